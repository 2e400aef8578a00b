"""Shared-corpus ratchet and soundness walks for the schema compiler (see tests/corpus.py and benchmarks/coverage.py).

Baselines live in tests/baselines/; `python benchmarks/coverage.py --update` rewrites them after a deliberate change.
"""

from __future__ import annotations

import json
import random
import zlib

import pytest

import corpus
from constrain import InvalidSchema, UnsupportedSchema
from constrain.schema import compile_schema

# ---------------------------------------------------------------------------
# loaders: the corpora are the ones the README describes
# ---------------------------------------------------------------------------


def test_jsonschemabench_counts():
    cases = corpus.jsonschemabench()
    assert len(cases) == 5653
    assert sum(len(c.instances) for c in cases) == 15015
    assert len({c.id for c in cases}) == len(cases)


def test_json_schema_test_suite_counts():
    cases = corpus.json_schema_test_suite()
    assert len(cases) == 692
    assert sum(len(c.instances) for c in cases) == 3741
    assert {c.draft for c in cases} == {"Draft202012Validator", "Draft7Validator"}


def test_tools_ids_are_unique_and_calls_attached():
    cases = corpus.tools()
    assert len({c.id for c in cases}) == len(cases)
    groups = {c.group for c in cases}
    assert {"BFCL/simple_python", "BFCL/multi_turn", "MCP", "StableToolBench/G1_tool"} <= groups
    simple = [c for c in cases if c.group == "BFCL/simple_python"]
    assert sum(len(c.instances) for c in simple) == 400


# ---------------------------------------------------------------------------
# the canonical writer
# ---------------------------------------------------------------------------


def _text(schema, data, **kw):
    return corpus.CanonicalWriter(schema, **kw).text(data).decode()


def test_writer_orders_declared_then_undeclared_in_instance_order():
    schema = {"type": "object", "properties": {"b": {}, "a": {}}}
    assert _text(schema, {"z": 1, "a": 2, "y": 3, "b": 4}) == '{"b":4,"a":2,"z":1,"y":3}'


def test_writer_follows_ref_and_allof_order():
    schema = {
        "$defs": {"base": {"properties": {"x": {}, "y": {}}}},
        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"a": {}, "x": {}}}],
        "properties": {"p": {}},
    }
    assert _text(schema, {"a": 1, "y": 2, "x": 3, "p": 4}) == '{"p":4,"x":3,"y":2,"a":1}'


def test_writer_takes_first_valid_anyof_branch_after_parent():
    schema = {
        "properties": {"kind": {}},
        "anyOf": [
            {"properties": {"n": {"type": "integer"}, "m": {}}, "required": ["n"]},
            {"properties": {"m": {}, "n": {}}},
        ],
    }
    assert _text(schema, {"m": 1, "n": 2, "kind": 0}) == '{"kind":0,"n":2,"m":1}'
    assert _text(schema, {"m": 1, "n": "s", "kind": 0}) == '{"kind":0,"m":1,"n":"s"}'


def test_writer_recurses_into_items_and_additional_properties():
    schema = {
        "type": "array",
        "prefixItems": [{"properties": {"b": {}, "a": {}}}],
        "items": {"additionalProperties": {"properties": {"d": {}, "c": {}}}},
    }
    data = [{"a": 1, "b": 2}, {"k": {"c": 1, "d": 2}}]
    assert _text(schema, data) == '[{"b":2,"a":1},{"k":{"d":2,"c":1}}]'


def _accepted(schema, text, **options):
    return compile_schema(schema, **{**corpus.OPTIONS, **options}).dfa.matches(text.encode())


def test_writer_follows_pattern_properties():
    schema = {
        "additionalProperties": {"properties": {"z": {}, "y": {}}},
        "patternProperties": {"^p": {"properties": {"b": {}, "a": {}}}},
        "properties": {"p0": {"properties": {"d": {}}}},
    }
    text = _text(schema, {"p1": {"a": 1, "b": 2}, "q": {"y": 1, "z": 2}, "p0": {"a": 0, "d": 1}})
    assert text == '{"p0":{"d":1,"a":0},"p1":{"b":2,"a":1},"q":{"z":2,"y":1}}'
    assert _accepted(schema, text)


def test_writer_writes_undeclared_required_names_in_required_order():
    schema = {"properties": {"a": {}}, "required": ["c", "a", "b"]}
    text = _text(schema, {"b": 1, "z": 0, "c": 2, "a": 3})
    assert text == '{"a":3,"c":2,"b":1,"z":0}'
    assert _accepted(schema, text) and not _accepted(schema, '{"a":3,"b":1,"c":2,"z":0}')
    # dependencies: [name, its requirements], as `required` orders them
    deps = {"properties": {"a": {}}, "dependentRequired": {"a": ["d", "c"]}}
    text = _text(deps, {"c": 1, "d": 2, "a": 0})
    assert text == '{"a":0,"d":2,"c":1}'
    assert _accepted(deps, text)


def test_writer_follows_if_then_else():
    schema = {"if": {"properties": {"k": {"const": 1}}}, "then": {"properties": {"b": {}, "a": {}}}, "properties": {"x": {}}}
    text = _text(schema, {"a": 0, "b": 0, "k": 1, "x": 0})
    assert text == '{"x":0,"k":1,"b":0,"a":0}'
    assert _accepted(schema, text, max_depth=1)  # the `else` side's universe at depth 3 passes the time budget


def test_writer_writes_contains_elements_with_the_contains_schema():
    # an element valid against `contains` is written as allOf[items, contains]: the array needs one such text
    schema = {"type": "array", "items": {"properties": {"b": {}}}, "contains": {"properties": {"a": {}, "k": {"const": 1}}, "required": ["k"]}}
    text = _text(schema, [{"k": 1, "a": 0, "b": 0}, {"a": 0, "b": 0}])
    assert text == '[{"b":0,"a":0,"k":1},{"b":0,"a":0}]'
    assert _accepted(schema, text) and not _accepted(schema, '[{"b":0,"k":1,"a":0},{"b":0,"a":0}]')


def test_writer_ranks_keys_below_a_oneof():
    # the names the oneOf mentions, in their first mention (x, k, y), order every object of every branch
    schema = {"oneOf": [
        {"properties": {"x": {}, "k": {"const": 1}}, "required": ["k"]},
        {"properties": {"y": {}, "x": {}, "k": {"const": 2}}, "required": ["k"]},
    ]}
    text = _text(schema, {"y": 1, "x": 2, "k": 2})
    assert text == '{"x":2,"k":2,"y":1}'
    assert _accepted(schema, text) and not _accepted(schema, '{"y":1,"x":2,"k":2}')


def test_writer_ranks_keys_under_not_schema_wide():
    # under `not`, the ranking is every name of the whole schema in first-mention order: o, a, c, b
    schema = {
        "$defs": {"d": {"properties": {"a": {}, "c": {}}}},
        "properties": {"o": {"properties": {"b": {}, "a": {}}, "not": {"required": ["c"], "minProperties": 3}}},
    }
    text = _text(schema, {"o": {"b": 1, "a": 2}})
    assert text == '{"o":{"a":2,"b":1}}'
    assert _accepted(schema, text) and not _accepted(schema, '{"o":{"b":1,"a":2}}')


def test_writer_keeps_schema_order_under_a_not_of_names():
    # `not: {required: [...]}` is compiled without the universe (`negated`): no ranking, declared order
    schema = {"$defs": {"d": {"properties": {"a": {}, "c": {}}}},
              "properties": {"o": {"properties": {"b": {}, "a": {}}, "not": {"required": ["c"]}}}}
    text = _text(schema, {"o": {"a": 2, "b": 1}})
    assert text == '{"o":{"b":1,"a":2}}'
    assert _accepted(schema, text)


def test_writer_numbers_strings_and_const_order():
    assert _text({}, [1.0, -0.0, 2.5, 1e-7, 12345678901234567890, "é\n\u2028"]) == '[1,0,2.5,0.0000001,12345678901234567890,"é\\n\u2028"]'
    assert _text({"const": {"b": 1, "a": [2]}}, {"a": [2.0], "b": 1}) == '{"b":1,"a":[2]}'


def test_writer_flexible_separators():
    schema = {"properties": {"a": {}, "b": {}}}
    assert _text(schema, {"b": [1, 2], "a": 0}, separators=(", ", ": ")) == '{"a": 0, "b": [1, 2]}'


def test_writer_refuses_lone_surrogates_and_non_finite_numbers():
    with pytest.raises(corpus.NotCanonicalisable):
        corpus.CanonicalWriter({}).text("\ud800")
    with pytest.raises(corpus.NotCanonicalisable):
        corpus.CanonicalWriter({}).text(float("inf"))


def test_flexible_whitespace_accepts_the_spaced_style_on_tool_schemas():
    cases = corpus.sample([c for c in corpus.tools() if c.group.startswith("BFCL/") and c.instances], 3, seed=3)
    checked = 0
    for case in cases:
        flexible = compile_schema(case.schema, whitespace="flexible").dfa
        compact = compile_schema(case.schema, whitespace="compact").dfa
        oracle = corpus.validator(case.schema)
        spaced = corpus.CanonicalWriter(case.schema, separators=(", ", ": "), oracle=oracle)
        tight = corpus.CanonicalWriter(case.schema, oracle=oracle)
        for inst in case.instances:
            if not oracle.is_valid(inst.data):
                continue
            assert flexible.matches(spaced.text(inst.data)), (case.id, inst.id)
            assert compact.matches(tight.text(inst.data)), (case.id, inst.id)
            if spaced.text(inst.data) != tight.text(inst.data):
                assert not compact.matches(spaced.text(inst.data)), (case.id, inst.id)
            checked += 1
    assert checked >= 20


# ---------------------------------------------------------------------------
# the ratchet
# ---------------------------------------------------------------------------


def _ratchet(name: str, cases: list[corpus.Case]) -> None:
    results = corpus.run_cases(cases, workers=2)
    crashes = {cid: r["reason"] for cid, r in results.items() if r["status"] in ("crash", "hang")}
    assert not crashes, f"compiler crashed or hung: {crashes}"
    baseline = corpus.load_baseline(name)
    regressions, improvements, unstable = corpus.compare(baseline, results)
    if len(cases) < len(baseline["schemas"]):  # a sample: schemas it did not run are not lost
        regressions = [r for r in regressions if not r.endswith("in the baseline but not in the corpus")]
    for line in improvements:
        print(f"IMPROVED {name}: {line} (run benchmarks/coverage.py --update to lock it in)")
    for line in unstable:
        print(f"TIME BUDGET {name}: {line}")
    assert not regressions, f"{len(regressions)} regressions against tests/baselines/{name}.json:\n" + "\n".join(regressions[:50])


@pytest.mark.parametrize("name", list(corpus.CORPORA))
def test_ratchet_sample(name):
    """A seeded sample (1-2 schemas per group) against the committed baseline; the full run is below."""
    _ratchet(name, corpus.sample(corpus.CORPORA[name](), 1 if name == "json_schema_test_suite" else 2, seed=7))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(corpus.CORPORA))
def test_ratchet_full(name):
    _ratchet(name, corpus.CORPORA[name]())


def test_compare_flags_regressions_and_reports_improvements():
    baseline = {"schemas": {
        "a": {"status": "compiled", "instances": {"0": "agree", "1": "false_reject", "2": "agree"}},
        "b": {"status": "UnsupportedSchema"},
        "c": {"status": "compiled"},
        "gone": {"status": "compiled"},
    }}
    results = {
        "a": {"status": "compiled", "instances": {"0": "false_reject", "1": "agree", "2": "false_accept"}},
        "b": {"status": "compiled", "instances": {"0": "false_accept"}},
        "c": {"status": "BudgetExceeded", "reason": "schema compilation exceeded its time budget", "instances": {}},
    }
    regressions, improvements, unstable = corpus.compare(baseline, results)
    assert regressions == [
        "a instance 0: agree -> false_reject",
        "a instance 2: agree -> false_accept",
        "b instance 0: None -> false_accept",
        "gone: in the baseline but not in the corpus",
    ]
    assert improvements == ["a instance 1: false_reject -> agree", "b: UnsupportedSchema -> compiled"]
    assert unstable == ["c: compiled -> BudgetExceeded (schema compilation exceeded its time budget)"]


# ---------------------------------------------------------------------------
# soundness: every text sampled from a compiled automaton is valid
# ---------------------------------------------------------------------------


def _walk_cases(cases: list[corpus.Case], n_walks: int) -> None:
    compiled = 0
    bad = {}
    for case in cases:
        try:
            dfa = compile_schema(case.compiled_schema, **corpus.OPTIONS).dfa
        except (InvalidSchema, UnsupportedSchema):
            continue
        compiled += 1
        violations = corpus.walk_violations(case.schema, dfa, n_walks, seed=zlib.crc32(case.id.encode()), draft=case.draft)
        if violations:
            bad[case.id] = violations[:3]
    assert compiled >= len(cases) // 3
    assert not bad, json.dumps(bad, indent=1, ensure_ascii=False)[:4000]


def test_walks_bfcl_tool_schemas_sample():
    cases = corpus.sample([c for c in corpus.tools() if c.group.startswith("BFCL/")], 8, seed=11)
    _walk_cases(cases, 20)


def test_walks_jsonschemabench_sample():
    cases = [c for c in corpus.sample(corpus.jsonschemabench(), 3, seed=5) if len(json.dumps(c.schema)) < 20_000]
    _walk_cases(cases, 10)


@pytest.mark.slow
def test_walks_all_bfcl_tool_schemas():
    _walk_cases([c for c in corpus.tools() if c.group.startswith("BFCL/")], 20)


# ---------------------------------------------------------------------------
# token level (Llama 3 vocabulary): walks through the token index, and real tokenizations of valid instances
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama3_tokenizer():
    from constrain import assets

    transformers = pytest.importorskip("transformers")
    path = assets.gguf_path("llama-bpe")
    if not path.exists():
        pytest.fail(f"missing {path} (fix: `python -m constrain.assets fetch`)")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _token_cases() -> list[corpus.Case]:
    return corpus.sample([c for c in corpus.tools() if c.group.startswith("BFCL/") and c.instances], 2, seed=13)


def test_token_walks_llama3(llama3_vocab):
    """Random token sequences allowed by the masks decode to valid instances."""
    from constrain.compiler import compile_json_schema

    rng = random.Random(1)
    bad = []
    for case in _token_cases():
        index = compile_json_schema(case.schema, llama3_vocab, cache=None)
        oracle = corpus.validator(case.schema)
        for _ in range(5):
            ids, finished = corpus.token_walk(index, rng)
            assert finished, (case.id, ids)
            text = llama3_vocab.decode(ids)
            try:
                valid = oracle.is_valid(json.loads(text))
            except ValueError:
                valid = False
            if not valid:
                bad.append((case.id, text[:200]))
    assert not bad, bad[:5]


def test_token_level_accepts_real_tokenizations_llama3(llama3_vocab, llama3_tokenizer):
    """Valid instances in canonical form, tokenized by the real Llama 3 tokenizer, pass the masks and end accepting."""
    from constrain.compiler import compile_json_schema

    checked, bad = 0, []
    for case in _token_cases():
        index = compile_json_schema(case.schema, llama3_vocab, cache=None)
        oracle = corpus.validator(case.schema)
        writer = corpus.CanonicalWriter(case.schema, oracle=oracle)
        for inst in case.instances:
            if not oracle.is_valid(inst.data):
                continue
            text = writer.text(inst.data)
            ids = llama3_tokenizer.encode(text.decode(), add_special_tokens=False)
            assert llama3_vocab.decode(ids) == text
            if not corpus.token_accepts(index, ids):
                bad.append((case.id, inst.id, text))
            checked += 1
    assert checked >= 10
    assert not bad, bad[:5]
