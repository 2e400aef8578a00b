"""Security: loopback by default, `--api-key` enforced on every `/v1` route before the body is read, a body-size
bound, and nothing from a request is evaluated, imported, fetched or unpickled (checked by sending such payloads and
by scanning the request path's source for the calls that could)."""

from __future__ import annotations

import ast
import json
import os
import pickle
import socket
from pathlib import Path

import pytest

from server_utils import ROOT, demo_server, error_of, http, post_chat

KEY = "sk-hardening"
LIMIT = 64 * 1024
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tool_choice": "none"}
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`constrain serve` with no --host (the default must be loopback), an API key and a 64 KiB body bound."""
    with demo_server("security", ["--api-key", KEY, "--max-body-bytes", str(LIMIT), "--constrained-tools"],
                     tmp_path_factory.mktemp("security"), default_host=True) as s:
        yield s


def listening_addresses(port: int) -> set[str]:
    """Local IPv4/IPv6 addresses (hex, as /proc/net/tcp* spells them) with a socket listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def test_binds_loopback_by_default(server):
    assert f"listening on http://127.0.0.1:{server.port}/v1" in server.log()
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp on this platform to read the bound address from")
    assert listening_addresses(server.port) == {"0100007F"}  # 127.0.0.1 only: not 0.0.0.0, not ::


@pytest.mark.parametrize("path, method", [("/v1/chat/completions", "POST"), ("/v1/models", "GET"),
                                          ("/v1/stats", "GET")])
@pytest.mark.parametrize("header", [None, "Bearer wrong-key", f"Basic {KEY}", KEY, "Bearer", f"Bearer {KEY}x"])
def test_api_key_required(server, path, method, header):
    headers = {"Authorization": header} if header is not None else {}
    status, data = http(server.port, method, path, json.dumps(BODY).encode() if method == "POST" else None, headers)
    err = error_of(status, data)
    assert status == 401 and err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error", err


def test_api_key_accepted(server):
    for path in ("/v1/models", "/v1/stats"):
        assert http(server.port, "GET", path, headers=AUTH)[0] == 200
    status, data = post_chat(server.port, BODY, AUTH)
    assert status == 200, data[:300]


def test_unauthenticated_body_is_never_read(server):
    """Without the key, an oversized or malformed body is refused as unauthenticated (401), not parsed."""
    for raw in (b"x" * (LIMIT * 4), b"\x80\x04not json"):
        status, data = post_chat(server.port, raw)
        assert status == 401 and error_of(status, data)["code"] == "invalid_api_key"


def test_body_size_limit(server):
    big = {**BODY, "messages": [{"role": "user", "content": "a" * LIMIT}]}
    status, data = post_chat(server.port, big, AUTH)
    err = error_of(status, data)
    assert status == 413 and err["code"] == "request_too_large", err
    # chunked, with no Content-Length to refuse early: counted as it arrives
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.putrequest("POST", "/v1/chat/completions")
    for k, v in {**AUTH, "Content-Type": "application/json", "Transfer-Encoding": "chunked"}.items():
        conn.putheader(k, v)
    conn.endheaders()
    piece = b"a" * 8192
    try:
        for _ in range(LIMIT // len(piece) + 2):
            conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.send(b"0\r\n\r\n")
    except OSError:
        pass  # the server may answer and close before the rest is sent
    resp = conn.getresponse()
    assert resp.status == 413 and error_of(resp.status, resp.read())["code"] == "request_too_large"
    conn.close()
    # just under the bound: read and answered on its merits
    under = {**BODY, "messages": [{"role": "user", "content": "a" * (LIMIT - 500)}]}
    status, data = post_chat(server.port, under, AUTH)
    assert status in (200, 400) and len(json.dumps(under)) <= LIMIT, data[:300]


def test_chat_template_cannot_come_from_the_request(server):
    for key in ("chat_template", "tokenizer_kwargs", "tools", "add_generation_prompt", "tokenize"):
        body = {**BODY, "chat_template_kwargs": {key: "{{ raise_exception('evaluated') }}"}}
        status, data = post_chat(server.port, body, AUTH)
        err = error_of(status, data)
        assert status == 400 and err["param"] == f"chat_template_kwargs.{key}", err


def test_remote_ref_is_never_fetched(server):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"
    body = {**BODY, "tool_choice": "required", "max_tokens": 64, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": url}}}}}]}
    status, data = post_chat(server.port, body, AUTH)
    err = error_of(status, data)
    assert status == 400 and err["param"] == "tools[0].function.parameters.properties.a.$ref", err
    with pytest.raises(BlockingIOError):
        listener.accept()  # nobody connected
    listener.close()


class _Marker:
    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))  # unpickling this would create the file


def test_pickle_payload_is_not_unpickled(server, tmp_path):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(str(marker)))
    for content_type in ("application/json", "application/octet-stream", "application/x-python-pickle"):
        status, data = post_chat(server.port, payload, {**AUTH, "Content-Type": content_type})
        assert status == 400 and error_of(status, data)["code"] == "invalid_json"
    assert not marker.exists()


# modules a request passes through (server → engine → protocol/policy → grammar/schema/automaton → index → parse)
REQUEST_PATH = ("server", "engine", "protocol", "policy", "response", "parse", "grammar", "schema", "automaton",
                "compiler", "regex", "formats", "numbers", "syntax", "templates", "index", "processor", "cache",
                "vocabulary", "errors", "trie")
FORBIDDEN_NAMES = {"eval", "exec", "compile", "__import__", "breakpoint"}
FORBIDDEN_ATTRS = {("pickle", "load"), ("pickle", "loads"), ("marshal", "load"), ("marshal", "loads"),
                   ("importlib", "import_module"), ("yaml", "load"), ("os", "system"), ("os", "popen"),
                   ("torch", "load"), ("subprocess", "run"), ("subprocess", "Popen"), ("shelve", "open")}


def test_request_path_evaluates_nothing():
    """No call on the request path can evaluate, import or unpickle data; `ast.literal_eval` (literals only) is
    allowed, and models load without `trust_remote_code`."""
    found = []
    for name in REQUEST_PATH:
        path = ROOT / "constrain" / f"{name}.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id in FORBIDDEN_NAMES:
                    found.append(f"{name}.py:{node.lineno} {f.id}()")
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and (f.value.id, f.attr) in FORBIDDEN_ATTRS:
                    found.append(f"{name}.py:{node.lineno} {f.value.id}.{f.attr}()")
                for kw in node.keywords:
                    if kw.arg == "trust_remote_code" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        found.append(f"{name}.py:{node.lineno} trust_remote_code")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                for bad in ("pickle", "marshal", "shelve", "dill", "cloudpickle"):
                    if bad in names:
                        found.append(f"{name}.py:{node.lineno} import {bad}")
    assert not found, found
