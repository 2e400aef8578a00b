"""Public compile entry points: a JSON Schema or a regex, plus a vocabulary → a cached `TokenIndex`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from constrain import automaton as fa
from constrain.index import DEFAULT_CACHE, IndexCache, TokenIndex
from constrain.schema import SchemaOptions, compile_schema


def _key(kind: str, payload: Any) -> str:
    text = json.dumps([kind, payload], sort_keys=False, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def compile_json_schema(schema: Any, vocab: Any, *, eager: bool = False, cache: IndexCache | None = DEFAULT_CACHE, **options: Any) -> TokenIndex:
    """The token index of the JSON texts valid against `schema`, for `vocab`.

    Args:
        schema: a JSON Schema (dict or bool).
        vocab: a `constrain.Vocabulary`.
        eager: compute every state's mask now (default: on first use).
        cache: where compiled indexes are kept (None: no caching).
        **options: `strict`, `whitespace`, `max_depth`, `max_states`, `timeout_s` (see `constrain.schema.compile_schema`).
    Returns:
        A shareable `TokenIndex`; `index.start()` gives a per-sequence state.
    Raises:
        InvalidSchema / UnsupportedSchema with `.pointer` into the schema.
    """
    SchemaOptions(**options)  # reject unknown options before hashing
    key = _key("json_schema", [schema, sorted(options.items())])

    def build() -> fa.Dfa:
        return compile_schema(schema, **options).dfa

    if cache is None:
        return TokenIndex(build(), vocab, eager=eager)
    return cache.get_or_build(key, vocab, build, eager=eager)


def compile_regex(pattern: str, vocab: Any, *, eager: bool = False, cache: IndexCache | None = DEFAULT_CACHE, max_states: int = 100_000) -> TokenIndex:
    """The token index of the texts that fully match the ECMA-262 regex `pattern`, for `vocab`.

    Raises:
        InvalidSchema: a malformed pattern. UnsupportedSchema: backreferences, lookaround, or over budget.
    """
    from constrain import regex as _regex

    def build() -> fa.Dfa:
        dfa = fa.compile(_regex.regex_expr(pattern), max_states=max_states)
        if dfa.is_empty:
            from constrain.errors import UnsupportedSchema

            raise UnsupportedSchema(f"the regex {pattern!r} matches no string", pointer="")
        return dfa

    if cache is None:
        return TokenIndex(build(), vocab, eager=eager)
    return cache.get_or_build(_key("regex", [pattern, max_states]), vocab, build, eager=eager)
