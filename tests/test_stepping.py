"""The cursor's per-token calls in C (`constrain.stepping`): patched masks written into a caller's buffer, and token
walks, equal to the numpy and Python paths they stand in for."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from constrain import stepping
from constrain.errors import InternalError, MaskViolation
from constrain.index import TokenIndex
from constrain.schema import compile_schema

from test_native import _STEP_SCHEMA, counted_walk_cases, tally_walk

_EXT = stepping.module()


def test_the_extension_is_built_where_a_compiler_and_python_headers_are():
    if os.environ.get("CONSTRAIN_NATIVE", "1") == "0":
        pytest.skip("CONSTRAIN_NATIVE=0 turns every native library off")
    if shutil.which("cc") is None and shutil.which("gcc") is None and shutil.which("clang") is None:
        pytest.skip("no C compiler on this machine: cursors copy masks and walk tokens in numpy and Python")
    if not Path(sysconfig.get_paths()["include"], "Python.h").exists():
        pytest.skip("no Python.h for this interpreter: cursors copy masks and walk tokens in numpy and Python")
    assert _EXT is not None


needs_ext = pytest.mark.skipif(_EXT is None, reason="the extension is not built here (no compiler or Python.h)")


def _masks(rng: np.random.Generator) -> list[np.ndarray]:
    """Masks of 1-3000 words around the patch limit: mostly 0 or mostly 1 with 0 to the limit + 6 other words, and
    random ones."""
    out = []
    for n in (1, 2, 31, 100, 3000):
        for base in (0, -1):
            limit = stepping.patch_limit(n)
            for k in (0, 1, limit - 1, limit, limit + 1, limit + 6):
                mask = np.full(n, base, np.int32)
                at = rng.choice(n, size=min(k, n), replace=False)
                mask[at] = rng.integers(-2**31, 2**31, size=at.shape[0], dtype=np.int64).astype(np.int32)
                out.append(mask)
        out.append(rng.integers(-2**31, 2**31, size=n, dtype=np.int64).astype(np.int32))
    return out


def _sparse_key(mask: np.ndarray) -> bytes:
    from constrain.native import sparse_key
    return sparse_key(mask)


@needs_ext
def test_a_patch_rebuilds_its_mask_and_is_none_past_the_limit():
    """`patch` (C) and `patch_of` (numpy) give the same patch; `fill` writes exactly the mask from it; a mask with
    more than `patch_limit` words off both all 0 and all 1 has none."""
    rng = np.random.default_rng(3)
    for mask in _masks(rng):
        n = mask.shape[0]
        off = min(int((mask != 0).sum()), int((mask != -1).sum()))
        limit = stepping.patch_limit(n)
        got = _EXT.patch(mask, limit)
        saved = stepping._state["mod"]
        stepping._state["mod"] = None
        try:
            assert stepping.patch_of(b"f" + mask.tobytes(), mask, n) == got
        finally:
            stepping._state["mod"] = saved
        if off > limit:
            assert got is None
            continue
        assert got is not None and len(got) == 8 + 8 * off
        for dtype in (np.int32, np.uint32):
            out = np.full(n, 7, dtype)
            _EXT.fill(out, got)
            assert np.array_equal(out.view(np.int32), mask)
        key = _sparse_key(mask)
        if key[:1] == b"s":  # a sparse key is a patch over all 0 as it stands
            out = np.full(n, 7, np.int32)
            _EXT.fill(out, stepping.patch_of(key, None, n))
            assert np.array_equal(out, mask)


@needs_ext
def test_fill_refuses_a_buffer_of_another_width_or_kind():
    patch = _EXT.patch(np.zeros(10, np.int32), 4)
    for bad in (np.zeros(9, np.int32), np.zeros(11, np.int32), np.zeros(10, np.int64), np.zeros(20, np.int16)):
        with pytest.raises(ValueError):
            _EXT.fill(bad, patch)
    frozen = np.zeros(10, np.int32)
    frozen.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        _EXT.fill(frozen, patch)
    with pytest.raises(ValueError):  # not C-contiguous
        _EXT.fill(np.zeros(20, np.int32)[::2], patch)
    with pytest.raises(ValueError):  # not bytes: read as a mask, of 1-byte items
        _EXT.fill(np.zeros(10, np.int32), bytearray(patch))
    with pytest.raises(ValueError):  # a pair that names a word outside the mask
        _EXT.fill(np.zeros(10, np.int32), patch[:8] + np.array([10, 1], np.int32).tobytes())
    mask = np.arange(10, dtype=np.int32)
    out = np.zeros(10, np.uint32)
    _EXT.fill(out, mask)  # a mask is copied
    assert np.array_equal(out.view(np.int32), mask)
    for bad_out, bad_mask in ((np.zeros(9, np.int32), mask), (np.zeros(10, np.int32), mask.astype(np.int64)),
                              (np.zeros(10, np.int32), mask[::2])):
        with pytest.raises(ValueError):
            _EXT.fill(bad_out, bad_mask)


# -- TokenState.fill_mask and advance over real tokenizers --------------------------------------------------------

_PLAIN_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1,
                                                                                      "maximum": 14},
    "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}}},
    "required": ["city", "unit"], "additionalProperties": False}
# counted strings and arrays (bounds past the automaton's own), without deep values
_COUNTED_SCHEMA = {"type": "object", "properties": {
    "s": {"type": "string", "maxLength": 600}, "xs": {"type": "array", "items": {"type": "integer"}, "maxItems": 150},
    "note": {"type": "string", "minLength": 2, "maxLength": 300}}, "required": ["s", "xs"], "additionalProperties": False}
_SCHEMAS = {"plain": _PLAIN_SCHEMA, "counted": _COUNTED_SCHEMA, "deep": _STEP_SCHEMA}


def _walks(index: TokenIndex, rng: np.random.Generator, n: int, steps: int):
    """`n` random walks of up to `steps` tokens, each token drawn from the mask (EOS ends a walk): (cursor before,
    token) pairs, the cursor a fork."""
    for _ in range(n):
        cursor = index.start()
        for _ in range(steps):
            allowed = cursor.allowed_token_ids()
            t = int(rng.choice(allowed))
            yield cursor.fork(), t
            cursor.advance(t)
            if cursor.is_finished():
                yield cursor.fork(), None
                break


@pytest.mark.parametrize("vocab_name", ["llama3_vocab", "gemma4_vocab"])
@pytest.mark.parametrize("kind", list(_SCHEMAS))
def test_fill_mask_writes_the_mask_at_every_step(request, vocab_name, kind):
    """Along random walks (and after EOS), `fill_mask(out)` and `fill_mask(out, budget)` write `mask()` and
    `mask(budget)`, into int32 and uint32 buffers, with the extension and with the numpy copy it stands in for."""
    vocab = request.getfixturevalue(vocab_name)
    dfa = compile_schema(_SCHEMAS[kind], whitespace="compact").dfa
    index = TokenIndex(dfa, vocab, background=True)
    rng = np.random.default_rng(11)
    out = np.zeros(index.n_words, np.int32)
    plain = steps = 0
    for cursor, _ in _walks(index, rng, 6, 90):
        steps += 1
        for ext in (index._fill_words, None):
            saved, index._fill_words = index._fill_words, ext
            try:
                out[:] = 12345
                cursor.fill_mask(out)
                assert np.array_equal(out, cursor.mask())
                budget = int(rng.integers(1, 40))
                u32 = np.zeros(index.n_words, np.uint32)
                cursor.fill_mask(u32, budget)
                assert np.array_equal(u32.view(np.int32), cursor.mask(budget))
            finally:
                index._fill_words = saved
        plain += index._patches[cursor.mask_row()] is not None
    assert steps > 60 and plain >= 10, (plain, steps)


def test_a_row_without_a_patch_is_copied(llama3_vocab):
    """A string's content on Llama 3 (the tokens without a quote, a backslash or a control byte: ~2,500 of 4,008
    words are not all 1) has no patch; fill_mask copies its row."""
    index = TokenIndex(compile_schema({"type": "string"}).dfa, llama3_vocab)
    cursor = index.start()
    cursor.advance(llama3_vocab.token_bytes.index(b'"'))
    assert index._patches[cursor.mask_row()] is None
    out = np.full(index.n_words, 5, np.int32)
    cursor.fill_mask(out)
    assert np.array_equal(out, cursor.mask())


@pytest.mark.parametrize("use_ext", [True, False])
def test_fill_mask_refuses_a_buffer_of_another_shape(llama3_vocab, use_ext):
    index = TokenIndex(compile_schema(_PLAIN_SCHEMA).dfa, llama3_vocab)
    if not use_ext:
        index._fill_words = None
    elif index._fill_words is None:
        pytest.skip("the extension is not built here (no compiler or Python.h)")
    cursor = index.start()
    for bad in (np.zeros(index.n_words + 1, np.int32), np.zeros((1, index.n_words), np.int32)[:, :-1],
                np.zeros(index.n_words, np.int64), np.zeros(index.n_words, np.int16)):
        with pytest.raises(ValueError):
            cursor.fill_mask(bad)
    frozen = np.zeros(index.n_words, np.int32)
    frozen.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):  # (numpy's own error for a read-only buffer asked writable)
        cursor.fill_mask(frozen)
    with pytest.raises(TypeError):
        cursor.fill_mask([0] * index.n_words)


@pytest.mark.parametrize("kind", list(_SCHEMAS))
def test_a_negative_budget_is_refused_by_every_mask_call(llama3_vocab, kind):
    index = TokenIndex(compile_schema(_SCHEMAS[kind], whitespace="compact").dfa, llama3_vocab)
    cursor = index.start()
    cursor.advance(llama3_vocab.token_bytes.index(b"{"))
    out = np.zeros(index.n_words, np.int32)
    for call in (lambda: cursor.mask(-1), lambda: cursor.mask_row(-1), lambda: cursor.fill_mask(out, -1),
                 lambda: cursor.allowed_token_ids(-1)):
        with pytest.raises(InternalError):
            call()


def _python_twin(index: TokenIndex) -> TokenIndex:
    """The same index with the cursor's C walks off: `advance` walks every token in Python."""
    twin = TokenIndex(index._dfa, index.vocab)
    twin._walk_step = twin._walk_counted = twin._stepper = None
    twin._plain_steps = twin._quick_steps = False
    return twin


@pytest.mark.parametrize("kind", list(_SCHEMAS))
def test_the_c_walks_advance_as_the_python_walk(gemma4_vocab, kind):
    """From the states of random walks, every token that spells the text ahead and random tokens (byte tokens,
    specials, EOS, ids out of range), under no budget, a budget past every state's bound and a tight one, move the
    cursor to the same state, count and bound, or raise the same MaskViolation (the same dying byte), with the C
    walks and without."""
    dfa = compile_schema(_SCHEMAS[kind], whitespace="compact").dfa
    index = TokenIndex(dfa, gemma4_vocab)
    if index._walk_step is None:
        pytest.skip("the extension is not built here (no compiler or Python.h)")
    assert (index._walk_counted is not None) == (kind != "plain") and index._plain_steps == (kind == "plain")
    twin = _python_twin(index)
    rng = np.random.default_rng(5)
    n = len(gemma4_vocab.token_bytes)
    outcomes = {"moved": 0, "refused": 0}
    for cursor, t in _walks(index, rng, 8, 120):
        ids = rng.integers(n, size=6).tolist() + [-1, n, gemma4_vocab.vocab_size - 1, *gemma4_vocab.eos_ids[:1]]
        if t is not None:
            ids.append(t)
        # no budget, one at or past every state's bound (the quick path), and a tight one (the full path)
        budgets = [None, index._bounds()[1] + int(rng.integers(3)), int(rng.integers(1, 4))]
        for tok, budget in itertools.product(ids, budgets):
            mine, theirs = cursor.fork(), cursor.fork()
            theirs._index = twin
            try:
                theirs.advance(tok, budget)
            except MaskViolation as err:
                with pytest.raises(MaskViolation) as got:
                    mine.advance(tok, budget)
                assert str(got.value) == str(err)
                outcomes["refused"] += 1
                continue
            mine.advance(tok, budget)
            assert (mine._state, mine._count, mine._limit, mine._stack, mine._finished) == (
                theirs._state, theirs._count, theirs._limit, theirs._stack, theirs._finished)
            outcomes["moved"] += 1
    assert min(outcomes.values()) > 50, outcomes


def test_a_walk_in_c_refuses_a_state_outside_the_automaton(llama3_vocab):
    index = TokenIndex(compile_schema(_PLAIN_SCHEMA).dfa, llama3_vocab)
    if index._walk_step is None:
        pytest.skip("the extension is not built here (no compiler or Python.h)")
    assert index._walk_step(index.start().dfa_state, b"") == -1  # an empty token moves nowhere
    for bad in (-1, index.dfa.n_states):
        with pytest.raises(ValueError):
            index._walk_step(bad, b"{")
    with pytest.raises(TypeError):
        index._walk_step(0, bytearray(b"{"))


def test_json_texts_walk_to_acceptance_through_the_c_walks(qwen3_vocab):
    """A valid instance of each schema, written compact and fed one byte token at a time, ends accepting."""
    values = {"plain": {"city": "Zürich", "unit": "celsius", "days": 14, "tags": ["a", "bc"]},
              "counted": {"s": "é" * 600, "xs": list(range(150)), "note": "ok"}}
    byte_token = {}
    for t, b in enumerate(qwen3_vocab.token_bytes):
        if len(b) == 1 and t not in qwen3_vocab.special_ids:
            byte_token.setdefault(b, t)
    for kind, value in values.items():
        index = TokenIndex(compile_schema(_SCHEMAS[kind], whitespace="compact").dfa, qwen3_vocab)
        cursor = index.start()
        for byte in json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode():
            cursor.advance(byte_token[bytes([byte])])
        assert cursor.is_accepting(), kind


def test_the_counted_walk_in_c_keeps_the_stack_as_walk_counted_does(gemma4_vocab):
    """The extension's counted walk against `automaton.walk_counted` on `test_native`'s cases (texts nested 9 deep,
    a long counted string, a counted array filled to its bound; tokens ahead, a comma, random ones): the same state,
    count, bound, dying byte and stack; an unchanged stack is the same tuple."""
    index = TokenIndex(compile_schema(_STEP_SCHEMA, whitespace="compact").dfa, gemma4_vocab)
    if index._walk_counted is None:
        pytest.skip("the extension is not built here (no compiler or Python.h)")
    seen = {"died": 0, "spilled": 0, "refilled": 0, "ticked": 0, "bounded": 0}
    kept = 0
    for cursor, t, data, want, spilled in counted_walk_cases(index, np.random.default_rng(9), 6):
        got = index._walk_counted(cursor._state, cursor._count, cursor._limit, data, cursor._stack)
        assert got == (*want, tuple(spilled)), (t, data, cursor._state, cursor._stack)
        if got[4] == cursor._stack:
            assert got[4] is cursor._stack
            kept += 1
        tally_walk(seen, cursor, want, spilled)
    assert min(seen.values()) > 20 and kept > 20, (seen, kept)
