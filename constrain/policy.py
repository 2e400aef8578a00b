"""A request's tool policy: tools, `tool_choice`, `parallel_tool_calls`, `response_format` → an immutable `Policy`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from constrain.errors import InvalidSchema, RequestError, join_pointer
from constrain.protocol import (
    REQUEST_FIELDS,
    AllowedToolsChoice,
    ChatRequest,
    NamedToolChoice,
    ResponseFormat,
    ToolSpec,
)
from constrain.schema import check_strict

__all__ = ["MAX_PARALLEL_CALLS", "Policy", "ResponseFormat", "ToolSpec"]

Mode = Literal["none", "auto", "required"]

# Most calls one turn may make when parallel calls are on. The grammar allows no call past this count, so the turn
# can always end (an unbounded call list is how vllm#50399 repeated one call until max_tokens).
# Each allowed call is one more copy of the call automaton (a DFA counts in states): compile time and memory grow
# linearly with this cap (measured: 50 BFCL tools, auto: cap 4 → 12k states, cap 8 → 24k). BFCL's parallel sets
# need at most 8 calls in 99.5 % of cases.
MAX_PARALLEL_CALLS = 8
_KEY_VERSION = 2


@dataclass(frozen=True)
class Policy:
    """What the model may emit this turn: an immutable, hashable, picklable value (the index cache's key).

    Fields:
        tools: every declared tool, in request order (all reach the prompt, even under `mode="none"`).
        mode: "none" (no call), "auto" (text or calls), "required" (at least one call), after resolving a named
            or `allowed_tools` choice.
        allowed: names that may be called, in declaration order; () under "none"; one name when `named`.
        named: the choice named one function: exactly one call of `allowed[0]`.
        parallel: more than one call may be made (`max_calls > 1`).
        min_calls, max_calls: bounds on the number of calls: none 0..0, auto 0..max, required 1..max, named 1..1;
            max is 1 with `parallel_tool_calls: false`, else `MAX_PARALLEL_CALLS`.
        response_format: the assistant text's format, None for plain text.
        max_tokens: the completion budget (None: the server's limit); per request, not part of `key()`.
        thinking: `chat_template_kwargs.enable_thinking` (None: the template's default).
        reasoning_budget: `chat_template_kwargs.thinking_budget` in tokens (None: unbounded).
        relax_non_strict: non-strict tools may be compiled with unsupported keywords relaxed, each one recorded by
            the compiler; strict tools are never relaxed.
        closed_objects: objects in tool arguments that declare `properties` but do not say `additionalProperties`
            take no undeclared properties (a deliberate narrowing: a tool's function takes only the parameters it
            declares); a bare `{"type": "object"}` stays free-form.
        shallower: a tool's (or `response_format`'s) schema over the state budget with recursion or free-form
            nesting is compiled with fewer levels of it, the most that fit (`compile_schema(shallower=True)`: a
            narrowing, never a relaxation; off by default, `constrain serve --shallower-schemas` sets it).
    """

    tools: tuple[ToolSpec, ...] = ()
    mode: Mode = "none"
    allowed: tuple[str, ...] = ()
    named: bool = False
    parallel: bool = False
    max_calls: int = 0
    min_calls: int = 0
    response_format: ResponseFormat | None = None
    max_tokens: int | None = None
    thinking: bool | None = None
    reasoning_budget: int | None = None
    relax_non_strict: bool = True
    closed_objects: bool = True
    shallower: bool = False

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if not isinstance(self.tools, tuple) or not isinstance(self.allowed, tuple):
            raise TypeError("Policy.tools and Policy.allowed must be tuples")
        if self.mode not in ("none", "auto", "required"):
            raise ValueError(f"mode must be 'none', 'auto' or 'required', got {self.mode!r}")
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        if not set(self.allowed) <= set(names):
            raise ValueError(f"allowed {self.allowed} names undeclared tools (declared: {names})")
        if not 0 <= self.min_calls <= self.max_calls or (self.mode != "none" and self.max_calls < 1):
            raise ValueError(f"bad call bounds {self.min_calls}..{self.max_calls} for mode {self.mode!r}")
        if (self.mode == "none") != (self.max_calls == 0) or (self.mode == "required") != (self.min_calls >= 1):
            raise ValueError(f"call bounds {self.min_calls}..{self.max_calls} contradict mode {self.mode!r}")
        if self.mode != "none" and not self.allowed:
            raise ValueError(f"mode {self.mode!r} needs at least one allowed tool")
        if self.named and (len(self.allowed) != 1 or self.min_calls != 1 or self.max_calls != 1):
            raise ValueError("a named policy allows exactly one tool, exactly once")
        if self.parallel != (self.max_calls > 1):
            raise ValueError(f"parallel={self.parallel} contradicts max_calls={self.max_calls}")

    @classmethod
    def from_request(cls, body: Mapping[str, Any] | None = None, /, **fields: Any) -> Policy:
        """The policy of a Chat Completions request body; keyword fields are merged over `body`.

        `Policy.from_request(body)` and `Policy.from_request(tools=..., tool_choice="required")` are equivalent
        spellings. `messages` may be omitted (it is validated when present).
        Raises:
            TypeError: a keyword that is not a request field this stage reads.
            RequestError / InvalidSchema: an invalid field, with its `pointer` and OpenAI `code`
                (see `ChatRequest.from_body` and `from_chat_request`).
        """
        unknown = sorted(set(fields) - REQUEST_FIELDS)
        if unknown:
            raise TypeError(f"Policy.from_request() got unknown request fields {unknown}")
        if body is not None and not isinstance(body, Mapping):
            return cls.from_chat_request(ChatRequest.from_body(body, require_messages=False))
        merged = {**(body or {}), **fields}
        return cls.from_chat_request(ChatRequest.from_body(merged, require_messages=False))

    @classmethod
    def from_chat_request(cls, request: ChatRequest) -> Policy:
        """The policy of a validated request.

        Defaults (OpenAI): `tool_choice` is "auto" with tools and "none" without; `parallel_tool_calls` is true.
        "none" and "auto" without tools mean no call (accepted: harmless); "required", a named function or
        `allowed_tools` without tools are rejected.
        Raises:
            InvalidSchema: a `strict` tool's parameters (code `invalid_function_parameters`, pointer into
                `/tools/<i>/function/parameters`) or a strict `response_format` schema (`invalid_json_schema`,
                into `/response_format/json_schema/schema`) outside OpenAI's strict subset.
            RequestError: code `invalid_value` at `/tool_choice` (needs tools), `/tool_choice/function/name`
                (not a declared tool) or `/tool_choice/allowed_tools/tools/<i>/function/name` (not declared).
        """
        _check_strict_schemas(request)
        tools = request.tools or ()
        names = [t.name for t in tools]
        choice = request.tool_choice if request.tool_choice is not None else ("auto" if tools else "none")
        parallel_ok = request.parallel_tool_calls is not False
        named = False
        if isinstance(choice, str) and not tools and choice != "required":
            mode, allowed = "none", ()  # "auto" over no tools is "none"
        elif not tools:
            raise RequestError(
                "Invalid value for 'tool_choice': 'tool_choice' other than 'none' or 'auto' is only allowed when "
                "'tools' are specified.",
                pointer="/tool_choice", code="invalid_value",
            )
        elif isinstance(choice, NamedToolChoice):
            if choice.name not in names:
                raise RequestError(
                    f"Invalid value for 'tool_choice': function {choice.name!r} not found in 'tools'.",
                    pointer="/tool_choice/function/name", code="invalid_value",
                )
            mode, allowed, named = "required", (choice.name,), True
        elif isinstance(choice, AllowedToolsChoice):
            for i, name in enumerate(choice.names):
                if name not in names:
                    raise RequestError(
                        f"Invalid value for 'tool_choice.allowed_tools.tools': tool {name!r} not found in 'tools'.",
                        pointer=f"/tool_choice/allowed_tools/tools/{i}/function/name", code="invalid_value",
                    )
            mode, allowed = choice.mode, tuple(n for n in names if n in choice.names)
        else:
            mode, allowed = choice, (() if choice == "none" else tuple(names))
        if mode == "none":
            min_calls = max_calls = 0
        else:
            min_calls = 1 if mode == "required" else 0
            max_calls = 1 if named or not parallel_ok else MAX_PARALLEL_CALLS
        return cls(
            tools=tuple(tools),
            mode=mode,  # type: ignore[arg-type]
            allowed=allowed,
            named=named,
            parallel=max_calls > 1,
            max_calls=max_calls,
            min_calls=min_calls,
            response_format=None if request.response_format is None or request.response_format.type == "text" else request.response_format,
            max_tokens=request.max_tokens,
            thinking=request.enable_thinking,
            reasoning_budget=request.thinking_budget,
        )

    def key(self) -> str:
        """A stable sha256 hex digest of everything that shapes the grammar (cache key of the compiled index).

        It covers tool names, parameters (key order included), strictness, mode, allowed names, call bounds,
        response_format, thinking, reasoning_budget and relax_non_strict. It leaves out `max_tokens` (counted per
        request) and tool descriptions (prompt only).
        """
        fmt = self.response_format
        payload = {
            "v": _KEY_VERSION,
            "tools": [[t.name, t.parameters, t.strict] for t in self.tools],
            "mode": self.mode,
            "allowed": list(self.allowed),
            "named": self.named,
            "calls": [self.min_calls, self.max_calls],
            "format": None if fmt is None else [fmt.type, fmt.name, fmt.schema, fmt.strict],
            "thinking": self.thinking,
            "reasoning_budget": self.reasoning_budget,
            "relax_non_strict": self.relax_non_strict,
            "closed_objects": self.closed_objects,
        }
        if self.shallower:  # (only when set: every other policy keeps the key it had)
            payload["shallower"] = True
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), sort_keys=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def tool(self, name: str) -> ToolSpec:
        """The declared tool called `name` (KeyError if none)."""
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)


def _check_strict_schemas(request: ChatRequest) -> None:
    """Strict schemas must be in OpenAI's strict subset: fail closed, never decode them non-strictly."""
    for i, tool in enumerate(request.tools or ()):
        if tool.strict:
            check_strict(tool.parameters, join_pointer("/tools", i, "function", "parameters"))
    fmt = request.response_format
    if fmt is not None and fmt.strict and fmt.schema is not None:
        try:
            check_strict(fmt.schema, "/response_format/json_schema/schema")
        except InvalidSchema as err:  # check_strict speaks for tools; response_format errors carry this code
            raise InvalidSchema(
                f"Invalid schema for response_format '{fmt.name}': {err.message}", pointer=err.pointer, code="invalid_json_schema"
            ) from err
