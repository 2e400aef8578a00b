"""Token index: a byte DFA × a vocabulary → one packed int32 token mask per DFA state (optionally under a token
budget, from exact per-state minimum token counts); a cursor per sequence."""

from __future__ import annotations

import concurrent.futures
import functools
import os
import struct
import threading
import time
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np

from constrain import native as _native
from constrain import stepping as _stepping
from constrain.automaton import (EFFECT_CLOSE, EFFECT_NONE, EFFECT_OPEN, EFFECT_TICK, MAX_SPILLED, BudgetExceeded,
                                 Deadline, active_deadlines, check_deadlines, contract_counters, counter_tick_bytes,
                                 shortest_distances, walk_counted)
from constrain.errors import InternalError, MaskViolation, UnsupportedSchema
from constrain.trie import _build_trie, _Trie, _trie_for

__all__ = ["NO_COMPLETION", "TokenIndex", "TokenState", "prepare"]

# Walk a trie depth densely once live nodes exceed 1/_DENSE_RATIO of it (bench_index.py: the crossover is ~1/4).
_DENSE_RATIO = 4

# Whole-index builds (the `min_tokens` table, `eager=True`) walk the states whose first byte leaves at most
# _BATCH_MAX_FIRST trie nodes alive (structural states) together, _BATCH_STATES per numpy call, and the others (string
# content: most of the trie alive) one at a time. (required_50, Llama 3: 3584 of 3801 states batched, 238 -> 48 ms.)
_BATCH_MAX_FIRST = 32
_BATCH_STATES = 256

# Without the native walk, a lazy miss also fills the rows of the structural states up to _AHEAD_LEVELS tokens after
# it (breadth-first, at most _AHEAD_STATES, one batched walk per level), so a sequence misses about once every few
# tokens instead of at every state it has not seen (a numpy walk costs ~50 us even for a state with one live token).
# The C walk fills the structural states' rows at construction instead (`_prefill_structural`); a miss there is a
# wider state, walked alone.
_AHEAD_LEVELS = 2
_AHEAD_STATES = 32

# A lazy index over at most _PREFILL_STATES states fills every row at construction with the C walk, for at most
# _PREFILL_S seconds (states in breadth-first order; the rest stay lazy): a small grammar then never waits on a walk
# while decoding (bench_engine.py, Qwen3: hermes_1tool, 146 states, ~1.5 ms; required_10, 573 states, ~3 ms).
_PREFILL_STATES = 1024
_PREFILL_S = 0.005
# Within that time the states the structural fill left are first walked in C, _PREFILL_CHUNK a call, up to
# _PREFILL_BATCH_LIVE live nodes (nested_users: Llama 3 e-mail states up to 1,592 nodes, Gemma 4 hex digits ~600;
# a string's escape states keep 4,600-23,000 live and are given up): 132 of Llama 3's 141 and 122 of Gemma 4's 131
# such states are batched (~1.5-2.3 ms), where the loop alone had filled 30 and 11 in its 5 ms (Gemma 4 cold p99,
# two alternating A/B runs: 31.8-67 -> 6.2-6.8 us).
# Fewer than _PREFILL_BATCH_MIN such states (typically a string's escape states, the 3 left in hermes_1tool and
# required_10, wider than the batch walks: 2,048 nodes each spent for nothing, +0.1-0.5 ms) are left to the loop.
_PREFILL_CHUNK = 64
_PREFILL_BATCH_LIVE = 2048
_PREFILL_BATCH_MIN = 8

# Before that, every lazy index with the C walk fills in one C call the rows of the states that at most
# _BATCH_MAX_FIRST first bytes and at most _PREFILL_LIVE trie nodes keep live (structural states: a decoding step
# through them then never misses; bench_engine.py cold p99, Qwen3: required_20 25.5 -> 3.3 us, parallel_1to5_of_5
# 20.1 -> 3.1 us). A walk given up at _PREFILL_LIVE nodes is wasted; once those reach _PREFILL_WASTE nodes per state,
# the remaining states are walked up to _PREFILL_FLOOR nodes only. Measured cost of that call (median of 5,
# Qwen3 / Llama 3): required_50 3.1 / 2.9 ms, nested_table 2.4 / 2.3 ms, send_email_to_array 9.1 / 3.1 ms (its
# e-mail states: 128-512 nodes each), nested_users 13 / 8.8 ms; with 128 nodes for every state, the states
# required_50 and nested_table missed at 139-484 nodes stayed lazy. Llama 3's number states (its 1,110 number
# tokens kept ~1,100 nodes live) are in since the walk takes a subtree of digits in one step where a number's digits
# loop (`native._digit_runs`: ~10 nodes live; bench_engine.py cold p99, Llama 3: required_20 23 -> 4.4 us,
# parallel_1to5_of_5 24 -> 3.8 us, required_50 31 -> 11.5 us; index and first mask, min of 15, 0.5 / 0.3 / 0.9 ms
# longer on required_20 / parallel_1to5_of_5 / required_50, where the number rows are now made).
_PREFILL_LIVE = 512
_PREFILL_FLOOR = 128
_PREFILL_WASTE = 16

# Of the new rows that fill gives, the first _EAGER_ROWS (the states nearest the start) are made at once in blocks
# with every page mapped (madvise MADV_POPULATE_READ), the others on first read: a fresh row's first read otherwise
# faults in its pages (~5 us for Qwen3's 4,740 words), and making them costs: index + first mask of required_50
# (Qwen3, 883 rows, median of 7) 2.7 ms with none made at once, 5.3 ms with all (`_make_rows` of 512: 1.8 ms).
# Blocks stay under 4 MiB, above which numpy asks for huge pages (one 16 MiB table: 0.4 ms without, 1-45 ms with:
# the kernel zeroes or compacts 2 MiB at a time). A row made on first read instead costs its step 10-27 us (a cold
# replay of required_50 on Gemma 4: 282 rows waiting, ~10 of them read in 233 steps, the slowest steps after the
# first visit of a wide string state), so 1,024, not 512: required_50's 798-899 rows are all made at once, for
# +0.9 / +1.0 / +2.0 ms of index + first mask on Llama 3 / Qwen3 / Gemma 4 (medians of 14, interleaved) and a cold
# p99 of 1.55-2.08x xgrammar's -> 2.01-4.63x (bench_engine.py, two alternating runs each; measured with a bound of
# 2,048, which makes the same rows there). An index of more rows (tens of thousands of states) still keeps the rest
# waiting: at 32 KiB a row (Gemma 4), 1,024 rows are 32 MiB.
_EAGER_ROWS = 1024
# `TokenIndex(background=True)` (what the compile functions and the index cache build): the start state's row is made
# at construction and the fill above runs on one worker thread (the C walk releases the GIL), which in a DFA over
# _PREFILL_STATES then also walks the states still without a row, breadth-first, for _PREFILL_S (`_prefill_alone`:
# strings' content states, whose first visits are a decoding step's slowest, 100-260 us). Any other row waits until
# that is done (`_settle`). bench_engine.py, constrain and xgrammar, 7 cold compiles a cell, session 38: time to first
# mask met on 24 of 24 cells (1.14-11.7x xgrammar's; with the fill at construction 20 of 24 in two runs:
# parallel_1to5_of_5 0.71-0.98x, nested_table / Llama 3 0.86-0.89x); cold p99 on 18 of 24 (19 and 18): the replay's
# second step waits for the fill (1.7-22 ms), which moves its slow steps one rank into the p99, as when session 34
# tried the worker without the wide walk (nested_table / Qwen3 203 us), but the wide walk leaves fewer such steps
# (nested_table 7.5-10.8 us against 14.5-37.5). One core: the fill runs at construction.
_PREFILL_POOL: list = []  # [(pid, executor)]: `native.one_worker`'s


def _prefill_pool() -> concurrent.futures.ThreadPoolExecutor | None:
    """The worker thread background prefills run on, or None where this process may use one core only."""
    return _native.one_worker(_PREFILL_POOL, "constrain-prefill")


# Where the extension module (`stepping`) is not built, a cursor walks a token of at least this many bytes through
# ctypes (`native.Stepper`). Warm, a call costs ~0.6 us (counted:
# ~1.8 us) against ~0.1 us a byte in Python (counted: 0.5 us + 0.16 us a byte); the first call after a compile
# costs ~6 us more (its caches evicted), so shorter tokens, the common ones, stay in Python. A 40-byte token of a
# counted string took 17 us in Python (Gemma 4, nested_table's longest steps).
_C_STEP_BYTES = 16

# `min_tokens` of a state from which no sequence of this vocabulary's tokens reaches acceptance (possible only when
# some byte is not a token), and `token_min_budget` of a token that no budget allows.
NO_COMPLETION = 2**31 - 1

# Whether a lazy index with the C walk answers budgets by searching each distance asked from the state asked
# (`TokenIndex._at_most`) instead of building its whole `min_tokens` table (one trie walk per state) the first time a
# budget can bind. The table stalled that step: 4.6-877 ms on the engine benchmark's workloads (bench_budget.py),
# 0.7-8.4 s on JSONSchemaBench automata of 10,003-34,469 states (Llama 3), most of a minute past 100k. Searched, a
# budgeted walk from 3 tokens past the bound's free_from to acceptance took 1.4-28x less in all and its slowest step
# 1.2-198x less on 13 of the 16 workload and vocabulary cells (Llama 3, Gemma 4), 1.3x more on the smallest
# (hermes_1tool, Llama 3: 146 states, a 4.6 ms table). False: the table (what an eager index builds, and the numpy
# walks use).
SEARCHED_DISTANCES = True


# --------------------------------------------------------------------------------------------------------------------
# Reference masks: once per vocabulary, the wide states every JSON string has

_REFERENCES: "weakref.WeakKeyDictionary[_Trie, dict[int, tuple]]" = weakref.WeakKeyDictionary()
_REFERENCES_LOCK = threading.Lock()


def _references(vocab: Any, trie: _Trie, n_words: int) -> tuple:
    """The content state and the escape state of a JSON string (`{"type": "string"}`), with their masks over `trie`:
    a wide state of any DFA on this vocabulary may derive its mask from one of them instead of walking most of the
    trie (see `native.TrieWalker`). Built once per (trie, mask width): one compile and the walks of its 16 states."""
    with _REFERENCES_LOCK:
        hit = _REFERENCES.get(trie, {}).get(n_words)
    if hit is not None:
        return hit
    from constrain import automaton as fa
    from constrain.syntax import ANY_TEXT, JsonSyntax  # (the syntax builds on the automaton module, not on this one)

    try:
        dfa = fa.compile(JsonSyntax("compact").string(ANY_TEXT))  # what `{"type": "string"}` compiles to
    except BudgetExceeded:  # a request's deadline ran out around it: no references this time (the index is exact)
        return ()
    index = TokenIndex(dfa, vocab, references=False)  # (these are being built)
    refs: tuple = ()
    if index._walker is not None:
        states = [dfa.step(dfa.start, b'"'), dfa.step(dfa.start, b'"\\')]
        masks = [(s, index.mask_for_state(s).view(np.uint32).copy()) for s in states]
        refs = (_native.Reference(index._tflat, index._n_classes, np.asarray(dfa.class_of)[:256], masks),)
    with _REFERENCES_LOCK:
        _REFERENCES.setdefault(trie, {})[n_words] = refs
    return refs


# A counter that ticks on at most this many byte values (an array's comma) has the tokens that hold them listed
# (`_TickTokens`); one that ticks on more (a string's characters) is bounded by the longest token.
_FEW_TICK_BYTES = 16
_TICKS: "weakref.WeakKeyDictionary[_Trie, dict[bytes, _TickTokens]]" = weakref.WeakKeyDictionary()


def _bytes_on_path(trie: _Trie, hit: np.ndarray) -> np.ndarray:
    """Per trie node, how many nodes on its path from the root (itself included) `hit` marks (bool [n_nodes])."""
    ds = trie.depth_start
    hit = hit.astype(np.int64)
    count = np.zeros(trie.n_nodes, np.int64)
    for d in range(trie.max_depth):  # nodes by depth: a node's count is its parent's plus its own byte
        lo, hi = ds[d], ds[d + 1]
        count[lo:hi] = hit[lo:hi] + (count[ds[d - 1] + trie.parent_local[lo:hi]] if d else 0)
    return count


class _TickTokens:
    """The tokens of a vocabulary that hold a byte of a small set (an array's comma), made once per (trie, set):
    on Llama 3 861 tokens of 12 bytes at most, those with two commas or more 8 bytes at most."""

    def __init__(self, trie: _Trie, byte_set: np.ndarray):
        ds = trie.depth_start
        per_token = _bytes_on_path(trie, byte_set[trie.node_byte])[trie.term_node]
        held = per_token > 0
        self.ids = trie.term_tokens[held].astype(np.int64)  # the tokens that hold one or more
        self.most = int(per_token.max()) if per_token.size else 0  # the most one token holds
        length = np.searchsorted(np.asarray(ds), trie.term_node, side="right")[held]
        self.longest = int(length.max()) if length.size else 0  # the bytes of the longest of them
        several = per_token[held] > 1
        # (count, length) of the tokens with two or more, the longest per count
        pairs = {}
        for c, n in zip(per_token[held][several].tolist(), length[several].tolist()):
            pairs[c] = max(pairs.get(c, 0), n)
        self.several = sorted(pairs.items())
        self._sub: _Trie | None = None
        self._outside: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    def most_apart(self, gap: int) -> int:
        """The most ticks one token makes when two ticks lie at least `gap` bytes apart (the second's byte included):
        a token with k ticks spells at least 1 + (k - 1) * gap bytes, and holds at least k of the bytes."""
        if self.most <= 1:
            return self.most
        return max([1] + [min(c, 1 + (n - 1) // max(gap, 1)) for c, n in self.several])

    def outside_words(self, n_words: int) -> np.ndarray:
        """int32 [n_words]: the bits of every token but these (cached per width)."""
        with self._lock:
            words = self._outside.get(n_words)
            if words is None:
                outside = np.ones(n_words * 32, bool)
                outside[self.ids] = False
                words = self._outside[n_words] = np.packbits(outside, bitorder="little").view(np.int32)
            return words

    def sub_trie(self, vocab: Any) -> _Trie:
        """The trie of these tokens alone (about 1,700 nodes on Llama 3), built on first use."""
        with self._lock:
            if self._sub is None:
                token_bytes = [b""] * int(vocab.n_tokens)  # (empty: left out of the trie)
                spelled = vocab.token_bytes
                for t in self.ids.tolist():
                    token_bytes[t] = spelled[t]
                self._sub = _build_trie(SimpleNamespace(token_bytes=tuple(token_bytes), special_ids=(), eos_ids=()))
            return self._sub


def _tick_tokens(trie: _Trie, byte_set: np.ndarray) -> _TickTokens:
    """`_TickTokens` of `byte_set` (bool [256]) over `trie`, cached per trie."""
    key = np.packbits(byte_set).tobytes()
    with _REFERENCES_LOCK:
        hit = _TICKS.setdefault(trie, {}).get(key)
    if hit is None:
        hit = _TickTokens(trie, byte_set)
        with _REFERENCES_LOCK:
            hit = _TICKS[trie].setdefault(key, hit)
    return hit


def _edges(trans: np.ndarray, keep: np.ndarray, backward: bool) -> tuple[list[int], list[int]]:
    """The distinct edges of the table `trans` (int [n, k]) at the cells where `keep`, grouped by source (or, with
    `backward`, by target): the other ends as one flat list, and where each state's run starts in it (n + 1)."""
    n = trans.shape[0]
    src, cls = np.nonzero(keep)
    dst = trans[src, cls].astype(np.int64)
    src = src.astype(np.int64)
    head, tail = np.divmod(np.unique(dst * n + src if backward else src * n + dst), n)
    return tail.tolist(), np.searchsorted(head, np.arange(n + 1)).tolist()


def _reached(seeds: np.ndarray, ends: list[int], starts: list[int]) -> np.ndarray:
    """bool [n]: the states reached from `seeds` along the edges `_edges` gave (`ends`, `starts`), seeds included."""
    seen = [False] * (len(starts) - 1)
    todo = seeds.tolist()
    for s in todo:
        seen[s] = True
    while todo:
        s = todo.pop()
        for d in ends[starts[s]:starts[s + 1]]:
            if not seen[d]:
                seen[d] = True
                todo.append(d)
    return np.array(seen, dtype=bool)


def _tick_gap(transitions: np.ndarray, effect: np.ndarray, cap: int) -> int:
    """The fewest bytes from a state right after a tick to the next tick inside the same counter (that tick's byte
    included), or `cap` when it is `cap` or more: breadth first from the states after a tick, at most `cap` levels of
    a few states each, reading only those states' rows (on the 404 states of an array of tool calls: a relaxation
    over the whole table took 0.46 ms, levels of whole-table masks and sorts 0.12 ms, this walk in numpy ~11 us a
    level, in C (`NativeAutomata.tick_gap`) 16 levels ~10 us in all)."""
    lib = _native.automata()
    if lib is not None:
        return lib.tick_gap(transitions, effect, cap, EFFECT_TICK, EFFECT_NONE)
    return _tick_gap_numpy(transitions, effect, cap)


def _tick_gap_numpy(transitions: np.ndarray, effect: np.ndarray, cap: int) -> int:
    """`_tick_gap` without the C library."""
    at = np.flatnonzero(effect.ravel() == EFFECT_TICK)
    after = transitions.ravel()[at]
    frontier = set(after[after >= 0].tolist())
    seen = set(frontier)
    for d in range(1, cap):
        if not frontier:
            return cap
        rows = np.fromiter(frontier, np.intp, len(frontier))
        step, done = transitions[rows], effect[rows]
        live = step >= 0
        if (live & (done == EFFECT_TICK)).any():
            return d
        frontier = set(step[live & (done == EFFECT_NONE)].tolist()) - seen  # (closing or opening leaves the counter)
        seen |= frontier
    return cap


_BRACKETS: "weakref.WeakKeyDictionary[_Trie, tuple[np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def _brackets(vocab: Any, trie: _Trie) -> tuple[np.ndarray, np.ndarray]:
    """Per token id, how many closing (`]`, `}`) and opening (`[`, `{`) bracket bytes it spells (int64 [n_tokens];
    0 for special, EOS and empty tokens), counted once per vocabulary."""
    with _REFERENCES_LOCK:
        hit = _BRACKETS.get(trie)
    if hit is not None:
        return hit
    out = []
    for byte_set in (b"]}", b"[{"):
        count = _bytes_on_path(trie, np.isin(trie.node_byte, np.frombuffer(byte_set, np.uint8)))
        per_token = np.zeros(int(vocab.n_tokens), np.int64)  # (the trie holds byte tokens only)
        per_token[trie.term_tokens] = count[trie.term_node]
        out.append(per_token)
    closers, openers = out
    with _REFERENCES_LOCK:
        _BRACKETS[trie] = (closers, openers)
    return closers, openers


_BRACKET_TOKENS: "weakref.WeakKeyDictionary[_Trie, dict[int, tuple]]" = weakref.WeakKeyDictionary()


def _bracket_tokens(vocab: Any, trie: _Trie, window: int) -> tuple[list, int, list, int, int]:
    """What a stacked index (`fa.nested_values` with this `window`) reads of the vocabulary's brackets, once per
    (vocabulary, window): the deep tokens (at least `window` closing brackets) and every token with a bracket, as
    (id, bytes) lists, the most closing brackets of a deep token, the most opening brackets of any token and the
    longest bracketed token."""
    with _REFERENCES_LOCK:
        hit = _BRACKET_TOKENS.get(trie, {}).get(window)
    if hit is not None:
        return hit
    closers, openers = _brackets(vocab, trie)
    deep = np.flatnonzero(closers >= window).tolist()
    bracketed = [(t, vocab.token_bytes[t]) for t in np.flatnonzero(closers + openers).tolist()]
    hit = ([(t, vocab.token_bytes[t]) for t in deep],
           # a token takes at most one kind off the stack per closing bracket: the mask depends on that many
           int(closers[deep].max()) if deep else 0,
           # near the end of a token budget, every token with a bracket is walked with the stack (spills and
           # refills change how many containers are left to close)
           bracketed,
           int(openers.max(initial=0)),
           max((len(data) for _, data in bracketed), default=0))
    with _REFERENCES_LOCK:
        _BRACKET_TOKENS.setdefault(trie, {})[window] = hit
    return hit


def _calm_states(tflat: np.ndarray, n_classes: int, byte_class: np.ndarray, spill: np.ndarray,
                 deep: list[tuple[int, bytes]]) -> list[bool]:
    """Per state of a stacked index (`tflat`: its flat table with a dead row last; `spill`: its SPILL effects, the
    same shape): whether no deep token spills a container kind on its way from the state. With nothing spilled
    before, such a state's deep tokens keep the stack empty, so no REFILL is ever taken and the exact walk is the
    automaton's: their bits are the row's (`_stack_row` would find the same, one token walk at a time). A deep token
    without an opening bracket never spills; the others are stepped from every state at once."""
    n_states = tflat.shape[0] // n_classes - 1
    calm = np.ones(n_states, bool)
    every = np.arange(n_states, dtype=np.int64)
    for _, data in deep:
        if b"[" not in data and b"{" not in data:
            continue
        at = every
        for byte in data:
            at_cls = at * n_classes + int(byte_class[byte])
            calm[every[spill[at_cls] > 0]] = False
            at = tflat[at_cls].astype(np.int64)
            at[at < 0] = n_states  # dead: the dead row stays dead and spills nothing
    return calm.tolist()


def prepare(vocab: Any) -> None:
    """The per-vocabulary preprocessing the first index on `vocab` would otherwise do: the token trie and the
    reference masks."""
    trie = _trie_for(vocab)
    _references(vocab, trie, (int(vocab.vocab_size) + 31) // 32)


# --------------------------------------------------------------------------------------------------------------------
# The index

# One state's trie walk: (dense `(depth, states, ok)` per densely walked depth, sparse `(nodes, states)`, n_alive).
_Walk = tuple[list[tuple[int, np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]], int]


_TERM_LOCAL: "weakref.WeakKeyDictionary[_Trie, list[np.ndarray]]" = weakref.WeakKeyDictionary()
_TERM_LOCAL_LOCK = threading.Lock()


_FINISHED: "weakref.WeakKeyDictionary[_Trie, dict[tuple, tuple[np.ndarray, bytes]]]" = weakref.WeakKeyDictionary()
_FINISHED_LOCK = threading.Lock()


def _term_local_by_depth(trie: _Trie) -> list[np.ndarray]:
    """Per depth of `trie`, the offsets (within the depth) of nodes that end a token; one list per trie, shared by
    every index over its vocabulary (a pass over the whole trie that no DFA changes)."""
    with _TERM_LOCAL_LOCK:
        hit = _TERM_LOCAL.get(trie)
    if hit is None:
        ds = trie.depth_start
        hit = [np.flatnonzero(trie.term_count[ds[d] : ds[d + 1]]) for d in range(trie.max_depth)]
        with _TERM_LOCAL_LOCK:
            _TERM_LOCAL[trie] = hit
    return hit


class TokenIndex:
    """Packed token masks of one DFA over one vocabulary, one row per DFA state, computed lazily or eagerly.

    Guarantee, for DFA state `s` and token id `t`:
      * `t >= vocab.n_tokens` (padding up to `vocab_size`) is never allowed;
      * an EOS id is allowed iff `s` is accepting;
      * an id named in `dfa.specials` (symbol `256 + i` is token `dfa.specials[i]`) is allowed iff the transition on
        its symbol is live;
      * any other id that is neither special nor EOS is allowed iff its bytes are non-empty and walking them from
        `s` never reaches the dead state (-1). Special and EOS ids are never walked as bytes.
    Bit `t % 32` of int32 word `t // 32` is set iff `t` is allowed; `n_words = ceil(vocab_size / 32)`.

    After EOS the sequence is finished: the mask then allows exactly the EOS ids (so a batch can keep padding a
    finished row with EOS) and `TokenState.advance` accepts only EOS ids.

    Token budgets. `min_tokens(s)` is the exact fewest tokens of this vocabulary (a multi-byte token counts 1, a
    grammar-named special token counts 1) that take state `s` to an accepting state; 0 if `s` accepts. A budget `B`
    is the number of tokens still allowed including the next one; with it, a non-EOS token `t` is allowed iff it is
    allowed without a budget and `min_tokens(state after t) <= B - 1`. **EOS is free**: it is not counted, and it is
    allowed iff the state accepts, whatever the budget — generation cut at `max_tokens` in an accepting state is a
    complete output. A server that wants the EOS itself inside `max_tokens` passes `B = max_tokens - generated - 1`
    (and requires `max_tokens >= min_tokens_from_start() + 1`). Guarantee: from any state `s` and budget
    `B >= min_tokens(s)`, every token sequence drawn from the budgeted masks (the budget falling by one per token)
    reaches an accepting state within `B` tokens, and the budgeted mask is never empty before it does. The table of
    `min_tokens` costs one trie walk per state (what `eager=True` does anyway, and then it is built at construction);
    a lazy index builds it on the first `min_tokens` call or the first budget below a bound read off the automaton
    without a trie walk (`completes_within`: from that bound on no budget binds); with the C walk a lazy index never
    builds it and searches each distance a budget asks from the state asked instead (`_at_most`: exact, the same
    masks). A budgeted mask equals the
    unbudgeted one, and is the same cached row, once `B >= budget_horizon(s)`; below that it is one extra trie walk,
    cached per (state, level).

    Deep values (`fa.nested_values`): a cursor keeps the container kinds spilled past the automaton's window. Its
    mask is its state's row except for the tokens with at least `window` closing brackets, walked with the stack
    (exact). Under a budget it counts one more token per spilled kind on top of `min_tokens`: an estimate there, not
    the guarantee above, and a budgeted mask that would be empty before acceptance takes the least larger budget that
    leaves a token (docs/guarantees.md).

    The index is immutable from the outside and safe to share across threads and requests; rows are filled on first
    use (idempotently; with the numpy walks a state's first use also fills up to 32 states two tokens ahead) and
    deduplicated, so equal masks share one row of `mask_table()`. With the C walk, every structural state's row is
    filled at construction in one call (`_prefill_structural`), and a DFA of at most 1,024 states has its other rows
    filled there too (within 5 ms).
    With the C walk, a wide state (string content: most of the trie live, a 0.3-1 ms walk) takes its mask from an
    earlier wide state of the same index, or from the vocabulary's reference masks (`references`), when the two keep
    the same byte strings live up to the longest token, but for strings through a few bytes (the closing quote,
    typically), or up to some depth (a string's content near its maxLength): those tokens alone are walked (see
    `native.TrieWalker`; exact, checked against the full walk in tests/test_native.py).

    Args:
        dfa: a trimmed `constrain.automaton.Dfa` (every state reachable and co-reachable).
        vocab: a `constrain.vocabulary.Vocabulary`.
        eager: compute every state's row and the `min_tokens` table now (structural states walked in batches, the
            others one at a time) instead of on first use.
        references: with the C walk, let wide states derive their masks from the vocabulary's reference masks (a
            JSON string's content and escape states, built once per vocabulary: `prepare`).
        background: with the C walk and two or more cores, make the start state's row now and run the prefill on a
            worker thread (`_PREFILL_POOL`); a row asked for meanwhile waits for it. The masks are the same either way.

    Raises:
        InternalError: the DFA's shape is inconsistent, or `dfa.specials` names an id that is not a special token of
            `vocab` (special tokens can only be produced through their symbol, never through bytes).
    """

    def __init__(self, dfa: Any, vocab: Any, *, eager: bool = False, references: bool = True,
                 background: bool = False):
        self._dfa = dfa
        self._vocab = vocab
        self._eager = bool(eager)
        self._use_references = bool(references)
        # set once by whoever compiled the DFA (e.g. `compile_index`: policy, tool format), before sharing
        self.meta: dict[str, Any] | None = None
        self._setup(_trie_for(vocab))
        self._lock = threading.Lock()
        self._rows: list[np.ndarray | None] = []  # None: not read yet, its nonzero words in `_pending`
        self._patches: list[bytes | None] = []  # per row, `stepping.patch_of` (what `TokenState.fill_mask` writes)
        # row -> the span of `_pending_pairs` (word index, value) holding its nonzero words
        self._pending: dict[int, tuple[int, int]] = {}
        self._pending_pairs = np.zeros((0, 2), np.int32)
        self._row_key: dict[bytes | int, int] = {}  # a row's `native.sparse_key`, or its hash (`_row_slot`) -> row
        self._key_bytes = self._patch_bytes = 0  # held by `_row_key`'s keys and by `_patches` (`nbytes`)
        self._row_of: list[int] = [-1] * (self._n_states + 1)  # last entry: the finished pseudo-state
        self._table_cache: np.ndarray | None = None
        self._row_of[self._n_states] = self._insert_row(*self._finished_mask())
        self._budget_init(None)
        self._background: concurrent.futures.Future | None = None  # the prefill on `_PREFILL_POOL`, until settled
        self._background_pid = 0  # the process that started it (a forked child's copy never finishes)
        self._worker = -1  # the thread ident running that prefill
        if self._eager:
            self._fill_all()
        elif self._walker is not None:
            pool = _prefill_pool() if background else None
            if pool is None:
                self._prefill_index()
            else:
                self.row_for_state(self._start_state)
                self._background_pid = os.getpid()
                self._background = pool.submit(self._prefill_index, True)

    def _prefill_index(self, on_worker: bool = False) -> None:
        """The construction's prefill: structural states, then, in a small automaton, the others within
        `_PREFILL_S`; on the worker, in a large one too the wide states (strings' content) in breadth-first order
        within `_PREFILL_S`, whose first visits are otherwise the slowest decoding steps (see `_PREFILL_POOL`)."""
        if on_worker:
            self._worker = threading.get_ident()
        self._prefill_structural()
        if self._n_states <= _PREFILL_STATES:
            self._prefill()
        elif on_worker:
            self._prefill_alone(time.perf_counter() + _PREFILL_S)

    def _settle(self) -> None:
        """Wait for the background prefill, if one is running (not on its own thread); its error, if any, is raised
        here, at every call. Every row but the start state's waits for it, made or not: a cursor that kept stepping
        beside the worker would take the GIL from it in 5 ms slices (`sys.getswitchinterval`: cold per-token p99 of
        100-140 us on nested_table / Qwen3 and Gemma 4 in bench_engine.py)."""
        job = self._background
        if job is None or threading.get_ident() == self._worker:
            return
        if os.getpid() != self._background_pid:  # a forked copy: the worker is not in this process
            self._background = None
            return
        job.result()
        self._background = None

    # ---- construction helpers

    def _setup(self, trie: _Trie) -> None:
        # Counted strings (`fa.counted_chars`): the cursor walks the automaton without their markers and keeps their
        # counts itself; masks are the plain automaton's except within a token's length of a bound (`_counted_row`).
        dfa, counters = contract_counters(self._dfa)
        vocab = self._vocab
        self._plain = dfa
        self._start_state = int(dfa.start)
        self._counters = counters
        transitions = np.asarray(dfa.transitions)
        class_of = np.asarray(dfa.class_of)
        n_states, n_classes = int(dfa.n_states), int(dfa.n_classes)
        specials = tuple(int(t) for t in dfa.specials)
        if transitions.shape != (n_states, n_classes):
            raise InternalError(
                f"dfa.transitions has shape {transitions.shape}, expected (n_states, n_classes) = "
                f"{(n_states, n_classes)}"
            )
        if class_of.shape[0] < 256 + len(specials):
            raise InternalError(
                f"dfa.class_of has {class_of.shape[0]} symbols, expected at least 256 + {len(specials)} specials"
            )
        not_special = [t for t in specials if t not in vocab.special_ids or not 0 <= t < vocab.n_tokens]
        if not_special:
            raise InternalError(
                f"dfa.specials names token ids {not_special} that are not special tokens of this vocabulary "
                f"(n_tokens={vocab.n_tokens}); a grammar may only name special tokens by id"
            )
        if n_states == 0:
            raise InternalError("the DFA's language is empty: no token sequence can satisfy it")
        self._trie = trie
        self._n_states = n_states
        self._n_classes = n_classes
        self._vocab_size = int(vocab.vocab_size)
        self._n_tokens = int(vocab.n_tokens)
        self._n_words = (self._vocab_size + 31) // 32
        # int32 halves the memory traffic of the walk's gathers; `state * n_classes + class` must not overflow.
        dtype = np.int32 if (n_states + 1) * n_classes < 2**31 else np.int64
        # A dead row appended last: a dead state (-1) indexes `-n_classes + class`, which lands in it and stays dead.
        dead = np.full((1, n_classes), -1, dtype=dtype)
        self._tflat = np.concatenate([transitions.astype(dtype), dead]).ravel()
        self._dtype = dtype
        self._accepting = np.asarray(dfa.accepting, dtype=bool)
        self._byte_class = class_of[:256]
        # Per depth, the local offsets of nodes that end some token: where a walk's destination states are read.
        self._term_local_by_depth = _term_local_by_depth(trie)
        self._eos = tuple(sorted({int(t) for t in vocab.eos_ids if 0 <= t < self._n_tokens}))
        self._eos_arr = np.asarray(self._eos, dtype=np.intp)
        self._special_cls = {t: int(class_of[256 + i]) for i, t in enumerate(specials)}
        self._special_ids_arr = np.asarray(list(self._special_cls), dtype=np.intp)
        self._special_cls_arr = np.asarray(list(self._special_cls.values()), dtype=np.intp)
        # The flat table as a memoryview for the cursor: indexing it at `state * n_classes + class` gives a Python
        # int ~10x faster than numpy scalar access, as fast as nested lists, and allocates nothing per state (one
        # view per row cost 2 ms and 14k tracked objects on a 14k-state DFA).
        self._tr_view = memoryview(self._tflat)
        self._cls_list: list[int] = class_of[:256].tolist()
        self._acc_list: list[bool] = self._accepting.tolist()
        self._eos_set = frozenset(self._eos)
        self._non_byte = frozenset(vocab.special_ids) | frozenset(vocab.eos_ids)
        # The trie walk in C where it is built (int32 tables only); else the numpy walks below.
        lib = _native.automata() if dtype is np.int32 else None
        self._walker = None if lib is None else lib.walker(
            self._tflat, n_classes, class_of[:256], trie, self._n_words, self._accepting, self._eos,
            self._special_ids_arr.tolist(), self._special_cls_arr.tolist())
        if self._walker is not None and self._use_references:
            self._walker.use_references(_references(vocab, trie, self._n_words))
        self._counted_rows: dict[tuple[int, int, int | None], int] = {}
        self._trimmed_rows: dict[tuple[int, bytes, bytes], int] = {}  # (plain row, words that lost bits, their values)
        self._far: dict[int, bool] = {}  # `_far_from_ticks`, per state asked
        self._counted_args: tuple[np.ndarray, np.ndarray] | None = None  # `_counted_inputs`
        self._outside_words: np.ndarray | None = None  # the tokens outside the trie, on the C counted walk's first use
        self._tick_walker = None  # the C walk of `_ticking`'s tokens, on first use
        self._need: np.ndarray | None = None  # `_need_ticks`, on first use
        self._needy: bool | None = None  # `_need_inside`, on first use
        self._ticking: _TickTokens | None = None
        if counters is not None:
            # A cursor with `room` counts left takes the plain row unless a token could tick `room` times (end at
            # the bound, maybe inside a character that needs room) or more: counted rows from room <= the most
            # ticks one token makes (`_near`), and a fresh bound (opened inside a token) must lie beyond. An array
            # ticks on its commas only: at most as many as one token holds (8 on Llama 3), and no more than fit in its
            # bytes when two ticks lie `_tick_gap` bytes apart (items of 5 tool calls: 1 tick); a string ticks on
            # most bytes: its longest token bounds it.
            self._near = {}
            per_limit = counter_tick_bytes(dfa, counters)
            gap = None  # `_tick_gap`, when first needed
            for limit, tick_bytes in zip(counters.limits, per_limit):
                if tick_bytes.sum() <= _FEW_TICK_BYTES:
                    ticking = _tick_tokens(trie, tick_bytes)
                    if gap is None and ticking.most > 1:
                        gap = _tick_gap(transitions, counters.effect, max(n for _, n in ticking.several))
                    near = ticking.most_apart(gap or 1)
                else:
                    near = trie.max_depth
                self._near[limit] = max(self._near.get(limit, 0), near)
                if limit <= near:
                    raise UnsupportedSchema(
                        f"a long maxLength or maxItems is counted beside the automaton (bound {limit}), and one token "
                        f"of this vocabulary can count {near} times: it could pass such a bound at once")
            effect = np.concatenate([counters.effect, np.zeros((1, n_classes), np.int8)]).ravel()
            self._eff_flat = effect
            self._eff_view = memoryview(effect)
            self._limits = counters.limits
            self._most_ticks = max(self._near.values(), default=0)
            # every counter ticks on a few bytes (arrays): a counted row walks only the tokens that hold one
            union = np.logical_or.reduce(per_limit) if per_limit else None
            self._ticking = _tick_tokens(trie, union) if union is not None and union.sum() <= _FEW_TICK_BYTES else None
        # The cursor walks a token without counting when none of its bytes has an effect anywhere (an array of tool
        # calls: all but the tokens holding ',', '[' or ']'): the plain walk, as without counters. Per token, on first
        # sight: 0 unknown, 1 quiet, 2 counts. Counted strings (most bytes count) and deep values always count.
        self._quiet_bytes: bytes | None = None
        if counters is not None and counters.refill is None:
            loud = (counters.effect != EFFECT_NONE).any(axis=0)[class_of[:256]]
            if loud.sum() <= _FEW_TICK_BYTES:
                self._quiet_bytes = bytes(np.flatnonzero(~loud).tolist())
                self._loud = bytearray(int(vocab.n_tokens))
        # Deep values (`fa.nested_values`): the cursor keeps the container kinds spilled past the automaton's window;
        # a mask is its state's row but for the tokens with at least `window` closing brackets, walked with the stack
        # (`_stack_row`).
        self._stacked = counters is not None and counters.refill is not None
        if self._stacked:
            spill = np.concatenate([counters.spill, np.zeros((1, n_classes), np.int8)]).ravel()
            self._spill_view = memoryview(spill)
            self._refill_view = memoryview(np.ascontiguousarray(counters.refill.ravel()))
            (self._deep, self._deep_reach, self._bracketed, self._most_opened,
             self._deep_longest) = _bracket_tokens(vocab, trie, counters.window)
            self._stack_rows: dict[tuple, int] = {}
            # per state: with nothing spilled, no counter and no budget, every deep token's bit is the row's (the
            # cursor then takes the plain row without building a key)
            self._calm: list[bool] = _calm_states(self._tflat, n_classes, self._byte_class, spill, self._deep)
        # The cursor's walk of long tokens (`_C_STEP_BYTES`), counted or not, in C where it is built.
        self._stepper = None if lib is None else lib.stepper(
            self._tflat, n_classes, class_of[:256], None if counters is None else self._eff_flat,
            None if counters is None else self._limits, spill if self._stacked else None,
            counters.refill if self._stacked else None, MAX_SPILLED)
        # A cursor's walk and mask fill in the extension module where it is built: a step of ~0.3 us against ~1 in
        # Python (a 2-3 byte token), ~2 through ctypes; a fill of ~0.5 us against ~0.9 (np.copyto from a row in cache)
        # and ~2 from a row not read yet (the first read of each row: a third of a replay's steps on required_10).
        ext = _stepping.module()
        self._token_bytes = vocab.token_bytes
        self._fill_words = None if ext is None else ext.fill
        self._walk_step = self._walk_counted = None
        if ext is not None and self._stepper is not None:
            walker = ext.walker(*self._stepper.addresses(), n_states)
            self._walk_step = functools.partial(ext.walk, walker)
            if counters is not None:
                self._walk_counted = functools.partial(ext.walk_counted, walker)
        self._plain_steps = self._walk_step is not None and counters is None  # (every byte token: `advance`'s top)
        self._quick_steps = self._plain_steps or (self._walk_counted is not None and not self._stacked)

    @functools.cached_property
    def _node_cls(self) -> np.ndarray:
        """Class id of every trie node for this DFA (the numpy walks' one gather per (vocab, dfa) instead of one per
        state; the C walk reads each node's byte instead: 0.35 ms saved per index on Qwen3's 333k nodes)."""
        return self._byte_class.astype(self._dtype)[self._trie.node_byte]

    @functools.cached_property
    def _parent_by_depth(self) -> list[np.ndarray]:
        """Per depth of the trie, each node's parent's offset within the depth above (views; the numpy walks only)."""
        ds = self._trie.depth_start
        return [self._trie.parent_local[ds[d] : ds[d + 1]] for d in range(self._trie.max_depth)]

    @functools.cached_property
    def _cls_by_depth(self) -> list[np.ndarray]:
        """`_node_cls` depth by depth (views)."""
        ds = self._trie.depth_start
        return [self._node_cls[ds[d] : ds[d + 1]] for d in range(self._trie.max_depth)]

    def __getstate__(self) -> dict[str, Any]:
        self._settle()
        with self._lock:
            for row in list(self._pending):
                self._materialise(row)
            return {
                "dfa": self._dfa,
                "vocab": self._vocab,
                "eager": self._eager,
                "meta": self.meta,
                "rows": list(self._rows),
                "row_of": list(self._row_of),
                "budget": None
                if self._min_tokens is None
                else (self._min_tokens, self._horizon, dict(self._budget_rows)),
            }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._dfa = state["dfa"]
        self._vocab = state["vocab"]
        self._eager = state["eager"]
        self._use_references = True
        self.meta = state.get("meta")
        self._setup(_trie_for(self._vocab))
        self._background, self._background_pid, self._worker = None, 0, -1
        self._lock = threading.Lock()
        self._rows = []
        self._patches = []
        self._pending = {}
        self._pending_pairs = np.zeros((0, 2), np.int32)
        self._row_key = {}
        self._key_bytes = self._patch_bytes = 0
        for row in state["rows"]:
            self._insert_row(np.array(row, dtype=np.int32))
        self._row_of = list(state["row_of"])
        self._table_cache = None
        self._budget_init(state.get("budget"))

    # ---- public surface

    @property
    def dfa(self) -> Any:
        """The DFA whose states the cursors walk: the one this index was built from, unless that has counted strings
        (`fa.counted_chars`), whose markers are folded away here (their bounds are kept by the cursors)."""
        return self._plain

    @property
    def vocab(self) -> Any:
        """The vocabulary this index was built for."""
        return self._vocab

    @property
    def n_words(self) -> int:
        """Width of one packed mask in int32 words: `ceil(vocab.vocab_size / 32)`."""
        return self._n_words

    @property
    def is_eager(self) -> bool:
        """Whether every state's row was computed at construction."""
        return self._eager

    def start(self) -> TokenState:
        """A fresh cursor at the DFA's start state (nothing generated yet)."""
        return TokenState(self, int(self._plain.start))

    def mask_for_state(self, state: int, budget: int | None = None) -> np.ndarray:
        """The packed mask of DFA state `state` (read-only int32 [n_words]); computes and caches it on first use.

        `state == dfa.n_states` gives the finished pseudo-state's mask (EOS ids only). With `budget` (tokens still
        allowed, including this one), tokens after which no completion fits in `budget - 1` more are cleared (see
        the class docstring).

        Raises:
            InternalError: `state` is outside `0 ..= dfa.n_states`, or `budget` is negative.
        """
        return self._row_words(self.row_for_state(state, budget))

    def row_for_state(self, state: int, budget: int | None = None) -> int:
        """The row of `mask_table()` holding `state`'s mask (under `budget`, if given); `dfa.n_states` stands for the
        finished pseudo-state.

        Raises:
            InternalError: `state` is outside `0 ..= dfa.n_states`, or `budget` is negative.
        """
        if self._background is not None and state != self._start_state:
            self._settle()
        row_of = self._row_of
        if not 0 <= state < len(row_of):  # also rejects the dead state -1 instead of wrapping around
            raise InternalError(f"DFA state {state} is outside 0..{self._n_states} (n_states={self._n_states})")
        if (budget is not None and budget < (self._free_from if self._bound else self._bounds()[1])
                and not self._free_at(state, budget)):
            return self._budget_row(state, budget)
        row = row_of[state]
        if row >= 0:
            return row
        if state == self._n_states:
            return row_of[state]  # the finished pseudo-state's row is made at construction
        if self._walker is not None:
            return self._native_row(state)
        walk = self._walk(state)
        mask = self._compute_mask(state, walk)
        with self._lock:
            if row_of[state] < 0:
                row_of[state] = self._insert_row(mask)
            row = row_of[state]
        self._fill_ahead(self._destinations(state, walk))
        return row

    def min_tokens(self, state: int) -> int:
        """The exact fewest tokens of this vocabulary that take DFA state `state` to an accepting state.

        0 if `state` accepts (and for the finished pseudo-state `dfa.n_states`); EOS is not counted. Builds the
        per-index table on first use (one trie walk per state not walked yet).

        Raises:
            InternalError: `state` is outside `0 ..= dfa.n_states`, or no token sequence of this vocabulary completes
                from it (only possible when some byte is not a token).
        """
        self._check_state(state)
        n = self._min_of(state)
        if n == NO_COMPLETION:
            raise InternalError(f"no sequence of this vocabulary's tokens reaches acceptance from DFA state {state}")
        return n

    def min_tokens_from_start(self) -> int:
        """`min_tokens(dfa.start)`: the least `max_tokens` (EOS not counted) for which a valid output exists.

        Raises:
            InternalError: no token sequence of this vocabulary is accepted.
        """
        return self.min_tokens(int(self._plain.start))

    def min_tokens_range_from_start(self, within_s: float = 0.5) -> tuple[int, int]:
        """`(lo, hi)` with `lo <= min_tokens_from_start() <= hi`: equal when the exact value is known or found within
        `within_s` seconds (with searched distances; else it is always exact), else the bounds proven so far (hi: the
        tokens of one valid output). What a caller that reports a too-small `max_tokens` can afford on an automaton
        whose exact minimum is a long search (Github_ultra o34345, 34,469 states: 4.5 s past the 2.9 s that proved
        256 tokens too few).

        Raises:
            InternalError: no token sequence of this vocabulary is accepted.
            BudgetExceeded: a `Deadline` active on this thread (not the `within_s` one) passed or was cancelled.
        """
        if not self._searched():
            n = self.min_tokens_from_start()
            return n, n
        start = int(self._plain.start)
        stop = Deadline(within_s)
        try:
            with stop.active():
                n = self.min_tokens(start)
            return n, n
        except BudgetExceeded:
            if not stop.is_expired() or any(d.is_expired() for d in active_deadlines()):
                raise
        with self._search_lock:
            lo, hi = self._search_bounds()
            return lo[start], hi[start]

    def completes_within(self, budget: int) -> bool:
        """Whether a valid output fits in `budget` tokens (EOS not counted): `min_tokens_from_start() <= budget`.

        A budget at or past the start's bound (`_bounds`: the tokens of one valid completion, read without a trie
        walk) fits at once; a smaller one is searched from the start (`_at_most`). Call it under the caller's
        `Deadline`, which then bounds the search. No mask differs from its unbudgeted one while the budget left is at
        or past the bound's free_from (1 + the largest bound; 18-41 on the engine benchmark's workloads); below it,
        masks search the distances they ask (`SEARCHED_DISTANCES`). Without the C walk (or with it switched off) a
        budget below free_from builds the exact table now (one trie walk per state, as `min_tokens_from_start`),
        which masks under it read anyway, and an output that runs until fewer than free_from tokens are left builds
        it then, once per index.
        """
        bound, free_from = self._bounds()
        if self._searched():
            start = int(self._plain.start)
            return bound[start] <= budget or self._at_most(start, budget)
        if budget >= free_from:
            return True  # (free_from is past every state's bound, the start's included)
        return self.min_tokens_from_start() <= budget

    def budget_horizon(self, state: int) -> int:
        """A budget from which on `state`'s budgeted mask is its unbudgeted one (the same cached row).

        That is `max(min_tokens(state after t)) + 1` over the token transitions `t` out of `state` (EOS excluded);
        0 when only EOS is allowed, `NO_COMPLETION` when some allowed token leads to a state without completion.
        It is the least such budget unless the worst transition is on a grammar-named special id that is also EOS.

        Raises:
            InternalError: `state` is outside `0 ..= dfa.n_states`.
        """
        self._check_state(state)
        if self._searched():
            return self._searched_horizon(state)
        return int(self._budget_tables()[2][state])

    def token_min_budget(self, state: int) -> np.ndarray:
        """The least budget at which each token is allowed in `state` (int32 [vocab_size]).

        Entry `t` is `min_tokens(state after t) + 1` for an allowed non-EOS token, 0 for an EOS id in an accepting
        state, and `NO_COMPLETION` for a token never allowed there; so `token_min_budget(s) <= B` is exactly the
        boolean view of `mask_for_state(s, B)`. Costs one trie walk (about a millisecond on 150k tokens); not cached.

        Raises:
            InternalError: `state` is outside `0 ..= dfa.n_states`.
        """
        self._check_state(state)
        return self._token_costs(state)[: self._vocab_size].astype(np.int32)

    def mask_table(self) -> tuple[np.ndarray, np.ndarray]:
        """A snapshot of the distinct masks computed so far (budgeted masks and counted strings' masks near their bounds
        included, once asked for).

        Returns:
            `(table, state_rows)`: `table` is int32 [n_rows, n_words] (distinct rows); `state_rows` is int32
            [dfa.n_states + 1] giving each state's row, or -1 where not computed yet (never in eager mode). The last
            entry is the finished pseudo-state (after EOS), which is always present.
        """
        self._settle()
        with self._lock:
            if self._table_cache is None or self._table_cache.shape[0] != len(self._rows):
                for row in list(self._pending):
                    self._materialise(row)
                self._table_cache = np.stack(self._rows)
                self._table_cache.flags.writeable = False
            return self._table_cache, np.asarray(self._row_of, dtype=np.int32)

    def nbytes(self) -> int:
        """Estimate of the memory this index holds now: mask rows with their patches and deduplication keys, and
        per-DFA arrays (the shared trie excluded)."""
        with self._lock:
            rows = (len(self._rows) - len(self._pending)) * self._n_words * 4 + int(self._pending_pairs.nbytes)
            rows += self._key_bytes + self._patch_bytes
            table = 0 if self._table_cache is None else int(self._table_cache.nbytes)
            budget = (0 if self._min_tokens is None else 24 * len(self._row_of)) + 120 * len(self._budget_rows)
            if self._hi:  # searched distances: proven bounds, destinations walked
                budget += 16 * len(self._hi) + self._dests_bytes
        node_cls = self.__dict__.get("_node_cls")  # built only if a numpy walk ran
        per_dfa = (int(self._tflat.nbytes) + 200 * self._n_states + (0 if node_cls is None else int(node_cls.nbytes))
                   + 8 * len(self._row_of))
        return rows + table + per_dfa + budget

    # ---- mask computation

    def _insert_row(self, mask: np.ndarray, key: bytes | None = None) -> int:
        """The row of `mask` (int32 or uint32 words; copied when new), added if new. `key`: its
        `native.sparse_key`, when known."""
        if key is None:
            key = _native.sparse_key(mask)
        slot, row = self._row_slot(key)
        if row is None:
            row = len(self._rows)
            mask = np.array(mask.view(np.int32), dtype=np.int32, copy=True)
            mask.flags.writeable = False
            self._rows.append(mask)
            self._enter_row(slot, row, _stepping.patch_of(key, mask, self._n_words))
        return row

    def _row_slot(self, key: bytes) -> tuple[bytes | int, int | None]:
        """`(its entry in _row_key, the row)` of a mask with `native.sparse_key` `key`; the row is None when new. A
        dense key (the whole row's bytes) is entered by its hash, not kept: the row itself is compared on a hit (the
        keys were 10-30 % of an index's bytes on the engine benchmark's workloads). Where two rows' hashes collide,
        the later goes by its whole key."""
        if key[:1] != b"f":
            return key, self._row_key.get(key)
        slot = hash(key)
        row = self._row_key.get(slot)
        if row is not None and self._rows[row].tobytes() != key[1:]:
            slot, row = key, self._row_key.get(key)
        return slot, row

    def _enter_row(self, slot: bytes | int, row: int, patch: bytes | None) -> None:
        """A new row's deduplication entry and patch (`_insert_row`, a batch's dense rows), their bytes counted
        (`nbytes`)."""
        self._row_key[slot] = row
        self._key_bytes += len(slot) if type(slot) is bytes else 8
        self._patches.append(patch)
        if patch is not None:
            self._patch_bytes += len(patch)

    # ---- counted strings

    def _need_ticks(self) -> np.ndarray:
        """Per state, 1 when a counter there takes one more count before it can close (a counted string inside a
        character or an escape, a counted array short of its minItems), else 0 (int64; a last 0 for the dead state
        -1). States outside every counter (before its bound opens, after it closes) read 1 too: the cursor asks only
        inside one (`_need_inside`)."""
        if self._need is None:
            effect = self._counters.effect
            trans = np.asarray(self._plain.transitions)
            # states that reach a closing transition without counting: backwards from those with one, over the
            # transitions that count nothing (one pass over the distinct (target, source) pairs; a fixpoint of
            # whole-table rounds took 3.9 ms on the 404 states of an array of tool calls, a round per byte of an item)
            seeds = np.flatnonzero((effect == EFFECT_CLOSE).any(axis=1))
            close = _reached(seeds, *_edges(trans, (effect == EFFECT_NONE) & (trans >= 0), backward=True))
            self._need = np.append(~close, False).astype(np.int64)
        return self._need

    def _need_inside(self) -> bool:
        """Whether a state inside a counter (reached from a transition that opens one, then over transitions that
        count or do nothing) needs a count before it can close (`_need_ticks`). An array of tool calls with minItems 1
        has none."""
        if self._needy is None:
            effect = self._counters.effect
            trans = np.asarray(self._plain.transitions)
            # (opening and closing transitions leave it: counters do not nest)
            inside_edges = ((effect == EFFECT_NONE) | (effect == EFFECT_TICK)) & (trans >= 0)
            seeds = np.unique(trans[(effect >= EFFECT_OPEN) & (trans >= 0)])
            inside = _reached(seeds, *_edges(trans, inside_edges, backward=False))
            self._needy = bool((self._need_ticks()[:-1].astype(bool) & inside).any())
        return self._needy

    def _counted_row(self, state: int, room: int, budget: int | None) -> int:
        """The row of `state`'s mask inside a counter with `room` counts left (at most `_near`: the most one token
        ticks): the plain mask (under `budget`) without the tokens that would pass the bound, or end inside a
        character with no room for it."""
        key = (state, room, budget)
        row = self._counted_rows.get(key)
        if row is not None:
            return row
        if self._ticking is not None and room >= self._most_ticks and not self._need_inside():
            # a token ticks `_most_ticks` times at most, and where it ends at the bound no state needs a tick: the
            # plain row (the cursor asks here at that room; for an array of tool calls, at the last item but one)
            row = self.row_for_state(state, budget)  # (outside the lock: a plain row's C walk takes it)
            with self._lock:
                self._counted_rows[key] = row
            return row
        if self._ticking is not None and (room > 0 or not self._need_inside()) and self._far_from_ticks(state):
            # no token of the vocabulary reaches a tick from here: the plain row as it is (most states of an item)
            row = self.row_for_state(state, budget)
            with self._lock:
                self._counted_rows[key] = row
            return row
        base_row = self.row_for_state(state, budget)
        base = self._row_words(base_row)
        if self._ticking is not None and (room > 0 or not self._need_inside()):
            # Arrays only: a token without a comma keeps its bit (it cannot tick, and ends where a close needs no more
            # ticks than the room), so only the few tokens with one are walked, in C where it is built (a row on
            # Llama 3: 10-20 us; by numpy, 70-250 us)
            sub = self._ticking.sub_trie(self._vocab)
            if self._walker is None:
                mask = base & self._counted_walk(sub, self._byte_class.astype(self._dtype)[sub.node_byte], state, room)
            else:
                if self._tick_walker is None:
                    self._tick_walker = _native.automata().walker(
                        self._tflat, self._n_classes, self._byte_class, sub, self._n_words, self._accepting,
                        self._eos, self._special_ids_arr.tolist(), self._special_cls_arr.tolist())
                effect, need_flags = self._counted_inputs()
                words, _ = self._tick_walker.counted(effect, need_flags, state, room)
                mask = base & (words.view(np.int32) | self._ticking.outside_words(self._n_words))
        # A narrow state's walk in C, depth first over its few live nodes (0.05-2.2 ms against 1.6-5.6 ms); a wide one
        # (a string's content: most of the trie live) by numpy depth by depth, which reads the trie in order (a
        # content state with room 8-120: 12-19 ms a row, the depth-first walk 14-31 ms)
        elif self._walker is not None and self._walker.first_live(state) <= _BATCH_MAX_FIRST:
            if self._outside_words is None:
                outside = np.ones(self._n_words * 32, bool)  # the tokens no trie node spells keep the plain row's bit
                outside[self._trie.term_tokens] = False
                self._outside_words = np.packbits(outside, bitorder="little").view(np.int32)
            effect, need_flags = self._counted_inputs()
            words, _ = self._walker.counted(effect, need_flags, state, room)
            mask = base & (words.view(np.int32) | self._outside_words)
        else:
            mask = base & self._counted_walk(self._trie, self._node_cls, state, room)
        # The row is the plain one less a few tokens: named by the plain row and the words that lost bits, it is
        # inserted once (many states share a plain row and lose the same tokens; inserting a row hashes all of it,
        # ~20 us on Qwen3 against ~3 us for this key), and where nothing was lost it is the plain row itself
        lost = np.flatnonzero(base != mask)
        trimmed = (base_row, lost.tobytes(), mask[lost].tobytes()) if lost.size else None
        with self._lock:
            if trimmed is None:
                row = base_row
            else:
                row = self._trimmed_rows.get(trimmed)
                if row is None:
                    row = self._trimmed_rows[trimmed] = self._insert_row(mask)
            self._counted_rows[key] = row
        return row

    def _counts(self, t: int, data: bytes) -> bool:
        """Whether token `t` (bytes `data`) holds a byte with an effect (`_quiet_bytes` set), decided on its first
        sight."""
        seen = self._loud[t]
        if not seen:
            seen = self._loud[t] = 2 if data.translate(None, self._quiet_bytes) else 1
        return seen == 2

    def _far_from_ticks(self, state: int) -> bool:
        """Whether every path from `state` to a tick of its counter is longer than the longest token holding a tick
        byte (`_ticking.longest`): then no token ticks from here, and without a tick a token ends where closing needs
        no more ticks than `_counted_row`'s callers leave. In C (a search of at most that many levels, cached per
        state); False without the C library (the counted walk decides)."""
        far = self._far.get(state)
        if far is None:
            lib = _native.automata()
            if lib is None:
                return False
            cap = self._ticking.longest + 1
            far = lib.tick_gap(self._plain.transitions, self._counters.effect, cap, EFFECT_TICK, EFFECT_NONE,
                               state) >= cap
            self._far[state] = far
        return far

    def _counted_inputs(self) -> tuple[np.ndarray, np.ndarray]:
        """The C counted walk's effect (int8) and need (uint8) tables, contiguous, made on first use."""
        if self._counted_args is None:
            self._counted_args = (np.ascontiguousarray(self._eff_flat, dtype=np.int8),
                                  np.ascontiguousarray(self._need_ticks(), dtype=np.uint8))
        return self._counted_args

    def _counted_walk(self, trie: _Trie, node_cls: np.ndarray, state: int, room: int) -> np.ndarray:
        """The words (int32) of a counted row's bits over `trie`'s tokens, by numpy depth by depth: a token's bit is
        set when it stays live from `state`, ticks at most `room` times before its counter closes, and does not end
        where closing needs more ticks than are left; the tokens `trie` does not spell are set."""
        k = self._n_classes
        ds = trie.depth_start
        tflat, eflat = self._tflat, self._eff_flat
        need = self._need_ticks()
        node_ok = np.zeros(trie.n_nodes, bool)
        states = np.full(1, state, np.int64)
        counts = np.zeros(1, np.int64)
        closed = np.zeros(1, bool)
        for d in range(1, trie.max_depth + 1):
            lo, hi = ds[d - 1], ds[d]
            parent = np.zeros(hi - lo, np.int64) if d == 1 else trie.parent_local[lo:hi]
            at = states[parent] * k + node_cls[lo:hi]  # a dead parent (-1) lands in the dead row
            effect = eflat[at]
            states = tflat[at].astype(np.int64)
            closed = closed[parent] | (effect >= EFFECT_CLOSE)  # closed, or a new string (bound > any token)
            counts = counts[parent] + (effect == EFFECT_TICK)
            states[~closed & (counts > room)] = -1
            node_ok[lo:hi] = (states >= 0) & (closed | (counts + need[states] <= room))
            if not (states >= 0).any():
                break
        ok = np.ones(self._n_words * 32, bool)
        ok[trie.term_tokens] = node_ok[trie.term_node]
        return np.packbits(ok, bitorder="little").view(np.int32)

    def _stack_row(self, base: int, state: int, stack: tuple[int, ...], count: int, limit: int, budget: int | None) -> int:
        """The row of a cursor at `state` with `stack` (and its counter at `count`/`limit`): the row `base` (the
        state's mask under what the stack leaves of the budget) with each deep token's bit replaced by an exact walk."""
        room = -1 if limit < 0 else min(limit - count, self._deep_longest + 1)  # a token ticks at most once a byte
        tight = budget is not None and not self._free_at(state, budget - len(stack) - self._most_opened - 1)
        # near a full stack, a token may spill past `MAX_SPILLED`: every token with a bracket is walked
        full = len(stack) + self._most_opened >= MAX_SPILLED
        tokens = self._bracketed if tight or full else self._deep
        key = (base, state, stack[max(len(stack) - self._deep_reach, 0):] if not tight else stack, room,
               None if budget is None else (budget, len(stack)), len(stack) if full else -1)
        row = self._stack_rows.get(key)
        if row is not None:
            return row
        words = self._row_words(base)
        mask = np.array(words, dtype=np.int32, copy=True)
        bits = mask.view(np.uint32)
        need = self._need_ticks() if limit >= 0 else None
        for t, data in tokens:
            left = list(stack)
            s, c, lim, at = walk_counted(self._tr_view, self._n_classes, self._cls_list, self._eff_view, self._limits,
                                         state, data, 0 if room >= 0 else count, room if room >= 0 else limit,
                                         self._spill_view, self._refill_view, left)
            ok = at < 0 and not (need is not None and 0 <= lim == c and need[s])
            if ok and budget is not None:
                ok = self._within(s, budget - 1 - len(left))
            if ok:
                bits[t >> 5] |= np.uint32(1 << (t & 31))
            else:
                bits[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)
        same = np.array_equal(mask, words)
        with self._lock:
            row = self._stack_rows[key] = base if same else self._insert_row(mask)
        if same and not stack and limit < 0 and budget is None:
            self._calm[state] = True
        return row

    def _finished_mask(self) -> tuple[np.ndarray, bytes]:
        """The finished pseudo-state's mask (EOS ids only) and its `native.sparse_key`, made once per (trie, mask
        width, EOS ids) and shared, read-only."""
        shape = (self._n_words, self._eos)
        with _FINISHED_LOCK:
            hit = _FINISHED.get(self._trie, {}).get(shape)
        if hit is None:
            allowed = np.zeros(self._n_words * 32, dtype=bool)
            allowed[self._eos_arr] = True
            mask = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32)
            mask.flags.writeable = False
            hit = (mask, _native.sparse_key(mask))
            with _FINISHED_LOCK:
                _FINISHED.setdefault(self._trie, {})[shape] = hit
        return hit

    def _fill_all(self) -> None:
        # The min_tokens table walks every state and fills each missing row on the way: eager costs one walk per state.
        self._budget_tables()

    def _prefill_structural(self) -> None:
        """Give a row to every state that at most `_BATCH_MAX_FIRST` first bytes and at most `_PREFILL_LIVE` trie nodes
        keep live (`_PREFILL_FLOOR` once the walks given up reach `_PREFILL_WASTE` nodes a state), from one C call.
        The first `_EAGER_ROWS` new rows are made now, the others kept as their nonzero words until first read."""
        # (called at construction, before any state has a row: every state is a candidate; converting the list of rows
        # to find them cost ~60 us on parallel_1to5_of_5's 2,012 states)
        states = np.arange(self._n_states, dtype=np.int32)
        self._fill_batch(states, _PREFILL_LIVE, _PREFILL_FLOOR, _PREFILL_WASTE * self._n_states)

    def _fill_batch(self, states: np.ndarray, live_max: int, live_floor: int, waste_budget: int) -> None:
        """Rows for those of `states` that `TrieWalker.masks_many` walks (at most `_BATCH_MAX_FIRST` first bytes live,
        `live_max` / `live_floor` / `waste_budget` as there), from one C call; rows made as `_prefill_structural`
        says."""
        local, off, data = self._walker.masks_many(states, _BATCH_MAX_FIRST, live_max, live_floor, waste_budget)
        n_uniq = off.shape[0] - 1
        if not n_uniq:
            return
        pairs = data.reshape(-1, 2)
        blob, bounds = data.tobytes(), (4 * off).tolist()
        with self._lock:
            row_key, rows, pending = self._row_key, self._rows, self._pending
            row_of_u = [0] * n_uniq
            new: list[int] = []  # the distinct masks that are new rows, in the states' breadth-first order
            dense: list[int] = []  # those with more nonzero words than a sparse key holds: keyed by all their words
            for u in range(n_uniq):
                lo, hi = bounds[u], bounds[u + 1]
                if hi - lo > 8 * _native.SPARSE_MAX:
                    dense.append(u)
                    continue
                key = b"s" + blob[lo:hi]
                r = row_key.get(key)
                if r is None:
                    r = row_key[key] = len(rows) + len(new)
                    new.append(u)
                row_of_u[u] = r
            first = len(rows)
            rows.extend([None] * len(new))
            head = struct.pack("<ii", self._n_words, 0)  # (`stepping.patch_of` of a sparse key)
            self._patches.extend([head + blob[bounds[u] : bounds[u + 1]] for u in new])
            spans = sum(bounds[u + 1] - bounds[u] for u in new)
            self._patch_bytes += 8 * len(new) + spans
            self._key_bytes += len(new) + spans
            pair_off = off // 2
            if dense:  # made side by side in one block (a new one's row is a view of it)
                block = self._rows_block(np.asarray(dense, np.int64), pair_off, pairs)
                block.flags.writeable = False
                for i, u in enumerate(dense):
                    key = b"f" + block[i].tobytes()  # (`native.sparse_key`'s dense form)
                    slot, r = self._row_slot(key)
                    if r is None:
                        r = len(rows)
                        rows.append(block[i])
                        self._enter_row(slot, r, _stepping.patch_of(key, block[i], self._n_words))
                    row_of_u[u] = r
            lazy_from = min(len(new), _EAGER_ROWS)
            if lazy_from < len(new):  # rows of an earlier batch may still wait on their words: these go after them
                base = self._pending_pairs.shape[0] if pending else 0
                self._pending_pairs = np.concatenate([self._pending_pairs, pairs]) if pending else pairs
                pair_at = (pair_off + base).tolist()
                for i in range(lazy_from, len(new)):
                    u = new[i]
                    pending[first + i] = (pair_at[u], pair_at[u + 1])
            self._make_rows(first, np.asarray(new[:lazy_from], np.int64), pair_off, pairs)
            done = local >= 0
            row_of = np.asarray(self._row_of, np.int64)
            row_of[states[done]] = np.asarray(row_of_u, np.int64)[local[done]]
            self._row_of = row_of.tolist()

    def _make_rows(self, first: int, uniq: np.ndarray, pair_off: np.ndarray, pairs: np.ndarray) -> None:
        """Rows `first ..` from the distinct masks `uniq` (`pairs[pair_off[u] : pair_off[u + 1]]` their nonzero words),
        in blocks whose pages are all mapped now: reading a row then never faults (the caller holds the lock)."""
        per_block = max(1, ((4 << 20) - 4096) // (4 * self._n_words))  # under 4 MiB: no huge pages (_EAGER_ROWS)
        for lo in range(0, uniq.shape[0], per_block):
            chunk = uniq[lo : lo + per_block]
            block = self._rows_block(chunk, pair_off, pairs)
            _native.populate(block)
            block.flags.writeable = False
            self._rows[first + lo : first + lo + chunk.shape[0]] = list(block)

    def _rows_block(self, uniq: np.ndarray, pair_off: np.ndarray, pairs: np.ndarray) -> np.ndarray:
        """The masks `uniq` side by side (int32 [len(uniq), n_words]), mask u being the nonzero words
        `pairs[pair_off[u] : pair_off[u + 1]]` (word index, value)."""
        lens = pair_off[uniq + 1] - pair_off[uniq]
        ends = lens.cumsum()
        at = np.arange(int(ends[-1]) if lens.shape[0] else 0) + np.repeat(pair_off[uniq] - (ends - lens), lens)
        block = np.zeros((uniq.shape[0], self._n_words), np.int32)
        block[np.repeat(np.arange(uniq.shape[0]), lens), pairs[at, 0]] = pairs[at, 1]
        return block

    def _row_words(self, row: int) -> np.ndarray:
        """Row `row`'s mask, made from its nonzero words if it has not been read yet."""
        mask = self._rows[row]
        if mask is None:
            with self._lock:
                mask = self._rows[row]
                if mask is None:
                    mask = self._materialise(row)
        return mask

    def _materialise(self, row: int) -> np.ndarray:
        """Make pending row `row`'s mask (the caller holds the lock)."""
        lo, hi = self._pending.pop(row)
        part = self._pending_pairs[lo:hi]
        mask = np.zeros(self._n_words, np.int32)
        mask[part[:, 0]] = part[:, 1]
        mask.flags.writeable = False
        self._rows[row] = mask
        return mask

    def _prefill(self) -> None:
        stop = time.perf_counter() + _PREFILL_S
        # First in C, `_PREFILL_CHUNK` states a call: those few first bytes keep live, walked up to
        # `_PREFILL_BATCH_LIVE` nodes (wider ones, an escape's next character in a string, are left to the loop below,
        # which may derive them from an earlier state's mask).
        narrow = self._batchable_states(np.flatnonzero(np.asarray(self._row_of[: self._n_states]) < 0)).astype(np.int32)
        if narrow.shape[0] >= _PREFILL_BATCH_MIN:
            for lo in range(0, narrow.shape[0], _PREFILL_CHUNK):
                self._fill_batch(narrow[lo : lo + _PREFILL_CHUNK], _PREFILL_BATCH_LIVE, _PREFILL_BATCH_LIVE, 0)
                if time.perf_counter() > stop:
                    return
        self._prefill_alone(stop)

    def _prefill_alone(self, stop: float) -> None:
        """Walk the states still without a row one at a time, in order (breadth-first), until `stop`
        (`time.perf_counter()`)."""
        row_of = self._row_of
        for s in range(self._n_states):
            if row_of[s] < 0:
                self._native_row(s)
                if time.perf_counter() > stop:
                    return

    def _check_state(self, state: int) -> None:
        if not 0 <= state <= self._n_states:
            raise InternalError(f"DFA state {state} is outside 0..{self._n_states} (n_states={self._n_states})")

    # ---- token budgets

    def _budget_init(self, saved: tuple[np.ndarray, list[int], dict] | None) -> None:
        self._budget_lock = threading.Lock()
        self._min_tokens: np.ndarray | None = None  # int64 [n_states + 1]; last: the finished pseudo-state
        self._min_tokens_list: list[int] = []
        self._horizon: list[int] = []
        self._budget_rows: dict[tuple[int, int], int] = {}  # (state, budget) -> row, only for budget < horizon
        self._bound: list[int] = []  # `_bounds`, on first use
        self._free_from = NO_COMPLETION
        # Searched distances (`_searched`): proven bounds on min_tokens per state (`_lo` <= it <= `_hi`), each
        # searched state's destinations, and budgets known (not) to bind per state (`_free_known`: the least budget
        # known free, the largest known not).
        self._search_lock = threading.RLock()
        self._lo: list[int] = []
        self._hi: list[int] = []
        self._dests_of: dict[int, list[int]] = {}
        self._dests_bytes = 0  # (their memory, for `nbytes`)
        self._free_known: dict[int, tuple[int, int]] = {}
        if saved is not None:
            dist, horizon, rows = saved
            self._horizon = list(horizon)
            self._budget_rows = dict(rows)
            self._min_tokens_list = np.asarray(dist).tolist()
            self._min_tokens = np.array(dist, dtype=np.int64)
            self._min_tokens.flags.writeable = False

    def _bounds(self) -> tuple[list[int], int]:
        """`(bound, free_from)`, built once per index without a trie walk (0.2-2.2 ms on the engine benchmark's
        workloads, where the exact table takes 5-675 ms; 83 s on a 269k-state policy).

        `bound[s] >= min_tokens(s)`, the tokens of one valid completion: a shortest path from `s` to acceptance over
        bytes that are tokens by themselves and grammar-named special ids, its bytes split into the vocabulary's
        tokens as cheaply as the bounds of the states along it allow (in C; without it, the path's length: a bound
        2-4x looser). `NO_COMPLETION` where there is none, 0 for the finished pseudo-state. `free_from`: 1 + the
        largest bound, a budget from which on no state's budgeted mask differs from its unbudgeted one (every token
        leads to a state whose completion fits): decoding under such a budget never needs the exact table.
        """
        if self._bound:
            return self._bound, self._free_from
        with self._budget_lock:
            if self._bound:
                return self._bound, self._free_from
            trie = self._trie
            first = slice(trie.depth_start[0], trie.depth_start[1])
            single = np.zeros(256, dtype=bool)
            single[trie.node_byte[first][trie.term_count[first] > 0]] = True
            usable = np.zeros(self._n_classes, dtype=bool)
            usable[self._byte_class[single]] = True
            special = list(self._special_cls.values())
            usable[special] = True  # a step as in the table (EOS ids named too: `advance`)
            lib = _native.automata()
            if lib is not None:
                rep = np.full(self._n_classes, -1, dtype=np.int32)  # a single-token byte per class, -1: a special's
                singles = np.flatnonzero(single)
                rep[self._byte_class[singles]] = singles
                dist = lib.token_bound(np.asarray(self._plain.transitions), usable, rep, self._accepting, trie,
                                       NO_COMPLETION)
            else:  # the path's length (numpy: ~16 ms on required_50's 115 levels, where the C bound takes ~0.2 ms)
                dist = np.minimum(shortest_distances(self._plain, usable), NO_COMPLETION)
            dist = np.append(dist, 0)
            worst = int(dist.max())
            self._free_from = NO_COMPLETION if worst == NO_COMPLETION else worst + 1
            self._bound = dist.tolist()
            return self._bound, self._free_from

    def _within(self, state: int, n: int) -> bool:
        """`min_tokens(state) <= n`, from `_bounds` when it tells (else from the exact table, built then, or searched)."""
        if (self._bound or self._bounds()[0])[state] <= n:
            return True
        if self._searched():
            return self._at_most(state, n)
        return (self._min_tokens_list or self._budget_tables()[1])[state] <= n

    def _min_of(self, state: int) -> int:
        """`min_tokens(state)` (`NO_COMPLETION` where none), from the table or searched."""
        if self._searched():
            return self._searched_min(state)
        return int(self._budget_tables()[0][state])

    def _free_at(self, state: int, budget: int) -> bool:
        """Whether `state`'s mask under `budget` is its unbudgeted one: `budget >= budget_horizon(state)`."""
        if budget >= (self._free_from if self._bound else self._bounds()[1]):
            return True
        if not self._searched():
            return budget >= (self._horizon or self._budget_tables()[2])[state]
        if budget < 0:
            return False  # (a horizon is never negative)
        with self._search_lock:
            no, yes = self._free_known.get(state, (-1, NO_COMPLETION))
            if budget >= yes:
                return True
            if budget <= no:
                return False
            free = all(self._at_most(e, budget - 1) for e in self._dests(state))
            self._free_known[state] = (no, budget) if free else (budget, yes)
            return free

    # ---- searched distances (`SEARCHED_DISTANCES`)

    def _searched(self) -> bool:
        """Whether this index answers budgets by searches from the states asked instead of the whole table: the C
        walk, and no table built (an eager index or a pickled one has it)."""
        return SEARCHED_DISTANCES and self._walker is not None and self._min_tokens is None

    def _search_bounds(self) -> tuple[list[int], list[int]]:
        """`(lo, hi)`: `lo[s] <= min_tokens(s) <= hi[s]` as proven so far (the caller holds `_search_lock`)."""
        if not self._hi:
            bound = self._bounds()[0]
            lo = [0 if a else 1 for a in self._acc_list]
            lo.append(0)  # the finished pseudo-state
            self._lo, self._hi = lo, list(bound)
        return self._lo, self._hi

    def _dests(self, state: int) -> list[int]:
        """The distinct states the non-EOS tokens of `state` lead to (one full C walk, cached; the state's row is
        made on the way, as the table's walk makes it)."""
        with self._search_lock:
            got = self._dests_of.get(state)
            if got is None:
                if state == self._n_states:
                    return []
                words, key, found, _ = self._walker.mask(state, share=False)  # every destination
                got = self._dests_of[state] = found.tolist()
                self._dests_bytes += 8 * len(got) + 100
                with self._lock:
                    if self._row_of[state] < 0:
                        self._row_of[state] = self._insert_row(words, key)
            return got

    def _at_most(self, state: int, k: int) -> bool:
        """`min_tokens(state) <= k`, searched (`_search`)."""
        return self._search(state, k) <= k

    def _searched_min(self, state: int) -> int:
        """`min_tokens(state)`, searched (`_search`); `NO_COMPLETION` where there is none."""
        return self._search(state, None)

    def _search(self, state: int, k: int | None) -> int:
        """The fewest tokens from `state` to acceptance if at most `k` (None: whatever it is), else a larger bound.

        Breadth first, one token a level, each state at the first level it is seen, keeping the best completion
        found, `level + hi[x]` for a state x seen at `level` (`hi`: proven upper bounds, the C bound to begin with;
        an accepting state's is 0). It stops once that best is at most `k`, or no further level can beat it or stay
        within `k`; a state is expanded only while `level + lo[x]` (`lo`: proven lower bounds) still could. A
        completion of L tokens, L at most `k` and below the best, would have been found (each state along a
        shortest one is seen by its level), so `m = min(best, k + 1)` is a lower bound on `min_tokens(state)`, and
        `m - level` on that of every state seen at `level`. Every fact is kept for later searches, so no state is
        walked twice (`_dests`), and an interrupted search (a deadline) leaves only true facts behind."""
        with self._search_lock:
            lo, hi = self._search_bounds()
            best = hi[state]
            limit = NO_COMPLETION if k is None else k
            if (k is not None and best <= k) or lo[state] >= best or lo[state] > limit:
                return best
            seen = {state: 0}
            frontier = [state]
            level = walks = 0
            while frontier and level + 1 < best and level < limit:
                level += 1
                after: list[int] = []
                for x in frontier:
                    if x not in self._dests_of:
                        walks += 1
                        if walks % 16 == 0:
                            check_deadlines()
                    for e in self._dests(x):
                        if e in seen:
                            continue
                        seen[e] = level
                        if level + hi[e] < best:
                            best = hi[state] = level + hi[e]
                            if best <= limit and k is not None:
                                return best
                        if level + lo[e] < best and level + lo[e] <= limit:
                            after.append(e)
                frontier = after
            proven = min(best, limit + 1)
            for x, at in seen.items():
                if lo[x] < proven - at:
                    lo[x] = proven - at
            return best

    def _searched_horizon(self, state: int) -> int:
        """`budget_horizon(state)` from searched distances: 1 + the largest `min_tokens` its tokens lead to."""
        if state == self._n_states:
            return 0
        with self._search_lock:
            worst = max((self._searched_min(e) for e in self._dests(state)), default=-1)
        return min(worst + 1, NO_COMPLETION)

    def _destinations(self, state: int, walk: _Walk) -> np.ndarray:
        """The distinct DFA states that the allowed non-EOS tokens of `state` lead to."""
        dense, sparse, _ = walk
        term_count = self._trie.term_count
        parts = [full[self._term_local_by_depth[d]] for d, full, _ in dense]
        parts += [st[term_count[nodes] > 0] for nodes, st in sparse]
        if self._special_cls_arr.shape[0]:
            parts.append(self._tflat[state * self._n_classes + self._special_cls_arr])
        # A scatter into flags, not np.unique: a string state has ~all tokens alive and sorting them doubled the walk.
        seen = np.zeros(self._n_states + 1, dtype=bool)  # the extra last flag absorbs the dead state -1
        for part in parts:
            seen[part] = True
        return np.flatnonzero(seen[: self._n_states])

    def _budget_tables(self) -> tuple[np.ndarray, list[int], list[int]]:
        """`(min_tokens, min_tokens_list, horizon)` over states `0 ..= n_states`, built once per index.

        Exact token distances: one trie walk per state gives the distinct destination states of its tokens (the
        state graph with one unit-weight edge per distinct destination); a backward breadth-first search from the
        accepting states over that graph gives every state's fewest tokens.
        """
        if self._min_tokens is not None:
            return self._min_tokens, self._min_tokens_list, self._horizon
        with self._budget_lock:
            if self._min_tokens is not None:
                return self._min_tokens, self._min_tokens_list, self._horizon
            n = self._n_states
            dests: list[np.ndarray] = [np.zeros(0, np.intp)] * n
            # A whole-index build can take minutes (115k states of string content: ~47 s): it checks the compile's
            # deadlines (`automaton.Deadline.active`) per batch and per single state, and keeps the rows made so far.
            if self._walker is not None:
                for s in range(n):  # one C walk per state: its mask, its row key and its destinations
                    if s % _BATCH_STATES == 0:
                        check_deadlines()
                    words, key, found, _ = self._walker.mask(s, share=False)  # every destination
                    dests[s] = np.sort(found)
                    with self._lock:
                        if self._row_of[s] < 0:
                            self._row_of[s] = self._insert_row(words, key)
            else:
                self._numpy_rows_and_destinations(dests)
            counts = np.fromiter((d.shape[0] for d in dests), dtype=np.intp, count=n)
            src = np.repeat(np.arange(n, dtype=np.intp), counts)
            dst = np.concatenate(dests) if n else np.zeros(0, np.intp)
            dist = np.full(n + 1, NO_COMPLETION, dtype=np.int64)
            dist[:n][self._accepting] = 0
            dist[n] = 0
            frontier = np.zeros(n, dtype=bool)
            frontier[self._accepting] = True
            level = 0
            while True:
                check_deadlines()
                level += 1
                reached = src[frontier[dst]]
                reached = reached[dist[reached] == NO_COMPLETION]
                if not reached.shape[0]:
                    break
                dist[reached] = level
                frontier[:] = False
                frontier[reached] = True
            horizon = np.zeros(n + 1, dtype=np.int64)
            if dst.shape[0]:
                # Max over each state's destinations (+1); NO_COMPLETION stays NO_COMPLETION.
                has = counts > 0
                starts = (np.cumsum(counts) - counts)[has]  # strictly increasing: reduceat needs no empty segment
                worst = np.maximum.reduceat(dist[dst], starts)
                horizon[:n][has] = np.minimum(worst + 1, NO_COMPLETION)
            dist.flags.writeable = False
            self._horizon = horizon.tolist()
            self._min_tokens_list = dist.tolist()
            self._min_tokens = dist
            return dist, self._min_tokens_list, self._horizon

    def _numpy_rows_and_destinations(self, dests: list[np.ndarray]) -> None:
        """Every state's row and destinations with the numpy walks: structural states in batches, the others one at a
        time (`dests[s]` set in place)."""
        n = self._n_states
        batched = self._batchable_states()
        for lo in range(0, batched.shape[0], _BATCH_STATES):
            check_deadlines()
            chunk = batched[lo : lo + _BATCH_STATES]
            masks, chunk_dests = self._walk_batch(chunk)
            with self._lock:
                for i, s in enumerate(chunk.tolist()):
                    dests[s] = chunk_dests[i]
                    if self._row_of[s] < 0:
                        self._row_of[s] = self._insert_row(masks[i])
        single = np.ones(n, dtype=bool)
        single[batched] = False
        for s in np.flatnonzero(single).tolist():
            check_deadlines()
            walk = self._walk(s)
            dests[s] = self._destinations(s, walk)
            if self._row_of[s] < 0:
                mask = self._compute_mask(s, walk)
                with self._lock:
                    if self._row_of[s] < 0:
                        self._row_of[s] = self._insert_row(mask)

    def _token_costs(self, state: int, dist: np.ndarray | None = None) -> np.ndarray:
        """int64 [n_words * 32]: the least budget at which each token is allowed in `state` (see token_min_budget),
        from `dist` (`min_tokens` of the states its tokens lead to; default: the table's, or searched)."""
        if dist is None and self._searched():
            dist = np.full(self._n_states + 1, NO_COMPLETION, dtype=np.int64)
            for e in self._dests(state):
                dist[e] = self._searched_min(e)
        elif dist is None:
            dist = self._budget_tables()[0]
        cost = np.full(self._n_words * 32, NO_COMPLETION, dtype=np.int64)
        if state == self._n_states:
            cost[self._eos_arr] = 0
            return cost
        trie = self._trie
        if self._walker is not None:
            by_token = np.full(self._n_tokens, -1, dtype=np.int32)
            self._walker.token_states(state, by_token)
            live_ids = trie.term_tokens[by_token[trie.term_tokens] >= 0]
            cost[live_ids] = np.minimum(dist[by_token[live_ids]] + 1, NO_COMPLETION)
        else:
            ds = trie.depth_start
            dense, sparse, _ = self._walk(state)
            node_state = np.full(trie.n_nodes, -1, dtype=np.intp)
            for d, full, _ in dense:
                node_state[ds[d] : ds[d + 1]] = full
            for nodes, st in sparse:
                node_state[nodes] = st
            tok_state = node_state[trie.term_node]
            live = tok_state >= 0
            cost[trie.term_tokens[live]] = np.minimum(dist[tok_state[live]] + 1, NO_COMPLETION)
        if self._special_ids_arr.shape[0]:
            nxt = self._tflat[state * self._n_classes + self._special_cls_arr]
            ok = nxt >= 0
            cost[self._special_ids_arr[ok]] = np.minimum(dist[nxt[ok]] + 1, NO_COMPLETION)
        if self._eos and self._accepting[state]:
            cost[self._eos_arr] = 0  # EOS is free (and wins over a special transition on the same id)
        return cost

    def _budget_row(self, state: int, budget: int) -> int:
        """The row of `state`'s mask under `budget`, for `budget` below the state's horizon."""
        if budget < 0:
            raise InternalError(f"budget must be >= 0 tokens, got {budget}")
        key = (state, budget)
        row = self._budget_rows.get(key)
        if row is not None:
            return row
        if self._searched():
            # each destination that fits in budget - 1 as if it needed none (its tokens cost 1), the others none fits
            fits = np.full(self._n_states + 1, NO_COMPLETION, dtype=np.int64)
            for e in self._dests(state):
                if self._at_most(e, budget - 1):
                    fits[e] = 0
            allowed = self._token_costs(state, fits) <= budget
            mask = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)
            with self._lock:
                row = self._budget_rows[key] = self._insert_row(mask)
            return row
        cost = self._token_costs(state)
        allowed = cost <= budget
        mask = np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)
        # Every budget between the largest cost <= budget and the next cost gives this same mask: register them all.
        below = cost[allowed]
        lo = int(below.max()) if below.shape[0] else 0
        above = cost[~allowed]
        hi = int(above.min()) if above.shape[0] else budget + 1
        hi = min(hi, self._horizon[state], budget + 256)  # bounded even when the horizon is NO_COMPLETION
        with self._lock:
            row = self._insert_row(mask)
            for b in range(lo, max(hi, budget + 1)):
                self._budget_rows[(state, b)] = row
        return row

    def _batchable_states(self, states: np.ndarray | None = None) -> np.ndarray:
        """Those of `states` (default: all, ascending) whose first byte leaves at most `_BATCH_MAX_FIRST` depth-1 trie
        nodes alive."""
        if states is None:
            states = np.arange(self._n_states)
        trie = self._trie
        if not trie.max_depth:
            return states
        first = self._byte_class[trie.node_byte[: trie.depth_start[1]]]  # (not `_cls_by_depth`: every node's class)
        keep = np.empty(states.shape[0], dtype=bool)
        for lo in range(0, states.shape[0], 4096):  # bounded temporaries: [4096, 256] gathers
            part = states[lo : lo + 4096].astype(np.int64)
            live = np.count_nonzero(self._tflat[(part * self._n_classes)[:, None] + first] >= 0, axis=1)
            keep[lo : lo + 4096] = live <= _BATCH_MAX_FIRST
        return states[keep]

    def _fill_ahead(self, frontier: np.ndarray) -> None:
        """Fill the missing rows of the structural states in `frontier` and after it (see `_AHEAD_LEVELS`)."""
        row_of = self._row_of
        left = _AHEAD_STATES
        for _ in range(_AHEAD_LEVELS):
            todo = [s for s in frontier.tolist() if row_of[s] < 0]
            if not todo:
                return
            todo_arr = self._batchable_states(np.asarray(todo, dtype=np.intp))[:left]
            if not todo_arr.shape[0]:
                return
            masks, dests = self._walk_batch(todo_arr)
            with self._lock:
                for i, s in enumerate(todo_arr.tolist()):
                    if row_of[s] < 0:
                        row_of[s] = self._insert_row(masks[i])
            left -= todo_arr.shape[0]
            if left <= 0:
                return
            frontier = np.unique(np.concatenate(dests)) if dests else np.zeros(0, np.intp)

    def _native_row(self, state: int) -> int:
        """Fill `state`'s row with the C walk (or as a remembered state's row, see `native.TrieWalker`); returns the
        row."""
        row_of = self._row_of
        words, key, _, same_as = self._walker.mask(state)
        row = row_of[same_as] if same_as >= 0 else -1
        if same_as >= 0 and row < 0:  # another thread has not inserted that state's row yet
            words, key, _, _ = self._walker.mask(state, share=False)
        with self._lock:
            if row_of[state] < 0:
                row_of[state] = row if row >= 0 else self._insert_row(words, key)
            return row_of[state]

    def _walk_batch(self, states: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """Masks and token destinations of many states in one sparse trie walk (the same as `_compute_mask` and
        `_destinations` one state at a time): the live nodes of all the states travel together, tagged by owner.

        Returns:
            `(masks, dests)`: int32 [len(states), n_words], and per state the sorted distinct DFA states its allowed
            non-EOS tokens lead to.
        """
        trie, tflat, n_classes = self._trie, self._tflat, self._n_classes
        k = int(states.shape[0])
        masks = np.zeros((k, self._n_words), dtype=np.uint32)
        owners: list[np.ndarray] = []
        ends_at: list[np.ndarray] = []  # DFA state after each live node that ends some token
        if trie.max_depth:
            states64 = states.astype(np.int64)
            first = tflat[(states64 * n_classes)[:, None] + self._cls_by_depth[0]]
            owner, node = np.nonzero(first >= 0)
            st = first[owner, node]
            node = node.astype(np.int64)
            live_nodes: list[np.ndarray] = []
            live_owner: list[np.ndarray] = []
            live_state: list[np.ndarray] = []
            for d in range(trie.max_depth):
                # the tokens ending at live nodes are read once after the walk: fewer numpy calls per depth
                live_nodes.append(node)
                live_owner.append(owner)
                live_state.append(st)
                if d + 1 == trie.max_depth:
                    break
                cnt = trie.child_count[node]
                has = cnt > 0
                if not has.all():
                    node, st, owner, cnt = node[has], st[has], owner[has], cnt[has]
                if not node.shape[0]:
                    break
                ends = cnt.cumsum()
                child = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(trie.child_start[node] - (ends - cnt), cnt)
                nxt = tflat[np.repeat(st * n_classes, cnt) + self._node_cls[child]]
                keep = nxt >= 0
                owner = np.repeat(owner, cnt)[keep]
                node, st = child[keep], nxt[keep]
            node = np.concatenate(live_nodes)
            tc = trie.term_count[node]
            term = tc > 0
            t_owner, t_node, t_count = np.concatenate(live_owner)[term], node[term], tc[term]
            if t_node.shape[0]:
                owners.append(t_owner)
                ends_at.append(np.concatenate(live_state)[term])
                ends = t_count.cumsum()
                pos = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(trie.term_start[t_node] - (ends - t_count), t_count)
                tok = trie.term_tokens[pos].astype(np.int64)
                np.bitwise_or.at(masks, (np.repeat(t_owner, t_count), tok >> 5), np.left_shift(np.uint32(1), (tok & 31).astype(np.uint32)))
        flat_bits = masks.view(np.uint8)  # little-endian words: bit t % 8 of byte t // 8 is token t
        if self._eos:
            acc = np.flatnonzero(self._accepting[states])
            for t in self._eos:
                flat_bits[acc, t >> 3] |= np.uint8(1 << (t & 7))
        pair_owner = list(owners)
        pair_dest = list(ends_at)
        if self._special_ids_arr.shape[0]:
            nxt = tflat[(states.astype(np.int64) * n_classes)[:, None] + self._special_cls_arr]
            s_owner, s_col = np.nonzero(nxt >= 0)
            for t, o in zip(self._special_ids_arr[s_col].tolist(), s_owner.tolist()):
                flat_bits[o, t >> 3] |= np.uint8(1 << (t & 7))
            pair_owner.append(s_owner)
            pair_dest.append(nxt[s_owner, s_col])
        dests: list[np.ndarray] = [np.zeros(0, np.intp)] * k
        if pair_owner:
            key = np.unique(np.concatenate(pair_owner).astype(np.int64) * (self._n_states + 1) + np.concatenate(pair_dest))
            own, dst = np.divmod(key, self._n_states + 1)
            bounds = np.searchsorted(own, np.arange(k + 1))
            dests = [dst[bounds[i] : bounds[i + 1]].astype(np.intp) for i in range(k)]
        return masks.view(np.int32), dests

    def _walk(self, state: int) -> _Walk:
        """The live trie nodes of one state, by walking the trie depth by depth.

        A depth is walked densely (every node: two gathers each) while many nodes stay alive, and sparsely (only the
        children of live nodes, a ragged expansion) once few do; a state where few first bytes survive therefore
        costs a handful of tiny numpy ops, and a string-content state costs about two gathers per trie node.

        Returns:
            `(dense, sparse, n_alive)`: `dense` holds `(depth, states, ok)` for densely walked depths (`states` the
            DFA state after every node of the depth, -1 dead; `ok = states >= 0`); `sparse` holds `(nodes, states)`,
            the live global node ids of a sparsely walked depth and their DFA states.
        """
        trie = self._trie
        tflat, n_classes = self._tflat, self._n_classes
        ds = trie.depth_start
        full = tflat[state * n_classes + self._cls_by_depth[0]] if trie.max_depth else None
        node = st = None
        dense: list[tuple[int, np.ndarray, np.ndarray]] = []
        sparse: list[tuple[np.ndarray, np.ndarray]] = []
        n_alive = 0
        for d in range(trie.max_depth):
            n_here = ds[d + 1] - ds[d]
            if full is not None:
                ok = full >= 0
                m = int(np.count_nonzero(ok))
                if m:
                    dense.append((d, full, ok))
            else:
                m = int(node.shape[0])
                sparse.append((node, st))
            n_alive += m
            if m == 0 or d + 1 == trie.max_depth:
                break
            # Dense costs ~3 passes over every node of the next depth; sparse ~10 passes over live children only.
            if m * _DENSE_RATIO >= n_here:
                if full is None:
                    full = np.full(n_here, -1, dtype=self._dtype)
                    full[node - ds[d]] = st
                full = tflat[full[self._parent_by_depth[d + 1]] * n_classes + self._cls_by_depth[d + 1]]
                continue
            if full is not None:
                local = np.flatnonzero(ok)
                st = full[local]
                node = local + ds[d]
                full = None
            cnt = trie.child_count[node]
            has = cnt > 0
            if not has.all():
                node, st, cnt = node[has], st[has], cnt[has]
            if not node.shape[0]:
                break
            ends = cnt.cumsum()  # the method: np.cumsum dispatch costs ~1.5 us a call, ~20 calls a walk
            # Ragged arange: the child ids of every live node, in order.
            child = np.arange(int(ends[-1]), dtype=np.intp) + np.repeat(trie.child_start[node] - (ends - cnt), cnt)
            nxt = tflat[np.repeat(st * n_classes, cnt) + self._node_cls[child]]
            keep = nxt >= 0
            node, st = child[keep], nxt[keep]
        return dense, sparse, n_alive

    def _compute_mask(self, state: int, walk: _Walk | None = None) -> np.ndarray:
        """The packed mask (int32 [n_words]) of one state (from `walk`, the state's `_walk`, when already done)."""
        trie = self._trie
        ds = trie.depth_start
        dense, sparse, n_alive = self._walk(state) if walk is None else walk
        allowed = np.zeros(self._n_words * 32, dtype=bool)
        if n_alive * _DENSE_RATIO >= trie.term_tokens.shape[0]:
            alive = np.zeros(trie.n_nodes, dtype=bool)
            for d, _, ok in dense:
                alive[ds[d] : ds[d + 1]] = ok
            for nodes, _ in sparse:
                alive[nodes] = True
            allowed[trie.term_tokens] = alive[trie.term_node]
        elif n_alive:
            nodes = np.concatenate([n for n, _ in sparse] + [np.flatnonzero(ok) + ds[d] for d, _, ok in dense])
            tc = trie.term_count[nodes]
            has = tc > 0
            nodes, tc = nodes[has], tc[has]
            if nodes.shape[0]:
                ends = tc.cumsum()
                pos = np.arange(int(ends[-1]), dtype=np.intp) + np.repeat(trie.term_start[nodes] - (ends - tc), tc)
                allowed[trie.term_tokens[pos]] = True
        if self._eos and self._accepting[state]:
            allowed[self._eos_arr] = True
        if self._special_ids_arr.shape[0]:
            live = self._tflat[state * self._n_classes + self._special_cls_arr] >= 0
            allowed[self._special_ids_arr[live]] = True
        return np.packbits(allowed, bitorder="little").view("<i4").astype(np.int32, copy=False)


# --------------------------------------------------------------------------------------------------------------------
# Per-sequence cursor


class TokenState:
    """The cursor of one sequence over a shared `TokenIndex`: the DFA state reached by the tokens fed so far.

    Small and cheap to fork; never share one between sequences. Made by `TokenIndex.start()`.
    """

    # `_count`/`_limit`: inside a counted string (`fa.counted_chars`), the characters written and the bound; limit -1
    # outside one. `_stack`: the container kinds a deep value spilled past the automaton's window (`fa.nested_values`),
    # innermost last; `_overrun`: a budgeted mask over deep values took a larger budget once (`_stack_row`).
    __slots__ = ("_index", "_state", "_finished", "_count", "_limit", "_stack", "_overrun")

    def __init__(self, index: TokenIndex, state: int, finished: bool = False, count: int = 0, limit: int = -1,
                 stack: tuple[int, ...] = (), overrun: bool = False):
        self._index = index
        self._state = state
        self._finished = finished
        self._count = count
        self._limit = limit
        self._stack = stack
        self._overrun = overrun

    @property
    def index(self) -> TokenIndex:
        """The index this cursor walks."""
        return self._index

    @property
    def dfa_state(self) -> int:
        """The current DFA state (after EOS: the accepting state EOS was taken in)."""
        return self._state

    def is_finished(self) -> bool:
        """Whether an EOS token has been fed (then only EOS ids are allowed)."""
        return self._finished

    def is_accepting(self) -> bool:
        """Whether the bytes fed so far form a complete match (always true once finished)."""
        return self._finished or self._index._acc_list[self._state]

    def _binding(self, budget: int | None) -> int | None:
        """`budget`, or None where it cannot bind a stacked cursor's mask: at or past `_bounds`' free_from plus one
        token for each container spilled or a token may open, every token's completion fits, so the mask is the
        unbudgeted one, cached across steps (a stack row keyed by each step's budget re-walked the deep tokens: ~90 us
        a step on Llama 3 against ~5 us)."""
        idx = self._index
        if budget is None or budget - len(self._stack) - idx._most_opened < (
                idx._free_from if idx._bound else idx._bounds()[1]):
            return budget
        return None

    def mask_row(self, budget: int | None = None) -> int:
        """The row of `index.mask_table()` that holds this cursor's mask under `budget` (computing it if needed).

        Raises:
            InternalError: `budget` is negative.
        """
        if budget is not None and budget < 0:
            raise InternalError(f"budget must be >= 0 tokens, got {budget}")
        idx = self._index
        if idx._stacked:
            budget = self._binding(budget)
        if idx._stacked and self._reads_stack(budget):
            return self._stack_row(budget)
        if self._limit >= 0 and self._limit - self._count <= idx._near[self._limit]:
            return idx._counted_row(self._state, self._limit - self._count, budget)
        return idx.row_for_state(idx._n_states if self._finished else self._state, budget)

    def _reads_stack(self, budget: int | None) -> bool:
        """Whether this cursor over deep values needs `_stack_row`: not finished, and something spilled, a budget, a
        counter, or a state whose deep tokens are not known to agree with its row."""
        return not self._finished and bool(self._stack or budget is not None or self._limit >= 0
                                           or not self._index._calm[self._state])

    def _stack_row(self, budget: int | None) -> int:
        """`mask_row` of a cursor over deep values: the budget less one token per spilled container (each still
        needs its closing bracket), deep tokens walked with the stack."""
        idx = self._index
        while True:
            left = None if budget is None else max(budget - len(self._stack), 0)
            if self._limit >= 0 and self._limit - self._count <= idx._near[self._limit]:
                base = idx._counted_row(self._state, self._limit - self._count, left)
            else:
                base = idx.row_for_state(self._state, left)
            row = idx._stack_row(base, self._state, self._stack, self._count, self._limit, budget)
            if (budget is None or idx._acc_list[self._state] or idx._row_words(row).any()
                    or not (self._stack or self._overrun
                            or idx._within(self._state, budget))):
                return row
            # The estimate ran out before the value could close: `min_tokens` is the automaton's, whose walk of a
            # token that opens past the window and closes back forgets the spilled kind (a shortcut the cursor, which
            # refills it, cannot take), and a refilled window may cost more to close than the one it replaced.
            # Continue under the least larger budget that leaves a token: the output may overrun its budget, and the
            # cursor remembers it did. (A budget below the automaton's own `min_tokens`, with nothing spilled and no
            # overrun before, keeps its empty mask, as without a stack.)
            self._overrun = True
            budget += 1

    def mask(self, budget: int | None = None) -> np.ndarray:
        """The packed mask of allowed next tokens: read-only int32 [n_words], bit `t % 32` of word `t // 32`.

        Args:
            budget: tokens still allowed to be generated, including this one (EOS not counted, see `TokenIndex`);
                None for no limit. At or above the state's `budget_horizon` this returns the unbudgeted row itself;
                the first budget asked of a lazy index builds its `min_tokens` table.

        Raises:
            InternalError: `budget` is negative.
        """
        if budget is not None and budget < 0:
            raise InternalError(f"budget must be >= 0 tokens, got {budget}")
        idx = self._index
        s = idx._n_states if self._finished else self._state
        if idx._background is not None and s != idx._start_state:
            idx._settle()
        if idx._stacked:
            budget = self._binding(budget)
        if idx._stacked and self._reads_stack(budget):
            return idx._row_words(self._stack_row(budget))
        if self._limit >= 0 and self._limit - self._count <= idx._near[self._limit]:
            return idx._row_words(idx._counted_row(s, self._limit - self._count, budget))
        if (budget is not None and budget < (idx._free_from if idx._bound else idx._bounds()[1])
                and not idx._free_at(s, budget)):
            return idx._row_words(idx._budget_row(s, budget))
        row = idx._row_of[s]
        if row < 0:
            row = idx.row_for_state(s)
        mask = idx._rows[row]
        return mask if mask is not None else idx._row_words(row)

    def fill_mask(self, out: np.ndarray, budget: int | None = None) -> None:
        """Write `mask(budget)` into `out`: the caller's int32 (or uint32) [n_words] buffer, C-contiguous and writable
        (one row of a batch's bitmask, as xgrammar's and llguidance's `fill_next_token_bitmask` take it).

        Most rows are written from a patch (the few words that differ from all 0 or all 1) instead of being copied: a
        row read for the first time then costs a few cache lines, not `4 * n_words` bytes.

        Raises:
            TypeError: `out` is not a buffer (a numpy array, say).
            ValueError: `out` is a buffer of another width, item size or layout, or read-only.
            InternalError: `budget` is negative.
        """
        idx = self._index
        s = self._state
        if idx._background is not None and (s != idx._start_state or self._finished):
            idx._settle()
        limit = self._limit
        # `mask`'s common case inline: no budget, no counter near its bound, nothing spilled
        if budget is None and not self._finished and (limit < 0 or limit - self._count > idx._near[limit]) and not (
                idx._stacked and (self._stack or limit >= 0 or not idx._calm[s])):
            row = idx._row_of[s]
            if row < 0:
                row = idx.row_for_state(s)
        else:
            row = self.mask_row(budget)
        if idx._fill_words is not None:
            patch = idx._patches[row]
            idx._fill_words(out, idx._row_words(row) if patch is None else patch)
            return
        if not isinstance(out, np.ndarray):
            raise TypeError(f"the mask buffer must be a numpy array (or another writable buffer where the extension "
                            f"is built), got {type(out).__name__}")
        if out.shape != (idx._n_words,) or out.dtype.itemsize != 4 or not out.flags.writeable:
            raise ValueError(f"the mask buffer must hold {idx._n_words} 4-byte words and be writable, got shape "
                             f"{out.shape} of {out.dtype}")
        np.copyto(out, idx._row_words(row).view(out.dtype))

    def allowed_token_ids(self, budget: int | None = None) -> np.ndarray:
        """The allowed next token ids under `budget` (as in `mask`), ascending (int64)."""
        bits = np.unpackbits(self.mask(budget).view(np.uint8), bitorder="little")
        return np.flatnonzero(bits)

    def fork(self) -> TokenState:
        """An independent copy at the same position (for beams and speculative branches)."""
        return TokenState(self._index, self._state, self._finished, self._count, self._limit, self._stack, self._overrun)

    __copy__ = fork

    def advance(self, token_id: int, budget: int | None = None) -> None:
        """Feed one token, in O(its byte length).

        Resolution order, matching the mask: a token named by the DFA takes its symbol's transition when live (and,
        under a budget, when the completion after it fits); else an EOS id in an accepting state finishes the
        sequence; else a byte token walks its bytes. Once finished, an EOS id is accepted and changes nothing.

        Args:
            token_id: the sampled token.
            budget: as in `mask`: tokens still allowed including this one. When given, the token is also checked
                against the budget (`min_tokens` of the state after it must be at most `budget - 1`; EOS is free).

        Raises:
            MaskViolation: the token is not allowed here (its bit in `mask(budget)` is 0). The cursor is unchanged.
                The error carries `token_id`, `token_bytes` (None for an id outside the tokenizer) and `dfa_state`.
            InternalError: `budget` is negative.
        """
        idx = self._index
        t = int(token_id)
        if ((budget is None or (idx._bound and budget >= idx._free_from)) and idx._quick_steps and not self._finished
                and 0 <= t < idx._n_tokens and t not in idx._non_byte and t not in idx._special_cls):
            # a byte token under no budget (or one at or past every state's bound: `_free_at`, `_fits` hold), the walk
            # in C; a walk that dies (or an empty token) takes the path below, which says why
            if idx._plain_steps:  # no counters
                s = idx._walk_step(self._state, idx._token_bytes[t])
                if s >= 0:
                    self._state = s
                    return
            elif data := idx._token_bytes[t]:  # counted strings and arrays, no deep values: every token counted
                s, count, limit, at, _ = idx._walk_counted(self._state, self._count, self._limit, data, ())
                if at < 0 and not (limit >= 0 and count == limit and idx._need_ticks()[s]):
                    self._state, self._count, self._limit = s, count, limit
                    return
        if budget is not None and budget < 0:
            raise InternalError(f"budget must be >= 0 tokens, got {budget}")
        if idx._stacked:
            budget = self._binding(budget)
        if self._finished:
            if t in idx._eos_set:
                return
            self._violation(t, "the sequence already ended with EOS")
        if not 0 <= t < idx._n_tokens:
            self._violation(t, f"id outside the tokenizer's {idx._n_tokens} tokens")
        s = self._state
        tr, k = idx._tr_view, idx._n_classes
        cls = idx._special_cls.get(t)
        nxt = -1 if cls is None else tr[s * k + cls]  # the grammar-named symbol's transition, -1 for none
        if nxt >= 0 and (budget is None or self._fits(nxt, budget)):
            self._state = nxt
            return
        if t in idx._eos_set:
            if idx._acc_list[s]:
                self._finished = True
                return
            if nxt < 0:
                self._violation(t, "EOS in a non-accepting state")
        if nxt >= 0:
            self._over_budget(t, nxt, budget)
        if t in idx._non_byte:
            self._violation(t, "a special token that the grammar does not allow here")
        data = idx._vocab.token_bytes[t]
        if not data:
            self._violation(t, "a token without bytes (an unused slot)")
        cl = idx._cls_list
        stack = self._stack
        counts = idx._counters is not None and (idx._quiet_bytes is None or idx._counts(t, data))
        if counts:
            s, count, limit, stack = self._counted_walk(t, data, s)
        elif idx._walk_step is not None and (nxt := idx._walk_step(s, data)) >= 0:
            s = nxt
        elif idx._stepper is not None and len(data) >= _C_STEP_BYTES:
            s = idx._stepper.plain(data, s)
            if s < 0:
                self._violation(t, f"the automaton dies on byte {data[-2 - s]:#04x}")
        else:  # (also where the walk in C died: this walk names the byte)
            for b in data:
                s = tr[s * k + cl[b]]
                if s < 0:
                    self._violation(t, f"the automaton dies on byte {b:#04x}")
        if not counts and self._count == self._limit and idx._need_ticks()[s]:  # (`_counted_walk`'s last check)
            self._violation(t, f"it ends where its counter needs a count that its bound ({self._limit}) leaves no "
                               f"room for")
        if budget is not None and idx._stacked:
            words = self.mask(budget)  # (deep values: the budgeted mask is the rule, see `_stack_row`)
            if not (int(words[t >> 5]) >> (t & 31)) & 1:
                self._violation(t, f"its completion does not fit a budget of {budget} tokens (this one included) with "
                                   f"{len(self._stack)} spilled containers to close")
        elif budget is not None and not self._fits(s, budget):
            self._over_budget(t, s, budget)
        self._state = s
        if counts:
            self._count, self._limit = count, limit
            self._stack = stack

    def _counted_walk(self, t: int, data: bytes, s: int) -> tuple[int, int, int, tuple[int, ...]]:
        """The byte walk of `advance` counting characters of counted strings and keeping deep values' stack:
        `(state, count, limit, stack)` after `data`."""
        idx = self._index
        if idx._walk_counted is not None:
            s, count, limit, at, stack = idx._walk_counted(s, self._count, self._limit, data, self._stack)
        elif idx._stepper is not None and len(data) >= _C_STEP_BYTES:
            s, count, limit, at, stack = idx._stepper.counted(data, s, self._count, self._limit, self._stack)
        else:
            spilled = list(self._stack) if idx._stacked else None
            s, count, limit, at = walk_counted(idx._tr_view, idx._n_classes, idx._cls_list, idx._eff_view,
                                               idx._limits, s, data, self._count, self._limit,
                                               idx._spill_view if idx._stacked else None,
                                               idx._refill_view if idx._stacked else None, spilled)
            stack = self._stack if spilled is None else tuple(spilled)
        if at >= 0:
            if 0 <= limit < count:
                self._violation(t, f"the text passes its counted bound of {limit} (maxLength characters or maxItems commas)")
            if idx._stacked and len(stack) >= MAX_SPILLED:
                before = walk_counted(idx._tr_view, idx._n_classes, idx._cls_list, idx._eff_view, idx._limits,
                                      self._state, data[:at], self._count, self._limit, idx._spill_view,
                                      idx._refill_view, list(self._stack))[0]
                if before >= 0 and idx._tr_view[before * idx._n_classes + idx._cls_list[data[at]]] >= 0:
                    self._violation(t, f"it opens a container past the {MAX_SPILLED} a free-form value may nest beyond "
                                       f"the automaton's window")
            self._violation(t, f"the automaton dies on byte {data[at]:#04x}")
        if limit >= 0 and count == limit and idx._need_ticks()[s]:
            self._violation(t, f"it ends inside a character that the string's maxLength ({limit}) leaves no room for")
        return s, count, limit, stack

    def _fits(self, state: int, budget: int) -> bool:
        idx = self._index
        return idx._within(state, budget - 1)

    def _over_budget(self, token_id: int, state: int, budget: int) -> None:
        need = self._index._min_of(state)
        left = "no completion" if need == NO_COMPLETION else f"at least {need} more tokens to go"
        self._violation(token_id, f"it leaves {left} with a budget of {budget} tokens (this one included)")

    def _violation(self, token_id: int, why: str) -> None:
        idx = self._index
        data = idx._vocab.token_bytes[token_id] if 0 <= token_id < idx._n_tokens else None
        err = MaskViolation(
            f"token {token_id} ({data!r}) is not allowed in DFA state {self._state}"
            f"{' (finished)' if self._finished else ''}: {why}"
        )
        err.token_id = token_id
        err.token_bytes = data
        err.dfa_state = self._state
        raise err
