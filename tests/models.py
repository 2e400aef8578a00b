"""Test helpers: real transformers tokenizers (from the cached vocab GGUFs) and tiny seeded random models for them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from constrain import assets

# Tokenizer GGUF per family; conversion by transformers is slow (llama-bpe ~18 s), so each is converted once and
# kept with save_pretrained under the asset cache.
GGUF = {"llama3": "llama-bpe", "qwen3": "qwen2", "phi3": "phi-3"}


def _missing(message: str):
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def hf_tokenizer(family: str):
    """The transformers tokenizer of `family` (a key of GGUF), converted from its vocab GGUF once and then cached.

    Missing assets fail under CI (env CI set) and skip elsewhere, like the vocabulary fixtures.
    """
    transformers = pytest.importorskip("transformers")
    name = GGUF[family]
    try:
        path = assets.gguf_path(name)
    except FileNotFoundError as err:
        _missing(f"{family} tokenizer: {err} (fix: `python -m constrain.assets fetch`)")
    saved = assets.cache_dir() / "hf-tokenizers" / name
    if not (saved / "tokenizer_config.json").exists():
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
        tok.save_pretrained(str(tmp))
        os.replace(tmp, saved) if not saved.exists() else None
    return transformers.AutoTokenizer.from_pretrained(str(saved))


def tiny_model(kind: str, vocab_size: int, *, eos_ids: list[int], pad_id: int, seed: int = 0):
    """A seeded random causal LM (hidden 64, 2 layers, 2 heads, head_dim 32) of `kind` "llama" or "qwen3".

    `vocab_size` is the logits width (may exceed the tokenizer's count, as real checkpoints do).
    """
    import torch
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=1024,
                  eos_token_id=list(eos_ids), pad_token_id=pad_id, bos_token_id=None, tie_word_embeddings=False)
    if kind == "llama":
        config, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif kind == "qwen3":
        config, cls = transformers.Qwen3Config(**common), transformers.Qwen3ForCausalLM
    else:
        raise ValueError(f"kind must be 'llama' or 'qwen3', got {kind!r}")
    torch.manual_seed(seed)
    model = cls(config).eval()
    model.generation_config.eos_token_id = list(eos_ids)
    model.generation_config.pad_token_id = pad_id
    model.generation_config.bos_token_id = None
    return model


def cache_dir() -> Path:
    """Where converted tokenizers live (the asset cache)."""
    return assets.cache_dir() / "hf-tokenizers"
