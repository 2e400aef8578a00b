"""Public compile entry points: a JSON Schema or a regex, plus a vocabulary → a cached `TokenIndex`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from constrain import automaton as fa
from constrain.cache import DEFAULT_CACHE, IndexCache
from constrain.automaton import Deadline
from constrain.index import TokenIndex
from constrain.schema import SchemaOptions, compile_schema


def _key(kind: str, payload: Any) -> str:
    text = json.dumps([kind, payload], sort_keys=False, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _build_index(key: str, vocab: Any, build: Any, eager: bool, cache: IndexCache | None, deadline: Deadline | None) -> TokenIndex:
    # Everything runs under the deadline, and a compile too small to reach one of the automaton's clock reads checks
    # it before and after: a cancelled or expired build raises before the cache keeps anything.
    if deadline is None:
        return TokenIndex(build(), vocab, eager=eager, background=True) if cache is None else cache.get_or_build(key, vocab, build, eager=eager)

    def checked() -> fa.Dfa:
        deadline.check()
        dfa = build()
        deadline.check()
        return dfa

    with deadline.active():
        if cache is None:
            return TokenIndex(checked(), vocab, eager=eager, background=True)
        return cache.get_or_build(key, vocab, checked, eager=eager)


def compile_json_schema(
    schema: Any, vocab: Any, *, eager: bool = False, cache: IndexCache | None = DEFAULT_CACHE, deadline: Deadline | None = None,
    **options: Any,
) -> TokenIndex:
    """The token index of the JSON texts valid against `schema`, for `vocab`.

    Args:
        schema: a JSON Schema (dict or bool).
        vocab: a `constrain.Vocabulary`.
        eager: compute every state's mask now (default: on first use).
        cache: where compiled indexes are kept (None: no caching).
        deadline: a `Deadline` bounding (and able to cancel) the whole compile, index build included.
        **options: `strict`, `whitespace`, `max_depth`, `deepen_recursion`, `shallower`, `max_states`, `timeout_s`,
            `closed_objects`, `relax` (see `constrain.schema.compile_schema`).
    Returns:
        A shareable `TokenIndex`; `index.start()` gives a per-sequence state.
    Raises:
        InvalidSchema / UnsupportedSchema with `.pointer` into the schema; `BudgetExceeded` (code `budget_exceeded`)
        past a budget, `deadline` or on `deadline.cancel()`, and then nothing is cached.
    """
    SchemaOptions(**options)  # reject unknown options before hashing
    key = _key("json_schema", [schema, sorted(options.items())])

    def build() -> fa.Dfa:
        return compile_schema(schema, **options).dfa

    return _build_index(key, vocab, build, eager, cache, deadline)


def compile_regex(
    pattern: str, vocab: Any, *, eager: bool = False, cache: IndexCache | None = DEFAULT_CACHE, max_states: int = 100_000,
    deadline: Deadline | None = None,
) -> TokenIndex:
    """The token index of the texts that fully match the ECMA-262 regex `pattern`, for `vocab`.

    Raises:
        InvalidSchema: a malformed pattern. UnsupportedSchema: backreferences, lookaround, or over budget (the
        state budget, or `deadline` passed or cancelled: code `budget_exceeded`, nothing cached).
    """
    from constrain import regex as _regex

    def build() -> fa.Dfa:
        dfa = fa.compile(_regex.regex_expr(pattern), max_states=max_states)
        if dfa.is_empty:
            from constrain.errors import UnsupportedSchema

            raise UnsupportedSchema(f"the regex {pattern!r} matches no string", pointer="")
        return dfa

    return _build_index(_key("regex", [pattern, max_states]), vocab, build, eager, cache, deadline)


def compile_index(
    policy: Any,
    vocab: Any,
    *,
    tool_format: str = "hermes",
    thinking: bool | None = None,
    eager: bool = False,
    cache: IndexCache | None = DEFAULT_CACHE,
    deadline: Deadline | None = None,
) -> TokenIndex:
    """The token index of every assistant turn `policy` allows, in the native format `tool_format`.

    Args:
        policy: a `constrain.Policy`.
        vocab: the model's `constrain.Vocabulary` (special tokens of the format are looked up in it by text).
        tool_format: one of `constrain.grammar.FORMATS`.
        thinking: the turn starts with the format's thinking block (default: `policy.thinking`, else off).
        eager: compute every state's mask now.
        cache: where compiled indexes are kept (None: no caching).
        deadline: a `Deadline` for the whole compile: every schema (each also keeps its own `timeout_s`), the policy
            automaton and the index build stop once it passes or is cancelled (from any thread). The index's lazy
            `min_tokens` table is built later, outside this call: run `min_tokens_from_start()` under
            `deadline.active()` to bound it too.
    Returns:
        A shareable `TokenIndex`; `index.meta` holds the policy, the format name and what was relaxed.
    Raises:
        InvalidSchema / UnsupportedSchema with pointers into the request (e.g. `/tools/2/function/parameters`);
        `BudgetExceeded` (code `budget_exceeded`) past a budget or `deadline`, or on `deadline.cancel()`, at the
        pointer of the part being compiled then (`/tools` for the policy automaton and the index); nothing is
        cached then.
    """
    from constrain.grammar import compile_policy_grammar, format_digest, load_format

    fmt = load_format(tool_format)
    think = bool(policy.thinking) if thinking is None else bool(thinking)
    key = _key("tools", [policy.key(), tool_format, format_digest(fmt), think])
    box: dict[str, Any] = {}

    def build() -> fa.Dfa:
        grammar = compile_policy_grammar(policy, fmt, vocab.special_tokens, thinking=think)
        box["grammar"] = grammar
        dfa = fa.compile(grammar.expr, max_states=1_000_000, pointer="/tools")
        if dfa.is_empty:
            from constrain.errors import UnsupportedSchema

            raise UnsupportedSchema("the tool policy allows no output at all", pointer="/tools")
        return dfa

    try:
        index = _build_index(key, vocab, build, eager, cache, deadline)
    except fa.BudgetExceeded as err:
        if not err.pointer:  # the index build: it covers the whole policy
            err.pointer = "/tools"
            err.args = (f"{err.message} (at {err.pointer})",)
        raise
    if getattr(index, "meta", None) is None:
        grammar = box.get("grammar")
        index.meta = {
            "policy": policy,
            "tool_format": tool_format,
            "thinking": think,
            "relaxed": grammar.relaxed if grammar else (),
            "ignored_keywords": grammar.ignored if grammar else (),
            "largest_part": grammar.largest if grammar else "",  # named when the index runs out of time
            "shallower": grammar.shallower if grammar else (),  # (pointer, depth) of schemas nested less deeply
        }
    return index
