"""Generated token ids → the assistant message: thinking, content and tool calls, read with the format's `.lark` file.

In: a `TokenIndex` from `compile_index` (its policy, format and vocabulary) and the ids generated. Out: a message dict
(`content`, `tool_calls`, `finish_reason`, `reasoning_content`), whole (`parse_output`) or as deltas (`StreamParser`).
"""

from __future__ import annotations

import ast
import codecs
import functools
import json
import re
import string
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from lark import Token
from lark.grammar import NonTerminal, Terminal

from constrain import automaton as fa
from constrain.errors import InternalError, MaskViolation
from constrain.grammar import PLACEHOLDERS, Format, load_format
from constrain.regex import regex_expr

__all__ = ["StreamParser", "new_call_id", "parse_output"]

# Special tokens named by the format become one lone surrogate each in the text the parser reads: no decoded UTF-8
# can contain one (undecodable bytes become U+DC80..U+DCFF through surrogateescape), so a special token and its
# spelling written as ordinary bytes can never be confused.
_SENTINEL_BASE = 0xD800
_BASE62 = string.digits + string.ascii_letters


def new_call_id() -> str:
    """A fresh tool-call id: `call_` + 24 alphanumerics from two uuid4s (~143 random bits), unique across requests."""
    n, out = int.from_bytes(uuid.uuid4().bytes + uuid.uuid4().bytes, "big"), []
    for _ in range(24):
        n, r = divmod(n, 62)
        out.append(_BASE62[r])
    return "call_" + "".join(out)


# ---------------------------------------------------------------------------------------------------------------------
# The format file as a matcher: nodes are tuples
#   ("lit", text) ("ph", placeholder) ("re", pattern) ("seq", nodes) ("alt", nodes) ("rep", node, lo, hi) ("call", node)
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Reader:
    """A format file read for parsing: its rules as nodes, special texts → sentinels."""

    fmt: Format
    sentinel: Mapping[str, str]  # special token text → its sentinel character
    rules: Mapping[str, Any]

    def rule(self, name: str) -> Any:
        return self.rules.get(name, ("seq", ()))

    def has(self, name: str) -> bool:
        return name in self.rules


@functools.lru_cache(maxsize=None)
def _reader(format_name: str) -> _Reader:
    fmt = load_format(format_name)
    texts = sorted(set(fmt.special_texts().values()) | set(fmt.meta.get("string_quote", ())))
    sentinel = {t: chr(_SENTINEL_BASE + i) for i, t in enumerate(texts)}
    special_texts = fmt.special_texts()

    def node(tree: Any, stack: tuple[str, ...]) -> Any:
        if isinstance(tree, NonTerminal):
            if tree.name in stack:
                raise ValueError(f"{fmt.name}.lark: rule {tree.name} is recursive")
            return node(fmt.rules[tree.name], stack + (tree.name,))
        if isinstance(tree, Terminal):
            if tree.name in PLACEHOLDERS:
                return ("ph", tree.name)
            if tree.name in special_texts:
                return ("lit", sentinel[special_texts[tree.name]])
            return node(fmt.terminals[tree.name], stack)
        if isinstance(tree, Token):
            raise ValueError(f"{fmt.name}.lark: unexpected token {tree!r}")
        kind = tree.data
        if kind == "expansions":
            return ("alt", tuple(node(c, stack) for c in tree.children))
        if kind == "expansion":
            return ("seq", tuple(node(c, stack) for c in tree.children))
        if kind == "value":
            return node(tree.children[0], stack)
        if kind == "maybe":
            return ("rep", node(tree.children[0], stack), 0, 1)
        if kind == "literal":
            raw = str(tree.children[0])
            if raw.startswith('"'):
                return ("lit", ast.literal_eval(raw))
            body, _, flags = raw[1:].rpartition("/")
            if flags:
                raise ValueError(f"{fmt.name}.lark: regex flags are not supported: {raw}")
            # the regex compiled by the same code that built the mask: ECMA semantics, exact prefix viability
            return ("re", fa.compile(regex_expr(body)))
        if kind == "expr":
            body, op = node(tree.children[0], stack), str(tree.children[1])
            if op == "?":
                return ("rep", body, 0, 1)
            if op == "*":
                return ("rep", body, 0, None)
            if op == "+":
                return ("rep", body, 1, None)
            if op == "~":
                lo = int(tree.children[2])
                hi = int(tree.children[3]) if len(tree.children) > 3 else lo
                return ("rep", body, lo, hi)
        raise ValueError(f"{fmt.name}.lark: unsupported construct {kind!r}")

    rules = {name: node(tree, (name,)) for name, tree in fmt.rules.items()}
    return _Reader(fmt, sentinel, rules)


def _turn(reader: _Reader, policy: Any, thinking: bool) -> Any:
    """The whole assistant turn, from the same `turn_structure` that `compile_policy_grammar` builds from."""
    from constrain.grammar import turn_structure

    def build(node: tuple) -> Any:
        tag = node[0]
        if tag == "rule":
            return reader.rule(node[1])
        if tag == "call":
            return ("call", reader.rule("call"))
        if tag in ("seq", "alt"):
            return (tag, tuple(build(child) for child in node[1]))
        return ("rep", build(node[1]), node[2], node[3])

    return build(turn_structure(reader.fmt, policy, thinking))


_ANY = None  # a first-character set that may be anything


def _first(node: Any, names: Sequence[str], kind: str) -> tuple[frozenset[str] | None, bool]:
    """(characters a match of `node` may start with or _ANY, whether it may match the empty string)."""
    tag = node[0]
    if tag == "lit":
        return (frozenset(node[1][:1]), False) if node[1] else (frozenset(), True)
    if tag == "ph":
        if node[1] == "NAME":
            return frozenset(n[:1] for n in names if n), any(not n for n in names)
        if node[1] == "ARGUMENTS":
            return (frozenset("<"), True) if kind == "qwen3_xml" else (frozenset("{"), False)
        return _ANY, True
    if tag == "re":
        dfa = node[1]
        if dfa.is_empty:
            return frozenset(), False
        live = [b for b in range(256) if dfa.transitions[dfa.start, dfa.class_of[b]] >= 0]
        first = None if any(b >= 0x80 for b in live) else frozenset(chr(b) for b in live)
        return first, bool(dfa.accepting[dfa.start])
    if tag in ("call",):
        return _first(node[1], names, kind)
    if tag == "rep":
        first, nullable = _first(node[1], names, kind)
        return first, nullable or node[2] == 0
    if tag == "alt":
        out: frozenset[str] | None = frozenset()
        nullable = False
        for child in node[1]:
            f, n = _first(child, names, kind)
            out = None if out is None or f is None else out | f
            nullable = nullable or n
        return out, nullable
    # seq
    out = frozenset()
    for child in node[1]:
        f, n = _first(child, names, kind)
        out = None if out is None or f is None else out | f
        if not n:
            return out, False
    return out, True


def _union(a: frozenset[str] | None, b: frozenset[str] | None) -> frozenset[str] | None:
    return None if a is None or b is None else a | b


# An event: (kind, call index or -1, value). Kinds: "reasoning", "content", "head" (value: the name), "args" (the
# arguments' JSON text so far), "close" (a call is complete; never sent).
Event = tuple[str, int, str]


class _Match:
    """All readings of `s[pos:]` against a turn node: full ones (ending at `end`) and, in prefix mode, partial ones
    (the text ran out inside the node, which could still continue)."""

    def __init__(self, reader: _Reader, policy: Any, s: str, prefix: bool):
        self.r = reader
        self.policy = policy
        self.s = s
        self.n = len(s)
        self.prefix = prefix
        self.names = tuple(policy.allowed)
        self.kind = reader.fmt.arguments
        rf = getattr(policy, "response_format", None)
        # free text never contains a tag spelling; a response_format JSON text is not free text (the grammar does
        # not intersect it with the exclusions), and thinking never contains the thinking close tag's spelling
        json_text = rf is not None and getattr(rf, "type", "text") in ("json_schema", "json_object")
        self.excludes = {
            "TEXT": () if json_text else tuple(reader.fmt.text_excludes),
            "THINKING": tuple(t for name, t in reader.fmt.special_texts().items() if name == "THINK_CLOSE"),
        }
        self.quote = reader.sentinel.get(reader.fmt.meta.get("string_quote", ("",))[0], None)
        self.first_cache: dict[int, tuple[frozenset[str] | None, bool]] = {}
        self._text_limit: dict[tuple[int, str], int] = {}

    def first(self, node: Any) -> tuple[frozenset[str] | None, bool]:
        key = id(node)
        got = self.first_cache.get(key)
        if got is None:
            got = self.first_cache[key] = _first(node, self.names, self.kind)
        return got

    # yields (end, events, partial, (n_calls, current name))
    def m(self, node: Any, pos: int, follow: frozenset[str] | None, st: tuple[int, str]) -> Iterator[tuple]:
        tag = node[0]
        s, n = self.s, self.n
        if tag == "lit":
            lit = node[1]
            if s.startswith(lit, pos):
                yield pos + len(lit), (), False, st
            elif self.prefix and len(s) - pos < len(lit) and lit.startswith(s[pos:]):
                yield n, (), True, st
        elif tag == "seq":
            yield from self.seq(node[1], 0, pos, follow, st)
        elif tag == "alt":
            for child in node[1]:
                yield from self.m(child, pos, follow, st)
        elif tag == "rep":
            yield from self.rep(node, 0, pos, follow, st)
        elif tag == "call":
            for end, ev, partial, st2 in self.m(node[1], pos, follow, (st[0], "")):
                if partial:
                    yield end, ev, True, st2
                else:
                    yield end, ev + (("close", st[0], st2[1]),), False, (st[0] + 1, "")
        elif tag == "ph":
            yield from self.placeholder(node[1], pos, follow, st)
        elif tag == "re":
            dfa = node[1]
            if dfa.is_empty:
                return
            state, i = dfa.start, pos
            while True:
                if dfa.accepting[state]:
                    yield i, (), False, st
                if i == n:
                    if self.prefix:
                        yield n, (), True, st
                    return
                if 0xD800 <= ord(s[i]) < 0xE000:
                    return
                for b in s[i].encode("utf-8"):
                    state = int(dfa.transitions[state, dfa.class_of[b]])
                    if state < 0:
                        return
                i += 1
        else:
            raise AssertionError(tag)

    def seq(self, nodes: Sequence[Any], i: int, pos: int, follow: frozenset[str] | None, st: tuple) -> Iterator[tuple]:
        if i == len(nodes):
            yield pos, (), False, st
            return
        after: frozenset[str] | None = frozenset()
        nullable = True
        for later in nodes[i + 1:]:
            f, nul = self.first(later)
            after = _union(after, f)
            if not nul:
                nullable = False
                break
        if nullable:
            after = _union(after, follow)
        for end, ev, partial, st2 in self.m(nodes[i], pos, after, st):
            if partial:
                yield end, ev, True, st2
            else:
                for end2, ev2, partial2, st3 in self.seq(nodes, i + 1, end, follow, st2):
                    yield end2, ev + ev2, partial2, st3

    def rep(self, node: Any, k: int, pos: int, follow: frozenset[str] | None, st: tuple) -> Iterator[tuple]:
        _, body, lo, hi = node
        if k >= lo:
            yield pos, (), False, st
        if hi is not None and k >= hi:
            return
        inner_follow = _union(self.first(body)[0], follow) if (hi is None or k + 1 < hi) else follow
        for end, ev, partial, st2 in self.m(body, pos, inner_follow, st):
            if partial:
                yield end, ev, True, st2
            elif end > pos or k < lo:
                for end2, ev2, partial2, st3 in self.rep(node, k + 1, end, follow, st2):
                    yield end2, ev + ev2, partial2, st3

    # ---- placeholders

    def placeholder(self, name: str, pos: int, follow: frozenset[str] | None, st: tuple) -> Iterator[tuple]:
        s, n = self.s, self.n
        if name in ("TEXT", "THINKING"):
            kind = "content" if name == "TEXT" else "reasoning"
            limit = self.text_limit(pos, name)
            for end in range(pos, min(limit, n) + 1):
                if end == n or follow is None or s[end] in follow:
                    yield end, ((kind, -1, s[pos:end]),) if end > pos else (), False, st
            if self.prefix and limit >= n:
                yield n, ((kind, -1, s[pos:]),) if n > pos else (), True, st
        elif name == "NAME":
            for tool in self.names:
                if s.startswith(tool, pos):
                    yield pos + len(tool), (("head", st[0], tool),), False, (st[0], tool)
                elif self.prefix and n - pos < len(tool) and tool.startswith(s[pos:]):
                    yield n, (), True, st
        elif name == "ARGUMENTS":
            yield from self.arguments(pos, st)
        else:
            raise ValueError(f"{self.r.fmt.name}.lark: unknown placeholder {name}")

    def text_limit(self, pos: int, name: str) -> int:
        """The largest end such that s[pos:end] is free text (no sentinel, no excluded spelling)."""
        key = (pos, name)
        got = self._text_limit.get(key)
        if got is not None:
            return got
        s, limit = self.s, self.n
        for i in range(pos, self.n):
            if 0xD800 <= ord(s[i]) < 0xDC00:
                limit = i
                break
        for spelling in self.excludes[name]:
            at = s.find(spelling, pos, limit)
            if at >= 0:
                limit = min(limit, at + len(spelling) - 1)
        self._text_limit[key] = limit
        return limit

    def arguments(self, pos: int, st: tuple) -> Iterator[tuple]:
        s, n = self.s, self.n
        i, name = st
        if self.kind == "json":
            try:
                value, end = _JSON.raw_decode(s, pos)
            except (ValueError, RecursionError):  # (a value nested past what the decoder recurses: not read)
                if self.prefix and not _has_sentinel(s, pos, n):
                    yield n, (("args", i, s[pos:]),) if n > pos else (), True, st
                return
            if isinstance(value, dict):
                yield end, (("args", i, s[pos:end]),), False, st
        elif self.kind == "gemma4":
            end = _gemma4_extent(s, pos, self.quote)
            if end is None:
                if self.prefix and (pos == n or s.startswith("{", pos)):
                    yield n, (), True, st
                return
            if end >= 0:
                try:
                    text = _dump(_gemma4_value(s[pos:end], self.quote))
                except (ValueError, RecursionError):
                    return
                yield end, (("args", i, text),), False, st
        elif self.kind == "qwen3_xml":
            params: list[tuple[str, str]] = []
            p = pos
            while True:
                try:
                    yield p, (("args", i, _xml_arguments(params, self.policy.tool(name).parameters)),), False, st
                except (ValueError, KeyError, RecursionError):
                    pass
                block = _xml_block(s, p)
                if block is None:  # the text ran out inside a block (or at its start)
                    if self.prefix and not _has_sentinel(s, p, n):
                        yield n, (), True, st
                    return
                if block[0] < 0:
                    return
                p, key, value = block
                params.append((key, value))
        else:
            raise ValueError(f"unknown arguments kind {self.kind!r}")


_JSON = json.JSONDecoder()


def _has_sentinel(s: str, start: int, end: int) -> bool:
    return any(0xD800 <= ord(c) < 0xDC00 for c in s[start:end])


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---- Gemma 4 arguments: {key:<|"|>text<|"|>,n:3,b:true,z:None,o:{...},a:[...]}


def _gemma4_extent(s: str, pos: int, quote: str | None) -> int | None:
    """End of the braced object at `pos`: an index, -1 if there is none, None if the text ran out inside it."""
    if pos >= len(s):
        return None
    if s[pos] != "{":
        return -1
    depth, i, n = 0, pos, len(s)
    while i < n:
        c = s[i]
        if c == quote:
            close = s.find(quote, i + 1)
            if close < 0:
                return None
            i = close + 1
            continue
        if 0xD800 <= ord(c) < 0xDC00:
            return -1
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _gemma4_value(text: str, quote: str | None) -> Any:
    """Gemma 4 argument syntax → the Python value (`None` is null; strings are verbatim between quote tokens)."""

    def value(i: int) -> tuple[Any, int]:
        if i >= len(text):
            raise ValueError("gemma4 arguments: value expected")
        c = text[i]
        if c == quote:
            close = text.find(quote, i + 1)
            if close < 0:
                raise ValueError("gemma4 arguments: unterminated string")
            return text[i + 1:close], close + 1
        if c == "{":
            out: dict[str, Any] = {}
            i += 1
            if text.startswith("}", i):
                return out, i + 1
            while True:
                colon = text.find(":", i)
                if colon < 0:
                    raise ValueError("gemma4 arguments: ':' expected")
                key = text[i:colon]
                if key in out:
                    raise ValueError(f"gemma4 arguments: duplicate key {key!r}")
                out[key], i = value(colon + 1)
                if text.startswith(",", i):
                    i += 1
                elif text.startswith("}", i):
                    return out, i + 1
                else:
                    raise ValueError("gemma4 arguments: ',' or '}' expected")
        if c == "[":
            items: list[Any] = []
            i += 1
            if text.startswith("]", i):
                return items, i + 1
            while True:
                item, i = value(i)
                items.append(item)
                if text.startswith(",", i):
                    i += 1
                elif text.startswith("]", i):
                    return items, i + 1
                else:
                    raise ValueError("gemma4 arguments: ',' or ']' expected")
        for word, val in (("true", True), ("false", False), ("None", None)):
            if text.startswith(word, i):
                return val, i + len(word)
        m = _NUMBER.match(text, i)
        if m:
            return json.loads(m.group(0)), m.end()
        raise ValueError(f"gemma4 arguments: unexpected {text[i:i + 10]!r}")

    result, end = value(0)
    if end != len(text) or not isinstance(result, dict):
        raise ValueError("gemma4 arguments: one object expected")
    return result


# ---- Qwen3 XML arguments: <parameter=KEY>\nVALUE\n</parameter>\n ...

_XML_OPEN, _XML_CLOSE = "<parameter=", "\n</parameter>\n"


def _xml_block(s: str, p: int) -> tuple[int, str, str] | tuple[int] | None:
    """One parameter block at `p`: (end, key, raw value), (-1,) when none starts here, None when the text ran out."""
    n = len(s)
    head = s[p:p + len(_XML_OPEN)]
    if not _XML_OPEN.startswith(head):
        return (-1,)
    if len(head) < len(_XML_OPEN):
        return None
    gt = s.find(">", p + len(_XML_OPEN))  # keys never contain '>'
    if gt < 0 or gt + 1 == n:
        return None
    if s[gt + 1] != "\n":
        return (-1,)
    close = s.find("\n</parameter>", gt + 2)  # string values never contain it, JSON values cannot
    if close < 0:
        return None
    if not s.startswith(_XML_CLOSE, close):
        return None if _XML_CLOSE.startswith(s[close:]) else (-1,)
    return close + len(_XML_CLOSE), s[p + len(_XML_OPEN):gt], s[gt + 2:close]


def _xml_arguments(params: Sequence[tuple[str, str]], schema: Any) -> str:
    """Parameter blocks → the arguments' JSON text, each value read with its schema's types (first that fits)."""
    out: dict[str, Any] = {}
    root = schema if isinstance(schema, dict) else {}
    props = root.get("properties", {}) if isinstance(root.get("properties"), dict) else {}
    extra = root.get("additionalProperties", {})
    for key, raw in params:
        if key in out:
            raise ValueError(f"qwen3_xml arguments: duplicate parameter {key!r}")
        sub = props.get(key, extra if isinstance(extra, dict) else {})
        out[key] = _xml_value(raw, sub, root)
    return _dump(out)


_SPELLINGS = {"True": True, "true": True, "False": False, "false": False, "None": None, "null": None}


def _types(schema: Any, root: Any, depth: int = 0) -> list[str]:
    """The JSON types a schema allows, in the order it names them (anyOf/oneOf branches in order)."""
    if depth > 32 or not isinstance(schema, dict):
        return []
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~"), {}) if isinstance(target, dict) else {}
        return _types(target, root, depth + 1)
    out: list[str] = []
    t = schema.get("type")
    for name in ([t] if isinstance(t, str) else t if isinstance(t, list) else []):
        out.append(name)
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, []) or []:
            out += _types(branch, root, depth + 1)
    for value in ([schema["const"]] if "const" in schema else []) + list(schema.get("enum", []) or []):
        out.append(_json_type(value))
    seen: list[str] = []
    for name in out:
        if name not in seen:
            seen.append(name)
    return seen


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _xml_value(raw: str, schema: Any, root: Any) -> Any:
    types = _types(schema, root) or ["null", "boolean", "number", "object", "array", "string"]
    for t in types:
        if t == "string":
            return raw
        if t in ("boolean", "null"):
            if raw in _SPELLINGS and _json_type(_SPELLINGS[raw]) == t:
                return _SPELLINGS[raw]
        elif t in ("integer", "number"):
            m = _NUMBER.fullmatch(raw)
            if m and (t == "number" or not any(c in raw for c in ".eE")):
                return json.loads(raw)
        elif t in ("object", "array"):
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):
                continue
            if _json_type(value) == t:
                return value
    raise ValueError(f"qwen3_xml arguments: {raw[:40]!r} fits none of the types {types}")


# ---------------------------------------------------------------------------------------------------------------------
# Token ids → the text the parser reads
# ---------------------------------------------------------------------------------------------------------------------


class _Decoder:
    """Replays ids through the index (is the output in the language?) and builds two texts: `parse` (format special
    tokens as sentinels) and `visible` (special tokens as their text); EOS tokens that end the sequence are dropped."""

    def __init__(self, index: Any):
        self.index = index
        self.vocab = index.vocab
        meta = index.meta or {}
        self.reader = _reader(meta.get("tool_format", "hermes"))
        self.state = index.start()
        self.valid = True  # every id so far was allowed by the index
        self.parse = ""
        self.visible = ""
        self._bytes = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self._visible_bytes = codecs.getincrementaldecoder("utf-8")("replace")
        self._special_ids = frozenset(self.vocab.special_ids)
        self._eos = frozenset(self.vocab.eos_ids)
        self._sentinel_of = {}
        for text, ch in self.reader.sentinel.items():
            tid = self.vocab.special_tokens.get(text)
            if tid is not None:
                self._sentinel_of[int(tid)] = ch

    def feed(self, token_id: int) -> None:
        t = int(token_id)
        was_finished = self.state.is_finished()
        if self.valid:
            try:
                self.state.advance(t)
            except MaskViolation:
                self.valid = False
        if self.valid and self.state.is_finished():
            if was_finished or t in self.vocab.eos_ids:
                return  # the EOS that ends the sequence: not part of the message
        data = self.vocab.token_bytes[t] if 0 <= t < self.vocab.n_tokens else b""
        if t in self._special_ids or t in self._sentinel_of:
            self.parse += self._bytes.decode(b"", final=True) + self._sentinel_of.get(t, data.decode("utf-8", "replace"))
            self._bytes.reset()
            self.visible += self._visible_bytes.decode(b"", final=True)
            self._visible_bytes.reset()
            if t not in self._eos:  # end tokens never reach the text
                self.visible += data.decode("utf-8", "replace")
        else:
            self.parse += self._bytes.decode(data)
            self.visible += self._visible_bytes.decode(data)

    def complete(self) -> bool:
        """The ids so far form a whole output of the index's language (EOS given or not)."""
        return self.valid and self.state.is_accepting()

    def flush(self) -> None:
        # a cut can end inside a UTF-8 sequence: those bytes are no character yet, so the parser never reads them
        self._bytes.reset()
        self.visible += self._visible_bytes.decode(b"", final=True)


# ---------------------------------------------------------------------------------------------------------------------
# Readings → message
# ---------------------------------------------------------------------------------------------------------------------


def _readings(decoder: _Decoder, prefix: bool) -> list[tuple[Event, ...]]:
    """Every distinct event list the text can be read as (whole readings only unless `prefix`), preferred first."""
    meta = decoder.index.meta or {}
    policy = meta["policy"]
    turn = _turn(decoder.reader, policy, bool(meta.get("thinking", False)))
    match = _Match(decoder.reader, policy, decoder.parse, prefix)
    seen: dict[tuple[Event, ...], None] = {}
    for end, events, partial, _ in match.m(turn, 0, frozenset(), (0, "")):
        if partial or end == match.n:
            seen.setdefault(events, None)
    return list(seen)


def _common(readings: Sequence[Sequence[Event]]) -> list[Event]:
    """The longest event list every reading starts with (text values compared character by character)."""
    if not readings:
        return []
    out = list(readings[0])
    for other in readings[1:]:
        k = 0
        while k < len(out) and k < len(other) and out[k] == other[k]:
            k += 1
        if k < len(out) and k < len(other) and out[k][:2] == other[k][:2] and out[k][0] != "head":
            prefix = _common_prefix(out[k][2], other[k][2])
            out = out[:k] + ([(out[k][0], out[k][1], prefix)] if prefix else [])
        else:
            out = out[:k]
    return out


def _common_prefix(a: str, b: str) -> str:
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    return a[:i]


def _calls_of(events: Sequence[Event]) -> list[tuple[str, str]]:
    heads = {e[1]: e[2] for e in events if e[0] == "head"}
    args = {e[1]: e[2] for e in events if e[0] == "args"}
    return [(heads[i], args.get(i, "")) for i in sorted(heads)]


def _valid_calls(events: Sequence[Event], policy: Any) -> bool:
    """The calls satisfy the policy: count bounds, allowed names, arguments a JSON object (fail-closed re-check)."""
    calls = _calls_of(events)
    closed = {e[1] for e in events if e[0] == "close"}
    if len(closed) != len(calls) or not policy.min_calls <= len(calls) <= policy.max_calls:
        return False
    for name, arguments in calls:
        if name not in policy.allowed:
            return False
        if not _usable_arguments(arguments):
            return False
    return True


def _usable_arguments(arguments: str) -> bool:
    """A JSON object without a repeated key at any depth, that Python's decoder reads (nested less deep than its
    recursion limit: the masks bound free-form nesting at `automaton.MAX_SPILLED` past the window)."""
    try:
        return isinstance(json.loads(arguments, object_pairs_hook=_unique_keys), dict)
    except (ValueError, RecursionError):
        return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are distinct; a repeated key (a byte automaton cannot rule out two equal undeclared
    keys) makes the arguments ambiguous, so the call is not reported."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("arguments repeat a key")
    return out


def _message(events: Sequence[Event], ids: Sequence[str], thinking: bool, finish_reason: str) -> dict[str, Any]:
    content = "".join(e[2] for e in events if e[0] == "content")
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if thinking:
        msg["reasoning_content"] = "".join(e[2] for e in events if e[0] == "reasoning") or None
    calls = _calls_of(events)
    if calls:
        msg["tool_calls"] = [
            {"id": ids[i], "type": "function", "function": {"name": name, "arguments": arguments}}
            for i, (name, arguments) in enumerate(calls)
        ]
    msg["finish_reason"] = finish_reason
    return msg


def _outcome(decoder: _Decoder, finish_reason: str) -> tuple[list[Event], str]:
    """The events of the reported message and its finish_reason (the fail-closed rules live here)."""
    if finish_reason not in ("stop", "length"):
        raise ValueError(f"finish_reason must be 'stop' or 'length', got {finish_reason!r}")
    policy = decoder.index.meta["policy"]
    decoder.flush()
    if finish_reason == "length":
        # cut: what every reading of the prefix agrees is reasoning or content; never a call
        if not decoder.valid:
            return [("content", -1, decoder.visible)] if decoder.visible else [], "length"
        return [e for e in _common(_readings(decoder, prefix=True)) if e[0] in ("reasoning", "content")], "length"
    if decoder.complete():
        readings = _readings(decoder, prefix=False)
        for events in readings:
            calls = _calls_of(events)
            if not calls:
                return list(events), "stop"
            if _valid_calls(events, policy):
                return list(events), "stop" if policy.named else "tool_calls"
    # not in the language (the mask was not applied) or unreadable: the text as content, no call
    return ([("content", -1, decoder.visible)] if decoder.visible else []), "stop"


def parse_output(
    index: Any,
    token_ids: Sequence[int] | Any,
    finish_reason: str = "stop",
    *,
    id_factory: Callable[[], str] = new_call_id,
) -> dict[str, Any]:
    """The OpenAI assistant message of a generated turn, read with the `.lark` file that built `index`'s mask.

    Guarantee (fail closed): `tool_calls` is reported only when the ids are a whole output of `index`'s language
    (replayed through `index.start()`), `finish_reason` is "stop", and every call reads back with an allowed name,
    a JSON-object `arguments` without a repeated key (at any depth) and a count within the policy's bounds. Otherwise there is no `tool_calls` key:
      * `finish_reason="length"` (the budget cut the output; it wins over calls): `content` is the text every
        reading of the prefix agrees is content (no tool-call markup), `finish_reason` "length";
      * ids outside the language, or a turn that does not read back: the whole text as `content` (special tokens
        spelled out, EOS dropped), `finish_reason` "stop".
    `finish_reason` with calls is "tool_calls", except for a named `tool_choice`, where it is "stop" (OpenAI's own
    behaviour, vllm PR #25054); "stop" without calls.

    Args:
        index: a `TokenIndex` from `constrain.compile_index` (its `meta` names the policy, format and thinking).
        token_ids: the generated ids, as sampled (the format's end token and a trailing EOS included or not).
        finish_reason: why generation stopped: "stop" (EOS or end token) or "length" (`max_tokens`).
        id_factory: makes each call's `id` (default `new_call_id`: `call_` + 24 alphanumerics).
    Returns:
        `{"role": "assistant", "content": str | None, "tool_calls": [...] (only when calls are reported),
        "reasoning_content": str | None (only when thinking is on), "finish_reason": ...}`, where each call is
        `{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}`. JSON formats keep the
        model's own argument text (valid JSON by construction); gemma4 and qwen3_xml arguments are converted to
        compact JSON (XML values read with the tool schema's types, the first that fits).
    Raises:
        ValueError: `finish_reason` is not "stop" or "length", or `index` was not made by `compile_index`.
    """
    if not (getattr(index, "meta", None) or {}).get("policy"):
        raise ValueError("parse_output needs an index made by constrain.compile_index (index.meta has no policy)")
    decoder = _Decoder(index)
    for t in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids):
        decoder.feed(t)
    events, reason = _outcome(decoder, finish_reason)
    ids = [id_factory() for _ in _calls_of(events)]
    return _message(events, ids, bool(index.meta.get("thinking")), reason)


# ---------------------------------------------------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------------------------------------------------


class StreamParser:
    """Per-request streaming reader: token ids in, OpenAI `chat.completion.chunk` deltas out (§1.7 of the contract).

    Deltas: `{"reasoning_content": ...}` and `{"content": ...}` fragments; per call a head
    `{"tool_calls": [{"index": i, "id", "type": "function", "function": {"name", "arguments": ""}}]}` once the whole
    name is known, then `{"tool_calls": [{"index": i, "function": {"arguments": fragment}}]}`. Nothing is sent
    while more than one reading of the text so far is possible (an incomplete tag that may open a call, a newline
    that may separate text from calls): what is sent is the longest part every reading agrees on.

    Release of calls (`stream_arguments`):
      * False (default, fail closed): a call is sent whole (head, then its arguments in one fragment) once its
        closing marker has been read and its arguments are a JSON object without a repeated key, so neither a cut
        output nor an ambiguous call is put on the wire.
      * True: JSON-format arguments stream as they are generated (gemma4 / qwen3_xml arguments are converted, so
        they still arrive in one fragment at the end of their block). With a budgeted mask a call is never cut;
        without one, a cut leaves the partial call sent and `finish_reason` "length" (OpenAI does the same).
    For an output in the language, the deltas of `feed` and `finish` joined give exactly `parse_output`'s message
    (same ids with the same `id_factory`). A cut stream ends with `finish_reason` "length", never "tool_calls",
    and its content deltas equal `parse_output`'s content; calls already completed (or, with `stream_arguments`,
    begun) were sent. For ids outside the language the final content is sent only where it extends what was sent.
    """

    def __init__(self, index: Any, *, id_factory: Callable[[], str] = new_call_id, stream_arguments: bool = False):
        if not (getattr(index, "meta", None) or {}).get("policy"):
            raise ValueError("StreamParser needs an index made by constrain.compile_index (index.meta has no policy)")
        self._decoder = _Decoder(index)
        self._ids: list[str] = []
        self._id_factory = id_factory
        self._stream_arguments = bool(stream_arguments)
        self._sent: list[Event] = []
        self._dead = False  # the readings ran out: send nothing more until finish
        self._usable: dict[int, bool] = {}  # closed call index -> its arguments are usable
        self.finish_reason: str | None = None

    def feed(self, token_id: int) -> list[dict[str, Any]]:
        """Read one generated id; return the deltas it makes certain (possibly none)."""
        if self.finish_reason is not None:
            raise ValueError("StreamParser.feed after finish")
        before = len(self._decoder.parse)
        self._decoder.feed(token_id)
        if self._dead or len(self._decoder.parse) == before:
            return []
        if not self._decoder.valid:
            self._dead = True
            return []
        readings = _readings(self._decoder, prefix=True)
        if not readings:
            self._dead = True
            return []
        return self._send(self._releasable(_common(readings)))

    def finish(self, finish_reason: str = "stop") -> list[dict[str, Any]]:
        """End the stream; return the last deltas. `self.finish_reason` then holds the chunk's finish_reason."""
        if self.finish_reason is not None:
            raise ValueError("StreamParser.finish called twice")
        events, reason = _outcome(self._decoder, finish_reason)
        self.finish_reason = reason
        if reason != "length":
            try:
                return self._send(events)
            except InternalError:
                pass  # a failure path (ids outside the language): only the content below
        # cut, or unreadable: send what extends the content already sent (text held back because it might have
        # opened a call is content in the whole reply too), never a call
        out = []
        for kind in ("reasoning", "content"):
            whole = "".join(e[2] for e in events if e[0] == kind)
            sent = "".join(e[2] for e in self._sent if e[0] == kind)
            if whole.startswith(sent) and len(whole) > len(sent):
                out.append({"reasoning_content" if kind == "reasoning" else "content": whole[len(sent):]})
        return out

    def _releasable(self, events: list[Event]) -> list[Event]:
        if self._stream_arguments:
            return events
        closed = {e[1] for e in events if e[0] == "close"}
        args = {e[1]: e[2] for e in events if e[0] == "args"}
        for k, e in enumerate(events):
            if e[0] in ("head", "args") and e[1] not in closed:
                return events[:k]
            if e[0] == "head" and not self._closed_call_usable(e[1], args.get(e[1], "")):
                self._dead = True  # finish() reports the turn as content (see _valid_calls)
                return events[:k]
        return events

    def _closed_call_usable(self, i: int, arguments: str) -> bool:
        """`_usable_arguments` of closed call `i`, parsed once (a closed call's arguments no longer change)."""
        usable = self._usable.get(i)
        if usable is None:
            usable = self._usable[i] = _usable_arguments(arguments)
        return usable

    def _send(self, events: list[Event]) -> list[dict[str, Any]]:
        sent = self._sent
        k = 0
        while k < len(sent) - 1 and k < len(events) and sent[k] == events[k]:
            k += 1
        deltas: list[dict[str, Any]] = []
        if sent:
            last, new = sent[-1], events[len(sent) - 1] if len(events) >= len(sent) else None
            if k != len(sent) - 1 or new is None or new[:2] != last[:2] or not new[2].startswith(last[2]) \
                    or (last[0] == "head" and new != last):
                raise InternalError("stream readings went back on sent deltas")
            if len(new[2]) > len(last[2]):
                deltas.append(self._delta((new[0], new[1], new[2][len(last[2]):])))
        for e in events[len(sent):]:
            if e[0] != "close" and (e[2] or e[0] == "head"):
                deltas.append(self._delta(e))
        self._sent = list(events)
        return deltas

    def _delta(self, e: Event) -> dict[str, Any]:
        kind, i, value = e
        if kind == "reasoning":
            return {"reasoning_content": value}
        if kind == "content":
            return {"content": value}
        if kind == "head":
            while len(self._ids) <= i:
                self._ids.append(self._id_factory())
            return {"tool_calls": [{"index": i, "id": self._ids[i], "type": "function",
                                    "function": {"name": value, "arguments": ""}}]}
        return {"tool_calls": [{"index": i, "function": {"arguments": value}}]}
