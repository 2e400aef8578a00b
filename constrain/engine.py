"""The serving engine: a transformers model, its chat template and vocabulary; request bodies in, generated token ids out.

A request is validated and rendered on the caller's thread (`Engine.prepare`), then one worker thread compiles its
policy (cached) and generates with `MaskProcessor` (or freely, for validation afterwards), reporting events to the job.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from constrain.errors import RequestError
from constrain.policy import Policy
from constrain.protocol import ChatRequest
from constrain.schema import DEFAULT_MAX_DEPTH

__all__ = ["Engine", "Job", "QueueFull", "RequestTimeout"]

log = logging.getLogger("constrain.serve")

# How long a request waits, past its compile deadline, for the compiler to stop itself and say where it was (it reads
# the deadline every 64 units of work: stops seen 0.04-0.5 s after the deadline; the tests bound it at 2 s).
_CANCEL_GRACE_S = 1.0

DEFAULT_COMPILE_TIMEOUT_S = 30.0  # schema.py's own per-schema budget is 10 s; this bounds the whole policy
DEFAULT_MAX_TOKENS = 256  # when a request names no max_tokens (raised to the shortest valid output when constrained)
TOOL_FORMATS = ("auto", "hermes", "qwen3_xml", "gemma4", "llama3_json", "mistral", "mistral_v3", "json")


class QueueFull(Exception):
    """The request queue is full (HTTP 429)."""


class RequestTimeout(Exception):
    """The request ran past the server's `--timeout` (HTTP 504)."""


@dataclass
class Job:
    """One request on its way through the worker. `sink` receives the events, on the worker thread:

    ("ready", {"index", "compile_ms", "cache_hit"}) once compiled; ("token", id) per generated token;
    ("done", {"ids", "finish_reason", "prompt_tokens", "completion_tokens", "seconds"}); or ("error", exception)
    instead of "ready"/"done" (a `RequestError`, `RequestTimeout`, or any other exception = internal).
    """

    request: ChatRequest
    policy: Policy
    prompt_ids: list[int]
    max_new_tokens: int
    max_tokens_pointer: str | None  # where the request said max_tokens (None: the server's default)
    thinking: bool
    tool_format: str
    deadline: float
    sink: Callable[[tuple[str, Any]], None] = lambda event: None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Stop generating for this job at the next step (the client went away)."""
        self.cancelled.set()


class Engine:
    """A loaded model served one request at a time by a worker thread, with a bounded queue of waiting requests.

    Args:
        model_dir: a transformers model directory (weights, tokenizer, chat template).
        tool_format: a format name of `constrain.grammar.FORMATS`, or "auto" (detected from the chat template; a
            template without tool calls serves text only and refuses required/named `tool_choice`).
        constrained: constrain generation with `MaskProcessor` (else generate freely and validate afterwards).
        max_queue: requests that may wait while one generates (more → `QueueFull`).
        timeout: seconds a request may take from submission to its last token (→ `RequestTimeout`).
        compile_timeout: seconds a request's constraints may take to compile (→ `budget_exceeded` 400).
        demo: the directory is the embedded demo model (labelled so in `/v1/models` and the log).
        shallower: compile every request's policy with `Policy.shallower` (a schema over the state budget with
            recursion or free-form nesting gets fewer levels of it instead of a `budget_exceeded` 400; each such
            schema is logged with its depth).
        threads: torch's intra-op threads (None: 1 for the demo model, whose steps are too small to split, else
            torch's default).
    Raises:
        ValueError: an unknown `tool_format`, or a named format the template cannot be used with.
    """

    def __init__(self, model_dir: str | Path, *, tool_format: str = "auto", constrained: bool = False,
                 max_queue: int = 16, timeout: float = 120.0, demo: bool = False, threads: int | None = None,
                 compile_timeout: float = DEFAULT_COMPILE_TIMEOUT_S, shallower: bool = False):
        import torch
        import transformers

        from constrain.templates import NoToolFormat, detect_format
        from constrain.vocabulary import Vocabulary

        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
        if threads or demo:
            torch.set_num_threads(threads or 1)
        self.model_dir = Path(model_dir)
        self.demo = demo
        self.constrained = constrained
        self.timeout = float(timeout)
        self.compile_timeout = float(compile_timeout)
        self.shallower = bool(shallower)
        self._lock = threading.Lock()
        self._shallow_seen: weakref.WeakSet = weakref.WeakSet()  # the indexes whose shallower schemas were logged
        self._compiling = 0
        self._compiles_timed_out = 0
        self._compiles_cancelled = 0
        self.name = self.model_dir.name
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.model_dir))
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        template = self.tokenizer.chat_template
        if not isinstance(template, str) or not template:
            raise ValueError(f"{self.model_dir} has no chat template")
        self.template = template
        self._template_parameters = frozenset(
            name for name, p in inspect.signature(self.tokenizer.apply_chat_template).parameters.items()
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
        gen_eos = self.model.generation_config.eos_token_id
        eos = [gen_eos] if isinstance(gen_eos, int) else list(gen_eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = tuple(eos)
        self.vocab = Vocabulary.from_tokenizer(self.tokenizer, eos_ids=eos or None,
                                               vocab_size=self.model.config.vocab_size)
        self.pad_id = self.model.generation_config.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 0) or 1 << 30)
        if tool_format == "auto":
            try:
                self.native_format: str | None = detect_format(template)
            except NoToolFormat as err:
                log.info("chat template has no supported tool-call format (%s): text only, "
                         "required/named tool_choice refused", err)
                self.native_format = None
        else:
            self.native_format = tool_format
        # Text and response_format need a format too; without a native one, the project's plain JSON format.
        self.tool_format = self.native_format or "json"
        self._default_thinking = self._template_thinks_by_default()
        self._warm_up()
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=max(int(max_queue), 0) or 1)
        self._worker = threading.Thread(target=self._run, name="constrain-engine", daemon=True)
        self._worker.start()

    @classmethod
    def load(cls, model_dir: str | Path | None = None, **options: Any) -> Engine:
        """The engine of `model_dir`, or of the embedded demo model (built and cached on first use) when None."""
        if model_dir is None:
            from constrain.demo_model import ensure_demo_model

            return cls(ensure_demo_model(), demo=True, **options)
        return cls(model_dir, **options)

    def _first_use(self, index: Any) -> bool:
        """True the first time `index` (a compiled policy, cached and shared by requests) is seen here."""
        with self._lock:
            seen = index in self._shallow_seen
            self._shallow_seen.add(index)
        return not seen

    def _template_thinks_by_default(self) -> bool:
        """The template opens a thinking turn unless told `enable_thinking: false` (Qwen3 hybrid models)."""
        from constrain.grammar import load_format

        if "enable_thinking" not in self.template or not load_format(self.tool_format).has("think"):
            return False
        msgs = [{"role": "user", "content": "x"}]
        try:
            default = self._render(msgs, None, {})
            on = self._render(msgs, None, {"enable_thinking": True})
        except Exception:  # noqa: BLE001 - a template that cannot say: thinking stays off
            return False
        return default == on

    def _warm_up(self) -> None:
        """One short generation (and, when constrained, one masked step) so the first request pays no one-off cost
        (the mask kernel is compiled by torch.compile on its first call)."""
        job = self.prepare({"messages": [{"role": "user", "content": "hi"}], "temperature": 0})
        job.max_new_tokens = 2  # raised to the shortest valid output when constrained (no max_tokens was asked)
        self._serve(job)

    # ---- requests

    def describe(self) -> dict[str, Any]:
        """The `/v1/models` entry of the served model."""
        return {"id": self.name, "object": "model", "created": 0, "owned_by": "constrain",
                "demo": self.demo, "tool_format": self.native_format, "constrained_tools": self.constrained,
                "shallower_schemas": self.shallower}

    def stats(self) -> dict[str, Any]:
        """The `/v1/stats` figures: the compiled-index cache (entries, estimated bytes and its bound, hits, misses,
        evictions), compilations running (threads not yet stopped), stopped at the compile budget or the request's
        deadline (`timed_out`) and cancelled because their client left, the process's resident memory in bytes (None
        where /proc is absent) and the queue length."""
        from constrain.compiler import DEFAULT_CACHE

        cache = DEFAULT_CACHE
        return {"cache": {"entries": len(cache), "bytes": cache.nbytes(), "max_bytes": cache.max_bytes,
                          "hits": cache.hits, "misses": cache.misses, "evictions": cache.evictions},
                "compiles": {"running": self._compiling, "timed_out": self._compiles_timed_out,
                             "cancelled": self._compiles_cancelled, "timeout_s": self.compile_timeout},
                "rss_bytes": _rss_bytes(), "queued": self.queued()}

    def prepare(self, body: Any) -> Job:
        """Validate a request body and render its prompt.

        Raises:
            RequestError: an invalid request (with `pointer` and `code`), including required/named `tool_choice`
                on a template without tool calls, `stop` sequences (not supported), a template that refuses the
                conversation, or a prompt longer than the context.
        """
        request = ChatRequest.from_body(body)
        policy = Policy.from_chat_request(request)
        if self.shallower:
            policy = dataclasses.replace(policy, shallower=True)
        if policy.mode == "required" and self.native_format is None:
            raise RequestError(
                f"Invalid value for 'tool_choice': the model {self.name!r} has a chat template without tool calls, "
                "so no tool call can be forced", pointer="/tool_choice", code="invalid_value")
        if request.stop:
            raise RequestError("'stop' sequences are not supported by this server", pointer="/stop",
                               code="unsupported_value")
        kwargs = dict(request.chat_template_kwargs or {})
        for key in kwargs:  # protocol refuses the known names; this catches what this transformers version adds
            if key in self._template_parameters:
                raise RequestError(f"Invalid value for 'chat_template_kwargs.{key}': {key!r} is a parameter of the "
                                   "chat template renderer, not a template variable",
                                   pointer=f"/chat_template_kwargs/{key}", code="invalid_value")
        thinking = request.enable_thinking if request.enable_thinking is not None else self._default_thinking
        try:
            prompt = self._render(_template_messages(body["messages"]), body.get("tools"), kwargs)
        except Exception as err:  # noqa: BLE001 - jinja errors and raise_exception() inside the template
            raise RequestError(f"the chat template cannot render these messages: {type(err).__name__}: {err}",
                               pointer="/messages", code="invalid_value") from err
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False).input_ids
        room = self.context_length - len(prompt_ids)
        pointer = None
        if request.max_tokens is not None:
            pointer = "/max_completion_tokens" if body.get("max_completion_tokens") is not None else "/max_tokens"
        max_new = request.max_tokens if request.max_tokens is not None else min(DEFAULT_MAX_TOKENS, room)
        if room < 1 or max_new > room:
            raise RequestError(
                f"This model's maximum context length is {self.context_length} tokens; the prompt has "
                f"{len(prompt_ids)} and max_tokens asks {max_new} more", pointer=pointer or "/messages",
                code="context_length_exceeded")
        return Job(request=request, policy=policy, prompt_ids=prompt_ids, max_new_tokens=max_new,
                   max_tokens_pointer=pointer, thinking=bool(thinking), tool_format=self.tool_format,
                   deadline=time.monotonic() + self.timeout)

    def submit(self, job: Job) -> None:
        """Queue a prepared job. Raises QueueFull when `max_queue` jobs are already waiting."""
        try:
            self._queue.put_nowait(job)
        except queue.Full as err:
            raise QueueFull(f"{self._queue.maxsize} requests are already waiting; retry later") from err

    def queued(self) -> int:
        """Requests waiting for the worker (the one generating not counted)."""
        return self._queue.qsize()

    def close(self) -> None:
        """Stop the worker after the job it is running."""
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass

    def _render(self, messages: list[dict], tools: Any, kwargs: dict) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False, **kwargs)

    # ---- the worker

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                self._serve(job)
            except Exception as err:  # noqa: BLE001 - reported to the job; the server answers 400 or 500
                if not isinstance(err, (RequestError, RequestTimeout)):
                    log.exception("request failed")
                job.sink(("error", err))

    def _serve(self, job: Job) -> None:
        import torch

        from constrain.automaton import BudgetExceeded, Deadline
        from constrain.compiler import DEFAULT_CACHE

        if time.monotonic() > job.deadline:
            raise RequestTimeout(f"the request waited longer than the server's {self.timeout:g} s timeout")
        if job.cancelled.is_set():
            job.sink(("done", None))
            return
        hits = DEFAULT_CACHE.hits
        t0 = time.perf_counter()
        compiled = self._compile(job)
        if compiled is None:  # the client went away while the policy compiled
            job.sink(("done", None))
            return
        index, (need, enough) = compiled  # need <= the shortest valid output's tokens <= enough (equal when exact)
        compile_ms = (time.perf_counter() - t0) * 1e3
        cache_hit = DEFAULT_CACHE.hits > hits
        processors = []
        if self.constrained:
            if job.max_new_tokens < need:
                if job.max_tokens_pointer is None:  # the server's default: raise it to what the output needs
                    job.max_new_tokens = enough
                else:  # the exact minimum (need == enough), else its proven bounds (the exact one a long search)
                    tokens = f"{need}" if need == enough else f"{need} to {enough}"
                    raise RequestError(
                        f"max_tokens is {job.max_new_tokens}, below the {tokens} tokens the shortest valid reply under "
                        f"this request's tool policy needs; set max_tokens to at least {enough}",
                        pointer=job.max_tokens_pointer, code="invalid_value")
            from constrain.processor import MaskProcessor

            processors.append(MaskProcessor(index, len(job.prompt_ids), budget=job.max_new_tokens))
        job.sink(("ready", {"index": index, "compile_ms": compile_ms, "cache_hit": cache_hit}))
        request = job.request
        temperature = 1.0 if request.temperature is None else request.temperature
        sampling: dict[str, Any] = {"do_sample": temperature > 0}
        if temperature > 0:
            sampling.update(temperature=temperature, top_p=1.0 if request.top_p is None else request.top_p, top_k=0)
        if request.seed is not None:
            torch.manual_seed(request.seed)
        hook = _Hook(job, len(job.prompt_ids))
        t1 = time.perf_counter()
        # the request's deadline bounds the token-budget searches a long output makes while decoding (an output
        # that comes within the index's bound of its max_tokens: `TokenIndex.completes_within`), as the hook bounds
        # the steps
        try:
            with torch.inference_mode(), Deadline(expires_at=job.deadline).active():
                out = self.model.generate(
                    torch.tensor([job.prompt_ids]), attention_mask=torch.ones(1, len(job.prompt_ids), dtype=torch.long),
                    max_new_tokens=job.max_new_tokens, min_new_tokens=0, logits_processor=processors,
                    stopping_criteria=[hook], eos_token_id=list(self.eos_ids), pad_token_id=self.pad_id,
                    repetition_penalty=None, **sampling)
        except BudgetExceeded as err:
            self._log(job, "timeout", compile_ms, cache_hit, hook.sent, time.perf_counter() - t1)
            raise RequestTimeout(f"the request ran past the server's {self.timeout:g} s timeout while its token "
                                 "budget table was built") from err
        seconds = time.perf_counter() - t1
        ids = out[0, len(job.prompt_ids):].tolist()
        hook.flush(ids)
        if job.cancelled.is_set():
            self._log(job, "cancelled", compile_ms, cache_hit, len(ids), seconds)
            job.sink(("done", None))
            return
        if hook.timed_out:
            self._log(job, "timeout", compile_ms, cache_hit, len(ids), seconds)
            raise RequestTimeout(f"the request ran past the server's {self.timeout:g} s timeout")
        eos = set(self.eos_ids)
        cut = next((k + 1 for k, t in enumerate(ids) if t in eos), None)
        if cut is not None:
            ids, finish = ids[:cut], "stop"
        elif self.constrained and _accepts(index, ids):
            finish = "stop"  # budget-aware masking: the output is complete when the budget runs out
        else:
            finish = "length"
        self._log(job, finish, compile_ms, cache_hit, len(ids), seconds)
        job.sink(("done", {"ids": ids, "finish_reason": finish, "prompt_tokens": len(job.prompt_ids),
                           "completion_tokens": len(ids), "reasoning_tokens": self._reasoning_tokens(job, ids),
                           "seconds": seconds}))

    def _compile(self, job: Job) -> tuple[Any, tuple[int, int]] | None:
        """The job's token index and, when a valid reply needs more than the job's `max_new_tokens`, the fewest
        tokens it needs as `(lo, hi)` (equal when exact: `TokenIndex.min_tokens_range_from_start`; else (0, 0), and
        unconstrained), or None when the job was cancelled meanwhile.

        Compilation runs on its own thread under one `Deadline` (the compile budget or the request's deadline,
        whichever comes first) that covers every schema, the policy automaton and the index's `min_tokens` table.
        Past it the compiler stops itself at its next check (within about a second: `_CANCEL_GRACE_S`) and the
        request gets a `budget_exceeded` 400 at the pointer where it stopped; a client that leaves cancels it. A
        stopped compile caches nothing and the request is never served unconstrained. `stats()` counts both.

        Raises:
            RequestError: the compiler's own refusals (named after their tool), or the compile budget.
            RequestTimeout: the request's own deadline came first.
        """
        from constrain.automaton import BudgetExceeded, Deadline
        from constrain.compiler import compile_index
        from constrain.errors import UnsupportedSchema

        box: dict[str, Any] = {}
        done = threading.Event()
        limit = min(time.monotonic() + self.compile_timeout, job.deadline)
        deadline = Deadline(expires_at=limit)

        def run() -> None:
            try:
                with deadline.active():
                    index = compile_index(job.policy, self.vocab, tool_format=job.tool_format, thinking=job.thinking,
                                          deadline=deadline)
                    box["index"] = index
                    cut = (getattr(index, "meta", None) or {}).get("shallower", ())
                    for where, depth in cut if cut and self._first_use(index) else ():
                        log.warning("%s: over the state budget at max_depth %d, compiled with recursion and "
                                    "free-form values nested %d level(s) (--shallower-schemas)", where,
                                    DEFAULT_MAX_DEPTH, depth)
                    fits = not self.constrained or index.completes_within(job.max_new_tokens)
                    box["result"] = (index, (0, 0) if fits else index.min_tokens_range_from_start())
            except BaseException as err:  # noqa: BLE001 - handed to the worker, which reports it to the job
                box["error"] = err
            finally:
                done.set()
                with self._lock:
                    self._compiling -= 1

        with self._lock:
            self._compiling += 1
        threading.Thread(target=run, name="constrain-compile", daemon=True).start()
        while not done.wait(0.05):
            if job.cancelled.is_set():
                deadline.cancel()
                with self._lock:
                    self._compiles_cancelled += 1
                return None
            if time.monotonic() > limit:
                # the compiler checks the deadline itself: give it a moment to stop and say where it was
                done.wait(_CANCEL_GRACE_S)
                deadline.cancel()
                break
        err = box.get("error")
        expired = deadline.is_expired() and "result" not in box
        if expired and (err is None or isinstance(err, BudgetExceeded)):
            with self._lock:
                self._compiles_timed_out += 1
            if limit == job.deadline:
                raise RequestTimeout(f"the request ran past the server's {self.timeout:g} s timeout while its "
                                     "tool policy compiled")
            calls = job.policy.max_calls > 0 and job.policy.mode != "none"
            pointer = "/response_format" if not calls and job.request.response_format is not None else "/tools"
            if err is not None and err.pointer:
                pointer = err.pointer
            elif "index" in box:
                # the automaton was built; its token-level tables ran out of time: name the part with most states
                pointer = (getattr(box["index"], "meta", None) or {}).get("largest_part") or pointer
            refusal = UnsupportedSchema(
                f"compiling this request's constraints did not finish within the server's {self.compile_timeout:g} s "
                "compile budget; simplify the schemas", pointer=pointer, code="budget_exceeded")
            _name_tool(refusal, job.policy)
            raise refusal from err
        if err is not None:
            if isinstance(err, RequestError):
                if not err.pointer and isinstance(err, BudgetExceeded):  # the index's table covers the whole policy
                    err.pointer = "/tools"
                    err.args = (f"{err.message} (at {err.pointer})",)
                _name_tool(err, job.policy)
            raise err
        return box["result"]

    def _reasoning_tokens(self, job: Job, ids: list[int]) -> int:
        """Tokens of the thinking block: up to and including its closing tag (all of them when it never closed)."""
        from lark.grammar import Terminal

        from constrain.grammar import load_format

        if not job.thinking:
            return 0
        fmt = load_format(job.tool_format)
        texts = fmt.special_texts()
        close = texts.get("THINK_CLOSE")
        close_id = self.vocab.special_tokens.get(close) if close else None
        if close_id is None:
            return 0
        # a block the model opens itself (hermes <think>, Gemma 4 <|channel>) may be skipped: then nothing is reasoning
        # (a block the prompt opened, as Qwen3.5's, has no opening token in the output)
        first = next(iter(fmt.rules["think"].scan_values(lambda v: isinstance(v, Terminal))), None) if fmt.has("think") else None
        if first is not None and first.name in texts and first.name != "THINK_CLOSE":
            if not ids or ids[0] != self.vocab.special_tokens.get(texts[first.name]):
                return 0
        return ids.index(close_id) + 1 if close_id in ids else len(ids)

    def _log(self, job: Job, outcome: str, compile_ms: float, cache_hit: bool, n: int, seconds: float) -> None:
        policy = job.policy
        choice = "named" if policy.named else policy.mode
        log.info("request mode=%s tool_choice=%s stream=%s format=%s thinking=%s compile=%s %.1fms "
                 "prompt_tokens=%d completion_tokens=%d tokens/s=%.1f outcome=%s%s",
                 "constrained" if self.constrained else "free", choice, job.request.stream, job.tool_format,
                 job.thinking, "hit" if cache_hit else "miss", compile_ms, len(job.prompt_ids), n,
                 n / seconds if seconds > 0 else 0.0, outcome, " (demo model)" if self.demo else "")


class _Hook:
    """A stopping criterion that reports each new token to the job and stops on cancel or deadline."""

    def __init__(self, job: Job, prompt_length: int):
        self.job = job
        self.prompt_length = prompt_length
        self.sent = 0
        self.timed_out = False

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.flush(input_ids[0, self.prompt_length:].tolist())
        stop = self.job.cancelled.is_set()
        if time.monotonic() > self.job.deadline:
            self.timed_out = stop = True
        return torch.full((input_ids.shape[0],), stop, dtype=torch.bool, device=input_ids.device)

    def flush(self, ids: list[int]) -> None:
        for t in ids[self.sent:]:
            self.job.sink(("token", t))
        self.sent = max(self.sent, len(ids))


def _accepts(index: Any, ids: list[int]) -> bool:
    state = index.start()
    try:
        for t in ids:
            state.advance(t)
    except Exception:  # noqa: BLE001 - a token outside the language: not a complete output
        return False
    return state.is_accepting()


def _name_tool(err: RequestError, policy: Policy) -> None:
    """Prefix a compile error under `/tools/<i>` with that tool's name (the pointer already gives its index)."""
    parts = err.pointer.split("/")
    if len(parts) > 2 and parts[1] == "tools" and parts[2].isdigit() and int(parts[2]) < len(policy.tools):
        name = policy.tools[int(parts[2])].name
        err.message = f"tool {name!r}: {err.message}"
        err.args = (f"{err.message} (at {err.pointer})",)


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return None


def _template_messages(messages: list[dict]) -> list[dict]:
    """Request messages as chat templates read them: text parts joined, null content as "", call arguments as
    objects (HF convention)."""
    out = []
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, list):
            m["content"] = "".join(p.get("text") or p.get("refusal") or "" for p in content if isinstance(p, dict))
        elif content is None:  # an assistant turn of only calls: templates read `message.content` as a string
            m["content"] = ""
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                fn = dict(c.get("function") or {})
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except ValueError:
                        pass
                c["function"] = fn
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out

