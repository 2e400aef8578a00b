"""Token budgets: min_tokens equals a BFS over tokens, budgeted masks equal an oracle, budgeted walks always finish."""

from __future__ import annotations

import collections
import json
import math
import pickle
import random
import re
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain import automaton as fa
from constrain import index as index_module
from constrain.errors import InternalError, MaskViolation
from constrain.index import NO_COMPLETION, TokenIndex, TokenState
from constrain.schema import compile_schema
from constrain.vocabulary import Vocabulary
from paths import DATA  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------------
# Synthetic vocabulary: 256 single bytes, JSON-ish multi-byte tokens (so token and byte distances differ), specials.

_PIECES = [b'{"', b'"}', b'": ', b'", "', b"name", b"get", b"tr", b"true", b"fal", b"se", b"null", b"12", b"345",
           b"  ", b"    ", b"ab", b"bbb", b"bc", b'{"a": ', b"}\n", "中".encode(), "é".encode()[:1], b'"x"']
EOS, TOOL_OPEN, TOOL_CLOSE, IM_END = 300, 301, 302, 303


def _synthetic_tokens(seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    tokens = [bytes([b]) for b in range(256)] + _PIECES
    alphabet = b'{}[]":, abcdefnlrstu0123456789'
    seen = set(tokens)
    while len(tokens) < 300:
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(2, 5)))
        if data not in seen:
            seen.add(data)
            tokens.append(data)
    return tokens[:300] + [b"<|eos|>", b"<tool>", b"</tool>", b"<|im_end|>"]


SYN_TOKENS = _synthetic_tokens()


@pytest.fixture(scope="module")
def vocab():
    return Vocabulary.from_token_bytes(SYN_TOKENS, special_ids=(EOS, TOOL_OPEN, TOOL_CLOSE, IM_END),
                                       eos_ids=(EOS, IM_END), vocab_size=len(SYN_TOKENS) + 13)


_DIGITS = fa.byte_set([(0x30, 0x39)])
_STRING = fa.concat(fa.literal(b'"'), fa.repeat(fa.chars([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)]), 0),
                    fa.literal(b'"'))
GRAMMARS = {
    "literal": fa.literal(b'{"name": "get"}'),
    "union": fa.union(fa.literal(b"true"), fa.literal(b"false"), fa.literal(b"null")),
    "digits": fa.concat(fa.optional(fa.literal(b"-")), fa.repeat(_DIGITS, 1, 6)),
    "ab_star_c": fa.concat(fa.literal(b"a"), fa.repeat(fa.literal(b"b"), 0), fa.literal(b"c")),
    "json_object": fa.concat(
        fa.literal(b"{"),
        fa.optional(fa.concat(_STRING, fa.literal(b": "), fa.union(_STRING, fa.repeat(_DIGITS, 1)),
                              fa.repeat(fa.concat(fa.literal(b", "), _STRING, fa.literal(b": "), _STRING), 0))),
        fa.literal(b"}"),
    ),
    "tool_call": fa.concat(fa.special(TOOL_OPEN), fa.literal(b'{"a": '), fa.repeat(_DIGITS, 1), fa.literal(b"}"),
                           fa.special(TOOL_CLOSE), fa.optional(fa.special(TOOL_OPEN))),
    # <|im_end|> is both EOS and named by the grammar: as a symbol it may start a second round.
    "special_is_eos": fa.concat(fa.literal(b"x"), fa.repeat(fa.concat(fa.special(IM_END), fa.literal(b"yy")), 0, 2)),
    "spaces": fa.concat(fa.repeat(fa.literal(b" "), 0, 20), fa.literal(b"x")),
}


@pytest.fixture(scope="module", params=list(GRAMMARS))
def dfa(request):
    return fa.compile(GRAMMARS[request.param])


@pytest.fixture(params=["table", "searched"])
def searched(request, monkeypatch):
    """Both ways an index answers budgets: its whole min_tokens table (`SEARCHED_DISTANCES` off, as without the C
    walk), or searches from the states asked (the default)."""
    monkeypatch.setattr(index_module, "SEARCHED_DISTANCES", request.param == "searched")
    return request.param == "searched"


# ---------------------------------------------------------------------------------------------------------------------
# Oracles, written without the trie: one Python walk per token, then a breadth-first search over DFA states.


def oracle_successors(dfa, vocab, state: int) -> dict[int, int]:
    """Allowed non-EOS-resolved token → the state after it (a grammar-named special takes its symbol first)."""
    out = {}
    for t, data in enumerate(vocab.token_bytes):
        if t in dfa.specials:
            nxt = dfa.step_symbol(state, 256 + dfa.specials.index(t))
            if nxt >= 0:
                out[t] = nxt
            continue
        if t in vocab.special_ids or t in vocab.eos_ids or not data:
            continue
        nxt = dfa.step(state, data)
        if nxt >= 0:
            out[t] = nxt
    return out


def oracle_min_tokens(dfa, vocab) -> list[float]:
    """Fewest tokens to acceptance from each state: a forward BFS per state over token successors."""
    succ = [oracle_successors(dfa, vocab, s) for s in range(dfa.n_states)]
    out: list[float] = []
    for start in range(dfa.n_states):
        seen, level, dist = {start}, {start}, 0
        while level and not any(dfa.accepting[s] for s in level):
            level = {d for s in level for d in succ[s].values()} - seen
            seen |= level
            dist += 1
        out.append(dist if level else math.inf)
    return out


def oracle_budget_allowed(dfa, vocab, state: int, budget: int, min_tokens: list[float]) -> set[int]:
    allowed = {t for t, nxt in oracle_successors(dfa, vocab, state).items() if min_tokens[nxt] <= budget - 1}
    if dfa.accepting[state]:
        allowed |= set(vocab.eos_ids)
    return allowed


def allowed_set(cursor: TokenState, budget: int | None = None) -> set[int]:
    return set(cursor.allowed_token_ids(budget).tolist())


# ---------------------------------------------------------------------------------------------------------------------
# Exactness on the synthetic vocabulary


def test_min_tokens_equals_bfs_over_tokens(dfa, vocab, searched):
    index = TokenIndex(dfa, vocab)
    expected = oracle_min_tokens(dfa, vocab)
    assert [index.min_tokens(s) for s in range(dfa.n_states)] == expected
    assert index.min_tokens_from_start() == expected[dfa.start]
    assert index.min_tokens(dfa.n_states) == 0  # the finished pseudo-state
    byte_distance = fa.shortest_distances(dfa)
    assert all(index.min_tokens(s) <= byte_distance[s] for s in range(dfa.n_states))  # every byte is a token
    assert (index._min_tokens is None) == searched  # searched: every distance found without the table


def test_budgeted_masks_equal_oracle(dfa, vocab, searched):
    index = TokenIndex(dfa, vocab, eager=not searched)  # (an eager index builds the table at construction)
    min_tokens = oracle_min_tokens(dfa, vocab)
    for s in range(dfa.n_states):
        cursor = TokenState(index, s)
        horizon = index.budget_horizon(s)
        costs = index.token_min_budget(s)
        assert costs.shape == (vocab.vocab_size,) and costs.dtype == np.int32
        for budget in range(horizon + 2):
            expected = oracle_budget_allowed(dfa, vocab, s, budget, min_tokens)
            assert allowed_set(cursor, budget) == expected, (s, budget)
            assert set(np.flatnonzero(costs <= budget).tolist()) == expected
            if budget >= horizon:
                assert cursor.mask(budget) is cursor.mask()  # the cached row itself: no work on the hot path
            elif s != dfa.n_states and not set(dfa.specials) & set(vocab.eos_ids):
                assert allowed_set(cursor, budget) < allowed_set(cursor)  # the horizon is the least such budget
        assert np.array_equal(index.mask_for_state(s, horizon + 3), index.mask_for_state(s))
        table, _ = index.mask_table()
        assert np.array_equal(table[cursor.mask_row(max(horizon - 1, 0))], cursor.mask(max(horizon - 1, 0)))


def test_budget_none_leaves_masks_unchanged(dfa, vocab):
    fresh = TokenIndex(dfa, vocab)
    budgeted = TokenIndex(dfa, vocab)
    budgeted.min_tokens_from_start()
    for s in range(dfa.n_states):
        cursor = TokenState(budgeted, s)
        assert cursor.mask(None) is cursor.mask()
        assert np.array_equal(cursor.mask(), fresh.mask_for_state(s))
        cursor.mask(0)  # budgeted rows go into the same table; the unbudgeted rows stay
        assert np.array_equal(budgeted.mask_for_state(s), fresh.mask_for_state(s))


def test_advance_with_budget_agrees_with_mask(dfa, vocab, searched):
    index = TokenIndex(dfa, vocab)
    ids = list(range(vocab.vocab_size))
    for s in range(dfa.n_states):
        for budget in range(index.budget_horizon(s) + 1):
            allowed = allowed_set(TokenState(index, s), budget)
            for t in ids:
                cursor = TokenState(index, s)
                if t in allowed:
                    cursor.advance(t, budget=budget)
                    assert cursor.is_finished() or index.min_tokens(cursor.dfa_state) <= budget - 1
                else:
                    with pytest.raises(MaskViolation):
                        cursor.advance(t, budget=budget)
                    assert cursor.dfa_state == s and not cursor.is_finished()


def test_bound_covers_min_tokens_and_every_horizon(dfa, vocab, searched):
    # `_bounds` (one completion's tokens, no trie walk) never undercuts the exact table, and from its free_from on every
    # budgeted mask is the unbudgeted row; `completes_within` says what the exact minimum says, at every budget.
    index = TokenIndex(dfa, vocab)
    bound, free_from = index._bounds()
    exact = oracle_min_tokens(dfa, vocab)
    assert all(b >= e for b, e in zip(bound, exact)) and bound[dfa.n_states] == 0
    path = fa.shortest_distances(dfa).tolist()  # every byte is a token of this vocabulary
    assert all(b <= p for b, p in zip(bound, path))
    assert free_from == max(bound) + 1 > max(index.budget_horizon(s) for s in range(dfa.n_states + 1)) - 1
    for budget in range(free_from + 2):
        assert TokenIndex(dfa, vocab).completes_within(budget) == (exact[dfa.start] <= budget)
    for s in range(dfa.n_states):
        cursor = TokenState(index, s)
        assert cursor.mask(free_from) is cursor.mask()


def test_without_the_c_library_the_bound_is_the_path_length(dfa, vocab, monkeypatch):
    from constrain import native

    monkeypatch.setattr(native, "automata", lambda: None)
    bound, free_from = TokenIndex(dfa, vocab)._bounds()
    assert bound[: dfa.n_states] == fa.shortest_distances(dfa).tolist() and free_from == max(bound) + 1


def test_budgets_past_the_bound_never_build_the_table(dfa, vocab, searched):
    # Under a budget no state can bind (free_from on), a budgeted walk reads only rows a plain walk reads: the exact
    # table (one trie walk per state) is never built, and the masks are the unbudgeted ones of a fresh index.
    index, plain = TokenIndex(dfa, vocab), TokenIndex(dfa, vocab)
    free_from = index._bounds()[1]
    assert index.completes_within(free_from)
    for seed in range(4):
        rng = random.Random(seed)
        cursor, budget = index.start(), free_from + 30
        for _ in range(30):
            allowed = cursor.allowed_token_ids(budget).tolist()
            assert allowed == TokenState(plain, cursor.dfa_state).allowed_token_ids().tolist()
            content = [t for t in allowed if t not in vocab.eos_ids]
            if not content or (cursor.is_accepting() and rng.random() < 0.2):
                break
            cursor.advance(rng.choice(content), budget=budget)
            budget -= 1
    assert index._min_tokens is None
    # a budget that can bind at once: the table is built (under the caller's deadline), or the start searched
    assert index.completes_within(free_from - 1) == (index.min_tokens_from_start() <= free_from - 1)
    assert (index._min_tokens is None) == searched


def test_a_large_automaton_searches_its_budgets_instead_of_a_table(vocab):
    # no table is built for 10k states (it would walk every one): a budget at or past the start's bound fits without a
    # trie walk, and near the end of its budget a cursor's masks are searched from the states it meets
    n = 10_001
    tail = b'{"name": "get"}, "x": [1, 2]}'  # several tokens of this vocabulary: budgets bind on the way to it
    dfa = fa.compile(fa.concat(fa.repeat(fa.union(fa.literal(b"ab"), fa.literal(b"c")), 0, n // 2), fa.literal(tail)))
    assert dfa.n_states > 10_000
    index = TokenIndex(dfa, vocab)
    low = index._bounds()[0][dfa.start]
    assert index.completes_within(low) and index._min_tokens is None and not index._dests_of
    assert index.completes_within(low - 1) == (index.min_tokens_from_start() <= low - 1)
    rng = random.Random(0)
    for _ in range(3):
        cursor, budget = index.start(), 40
        while True:
            allowed = cursor.allowed_token_ids(budget).tolist()
            expected = oracle_budget_allowed(dfa, vocab, cursor.dfa_state, budget,
                                             _window_min_tokens(dfa, vocab, cursor.dfa_state, budget))
            assert set(allowed) == expected, (cursor.dfa_state, budget)
            content = [t for t in allowed if t not in vocab.eos_ids]
            if not content or (cursor.is_accepting() and rng.random() < 0.3):
                break
            cursor.advance(rng.choice(content), budget=budget)
            budget -= 1
    assert index._min_tokens is None and 0 < len(index._dests_of) < 2_000  # only the states near the cursor's way


def test_the_shortest_output_is_bounded_when_its_exact_search_runs_long(vocab):
    # at least 5,000 "ab"/"c" repeats (~2,500+ tokens at best): the exact minimum is a search through thousands of
    # states; given no time, the bounds proven so far, which a later exact search confirms
    dfa = fa.compile(fa.concat(fa.repeat(fa.union(fa.literal(b"ab"), fa.literal(b"c")), 5_000, 5_010), fa.literal(b"!")))
    index = TokenIndex(dfa, vocab)
    assert not index.completes_within(100)
    lo, hi = index.min_tokens_range_from_start(within_s=0.0)
    assert 100 < lo < hi  # not searched to the end (a bound loose at this size)
    exact = index.min_tokens_from_start()
    assert lo <= exact <= hi
    assert index.min_tokens_range_from_start() == (exact, exact)  # known now
    fresh = TokenIndex(dfa, vocab)
    outer = fa.Deadline(0.0)
    with pytest.raises(fa.BudgetExceeded), outer.active():  # the caller's own deadline still stops it
        fresh.min_tokens_range_from_start(within_s=10.0)


def _window_min_tokens(dfa, vocab, state: int, budget: int) -> dict[int, float]:
    """`min_tokens` of the states within `budget` tokens of `state`, capped at `budget` (the oracle's BFS, forward
    from each; what a budgeted mask there reads)."""
    succ: dict[int, dict[int, int]] = {}

    def successors(s: int) -> dict[int, int]:
        if s not in succ:
            succ[s] = oracle_successors(dfa, vocab, s)
        return succ[s]

    out: dict[int, float] = {}
    for first in set(successors(state).values()):
        seen, level, dist = {first}, {first}, 0
        while level and dist < budget and not any(dfa.accepting[s] for s in level):
            level = {d for s in level for d in successors(s).values()} - seen
            seen |= level
            dist += 1
        out[first] = dist if level and any(dfa.accepting[s] for s in level) else math.inf
    return collections.defaultdict(lambda: math.inf, out)


def _budgeted_walk(index: TokenIndex, budget: int, rng: random.Random, eos_ids) -> tuple[TokenState, list[int]]:
    """Random tokens from the budgeted masks, stopping at random once accepting; asserts the mask never empties."""
    cursor = index.start()
    tokens: list[int] = []
    remaining = budget
    while True:
        allowed = cursor.allowed_token_ids(budget=remaining).tolist()
        content = [t for t in allowed if t not in eos_ids]
        if cursor.is_accepting():
            assert set(eos_ids) <= set(allowed)
            if not content or remaining == 0 or rng.random() < 0.15:
                return cursor, tokens
        assert content, f"stuck with {remaining} of {budget} tokens left in state {cursor.dfa_state}"
        t = rng.choice(content)
        cursor.advance(t, budget=remaining)
        tokens.append(t)
        remaining -= 1


@pytest.mark.parametrize("extra", [0, 1, 5, 20])
def test_budgeted_random_walks_finish_in_budget(dfa, vocab, extra, searched):
    index = TokenIndex(dfa, vocab)
    budget = index.min_tokens_from_start() + extra
    for seed in range(8):
        cursor, tokens = _budgeted_walk(index, budget, random.Random(seed), vocab.eos_ids)
        assert cursor.is_accepting() and len(tokens) <= budget
    assert (index._min_tokens is None) == searched


def test_below_minimum_nothing_but_eos_is_allowed(dfa, vocab, searched):
    index = TokenIndex(dfa, vocab)
    low = index.min_tokens_from_start()
    cursor = index.start()
    for budget in range(low):
        assert allowed_set(cursor, budget) == set()  # not accepting (min > 0): not even EOS
    assert allowed_set(cursor, low)


def test_eos_is_free(vocab):
    index = TokenIndex(fa.compile(GRAMMARS["ab_star_c"]), vocab)
    cursor = index.start()
    assert allowed_set(cursor, 1) == set() and index.min_tokens_from_start() == 2
    cursor.advance(ord("a"), budget=2)
    assert vocab.token_bytes.index(b"bc") in allowed_set(cursor, 1)  # "bc" finishes in one token
    assert allowed_set(cursor, 1) == {ord("c"), vocab.token_bytes.index(b"bc")}
    cursor.advance(ord("c"), budget=1)
    assert allowed_set(cursor, 0) == {EOS, IM_END}  # accepting: EOS costs nothing, even with no budget left
    cursor.advance(EOS, budget=0)
    assert cursor.is_finished() and allowed_set(cursor, 0) == {EOS, IM_END}


def test_special_that_is_also_eos_resolves_as_eos_when_over_budget(vocab):
    dfa = fa.compile(GRAMMARS["special_is_eos"])
    index = TokenIndex(dfa, vocab)
    cursor = index.start()
    cursor.advance(ord("x"))
    assert IM_END in allowed_set(cursor, 0)
    over = cursor.fork()
    over.advance(IM_END, budget=2)  # as a symbol it needs 1 + 2 ("y", "y") tokens: over budget, so it is EOS
    assert over.is_finished()
    cursor.advance(IM_END, budget=3)  # fits as a symbol
    assert not cursor.is_finished() and index.min_tokens(cursor.dfa_state) == 2


def test_vocabulary_missing_a_byte(vocab):
    # "d" is no token: after "c" the grammar cannot finish, so budgets exclude "c" that the plain mask allows.
    tokens = [bytes([b]) if b != ord("d") else b"" for b in range(256)] + [b"<|eos|>"]
    small = Vocabulary.from_token_bytes(tokens, special_ids=(256,), eos_ids=(256,))
    dfa = fa.compile(fa.union(fa.literal(b"ab"), fa.literal(b"cd")))
    index = TokenIndex(dfa, small)
    start = index.start()
    assert allowed_set(start) == {ord("a"), ord("c")}
    assert index.budget_horizon(dfa.start) == NO_COMPLETION
    for budget in (2, 3, 1000):
        assert allowed_set(start, budget) == {ord("a")}
    assert index.token_min_budget(dfa.start)[ord("c")] == NO_COMPLETION
    with pytest.raises(MaskViolation):
        start.fork().advance(ord("c"), budget=1000)
    with pytest.raises(InternalError):
        index.min_tokens(dfa.step(dfa.start, b"c"))
    assert index.min_tokens_from_start() == 2


def test_bad_inputs_raise(vocab):
    index = TokenIndex(fa.compile(GRAMMARS["literal"]), vocab)
    for state in (-1, index.dfa.n_states + 1):
        with pytest.raises(InternalError):
            index.min_tokens(state)
        with pytest.raises(InternalError):
            index.budget_horizon(state)
    with pytest.raises(InternalError):
        index.start().mask(-1)
    with pytest.raises(InternalError):
        index.start().advance(ord("{"), budget=-1)


def test_pickle_keeps_budget_tables(vocab):
    dfa = fa.compile(GRAMMARS["json_object"])
    index = TokenIndex(dfa, vocab)
    cursor = index.start()
    low = index.min_tokens_from_start()
    before = cursor.mask(low).copy()
    clone = pickle.loads(pickle.dumps(index))
    assert clone.min_tokens_from_start() == low
    assert np.array_equal(clone.start().mask(low), before)
    states = range(dfa.n_states)
    assert [clone.budget_horizon(s) for s in states] == [index.budget_horizon(s) for s in states]
    assert np.array_equal(TokenIndex(dfa, vocab).start().mask(low), before)


_LEAVES = st.sampled_from([fa.literal(b'"'), fa.literal(b"ab"), fa.literal(b"  "), fa.byte_set([(0x30, 0x39)]),
                           fa.byte_set([(0x61, 0x7A)]), fa.chars([(0x4E00, 0x4E10)]), fa.special(TOOL_OPEN),
                           fa.literal(b"true"), fa.literal(b'{"')])
_EXPRS = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=3).map(lambda parts: fa.concat(*parts)),
        st.lists(inner, min_size=2, max_size=3).map(lambda parts: fa.union(*parts)),
        st.tuples(inner, st.integers(0, 2), st.one_of(st.none(), st.integers(2, 4))).map(
            lambda a: fa.repeat(a[0], a[1], a[2])),
    ),
    max_leaves=6,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expr=_EXPRS, seed=st.integers(0, 2**16), extra=st.sampled_from([0, 1, 5, 20]))
def test_random_grammars_min_tokens_and_walks(vocab, expr, seed, extra):
    dfa = fa.compile(expr, max_states=300)
    if dfa.is_empty:
        return
    index = TokenIndex(dfa, vocab, eager=bool(seed & 1))
    assert index.min_tokens_from_start() == oracle_min_tokens(dfa, vocab)[dfa.start]
    budget = index.min_tokens_from_start() + extra
    cursor, tokens = _budgeted_walk(index, budget, random.Random(seed), vocab.eos_ids)
    assert cursor.is_accepting() and len(tokens) <= budget


# ---------------------------------------------------------------------------------------------------------------------
# Real tokenizers on real tool schemas (BFCL simple_python)

_BFCL = str(DATA / "bfcl" / "openai" / "simple_python.jsonl")
_SCHEMA_LINES = (0, 5, 100, 250)


@pytest.fixture(scope="module")
def bfcl_dfas():
    with open(_BFCL) as f:  # the shared data is a required input: missing, the test fails
        rows = [json.loads(line) for line in f]
    return [compile_schema(rows[i]["tools"][0]["function"]["parameters"]).dfa for i in _SCHEMA_LINES]


def _vocab(request, name):
    return request.getfixturevalue(name)


def _byte_tokens_by_length(vocab) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    groups: dict[int, list[int]] = {}
    excluded = vocab.special_ids | set(vocab.eos_ids)
    for t, data in enumerate(vocab.token_bytes):
        if data and t not in excluded:
            groups.setdefault(len(data), []).append(t)
    return {n: (np.asarray(ids), np.frombuffer(b"".join(vocab.token_bytes[t] for t in ids), np.uint8).reshape(-1, n))
            for n, ids in groups.items()}


def brute_force_min_tokens(dfa, vocab) -> int:
    """Forward BFS from the start over every token of the vocabulary, stepping each token's bytes (no trie)."""
    groups = _byte_tokens_by_length(vocab)
    trans = np.vstack([dfa.transitions, np.full((1, dfa.n_classes), -1, dfa.transitions.dtype)])  # -1 row: dead
    cls = np.asarray(dfa.class_of[:256])
    seen, level, dist = {dfa.start}, {dfa.start}, 0
    while not any(dfa.accepting[s] for s in level):
        nxt = set()
        for s in level:
            for _, mat in groups.values():
                cur = np.full(mat.shape[0], s)
                for j in range(mat.shape[1]):
                    cur = trans[cur, cls[mat[:, j]]]
                nxt.update(np.unique(cur[cur >= 0]).tolist())
            nxt.update(int(dfa.step_symbol(s, 256 + i)) for i in range(len(dfa.specials)))
        level = nxt - seen - {-1}
        assert level, "no completion"
        seen |= level
        dist += 1
    return dist


def shortest_witness(index: TokenIndex) -> list[int]:
    """A shortest output, token by token: each step takes a token whose completion needs one token less."""
    cursor, out = index.start(), []
    while not cursor.is_accepting():
        need = index.min_tokens(cursor.dfa_state)
        costs = index.token_min_budget(cursor.dfa_state)
        t = int(np.flatnonzero(costs == need)[0])
        cursor.advance(t, budget=need)
        out.append(t)
    return out


@pytest.mark.parametrize("name", ["qwen3_vocab", "llama3_vocab"])
def test_real_vocab_min_tokens_on_tool_schemas(request, name, bfcl_dfas):
    vocab = _vocab(request, name)
    max_len = max(len(d) for t, d in enumerate(vocab.token_bytes) if t not in vocab.special_ids)
    for k, dfa in enumerate(bfcl_dfas):
        index = TokenIndex(dfa, vocab)
        low = index.min_tokens_from_start()
        byte_distance = int(fa.shortest_distances(dfa)[dfa.start])
        assert -(-byte_distance // max_len) <= low <= byte_distance
        witness = shortest_witness(index)
        text = b"".join(vocab.token_bytes[t] for t in witness)
        assert len(witness) == low and dfa.matches(text)
        assert isinstance(json.loads(text), dict)
        if k < 2:  # the independent brute force costs about a second per schema
            assert brute_force_min_tokens(dfa, vocab) == low
        assert allowed_set(index.start(), low - 1) == set()


@pytest.mark.parametrize("name", ["qwen3_vocab", "llama3_vocab"])
def test_real_vocab_bound_is_above_the_exact_table(request, name, bfcl_dfas):
    vocab = _vocab(request, name)
    for dfa in bfcl_dfas:
        index = TokenIndex(dfa, vocab)
        bound, free_from = index._bounds()
        assert index._min_tokens is None  # the bound walks no token
        states = range(len(bound))  # the index's own states (counted strings' markers contracted) and the finished one
        exact = [index.min_tokens(s) for s in states]
        assert all(b >= e for b, e in zip(bound, exact))
        assert free_from > max(index.budget_horizon(s) for s in states) - 1
        low, high = index.min_tokens_from_start(), bound[index.start().dfa_state]
        for budget in (low - 1, low, high - 1, high):
            assert TokenIndex(dfa, vocab).completes_within(budget) == (low <= budget)


@pytest.mark.parametrize("name", ["qwen3_vocab", "llama3_vocab"])
def test_real_vocab_budgeted_walks(request, name, bfcl_dfas, searched):
    vocab = _vocab(request, name)
    for dfa in bfcl_dfas[:3]:
        index = TokenIndex(dfa, vocab)
        low = index.min_tokens_from_start()
        for extra in (0, 1, 5, 20):
            for seed in range(3):
                cursor, tokens = _budgeted_walk(index, low + extra, random.Random(seed), vocab.eos_ids)
                text = b"".join(vocab.token_bytes[t] for t in tokens)
                assert cursor.is_accepting() and len(tokens) <= low + extra and dfa.matches(text)
                json.loads(text)


# ---------------------------------------------------------------------------------------------------------------------
# Compile deadlines: one `Deadline` bounds (and can cancel) a whole compile_index, index build included. The bounds
# below are generous "stops within" checks on a loaded 2-core machine, not timings.

_STOP_BOUND_S = 2.0  # how long past its deadline (or cancel) a compile may take to stop


def _tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _one(prop: dict) -> dict:
    return {"type": "object", "properties": {"v": prop}, "required": ["v"]}


def _intersected_patterns_policy():
    """Ten intersected `.*c.*` patterns: the automaton (~115k states) compiles in seconds, its min_tokens table
    over the Qwen3 vocabulary takes most of a minute."""
    from constrain import Policy

    schema = _one({"allOf": [{"type": "string", "pattern": f".*{c}.*"} for c in "abcdefghij"]})
    return Policy.from_request({"tools": [_tool("intersected", schema)], "tool_choice": "required"})


def _compile_in_thread(policy, vocab, deadline, **kwargs):
    from constrain.compiler import compile_index

    box: dict = {}

    def run() -> None:
        try:
            box["index"] = compile_index(policy, vocab, tool_format="hermes", thinking=False, eager=True,
                                         deadline=deadline, **kwargs)
        except fa.BudgetExceeded as err:
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_deadline_stops_the_index_build(qwen3_vocab):
    from constrain.compiler import compile_index

    deadline = fa.Deadline(4.0)
    with pytest.raises(fa.BudgetExceeded) as info:
        compile_index(_intersected_patterns_policy(), qwen3_vocab, tool_format="hermes", thinking=False, eager=True,
                      cache=None, deadline=deadline)
    assert time.monotonic() - deadline.expires_at < _STOP_BOUND_S
    assert info.value.code == "budget_exceeded"
    assert info.value.pointer.startswith("/tools")  # the index (`/tools`) or the tool's schema (`/tools/0/...`)


def test_cancel_from_another_thread_stops_the_compile_and_caches_nothing(qwen3_vocab):
    from constrain.cache import IndexCache

    cache = IndexCache()
    deadline = fa.Deadline()  # no time limit: only the cancel stops it
    thread, box = _compile_in_thread(_intersected_patterns_policy(), qwen3_vocab, deadline, cache=cache)
    thread.join(3.0)
    assert thread.is_alive(), "the compile finished before the cancel: this test needs a slower one"
    cancelled_at = time.monotonic()
    deadline.cancel()
    thread.join(_STOP_BOUND_S)
    assert not thread.is_alive(), f"the compile still ran {time.monotonic() - cancelled_at:.1f} s after cancel()"
    assert "index" not in box and box["error"].code == "budget_exceeded"
    assert len(cache) == 0
    # the cache itself still works: a small policy compiles and is kept
    from constrain import Policy
    from constrain.compiler import compile_index

    small = Policy.from_request({"tools": [_tool("small", _one({"type": "boolean"}))], "tool_choice": "required"})
    compile_index(small, qwen3_vocab, tool_format="hermes", thinking=False, cache=cache, deadline=fa.Deadline(60))
    assert len(cache) == 1


def test_cancelled_before_it_starts_compiles_nothing(qwen3_vocab):
    """A compile too small to reach one of the automaton's clock reads still honours a cancel."""
    from constrain import Policy
    from constrain.cache import IndexCache
    from constrain.compiler import compile_index

    cache = IndexCache()
    small = Policy.from_request({"tools": [_tool("tiny", _one({"type": "null"}))], "tool_choice": "required"})
    deadline = fa.Deadline()
    deadline.cancel()
    with pytest.raises(fa.BudgetExceeded) as info:
        compile_index(small, qwen3_vocab, tool_format="hermes", thinking=False, cache=cache, deadline=deadline)
    assert info.value.pointer == "/tools" and len(cache) == 0


def test_one_deadline_bounds_many_slow_tools(qwen3_vocab):
    """128 tools whose schemas take seconds each (a nested bounded repetition, distinct per tool so no compiled
    sub-automaton is shared): each fits its own 10 s schema budget, the sum does not fit the request's deadline."""
    from constrain import Policy
    from constrain.compiler import compile_index

    tools = [_tool(f"slow_{i}", _one({"type": "string", "pattern": f"^deadline{i}((a{{1,12}}){{1,12}}){{1,12}}$"}))
             for i in range(128)]
    policy = Policy.from_request({"tools": tools, "tool_choice": "required"})
    deadline = fa.Deadline(4.0)
    with pytest.raises(fa.BudgetExceeded) as info:
        compile_index(policy, qwen3_vocab, tool_format="hermes", thinking=False, cache=None, deadline=deadline)
    assert time.monotonic() - deadline.expires_at < _STOP_BOUND_S
    # it stopped inside one tool's schema, and says which
    assert re.fullmatch(r"/tools/\d+/function/parameters(/.*)?", info.value.pointer), info.value.pointer


def test_json_schema_and_regex_compiles_take_a_deadline_too(vocab):
    from constrain.cache import IndexCache
    from constrain.compiler import compile_json_schema, compile_regex

    cache = IndexCache()
    cancelled = fa.Deadline()
    cancelled.cancel()
    with pytest.raises(fa.BudgetExceeded):
        compile_json_schema({"type": "string", "maxLength": 3}, vocab, cache=cache, deadline=cancelled)
    with pytest.raises(fa.BudgetExceeded):
        compile_regex("[ab]{2}", vocab, cache=cache, deadline=cancelled)
    assert len(cache) == 0
    index = compile_regex("[ab]{2}", vocab, cache=cache, deadline=fa.Deadline(60))
    assert index.dfa.matches(b"ab") and len(cache) == 1
