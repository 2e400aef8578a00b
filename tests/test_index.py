"""TokenIndex / TokenState: masks equal a plain-Python oracle at every state; cursor, dedupe, pickling, cache."""

from __future__ import annotations

import copy
import pickle
import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain import automaton as fa
from constrain.errors import InternalError, MaskViolation
from constrain.cache import IndexCache
from constrain.index import TokenIndex, TokenState
from constrain.vocabulary import Vocabulary



def make_vocab(token_bytes, *, special_ids=(), eos_ids=(), vocab_size=None):
    return Vocabulary.from_token_bytes(token_bytes, special_ids=special_ids, eos_ids=eos_ids, vocab_size=vocab_size)


# ---------------------------------------------------------------------------------------------------------------------
# Synthetic vocabulary: 256 single bytes, random multi-byte tokens (JSON-ish ASCII, UTF-8 pieces), duplicates, an empty
# empty token (an unused slot), special tokens, EOS, and padding ids beyond n_tokens (vocab_size not a multiple of 32).

_ALPHABET = b'{}[]":,.-+eE0123456789 abcnulltrufs\\\n\t/'
_UTF8 = ["é", "ü", "中", "文", "😀", "Ω"]


def _synthetic_token_bytes(seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    tokens = [bytes([b]) for b in range(256)]
    seen = set(tokens)
    while len(tokens) < 900:
        kind = rng.random()
        if kind < 0.7:
            data = bytes(rng.choice(_ALPHABET) for _ in range(rng.randint(2, 7)))
        elif kind < 0.9:
            text = "".join(rng.choice(_UTF8 + ["a", " ", '"']) for _ in range(rng.randint(1, 3)))
            raw = text.encode()
            lo = rng.randint(0, len(raw) - 1)
            data = raw[lo : rng.randint(lo + 1, len(raw))]  # may cut a character: partial UTF-8 stays raw
        else:
            data = b" " * rng.randint(2, 12)
        if data not in seen:
            seen.add(data)
            tokens.append(data)
    tokens += [b'"a', b"12", b'"a']  # duplicate byte strings (ids 900..902)
    tokens.append(b"")  # 903: an unused slot, never allowed
    tokens += [b"<|eos|>", b"<tool>", b"</tool>", b"<unused>"]  # 904..907: special, their text is never walked
    return tokens


SYN_TOKENS = _synthetic_token_bytes()
EOS = 904
TOOL_OPEN, TOOL_CLOSE, UNUSED = 905, 906, 907
SYN_VOCAB_SIZE = len(SYN_TOKENS) + 37


@pytest.fixture(scope="module")
def vocab():
    specials = (EOS, TOOL_OPEN, TOOL_CLOSE, UNUSED)
    return make_vocab(SYN_TOKENS, special_ids=specials, eos_ids=(EOS,), vocab_size=SYN_VOCAB_SIZE)


# ---------------------------------------------------------------------------------------------------------------------
# The oracle: written independently of the trie walk, one token at a time.


def oracle_allowed(dfa, vocab, state: int) -> set[int]:
    allowed = set()
    for t in range(vocab.n_tokens):
        data = vocab.token_bytes[t]
        if t in vocab.special_ids or t in vocab.eos_ids or not data:
            continue
        s = state
        for byte in data:
            s = int(dfa.transitions[s, dfa.class_of[byte]])
            if s < 0:
                break
        if s >= 0:
            allowed.add(t)
    if dfa.accepting[state]:
        allowed.update(vocab.eos_ids)
    for i, t in enumerate(dfa.specials):
        if dfa.transitions[state, dfa.class_of[256 + i]] >= 0:
            allowed.add(t)
    return allowed


def unpack(mask: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little")).tolist())


def hand_made_dfa():
    """`ab*c` over bytes (classes: a, b, c, other) followed optionally by the <tool> special symbol."""
    class_of = np.full(257, 3, dtype=np.int32)
    class_of[ord("a")], class_of[ord("b")], class_of[ord("c")] = 0, 1, 2
    class_of[256] = 4
    transitions = np.array(
        [
            [1, -1, -1, -1, -1],  # 0 --a--> 1
            [-1, 1, 2, -1, -1],  # 1 --b--> 1, --c--> 2
            [-1, -1, -1, -1, 3],  # 2 accepting, --<tool>--> 3
            [-1, -1, -1, -1, -1],  # 3 accepting
        ],
        dtype=np.int32,
    )
    accepting = np.array([False, False, True, True])
    return fa.Dfa(transitions, accepting, class_of, (TOOL_OPEN,))


_DIGITS = fa.byte_set([(0x30, 0x39)])
_STRING = fa.concat(
    fa.literal(b'"'),
    fa.repeat(fa.union(fa.chars([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]), fa.literal(b'\\"')), 0),
    fa.literal(b'"'),
)
COMPILED = {
    "literal": fa.literal(b'{"name": "get"}'),
    "union": fa.union(fa.literal(b"true"), fa.literal(b"false"), fa.literal(b"null")),
    "digits": fa.concat(fa.optional(fa.literal(b"-")), fa.repeat(_DIGITS, 1, 6)),
    "utf8_chars": fa.repeat(fa.chars([(0xE9, 0xE9), (0x4E00, 0x9FFF), (0x1F600, 0x1F64F)]), 1, 3),
    "json_object": fa.concat(
        fa.literal(b"{"),
        fa.optional(
            fa.concat(
                _STRING,
                fa.literal(b":"),
                fa.union(_STRING, fa.repeat(_DIGITS, 1)),
                fa.repeat(fa.concat(fa.literal(b", "), _STRING, fa.literal(b":"), _STRING), 0),
            )
        ),
        fa.literal(b"}"),
    ),
    "tool_call": fa.concat(
        fa.special(TOOL_OPEN), fa.literal(b'{"a": '), fa.repeat(_DIGITS, 1), fa.literal(b"}"), fa.special(TOOL_CLOSE)
    ),
    "spaces": fa.concat(fa.repeat(fa.literal(b" "), 0, 20), fa.literal(b"x")),
}


@pytest.fixture(scope="module", params=["hand_made", *COMPILED])
def dfa(request):
    if request.param == "hand_made":
        return hand_made_dfa()
    return fa.compile(COMPILED[request.param])


# ---------------------------------------------------------------------------------------------------------------------
# Exactness


def test_mask_equals_oracle_at_every_state(dfa, vocab):
    index = TokenIndex(dfa, vocab)
    assert index.n_words == -(-SYN_VOCAB_SIZE // 32)
    for s in range(dfa.n_states):
        mask = index.mask_for_state(s)
        assert mask.dtype == np.int32 and mask.shape == (index.n_words,)
        assert unpack(mask) == oracle_allowed(dfa, vocab, s), f"state {s}"


def test_eos_padding_and_specials(dfa, vocab):
    index = TokenIndex(dfa, vocab, eager=True)
    for s in range(dfa.n_states):
        allowed = unpack(index.mask_for_state(s))
        assert (EOS in allowed) == bool(dfa.accepting[s])
        assert not any(t >= vocab.n_tokens for t in allowed)
        assert UNUSED not in allowed and 903 not in allowed  # unnamed special, unused slot
        for t in (TOOL_OPEN, TOOL_CLOSE):
            if t not in dfa.specials:
                assert t not in allowed


def test_lazy_equals_eager(dfa, vocab):
    lazy, eager = TokenIndex(dfa, vocab), TokenIndex(dfa, vocab, eager=True)
    for s in reversed(range(dfa.n_states)):
        assert np.array_equal(lazy.mask_for_state(s), eager.mask_for_state(s))
    lazy_table, lazy_rows = lazy.mask_table()
    eager_table, eager_rows = eager.mask_table()
    assert (eager_rows >= 0).all() and (lazy_rows >= 0).all()
    for s in range(dfa.n_states + 1):
        assert np.array_equal(lazy_table[lazy_rows[s]], eager_table[eager_rows[s]])


def test_mask_table_deduplicates(vocab):
    # Ten states in a row that each allow exactly one byte-class: "aaaaaaaaaa" has ten equal masks but one accepting.
    dfa = fa.compile(fa.repeat(fa.literal(b"z"), 10, 10))
    index = TokenIndex(dfa, vocab, eager=True)
    table, rows = index.mask_table()
    assert table.dtype == np.int32 and table.shape[1] == index.n_words
    distinct = {index.mask_for_state(s).tobytes() for s in range(dfa.n_states)} | {index.start().mask().tobytes()}
    finished = index.start()
    for _ in range(10):
        finished.advance(ord("z"))
    finished.advance(EOS)
    distinct.add(finished.mask().tobytes())
    assert table.shape[0] == len(distinct)
    assert len({table[r].tobytes() for r in range(table.shape[0])}) == table.shape[0]


def test_masks_are_read_only(vocab):
    index = TokenIndex(hand_made_dfa(), vocab)
    with pytest.raises(ValueError):
        index.start().mask()[0] = 0


# ---------------------------------------------------------------------------------------------------------------------
# The cursor


def test_advance_agrees_with_mask_everywhere(dfa, vocab):
    index = TokenIndex(dfa, vocab)
    ids = list(range(SYN_VOCAB_SIZE)) + [-1, SYN_VOCAB_SIZE + 5]
    for s in range(dfa.n_states):
        allowed = unpack(index.mask_for_state(s))
        for t in ids:
            cursor = TokenState(index, s)
            if t in allowed:
                cursor.advance(t)
                if t in dfa.specials and dfa.transitions[s, dfa.class_of[256 + dfa.specials.index(t)]] >= 0:
                    assert cursor.dfa_state == dfa.step_symbol(s, 256 + dfa.specials.index(t))
                elif t == EOS:
                    assert cursor.is_finished() and cursor.is_accepting()
                else:
                    assert cursor.dfa_state == dfa.step(s, vocab.token_bytes[t])
            else:
                with pytest.raises(MaskViolation) as info:
                    cursor.advance(t)
                assert info.value.token_id == t and info.value.dfa_state == s
                assert cursor.dfa_state == s and not cursor.is_finished()


def test_cursor_generates_a_tool_call_and_finishes(vocab):
    dfa = fa.compile(COMPILED["tool_call"])
    index = TokenIndex(dfa, vocab)
    cursor = index.start()
    assert unpack(cursor.mask()) == {TOOL_OPEN}
    with pytest.raises(MaskViolation):
        cursor.advance(EOS)
    cursor.advance(TOOL_OPEN)
    for byte in b'{"a": 42}':
        assert byte in set(cursor.allowed_token_ids().tolist())
        cursor.advance(byte)
    assert not cursor.is_accepting()
    assert cursor.allowed_token_ids().tolist() == [TOOL_CLOSE]
    beam = cursor.fork()
    cursor.advance(TOOL_CLOSE)
    assert cursor.is_accepting() and not cursor.is_finished()
    assert cursor.allowed_token_ids().tolist() == [EOS]
    cursor.advance(EOS)
    assert cursor.is_finished() and cursor.allowed_token_ids().tolist() == [EOS]
    cursor.advance(EOS)  # padding a finished row with EOS is tolerated
    with pytest.raises(MaskViolation) as info:
        cursor.advance(ord("a"))
    assert info.value.token_bytes == b"a"
    assert beam.allowed_token_ids().tolist() == [TOOL_CLOSE] and not beam.is_finished()
    table, rows = index.mask_table()
    assert np.array_equal(table[cursor.mask_row()], cursor.mask())
    assert cursor.mask_row() == rows[dfa.n_states]


def test_multibyte_token_walk(vocab):
    dfa = fa.compile(COMPILED["utf8_chars"])
    index = TokenIndex(dfa, vocab)
    cursor = index.start()
    allowed = set(cursor.allowed_token_ids().tolist())
    whole = [t for t in allowed if vocab.token_bytes[t] in ("中".encode(), "é".encode(), "😀".encode())]
    partial = [t for t in allowed if len(vocab.token_bytes[t]) == 1]
    assert whole and partial  # single lead bytes are allowed: the character may finish in the next token
    cursor.advance(partial[0])
    assert not cursor.is_accepting()
    assert all(0x80 <= vocab.token_bytes[t][0] <= 0xBF for t in cursor.allowed_token_ids().tolist())


# ---------------------------------------------------------------------------------------------------------------------
# Random grammars and random walks (Hypothesis)

_LEAVES = st.sampled_from(
    [
        fa.literal(b'"'),
        fa.literal(b"ab"),
        fa.literal(b"  "),
        fa.byte_set([(0x30, 0x39)]),
        fa.byte_set([(0x61, 0x7A), (0x20, 0x20)]),
        fa.chars([(0x80, 0x7FF)]),
        fa.chars([(0x4E00, 0x4E10), (0x1F600, 0x1F601)]),
        fa.special(TOOL_OPEN),
    ]
)
_EXPRS = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=3).map(lambda parts: fa.concat(*parts)),
        st.lists(inner, min_size=2, max_size=3).map(lambda parts: fa.union(*parts)),
        st.tuples(inner, st.integers(0, 2), st.one_of(st.none(), st.integers(2, 4))).map(
            lambda a: fa.repeat(a[0], a[1], a[2])
        ),
    ),
    max_leaves=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expr=_EXPRS, seed=st.integers(0, 2**16))
def test_random_walks_match_oracle(vocab, expr, seed):
    dfa = fa.compile(expr, max_states=500)
    if dfa.is_empty:
        return
    index = TokenIndex(dfa, vocab, eager=bool(seed & 1))
    rng = random.Random(seed)
    cursor = index.start()
    for _ in range(6):
        expected = oracle_allowed(dfa, vocab, cursor.dfa_state)
        assert set(cursor.allowed_token_ids().tolist()) == expected
        choices = sorted(expected - {EOS})
        if not choices:
            break
        cursor.advance(rng.choice(choices))


# ---------------------------------------------------------------------------------------------------------------------
# Construction errors, sharing, pickling, cache


def test_dfa_naming_a_non_special_token_is_rejected(vocab):
    class_of = np.zeros(257, dtype=np.int32)
    class_of[256] = 1
    dfa = fa.Dfa(np.array([[-1, 1], [-1, -1]], dtype=np.int32), np.array([False, True]), class_of, (65,))
    with pytest.raises(InternalError):
        TokenIndex(dfa, vocab)


def test_bad_state_raises(vocab):
    dfa = hand_made_dfa()
    index = TokenIndex(dfa, vocab)
    for state in (-1, dfa.n_states + 1, 99):
        with pytest.raises(InternalError):
            index.mask_for_state(state)
    assert unpack(index.mask_for_state(dfa.n_states)) == {EOS}  # the finished pseudo-state


def test_empty_language_is_rejected(vocab):
    with pytest.raises(InternalError):
        TokenIndex(fa.compile(fa.NOTHING), vocab)


def test_copy_is_a_fork(vocab):
    cursor = TokenIndex(hand_made_dfa(), vocab).start()
    twin = copy.copy(cursor)
    cursor.advance(ord("a"))
    assert twin.dfa_state == 0 and cursor.dfa_state == 1


def test_pickle_round_trip(vocab):
    dfa = fa.compile(COMPILED["json_object"])
    index = TokenIndex(dfa, vocab)
    index.mask_for_state(dfa.start)
    clone = pickle.loads(pickle.dumps(index))
    assert clone.n_words == index.n_words
    for s in range(dfa.n_states):
        assert np.array_equal(clone.mask_for_state(s), index.mask_for_state(s))
    cursor = clone.start()
    cursor.advance(ord("{"))
    assert cursor.dfa_state == dfa.step(dfa.start, b"{")


def test_concurrent_lazy_fill(vocab):
    dfa = fa.compile(COMPILED["json_object"])
    index = TokenIndex(dfa, vocab)
    reference = TokenIndex(dfa, vocab, eager=True)
    errors = []

    def worker(order):
        try:
            for s in order:
                assert np.array_equal(index.mask_for_state(s), reference.mask_for_state(s))
        except AssertionError as err:
            errors.append(err)

    orders = [random.Random(i).sample(range(dfa.n_states), dfa.n_states) for i in range(4)]
    threads = [threading.Thread(target=worker, args=(o,)) for o in orders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    table, rows = index.mask_table()
    assert table.shape[0] == len({table[r].tobytes() for r in rows})


def test_cache_hits_misses_and_eviction_by_bytes(vocab):
    builds = []

    def builder(name):
        def build():
            builds.append(name)
            return fa.compile(COMPILED[name])

        return build

    one = TokenIndex(fa.compile(COMPILED["literal"]), vocab, eager=True).nbytes()
    cache = IndexCache(max_bytes=int(one * 2.5))
    a = cache.get_or_build("literal", vocab, builder("literal"), eager=True)
    assert cache.get_or_build("literal", vocab, builder("literal")) is a
    assert (cache.hits, cache.misses, builds) == (1, 1, ["literal"])
    cache.get_or_build("union", vocab, builder("union"), eager=True)
    cache.get_or_build("literal", vocab, builder("literal"))  # touch: "union" is now least recent
    cache.get_or_build("json_object", vocab, builder("json_object"), eager=True)  # too big to keep beside the others
    assert cache.evictions >= 1
    assert cache.nbytes() <= cache.max_bytes
    assert (vocab.fingerprint, "union") not in cache
    other = make_vocab(SYN_TOKENS[:300], vocab_size=320)
    cache.get_or_build("literal", other, builder("literal"))
    assert builds.count("literal") == 2  # keyed by vocabulary fingerprint too
    stats = cache.stats()
    assert stats.entries == len(cache) and stats.bytes == cache.nbytes() <= stats.max_bytes == cache.max_bytes
    assert (stats.hits, stats.misses, stats.evictions) == (cache.hits, cache.misses, cache.evictions)


def test_oversized_index_is_returned_but_not_kept(vocab):
    cache = IndexCache(max_bytes=10)
    index = cache.get_or_build("k", vocab, lambda: hand_made_dfa())
    assert isinstance(index, TokenIndex) and len(cache) == 0 and cache.evictions == 1
    assert (cache.stats().entries, cache.stats().bytes, cache.stats().evictions) == (0, 0, 1)


# ---------------------------------------------------------------------------------------------------------------------
# Real tokenizers (fixtures from tests/conftest.py)


def _real_vocab(request, name):
    try:
        return request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.skip(f"fixture {name} is not defined yet (tests/conftest.py)")


@pytest.mark.parametrize("name", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab"])
def test_real_vocabulary_matches_oracle(request, name):
    vocab = _real_vocab(request, name)
    dfa = fa.compile(COMPILED["json_object"])
    index = TokenIndex(dfa, vocab)
    rng = random.Random(1)
    sample = rng.sample(range(vocab.n_tokens), min(20_000, vocab.n_tokens))
    # States: start, after `{`, inside a string, after a key's closing quote and colon, in digits.
    states = {dfa.start}
    for prefix in (b"{", b'{"', b'{"ab', b'{"ab":', b'{"ab":12', b'{"ab":"x'):
        states.add(dfa.step(dfa.start, prefix))
    n_byte_tokens_allowed_in_string = 0
    for s in states:
        allowed = unpack(index.mask_for_state(s))
        special = vocab.special_ids | set(vocab.eos_ids)
        # Every allowed byte token walks; a random sample of all tokens agrees both ways.
        for t in allowed - special:
            assert dfa.step(s, vocab.token_bytes[t]) >= 0
        for t in sample:
            data = vocab.token_bytes[t]
            expected = t not in special and bool(data) and dfa.step(s, data) >= 0
            expected = expected or (t in vocab.eos_ids and bool(dfa.accepting[s]))
            assert (t in allowed) == expected, (s, t, data)
        assert not any(t >= vocab.n_tokens for t in allowed)
        if s == dfa.step(dfa.start, b'{"ab'):
            n_byte_tokens_allowed_in_string = len(allowed)
    assert n_byte_tokens_allowed_in_string > vocab.n_tokens // 2


@pytest.mark.parametrize("name", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab"])
def test_real_vocabulary_eager_equals_lazy(request, name):
    # eager walks structural states many at a time and string states one at a time; lazy walks each state alone
    vocab = _real_vocab(request, name)
    dfa = fa.compile(fa.concat(fa.literal(b'{"name":"get_weather","arguments":'), COMPILED["json_object"], fa.literal(b"}")))
    lazy, eager = TokenIndex(dfa, vocab), TokenIndex(dfa, vocab, eager=True)
    for s in range(dfa.n_states):
        assert np.array_equal(lazy.mask_for_state(s), eager.mask_for_state(s)), s
    assert lazy.min_tokens_from_start() == eager.min_tokens_from_start()


def test_dense_rows_are_found_by_hash_and_compared(llama3_vocab):
    """A dense row (more nonzero words than a sparse key holds) is entered in the deduplication table by its key's
    hash, and the row itself is compared on a hit: under a forced hash collision the new mask gets a row of its own,
    found again by its whole key. `nbytes` counts the keys and patches held."""
    from constrain import native

    vocab = llama3_vocab
    dfa = fa.compile(COMPILED["json_object"])
    index = TokenIndex(dfa, vocab)
    inside = dfa.step(dfa.start, b'{"ab')
    row = index.row_for_state(inside)
    words = index.mask_for_state(inside).copy()
    assert native.sparse_key(words)[:1] == b"f"
    assert index._insert_row(words.copy()) == row
    other = words.copy()
    other[3] ^= 1 << 7
    index._row_key[hash(native.sparse_key(other))] = row  # its hash names the first row
    new = index._insert_row(other)
    assert new != row and np.array_equal(index._row_words(new), other)
    assert index._insert_row(other.copy()) == new and index._insert_row(words.copy()) == row
    assert native.sparse_key(other) in index._row_key  # (entered by its whole key)
    assert index._key_bytes + 8 == sum(len(k) if isinstance(k, bytes) else 8 for k in index._row_key)  # (+ the forced)
    assert index._patch_bytes == sum(len(p) for p in index._patches if p is not None)


def test_qwen3_tool_call_special_tokens(qwen3_vocab):
    vocab = qwen3_vocab
    tool_open, tool_close = vocab.special_tokens["<tool_call>"], vocab.special_tokens["</tool_call>"]
    dfa = fa.compile(
        fa.concat(fa.special(tool_open), fa.literal(b'\n{"a": '), fa.repeat(_DIGITS, 1), fa.literal(b"}\n"),
                  fa.special(tool_close))
    )
    index = TokenIndex(dfa, vocab)
    cursor = index.start()
    assert cursor.allowed_token_ids().tolist() == [tool_open]
    cursor.advance(tool_open)
    text = b'\n{"a": 42}\n'
    while text:  # greedy longest allowed token, as a tokenizer might split it
        allowed = cursor.allowed_token_ids().tolist()
        fits = [t for t in allowed if text.startswith(vocab.token_bytes[t])]
        best = max(fits, key=lambda t: len(vocab.token_bytes[t]))
        cursor.advance(best)
        text = text[len(vocab.token_bytes[best]) :]
    assert cursor.allowed_token_ids().tolist() == [tool_close]
    with pytest.raises(MaskViolation):
        cursor.fork().advance(vocab.special_tokens["<|im_end|>"])
    cursor.advance(tool_close)
    assert set(cursor.allowed_token_ids().tolist()) == set(vocab.eos_ids)
