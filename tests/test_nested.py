"""Deep values: free-form JSON nested to any depth, the innermost container kinds in the automaton and the deeper
ones on the cursor's stack (`fa.nested_values`).

Checked against Python's JSON parser at the text level, and against the same schema unrolled to depth 7 without a
stack (counters off) mask by mask on real tokenizers, through states where the stack holds kinds; Gemma 4 holds
tokens with 4 closing brackets, more than the window, which the index walks with the stack.
"""

from __future__ import annotations

import json
import pickle
import random
import time

import numpy as np
import pytest

from constrain import MaskViolation
from constrain import automaton as fa
from constrain import index as cindex
from constrain.index import TokenIndex, TokenState
from constrain.schema import FREE_FORM_WINDOW, SchemaOptions, _compile_with, compile_schema

SCHEMA = {"type": "object", "properties": {"a": {}, "b": {"type": "integer"}}, "required": ["a", "b"]}
UNROLLED_DEPTH = 7


def random_value(rng: random.Random, depth: int = 0, deepest: int = 14):
    r = rng.random()
    if depth >= deepest or r < 0.2:
        return rng.choice([0, -1.5, "x]}", "", None, True, False, 12e3])
    if r < 0.6:
        return [random_value(rng, depth + 1, deepest) for _ in range(rng.randrange(3))]
    return {f"k{i}": random_value(rng, depth + 1, deepest) for i in range(rng.randrange(3))}


def depth_of(value) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


def mutants(text: str, rng: random.Random) -> list[str]:
    """Texts one bracket away from `text` (outside strings: `text` writes none in them but the `x]}` value)."""
    spots = [i for i, c in enumerate(text) if c in "]}" and text[i - 3 : i] != '"x]' and text[i - 2 : i] != '"x']
    out = []
    for i in rng.sample(spots, min(4, len(spots))):
        out.append(text[:i] + ("}" if text[i] == "]" else "]") + text[i + 1 :])  # the other kind
        out.append(text[:i] + text[i + 1 :])  # one closing bracket short
        out.append(text[:i] + "," + text[i:])  # a trailing comma
    return out + [text + "]", text + "}"]


@pytest.mark.parametrize("whitespace,separators", [("compact", (",", ":")), ("flexible", (", ", ": "))])
def test_texts_of_any_depth_are_json(whitespace, separators):
    dfa = compile_schema({}, whitespace=whitespace).dfa
    assert fa.has_counters(dfa) and dfa.n_states < 700  # as many states as nesting at most 3 deep without a stack
    rng = random.Random(0)
    deepest = rejected = 0
    for _ in range(1500):
        value = random_value(rng)
        text = json.dumps(value, separators=separators)
        assert dfa.matches(text.encode()), text
        deepest = max(deepest, depth_of(value))
        for bad in mutants(text, rng):
            with pytest.raises(ValueError):
                json.loads(bad)
            assert not dfa.matches(bad.encode()), bad
            rejected += 1
    assert deepest >= 12 and rejected > 5000


def test_deep_values_inside_other_keywords():
    schema = {"type": "array", "items": {"type": "object", "properties": {"v": {}}, "required": ["v"]}, "maxItems": 2}
    dfa = compile_schema(schema).dfa
    deep = '{"v":' + "[" * 30 + '{"w":{}}' + "]" * 30 + "}"
    assert dfa.matches(f"[{deep},{deep}]".encode())
    assert not dfa.matches(f"[{deep},{deep},{deep}]".encode())  # maxItems still counts around deep items
    assert not dfa.matches(f"[{deep[:-2]}]]".encode())


def unrolled(schema: dict) -> fa.Dfa:
    """`schema` compiled without counters or a stack: free-form values nest at most UNROLLED_DEPTH levels."""
    opts = SchemaOptions(max_depth=UNROLLED_DEPTH)
    return _compile_with(schema, opts, "", time.monotonic() + 60, counters=False)[1]


def text_depth(data: bytes) -> int:
    depth, in_string, escaped = 0, False, False
    for c in data.decode("utf-8", "replace"):
        if in_string:
            escaped, in_string = (False, in_string) if escaped else (c == "\\", c != '"')
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth -= 1
    return depth


@pytest.mark.parametrize("vocab_name,walks", [("llama3_vocab", 16), ("gemma4_vocab", 4)])  # (Gemma 4: 262k-token masks)
def test_masks_equal_the_unrolled_automaton(vocab_name, walks, request):
    vocab = request.getfixturevalue(vocab_name)
    stacked, plain = TokenIndex(compile_schema(SCHEMA).dfa, vocab), TokenIndex(unrolled(SCHEMA), vocab)
    assert stacked._stacked and not plain._stacked and len(stacked._deep) >= 3
    tb = vocab.token_bytes
    opens = np.array([b.count(b"[") + b.count(b"{") for b in tb] + [0] * (vocab.vocab_size - len(tb)))
    brackets = [t for t, b in enumerate(tb) if b in (b"[", b"{", b"[[", b'{"', b'":[', b'":{', b"],[", b"},{")]
    closers = [t for t, b in enumerate(tb) if b and set(b) <= set(b"]}") and t not in vocab.special_ids]
    rng = random.Random(1)
    compared = with_stack = 0
    for _ in range(walks):
        a, b = stacked.start(), plain.start()
        text = b""
        for step in range(150):
            depth = text_depth(text)
            if b is not None and depth <= UNROLLED_DEPTH - 1:
                ma = np.unpackbits(a.mask().view(np.uint8), bitorder="little").astype(bool)
                mb = np.unpackbits(b.mask().view(np.uint8), bitorder="little").astype(bool)
                differ = np.flatnonzero((ma != mb) & (opens + depth <= UNROLLED_DEPTH))
                assert not len(differ), (text, [(int(t), tb[t]) for t in differ[:5]])
                compared += 1
                with_stack += bool(a._stack)
            allowed = [int(t) for t in a.allowed_token_ids() if t not in vocab.eos_ids]
            if not allowed:
                break
            live = set(allowed)
            pool = [t for t in (closers if step > 100 else brackets) if t in live]
            tok = rng.choice(pool) if pool and rng.random() < 0.85 else rng.choice(allowed)
            a.advance(tok)
            text += tb[tok]
            if b is not None:
                try:
                    b.advance(tok)
                except MaskViolation:  # deeper than the unrolled automaton goes
                    b = None
    assert compared > 50 * walks and with_stack > 9 * walks


def single_byte_ids(vocab, text: str) -> list[int]:
    one = {}
    for t, b in enumerate(vocab.token_bytes):
        if len(b) == 1 and t not in vocab.special_ids:
            one.setdefault(b, t)
    return [one[bytes([c])] for c in text.encode()]


def test_a_token_closing_more_than_the_window_reads_the_stack(gemma4_vocab):
    vocab = gemma4_vocab
    four = vocab.token_bytes.index(b"]]]]")
    assert FREE_FORM_WINDOW < 4
    index = TokenIndex(compile_schema({}).dfa, vocab)
    state = index.start()
    for t in single_byte_ids(vocab, '[{"a":[[[['):  # kinds [ { [ [ [ [: the window holds 3, the stack [ { [
        state.advance(t)
    assert state._stack == (fa.STACK_ARR, fa.STACK_OBJ, fa.STACK_ARR)
    assert four in state.allowed_token_ids()
    after = state.fork()
    after.advance(four)  # four arrays closed: the object is next
    ids = set(after.allowed_token_ids().tolist())
    assert single_byte_ids(vocab, "}")[0] in ids and single_byte_ids(vocab, "]")[0] not in ids
    state = index.start()
    for t in single_byte_ids(vocab, '[{"a":[[['):  # kinds [ { [ [ [: a fourth `]` would close the object
        state.advance(t)
    assert four not in state.allowed_token_ids()
    with pytest.raises(MaskViolation):
        state.advance(four)


@pytest.mark.parametrize("vocab_name", ["qwen3_vocab", "gemma4_vocab"])
def test_states_known_calm_at_construction_have_their_rows_exact(vocab_name, request):
    # calm: no deep token spills from the state, so with nothing spilled the row needs no walk with the stack
    vocab = request.getfixturevalue(vocab_name)
    index = TokenIndex(compile_schema(SCHEMA, whitespace="compact").dfa, vocab)
    calm = list(index._calm)
    # Qwen3's 9 deep tokens (`}}}`, `]]]`, ...) open nothing; Gemma 4's `}}}{`, `}{*}{}`, ... open a container
    # only after closing more: from a window that starts full, none opens a fourth kind
    assert all(calm)
    assert any(b"[" in data or b"{" in data for _, data in index._deep) == (vocab_name == "gemma4_vocab")
    # a token that opens four arrays spills where a value starts (the fourth `[`), not inside a string
    spill = np.concatenate([index._counters.spill, np.zeros((1, index._n_classes), np.int8)]).ravel()
    opens = cindex._calm_states(index._tflat, index._n_classes, index._byte_class, spill, [(0, b"[[[[")])
    plain = index._plain  # (the automaton the table holds: markers folded away)
    assert not opens[plain.step(plain.start, b'{"a":')] and opens[plain.step(plain.start, b'{"a":"')]
    for state in range(index._n_states):
        base = index.row_for_state(state)
        exact = index._stack_row(base, state, (), 0, -1, None)  # every deep token walked with the empty stack
        if calm[state]:
            assert exact == base, state


def test_cursor_forks_and_pickles_with_its_stack(llama3_vocab):
    index = TokenIndex(compile_schema({}).dfa, llama3_vocab)
    state = index.start()
    for t in single_byte_ids(llama3_vocab, "[[[[[[{"):
        state.advance(t)
    fork = state.fork()
    copy = pickle.loads(pickle.dumps(index))
    for t in single_byte_ids(llama3_vocab, "}]]]]]]"):
        fork.advance(t)
    assert fork.is_accepting() and not state.is_accepting() and state._stack == (0, 0, 0, 0)
    replay = copy.start()
    for t in single_byte_ids(llama3_vocab, "[[[[[[{}]]]]]]"):
        replay.advance(t)
    assert replay.is_accepting()
    np.testing.assert_array_equal(copy.start().mask(), index.start().mask())


def test_a_budget_that_cannot_bind_reads_the_unbudgeted_stack_rows(llama3_vocab, monkeypatch):
    # Past the index's bound plus one token per spilled container and per container a token may open, a stacked
    # cursor takes its unbudgeted rows (cached across steps) instead of a stack row per budget: the same masks as the
    # budgeted walk of every deep token, and no min_tokens table is built.
    vocab = llama3_vocab
    fast, slow = (TokenIndex(compile_schema(SCHEMA).dfa, vocab) for _ in range(2))
    opening = [t for t, b in enumerate(vocab.token_bytes) if b in (b"[", b"[[", b'{"', b'":[')]
    budget = fast._bounds()[1] + fast._most_opened + 40
    rng = random.Random(5)
    spilled = 0
    with monkeypatch.context() as m:
        for _ in range(6):
            a, b, left = fast.start(), slow.start(), budget
            for _ in range(30):
                m.setattr(TokenState, "_binding", lambda self, budget: budget)  # the walk of every deep token
                expected = b.mask(left).copy()
                m.undo()
                assert np.array_equal(a.mask(left), expected)
                assert a.mask_row(left) == a.mask_row()
                allowed = [int(t) for t in a.allowed_token_ids(left) if t not in vocab.eos_ids]
                if not allowed or left - 1 - len(a._stack) - fast._most_opened < fast._bounds()[1]:
                    break
                pool = [t for t in opening if t in set(allowed)]
                tok = rng.choice(pool) if pool and rng.random() < 0.8 else rng.choice(allowed)
                a.advance(tok, left)
                b.advance(tok)
                spilled += bool(a._stack)
                left -= 1
    assert spilled and fast._min_tokens is None


def test_budgeted_walks_over_deep_values_end_valid(llama3_vocab):
    # Under a budget a cursor counts one more token per spilled container (its closing bracket) on top of the
    # automaton's `min_tokens`: an estimate (docs/guarantees.md), so a walk may overrun its budget; the mask is never
    # empty before the value can end (measured: 15 of 300 such walks overran by one token, none by more).
    vocab = llama3_vocab
    index = TokenIndex(compile_schema(SCHEMA).dfa, vocab)
    rng = random.Random(3)
    opening = [t for t, b in enumerate(vocab.token_bytes) if b in (b"[", b"[[", b'{"', b'":[')]
    ended = within = 0
    for _ in range(40):
        budget = rng.randrange(30, 70)
        state, ids = index.start(), []
        while not state.is_accepting() or rng.random() < 0.7:
            left = max(budget - len(ids), 0)  # (as MaskProcessor passes it once a walk has overrun)
            allowed = [int(t) for t in state.allowed_token_ids(left) if t not in vocab.eos_ids]
            if not allowed:
                break
            live = set(allowed)
            pool = [t for t in opening if t in live]
            tok = rng.choice(pool) if pool and len(ids) < 20 and rng.random() < 0.8 else rng.choice(allowed)
            state.advance(tok, left)
            ids.append(tok)
        assert state.is_accepting() and len(ids) <= budget + 2
        value = json.loads(b"".join(vocab.token_bytes[t] for t in ids))
        ended += depth_of(value["a"]) > FREE_FORM_WINDOW
        within += len(ids) <= budget
    assert ended >= 10 and within >= 34


def test_where_two_deep_values_meet_in_a_product_they_nest_at_most_max_depth():
    # `oneOf` subtracts the overlap of its branches: two stacks cannot be lined up, so the schema is compiled again
    # with free-form values bounded by max_depth, long strings still counted
    schema = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 600},
                                               "v": {"oneOf": [{"type": "array"}, {"type": "array", "maxItems": 3}]}}}
    dfa = compile_schema(schema).dfa
    counters = fa.contract_counters(dfa)[1]
    assert counters is not None and counters.limits == (600,) and counters.refill is None
    assert dfa.matches(b'{"v":[1,2,3,4,[[[1]]]]}') and not dfa.matches(b'{"v":[1,2,3,4,[[[[1]]]]]}')
    assert not dfa.matches(b'{"v":[1,2]}')  # in both branches


def test_over_the_state_budget_with_the_stack_compiles_without():
    """A schema whose automaton with the stack exceeds the state budget and fits it without is compiled again
    without. Github_hard o82151, whose free-form arrays were each embedded twice until the NFA built an array's item
    once, was over 100k states with the stack then; now its compile peaks at 26,493 states with the stack and 25,949
    without: the budget is set to the least that the compile without the stack fits (found by bisection)."""
    import corpus  # (tests/corpus.py: the shared JSONSchemaBench files)

    case = next(c for c in corpus.jsonschemabench() if c.id == "Github_hard---o82151")

    def compiles(stack: bool, max_states: int) -> bool:
        opts = SchemaOptions(**{**corpus.OPTIONS, "max_states": max_states})
        fa.clear_compiled()  # (a shared sub-automaton would skip its budget check)
        try:
            _compile_with(case.schema, opts, "", time.monotonic() + 30, counters=True, stack=stack)
        except fa.BudgetExceeded:
            return False
        return True

    lo, hi = 1_000, 100_000
    assert compiles(False, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if compiles(False, mid) else (mid + 1, hi)
    assert not compiles(True, lo)
    fa.clear_compiled()
    dfa = compile_schema(case.schema, **{**corpus.OPTIONS, "max_states": lo}).dfa
    counters = fa.contract_counters(dfa)[1]
    assert dfa.n_states < 25_000 and counters is not None and counters.refill is None and counters.limits


def test_gemma4_arguments_nest_to_any_depth(gemma4_vocab):
    from constrain.parse import _gemma4_value
    from constrain.syntax import Gemma4Syntax

    vocab, quote = gemma4_vocab, 52  # `<|"|>`, Gemma 4's string quote token
    assert vocab.token_bytes[quote] == b'<|"|>' and quote in vocab.special_ids
    dfa = compile_schema({"type": "object", "properties": {"a": {}}}, syntax=Gemma4Syntax(quote)).dfa
    index = TokenIndex(dfa, vocab)
    assert index._stacked
    state = index.start()
    for piece in ["{a:[[[[{b:", quote, "x]}", quote, ",c:None}]]]]}"]:
        for t in [piece] if isinstance(piece, int) else single_byte_ids(vocab, piece):
            state.advance(t)
    assert state.is_accepting()
    with pytest.raises(MaskViolation):  # an object where the stack says array
        state = index.start()
        for t in single_byte_ids(vocab, "{a:[[[[[1]]]]}"):
            state.advance(t)
    rng = random.Random(5)
    brackets = [t for t, b in enumerate(vocab.token_bytes) if b in (b"[", b"{", b"[[", b"],[")]
    deepest = ended = 0
    for _ in range(8):
        state, ids = index.start(), single_byte_ids(vocab, "{a:")
        for t in ids:
            state.advance(t)
        while len(ids) < 60 and not (state.is_accepting() and rng.random() < 0.3):
            allowed = state.allowed_token_ids()
            allowed = allowed[~np.isin(allowed, vocab.eos_ids)]
            if not len(allowed):
                break
            pool = np.intersect1d(allowed, brackets) if len(ids) < 40 else []
            tok = int(rng.choice(pool) if len(pool) and rng.random() < 0.7 else rng.choice(allowed))
            state.advance(tok)
            ids.append(tok)
            deepest = max(deepest, len(state._stack))
        if state.is_accepting():
            _gemma4_value(b"".join(vocab.token_bytes[t] for t in ids).decode(), '<|"|>')  # parses
            ended += 1
    assert deepest >= 2 and ended >= 1


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
def test_the_stack_holds_at_most_max_spilled_containers(vocab_name, request):
    """A free-form value nests at most `MAX_SPILLED` containers beyond the window: at a full stack no token that opens
    one more is allowed (single brackets and multi-bracket tokens alike; `advance` refuses them, walked in Python
    or in C), while closing and scalars still are; one level below the cap, one more bracket is allowed again."""
    vocab = request.getfixturevalue(vocab_name)
    index = TokenIndex(compile_schema({}).dfa, vocab)
    opener = single_byte_ids(vocab, "[")[0]
    closer = single_byte_ids(vocab, "]")[0]
    multi = [t for t, data in enumerate(vocab.token_bytes) if data and set(data) <= set(b"[") and len(data) > 1]
    assert multi
    state = index.start()
    for _ in range(FREE_FORM_WINDOW + fa.MAX_SPILLED - 1):
        state.advance(opener)
    assert len(state._stack) == fa.MAX_SPILLED - 1
    allowed = set(state.allowed_token_ids().tolist())
    assert opener in allowed and closer in allowed and not allowed & set(multi)  # `[[` would spill two
    state.advance(opener)
    assert len(state._stack) == fa.MAX_SPILLED
    allowed = set(state.allowed_token_ids().tolist())
    assert closer in allowed and opener not in allowed and not allowed & set(multi)
    assert single_byte_ids(vocab, "1")[0] in allowed
    for t in [opener, *multi[:3]]:
        with pytest.raises(MaskViolation, match="past the 128"):
            state.fork().advance(t)
    # the C walk of long tokens stops at the same byte as the Python one
    low = state.fork()
    for _ in range(5):
        low.advance(closer)
    data = b"," + b"[" * 20  # (after a closed array, its sibling)
    args = (index._tr_view, index._n_classes, index._cls_list, index._eff_view, index._limits, low._state, data,
            low._count, low._limit, index._spill_view, index._refill_view, list(low._stack))
    assert fa.walk_counted(*args)[3] == 6  # the sixth bracket would spill a 129th kind
    assert index._stepper.counted(data, low._state, low._count, low._limit, low._stack)[3] == 6
    state.advance(closer)
    state.advance(single_byte_ids(vocab, ",")[0])
    assert opener in set(state.allowed_token_ids().tolist())  # a sibling at the deepest level
    state.advance(opener)
    for _ in range(FREE_FORM_WINDOW + fa.MAX_SPILLED):  # the deepest value the cap allows closes and ends
        state.advance(closer)
    assert state.is_accepting()
