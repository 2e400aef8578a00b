"""constrain: tool policies and JSON Schemas compiled to byte automata and token masks for LLM decoding."""

from constrain.compiler import compile_index, compile_json_schema, compile_regex
from constrain.errors import (
    ConstrainError,
    InternalError,
    InvalidSchema,
    MaskViolation,
    RequestError,
    TokenizerError,
    UnsupportedSchema,
)
from constrain.index import TokenIndex, TokenState
from constrain.policy import Policy
from constrain.vocabulary import Vocabulary

# Names whose modules import torch (or are heavier) load on first use.
_LAZY = {
    "MaskProcessor": "constrain.processor",
    "apply_token_mask": "constrain_kernels",
    "parse_output": "constrain.parse",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'constrain' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "ConstrainError",
    "InternalError",
    "InvalidSchema",
    "MaskProcessor",
    "MaskViolation",
    "Policy",
    "RequestError",
    "TokenIndex",
    "TokenState",
    "TokenizerError",
    "UnsupportedSchema",
    "Vocabulary",
    "apply_token_mask",
    "compile_index",
    "compile_json_schema",
    "compile_regex",
    "parse_output",
]
