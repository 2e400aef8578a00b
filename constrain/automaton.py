"""Byte automata: expressions over bytes (plus opaque special symbols) compiled to deterministic automata.

In: expression trees built with `literal`, `byte_set`, `chars`, `concat`, `union`, `repeat`, ...
Out: an immutable, trimmed `Dfa` whose alphabet is partitioned into symbol classes; minimal when determinised whole,
and built from minimal parts when large parts are glued side by side (see "Composition of compiled parts").
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from constrain import native as _native
from constrain.errors import InternalError, UnsupportedSchema

N_BYTES = 256
MAX_UNICODE = 0x10FFFF


class BudgetExceeded(UnsupportedSchema):
    """An automaton grew past its state budget or its compile deadline, or its compile was cancelled."""

    def __init__(self, message: str, *, pointer: str = ""):
        super().__init__(message, pointer=pointer, code="budget_exceeded")


class Deadline:
    """One compile's time limit and cancel flag, shared by every stage of that compile.

    While `active()` on a thread, every automaton compile (each schema's, the policy's) and every token-index build
    (the `min_tokens` table, eager fills) on that thread checks it where it checks its own deadline, and stops with
    `BudgetExceeded` (code `budget_exceeded`, the pointer of the part being compiled) once `expires_at` has passed
    or `cancel()` was called, from any thread. A stage's own budget (a schema's `timeout_s`) still applies inside it.

    Args:
        seconds: time allowed from now (None: no time limit, only `cancel()`).
        expires_at: a `time.monotonic()` instant instead of `seconds`.
    """

    def __init__(self, seconds: float | None = None, *, expires_at: float | None = None):
        if seconds is not None and expires_at is not None:
            raise InternalError(f"give seconds or expires_at, not both (got {seconds!r} and {expires_at!r})")
        self.expires_at = time.monotonic() + seconds if seconds is not None else expires_at
        self._cancelled = threading.Event()
        self._flag = ctypes.c_int32(0)  # the same, for the native passes to read

    def cancel(self) -> None:
        """Ask every compile under this deadline to stop at its next check (thread-safe, idempotent)."""
        self._cancelled.set()
        self._flag.value = 1

    @property
    def is_cancelled(self) -> bool:
        return self._cancelled.is_set()

    def is_expired(self) -> bool:
        """Cancelled, or past `expires_at`."""
        return self._cancelled.is_set() or (self.expires_at is not None and time.monotonic() > self.expires_at)

    def check(self, pointer: str = "") -> None:
        """Raise `BudgetExceeded` at `pointer` once cancelled or past `expires_at`."""
        if self._cancelled.is_set():
            raise BudgetExceeded("compilation was cancelled", pointer=pointer)
        if self.expires_at is not None and time.monotonic() > self.expires_at:
            raise BudgetExceeded("compilation exceeded its total time budget", pointer=pointer)

    def active(self) -> "_Active":
        """A context manager making this the deadline every compile on the current thread checks (nestable)."""
        return _Active(self)


_active = threading.local()


class _Active:
    def __init__(self, deadline: Deadline):
        self.deadline = deadline

    def __enter__(self) -> Deadline:
        stack = getattr(_active, "stack", None)
        if stack is None:
            stack = _active.stack = []
        stack.append(self.deadline)
        return self.deadline

    def __exit__(self, *exc: object) -> None:
        _active.stack.pop()


def active_deadlines() -> tuple[Deadline, ...]:
    """The deadlines active on the current thread, outermost first (empty when none)."""
    return tuple(getattr(_active, "stack", ()))


def native_limits(deadline: float | None, shared: Sequence[Deadline] | None = None
                  ) -> tuple[float | None, list[ctypes.c_int32]]:
    """For a native pass: the earliest of `deadline` and the `shared` deadlines' (default: the active ones), as a
    `time.monotonic()` instant (None if none), and the shared deadlines' cancel flags."""
    shared = active_deadlines() if shared is None else shared
    instants = [d for d in [deadline, *(x.expires_at for x in shared)] if d is not None]
    return (min(instants) if instants else None), [x._flag for x in shared]


def check_deadlines(pointer: str = "") -> None:
    """Raise `BudgetExceeded` at `pointer` when any deadline active on this thread is cancelled or past."""
    for deadline in getattr(_active, "stack", ()):
        deadline.check(pointer)


# ---------------------------------------------------------------------------
# Expressions
# ---------------------------------------------------------------------------


class Expr:
    """A regular language over bytes and special symbols. Immutable; hashed by identity (a Dfa by content)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True, eq=False)
class _Bytes(Expr):
    mask: int  # bit b set: byte b is in the set


@dataclass(frozen=True, slots=True, eq=False)
class _Special(Expr):
    symbol_id: int


@dataclass(frozen=True, slots=True, eq=False)
class _Concat(Expr):
    parts: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, eq=False)
class _Union(Expr):
    parts: tuple[Expr, ...]


@dataclass(frozen=True, slots=True, eq=False)
class _Repeat(Expr):
    body: Expr
    lo: int
    hi: int | None


@dataclass(frozen=True, slots=True, eq=False)
class _Intersect(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True, eq=False)
class _Difference(Expr):
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True, eq=False)
class _Substitute(Expr):
    body: Expr
    mapping: tuple[tuple[int, Expr], ...]


EMPTY: Expr = _Concat(())
NOTHING: Expr = _Union(())


_ONE_BYTE = tuple(_Bytes(1 << b) for b in range(N_BYTES))  # shared: a literal's parts are never told apart by identity


def literal(data: bytes) -> Expr:
    """Exactly the bytes `data`."""
    # (what `concat` of the bytes gives, without its loop: one byte alone, else their concatenation; required_50
    # writes ~530 literals a compile)
    if len(data) > 1:
        return _Concat(tuple(map(_ONE_BYTE.__getitem__, data)))
    return _ONE_BYTE[data[0]] if data else EMPTY


def byte_set(ranges: Iterable[tuple[int, int]]) -> Expr:
    """One byte in any of the inclusive `ranges` (0..255)."""
    mask = 0
    for lo, hi in ranges:
        if not 0 <= lo <= hi <= 255:
            raise ValueError(f"byte range must lie in 0..255 with lo <= hi, got ({lo}, {hi})")
        mask |= ((1 << (hi - lo + 1)) - 1) << lo
    return _Bytes(mask) if mask else NOTHING


def special(symbol_id: int) -> Expr:
    """One opaque extra symbol (a special token named by a grammar); never a byte."""
    return _Special(int(symbol_id))


def concat(*parts: Expr) -> Expr:
    """The parts one after another."""
    flat: list[Expr] = []
    for part in parts:
        kind = type(part)
        if kind is _Concat:
            flat.extend(part.parts)
        elif part is NOTHING:  # (the only empty union: `union` returns it)
            return NOTHING
        else:
            flat.append(part)
    if not flat:
        return EMPTY
    return flat[0] if len(flat) == 1 else _Concat(tuple(flat))


def union(*parts: Expr) -> Expr:
    """Any one of the parts."""
    flat: list[Expr] = []
    seen: set[Expr] = set()
    byte_mask = 0
    for part in parts:
        members = part.parts if isinstance(part, _Union) else (part,)
        for member in members:
            if isinstance(member, _Bytes):
                byte_mask |= member.mask
            elif member not in seen:
                seen.add(member)
                flat.append(member)
    if byte_mask:
        flat.insert(0, _Bytes(byte_mask))
    if not flat:
        return NOTHING
    if len(flat) == 1:
        return flat[0]
    return _Union(tuple(flat))


def optional(part: Expr) -> Expr:
    """`part` or nothing at all."""
    return union(EMPTY, part)


def repeat(part: Expr, lo: int, hi: int | None = None) -> Expr:
    """`lo` to `hi` copies of `part` (`hi=None`: unbounded). Bounded repetition stays linear in `hi`."""
    if lo < 0 or (hi is not None and hi < lo):
        raise ValueError(f"repeat bounds must satisfy 0 <= lo <= hi, got lo={lo}, hi={hi}")
    if hi == 0 or part == EMPTY:
        return EMPTY
    if part == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    if lo == 1 and hi == 1:
        return part
    return _Repeat(part, lo, hi)


def intersect(a: Expr, b: Expr) -> Expr:
    """Strings in both `a` and `b`."""
    if a == NOTHING or b == NOTHING:
        return NOTHING
    return a if a == b else _Intersect(a, b)


def difference(a: Expr, b: Expr) -> Expr:
    """Strings in `a` but not in `b`."""
    if a == NOTHING:
        return NOTHING
    if b == NOTHING:
        return a
    return _Difference(a, b)


def substitute(part: Expr, mapping: dict[int, Expr]) -> Expr:
    """Replace every byte `b` in `part`'s strings by the language `mapping[b]` (bytes not in it stay)."""
    if not mapping or part in (EMPTY, NOTHING):
        return part
    return _Substitute(part, tuple(sorted(mapping.items())))


def _utf8_ranges(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """Split the code points lo..hi (one encoded length, no surrogates) into byte-range sequences."""
    length = 1 if hi < 0x80 else 2 if hi < 0x800 else 3 if hi < 0x10000 else 4
    if length == 1:
        return [[(lo, hi)]]
    for i in range(1, length):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                return _utf8_ranges(lo, lo | m) + _utf8_ranges((lo | m) + 1, hi)
            if hi & m != m:
                return _utf8_ranges(lo, (hi & ~m) - 1) + _utf8_ranges(hi & ~m, hi)
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    return [list(zip(a, b))]


def chars(ranges: Iterable[tuple[int, int]]) -> Expr:
    """One Unicode scalar value in any inclusive code-point range, UTF-8 encoded; surrogates never match."""
    alternatives: list[Expr] = []
    for lo, hi in ranges:
        lo, hi = max(lo, 0), min(hi, MAX_UNICODE)
        for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)):
            for start, end in ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_UNICODE)):
                s, e = max(a, start), min(b, end)
                if s <= e:
                    for seq in _utf8_ranges(s, e):
                        alternatives.append(concat(*(byte_set([r]) for r in seq)))
    return union(*alternatives)


ANY_CHAR = chars([(0, MAX_UNICODE)])


def text_without(forbidden: bytes, alphabet: Expr = ANY_CHAR) -> Expr:
    """Any run of `alphabet` units that does not contain the bytes `forbidden` anywhere."""
    anything = repeat(alphabet, 0)
    return difference(anything, concat(repeat(byte_set([(0, 255)]), 0), literal(forbidden), repeat(byte_set([(0, 255)]), 0)))


# ---------------------------------------------------------------------------
# DFA
# ---------------------------------------------------------------------------


class Dfa(Expr):
    """A deterministic, trimmed automaton (minimal, or glued from minimal parts: see `compile`). Immutable; also
    usable as an expression.

    Symbols 0..255 are bytes; symbol 256+i is the opaque special symbol `specials[i]`.
    `transitions[s, class_of[symbol]]` is the next state or -1 (dead). Every state is reachable
    from `start` and can reach an accepting state, so any target other than -1 is live.
    """

    __slots__ = (
        "n_states", "start", "n_classes", "class_of", "specials", "transitions", "accepting", "_digest", "_rows", "_edges",
        "_contracted",
    )

    def __init__(self, transitions: np.ndarray, accepting: np.ndarray, class_of: np.ndarray, specials: tuple[int, ...], start: int = 0):
        self.transitions = np.ascontiguousarray(transitions, dtype=np.int32)
        self.accepting = np.ascontiguousarray(accepting, dtype=bool)
        self.class_of = np.ascontiguousarray(class_of, dtype=np.int32)
        self.specials = tuple(specials)
        self.start = int(start)
        self.n_states = int(self.transitions.shape[0])
        self.n_classes = int(self.transitions.shape[1])
        for array in (self.transitions, self.accepting, self.class_of):
            array.setflags(write=False)
        self._digest: str | None = None
        self._rows: list[list[int]] | None = None
        self._edges: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]] = {}
        self._contracted: tuple[Dfa, Counters | None] | None = None  # `contract_counters`, on first use

    def __getstate__(self):
        return (self.transitions, self.accepting, self.class_of, self.specials, self.start)

    def __setstate__(self, state):
        self.__init__(*state)

    @property
    def digest(self) -> str:
        """A stable content hash (sha256 hex)."""
        if self._digest is None:
            h = hashlib.sha256()
            h.update(np.array([self.start, self.n_states, self.n_classes, *self.specials], dtype=np.int64).tobytes())
            for array in (self.transitions, self.accepting, self.class_of):
                h.update(array.tobytes())
            self._digest = h.hexdigest()
        return self._digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dfa) and self.digest == other.digest

    def __repr__(self) -> str:
        return f"Dfa(n_states={self.n_states}, n_classes={self.n_classes}, specials={len(self.specials)})"

    @property
    def is_empty(self) -> bool:
        """True when the language is empty (no string is accepted)."""
        return self.n_states == 0

    def symbol_class(self, symbol: int) -> int:
        """The class of `symbol`, or -1 for a special symbol this automaton never uses."""
        return int(self.class_of[symbol]) if symbol < len(self.class_of) else -1

    def special_symbol(self, symbol_id: int) -> int:
        """The symbol number of the special `symbol_id`, or -1 if unused here."""
        try:
            return N_BYTES + self.specials.index(symbol_id)
        except ValueError:
            return -1

    def _edge_groups(self, special_symbols: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """Every transition as arrays `(src, dst, label, masks)`, sorted by source: transition g reads the symbols
        `masks[label[g]]`, its class's (a Python int over the symbol numbering in which special `i` is
        `special_symbols[i]`). Only the classes become Python ints. Cached: embedding one DFA many times (bounded
        repeats, an NFA built around it) reads it again."""
        groups = self._edges.get(special_symbols)
        if groups is None:
            masks = [0] * self.n_classes
            for symbol in range(N_BYTES):
                masks[self.class_of[symbol]] |= 1 << symbol
            for i, symbol in enumerate(special_symbols):
                masks[self.class_of[N_BYTES + i]] |= 1 << symbol
            src, label = np.nonzero(self.transitions >= 0)
            dst = self.transitions[src, label]
            groups = (src.astype(np.int32), dst.astype(np.int32), label.astype(np.int32), masks)
            self._edges[special_symbols] = groups
        return groups

    def _edge_lists(self, special_symbols: tuple[int, ...]) -> list[list[tuple[int, int]]]:
        """Per state, `(symbol mask, target)` with one mask per live target (`_edge_groups` as Python lists)."""
        src, dst, label, masks = self._edge_groups(special_symbols)
        edges: list[dict[int, int]] = [{} for _ in range(self.n_states)]
        for s, t, c in zip(src.tolist(), dst.tolist(), label.tolist()):
            edges[s][t] = edges[s].get(t, 0) | masks[c]
        return [[(m, t) for t, m in row.items() if m] for row in edges]

    def rows(self) -> list[list[int]]:
        """Transitions as nested Python lists (fast scalar stepping)."""
        if self._rows is None:
            self._rows = self.transitions.tolist()
        return self._rows

    def step(self, state: int, data: bytes) -> int:
        """The state after reading `data` from `state`, or -1 if the automaton dies."""
        rows, class_of = self.rows(), self.class_of
        for byte in data:
            if state < 0:
                return -1
            state = rows[state][class_of[byte]]
        return state

    def step_symbol(self, state: int, symbol: int) -> int:
        """The state after one symbol (byte or 256+i special), or -1."""
        if state < 0:
            return -1
        cls = self.symbol_class(symbol)
        return -1 if cls < 0 else int(self.transitions[state, cls])

    def matches(self, data: bytes) -> bool:
        """True when `data` is in the language (with counted strings: their bounds kept, see `counted_chars`)."""
        if self.is_empty:
            return False
        if has_counters(self):
            plain, counters = contract_counters(self)  # (cached on the automaton)
            stacked = counters.refill is not None
            stack: list[int] = []
            state = walk_counted(memoryview(plain.transitions.ravel()), plain.n_classes, plain.class_of[:N_BYTES].tolist(),
                                 memoryview(counters.effect.ravel()), counters.limits, plain.start, data, 0, -1,
                                 memoryview(counters.spill.ravel()) if stacked else None,
                                 memoryview(counters.refill.ravel()) if stacked else None, stack)[0]
            return state >= 0 and not stack and bool(plain.accepting[state])
        state = self.step(self.start, data)
        return state >= 0 and bool(self.accepting[state])


# ---------------------------------------------------------------------------
# Counted strings: a long `maxLength` kept by a counter beside the automaton
# ---------------------------------------------------------------------------
#
# A JSON string of at most N characters needs ~4N automaton states when unrolled (a Snowplow `maxLength: 65535` is
# over the 100k-state budget). `counted_chars` instead spells its characters as an unbounded loop with
# three marker symbols around and inside it: OPEN(n) after the opening quote (n: the characters allowed), TICK after
# each character, CLOSE after the closing quote. Markers are special symbols with negative ids (never tokens);
# every state that takes a marker takes nothing else, so `contract_counters` folds each marker into the byte
# transition before it: the plain automaton (the loop unbounded) plus an effect per transition, which a cursor
# applies to a count. A product (`intersect`, `difference`) of an automaton with markers would compare marker
# spellings, not strings, unless one side has none (it then reads the other's markers as no-ops: a format's
# automaton intersected with a counted string); else it raises `CountedProduct` and the caller compiles without
# counters instead.

MARK_TICK = -2
MARK_CLOSE = -3
_MARK_OPEN_BASE = -(1 << 40)  # OPEN(n) is _MARK_OPEN_BASE - n
# Effects of a contracted transition.
EFFECT_NONE, EFFECT_TICK, EFFECT_CLOSE, EFFECT_OPEN = 0, 1, 2, 3  # OPEN(limits[i]) is EFFECT_OPEN + i


class CountedProduct(UnsupportedSchema):
    """A product of automata that both hold counted strings, or that subtracts one that does (internal: the schema
    compiler retries without counters)."""


def counted_chars(limit: int, char: Expr) -> Expr:
    """At most `limit` repetitions of `char` (one character each), with the markers a cursor counts them by: the
    content of a counted string, whose closing delimiter `counted_close` must follow. What precedes must leave
    nothing else possible (an opening quote), and `char` may not spell the closing delimiter."""
    return concat(counted_open(limit), repeat(concat(char, counted_tick()), 0))


def counted_close() -> Expr:
    """The marker right after a counted string's (or array's) closing delimiter."""
    return special(MARK_CLOSE)


def counted_open(limit: int) -> Expr:
    """The marker that opens a counter (after a counted array's bracket, a counted string's quote): at most `limit`
    ticks (`counted_tick`) follow before `counted_close`. What precedes must leave nothing else possible."""
    if limit < 0:
        raise InternalError(f"a counter's limit must be >= 0, got {limit}")
    return special(_MARK_OPEN_BASE - limit)


def counted_tick() -> Expr:
    """The marker of one count: after a counted string's character, after a counted array's separating comma (before
    any whitespace)."""
    return special(MARK_TICK)


def has_markers(expr: Expr) -> bool:
    """Whether `expr` spells counted-string or counted-array markers (`measure`'s walk of the tree)."""
    return measure(expr)[2]


NO_TEXT = 1 << 62  # `shortest_text` of a language without strings


def shortest_text(expr: Expr) -> int:
    """A lower bound on the bytes of the strings of `expr` (`measure`'s walk of the tree): exact for bytes,
    concatenations, unions, repetitions and automata without special symbols; the larger side's bound for an
    intersection, the first operand's for a difference, 0 for an automaton with special symbols or a substitution;
    NO_TEXT where there is no string."""
    return measure(expr)[1]


def measure(expr: Expr) -> tuple[int, int, bool]:
    """`(size(expr), shortest_text(expr), has_markers(expr))` in one walk of the tree, memoised by identity (three
    separate walks took 0.33 ms on an item of 5 tool calls, this one ~0.1 ms). Its size is `_size`'s estimate, written
    again here so that one walk gives all three (`_size` keeps its own memo for the compiler's part sizes)."""
    return _measure(expr, {})


def _measure(expr: Expr, memo: dict[int, tuple[int, int, bool]]) -> tuple[int, int, bool]:
    hit = memo.get(id(expr))
    if hit is not None:
        return hit
    if isinstance(expr, _Bytes):
        return 1, 1 if expr.mask else NO_TEXT, False
    if isinstance(expr, _Special):
        out = (1, 0, expr.symbol_id < 0)
    elif isinstance(expr, (_Concat, _Union)):
        size, short, markers = 1, 0 if isinstance(expr, _Concat) else NO_TEXT, False
        concat = isinstance(expr, _Concat)
        for p in expr.parts:
            if type(p) is _Bytes:
                size += 1
                n = 1 if p.mask else NO_TEXT
            else:
                ps, n, pm = _measure(p, memo)
                size += ps
                markers = markers or pm
            short = short + n if concat else min(short, n)
        out = (size, min(short, NO_TEXT), markers)
    elif isinstance(expr, Dfa):
        if expr.is_empty:
            short = NO_TEXT
        elif expr.specials:
            short = 0
        else:
            d = int(shortest_distances(expr)[expr.start])
            short = NO_TEXT if d == np.iinfo(np.int64).max else d
        out = (expr.n_states, short, any(sid < 0 for sid in expr.specials))
    elif isinstance(expr, _Repeat):
        size, short, markers = _measure(expr.body, memo)
        copies = expr.lo + (1 if expr.hi is None else expr.hi - expr.lo)
        out = (1 + size * copies, 0 if expr.lo == 0 else min(short * expr.lo, NO_TEXT), markers)
    elif isinstance(expr, (_Intersect, _Difference)):
        (a_size, a_short, a_markers), (b_size, b_short, b_markers) = _measure(expr.a, memo), _measure(expr.b, memo)
        short = max(a_short, b_short) if isinstance(expr, _Intersect) else a_short
        out = (a_size + b_size, short, a_markers or b_markers)
    elif isinstance(expr, _Substitute):
        parts = [_measure(expr.body, memo)] + [_measure(e, memo) for _, e in expr.mapping]
        out = (sum(m[0] for m in parts), 0, any(m[2] for m in parts))
    else:
        raise TypeError(f"not an automaton expression: {expr!r}")
    memo[id(expr)] = out
    return out


def size(expr: Expr) -> int:
    """An estimate of the automaton `expr` builds (`_size`: symbol edges; a compiled part counts its states)."""
    return _size(expr, {})


def counter_tick_bytes(dfa: "Dfa", counters: "Counters") -> list[np.ndarray]:
    """Per bound `counters.limits[i]`: the bytes (bool [256]) whose transitions tick inside a counter with that bound
    (`dfa`: the contracted automaton). A counted string ticks on the bytes that end a character, a counted array on
    its comma only, so a token of this vocabulary ticks at most as often as it holds such bytes."""
    trans = np.asarray(dfa.transitions)
    effect = counters.effect
    class_of = np.asarray(dfa.class_of)[:N_BYTES]
    n = trans.shape[0]
    live = trans >= 0
    ticks = (effect == EFFECT_TICK) & live
    if len(counters.limits) == 1:  # every tick is one of its counters' (the search below: 1.8 ms under the profiler on 400 states)
        return [ticks.any(axis=0)[class_of]]
    inside = ((effect == EFFECT_NONE) | (effect == EFFECT_TICK)) & live  # closing and opening transitions leave
    out = []
    for i in range(len(counters.limits)):
        opened = trans[(effect == EFFECT_OPEN + i) & live]
        seen = np.zeros(n, bool)
        seen[opened] = True
        frontier = np.unique(opened)
        while frontier.size:  # the states inside counters of this bound
            nxt = trans[frontier][inside[frontier]]
            nxt = np.unique(nxt[~seen[nxt]])
            seen[nxt] = True
            frontier = nxt
        out.append(ticks[seen].any(axis=0)[class_of])
    return out


def has_counters(dfa: Dfa) -> bool:
    """Whether `dfa` holds counted strings (marker symbols)."""
    return any(sid < 0 for sid in dfa.specials)


@dataclass(frozen=True, eq=False)
class Counters:
    """The counters and stack of a contracted automaton: `effect[s, c]` (int8) is what the transition on class c from
    state s does to the count (EFFECT_*), `limits[i]` the bound of OPEN effect `EFFECT_OPEN + i`. With deep values
    (`nested_values`): `spill[s, c]` is 1 + the container kind that transition pushes on the cursor's stack (0: none),
    `refill[s, k]` the state the cursor moves to from `s` when it takes kind k back off the stack (-1: none), and
    `window` the fewest container kinds any of them keeps in its states; else those are None and 0."""

    effect: np.ndarray
    limits: tuple[int, ...]
    spill: np.ndarray | None = None
    refill: np.ndarray | None = None
    window: int = 0


def walk_counted(table, n_classes: int, class_of, effect, limits: tuple[int, ...], state: int, data: bytes,
                 count: int, limit: int, spill=None, refill=None, stack: list[int] | None = None) -> tuple[int, int, int, int]:
    """`data` read from `state` of a contracted automaton, counting its counted strings: `table` and `effect` are its
    transitions and their effects flat (`state * n_classes + class`), `class_of` each byte's class; `count`/`limit`
    the count so far and the bound (-1: outside a counted string). Returns `(state, count, limit, at)`: `at` is the
    index of the byte where the walk died or passed a bound (then `state` is -1), else -1. Ending inside a character
    that the bound leaves no room for is not checked here (`TokenIndex` knows which states are).

    With deep values (`nested_values`): `spill` (flat like `effect`) and `refill` (flat, `state * 2 + kind`) from
    `Counters`; `stack` (the kinds spilled so far, innermost last) is updated in place, refills taken as soon as a
    state offers them; a spill onto a stack of `MAX_SPILLED` kinds dies."""
    for at, byte in enumerate(data):
        x = state * n_classes + class_of[byte]
        state = table[x]
        if state < 0:
            return -1, count, limit, at
        e = effect[x]
        if e == EFFECT_TICK:
            count += 1
            if 0 <= limit < count:
                return -1, count, limit, at
        elif e == EFFECT_CLOSE:
            limit = -1
        elif e:
            count, limit = 0, limits[e - EFFECT_OPEN]
        if spill is not None:
            k = spill[x]
            if k:
                if len(stack) >= MAX_SPILLED:
                    return -1, count, limit, at
                stack.append(k - 1)
            elif stack and refill[2 * state] >= 0:
                state = refill[2 * state + stack.pop()]
    return state, count, limit, -1


_INTO_MARK = 1 << 30  # (state ids stay far below: the state budget)


def contract_counters(dfa: Dfa) -> tuple[Dfa, Counters | None]:
    """`dfa` without its marker symbols (see `counted_chars`) and the effects they leave on the transitions before
    them; `(dfa, None)` when it has none.

    Raises:
        UnsupportedSchema: a state takes a marker and something else (a counted string beside another alternative
            that starts alike, e.g. two strings in one `anyOf`): the markers cannot be folded.
        InternalError: the markers break what `counted_chars` promises (one after another, or at the start).
    """
    if dfa._contracted is not None:
        return dfa._contracted
    marks = [(i, sid) for i, sid in enumerate(dfa.specials) if sid < 0]
    if not marks or dfa.is_empty:
        return dfa, None
    trans = np.asarray(dfa.transitions)
    class_of = np.asarray(dfa.class_of)
    n = trans.shape[0]
    keep_symbols = np.concatenate([np.arange(N_BYTES), N_BYTES + np.flatnonzero(np.asarray(dfa.specials) >= 0)])
    plain_cols = set(np.unique(class_of[keep_symbols]).tolist())
    stack_of = {i: _stack_marker_of(sid) for i, sid in marks}  # (window, code) of the stack markers, else None
    windows = [m[0] for m in stack_of.values() if m is not None]
    if windows:
        trans = trans.copy()  # (its refill columns are cut below)
    # REFILL markers are transitions the cursor takes itself: read into `refill`, then cut from the table
    refill = np.full((n, 2), -1, np.int64) if windows else None
    for i, m in stack_of.items():
        if m is not None and m[1] >= 2:
            cls = int(class_of[N_BYTES + i])
            if cls in plain_cols:
                if (trans[:, cls] >= 0).any():
                    raise InternalError("a refill marker shares its symbol class with another symbol")
                continue  # (never taken)
            refill[:, m[1] - 2] = trans[:, cls]
            trans[:, cls] = -1
    marks = [(i, sid) for i, sid in marks if stack_of[i] is None or stack_of[i][1] < 2]
    limits = sorted({_MARK_OPEN_BASE - sid for _, sid in marks if sid <= _MARK_OPEN_BASE})
    code_of_class: dict[int, int] = {}
    for i, sid in marks:
        if stack_of[i] is not None:  # SPILL(kind): an effect like a counter's, told apart by its sign
            code = -1 - stack_of[i][1]
        else:
            code = EFFECT_TICK if sid == MARK_TICK else EFFECT_CLOSE if sid == MARK_CLOSE else EFFECT_OPEN + limits.index(_MARK_OPEN_BASE - sid)
        cls = int(class_of[N_BYTES + i])
        if cls in plain_cols or code_of_class.get(cls, code) != code:
            if (trans[:, cls] >= 0).any():
                raise InternalError("a counted-string marker shares its symbol class with another symbol")
            continue  # a marker never taken (its class is the dead one)
        code_of_class[cls] = code
    mark_cols = np.asarray(sorted(code_of_class), np.int64)
    live_mark = trans[:, mark_cols] >= 0 if len(mark_cols) else np.zeros((n, 0), bool)
    marked = live_mark.any(axis=1)
    at_marks = np.flatnonzero(marked)  # (few: the other states' plain columns are not read)
    if (live_mark[at_marks].sum(axis=1) > 1).any() or dfa.accepting[at_marks].any() or (
            trans[at_marks][:, sorted(plain_cols)] >= 0).any():
        raise UnsupportedSchema("a string with a long maxLength (counted) lies beside another alternative that starts "
                                "alike; the counter cannot be kept")
    # each marked state: the state after its marker, and that marker's effect
    after = np.full(n, -1, np.int64)
    code = np.zeros(n, np.int8)
    rows, cols = np.nonzero(live_mark)
    after[rows] = trans[rows, mark_cols[cols]]
    code[rows] = [code_of_class[int(mark_cols[c])] for c in cols]
    if marked[after[marked]].any():
        raise InternalError("two counted-string markers follow each other")
    if marked[dfa.start]:
        raise InternalError("an automaton may not start with a counted-string marker")
    kept = np.flatnonzero(~marked)
    if n >= _INTO_MARK:
        raise InternalError(f"{n} states: too many to flag transitions into markers")
    new_id = np.full(n, -1, np.int64)
    new_id[kept] = np.arange(len(kept))
    # one gather through a lookup table indexed by the old target (-1, dead, reads the extra last entry): a
    # transition into a marked state goes on to the state after its marker, flagged by _INTO_MARK added, and takes
    # the marker's effect (read off the few flagged entries)
    goes_to = np.append(new_id, -1).astype(np.int32)
    goes_to[rows] = new_id[after[rows]] + _INTO_MARK
    kept_trans = trans[kept]  # (kept states take no marker: their marker columns are -1 already)
    table = goes_to[kept_trans]
    flat = table.ravel()
    hit = np.flatnonzero(flat >= _INTO_MARK)
    codes = code[kept_trans.ravel()[hit]]
    flat[hit] -= _INTO_MARK
    effect = np.zeros(table.shape, np.int8)
    specials = tuple(sid for sid in dfa.specials if sid >= 0)
    new_class_of = class_of[keep_symbols]
    plain = Dfa(table, dfa.accepting[kept], new_class_of, specials, int(new_id[dfa.start]))
    spill = None
    if windows:
        spill = np.zeros(kept_trans.shape, np.int8)
        pushes = codes < 0
        spill.ravel()[hit[pushes]] = -codes[pushes]  # -1 - kind -> 1 + kind
        codes[pushes] = EFFECT_NONE
        refill = refill[kept]
        live = refill >= 0
        refill[live] = new_id[refill[live]]
        if (refill[live] < 0).any():
            raise InternalError("a refill marker leads to a marked state")
    effect.ravel()[hit] = codes
    dfa._contracted = (plain, Counters(effect, tuple(limits), spill, refill, min(windows, default=0)))
    return dfa._contracted


# ---------------------------------------------------------------------------
# Deep values: a window of container kinds in the automaton, the rest on the cursor's stack
# ---------------------------------------------------------------------------
#
# A free-form JSON value nests arrays and objects without bound, which no finite automaton holds. `nested_values`
# keeps the innermost `window` container kinds in its states. Opening one more drops the outermost kind of the window
# from the states and spells the marker SPILL(kind) after the bracket: the cursor pushes that kind on a stack. A
# closing bracket that leaves the window one short of full leads to a state with REFILL(kind) transitions: when its
# stack is not empty, the cursor takes the one of the kind on top of it (at once, in the middle of a token too), so
# the window is full whenever the stack holds anything. REFILL transitions are never tokens; `contract_counters`
# cuts them from the table into `Counters.refill`.
#
# Masks stay the automaton's rows for every token holding fewer than `window` closing brackets: from a state with a
# full window it cannot close the whole window, and with an empty stack the window is the whole nesting, so the top
# kinds it closes are the ones the states know. The few tokens with more (at window 3: 2 in Phi-3, 9 in Llama 3 and
# Qwen3, 24 in Gemma 4: `}}}`, `']]],\n`) are walked with the stack by the index (`TokenIndex._stack_row`).

STACK_ARR, STACK_OBJ = 0, 1
# The most container kinds a cursor keeps on its stack: a token that would spill one more is not allowed, so a deep
# value nests at most this many levels beyond the window (and the output stays readable by parsers that recurse per
# level: Python's `json.loads` fails past ~1,000, and `parse.parse_output` reads every call's arguments with it).
MAX_SPILLED = 128
_MARK_STACK_BASE = -(1 << 20)  # marker `_MARK_STACK_BASE - 4 * window - code`; code 0/1 SPILL(kind), 2/3 REFILL(kind)


def _stack_marker_of(sid: int) -> tuple[int, int] | None:
    """(window, code) of a stack marker id, else None."""
    if not _MARK_OPEN_BASE < sid <= _MARK_STACK_BASE:
        return None
    window, code = divmod(_MARK_STACK_BASE - sid, 4)
    return window, code


def nested_values(window: int, scalar: Expr, key: Expr, item_sep: Expr, member_sep: Expr) -> Expr:
    """JSON values nested to any depth: `scalar` values, arrays of values between `[` `]` separated by `item_sep`,
    objects of `key` (a member's key and colon) value pairs between `{` `}` separated by `member_sep`; the innermost
    `window` (>= 2) container kinds kept in states, deeper ones on the cursor's stack (see above)."""
    if window < 2:
        raise InternalError(f"a stack window holds at least 2 container kinds, got {window}")
    SCALAR, KEY, ISEP, MSEP = 1, 2, 3, 4  # placeholder bytes, substituted at the end
    close = {STACK_ARR: ord("]"), STACK_OBJ: ord("}")}
    symbols = [SCALAR, KEY, ISEP, MSEP, ord("["), ord("]"), ord("{"), ord("}")]
    specials = tuple(sorted(_MARK_STACK_BASE - 4 * window - code for code in range(4)))
    col = {b: 1 + i for i, b in enumerate(symbols)}  # column 0: every other symbol (dead)
    for code in range(4):
        col[("mark", code)] = 1 + len(symbols) + specials.index(_MARK_STACK_BASE - 4 * window - code)
    n_cols = 1 + len(symbols) + len(specials)
    ids: dict[tuple, int] = {}
    rows: list[list[int]] = []
    todo: list[tuple] = []

    def to(node: tuple) -> int:
        if node not in ids:
            ids[node] = len(rows)
            rows.append([-1] * n_cols)
            todo.append(node)
        return ids[node]

    def after(w: tuple) -> tuple:  # where a value written inside the containers `w` (outermost first) leaves
        return (w, "after") if w else ((), "done")

    def value_moves(w: tuple) -> list[tuple]:
        moves = [(SCALAR, after(w))]
        for byte, kind in ((ord("["), STACK_ARR), (ord("{"), STACK_OBJ)):
            inner = (w + (kind,))[-window:]
            moves.append((byte, (inner, "open") if len(w) < window else ("spill", w[0], inner)))
        return moves

    to(((), "value"))
    while todo:
        node = todo.pop()
        row = rows[ids[node]]
        if node[0] == "spill":  # after the bracket: the marker that pushes the dropped kind
            _, kind, inner = node
            row[col[("mark", kind)]] = to((inner, "open"))
            continue
        w, pos = node
        top = w[-1] if w else None
        moves: list[tuple] = []
        if pos == "value":
            moves = value_moves(w)
        elif pos == "open":
            moves = [(close[top], after(w[:-1]))] + (value_moves(w) if top == STACK_ARR else [(KEY, (w, "value"))])
        elif pos == "after":
            moves = [(close[top], after(w[:-1])), (ISEP, (w, "value")) if top == STACK_ARR else (MSEP, (w, "key"))]
            if len(w) == window - 1:  # a closing bracket may have left the window one short: refills
                moves += [(("mark", 2 + k), after((k,) + w)) for k in (STACK_ARR, STACK_OBJ)]
        elif pos == "key":
            moves = [(KEY, (w, "value"))]
        for symbol, target in moves:
            row[col[symbol]] = to(target)
    class_of = np.zeros(N_BYTES + len(specials), np.int32)
    for b in symbols:
        class_of[b] = col[b]
    for code in range(4):
        class_of[N_BYTES + specials.index(_MARK_STACK_BASE - 4 * window - code)] = col[("mark", code)]
    accepting = np.zeros(len(rows), bool)
    accepting[ids[((), "done")]] = True
    skeleton = Dfa(np.array(rows, np.int32), accepting, class_of, specials, 0)
    return substitute(skeleton, {SCALAR: scalar, KEY: key, ISEP: item_sep, MSEP: member_sep})


_EMPTY_LANGUAGE = None


def _empty_dfa() -> Dfa:
    global _EMPTY_LANGUAGE
    if _EMPTY_LANGUAGE is None:
        _EMPTY_LANGUAGE = Dfa(np.zeros((0, 1), np.int32), np.zeros(0, bool), np.zeros(N_BYTES, np.int32), ())
    return _EMPTY_LANGUAGE


# ---------------------------------------------------------------------------
# Compilation: expression -> NFA -> DFA -> trimmed, minimised DFA
# ---------------------------------------------------------------------------


class _Budget:
    def __init__(self, max_states: int, deadline: float | None, pointer: str, pointers: dict[int, str] | None = None):
        self.max_states = max_states
        self.deadline = deadline
        self.pointer = pointer
        # id(sub-expression) -> its JSON Pointer: a budget error names the innermost one it was building (see `_at`)
        self.pointers = pointers or {}
        self.shared = active_deadlines()  # the whole compile's deadlines (`Deadline.active`), read once per compile
        self._ticks = 0
        self._next_check = 64
        # the largest size checked so far: a shared compiled DFA remembers the peak its build needed (see `_compile`)
        self.peak = 0

    def check(self, n_states: int) -> None:
        if n_states > self.peak:
            self.peak = n_states
        if n_states > self.max_states:
            raise BudgetExceeded(f"automaton exceeds the state budget of {self.max_states} states", pointer=self.pointer)
        self.tick()

    def tick(self, units: int = 1) -> None:
        """Count `units` of work (one: an NFA node, a DFA state built or expanded, 64 NFA nodes of a closure); read
        the clock every 64."""
        self._ticks += units
        if self._ticks >= self._next_check:
            self._next_check = self._ticks + 64
            self.check_time()

    def native_limits(self) -> tuple[float | None, list[ctypes.c_int32]]:
        """For a native pass: the earliest deadline (a `time.monotonic()` instant, None if none) and the cancel
        flags of the active `Deadline`s."""
        return native_limits(self.deadline, self.shared)

    def native_stopped(self, status: int) -> None:
        """Raise the error a native pass stopped with (`constrain.native.DET_*`)."""
        if status == _native.DET_STATES:
            self.check(self.max_states + 1)
        self.check_time()
        raise BudgetExceeded("automaton compilation exceeded its time budget", pointer=self.pointer)

    def check_time(self) -> None:
        """Raise once the deadline has passed; called directly between coarse steps (a refinement round)."""
        # Between two reads of the clock there is at most 64 units of work or one numpy pass over the automaton
        # (a compile seen at 30 s under a 10 s budget on a loaded machine read the clock every 256 units only).
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise BudgetExceeded("automaton compilation exceeded its time budget", pointer=self.pointer)
        for deadline in self.shared:
            deadline.check(self.pointer)


class _Nfa:
    """Thompson NFA; edges carry symbol masks (Python ints over the global alphabet).

    Kept flat, in the order added: epsilon moves `eps_src[i] -> eps_dst[i]`, symbol edges `edge_src[i] -> edge_dst[i]`
    reading mask number `edge_mask[i]` (`mask_ids`: mask -> number, in order of first use). The native subset
    construction takes them as arrays as they are (per-node lists cost `required_50` 4 ms to flatten)."""

    def __init__(self, specials: tuple[int, ...], budget: _Budget, memo: _Memo):
        self.specials = specials
        self.special_symbol = {sid: N_BYTES + i for i, sid in enumerate(specials)}
        self.n_nodes = 0
        self.eps_src: list[int] = []
        self.eps_dst: list[int] = []
        self.edge_src: list[int] = []
        self.edge_mask: list[int] = []
        self.edge_dst: list[int] = []
        self.mask_ids: dict[int, int] = {}
        self.budget = budget
        self.memo = memo  # for the sub-automata compiled on the way
        # (expr, dst) -> entry node: a sub-expression reached again with the same continuation is
        # built once (expressions are DAGs; suffix sharing keeps the NFA linear in the DAG's size)
        self.entries: dict[tuple[int, int], int] = {}
        # (suffix id, dst) -> the node a concatenation's remaining parts start from (see `_build`)
        self.suffix_ids: dict[tuple[int, int], int] = {}
        self.suffix_entries: dict[tuple[int, int], int] = {}
        self.suffixes_of: dict[int, list[int]] = {}  # id(concatenation) -> the suffix id before each of its parts
        self.loops_of: dict[int, dict[int, tuple[int, Expr]]] = {}  # id(concatenation) -> `_loops_of`
        # embedded DFAs kept as arrays, `(first node, _edge_groups)`, for the native subset construction; None
        # without it (the Python one reads the flat lists only)
        self.blocks: list[tuple[int, tuple]] | None = [] if _native.automata() is not None else None

    def node(self) -> int:
        n = self.n_nodes
        self.n_nodes = n + 1
        self.budget.check(self.n_nodes // 4)
        return n

    def _eps(self, src: int, dst: int) -> None:
        self.eps_src.append(src)
        self.eps_dst.append(dst)

    def _edge(self, src: int, mask: int, dst: int) -> None:
        mask_id = self.mask_ids.get(mask)
        if mask_id is None:
            mask_id = self.mask_ids[mask] = len(self.mask_ids)
        self.edge_src.append(src)
        self.edge_mask.append(mask_id)
        self.edge_dst.append(dst)

    def build(self, expr: Expr, src: int, dst: int) -> None:
        """Add paths from src to dst that spell exactly `expr`."""
        if isinstance(expr, _Bytes):
            self._edge(src, expr.mask, dst)
            return
        self._eps(src, self._entry(expr, dst))

    def _entry(self, expr: Expr, dst: int) -> int:
        """The node `expr` is spelt from towards dst, built on first use (`entries`)."""
        key = (id(expr), dst)
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = self.node()
            self._build_entry(expr, entry, dst)
        return entry

    def _build_entry(self, expr: Expr, entry: int, dst: int) -> None:
        """Build `expr` from its entry node towards dst (`entries`), once."""
        try:
            self._build(expr, entry, dst)
        except BudgetExceeded as err:
            _at(err, expr, self.budget)
            raise

    def _build(self, expr: Expr, src: int, dst: int) -> None:
        if isinstance(expr, _Bytes):
            self._edge(src, expr.mask, dst)
        elif isinstance(expr, _Special):
            self._edge(src, 1 << self.special_symbol[expr.symbol_id], dst)
        elif isinstance(expr, _Concat):
            parts = expr.parts
            if not parts:
                self._eps(src, dst)
                return
            # The node before each suffix of the parts is shared by every concatenation that ends in the same
            # parts towards the same dst: `a x rest` and `b x rest` (an optional object member written with and
            # without its comma) build `x` once. A suffix is named by interned (id(part), id of the suffix after it).
            before = self.suffixes_of.get(id(expr))
            if before is None:
                suffix = -1
                before = [0] * len(parts)
                for i in range(len(parts) - 1, 0, -1):
                    suffix = self.suffix_ids.setdefault((id(parts[i]), suffix), len(self.suffix_ids))
                    before[i] = suffix
                self.suffixes_of[id(expr)] = before
                loops = _loops_of(parts)
                if loops:
                    self.loops_of[id(expr)] = loops
            loops = self.loops_of.get(id(expr), _NO_LOOPS)
            entries, mask_ids = self.suffix_entries, self.mask_ids
            edge_src, edge_mask, edge_dst = self.edge_src, self.edge_mask, self.edge_dst
            n = len(parts)
            # the node before the last part is that part's entry towards dst (`_entry`), when it has one: `y x*` and
            # a bare `x*` (an object's extra members after a declared one, and with none) loop on one node
            last_entry = n > 1 and type(parts[-1]) is not _Bytes
            fresh = 0
            cur, i = src, 0
            while True:
                loop = loops.get(i)
                end = i + (loop[0] if loop is not None else 1)  # the parts this step spells: [i, end)
                shared = False
                if end == n:
                    nxt = dst
                else:
                    if last_entry and end == n - 1:
                        key, table = (id(parts[-1]), dst), self.entries
                    else:
                        key, table = (before[end], dst), entries
                    nxt = table.get(key)
                    shared = nxt is not None
                    if not shared:
                        # a new node, inlined (a literal's bytes are most of an NFA's nodes)
                        nxt = table[key] = self.n_nodes
                        self.n_nodes = nxt + 1
                        fresh += 1
                part = parts[i]
                if loop is not None:
                    # x of several parts, then `(sep x)*` from that repetition's own entry, where it loops
                    # (`_build_repeat`): x's parts are the same suffixes as the loop's x towards that node, built once
                    self.build(loop[1], cur, self._entry(parts[end - 1], nxt))
                elif type(part) is _Bytes:
                    mask_id = mask_ids.get(part.mask)
                    if mask_id is None:
                        mask_id = mask_ids[part.mask] = len(mask_ids)
                    edge_src.append(cur)
                    edge_mask.append(mask_id)
                    edge_dst.append(nxt)
                elif end == n and last_entry:
                    self._build_entry(part, cur, dst)  # cur is its entry, new
                else:
                    self._part(part, cur, nxt)
                if shared or end == n:
                    break
                cur, i = nxt, end
            if fresh:
                self.budget.tick(fresh - 1)
                self.budget.check(self.n_nodes // 4)
        elif isinstance(expr, _Union):
            for part in expr.parts:
                self.build(part, src, dst)
        elif isinstance(expr, _Repeat):
            self._build_repeat(expr, src, dst)
        elif isinstance(expr, Dfa):
            self._embed(expr, src, dst)
        elif isinstance(expr, _Substitute):
            if _prefix_code(expr.mapping) is not None:
                self._embed(_compile(expr, self.budget, self.memo), src, dst)
            else:
                self._embed(_compile(expr.body, self.budget, self.memo), src, dst, dict(expr.mapping))
        elif isinstance(expr, (_Intersect, _Difference)):
            self._embed(_compile(expr, self.budget, self.memo), src, dst)
        else:
            raise TypeError(f"not an automaton expression: {expr!r}")

    def _part(self, part: Expr, src: int, dst: int) -> None:
        """One part of a concatenation, from the node before it (which only paths spelling this part and the rest of
        the concatenation reach: the concatenation's entry or a suffix node) to `dst`. An unbounded repetition loops
        on that node itself, so its body's last part is built towards the same node as the part before it: an open
        object's extra members `(, "key": v)*` after a declared member whose value is the same automaton v share
        one copy of v (Github_medium o89218: 55,795 states determinised, 18,672 minimal)."""
        if type(part) is _Repeat and part.lo == 0 and part.hi is None:
            self._build_entry(part, src, dst)  # src is as good as its entry: `_build_repeat` loops on it
        else:
            self.build(part, src, dst)

    def _build_repeat(self, expr: _Repeat, src: int, dst: int) -> None:
        body, lo, hi = expr.body, expr.lo, expr.hi
        copies = max(lo, 1) if hi is None else hi  # built: x* and x+ loop on one copy
        if copies > 1 and not isinstance(body, (_Bytes, _Special, Dfa)):
            body = _compile(body, self.budget, self.memo)  # determinise once, embed the small DFA per copy
        cur = src
        for _ in range(lo - 1 if hi is None and lo else lo):
            nxt = self.node()
            self.build(body, cur, nxt)
            cur = nxt
        if hi is None and lo:
            # the last copy required loops on itself: x{lo,} as x{lo-1} then x+, whose x is built once (the loop's x
            # shares the entry of the one before it, both leaving to `back`)
            back = self.node()
            self.build(body, cur, back)
            self.build(body, back, back)
            self._eps(back, dst)
            return
        if hi is None:
            # x*: x loops on the repetition's entry itself (only paths spelling x* towards dst reach it), so an x
            # written just before it (towards this same node) shares its entry with the loop's (see `_Concat`)
            self.build(body, cur, cur)
            self._eps(cur, dst)
            return
        self._eps(cur, dst)
        for _ in range(hi - lo):
            nxt = self.node()
            self.build(body, cur, nxt)
            self._eps(nxt, dst)
            cur = nxt

    def _embed(self, dfa: Dfa, src: int, dst: int, mapping: dict[int, Expr] | None = None) -> None:
        """Add `dfa`'s states as nodes entered from `src`, leaving to `dst` from its accepting states; a byte `b` of
        `mapping` is replaced by a path spelling `mapping[b]`."""
        if dfa.is_empty:
            return
        base = self.n_nodes
        n = dfa.n_states
        special_symbols = tuple(self.special_symbol[sid] for sid in dfa.specials)
        mapped_mask = sum(1 << b for b in mapping) if mapping else 0
        self.n_nodes = base + n
        self.budget.check(self.n_nodes // 4)
        if self.blocks is not None:
            # A block: the DFA's transitions stay arrays (`_edge_groups`) that the native subset construction reads
            # directly (a 12k-state DFA copied into Python lists cost ~50 ms); acceptance (an epsilon to dst) and the
            # paths of mapped bytes are added here.
            src_of, dst_of, label, masks = dfa._edge_groups(special_symbols)
            accepting = np.flatnonzero(dfa.accepting) + base
            self.eps_src.extend(accepting.tolist())
            self.eps_dst.extend(itertools.repeat(dst, len(accepting)))
            mapped = [g for g, m in enumerate(masks) if m & mapped_mask]
            if mapped:
                for g in np.flatnonzero(np.isin(label, mapped)).tolist():
                    s, t, mask = base + int(src_of[g]), base + int(dst_of[g]), masks[label[g]] & mapped_mask
                    self._build_mapped(mapping, mask, s, t)
                masks = [m & ~mapped_mask for m in masks]
            self.blocks.append((base, (src_of, dst_of, label, masks)))
            self._eps(src, base + dfa.start)
            return
        for s, row in enumerate(dfa._edge_lists(special_symbols)):
            for mask, t in row:
                if mask & mapped_mask:
                    self._build_mapped(mapping, mask & mapped_mask, base + s, base + t)
                    mask &= ~mapped_mask
                if mask:
                    self._edge(base + s, mask, base + t)
        for s in np.flatnonzero(dfa.accepting).tolist():
            self._eps(base + s, dst)
        self._eps(src, base + dfa.start)

    def _build_mapped(self, mapping: dict[int, Expr], bits: int, src: int, dst: int) -> None:
        """From src to dst, a path spelling `mapping[b]` for each byte b in the mask `bits`."""
        while bits:
            low = bits & -bits
            self.build(mapping[low.bit_length() - 1], src, dst)
            bits ^= low


def _literal_bytes(expr: Expr) -> bytes | None:
    """The one string `expr` spells when it is a literal (single bytes in sequence), else None."""
    parts = expr.parts if isinstance(expr, _Concat) else (expr,)
    out = bytearray()
    for part in parts:
        if not isinstance(part, _Bytes) or part.mask & (part.mask - 1) or not part.mask:
            return None
        out.append(part.mask.bit_length() - 1)
    return bytes(out)


_PREFIX_CODES: dict[tuple, tuple[list[dict[int, int]], dict[int, int]] | None] = {}


def _prefix_code(mapping: tuple[tuple[int, Expr], ...]) -> tuple[list[dict[int, int]], dict[int, int]] | None:
    """The trie of a substitution's replacements, `(children per node, leaf node -> mapped byte)`, when they can be
    spliced into a DFA deterministically: each replacement a non-empty literal, none a prefix of another, and each
    starting with a mapped byte (so no unmapped transition reads it). None otherwise (JSON's escapes qualify)."""
    if mapping in _PREFIX_CODES:
        return _PREFIX_CODES[mapping]
    children: list[dict[int, int]] = [{}]
    leaf_of: dict[int, int] = {}
    code: tuple | None = (children, leaf_of)
    for b, replacement in mapping:
        data = _literal_bytes(replacement)
        if not data:
            code = None
            break
        node = 0
        for x in data:
            if node in leaf_of:
                break
            node = children[node].setdefault(x, len(children))
            if node == len(children):
                children.append({})
        if node in leaf_of or children[node] or node == 0:
            code = None
            break
        leaf_of[node] = b
    if code is not None and not set(children[0]) <= {b for b, _ in mapping}:
        code = None
    if len(_PREFIX_CODES) < 64:
        _PREFIX_CODES[mapping] = code
    return code


def _substituted(dfa: Dfa, code: tuple[list[dict[int, int]], dict[int, int]]) -> Dfa:
    """`dfa` with every mapped byte's transition replaced by a path spelling its replacement, built directly (no
    subset construction) from the replacements' prefix code (`_prefix_code`). From each state the replacements it
    uses share their prefixes: one copy of the code's trie per state, cut to the live leaves. The result is
    deterministic and trimmed, not minimised."""
    if dfa.is_empty:
        return dfa
    children, leaf_of = code
    mapped = sorted(leaf_of.values())
    n, trans, class_of = dfa.n_states, dfa.transitions, dfa.class_of
    target = {u: trans[:, class_of[b]] for u, b in leaf_of.items()}  # per leaf: each state's target, -1 none
    bfs = [0]
    for u in bfs:
        bfs.extend(children[u].values())
    need: dict[int, np.ndarray] = {}
    for u in reversed(bfs):
        need[u] = target[u] >= 0 if u in leaf_of else np.logical_or.reduce([need[v] for v in children[u].values()])
    # new states: per internal trie node, one copy for each state that needs it
    copy: dict[int, np.ndarray] = {0: np.arange(n, dtype=np.int32)}
    n_total = n
    for u in bfs[1:]:
        if u not in leaf_of:
            ids = np.full(n, -1, np.int32)
            live = np.flatnonzero(need[u])
            ids[live] = n_total + np.arange(len(live), dtype=np.int32)
            copy[u] = ids
            n_total += len(live)
    # classes: every byte a replacement reads, or that is mapped, gets its own
    own = sorted(set(mapped) | {x for c in children for x in c})
    key = class_of.astype(np.int64)
    key[own] = dfa.n_classes + np.arange(len(own))
    _, new_class = np.unique(key, return_inverse=True)
    new_class = new_class.reshape(-1).astype(np.int32)
    old_class = np.zeros(int(new_class.max()) + 1, np.int32)
    old_class[new_class] = class_of
    table = np.full((n_total, len(old_class)), -1, np.int32)
    table[:n] = trans[:, old_class]
    table[:n, new_class[mapped]] = -1
    for u, rows in copy.items():
        for x, v in children[u].items():
            dest = target[v] if v in leaf_of else copy[v]
            ok = (dest >= 0) & need[u] if u else dest >= 0
            table[rows[ok], new_class[x]] = dest[ok]
    accepting = np.zeros(n_total, bool)
    accepting[:n] = dfa.accepting
    return Dfa(table, accepting, new_class, dfa.specials, dfa.start)


def _partition(masks: Iterable[int], n_symbols: int) -> tuple[np.ndarray, int, dict[int, list[int]]]:
    """Coarsest partition of the alphabet refining every mask: `(class_of symbol, n_classes, mask -> its classes)`.
    A symbol's class is the set of masks it is in (one numpy pass over the distinct masks' bits)."""
    distinct = sorted(set(masks))
    if not distinct:
        return np.zeros(n_symbols, np.int32), 1, {}
    n_bytes = (n_symbols + 7) // 8
    raw = np.frombuffer(b"".join(m.to_bytes(n_bytes, "little") for m in distinct), np.uint8)
    bits = np.unpackbits(raw.reshape(len(distinct), n_bytes), axis=1, bitorder="little")[:, :n_symbols]
    signatures, class_of = _unique_rows(np.ascontiguousarray(bits.T))  # [class, mask]
    which, cls = np.nonzero(signatures.T)  # per mask (ascending), the classes inside it
    ends = np.searchsorted(which, np.arange(1, len(distinct) + 1)).tolist()
    cls = cls.tolist()
    covers, at = {}, 0
    for m, end in zip(distinct, ends):
        covers[m] = cls[at:end]
        at = end
    return class_of.astype(np.int32), len(signatures), covers


def _determinise(nfa: _Nfa, start: int, final: int, budget: _Budget) -> Dfa:
    n_symbols = N_BYTES + len(nfa.specials)
    mask_ids = dict(nfa.mask_ids)  # every mask read, numbered: the listed edges' first, then the blocks' new ones
    for _, groups in nfa.blocks or ():
        for m in groups[3]:
            mask_ids.setdefault(m, len(mask_ids))
    class_of, n_classes, covers = _partition(mask_ids, n_symbols)

    native = _native.automata()
    if native is not None:
        deadline, flags = budget.native_limits()
        blocks = []
        for base, (src, dst, label, masks) in nfa.blocks or ():
            ids = np.fromiter((mask_ids[m] for m in masks), np.int32, len(masks))
            blocks.append((base, src, dst, ids[label]))
        status, transitions, accepting = native.determinise(
            nfa.n_nodes, nfa.eps_src, nfa.eps_dst, nfa.edge_src, nfa.edge_mask, nfa.edge_dst,
            [covers[m] for m in mask_ids], n_classes, start, final, budget.max_states, deadline, flags, blocks)
        if status != _native.DET_OK:
            budget.native_stopped(status)
        budget.check(len(accepting) - 1)
        return _finish(transitions, accepting, class_of, nfa.specials, 0, budget)

    # the Python subset construction reads per-node lists
    eps: list[list[int]] = [[] for _ in range(nfa.n_nodes)]
    for a, b in zip(nfa.eps_src, nfa.eps_dst):
        eps[a].append(b)
    edges_of: list[list[tuple[int, int]]] = [[] for _ in range(nfa.n_nodes)]
    mask_of = list(nfa.mask_ids)
    for a, m, b in zip(nfa.edge_src, nfa.edge_mask, nfa.edge_dst):
        edges_of[a].append((mask_of[m], b))

    closure_cache: dict[frozenset, frozenset] = {}

    def closure(seeds: Iterable[int]) -> frozenset:
        key = frozenset(seeds)
        hit = closure_cache.get(key)
        if hit is not None:
            return hit
        stack = list(key)
        seen = set(key)
        while stack:
            n = stack.pop()
            for m in eps[n]:
                if m not in seen:
                    seen.add(m)
                    stack.append(m)
        # A DFA state of a nested repetition holds thousands of NFA nodes (`^((a{1,20}){1,20}){1,20}$`): its closure
        # counts as work by size, so the clock is read every 64 units of work whatever the states' sizes.
        budget.tick(len(seen) >> 6)
        # keep only nodes that carry symbol edges, plus the final node (for acceptance)
        result = frozenset(n for n in seen if edges_of[n] or n == final)
        closure_cache[key] = result
        return result

    first = closure([start])
    ids: dict[frozenset, int] = {first: 0}
    order = [first]
    # live transitions as (state, class, target) triples: most states step on a few of many classes (a literal's
    # chain state on one), so a dense row per state would mostly be filled with -1 and converted element by element
    src_of: list[int] = []
    class_of_edge: list[int] = []
    target_of: list[int] = []
    i = 0
    while i < len(order):
        current = order[i]
        i += 1
        budget.tick(1 + (len(current) >> 6))
        # Targets grouped by symbol mask first: when the masks of a state's edges are pairwise disjoint (the usual
        # case), every class of a mask has the same target set, so one closure serves all of them.
        by_mask: dict[int, set[int]] = {}
        for n in current:
            for m, t in edges_of[n]:
                group = by_mask.get(m)
                if group is None:
                    by_mask[m] = {t}
                else:
                    group.add(t)
        union_of_masks = 0
        for m in by_mask:
            if union_of_masks & m:
                break
            union_of_masks |= m
        else:
            union_of_masks = -1
        if union_of_masks == -1:
            groups = [(covers[m], ts) for m, ts in by_mask.items()]
        else:
            targets: dict[int, set[int]] = {}
            for m, ts in by_mask.items():
                for c in covers[m]:
                    cur = targets.get(c)
                    if cur is None:
                        targets[c] = set(ts)
                    else:
                        cur |= ts
            groups = [((c,), ts) for c, ts in targets.items()]
        here = i - 1
        for classes, ts in groups:
            nxt = closure(ts)
            j = ids.get(nxt)
            if j is None:
                j = len(order)
                ids[nxt] = j
                order.append(nxt)
                budget.check(j)
            class_of_edge.extend(classes)
            src_of.extend([here] * len(classes))
            target_of.extend([j] * len(classes))
    accepting = np.array([final in s for s in order], dtype=bool)
    transitions = np.full((len(order), n_classes), -1, np.int32)
    transitions[np.array(src_of, np.int64), np.array(class_of_edge, np.int64)] = np.array(target_of, np.int32)
    return _finish(transitions, accepting, class_of, nfa.specials, 0, budget)


def _closure_of(seeds: np.ndarray, start: np.ndarray, neighbours: np.ndarray, n: int) -> np.ndarray:
    """Boolean [n]: the seeds and every state reachable from them along the CSR graph (start, neighbours)."""
    return _levels_from(seeds, start, neighbours, n) >= 0


_SCALAR_BFS_MAX = 1 << 15  # states up to which a breadth-first search runs on Python lists (see `_levels_from`)


def _levels_from(seeds: np.ndarray, start: np.ndarray, neighbours: np.ndarray, n: int, budget: _Budget | None = None) -> np.ndarray:
    """int64 [n]: the fewest edges from a seed along the CSR graph (start, neighbours); -1 where unreachable.

    One numpy pass per level suits wide graphs; JSON automata are deep (a literal is a chain of states: required_50
    has ~300 levels), so small graphs are searched on Python lists after dropping parallel edges (one per class)."""
    if n <= _SCALAR_BFS_MAX:
        owner = np.repeat(np.arange(n, dtype=np.int64), np.diff(start))
        pairs = np.unique(owner * n + neighbours)
        src, dst = pairs // n, pairs % n
        bounds = np.searchsorted(src, np.arange(n + 1)).tolist()
        targets = dst.tolist()
        out = [-1] * n
        frontier = [int(x) for x in np.asarray(seeds).tolist()]
        for x in frontier:
            out[x] = 0
        d = 0
        while frontier:
            d += 1
            nxt = []
            for x in frontier:
                for t in targets[bounds[x]:bounds[x + 1]]:
                    if out[t] < 0:
                        out[t] = d
                        nxt.append(t)
            frontier = nxt
        return np.array(out, np.int64)
    level = np.full(n, -1, np.int64)
    level[seeds] = 0
    frontier = np.asarray(seeds, dtype=np.int64)
    d = 0
    while frontier.size:
        if budget is not None:
            budget.check_time()  # one numpy pass per level: reading the clock costs nothing beside it
        counts = start[frontier + 1] - start[frontier]
        total = int(counts.sum())
        if not total:
            break
        offsets = np.repeat(start[frontier] - np.cumsum(counts) + counts, counts) + np.arange(total)
        nxt = np.unique(neighbours[offsets])
        frontier = nxt[level[nxt] < 0]
        d += 1
        level[frontier] = d
    return level


def _unique_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a 2-D int array and the inverse map (sorted by raw bytes)."""
    a = np.ascontiguousarray(a)
    view = a.view(np.dtype((np.void, a.dtype.itemsize * a.shape[1]))).reshape(-1)
    _, index, inverse = np.unique(view, return_index=True, return_inverse=True)
    return a[index], inverse.reshape(-1)


def _column_weights(n: int) -> np.ndarray:
    """n weights in 1..2**16 - 1 (float64), a fixed function of the position (splitmix64 of 1..n, top 16 bits)."""
    z = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (((z ^ (z >> np.uint64(31))) >> np.uint64(48)) | np.uint64(1)).astype(np.float64)


_COLUMN_WEIGHTS = _column_weights(1 << 12)
_COLUMN_WEIGHTS_INT = _COLUMN_WEIGHTS.astype(np.int64)  # (the native merge's)
# A DFA table of n states holds -1..n-1: n * 2**16 * n < 2**53 keeps every key an exact integer in float64, whatever
# order BLAS sums in, so equal columns get equal keys. Larger tables are keyed in int64 instead.
_FLOAT_KEYS_MAX = 1 << 18


def _unique_columns(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct columns of a DFA's transition table (int32, entries -1..n-1 for n rows) side by side, in the
    order of a fixed hash of their values, and per column the index of its copy there: how a DFA's equal classes are
    merged.

    A column's key is one dot product with fixed integer weights (float64 through BLAS while exact, see
    `_FLOAT_KEYS_MAX`), read off the table as it lies (no transposed copy to sort by raw bytes), and columns with
    equal keys are checked to be equal (a collision falls back to `_unique_rows`). `required_50`'s 3,801 x 106 table
    after minimisation (73 distinct columns), median of 41: 3.75 ms sorting, 0.74 ms with int32 keys, 0.52 ms in
    numpy. In C where it is built (`native.unique_columns`: the same keys, order and result): 0.05 against 0.19 ms on
    parallel_1to5_of_5's 408 x 36 table within a compile, 0.19 against 0.36 on nested_table's 2,054 x 51."""
    global _COLUMN_WEIGHTS, _COLUMN_WEIGHTS_INT
    table = np.ascontiguousarray(table, dtype=np.int32)
    n, k = table.shape
    if n > len(_COLUMN_WEIGHTS):
        _COLUMN_WEIGHTS = _column_weights(max(n, 2 * len(_COLUMN_WEIGHTS)))
        _COLUMN_WEIGHTS_INT = _COLUMN_WEIGHTS.astype(np.int64)
    native = _native.automata()
    if native is None:
        merged = _unique_columns_numpy(table, _COLUMN_WEIGHTS[:n])
    else:
        # the same keys as exact integers in one pass over the table (numpy's dozen calls took 0.16 ms on a 408 x 36
        # table, 0.78 ms on 3,085 x 57)
        merged = native.unique_columns(table, _COLUMN_WEIGHTS_INT[:n], n < _FLOAT_KEYS_MAX)
        if merged is not None:
            merged = merged[0], merged[1].astype(np.intp)
    if merged is not None:
        return merged
    # equal keys on different columns: grouped by sorting them instead
    columns, inverse = _unique_rows(table.T)
    return np.ascontiguousarray(columns.T), inverse


def _unique_columns_numpy(table: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """`_unique_columns` in numpy (where the native passes are not built): `table` int32 C-contiguous, `weights` its
    rows' float64 weights; None when two different columns share a key."""
    n, k = table.shape
    keys = weights @ table.astype(np.float64) if n < _FLOAT_KEYS_MAX else weights.astype(np.int64) @ table
    _, index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    copy_of = index[inverse]
    merged = np.flatnonzero(copy_of != np.arange(k))
    if merged.size == 0 or np.array_equal(table[:, merged], table[:, copy_of[merged]]):
        return table[:, index], inverse
    return None


def _finish(transitions: np.ndarray, accepting: np.ndarray, class_of: np.ndarray, specials: tuple[int, ...], start: int, budget: _Budget) -> Dfa:
    """Trim (keep reachable and co-reachable states), minimise, merge equal classes."""
    n = transitions.shape[0]
    if n == 0:
        return _empty_dfa()
    native = _native.automata()
    if native is not None:
        budget.check_time()
        trans, acc = native.finish(transitions, accepting, start)
        if not len(acc):
            return _empty_dfa()
        cols, class_map = _unique_columns(trans)
        return Dfa(cols, acc, class_map[class_of].astype(np.int32), specials, 0)
    src, cls = np.nonzero(transitions >= 0)
    dst = transitions[src, cls].astype(np.int64)
    # co-reachable (can reach acceptance): closure over reversed edges
    order = np.argsort(dst, kind="stable")
    budget.check_time()
    to_accept = _levels_from(np.nonzero(accepting)[0], np.searchsorted(dst[order], np.arange(n + 1)), src[order], n, budget)
    live = to_accept >= 0
    if not live[start]:
        return _empty_dfa()
    trans = np.where((transitions >= 0) & live[np.maximum(transitions, 0)], transitions, -1)
    # reachable from start through live states
    ok = live[dst] & live[src]
    fwd = np.argsort(src[ok], kind="stable")
    reach = _closure_of(np.array([start]), np.searchsorted(src[ok][fwd], np.arange(n + 1)), dst[ok][fwd], n)
    keep = np.nonzero(reach)[0]
    renumber = np.full(n + 1, -1, np.int32)
    renumber[keep] = np.arange(len(keep), dtype=np.int32)
    trans = renumber[trans[keep]]  # -1 indexes the last slot, which stays -1
    acc = accepting[keep]
    start = int(renumber[start])
    trans, acc, start = _minimise(trans, acc, start, budget, to_accept[keep])
    # merge classes whose columns are identical
    cols, class_map = _unique_columns(trans)
    return Dfa(cols, acc, class_map[class_of].astype(np.int32), specials, start)


# Integer weights keep every signature sum exact in float64, whatever order it is summed in.
_HASH_WEIGHTS = np.random.default_rng(20261129).integers(1, 2**16, size=(4096, 2)).astype(np.float64)
# (weights < 2**16 and block ids < 2**26 keep every sum of up to 2**11 classes exact; a hash collision is caught
#  by `_is_congruence`, which then falls back to the exact refinement)


def _refine(trans: np.ndarray, block: np.ndarray, n_blocks: int, budget: _Budget, *, exact: bool) -> tuple[np.ndarray, int]:
    """Moore partition refinement to the fixpoint: split blocks by (block, blocks of the targets per class).

    The hashed variant keeps block ids stable across splits and recomputes signatures only for states with a
    target in a block that just split (a worklist), so late rounds touch few states. A signature is summed over the
    live edges only (sparse: a DFA state has few live classes), so a round costs the affected states' edges.
    """
    n, k = trans.shape
    weights = _HASH_WEIGHTS[:k] if k <= 2048 and n < 2**26 else None
    if exact or weights is None:
        return _refine_exact(trans, block, n_blocks, budget)
    # live edges in CSR form, both ways: out-edges grouped by source (row-major order), in-edges by target
    src, cls = np.nonzero(trans >= 0)
    dst = trans[src, cls].astype(np.int64)
    out_start = np.searchsorted(src, np.arange(n + 1))
    w_re, w_im = weights[cls, 0], weights[cls, 1]
    order = np.argsort(dst, kind="stable")
    preds = src[order]
    in_start = np.searchsorted(dst[order], np.arange(n + 1))
    block = block.copy()
    key = np.zeros(n, np.complex128)
    # Invariant after every round: all members of block b have the key block_key[b]. So a round sorts only the
    # states whose key it recomputed (those with a target in a block that just split): within their block, the ones
    # whose key is still block_key[b] stay with the members not recomputed, the others leave in groups by key. A
    # round costs its recomputed states, not the whole blocks they sit in (nested_users: a 53k-state block and
    # 1,037 rounds).
    cap = n + n_blocks + 1  # block ids never exceed n + the initial blocks
    block_key = np.zeros(cap, np.complex128)
    size = np.bincount(block, minlength=cap).astype(np.int64)
    affected = np.arange(n, dtype=np.int64)
    while affected.size:
        budget.check(0)
        budget.check_time()
        counts = out_start[affected + 1] - out_start[affected]
        total = int(counts.sum())
        owner = np.repeat(np.arange(affected.size), counts)
        pos = np.arange(total) + np.repeat(out_start[affected] - np.cumsum(counts) + counts, counts)
        # +1: a dead target (no edge) must not hash like an edge into block 0
        target = block[dst[pos]].astype(np.float64) + 1.0
        key[affected] = np.bincount(owner, w_re[pos] * target, affected.size) + 1j * np.bincount(
            owner, w_im[pos] * target, affected.size
        )
        # group the recomputed states by (block, key)
        m = affected[np.lexsort((key[affected].imag, key[affected].real, block[affected]))]
        mb, mk = block[m], key[m]
        new_group = np.ones(len(m), bool)
        new_group[1:] = (mb[1:] != mb[:-1]) | (mk[1:] != mk[:-1])
        first_of_block = np.ones(len(m), bool)
        first_of_block[1:] = mb[1:] != mb[:-1]
        group_id = np.cumsum(new_group) - 1
        # per block: how many of its members were recomputed (all of them: its largest group keeps the id and sets
        # the key; some: the group with the block's standing key, if any, stays with the members not recomputed)
        starts = np.flatnonzero(first_of_block)
        blocks_here = mb[starts]
        recomputed = np.diff(np.append(starts, len(m)))
        whole = recomputed == size[blocks_here]
        if whole.any():
            # a block recomputed whole keeps its id for its largest group (Hopcroft's smaller half: only the states
            # that move make their predecessors recompute in the next round)
            group_size = np.diff(np.append(np.flatnonzero(new_group), len(m)))
            order = np.lexsort((-group_size, mb[new_group]))  # per block, largest group first
            firsts = np.flatnonzero(new_group)[order]
            first_in_block = np.ones(len(firsts), bool)
            first_in_block[1:] = mb[firsts[1:]] != mb[firsts[:-1]]
            largest = firsts[first_in_block]  # one position per recomputed block, in block order (as blocks_here)
            block_key[blocks_here[whole]] = mk[largest[whole]]
        stays = mk == block_key[mb]
        moved = ~stays
        if not moved.any():
            break
        # fresh ids, one per moving group
        fresh_groups = np.unique(group_id[moved])
        fresh_ids = np.full(group_id[-1] + 1, -1, np.int64)
        fresh_ids[fresh_groups] = n_blocks + np.arange(len(fresh_groups))
        n_blocks += len(fresh_groups)
        changed = m[moved]
        new_ids = fresh_ids[group_id[moved]]
        np.subtract.at(size, block[changed], 1)
        block[changed] = new_ids
        np.add.at(size, new_ids, 1)
        block_key[new_ids] = key[changed]
        counts = in_start[changed + 1] - in_start[changed]
        if counts.sum() == 0:
            break
        offsets = np.repeat(in_start[changed] - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        affected = np.unique(preds[offsets])
    return _in_order_of_appearance(block)


def _in_order_of_appearance(block: np.ndarray) -> tuple[np.ndarray, int]:
    """Block ids renumbered 0..n_blocks-1 in order of first appearance, and n_blocks."""
    _, first = np.unique(block, return_index=True)
    rank = np.empty(len(first), np.int64)
    rank[np.argsort(first)] = np.arange(len(first))
    _, inverse = np.unique(block, return_inverse=True)
    return rank[inverse.reshape(-1)], len(first)


def _refine_exact(trans: np.ndarray, block: np.ndarray, n_blocks: int, budget: _Budget) -> tuple[np.ndarray, int]:
    dead = trans < 0
    safe = np.maximum(trans, 0)
    while True:
        target_blocks = np.where(dead, -1, block[safe])
        signature = np.ascontiguousarray(np.column_stack([block, target_blocks]).astype(np.int64))
        keys = signature.view(np.dtype((np.void, signature.dtype.itemsize * signature.shape[1]))).reshape(-1)
        _, new_block = np.unique(keys, return_inverse=True)
        new_block = new_block.reshape(-1).astype(np.int64)
        new_n = int(new_block.max()) + 1
        budget.check(0)
        budget.check_time()
        if new_n == n_blocks:
            return block, n_blocks
        block, n_blocks = new_block, new_n


def _is_congruence(trans: np.ndarray, accepting: np.ndarray, block: np.ndarray) -> bool:
    """Every state agrees with its block's first state on acceptance and on the blocks of its targets."""
    first = np.full(int(block.max()) + 1, -1, np.int64)
    first[block[::-1]] = np.arange(len(block) - 1, -1, -1)
    rep = first[block]
    mapped = np.where(trans >= 0, block[np.maximum(trans, 0)], -1)
    return bool((accepting == accepting[rep]).all() and (mapped == mapped[rep]).all())


def _minimise(
    trans: np.ndarray, accepting: np.ndarray, start: int, budget: _Budget, to_accept: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Moore partition refinement, vectorised with numpy (hashed signatures, verified; exact fallback). The numpy
    path only: with the native passes `_finish` trims and minimises in C (Hopcroft).

    The first partition already separates states by what equivalent states share: acceptance, the fewest symbols to
    acceptance (`to_accept`, when given) and which classes have a live transition, which saves a few refinement
    rounds (required_50: 63 -> 54; rounds are set by the longest distinguishing suffix, often a whole item).
    """
    n, k = trans.shape
    features = [accepting.astype(np.int64)]
    if to_accept is not None:
        features.append(np.asarray(to_accept, dtype=np.int64))
    live_classes = np.packbits(trans >= 0, axis=1)
    features.append(_unique_rows(live_classes)[1].astype(np.int64))
    _, block = np.unique(np.column_stack(features), axis=0, return_inverse=True)
    block0 = block.reshape(-1).astype(np.int64)
    n0 = int(block0.max()) + 1
    block, n_blocks = _refine(trans, block0, n0, budget, exact=False)
    if not _is_congruence(trans, accepting, block):
        block, n_blocks = _refine(trans, block0, n0, budget, exact=True)
    if n_blocks == n:
        return trans, accepting, start
    rep = np.full(n_blocks, -1, np.int64)
    rep[block[::-1]] = np.arange(n - 1, -1, -1)
    new_trans = trans[rep]
    new_trans = np.where(new_trans >= 0, block[np.maximum(new_trans, 0)], -1).astype(np.int32)
    return new_trans, accepting[rep], int(block[start])


def _product(a: Dfa, b: Dfa, *, keep_b: bool, budget: _Budget) -> Dfa:
    """Intersection (keep_b) or difference (not keep_b) of two DFAs.

    Counted strings (`counted_chars`) on one side only, in an intersection or in the first operand of a difference:
    the other side stays where it is on their markers (it reads the texts with the markers left out), so the result
    keeps them. On both sides, or in the subtracted operand, the markers of the two would have to line up:
    `CountedProduct`.
    """
    if has_counters(a) or has_counters(b):
        if (has_counters(a) and has_counters(b)) or not keep_b and has_counters(b):
            raise CountedProduct("a product of two automata with counted strings")
        if has_counters(b):
            a, b = b, a  # (an intersection)
        b = _transparent(b, tuple(sid for sid in a.specials if sid < 0))
    specials = tuple(sorted(set(a.specials) | set(b.specials)))
    n_symbols = N_BYTES + len(specials)

    def remap(d: Dfa) -> np.ndarray:
        out = np.full(n_symbols, -1, np.int64)
        out[:N_BYTES] = d.class_of[:N_BYTES]
        for i, sid in enumerate(specials):
            sym = d.special_symbol(sid)
            if sym >= 0:
                out[N_BYTES + i] = d.class_of[sym]
        return out

    ca, cb = remap(a), remap(b)
    pair = (ca + 1) * (b.n_classes + 1) + (cb + 1)
    uniq, class_of = np.unique(pair, return_inverse=True)
    class_of = class_of.reshape(-1).astype(np.int32)
    pa = [int(p // (b.n_classes + 1)) - 1 for p in uniq]
    pb = [int(p % (b.n_classes + 1)) - 1 for p in uniq]
    if a.is_empty or (keep_b and b.is_empty):
        return _empty_dfa()
    native = _native.automata()
    if native is not None:
        deadline, flags = budget.native_limits()
        status, transitions, accepting = native.product(
            (a.transitions, a.accepting, a.start), None if b.is_empty else (b.transitions, b.accepting, b.start),
            np.array(pa, np.int32), np.array(pb, np.int32), keep_b, budget.max_states, deadline, flags)
        if status != _native.DET_OK:
            budget.native_stopped(status)
        budget.check(len(accepting) - 1)
        return _finish(transitions, accepting, class_of, specials, 0, budget)
    ra = a.rows() if not a.is_empty else []
    rb = b.rows() if not b.is_empty else []
    start = (a.start, b.start if not b.is_empty else -1)
    ids = {start: 0}
    order = [start]
    rows = []
    i = 0
    while i < len(order):
        sa, sb = order[i]
        i += 1
        budget.tick()
        row = []
        for c in range(len(uniq)):
            ta = ra[sa][pa[c]] if pa[c] >= 0 else -1
            tb = rb[sb][pb[c]] if (sb >= 0 and pb[c] >= 0) else -1
            if ta < 0 or (keep_b and tb < 0):
                row.append(-1)
                continue
            key = (ta, tb)
            j = ids.get(key)
            if j is None:
                j = len(order)
                ids[key] = j
                order.append(key)
                budget.check(j)
            row.append(j)
        rows.append(row)
    acc_a, acc_b = a.accepting, b.accepting
    if keep_b:
        accepting = np.array([bool(acc_a[x]) and bool(acc_b[y]) for x, y in order])
    else:
        accepting = np.array([bool(acc_a[x]) and not (y >= 0 and bool(acc_b[y])) for x, y in order])
    transitions = np.array(rows, dtype=np.int32).reshape(len(rows), len(uniq))
    return _finish(transitions, accepting, class_of, specials, 0, budget)


def _transparent(dfa: Dfa, marks: tuple[int, ...]) -> Dfa:
    """`dfa` reading the marker symbols `marks` as no-ops: each stays in its state on them."""
    if dfa.is_empty:
        return dfa
    n, k = dfa.transitions.shape
    table = np.hstack([dfa.transitions, np.arange(n, dtype=np.int32)[:, None]])
    class_of = np.concatenate([dfa.class_of[: N_BYTES + len(dfa.specials)], np.full(len(marks), k, np.int32)])
    return Dfa(table, dfa.accepting, class_of, dfa.specials + marks, dfa.start)


# ---------------------------------------------------------------------------
# Composition of compiled parts (no determinisation of the whole)
# ---------------------------------------------------------------------------
#
# A bounded repetition embeds its body's DFA once per copy into the NFA, and determinising that NFA walks every copy
# again (parallel_1to5_of_5: a 2,012-state array of five 400-state calls, 60 % of its compile). When the parts meet
# cleanly -- no accepting state of the left part continues with a byte the right part may start with -- the DFA of
# their concatenation is the two DFAs side by side, the left part's accepting states also taking the right part's
# first step: no subset construction is needed, and that holds for the JSON texts and tool-call envelopes this
# library builds (an object ends at its `}`, a number is followed by `,` or `}`). Parts that overlap fall back to the
# NFA. Glued automata are trimmed; two states of different parts may have equal languages, so small glued automata
# are minimised again (`_MINIMISE_GLUED_MAX`).

_COMPOSE_MIN = 64  # estimated NFA size of a part from which it is compiled on its own and glued
# Glued automata up to this many states are minimised again (a few ms at most): equal languages of different parts
# -- the number of a last declared property and the number of an undeclared one after it -- are merged. Larger ones
# are kept as glued, where minimising would cost what gluing saved (300 JSONSchemaBench schemas: 301,355 states
# against 300,828 minimal, +0.2 %; the largest excess +1.6 %).
_MINIMISE_GLUED_MAX = 1024


def _size(expr: Expr, sizes: dict[int, int]) -> int:
    """An estimate of the NFA `expr` builds (symbol edges; a DFA counts its states), memoised by identity."""
    hit = sizes.get(id(expr))
    if hit is not None:
        return hit
    if isinstance(expr, (_Bytes, _Special)):
        size = 1
    elif isinstance(expr, Dfa):
        size = expr.n_states
    elif isinstance(expr, (_Concat, _Union)):
        size = 1 + sum(1 if type(p) is _Bytes else _size(p, sizes) for p in expr.parts)
    elif isinstance(expr, _Repeat):
        size = 1 + _size(expr.body, sizes) * (expr.lo + (1 if expr.hi is None else expr.hi - expr.lo))
    elif isinstance(expr, (_Intersect, _Difference)):
        size = _size(expr.a, sizes) + _size(expr.b, sizes)
    elif isinstance(expr, _Substitute):
        size = _size(expr.body, sizes) + sum(_size(e, sizes) for _, e in expr.mapping)
    else:
        raise TypeError(f"not an automaton expression: {expr!r}")
    sizes[id(expr)] = size
    return size


def _first(expr: Expr, firsts: dict[int, tuple[int, bool]]) -> tuple[int, bool]:
    """(symbols a string of `expr` may start with, as a mask over bytes and 256+special ids -- a superset --, whether
    `expr` accepts the empty string), memoised by identity."""
    hit = firsts.get(id(expr))
    if hit is not None:
        return hit
    if isinstance(expr, _Bytes):
        out = (expr.mask, False)
    elif isinstance(expr, _Special):
        out = (1 << (N_BYTES + expr.symbol_id), False)
    elif isinstance(expr, Dfa):
        mask = 0
        if not expr.is_empty:
            live = expr.transitions[expr.start] >= 0
            for symbol in np.flatnonzero(live[expr.class_of[:N_BYTES]]).tolist():
                mask |= 1 << symbol
            for i, sid in enumerate(expr.specials):
                if live[expr.class_of[N_BYTES + i]]:
                    mask |= 1 << (N_BYTES + sid)
        out = (mask, not expr.is_empty and bool(expr.accepting[expr.start]))
    elif isinstance(expr, _Concat):
        mask, nullable = 0, True
        for part in expr.parts:
            m, n = _first(part, firsts)
            mask |= m
            if not n:
                nullable = False
                break
        out = (mask, nullable)
    elif isinstance(expr, _Union):
        mask, nullable = 0, False
        for part in expr.parts:
            m, n = _first(part, firsts)
            mask, nullable = mask | m, nullable or n
        out = (mask, nullable)
    elif isinstance(expr, _Repeat):
        m, n = _first(expr.body, firsts)
        out = (m, n or expr.lo == 0)
    elif isinstance(expr, (_Intersect, _Difference)):
        m, n = _first(expr.a, firsts)
        out = (m, n)
    elif isinstance(expr, _Substitute):
        out = (-1, True)  # any symbol (a mask with every bit set), perhaps empty
    else:
        raise TypeError(f"not an automaton expression: {expr!r}")
    firsts[id(expr)] = out
    return out


def starts_alike(exprs: Sequence[Expr]) -> bool:
    """Whether two of `exprs` may start with a common symbol (`_first`'s supersets: may say so wrongly, never miss
    one)."""
    firsts: dict[int, tuple[int, bool]] = {}
    seen = 0
    for expr in exprs:
        mask = _first(expr, firsts)[0]
        if mask & seen:
            return True
        seen |= mask
    return False


class _Glued:
    """A trimmed DFA under construction over a shared class alphabet: `table[s, c]` is a target or -1."""

    __slots__ = ("table", "accepting", "start")

    def __init__(self, table: np.ndarray, accepting: np.ndarray, start: int):
        self.table, self.accepting, self.start = table, accepting, start

    def __len__(self) -> int:
        return self.table.shape[0]


def _aligned(dfas: Sequence[Dfa]) -> tuple[tuple[int, ...], np.ndarray, list[_Glued]]:
    """The DFAs over one class alphabet refining all of theirs: `(specials, class_of, glued parts)`."""
    specials = tuple(sorted(set().union(*(d.specials for d in dfas))))
    n_symbols = N_BYTES + len(specials)
    classes = np.empty((len(dfas), n_symbols), np.int64)
    for i, d in enumerate(dfas):
        row = classes[i]
        row[:] = d.n_classes  # the dead column appended below
        row[:N_BYTES] = d.class_of[:N_BYTES]
        for j, sid in enumerate(specials):
            symbol = d.special_symbol(sid)
            if symbol >= 0:
                row[N_BYTES + j] = d.class_of[symbol]
    columns, class_of = _unique_rows(classes.T)
    parts = []
    for i, d in enumerate(dfas):
        own = columns[:, i]  # each joint class's class in d (d.n_classes: none)
        if len(own) == d.n_classes and (own == np.arange(d.n_classes)).all():
            parts.append(_Glued(d.transitions, d.accepting, d.start))  # its classes already (read, never written)
            continue
        table = d.transitions[:, np.minimum(own, d.n_classes - 1)]
        table[:, own == d.n_classes] = -1
        parts.append(_Glued(table, d.accepting, d.start))
    return specials, class_of.astype(np.int32), parts


def _without_unentered(g: _Glued, state: int) -> _Glued:
    """`g` less `state` when no transition enters it and it is not the start (it became unreachable)."""
    if state == g.start or (g.table == state).any():
        return g
    table = np.delete(g.table, state, axis=0)
    table = np.where(table > state, table - 1, table)
    return _Glued(table, np.delete(g.accepting, state), g.start - (g.start > state))


def _glue(a: _Glued, b: _Glued) -> _Glued | None:
    """a·b side by side, or None when an accepting state of `a` continues with a class `b` may start with."""
    final = np.flatnonzero(a.accepting)
    first = b.table[b.start] >= 0
    out = a.table[final]
    if ((out >= 0) & first).any():
        return None
    n = len(a)
    tb = np.where(b.table >= 0, b.table + n, -1).astype(np.int32)
    table = np.concatenate([a.table, tb])
    table[final] = np.where(out >= 0, out, tb[b.start])
    accepting = np.concatenate([np.zeros(n, bool), b.accepting])
    accepting[final] = b.accepting[b.start]
    return _without_unentered(_Glued(table, accepting, a.start), n + b.start)


def _optional(g: _Glued) -> _Glued:
    """g or nothing: a fresh accepting start state stepping like the old one."""
    if g.accepting[g.start]:
        return g
    table = np.concatenate([g.table, g.table[g.start][None]])
    accepting = np.concatenate([g.accepting, [True]])
    return _without_unentered(_Glued(table, accepting, len(g)), g.start)


def _star(g: _Glued) -> _Glued | None:
    """g*, or None when an accepting state of `g` continues with a class `g` may start with."""
    final = np.flatnonzero(g.accepting)
    first = g.table[g.start] >= 0
    out = g.table[final]
    if ((out >= 0) & first).any():
        return None
    table = g.table.copy()
    table[final] = np.where(out >= 0, out, g.table[g.start])
    return _optional(_Glued(table, g.accepting, g.start))  # unchanged when g accepts at its start already


def _glue_all(parts: Sequence[_Glued], budget: _Budget, skips: Sequence[tuple[int, int]] = ()) -> _Glued | None:
    """The parts one after another (`_glue` of each to the ones before), or None when two overlap: written once into
    one table, each later part's start left out when nothing enters it (the states renumbered as they are written,
    through one lookup per part). nested_table's last glue of five parts, 3,080 states: 1.2 -> 0.4 ms. A skip
    `(i, j)`: the accepting states of part i also step like part j's start (j > i + 1), or stay accepting when j is
    `len(parts)` (`x (sep x){0,2} y` as x, sep, x, sep, x, y with skips (0, 5), (2, 5)).

    Where the native library is built, the same pass runs in C (`NativeAutomata.glue`, the same table): all the glues
    of one compile, Llama 3, medians of 200, numpy -> C: parallel_1to5_of_5 649 -> 105 us, nested_table 969 -> 318,
    send_email_to_array 956 -> 308, nested_users 958 -> 297 (the numpy pass's ~12 calls a part cost more than the
    data)."""
    if len(parts) == 1:
        return parts[0]
    native = _native.automata()
    if native is not None:
        # (each later part loses at most its start: parts this far over the budget are over it glued, before the C pass)
        budget.check(sum(len(p) for p in parts) - (len(parts) - 1))
        skip_to = dict(skips)
        glued = native.glue([p.table for p in parts], [p.accepting for p in parts], [p.start for p in parts],
                            [skip_to.get(i, -1) for i in range(len(parts))])
        if glued is None:
            return None
        budget.check(len(glued[1]))
        return _Glued(glued[0], glued[1], parts[0].start)
    entered: dict[int, bool] = {}  # by identity: a repeated part is read once
    for p in parts[1:]:
        if id(p) not in entered:
            entered[id(p)] = bool((p.table == p.start).any())
    drop = [False] + [not entered[id(p)] for p in parts[1:]]
    total = sum(len(p) - d for p, d in zip(parts, drop))
    budget.check(total)
    table = np.empty((total, parts[0].table.shape[1]), np.int32)
    accepting = np.empty(total, bool)
    at = 0
    final = np.zeros(0, np.intp)  # the accepting states of the parts so far, numbered as written
    skip_to = dict(skips)
    pending: dict[int, list[np.ndarray]] = {}  # part j -> the accepting states (numbered) that skip to it
    for i, (p, dropped) in enumerate(zip(parts, drop)):
        n, start = len(p), p.start
        # each state's number as written (the last slot -1: where a missing transition, -1, looks)
        number = np.arange(at, at + n + 1, dtype=np.int32)
        if dropped:
            number[start + 1:] -= 1
        number[n] = -1
        if dropped:
            np.take(number, p.table[:start], out=table[at:at + start])
            np.take(number, p.table[start + 1:], out=table[at + start:at + n - 1])
            accepting[at:at + start] = p.accepting[:start]
            accepting[at + start:at + n - 1] = p.accepting[start + 1:]
        else:
            np.take(number, p.table, out=table[at:at + n])
            accepting[at:at + n] = p.accepting
        ends = np.flatnonzero(p.accepting)
        own = number[ends[ends != start] if dropped else ends]
        if i in pending:  # accepting states of an earlier part that may skip to here
            final = np.concatenate([final, *pending.pop(i)])
        if i:
            # the accepting states so far also step like this part's start
            into = number[p.table[start]]
            out = table[final]
            if ((out >= 0) & (into >= 0)).any():
                return None
            table[final] = np.where(out >= 0, out, into)
            # they accept as this part's start does (skipping ones were cleared by the part after them)
            accepting[final] = p.accepting[start]
            if p.accepting[start]:
                own = np.concatenate([final, own])
        if i in skip_to:
            pending.setdefault(skip_to[i], []).append(own)
        final = own
        at += n - dropped
    for own in pending.get(len(parts), ()):
        accepting[own] = True
    return _Glued(table, accepting, parts[0].start)


def _repeated(body: _Glued, lo: int, hi: int | None, budget: _Budget) -> _Glued | None:
    """body{lo,hi} by gluing copies, or None when copies would overlap."""
    if hi is None:
        tail = _star(body)
        if tail is None:
            return None
        budget.check(lo * len(body))  # (before a list of lo copies: minItems 10**9 would fill memory first)
        return _glue_all([body] * lo + [tail], budget)
    if hi == 0:
        return _Glued(np.full((1, body.table.shape[1]), -1, np.int32), np.ones(1, bool), 0)
    table, s0 = body.table, body.start
    n, k = table.shape
    final = np.flatnonzero(body.accepting)
    if ((table[final] >= 0) & (table[s0] >= 0)).any():
        return None  # an accepting state continues with a class the body starts with
    budget.check(hi * n + 1)
    # hi copies side by side in one pass; the accepting states of copy c also step like copy c+1's start
    offsets = (np.arange(hi, dtype=np.int32) * n)[:, None, None]
    out = np.where(table[None] >= 0, table[None] + offsets, -1).reshape(hi * n, k)
    if hi > 1:
        ends = (np.arange(hi - 1)[:, None] * n + final[None, :]).ravel()
        starts = np.repeat(np.arange(1, hi) * n + s0, len(final))
        out[ends] = np.where(out[ends] >= 0, out[ends], out[starts])
    accepting = np.zeros(hi * n, bool)
    accepting[(np.arange(max(lo, 1) - 1, hi)[:, None] * n + final[None, :]).ravel()] = True
    start = s0
    if lo == 0 and not body.accepting[s0]:
        # optional: a fresh accepting start stepping like copy 0's
        out = np.concatenate([out, out[s0][None]])
        accepting = np.append(accepting, True)
        start = hi * n
    # the copies' starts that nothing enters any more are dropped (each copy's other states are entered from the
    # copy before it, as its start's targets are)
    keep = np.zeros(len(out) + 1, bool)
    keep[out.ravel()] = True  # -1 marks the extra last slot
    keep = keep[:-1]
    keep[start] = True
    if keep.all():
        return _Glued(out, accepting, start)
    renumber = np.append(np.where(keep, np.cumsum(keep) - 1, -1), -1).astype(np.int32)
    return _Glued(renumber[out[keep]], accepting[keep], int(renumber[start]))


def _loop(x: _Glued, sep: _Glued) -> _Glued | None:
    """x (sep x)*, with one copy of x: x's accepting states also step like sep's start, sep's accepting states like
    x's start. None when the parts overlap (an accepting state of x continues with a class sep starts with, or one of
    sep with a class x starts with) or sep accepts at its start.

    Written in one pass: x's states keep their numbers, sep's follow but for its start when nothing in sep enters it
    and its accepting states with no step of their own, which are x's start itself (their entries go there). Items
    of 5 tool calls (402 states): 190 -> 77 us (a glue, then a redirect and a renumbering of the whole table)."""
    if sep.accepting[sep.start]:
        return None
    xt, st = x.table, sep.table
    n, m = len(x), len(sep)
    x_final = np.flatnonzero(x.accepting)
    s_first = st[sep.start]
    x_out = xt[x_final]
    if ((x_out >= 0) & (s_first >= 0)).any():
        return None
    s_final = np.flatnonzero(sep.accepting)
    s_out = st[s_final]
    into_x = xt[x.start]
    if ((s_out >= 0) & (into_x >= 0)).any():
        return None
    keep = np.ones(m, bool)
    keep[s_final[~(s_out >= 0).any(axis=1)]] = False  # bare: x's start itself
    number = np.full(m + 1, -1, np.int32)  # sep's state -> its number here (the last slot: the dead -1)
    number[:m][~keep] = x.start
    if not (st == sep.start).any():
        keep[sep.start] = False  # nothing enters it: its row lives on in x's accepting states only
    kept = np.flatnonzero(keep)
    number[kept] = np.arange(n, n + len(kept), dtype=np.int32)
    table = np.empty((n + len(kept), xt.shape[1]), np.int32)
    table[:n] = xt
    into_sep = number[s_first]
    table[x_final] = np.where(x_out >= 0, x_out, into_sep)
    np.take(number, st[kept], out=table[n:])
    accepting = np.zeros(len(table), bool)
    accepting[:n] = x.accepting
    finals = n + np.flatnonzero(sep.accepting[kept])  # sep's accepting states that stay (they step on their own)
    table[finals] = np.where(table[finals] >= 0, table[finals], into_x)
    accepting[finals] = x.accepting[x.start]
    return _Glued(table, accepting, x.start)


def _disjoint_union(parts: Sequence[_Glued]) -> _Glued | None:
    """Any one of the parts, when no two start states step on a common class (else None): the parts side by side
    under a fresh start state stepping like all of theirs."""
    starts = np.stack([p.table[p.start] for p in parts])
    if ((starts >= 0).sum(axis=0) > 1).any():
        return None
    offsets = np.cumsum([0] + [len(p) for p in parts])
    tables = [np.where(p.table >= 0, p.table + off, -1).astype(np.int32) for p, off in zip(parts, offsets)]
    first = np.max(np.stack([t[p.start] for t, p in zip(tables, parts)]), axis=0)
    table = np.concatenate(tables + [first[None]])
    accepting = np.concatenate([p.accepting for p in parts] + [[any(p.accepting[p.start] for p in parts)]])
    out = _Glued(table, accepting, len(table) - 1)
    for p, off in sorted(zip(parts, offsets[:-1]), key=lambda item: -item[1]):
        out = _without_unentered(out, int(off) + p.start)
    return out


_NO_LOOPS: dict[int, tuple[int, Expr]] = {}


def _loops_of(parts: tuple[Expr, ...]) -> dict[int, tuple[int, Expr]]:
    """The `x (sep x)*` runs of a concatenation's parts (x two or more whole parts, then an unbounded repetition of
    a concatenation ending in the same objects): first part's index -> (parts spanned, x as one concatenation).
    (With x one part, `_Nfa._part` shares it.)"""
    loops: dict[int, tuple[int, Expr]] = {}
    taken = -1  # parts before this index belong to a loop already
    for at, part in enumerate(parts):
        if not (isinstance(part, _Repeat) and part.lo == 0 and part.hi is None and isinstance(part.body, _Concat)):
            continue
        body = part.body.parts
        for k in range(min(len(body) - 1, at - taken - 1), 1, -1):  # (one part: `_Nfa._part` loops on its node)
            if _ends_with(body, parts[at - k:at]):
                loops[at - k] = (k + 1, _Concat(parts[at - k:at]))
                taken = at
                break
    return loops


def _ends_with(parts: tuple[Expr, ...], tail: tuple[Expr, ...]) -> bool:
    return len(parts) > len(tail) and all(a is b for a, b in zip(parts[len(parts) - len(tail):], tail))


def _compose(expr: Expr, budget: _Budget, memo: _Memo) -> Dfa | Expr | None:
    """`expr` compiled by gluing separately compiled parts (a `Dfa`), an equivalent expression made of compiled
    parts for the NFA when they overlap, or None when `expr` is better determinised whole."""
    sizes = memo.sizes
    class_parts: Sequence[_Glued] = ()  # what `_as_dfa` reads equal classes off (a concatenation: its distinct parts)

    def heavy(e: Expr) -> bool:
        return _size(e, sizes) >= _COMPOSE_MIN

    def compiled(items: list[Expr], join) -> Dfa:
        return _compile(items[0] if len(items) == 1 else join(tuple(items)), budget, memo)

    if isinstance(expr, _Repeat):
        copies = expr.lo + (1 if expr.hi is None else expr.hi - expr.lo)
        if (copies < 2 and expr.hi is not None) or not heavy(expr.body):
            return None
        body = _compile(expr.body, budget, memo)
        if body.is_empty:
            return None
        specials, class_of, (part,) = _aligned([body])
        glued = _repeated(part, expr.lo, expr.hi, budget)
        fallback: Expr = _Repeat(body, expr.lo, expr.hi)
    elif isinstance(expr, _Concat):
        # groups: a heavy part alone, runs of light parts together, and `x (sep x)*` (how arrays are written) as one
        # loop over a single copy of x -- glued as x then (sep x)*, the first x would be a second copy of the same
        # states
        # spans over expr.parts: [first, end, loop] where loop = (x parts, sep parts) for `x (sep x)*`, else None
        # `x (sep x){lo,hi}` (a bounded array of heavy items) likewise as x, sep, x, ... glued in one pass, the copies
        # from the lo-th on also stepping into what follows the group (`_glue_all`'s skips)
        spans: list[list] = []
        parts = expr.parts
        for at, part in enumerate(parts):
            loop = None
            if isinstance(part, _Repeat) and isinstance(part.body, _Concat) and (
                    (part.lo == 0 and part.hi is None) or (part.hi is not None and heavy(part.body.parts[-1]))):
                body = part.body.parts
                for k in range(min(len(body) - 1, at), 0, -1):
                    # x must be whole items: no earlier span may straddle where it starts
                    if _ends_with(body, parts[at - k:at]) and any(sp[0] == at - k for sp in spans):
                        while spans and spans[-1][0] >= at - k:
                            spans.pop()
                        loop = (list(parts[at - k:at]), list(body[: len(body) - k]))
                        if part.hi is not None:
                            loop = (*loop, part.lo, part.hi)
                        spans.append([at - k, at + 1, loop])
                        break
            if loop is None:
                spans.append([at, at + 1, None])
        items: list = [(("loop" if len(sp[2]) == 2 else "copies"), *sp[2]) if sp[2] is not None else parts[sp[0]]
                       for sp in spans]
        # ["run", [parts]] | ["part", expr] | ["loop", x parts, sep parts] | ["copies", x parts, sep parts, lo, hi]
        groups: list[list] = []
        for item in items:
            if isinstance(item, tuple):
                groups.append(list(item))
            elif heavy(item):
                groups.append(["part", item])
            elif groups and groups[-1][0] == "run":
                groups[-1][1].append(item)
            else:
                groups.append(["run", [item]])
        if all(g[0] == "run" for g in groups) or (len(groups) < 2 and groups[0][0] != "loop"):
            return None
        dfas: list[Dfa] = []  # per group (a group of copies: its x)
        sequence: list[Dfa] = []  # what is glued, in order: a group of copies spelled out
        skips: list[tuple[int, int]] = []  # `_glue_all`'s: (an optional copy's x, the part after its group)
        fallbacks: list[Expr] = []
        for g in groups:
            if g[0] == "run":
                dfas.append(compiled(g[1], _Concat))
            elif g[0] == "part":
                dfas.append(_compile(g[1], budget, memo))
            elif g[0] == "copies":
                x, sep = compiled(g[1], _Concat), compiled(g[2], _Concat)
                lo, hi = g[3], g[4]
                dfas.append(x)
                fallbacks.append(_Concat((x, _Repeat(_Concat((sep, x)), lo, hi))))
                if sep.is_empty:
                    if lo:
                        return _empty_dfa()
                    sequence.append(x)
                    continue
                budget.check((hi + 1) * (x.n_states - 1))  # (at least that many states: fail before spelling them)
                optional = []
                for copy in range(hi + 1):
                    if copy:
                        sequence.append(sep)
                    if lo <= copy < hi:
                        optional.append(len(sequence))
                    sequence.append(x)
                skips.extend((i, len(sequence)) for i in optional)
                continue
            else:
                x, sep = compiled(g[1], _Concat), compiled(g[2], _Concat)
                dfas.append(x)
                if not (x.is_empty or sep.is_empty):
                    # looped over the one class alphabet of all the parts below (not aligned and finished alone)
                    sequence.append((x, sep))
                    fallbacks.append(_Concat((x, _Repeat(_Concat((sep, x)), 0, None))))
                    continue
            sequence.append(dfas[-1])
            fallbacks.append(dfas[-1])
        if any(d.is_empty for d in dfas):
            return _empty_dfa()
        while True:
            distinct = list({id(d): d for e in sequence for d in (e if isinstance(e, tuple) else (e,))}.values())
            specials, class_of, aligned = _aligned(distinct)
            glued_of = {id(d): g for d, g in zip(distinct, aligned)}
            pieces: list[_Glued] = []
            for i, e in enumerate(sequence):
                if not isinstance(e, tuple):
                    pieces.append(glued_of[id(e)])
                    continue
                looped = _loop(glued_of[id(e[0])], glued_of[id(e[1])])
                if looped is None:  # x and sep overlap: that loop determinised, and the parts aligned again
                    sequence[i] = _determinised(_Concat((e[0], _Repeat(_Concat((e[1], e[0])), 0, None))), budget)
                    break
                pieces.append(looped)
            else:
                break
        try:
            glued = _glue_all(pieces, budget, skips)
        except BudgetExceeded as err:
            # the parts fit and their sum does not: the largest part is what a user would shrink
            largest = max(range(len(groups)), key=lambda k: dfas[k].n_states)
            if groups[largest][0] == "part":
                _at(err, groups[largest][1], budget)
            raise
        fallback = _Concat(tuple(fallbacks))
        class_parts = aligned
    elif isinstance(expr, _Union):
        if not any(heavy(p) for p in expr.parts):
            return None
        light = [p for p in expr.parts if not heavy(p)]
        seen = 0
        for group in [[p] for p in expr.parts if heavy(p)] + [light]:
            mask = 0
            for p in group:
                mask |= _first(p, memo.firsts)[0]
            if mask & seen:
                return None  # alternatives that start alike are determinised together
            seen |= mask
        dfas = [_compile(p, budget, memo) for p in expr.parts if heavy(p)]
        if light:
            dfas.append(compiled(light, _Union))
        dfas = [d for d in dfas if not d.is_empty]
        if len(dfas) < 2:
            return dfas[0] if dfas else _empty_dfa()
        specials, class_of, glued_parts = _aligned(dfas)
        glued = _disjoint_union(glued_parts)
        fallback = _Union(tuple(dfas))
    else:
        return None
    if glued is None:
        return fallback
    budget.check(len(glued))
    if len(glued) <= _MINIMISE_GLUED_MAX:
        # minimised next (`_minimal(..., merged=False)`), which merges equal classes itself: not merged here too
        return Dfa(glued.table, glued.accepting, class_of, specials, glued.start)
    return _as_dfa(glued, specials, class_of, class_parts)


def _minimal(dfa: Dfa, budget: _Budget, *, merged: bool = True) -> Dfa:
    """`dfa` minimised (it is trimmed already); `merged`: its equal classes are merged already (else the result is
    never `dfa` itself, even when no state merges)."""
    if dfa.n_states == 0 or (dfa.n_states == 1 and merged):
        return dfa
    if _native.automata() is not None:
        minimal = _finish(dfa.transitions, dfa.accepting, dfa.class_of, dfa.specials, dfa.start, budget)
        return dfa if merged and minimal.n_states == dfa.n_states else minimal
    trans, acc, start = _minimise(dfa.transitions, dfa.accepting, dfa.start, budget)
    if merged and len(trans) == dfa.n_states:
        return dfa
    columns, class_map = _unique_columns(trans)
    return Dfa(columns, acc, class_map[dfa.class_of].astype(np.int32), dfa.specials, start)


def _as_dfa(glued: _Glued, specials: tuple[int, ...], class_of: np.ndarray, parts: Sequence[_Glued] = ()) -> Dfa:
    """The finished DFA: classes whose columns are equal merged. With `parts` (what `glued` was glued from, over
    its classes), the classes equal in every part's table: equal in the glued one too (its rows are the parts' rows
    renumbered, or a part's accepting row filled in with the next part's start row), read off the parts, which
    may be far fewer rows than their copies (parallel_1to5_of_5: 408 rows for 2,012)."""
    if not parts:
        columns, class_map = _unique_columns(glued.table)
        return Dfa(columns, glued.accepting, class_map[class_of].astype(np.int32), specials, glued.start)
    _, class_map = _unique_columns(np.concatenate([p.table for p in parts]))
    first = np.empty(int(class_map.max()) + 1, np.intp)
    first[class_map[::-1]] = np.arange(len(class_map) - 1, -1, -1)  # each merged class's first column
    identity = len(first) == len(class_map) and bool((first == np.arange(len(first))).all())
    columns = glued.table if identity else np.ascontiguousarray(glued.table[:, first])
    return Dfa(columns, glued.accepting, class_map[class_of].astype(np.int32), specials, glued.start)


class _Memo:
    """One `compile` call's caches: DFAs by expression identity, structural keys by identity (objects kept alive)."""

    def __init__(self) -> None:
        self.dfas: dict[Expr, Dfa] = {}
        self.keys: dict[int, tuple[Expr, bytes, frozenset[int]]] = {}
        self.sizes: dict[int, int] = {}  # id(expr) -> `_size` (the expressions are kept alive by the compiled one)
        self.firsts: dict[int, tuple[int, bool]] = {}  # id(expr) -> `_first`


_NO_SPECIALS: frozenset[int] = frozenset()


_BYTE_RECORDS: dict[int, bytes] = {}  # a byte set's record in `_describe`'s stream, by mask (the first 4,096 seen)


def _describe(expr: Expr, keys: dict[int, tuple[Expr, bytes, frozenset[int]]]) -> tuple[bytes, frozenset[int]]:
    """`(structural key, special ids used)`: the key is a digest of the expression tree, equal for two separately
    built, structurally equal expressions. Memoised by identity in `keys` (which keeps the objects alive)."""
    hit = keys.get(id(expr))
    if hit is not None:
        return hit[1], hit[2]
    h = hashlib.blake2b(digest_size=20)
    specials = _NO_SPECIALS
    children: tuple[Expr, ...] = ()
    if isinstance(expr, Dfa):
        h.update(b"D" + expr.digest.encode())
        specials = frozenset(expr.specials) if expr.specials else _NO_SPECIALS
    elif isinstance(expr, _Bytes):
        h.update(b"B" + expr.mask.to_bytes(32, "little"))
    elif isinstance(expr, _Special):
        h.update(b"S%d" % expr.symbol_id)
        specials = frozenset((expr.symbol_id,))
    elif isinstance(expr, (_Concat, _Union)):
        records = [b"C%d" % len(expr.parts) if isinstance(expr, _Concat) else b"U%d" % len(expr.parts)]
        for part in expr.parts:
            # a byte set inline (literal text is long runs of them); tagged records keep the stream unambiguous
            if type(part) is _Bytes:
                record = _BYTE_RECORDS.get(part.mask)
                if record is None:
                    record = b"b" + part.mask.to_bytes(32, "little")
                    if len(_BYTE_RECORDS) < 4096:
                        _BYTE_RECORDS[part.mask] = record
                records.append(record)
            else:
                key, sub = _describe(part, keys)
                records.append(b"k" + key)
                if sub:
                    specials = specials | sub
        h.update(b"".join(records))  # (one stream: the digest of the records fed one by one)
    elif isinstance(expr, _Repeat):
        h.update(b"R%d,%d" % (expr.lo, -1 if expr.hi is None else expr.hi))
        children = (expr.body,)
    elif isinstance(expr, (_Intersect, _Difference)):
        h.update(b"I" if isinstance(expr, _Intersect) else b"M")
        children = (expr.a, expr.b)
    elif isinstance(expr, _Substitute):
        h.update(b"T%d" % len(expr.mapping))
        key, specials = _describe(expr.body, keys)
        h.update(key)
        for byte, sub_expr in expr.mapping:
            h.update(b"%d" % byte)
            key, sub = _describe(sub_expr, keys)
            h.update(key)
            if sub:
                specials = specials | sub
    else:
        raise TypeError(f"not an automaton expression: {expr!r}")
    for child in children:
        key, sub = _describe(child, keys)
        h.update(key)
        if sub:
            specials = specials | sub
    key = h.digest()
    keys[id(expr)] = (expr, key, specials)
    return key, specials


# Process-wide LRU of compiled DFAs by structural key, bounded by their array bytes. Schemas repeat sub-languages
# (a $ref used in several places, a oneOf branch compiled once alone and once in the union): each is determinised
# once. Every entry records the budget peak its build reached, so a hit under a smaller `max_states` fails exactly as
# a rebuild would. (nested_table: 45 -> 9 determinisations in one compile_schema call.)
_SHARED_MAX_BYTES = 64 << 20
_shared: OrderedDict[bytes, tuple[Dfa, int, int]] = OrderedDict()
_shared_bytes = 0
_shared_lock = threading.Lock()


def _shared_get(key: bytes) -> tuple[Dfa, int] | None:
    with _shared_lock:
        hit = _shared.get(key)
        if hit is None:
            return None
        _shared.move_to_end(key)
        return hit[0], hit[1]


def _shared_put(key: bytes, dfa: Dfa, peak: int) -> None:
    global _shared_bytes
    size = int(dfa.transitions.nbytes + dfa.class_of.nbytes + dfa.accepting.nbytes) + 200
    if size > _SHARED_MAX_BYTES // 4:
        return
    with _shared_lock:
        if key in _shared:
            return
        _shared[key] = (dfa, peak, size)
        _shared_bytes += size
        while _shared_bytes > _SHARED_MAX_BYTES:
            _, (_, _, old) = _shared.popitem(last=False)
            _shared_bytes -= old


def clear_compiled() -> None:
    """Forget every shared compiled sub-automaton (benchmarks call it to time a cold compile)."""
    global _shared_bytes
    with _shared_lock:
        _shared.clear()
        _shared_bytes = 0


def _at(err: BudgetExceeded, expr: Expr, budget: _Budget) -> None:
    """Point `err` at `expr`'s JSON Pointer, unless an expression inside it already claimed the error."""
    if budget.pointers and not getattr(err, "located", False):
        pointer = budget.pointers.get(id(expr))
        if pointer is not None:
            err.pointer = pointer
            err.args = (f"{err.message} (at {pointer or '/'})",)
            err.located = True


def _compile(expr: Expr, budget: _Budget, memo: _Memo) -> Dfa:
    if isinstance(expr, Dfa):
        return expr
    try:
        return _compile_uncaught(expr, budget, memo)
    except BudgetExceeded as err:
        _at(err, expr, budget)
        raise


def _compile_uncaught(expr: Expr, budget: _Budget, memo: _Memo) -> Dfa:
    hit = memo.dfas.get(expr)
    if hit is not None:
        return hit
    key, specials = _describe(expr, memo.keys)
    shared = _shared_get(key)
    if shared is not None:
        dfa, peak = shared
        budget.check(peak)
    else:
        outer_peak, budget.peak = budget.peak, 0
        try:
            if isinstance(expr, (_Intersect, _Difference)):
                a = _compile(expr.a, budget, memo)
                b = _compile(expr.b, budget, memo)
                dfa = _product(a, b, keep_b=isinstance(expr, _Intersect), budget=budget)
            elif isinstance(expr, (_Bytes, _Special)) or (
                isinstance(expr, _Concat) and all(type(p) in (_Bytes, _Special) for p in expr.parts)
            ):
                dfa = _chain((expr,) if isinstance(expr, (_Bytes, _Special)) else expr.parts, budget)
            elif isinstance(expr, _Substitute) and (code := _prefix_code(expr.mapping)) is not None:
                dfa = _substituted(_compile(expr.body, budget, memo), code)
                budget.check(dfa.n_states)
                if dfa.n_states <= _MINIMISE_GLUED_MAX:
                    dfa = _minimal(dfa, budget)
            else:
                composed = _compose(expr, budget, memo)
                if isinstance(composed, Dfa):
                    dfa = composed if composed.n_states > _MINIMISE_GLUED_MAX else _minimal(composed, budget, merged=False)
                else:
                    try:
                        dfa = _determinised(expr if composed is None else composed, budget, memo, specials)
                    except BudgetExceeded:
                        # over the state budget (a peak past it; not the time budget): the joins may still fit
                        if not (budget.peak > budget.max_states and isinstance(expr, _Union) and len(expr.parts) > 2
                                and all(isinstance(p, Dfa) for p in expr.parts)):
                            raise
                        budget.peak = 0  # (the peak remembered with the result is the fold's: the same at every compile)
                        dfa = _union_folded(expr, budget, memo)
            peak = budget.peak
        finally:
            budget.peak = max(outer_peak, budget.peak)
        _shared_put(key, dfa, peak)
    memo.dfas[expr] = dfa
    return dfa


def _union_folded(expr: _Union, budget: _Budget, memo: _Memo) -> Dfa:
    """A union of three or more compiled alternatives whose subset construction passed the state budget, joined two
    at a time, each join minimised: the whole construction's states are the tuples of the alternatives' states
    reached together, a join's only the pairs of two minimal automata (Glaive's `calculate_area`, a oneOf of three
    open objects of ~19,000 states each: 132,629 subsets at once, joins of 38,069 pairs at most, 19,103 states).

    Only for alternatives that are DFAs already (a `oneOf`'s branches, `schema._Compiler.exactly_one`): tried on every
    union over the budget, it compiled 2 more JSONSchemaBench schemas but took the 114 refusals from 72 s to 272 s in
    all (each inner union over the budget compiled its alternatives alone, then the next one out again, 8 of them
    until the 10 s time budget)."""
    dfas = sorted((_compile(p, budget, memo) for p in expr.parts), key=lambda d: d.n_states)
    budget.check(dfas[-1].n_states)
    joined = dfas[0]
    for dfa in dfas[1:]:
        joined = _determinised(_Union((joined, dfa)), budget, memo)
    return joined


def _chain(parts: Sequence[_Bytes | _Special], budget: _Budget) -> Dfa:
    """The DFA of a sequence of byte sets and special symbols (a literal, markers beside it), built directly: a chain
    of states (through the subset construction, a 2-part run with a marker took ~0.3 ms)."""
    if not parts:
        return _epsilon_dfa()
    if any(type(p) is _Bytes and p.mask == 0 for p in parts):
        return _empty_dfa()
    budget.check(len(parts) + 1)
    specials = tuple(sorted({p.symbol_id for p in parts if type(p) is _Special}))
    masks = {m: i for i, m in enumerate(dict.fromkeys(p.mask for p in parts if type(p) is _Bytes))}
    accepting = np.zeros(len(parts) + 1, bool)
    accepting[-1] = True
    if len(masks) < N_BYTES and all(m & (m - 1) == 0 for m in masks):
        # literal text (one byte a part): class 1 + i for the i-th byte it uses, class 0 for every other byte, then
        # one class per special symbol; the table written as one list (a few parts: lists beat numpy's calls)
        n_byte_classes = len(masks) + 1
        width = n_byte_classes + len(specials)
        class_list = [0] * N_BYTES + list(range(n_byte_classes, width))
        for m, i in masks.items():
            class_list[m.bit_length() - 1] = i + 1
        cells = [-1] * ((len(parts) + 1) * width)
        for i, p in enumerate(parts):
            column = masks[p.mask] + 1 if type(p) is _Bytes else n_byte_classes + specials.index(p.symbol_id)
            cells[i * width + column] = i + 1
        table = np.array(cells, np.int32).reshape(len(parts) + 1, width)
        return Dfa(table, accepting, np.array(class_list, np.int32), specials, 0)
    raw = np.frombuffer(b"".join(m.to_bytes(N_BYTES // 8, "little") for m in masks), np.uint8)
    bits = np.unpackbits(raw.reshape(len(masks), N_BYTES // 8), axis=1, bitorder="little")  # [mask, byte]
    columns, byte_class = _unique_rows(np.ascontiguousarray(bits.T))
    n_byte_classes = len(columns)
    table = np.full((len(parts) + 1, n_byte_classes + len(specials)), -1, np.int32)
    inside = columns.astype(bool)  # [class, distinct mask]
    for i, p in enumerate(parts):
        if type(p) is _Bytes:
            table[i, :n_byte_classes][inside[:, masks[p.mask]]] = i + 1
        else:  # a special symbol: a class of its own
            table[i, n_byte_classes + specials.index(p.symbol_id)] = i + 1
    class_of = np.concatenate([np.asarray(byte_class, np.int32),
                               np.arange(n_byte_classes, n_byte_classes + len(specials), dtype=np.int32)])
    # classes with equal columns were merged by construction (a class is a distinct membership pattern)
    return Dfa(table, accepting, class_of, specials, 0)


def _epsilon_dfa() -> Dfa:
    return Dfa(np.full((1, 1), -1, np.int32), np.ones(1, bool), np.zeros(N_BYTES, np.int32), (), 0)


def _determinised(expr: Expr, budget: _Budget, memo: _Memo | None = None, specials: frozenset[int] | None = None) -> Dfa:
    """`expr` through the NFA and the subset construction."""
    memo = memo or _Memo()
    if specials is None:
        specials = _describe(expr, memo.keys)[1]
    nfa = _Nfa(tuple(sorted(specials)), budget, memo)
    start, final = nfa.node(), nfa.node()
    nfa.build(expr, start, final)
    return _determinise(nfa, start, final, budget)


def compile(  # noqa: A001
    expr: Expr, *, max_states: int = 200_000, deadline: float | None = None, pointer: str = "",
    pointers: dict[int, str] | None = None, parts: list[tuple[int, str]] | None = None,
) -> Dfa:
    """Compile an expression to a deterministic, trimmed automaton.

    Small expressions are determinised whole and minimised. Large concatenations, bounded or unbounded repetitions
    and unions whose alternatives start differently are compiled part by part and the parts' DFAs glued side by side
    when no part's accepting state continues with a symbol the next part starts with. A glued result of more than
    `_MINIMISE_GLUED_MAX` states is not minimised again (on the engine benchmark's workloads: 0-1 more states than
    the minimal DFA; on 300 JSONSchemaBench schemas +0.2 % states in all). Neither is a substitution spliced into a
    DFA (`_substituted`: JSON string escapes) of that size (the `nested_users` e-mail value: 13,933 states, already
    minimal).

    Besides `deadline`, every `Deadline` active on this thread (`Deadline.active`) stops the compile.

    Args:
        expr: the language to compile.
        max_states: the state budget for every intermediate automaton.
        deadline: a `time.monotonic()` instant after which compilation stops.
        pointer: JSON Pointer reported in a budget error.
        pointers: `id(sub-expression)` → JSON Pointer, for sub-expressions of `expr` (kept alive by it): a budget
            error raised while one of them was built or determinised reports the innermost one's pointer instead.
        parts: if given, receives `(states, pointer)` of every pointed sub-expression compiled on its own (what a
            caller names when a later step, such as the token index, runs out of time).
    Returns:
        The `Dfa` (empty: `n_states == 0` when the language is empty).
    Raises:
        BudgetExceeded: an intermediate automaton passed `max_states` or the deadline passed.
    """
    _pause_gc()
    try:
        memo = _Memo()
        dfa = _compile(expr, _Budget(max_states, deadline, pointer, pointers), memo)
        if parts is not None and pointers:
            parts.extend((d.n_states, pointers[id(e)]) for e, d in memo.dfas.items() if id(e) in pointers)
        return dfa
    except BudgetExceeded as err:
        # The traceback's frames hold the stopped compile's NFA and state sets (millions of objects): drop them here,
        # while the collector is still paused, so they are freed by reference counts alone. (Freeing them is what a
        # stopped compile costs past its deadline: `^((a{1,20}){1,20}){1,20}$` stops at 10.0 s, returns at 10.3-10.7.)
        raise err.with_traceback(None) from err.__cause__
    except RecursionError as err:
        raise BudgetExceeded("automaton expression nested too deeply to compile", pointer=pointer) from err
    finally:
        _resume_gc()


# Compiling allocates many small acyclic containers (NFA edge lists, state sets); the cyclic collector's passes over
# them can free nothing and cost 20-30 % of a compile (required_50: 85 -> 60 ms CPU). So it is paused while any
# thread compiles, bounded by the compile deadline, and restored as it was when the last one finishes.
_gc_lock = threading.Lock()
_gc_users = 0
_gc_was_enabled = False


def _pause_gc() -> None:
    global _gc_users, _gc_was_enabled
    with _gc_lock:
        if _gc_users == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_users += 1


def _resume_gc() -> None:
    global _gc_users
    with _gc_lock:
        _gc_users -= 1
        if _gc_users == 0 and _gc_was_enabled:
            gc.enable()


def shortest_distances(dfa: Dfa, classes: np.ndarray | None = None) -> np.ndarray:
    """For each state, the fewest symbols needed to reach acceptance, reading only the symbol classes `classes`
    marks (bool [n_classes]; None: all), or the int64 maximum where none does (int64 [n_states])."""
    trans = np.asarray(dfa.transitions)
    return _fewest_steps(trans, np.asarray(dfa.accepting, bool),
                         np.ones(trans.shape[1], bool) if classes is None else np.asarray(classes, bool))


def _fewest_steps(trans: np.ndarray, accepting: np.ndarray, use: np.ndarray) -> np.ndarray:
    """`shortest_distances` over a table: breadth first backwards from the accepting states, one round per level
    over the frontier's predecessors only (each transition read once)."""
    n = trans.shape[0]
    src, col = np.nonzero((trans >= 0) & use[None, :])
    dst = trans[src, col].astype(np.intp)
    preds = src[np.argsort(dst, kind="stable")]  # the predecessors of each state, grouped by state
    ptr = np.zeros(n + 1, dtype=np.intp)
    np.cumsum(np.bincount(dst, minlength=n), out=ptr[1:])
    none = np.iinfo(np.int64).max
    dist = np.full(n, none, dtype=np.int64)
    frontier = np.flatnonzero(accepting)
    dist[frontier] = 0
    level = 0
    while frontier.shape[0]:
        level += 1
        counts = ptr[frontier + 1] - ptr[frontier]
        at = np.repeat(ptr[frontier] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        found = np.unique(preds[at])
        frontier = found[dist[found] == none]
        dist[frontier] = level
    return dist


def accepted_strings(dfa: Dfa, limit: int = 1000, max_len: int = 64) -> list[bytes]:
    """Up to `limit` accepted byte strings, shortest first (specials skipped); for tests and docs."""
    out: list[bytes] = []
    if dfa.is_empty:
        return out
    queue: list[tuple[int, bytes]] = [(dfa.start, b"")]
    rows = dfa.rows()
    class_rep = {}
    for b in range(N_BYTES):
        class_rep.setdefault(int(dfa.class_of[b]), b)
    while queue and len(out) < limit:
        nxt = []
        for s, prefix in queue:
            if dfa.accepting[s]:
                out.append(prefix)
            if len(prefix) < max_len:
                for cls, b in class_rep.items():
                    t = rows[s][cls]
                    if t >= 0:
                        nxt.append((t, prefix + bytes([b])))
        queue = nxt[: limit * 4]
    return out[:limit]


def sequence_of(items: Sequence[Expr], separator: Expr) -> Expr:
    """items[0] sep items[1] sep ... (a convenience for fixed-length lists)."""
    parts: list[Expr] = []
    for i, item in enumerate(items):
        if i:
            parts.append(separator)
        parts.append(item)
    return concat(*parts)
