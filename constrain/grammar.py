"""Tool-call wire formats as data: `grammars/<format>.lark` plus a `Policy` → one byte-automaton expression.

In: a format name, a `Policy`, and the special-token texts → ids of a vocabulary. Out: an `fa.Expr` of the whole
assistant turn. The same `.lark` file is what `constrain.parse` reads back, so enforcement and parsing cannot drift.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from lark import Token, Tree
from lark.grammar import NonTerminal, Terminal
from lark.load_grammar import _parse_grammar  # lark's own grammar-of-grammars parser (lark 1.x)

from constrain import automaton as fa
from constrain.errors import UnsupportedSchema, join_pointer
from constrain.schema import DEFAULT_MAX_DEPTH, CompiledSchema, compile_schema
from constrain.syntax import ANY_TEXT, Gemma4Syntax, JsonSyntax, XmlArgumentsSyntax

GRAMMAR_DIR = Path(__file__).resolve().parent.parent / "grammars"
FORMATS = ("hermes", "qwen3_xml", "gemma4", "llama3_json", "mistral", "mistral_v3", "json")
PLACEHOLDERS = ("NAME", "ARGUMENTS", "TEXT", "THINKING")


@dataclass(frozen=True)
class Format:
    """One wire format, read from its `.lark` file: rules, terminals and the `//!` metadata lines."""

    name: str
    source: str
    rules: Mapping[str, Tree]
    terminals: Mapping[str, Tree]
    special: frozenset[str]  # terminals that are single special tokens
    meta: Mapping[str, tuple[str, ...]]

    @property
    def arguments(self) -> str:
        """How call arguments are written: `json`, `gemma4` or `qwen3_xml`."""
        return self.meta.get("arguments", ("json",))[0]

    @property
    def text_excludes(self) -> tuple[str, ...]:
        """Spellings that free text may never contain (tool-call and thinking tags)."""
        return self.meta.get("text_excludes", ())

    def has(self, rule: str) -> bool:
        return rule in self.rules

    def special_texts(self) -> dict[str, str]:
        """Terminal name → the special token's text."""
        return {name: _literal_text(self.terminals[name]) for name in self.special}


def _literal_text(term: Tree) -> str:
    """The text of a terminal defined as one string literal."""
    literals = [t for t in term.iter_subtrees() if t.data == "literal"]
    if len(literals) != 1:
        raise ValueError(f"special terminal must be one string literal, got {term}")
    raw = str(literals[0].children[0])
    if not raw.startswith('"'):
        raise ValueError(f"special terminal must be a string literal, got {raw}")
    return ast.literal_eval(raw)


@functools.lru_cache(maxsize=None)
def load_format(name: str) -> Format:
    """Read `grammars/<name>.lark`.

    Raises:
        ValueError: unknown format name, or a file that breaks the conventions (see grammars/README.md).
    """
    if name not in FORMATS:
        raise ValueError(f"unknown tool format {name!r}; expected one of {', '.join(FORMATS)}")
    path = GRAMMAR_DIR / f"{name}.lark"
    source = path.read_text(encoding="utf-8")
    meta: dict[str, tuple[str, ...]] = {}
    for line in source.splitlines():
        if line.startswith("//!"):
            key, _, value = line[3:].partition(":")
            meta[key.strip()] = tuple(ast.literal_eval(v) if v.startswith('"') else v for v in _split_meta(value))
    tree = _parse_grammar(source, str(path))
    rules: dict[str, Tree] = {}
    terminals: dict[str, Tree] = {}
    for item in tree.children:
        if item.data == "rule":
            rules[str(item.children[1])] = item.children[-1]
        elif item.data == "term":
            terminals[str(item.children[0])] = item.children[-1]
    special = frozenset(meta.get("special", ()))
    for term in special:
        if term not in terminals:
            raise ValueError(f"{path.name}: special terminal {term} is not defined")
    if "call" not in rules:
        raise ValueError(f"{path.name}: a format must define the rule 'call'")
    return Format(name, source, rules, terminals, special, meta)


def _split_meta(value: str) -> list[str]:
    out, cur, quoted = [], "", False
    for ch in value.strip():
        if ch == '"' and not cur.endswith("\\"):
            quoted = not quoted
        if ch == " " and not quoted:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


# ---------------------------------------------------------------------------
# .lark trees → expressions
# ---------------------------------------------------------------------------


class _Translator:
    def __init__(self, fmt: Format, special_ids: Mapping[str, int], placeholders: Mapping[str, fa.Expr]):
        self.fmt = fmt
        self.special_ids = special_ids
        self.placeholders = placeholders
        self.stack: list[str] = []

    def rule(self, name: str) -> fa.Expr:
        if name in self.stack:
            raise ValueError(f"{self.fmt.name}.lark: rule {name} is recursive; tool-call formats must be regular")
        self.stack.append(name)
        try:
            return self.node(self.fmt.rules[name])
        finally:
            self.stack.pop()

    def terminal(self, name: str) -> fa.Expr:
        if name in self.placeholders:
            return self.placeholders[name]
        if name in self.fmt.special:
            text = _literal_text(self.fmt.terminals[name])
            return fa.special(self.special_ids[text])
        if name not in self.fmt.terminals:
            raise ValueError(f"{self.fmt.name}.lark: terminal {name} has no definition and no value")
        return self.node(self.fmt.terminals[name])

    def node(self, node: Any) -> fa.Expr:
        if isinstance(node, NonTerminal):
            return self.rule(node.name)
        if isinstance(node, Terminal):
            return self.terminal(node.name)
        if isinstance(node, Token):
            raise ValueError(f"{self.fmt.name}.lark: unexpected token {node!r}")
        kind = node.data
        if kind == "expansions":
            return fa.union(*(self.node(c) for c in node.children))
        if kind == "expansion":
            return fa.concat(*(self.node(c) for c in node.children))
        if kind == "value":
            return self.node(node.children[0])
        if kind == "maybe":
            return fa.optional(self.node(node.children[0]))
        if kind == "literal":
            return self.literal(str(node.children[0]))
        if kind == "expr":
            body, op = self.node(node.children[0]), str(node.children[1])
            if op == "?":
                return fa.optional(body)
            if op == "*":
                return fa.repeat(body, 0)
            if op == "+":
                return fa.repeat(body, 1)
            if op == "~":
                lo = int(node.children[2])
                hi = int(node.children[3]) if len(node.children) > 3 else lo
                return fa.repeat(body, lo, hi)
        raise ValueError(f"{self.fmt.name}.lark: unsupported construct {kind!r}")

    def literal(self, raw: str) -> fa.Expr:
        if raw.startswith('"'):
            if not raw.endswith('"'):
                raise ValueError(f"{self.fmt.name}.lark: string flags are not supported: {raw}")
            return fa.literal(ast.literal_eval(raw).encode("utf-8"))
        from constrain.regex import regex_expr

        body, _, flags = raw[1:].rpartition("/")
        if flags:
            raise ValueError(f"{self.fmt.name}.lark: regex flags are not supported: {raw}")
        return regex_expr(body)


# ---------------------------------------------------------------------------
# policy → expression
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolGrammar:
    """What compiling a policy produced besides the expression: per-tool relaxations and ignored keywords."""

    expr: fa.Expr
    relaxed: tuple[tuple[str, str, str], ...]  # (tool name, pointer, reason)
    ignored: tuple[str, ...]
    largest: str = ""  # the pointer of the part with the most states (`CompiledSchema.largest` of the largest schema)
    # (pointer, depth) of each schema compiled shallower than max_depth (`Policy.shallower`)
    shallower: tuple[tuple[str, int], ...] = ()


def argument_syntax(fmt: Format, special_ids: Mapping[str, int]) -> JsonSyntax:
    """The syntax arguments are written in for `fmt`."""
    kind = fmt.arguments
    if kind == "json":
        return JsonSyntax(fmt.meta.get("whitespace", ("flexible",))[0])
    if kind == "gemma4":
        quote = fmt.meta.get("string_quote", ('<|"|>',))[0]
        return Gemma4Syntax(special_ids[quote])
    if kind == "qwen3_xml":
        return XmlArgumentsSyntax()
    raise ValueError(f"{fmt.name}.lark: unknown arguments kind {kind!r}")


def resolve_special_ids(fmt: Format, special_tokens: Mapping[str, int]) -> dict[str, int]:
    """Special token text → id for every special terminal of `fmt` (plus the Gemma 4 string quote).

    Raises:
        UnsupportedSchema: the vocabulary lacks a special token the format needs.
    """
    texts = set(fmt.special_texts().values()) | set(fmt.meta.get("string_quote", ()))
    missing = sorted(t for t in texts if t not in special_tokens)
    if missing:
        raise UnsupportedSchema(
            f"tool format {fmt.name!r} needs the special token(s) {', '.join(missing)}, which this vocabulary lacks",
            pointer="/tools",
        )
    return {t: int(special_tokens[t]) for t in texts}


def compile_policy_grammar(
    policy: Any,
    fmt: Format,
    special_tokens: Mapping[str, int],
    *,
    thinking: bool = False,
    compile_arguments: Callable[..., CompiledSchema] = compile_schema,
) -> ToolGrammar:
    """The expression of every assistant turn that `policy` allows, written in `fmt`.

    Structure (each piece from the format file): `think?` when `thinking`, then
      none:      content? end
      auto:      (content | content content_sep calls | calls) end     (content may be empty)
      required:  calls end     (no text before the first call; only the thinking block)
    where `calls` = calls_open call (call_sep call){min-1..max-1} calls_close and `call` is the union over
    `policy.allowed` of the format's call rule with NAME and ARGUMENTS filled in for that tool.
    `response_format: json_schema` replaces `content` by the schema's JSON text.

    Raises:
        InvalidSchema / UnsupportedSchema with pointers into the request (`/tools/i/function/parameters`).
    """
    special_ids = resolve_special_ids(fmt, special_tokens)
    syntax = argument_syntax(fmt, special_ids)
    text = _free_text(fmt)
    relaxed: list[tuple[str, str, str]] = []
    ignored: list[str] = []
    sizes: list[tuple[int, str]] = []
    shallower: list[tuple[str, int]] = []
    # (passed only when set: a `compile_arguments` that does not take it is still called as before)
    narrow = {"shallower": True} if getattr(policy, "shallower", False) else {}

    def note_depth(compiled: Any, pointer: str) -> None:
        depth = getattr(compiled, "depth", None)
        if narrow and depth is not None and depth < DEFAULT_MAX_DEPTH:
            shallower.append((pointer, depth))

    content: fa.Expr = text
    rf = getattr(policy, "response_format", None)
    if rf is not None and getattr(rf, "type", "text") == "json_schema":
        compiled = compile_arguments(rf.schema, pointer="/response_format/json_schema/schema", strict=bool(rf.strict),
                                     whitespace="compact" if rf.strict else "flexible", **narrow)
        note_depth(compiled, "/response_format/json_schema/schema")
        content = compiled.dfa
        sizes.append((compiled.dfa.n_states, getattr(compiled, "largest", "") or "/response_format/json_schema/schema"))
    elif rf is not None and getattr(rf, "type", "text") == "json_object":
        compiled = compile_arguments({"type": "object"}, pointer="/response_format")
        content = compiled.dfa

    def translator(name: fa.Expr = fa.NOTHING, arguments: fa.Expr = fa.NOTHING) -> _Translator:
        return _Translator(fmt, special_ids, {"NAME": name, "ARGUMENTS": arguments, "TEXT": content,
                                              "THINKING": fa.text_without(_think_close_text(fmt))})

    def part(rule: str) -> fa.Expr:
        return translator().rule(rule) if fmt.has(rule) else fa.EMPTY

    per_tool: list[fa.Expr] = []
    if policy.max_calls > 0 and policy.mode != "none":
        index_of = {tool.name: i for i, tool in enumerate(policy.tools)}
        per_tool = []
        for name in policy.allowed:
            i = index_of[name]
            tool = policy.tools[i]
            pointer = join_pointer("/tools", i, "function", "parameters")
            relax = bool(getattr(policy, "relax_non_strict", True)) and not tool.strict
            compiled = compile_arguments(tool.parameters, pointer=pointer, strict=tool.strict, relax=relax,
                                         closed_objects=bool(getattr(policy, "closed_objects", True)),
                                         # strict tools too are written as the model's template writes calls
                                         # (e.g. `", "`); strictness is about validity, not spacing
                                         syntax=syntax, **narrow)
            note_depth(compiled, pointer)
            relaxed += [(name, p, why) for p, why in compiled.relaxed]
            ignored += compiled.ignored_keywords
            sizes.append((compiled.dfa.n_states, getattr(compiled, "largest", "") or pointer))
            per_tool.append(translator(fa.literal(name.encode()), compiled.dfa).rule("call"))

    if thinking and not fmt.has("think"):
        raise UnsupportedSchema(f"tool format {fmt.name!r} has no thinking block", pointer="/chat_template_kwargs/enable_thinking")

    def build(node: tuple) -> fa.Expr:
        tag = node[0]
        if tag == "rule":
            return part(node[1])
        if tag == "call":
            return call
        if tag == "seq":
            return fa.concat(*(build(child) for child in node[1]))
        if tag == "alt":
            return fa.union(*(build(child) for child in node[1]))
        return fa.repeat(build(node[1]), node[2], node[3])  # "rep"

    call = fa.union(*per_tool) if per_tool else fa.NOTHING
    body = build(turn_structure(fmt, policy, thinking))
    return ToolGrammar(body, tuple(relaxed), tuple(ignored), max(sizes)[1] if sizes else "", tuple(shallower))


def turn_structure(fmt: Format, policy: Any, thinking: bool) -> tuple:
    """The shape of a whole assistant turn as data, shared by the mask compiler and the parser.

    Nodes: ("rule", name) — a rule of the format file (absent rules are empty); ("call",) — one call of any allowed
    tool; ("seq", nodes); ("alt", nodes); ("rep", node, lo, hi).
      none:      content text_end
      auto:      (content content_sep)? calls end  |  content text_end     (calls first: preferred when ambiguous)
      required:  calls end
      calls  =   calls_open call (call_sep call){min-1..max-1} calls_close
    with `think` in front when thinking is on; `text_end` is `end` when the format has no `text_end`.
    """
    text_end = ("rule", "text_end") if fmt.has("text_end") else ("rule", "end")
    content_only = ("seq", (("rule", "content"), text_end))
    if policy.mode == "none" or policy.max_calls == 0:
        body: tuple = content_only
    else:
        lo, hi = max(policy.min_calls, 1), policy.max_calls
        call = ("call",)
        calls = ("seq", (("rule", "calls_open"), call, ("rep", ("seq", (("rule", "call_sep"), call)), lo - 1, hi - 1),
                         ("rule", "calls_close")))
        if policy.mode == "auto":
            lead = ("rep", ("seq", (("rule", "content"), ("rule", "content_sep"))), 0, 1)
            body = ("alt", (("seq", (lead, calls, ("rule", "end"))), content_only))
        else:
            body = ("seq", (calls, ("rule", "end")))
    if thinking:
        body = ("seq", (("rule", "think"), body))
    return body


def _free_text(fmt: Format) -> fa.Expr:
    """UTF-8 text that contains none of the format's tag spellings."""
    text = ANY_TEXT
    for spelling in fmt.text_excludes:
        text = fa.intersect(text, fa.text_without(spelling.encode("utf-8")))
    return text


def _think_close_text(fmt: Format) -> bytes:
    for name, text in fmt.special_texts().items():
        if name == "THINK_CLOSE":
            return text.encode("utf-8")
    return b"\x00"


def format_digest(fmt: Format) -> str:
    """A content hash of the format file (part of every index cache key)."""
    return hashlib.sha256(fmt.source.encode("utf-8")).hexdigest()


__all__ = [
    "FORMATS",
    "Format",
    "ToolGrammar",
    "argument_syntax",
    "compile_policy_grammar",
    "format_digest",
    "load_format",
    "resolve_special_ids",
    "turn_structure",
]
