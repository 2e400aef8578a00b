"""Vocabulary: exact token bytes checked against each real tokenizer's own encoder/decoder; value semantics."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import pytest

from constrain.errors import InternalError
from constrain.vocabulary import TokenizerError, Vocabulary, _BYTE_OF_CHAR

sys.path.insert(0, str(Path(__file__).parent))
import assets  # noqa: E402  (tests/ is not a package)


def asset(name: str) -> Path:
    """A cached asset; missing is a failure under CI and a skip on a developer machine."""
    try:
        return assets.asset_path(name)
    except assets.AssetError as err:
        if os.environ.get("CI"):
            pytest.fail(str(err))
        pytest.skip(str(err))


def expected_bytes(vocab: Vocabulary, text: str) -> bytes:
    # SentencePiece-style tokenizers encode a non-empty text with one dummy leading space.
    return (b" " if vocab.prefix_space and text else b"") + text.encode("utf-8")


@pytest.fixture(scope="module")
def gguf_vocabs() -> dict[str, Vocabulary]:
    return {name: Vocabulary.from_gguf(asset(f"ggml-vocab-{name}.gguf")) for name in assets.GGUF_VOCABS}


# ----- synthetic: construction, value semantics, decode

def small(**overrides) -> Vocabulary:
    args = dict(special_ids=[3], eos_ids=[3], vocab_size=40, prefix_space=False)
    args.update(overrides)
    return Vocabulary.from_token_bytes([b"a", b"\xe4\xb8", b"", b"<|end|>"], **args)


def test_value_semantics_and_pickle():
    vocab = small()
    assert vocab.n_tokens == 4 and vocab.vocab_size == 40
    assert dict(vocab.special_tokens) == {"<|end|>": 3}
    assert small() == vocab and hash(small()) == hash(vocab)
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone == vocab and clone.token_bytes == vocab.token_bytes and clone.eos_ids == (3,)
    changed = [
        small(vocab_size=41),
        small(prefix_space=True),
        small(eos_ids=[]),
        small(special_ids=[2, 3]),
        Vocabulary.from_token_bytes([b"b", b"\xe4\xb8", b"", b"<|end|>"], special_ids=[3], eos_ids=[3], vocab_size=40),
    ]
    assert len({v.fingerprint for v in changed} | {vocab.fingerprint}) == len(changed) + 1
    with pytest.raises(AttributeError):
        vocab.vocab_size = 50
    with pytest.raises(TypeError):
        vocab.special_tokens["x"] = 1


def test_decode_concatenates_and_rejects_non_byte_tokens():
    vocab = small()
    assert vocab.decode([0, 1, 2, 0]) == b"a\xe4\xb8a"
    for bad in ([3], [4], [-1]):  # special/EOS, padding id, negative
        with pytest.raises(InternalError):
            vocab.decode(bad)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(token_bytes=[b"a", "b"]),
        dict(token_bytes=[b"a", None]),
        dict(token_bytes=[b"a"], special_ids=[1]),
        dict(token_bytes=[b"a"], eos_ids=[-1]),
        dict(token_bytes=[b"a", b"b"], vocab_size=1),
    ],
)
def test_invalid_construction(kwargs):
    with pytest.raises(TokenizerError):
        Vocabulary.from_token_bytes(**kwargs)


def test_byte_level_alphabet_is_a_bijection():
    assert sorted(_BYTE_OF_CHAR.values()) == list(range(256))
    assert all(len(c) == 1 and c.isprintable() for c in _BYTE_OF_CHAR)
    assert _BYTE_OF_CHAR["Ġ"] == 0x20 and _BYTE_OF_CHAR["Ċ"] == 0x0A and _BYTE_OF_CHAR["a"] == ord("a")


_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}


def _tiny_hf_tokenizer(decoder: dict | None, added: list[dict] | None = None):
    tokenizers = pytest.importorskip("tokenizers")
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added or [], "normalizer": None,
        "pre_tokenizer": None, "post_processor": None, "decoder": decoder,
        "model": {"type": "WordLevel", "vocab": {"a": 0, "Ġb": 1, "▁c": 2, "<0x41>": 3, "[UNK]": 4},
                  "unk_token": "[UNK]"},
    }
    return tokenizers.Tokenizer.from_str(json.dumps(spec))


def test_hf_decoders_map_pieces_exactly():
    byte_level = _tiny_hf_tokenizer(_BYTE_LEVEL,
                                    added=[{"id": 5, "content": "<eos>", "single_word": False, "lstrip": False,
                                            "rstrip": False, "normalized": False, "special": True},
                                           {"id": 6, "content": "<tool call>", "single_word": False,
                                            "lstrip": False, "rstrip": False, "normalized": False,
                                            "special": False}])
    vocab = Vocabulary.from_tokenizer(byte_level, eos_ids=[5])
    assert vocab.token_bytes[:3] == (b"a", b" b", "▁c".encode())
    assert vocab.token_bytes[6] == b"<tool call>" and vocab.special_ids == {5}
    # The tokenizer's own decoder agrees on each non-special token.
    for i in (0, 1, 6):
        assert byte_level.decode([i], skip_special_tokens=False).encode() == vocab.token_bytes[i]

    spm = _tiny_hf_tokenizer({"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})
    vocab = Vocabulary.from_tokenizer(spm, eos_ids=[4])
    assert vocab.token_bytes[:4] == (b"a", "Ġb".encode(), b" c", b"A") and vocab.prefix_space


@pytest.mark.parametrize("decoder", [None, {"type": "WordPiece", "prefix": "##", "cleanup": True}])
def test_hf_decoder_that_is_not_a_concatenation_is_rejected(decoder):
    with pytest.raises(TokenizerError):
        Vocabulary.from_tokenizer(_tiny_hf_tokenizer(decoder), eos_ids=[0])


def test_unsupported_tokenizer_and_missing_eos():
    with pytest.raises(TokenizerError):
        Vocabulary.from_tokenizer(object())
    bare = _tiny_hf_tokenizer(_BYTE_LEVEL)
    with pytest.raises(TokenizerError):  # a bare tokenizers.Tokenizer names no eos token
        Vocabulary.from_tokenizer(bare)


def test_gguf_reader_rejects_non_gguf(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGML" + b"\0" * 40)
    with pytest.raises(TokenizerError):
        Vocabulary.from_gguf(path)
    path.write_bytes(b"GGUF\x03\0\0\0" + b"\0" * 8 + b"\x05" + b"\0" * 7)  # claims 5 keys, has none
    with pytest.raises(TokenizerError):
        Vocabulary.from_gguf(path)


def test_asset_table_is_pinned():
    members = {name for archive in assets.ARCHIVES for name in archive.members}
    assert members == set(assets.SHA256)
    assert all("==" in archive.requirement for archive in assets.ARCHIVES)


# ----- real tokenizers (llama.cpp's GGUF vocabularies and test cases, Mistral's files)

@pytest.mark.parametrize("name", assets.GGUF_VOCABS)
def test_gguf_ids_from_llama_cpp_decode_to_their_text(gguf_vocabs, name):
    vocab = gguf_vocabs[name]
    cases = assets.read_gguf_cases(name)
    assert len(cases) >= 40
    for text, ids in cases:
        assert vocab.decode(ids) == expected_bytes(vocab, text), text


def test_gguf_vocab_facts(gguf_vocabs):
    gpt2, llama3, qwen, spm, gemma = (gguf_vocabs[n] for n in assets.GGUF_VOCABS)
    assert (gpt2.n_tokens, gpt2.eos_ids, gpt2.special_tokens["<|endoftext|>"]) == (50257, (50256,), 50256)
    assert llama3.n_tokens == 128256 and "<|eot_id|>" in llama3.special_tokens and not llama3.prefix_space
    assert {"<|im_start|>", "<|im_end|>"} <= set(qwen.special_tokens) and qwen.n_tokens == 151936
    assert spm.prefix_space and 0 in spm.special_ids and spm.token_bytes[3 + 0x0A] == b"\n"
    assert spm.special_tokens == {"<unk>": 0, "<s>": 1, "</s>": 2} and spm.eos_ids == (2,)
    # Gemma 4's tool-call markers are user-defined tokens: single markers that a grammar names by id, so special.
    assert {gemma.special_tokens[t] for t in ("<|tool_call>", "<tool_call|>", '<|"|>')} == {48, 49, 52}
    assert {48, 49, 52} <= gemma.special_ids and not gemma.prefix_space
    for vocab in gguf_vocabs.values():
        assert all(type(data) is bytes for data in vocab.token_bytes)


def test_eos_override_and_padded_vocab_size(gguf_vocabs):
    llama3 = gguf_vocabs["llama-bpe"]
    eot = llama3.special_tokens["<|eot_id|>"]
    path = asset("ggml-vocab-llama-bpe.gguf")
    chat = Vocabulary.from_gguf(path, eos_ids=[llama3.eos_ids[0], eot], vocab_size=128320)
    assert chat.eos_ids == tuple(sorted({llama3.eos_ids[0], eot})) and chat.vocab_size == 128320
    assert chat.token_bytes == llama3.token_bytes and chat != llama3


@pytest.fixture(scope="module")
def hf_tokenizers():
    transformers = pytest.importorskip("transformers")
    out = {}
    for name in ("gpt-2", "llama-spm"):
        path = asset(f"ggml-vocab-{name}.gguf")
        out[name] = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return out


@pytest.mark.parametrize("name", ["gpt-2", "llama-spm"])
def test_transformers_tokenizer_matches_its_own_decoder(hf_tokenizers, gguf_vocabs, name):
    tok = hf_tokenizers[name]
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.eos_ids == (tok.eos_token_id,) and vocab.prefix_space == gguf_vocabs[name].prefix_space
    # Same bytes as llama.cpp's reading of the same vocabulary, token for token (HF marks <unk> special).
    for i, data in enumerate(vocab.token_bytes):
        if i not in vocab.special_ids:
            assert data == gguf_vocabs[name].token_bytes[i], i
    # Every token whose bytes are valid UTF-8 decodes, after an anchor token, to exactly those bytes.
    backend = tok.backend_tokenizer
    anchor = backend.token_to_id("x")
    ids = [i for i, d in enumerate(vocab.token_bytes) if i not in vocab.special_ids and d and _utf8(d)]
    assert len(ids) > 0.9 * vocab.n_tokens - 300
    decoded = backend.decode_batch([[anchor, i] for i in ids], skip_special_tokens=False)
    wrong = [i for i, text in zip(ids, decoded) if text.encode() != b"x" + vocab.token_bytes[i]]
    assert wrong == []
    # On the ids the HF encoder gives llama.cpp's test texts, our bytes equal the HF decoder's output (which drops
    # the dummy prefix space); byte-level BPE encodes losslessly, so there they are the text itself.
    for text, _ in assets.read_gguf_cases(name):
        ids = tok.encode(text, add_special_tokens=False)
        got = vocab.decode(ids)
        assert (got.removeprefix(b" ") if vocab.prefix_space else got) == tok.decode(ids).encode(), text
        if not vocab.prefix_space:
            assert got == text.encode(), text
    # A bare tokenizers.Tokenizer reads the same (given its eos).
    assert Vocabulary.from_tokenizer(backend, eos_ids=vocab.eos_ids) == vocab


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_tiktoken_encoding_gpt2(gguf_vocabs):
    tiktoken = pytest.importorskip("tiktoken")
    gpt2 = gguf_vocabs["gpt-2"]
    # GPT-2's ids are its BPE merge ranks, so the GGUF vocabulary is also GPT-2's tiktoken table.
    ranks = {data: i for i, data in enumerate(gpt2.token_bytes) if i not in gpt2.special_ids}
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("gpt2-test", pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    vocab = Vocabulary.from_tokenizer(enc)
    assert vocab == Vocabulary.from_token_bytes(gpt2.token_bytes, special_ids=[50256], eos_ids=[50256])
    for text, ids in assets.read_gguf_cases("gpt-2"):
        assert enc.encode_ordinary(text) == ids  # it really is GPT-2's tokenizer
        assert vocab.decode(ids) == text.encode()


def test_mistral_sentencepiece_with_byte_fallback():
    sentencepiece = pytest.importorskip("sentencepiece")
    path = asset("mistral-v3.model")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    vocab = Vocabulary.from_tokenizer(sp)
    assert vocab.n_tokens == sp.get_piece_size() and vocab.prefix_space and vocab.eos_ids == (sp.eos_id(),)
    assert {"[INST]", "[TOOL_CALLS]", "</s>"} <= set(vocab.special_tokens)
    assert vocab.token_bytes[sp.piece_to_id("<0xF0>")] == b"\xf0"
    for text, _ in assets.read_gguf_cases("llama-spm"):
        ids = sp.encode(text)
        got = vocab.decode(ids)
        # SentencePiece's decoder drops the dummy prefix space; everything else must match.
        assert got.removeprefix(b" ") == sp.decode(ids).encode(), text
    from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer

    assert Vocabulary.from_tokenizer(SentencePieceTokenizer(str(path))) == vocab


def test_mistral_tekken():
    pytest.importorskip("mistral_common")
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tek = Tekkenizer.from_file(asset("tekken-240718.json"))
    vocab = Vocabulary.from_tokenizer(tek)
    assert vocab.n_tokens == tek.n_words and vocab.eos_ids == (tek.eos_id,) and not vocab.prefix_space
    assert vocab.special_ids == set(range(tek.num_special_tokens))
    assert "[TOOL_CALLS]" in vocab.special_tokens
    for text, _ in assets.read_gguf_cases("gpt-2"):
        assert vocab.decode(tek.encode(text, bos=False, eos=False)) == text.encode(), text
