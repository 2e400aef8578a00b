"""constrain: tool policies and JSON Schemas compiled to byte automata and token masks for LLM decoding."""

from constrain.errors import (
    ConstrainError,
    InternalError,
    InvalidSchema,
    MaskViolation,
    RequestError,
    UnsupportedSchema,
)

__all__ = [
    "ConstrainError",
    "InternalError",
    "InvalidSchema",
    "MaskViolation",
    "RequestError",
    "UnsupportedSchema",
]
