"""How JSON values are written: JSON itself, Gemma 4 call arguments, Qwen3 XML parameters (expressions per piece)."""

from __future__ import annotations

import json
from json.encoder import encode_basestring as _encode_string  # json.dumps' own, for ensure_ascii=False
from typing import Any, Literal

from constrain import automaton as fa

Whitespace = Literal["flexible", "compact"]

# JSON string writing rule: exactly what json.dumps(ensure_ascii=False) writes.
_SHORT_ESCAPES = {0x22: b'\\"', 0x5C: b"\\\\", 0x08: b"\\b", 0x0C: b"\\f", 0x0A: b"\\n", 0x0D: b"\\r", 0x09: b"\\t"}
_ESCAPES = {b: fa.literal(_SHORT_ESCAPES.get(b, b"\\u%04x" % b)) for b in [*range(0x20), 0x22, 0x5C]}
ANY_TEXT = fa.repeat(fa.ANY_CHAR, 0)
ANY_TEXT_ANY_LENGTH = ANY_TEXT  # the marker for "no string keyword": its automaton is compiled once per syntax


def encode_string(decoded: fa.Expr) -> fa.Expr:
    """The JSON string literals (quotes included) whose decoded value is in `decoded` (UTF-8)."""
    return fa.concat(fa.literal(b'"'), fa.substitute(decoded, _ESCAPES), fa.literal(b'"'))


def dump_json(value: Any, whitespace: Whitespace = "compact") -> str:
    """A value in the canonical writing style (keys in the given order)."""
    if type(value) is str:  # (what json.dumps gives a string, without building an encoder: keys, enum texts)
        return _encode_string(value)
    separators = (",", ":") if whitespace == "compact" else (", ", ": ")
    return json.dumps(value, ensure_ascii=False, separators=separators, allow_nan=False)


class JsonSyntax:
    """How values are written: JSON (the default); other wire formats subclass this."""

    name = "json"
    sort_keys = False  # members in schema order (False) or sorted case-insensitively (True)
    containers_as_json = False  # arrays and objects below this level switch to JSON syntax

    def __init__(self, whitespace: Whitespace = "compact"):
        sep = fa.optional(fa.literal(b" ")) if whitespace == "flexible" else fa.EMPTY
        self.whitespace = whitespace
        self.gap = sep  # what may follow a separator's comma
        self.member_sep = self.item_sep = fa.concat(fa.literal(b","), sep)
        self.colon = fa.concat(fa.literal(b":"), sep)
        self.obj_open, self.obj_close = fa.literal(b"{"), fa.literal(b"}")
        self.arr_open, self.arr_close = fa.literal(b"["), fa.literal(b"]")
        self.null = fa.literal(b"null")
        self.true, self.false = fa.literal(b"true"), fa.literal(b"false")

    def child(self) -> "JsonSyntax":
        """The syntax of values nested inside this level's objects and arrays."""
        return self

    def string(self, decoded: fa.Expr) -> fa.Expr:
        return encode_string(decoded)

    def key(self, name: str) -> fa.Expr:
        return fa.literal(dump_json(name).encode())

    def extra_key(self, decoded: fa.Expr) -> fa.Expr:
        return encode_string(decoded)

    def member(self, key: fa.Expr, value: fa.Expr) -> fa.Expr:
        return fa.concat(key, self.colon, value)

    def text(self, value: Any) -> bytes | None:
        """The one text of a scalar in this syntax, or None when it has no fixed text (numbers)."""
        if value is None:
            return b"null"
        if isinstance(value, bool):
            return b"true" if value else b"false"
        if isinstance(value, str):
            return dump_json(value).encode()
        return None


class Gemma4Syntax(JsonSyntax):
    """Gemma 4 call arguments: bare keys in case-insensitive order, strings between the `<|"|>` token, `None`."""

    name = "gemma4"
    sort_keys = True

    def __init__(self, quote_symbol: int):
        super().__init__("compact")
        self.quote = fa.special(quote_symbol)
        self.null = fa.literal(b"None")

    def string(self, decoded: fa.Expr) -> fa.Expr:
        # raw text, no escaping; the string ends only at the quote token, whose text may not appear inside
        return fa.concat(self.quote, fa.intersect(decoded, fa.text_without(b'<|"|>')), self.quote)

    def key(self, name: str) -> fa.Expr:
        return fa.literal(name.encode())

    def extra_key(self, decoded: fa.Expr) -> fa.Expr:
        return fa.intersect(decoded, fa.repeat(fa.chars([(0x21, 0x2B), (0x2D, 0x39), (0x3B, 0x5A), (0x5E, 0x7A), (0x7E, 0x10FFFF)]), 1))

    def text(self, value: Any) -> bytes | None:
        if value is None:
            return b"None"
        if isinstance(value, str):
            return None  # written with the quote symbol, see `string`
        return super().text(value)


class XmlArgumentsSyntax(JsonSyntax):
    """Qwen3-Coder / Qwen3.5 arguments: one `<parameter=KEY>` block per argument, no braces or commas."""

    name = "qwen3_xml"

    def __init__(self):
        super().__init__("compact")
        self.obj_open = self.obj_close = fa.EMPTY
        self.member_sep = fa.EMPTY

    def child(self) -> JsonSyntax:
        return XmlValueSyntax()

    def key(self, name: str) -> fa.Expr:
        return fa.literal(name.encode())

    def extra_key(self, decoded: fa.Expr) -> fa.Expr:
        return fa.intersect(decoded, fa.repeat(fa.chars([(0x21, 0x3D), (0x3F, 0x10FFFF)]), 1))

    def member(self, key: fa.Expr, value: fa.Expr) -> fa.Expr:
        return fa.concat(fa.literal(b"<parameter="), key, fa.literal(b">\n"), value, fa.literal(b"\n</parameter>\n"))


class XmlValueSyntax(JsonSyntax):
    """A value inside `<parameter=KEY>`: raw strings, Python-style `True`/`False`/`None`, JSON containers."""

    name = "qwen3_xml_value"
    containers_as_json = True

    def __init__(self):
        super().__init__("flexible")
        # the chat template writes Python's str(); parsers also take JSON's spelling
        self.null = fa.union(fa.literal(b"None"), fa.literal(b"null"))
        self.true = fa.union(fa.literal(b"True"), fa.literal(b"true"))
        self.false = fa.union(fa.literal(b"False"), fa.literal(b"false"))

    def child(self) -> JsonSyntax:
        return JsonSyntax("flexible")

    def string(self, decoded: fa.Expr) -> fa.Expr:
        return fa.intersect(decoded, fa.text_without(b"\n</parameter>"))

    def text(self, value: Any) -> bytes | None:
        if isinstance(value, str):
            return value.encode()
        return super().text(value)
