"""OpenAI Chat Completions request body (parsed JSON) → typed, immutable `ChatRequest`, or a `RequestError`.

Every error carries the RFC 6901 pointer of the offending field and OpenAI's error `code`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from constrain.errors import InvalidSchema, RequestError, join_pointer, pointer_to_param

ToolChoiceMode = Literal["none", "auto", "required"]

# OpenAI: "a-z, A-Z, 0-9, or contain underscores and dashes, with a maximum length of 64" (tools and json_schema).
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]+")
MAX_NAME_LENGTH = 64
MAX_TOOLS = 128  # OpenAI's documented limit on `tools`.
MAX_STOP = 4  # OpenAI: "Up to 4 sequences".
# Nesting bound of a request body (arrays and objects): keeps every recursive walk below (schema compiler, templates)
# far from Python's recursion limit; a 60-level nested object schema inside `tools` still fits.
MAX_JSON_DEPTH = 128
# `chat_template_kwargs` are template variables. These names are `apply_chat_template`'s own parameters (a request
# that passed `chat_template` would have its own Jinja template rendered) or variables the server sets itself.
RESERVED_TEMPLATE_KWARGS = frozenset({
    "chat_template", "conversation", "messages", "tools", "documents", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs",
})
# Omitted `parameters` = an empty parameter list (OpenAI). Strict tools get the strict-subset spelling of it.
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
EMPTY_STRICT_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
# OpenAI rejects these at the root of a function's parameters ("must have type 'object' and not have ...").
ROOT_FORBIDDEN = ("oneOf", "anyOf", "allOf", "enum", "const", "not")

_ROLES = ("system", "developer", "user", "assistant", "tool")
_PART_TYPES = {
    "system": ("text",),
    "developer": ("text",),
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
}
# The top-level fields this stage reads; the rest are listed in `ChatRequest.ignored_fields`.
REQUEST_FIELDS = frozenset(
    {
        "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "response_format", "max_tokens",
        "max_completion_tokens", "chat_template_kwargs", "stream", "stream_options", "n", "temperature", "top_p",
        "seed", "stop", "functions", "function_call",
    }
)


# ---------------------------------------------------------------------------
# immutable JSON values
# ---------------------------------------------------------------------------


class _Canonical:
    """Equality and hash by exact JSON text (key order, 1 vs 1.0 vs true): they matter to the grammar built from it."""

    __slots__ = ()
    _base: type = object

    def canonical(self) -> str:
        """The exact JSON text (keys in order, no spaces); cached."""
        try:
            return self._text  # type: ignore[attr-defined]
        except AttributeError:
            object.__setattr__(self, "_text", _dump(self))
            return self._text  # type: ignore[attr-defined]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, type(self)):
            return self.canonical() == other.canonical()
        return self._base.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(self.canonical())


class FrozenDict(_Canonical, dict):
    """A JSON object that cannot change; equal and hashed by its exact JSON text."""

    __slots__ = ("_text",)
    _base = dict

    def _blocked(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a FrozenDict is immutable; copy it with dict(...) or json.loads(json.dumps(...)) first")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _blocked  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (dict(self),))


class FrozenList(_Canonical, list):
    """A JSON array that cannot change (see `FrozenDict`)."""

    __slots__ = ("_text",)
    _base = list

    def _blocked(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("a FrozenList is immutable; copy it with list(...) first")

    __setitem__ = __delitem__ = __iadd__ = __imul__ = append = extend = insert = pop = remove = clear = sort = reverse = _blocked  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def freeze_json(value: Any) -> Any:
    """A deep, immutable copy of a JSON value: objects → `FrozenDict`, arrays → `FrozenList`."""
    if isinstance(value, dict):
        return FrozenDict((k, freeze_json(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze_json(v) for v in value)
    return value


# ---------------------------------------------------------------------------
# the typed request
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """One declared function tool. `parameters` is an immutable, well-formed JSON Schema with an object root
    (omitted → `EMPTY_PARAMETERS`, or `EMPTY_STRICT_PARAMETERS` when strict); `strict` is False when omitted or null (Chat Completions
    default); whether a strict schema is in OpenAI's strict subset is checked by `Policy`."""

    name: str
    parameters: FrozenDict
    strict: bool = False
    description: str | None = None


@dataclass(frozen=True)
class NamedToolChoice:
    """`tool_choice: {"type":"function","function":{"name": ...}}`: exactly one call of `name`."""

    name: str


@dataclass(frozen=True)
class AllowedToolsChoice:
    """`tool_choice: {"type":"allowed_tools", ...}`: `mode` over the subset `names` (as sent: order, repeats)."""

    mode: Literal["auto", "required"]
    names: tuple[str, ...]


ToolChoice = ToolChoiceMode | NamedToolChoice | AllowedToolsChoice


@dataclass(frozen=True)
class ResponseFormat:
    """`response_format`: `type` "text", "json_object" or "json_schema" (then `name` and `schema` are set)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: FrozenDict | None = None
    strict: bool = False
    description: str | None = None


@dataclass(frozen=True)
class ToolCall:
    """A function call in an assistant message of the history; `arguments` is the JSON-encoded string as sent."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ContentPart:
    """One part of an array `content`: `type`, its `text` for text/refusal parts, and the whole part as sent."""

    type: str
    text: str | None
    data: FrozenDict


@dataclass(frozen=True)
class Message:
    """One chat message. `content` is a string, a tuple of parts, or None (assistant messages with tool calls)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | tuple[ContentPart, ...] | None
    name: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    reasoning_content: str | None = None


@dataclass(frozen=True)
class ChatRequest:
    """A validated Chat Completions request. Optional fields are None when absent or null.

    `tools` is None when absent; `tool_choice` is the value as sent (None when absent; defaults are resolved by
    `Policy`). `max_tokens` merges `max_tokens` and `max_completion_tokens`. `ignored_fields` lists the top-level
    fields this stage does not read (OpenAI-compatible servers accept and ignore them).
    """

    messages: tuple[Message, ...] = ()
    model: str | None = None
    tools: tuple[ToolSpec, ...] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    max_tokens: int | None = None
    stream: bool = False
    include_usage: bool = False
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    chat_template_kwargs: FrozenDict | None = None
    enable_thinking: bool | None = None
    thinking_budget: int | None = None
    ignored_fields: tuple[str, ...] = ()

    @classmethod
    def from_body(cls, body: Any, *, require_messages: bool = True) -> ChatRequest:
        """Validate a parsed JSON request body.

        Args:
            body: the parsed JSON body (a dict).
            require_messages: False lets a body without `messages` through (for `Policy.from_request`);
                `messages` is still validated when present.
        Returns:
            The typed, immutable request.
        Raises:
            RequestError (or `InvalidSchema` for tool and response_format schemas) with the field's `pointer`
            and OpenAI's `code`: `invalid_type`, `missing_required_parameter`, `invalid_value`, `empty_array`,
            `array_above_max_length`, `string_above_max_length`, `integer_below_min_value`,
            `decimal_below_min_value`, `decimal_above_max_value`, `unsupported_value`,
            `invalid_function_parameters`, `invalid_json_schema` (ill-formed schemas; OpenAI's strict subset is
            checked by `Policy`).
        """
        if not isinstance(body, dict):
            raise _invalid_type("", "an object", body)
        for key in body:
            if not isinstance(key, str):
                raise RequestError(f"field names must be strings, got {key!r}", pointer="", code="invalid_type")
        check_json_value(body)
        for legacy in ("functions", "function_call"):
            if body.get(legacy) is not None:
                raise RequestError(
                    f"'{legacy}' (deprecated function calling) is not supported; use 'tools' and 'tool_choice'",
                    pointer=join_pointer("", legacy), code="unsupported_value",
                )
        fields: dict[str, Any] = {}
        messages = body.get("messages")
        if messages is None:
            if require_messages:
                raise _missing("/messages")
        else:
            fields["messages"] = _messages(messages)
        fields["model"] = _opt(body, "model", "", _string)
        tools = body.get("tools")
        fields["tools"] = None if tools is None else _tools(tools)
        fields["tool_choice"] = _opt(body, "tool_choice", "", _tool_choice)
        fields["parallel_tool_calls"] = _opt(body, "parallel_tool_calls", "", _boolean)
        fields["response_format"] = _opt(body, "response_format", "", _response_format)
        fields["max_tokens"] = _max_tokens(body)
        stream = _opt(body, "stream", "", _boolean) or False
        fields["stream"] = stream
        fields["include_usage"] = _stream_options(body, stream)
        n = _opt(body, "n", "", _integer)
        if n is not None and n < 1:
            raise _below_min("/n", 1, n)
        if n is not None and n != 1:
            raise RequestError(f"only n=1 is supported, got {n}", pointer="/n", code="unsupported_value")
        fields["temperature"] = _opt(body, "temperature", "", lambda v, p: _number(v, p, 0.0, 2.0))
        fields["top_p"] = _opt(body, "top_p", "", lambda v, p: _number(v, p, 0.0, 1.0))
        fields["seed"] = _opt(body, "seed", "", _integer)
        fields["stop"] = _opt(body, "stop", "", _stop) or ()
        kwargs = _opt(body, "chat_template_kwargs", "", _object)
        if kwargs is not None:
            for key in kwargs:
                if key in RESERVED_TEMPLATE_KWARGS:
                    raise _invalid_value(join_pointer("/chat_template_kwargs", key),
                                         f"{key!r} is set by the server and cannot be passed as a template variable.")
            fields["chat_template_kwargs"] = freeze_json(kwargs)
            fields["enable_thinking"] = _opt(kwargs, "enable_thinking", "/chat_template_kwargs", _boolean)
            budget = _opt(kwargs, "thinking_budget", "/chat_template_kwargs", _integer)
            if budget is not None and budget < 0:
                raise _below_min("/chat_template_kwargs/thinking_budget", 0, budget)
            fields["thinking_budget"] = budget
        fields["ignored_fields"] = tuple(k for k in body if k not in REQUEST_FIELDS)
        return cls(**fields)


def check_json_value(value: Any) -> None:
    """Check a parsed request body as a whole: nesting at most `MAX_JSON_DEPTH`, every string and key valid Unicode
    (JSON's `\\ud800` escapes decode to lone surrogates, which no UTF-8 tokenizer can take).

    Raises:
        RequestError: `invalid_value` at the pointer of the first offending value.
    """
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, pointer, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item, pointer)
        elif isinstance(item, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise RequestError(f"the request nests arrays and objects deeper than {MAX_JSON_DEPTH} levels",
                                   pointer=pointer, code="invalid_value")
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    _check_text(key, pointer)  # the key's own pointer would carry the surrogate into the error
                stack.append((child, join_pointer(pointer, key), depth + 1))


def _check_text(text: str, pointer: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(f"the string contains an unpaired surrogate (U+{ord(text[err.start]):04X}) at "
                           f"offset {err.start}; strings must be valid Unicode", pointer=pointer,
                           code="invalid_value") from err


# ---------------------------------------------------------------------------
# error builders and scalar checks
# ---------------------------------------------------------------------------


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _quote(pointer: str) -> str:
    return pointer_to_param(pointer) or "body"


def _invalid_type(pointer: str, expected: str, value: Any) -> RequestError:
    return RequestError(
        f"Invalid type for '{_quote(pointer)}': expected {expected}, but got {_describe(value)} instead.",
        pointer=pointer, code="invalid_type",
    )


def _missing(pointer: str) -> RequestError:
    return RequestError(f"Missing required parameter: '{_quote(pointer)}'.", pointer=pointer, code="missing_required_parameter")


def _invalid_value(pointer: str, message: str) -> RequestError:
    return RequestError(f"Invalid value for '{_quote(pointer)}': {message}", pointer=pointer, code="invalid_value")


def _below_min(pointer: str, minimum: int, value: int) -> RequestError:
    return RequestError(
        f"Invalid '{_quote(pointer)}': integer below minimum value. Expected a value >= {minimum}, but got {value} instead.",
        pointer=pointer, code="integer_below_min_value",
    )


def _string(value: Any, pointer: str) -> str:
    if not isinstance(value, str):
        raise _invalid_type(pointer, "a string", value)
    return value


def _boolean(value: Any, pointer: str) -> bool:
    if not isinstance(value, bool):
        raise _invalid_type(pointer, "a boolean", value)
    return value


def _integer(value: Any, pointer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(pointer, "an integer", value)
    return value


def _object(value: Any, pointer: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid_type(pointer, "an object", value)
    return value


def _array(value: Any, pointer: str, *, non_empty: bool = False) -> list[Any]:
    if not isinstance(value, list):
        raise _invalid_type(pointer, "an array", value)
    if non_empty and not value:
        raise RequestError(
            f"Invalid '{_quote(pointer)}': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            pointer=pointer, code="empty_array",
        )
    return value


def _number(value: Any, pointer: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _invalid_type(pointer, "a number", value)
    if value < low:
        raise RequestError(
            f"Invalid '{_quote(pointer)}': decimal below minimum value. Expected a value >= {low}, but got {value} instead.",
            pointer=pointer, code="decimal_below_min_value",
        )
    if value > high:
        raise RequestError(
            f"Invalid '{_quote(pointer)}': decimal above maximum value. Expected a value <= {high}, but got {value} instead.",
            pointer=pointer, code="decimal_above_max_value",
        )
    return float(value)


def _opt(obj: Mapping[str, Any], key: str, pointer: str, check: Any) -> Any:
    """`check(obj[key], pointer/key)`, or None when the key is absent or null."""
    value = obj.get(key)
    return None if value is None else check(value, join_pointer(pointer, key))


def _req(obj: Mapping[str, Any], key: str, pointer: str, check: Any) -> Any:
    """`check(obj[key], pointer/key)`; a missing or null key is `missing_required_parameter`."""
    value = obj.get(key)
    if value is None:
        raise _missing(join_pointer(pointer, key))
    return check(value, join_pointer(pointer, key))


def _name(value: Any, pointer: str) -> str:
    name = _string(value, pointer)
    if len(name) > MAX_NAME_LENGTH:
        raise RequestError(
            f"Invalid '{_quote(pointer)}': string too long. Expected a string with maximum length {MAX_NAME_LENGTH}, "
            f"but got a string with length {len(name)} instead.",
            pointer=pointer, code="string_above_max_length",
        )
    if not NAME_PATTERN.fullmatch(name):
        raise _invalid_value(pointer, f"string {name!r} does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.")
    return name


def _type_tag(obj: dict[str, Any], pointer: str, allowed: tuple[str, ...], unsupported: tuple[str, ...] = ()) -> str:
    kind = _req(obj, "type", pointer, _string)
    if kind in unsupported:
        raise RequestError(f"'{kind}' is not supported by this server", pointer=join_pointer(pointer, "type"), code="unsupported_value")
    if kind not in allowed:
        raise _invalid_value(join_pointer(pointer, "type"), f"expected one of {', '.join(map(repr, allowed))}, got {kind!r}.")
    return kind


# ---------------------------------------------------------------------------
# tools, tool_choice, response_format
# ---------------------------------------------------------------------------


def _tools(value: Any) -> tuple[ToolSpec, ...]:
    items = _array(value, "/tools", non_empty=True)
    if len(items) > MAX_TOOLS:
        raise RequestError(
            f"Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, but got an array with length {len(items)} instead.",
            pointer="/tools", code="array_above_max_length",
        )
    out: list[ToolSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        pointer = join_pointer("/tools", i)
        tool = _object(item, pointer)
        # Custom (free-text/grammar) tools exist in OpenAI's API, but constrain enforces function tools only.
        _type_tag(tool, pointer, ("function",), unsupported=("custom",))
        fn = _req(tool, "function", pointer, _object)
        fp = join_pointer(pointer, "function")
        name = _req(fn, "name", fp, _name)
        if name in seen:
            raise _invalid_value(join_pointer(fp, "name"), f"duplicate function name {name!r}; tool names must be unique.")
        seen.add(name)
        description = _opt(fn, "description", fp, _string)
        strict = _opt(fn, "strict", fp, _boolean) or False
        params = fn.get("parameters")
        pp = join_pointer(fp, "parameters")
        if params is None:
            params = EMPTY_STRICT_PARAMETERS if strict else EMPTY_PARAMETERS
        else:
            _object(params, pp)
            _check_function_root(params, pp, name)
            _check_schema_shape(params, pp, "invalid_function_parameters")
        out.append(ToolSpec(name=name, parameters=freeze_json(params), strict=strict, description=description))
    return tuple(out)


def _check_function_root(schema: dict[str, Any], pointer: str, name: str) -> None:
    if schema.get("type") != "object":
        raise InvalidSchema(
            f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: {json.dumps(schema.get('type'))}'.",
            pointer=join_pointer(pointer, "type"), code="invalid_function_parameters",
        )
    for key in ROOT_FORBIDDEN:
        if key in schema:
            raise InvalidSchema(
                f"Invalid schema for function '{name}': schema must have type 'object' and not have '{key}' at the top level.",
                pointer=join_pointer(pointer, key), code="invalid_function_parameters",
            )


def _tool_choice(value: Any, pointer: str) -> ToolChoice:
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise _invalid_value(pointer, f"expected 'none', 'auto', 'required' or an object, got {value!r}.")
        return value  # type: ignore[return-value]
    choice = _object(value, pointer)
    kind = _type_tag(choice, pointer, ("function", "allowed_tools"), unsupported=("custom",))
    if kind == "function":
        fn = _req(choice, "function", pointer, _object)
        return NamedToolChoice(_req(fn, "name", join_pointer(pointer, "function"), _string))
    ap = join_pointer(pointer, "allowed_tools")
    allowed = _req(choice, "allowed_tools", pointer, _object)
    mode = _req(allowed, "mode", ap, _string)
    if mode not in ("auto", "required"):
        raise _invalid_value(join_pointer(ap, "mode"), f"must be 'auto' or 'required', got {mode!r}.")
    tp = join_pointer(ap, "tools")
    names: list[str] = []
    for i, item in enumerate(_req(allowed, "tools", ap, lambda v, p: _array(v, p, non_empty=True))):
        ip = join_pointer(tp, i)
        _type_tag(_object(item, ip), ip, ("function",), unsupported=("custom",))
        fn = _req(item, "function", ip, _object)
        names.append(_req(fn, "name", join_pointer(ip, "function"), _string))
    return AllowedToolsChoice(mode=mode, names=tuple(names))  # type: ignore[arg-type]


def _response_format(value: Any, pointer: str) -> ResponseFormat:
    fmt = _object(value, pointer)
    kind = _type_tag(fmt, pointer, ("text", "json_object", "json_schema"))
    if kind != "json_schema":
        return ResponseFormat(type=kind)  # type: ignore[arg-type]
    jp = join_pointer(pointer, "json_schema")
    spec = _req(fmt, "json_schema", pointer, _object)
    name = _req(spec, "name", jp, _name)
    description = _opt(spec, "description", jp, _string)
    strict = _opt(spec, "strict", jp, _boolean) or False
    # The SDK types mark `schema` optional; without it nothing is constrained, so we fail closed and require it.
    schema = _req(spec, "schema", jp, _object)
    sp = join_pointer(jp, "schema")
    _check_schema_shape(schema, sp, "invalid_json_schema")
    return ResponseFormat(type="json_schema", name=name, schema=freeze_json(schema), strict=strict, description=description)


# ---------------------------------------------------------------------------
# JSON Schema well-formedness (keyword value types; the semantics are checked when compiling)
# ---------------------------------------------------------------------------

_TYPE_NAMES = ("null", "boolean", "object", "array", "string", "number", "integer")
_SUBSCHEMA = ("additionalProperties", "additionalItems", "contains", "propertyNames", "not", "if", "then", "else",
              "unevaluatedItems", "unevaluatedProperties", "contentSchema")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains")
_NUMBERS = ("minimum", "maximum", "multipleOf")
_STRINGS = ("format", "pattern", "$ref")


def _check_schema_shape(schema: Any, pointer: str, code: str) -> None:
    """Raise `InvalidSchema` where a keyword's value has the wrong JSON type for drafts 4 to 2020-12."""

    def bad(where: str, expected: str, value: Any) -> InvalidSchema:
        return InvalidSchema(f"invalid JSON Schema: expected {expected}, got {_describe(value)}", pointer=where, code=code)

    def is_count(v: Any) -> bool:
        return not isinstance(v, bool) and (isinstance(v, int) or (isinstance(v, float) and v.is_integer())) and v >= 0

    def is_number(v: Any) -> bool:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)

    stack = [(schema, pointer)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            raise bad(where, "a schema (an object or a boolean)", node)
        for key, value in node.items():
            at = join_pointer(where, key)
            if key in _SUBSCHEMA:
                stack.append((value, at))
            elif key in _SCHEMA_MAPS:
                if not isinstance(value, dict):
                    raise bad(at, "an object of schemas", value)
                stack.extend((sub, join_pointer(at, k)) for k, sub in value.items())
            elif key in _SCHEMA_LISTS:
                if not isinstance(value, list) or not value:
                    raise bad(at, "a non-empty array of schemas", value)
                stack.extend((sub, join_pointer(at, i)) for i, sub in enumerate(value))
            elif key == "items":
                if isinstance(value, list):  # drafts 4 to 2019-09 tuple form
                    stack.extend((sub, join_pointer(at, i)) for i, sub in enumerate(value))
                else:
                    stack.append((value, at))
            elif key == "dependencies":
                if not isinstance(value, dict):
                    raise bad(at, "an object", value)
                for k, sub in value.items():
                    if isinstance(sub, list):
                        if not all(isinstance(s, str) for s in sub):
                            raise bad(join_pointer(at, k), "an array of strings", sub)
                    else:
                        stack.append((sub, join_pointer(at, k)))
            elif key == "type":
                names = value if isinstance(value, list) else [value]
                if (isinstance(value, list) and not value) or not all(isinstance(t, str) and t in _TYPE_NAMES for t in names):
                    raise InvalidSchema(f"invalid JSON Schema: 'type' must be one of {list(_TYPE_NAMES)} or a non-empty array of them, got {value!r}", pointer=at, code=code)
            elif key == "required":
                if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                    raise bad(at, "an array of strings", value)
            elif key == "enum":
                if not isinstance(value, list):
                    raise bad(at, "an array", value)
            elif key in _STRINGS:
                if not isinstance(value, str):
                    raise bad(at, "a string", value)
            elif key in _COUNTS:
                if not is_count(value):
                    raise bad(at, "a non-negative integer", value)
            elif key in _NUMBERS:
                if not is_number(value) or (key == "multipleOf" and value <= 0):
                    raise bad(at, "a number" + (" > 0" if key == "multipleOf" else ""), value)
            elif key in ("exclusiveMinimum", "exclusiveMaximum"):
                if not (isinstance(value, bool) or is_number(value)):  # boolean in draft 4, number later
                    raise bad(at, "a number or a boolean", value)
            elif key == "uniqueItems":
                if not isinstance(value, bool):
                    raise bad(at, "a boolean", value)


# ---------------------------------------------------------------------------
# scalar request fields
# ---------------------------------------------------------------------------


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    values = {}
    for key in ("max_completion_tokens", "max_tokens"):
        value = _opt(body, key, "", _integer)
        if value is not None:
            if value < 1:
                raise _below_min(join_pointer("", key), 1, value)
            values[key] = value
    # OpenAI deprecates max_tokens for max_completion_tokens; when both are sent they must agree (we do not guess).
    if len(values) == 2 and values["max_tokens"] != values["max_completion_tokens"]:
        raise _invalid_value(
            "/max_tokens",
            f"'max_tokens' ({values['max_tokens']}) and 'max_completion_tokens' ({values['max_completion_tokens']}) disagree; send only 'max_completion_tokens'.",
        )
    return values.get("max_completion_tokens", values.get("max_tokens"))


def _stream_options(body: Mapping[str, Any], stream: bool) -> bool:
    options = _opt(body, "stream_options", "", _object)
    if options is None:
        return False
    if not stream:
        raise _invalid_value("/stream_options", "'stream_options' is only allowed when 'stream' is true.")
    _opt(options, "include_obfuscation", "/stream_options", _boolean)
    return _opt(options, "include_usage", "/stream_options", _boolean) or False


def _stop(value: Any, pointer: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    items = _array(value, pointer)
    if len(items) > MAX_STOP:
        raise RequestError(
            f"Invalid '{_quote(pointer)}': array too long. Expected an array with maximum length {MAX_STOP}, but got an array with length {len(items)} instead.",
            pointer=pointer, code="array_above_max_length",
        )
    return tuple(_string(s, join_pointer(pointer, i)) for i, s in enumerate(items))


# ---------------------------------------------------------------------------
# messages
# ---------------------------------------------------------------------------


def _messages(value: Any) -> tuple[Message, ...]:
    items = _array(value, "/messages", non_empty=True)
    out = tuple(_message(item, join_pointer("/messages", i)) for i, item in enumerate(items))
    _check_tool_responses(out)
    return out


def _message(value: Any, pointer: str) -> Message:
    msg = _object(value, pointer)
    role = _req(msg, "role", pointer, _string)
    if role == "function":
        raise RequestError("role 'function' (deprecated function calling) is not supported; use role 'tool'",
                           pointer=join_pointer(pointer, "role"), code="unsupported_value")
    if role not in _ROLES:
        raise _invalid_value(join_pointer(pointer, "role"), f"expected one of {', '.join(map(repr, _ROLES))}, got {role!r}.")
    name = _opt(msg, "name", pointer, _string)
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id = None
    reasoning = None
    if role == "assistant":
        if msg.get("function_call") is not None:
            raise RequestError("'function_call' (deprecated function calling) is not supported; use 'tool_calls'",
                               pointer=join_pointer(pointer, "function_call"), code="unsupported_value")
        tool_calls = _opt(msg, "tool_calls", pointer, _tool_calls) or ()
        _opt(msg, "refusal", pointer, _string)
        reasoning = _opt(msg, "reasoning_content", pointer, _string)
        if msg.get("content") is None and not tool_calls:
            raise _missing(join_pointer(pointer, "content"))  # OpenAI: "Required unless tool_calls is specified"
    elif role == "tool":
        tool_call_id = _req(msg, "tool_call_id", pointer, _string)
    content = None
    if msg.get("content") is not None or role != "assistant":
        content = _req(msg, "content", pointer, lambda v, p: _content(v, p, role))
    return Message(role=role, content=content, name=name, tool_calls=tool_calls, tool_call_id=tool_call_id,  # type: ignore[arg-type]
                   reasoning_content=reasoning)


def _content(value: Any, pointer: str, role: str) -> str | tuple[ContentPart, ...]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise _invalid_type(pointer, "a string or an array of content parts", value)
    parts = []
    for i, item in enumerate(value):
        ip = join_pointer(pointer, i)
        part = _object(item, ip)
        kind = _type_tag(part, ip, _PART_TYPES[role])
        text = None
        if kind in ("text", "refusal"):
            text = _req(part, kind, ip, _string)
        else:  # image_url / input_audio / file carry an object of the same name
            _req(part, kind, ip, _object)
        parts.append(ContentPart(type=kind, text=text, data=freeze_json(part)))
    return tuple(parts)


def _tool_calls(value: Any, pointer: str) -> tuple[ToolCall, ...]:
    out = []
    ids: set[str] = set()
    for i, item in enumerate(_array(value, pointer, non_empty=True)):
        ip = join_pointer(pointer, i)
        call = _object(item, ip)
        call_id = _req(call, "id", ip, _string)
        if call_id in ids:
            raise _invalid_value(join_pointer(ip, "id"), f"duplicate tool call id {call_id!r}.")
        ids.add(call_id)
        _type_tag(call, ip, ("function",), unsupported=("custom",))
        fn = _req(call, "function", ip, _object)
        fp = join_pointer(ip, "function")
        out.append(ToolCall(id=call_id, name=_req(fn, "name", fp, _string), arguments=_req(fn, "arguments", fp, _string)))
    return tuple(out)


def _check_tool_responses(messages: tuple[Message, ...]) -> None:
    """OpenAI's pairing rule: each assistant `tool_calls` id is answered by one `tool` message right after it."""
    pending: dict[str, str] = {}  # unanswered id → pointer of that id
    for i, msg in enumerate(messages):
        if msg.role == "tool":
            if msg.tool_call_id not in pending:
                raise _invalid_value(
                    f"/messages/{i}/tool_call_id",
                    f"{msg.tool_call_id!r} does not answer a tool call of the preceding assistant message: messages with "
                    "role 'tool' must be a response to a preceding message with 'tool_calls', once per id.",
                )
            del pending[msg.tool_call_id]
            continue
        if pending:
            break
        pending = {c.id: f"/messages/{i}/tool_calls/{j}/id" for j, c in enumerate(msg.tool_calls)}
    if pending:
        call_id, where = next(iter(pending.items()))
        raise _invalid_value(
            where,
            f"an assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'; {call_id!r} has no response.",
        )
