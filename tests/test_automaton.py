"""Byte automata: random expressions against Python's `re` as the oracle."""

import copy
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from constrain import automaton as fa

ALPHABET = b"abc"


def _leaf():
    return st.one_of(
        st.sampled_from(ALPHABET).map(lambda b: (fa.literal(bytes([b])), re.escape(chr(b)))),
        st.just((fa.byte_set([(97, 98)]), "[ab]")),
        st.just((fa.EMPTY, "(?:)")),
    )


def _extend(children):
    pair = st.tuples(children, children)
    return st.one_of(
        pair.map(lambda p: (fa.concat(p[0][0], p[1][0]), f"(?:{p[0][1]})(?:{p[1][1]})")),
        pair.map(lambda p: (fa.union(p[0][0], p[1][0]), f"(?:{p[0][1]}|{p[1][1]})")),
        st.tuples(children, st.integers(0, 3), st.integers(0, 2)).map(
            lambda t: (fa.repeat(t[0][0], t[1], t[1] + t[2]), f"(?:{t[0][1]}){{{t[1]},{t[1] + t[2]}}}")
        ),
        children.map(lambda c: (fa.repeat(c[0], 0), f"(?:{c[1]})*")),
        children.map(lambda c: (fa.optional(c[0]), f"(?:{c[1]})?")),
    )


EXPRS = st.recursive(_leaf(), _extend, max_leaves=8)
WORDS = st.lists(st.binary(min_size=0, max_size=7).map(lambda b: bytes(ALPHABET[x % 3] for x in b)), min_size=20, max_size=40)


@settings(max_examples=150, deadline=None)
@given(EXPRS, WORDS)
def test_compiled_automaton_agrees_with_re(expr_and_regex, words):
    expr, pattern = expr_and_regex
    dfa = fa.compile(expr)
    oracle = re.compile(pattern.encode())
    for word in words + fa.accepted_strings(dfa, limit=20, max_len=8):
        assert dfa.matches(word) == bool(oracle.fullmatch(word)), (pattern, word)


@settings(max_examples=150, deadline=None)
@given(EXPRS, st.integers(0, 3))
def test_unbounded_repetition_built_on_one_node_equals_distinct_copies(x, lo):
    """x{lo,} (lo - 1 copies, then one copy of x looping on itself) and x* (x looping on the repetition's entry),
    determinised whole, against the same language spelt with distinct objects (no copy shared). (Not `re`: it
    backtracks exponentially on some of these nested patterns.)"""
    budget = fa._Budget(10**6, None, "")
    shared = fa._determinised(fa.union(fa.repeat(x[0], lo), fa.literal(b"c")), budget)
    copies = [copy.deepcopy(x[0]) for _ in range(lo + 1)]  # new objects all through: nothing built once for both
    spelt = fa._Concat(tuple(copies[:lo]) + (fa._Repeat(copies[lo], 0, None),))
    distinct = fa._determinised(fa.union(spelt, fa.literal(b"c")), budget)
    assert fa.compile(fa.difference(shared, distinct)).is_empty
    assert fa.compile(fa.difference(distinct, shared)).is_empty


@settings(max_examples=60, deadline=None)
@given(EXPRS, EXPRS, WORDS)
def test_intersection_and_difference(a, b, words):
    ia = fa.compile(fa.intersect(a[0], b[0]))
    da = fa.compile(fa.difference(a[0], b[0]))
    ra, rb = re.compile(a[1].encode()), re.compile(b[1].encode())
    for word in words:
        in_a, in_b = bool(ra.fullmatch(word)), bool(rb.fullmatch(word))
        assert ia.matches(word) == (in_a and in_b)
        assert da.matches(word) == (in_a and not in_b)


@settings(max_examples=60, deadline=None)
@given(EXPRS)
def test_result_is_trimmed_and_minimal(expr_and_regex):
    dfa = fa.compile(expr_and_regex[0])
    if dfa.is_empty:
        return
    # every state reachable and co-reachable
    dist = fa.shortest_distances(dfa)
    assert (dist < np.iinfo(np.int64).max).all()
    # minimal: recompiling the DFA as an expression gives the same number of states
    assert fa.compile(fa.concat(dfa)).n_states == dfa.n_states


@pytest.mark.parametrize(
    "lo,hi",
    [(0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, 0x10FFFF), (0xD000, 0xE100), (0x41, 0x1F600), (0x3B1, 0x3C9)],
)
def test_chars_is_exact_utf8(lo, hi):
    dfa = fa.compile(fa.chars([(lo, hi)]))
    rng = np.random.default_rng(lo)
    probes = {lo, hi, lo - 1, hi + 1, 0xD7FF, 0xD800, 0xDFFF, 0xE000, *rng.integers(0, 0x110000, 300).tolist()}
    for cp in probes:
        if 0 <= cp <= 0x10FFFF and not 0xD800 <= cp <= 0xDFFF:
            assert dfa.matches(chr(cp).encode()) == (lo <= cp <= hi), hex(cp)
    # surrogates and overlong / invalid encodings never match
    for bad in (b"\xed\xa0\x80", b"\xc0\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\xff"):
        assert not dfa.matches(bad)


def test_text_without():
    dfa = fa.compile(fa.text_without(b"</think>"))
    assert dfa.matches("reasoning </thin k> done ✓".encode())
    assert not dfa.matches(b"a </think> b")
    assert dfa.matches(b"</think")  # a prefix of the forbidden text is fine


def test_specials_are_symbols_not_bytes():
    dfa = fa.compile(fa.concat(fa.literal(b"x"), fa.special(151657)))
    assert dfa.specials == (151657,)
    s = dfa.step(dfa.start, b"x")
    assert dfa.step_symbol(s, dfa.special_symbol(151657)) >= 0
    assert not dfa.matches(b"x")


def test_budget_exceeded_is_typed():
    expr = fa.repeat(fa.chars([(0, 0x10FFFF)]), 0, 5000)
    with pytest.raises(fa.BudgetExceeded):
        fa.compile(expr, max_states=1000)


def test_substitute_maps_bytes_to_languages():
    dfa = fa.compile(fa.substitute(fa.repeat(fa.byte_set([(97, 99)]), 0), {ord("b"): fa.literal(b"XY")}))
    assert dfa.matches(b"aXYc") and not dfa.matches(b"abc")


def test_dfa_pickles():
    import pickle

    dfa = fa.compile(fa.repeat(fa.literal(b"ab"), 1, 3))
    clone = pickle.loads(pickle.dumps(dfa))
    assert clone == dfa and clone.matches(b"abab")


def _two_lists(n):
    item = fa.union(fa.literal(b"true"), fa.repeat(fa.byte_set([(48, 57)]), 1, 6))
    return fa.concat(fa.literal(b"["), fa.repeat(fa.concat(item, fa.literal(b",")), 0, n), fa.literal(b"]"))


def test_structurally_equal_expressions_compile_to_the_same_automaton():
    fa.clear_compiled()
    cold = fa.compile(_two_lists(40))
    warm = fa.compile(_two_lists(40))  # built again: other objects, the same language tree
    assert warm == cold
    fa.clear_compiled()
    assert fa.compile(_two_lists(40)) == cold
    assert fa.compile(_two_lists(41)) != cold


@pytest.mark.parametrize("warm_first", [False, True])
def test_shared_sub_automata_keep_the_state_budget(warm_first):
    # A sub-automaton compiled before under a large budget must fail a smaller budget exactly as a cold build does.
    fa.clear_compiled()
    expr = fa.concat(fa.literal(b"<"), fa.repeat(fa.chars([(0, 0x10FFFF)]), 0, 2000), fa.literal(b">"))
    if warm_first:
        big = fa.compile(expr, max_states=100_000)
        assert big.matches("<héllo>".encode())
    with pytest.raises(fa.BudgetExceeded):
        fa.compile(fa.concat(fa.literal(b"<"), fa.repeat(fa.chars([(0, 0x10FFFF)]), 0, 2000), fa.literal(b">")),
                   max_states=1000)


def test_deadline_is_enforced():
    import time

    fa.clear_compiled()
    expr = fa.repeat(fa.concat(fa.literal(b"<"), fa.repeat(fa.chars([(0, 0x10FFFF)]), 0, 50), fa.literal(b">")), 1, 40)
    with pytest.raises(fa.BudgetExceeded) as info:
        fa.compile(expr, deadline=time.monotonic() - 1.0, pointer="/x")
    assert info.value.pointer == "/x"


def test_compile_leaves_the_garbage_collector_as_it_was():
    import gc

    assert gc.isenabled()
    fa.compile(_two_lists(3))
    assert gc.isenabled()
    with pytest.raises(fa.BudgetExceeded):
        fa.compile(fa.repeat(fa.chars([(0, 0x10FFFF)]), 0, 5000), max_states=1000)
    assert gc.isenabled()
    gc.disable()
    try:
        fa.compile(_two_lists(4))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_budget_error_names_the_innermost_sub_expression_it_was_building():
    lower = fa.byte_set([(ord("a"), ord("z"))])
    long_run = fa.repeat(lower, 0, 1_000_000)  # its NFA alone passes the state budget
    expr = fa.concat(fa.literal(b"x"), long_run, fa.literal(b"y"))
    pointers = {id(long_run): "/properties/v/maxLength", id(expr): "/properties/v"}
    with pytest.raises(fa.BudgetExceeded) as info:
        fa.compile(expr, max_states=100_000, pointer="", pointers=pointers)
    assert info.value.pointer == "/properties/v/maxLength"
    with pytest.raises(fa.BudgetExceeded) as info:
        fa.compile(expr, max_states=100_000, pointer="/root")
    assert info.value.pointer == "/root"
    # a determinisation blow-up belongs to the whole expression being determinised
    ab = fa.byte_set([(ord("a"), ord("b"))])
    blowup = fa.concat(fa.repeat(ab, 0), fa.literal(b"a"), fa.repeat(ab, 20, 20))
    outer = fa.concat(fa.literal(b"q"), blowup)
    with pytest.raises(fa.BudgetExceeded) as info:
        fa.compile(outer, max_states=10_000, pointers={id(outer): "/pattern"})
    assert info.value.pointer == "/pattern"


def test_an_active_deadline_stops_a_compile():
    ab = fa.byte_set([(ord("a"), ord("b"))])
    blowup = fa.concat(fa.repeat(ab, 0), fa.literal(b"a"), fa.repeat(ab, 18, 18))  # ~2^19 states: seconds of work
    deadline = fa.Deadline()
    deadline.cancel()
    with deadline.active(), pytest.raises(fa.BudgetExceeded) as info:
        fa.compile(blowup, max_states=10_000_000, pointer="/tools/0/function/parameters")
    assert info.value.code == "budget_exceeded" and info.value.pointer == "/tools/0/function/parameters"
    with fa.Deadline(0.0).active(), pytest.raises(fa.BudgetExceeded):
        fa.compile(blowup, max_states=10_000_000)
    # outside `active()` the same deadline does not apply
    assert fa.compile(fa.literal(b"ok")).matches(b"ok")
    assert fa.active_deadlines() == ()


_CODE = {ord("a"): fa.literal(b"ab"), ord("b"): fa.literal(b"ac")}  # a prefix code whose first byte is mapped


@settings(max_examples=80, deadline=None)
@given(EXPRS, WORDS)
def test_prefix_code_substitution_equals_the_subset_construction(expr_and_regex, words):
    # spliced into the DFA directly (`_substituted`) vs built as NFA paths and determinised
    expr = fa.substitute(expr_and_regex[0], _CODE)
    direct = fa.compile(expr)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fa, "_prefix_code", lambda mapping: None)
        fa.clear_compiled()
        via_nfa = fa.compile(fa.substitute(expr_and_regex[0], _CODE))
    fa.clear_compiled()
    assert fa.compile(fa.difference(direct, via_nfa)).is_empty
    assert fa.compile(fa.difference(via_nfa, direct)).is_empty
    oracle = re.compile(expr_and_regex[1].encode())
    for word in words:
        assert direct.matches(word.replace(b"a", b"\0").replace(b"b", b"ac").replace(b"\0", b"ab")) == bool(oracle.fullmatch(word))


def test_prefix_code_requires_literals_that_are_prefix_free_and_start_mapped():
    lit = fa.literal
    assert fa._prefix_code(((0x22, lit(b'\\"')), (0x5C, lit(b"\\\\")))) is not None  # JSON's escapes
    assert fa._prefix_code(((ord("b"), lit(b"XY")),)) is None  # starts with an unmapped byte
    assert fa._prefix_code(((ord("a"), lit(b"a")), (ord("b"), lit(b"ab")))) is None  # "a" is a prefix of "ab"
    assert fa._prefix_code(((ord("a"), fa.repeat(lit(b"a"), 1, 2)),)) is None  # not a literal
    assert fa._prefix_code(((ord("a"), fa.EMPTY),)) is None  # empty


def test_json_string_escapes_spliced_into_a_dfa():
    import json

    from constrain import syntax

    body = fa.repeat(fa.union(fa.byte_set([(0, 0x7F)]), fa.chars([(0xE9, 0xE9)])), 0, 3)
    dfa = fa.compile(syntax.encode_string(body))
    for text in ["", 'a"b', "\\", "\n\t\x01", "é\x1f", "\u007f"]:
        assert dfa.matches(json.dumps(text, ensure_ascii=False).encode()), text
    for raw in [b'"\n"', b'"a\\"', b'"\\u001F"', b'"\\/"', b'"abcd"']:
        assert not dfa.matches(raw), raw


@pytest.mark.parametrize("n", [300, 9000])
@pytest.mark.parametrize("keys", ["float", "int64", "collide"])
def test_unique_columns_groups_equal_columns(monkeypatch, keys, n):
    """Equal classes are merged by hashing columns (float64 keys, exact for a DFA table of this size; int64 keys
    beyond); a hash collision (forced: all weights zero) must fall back to an exact grouping, never merge two
    different columns."""
    rng = np.random.default_rng(7)
    base = rng.integers(-1, n, size=(n, 9)).astype(np.int32)
    table = base[:, [0, 3, 1, 3, 8, 0, 2, 8, 5, 4, 4, 7, 6]]  # 13 columns, 9 distinct
    if keys == "collide":
        monkeypatch.setattr(fa, "_COLUMN_WEIGHTS", np.zeros(max(n, 4096), np.int32))
        monkeypatch.setattr(fa, "_COLUMN_WEIGHTS_INT", np.zeros(max(n, 4096), np.int64))  # (the native merge's)
    if keys == "int64":
        monkeypatch.setattr(fa, "_FLOAT_KEYS_MAX", 0)
    columns, inverse = fa._unique_columns(table)
    assert columns.shape == (n, 9)
    assert np.array_equal(columns[:, inverse], table)
    assert len({columns[:, j].tobytes() for j in range(columns.shape[1])}) == 9


@pytest.mark.parametrize("n", [1, 37, 5000, 300_000])
def test_native_unique_columns_equal_the_numpy_merge(n):
    """The C merge of equal columns gives the numpy one's result exactly (same distinct columns in the same order,
    same inverse), on tables with -1 entries, repeated columns and one column; past `_FLOAT_KEYS_MAX` rows both key in
    int64."""
    from constrain import native

    if native.automata() is None:
        pytest.skip("the native automaton passes are not built here (no C compiler)")
    rng = np.random.default_rng(n)
    for k in (1, 2, 13, 300):
        base = rng.integers(-1, n, size=(n, max(k // 3, 1))).astype(np.int32)
        table = np.ascontiguousarray(base[:, rng.integers(0, base.shape[1], size=k)])
        columns, inverse = fa._unique_columns(table)
        weights = fa._COLUMN_WEIGHTS[:n] if n <= len(fa._COLUMN_WEIGHTS) else fa._column_weights(n)
        expect_columns, expect_inverse = fa._unique_columns_numpy(table, weights)
        assert np.array_equal(columns, expect_columns) and np.array_equal(inverse, expect_inverse)
        assert np.array_equal(columns[:, inverse], table)


def test_glue_all_writes_what_pairwise_gluing_gives():
    """`_glue_all` (one pass) against gluing two at a time with `_glue`: parts that start with a loop back to their
    start, parts that accept at their start, and parts that overlap (None)."""
    exprs = [fa.literal(b"ab"), fa.repeat(fa.literal(b"xy"), 0), fa.optional(fa.literal(b"q")),
             fa.concat(fa.literal(b"c"), fa.repeat(fa.byte_set([(48, 57)]), 1)), fa.repeat(fa.literal(b"z"), 1),
             fa.literal(b"a")]
    dfas = [fa.compile(e) for e in exprs]
    budget = fa._Budget(10**6, None, "")
    for order in ([0, 1, 2, 3], [1, 4, 0], [2, 2, 3, 5], [3, 1, 4, 1, 0], [5, 0], [0, 5, 1], [1, 1], [4, 4], [0, 2, 2]):
        _, _, parts = fa._aligned([dfas[i] for i in order])
        one = fa._glue_all(parts, budget)
        two = parts[0]
        for part in parts[1:]:
            two = None if two is None else fa._glue(two, part)
        assert (one is None) == (two is None), order
        if one is not None:
            assert np.array_equal(one.table, two.table) and np.array_equal(one.accepting, two.accepting), order
            assert one.start == two.start, order


@settings(max_examples=150, deadline=None)
@given(EXPRS, EXPRS)
def test_shortest_text_is_the_shortest_accepted_string(expr_and_regex, other):
    """`fa.shortest_text` (read off the expression tree, before any compile) is exact for bytes, concatenations, unions
    and repetitions, also over compiled parts, and a lower bound through intersections and differences."""
    expr = expr_and_regex[0]
    dfa = fa.compile(expr)
    exact = fa.NO_TEXT if dfa.is_empty else int(fa.shortest_distances(dfa)[dfa.start])
    assert fa.shortest_text(expr) == exact
    assert fa.shortest_text(fa.concat(dfa, fa.literal(b"xy"))) == min(exact + 2, fa.NO_TEXT)
    for combined in (fa.intersect(expr, other[0]), fa.difference(expr, other[0])):
        got = fa.compile(combined)
        if not got.is_empty:
            assert fa.shortest_text(combined) <= int(fa.shortest_distances(got)[got.start])


@settings(max_examples=150, deadline=None)
@given(EXPRS, EXPRS)
def test_the_measuring_walk_sizes_as_the_compiler_does(expr_and_regex, other):
    """`fa.measure`'s size (what an array's count decision reads) is the compiler's part size `fa.size`; its shortest
    text and markers are `fa.shortest_text` and `fa.has_markers`, checked against compiled automata above and below."""
    counted = fa.concat(fa.literal(b'"'), fa.counted_chars(600, fa.byte_set([(97, 122)])), fa.literal(b'"'),
                        fa.counted_close())
    expr, more = expr_and_regex[0], other[0]
    for e in (expr, fa.concat(expr, counted), fa.union(fa.repeat(more, 1, 3), expr), fa.intersect(expr, more),
              fa.difference(more, expr), fa.concat(fa.compile(expr), fa.literal(b"q"), fa.special(7))):
        assert fa.measure(e)[0] == fa.size(e)


def test_has_markers_finds_markers_at_any_depth():
    item = fa.union(fa.literal(b"ab"), fa.repeat(fa.concat(fa.literal(b"c"), fa.special(5)), 0))
    assert not fa.has_markers(item) and not fa.has_markers(fa.compile(item))
    counted = fa.concat(fa.literal(b'"'), fa.counted_chars(600, fa.byte_set([(97, 122)])), fa.literal(b'"'),
                        fa.counted_close())
    for expr in (counted, fa.repeat(fa.union(item, counted), 0, 3), fa.intersect(fa.repeat(fa.ANY_CHAR, 0), counted)):
        assert fa.has_markers(expr)
    assert fa.has_markers(fa.compile(counted))
