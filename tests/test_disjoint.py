"""`schema.disjoint_branches`: a oneOf whose branches no value satisfies two of compiles as its anyOf (no key
ranking, no products). The reading must be sound (never disjoint when some value satisfies two branches) and the
compiled union exact."""

from __future__ import annotations

import itertools
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus import CanonicalWriter, NotCanonicalisable, walk_violations
from constrain.errors import UnsupportedSchema
from constrain.schema import compile_schema, disjoint_branches


def _no_refs(ref: str) -> None:
    return None


# (rest, branches, disjoint)
CASES = [
    ({}, [{"type": "string"}, {"type": "integer"}], True),
    ({}, [{"type": "number"}, {"type": "integer"}], False),
    ({}, [{"type": "integer"}, {"const": 1.5}], True),
    ({}, [{"type": "integer"}, {"const": 1.0}], False),  # 1.0 is an integer from draft 6 on
    ({}, [{"enum": ["a", "b"]}, {"enum": ["c", 1]}], True),
    ({}, [{"enum": ["a", "b"]}, {"enum": ["b", 1]}], False),
    ({}, [{"const": 1}, {"const": True}], True),  # booleans are not numbers
    # objects: a name one branch requires and the other forbids, only where nothing but objects is left
    ({"type": "object"}, [{"properties": {"a": {}}, "additionalProperties": False}, {"required": ["b"]}], True),
    ({}, [{"properties": {"a": {}}, "additionalProperties": False}, {"required": ["b"]}], False),  # "x" passes both
    ({"type": "object"}, [{"properties": {"a": {}}, "additionalProperties": False, "patternProperties": {"^b": {}}},
                          {"required": ["b"]}], False),
    ({"type": "object"}, [{"properties": {"b": False}}, {"required": ["b"]}], True),
    ({"type": "object"}, [{"properties": {"b": {"not": {}}}}, {"required": ["b"]}], True),
    ({"type": "object"}, [{"properties": {"b": {"not": {"type": "string"}}}}, {"required": ["b"]}], False),
    ({"type": "object"}, [{"properties": {"a": {}}}, {"required": ["b"]}], False),  # open: {"b": 1} passes both
    # discriminators
    ({"type": "object"}, [{"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
                          {"properties": {"kind": {"const": "y"}}, "required": ["kind"]}], True),
    ({"type": "object"}, [{"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
                          {"properties": {"kind": {"const": "y"}}}], True),  # kind present: x or y
    ({"type": "object"}, [{"properties": {"kind": {"const": "x"}}},
                          {"properties": {"kind": {"const": "y"}}}], False),  # {} passes both
    # the rest requires the discriminator (JSONSchemaBench Glaiveai2K calculate_area_*)
    ({"type": "object", "required": ["shape"]}, [{"properties": {"shape": {"enum": ["circle"]}}},
                                                 {"properties": {"shape": {"enum": ["square"]}}}], True),
    ({"type": "object"}, [{"properties": {"shape": {"enum": ["circle"]}}},
                          {"properties": {"shape": {"enum": ["square"]}}}], False),
    ({"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]},
     [{"properties": {"m": {"const": 1}}}, {"properties": {"m": {"const": 2}}}], False),  # m may be absent
    ({"type": "object"}, [{"properties": {"n": {"type": "string"}}, "required": ["n"]},
                          {"properties": {"n": {"type": "integer"}}, "required": ["n"]}], True),
    ({"type": "object"}, [{"properties": {"n": {"type": "object", "required": ["z"], "additionalProperties": False,
                                                "properties": {"z": {}}}}, "required": ["n"]},
                          {"properties": {"n": {"type": "object", "required": ["w"]}}, "required": ["n"]}], True),
    # type from the rest's `not` (its exact positive form), from allOf parts, through $ref
    ({"not": {"type": ["string", "number", "null", "boolean", "array"]}},
     [{"properties": {"a": {}}, "additionalProperties": False}, {"required": ["b"]}], True),
    ({}, [{"allOf": [{"type": "object"}, {"required": ["a"]}]}, {"type": "object", "properties": {"a": False}}], True),
    ({}, [{"$ref": "#/$defs/s"}, {"type": "string"}], False),  # an unknown $ref: anything
    # three branches: every pair
    ({}, [{"type": "string"}, {"type": "integer"}, {"type": "number"}], False),
    ({}, [{"type": "string"}, {"type": "integer"}, {"type": "null"}], True),
    ({}, [{"type": "string"}, False], True),
    ({}, [{"type": "string"}, True], False),
]


@pytest.mark.parametrize("rest,branches,expected", CASES, ids=[json.dumps(c[:2])[:70] for c in CASES])
def test_hand_picked_branches(rest, branches, expected):
    assert disjoint_branches(rest, branches, _no_refs) is expected


def test_refs_are_followed_and_cycles_end():
    defs = {"s": {"type": "string"}, "loop": {"$ref": "#/$defs/loop"}, "i": {"allOf": [{"$ref": "#/$defs/i2"}]},
            "i2": {"type": "integer"}}

    def lookup(ref: str):
        return defs.get(ref.rsplit("/", 1)[-1])

    assert disjoint_branches({}, [{"$ref": "#/$defs/s"}, {"$ref": "#/$defs/i"}], lookup)
    assert not disjoint_branches({}, [{"$ref": "#/$defs/loop"}, {"type": "string"}], lookup)
    # siblings of a $ref are left out (draft 4-7 validators ignore them): no claim from them
    assert not disjoint_branches({}, [{"$ref": "#/$defs/loop", "type": "integer"}, {"type": "string"}], lookup)


def test_a_dag_of_refs_is_read_in_bounded_time():
    """40 levels of `allOf` naming the next level twice: 2^40 paths; the reading stops after a bounded number of
    subschemas, and the facts read so far (the first path reaches the integer leaf) still hold."""
    defs = {f"d{i}": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(40)}
    defs["d40"] = {"type": "integer"}

    def lookup(ref: str):
        return defs.get(ref.rsplit("/", 1)[-1])

    assert disjoint_branches({}, [{"$ref": "#/$defs/d0"}, {"type": "string"}], lookup) is True
    assert disjoint_branches({}, [{"allOf": [{"type": "string"}, {"$ref": "#/$defs/d0"}]}, {"type": "integer"}], lookup)


# ---- soundness: a claim of disjointness is never contradicted by a value

NAMES = ["a", "b", "k"]
SCALARS = [None, True, 0, 1, 1.0, 1.5, "x", "y", ""]
VALUES = SCALARS + [[], [1], {}] + [
    dict(zip(names, vals)) for n in (1, 2) for names in itertools.combinations(NAMES, n)
    for vals in itertools.product(["x", "y", 1, None, {}], repeat=n)
]

leaf = st.one_of(
    st.builds(lambda t: {"type": t}, st.sampled_from(["string", "integer", "number", "null", "object", "boolean"])),
    st.builds(lambda v: {"const": v}, st.sampled_from(SCALARS)),
    st.builds(lambda vs: {"enum": vs}, st.lists(st.sampled_from(SCALARS), min_size=1, max_size=3)),
    st.just({}),
)


def _object(props, required, closed, typed):
    out: dict = {}
    if props:
        out["properties"] = props
    if required:
        out["required"] = required
    if closed:
        out["additionalProperties"] = False
    if typed:
        out["type"] = "object"
    return out


branch = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.builds(_object, st.dictionaries(st.sampled_from(NAMES), st.one_of(inner, st.just(False)), max_size=2),
                  st.lists(st.sampled_from(NAMES), max_size=2, unique=True), st.booleans(), st.booleans()),
        st.builds(lambda parts: {"allOf": parts}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda t: {"not": {"type": t}}, st.sampled_from(["string", "object", "null"])),
    ),
    max_leaves=4,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rest=st.one_of(st.just({}), st.just({"type": "object"}), st.just({"type": "object", "required": ["k"]}), leaf),
       branches=st.lists(branch, min_size=2, max_size=3))
def test_a_claim_is_never_contradicted(rest, branches):
    if not disjoint_branches(rest, branches, _no_refs):
        return
    for value in VALUES:
        passing = [b for b in branches if jsonschema.Draft202012Validator({"allOf": [rest, b]}).is_valid(value)]
        assert len(passing) <= 1, (value, passing)


# ---- compiled: the union is exact

COMPILED = [
    # WashingtonPost's distributor (JSONSchemaBench wp_*): over the state budget while ranked, as a oneOf
    {"type": "object", "oneOf": [
        {"additionalProperties": False, "properties": {
            "additional_properties": {"type": "object", "additionalProperties": {}},
            "category": {"enum": ["staff", "wires"], "type": "string"}, "mode": {"enum": ["custom"], "type": "string"},
            "name": {"type": "string"}}},
        {"additionalProperties": False, "properties": {"mode": {"enum": ["reference"], "type": "string"},
                                                       "reference_id": {"type": "string"}},
         "required": ["reference_id", "mode"]}]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                "required": ["kind", "r"]},
               {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer"}},
                "required": ["kind"]},
               {"type": "string", "maxLength": 3}]},
]


@pytest.mark.parametrize("schema", COMPILED, ids=["distributor", "shapes"])
def test_disjoint_oneof_compiles_as_its_union(schema):
    assert disjoint_branches({k: v for k, v in schema.items() if k != "oneOf"}, schema["oneOf"], _no_refs)
    dfa = compile_schema(schema).dfa
    assert walk_violations(schema, dfa, 300) == []
    union = compile_schema({**{k: v for k, v in schema.items() if k != "oneOf"}, "anyOf": schema["oneOf"]}).dfa
    assert dfa.n_states == union.n_states
    writer = CanonicalWriter(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    samples = [{"mode": "reference", "reference_id": "r1"}, {"mode": "custom", "name": "n"}, {},
               {"additional_properties": {"z": [1, {"q": None}], "a": 2}, "category": "wires"},
               {"mode": "reference"}, {"kind": "circle", "r": 1.5}, {"kind": "square", "side": 2, "r": 1},
               {"kind": "square"}, "abc", "abcd", {"kind": "circle"}, {"reference_id": "r", "mode": "custom"}]
    for value in samples:
        assert dfa.matches(writer.text(value)) == oracle.is_valid(value), value


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rest=st.one_of(st.just({}), st.just({"type": "object"}), st.just({"type": "object", "required": ["k"]})),
       branches=st.lists(branch, min_size=2, max_size=3))
def test_compiled_disjoint_oneof_agrees_with_python_jsonschema(rest, branches):
    """End to end: a oneOf the reading finds disjoint, compiled (as its union) and written by the corpus writer
    (which must take the same key order), accepts exactly the pool's valid values."""
    if not disjoint_branches(rest, branches, _no_refs):
        return
    schema = {**rest, "oneOf": branches}
    oracle = jsonschema.Draft202012Validator(schema)
    try:
        dfa = compile_schema(schema).dfa
    except UnsupportedSchema as err:  # only an empty language, and then no value of the pool is valid either
        assert "no JSON value" in str(err)
        assert not [v for v in VALUES if oracle.is_valid(v)]
        return
    writer = CanonicalWriter(schema)
    for value in VALUES:
        try:
            text = writer.text(value)
        except NotCanonicalisable:
            continue
        assert dfa.matches(text) == oracle.is_valid(value), (value, text)
