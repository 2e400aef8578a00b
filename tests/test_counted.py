"""Counted strings: a long `maxLength` kept by a counter beside the automaton (`fa.counted_chars`).

Checked against the same schema compiled without counters (the bound unrolled into states): the same texts at the
DFA level, the same masks token by token on real tokenizers, also within a token's length of the bound.
"""

from __future__ import annotations

import json
import pickle
import random

import numpy as np
import pytest

from constrain import automaton as fa
from constrain import schema as schema_module
from constrain.errors import MaskViolation, UnsupportedSchema
from constrain.index import TokenIndex
from constrain.schema import compile_schema

# maxLength 300, counted from 200 free characters up: the unrolled automaton stays small enough to compare against
LIMIT = 300
SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": LIMIT, "minLength": 2}, "maxItems": 3}


def both(schema, monkeypatch, threshold=200, knob="COUNTED_MIN_CHARS"):
    """(counted DFA, unrolled DFA) of `schema`: counted from `threshold` (characters, or items with
    knob="COUNTED_MIN_ITEMS") beyond the minimum, then never."""
    monkeypatch.setattr(schema_module, knob, threshold)
    counted = compile_schema(schema).dfa
    monkeypatch.setattr(schema_module, knob, 10**9)
    unrolled = compile_schema(schema).dfa
    return counted, unrolled


def test_long_max_length_compiles_to_a_few_states_and_keeps_its_bound():
    dfa = compile_schema({"type": "string", "maxLength": 65535, "minLength": 3}).dfa
    assert fa.has_counters(dfa) and dfa.n_states < 100  # unrolled: 200k+
    assert dfa.matches(b'"' + b"a" * 65535 + b'"') and not dfa.matches(b'"' + b"a" * 65536 + b'"')
    assert dfa.matches('"éé\\n"'.encode()) and not dfa.matches(b'"ab"')
    # characters, not bytes: 65535 two-byte characters fit, one escape is one character
    assert dfa.matches('"'.encode() + "é".encode() * 65535 + b'"')
    assert dfa.matches(b'"' + b"\\u0001" * 65535 + b'"') and not dfa.matches(b'"' + b"\\u0001" * 65536 + b'"')


def test_counted_texts_are_the_unrolled_texts(monkeypatch):
    counted, unrolled = both({"type": "array", "items": {"type": "string", "maxLength": 30, "minLength": 2}},
                             monkeypatch, threshold=20)
    assert fa.has_counters(counted) and not fa.has_counters(unrolled)
    rng = random.Random(0)
    valid = ["a", "é", "😀", "\\n", '\\"', "\\\\", "\\u0001"]  # one character each
    invalid = ['"', "\\", "\x01", "\\u0041"]
    too_long = accepted = 0
    for _ in range(3000):
        items = []
        for _ in range(rng.randint(1, 3)):
            n = rng.randint(0, 36)
            items.append('"' + "".join(rng.choice(invalid if rng.random() < 0.01 else valid) for _ in range(n)) + '"')
            too_long += n > 30
        text = ("[" + ",".join(items) + "]").encode()
        assert counted.matches(text) == unrolled.matches(text), text
        accepted += unrolled.matches(text)
    assert accepted > 1000 and too_long > 500  # both sides of the bound


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "string", "maxLength": 250}, {"type": "string", "minLength": 3}]},  # overlaps: a product
    {"anyOf": [{"type": "string", "maxLength": 250}, {"type": "string", "pattern": "^ab"}]},  # two strings: one quote
    {"not": {"type": "string", "maxLength": 250}},
    {"type": "object", "propertyNames": {"maxLength": 250}},
])
def test_where_a_counter_cannot_be_kept_the_bound_is_unrolled(schema, monkeypatch):
    counted, unrolled = both(schema, monkeypatch)
    counters = fa.contract_counters(counted)[1]
    assert (counters is None or not counters.limits) and counted == unrolled  # (free-form values keep their stack)


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 250, "pattern": "^[a-zé]*(-[0-9]+)?$"},
    {"type": "string", "maxLength": 260, "minLength": 3, "format": "email"},
])
def test_a_pattern_or_format_keeps_its_automaton_and_counts(schema, monkeypatch):
    # the intersection reads the counted side's markers as no-ops: no length product
    counted, unrolled = both(schema, monkeypatch)
    assert fa.has_counters(counted) and counted.n_states * 10 < unrolled.n_states
    rng = random.Random(3)
    accepted = set()
    for _ in range(400):
        n = rng.choice([0, 1, 2, 5, 100, 240, 249, 250, 251, 252, 255, 258, 259, 260, 261, 300])
        alphabet = "ab" if rng.random() < 0.7 else "abé-1."
        local = "".join(rng.choice(alphabet) for _ in range(n))
        for text in (local, local[: max(n - 6, 0)] + "@ab.cd", local[: max(n - 3, 0)] + "-12", "-" + local):
            data = json.dumps(text, ensure_ascii=False).encode()
            assert counted.matches(data) == unrolled.matches(data), data
            if unrolled.matches(data):
                accepted.add(len(text))
    assert max(accepted) in (250, 260) and len(accepted) > 5  # up to the bound, and not past it


# at most 10 words and 150 characters: a pattern whose product with the length bound is ~49,000 states
WORDS = {"type": "string", "minLength": 1, "maxLength": 150, "pattern": "^(?:\\S+\\s+){0,9}\\S+$"}


def _words_text(rng) -> str:
    words = ["".join(rng.choice("ab\u00e9\"\\") for _ in range(rng.choice([1, 2, 7, 15, 40])))
             for _ in range(rng.choice([1, 2, 9, 10, 11, 12]))]
    return "".join(w + rng.choice([" ", "\t", "\n", "  "]) for w in words[:-1]) + words[-1] + rng.choice(["", "", " "])


def test_a_pattern_with_a_large_length_product_is_counted_below_counted_min_chars(monkeypatch):
    # (the default cap: its product passes COUNTED_PRODUCT_STATES; then no cap below the state budget)
    counted, product = both(WORDS, monkeypatch, schema_module.COUNTED_PRODUCT_STATES, knob="COUNTED_PRODUCT_STATES")
    assert fa.has_counters(counted) and not fa.has_counters(product)
    assert counted.n_states * 20 < product.n_states
    rng = random.Random(5)
    lengths = {True: set(), False: set()}
    for _ in range(3000):
        text = _words_text(rng)
        data = json.dumps(text, ensure_ascii=False).encode()
        assert counted.matches(data) == product.matches(data), data
        lengths[product.matches(data)].add(len(text))
    assert max(lengths[True]) == 150 and max(lengths[False]) > 150  # up to the bound, and not past it
    # within a token's reach of minLength (128 characters beyond it at most) the length stays in the product
    near = dict(WORDS, maxLength=129)
    assert not fa.has_counters(compile_schema(near).dfa)
    monkeypatch.setattr(schema_module, "COUNTED_PRODUCT_STATES", 1)
    assert not fa.has_counters(compile_schema(near).dfa)


def test_a_small_length_product_stays_exact_in_the_automaton():
    # e-mail's states off its cycles saturate: with maxLength 300 the length product holds 6,279 states (5,971 minimal)
    dfa = compile_schema({"type": "string", "format": "email", "maxLength": 300}).dfa
    assert not fa.has_counters(dfa) and dfa.n_states < schema_module.COUNTED_PRODUCT_STATES
    assert dfa.matches(b'"' + b"a" * 290 + b'@b.cd"') and not dfa.matches(b'"' + b"a" * 296 + b'@b.cd"')


def test_masks_on_a_large_length_product_equal_its_masks_llama3(llama3_vocab, monkeypatch):
    _compare_walks(llama3_vocab, monkeypatch, 16, seed=6, schema=WORDS, threshold=schema_module.COUNTED_PRODUCT_STATES,
                   knob="COUNTED_PRODUCT_STATES")


def test_oneof_branches_that_start_apart_keep_the_counter(monkeypatch):
    counted, unrolled = both({"oneOf": [{"type": "string", "maxLength": 250}, {"type": "integer"}]}, monkeypatch)
    assert fa.has_counters(counted)
    for text in (b'"' + b"x" * 250 + b'"', b'"' + b"x" * 251 + b'"', b"5", b"5.5", b'""'):
        assert counted.matches(text) == unrolled.matches(text), text


def _walk_both(vocab, counted, unrolled, n_walks, seed, choose, stop_p):
    """Walk the indexes of the counted and the unrolled automaton side by side, `choose(rng, byte_tokens)` picking
    each token, asserting equal masks at every step; returns (counted index, steps within a token's reach of a
    bound)."""
    a, b = TokenIndex(counted, vocab), TokenIndex(unrolled, vocab)
    assert fa.has_counters(counted) and a.dfa.n_states * 5 < b.dfa.n_states
    rng = random.Random(seed)
    near = 0
    for _ in range(n_walks):
        x, y = a.start(), b.start()
        for _ in range(1500):
            allowed = x.allowed_token_ids()
            assert np.array_equal(allowed, y.allowed_token_ids())
            assert np.array_equal(x.mask(), a.mask_table()[0][x.mask_row()])  # the row the processors read
            near += x._limit >= 0 and x._limit - x._count <= a._near[x._limit]
            byte_tokens = allowed[allowed < vocab.n_tokens]
            if not len(byte_tokens) or (y.is_accepting() and rng.random() < stop_p):
                break
            tok = choose(rng, byte_tokens)
            x.advance(tok)
            y.advance(tok)
    return a, near


def _compare_walks(vocab, monkeypatch, n_walks, seed, schema=SCHEMA, threshold=200, knob="COUNTED_MIN_CHARS"):
    lengths = np.array([len(t) for t in vocab.token_bytes])

    def choose(rng, byte_tokens):
        if rng.random() < 0.8:  # long tokens, to reach the bound
            return int(rng.choice(byte_tokens[np.argsort(-lengths[byte_tokens], kind="stable")[:50]]))
        return int(rng.choice(byte_tokens))

    _, near = _walk_both(vocab, *both(schema, monkeypatch, threshold, knob), n_walks, seed, choose, stop_p=0.05)
    assert near > 50  # states within a token's length of the bound were compared


def test_masks_equal_the_unrolled_masks_llama3(llama3_vocab, monkeypatch):
    _compare_walks(llama3_vocab, monkeypatch, 25, seed=1)


def test_masks_equal_the_unrolled_masks_gemma4(gemma4_vocab, monkeypatch):
    # byte-fallback tokens: characters split across tokens, so a token may end inside one near the bound
    _compare_walks(gemma4_vocab, monkeypatch, 25, seed=2)


def test_masks_on_a_pattern_equal_the_unrolled_masks_llama3(llama3_vocab, monkeypatch):
    # a pattern's automaton intersected with the counted loop (no length product)
    pattern = {"type": "array", "items": {"type": "string", "pattern": "^[a-z ]*$", "maxLength": LIMIT}, "maxItems": 2}
    _compare_walks(llama3_vocab, monkeypatch, 15, seed=4, schema=pattern)


def _cursor_near_bound(index, vocab, room):
    """A cursor inside the first string with `room` characters left (written with single-letter tokens)."""
    a_id = vocab.token_bytes.index(b"a")
    state = index.start()
    state.advance(vocab.token_bytes.index(b'["'))
    for _ in range(LIMIT - room):
        state.advance(a_id)
    return state


def test_advance_rejects_a_token_past_the_bound(llama3_vocab, monkeypatch):
    counted, unrolled = both(SCHEMA, monkeypatch)
    vocab = llama3_vocab
    x = _cursor_near_bound(TokenIndex(counted, vocab), vocab, 3)
    y = _cursor_near_bound(TokenIndex(unrolled, vocab), vocab, 3)
    four = vocab.token_bytes.index(b"abcd")
    for cursor in (x, y):
        assert not cursor.allowed_token_ids().tolist().count(four)
        with pytest.raises(MaskViolation):
            cursor.advance(four)
    three = vocab.token_bytes.index(b"abc")
    x.advance(three)
    y.advance(three)
    assert np.array_equal(x.allowed_token_ids(), y.allowed_token_ids())
    assert vocab.token_bytes.index(b'"]') in x.allowed_token_ids().tolist()


def test_fork_and_pickle_keep_the_count(llama3_vocab, monkeypatch):
    counted, _ = both(SCHEMA, monkeypatch)
    vocab = llama3_vocab
    index = TokenIndex(counted, vocab)
    x = _cursor_near_bound(index, vocab, 5)
    fork = x.fork()
    assert np.array_equal(fork.allowed_token_ids(), x.allowed_token_ids())
    again = pickle.loads(pickle.dumps(index))
    y = _cursor_near_bound(again, vocab, 5)
    assert np.array_equal(y.allowed_token_ids(), x.allowed_token_ids())
    x.advance(vocab.token_bytes.index(b"a"))
    assert not np.array_equal(fork.allowed_token_ids(), x.allowed_token_ids())  # the fork kept its own count


# --- counted arrays: a long maxItems kept by the same counter, a tick per item separator ---------------------------

def both_items(schema, monkeypatch, threshold=20):
    """`both` for arrays: counted from `threshold` items beyond minItems."""
    return both(schema, monkeypatch, threshold, knob="COUNTED_MIN_ITEMS")


def test_long_max_items_compiles_to_the_item_automaton_and_keeps_its_bound():
    item = {"type": "object", "properties": {"key": {"type": "string", "pattern": "^[0-9a-z_-]{1,255}$"},
                                             "value": {"type": "string", "minLength": 1, "maxLength": 255}},
            "required": ["key", "value"], "additionalProperties": False}
    dfa = compile_schema({"type": "array", "items": item, "maxItems": 100}).dfa  # Github_easy o9842's deviceTags
    assert fa.has_counters(dfa) and dfa.n_states < 4000  # 3,857 states; unrolled: over the 100k-state budget
    one = {"key": "k", "value": "v"}
    for n in (0, 1, 99, 100, 101):
        for separators in ((",", ":"), (", ", ": ")):
            assert dfa.matches(json.dumps([one] * n, separators=separators).encode()) == (n <= 100), (n, separators)
    dfa = compile_schema({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1000}).dfa
    assert fa.has_counters(dfa) and dfa.n_states < 30  # 20 states (with its markers)
    assert [n for n in (0, 2, 3, 1000, 1001) if dfa.matches(json.dumps([7] * n).encode())] == [3, 1000]


def test_counted_arrays_are_the_unrolled_arrays(monkeypatch):
    schema = {"type": "array", "items": {"enum": [1, "a", [2]]}, "minItems": 2, "maxItems": 25}
    counted, unrolled = both_items(schema, monkeypatch)
    assert fa.has_counters(counted) and not fa.has_counters(unrolled)
    rng = random.Random(3)
    accepted = too_long = 0
    for _ in range(2000):
        n = rng.randint(0, 30)
        items = [rng.choice(["1", '"a"', "[2]", "[2,2]", "2"] if rng.random() < 0.02 else ["1", '"a"', "[2]"])
                 for _ in range(n)]
        text = ("[" + rng.choice([",", ", "]).join(items) + "]").encode()
        assert counted.matches(text) == unrolled.matches(text), text
        accepted += unrolled.matches(text)
        too_long += n > 25
    assert accepted > 800 and too_long > 200


@pytest.mark.parametrize("schema", [
    # an item that holds a counted string: one counter at a time, so the array is unrolled (the string counted)
    {"type": "array", "items": {"type": "string", "maxLength": 600}, "maxItems": 30},
    {"anyOf": [{"type": "array", "maxItems": 30}, {"type": "array", "items": {"type": "integer"}}]},  # one '['
    {"not": {"type": "array", "items": {"type": "integer"}, "maxItems": 30}},
])
def test_where_an_item_counter_cannot_be_kept_the_bound_is_unrolled(schema, monkeypatch):
    counted, unrolled = both_items(schema, monkeypatch)
    markers = {sid for sid in counted.specials if sid < 0}
    assert markers == {sid for sid in unrolled.specials if sid < 0}  # only the string's, where there is one
    for n in (0, 29, 30, 31):
        text = json.dumps(["x" * 10] * n if "maxLength" in json.dumps(schema) else [5] * n).encode()
        assert counted.matches(text) == unrolled.matches(text), n


def _compare_item_walks(vocab, monkeypatch, schema, n_walks, seed):
    def choose(rng, byte_tokens):  # mostly tokens that continue the array, to reach the bound
        going = [t for t in byte_tokens.tolist() if b"]" not in vocab.token_bytes[t]]
        return int(rng.choice(going if going and rng.random() < 0.97 else byte_tokens))

    index, near = _walk_both(vocab, *both_items(schema, monkeypatch, threshold=60), n_walks, seed, choose, stop_p=0.02)
    assert near > 80  # states within a token's reach of the bound were compared
    return index


def test_item_masks_equal_the_unrolled_masks_llama3(llama3_vocab, monkeypatch):
    # an array ticks on its commas only: Llama 3's tokens hold 8 commas at most, in 8 bytes, and two ticks lie 2 bytes
    # apart at least ("7,"): rows are counted from 1 + 7 // 2 = 4 left
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 70}
    index = _compare_item_walks(llama3_vocab, monkeypatch, schema, 30, seed=5)
    assert index._near == {69: 4}


def test_item_masks_equal_the_unrolled_masks_gemma4(gemma4_vocab, monkeypatch):
    schema = {"type": "array", "items": {"enum": ["a", "bc", "d e"]}, "minItems": 1, "maxItems": 64}
    index = _compare_item_walks(gemma4_vocab, monkeypatch, schema, 30, seed=6)
    # Gemma 4: 4 commas in one token at most, those with two or more 8 bytes at most; ticks 4 bytes apart ('"a",')
    assert index._near == {63: 2}


def test_a_vocabulary_whose_tokens_could_pass_a_fresh_item_bound_is_refused(llama3_vocab, monkeypatch):
    # Llama 3's 8-byte tokens of 4 or 8 commas, with ticks 2 bytes apart ("7,"), could count 4 at once: a bound of 4
    # commas could be passed at once (opened inside that token, no counted row before)
    counted, _ = both_items({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                             "maxItems": 5}, monkeypatch, threshold=3)
    with pytest.raises(UnsupportedSchema):
        TokenIndex(counted, llama3_vocab)
    counted, _ = both_items({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
                             "maxItems": 6}, monkeypatch, threshold=3)
    assert TokenIndex(counted, llama3_vocab)._near == {5: 4}


def test_public_api_walks_fill_a_counted_array_to_its_bound_and_no_further(qwen3_vocab):
    # production threshold (no monkeypatch): maxItems 120, so the array is counted; walks that continue the array
    # whenever the mask allows end at exactly 120 items, budgeted walks end in time, every output valid
    import constrain

    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 120}
    index = constrain.compile_json_schema(schema, qwen3_vocab, cache=None)
    assert fa.has_counters(index.dfa) is False and index._counters is not None  # (the cursor keeps the count)
    vocab = qwen3_vocab
    rng = random.Random(7)
    lengths = []
    for budget in (None, None, 30, 90):
        state = index.start()
        out = b""
        for step in range(2000):
            left = None if budget is None else budget - step
            allowed = state.allowed_token_ids(left)
            text_ids = [t for t in allowed.tolist() if t < vocab.n_tokens]
            if not text_ids:
                break
            going = [t for t in text_ids if b"]" not in vocab.token_bytes[t]]
            tok = rng.choice(going or text_ids)
            state.advance(tok)
            out += vocab.token_bytes[tok]
            if state.is_accepting() and not going:
                break
        assert state.is_accepting(), out[-80:]
        items = json.loads(out)
        assert all(isinstance(x, int) and 0 <= x <= 9 for x in items) and 1 <= len(items) <= 120
        if budget is not None:
            assert step < budget
        lengths.append(len(items))
    assert lengths[0] == lengths[1] == 120


# A short array of heavy items (tool calls) is counted too (COUNTED_UNROLLED_SIZE): its item appears once in the
# automaton.
CALL_ITEM = {"type": "object", "properties": {
    "name": {"enum": ["get_weather", "send_email", "book_table"]},
    "city": {"type": "string", "maxLength": 12},
    "units": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["name", "city"], "additionalProperties": False}


def _short_arrays(schema, monkeypatch):
    counted = compile_schema(schema).dfa
    monkeypatch.setattr(schema_module, "COUNTED_UNROLLED_SIZE", 10**9)
    unrolled = compile_schema(schema).dfa
    monkeypatch.undo()
    return counted, unrolled


@pytest.mark.parametrize("vocab_name,seed", [("llama3_vocab", 11), ("gemma4_vocab", 12)])
def test_a_few_heavy_items_are_counted_with_the_unrolled_masks(vocab_name, seed, monkeypatch, request):
    vocab = request.getfixturevalue(vocab_name)
    schema = {"type": "array", "items": CALL_ITEM, "minItems": 1, "maxItems": 8}
    counted, unrolled = _short_arrays(schema, monkeypatch)

    def choose(rng, byte_tokens):  # mostly tokens that continue the array, to reach the bound
        going = [t for t in byte_tokens.tolist() if b"]" not in vocab.token_bytes[t]]
        return int(rng.choice(going if going and rng.random() < 0.97 else byte_tokens))

    index, near = _walk_both(vocab, counted, unrolled, 12, seed, choose, stop_p=0.02)
    # an item and its comma are 20 bytes at least, and a token with two commas 8 at most: one tick a token
    assert index._near == {7: 1} and index._ticking is not None
    assert near > 60  # steps with at most one item left (counted rows) were compared


def _need_by_rounds(index):
    """`_need_ticks` as a fixpoint of whole-table rounds (its code until session 28): states that cannot reach a
    closing transition over transitions that count nothing."""
    effect, trans = index._counters.effect, np.asarray(index._plain.transitions)
    can_close = (effect == fa.EFFECT_CLOSE).any(axis=1)
    quiet, target = (effect == fa.EFFECT_NONE) & (trans >= 0), np.maximum(trans, 0)
    while True:
        grown = can_close | (quiet & can_close[target]).any(axis=1)
        if (grown == can_close).all():
            return np.append(~can_close, False).astype(np.int64)
        can_close = grown


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
def test_counted_rows_at_the_most_ticks_are_plain_where_no_state_inside_needs_one(vocab_name, request):
    # An array of tool calls with minItems 1: no state inside the counter needs a tick to close (the states before
    # '[' and after ']' do, outside it), so at a room of the most ticks one token makes (1) every state's row is the
    # plain one without a walk, and at room 0 the comma tokens alone are walked; both equal the walk of every token by
    # numpy. With minItems 2 the first item's states need a tick. `_need_ticks` equals the fixpoint of rounds.
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema({"type": "array", "items": CALL_ITEM, "minItems": 1, "maxItems": 8}).dfa
    index, full = TokenIndex(dfa, vocab), TokenIndex(dfa, vocab)
    full._ticking, full._walker = None, None  # every token walked by numpy, no shortcut
    assert index._most_ticks == 1 and not index._need_inside() and index._need_ticks().sum() == 2
    for room in (1, 0):
        for state in range(index._n_states):
            expected = full._row_words(full._counted_row(state, room, None))
            assert np.array_equal(index._row_words(index._counted_row(state, room, None)), expected), (state, room)
    assert index._tick_walker is not None  # (room 0: the comma tokens walked)
    for lo in (1, 2, 3):
        needy = TokenIndex(compile_schema({"type": "array", "items": CALL_ITEM, "minItems": lo, "maxItems": 10}).dfa,
                           vocab)
        assert np.array_equal(needy._need_ticks(), _need_by_rounds(needy))
        assert needy._need_inside() == (lo > 1)
    strings = TokenIndex(compile_schema({"type": "array", "items": {"type": "string", "maxLength": 3000},
                                         "maxItems": 3}).dfa, vocab)  # (inside an escape: a count is needed)
    assert np.array_equal(strings._need_ticks(), _need_by_rounds(strings)) and strings._need_inside()


def test_a_few_light_or_tight_items_are_unrolled(monkeypatch):
    def counted(items, hi, lo=0):
        return fa.has_counters(compile_schema({"type": "array", "items": items, "minItems": lo, "maxItems": hi}).dfa)

    assert not counted({"type": "integer"}, 8)  # a small item: unrolled copies cost little
    # CALL_ITEM weighs 799 (`fa.size`): counted from (maxItems - minItems) * 799 >= 4,096
    assert [hi for hi in (3, 4, 5, 6, 7, 8) if counted(CALL_ITEM, hi, lo=1)] == [7, 8]
    monkeypatch.setattr(schema_module, "COUNTED_UNROLLED_SIZE", 0)
    # items of 31 bytes at least: one comma a token, so a bound of one comma is left unrolled
    assert [hi for hi in (2, 3) if counted(CALL_ITEM, hi)] == [3]
    # items of 4 bytes ('"x0"'): a token of 12 bytes might count 1 + 11 // 5 = 3 commas
    short = {"type": "string", "enum": ["a" * 40, "b" * 41] + [f"x{i}" for i in range(40)]}
    assert [hi for hi in (4, 5) if counted(short, hi)] == [5]


def _expected_step(index, cursor, token):
    """What advancing `cursor` by the byte token `token` must do, by `fa.walk_counted` over every byte (the counted
    walk, whatever the token holds): `(state, count, limit)`, or None where the cursor must refuse it."""
    data = index._vocab.token_bytes[token]
    state, count, limit, at = fa.walk_counted(index._tr_view, index._n_classes, index._cls_list, index._eff_view,
                                              index._limits, cursor._state, data, cursor._count, cursor._limit)
    if at >= 0 or (0 <= limit == count and index._need_ticks()[state]):
        return None
    return state, count, limit


@pytest.mark.parametrize("vocab_name,seed", [("llama3_vocab", 21), ("gemma4_vocab", 22)])
def test_a_token_without_effect_bytes_steps_as_the_counted_walk(vocab_name, seed, request):
    # An array's cursor walks a token that holds none of the bytes with an effect (',', '[', ']') without counting
    # (`TokenIndex._counts`): at cursors all along random walks, every one of 3,000 random tokens (half of them
    # holding an effect byte) steps or is refused as the counted walk of its bytes says.
    vocab = request.getfixturevalue(vocab_name)
    schema = {"type": "array", "items": CALL_ITEM, "minItems": 2, "maxItems": 8}
    index = TokenIndex(compile_schema(schema).dfa, vocab)
    assert index._counters is not None and index._quiet_bytes is not None
    assert set(bytes(range(256))) - set(index._quiet_bytes) == set(b",[]")
    rng = random.Random(seed)
    tokens = [t for t in range(vocab.n_tokens) if vocab.token_bytes[t] and t not in vocab.special_ids]
    loud = [t for t in tokens if set(vocab.token_bytes[t]) & set(b",[]")]
    kinds = {True: 0, False: 0}
    for _ in range(4):
        cursor = index.start()
        for _ in range(rng.randrange(5, 400)):
            ids = cursor.allowed_token_ids()
            ids = ids[ids < vocab.n_tokens]
            if not len(ids):
                break
            cursor.advance(int(rng.choice(ids)))
            if rng.random() < 0.1:
                for t in rng.sample(tokens, 375) + rng.sample(loud, 375):
                    expected = _expected_step(index, cursor, t)
                    step = cursor.fork()
                    try:
                        step.advance(t)
                        got = (step._state, step._count, step._limit)
                    except MaskViolation:
                        got = None
                    assert got == expected, (t, vocab.token_bytes[t])
                    kinds[index._counts(t, vocab.token_bytes[t])] += 1
    assert kinds[True] > 500 and kinds[False] > 500


# --- a format's length cap counted: hostname's 253 bytes (`formats.counted_format`) -------------------------------

HOSTNAME = {"type": "string", "format": "hostname"}


def _hostname(rng: random.Random, n: int) -> str:
    """A random name of about `n` bytes: LDH labels of 1..63 bytes (no `--`) joined by dots, cut at `n` (it may end in
    a hyphen: invalid, as the checker says too; not in a dot, which the checker takes and we do not, documented)."""
    labels: list[str] = []
    while len(".".join(labels)) < n:
        inner = "".join(rng.choice("abcxyz019-") for _ in range(rng.randint(0, 61))).replace("--", "-a")
        labels.append(rng.choice(["a", "a" + inner + "z"]))
    return ".".join(labels)[:n].rstrip(".")


def test_hostname_in_a_json_string_counts_to_253_bytes():
    from jsonschema import Draft202012Validator

    checker = Draft202012Validator.FORMAT_CHECKER
    dfa = compile_schema(HOSTNAME).dfa
    assert fa.has_counters(dfa) and dfa.n_states < 300  # the cap in the automaton: ~24,000 states
    longest = ".".join(["a" * 63] * 3 + ["b" * 61])
    assert len(longest) == 253 and dfa.matches(f'"{longest}"'.encode())
    assert not dfa.matches(f'"{longest}c"'.encode()) and not dfa.matches(f'"{"a" * 64}.com"'.encode())
    assert dfa.matches(f'"{"a" * 63}.com"'.encode())  # 67 bytes: past the 63 the automaton alone keeps
    rng = random.Random(0)
    for _ in range(400):
        value = _hostname(rng, rng.randint(1, 262))
        text = json.dumps(value).encode()
        assert dfa.matches(text) == checker.conforms(value, "hostname"), value


@pytest.mark.parametrize("schema", [
    {"anyOf": [HOSTNAME, {"type": "string", "format": "ipv4"}]},  # branches that start alike (Snowplow sp_371)
    {"type": "array", "contains": HOSTNAME},  # each element is a match or not: two alternatives alike
    {"type": "array", "items": HOSTNAME, "maxItems": 1000},  # counted items: never items that count themselves
])
def test_where_a_hostname_cap_cannot_be_counted_it_is_narrowed_to_63_bytes(schema):
    dfa = compile_schema(schema).dfa
    wrap = (lambda v: [v]) if schema.get("type") == "array" else (lambda v: v)
    assert not dfa.matches(json.dumps(wrap("a" * 63 + ".com")).encode())  # over 63 bytes: narrowed
    assert dfa.matches(json.dumps(wrap("a" * 59 + ".com")).encode())


@pytest.mark.parametrize(("bounds", "most_states"), [({"maxLength": 100}, 6000), ({"minLength": 200}, 30000)])
def test_a_hostname_cap_within_a_tokens_reach_of_its_bounds_is_exact_in_the_automaton(bounds, most_states):
    # too few characters to count (a token may spell 128): the cap and the bounds in a product, exact
    dfa = compile_schema({**HOSTNAME, **bounds}).dfa
    assert not fa.has_counters(dfa) and dfa.n_states < most_states
    lo, hi = bounds.get("minLength", 1), bounds.get("maxLength", 253)
    for n in (lo - 1, lo, 150, hi, hi + 1):
        if n < 1:
            continue
        name = ".".join(["a" * 63] * 4)[:n - 1] + "b"  # labels of 63 bytes, the last one cut short
        assert dfa.matches(json.dumps(name).encode()) == (lo <= n <= hi), n


def test_hostname_cap_counted_once_not_compiled_again(monkeypatch):
    # the narrowing of branches that start alike happens while the expression is built: one compile, not a second
    # one without counters (which narrows every other counted string of the schema too)
    calls = []
    real = schema_module._compile_with
    monkeypatch.setattr(schema_module, "_compile_with", lambda *a, **k: calls.append(k["counters"]) or real(*a, **k))
    long_text = {"type": "string", "maxLength": 5000}
    compile_schema({"type": "object", "properties": {"h": {"anyOf": [HOSTNAME, {"type": "string", "format": "ipv4"}]},
                                                    "t": long_text}})
    assert calls == [True]


def test_hostname_masks_equal_the_capped_automaton_masks_llama3(llama3_vocab, monkeypatch):
    # the cap at 160 (cheap as a product: 12k states), counted against the product, token by token near the cap
    from constrain import formats

    monkeypatch.setattr(formats, "HOSTNAME_MAX_BYTES", 160)
    counted = compile_schema(HOSTNAME).dfa
    monkeypatch.setattr(schema_module, "COUNTED_FORMAT_MIN_CHARS", 10**9)
    monkeypatch.setattr(formats, "_HOSTNAME", fa.intersect(formats._HOSTNAME_LABELS, fa.repeat(formats._ANY_BYTE, 1, 160)))
    formats._built.cache_clear()
    try:
        capped = compile_schema(HOSTNAME).dfa
    finally:
        formats._built.cache_clear()
    vocab = llama3_vocab
    lengths = np.array([len(t) for t in vocab.token_bytes])

    def choose(rng, byte_tokens):
        if rng.random() < 0.7:
            return int(rng.choice(byte_tokens[np.argsort(-lengths[byte_tokens])[:40]]))
        return int(rng.choice(byte_tokens))

    index, near = _walk_both(vocab, counted, capped, 20, 7, choose, stop_p=0.02)
    assert near > 50
