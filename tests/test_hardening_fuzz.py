"""Request fuzzing: Hypothesis-drawn `/v1/chat/completions` bodies against a real `constrain serve --constrained-tools`.

Bodies are mutations of a valid request (fields dropped, retyped, added; values replaced anywhere in the tree; huge
strings; deep nesting) and byte-level damage (invalid UTF-8, truncated or random JSON). Every reply must be a 200 that
is valid for its own request, or a 4xx in OpenAI's error shape; never a 5xx, a hang (bounded client timeout) or a
dead server. Examples are derandomized, so CI replays the same bodies each run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_utils import (Server, check_message, demo_server, error_of, http, message_of_completion, message_of_events,
                          post_chat, sse_events)

MAX_BODY = 256 * 1024  # the server runs with --max-body-bytes MAX_BODY, so oversized bodies are fuzzed too
EXAMPLES = {"mutations": 250, "bytes": 120, "deep": 40}
TRIED: dict[str, int] = {}

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                         "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"], "additionalProperties": False}}},
]
BASE = {"model": "demo", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
        "tool_choice": "auto", "max_tokens": 24, "temperature": 0.7, "seed": 1,
        "chat_template_kwargs": {"enable_thinking": False}}
FIELDS = sorted(set(BASE) | {"stream", "stream_options", "response_format", "parallel_tool_calls", "n", "top_p",
                             "stop", "max_completion_tokens", "functions", "function_call", "logprobs", "user"})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--constrained-tools", "--max-body-bytes", str(MAX_BODY)]
    with demo_server("fuzz", args, tmp_path_factory.mktemp("fuzz")) as s:
        yield s
    print(f"\nbodies fuzzed: {TRIED} = {sum(TRIED.values())}")


# ---------------------------------------------------------------------------------------------------------------------
# strategies
# ---------------------------------------------------------------------------------------------------------------------

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))
json_values = st.recursive(_scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=12)
huge_strings = st.builds(lambda ch, n: ch * n, st.sampled_from(["a", "é", "\u4e2d", "😀", "\\", '"', "\n"]),
                         st.integers(10_000, 200_000))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _replace(value: Any, path: tuple, new: Any, drop: bool = False) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        if drop and not rest:
            copy.pop(head, None)
        else:
            copy[head] = _replace(value[head], rest, new, drop)
        return copy
    copy = list(value)
    if drop and not rest:
        del copy[head]
    else:
        copy[head] = _replace(value[head], rest, new, drop)
    return copy


@st.composite
def mutated_bodies(draw) -> Any:
    body: Any = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["retype", "drop", "extra", "field", "huge", "stream"]))
        paths = _paths(body)
        if kind == "retype":
            body = _replace(body, draw(st.sampled_from(paths)), draw(json_values))
        elif kind == "drop" and len(paths) > 1:
            body = _replace(body, draw(st.sampled_from(paths[1:])), None, drop=True)
        elif kind == "huge":
            body = _replace(body, draw(st.sampled_from(paths)), draw(huge_strings))
        elif isinstance(body, dict) and kind == "extra":
            body[draw(st.text(max_size=12))] = draw(json_values)
        elif isinstance(body, dict) and kind == "field":
            body[draw(st.sampled_from(FIELDS))] = draw(json_values)
        elif isinstance(body, dict) and kind == "stream":
            body["stream"] = True
            if draw(st.booleans()):
                body["stream_options"] = {"include_usage": draw(st.booleans())}
    if isinstance(body, dict):
        # keep generation short (a fuzzed max_tokens of 3000 would be a valid 30 s request, not a fault):
        # large values still reach the server when they exceed the context (400)
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and not isinstance(body[key], bool) and 24 < body[key] <= 8192:
                body[key] = 24
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = 24
    return body


@st.composite
def damaged_bytes(draw) -> bytes:
    raw = json.dumps(draw(mutated_bodies())).encode()
    kind = draw(st.sampled_from(["truncate", "invalid_utf8", "random", "surrogate", "splice"]))
    if kind == "truncate":
        return raw[: draw(st.integers(0, max(len(raw) - 1, 0)))]
    if kind == "invalid_utf8":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80"])) + raw[at:]
    if kind == "surrogate":  # a JSON escape of a lone surrogate: valid JSON, invalid Unicode
        return raw.replace(b"Paris", b"Par\\udc80is")
    if kind == "splice":
        at = draw(st.integers(0, len(raw)))
        return raw[:at] + draw(st.sampled_from([b"NaN", b"}", b"]", b",", b'"', b"\\", b"\x00", b"1e99999"])) + raw[at:]
    return draw(st.binary(max_size=200))


@st.composite
def deep_bodies(draw) -> bytes:
    depth = draw(st.integers(130, 5000))  # past MAX_JSON_DEPTH (128) wherever it sits
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
    inner = opener * depth + b"1" * (opener == b'{"a":') + closer * depth
    where = draw(st.sampled_from(["content", "parameters", "extra", "chat_template_kwargs"]))
    body = json.dumps({**BASE, "messages": [{"role": "user", "content": "@"}]}).encode()
    if where == "content":
        return body.replace(b'"@"', b"[" + inner + b"]")
    if where == "parameters":
        return body.replace(b'"parameters": {', b'"parameters": {"x": ' + inner + b", ", 1)
    if where == "chat_template_kwargs":
        return body.replace(b'"enable_thinking": false', b'"v": ' + inner)
    return body[:-1] + b', "extra": ' + inner + b"}"


# ---------------------------------------------------------------------------------------------------------------------
# the oracle
# ---------------------------------------------------------------------------------------------------------------------


def check_reply(server: Server, body: Any, raw: bytes) -> None:
    status, data = post_chat(server.port, raw, timeout=90)
    assert status < 500, (status, data[:500])
    if status == 200:
        parsed = body if isinstance(body, dict) else json.loads(raw)
        if parsed.get("stream"):
            message = message_of_events(sse_events(data))
        else:
            message = message_of_completion(json.loads(data))
        check_message(parsed, message, constrained=True)
    else:
        assert status in (400, 413), (status, data[:300])
        err = error_of(status, data)
        assert err["type"] == "invalid_request_error", err
        if status == 413:
            assert len(raw) > MAX_BODY and err["code"] == "request_too_large"


FUZZ = settings(deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])


@settings(FUZZ, max_examples=EXAMPLES["mutations"])
@given(body=mutated_bodies())
def test_mutated_bodies(server, body):
    TRIED["mutations"] = TRIED.get("mutations", 0) + 1
    check_reply(server, body, json.dumps(body).encode())


@settings(FUZZ, max_examples=EXAMPLES["bytes"])
@given(raw=damaged_bytes())
def test_damaged_bytes(server, raw):
    TRIED["bytes"] = TRIED.get("bytes", 0) + 1
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    status, data = post_chat(server.port, raw, timeout=90)
    assert status < 500, (status, data[:500])
    if len(raw) > MAX_BODY:  # refused unread, whatever it holds
        assert status == 413 and error_of(status, data)["code"] == "request_too_large", data[:300]
    elif body is None:  # not JSON (or not UTF-8): always refused as such
        assert status == 400 and error_of(status, data)["code"] == "invalid_json", data[:300]
    else:
        check_reply(server, body, raw)


@settings(FUZZ, max_examples=EXAMPLES["deep"])
@given(raw=deep_bodies())
def test_deep_nesting(server, raw):
    TRIED["deep"] = TRIED.get("deep", 0) + 1
    status, data = post_chat(server.port, raw, timeout=90)
    assert status == 400, (status, data[:300])
    assert error_of(status, data)["code"] in ("invalid_json", "invalid_value")


def test_server_survived(server):
    """After every fuzzed body: the process is alive and serves a valid request."""
    assert server.proc.poll() is None
    status, _ = http(server.port, "GET", "/health")
    assert status == 200
    status, data = post_chat(server.port, {**BASE, "tool_choice": "required"})
    assert status == 200, data[:300]
    check_message({**BASE, "tool_choice": "required"}, message_of_completion(json.loads(data)), constrained=True)
