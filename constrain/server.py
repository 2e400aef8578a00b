"""The OpenAI-compatible HTTP server of `constrain serve`: requests → `Engine` jobs → `chat.completion` JSON or SSE chunks.

HTTP only: validation, generation and parsing are the engine's and the pipeline's; errors become OpenAI's error shape
in one place (`_error`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from constrain.engine import Engine, QueueFull, RequestTimeout
from constrain.errors import RequestError
from constrain.parse import StreamParser, parse_output
from constrain.response import chat_completion, chat_completion_chunk, new_completion_id, role_delta, usage_chunk

__all__ = ["create_app"]

log = logging.getLogger("constrain.serve")
_POLL_S = 0.25  # how often a waiting non-streamed request checks that its client is still there
DEFAULT_MAX_BODY_BYTES = 8 << 20  # 1 MB of tool JSON with room to spare; larger bodies are refused unread (413)


def _error(err: BaseException) -> tuple[int, dict[str, Any]]:
    """The one place exceptions become HTTP statuses and OpenAI error bodies (contract §1.8)."""
    if isinstance(err, RequestError):
        return 400, {"message": err.message, "type": "invalid_request_error", "param": err.param or None,
                     "code": err.code}
    if isinstance(err, QueueFull):
        return 429, {"message": str(err), "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    if isinstance(err, RequestTimeout):
        return 504, {"message": str(err), "type": "timeout_error", "param": None, "code": "timeout"}
    if isinstance(err, _Unauthorized):
        return 401, {"message": str(err), "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    if isinstance(err, _BadJson):
        return 400, {"message": str(err), "type": "invalid_request_error", "param": None, "code": "invalid_json"}
    if isinstance(err, _TooLarge):
        return 413, {"message": str(err), "type": "invalid_request_error", "param": None, "code": "request_too_large"}
    return 500, {"message": f"internal server error: {type(err).__name__}: {err}", "type": "server_error",
                 "param": None, "code": "internal_error"}


class _Unauthorized(Exception):
    pass


class _BadJson(Exception):
    pass


class _TooLarge(Exception):
    pass


def _error_response(err: BaseException) -> Response:
    status, body = _error(err)
    if status >= 500 and not isinstance(err, RequestTimeout):
        log.error("request failed status=%d %s", status, body["message"])
    else:
        log.info("request rejected status=%d param=%s code=%s: %s", status, body["param"], body["code"],
                 body["message"])
    # ASCII escapes: a message may quote request text, and nothing in it may stop the error itself from being sent
    return Response(json.dumps({"error": body}), status_code=status, media_type="application/json")


def _sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (`_TooLarge`) as soon as it is known to pass `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge(f"the request body has {int(declared)} bytes; this server takes at most {limit}")
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise _TooLarge(f"the request body passes {limit} bytes, the most this server takes")
        parts.append(part)
    return b"".join(parts)


def create_app(engine: Engine, *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> Starlette:
    """The Starlette app serving `engine`: `POST /v1/chat/completions`, `GET /v1/models`, `GET /v1/stats`,
    `GET /health`.

    With `api_key`, the `/v1` routes answer 401 unless the request says `Authorization: Bearer <api_key>`.
    A chat request body over `max_body_bytes` is refused with 413 before it is parsed.
    """

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or token.strip() != api_key:
            raise _Unauthorized("Incorrect API key provided" if header else
                                "You didn't provide an API key (Authorization: Bearer <key>)")

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": engine.name, "demo": engine.demo, "queued": engine.queued()})

    async def models(request: Request) -> Response:
        try:
            check_key(request)
        except _Unauthorized as err:
            return _error_response(err)
        return JSONResponse({"object": "list", "data": [engine.describe()]})

    async def stats(request: Request) -> Response:
        try:
            check_key(request)
        except _Unauthorized as err:
            return _error_response(err)
        return JSONResponse(engine.stats())

    async def chat(request: Request) -> Response:
        job = None
        try:
            check_key(request)
            raw = await _read_body(request, max_body_bytes)
            try:
                body = json.loads(raw)
            except ValueError as err:
                raise _BadJson(f"the request body is not valid JSON: {err}") from err
            except RecursionError as err:  # the C decoder recurses once per array or object level
                raise _BadJson("the request body nests arrays and objects too deeply to be parsed") from err
            job = await run_in_threadpool(engine.prepare, body)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
            job.sink = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)
            engine.submit(job)
            kind, value = await _next(events, job, request, skip_tokens=False)
            if kind == "error":
                raise value
            if kind == "done":  # the client went away before generation began
                return Response(status_code=499)
            index = value["index"]
            if job.request.stream:
                return StreamingResponse(_stream(engine, job, index, events), media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            while True:
                kind, value = await _next(events, job, request, skip_tokens=True)
                if kind == "error":
                    raise value
                if kind == "done":
                    break
            if value is None:  # cancelled: nobody is listening
                return Response(status_code=499)
            message = parse_output(index, value["ids"], value["finish_reason"])
            return JSONResponse(chat_completion(
                message, model=engine.name, prompt_tokens=value["prompt_tokens"],
                completion_tokens=value["completion_tokens"], reasoning_tokens=value["reasoning_tokens"]))
        except Exception as err:  # noqa: BLE001 - every failure gets OpenAI's error shape (500 when unknown)
            if job is not None:
                job.cancel()
            return _error_response(err)

    return Starlette(routes=[
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/stats", stats, methods=["GET"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])


async def _next(events: asyncio.Queue, job: Any, request: Request, *, skip_tokens: bool) -> tuple[str, Any]:
    """The job's next event (tokens skipped when asked), cancelling the job when the client disconnects.

    The client is checked every `_POLL_S` whether or not events arrive: tokens stream in faster than that, so a check
    only on a quiet queue would never run while a non-streamed request generates."""
    checked = time.monotonic()
    while True:
        try:
            kind, value = await asyncio.wait_for(events.get(), _POLL_S)
        except asyncio.TimeoutError:
            kind, value = None, None
        if kind is None or time.monotonic() - checked >= _POLL_S:
            checked = time.monotonic()
            if await request.is_disconnected():
                job.cancel()
                return "done", None
            if time.monotonic() > job.deadline + 30:  # the worker is stuck past the request's own timeout
                job.cancel()
                return "error", RequestTimeout("the request ran past the server's timeout")
        if kind is None or (kind == "token" and skip_tokens):
            continue
        return kind, value


async def _stream(engine: Engine, job: Any, index: Any, events: asyncio.Queue) -> AsyncIterator[str]:
    """SSE chunks (contract §1.7): role, content / reasoning / tool-call deltas, the finish chunk, the optional usage
    chunk, `[DONE]`. A client that disconnects cancels the generation (Starlette cancels this generator)."""
    cid, created = new_completion_id(), int(time.time())
    usage = job.request.include_usage
    parser = StreamParser(index)

    def chunk(delta: dict, finish: str | None = None) -> str:
        return _sse(chat_completion_chunk(delta, model=engine.name, id=cid, created=created, finish_reason=finish,
                                          include_usage=usage))

    try:
        yield chunk(role_delta())
        while True:
            kind, value = await events.get()
            if kind == "token":
                for delta in parser.feed(value):
                    yield chunk(delta)
            elif kind == "done":
                if value is None:
                    return
                for delta in parser.finish(value["finish_reason"]):
                    yield chunk(delta)
                yield chunk({}, parser.finish_reason)
                if usage:
                    yield _sse(usage_chunk(model=engine.name, id=cid, created=created,
                                           prompt_tokens=value["prompt_tokens"],
                                           completion_tokens=value["completion_tokens"],
                                           reasoning_tokens=value["reasoning_tokens"]))
                yield "data: [DONE]\n\n"
                return
            else:  # an error after the stream began: OpenAI-compatible servers send it as an event (vLLM)
                status, body = _error(value)
                log.error("stream failed status=%d %s", status, body["message"])
                yield _sse({"error": body})
                yield "data: [DONE]\n\n"
                return
    finally:
        job.cancel()
