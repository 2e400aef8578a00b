"""Shared fixtures: real-tokenizer vocabularies, loaded once per test run from the local asset cache."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from constrain import assets
from constrain.vocabulary import Vocabulary, qwen3_vocabulary


def _load(what: str, build: Callable[[], Vocabulary]) -> Vocabulary:
    """Build a vocabulary from cached assets; a missing asset fails under CI (env CI set) and skips elsewhere."""
    try:
        return build()
    except (FileNotFoundError, ImportError) as err:
        message = f"{what}: {err} (fix: `python -m constrain.assets fetch`)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="session")
def llama3_vocab() -> Vocabulary:
    """Llama 3 (byte-level BPE, 128256 tokens; EOS `<|end_of_text|>` 128001 and `<|eot_id|>` 128009)."""
    return _load("llama3_vocab", lambda: Vocabulary.from_gguf(assets.gguf_path("llama-bpe")))


@pytest.fixture(scope="session")
def qwen3_vocab() -> Vocabulary:
    """Qwen3 (byte-level BPE; Qwen3's added tokens 151643-151668 special; vocab_size 151936)."""
    return _load("qwen3_vocab", qwen3_vocabulary)


@pytest.fixture(scope="session")
def gemma4_vocab() -> Vocabulary:
    """Gemma 4 (BPE over `▁` pieces with `<0xNN>` byte fallback, 262144 tokens; `<|tool_call>` 48 etc. special)."""
    return _load("gemma4_vocab", lambda: Vocabulary.from_gguf(assets.gguf_path("gemma-4")))


@pytest.fixture(scope="session")
def tekken_vocab() -> Vocabulary:
    """Mistral Tekken (tiktoken-style byte BPE; the first `num_special_tokens` ids are special)."""
    return _load("tekken_vocab", lambda: Vocabulary.from_mistral(assets.mistral_tokenizer_path("tekken")))


@pytest.fixture(scope="session")
def tekken_v11_vocab(tekken_vocab: Vocabulary) -> Vocabulary:
    """The cached Tekken (v3/v7, 2024) with ids 32-35 named as v11/v13 name them: [ARGS] [CALL_ID] [THINK] [/THINK].

    Tekken v11/v13 keep the v7 vocabulary and give four reserved control slots these names (mistral_common's
    v11/v13 token-id fixtures); mistral_common ships no v11+ file, so tests rename the slots.
    """
    names = {32: b"[ARGS]", 33: b"[CALL_ID]", 34: b"[THINK]", 35: b"[/THINK]"}
    tokens = [names.get(i, b) for i, b in enumerate(tekken_vocab.token_bytes)]
    return Vocabulary(tokens, special_ids=tekken_vocab.special_ids, eos_ids=tekken_vocab.eos_ids,
                      vocab_size=tekken_vocab.vocab_size, prefix_space=tekken_vocab.prefix_space)


@pytest.fixture(scope="session")
def phi3_vocab() -> Vocabulary:
    """Phi-3 (SentencePiece with byte fallback, 32064 tokens, dummy-prefix space)."""
    return _load("phi3_vocab", lambda: Vocabulary.from_gguf(assets.gguf_path("phi-3")))


@pytest.fixture(scope="session")
def gpt2_vocab() -> Vocabulary:
    """GPT-2 (byte-level BPE, 50257 tokens, EOS `<|endoftext|>` 50256)."""
    return _load("gpt2_vocab", lambda: Vocabulary.from_gguf(assets.gguf_path("gpt-2")))
