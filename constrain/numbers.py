"""JSON number and integer texts restricted by JSON Schema numeric keywords, as byte-automaton expressions.

In: bounds (`minimum`, `maximum`, exclusive variants) and `multipleOf`. Out: an `automaton.Expr` over the number text.
"""

from __future__ import annotations

import math
import struct
import sys
from decimal import Decimal
from fractions import Fraction
from typing import Callable, Hashable

import numpy as np

from constrain import automaton as fa
from constrain.errors import InvalidSchema, UnsupportedSchema, join_pointer

MAX_MULTIPLE_OF = 10_000
"""Largest integer modulus enforced exactly (the mod-k automaton has up to k states before the range product)."""

_DIGIT = fa.byte_set([(0x30, 0x39)])
_NONZERO = fa.byte_set([(0x31, 0x39)])
_MINUS = fa.literal(b"-")
_DOT = fa.literal(b".")

JSON_INTEGER: fa.Expr = fa.union(fa.literal(b"0"), fa.concat(fa.optional(_MINUS), _NONZERO, fa.repeat(_DIGIT, 0)))
"""Integers in canonical JSON form: `0|-?[1-9][0-9]*` (no `-0`, no fraction, no exponent)."""

JSON_NUMBER: fa.Expr = fa.concat(
    fa.optional(_MINUS),
    fa.union(fa.literal(b"0"), fa.concat(_NONZERO, fa.repeat(_DIGIT, 0))),
    fa.optional(fa.concat(_DOT, fa.repeat(_DIGIT, 1))),
    fa.optional(fa.concat(fa.byte_set([(0x45, 0x45), (0x65, 0x65)]), fa.optional(fa.byte_set([(0x2B, 0x2B), (0x2D, 0x2D)])), fa.repeat(_DIGIT, 1))),
)
"""Every JSON number text (RFC 8259 section 6), including `-0` and exponents."""

_Bound = tuple[Fraction, bool]  # (value, strict)


# --- digit automata built state by state (linear in the number of digits, no deep expression nesting) ---------

def _digit_dfa(start: Hashable, step: Callable[[Hashable, int | str], Hashable | None],
               accepting: Callable[[Hashable], bool], extra: str = "", shape: fa.Expr | None = None) -> fa.Expr:
    """The digit strings (with the `extra` characters, within `shape`) driven through `step` from `start`;
    `step(state, symbol)` gets a digit 0-9 or one of `extra`, and returns None for a dead end."""
    symbols: list[int | str] = [*range(10), *extra]
    index = {start: 0}
    order = [start]
    rows: list[list[int]] = []
    while len(rows) < len(order):
        state = order[len(rows)]
        row = [-1] * (len(symbols) + 1)  # one class per symbol; the last: every other byte
        for c, symbol in enumerate(symbols):
            nxt = step(state, symbol)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = len(order)
                    order.append(nxt)
                row[c] = index[nxt]
        rows.append(row)
    accept = np.array([accepting(s) for s in order], dtype=bool)
    if not accept.any():
        return fa.NOTHING
    class_of = np.full(256, len(symbols), dtype=np.int32)
    class_of[0x30:0x3A] = np.arange(10, dtype=np.int32)
    for c, ch in enumerate(extra, start=10):
        class_of[ord(ch)] = c
    raw = fa.Dfa(np.array(rows, dtype=np.int32), accept, class_of, (), 0)
    # `raw` may hold dead or equivalent states; the product trims and minimises it, as every `Dfa` must be.
    return fa.compile(fa.intersect(raw, fa.repeat(_DIGIT, 0) if shape is None else shape))


def _fixed_between(lo: str, hi: str) -> fa.Expr:
    """Digit strings of length len(lo) == len(hi) between lo and hi (inclusive, lexicographic = numeric)."""
    n = len(lo)

    def step(state, d):
        i, lo_tight, hi_tight = state
        if i == n or (lo_tight and d < int(lo[i])) or (hi_tight and d > int(hi[i])):
            return None
        return (i + 1, lo_tight and d == int(lo[i]), hi_tight and d == int(hi[i]))

    return _digit_dfa((0, True, True), step, lambda s: s[0] == n)


def _naturals(lo: int, hi: int | None) -> fa.Expr:
    """Canonical texts (no leading zero) of the integers lo..hi (hi None: unbounded), lo >= 0."""
    if hi is not None and lo > hi:
        return fa.NOTHING
    parts = []
    if lo == 0:
        parts.append(fa.literal(b"0"))
        lo = 1
        if hi is not None and hi < 1:
            return parts[0]
    a = str(lo)
    if hi is None:
        parts += [_fixed_between(a, "9" * len(a)), fa.concat(_NONZERO, fa.repeat(_DIGIT, len(a)))]
    elif len(str(hi)) == len(a):
        parts.append(_fixed_between(a, str(hi)))
    else:
        b = str(hi)
        parts.append(_fixed_between(a, "9" * len(a)))
        if len(b) - len(a) >= 2:
            parts.append(fa.concat(_NONZERO, fa.repeat(_DIGIT, len(a), len(b) - 2)))
        parts.append(_fixed_between("1" + "0" * (len(b) - 1), b))
    return fa.union(*parts)


def _integers(lo: int | None, hi: int | None) -> fa.Expr:
    """Canonical texts of the integers lo..hi (None: unbounded); never `-0`."""
    parts = []
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        low_magnitude = max(1, -hi) if hi is not None else 1
        parts.append(fa.concat(_MINUS, _naturals(low_magnitude, -lo if lo is not None else None)))
    return fa.union(*parts)


def _decimal_digits(q: Fraction) -> tuple[int, str]:
    """q >= 0 with a finite decimal expansion -> (integer part, fraction digits without trailing zeros)."""
    whole = q.numerator // q.denominator
    rest = q - whole
    den, k = rest.denominator, 0
    while den % 10 == 0:
        den //= 10
        k += 1
    while den % 2 == 0 or den % 5 == 0:
        den //= 2 if den % 2 == 0 else 5
        k += 1
    assert den == 1, f"{q} has no finite decimal expansion"
    digits = str(rest.numerator * 10**k // rest.denominator).rjust(k, "0").rstrip("0") if rest else ""
    return whole, digits


def _fraction_digits(lo: tuple[str, bool] | None, hi: tuple[str, bool] | None) -> fa.Expr:
    """Non-empty digit strings w with 0.w within the bounds (each: fraction digits without trailing zeros, strict)."""

    def compare(rel, i, digits, d):
        if rel != "eq":
            return rel, i
        c = int(digits[i]) if i < len(digits) else 0
        return ("gt" if d > c else "lt" if d < c else "eq"), min(i + 1, len(digits))

    def step(state, d):
        lo_rel, lo_i, hi_rel, hi_i, _ = state
        if lo is not None:
            lo_rel, lo_i = compare(lo_rel, lo_i, lo[0], d)
            if lo_rel == "lt":
                return None
        if hi is not None:
            hi_rel, hi_i = compare(hi_rel, hi_i, hi[0], d)
            if hi_rel == "gt":
                return None
        return lo_rel, lo_i, hi_rel, hi_i, True

    def final(rel, i, digits):  # a prefix of the digits still "eq" is below them (no trailing zeros)
        return "lt" if rel == "eq" and i < len(digits) else rel

    def accepting(state):
        lo_rel, lo_i, hi_rel, hi_i, nonempty = state
        ok_lo = lo is None or final(lo_rel, lo_i, lo[0]) == "gt" or (final(lo_rel, lo_i, lo[0]) == "eq" and not lo[1])
        ok_hi = hi is None or final(hi_rel, hi_i, hi[0]) == "lt" or (final(hi_rel, hi_i, hi[0]) == "eq" and not hi[1])
        return nonempty and ok_lo and ok_hi

    return _digit_dfa(("eq", 0, "eq", 0, False), step, accepting)


def _nonneg_fractions(lo: _Bound, hi: _Bound | None) -> fa.Expr:
    """Texts `I.F` (I canonical, F non-empty) whose value lies within lo (>= 0) and hi."""
    lo_int, lo_digits = _decimal_digits(lo[0])
    lo_frac = (lo_digits, lo[1])
    if hi is None:
        return fa.union(
            fa.concat(_naturals(lo_int, lo_int), _DOT, _fraction_digits(lo_frac, None)),
            fa.concat(_naturals(lo_int + 1, None), _DOT, fa.repeat(_DIGIT, 1)),
        )
    hi_int, hi_digits = _decimal_digits(hi[0])
    hi_frac = (hi_digits, hi[1])
    if lo_int > hi_int:
        return fa.NOTHING
    if lo_int == hi_int:
        return fa.concat(_naturals(lo_int, lo_int), _DOT, _fraction_digits(lo_frac, hi_frac))
    return fa.union(
        fa.concat(_naturals(lo_int, lo_int), _DOT, _fraction_digits(lo_frac, None)),
        fa.concat(_naturals(lo_int + 1, hi_int - 1), _DOT, fa.repeat(_DIGIT, 1)),
        fa.concat(_naturals(hi_int, hi_int), _DOT, _fraction_digits(None, hi_frac)),
    )


def _fractions(lo: _Bound | None, hi: _Bound | None) -> fa.Expr:
    """Texts `-?I.F` whose value lies within the bounds; a negative sign only before a non-zero value."""
    parts = []
    if hi is None or hi[0] >= 0:
        nonneg_lo = lo if lo is not None and lo[0] >= 0 else (Fraction(0), False)
        parts.append(_nonneg_fractions(nonneg_lo, hi))
    if lo is None or lo[0] < 0:
        mag_lo = (-hi[0], hi[1]) if hi is not None and hi[0] < 0 else (Fraction(0), True)
        mag_hi = (-lo[0], lo[1]) if lo is not None else None
        parts.append(fa.concat(_MINUS, _nonneg_fractions(mag_lo, mag_hi)))
    return fa.union(*parts)


# --- bounds: what python-jsonschema compares, and what the schema author wrote --------------------------------

_INF = Fraction(2) ** 1024  # one step past the largest float: stands for infinity, an "even" float
_MAX_FLOAT = Fraction(sys.float_info.max)


def _float_value(f: float) -> Fraction:
    return _INF if f == math.inf else -_INF if f == -math.inf else Fraction(f)


def _is_even(f: float) -> bool:
    return math.isinf(f) or struct.unpack("<Q", struct.pack("<d", f))[0] & 1 == 0


def _parsed_at_least(x: Fraction, strict: bool) -> _Bound:
    """The threshold t such that float(d) >= x (> x if strict) exactly when d >= t (> t if t's flag is set)."""
    if x > _MAX_FLOAT or (strict and x == _MAX_FLOAT):
        g = math.inf
    elif x < -_MAX_FLOAT:
        g = -sys.float_info.max
    else:
        g = float(x)
        if Fraction(g) < x or (strict and Fraction(g) == x):
            g = math.nextafter(g, math.inf)
    below = math.nextafter(g, -math.inf) if g != math.inf else sys.float_info.max
    midpoint = (_float_value(below) + _float_value(g)) / 2
    return midpoint, not _is_even(g)  # a tie rounds to the even neighbour


def _check_number(value, keyword: str, pointer: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidSchema(f"{keyword} must be a number, got {value!r}", pointer=join_pointer(pointer, keyword))
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidSchema(f"{keyword} must be finite, got {value!r}", pointer=join_pointer(pointer, keyword))


def _written(x: int | float) -> Fraction:
    """The decimal the schema author wrote (a float's shortest repr), not its binary value."""
    return Fraction(Decimal(repr(x))) if isinstance(x, float) else Fraction(x)


def _collect(inclusive, exclusive, pointer: str, names: tuple[str, str]) -> list[tuple[int | float, bool]]:
    bounds = []
    for value, strict, name in ((inclusive, False, names[0]), (exclusive, True, names[1])):
        if value is not None:
            _check_number(value, name, pointer)
            bounds.append((value, strict))
    return bounds


def _tightest(candidates: list[_Bound], lower: bool) -> _Bound | None:
    best: _Bound | None = None
    for value, strict in candidates:
        if best is None or (value > best[0] if lower else value < best[0]):
            best = (value, strict)
        elif value == best[0]:
            best = (value, best[1] or strict)
    return best


def _integer_limits(lows, highs) -> tuple[int | None, int | None]:
    lo = hi = None
    for x, strict in lows:
        for v in {Fraction(x), _written(x)}:  # an integer text is compared exactly with the binary value
            n = math.floor(v) + 1 if strict else math.ceil(v)
            lo = n if lo is None else max(lo, n)
    for x, strict in highs:
        for v in {Fraction(x), _written(x)}:
            n = math.ceil(v) - 1 if strict else math.floor(v)
            hi = n if hi is None else min(hi, n)
    return lo, hi


_EXTRA_PLACES = 20
"""Fraction places kept beyond a written bound's own when a parsed-float threshold is rounded inward."""


def _inward(bound: _Bound, lower: bool, places: int) -> _Bound:
    """Round a threshold towards the inside of the range onto the 10**-places grid (narrower, never wider)."""
    value, strict = bound
    scaled = value * 10**places
    if scaled.denominator == 1:
        return bound
    grid = math.ceil(scaled) if lower else math.floor(scaled)
    return Fraction(grid, 10**places), False  # strictly inside the old threshold already


def _fraction_limits(lows, highs) -> tuple[_Bound | None, _Bound | None]:
    # A fraction text is parsed to a float before python-jsonschema compares it: keep the texts that satisfy both
    # the written decimal and the parsed float. The float threshold is a midpoint between neighbouring floats (up to
    # ~1075 digits next to 0); rounding it inward keeps the automaton linear in the written bound's digits.
    lo_candidates = []
    for x, strict in lows:
        places = len(_decimal_digits(abs(_written(x)))[1]) + _EXTRA_PLACES
        lo_candidates += [(_written(x), strict), _inward(_parsed_at_least(Fraction(x), strict), True, places)]
    hi_candidates = []
    for x, strict in highs:
        places = len(_decimal_digits(abs(_written(x)))[1]) + _EXTRA_PLACES
        t, t_strict = _parsed_at_least(-Fraction(x), strict)
        hi_candidates += [(_written(x), strict), _inward((-t, t_strict), False, places)]
    return _tightest(lo_candidates, True), _tightest(hi_candidates, False)


def _modulus_dfa(k: int) -> fa.Expr:
    """Digit strings (optionally after `-`) whose value is a multiple of k."""
    digits = _digit_dfa(0, lambda r, d: (10 * r + d) % k, lambda r: r == 0)
    return fa.concat(fa.optional(_MINUS), digits)


def _decimal_multiples(k: Fraction, written_as, pointer: str) -> fa.Expr:
    """The plain decimal texts `-?digits(.digits)?` (leading zeros not checked) whose value is a multiple of k = a/b (lowest
    terms, b > 1), in exact arithmetic.

    x = N / 10**f (N: the digits without the dot, f: the fraction digits) is a multiple iff a * 10**f divides N * b.
    Past e = max(v2(b), v5(b)) fraction digits only zeros can follow (x's lowest-terms denominator, a power of two
    times a power of five, must divide b). With the fraction padded to e digits, x is a multiple iff M divides N,
    M = a * 10**e / c, c the largest divisor of b made of twos and fives (b's other factors are prime to
    a * 10**e): the digits are read modulo M, up to M * (e + 2) + 1 states before minimisation (2.5: M = 25,
    9 states minimised).

    Raises:
        UnsupportedSchema: M exceeds MAX_MULTIPLE_OF.
    """
    a, b = k.numerator, k.denominator
    twos, fives = _valuation(b, 2), _valuation(b, 5)
    e = max(twos, fives)
    m = a * 10**e // (2**twos * 5**fives)
    if m > MAX_MULTIPLE_OF:
        raise UnsupportedSchema(
            f"multipleOf {written_as!r} for numbers needs {m} residues; the enforced limit is {MAX_MULTIPLE_OF}",
            pointer=join_pointer(pointer, "multipleOf"))
    # states: ("i", r) integer digits read (the sign changes nothing); ("d", r) just after the dot; ("f", r, j) j
    # fraction digits read (j == e: only zeros may follow). r: the digits so far modulo m.
    def step(state, symbol):
        kind, r = state[0], state[1]
        if symbol == "-":
            return state if state == ("i", 0) else None  # (where a sign may stand is the shape's business)
        if symbol == ".":
            return ("d", r) if kind == "i" else None
        if kind == "i":
            return "i", (10 * r + symbol) % m
        j = 0 if kind == "d" else state[2]
        if j < e:
            return "f", (10 * r + symbol) % m, j + 1
        return ("f", r, e) if symbol == 0 else None

    def accepting(state) -> bool:
        if state[0] == "i":
            return state[1] * 10**e % m == 0
        return state[0] == "f" and state[1] * 10 ** (e - state[2]) % m == 0

    shape = fa.concat(fa.optional(_MINUS), fa.repeat(_DIGIT, 1), fa.optional(fa.concat(_DOT, fa.repeat(_DIGIT, 1))))
    return _digit_dfa(("i", 0), step, accepting, extra=".-", shape=shape)


def _valuation(n: int, p: int) -> int:
    """The exponent of the prime p in n > 0."""
    v = 0
    while n % p == 0:
        n //= p
        v += 1
    return v


def _multiple_of(value, pointer: str) -> Fraction | None:
    if value is None:
        return None
    _check_number(value, "multipleOf", pointer)
    if value <= 0:
        raise InvalidSchema(f"multipleOf must be > 0, got {value!r}", pointer=join_pointer(pointer, "multipleOf"))
    return _written(value)


def _integer_multiples(k: int, pointer: str) -> fa.Expr | None:
    if k == 1:
        return None
    if k > MAX_MULTIPLE_OF:
        raise UnsupportedSchema(f"multipleOf {k} exceeds the enforced limit {MAX_MULTIPLE_OF}", pointer=join_pointer(pointer, "multipleOf"))
    return _modulus_dfa(k)


def integer_expr(minimum=None, maximum=None, *, exclusive_minimum=None, exclusive_maximum=None, multiple_of=None, pointer="") -> fa.Expr:
    """The integer texts `0|-?[1-9][0-9]*` whose value satisfies the JSON Schema numeric keywords.

    Guarantee: exact for the integers written in canonical form. Never `-0`, a fraction (`1.0`) or an exponent
    (`1e2`), although JSON Schema counts those as integers. Bounds may be floats (`minimum: 0.5` means >= 1) or
    arbitrarily large ints; an integer is compared with both the float's binary value (as python-jsonschema does)
    and its written decimal, whichever is tighter. `multiple_of` m (the decimal it is written as, `a/b` in lowest
    terms) keeps the integers divisible by `a` (0.5 -> every integer, 1.5 -> multiples of 3). python-jsonschema
    divides in floats (`3 / 0.1 != 30`); this follows exact arithmetic instead.

    Args:
        minimum, maximum, exclusive_minimum, exclusive_maximum: int or float bounds, or None.
        multiple_of: a positive int or float, or None.
        pointer: JSON Pointer of the schema, for errors (the keyword is appended).
    Returns:
        An expression; `fa.NOTHING` when no integer satisfies the bounds (the caller reports it).
    Raises:
        InvalidSchema: a keyword is not a finite number, or multiple_of <= 0.
        UnsupportedSchema: the numerator of multiple_of exceeds MAX_MULTIPLE_OF.
    """
    lows = _collect(minimum, exclusive_minimum, pointer, ("minimum", "exclusiveMinimum"))
    highs = _collect(maximum, exclusive_maximum, pointer, ("maximum", "exclusiveMaximum"))
    k = _multiple_of(multiple_of, pointer)
    modulus = _integer_multiples(k.numerator, pointer) if k is not None else None
    lo, hi = _integer_limits(lows, highs)
    if lo is not None and hi is not None and lo > hi:
        return fa.NOTHING
    texts = JSON_INTEGER if lo is None and hi is None else _integers(lo, hi)
    return texts if modulus is None else fa.intersect(texts, modulus)


def number_expr(minimum=None, maximum=None, *, exclusive_minimum=None, exclusive_maximum=None, multiple_of=None, pointer="") -> fa.Expr:
    """The JSON number texts whose value satisfies the JSON Schema numeric keywords.

    Guarantee: without keywords, exactly `JSON_NUMBER`. With any keyword, plain decimal notation only: no exponent,
    no `-0`/`-0.0`; fractions may carry trailing zeros (`1.50`). Exact for integer texts (compared like
    python-jsonschema compares ints) and for fraction texts, which python-jsonschema parses to floats: a fraction
    text is kept when both its float and its written decimal satisfy the bound (so `0.09999999999999999` is refused
    under `minimum: 0.1`, and `0.10000000000000001` under `exclusiveMinimum: 0.1`). Beside an exclusive bound the
    float threshold is rounded inward to 20 more fraction places than the bound is written with: fraction texts
    closer than 10**-20 to it (or to 0 for `exclusiveMaximum: 0`) are refused although the float would pass.
    `multiple_of`: an integral value keeps integer texts that are multiples (no fraction texts); 10**-p (0.1, 0.01,
    ...) keeps integer texts and fractions with at most p significant fraction digits; any other a/b (2.5 = 5/2,
    0.75 = 3/4) keeps the integer and fraction texts that are multiples (`_decimal_multiples`); all in exact decimal
    arithmetic (python-jsonschema's float division disagrees, e.g. 0.07 / 0.01).

    Args:
        minimum, maximum, exclusive_minimum, exclusive_maximum: int or float bounds, or None.
        multiple_of: a positive int or float, or None.
        pointer: JSON Pointer of the schema, for errors (the keyword is appended).
    Returns:
        An expression; `fa.NOTHING` when no number satisfies the bounds (the caller reports it).
    Raises:
        InvalidSchema: a keyword is not a finite number, or multiple_of <= 0.
        UnsupportedSchema: multiple_of's numerator exceeds MAX_MULTIPLE_OF, or (other than a power of ten below
            one) its numerator times 10**e does, e its fraction digits in lowest terms (see `_decimal_multiples`).
    """
    lows = _collect(minimum, exclusive_minimum, pointer, ("minimum", "exclusiveMinimum"))
    highs = _collect(maximum, exclusive_maximum, pointer, ("maximum", "exclusiveMaximum"))
    k = _multiple_of(multiple_of, pointer)
    if k is None and not lows and not highs:
        return JSON_NUMBER
    fraction_digits: int | None = None  # None: any number of fraction digits; 0: no fraction texts
    modulus = None
    if k is not None:
        if k.denominator == 1:
            modulus = _integer_multiples(k.numerator, pointer)
            fraction_digits = 0
        elif k.numerator == 1 and 10 ** (len(str(k.denominator)) - 1) == k.denominator:
            fraction_digits = len(str(k.denominator)) - 1
        else:
            modulus = _decimal_multiples(k, multiple_of, pointer)
    lo, hi = _integer_limits(lows, highs)
    integers = fa.NOTHING if lo is not None and hi is not None and lo > hi else _integers(lo, hi)
    if modulus is not None:
        integers = fa.intersect(integers, modulus)
    if fraction_digits == 0:
        return integers
    flo, fhi = _fraction_limits(lows, highs)
    if flo is not None and fhi is not None and (flo[0] > fhi[0] or (flo[0] == fhi[0] and (flo[1] or fhi[1]))):
        fractions = fa.NOTHING
    else:
        fractions = _fractions(flo, fhi)
    if fraction_digits is not None:
        shape = fa.concat(fa.optional(_MINUS), fa.repeat(_DIGIT, 1), _DOT, fa.repeat(_DIGIT, 1, fraction_digits), fa.repeat(fa.literal(b"0"), 0))
        fractions = fa.intersect(fractions, shape)
    if modulus is not None:
        fractions = fa.intersect(fractions, modulus)
    return fa.union(integers, fractions)


MAX_CANONICAL_DIGITS = 15
"""Digits a fraction may have under `not` (DBL_DIG: such decimals survive the round trip through a double). Integers
are exact at any length (Python compares an int with a float bound exactly)."""


def _canonical_numbers() -> fa.Expr:
    integers = JSON_INTEGER
    fractions = []
    for i in range(1, MAX_CANONICAL_DIGITS):  # i integer digits, 1..(15 - i) fraction digits, the last not 0
        whole = fa.literal(b"0") if i == 1 else fa.concat(_NONZERO, fa.repeat(_DIGIT, i - 1, i - 1))
        if i == 1:
            whole = fa.union(whole, _NONZERO)
        frac = fa.concat(fa.repeat(_DIGIT, 0, MAX_CANONICAL_DIGITS - i - 1), _NONZERO)
        fractions.append(fa.concat(whole, _DOT, frac))
    # "-0.5" is negative; "-0" alone never appears (integers above)
    return fa.union(integers, fa.concat(fa.optional(_MINUS), fa.union(*fractions)))


CANONICAL_NUMBER: fa.Expr = _canonical_numbers()
"""The numbers a value checked by `not` is written with: integral values as integers (any length), other values as
plain decimals of at most 15 digits without trailing zeros, never an exponent or `-0`. Python compares such a text's
value with any bound as its exact value would, so every numeric keyword is exact on these texts (see
docs/guarantees.md, `not`)."""


def canonical_text(x: int | float) -> str:
    """A number as the writing rules spell it: integral values without a fraction, others as plain decimals."""
    if isinstance(x, int):
        return str(x)
    if x.is_integer():
        return str(int(x))
    text = repr(x)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text
