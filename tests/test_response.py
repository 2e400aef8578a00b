"""response: OpenAI chat.completion / chunk shapes (contract reference §1.4, §1.7)."""

from __future__ import annotations

import pytest

from constrain.response import (
    chat_completion,
    chat_completion_chunk,
    new_completion_id,
    role_delta,
    usage_chunk,
)

CALL = {"id": "call_abc", "type": "function", "function": {"name": "get", "arguments": "{}"}}


def test_chat_completion_shape():
    msg = {"role": "assistant", "content": None, "tool_calls": [CALL], "finish_reason": "tool_calls"}
    out = chat_completion(msg, model="m", prompt_tokens=10, completion_tokens=5, created=123, id="chatcmpl-x")
    assert out == {
        "id": "chatcmpl-x", "object": "chat.completion", "created": 123, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": None,
                                             "tool_calls": [CALL]},
                     "logprobs": None, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    }


def test_no_calls_means_no_tool_calls_key():
    out = chat_completion({"content": "hi", "tool_calls": [], "finish_reason": "stop"}, model="m",
                          prompt_tokens=1, completion_tokens=1)
    assert "tool_calls" not in out["choices"][0]["message"]
    assert out["id"].startswith("chatcmpl-") and isinstance(out["created"], int)


def test_53255_tool_calls_finish_without_calls_is_refused():
    with pytest.raises(ValueError):
        chat_completion({"content": None, "tool_calls": [], "finish_reason": "tool_calls"}, model="m",
                        prompt_tokens=1, completion_tokens=1)


@pytest.mark.parametrize("reason", [None, "done", "function_call"])
def test_bad_finish_reason(reason):
    with pytest.raises(ValueError):
        chat_completion({"content": "x", "finish_reason": reason}, model="m", prompt_tokens=1, completion_tokens=1)


def test_reasoning_content_passes_through():
    out = chat_completion({"content": "a", "reasoning_content": "r", "finish_reason": "stop"}, model="m",
                          prompt_tokens=1, completion_tokens=1)
    assert out["choices"][0]["message"]["reasoning_content"] == "r"


def test_stream_chunks():
    cid = new_completion_id()
    first = chat_completion_chunk(role_delta(), model="m", id=cid, created=5)
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["delta"]["role"] == "assistant"
    assert first["choices"][0]["finish_reason"] is None and first["choices"][0]["logprobs"] is None
    assert "usage" not in first
    last = chat_completion_chunk({}, model="m", id=cid, created=5, finish_reason="length", include_usage=True)
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert last["usage"] is None and last["id"] == cid
    tail = usage_chunk(model="m", id=cid, created=5, prompt_tokens=3, completion_tokens=4)
    assert tail["choices"] == [] and tail["usage"]["total_tokens"] == 7


def test_completion_ids_unique():
    ids = {new_completion_id() for _ in range(1000)}
    assert len(ids) == 1000 and all(i.startswith("chatcmpl-") for i in ids)


def test_usage_counts_checked():
    with pytest.raises(ValueError):
        chat_completion({"content": "x", "finish_reason": "stop"}, model="m", prompt_tokens=-1, completion_tokens=1)
