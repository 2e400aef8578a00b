"""The token trie: every array equals a plain-Python oracle built from the set of token prefixes, both as the C
builder makes it and as the numpy fallback does."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain import trie as ctrie
from constrain.trie import _build_trie
from constrain.vocabulary import Vocabulary

_ARRAYS = ("node_byte", "parent_local", "child_start", "child_count", "term_start", "term_count", "term_tokens",
           "term_node")


def oracle_trie(vocab: Vocabulary) -> dict:
    """The layout `_Trie` documents, written from its definition: nodes are the distinct nonempty prefixes of the byte
    tokens, numbered by (length, bytes); a node's children start where its depth's earlier nodes' children end."""
    skip = vocab.special_ids | set(vocab.eos_ids)
    tokens = [(i, data) for i, data in enumerate(vocab.token_bytes) if data and i not in skip]
    prefixes = sorted({data[:d] for _, data in tokens for d in range(1, len(data) + 1)}, key=lambda p: (len(p), p))
    gid = {p: k for k, p in enumerate(prefixes)}
    max_depth = len(prefixes[-1]) if prefixes else 0
    depth_start = [0] * (max_depth + 1)
    for p in prefixes:
        depth_start[len(p)] += 1
    for d in range(1, max_depth + 1):
        depth_start[d] += depth_start[d - 1]
    n = len(prefixes)
    child_count, child_start, parent_local = [0] * n, [0] * n, [0] * n
    for p in prefixes:
        if len(p) > 1:
            child_count[gid[p[:-1]]] += 1
            parent_local[gid[p]] = gid[p[:-1]] - depth_start[len(p) - 2]
    for d in range(1, max_depth):  # the deepest depth has no children and keeps zeros
        at = depth_start[d]  # where depth d+1 starts
        for k in range(depth_start[d - 1], depth_start[d]):
            child_start[k] = at
            at += child_count[k]
    ends = sorted((gid[data], i) for i, data in tokens)
    term_count = [0] * n
    for node, _ in ends:
        term_count[node] += 1
    term_start = [0] * n
    for k in range(1, n):
        term_start[k] = term_start[k - 1] + term_count[k - 1]
    return {
        "node_byte": np.array([p[-1] for p in prefixes], dtype=np.uint8),
        "parent_local": np.array(parent_local, dtype=np.int32),
        "child_start": np.array(child_start, dtype=np.int32),
        "child_count": np.array(child_count, dtype=np.int32),
        "term_start": np.array(term_start, dtype=np.int32),
        "term_count": np.array(term_count, dtype=np.int32),
        "term_tokens": np.array([i for _, i in ends], dtype=np.int32),
        "term_node": np.array([node for node, _ in ends], dtype=np.int32),
        "depth_start": tuple(depth_start),
    }


def assert_trie_equals_oracle(vocab: Vocabulary) -> None:
    expected, lib = oracle_trie(vocab), ctrie._native()
    builds = [ctrie._build_trie_numpy(vocab)] + ([] if lib is None else [ctrie._build_trie_native(vocab, lib)])
    for trie in builds:
        assert trie.depth_start == expected["depth_start"]
        for name in _ARRAYS:
            got, want = getattr(trie, name), expected[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert np.array_equal(got, want), name


def test_the_c_builder_is_built_and_used_where_a_compiler_is(monkeypatch):
    # (as the automaton passes, tests/test_native.py; CONSTRAIN_NATIVE=0 takes the numpy builder everywhere)
    assert ctrie._native() is not None

    def numpy_builder(vocab):
        raise AssertionError("the numpy builder ran where the C one was built")

    monkeypatch.setattr(ctrie, "_build_trie_numpy", numpy_builder)
    assert _build_trie(make_vocab([b"ab", b"a"])).node_byte.tolist() == [ord("a"), ord("b")]


def make_vocab(tokens, **kwargs) -> Vocabulary:
    return Vocabulary.from_token_bytes(tokens, **kwargs)


@pytest.mark.parametrize(
    "tokens",
    [
        pytest.param([b"a"], id="one"),
        pytest.param([b"b", b"a", b"ab", b"abc", b"b"], id="prefixes-and-a-duplicate"),
        # zero bytes next to the zero padding of a chunk: a shorter token sorts first, equal ones share a node
        pytest.param([b"a\x00", b"a", b"a\x00\x00", b"a\x00b", b"\x00", b"a\x00", b"\x00\x00\x00\x00\x00\x00\x00\x00"],
                     id="zero-bytes"),
        pytest.param([b"\xff" * k for k in (9, 1, 8, 7, 14, 15, 21)] + [b"\xff" * 7 + b"\x00"], id="0xff-chunk-edges"),
        # ties broken over many 7-byte chunks, and depths past 255 (uint16 depths, lengths above one byte)
        pytest.param([b"x" * k for k in range(300, 0, -7)] + [b"x" * 150 + b"y", b"x" * 149 + b"w"], id="long-runs"),
        pytest.param([b"same"] * 5 + [b"sam", b"same!"], id="many-duplicates"),
        # more groups of tokens tied on their first chunk than a uint16 group id holds
        pytest.param([b"%07d%c" % (i, c) for i in range(2**16 + 5) for c in b"xy"], id="many-tie-groups"),
    ],
)
def test_edge_vocabularies_match_oracle(tokens):
    assert_trie_equals_oracle(make_vocab(tokens))


def test_specials_eos_and_empty_tokens_are_not_in_the_trie():
    tokens = [b"ab", b"", b"<eos>", b"a", b"<tool>", b"ab", b"abc"]
    vocab = make_vocab(tokens, special_ids=(2, 4), eos_ids=(2,))
    assert_trie_equals_oracle(vocab)
    trie = _build_trie(vocab)
    assert sorted(trie.term_tokens.tolist()) == [0, 3, 5, 6]


def test_a_vocabulary_with_no_byte_token_gives_an_empty_trie():
    for vocab in (make_vocab([]), make_vocab([b"", b"<eos>"], special_ids=(1,), eos_ids=(1,))):
        trie = _build_trie(vocab)
        assert trie.n_nodes == 0 and trie.max_depth == 0 and trie.term_tokens.shape == (0,)
        assert_trie_equals_oracle(vocab)


# A small alphabet makes long shared prefixes, duplicates and zero bytes common.
_TOKENS = st.lists(st.lists(st.sampled_from([0, 1, 97, 98, 255]), max_size=24).map(bytes), min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(tokens=_TOKENS, data=st.data())
def test_random_vocabularies_match_oracle(tokens, data):
    special = data.draw(st.sets(st.integers(0, len(tokens) - 1), max_size=3))
    eos = data.draw(st.sets(st.integers(0, len(tokens) - 1), max_size=2))
    assert_trie_equals_oracle(make_vocab(tokens, special_ids=special, eos_ids=eos))


@pytest.mark.parametrize("name", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab"])
def test_real_vocabularies_match_oracle(request, name):
    assert_trie_equals_oracle(request.getfixturevalue(name))
