"""Faults: client disconnects (mid-stream and while waiting), exceptions injected into generation and compilation,
cancellation releasing its job, SIGTERM with requests in flight.

Injection monkeypatches an in-process engine (the same `create_app` served by uvicorn on a loopback thread); nothing
a request says can trigger it. SIGTERM runs against a real `constrain serve` subprocess.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import signal
import socket
import threading
import time
import weakref

import pytest

from server_utils import (SLOW_TOOLS, Server, check_message, error_of, free_port, message_of_completion, post_chat,
                          require_demo_model, sse_events)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}]
BODY = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS, "tool_choice": "required",
        "max_tokens": 48, "seed": 0, "chat_template_kwargs": {"enable_thinking": False}}
LONG = {"messages": [{"role": "user", "content": "Tell me a story."}], "tool_choice": "none", "max_tokens": 3000,
        "temperature": 1.0, "seed": 0, "chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def live():
    """(engine, port): the demo engine, constrained, served in this process on a loopback thread."""
    import uvicorn

    from constrain.engine import Engine
    from constrain.server import create_app

    import torch

    require_demo_model()
    threads = torch.get_num_threads()  # the demo engine sets 1 for the process; later tests get theirs back
    engine = Engine.load(None, constrained=True, max_queue=8, timeout=60)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "in-process server did not start"
        time.sleep(0.05)
    try:
        yield engine, port
    finally:
        server.should_exit = True
        thread.join(30)
        engine.close()
        torch.set_num_threads(threads)


def assert_serves(port: int) -> None:
    """The next ordinary request succeeds with a valid forced call."""
    status, data = post_chat(port, BODY)
    assert status == 200, data[:300]
    check_message(BODY, message_of_completion(json.loads(data)), constrained=True)


def open_stream(port: int, body: dict) -> socket.socket:
    """Send a streamed request on a raw socket and return it once the first SSE chunk has arrived."""
    raw = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    seen = b""
    while b"data: " not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen
        seen += chunk
    assert seen.startswith(b"HTTP/1.1 200"), seen[:200]
    return sock


def wait_for(predicate, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def cancelled_lines(records) -> list[int]:
    """completion_tokens of each request the engine logged as cancelled."""
    out = []
    for r in records:
        m = re.search(r"completion_tokens=(\d+) .*outcome=cancelled", r.getMessage())
        if m:
            out.append(int(m.group(1)))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# injected exceptions
# ---------------------------------------------------------------------------------------------------------------------


def test_exception_in_generation_is_500_then_next_succeeds(live, monkeypatch):
    engine, port = live

    def boom(*args, **kwargs):
        raise RuntimeError("injected fault in generate")

    monkeypatch.setattr(engine.model, "generate", boom)
    status, data = post_chat(port, BODY)
    err = error_of(status, data)
    assert status == 500 and err["type"] == "server_error" and err["code"] == "internal_error", err
    monkeypatch.undo()
    assert_serves(port)


def test_exception_mid_stream_is_an_error_event_then_next_succeeds(live, monkeypatch):
    import constrain.engine as engine_module

    engine, port = live
    original = engine_module._Hook.__call__

    def fail_after_three(self, input_ids, scores, **kwargs):
        if self.sent >= 3:
            raise RuntimeError("injected fault after three tokens")
        return original(self, input_ids, scores, **kwargs)

    monkeypatch.setattr(engine_module._Hook, "__call__", fail_after_three)
    status, data = post_chat(port, {**LONG, "max_tokens": 64, "stream": True})
    assert status == 200  # the stream had begun: the error comes as an event (as vLLM sends it), then [DONE]
    events = sse_events(data)
    assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
    body = events[-2]["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["type"] == "server_error", body
    assert all("error" not in e for e in events[:-2])
    monkeypatch.undo()
    assert_serves(port)


def test_exception_in_compilation_is_500_then_next_succeeds(live, monkeypatch):
    import constrain.compiler

    _, port = live

    def boom(*args, **kwargs):
        raise MemoryError("injected fault in compile_index")

    monkeypatch.setattr(constrain.compiler, "compile_index", boom)
    for stream in (False, True):
        status, data = post_chat(port, {**BODY, "stream": stream})
        err = error_of(status, data)
        assert status == 500 and err["code"] == "internal_error" and "MemoryError" in err["message"], err
    monkeypatch.undo()
    assert_serves(port)


def test_slow_compilation_is_refused_at_the_compile_budget(live, monkeypatch):
    import constrain.compiler

    engine, port = live
    original = constrain.compiler.compile_index
    release = threading.Event()

    def stuck(*args, **kwargs):  # a compiler that overruns every budget until released
        release.wait(60)
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "compile_timeout", 1.0)
    monkeypatch.setattr(constrain.compiler, "compile_index", stuck)
    timed_out = engine.stats()["compiles"]["timed_out"]
    t0 = time.monotonic()
    status, data = post_chat(port, BODY)
    err = error_of(status, data)
    assert status == 400 and err["code"] == "budget_exceeded" and err["param"] == "tools", err
    assert time.monotonic() - t0 < 30  # answered at the budget, not when the compiler finished
    assert engine.stats()["compiles"]["timed_out"] == timed_out + 1
    monkeypatch.undo()
    release.set()  # this fake compiler never reads its deadline; the real one does (the tests below)
    wait_for(lambda: engine.stats()["compiles"]["running"] == 0, what="the stuck compilation to end")
    assert_serves(port)


SLOW_BODY = {**BODY, "tools": SLOW_TOOLS}
STOP_BOUND_S = 2.0  # how long a compile may run on after its deadline or cancel (a generous bound, not a timing)


def test_compilation_past_the_budget_stops_at_the_budget(live, monkeypatch):
    engine, port = live
    monkeypatch.setattr(engine, "compile_timeout", 4.0)
    timed_out = engine.stats()["compiles"]["timed_out"]
    t0 = time.monotonic()
    status, data = post_chat(port, SLOW_BODY)
    answered = time.monotonic()
    err = error_of(status, data)
    assert status == 400 and err["code"] == "budget_exceeded", err
    assert err["param"] == "tools" or err["param"].startswith("tools[0].function.parameters"), err
    assert answered - t0 < 4.0 + STOP_BOUND_S + 1.0  # the budget, the grace for the compiler to stop, the HTTP round
    assert engine.stats()["compiles"]["timed_out"] == timed_out + 1
    # the compile thread itself stopped (it no longer runs on in the background)
    wait_for(lambda: engine.stats()["compiles"]["running"] == 0, timeout=STOP_BOUND_S, what="the compile to stop")
    monkeypatch.undo()
    assert_serves(port)


def test_request_timeout_stops_its_compilation(live, monkeypatch):
    engine, port = live
    monkeypatch.setattr(engine, "timeout", 4.0)  # the request's own deadline comes before the compile budget
    status, data = post_chat(port, SLOW_BODY)
    err = error_of(status, data)
    assert status == 504 and err["code"] == "timeout", err
    wait_for(lambda: engine.stats()["compiles"]["running"] == 0, timeout=STOP_BOUND_S, what="the compile to stop")
    monkeypatch.undo()
    assert_serves(port)


def test_client_leaving_cancels_its_compilation(live):
    engine, port = live
    cancelled = engine.stats()["compiles"]["cancelled"]
    raw = json.dumps(SLOW_BODY).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    wait_for(lambda: engine.stats()["compiles"]["running"] == 1, timeout=10, what="the compile to start")
    time.sleep(1.0)
    sock.close()
    # the server notices the departed client within its poll interval, then the compile stops at its next check
    wait_for(lambda: engine.stats()["compiles"]["cancelled"] == cancelled + 1, timeout=5, what="the cancel")
    wait_for(lambda: engine.stats()["compiles"]["running"] == 0, timeout=STOP_BOUND_S, what="the compile to stop")
    assert_serves(port)


# ---------------------------------------------------------------------------------------------------------------------
# disconnects and cancellation
# ---------------------------------------------------------------------------------------------------------------------


def test_disconnect_mid_stream_cancels_and_releases_the_job(live, monkeypatch, caplog):
    engine, port = live
    jobs: list[weakref.ref] = []
    prepare = engine.prepare

    def tracked(body):
        job = prepare(body)
        jobs.append(weakref.ref(job))
        return job

    monkeypatch.setattr(engine, "prepare", tracked)
    caplog.set_level(logging.INFO, logger="constrain.serve")
    for _ in range(3):
        open_stream(port, LONG).close()  # the client goes away after the first chunk
        wait_for(lambda: len(cancelled_lines(caplog.records)) >= 1, what="a cancelled outcome")
        tokens = cancelled_lines(caplog.records)
        assert tokens and max(tokens) < LONG["max_tokens"], tokens  # generation stopped early
        caplog.clear()
    assert engine.queued() == 0
    monkeypatch.undo()
    assert_serves(port)
    gc.collect()
    assert jobs and all(ref() is None for ref in jobs), "a cancelled job (its index and tensors) is still referenced"


def test_disconnect_while_waiting_cancels(live, caplog):
    engine, port = live
    caplog.set_level(logging.INFO, logger="constrain.serve")
    raw = json.dumps(LONG).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    time.sleep(1.0)  # generating; the non-streamed reply would come at the end
    sock.close()
    wait_for(lambda: cancelled_lines(caplog.records), what="a cancelled outcome")
    assert max(cancelled_lines(caplog.records)) < LONG["max_tokens"]
    assert_serves(port)


def test_queued_request_whose_client_left_never_runs(live, caplog):
    engine, port = live
    caplog.set_level(logging.INFO, logger="constrain.serve")
    first = open_stream(port, LONG)  # occupies the worker
    raw = json.dumps({**LONG, "max_tokens": 2000}).encode()
    second = socket.create_connection(("127.0.0.1", port), timeout=60)
    second.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(raw) + raw)
    wait_for(lambda: engine.queued() == 1, what="the second request to queue")
    second.close()
    time.sleep(1.0)  # the server notices the departed client within its poll interval
    first.close()
    wait_for(lambda: engine.queued() == 0, what="the queue to drain")
    assert_serves(port)
    runs = [r.getMessage() for r in caplog.records
            if "request mode=" in r.getMessage() and "tool_choice=none" in r.getMessage()]
    assert len(runs) == 1 and "outcome=cancelled" in runs[0], runs  # only the first generated at all


# ---------------------------------------------------------------------------------------------------------------------
# SIGTERM
# ---------------------------------------------------------------------------------------------------------------------


def read_all(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return out
        if not chunk:
            return out
        out += chunk


@pytest.fixture
def subprocess_server(tmp_path):
    require_demo_model()
    made: list[Server] = []

    def make(name: str, args: list[str]) -> Server:
        s = Server(name, ["--constrained-tools", *args], tmp_path)
        made.append(s)
        s.start()
        s.wait_ready()
        return s

    yield make
    for s in made:
        s.stop()


def test_sigterm_finishes_in_flight_then_exits(subprocess_server):
    server = subprocess_server("sigterm", ["--shutdown-timeout", "60"])
    sock = open_stream(server.port, {**LONG, "max_tokens": 200})
    server.proc.send_signal(signal.SIGTERM)
    rest = read_all(sock).decode("utf-8", "replace")
    assert "data: [DONE]" in rest, rest[-500:]  # the in-flight stream was allowed to finish
    # uvicorn re-raises the signal once its graceful shutdown is done: the process ends by SIGTERM, not by a crash
    assert server.proc.wait(60) == -signal.SIGTERM
    assert "Traceback" not in server.log()
    with pytest.raises(OSError):
        post_chat(server.port, BODY, timeout=5)  # nothing listens any more


def test_sigterm_past_the_grace_period_fails_in_flight_cleanly(subprocess_server):
    server = subprocess_server("sigterm-short", ["--shutdown-timeout", "1"])
    sock = open_stream(server.port, LONG)  # 3000 tokens: far longer than the grace period
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    rest = read_all(sock).decode("utf-8", "replace")
    assert "[DONE]" not in rest  # cut off, not passed off as complete
    assert server.proc.wait(60) == -signal.SIGTERM
    assert time.monotonic() - t0 < 60
