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


# ---- Gemma 4: a tiny random model directory on the real Gemma 4 tokenizer and chat template

GEMMA4_MODEL_VERSION = 1  # bump when what `gemma4_model_dir` saves changes: an old directory is rebuilt
GEMMA4_EOS_IDS = (1, 106, 50)  # <eos>, <turn|>, <|tool_response> (what the GGUF's vocabulary ends generation on)
GEMMA4_PAD_ID = 0


def gemma4_hf_tokenizer():
    """Gemma 4's tokenizer as a transformers fast tokenizer: the BPE that `test_templates._gemma4_tokenizer` rebuilds
    from the gemma-4 vocab GGUF (checked there against llama.cpp's test cases), plus what a model directory needs:
    the GGUF's control and user-defined tokens (`<bos>`, `<|turn>`, `<|tool_call>` 48, `<|"|>` 52, `<turn|>` 106 ...)
    as added tokens matched before BPE, and a `▁`/byte-fallback decoder. Chat template: the GGUF's own (identical
    to ../shared/reference/gemma4-chat-template.jinja)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from test_templates import _gemma4_tokenizer

    from constrain.vocabulary import _read_gguf_metadata

    try:
        path = assets.gguf_path("gemma-4")
    except FileNotFoundError as err:
        _missing(f"gemma4 tokenizer: {err} (fix: `python -m constrain.assets fetch`)")
    meta = _read_gguf_metadata(str(path))
    tok = tokenizers.Tokenizer.from_str(_gemma4_tokenizer().to_str())  # a copy: the cached one stays bare
    d = tokenizers.decoders
    tok.decoder = d.Sequence([d.Replace("▁", " "), d.ByteFallback(), d.Fuse()])
    pieces, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    marks = [(i, pieces[i], types[i]) for i in range(len(pieces)) if types[i] in (3, 4)]  # control, user-defined
    tok.add_special_tokens([tokenizers.AddedToken(p, special=t == 3, normalized=False) for _, p, t in marks])
    for i, p, _ in marks:
        assert tok.token_to_id(p) == i, (p, i, tok.token_to_id(p))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                                pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
    fast.chat_template = meta["tokenizer.chat_template"]
    return fast


def gemma4_model_dir() -> Path:
    """A transformers model directory under the asset cache: a seeded random Llama-architecture causal LM (hidden 64,
    2 layers, tied embeddings, logits 262144 wide: ~67 MB) with Gemma 4's tokenizer and chat template, built once.

    The architecture is not Gemma 4's: the server's contract depends on the vocabulary, tokenizer and template, not on
    the layers that produce the logits.
    """
    import json

    from constrain.demo_model import build_dir_once

    target = assets.cache_dir() / "test-models" / f"gemma4-tiny-llama-v{GEMMA4_MODEL_VERSION}"
    if (target / "constrain_test_model.json").is_file():
        return target
    import torch
    import transformers

    tokenizer = gemma4_hf_tokenizer()

    def build(tmp: Path) -> None:
        tokenizer.save_pretrained(str(tmp))
        eos = list(GEMMA4_EOS_IDS)
        config = transformers.LlamaConfig(
            vocab_size=262144, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, max_position_embeddings=4096, eos_token_id=eos,
            pad_token_id=GEMMA4_PAD_ID, bos_token_id=2, tie_word_embeddings=True)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        model.generation_config.eos_token_id = eos
        model.generation_config.pad_token_id = GEMMA4_PAD_ID
        model.generation_config.bos_token_id = 2
        model.save_pretrained(str(tmp))
        (tmp / "constrain_test_model.json").write_text(json.dumps({
            "version": GEMMA4_MODEL_VERSION, "seed": 0, "architecture": "llama (not gemma4: irrelevant here)",
            "tokenizer": "gemma-4 vocab GGUF", "template": "the gemma-4 GGUF's tokenizer.chat_template"}, indent=1))

    return build_dir_once(target, "constrain_test_model.json", build)
