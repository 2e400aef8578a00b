"""The embedded demo model of `constrain serve`: a tiny, randomly initialised Qwen3 on Qwen3's real tokenizer and chat
template, built once from the asset cache and saved as a transformers model directory under it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

from constrain import assets

# Bump when anything below changes what is saved: an old directory is then rebuilt, never reused.
DEMO_VERSION = 1
DEMO_NAME = "constrain-demo-qwen3-tiny"
_SEED = 0
_TEMPLATE = "Qwen-Qwen3-0.6B"
# Added tokens Qwen3 writes as text (not `special`): decoding keeps them (as Qwen3's own tokenizer_config does).
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>",
                "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}


def demo_model_dir() -> Path:
    """Where the demo model directory lives (it may not exist yet): `<asset cache>/demo-models/<name>-v<version>`."""
    return assets.cache_dir() / "demo-models" / f"{DEMO_NAME}-v{DEMO_VERSION}"


def ensure_demo_model() -> Path:
    """The demo model directory, built on first use (about 20 s, 40 MB) and reused afterwards.

    Contents: a seeded random `Qwen3ForCausalLM` (hidden 64, 2 layers, tied embeddings, logits 151936 wide), the Qwen3
    tokenizer (the qwen2 vocab GGUF's BPE with Qwen3's added tokens `<tool_call>` 151657 ... `</think>` 151668), the
    real Qwen3 chat template, and `constrain_demo.json` marking it as a demo.

    Raises:
        FileNotFoundError: the qwen2 vocab GGUF or the Qwen3 chat template is not in the asset cache
            (`python -m constrain.assets fetch`).
    """
    target = demo_model_dir()
    if (target / "constrain_demo.json").is_file():
        return target
    template = assets.template_path(_TEMPLATE).read_text(encoding="utf-8")
    return build_dir_once(target, "constrain_demo.json", lambda tmp: _build(tmp, template))


def build_dir_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(tmp)` into a private temporary folder and renamed into place (so a crash or a
    concurrent builder never leaves a half-built folder); skipped when `target/marker` already exists."""
    if (target / marker).is_file():
        return target
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _qwen3_tokenizer_json() -> dict:
    """The qwen2 GGUF's tokenizer as transformers converts it, with Qwen3's added tokens in place of the
    `[PAD…]` placeholders (the same overlay as `constrain.vocabulary.qwen3_vocabulary`)."""
    import transformers

    from constrain.vocabulary import QWEN3_ADDED_TOKENS

    converted = assets.cache_dir() / "hf-tokenizers" / "qwen2" / "tokenizer.json"
    if not converted.is_file():
        gguf = assets.gguf_path("qwen2")
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        spec = json.loads(tok.backend_tokenizer.to_str())
    else:
        spec = json.loads(converted.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    by_id = {i: text for text, i in vocab.items()}
    for entry in spec["added_tokens"]:
        text = QWEN3_ADDED_TOKENS.get(entry["id"])
        if text is None:
            continue
        old = entry["content"]
        if old != text:
            if by_id.get(entry["id"]) == old:
                del vocab[old]
            vocab[text] = entry["id"]
        entry["content"] = text
        entry["special"] = text not in _NOT_SPECIAL
    return spec


def _build(out: Path, template: str) -> None:
    import torch
    import transformers
    from tokenizers import Tokenizer

    from constrain.vocabulary import QWEN3_EOS_IDS, QWEN3_VOCAB_SIZE

    spec = _qwen3_tokenizer_json()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None, unk_token=None,
    )
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out))
    eos = list(QWEN3_EOS_IDS)
    config = transformers.Qwen3Config(
        vocab_size=QWEN3_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
        eos_token_id=eos, pad_token_id=QWEN3_EOS_IDS[1], bos_token_id=None, tie_word_embeddings=True,
    )
    torch.manual_seed(_SEED)
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = QWEN3_EOS_IDS[1]
    model.generation_config.bos_token_id = None
    model.save_pretrained(str(out))
    (out / "constrain_demo.json").write_text(json.dumps({
        "name": DEMO_NAME, "version": DEMO_VERSION, "seed": _SEED, "template": _TEMPLATE,
        "note": "randomly initialised weights: output is noise; for trying the server and its contract only",
    }, indent=1))


__all__ = ["DEMO_NAME", "demo_model_dir", "ensure_demo_model"]
