"""Policy stage: tools, tool_choice, parallel_tool_calls, response_format → an immutable `Policy`."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.errors import InvalidSchema, RequestError
from constrain.policy import MAX_PARALLEL_CALLS, Policy, ResponseFormat, ToolSpec
from constrain.protocol import ChatRequest
from paths import DATA  # noqa: E402


USER = [{"role": "user", "content": "hi"}]


STRICT_OK = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "units": {"type": ["string", "null"], "enum": ["c", "f", None]}},
    "required": ["city", "units"],
    "additionalProperties": False,
}


def strict_tool(parameters: dict, name: str = "s") -> dict:
    return {"type": "function", "function": {"name": name, "strict": True, "parameters": parameters}}


def strict_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "strict": True, "schema": schema}}


def tool(name: str, **function: object) -> dict:
    params = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    return {"type": "function", "function": {"name": name, "parameters": params, **function}}


TOOLS = [tool("a"), tool("b"), tool("c")]


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def allowed(mode: str, *names: str) -> dict:
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [named(n) for n in names]}}


def bounds(p: Policy) -> tuple:
    return p.mode, p.allowed, p.named, p.parallel, p.min_calls, p.max_calls


# ---------------------------------------------------------------------------
# modes
# ---------------------------------------------------------------------------

M = MAX_PARALLEL_CALLS
MODES = [
    # (tool_choice, parallel_tool_calls) → (mode, allowed, named, parallel, min_calls, max_calls)
    (None, None, ("auto", ("a", "b", "c"), False, True, 0, M)),  # default with tools: auto, parallel
    ("none", None, ("none", (), False, False, 0, 0)),
    ("none", False, ("none", (), False, False, 0, 0)),
    ("auto", None, ("auto", ("a", "b", "c"), False, True, 0, M)),
    ("auto", True, ("auto", ("a", "b", "c"), False, True, 0, M)),
    ("auto", False, ("auto", ("a", "b", "c"), False, False, 0, 1)),
    ("required", None, ("required", ("a", "b", "c"), False, True, 1, M)),
    ("required", False, ("required", ("a", "b", "c"), False, False, 1, 1)),
    (named("b"), None, ("required", ("b",), True, False, 1, 1)),
    (named("b"), True, ("required", ("b",), True, False, 1, 1)),  # parallel is irrelevant to a named choice
    (named("b"), False, ("required", ("b",), True, False, 1, 1)),
    (allowed("auto", "c", "a"), None, ("auto", ("a", "c"), False, True, 0, M)),  # declaration order
    (allowed("required", "c"), None, ("required", ("c",), False, True, 1, M)),
    (allowed("required", "c", "a", "c"), False, ("required", ("a", "c"), False, False, 1, 1)),
]


@pytest.mark.parametrize("choice, parallel, expected", MODES)
def test_mode(choice, parallel, expected):
    body = {"tools": TOOLS}
    if choice is not None:
        body["tool_choice"] = choice
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    p = Policy.from_request(body)
    assert bounds(p) == expected
    assert [t.name for t in p.tools] == ["a", "b", "c"]  # every declared tool reaches the prompt, whatever the mode


@pytest.mark.parametrize("choice", [None, "none", "auto"])
def test_no_tools_means_no_calls(choice):
    p = Policy.from_request({"messages": USER} if choice is None else {"messages": USER, "tool_choice": choice})
    assert bounds(p) == ("none", (), False, False, 0, 0) and p.tools == ()


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_without_tools_is_harmless(parallel):
    # OpenAI 400s this; we accept it because it cannot contradict anything (no tool can be called).
    assert bounds(Policy.from_request(parallel_tool_calls=parallel)) == ("none", (), False, False, 0, 0)


def test_defaults():
    p = Policy.from_request(tools=TOOLS)
    assert (p.response_format, p.max_tokens, p.thinking, p.reasoning_budget, p.relax_non_strict) == (None, None, None, None, True)
    assert Policy() == Policy.from_request({})
    assert bounds(Policy()) == ("none", (), False, False, 0, 0)


def test_tool_specs():
    p = Policy.from_request(tools=[tool("a", description="d", strict=False), {"type": "function", "function": {"name": "b", "strict": True}}])
    assert p.tools[0] == ToolSpec("a", TOOLS[0]["function"]["parameters"], False, "d")
    # omitted parameters: an empty parameter list, in the strict subset's spelling for a strict tool
    assert p.tool("b") == ToolSpec("b", {"type": "object", "properties": {}, "required": [], "additionalProperties": False}, True, None)
    assert Policy.from_request(tools=[{"type": "function", "function": {"name": "c"}}]).tools[0].parameters == {"type": "object", "properties": {}}
    with pytest.raises(KeyError):
        p.tool("zz")


def test_other_request_fields():
    fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}}
    p = Policy.from_request(
        {"messages": USER, "max_completion_tokens": 99, "response_format": fmt,
         "chat_template_kwargs": {"enable_thinking": True, "thinking_budget": 512}}
    )
    assert p.response_format == ResponseFormat("json_schema", "out", {"type": "object"}, False, None)
    assert (p.max_tokens, p.thinking, p.reasoning_budget) == (99, True, 512)
    assert Policy.from_request(response_format={"type": "text"}).response_format is None  # text is the default
    assert Policy.from_request(response_format={"type": "json_object"}).response_format == ResponseFormat("json_object")


def test_keyword_fields_merge_over_body():
    base = {"messages": USER, "tools": TOOLS, "tool_choice": "none"}
    assert Policy.from_request(base, tool_choice="required") == Policy.from_request({**base, "tool_choice": "required"})
    assert Policy.from_request(tools=TOOLS, tool_choice="required") == Policy.from_request({"tools": TOOLS, "tool_choice": "required"})
    with pytest.raises(TypeError):
        Policy.from_request(tool_choise="required")


def test_from_chat_request_matches_from_request():
    body = {"messages": USER, "tools": TOOLS, "tool_choice": allowed("auto", "b"), "parallel_tool_calls": False}
    assert Policy.from_chat_request(ChatRequest.from_body(body)) == Policy.from_request(body)


# ---------------------------------------------------------------------------
# errors of the policy stage (shape errors: tests/test_protocol.py)
# ---------------------------------------------------------------------------

POLICY_ERRORS = [
    ({"tools": TOOLS, "tool_choice": named("zz")}, RequestError, "/tool_choice/function/name", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": allowed("auto", "a", "zz")}, RequestError, "/tool_choice/allowed_tools/tools/1/function/name", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": allowed("required", "a", "a", "zz")}, RequestError, "/tool_choice/allowed_tools/tools/2/function/name", "invalid_value"),
    ({"tool_choice": "required"}, RequestError, "/tool_choice", "invalid_value"),
    ({"tool_choice": named("a")}, RequestError, "/tool_choice", "invalid_value"),
    ({"tool_choice": allowed("auto", "a")}, RequestError, "/tool_choice", "invalid_value"),
    ({"tools": [], "tool_choice": "required"}, RequestError, "/tools", "empty_array"),
    ({"tools": [tool("a"), tool("a")]}, RequestError, "/tools/1/function/name", "invalid_value"),
    ({"tools": [tool("a"), tool("b", strict=True)]}, InvalidSchema, "/tools/1/function/parameters", "invalid_function_parameters"),
    ({"messages": [{"role": "user"}], "tools": TOOLS}, RequestError, "/messages/0/content", "missing_required_parameter"),
    # strict tools and response_format: OpenAI's strict subset (schema.check_strict), pointer inside the schema
    ({"tools": [tool("a"), strict_tool({**STRICT_OK, "additionalProperties": True})]},
     InvalidSchema, "/tools/1/function/parameters", "invalid_function_parameters"),
    ({"tools": [strict_tool({**STRICT_OK, "required": ["city"]})]},
     InvalidSchema, "/tools/0/function/parameters/required", "invalid_function_parameters"),
    ({"tools": [strict_tool({**STRICT_OK, "properties": {"city": {"type": "string", "format": "uri"}, "units": {"type": "null"}}})]},
     InvalidSchema, "/tools/0/function/parameters/properties/city/format", "invalid_function_parameters"),
    ({"tools": [strict_tool({**STRICT_OK, "allOf": [{}]})]}, InvalidSchema, "/tools/0/function/parameters/allOf", "invalid_function_parameters"),
    ({"tools": [strict_tool({**STRICT_OK, "properties": {"city": {"type": "object", "properties": {}}, "units": {"type": "null"}}})]},
     InvalidSchema, "/tools/0/function/parameters/properties/city", "invalid_function_parameters"),
    ({"tools": [strict_tool({"type": "object", "properties": {}})]}, InvalidSchema, "/tools/0/function/parameters", "invalid_function_parameters"),
    ({"response_format": strict_format({"type": "object", "properties": {}})},
     InvalidSchema, "/response_format/json_schema/schema", "invalid_json_schema"),
    ({"response_format": strict_format({"anyOf": [STRICT_OK]})}, InvalidSchema, "/response_format/json_schema/schema/anyOf", "invalid_json_schema"),
    ({"response_format": strict_format({**STRICT_OK, "properties": {"city": {"not": {}}, "units": {"type": "null"}}})},
     InvalidSchema, "/response_format/json_schema/schema/properties/city/not", "invalid_json_schema"),
    ([("tools", TOOLS)], RequestError, "", "invalid_type"),
]


@pytest.mark.parametrize("body, cls, pointer, code", POLICY_ERRORS)
def test_policy_error(body, cls, pointer, code):
    with pytest.raises(cls) as info:
        Policy.from_request(body)
    assert type(info.value) is cls and (info.value.pointer, info.value.code) == (pointer, code)


def test_strict_schemas_in_the_subset_load():
    p = Policy.from_request(tools=[strict_tool(STRICT_OK)], tool_choice="required", response_format=strict_format(STRICT_OK))
    assert p.tools[0].strict and p.response_format.strict
    # strict: false (or omitted) tools are not held to the subset; relaxing them later is the policy flag's job
    loose = {"type": "object", "properties": {"a": {"type": "string", "format": "uri"}}}
    assert not Policy.from_request(tools=[tool("a", parameters=loose, strict=False)]).tools[0].strict


def test_unknown_named_tool_param():
    with pytest.raises(RequestError) as info:
        Policy.from_request(tools=TOOLS, tool_choice=named("zz"))
    assert info.value.param == "tool_choice.function.name"


@pytest.mark.parametrize(
    "fields",
    [
        {"mode": "sometimes"},
        {"tools": (ToolSpec("a", {}),), "mode": "auto", "allowed": ("b",), "max_calls": 1},
        {"tools": (ToolSpec("a", {}), ToolSpec("a", {})), "mode": "none"},
        {"tools": (ToolSpec("a", {}),), "mode": "required", "allowed": ("a",), "min_calls": 0, "max_calls": 1},
        {"tools": (ToolSpec("a", {}),), "mode": "auto", "allowed": ("a",), "max_calls": 0},
        {"tools": (ToolSpec("a", {}),), "mode": "auto", "allowed": ("a",), "max_calls": 2, "parallel": False},
        {"tools": (ToolSpec("a", {}),), "mode": "required", "allowed": ("a",), "named": True, "min_calls": 1, "max_calls": 2, "parallel": True},
        {"mode": "auto", "max_calls": 1},
        {"tools": [ToolSpec("a", {})]},
    ],
)
def test_inconsistent_direct_construction(fields):
    with pytest.raises((ValueError, TypeError)):
        Policy(**fields)


# ---------------------------------------------------------------------------
# immutability, hashing, key()
# ---------------------------------------------------------------------------


def test_policy_is_frozen_hashable_picklable():
    p = Policy.from_request(tools=TOOLS, tool_choice="required", response_format={
        "type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object", "properties": {"x": {"enum": [1, 2]}}}}})
    twin = pickle.loads(pickle.dumps(p))
    assert twin == p and hash(twin) == hash(p) and twin.key() == p.key()
    assert {p: 1}[Policy.from_request(tools=TOOLS, tool_choice="required", response_format=dict(
        type="json_schema", json_schema={"name": "o", "schema": {"type": "object", "properties": {"x": {"enum": [1, 2]}}}}))] == 1
    with pytest.raises(AttributeError):
        p.mode = "none"  # type: ignore[misc]
    with pytest.raises(TypeError):
        p.tools[0].parameters["properties"]["q"]["type"] = "integer"


BASE = {"messages": USER, "tools": TOOLS, "tool_choice": "auto"}


def test_key_is_stable():
    key = Policy.from_request(BASE).key()
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == Policy.from_request(json.loads(json.dumps(BASE))).key()
    assert key == pickle.loads(pickle.dumps(Policy.from_request(BASE))).key()
    # Pinned: a change here invalidates every cached index, so it must be deliberate (bump _KEY_VERSION).
    assert Policy().key() == Policy.from_request({}).key() == "9aa9f90139736c54556f74fb8c80a2a1d2784a2b1b991acbb2040c35204aba29"


@pytest.mark.parametrize(
    "change",
    [
        {"messages": [{"role": "user", "content": "something else"}]},
        {"max_tokens": 5},
        {"max_completion_tokens": 500},
        {"temperature": 0.1, "seed": 7, "stream": True, "stop": "x"},
        {"tools": [tool("a", description="other words"), tool("b"), tool("c")]},  # descriptions reach the prompt only
        {"tool_choice": allowed("auto", "a", "b", "c")},  # the same policy, spelled differently
        {"tool_choice": None},  # default with tools is auto
        {"parallel_tool_calls": True},  # the default
        {"response_format": {"type": "text"}},  # the default
        {"user": "someone", "logprobs": True},
    ],
)
def test_key_ignores_what_does_not_shape_the_grammar(change):
    assert Policy.from_request({**BASE, **change}).key() == Policy.from_request(BASE).key()


@pytest.mark.parametrize(
    "change",
    [
        {"tools": TOOLS[:2]},
        {"tools": [TOOLS[1], TOOLS[0], TOOLS[2]]},
        {"tools": [tool("a", parameters={"type": "object", "properties": {"q": {"type": "integer"}}}), TOOLS[1], TOOLS[2]]},
        {"tools": [tool("a", parameters={"type": "object", "required": ["q"], "properties": {"q": {"type": "string"}}}), TOOLS[1], TOOLS[2]]},
        {"tools": [tool("a", parameters={"type": "object", "properties": {"q": {"const": 1.0}}}), TOOLS[1], TOOLS[2]]},
        {"tools": [tool("z"), TOOLS[1], TOOLS[2]]},
        {"tools": [tool("a", parameters={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"], "additionalProperties": False}, strict=True), TOOLS[1], TOOLS[2]]},
        {"tool_choice": "none"},
        {"tool_choice": "required"},
        {"tool_choice": named("a")},
        {"tool_choice": allowed("auto", "a")},
        {"tool_choice": allowed("required", "a", "b", "c")},
        {"parallel_tool_calls": False},
        {"response_format": {"type": "json_object"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "object"}}}},
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template_kwargs": {"thinking_budget": 128}},
    ],
)
def test_key_changes_with_what_shapes_the_grammar(change):
    assert Policy.from_request({**BASE, **change}).key() != Policy.from_request(BASE).key()


def test_shallower_is_part_of_the_key_only_when_set():
    import dataclasses

    base = Policy.from_request(BASE)
    assert not base.shallower
    assert dataclasses.replace(base, shallower=True).key() != base.key()
    assert dataclasses.replace(base, shallower=False).key() == base.key()  # (the keys cached before it stay valid)


def test_key_sees_integer_vs_float_and_schema_details():
    def key(const: object) -> str:
        return Policy.from_request(tools=[tool("a", parameters={"type": "object", "properties": {"q": {"const": const}}})]).key()

    assert len({key(1), key(1.0), key(True), key("1")}) == 4


def test_key_sees_relax_flag():
    p = Policy.from_request(BASE)
    from dataclasses import replace

    assert replace(p, relax_non_strict=False).key() != p.key()
    assert replace(p, max_tokens=3).key() == p.key()


def test_named_choice_ignores_parallel_in_key():
    a = Policy.from_request({**BASE, "tool_choice": named("a"), "parallel_tool_calls": True})
    b = Policy.from_request({**BASE, "tool_choice": named("a"), "parallel_tool_calls": False})
    assert a == b and a.key() == b.key()


# ---------------------------------------------------------------------------
# real tool sets
# ---------------------------------------------------------------------------


def _tool_sets() -> list[tuple[str, list]]:
    out = []
    for path in sorted((DATA / "bfcl" / "openai").glob("*.jsonl")) + [DATA / "mcp_reference_servers" / "tools.jsonl"]:
        for n, line in enumerate(path.read_text().splitlines()):
            rec = json.loads(line)
            if rec.get("tools"):
                out.append((f"{path.parent.name}/{path.stem}:{rec.get('id', rec.get('server', n))}", rec["tools"]))
    return out


TOOL_SETS = _tool_sets()


def _swap_dots(tools: list) -> list:
    """BFCL's harness swaps '.' for '_' in function names before sending them to OpenAI."""
    tools = json.loads(json.dumps(tools))
    for t in tools:
        t["function"]["name"] = t["function"]["name"].replace(".", "_")
    return tools


def test_real_tool_sets_are_there():
    assert len(TOOL_SETS) > 1500
    assert sum(any("." in t["function"]["name"] for t in tools) for _, tools in TOOL_SETS) > 100


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_real_tool_sets_load(choice):
    for where, tools in TOOL_SETS:
        swapped = _swap_dots(tools)
        p = Policy.from_request(tools=swapped, tool_choice=choice)
        assert [t.name for t in p.tools] == [t["function"]["name"] for t in swapped], where
        assert [t.parameters for t in p.tools] == [t["function"].get("parameters", {"type": "object", "properties": {}}) for t in swapped], where
        named_policy = Policy.from_request(tools=swapped, tool_choice=named(swapped[-1]["function"]["name"]))
        assert named_policy.allowed == (swapped[-1]["function"]["name"],), where


def test_raw_bfcl_dotted_names_are_rejected():
    rejected = 0
    for where, tools in TOOL_SETS:
        dotted = [i for i, t in enumerate(tools) if "." in t["function"]["name"]]
        if not dotted:
            continue
        with pytest.raises(RequestError) as info:
            Policy.from_request(tools=tools)
        assert (info.value.pointer, info.value.code) == (f"/tools/{dotted[0]}/function/name", "invalid_value"), where
        assert info.value.param == f"tools[{dotted[0]}].function.name"
        rejected += 1
    assert rejected > 100


def test_mcp_tools_as_strict_fail_closed_with_a_pointer():
    # None of the MCP reference schemas says additionalProperties: false, so none is in OpenAI's strict subset:
    # asked for strict, each is a 400 that points into its parameters, never a silently non-strict tool.
    for line in (DATA / "mcp_reference_servers" / "tools.jsonl").read_text().splitlines():
        for t in json.loads(line)["tools"]:
            with pytest.raises(InvalidSchema) as info:
                Policy.from_request(tools=[tool("ok"), {"type": "function", "function": {**t["function"], "strict": True}}])
            assert info.value.code == "invalid_function_parameters"
            assert info.value.pointer.startswith("/tools/1/function/parameters")


# ---------------------------------------------------------------------------
# fuzzing the policy stage
# ---------------------------------------------------------------------------

_names = st.sampled_from(["a", "b", "c", "zz", "a.b", ""])
_choice = (
    st.sampled_from(["none", "auto", "required", "any", None])
    | _names.map(named)
    | st.tuples(st.sampled_from(["auto", "required", "none"]), st.lists(_names, max_size=3)).map(
        lambda t: {"type": "allowed_tools", "allowed_tools": {"mode": t[0], "tools": [named(n) for n in t[1]]}})
)
_tools = st.lists(_names.map(tool), max_size=4) | st.none()


_junk = st.recursive(
    st.none() | st.booleans() | st.integers(-2, 3) | st.floats() | st.sampled_from(["object", "string", "null", "date", "a", ""]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(list(STRICT_OK) + [
        "items", "anyOf", "$defs", "$ref", "format", "enum", "const", "pattern", "minimum", "not", "city", "units"]), inner, max_size=4),
    max_leaves=25,
)
_strict_schemas = st.dictionaries(st.sampled_from(list(STRICT_OK) + ["anyOf", "items", "$defs", "format"]), _junk, max_size=5).map(
    lambda d: {"type": "object", **d})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_strict_schemas, st.booleans())
def test_fuzzed_strict_schemas_raise_only_request_errors(schema, as_format):
    body = {"response_format": strict_format(schema)} if as_format else {"tools": [strict_tool(schema)]}
    try:
        Policy.from_request(body)
    except RequestError as err:
        assert err.pointer.startswith("/response_format/json_schema/schema" if as_format else "/tools/0/function/parameters")
        assert err.code in ("invalid_type", "invalid_function_parameters", "invalid_json_schema")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tools, _choice, st.sampled_from([True, False, None, "x"]))
def test_fuzzed_policies_are_consistent(tools, choice, parallel):
    try:
        p = Policy.from_request(tools=tools, tool_choice=choice, parallel_tool_calls=parallel)
    except RequestError as err:
        assert err.pointer.startswith("/tools") or err.pointer.startswith("/tool_choice") or err.pointer == "/parallel_tool_calls"
        return
    # Policy.__post_init__ checks the invariants; here the semantics against the request.
    assert set(p.allowed) <= {t.name for t in p.tools}
    if p.mode == "none":
        assert p.max_calls == 0
    else:
        assert 1 <= p.max_calls <= MAX_PARALLEL_CALLS and p.allowed
        if parallel is False or p.named:
            assert p.max_calls == 1
    assert p.min_calls == (1 if p.mode == "required" else 0)
    assert p == pickle.loads(pickle.dumps(p)) and p.key() == pickle.loads(pickle.dumps(p)).key()
