"""The assistant message (from `constrain.parse`) → OpenAI `chat.completion` / `chat.completion.chunk` objects.

In: a message dict with `finish_reason`, or a stream delta, plus model name and token counts. Out: the response
objects in OpenAI's exact shape (contract reference §1.4, §1.7); no HTTP, no automata.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Mapping

__all__ = ["chat_completion", "chat_completion_chunk", "new_completion_id", "role_delta", "usage", "usage_chunk"]

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")


def new_completion_id() -> str:
    """A fresh completion id: `chatcmpl-` + 32 hex digits of a uuid4."""
    return "chatcmpl-" + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's `usage` object (`total_tokens` is the sum; `completion_tokens_details.reasoning_tokens` included)."""
    for name, value in (("prompt_tokens", prompt_tokens), ("completion_tokens", completion_tokens),
                        ("reasoning_tokens", reasoning_tokens)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def _check_finish(finish_reason: Any, *, allow_none: bool) -> None:
    if finish_reason is None and allow_none:
        return
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"finish_reason must be one of {', '.join(FINISH_REASONS)}, got {finish_reason!r}")


def chat_completion(
    message: Mapping[str, Any],
    *,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    reasoning_tokens: int = 0,
    created: int | None = None,
    id: str | None = None,
) -> dict[str, Any]:
    """A non-streaming `chat.completion` object for one choice.

    Args:
        message: `parse_output`'s dict: `content`, optional `tool_calls` and `reasoning_content`, `finish_reason`.
        model: the model name echoed back.
        prompt_tokens, completion_tokens, reasoning_tokens: counts for `usage`.
        created: Unix seconds (default: now). id: the completion id (default: `new_completion_id()`).
    Returns:
        `{"id": "chatcmpl-…", "object": "chat.completion", "created", "model", "choices": [{"index": 0,
        "message": {"role": "assistant", "content", "refusal": None, "tool_calls"?, "reasoning_content"?},
        "logprobs": None, "finish_reason"}], "usage"}`. `tool_calls` is present only when non-empty (an empty
        list is never sent, vllm#53255); `content` is None when absent.
    Raises:
        ValueError: a missing or unknown `finish_reason`, or `finish_reason` "tool_calls" without calls.
    """
    finish_reason = message.get("finish_reason")
    _check_finish(finish_reason, allow_none=False)
    calls = list(message.get("tool_calls") or [])
    if finish_reason == "tool_calls" and not calls:
        raise ValueError("finish_reason 'tool_calls' needs at least one tool call (vllm#53255)")
    out_message: dict[str, Any] = {"role": "assistant", "content": message.get("content"), "refusal": None}
    if calls:
        out_message["tool_calls"] = calls
    if "reasoning_content" in message:
        out_message["reasoning_content"] = message["reasoning_content"]
    return {
        "id": id or new_completion_id(),
        "object": "chat.completion",
        "created": int(time.time()) if created is None else int(created),
        "model": model,
        "choices": [{"index": 0, "message": out_message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens, reasoning_tokens),
    }


def role_delta() -> dict[str, Any]:
    """The first delta of a stream: the role, before any content or call (as OpenAI sends it)."""
    return {"role": "assistant", "content": None, "refusal": None}


def chat_completion_chunk(
    delta: Mapping[str, Any],
    *,
    model: str,
    id: str,
    created: int,
    finish_reason: str | None = None,
    include_usage: bool = False,
) -> dict[str, Any]:
    """One `chat.completion.chunk` with one choice.

    Args:
        delta: a `StreamParser` delta, `role_delta()`, or `{}` for the last chunk (which carries `finish_reason`).
        model, id, created: the same on every chunk of a stream (make `id` with `new_completion_id()` once).
        finish_reason: None on every chunk but the last.
        include_usage: the request asked `stream_options.include_usage`: every choice chunk then says
            `"usage": None` and `usage_chunk` follows the last one.
    Raises:
        ValueError: an unknown `finish_reason`.
    """
    _check_finish(finish_reason, allow_none=True)
    chunk: dict[str, Any] = {
        "id": id,
        "object": "chat.completion.chunk",
        "created": int(created),
        "model": model,
        "choices": [{"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish_reason}],
    }
    if include_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(
    *, model: str, id: str, created: int, prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0
) -> dict[str, Any]:
    """The extra chunk of `stream_options.include_usage`, after the finish chunk: `choices: []` and the usage."""
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": int(created),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens, reasoning_tokens),
    }
