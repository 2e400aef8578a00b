"""Numeric automata against python-jsonschema (bounds) and exact decimal arithmetic (multipleOf)."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from constrain import automaton as fa
from constrain.errors import InvalidSchema, UnsupportedSchema
from constrain.numbers import JSON_INTEGER, JSON_NUMBER, MAX_MULTIPLE_OF, integer_expr, number_expr

JSON_NUMBER_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
CANONICAL_INTEGER_RE = re.compile(r"0|-?[1-9][0-9]*")  # writing rule: no -0, no fraction, no exponent
PLAIN_DECIMAL_RE = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?")  # writing rule when bounded: no exponent
NEGATIVE_ZERO_RE = re.compile(r"-0(?:\.0+)?")
KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
EXTRA_PLACES = 20  # numbers._EXTRA_PLACES: the documented rounding zone beside exclusive bounds


def accepts(expr: fa.Expr, text: str) -> bool:
    return fa.compile(expr).matches(text.encode())


def written(x) -> Fraction:
    return Fraction(Decimal(repr(x))) if isinstance(x, float) else Fraction(x)


def call(fn, bounds: dict, multiple_of=None):
    return fn(
        bounds.get("minimum"), bounds.get("maximum"),
        exclusive_minimum=bounds.get("exclusiveMinimum"), exclusive_maximum=bounds.get("exclusiveMaximum"),
        multiple_of=multiple_of,
    )


def decimal_ok(text: str, bounds: dict) -> bool:
    """The schema author's reading: the text's exact decimal against each bound as written."""
    d = Fraction(Decimal(text))
    checks = {
        "minimum": lambda b: d >= b, "maximum": lambda b: d <= b,
        "exclusiveMinimum": lambda b: d > b, "exclusiveMaximum": lambda b: d < b,
    }
    return all(checks[k](written(v)) for k, v in bounds.items())


def near_exclusive_bound(text: str, bounds: dict) -> bool:
    """Within the documented zone beside an exclusive bound: float rounding plus 10**-(places written + 20)."""
    d = Fraction(Decimal(text))
    for k in ("exclusiveMinimum", "exclusiveMaximum"):
        if k in bounds:
            b = written(bounds[k])
            places = len(f"{Decimal(repr(bounds[k])) if isinstance(bounds[k], float) else Decimal(bounds[k]):f}".partition(".")[2])
            if abs(d - b) <= abs(b) * Fraction(1, 2**50) + Fraction(1, 10 ** (places + EXTRA_PLACES)):
                return True
    return False


# --- strategies -----------------------------------------------------------------------------------------------

bound_values = st.one_of(
    st.integers(-1000, 1000),
    st.integers(-(10**30), 10**30),
    st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(float),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 0.0, -0.0, 0.1, -2.5, 0.5, 1e-7, 2**53, 2.0**53 + 2, 1e20, -1e20, 1e300]),
)
bounds_st = st.dictionaries(st.sampled_from(KEYWORDS), bound_values, max_size=4)


def candidate_texts(bounds: dict, draw) -> list[str]:
    texts = ["0", "-0", "-0.0", "1", "-1", "0.5", "1.0", "1.50", "1e2", "-1E-2", "01", "1.", ".5", "+1", "- 1"]
    for v in bounds.values():
        w = written(v)
        f = math.floor(w)
        texts += [str(n) for n in (f - 1, f, f + 1, f + 2)]
        dec = Decimal(repr(v)) if isinstance(v, float) else Decimal(v)
        plain = f"{dec:f}"
        texts += [plain, plain + "0" if "." in plain else plain + ".0", plain + ".000"]
        for k in (1, 3, 17, 25):
            for sign in (-1, 1):
                texts.append(f"{dec + sign * Decimal(10) ** -k:f}")
        texts.append(repr(math.nextafter(float(v), math.inf)) if abs(v) < 1e300 else "1")
    texts += draw(st.lists(st.integers(-(10**6), 10**6).map(str), max_size=5))
    texts += draw(st.lists(st.decimals(-1e6, 1e6, places=4, allow_nan=False, allow_infinity=False).map(lambda d: f"{d:f}"), max_size=5))
    return [t for t in texts if "e" not in t.lower() or t in ("1e2", "-1E-2")]


def oracle_valid(text: str, schema: dict) -> bool:
    return Draft202012Validator(schema).is_valid(json.loads(text))


# --- Hypothesis differential ----------------------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounds_st, st.data())
def test_integer_bounds_match_jsonschema(bounds, data):
    expr = call(integer_expr, bounds)
    dfa = fa.compile(expr)
    schema = {"type": "integer", **bounds}
    for text in candidate_texts(bounds, data.draw):
        # Documented rule: an integer must satisfy both the float's binary value (the oracle's reading) and the
        # decimal the author wrote (`maximum: 1e300` refuses 10**300 + 1, which is below the float 1e300).
        expected = bool(CANONICAL_INTEGER_RE.fullmatch(text)) and oracle_valid(text, schema) and decimal_ok(text, bounds)
        assert dfa.matches(text.encode()) == expected, (text, bounds)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bounds_st, st.data())
def test_number_bounds_match_jsonschema(bounds, data):
    dfa = fa.compile(call(number_expr, bounds))
    schema = {"type": "number", **bounds}
    for text in candidate_texts(bounds, data.draw):
        ours = dfa.matches(text.encode())
        if not bounds:
            assert ours == bool(JSON_NUMBER_RE.fullmatch(text)), text
            continue
        if not PLAIN_DECIMAL_RE.fullmatch(text) or NEGATIVE_ZERO_RE.fullmatch(text):
            assert not ours, text  # writing rules: no exponent, no negative zero when bounded
            continue
        valid = oracle_valid(text, schema)
        if ours:
            assert valid and decimal_ok(text, bounds), ("false accept", text, bounds)
        elif valid and decimal_ok(text, bounds):
            # Documented narrowing: a fraction text within the rounding zone of an exclusive bound.
            assert "." in text and near_exclusive_bound(text, bounds), ("unexplained reject", text, bounds)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(KEYWORDS), st.integers(-300, 300), max_size=2),
    st.one_of(st.integers(1, 40), st.sampled_from([0.5, 1.5, 0.1, 2.0, 0.25, 7.0])),
    st.lists(st.integers(-400, 400), max_size=40),
)
def test_integer_multiple_of_is_exact(bounds, k, values):
    dfa = fa.compile(call(integer_expr, bounds, multiple_of=k))
    schema = {"type": "integer", **bounds}
    for n in values:
        # Exact arithmetic (python-jsonschema divides in floats: 3 / 0.1 != 30).
        expected = oracle_valid(str(n), schema) and (Fraction(n) / written(k)).denominator == 1
        assert dfa.matches(str(n).encode()) == expected, (n, k, bounds)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from(KEYWORDS), st.decimals(-50, 50, places=2).map(float), max_size=2),
    st.sampled_from([0.1, 0.01, 0.001, 1, 3, 5.0, 2.5, 0.75, 0.3, 6.5, 0.125, 12.34]),
    st.lists(st.decimals(-60, 60, places=4).map(lambda d: f"{d:f}"), max_size=30),
)
def test_number_multiple_of_is_exact(bounds, k, texts):
    dfa = fa.compile(call(number_expr, bounds, multiple_of=k))
    for text in texts + ["0", "1", "-3", "1.0", "0.30", "0.07", "2.500", "7.5", "-0.375", "24.68", "13"]:
        if NEGATIVE_ZERO_RE.fullmatch(text):
            continue
        integral_k = float(k).is_integer()
        expected = (
            decimal_ok(text, bounds)
            and (Fraction(Decimal(text)) / written(k)).denominator == 1
            and not (integral_k and "." in text)  # integral multipleOf: integer texts only
        )
        ours = dfa.matches(text.encode())
        if ours:
            assert expected and oracle_valid(text, {"type": "number", **bounds}), (text, k, bounds)
        elif expected:
            assert "." in text and near_exclusive_bound(text, bounds), (text, k, bounds)


# --- unit cases -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["0", "-0", "1", "-12", "1.5", "-0.0", "1e5", "1E+5", "1.5e-3", "10"])
def test_json_number_accepts(text):
    assert accepts(JSON_NUMBER, text)
    assert accepts(number_expr(), text)


@pytest.mark.parametrize("text", ["", "-", "01", "1.", ".5", "+1", "1e", "1e+", "NaN", "Infinity", " 1", "1 "])
def test_json_number_rejects(text):
    assert not accepts(JSON_NUMBER, text)


def test_json_integer():
    for text in ["0", "7", "-7", "1234567890123456789012345"]:
        assert accepts(JSON_INTEGER, text) and accepts(integer_expr(), text)
    for text in ["-0", "01", "1.0", "1e2", "", "-"]:
        assert not accepts(JSON_INTEGER, text)


def test_float_and_huge_bounds():
    e = integer_expr(0.5, 2.5)
    assert [t for t in ["0", "1", "2", "3"] if accepts(e, t)] == ["1", "2"]
    big = 10**40
    e = integer_expr(big - 1, exclusive_maximum=big + 1)
    assert [t for t in map(str, [big - 2, big - 1, big, big + 1]) if accepts(e, t)] == [str(big - 1), str(big)]
    e = number_expr(exclusive_minimum=-2.5, maximum=0.1)
    assert accepts(e, "-2.4999") and accepts(e, "0.1") and accepts(e, "0.10") and accepts(e, "0")
    assert not any(accepts(e, t) for t in ["-2.5", "-2.50", "0.1000001", "-0", "-0.0", "1e-1"])


def test_float_parsing_near_bounds():
    # `0.10000000000000001` parses to the float 0.1: not above exclusiveMinimum 0.1.
    e = number_expr(exclusive_minimum=0.1)
    assert not accepts(e, "0.10000000000000001") and accepts(e, "0.1000000000001")
    # `0.09999999999999999999` parses to 0.1 (valid for jsonschema) but is below the written 0.1: refused.
    assert not accepts(number_expr(minimum=0.1), "0.09999999999999999999")


def test_empty_ranges_are_nothing():
    assert integer_expr(5, 4) is fa.NOTHING
    assert integer_expr(exclusive_minimum=1, exclusive_maximum=2) is fa.NOTHING
    assert integer_expr(1.2, 1.8) is fa.NOTHING
    assert fa.compile(number_expr(exclusive_minimum=1, maximum=1)).is_empty
    assert fa.compile(number_expr(minimum=2, maximum=1)).is_empty


def test_integer_multiple_of_reductions():
    assert all(accepts(integer_expr(multiple_of=0.5), t) for t in ["0", "1", "-7"])
    e = integer_expr(multiple_of=1.5)
    assert [t for t in ["0", "1", "2", "3", "-6", "9"] if accepts(e, t)] == ["0", "3", "-6", "9"]
    e = integer_expr(multiple_of=7.0, minimum=-20, maximum=20)
    assert [n for n in range(-25, 26) if accepts(e, str(n))] == [-14, -7, 0, 7, 14]


def test_number_multiple_of_fraction_digits():
    e = number_expr(multiple_of=0.01)
    assert all(accepts(e, t) for t in ["1", "1.2", "1.23", "1.2300", "-0.07"])
    assert not any(accepts(e, t) for t in ["1.234", "1.2301", "1e2"])


@pytest.mark.parametrize(
    ("kwargs", "error", "pointer"),
    [
        ({"minimum": True}, InvalidSchema, "/s/minimum"),
        ({"exclusive_maximum": "3"}, InvalidSchema, "/s/exclusiveMaximum"),
        ({"maximum": math.inf}, InvalidSchema, "/s/maximum"),
        ({"multiple_of": 0}, InvalidSchema, "/s/multipleOf"),
        ({"multiple_of": -2}, InvalidSchema, "/s/multipleOf"),
        ({"multiple_of": MAX_MULTIPLE_OF + 1}, UnsupportedSchema, "/s/multipleOf"),
    ],
)
@pytest.mark.parametrize("fn", [integer_expr, number_expr])
def test_errors_carry_pointer(fn, kwargs, error, pointer):
    with pytest.raises(error) as info:
        fn(pointer="/s", **kwargs)
    assert info.value.pointer == pointer


def test_number_multiple_of_decimals():
    # a/b with b not a power of ten: the integer and fraction texts that are multiples, in exact arithmetic
    e = number_expr(multiple_of=2.5)
    assert all(accepts(e, t) for t in ["0", "5", "-7.5", "7.50", "2.5000", "100"])
    assert not any(accepts(e, t) for t in ["1", "2.4", "7.25", "7.51", "1e1"])
    e = number_expr(multiple_of=0.75, minimum=0, maximum=3)
    assert [t for t in ["0", "0.75", "1.5", "2.25", "3", "3.75", "1", "0.375"] if accepts(e, t)] == ["0", "0.75", "1.5", "2.25", "3"]
    e = number_expr(multiple_of=0.3)  # 3/10: python-jsonschema's float division says 0.9 / 0.3 is not whole
    assert all(accepts(e, t) for t in ["0.9", "0.3", "3", "-1.2"]) and not any(accepts(e, t) for t in ["1", "0.1", "0.35"])


@pytest.mark.parametrize("k", [12345.67, 1 / 3, 0.123456789])
def test_number_multiple_of_unsupported(k):
    # numerator times 10**e over MAX_MULTIPLE_OF (1/3 as written is 0.3333333333333333: 3333333333333333 residues)
    with pytest.raises(UnsupportedSchema) as info:
        number_expr(multiple_of=k, pointer="/s")
    assert info.value.pointer == "/s/multipleOf"


def test_integer_multiple_of_numerator_limit():
    with pytest.raises(UnsupportedSchema):
        integer_expr(multiple_of=100.01, pointer="/s")  # 10001/100: integers divisible by 10001


def test_a_float_bound_is_read_both_as_written_and_as_its_binary_value():
    """`maximum: 1e300`: the float's binary value is above 10**300, the written decimal is 10**300 exactly."""
    dfa = fa.compile(integer_expr(maximum=1e300))
    assert dfa.matches(str(10**300).encode())
    assert not dfa.matches(str(10**300 + 1).encode())  # valid for python-jsonschema (float compare), not as written
    assert oracle_valid(str(10**300 + 1), {"type": "integer", "maximum": 1e300})
