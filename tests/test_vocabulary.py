"""Vocabulary: exact token bytes checked against each real tokenizer's own encoder/decoder; value semantics."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from constrain import assets
from constrain.errors import InternalError
from constrain.vocabulary import TokenizerError, Vocabulary, _BYTE_OF_CHAR

GGUF_VOCABS = ("gpt-2", "llama-bpe", "qwen2", "llama-spm", "gemma-4")


def asset(find, name: str) -> Path:
    """A cached asset (`find` is a `constrain.assets` lookup); missing fails under CI and skips elsewhere."""
    try:
        return find(name)
    except FileNotFoundError as err:
        if os.environ.get("CI"):
            pytest.fail(str(err))
        pytest.skip(str(err))


def expected_bytes(vocab: Vocabulary, text: str) -> bytes:
    # SentencePiece-style tokenizers encode a non-empty text with one dummy leading space.
    return (b" " if vocab.prefix_space and text else b"") + text.encode("utf-8")


@pytest.fixture(scope="module")
def gguf_vocabs() -> dict[str, Vocabulary]:
    return {name: Vocabulary.from_gguf(asset(assets.gguf_path, name)) for name in GGUF_VOCABS}


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
    # Every added token is special, `"special": false` ones too (like Qwen's `<tool_call>`); its text is kept.
    assert vocab.token_bytes[6] == b"<tool call>" and vocab.special_ids == {5, 6}
    # The tokenizer's own decoder agrees on each token.
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


# ----- real tokenizers (llama.cpp's GGUF vocabularies and test cases, Mistral's files)

@pytest.mark.parametrize("name", GGUF_VOCABS)
def test_gguf_ids_from_llama_cpp_decode_to_their_text(gguf_vocabs, name):
    vocab = gguf_vocabs[name]
    cases = assets.gguf_test_cases(name)
    assert len(cases) >= 40
    for text, ids in cases:
        assert vocab.decode(ids) == expected_bytes(vocab, text), text


def test_gguf_vocab_facts(gguf_vocabs):
    gpt2, llama3, qwen, spm, gemma = (gguf_vocabs[n] for n in GGUF_VOCABS)
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
    path = asset(assets.gguf_path, "llama-bpe")
    chat = Vocabulary.from_gguf(path, eos_ids=[llama3.eos_ids[0], eot], vocab_size=128320)
    assert chat.eos_ids == tuple(sorted({llama3.eos_ids[0], eot})) and chat.vocab_size == 128320
    assert chat.token_bytes == llama3.token_bytes and chat != llama3


@pytest.fixture(scope="module")
def hf_tokenizers():
    transformers = pytest.importorskip("transformers")
    out = {}
    for name in ("gpt-2", "llama-spm"):
        path = asset(assets.gguf_path, name)
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
    for text, _ in assets.gguf_test_cases(name):
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
    for text, ids in assets.gguf_test_cases("gpt-2"):
        assert enc.encode_ordinary(text) == ids  # it really is GPT-2's tokenizer
        assert vocab.decode(ids) == text.encode()


def test_mistral_sentencepiece_with_byte_fallback():
    sentencepiece = pytest.importorskip("sentencepiece")
    path = asset(assets.mistral_tokenizer_path, "sentencepiece")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(path))
    vocab = Vocabulary.from_tokenizer(sp)
    assert vocab.n_tokens == sp.get_piece_size() and vocab.prefix_space and vocab.eos_ids == (sp.eos_id(),)
    assert {"[INST]", "[TOOL_CALLS]", "</s>"} <= set(vocab.special_tokens)
    assert vocab.token_bytes[sp.piece_to_id("<0xF0>")] == b"\xf0"
    for text, _ in assets.gguf_test_cases("llama-spm"):
        ids = sp.encode(text)
        got = vocab.decode(ids)
        # SentencePiece's decoder drops the dummy prefix space; everything else must match.
        assert got.removeprefix(b" ") == sp.decode(ids).encode(), text
    from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer

    assert Vocabulary.from_tokenizer(SentencePieceTokenizer(str(path))) == vocab


def test_mistral_tekken():
    pytest.importorskip("mistral_common")
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tek = Tekkenizer.from_file(asset(assets.mistral_tokenizer_path, "tekken"))
    vocab = Vocabulary.from_tokenizer(tek)
    assert vocab.n_tokens == tek.n_words and vocab.eos_ids == (tek.eos_id,) and not vocab.prefix_space
    assert vocab.special_ids == set(range(tek.num_special_tokens))
    assert "[TOOL_CALLS]" in vocab.special_tokens
    for text, _ in assets.gguf_test_cases("gpt-2"):
        assert vocab.decode(tek.encode(text, bos=False, eos=False)) == text.encode(), text


# ----- the shared fixtures (tests/conftest.py): round trips, bytes, specials, fingerprints

SAMPLES = [
    "Hello, world! The quick brown fox.",
    "café naïve Ångström façade Über",
    "中文分词测试，日本語のテキスト、한국어",
    "emoji 🦙🚀👩‍👩‍👧 ok",
    "def f(x):\n\treturn {'a': [1, 2.5e-3]}  # code\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "q": "a\\"b\\n"}}',
]
FIXTURES = ["llama3_vocab", "qwen3_vocab", "gemma4_vocab", "tekken_vocab", "phi3_vocab", "gpt2_vocab"]


@pytest.mark.parametrize("fixture", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab", "phi3_vocab", "gpt2_vocab"])
def test_fixture_decodes_llama_cpp_ids(request, fixture):
    # llama.cpp's own tokenizer test cases (ASCII, accents, CJK, emoji, code, whitespace runs) for the same file.
    vocab = request.getfixturevalue(fixture)
    name = {"llama3_vocab": "llama-bpe", "qwen3_vocab": "qwen2", "gemma4_vocab": "gemma-4", "phi3_vocab": "phi-3",
            "gpt2_vocab": "gpt-2"}[fixture]
    for text, ids in assets.gguf_test_cases(name):
        assert vocab.decode(ids) == expected_bytes(vocab, text), text


def test_tekken_round_trip_through_mistral_common(tekken_vocab):
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tek = MistralTokenizer.from_file(str(assets.mistral_tokenizer_path("tekken"))).instruct_tokenizer.tokenizer
    for text in SAMPLES:
        ids = tek.encode(text, bos=False, eos=False)
        assert tekken_vocab.decode(ids) == text.encode("utf-8"), text
        assert tek.decode(ids) == text


@pytest.mark.parametrize("name", ["phi-3", pytest.param("llama-bpe", marks=pytest.mark.slow)])
def test_transformers_tokenizer_from_gguf_gives_same_bytes(name):
    # transformers builds its tokenizer from the same GGUF; llama-bpe takes ~18 s to convert, hence `slow`.
    transformers = pytest.importorskip("transformers")
    path = asset(assets.gguf_path, name)
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    from_gguf, from_tok = Vocabulary.from_gguf(path), Vocabulary.from_tokenizer(tok)
    n = from_gguf.n_tokens
    assert from_tok.token_bytes[:n] == from_gguf.token_bytes
    # Ids past the GGUF's count are tokens transformers' converter added (llama-bpe gets `<|endoftext|>`).
    assert all(t in from_tok.special_ids for t in range(n, from_tok.n_tokens))
    # The GGUF flags more (its unknown-type `[PAD…]` slots), never fewer.
    assert {t for t in from_tok.special_ids if t < n} <= from_gguf.special_ids
    assert set(from_gguf.eos_ids) <= set(from_tok.eos_ids)
    for text in SAMPLES:
        ids = tok.encode(text, add_special_tokens=False)
        assert from_gguf.decode(ids) == expected_bytes(from_gguf, text), text


@pytest.mark.parametrize("fixture", FIXTURES)
def test_every_byte_is_one_ordinary_token(request, fixture):
    vocab = request.getfixturevalue(fixture)
    singles = {d for t, d in enumerate(vocab.token_bytes) if len(d) == 1 and t not in vocab.special_ids}
    missing = sorted(set(range(256)) - {d[0] for d in singles})
    assert missing == [], f"{fixture}: no single-byte token for {missing}"


@pytest.mark.parametrize("fixture", FIXTURES)
def test_partial_utf8_tokens_stay_raw(request, fixture):
    vocab = request.getfixturevalue(fixture)
    ordinary = [d for t, d in enumerate(vocab.token_bytes) if t not in vocab.special_ids]
    assert all(type(d) is bytes for d in ordinary)
    partial = [d for d in ordinary if d and not _utf8(d)]
    assert partial, "a byte-level or byte-fallback vocabulary has tokens that are not whole UTF-8"
    # Lone continuation bytes and cut-off lead bytes are there as themselves (never U+FFFD).
    assert b"\x80" in ordinary and b"\xe4" in ordinary


def test_special_tokens_per_family(llama3_vocab, qwen3_vocab, gemma4_vocab, tekken_vocab, phi3_vocab, gpt2_vocab):
    assert set(llama3_vocab.eos_ids) == {128001, 128009}  # <|end_of_text|>, <|eot_id|>
    assert llama3_vocab.special_tokens["<|start_header_id|>"] == 128006

    q = qwen3_vocab
    assert (q.n_tokens, q.vocab_size) == (151936, 151936) and set(q.eos_ids) == {151643, 151645}
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                "</tool_call>": 151658, "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667,
                "</think>": 151668}
    assert {k: q.special_tokens[k] for k in expected} == expected
    assert set(range(151643, 151669)) <= q.special_ids and q.token_bytes[151657] == b"<tool_call>"
    assert "[PAD151657]" not in q.special_tokens  # the placeholder is overlaid

    g = gemma4_vocab
    gemma = {"<eos>": 1, "<bos>": 2, "<|tool>": 46, "<tool|>": 47, "<|tool_call>": 48, "<tool_call|>": 49,
             "<|tool_response>": 50, "<tool_response|>": 51, '<|"|>': 52, "<|think|>": 98, "<|channel>": 100,
             "<channel|>": 101, "<|turn>": 105, "<turn|>": 106}
    assert {k: g.special_tokens[k] for k in gemma} == gemma and set(gemma.values()) <= g.special_ids
    assert set(g.eos_ids) == {1, 50, 106}  # <eos>, <|tool_response>, <turn|> (llama.cpp's end-of-generation set)

    assert tekken_vocab.special_tokens["[TOOL_CALLS]"] == 9 and tekken_vocab.eos_ids == (2,)
    assert phi3_vocab.special_tokens["<|end|>"] == 32007 and 32007 in phi3_vocab.eos_ids
    assert gpt2_vocab.eos_ids == (50256,)
    for fixture in (llama3_vocab, q, g, tekken_vocab, phi3_vocab, gpt2_vocab):
        assert set(fixture.eos_ids) <= fixture.special_ids | set(fixture.eos_ids)
        assert fixture.vocab_size >= fixture.n_tokens == len(fixture.token_bytes)
        for text, t in fixture.special_tokens.items():
            assert t in fixture.special_ids and fixture.token_bytes[t] == text.encode("utf-8")


def test_fingerprints_differ_across_vocabularies(request):
    vocabs = [request.getfixturevalue(f) for f in FIXTURES]
    assert len({v.fingerprint for v in vocabs}) == len(vocabs)
    qwen2 = Vocabulary.from_gguf(asset(assets.gguf_path, "qwen2"))
    assert qwen2.token_bytes[:151643] == vocabs[1].token_bytes[:151643] and qwen2 != vocabs[1]


def test_fingerprint_is_stable_across_processes(gpt2_vocab):
    import subprocess
    import sys

    code = ("from constrain import assets; from constrain.vocabulary import Vocabulary; "
            "print(Vocabulary.from_gguf(assets.gguf_path('gpt-2')).fingerprint)")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == gpt2_vocab.fingerprint


def test_real_vocabulary_pickles(qwen3_vocab):
    clone = pickle.loads(pickle.dumps(qwen3_vocab))
    assert clone == qwen3_vocab and clone.special_tokens == qwen3_vocab.special_tokens
    assert clone.eos_ids == qwen3_vocab.eos_ids and clone.vocab_size == qwen3_vocab.vocab_size
