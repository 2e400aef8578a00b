"""Test helpers for `constrain serve`: a real server subprocess on a free loopback port, and checks of what it returns."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT_S = 240  # import torch + transformers, load, warm up the mask kernel; all servers start at once


REPLY_FORMAT = {"type": "json_schema", "json_schema": {"name": "reply", "strict": True, "schema": {
    "type": "object", "additionalProperties": False, "required": ["answer", "confidence"],
    "properties": {"answer": {"type": "string", "maxLength": 16},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}}}
"""A strict `response_format` the server tests ask for (a short answer and a confidence in [0, 1])."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m constrain serve ARGS` on 127.0.0.1; `start()` does not wait, `wait_ready()` does; `stop()` ends it."""

    def __init__(self, name: str, args: list[str], log_dir: Path):
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.log_path = log_dir / f"server-{name}.log"
        self.args = [sys.executable, "-m", "constrain", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(ROOT))
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server {self.name} not ready after {START_TIMEOUT_S} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "_log", None):
            self._log.close()


def require_demo_model() -> None:
    """Build (once) the embedded demo model; its missing assets fail the test in CI and skip it elsewhere."""
    from constrain.demo_model import ensure_demo_model

    try:
        ensure_demo_model()
    except FileNotFoundError as err:
        message = f"demo model assets: {err} (fix: `python -m constrain.assets fetch`)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)


@contextlib.contextmanager
def demo_server(name: str, args: list[str], log_dir: Path, *, default_host: bool = False) -> Iterator[Server]:
    """A ready `constrain serve ARGS` on the demo model, stopped on exit; `default_host` leaves out `--host`."""
    require_demo_model()
    s = Server(name, args, log_dir)
    if default_host:
        i = s.args.index("--host")
        del s.args[i:i + 2]
    s.start()
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def text_only_model(dest: Path) -> Path:
    """A copy of the demo model whose chat template knows no tools (Qwen2's plain ChatML template)."""
    from constrain import assets
    from constrain.demo_model import ensure_demo_model

    src = ensure_demo_model()
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "model.safetensors":
            os.symlink(f, dest / f.name)
        elif f.is_file():
            shutil.copy(f, dest / f.name)
    (dest / "constrain_demo.json").unlink()
    template = (assets.cache_dir() / "hf-tokenizers" / "qwen2" / "chat_template.jinja")
    text = template.read_text(encoding="utf-8") if template.is_file() else (
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + "
        "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    (dest / "chat_template.jinja").write_text(text, encoding="utf-8")
    return dest


def raw_sse(base_url: str, body: dict, api_key: str | None = None) -> list[str]:
    """The `data:` payloads of a streamed request, as sent (including `[DONE]`)."""
    req = urllib.request.Request(base_url + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {api_key}"} if api_key else {})})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def reassemble(chunks: list[Any]) -> dict[str, Any]:
    """Streamed `ChatCompletionChunk`s → the message they spell: content, reasoning, calls by `index`, finish."""
    content, reasoning, calls, finish = None, None, {}, None
    for ch in chunks:
        for choice in ch.choices:
            d = choice.delta
            if d.content is not None:
                content = (content or "") + d.content
            extra = getattr(d, "reasoning_content", None)
            if extra is not None:
                reasoning = (reasoning or "") + extra
            for tc in d.tool_calls or []:
                if tc.index not in calls:
                    assert tc.id and tc.id.startswith("call_") and tc.function.name, "first delta of a call: id, name"
                    assert tc.function.arguments == "", "first delta of a call carries empty arguments"
                    calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None, "id and name come once per call"
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            if choice.finish_reason is not None:
                assert finish is None, "one finish chunk"
                finish = choice.finish_reason
    return {"content": content, "reasoning_content": reasoning,
            "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish}


def whole(resp: Any) -> dict[str, Any]:
    """A non-streamed response in `reassemble`'s shape."""
    choice = resp.choices[0]
    msg = choice.message
    return {"content": msg.content, "reasoning_content": getattr(msg, "reasoning_content", None),
            "tool_calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                           for c in msg.tool_calls or []],
            "finish_reason": choice.finish_reason}


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "tool_calls": [{k: v for k, v in c.items() if k != "id"} for c in message["tool_calls"]]}


def chain_tool_turns(ask, user: list[dict], tools: list[dict], seed: int, extra: dict) -> None:
    """read_dataset → calculate_total → final answer: each named call's result goes back into the next request.

    `ask(body) -> (response, message)` sends one request; `extra` is merged into every body (e.g. thinking off).
    Asserts that every call is the one named, that the history reaches the prompt, and that the answer is text.
    """
    messages = list(user)
    prompt_tokens = 0
    for tool, result in (("read_dataset", {"rows": [120.5, 99.5]}), ("calculate_total", {"total": 220.0})):
        body = {"messages": messages, "tools": tools, "max_tokens": 64, "seed": seed, **extra,
                "tool_choice": {"type": "function", "function": {"name": tool}}}
        resp, msg = ask(body)
        assert resp.usage.prompt_tokens > prompt_tokens  # the history (calls and results) reaches the prompt
        prompt_tokens = resp.usage.prompt_tokens
        (call,) = msg.tool_calls
        assert call.function.name == tool
        messages = messages + [
            {"role": "assistant", "content": msg.content, "tool_calls": [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)},
        ]
    body = {"messages": messages, "tools": tools, "max_tokens": 32, "seed": seed, "tool_choice": "none", **extra}
    resp, msg = ask(body)
    assert not msg.tool_calls and isinstance(msg.content, str) and resp.usage.prompt_tokens > prompt_tokens


# ---------------------------------------------------------------------------------------------------------------------
# raw HTTP (the hardening suites send bodies the openai client would refuse to build)
# ---------------------------------------------------------------------------------------------------------------------

ERROR_KEYS = {"message", "type", "param", "code"}


def http(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         timeout: float = 120) -> tuple[int, bytes]:
    """(status, body bytes) of one request on 127.0.0.1:`port`; a non-2xx status is returned, not raised."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post_chat(port: int, body: Any, headers: dict | None = None, timeout: float = 120) -> tuple[int, bytes]:
    """POST a body (a JSON value, or bytes sent as they are) to /v1/chat/completions."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http(port, "POST", "/v1/chat/completions", raw, headers, timeout)


def error_of(status: int, data: bytes) -> dict[str, Any]:
    """The `error` object of a 4xx/5xx reply, after checking OpenAI's shape exactly (contract §1.8)."""
    payload = json.loads(data)
    assert set(payload) == {"error"}, payload
    err = payload["error"]
    assert set(err) == ERROR_KEYS, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    assert err["param"] is None or isinstance(err["param"], str), err
    assert err["code"] is None or isinstance(err["code"], str), err
    return err


def sse_events(data: bytes) -> list[Any]:
    """The parsed `data:` payloads of an SSE body; `[DONE]` stays a string."""
    out = []
    for line in data.decode("utf-8").split("\n"):
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def message_of_events(events: list[Any]) -> dict[str, Any]:
    """Streamed chunk dicts → {"content", "tool_calls": [{"name", "arguments"}], "finish_reason", "usage"}."""
    assert events and events[-1] == "[DONE]", events[-3:]
    content, calls, finish, usage = None, {}, None, None
    for ev in events[:-1]:
        assert "error" not in ev, ev
        usage = ev.get("usage") or usage
        for choice in ev["choices"]:
            d = choice["delta"]
            if d.get("content") is not None:
                content = (content or "") + d["content"]
            for tc in d.get("tool_calls") or []:
                fn = tc.get("function") or {}
                if tc["index"] not in calls:
                    calls[tc["index"]] = {"name": fn["name"], "arguments": ""}
                calls[tc["index"]]["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason") is not None:
                finish = choice["finish_reason"]
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish_reason": finish,
            "usage": usage}


def message_of_completion(payload: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed `chat.completion` dict in `message_of_events`' shape."""
    assert payload["object"] == "chat.completion" and len(payload["choices"]) == 1, payload
    choice = payload["choices"][0]
    msg = choice["message"]
    assert msg["role"] == "assistant"
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in msg.get("tool_calls") or []]
    return {"content": msg.get("content"), "tool_calls": calls, "finish_reason": choice["finish_reason"],
            "usage": payload["usage"]}


def check_message(body: dict[str, Any], message: dict[str, Any], *, constrained: bool) -> None:
    """A reply is valid for its own request: declared and allowed names, arguments valid against that tool's
    parameters, the call count within the policy, a forced call present, response_format content valid."""
    import jsonschema

    import constrain

    policy = constrain.Policy.from_request(body)
    declared = {t["function"]["name"]: t["function"].get("parameters") or {} for t in body.get("tools") or []}
    calls = message["tool_calls"]
    for c in calls:
        assert c["name"] in policy.allowed, (c["name"], policy.allowed)
        jsonschema.validate(json.loads(c["arguments"]), declared[c["name"]])
    assert len(calls) <= policy.max_calls
    if constrained and policy.mode == "required":
        assert calls and message["finish_reason"] != "length", message
    fmt = body.get("response_format")
    if constrained and fmt and fmt["type"] == "json_schema" and not calls:
        assert message["finish_reason"] == "stop", message
        jsonschema.validate(json.loads(message["content"]), fmt["json_schema"]["schema"])


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# ---------------------------------------------------------------------------------------------------------------------
# load: concurrent clients, every reply checked against its own request (shared by the load test and benchmarks/load.py)
# ---------------------------------------------------------------------------------------------------------------------

LOAD_MODES = ("none", "auto", "required", "named", "response_format")


def load_tool_sets(n_sets: int) -> list[list[dict]]:
    """`n_sets` tool sets with names unique to their set (a reply carrying another set's name is cross-talk)."""
    sets = []
    for k in range(n_sets):
        sets.append([
            {"type": "function", "function": {"name": f"weather_{k}", "parameters": {
                "type": "object", "properties": {"city": {"type": "string", "maxLength": 8 + k},
                                                 "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"]}}},
            {"type": "function", "function": {"name": f"add_{k}", "strict": True, "parameters": {
                "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"], "additionalProperties": False}}},
        ])
    return sets


def load_body(i: int, tool_sets: list[list[dict]], max_tokens: int) -> dict:
    """Request `i` of a load run: its tool set, mode and streaming follow from `i`; its user text is unique."""
    tools = tool_sets[i % len(tool_sets)]
    mode = LOAD_MODES[(i // len(tool_sets)) % len(LOAD_MODES)]
    body: dict = {"messages": [{"role": "user", "content": f"Request number {i}: " + "please " * (i % 11)}],
                  "max_tokens": max_tokens, "seed": i, "stream": bool((i // 3) % 2),
                  "chat_template_kwargs": {"enable_thinking": False}}
    if mode == "response_format":
        k = i % len(tool_sets)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": f"r{k}", "strict": True, "schema": {
            "type": "object", "properties": {"set": {"type": "integer", "enum": [k]}}, "required": ["set"],
            "additionalProperties": False}}}
    else:
        body["tools"] = tools
        body["tool_choice"] = ({"type": "function", "function": {"name": tools[1]["function"]["name"]}}
                               if mode == "named" else mode)
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return body


def expected_prompt_tokens(tokenizer: Any, body: dict) -> int:
    """The prompt length the server must report for `body` (the chat template rendered as `Engine.prepare` does)."""
    prompt = tokenizer.apply_chat_template(body["messages"], tools=body.get("tools"), add_generation_prompt=True,
                                           tokenize=False, **body.get("chat_template_kwargs", {}))
    return len(tokenizer(prompt, add_special_tokens=False).input_ids)


def run_load(port: int, *, clients: int, per_client: int, max_tokens: int, n_sets: int = 2,
             tokenizer: Any = None, timeout: float = 300) -> dict[str, Any]:
    """`clients` threads each send `per_client` requests back to back; every reply is checked against its own
    request (`check_message`, and `usage.prompt_tokens` against `tokenizer` when given: a reply for another request
    has another prompt). Returns figures and the failures (empty when every request got its own valid reply)."""
    import statistics
    import threading

    tool_sets = load_tool_sets(n_sets)
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    expected = {}
    if tokenizer is not None:
        for i in range(clients * per_client):
            expected[i] = expected_prompt_tokens(tokenizer, load_body(i, tool_sets, max_tokens))

    def client(c: int) -> None:
        for r in range(per_client):
            i = c * per_client + r
            body = load_body(i, tool_sets, max_tokens)
            t0 = time.perf_counter()
            try:
                status, data = post_chat(port, body, timeout=timeout)
                elapsed = time.perf_counter() - t0
                assert status == 200, (status, data[:300])
                if body["stream"]:
                    message = message_of_events(sse_events(data))
                else:
                    message = message_of_completion(json.loads(data))
                check_message(body, message, constrained=True)
                if i in expected:
                    assert message["usage"]["prompt_tokens"] == expected[i], (message["usage"], expected[i])
            except Exception as err:  # noqa: BLE001 - collected and reported by the caller
                with lock:
                    failures.append(f"request {i}: {type(err).__name__}: {str(err)[:300]}")
                continue
            with lock:
                latencies.append(elapsed)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    wall = time.perf_counter() - t0
    hung = sum(t.is_alive() for t in threads)
    if hung:
        failures.append(f"{hung} client threads still waiting after {timeout} s")
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")

    return {"requests": clients * per_client, "ok": len(latencies), "clients": clients, "wall_s": wall,
            "p50_s": statistics.median(ordered) if ordered else float("nan"), "p99_s": pct(0.99),
            "throughput_rps": len(latencies) / wall if wall else 0.0, "failures": failures}


def stats_of(port: int, api_key: str | None = None) -> dict[str, Any]:
    status, data = http(port, "GET", "/v1/stats", headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
    assert status == 200, data[:300]
    return json.loads(data)


# Two tools of 40 string properties, each with its own nested bounded repetition (`^k0x1((a{1,12}){1,12}){1,12}$`:
# ~0.25 s a property, one tool ~11 s here; ~70k states a tool, within the state budgets): nothing caps the whole
# compile but the request's compile deadline.
SLOW_TOOLS = [{"type": "function", "function": {"name": f"slow_{j}", "parameters": {
    "type": "object", "properties": {f"p{i}": {"type": "string", "pattern": f"^k{j}x{i}((a{{1,12}}){{1,12}}){{1,12}}$"}
                                     for i in range(40)},
    "required": [f"p{i}" for i in range(40)]}}} for j in range(2)]
