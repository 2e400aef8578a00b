"""End to end: `constrain serve` as a real subprocess on 127.0.0.1, driven by the official `openai` client.

Three servers on the embedded demo model (tiny random Qwen3, real Qwen3 tokenizer and chat template, hermes format):
`free` (generation unconstrained, output validated afterwards), `constrained` (`--constrained-tools`, `--api-key`),
and `textonly` (the same weights under a chat template without tools; `--max-queue 1 --timeout 8`).
Every tool call any server returns is checked: allowed name, arguments that parse and validate (python-jsonschema),
call count within the policy, finish_reason rules. A random model never writes a valid call by chance, so on the free
server these checks are the fail-closed guarantee; on the constrained one, required/named must return a call.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

import jsonschema  # noqa: E402  (test extra: a missing package is an install error, never a skip)
import openai  # noqa: E402
import starlette  # noqa: E402,F401
import uvicorn  # noqa: E402,F401

import constrain  # noqa: E402
from server_utils import REPLY_FORMAT, chain_tool_turns, require_demo_model, Server, raw_sse, reassemble, text_only_model, whole, without_ids  # noqa: E402

KEY = "sk-test-constrain"
SEEDS = (0, 1, 2)
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

READ_DATASET = {"type": "function", "function": {
    "name": "read_dataset", "description": "Read a dataset by name.", "strict": True,
    "parameters": {"type": "object", "properties": {"name": {"type": "string", "enum": ["sales_2024", "sales_2025"]}},
                   "required": ["name"], "additionalProperties": False}}}
CALCULATE_TOTAL = {"type": "function", "function": {
    "name": "calculate_total", "description": "Sum values in a currency.",
    "parameters": {"type": "object", "properties": {
        "values": {"type": "array", "items": {"type": "number"}, "maxItems": 4},
        "currency": {"type": "string", "enum": ["EUR", "USD"]}}, "required": ["values", "currency"]}}}
GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TOOLS = [READ_DATASET, CALCULATE_TOTAL, GET_WEATHER]
STRICT_NESTED = {"type": "function", "function": {
    "name": "book_trip", "strict": True, "parameters": {
        "type": "object", "additionalProperties": False, "required": ["where", "nights", "extras"],
        "properties": {
            "where": {"type": "object", "additionalProperties": False, "required": ["city", "country"],
                      "properties": {"city": {"type": "string", "maxLength": 10},
                                     "country": {"type": "string", "enum": ["FR", "DE", "JP"]}}},
            "nights": {"type": "integer", "minimum": 1, "maximum": 14},
            "extras": {"type": ["array", "null"], "items": {"type": "boolean"}, "maxItems": 2}}}}}
USER = [{"role": "user", "content": "Total the 2024 sales in EUR, please."}]

MODES = {
    "none": {"tool_choice": "none"},
    "auto": {"tool_choice": "auto"},
    "required": {"tool_choice": "required"},
    "named": {"tool_choice": {"type": "function", "function": {"name": "calculate_total"}}},
    "allowed_auto": {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}]}}},
    "allowed_required": {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "read_dataset"}},
        {"type": "function", "function": {"name": "get_weather"}}]}}},
    "parallel_false": {"tool_choice": "required", "parallel_tool_calls": False},
}


# ---------------------------------------------------------------------------------------------------------------------
# servers
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    require_demo_model()  # once, before three processes would race to build it
    d = tmp_path_factory.mktemp("serve")
    text_dir = text_only_model(d / "textonly-model")
    found = {
        "free": Server("free", [], d),
        "constrained": Server("constrained", ["--constrained-tools", "--api-key", KEY], d),
        "textonly": Server("textonly", ["--model", str(text_dir), "--max-queue", "1", "--timeout", "8"], d),
    }
    try:
        for s in found.values():
            s.start()
        for s in found.values():
            s.wait_ready()
        yield found
    finally:
        for s in found.values():
            s.stop()


def client_of(server: Server, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0, timeout=120)


@pytest.fixture(params=["free", "constrained"])
def served(request, servers):
    """(server name, client) for the free and the constrained server."""
    return request.param, client_of(servers[request.param])


# ---------------------------------------------------------------------------------------------------------------------
# the contract, checked on every reply
# ---------------------------------------------------------------------------------------------------------------------


def check(resp, body: dict, *, constrained: bool):
    """Every reply: OpenAI's shape, allowed names, arguments that validate, call bounds, finish_reason rules."""
    policy = constrain.Policy.from_request(body)
    declared = {t["function"]["name"]: t["function"] for t in body.get("tools") or []}
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion" and isinstance(resp.created, int)
    assert resp.model and len(resp.choices) == 1
    u = resp.usage
    assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.completion_tokens <= body.get("max_tokens", 10**9)
    choice = resp.choices[0]
    msg, calls = choice.message, choice.message.tool_calls or []
    assert msg.role == "assistant"
    assert len({c.id for c in calls}) == len(calls) and all(c.id.startswith("call_") and len(c.id) == 29 for c in calls)
    for c in calls:
        assert c.type == "function" and c.function.name in policy.allowed, c.function.name
        args = json.loads(c.function.arguments)
        assert isinstance(args, dict)
        jsonschema.validate(args, declared[c.function.name]["parameters"])
    assert len(calls) <= policy.max_calls
    if calls:
        assert choice.finish_reason == ("stop" if policy.named else "tool_calls")
        assert msg.content is None or isinstance(msg.content, str)
    else:
        assert choice.finish_reason in ("stop", "length")
    if constrained and policy.mode == "required":
        assert len(calls) >= 1 and choice.finish_reason != "length", "a forced call must come back under the mask"
    fmt = body.get("response_format")
    if constrained and fmt and fmt["type"] == "json_schema" and not calls:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(msg.content), fmt["json_schema"]["schema"])
    return msg


def create(client, body: dict, **kwargs):
    """`chat.completions.create` with the non-OpenAI fields (`chat_template_kwargs`) sent as `extra_body`."""
    extra = {k: v for k, v in body.items() if k == "chat_template_kwargs"}
    rest = {k: v for k, v in body.items() if k not in extra}
    return client.chat.completions.create(model="demo", **rest, **kwargs, extra_body=extra or None)


def ask(client, body: dict, *, constrained: bool):
    resp = create(client, body)
    return resp, check(resp, body, constrained=constrained)


def body_of(mode: str, seed: int, **extra) -> dict:
    return {"messages": USER, "tools": TOOLS, "max_tokens": 64, "seed": seed, **MODES[mode], **NO_THINK, **extra}


# ---------------------------------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------------------------------


def test_models_health_and_demo_label(servers):
    models = client_of(servers["constrained"]).models.list().data
    assert len(models) == 1 and models[0].demo is True and models[0].tool_format == "hermes"
    assert "DEMO" in servers["free"].log()
    assert client_of(servers["textonly"]).models.list().data[0].tool_format is None


INVALID = [
    ({"messages": None}, "messages"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!", "parameters": {"type": "object"}}}]},
     "tools[0].function.name"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "nope"}}]}}}, "tool_choice.allowed_tools.tools[0].function.name"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"temperature": 3}, "temperature"),
    ({"n": 2}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]}, "tools[0].function.parameters"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "strict": True, "schema": {
        "type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}}},
     "response_format.json_schema.schema"),
    ({"stop": ["\n"]}, "stop"),
]


@pytest.mark.parametrize("patch,param", INVALID, ids=[p for _, p in INVALID])
def test_invalid_fields_are_400_with_param(servers, patch, param):
    body = {"model": "demo", "messages": USER, "tools": TOOLS, "max_tokens": 8, **patch}
    body = {k: v for k, v in body.items() if v is not None}
    for name in ("free", "constrained"):
        with pytest.raises(openai.BadRequestError) as info:
            client_of(servers[name]).post("/chat/completions", body=body, cast_to=object)
        err = info.value
        assert err.status_code == 400 and err.body["type"] == "invalid_request_error"
        assert err.body["param"] == param and err.body["code"] and err.body["message"]


def test_bad_json_and_auth(servers):
    req = urllib.request.Request(servers["free"].base_url + "/chat/completions", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 400 and json.loads(info.value.read())["error"]["code"] == "invalid_json"
    with pytest.raises(openai.AuthenticationError) as auth:
        client_of(servers["constrained"], "wrong-key").chat.completions.create(model="demo", messages=USER, max_tokens=4)
    assert auth.value.status_code == 401 and auth.value.body["code"] == "invalid_api_key"
    body = json.dumps({"model": "demo", "messages": USER, "max_tokens": 4}).encode()
    req = urllib.request.Request(servers["constrained"].base_url + "/chat/completions", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as info:  # no Authorization header at all
        urllib.request.urlopen(req, timeout=30)
    assert info.value.code == 401 and json.loads(info.value.read())["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("mode", list(MODES))
def test_tool_choice_modes(served, mode):
    name, client = served
    for seed in SEEDS:
        _, msg = ask(client, body_of(mode, seed), constrained=name == "constrained")
        if mode == "none":
            assert not msg.tool_calls


def test_forced_call_below_minimum_then_success(servers):
    client = client_of(servers["constrained"])
    body = body_of("named", 0, max_tokens=1)
    with pytest.raises(openai.BadRequestError) as info:
        create(client, body)
    err = info.value.body
    assert err["param"] == "max_tokens" and err["code"] == "invalid_value"
    minimum = int(next(w for w in err["message"].split() if w.isdigit() and w != "1"))
    assert minimum > 1 and str(minimum) in err["message"]
    resp, msg = ask(client, body_of("named", 0, max_tokens=minimum), constrained=True)
    assert len(msg.tool_calls) == 1 and resp.usage.completion_tokens <= minimum
    with pytest.raises(openai.BadRequestError):  # and one token less is still refused
        create(client, body_of("named", 0, max_tokens=minimum - 1))


def test_multi_turn_with_tool_results(servers):
    client = client_of(servers["constrained"])
    for seed in SEEDS:
        chain_tool_turns(lambda body: ask(client, body, constrained=True), USER, TOOLS, seed, NO_THINK)


def test_usage_chunk_only_on_opt_in(servers):
    server = servers["constrained"]
    base = {"model": "demo", **body_of("required", 0), "stream": True}
    for opt_in in (False, True):
        body = {**base, **({"stream_options": {"include_usage": True}} if opt_in else {})}
        events = raw_sse(server.base_url, body, KEY)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
        assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        assert len(finals) == 1 and finals[0]["choices"][0]["delta"] == {}
        usage_chunks = [c for c in chunks if not c["choices"]]
        if opt_in:
            assert usage_chunks == [chunks[-1]] and chunks[-1]["usage"]["total_tokens"] > 0
            assert all(c["usage"] is None for c in chunks[:-1])
        else:
            assert not usage_chunks and all("usage" not in c for c in chunks)


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_stream_reassembles_to_whole(served, mode):
    name, client = served
    for seed in SEEDS:
        for temperature in (0, 1):
            body = body_of(mode, seed, temperature=temperature)
            resp, _ = ask(client, body, constrained=name == "constrained")
            chunks = list(create(client, body, stream=True))
            streamed = reassemble(chunks)
            for c in streamed["tool_calls"]:
                json.loads(c["arguments"])
            assert without_ids(streamed) == without_ids(whole(resp)), (seed, temperature)


def test_thinking_on_and_off(servers):
    client = client_of(servers["constrained"])
    for seed in SEEDS:
        on = {"messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 96, "seed": seed,
              "chat_template_kwargs": {"enable_thinking": True}}
        resp, msg = ask(client, on, constrained=True)
        assert isinstance(msg.reasoning_content, str) and resp.usage.completion_tokens_details.reasoning_tokens > 0
        off = {**on, "chat_template_kwargs": {"enable_thinking": False}}
        resp, msg = ask(client, off, constrained=True)
        assert getattr(msg, "reasoning_content", None) is None
        assert resp.usage.completion_tokens_details.reasoning_tokens == 0
    # the template's default (Qwen3: thinking on) on the free server: replies still fail closed
    for seed in SEEDS:
        ask(client_of(servers["free"]), {"messages": USER, "tools": TOOLS, "tool_choice": "auto", "max_tokens": 48,
                                         "seed": seed}, constrained=False)


def test_strict_nested_schema(served):
    name, client = served
    for seed in SEEDS:
        body = {"messages": USER, "tools": [STRICT_NESTED, *TOOLS], "max_tokens": 96, "seed": seed, **NO_THINK,
                "tool_choice": {"type": "function", "function": {"name": "book_trip"}}}
        _, msg = ask(client, body, constrained=name == "constrained")
        if name == "constrained":
            assert len(msg.tool_calls) == 1


def test_response_format_json_schema(served):
    name, client = served
    for seed in SEEDS:
        body = {"messages": USER, "max_tokens": 64, "seed": seed, **NO_THINK,
                "response_format": REPLY_FORMAT}
        _, msg = ask(client, body, constrained=name == "constrained")
        assert not msg.tool_calls


def test_concurrent_requests(servers):
    client = client_of(servers["constrained"])
    out: dict[int, object] = {}

    def one(seed: int) -> None:
        try:
            out[seed] = ask(client, body_of("required", seed), constrained=True)
        except Exception as err:  # noqa: BLE001 - reported below
            out[seed] = err

    threads = [threading.Thread(target=one, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(v, tuple) for v in out.values()) and len(out) == 4, out


def test_template_without_tools(servers):
    client = client_of(servers["textonly"])
    for mode, param in (("required", "tool_choice"), ("named", "tool_choice"), ("allowed_required", "tool_choice")):
        with pytest.raises(openai.BadRequestError) as info:
            create(client, body_of(mode, 0, max_tokens=8))
        assert info.value.body["param"] == param and info.value.body["code"] == "invalid_value"
    _, msg = ask(client, body_of("auto", 0, max_tokens=16), constrained=False)
    assert not msg.tool_calls


def test_queue_full_and_disconnect_cancels(servers):
    server = servers["textonly"]  # --max-queue 1
    client = client_of(server)
    long = client.chat.completions.create(model="demo", messages=USER, max_tokens=3500, stream=True, temperature=1)
    next(iter(long))  # the long request is generating
    waiting: dict[str, object] = {}
    t = threading.Thread(target=lambda: waiting.update(r=client.chat.completions.create(
        model="demo", messages=USER, max_tokens=4)))
    t.start()
    for _ in range(200):  # until the second request sits in the queue
        if json.loads(urllib.request.urlopen(server.base_url[:-3] + "/health", timeout=10).read())["queued"] == 1:
            break
        threading.Event().wait(0.05)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="demo", messages=USER, max_tokens=4)
    assert info.value.status_code == 429 and info.value.body["code"] == "rate_limit_exceeded"
    long.close()  # the client goes away: its generation is cancelled, the queued request runs
    t.join(60)
    assert waiting["r"].choices[0].finish_reason in ("stop", "length")
    for _ in range(50):
        if "outcome=cancelled" in server.log():
            break
        threading.Event().wait(0.2)
    assert "outcome=cancelled" in server.log()


def test_timeout(servers):
    client = client_of(servers["textonly"])  # --timeout 8
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="demo", messages=USER, max_tokens=3900, temperature=1)
    assert info.value.status_code == 504 and info.value.body["code"] == "timeout"
    # and the server still answers
    assert client.chat.completions.create(model="demo", messages=USER, max_tokens=4).choices
