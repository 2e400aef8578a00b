"""Request stage: a Chat Completions body → `ChatRequest`, or a `RequestError` with the field's pointer and code."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain.errors import InvalidSchema, RequestError
from constrain.protocol import (
    AllowedToolsChoice,
    ChatRequest,
    FrozenDict,
    FrozenList,
    NamedToolChoice,
    ResponseFormat,
    ToolSpec,
    freeze_json,
)

USER = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
STRICT_OK = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "units": {"type": ["string", "null"], "enum": ["c", "f", None]}},
    "required": ["city", "units"],
    "additionalProperties": False,
}


def tool(name: str = "get_weather", **function: object) -> dict:
    return {"type": "function", "function": {"name": name, **function}}


def body(**fields: object) -> dict:
    return {"model": "m", "messages": USER, **fields}


def call(call_id: str = "call_1", name: str = "get_weather", arguments: str = '{"city":"Paris"}') -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def raises(b: object, cls: type, pointer: str, code: str, **kwargs: object) -> RequestError:
    with pytest.raises(cls) as info:
        ChatRequest.from_body(b, **kwargs)
    assert type(info.value) is cls
    assert (info.value.pointer, info.value.code) == (pointer, code)
    return info.value


# ---------------------------------------------------------------------------
# valid requests
# ---------------------------------------------------------------------------


def test_minimal_request_defaults():
    r = ChatRequest.from_body({"messages": USER})
    assert r.messages[0].role == "user" and r.messages[0].content == "hi"
    assert (r.model, r.tools, r.tool_choice, r.parallel_tool_calls, r.response_format) == (None, None, None, None, None)
    assert (r.max_tokens, r.stream, r.include_usage, r.n, r.stop) == (None, False, False, 1, ())
    assert (r.enable_thinking, r.thinking_budget, r.chat_template_kwargs, r.ignored_fields) == (None, None, None, ())


def test_full_request_is_typed():
    r = ChatRequest.from_body(
        body(
            tools=[WEATHER, tool("noop")],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": STRICT_OK, "strict": True}},
            max_completion_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
            n=1,
            temperature=0.7,
            top_p=1,
            seed=-3,
            stop=["\n\n", "END"],
            chat_template_kwargs={"enable_thinking": False, "thinking_budget": 0, "custom": [1]},
        )
    )
    assert r.tools[0] == ToolSpec("get_weather", WEATHER["function"]["parameters"], False, "Weather for a city.")
    assert r.tools[1].parameters == {"type": "object", "properties": {}}  # omitted parameters
    assert r.tool_choice == NamedToolChoice("get_weather")
    assert r.parallel_tool_calls is False
    assert r.response_format == ResponseFormat("json_schema", "out", STRICT_OK, True, None)
    assert (r.max_tokens, r.stream, r.include_usage, r.temperature, r.top_p, r.seed) == (64, True, True, 0.7, 1.0, -3)
    assert r.stop == ("\n\n", "END")
    assert (r.enable_thinking, r.thinking_budget) == (False, 0)
    assert r.chat_template_kwargs == {"enable_thinking": False, "thinking_budget": 0, "custom": [1]}


def test_nulls_mean_absent():
    fields = ["tools", "tool_choice", "parallel_tool_calls", "response_format", "max_tokens", "max_completion_tokens",
              "stream", "stream_options", "n", "temperature", "top_p", "seed", "stop", "chat_template_kwargs", "model"]
    r = ChatRequest.from_body(body(**{f: None for f in fields}))
    assert r == ChatRequest.from_body(body(model=None))


def test_unknown_fields_are_listed_not_rejected():
    r = ChatRequest.from_body(body(logprobs=True, user="u", x_vendor={"a": 1}))
    assert r.ignored_fields == ("logprobs", "user", "x_vendor")


@pytest.mark.parametrize(
    "choice, expected",
    [
        ("none", "none"),
        ("auto", "auto"),
        ("required", "required"),
        ({"type": "function", "function": {"name": "f"}}, NamedToolChoice("f")),
        (
            {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
                {"type": "function", "function": {"name": "b"}}, {"type": "function", "function": {"name": "a"}}]}},
            AllowedToolsChoice("required", ("b", "a")),
        ),
    ],
)
def test_tool_choice_forms(choice, expected):
    assert ChatRequest.from_body(body(tool_choice=choice)).tool_choice == expected


@pytest.mark.parametrize("fmt", [{"type": "text"}, {"type": "json_object"}])
def test_simple_response_formats(fmt):
    assert ChatRequest.from_body(body(response_format=fmt)).response_format == ResponseFormat(fmt["type"])


def test_max_tokens_spellings():
    assert ChatRequest.from_body(body(max_tokens=5)).max_tokens == 5
    assert ChatRequest.from_body(body(max_completion_tokens=7)).max_tokens == 7
    assert ChatRequest.from_body(body(max_tokens=9, max_completion_tokens=9)).max_tokens == 9


def test_conversation_with_tool_round_trip():
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,"}}]},
        {"role": "assistant", "content": None, "tool_calls": [call("a"), call("b")], "reasoning_content": "hmm"},
        {"role": "tool", "tool_call_id": "b", "content": "sunny"},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "rainy"}]},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "again", "name": "bob"},
    ]
    r = ChatRequest.from_body({"messages": messages})
    assistant = r.messages[2]
    assert assistant.content is None and assistant.reasoning_content == "hmm"
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [
        ("a", "get_weather", '{"city":"Paris"}'), ("b", "get_weather", '{"city":"Paris"}')]
    assert r.messages[3].tool_call_id == "b"
    assert [p.type for p in r.messages[1].content] == ["text", "image_url"]
    assert r.messages[5].content[0].text == "no"
    assert r.messages[6].name == "bob"


def test_messages_optional_only_when_asked():
    assert ChatRequest.from_body({"tools": [WEATHER]}, require_messages=False).messages == ()
    raises({"tools": [WEATHER]}, RequestError, "/messages", "missing_required_parameter")


# ---------------------------------------------------------------------------
# every error: class, pointer (and so param), code
# ---------------------------------------------------------------------------

ERRORS = [
    # body
    ([], RequestError, "", "invalid_type"),
    (body(functions=[{"name": "f"}]), RequestError, "/functions", "unsupported_value"),
    (body(function_call="auto"), RequestError, "/function_call", "unsupported_value"),
    # tools
    (body(tools={}), RequestError, "/tools", "invalid_type"),
    (body(tools=[]), RequestError, "/tools", "empty_array"),
    (body(tools=[tool(f"t{i}") for i in range(129)]), RequestError, "/tools", "array_above_max_length"),
    (body(tools=[WEATHER, "x"]), RequestError, "/tools/1", "invalid_type"),
    (body(tools=[{"function": {"name": "f"}}]), RequestError, "/tools/0/type", "missing_required_parameter"),
    (body(tools=[{"type": "retrieval", "function": {"name": "f"}}]), RequestError, "/tools/0/type", "invalid_value"),
    (body(tools=[{"type": "custom", "custom": {"name": "f"}}]), RequestError, "/tools/0/type", "unsupported_value"),
    (body(tools=[{"type": "function"}]), RequestError, "/tools/0/function", "missing_required_parameter"),
    (body(tools=[{"type": "function", "function": "f"}]), RequestError, "/tools/0/function", "invalid_type"),
    (body(tools=[tool(None)]), RequestError, "/tools/0/function/name", "missing_required_parameter"),
    (body(tools=[tool(3)]), RequestError, "/tools/0/function/name", "invalid_type"),
    (body(tools=[tool("")]), RequestError, "/tools/0/function/name", "invalid_value"),
    (body(tools=[tool("math.sum")]), RequestError, "/tools/0/function/name", "invalid_value"),
    (body(tools=[tool("get weather")]), RequestError, "/tools/0/function/name", "invalid_value"),
    (body(tools=[tool("f\n")]), RequestError, "/tools/0/function/name", "invalid_value"),
    (body(tools=[tool("x" * 65)]), RequestError, "/tools/0/function/name", "string_above_max_length"),
    (body(tools=[WEATHER, tool("a"), WEATHER]), RequestError, "/tools/2/function/name", "invalid_value"),
    (body(tools=[tool(description=1)]), RequestError, "/tools/0/function/description", "invalid_type"),
    (body(tools=[tool(strict="yes")]), RequestError, "/tools/0/function/strict", "invalid_type"),
    (body(tools=[tool(parameters="{}")]), RequestError, "/tools/0/function/parameters", "invalid_type"),
    (body(tools=[tool(parameters={})]), InvalidSchema, "/tools/0/function/parameters/type", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "string"})]), InvalidSchema, "/tools/0/function/parameters/type", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": ["object", "null"]})]), InvalidSchema, "/tools/0/function/parameters/type", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "anyOf": [{"required": ["a"]}]})]),
     InvalidSchema, "/tools/0/function/parameters/anyOf", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "properties": []})]),
     InvalidSchema, "/tools/0/function/parameters/properties", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "properties": {"a": {"type": "str"}}})]),
     InvalidSchema, "/tools/0/function/parameters/properties/a/type", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "required": "a"})]),
     InvalidSchema, "/tools/0/function/parameters/required", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "properties": {"a": {"type": "array", "items": 3}}})]),
     InvalidSchema, "/tools/0/function/parameters/properties/a/items", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "properties": {"a": {"maxLength": -1}}})]),
     InvalidSchema, "/tools/0/function/parameters/properties/a/maxLength", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "properties": {"a": {"multipleOf": 0}}})]),
     InvalidSchema, "/tools/0/function/parameters/properties/a/multipleOf", "invalid_function_parameters"),
    (body(tools=[tool(parameters={"type": "object", "properties": {"a": {"anyOf": []}}})]),
     InvalidSchema, "/tools/0/function/parameters/properties/a/anyOf", "invalid_function_parameters"),
    # tool_choice shapes (the declared-tool checks are policy's: tests/test_policy.py)
    (body(tool_choice="any"), RequestError, "/tool_choice", "invalid_value"),
    (body(tool_choice=1), RequestError, "/tool_choice", "invalid_type"),
    (body(tool_choice={"function": {"name": "f"}}), RequestError, "/tool_choice/type", "missing_required_parameter"),
    (body(tool_choice={"type": "tool", "name": "f"}), RequestError, "/tool_choice/type", "invalid_value"),
    (body(tool_choice={"type": "custom", "custom": {"name": "f"}}), RequestError, "/tool_choice/type", "unsupported_value"),
    (body(tool_choice={"type": "function"}), RequestError, "/tool_choice/function", "missing_required_parameter"),
    (body(tool_choice={"type": "function", "function": {}}), RequestError, "/tool_choice/function/name", "missing_required_parameter"),
    (body(tool_choice={"type": "function", "function": {"name": 1}}), RequestError, "/tool_choice/function/name", "invalid_type"),
    (body(tool_choice={"type": "allowed_tools"}), RequestError, "/tool_choice/allowed_tools", "missing_required_parameter"),
    (body(tool_choice={"type": "allowed_tools", "allowed_tools": {"tools": []}}),
     RequestError, "/tool_choice/allowed_tools/mode", "missing_required_parameter"),
    (body(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "none", "tools": []}}),
     RequestError, "/tool_choice/allowed_tools/mode", "invalid_value"),
    (body(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}),
     RequestError, "/tool_choice/allowed_tools/tools", "empty_array"),
    (body(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {}}]}}),
     RequestError, "/tool_choice/allowed_tools/tools/0/function/name", "missing_required_parameter"),
    (body(tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"type": "x"}]}}),
     RequestError, "/tool_choice/allowed_tools/tools/0/type", "invalid_value"),
    (body(parallel_tool_calls="false"), RequestError, "/parallel_tool_calls", "invalid_type"),
    # response_format
    (body(response_format="json"), RequestError, "/response_format", "invalid_type"),
    (body(response_format={"type": "xml"}), RequestError, "/response_format/type", "invalid_value"),
    (body(response_format={"type": "json_schema"}), RequestError, "/response_format/json_schema", "missing_required_parameter"),
    (body(response_format={"type": "json_schema", "json_schema": {"schema": {}}}),
     RequestError, "/response_format/json_schema/name", "missing_required_parameter"),
    (body(response_format={"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}),
     RequestError, "/response_format/json_schema/name", "invalid_value"),
    (body(response_format={"type": "json_schema", "json_schema": {"name": "a"}}),
     RequestError, "/response_format/json_schema/schema", "missing_required_parameter"),
    (body(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": True}}),
     RequestError, "/response_format/json_schema/schema", "invalid_type"),
    (body(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": 3}}}),
     InvalidSchema, "/response_format/json_schema/schema/type", "invalid_json_schema"),
    (body(response_format={"type": "json_schema", "json_schema": {"name": "a", "strict": 1, "schema": STRICT_OK}}),
     RequestError, "/response_format/json_schema/strict", "invalid_type"),
    # budgets and sampling
    (body(max_tokens=0), RequestError, "/max_tokens", "integer_below_min_value"),
    (body(max_tokens=1.5), RequestError, "/max_tokens", "invalid_type"),
    (body(max_tokens=True), RequestError, "/max_tokens", "invalid_type"),
    (body(max_completion_tokens=-1), RequestError, "/max_completion_tokens", "integer_below_min_value"),
    (body(max_tokens=10, max_completion_tokens=20), RequestError, "/max_tokens", "invalid_value"),
    (body(n=2), RequestError, "/n", "unsupported_value"),
    (body(n=0), RequestError, "/n", "integer_below_min_value"),
    (body(n="1"), RequestError, "/n", "invalid_type"),
    (body(temperature=2.5), RequestError, "/temperature", "decimal_above_max_value"),
    (body(temperature=-0.1), RequestError, "/temperature", "decimal_below_min_value"),
    (body(temperature=float("nan")), RequestError, "/temperature", "invalid_type"),
    (body(top_p=1.5), RequestError, "/top_p", "decimal_above_max_value"),
    (body(top_p="1"), RequestError, "/top_p", "invalid_type"),
    (body(seed=1.0), RequestError, "/seed", "invalid_type"),
    (body(stop=["a", 1]), RequestError, "/stop/1", "invalid_type"),
    (body(stop=["a", "b", "c", "d", "e"]), RequestError, "/stop", "array_above_max_length"),
    (body(stop=3), RequestError, "/stop", "invalid_type"),
    (body(stream="yes"), RequestError, "/stream", "invalid_type"),
    (body(stream_options={"include_usage": True}), RequestError, "/stream_options", "invalid_value"),
    (body(stream=True, stream_options={"include_usage": "yes"}), RequestError, "/stream_options/include_usage", "invalid_type"),
    (body(stream=True, stream_options=[]), RequestError, "/stream_options", "invalid_type"),
    (body(chat_template_kwargs=[]), RequestError, "/chat_template_kwargs", "invalid_type"),
    (body(chat_template_kwargs={"enable_thinking": "no"}), RequestError, "/chat_template_kwargs/enable_thinking", "invalid_type"),
    (body(chat_template_kwargs={"thinking_budget": -1}), RequestError, "/chat_template_kwargs/thinking_budget", "integer_below_min_value"),
    (body(chat_template_kwargs={"thinking_budget": "1k"}), RequestError, "/chat_template_kwargs/thinking_budget", "invalid_type"),
    (body(model=3), RequestError, "/model", "invalid_type"),
    # messages
    ({"model": "m"}, RequestError, "/messages", "missing_required_parameter"),
    (body(messages=[]), RequestError, "/messages", "empty_array"),
    (body(messages="hi"), RequestError, "/messages", "invalid_type"),
    (body(messages=[USER[0], "hi"]), RequestError, "/messages/1", "invalid_type"),
    (body(messages=[{"content": "hi"}]), RequestError, "/messages/0/role", "missing_required_parameter"),
    (body(messages=[{"role": "robot", "content": "hi"}]), RequestError, "/messages/0/role", "invalid_value"),
    (body(messages=[{"role": "function", "name": "f", "content": "1"}]), RequestError, "/messages/0/role", "unsupported_value"),
    (body(messages=[{"role": "user"}]), RequestError, "/messages/0/content", "missing_required_parameter"),
    (body(messages=[{"role": "user", "content": 3}]), RequestError, "/messages/0/content", "invalid_type"),
    (body(messages=[{"role": "user", "content": [{"text": "a"}]}]), RequestError, "/messages/0/content/0/type", "missing_required_parameter"),
    (body(messages=[{"role": "user", "content": [{"type": "text"}]}]), RequestError, "/messages/0/content/0/text", "missing_required_parameter"),
    (body(messages=[{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     RequestError, "/messages/0/content/0/type", "invalid_value"),
    (body(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), RequestError, "/messages/0/content/0/image_url", "missing_required_parameter"),
    (body(messages=[{"role": "user", "content": "hi", "name": 1}]), RequestError, "/messages/0/name", "invalid_type"),
    (body(messages=[USER[0], {"role": "assistant"}]), RequestError, "/messages/1/content", "missing_required_parameter"),
    (body(messages=[USER[0], {"role": "assistant", "content": None, "tool_calls": []}]), RequestError, "/messages/1/tool_calls", "empty_array"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
     RequestError, "/messages/1/tool_calls/0/id", "missing_required_parameter"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a"), call("a")]}]), RequestError, "/messages/1/tool_calls/1/id", "invalid_value"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [{**call(), "type": "custom"}]}]), RequestError, "/messages/1/tool_calls/0/type", "unsupported_value"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call(arguments={"city": "Paris"})]}]),
     RequestError, "/messages/1/tool_calls/0/function/arguments", "invalid_type"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"arguments": "{}"}}]}]),
     RequestError, "/messages/1/tool_calls/0/function/name", "missing_required_parameter"),
    (body(messages=[USER[0], {"role": "assistant", "content": "x", "function_call": {"name": "f", "arguments": "{}"}}]),
     RequestError, "/messages/1/function_call", "unsupported_value"),
    (body(messages=[USER[0], {"role": "assistant", "content": "x", "reasoning_content": 1}]), RequestError, "/messages/1/reasoning_content", "invalid_type"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a")]}, {"role": "tool", "content": "x"}]),
     RequestError, "/messages/2/tool_call_id", "missing_required_parameter"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a")]}, {"role": "tool", "tool_call_id": "a"}]),
     RequestError, "/messages/2/content", "missing_required_parameter"),
    # pairing of tool calls and tool messages (OpenAI rejects both directions)
    (body(messages=[USER[0], {"role": "tool", "tool_call_id": "a", "content": "x"}]), RequestError, "/messages/1/tool_call_id", "invalid_value"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a")]}, {"role": "tool", "tool_call_id": "b", "content": "x"}]),
     RequestError, "/messages/2/tool_call_id", "invalid_value"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a")]},
                    {"role": "tool", "tool_call_id": "a", "content": "x"}, {"role": "tool", "tool_call_id": "a", "content": "y"}]),
     RequestError, "/messages/3/tool_call_id", "invalid_value"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a"), call("b")]},
                    {"role": "tool", "tool_call_id": "a", "content": "x"}, USER[0]]),
     RequestError, "/messages/1/tool_calls/1/id", "invalid_value"),
    (body(messages=[USER[0], {"role": "assistant", "tool_calls": [call("a")]}]), RequestError, "/messages/1/tool_calls/0/id", "invalid_value"),
]


@pytest.mark.parametrize("b, cls, pointer, code", ERRORS, ids=[f"{e[2] or 'body'}:{e[3]}:{i}" for i, e in enumerate(ERRORS)])
def test_error(b, cls, pointer, code):
    raises(b, cls, pointer, code)


def test_strict_subset_is_not_this_stage():
    # The request stage checks that schemas are well-formed; OpenAI's strict subset is checked by Policy
    # (tests/test_policy.py), which may import the schema stage.
    loose = {"type": "object", "properties": {"a": {"type": "string"}}}
    r = ChatRequest.from_body(body(tools=[tool(strict=True, parameters=loose)],
                                   response_format={"type": "json_schema", "json_schema": {"name": "o", "strict": True, "schema": loose}}))
    assert r.tools[0].strict and r.response_format.strict


def test_param_uses_openai_spelling():
    err = raises(body(tools=[WEATHER, tool("math.sum")]), RequestError, "/tools/1/function/name", "invalid_value")
    assert err.param == "tools[1].function.name"
    err = raises(body(messages=[USER[0], {"role": "tool", "tool_call_id": "a", "content": "x"}]),
                 RequestError, "/messages/1/tool_call_id", "invalid_value")
    assert err.param == "messages[1].tool_call_id"
    err = raises(body(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": []}}),
                 RequestError, "/response_format/json_schema/schema", "invalid_type")
    assert err.param == "response_format.json_schema.schema"


def test_input_is_not_mutated_and_result_is_frozen():
    b = body(tools=[WEATHER], response_format={"type": "json_schema", "json_schema": {"name": "o", "schema": STRICT_OK}})
    before = copy.deepcopy(b)
    r = ChatRequest.from_body(b)
    assert b == before
    b["tools"][0]["function"]["parameters"]["properties"]["x"] = {}  # the caller's dict stays theirs
    assert "x" not in r.tools[0].parameters["properties"]
    with pytest.raises(TypeError):
        r.tools[0].parameters["properties"]["y"] = {}
    with pytest.raises(TypeError):
        r.tools[0].parameters["required"].append("z")
    with pytest.raises(AttributeError):
        r.tools[0].name = "other"  # type: ignore[misc]


# ---------------------------------------------------------------------------
# immutable JSON values
# ---------------------------------------------------------------------------


def test_frozen_json_is_exact_about_order_and_number_spelling():
    a = freeze_json({"x": 1, "y": [True]})
    assert isinstance(a, dict) and isinstance(a["y"], list)
    assert a == {"y": [True], "x": 1}  # against a plain dict: ordinary dict equality
    assert a != freeze_json({"y": [True], "x": 1})  # order shapes the grammar
    assert freeze_json({"c": 1}) != freeze_json({"c": 1.0}) != freeze_json({"c": True})
    assert hash(a) == hash(freeze_json({"x": 1, "y": [True]}))
    assert json.dumps(a) == '{"x": 1, "y": [true]}'


@pytest.mark.parametrize("value", [freeze_json({"a": [1, {"b": None}]}), freeze_json([{"a": 1}, []])])
def test_frozen_json_pickles_and_copies(value):
    for twin in (pickle.loads(pickle.dumps(value)), copy.deepcopy(value), copy.copy(value)):
        assert twin == value and type(twin) is type(value)
        assert isinstance(twin, (FrozenDict, FrozenList))


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(a=2), lambda d: d.pop("a"), lambda d: d.setdefault("b", 1), lambda d: d.clear(),
    lambda d: d.__delitem__("a"), lambda d: d.popitem(),
])
def test_frozen_dict_rejects_mutation(mutate):
    with pytest.raises(TypeError):
        mutate(freeze_json({"a": 1}))


@pytest.mark.parametrize("mutate", [
    lambda v: v.append(1), lambda v: v.extend([1]), lambda v: v.insert(0, 1), lambda v: v.pop(), lambda v: v.sort(),
    lambda v: v.__setitem__(0, 2), lambda v: v.__delitem__(0), lambda v: v.__iadd__([1]), lambda v: v.reverse(),
])
def test_frozen_list_rejects_mutation(mutate):
    with pytest.raises(TypeError):
        mutate(freeze_json([1, 2]))


# ---------------------------------------------------------------------------
# fuzzing: junk never escapes as anything but RequestError
# ---------------------------------------------------------------------------

_KEYS = [
    "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "max_tokens", "max_completion_tokens",
    "chat_template_kwargs", "stream", "stream_options", "n", "temperature", "top_p", "seed", "stop", "model",
    "type", "function", "name", "parameters", "strict", "description", "properties", "required", "items", "anyOf",
    "additionalProperties", "$defs", "$ref", "format", "enum", "json_schema", "schema", "allowed_tools", "mode",
    "role", "content", "tool_calls", "tool_call_id", "id", "arguments", "text", "enable_thinking", "thinking_budget",
    "include_usage", "minLength", "multipleOf", "object", "exclusiveMinimum",
]
_WORDS = ["function", "object", "auto", "none", "required", "allowed_tools", "json_schema", "text", "user", "assistant",
          "tool", "string", "integer", "array", "null", "f", "a.b", "date", "x" * 70, ""]
_scalars = st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=True) | st.sampled_from(_WORDS) | st.text(max_size=5)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS) | st.text(max_size=3), inner, max_size=5),
    max_leaves=40,
)


def _tool_like():
    schema = st.dictionaries(st.sampled_from(_KEYS), _json, max_size=5).map(lambda d: {"type": "object", **d})
    fn = st.fixed_dictionaries({"name": st.sampled_from(["f", "g", "a.b", ""]) | _json},
                               optional={"parameters": schema | _json, "strict": st.booleans() | _json})
    return st.fixed_dictionaries({"type": st.just("function") | _json, "function": fn | _json})


_bodies = st.dictionaries(st.sampled_from(_KEYS[:16]), _json, max_size=8) | st.fixed_dictionaries(
    {"messages": st.just(USER) | _json},
    optional={"tools": st.lists(_tool_like(), max_size=3) | _json, "tool_choice": _json,
              "response_format": st.fixed_dictionaries({"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries(
                  {"name": st.just("o"), "schema": _json, "strict": st.booleans()})}) | _json},
) | _json


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_bodies)
def test_fuzzed_bodies_raise_only_request_errors(b):
    try:
        ChatRequest.from_body(b)
    except RequestError as err:
        assert err.pointer == "" or err.pointer.startswith("/")
        assert isinstance(err.code, str) and err.code
