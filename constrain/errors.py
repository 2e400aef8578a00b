"""The exception family: caller faults (4xx) carry a JSON Pointer; internal faults (5xx) do not."""

from __future__ import annotations


class ConstrainError(Exception):
    """Base class of every error constrain raises on purpose."""


class RequestError(ConstrainError):
    """The caller's fault (HTTP 400). `pointer` is an RFC 6901 JSON Pointer into the request or schema."""

    def __init__(self, message: str, *, pointer: str = "", code: str = "invalid_request_error"):
        super().__init__(f"{message} (at {pointer or '/'})")
        self.message = message
        self.pointer = pointer
        self.code = code

    @property
    def param(self) -> str:
        """The pointer in OpenAI's `param` spelling: `/tools/2/function/parameters` → `tools[2].function.parameters`."""
        return pointer_to_param(self.pointer)


class InvalidSchema(RequestError):
    """Not a valid schema (or outside the strict subset when strict mode is asked for)."""

    def __init__(self, message: str, *, pointer: str = "", code: str = "invalid_json_schema"):
        super().__init__(message, pointer=pointer, code=code)


class UnsupportedSchema(RequestError):
    """A valid schema that constrain cannot enforce exactly (or not within its budgets)."""

    def __init__(self, message: str, *, pointer: str = "", code: str = "unsupported_json_schema"):
        super().__init__(message, pointer=pointer, code=code)


class TokenizerError(ConstrainError):
    """A tokenizer whose tokens cannot be mapped to bytes exactly (unknown kind, decoder or file)."""


class InternalError(ConstrainError):
    """constrain's own fault (HTTP 500)."""


class MaskViolation(InternalError):
    """A token outside the allowed mask was fed to a state."""


def pointer_to_param(pointer: str) -> str:
    """RFC 6901 JSON Pointer → OpenAI `param` (`messages[0].content`); the empty pointer gives ''."""
    out = ""
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        out += f"[{token}]" if token.isdigit() else (f".{token}" if out else token)
    return out


def join_pointer(pointer: str, *parts: str | int) -> str:
    """Append reference tokens to a JSON Pointer, escaping `~` and `/` (RFC 6901)."""
    for part in parts:
        text = part if type(part) is str else str(part)
        if "~" in text or "/" in text:
            text = text.replace("~", "~0").replace("/", "~1")
        pointer = f"{pointer}/{text}"
    return pointer
