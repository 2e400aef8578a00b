"""The native automaton passes (`constrain.native`): the C subset construction and Hopcroft minimisation give the
same minimal automata as the numpy passes, keep the state and time budgets, and stop when cancelled."""

import concurrent.futures
import ctypes
import json
import pickle
import shutil
import threading
import time
from collections import deque
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import constrain
from constrain import automaton as fa
from constrain import index as cindex
from constrain import native
from constrain.cache import IndexCache
from constrain.errors import ConstrainError
from constrain.index import TokenIndex
from constrain.schema import compile_schema

from corpus import OPTIONS, jsonschemabench, sample
from test_automaton import _extend, _leaf

BIG_EXPRS = st.recursive(_leaf(), _extend, max_leaves=14)


def test_the_native_passes_are_built_where_a_compiler_is():
    if shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None:
        pytest.skip("no C compiler on this machine: the numpy passes run instead")
    assert native.automata() is not None


@contextmanager
def numpy_passes():
    """Compile with the numpy/Python passes (and an empty shared cache, which would hand back native results)."""
    saved = native._state.get("lib", "unset")
    native._state["lib"] = None
    fa.clear_compiled()
    try:
        yield
    finally:
        if saved == "unset":
            native._state.pop("lib", None)
        else:
            native._state["lib"] = saved
        fa.clear_compiled()


def canonical(dfa: fa.Dfa) -> tuple:
    """The automaton up to renumbering: states in breadth-first order from the start, classes by their first symbol.
    Two minimal DFAs of one language have the same canonical form."""
    if dfa.is_empty:
        return ()
    first_symbol: dict[int, int] = {}
    for symbol, c in enumerate(dfa.class_of.tolist()):
        first_symbol.setdefault(c, symbol)
    classes = sorted(first_symbol, key=first_symbol.get)
    ids = {dfa.start: 0}
    queue = deque([dfa.start])
    rows = []
    while queue:
        s = queue.popleft()
        row = [bool(dfa.accepting[s])]
        for c in classes:
            t = int(dfa.transitions[s, c])
            if t >= 0 and t not in ids:
                ids[t] = len(ids)
                queue.append(t)
            row.append(ids[t] if t >= 0 else -1)
        rows.append(tuple(row))
    symbols = tuple(first_symbol[c] for c in dfa.class_of.tolist())
    return dfa.specials, symbols, tuple(rows)


@settings(max_examples=200, deadline=None)
@given(BIG_EXPRS)
def test_native_and_numpy_passes_build_the_same_minimal_automaton(expr_and_regex):
    expr = expr_and_regex[0]
    assert native.automata() is not None
    fa.clear_compiled()
    fast = fa.compile(expr)
    with numpy_passes():
        slow = fa.compile(expr)
    assert canonical(fast) == canonical(slow)


@settings(max_examples=150, deadline=None)
@given(BIG_EXPRS, BIG_EXPRS)
def test_native_and_numpy_products_agree(a, b):
    """Intersection and difference (the product construction) both ways."""
    for make in (fa.intersect, fa.difference):
        fa.clear_compiled()
        fast = fa.compile(make(a[0], b[0]))
        with numpy_passes():
            slow = fa.compile(make(a[0], b[0]))
        assert canonical(fast) == canonical(slow)


def _outcome(schema) -> tuple:
    try:
        return ("compiled", canonical(compile_schema(schema, **OPTIONS).dfa))
    except ConstrainError as err:
        return (type(err).__name__, getattr(err, "pointer", None))


def test_native_and_numpy_passes_agree_on_real_schemas():
    """Two schemas per JSONSchemaBench subset: the same automaton (or the same typed error) both ways."""
    cases = sample(jsonschemabench(), 2, seed=7)
    assert len(cases) >= 20
    compiled = 0
    for case in cases:
        fa.clear_compiled()
        fast = _outcome(case.schema)
        with numpy_passes():
            slow = _outcome(case.schema)
        if "BudgetExceeded" in (fast[0], slow[0]):
            continue  # a time budget may run out on one side only (the numpy passes are slower)
        assert fast == slow, case.id
        compiled += fast[0] == "compiled"
    assert compiled >= len(cases) // 2


def _trimmed_random_dfa(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A random partial DFA of about `n` states over `k` classes, trimmed (every state reachable and co-reachable),
    with many equivalent states (targets drawn from a few 'shapes')."""
    while True:
        trans = rng.integers(-1, n, size=(n, k)).astype(np.int32)
        trans[rng.random((n, k)) < 0.4] = -1
        shapes = rng.integers(0, max(2, n // 4), size=n)
        trans = trans[shapes % n] if rng.random() < 0.5 else trans
        accepting = rng.random(n) < 0.3
        if not accepting.any():
            continue
        fwd = {0}
        queue = [0]
        while queue:
            s = queue.pop()
            for t in trans[s]:
                if t >= 0 and t not in fwd:
                    fwd.add(int(t))
                    queue.append(int(t))
        back = set(np.flatnonzero(accepting).tolist())
        changed = True
        while changed:
            changed = False
            for s in range(n):
                if s not in back and any(t in back for t in trans[s] if t >= 0):
                    back.add(s)
                    changed = True
        keep = sorted(fwd & back)
        if 0 not in keep:
            continue
        renumber = np.full(n + 1, -1, np.int32)
        renumber[keep] = np.arange(len(keep), dtype=np.int32)
        sub = renumber[trans[keep]]
        return np.ascontiguousarray(sub), accepting[keep]


@pytest.mark.parametrize("seed", range(40))
def test_hopcroft_partition_equals_the_exact_moore_refinement(seed):
    rng = np.random.default_rng(seed)
    trans, accepting = _trimmed_random_dfa(rng, int(rng.integers(2, 120)), int(rng.integers(1, 6)))
    block0 = accepting.astype(np.int64)
    block0, n0 = fa._in_order_of_appearance(block0)
    fast, n_fast = fa._in_order_of_appearance(native.automata().minimise(trans, block0, n0)[0])
    exact, n_exact = fa._refine_exact(trans, block0, n0, fa._Budget(10**9, None, ""))
    exact, n_exact2 = fa._in_order_of_appearance(exact)
    assert n_fast == n_exact == n_exact2
    assert (fast == exact).all()


@pytest.mark.parametrize("seed", range(30))
def test_distances_to_acceptance_agree_with_a_plain_search(seed):
    # `automaton.shortest_distances` over some classes (the token-budget bound without the C library): fewest steps
    # on the marked classes to an accepting state
    rng = np.random.default_rng(500 + seed)
    n, k = int(rng.integers(1, 150)), int(rng.integers(1, 7))
    trans = np.where(rng.random((n, k)) < 0.5, rng.integers(0, n, (n, k)), -1).astype(np.int32)
    accepting = rng.random(n) < 0.1
    use = rng.random(k) < 0.7
    expected = []
    for s in range(n):  # forwards from each state: the oracle shares no code with either pass
        none = np.iinfo(np.int64).max
        seen, frontier, level, found = {s}, [s], 0, none
        while frontier and found == none:
            if any(accepting[t] for t in frontier):
                found = level
            frontier = [d for t in frontier for c in range(k) if use[c] and (d := int(trans[t, c])) >= 0
                        and d not in seen and not seen.add(d)]
            level += 1
        expected.append(found)
    assert fa._fewest_steps(trans, accepting, use).tolist() == expected


@pytest.mark.parametrize("seed", range(40))
def test_native_finish_trims_and_minimises_like_the_numpy_passes(seed):
    """Untrimmed random DFAs (unreachable and dead states): the same minimal automaton, numbered breadth-first."""
    rng = np.random.default_rng(100 + seed)
    n, k = int(rng.integers(1, 80)), int(rng.integers(1, 5))
    trans = rng.integers(-1, n, size=(n, k)).astype(np.int32)
    trans[rng.random((n, k)) < 0.3] = -1
    accepting = rng.random(n) < 0.2
    class_of = np.arange(256, dtype=np.int32) % k
    start = int(rng.integers(0, n))
    budget = fa._Budget(10**9, None, "")
    fast = fa._finish(trans, accepting, class_of, (), start, budget)
    with numpy_passes():
        slow = fa._finish(trans, accepting, class_of, (), start, budget)
    assert canonical(fast) == canonical(slow)
    assert fast.is_empty or fast.start == 0


def _random_part(rng: np.random.Generator, k: int, layout: str) -> fa._Glued:
    """A small random DFA table over k classes; its start entered or not, accepting at it or not."""
    n = int(rng.integers(1, 12))
    table = rng.integers(-1, n, size=(n, k)).astype(np.int32)
    table[rng.random((n, k)) < 0.6] = -1
    start = int(rng.integers(0, n))
    if rng.random() < 0.6:
        table[table == start] = -1  # nothing enters the start: a glue leaves it out
    accepting = rng.random(n) < 0.35
    if layout == "F":
        table = np.asfortranarray(table)
    elif layout == "view":
        table = np.concatenate([table, table], axis=1)[:, ::2]  # a strided view (every other column)
    return fa._Glued(table, accepting, start)


@pytest.mark.parametrize("seed", range(60))
def test_native_glue_writes_what_the_numpy_glue_writes(seed):
    """`_glue_all` in C against its numpy pass: random parts (some repeated, as an array's items are; row-major,
    column-major or strided tables), random skips; the same table, flags and start, or None for both."""
    rng = np.random.default_rng(300 + seed)
    k = int(rng.integers(1, 6))
    pool = [_random_part(rng, k, str(rng.choice(["C", "F", "view"]))) for _ in range(4)]
    parts = [pool[int(i)] for i in rng.integers(0, len(pool), size=int(rng.integers(2, 8)))]
    skips = []
    for i in range(len(parts) - 2):
        if rng.random() < 0.4:
            skips.append((i, int(rng.integers(i + 2, len(parts) + 1))))
    budget = fa._Budget(10**9, None, "")
    fast = fa._glue_all(parts, budget, skips)
    with numpy_passes():
        slow = fa._glue_all(parts, budget, skips)
    assert (fast is None) == (slow is None)
    if fast is not None:
        assert np.array_equal(fast.table, slow.table) and np.array_equal(fast.accepting, slow.accepting)
        assert fast.start == slow.start


def test_native_glue_keeps_the_state_budget():
    """The C glue answers to the state budget as the numpy pass does: at the glued size it fits; one state less, or a
    budget below the parts' own sizes, raises on both paths."""
    _, _, parts = fa._aligned([fa.compile(fa.literal(text)) for text in (b"ab", b"cde", b"f", b"ghij", b"kl")])
    glued = fa._glue_all(parts, fa._Budget(10**9, None, ""))
    total = len(glued)
    assert total == 1 + 2 + 3 + 1 + 4 + 2  # each literal's states, every later start left out (nothing enters it)
    assert fa._glue_all(parts, fa._Budget(total, None, "")) is not None
    for limit in (total - 1, 3):
        with pytest.raises(fa.BudgetExceeded):
            fa._glue_all(parts, fa._Budget(limit, None, ""))
        with numpy_passes(), pytest.raises(fa.BudgetExceeded):
            fa._glue_all(parts, fa._Budget(limit, None, ""))


# -- budgets -----------------------------------------------------------------------------------------------------


def _blowup(width: int) -> fa.Expr:
    ab = fa.byte_set([(ord("a"), ord("b"))])
    return fa.concat(fa.repeat(ab, 0), fa.literal(b"a"), fa.repeat(ab, width, width))  # ~2^(width+1) states


def test_the_state_budget_stops_the_native_subset_construction():
    fa.clear_compiled()
    with pytest.raises(fa.BudgetExceeded) as info:
        fa.compile(_blowup(14), max_states=5_000, pointer="/p")
    assert "state budget of 5000 states" in str(info.value) and info.value.pointer == "/p"
    with numpy_passes(), pytest.raises(fa.BudgetExceeded) as slow:
        fa.compile(_blowup(14), max_states=5_000, pointer="/p")
    assert str(slow.value) == str(info.value)


def test_a_deadline_in_the_past_stops_the_native_subset_construction():
    fa.clear_compiled()
    with pytest.raises(fa.BudgetExceeded, match="time budget"):
        fa.compile(_blowup(20), max_states=10**7, deadline=time.monotonic() - 1.0)


def test_cancelling_stops_a_native_subset_construction_in_flight():
    """A compile of ~2^21 states (seconds of C) cancelled from another thread stops within a fraction of that."""
    fa.clear_compiled()
    deadline = fa.Deadline()
    timer = threading.Timer(0.2, deadline.cancel)
    started = time.monotonic()
    timer.start()
    try:
        with deadline.active(), pytest.raises(fa.BudgetExceeded, match="cancelled"):
            fa.compile(_blowup(20), max_states=10**7, pointer="/tools/0")
    finally:
        timer.cancel()
    assert time.monotonic() - started < 2.0


def test_native_determinise_reports_each_limit():
    lib = native.automata()
    # a -> b -> (final) over one class: three nodes, two edges reading mask 0 (class 0), no epsilon moves
    chain = (3, [], [], [0, 1], [0, 0], [1, 2], [[0]], 1)
    ok = lib.determinise(*chain, 0, 2, 10, None, [])
    assert ok[0] == native.DET_OK and ok[1].tolist() == [[1], [2], [-1]] and ok[2].tolist() == [False, False, True]
    assert lib.determinise(*chain, 0, 2, 1, None, [])[0] == native.DET_STATES
    flag = ctypes.c_int32(1)
    n = 40_000
    big = (n, [], [], list(range(n - 1)), [0] * (n - 1), list(range(1, n)), [[0]], 1)
    assert lib.determinise(*big, 0, n - 1, 10**6, None, [flag])[0] == native.DET_CANCELLED
    late = time.monotonic() - 1.0
    assert lib.determinise(*big, 0, n - 1, 10**6, late, [])[0] == native.DET_TIME
    # a block (an embedded DFA's edges as arrays) after the listed edges, and an epsilon move: 0 -eps-> 1 -a-> 2
    mixed = lib.determinise(3, [0], [1], [], [], [], [[0]], 1, 0, 2, 10, None, [],
                            [(1, np.array([0], np.int32), np.array([1], np.int32), np.array([0], np.int32))])
    assert mixed[0] == native.DET_OK and mixed[1].tolist() == [[1], [-1]] and mixed[2].tolist() == [False, True]


# -- the trie walk -----------------------------------------------------------------------------------------------


def _numpy_twin(index: TokenIndex) -> TokenIndex:
    """The same index with the numpy walks (a fresh one: no rows shared)."""
    twin = TokenIndex(index.dfa, index.vocab)
    twin._walker = None
    return twin


_WALK_SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["c", "f"]},
                                      "days": {"type": "integer", "minimum": 1, "maximum": 14}},
     "required": ["city"], "additionalProperties": False},
    {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1, "maxItems": 3},
]


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab", "phi3_vocab"])
@pytest.mark.parametrize("schema", _WALK_SCHEMAS, ids=["object", "emails"])
def test_native_walk_gives_the_numpy_masks_destinations_and_token_costs(request, vocab_name, schema):
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(schema, whitespace="compact").dfa
    # a special token on an edge too: `<tok>` + the schema, with the vocabulary's first special id
    special = sorted(vocab.special_ids - set(vocab.eos_ids))[0]
    dfa = fa.compile(fa.concat(fa.special(special), fa.optional(fa.literal(b" ")), dfa))
    index = TokenIndex(dfa, vocab)
    assert index._walker is not None
    twin = _numpy_twin(index)
    rng = np.random.default_rng(0)
    states = sorted(set(rng.choice(dfa.n_states, size=min(60, dfa.n_states), replace=False).tolist()) | {dfa.start})
    for s in states:
        assert np.array_equal(index.mask_for_state(s), twin.mask_for_state(s)), s
        words, key, dests, _ = index._walker.mask(s, share=False)
        walk = twin._walk(s)
        assert np.array_equal(words.view(np.int32), twin._compute_mask(s, walk))
        assert key == native.sparse_key(words) and np.array_equal(np.sort(dests), twin._destinations(s, walk))
    assert np.array_equal(index._budget_tables()[0], twin._budget_tables()[0])
    for s in states[:10]:
        assert np.array_equal(index._token_costs(s), twin._token_costs(s)), s
    # rows deduplicate across both key forms (sparse and full)
    assert len(index.mask_table()[0]) == len({r.tobytes() for r in index.mask_table()[0]})


# -- structural states filled in one call at construction ------------------------------------------------------

_PREFILL_SCHEMAS = [
    _WALK_SCHEMAS[0],
    # ten tool-call objects: many structural states, the same masks reached from several of them
    {"anyOf": [{"type": "object", "properties": {"name": {"const": f"tool_{i}"},
                                                 "arguments": {"type": "object", "properties": {
                                                     "n": {"type": "integer", "minimum": 0, "maximum": 10 ** i},
                                                     "mode": {"enum": ["fast", "slow", f"m{i}"]}},
                                                     "required": ["n"], "additionalProperties": False}},
                "required": ["name", "arguments"], "additionalProperties": False} for i in range(10)]},
]


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab", "phi3_vocab"])
@pytest.mark.parametrize("schema", _PREFILL_SCHEMAS, ids=["object", "calls"])
def test_structural_rows_filled_at_construction_are_the_full_walks_masks(request, vocab_name, schema):
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(schema, whitespace="compact").dfa
    index = TokenIndex(dfa, vocab)
    filled = {s for s in range(dfa.n_states) if index._row_of[s] >= 0}
    twin = _numpy_twin(index)
    small = {s for s in range(dfa.n_states)
             if index._walker.first_live(s) <= 32 and twin._walk(s)[2] <= cindex._PREFILL_FLOOR}
    assert len(small) > dfa.n_states // 3 and small <= filled  # filled before any mask is asked for
    _shared_masks_match(index, list(range(dfa.n_states)))
    table, state_rows = index.mask_table()
    assert len(table) == len({r.tobytes() for r in table})  # one row per distinct mask, however it was computed
    assert (state_rows >= 0).all()


def test_walks_given_up_past_the_waste_budget_fall_back_to_the_floor(llama3_vocab):
    # bounded integers (their digits are counted, no digit loop: no digit runs): Llama 3's 1,110 number tokens keep
    # ~1,100 trie nodes live at a number's first digit
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index = TokenIndex(dfa, llama3_vocab)
    states = np.arange(dfa.n_states, dtype=np.int32)
    floor, _, _ = index._walker.masks_many(states, 32, 128)
    wide, _, _ = index._walker.masks_many(states, 32, 4096)
    assert (floor >= 0).sum() < (wide >= 0).sum()
    spent, _, _ = index._walker.masks_many(states, 32, 4096, live_floor=128, waste_budget=0)
    assert np.array_equal(spent >= 0, floor >= 0)
    # a budget for a few walks given up: the same states as the wide cap up to the first state given up after it
    some, _, _ = index._walker.masks_many(states, 32, 16, live_floor=16, waste_budget=10**9)
    assert np.array_equal(some >= 0, index._walker.masks_many(states, 32, 16)[0] >= 0)


def test_many_states_walked_as_two_halves_on_two_threads_give_the_same_masks(llama3_vocab, monkeypatch):
    """`masks_many` over `_SPLIT_STATES` states or more walks two halves at once (the second on the worker thread):
    every state's distinct mask holds the same words as in one call, and an index built that way has the same rows."""
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index = TokenIndex(dfa, llama3_vocab)
    states = np.arange(dfa.n_states, dtype=np.int32)

    def masks(result) -> dict[int, bytes]:
        local, off, data = result
        return {s: data[off[local[s]] : off[local[s] + 1]].tobytes() for s in np.flatnonzero(local >= 0).tolist()}

    whole = masks(index._walker.masks_many(states, 32, 512))
    monkeypatch.setattr(native, "_SPLIT_STATES", 2)
    if native._walk_pool() is None:
        pytest.skip("this process may run on one core only: masks_many never splits")
    split = index._walker.masks_many(states, 32, 512)
    assert masks(split) == whole and len(whole) > dfa.n_states // 2
    assert split[1].shape[0] - 1 >= len(set(whole.values()))  # (a mask may come back from both halves)
    again = TokenIndex(dfa, llama3_vocab)
    for s in range(dfa.n_states):
        assert np.array_equal(again.mask_for_state(s), index.mask_for_state(s)), s


# -- the cursor's step in C ---------------------------------------------------------------------------------------

# a counted string (maxLength past COUNTED_MIN_CHARS), a counted array (maxItems past COUNTED_MIN_ITEMS) and free-form
# values nested past the automaton's window on the cursor's stack
_STEP_SCHEMA = {"type": "object", "properties": {
    "v": {}, "xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 150},
    "s": {"type": "string", "maxLength": 600}}, "required": ["v", "xs", "s"], "additionalProperties": False}


def _deep_value(rng: np.random.Generator, depth: int = 0):
    if depth >= 9 or rng.random() < 0.15:
        return [0, "x", None, 1.5, True][rng.integers(5)]
    if rng.random() < 0.5:
        return [_deep_value(rng, depth + 1) for _ in range(rng.integers(1, 3))]
    return {f"k{i}": _deep_value(rng, depth + 1) for i in range(rng.integers(1, 3))}


def counted_walk_cases(index: TokenIndex, rng: np.random.Generator, n_texts: int):
    """Cases for a walk of `_STEP_SCHEMA`'s index against `automaton.walk_counted`: along valid texts with values nested
    up to 9 deep (past the window: spilled and refilled), a long counted string and a counted array filled to its
    bound, every token that spells the next 1-16 bytes, a comma and two random ones, from the cursor there:
    `(cursor, token, its bytes, walk_counted's (state, count, bound, dying byte), the stack it leaves)`."""
    token_bytes = index.vocab.token_bytes
    byte_token = {}
    for t, b in enumerate(token_bytes):
        if b and t not in index._non_byte:
            byte_token.setdefault(b, t)
    for i in range(n_texts):
        value = {"v": _deep_value(rng), "xs": rng.integers(-99, 99, size=150 - i % 3).tolist(),
                 "s": "ab\u00e9 c" * (120 - i % 2 * 30)}
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
        cursor = index.start()
        for at in range(len(text)):
            ahead = [byte_token[text[at : at + n]] for n in range(1, 17) if text[at : at + n] in byte_token]
            for t in ahead + [byte_token[b","]] + rng.integers(len(token_bytes), size=2).tolist():
                data = token_bytes[t]
                if not data:
                    continue
                spilled = list(cursor._stack)
                want = fa.walk_counted(index._tr_view, index._n_classes, index._cls_list, index._eff_view,
                                       index._limits, cursor._state, data, cursor._count, cursor._limit,
                                       index._spill_view, index._refill_view, spilled)
                yield cursor, t, data, want, spilled
            cursor.advance(byte_token[text[at : at + 1]])
        assert cursor.is_accepting()


def tally_walk(seen: dict[str, int], cursor, want: tuple, spilled: list[int]) -> None:
    """Count what one `counted_walk_cases` case exercised, under the keys `seen` has."""
    outcomes = {"died": want[3] >= 0, "spilled": want[3] < 0 and len(spilled) > len(cursor._stack),
                "refilled": want[3] < 0 and len(spilled) < len(cursor._stack),
                "ticked": want[3] < 0 and want[1] > cursor._count, "bounded": want[3] >= 0 and 0 <= want[2] < want[1]}
    for key in seen:
        seen[key] += outcomes.get(key, False)


def test_the_c_step_reads_bytes_as_walk_counted_does(gemma4_vocab):
    """`Stepper.counted` and `Stepper.plain` against `automaton.walk_counted` and the table walk they replace in
    `TokenState.advance`: along valid texts with values nested up to 9 deep (past the window: spilled and refilled),
    a long counted string and a counted array filled to its bound, every token that spells the next 1-16 bytes, a
    comma and two random ones, read
    from the cursor's state, count, bound and stack, give the same state, count, bound, stack and dying byte."""
    index = TokenIndex(compile_schema(_STEP_SCHEMA, whitespace="compact").dfa, gemma4_vocab)
    assert index._stacked and index._limits and index._stepper is not None
    plain = TokenIndex(compile_schema(_WALK_SCHEMAS[0], whitespace="compact").dfa, gemma4_vocab)
    rng = np.random.default_rng(7)
    token_bytes = gemma4_vocab.token_bytes
    seen = {"died": 0, "spilled": 0, "refilled": 0, "ticked": 0, "bounded": 0}
    for cursor, t, data, want, spilled in counted_walk_cases(index, rng, 12):
        got = index._stepper.counted(data, cursor._state, cursor._count, cursor._limit, cursor._stack)
        assert got == (*want, tuple(spilled)), (t, data, cursor._state, cursor._stack)
        tally_walk(seen, cursor, want, spilled)
    assert min(seen.values()) > 20, seen
    for _ in range(3000):
        data = token_bytes[rng.integers(len(token_bytes))] or b"x"
        s = want = int(rng.integers(plain._n_states))
        for at, byte in enumerate(data):
            want = plain._tr_view[want * plain._n_classes + plain._cls_list[byte]]
            if want < 0:
                want = -2 - at
                break
        assert plain._stepper.plain(data, s) == want


# -- digit runs: a number's digits are not walked token by token --------------------------------------------------

# unbounded integers and numbers (digit loops in the integer part, the fraction and the exponent), in several contexts
_NUMBER_SCHEMA = {"type": "object", "properties": {
    "n": {"type": "integer"}, "x": {"type": "number"}, "xs": {"type": "array", "items": {"type": "number"}},
    "low": {"type": "integer", "minimum": -5}, "pick": {"anyOf": [{"type": "number"}, {"enum": ["none", 12]}]}},
    "additionalProperties": False}


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gpt2_vocab"])
def test_each_digit_run_holds_exactly_the_tokens_below_its_node(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    trie = cindex._trie_for(vocab)
    run_of, run_off, run_tok = native._digit_runs(trie)
    # the independent reading: a token is below a node when that node's bytes are a strict prefix of the token's
    by_prefix: dict[bytes, set[int]] = {}
    for t in trie.term_tokens.tolist():
        data = vocab.token_bytes[t]
        for cut in range(1, len(data)):
            by_prefix.setdefault(data[:cut], set()).add(t)
    spelled = {}
    for node in np.flatnonzero(run_of >= 0).tolist():  # a node's bytes: up through its parents
        path, x = [], node
        while x >= 0:
            path.append(int(trie.node_byte[x]))
            x = int(native._parents(trie)[x])
        spelled[node] = bytes(reversed(path))
    assert len(spelled) >= 100  # Llama 3: the 10 one-digit and 100 two-digit nodes at least
    for node, prefix in spelled.items():
        r = int(run_of[node])
        below = set(run_tok[run_off[r] : run_off[r + 1]].tolist())
        assert below == by_prefix[prefix], prefix
        assert len(below) >= native._RUN_MIN_TOKENS
        assert all(vocab.token_bytes[t][len(prefix):].isdigit() for t in below), prefix
    # and every node whose descendants are all digits, with enough of them, is a run
    for prefix, below in by_prefix.items():
        if len(below) >= native._RUN_MIN_TOKENS and all(vocab.token_bytes[t][len(prefix):].isdigit() for t in below):
            assert prefix in spelled.values(), prefix


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gpt2_vocab", "qwen3_vocab"])
def test_number_states_get_the_full_walks_masks_through_digit_runs(request, vocab_name):
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(_NUMBER_SCHEMA, whitespace="compact").dfa
    index = TokenIndex(dfa, vocab)
    twin = _numpy_twin(index)
    loops = native._digit_loops(index._tflat, index._n_classes, index._byte_class)
    assert loops.sum() >= 6  # integer part, fraction and exponent digits, in several properties
    # the walker keeps them where the vocabulary has digit runs (not Qwen's one digit a token)
    kept = index._walker._keep[-1]
    assert kept is None if vocab_name == "qwen3_vocab" else np.array_equal(kept, loops)
    for s in range(dfa.n_states):
        words, key, dests, _ = index._walker.mask(s, share=False)
        walk = twin._walk(s)
        assert np.array_equal(words.view(np.int32), twin._compute_mask(s, walk)), s
        assert key == native.sparse_key(words) and np.array_equal(np.sort(dests), twin._destinations(s, walk)), s
        assert np.array_equal(index.mask_for_state(s), words.view(np.int32)), s  # the row filled at construction
    for s in np.flatnonzero(loops[: dfa.n_states]).tolist():
        assert np.array_equal(index._token_costs(s), twin._token_costs(s)), s
    # in one batch, states reaching the same digit runs with the same other words share one distinct mask
    states = np.arange(dfa.n_states, dtype=np.int32)
    local, off, data = index._walker.masks_many(states, 32, 512)
    for s in np.flatnonzero(local >= 0).tolist():
        words = np.zeros(index._n_words, np.int32)
        part = data[off[local[s]] : off[local[s] + 1]].reshape(-1, 2)
        words[part[:, 0]] = part[:, 1]
        assert np.array_equal(words, twin.mask_for_state(s)), s
    if vocab_name != "qwen3_vocab":  # (Qwen writes one digit a token: no runs, the plain walk)
        assert (local >= 0).sum() == dfa.n_states  # every number state within the structural fill's bounds


def test_small_automata_fill_wider_states_in_batches_at_construction(gemma4_vocab, monkeypatch):
    # a 24-hex-digit id: on Gemma 4 each digit's state keeps ~600 trie nodes live, over the structural fill's 512
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-fA-F0-9]{24}$"},
                                               "n": {"type": "integer"}}, "required": ["id"], "additionalProperties": False}
    dfa = compile_schema(schema, whitespace="compact").dfa
    assert dfa.n_states <= cindex._PREFILL_STATES
    digits = [dfa.step(dfa.start, b'{"id":"' + b"a" * k) for k in range(24)]
    monkeypatch.setattr(cindex, "_PREFILL_S", 60.0)
    with monkeypatch.context() as m:
        m.setattr(TokenIndex, "_prefill", lambda self: None)
        structural_only = TokenIndex(dfa, gemma4_vocab)
    assert sum(structural_only._row_of[s] < 0 for s in digits) >= 20  # wider than the structural fill walks
    index = TokenIndex(dfa, gemma4_vocab)
    assert all(index._row_of[s] >= 0 for s in digits)  # filled by the batches
    _shared_masks_match(index, list(range(dfa.n_states)))
    # several batches, each keeping its new rows as words until read, after the structural fill's (ten tool calls)
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    assert dfa.n_states <= cindex._PREFILL_STATES
    monkeypatch.setattr(cindex, "_EAGER_ROWS", 0)
    monkeypatch.setattr(cindex, "_PREFILL_CHUNK", 8)
    monkeypatch.setattr(cindex, "_PREFILL_LIVE", 2)  # (so that the batches find sparse masks to keep)
    monkeypatch.setattr(cindex, "_PREFILL_FLOOR", 2)
    with monkeypatch.context() as m:
        m.setattr(TokenIndex, "_prefill", lambda self: None)
        first_only = TokenIndex(dfa, gemma4_vocab)
    index = TokenIndex(dfa, gemma4_vocab)
    assert len(index._pending) > len(first_only._pending) > 0
    _shared_masks_match(index, list(range(dfa.n_states)))  # every row, made now or on first read, is the full walk's
    table, _ = index.mask_table()
    assert len(table) == len({r.tobytes() for r in table})


def test_rows_made_on_first_read_equal_the_walks_and_survive_pickling(qwen3_vocab, monkeypatch):
    monkeypatch.setattr(cindex, "_EAGER_ROWS", 4)
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index = TokenIndex(dfa, qwen3_vocab)
    assert len(index._pending) > 10 and sum(r is not None for r in index._rows) >= 4
    clone = pickle.loads(pickle.dumps(index))  # pickling makes every pending row
    assert not index._pending and not clone._pending
    fresh = TokenIndex(dfa, qwen3_vocab)
    table, state_rows = fresh.mask_table()  # so does the table
    assert not fresh._pending and len(table) == len({r.tobytes() for r in table})
    for s in range(dfa.n_states):
        full = index._walker.mask(s, share=False)[0].view(np.int32)
        assert np.array_equal(clone.mask_for_state(s), full) and np.array_equal(table[state_rows[s]], full), s


def test_threads_reading_pending_rows_get_one_mask_each(qwen3_vocab, monkeypatch):
    monkeypatch.setattr(cindex, "_EAGER_ROWS", 0)  # every filled row made on first read
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index = TokenIndex(dfa, qwen3_vocab)
    assert len(index._pending) > 10
    seen: list[dict[int, np.ndarray]] = [{} for _ in range(4)]

    def worker(k: int) -> None:
        for s in np.random.default_rng(k).permutation(dfa.n_states).tolist():
            seen[k][s] = index.mask_for_state(s)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not index._pending
    for s in range(dfa.n_states):
        assert all(seen[k][s] is seen[0][s] for k in range(4)), s  # one array per row, made once
        assert np.array_equal(seen[0][s], index._walker.mask(s, share=False)[0].view(np.int32)), s


def test_a_full_output_buffer_leaves_the_remaining_states_to_the_lazy_walk(qwen3_vocab, monkeypatch):
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    states = np.arange(dfa.n_states, dtype=np.int32)
    index = TokenIndex(dfa, qwen3_vocab)
    local, off, data = index._walker.masks_many(states, 32, 10**6)
    assert (local >= 0).all()
    # room for half of the distinct masks' words: the states whose mask no longer fits are left out, the others
    # have the same masks as before
    monkeypatch.setattr(native.TrieWalker, "_MANY_WORDS", data.shape[0] / (4 * dfa.n_states))
    part_local, part_off, part_data = index._walker.masks_many(states, 32, 10**6)
    kept = part_local >= 0
    assert 0 < kept.sum() < dfa.n_states
    for s in states[kept]:
        u, v = local[s], part_local[s]
        assert np.array_equal(data[off[u] : off[u + 1]], part_data[part_off[v] : part_off[v + 1]])
    monkeypatch.setattr(cindex, "_PREFILL_STATES", 0)  # no fill of the other rows either
    lazy = TokenIndex(dfa, qwen3_vocab)
    assert any(lazy._row_of[s] < 0 for s in range(dfa.n_states))
    _shared_masks_match(lazy, list(range(dfa.n_states)))
    table, _ = lazy.mask_table()
    assert len(table) == len({r.tobytes() for r in table})


# -- shared walks: a wide state's mask derived from an earlier one's ---------------------------------------------

_SHARE_SCHEMAS = {
    # string fields followed by different properties: their content states differ only after the closing quote
    "fields": {"type": "object", "properties": {k: {"type": "string"} for k in ("a", "b", "c", "d")},
               "required": ["a", "b", "c", "d"], "additionalProperties": False},
    # a length counter longer than any token: its early states have one and the same mask
    "long_string": {"type": "array", "items": {"type": "string", "maxLength": 300}, "maxItems": 2},
    # counted formats and patterns: derived masks through the `@` and other bytes
    "emails": {"type": "object", "properties": {"to": {"type": "array", "items": {"type": "string", "format": "email",
                                                                                  "maxLength": 200}},
                                                "note": {"type": "string", "pattern": "^[a-z ]{0,150}$"}},
               "required": ["to", "note"], "additionalProperties": False},
}


def _shared_masks_match(index: TokenIndex, order: list[int]) -> None:
    for s in order:
        walker_mask = index.mask_for_state(s)
        full, _, _, _ = index._walker.mask(s, share=False)
        assert np.array_equal(walker_mask, full.view(np.int32)), s


@pytest.mark.parametrize("vocab_name", ["qwen3_vocab", "gemma4_vocab", "phi3_vocab"])
@pytest.mark.parametrize("name", sorted(_SHARE_SCHEMAS))
def test_shared_walks_give_every_state_the_full_walks_mask(request, vocab_name, name):
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(_SHARE_SCHEMAS[name], whitespace="compact").dfa
    forward = TokenIndex(dfa, vocab)
    _shared_masks_match(forward, list(range(dfa.n_states)))
    assert forward._walker.shared > 0  # the point: most wide states are derived, not walked
    shuffled = TokenIndex(dfa, vocab)
    _shared_masks_match(shuffled, np.random.default_rng(1).permutation(dfa.n_states).tolist())


def _string_states(index: TokenIndex) -> list[int]:
    """States inside a string with (almost) any content byte live, in breadth-first order."""
    dfa = index.dfa
    rows = np.asarray(dfa.transitions)
    cls = np.asarray(dfa.class_of)[: 256]
    content = [ord(c) for c in "abcXYZ019 _-"]
    return [s for s in range(dfa.n_states) if all(rows[s, cls[b]] >= 0 for b in content)]


def test_pair_check_finds_the_closing_quote_between_two_string_fields(qwen3_vocab):
    index = TokenIndex(compile_schema(_SHARE_SCHEMAS["fields"], whitespace="compact").dfa, qwen3_vocab)
    w = index._walker
    a, b = _string_states(index)[:2]
    in_x = w._pair(w._tflat, w._k, w._own_joint, a, b)[0]
    assert bytes(np.flatnonzero(in_x).astype(np.uint8)) == b'"'


def test_pair_check_tells_counters_apart_only_within_the_longest_token(qwen3_vocab, monkeypatch):
    dfa = compile_schema({"type": "string", "maxLength": 400}, whitespace="compact").dfa
    index = TokenIndex(dfa, qwen3_vocab)
    w = index._walker
    assert index._trie.max_depth == 128  # the longest Qwen3 token, in bytes
    chain = [dfa.step(dfa.start, b'"' + b"a" * i) for i in range(400)]  # the content state with 400 - i left

    def pair(i: int, j: int):
        return w._pair(w._tflat, w._k, w._own_joint, chain[i], chain[j])[0]

    # 400 and 300 code points left: no string of at most 128 bytes tells them apart
    assert not pair(0, 100).any()
    # 300 and 10 left: the string of 11 a's does, and no byte set short of the content bytes hides it
    assert pair(100, 390) is None
    monkeypatch.setattr(w, "_MAX_ROUNDS", 0)
    assert pair(100, 390) is None
    index2 = TokenIndex(dfa, qwen3_vocab)
    _shared_masks_match(index2, chain[::7] + chain[300:])
    assert index2._walker.shared > 0


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab"])
def test_string_states_near_their_maxlength_walk_only_the_longer_tokens(request, vocab_name, monkeypatch):
    # Within the longest token of its bound, each content state of a string keeps different strings live (the ones
    # that pass the bound), so no byte set X hides the difference; the pair search stops at the depth where its
    # neighbour's first disagrees, and the tokens longer than that are walked. Every mask is the full walk's.
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema({"type": "string", "maxLength": 300}, whitespace="compact").dfa
    chain = [dfa.step(dfa.start, b'"' + b"a" * i) for i in range(300)]
    index = TokenIndex(dfa, vocab)
    w = index._walker
    short = []
    derive = w._derive_short
    monkeypatch.setattr(w, "_derive_short", lambda s, base, agree: short.append(agree) or derive(s, base, agree))
    _shared_masks_match(index, chain)
    assert len(short) > 20 and min(short) >= w._DEEP_AGREE
    in_x, agree = w._pair(w._tflat, w._k, w._own_joint, chain[280], chain[281], w._DEEP_AGREE)
    assert in_x is None and agree == 300 - 281  # the 19 a's after which the later state takes no more


@pytest.mark.parametrize("name", sorted(_SHARE_SCHEMAS))
def test_pairs_whose_first_bytes_differ_in_too_many_classes_never_agree(qwen3_vocab, name):
    """`TrieWalker._candidates` drops a remembered state whose first bytes are live in more than `_MAX_ROUNDS`
    classes where the state's are not (or the other way round): the pair search would fail, each such class taking
    one of its rounds. The pairs of their first 40 string states and 3,000 random pairs, against the pair search
    itself."""
    index = TokenIndex(compile_schema(_SHARE_SCHEMAS[name], whitespace="compact").dfa, qwen3_vocab)
    w = index._walker
    strings = _string_states(index)[:40]
    rng = np.random.default_rng(3)
    pairs = [(p, q) for p in strings for q in strings] + rng.integers(0, index.dfa.n_states, (3000, 2)).tolist()
    dropped = 0
    for p, q in pairs:
        if (w._live_classes(p) ^ w._live_classes(q)).bit_count() > w._MAX_ROUNDS:
            dropped += 1
            assert w._pair(w._tflat, w._k, w._own_joint, p, q)[0] is None, (p, q)
    assert dropped > 0


def test_a_state_with_a_remembered_states_first_bytes_shares_without_walking(qwen3_vocab, monkeypatch):
    """The content state of a second string field has the first field's live first bytes exactly: its mask is
    derived from that one's without a walk of the trie first (and equals the full walk's)."""
    monkeypatch.setattr(cindex, "_PREFILL_STATES", 0)  # only the structural rows filled at construction
    index = TokenIndex(compile_schema(_SHARE_SCHEMAS["fields"], whitespace="compact").dfa, qwen3_vocab)
    w = index._walker
    first, second = [s for s in _string_states(index) if index._row_of[s] < 0][:2]
    assert w._live_classes(first) == w._live_classes(second)
    index.mask_for_state(first)
    assert first in [p for p, _ in w._reps]
    walks = []
    fn = w._fn
    w._fn = lambda *args: walks.append(args[1]) or fn(*args)
    try:
        got = index.mask_for_state(second)
    finally:
        w._fn = fn
    assert walks == [] and w.shared >= 1
    assert np.array_equal(got, w.mask(second, share=False)[0].view(np.int32))


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
def test_a_first_string_state_derives_from_the_vocabularys_reference(request, vocab_name, monkeypatch):
    vocab = request.getfixturevalue(vocab_name)
    monkeypatch.setattr(cindex, "_PREFILL_STATES", 0)  # only the structural rows filled at construction
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 500}}, "required": ["q"],
              "additionalProperties": False}
    dfa = compile_schema(schema, whitespace="compact").dfa
    index = TokenIndex(dfa, vocab)
    content = _string_states(index)[0]
    assert np.array_equal(index.mask_for_state(content), index._walker.mask(content, share=False)[0].view(np.int32))
    assert index._walker.shared == 1  # derived from the reference: its own first string state, not walked
    alone = TokenIndex(dfa, vocab, references=False)
    assert np.array_equal(alone.mask_for_state(content), index.mask_for_state(content))
    assert alone._walker.shared == 0


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
def test_shared_walks_on_jsonschemabench_give_the_full_walks_masks(request, vocab_name):
    """One schema per JSONSchemaBench group (up to 1,500 states): every state, in a random order, against the full
    walk (derived masks, rows aliased to earlier states and reference-derived ones included)."""
    vocab = request.getfixturevalue(vocab_name)
    n_schemas = n_shared = 0
    for case in sample(jsonschemabench(), 1, seed=5):
        try:
            dfa = compile_schema(case.schema, **{**OPTIONS, "timeout_s": 5.0}).dfa
        except ConstrainError:
            continue
        if dfa.n_states > 1500:
            continue
        index = TokenIndex(dfa, vocab)  # (its states: `index.dfa`'s, without counted strings' markers)
        _shared_masks_match(index, np.random.default_rng(0).permutation(index.dfa.n_states).tolist())
        n_schemas += 1
        n_shared += index._walker.shared
    assert n_schemas >= 12 and n_shared > 0


_LENGTH_SCHEMAS = [
    {"type": "string", "format": "email", "maxLength": 300},
    {"type": "string", "format": "email", "minLength": 5, "maxLength": 40},
    {"type": "string", "pattern": "^[a-zé]+$", "minLength": 3, "maxLength": 200},
    {"type": "string", "pattern": "^(ab|cd)*x?$", "minLength": 7, "maxLength": 7},
    {"type": "string", "pattern": "^(ab|cd)*$", "minLength": 7, "maxLength": 7},  # even lengths only: none fits
    {"type": "string", "format": "date-time", "maxLength": 20},
    {"type": "string", "format": "uri", "maxLength": 3},
    {"type": "string", "pattern": "^[0-9]{4}-[^x]*$", "minLength": 6},
]


@pytest.mark.parametrize("schema", _LENGTH_SCHEMAS, ids=range(len(_LENGTH_SCHEMAS)))
def test_native_length_product_gives_the_python_products_automaton(schema):
    """The code-point-counting product behind minLength/maxLength on a format or pattern, C against Python."""
    def build():
        try:
            return canonical(compile_schema(schema).dfa)
        except ConstrainError as err:
            return type(err).__name__, err.pointer
    fa.clear_compiled()
    native_result = build()
    with numpy_passes():
        assert build() == native_result


def test_native_length_product_keeps_the_state_budget():
    schema = {"type": "string", "format": "email", "maxLength": 400}  # (from 512 characters it is counted instead)
    with pytest.raises(fa.BudgetExceeded) as err:
        compile_schema(schema, max_states=2_000)
    assert "state budget of 2000 states" in str(err.value) and err.value.pointer == "/maxLength"


# --- the counted walk (`constrain_walk_counted`) against the numpy walk of `TokenIndex._counted_row` ----------------

COUNTED_SCHEMAS = [
    {"type": "array", "items": {"type": "string", "maxLength": 3000, "minLength": 2}, "maxItems": 3},
    {"type": "string", "maxLength": 1024, "minLength": 3, "format": "email"},
    {"type": "string", "maxLength": 5000, "pattern": "^[a-zé]*(-[0-9]+)?$"},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 150},
    {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                                "additionalProperties": False}, "maxItems": 120},
]


@pytest.mark.parametrize("schema", COUNTED_SCHEMAS)
@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
def test_counted_rows_from_the_c_walk_equal_the_numpy_walks(schema, vocab_name, request):
    """Narrow states' counted rows come from the C walk, wide ones' from numpy: equal to numpy's alone."""
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(schema).dfa
    native_index, numpy_index = TokenIndex(dfa, vocab), TokenIndex(dfa, vocab)
    assert native_index._counters is not None and native_index._walker is not None
    native_index._ticking = numpy_index._ticking = None  # (arrays: every token walked, not those with a comma)
    numpy_index._walker = None  # `_counted_row` (and its plain rows) walked by numpy
    rng = np.random.default_rng(len(json.dumps(schema)))
    states = rng.integers(0, native_index._n_states, 30).tolist()
    assert any(native_index._walker.first_live(s) <= cindex._BATCH_MAX_FIRST for s in states)  # some walked in C
    for state, room in zip(states, rng.integers(0, 6, 30).tolist()):
        got = native_index._row_words(native_index._counted_row(state, room, None))
        expected = numpy_index._row_words(numpy_index._counted_row(state, room, None))
        assert np.array_equal(got, expected), (state, room)
    effect = np.ascontiguousarray(native_index._eff_flat, dtype=np.int8)
    need = np.ascontiguousarray(native_index._need_ticks(), dtype=np.uint8)
    most = [native_index._walker.counted(effect, need, s, 10**6)[1] for s in range(native_index._n_states)]
    assert 1 <= max(most) <= native_index._trie.max_depth  # inside the counter tokens count; a count a byte at most


@pytest.mark.parametrize("schema", [
    COUNTED_SCHEMAS[3], COUNTED_SCHEMAS[4],
    # a short array of heavy items, minItems 2: closing the first item needs a tick
    {"type": "array", "minItems": 2, "maxItems": 8, "items": {
        "type": "object", "properties": {"name": {"enum": ["get_weather", "send_email"]},
                                         "city": {"type": "string", "maxLength": 12},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["name", "city"], "additionalProperties": False}},
])
@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
def test_counted_array_rows_from_the_comma_tokens_equal_the_full_walks(schema, vocab_name, request):
    """An array's counted rows walk only the tokens that hold a comma (`_TickTokens.sub_trie`, in C or by numpy):
    equal to the numpy walk of every token; `_near` is at least the most ticks any token makes from any state (the C walk's count)."""
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(schema).dfa
    index, by_numpy, full = TokenIndex(dfa, vocab), TokenIndex(dfa, vocab), TokenIndex(dfa, vocab)
    assert index._ticking is not None and len(index._ticking.ids) < 2000
    by_numpy._walker = None  # the comma tokens walked by numpy
    full._ticking, full._walker = None, None
    rng = np.random.default_rng(len(json.dumps(schema)))
    for state, room in zip(range(index._n_states), rng.integers(0, 6, index._n_states).tolist()):
        expected = full._row_words(full._counted_row(state, room, None))
        for got in (index, by_numpy):
            assert np.array_equal(got._row_words(got._counted_row(state, room, None)), expected), (state, room)
    assert index._tick_walker is not None and by_numpy._tick_walker is None
    # states farther from a tick than the longest comma token take the plain row without a walk (all three agree)
    # (rooms of the most ticks a token makes or more take the plain row before this search, where no state inside
    # the counter needs a tick: asked here of every state)
    far = [s for s in range(index._n_states) if index._far_from_ticks(s)]
    assert far and len(far) < index._n_states and not full._far
    for state in far:
        assert index._counted_row(state, 0, None) == index.row_for_state(state) or index._need_inside()
        assert np.array_equal(index._row_words(index._counted_row(state, 0, None)),
                              full._row_words(full._counted_row(state, 0, None)))
    effect = np.ascontiguousarray(index._eff_flat, dtype=np.int8)
    need = np.ascontiguousarray(index._need_ticks(), dtype=np.uint8)
    most = max(index._walker.counted(effect, need, s, 10**6)[1] for s in range(index._n_states))
    (near,) = index._near.values()
    assert 1 <= most <= near
    if "properties" in schema["items"] and "name" in schema["items"]["properties"]:
        assert most == near == 1  # items of 20 bytes or more: one comma a token


@pytest.mark.parametrize("seed", range(30))
def test_the_gap_between_ticks_agrees_with_a_plain_search(seed):
    # `index._tick_gap` (C) and its numpy walk: the fewest bytes from a state right after a tick to the next tick,
    # stepping only on transitions that neither tick nor open or close a counter in between, capped
    rng = np.random.default_rng(900 + seed)
    n, k = int(rng.integers(1, 120)), int(rng.integers(1, 6))
    trans = np.where(rng.random((n, k)) < 0.5, rng.integers(0, n, (n, k)), -1).astype(np.int32)
    effect = rng.choice([fa.EFFECT_NONE] * 6 + [fa.EFFECT_TICK, fa.EFFECT_CLOSE, fa.EFFECT_OPEN], (n, k)).astype(np.int8)
    ticks = (effect == fa.EFFECT_TICK) & (trans >= 0)
    for cap in (1, 2, 5, 40):
        best = cap
        for s in {int(t) for t in trans[ticks]}:  # from each state after a tick: the oracle shares no code with either
            seen, frontier, level = {s}, [s], 1
            while frontier and level < best:
                if any(ticks[t].any() for t in frontier):
                    best = level
                    break
                frontier = [d for t in frontier for c in range(k) if effect[t, c] == fa.EFFECT_NONE
                            and (d := int(trans[t, c])) >= 0 and d not in seen and not seen.add(d)]
                level += 1
        assert native.automata().tick_gap(trans, effect, cap, fa.EFFECT_TICK, fa.EFFECT_NONE) == best
        assert cindex._tick_gap_numpy(trans, effect, cap) == best
        assert cindex._tick_gap(trans, effect, cap) == best


def _mapped(arr: np.ndarray) -> np.ndarray:
    """Per page of `arr`'s memory: whether it is mapped (mincore)."""
    import mmap

    page = mmap.PAGESIZE
    start = arr.ctypes.data - arr.ctypes.data % page
    out = np.zeros((arr.ctypes.data + arr.nbytes - start + page - 1) // page, np.uint8)
    assert native._mincore()(start, arr.ctypes.data + arr.nbytes - start, out.ctypes.data) == 0
    return out & 1 == 1


def test_populate_maps_the_pages_of_fresh_memory_and_leaves_mapped_memory_alone(monkeypatch):
    import mmap

    real = native._madvise()
    if real is None or native._mincore() is None:
        pytest.skip("this libc has no madvise or no mincore: populate does nothing")
    calls = []

    def spy(start, length, advice):
        calls.append(real(start, length, advice))
        return calls[-1]

    monkeypatch.setattr(native, "_madvise", lambda: spy)
    memory = mmap.mmap(-1, 64 * mmap.PAGESIZE)  # anonymous: no page mapped until touched
    fresh = np.frombuffer(memory, np.int32)
    assert not _mapped(fresh).any()
    native.populate(fresh)
    assert len(calls) == 1
    if calls[0] != 0:
        pytest.skip("this kernel has no MADV_POPULATE_READ (Linux 5.14+)")
    assert _mapped(fresh).all() and not fresh.any()
    written = np.ones(16 * mmap.PAGESIZE, np.int32)
    assert _mapped(written).all()
    native.populate(written)  # every page mapped: no advice
    assert len(calls) == 1
    del fresh
    memory.close()


# ---- the prefill on a worker thread (`TokenIndex(background=True)`)

# over `_PREFILL_STATES`: the worker also walks the wide states it has time for (strings' content)
_BACKGROUND_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["title", "note"], "properties": {
    "title": {"type": "string", "maxLength": 30}, "note": {"type": "string", "format": "date"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}, "n": {"type": "number"}}}


@contextmanager
def _held_prefill(monkeypatch):
    """The background prefill held at its start until the yielded event is set."""
    release = threading.Event()
    structural = TokenIndex._prefill_structural

    def held(self):
        assert release.wait(30)
        structural(self)

    monkeypatch.setattr(TokenIndex, "_prefill_structural", held)
    try:
        yield release
    finally:
        release.set()


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "qwen3_vocab", "gemma4_vocab"])
@pytest.mark.parametrize("schema", [_BACKGROUND_SCHEMA, _PREFILL_SCHEMAS[1]], ids=["wide", "calls"])
def test_the_background_prefill_gives_every_state_the_full_walks_mask(request, vocab_name, schema, monkeypatch):
    if cindex._prefill_pool() is None:
        pytest.skip("one core: the prefill runs at construction (test_one_core_prefills_at_construction)")
    monkeypatch.setattr(cindex, "_PREFILL_S", 60.0)  # (time enough for every state)
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(schema, whitespace="compact").dfa
    assert (dfa.n_states > cindex._PREFILL_STATES) == (schema is _BACKGROUND_SCHEMA)
    index, plain = TokenIndex(dfa, vocab, background=True), TokenIndex(dfa, vocab)
    assert index._row_of[dfa.start] >= 0  # the start state's row is made at construction
    index.mask_for_state(dfa.step(dfa.start, b"{"))  # waits for the worker
    assert index._background is None
    # every state, where construction leaves a large automaton's wide states (strings' content) to their first use
    assert all(index._row_of[s] >= 0 for s in range(dfa.n_states))
    if schema is _BACKGROUND_SCHEMA:
        assert plain._row_of[dfa.step(dfa.start, b'{"title":"ab')] < 0
    _shared_masks_match(index, list(range(dfa.n_states)))
    for s in range(dfa.n_states):
        assert np.array_equal(index.mask_for_state(s), plain.mask_for_state(s)), s


def test_rows_but_the_start_states_wait_for_the_background_prefill(qwen3_vocab, monkeypatch):
    if cindex._prefill_pool() is None:
        pytest.skip("one core: the prefill runs at construction (test_one_core_prefills_at_construction)")
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    after = dfa.step(dfa.start, b"{")
    with _held_prefill(monkeypatch) as release:
        index = TokenIndex(dfa, qwen3_vocab, background=True)
        assert np.array_equal(index.start().mask(), index._walker.mask(dfa.start, share=False)[0].view(np.int32))
        got: list[np.ndarray] = []
        reader = threading.Thread(target=lambda: got.append(index.mask_for_state(after)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not got  # waits, although nothing stops it walking that state itself
        assert index._row_of[after] < 0
        release.set()
        reader.join(30)
    assert got and np.array_equal(got[0], index._walker.mask(after, share=False)[0].view(np.int32))
    assert index._background is None and index._row_of[after] >= 0


def test_the_worker_reads_its_own_rows_without_waiting_on_itself(qwen3_vocab, monkeypatch):
    if cindex._prefill_pool() is None:
        pytest.skip("one core: the prefill runs at construction (test_one_core_prefills_at_construction)")
    structural = TokenIndex._prefill_structural
    read: list[np.ndarray] = []

    def reading(self):  # a row read on the worker while its fill runs: made there, not waited for (a deadlock)
        read.append(self.mask_for_state(self._plain.step(self._start_state, b"{")))
        structural(self)

    monkeypatch.setattr(TokenIndex, "_prefill_structural", reading)
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index = TokenIndex(dfa, qwen3_vocab, background=True)
    index._background.result(timeout=30)
    after = dfa.step(dfa.start, b"{")
    assert read and np.array_equal(read[0], index._walker.mask(after, share=False)[0].view(np.int32))


def test_a_failed_background_prefill_fails_every_later_row(qwen3_vocab, monkeypatch):
    if cindex._prefill_pool() is None:
        pytest.skip("one core: the prefill runs at construction (test_one_core_prefills_at_construction)")

    def broken(self):
        raise RuntimeError("prefill broke")

    monkeypatch.setattr(TokenIndex, "_prefill_structural", broken)
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index = TokenIndex(dfa, qwen3_vocab, background=True)
    index.start().mask()  # the start state's row was made before the worker started
    for _ in range(2):  # raised again at every later row: never a mask from a half-built index
        with pytest.raises(RuntimeError, match="prefill broke"):
            index.mask_for_state(dfa.step(dfa.start, b"{"))


def test_pickling_waits_for_the_background_prefill(qwen3_vocab, monkeypatch):
    if cindex._prefill_pool() is None:
        pytest.skip("one core: the prefill runs at construction (test_one_core_prefills_at_construction)")
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    with _held_prefill(monkeypatch) as release:
        index = TokenIndex(dfa, qwen3_vocab, background=True)
        threading.Timer(0.2, release.set).start()
        clone = pickle.loads(pickle.dumps(index))
    plain = TokenIndex(dfa, qwen3_vocab)
    assert index._background is None and clone._background is None
    assert [r >= 0 for r in clone._row_of] == [r >= 0 for r in index._row_of]
    for s in range(dfa.n_states):
        assert np.array_equal(clone.mask_for_state(s), plain.mask_for_state(s)), s


def test_one_core_prefills_at_construction(qwen3_vocab, monkeypatch):
    monkeypatch.setattr(cindex, "_prefill_pool", lambda: None)
    dfa = compile_schema(_PREFILL_SCHEMAS[1], whitespace="compact").dfa
    index, plain = TokenIndex(dfa, qwen3_vocab, background=True), TokenIndex(dfa, qwen3_vocab)
    assert index._background is None
    assert index._row_of == plain._row_of


def test_compiled_indexes_prefill_in_the_background(qwen3_vocab, monkeypatch):
    submitted = []

    class Recorder:  # runs the job at once, recording whose it was
        def submit(self, fn, *args):
            submitted.append(fn.__self__)
            done = concurrent.futures.Future()
            done.set_result(fn(*args))
            return done

    monkeypatch.setattr(cindex, "_prefill_pool", lambda: Recorder())
    index = constrain.compile_json_schema(_PREFILL_SCHEMAS[1], qwen3_vocab, cache=None)
    cached = constrain.compile_json_schema(_PREFILL_SCHEMAS[1], qwen3_vocab, cache=IndexCache())
    assert submitted == [index, cached]
