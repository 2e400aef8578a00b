"""JSON Schema → byte automaton of the JSON texts that are valid instances, in constrain's writing rules.

In: a JSON Schema (dict or bool) and options. Out: an `fa.Expr` / minimal `fa.Dfa`.
The writing rules and every keyword's guarantee are listed in docs/guarantees.md.
"""

from __future__ import annotations

import collections
import json
import dataclasses
import math
import time
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable
from urllib.parse import unquote, urldefrag, urljoin

import numpy as np

from constrain import automaton as fa
from constrain import native as _native
from constrain.errors import InvalidSchema, UnsupportedSchema, join_pointer
from constrain.syntax import ANY_TEXT, ANY_TEXT_ANY_LENGTH, Gemma4Syntax, JsonSyntax, Whitespace, dump_json

DEFAULT_MAX_DEPTH = 3
# A free-form value in plain JSON nests to any depth: its innermost FREE_FORM_WINDOW container kinds are automaton
# states, deeper ones ride on the cursor's stack (`fa.nested_values`: 637 states; nesting at most 3 deep took 642).
# Tokens with this many closing brackets or more are walked with the stack at each step (2 in Phi-3, 9 in Llama 3 and
# Qwen3, 24 in Gemma 4).
FREE_FORM_WINDOW = 3
# A string whose maxLength leaves at least this many characters beyond minLength is counted beside the automaton
# (`fa.counted_chars`) instead of unrolled: more than any token of the supported vocabularies spells (128 bytes at
# most), so one token never crosses a fresh bound (`TokenIndex` checks), and ~4 states a character fewer (a plain
# `maxLength: 65535` string: over the 100k-state budget unrolled, 19 states counted; `format: email` with
# `maxLength: 1024`: 13,935 -> 350).
COUNTED_MIN_CHARS = 512
# A format cut at a length its automaton holds only at a high cost (`formats.counted_format`: hostname's 253 bytes,
# ~24,000 states as a product) is counted the same way when the cut leaves more characters beyond minLength than
# any token of the supported vocabularies spells (128 bytes at most); where counting is on but the bounds leave
# fewer, or minLength passes the narrowed length, the cap is a product with them (exact); else narrowed as
# `formats.format_expr` has it.
COUNTED_FORMAT_MIN_CHARS = 128
# Between COUNTED_FORMAT_MIN_CHARS and COUNTED_MIN_CHARS characters beyond minLength, a pattern's or format's length
# product (`length_bounded`) is built while it holds at most this many states, and the string is counted past that: at
# most 50 words in 500 characters (Github_medium o21115, `^(?:\S+\s+){0,49}\S+$`) is 776,589 states as a product and
# 2,060 counted; `format: email` with `maxLength: 300` stays a product (its states off the cycles saturate).
COUNTED_PRODUCT_STATES = 10_000
# A recursive `$ref` cut at max_depth in an automaton of at most 1/DEEPEN_FROM_SHARE of the state budget is unrolled
# up to DEEPEN_LEVELS levels deeper while that fits in 1/DEEPEN_BUDGET_SHARE of it (`compile_schema`). Of the 603
# JSONSchemaBench schemas with a `$ref` that compile, 38 cut one; 14 of those unroll deeper under these shares
# (Github_trivial o47165: 722 -> 6,734 states, 4 -> 27 ms); of the others, most are automata of over 6,250 states at
# depth 3, which are not tried, and a try that goes over costs up to 0.6 s (Github_medium o74424).
DEEPEN_LEVELS = 2
DEEPEN_BUDGET_SHARE = 4
DEEPEN_FROM_SHARE = 16
# An array whose maxItems leaves at least this many items beyond minItems is counted beside the automaton
# (`counted_array`) instead of unrolled: it ticks on its commas, of which the supported vocabularies' tokens hold 8
# at most, so one token never crosses a fresh bound (`TokenIndex` checks). maxItems 100 of objects with two bounded
# string fields (Github_easy o9842): over the 100k-state budget unrolled, 3,857 states counted.
COUNTED_MIN_ITEMS = 100
# A shorter array is counted too when the copies unrolling would add are heavy (maxItems - minItems times the item's
# estimated automaton, `fa.size`, at least COUNTED_UNROLLED_SIZE) and maxItems - 1 lies beyond the most commas one
# token could count between two items. Schema -> first mask on Llama 3 (session 27, counted and unrolled interleaved,
# medians of 10), arrays of 1..n of the anyOf of k BFCL call objects (k = 1, 2, 3, 5: size 304, 485, 589, 793):
# counted / unrolled 0.78-0.92 from a weight ((n - 1) * size) of 1,216 up (k = 1, n = 5 .. k = 5, n = 8: 0.70), 0.92
# at 970 (k = 2, n = 3), 0.98 at 1,178 and 1.04 at 1,586 (k = 3 and 5, n = 3); parallel_1to5_of_5 (1..5 of k = 5,
# 3,172) 0.92. A token holds at most COUNTED_MOST_COMMAS commas, and one with two or more at most
# COUNTED_COMMA_TOKEN_BYTES bytes (measured on 14 vocabularies: Llama 3, Qwen3, GPT-2, StarCoder 8 commas, Gemma 4 4,
# Tekken and Phi-3 2; such tokens 8 bytes at most: 12 leaves a margin), while two counted commas lie an item and a
# comma apart. `TokenIndex` bounds the ticks per token for its vocabulary and automaton, and refuses a counter it
# could not keep. 2,048 in session 27, back to 4,096 in session 28 (parallel_1to5_of_5, 3,172, unrolled again): its
# counted rows at the last item (a comma-token walk per state first met, 20-90 us) set the per-token p99 of a cold
# index, 70-92 us counted against 6.4-6.7 unrolled on Qwen3 and Gemma 4 (12 replayed walks of 1..5 calls), for 0.46 ms
# of schema -> first mask.
COUNTED_UNROLLED_SIZE = 4096
COUNTED_MOST_COMMAS = 8
COUNTED_COMMA_TOKEN_BYTES = 12
# `uniqueItems` is enforced for items of at most this many distinct values: the automaton keeps which were written
# (2**n sets).
MAX_UNIQUE_VALUES = 8
DEFAULT_MAX_STATES = 100_000
DEFAULT_TIMEOUT_S = 10.0

ANNOTATIONS = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "$schema", "$id", "id", "deprecated",
        "readOnly", "writeOnly", "contentMediaType", "contentEncoding", "$anchor", "$vocabulary",
    }
)
APPLIED = frozenset(
    {
        "type", "enum", "const", "properties", "required", "additionalProperties", "anyOf", "oneOf", "allOf",
        "$ref", "$defs", "definitions", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
        "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
        "exclusiveMaximum", "multipleOf", "minProperties", "maxProperties", "propertyNames", "uniqueItems",
        "not", "patternProperties", "contains", "minContains", "maxContains",
    }
)
# Keywords rewritten into allOf/anyOf parts before merging (see `_desugar`).
DESUGARED = frozenset({"dependencies", "dependentRequired", "dependentSchemas", "if", "then", "else"})
# Drafts whose `$ref` overrides its sibling keywords ("All other properties in a "$ref" object MUST be ignored").
_REF_ALONE_DRAFTS = ("draft3", "draft4", "draft6", "draft7")
NOT_MARK = "#not"  # pushed on the `$ref` stack at each `not`: recursion is counted afresh inside the operand
MAX_NOT_NESTING = 16
# An object's undeclared keys are partitioned by the set of its `patternProperties` they match (`extra_member`): n
# patterns that overlap freely make up to 2^n parts, pairwise disjoint ones n + 1. Only the parts some key reaches are
# kept; an object whose patterns make more than MAX_KEY_REGIONS is refused. (Until session 36 the bound was a count,
# 8 patterns, which refused Github_hard o12335's 19 disjoint ones: 20 parts, 5,598 states, 0.25 s.)
MAX_KEY_REGIONS = 256
# The largest count keyword (`maxLength`, `minItems`, ...) enforced: counted strings and arrays keep their bound in an
# int64 beside the automaton. Past it a bound is `UnsupportedSchema` (no output could reach it anyway).
MAX_COUNT = 2**63 - 1
# Assertion keywords of JSON Schema drafts 4 to 2020-12 that constrain does not enforce: always an error.
UNSUPPORTED = frozenset(
    {
        "unevaluatedProperties", "unevaluatedItems",
        "$dynamicRef", "$dynamicAnchor", "$recursiveRef", "$recursiveAnchor", "contentSchema",
    }
)
# Of those, enforced where `_Compiler.unevaluated` can rewrite them exactly (drafts 2019-09 and 2020-12; older drafts
# do not define them: annotations there).
UNEVALUATED = ("unevaluatedProperties", "unevaluatedItems")
STRICT_KEYWORDS = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "enum", "const", "anyOf", "$ref",
        "$defs", "definitions", "pattern", "format", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "minItems", "maxItems", "minLength", "maxLength",
    }
)
STRICT_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")

def char_length_range(dfa: fa.Dfa) -> tuple[int, int | None]:
    """(fewest, most) code points of the UTF-8 strings `dfa` accepts; most is None when unbounded.

    A transition counts one code point unless its class holds only UTF-8 continuation bytes (0x80-0xBF).
    """
    if dfa.is_empty:
        return 0, 0
    trans = np.asarray(dfa.transitions)
    n, k = trans.shape
    byte_cls = np.asarray(dfa.class_of[: fa.N_BYTES])
    continuation = (np.arange(fa.N_BYTES) >= 0x80) & (np.arange(fa.N_BYTES) <= 0xBF)
    cont = (np.bincount(byte_cls, minlength=k) > 0) & (np.bincount(byte_cls[~continuation], minlength=k) == 0)
    # the live transitions only, state by state: (target, weight) pairs, each edge read once below
    src, cls = np.nonzero(trans >= 0)
    dst, weight = trans[src, cls].tolist(), (~cont[cls]).astype(np.int64).tolist()
    ptr = np.searchsorted(src, np.arange(n + 1)).tolist()
    # fewest: 0/1-weighted shortest path (deque BFS) from start to any accepting state
    inf = 1 << 60
    dist = [inf] * n
    dist[dfa.start] = 0
    queue = collections.deque([dfa.start])
    while queue:
        s = queue.popleft()
        d = dist[s]
        for e in range(ptr[s], ptr[s + 1]):
            t, w = dst[e], weight[e]
            if d + w < dist[t]:
                dist[t] = d + w
                (queue.append if w else queue.appendleft)(t)
    accepting = np.flatnonzero(dfa.accepting).tolist()
    shortest = min(dist[s] for s in accepting)
    # most: longest path in the DAG (None on any cycle: every state is live, so a cycle is reachable and co-reachable)
    indegree = np.bincount(np.asarray(dst, np.int64), minlength=n).tolist()
    order, ready = [], [s for s in range(n) if indegree[s] == 0]
    while ready:
        s = ready.pop()
        order.append(s)
        for e in range(ptr[s], ptr[s + 1]):
            t = dst[e]
            indegree[t] -= 1
            if indegree[t] == 0:
                ready.append(t)
    if len(order) < n:
        return shortest, None
    longest = [-inf] * n
    longest[dfa.start] = 0
    for s in order:
        if longest[s] < 0:
            continue
        for e in range(ptr[s], ptr[s + 1]):
            t = dst[e]
            longest[t] = max(longest[t], longest[s] + weight[e])
    return shortest, max(longest[s] for s in accepting)


class _ProductCapped(fa.BudgetExceeded):
    """A length product past the cap `length_bounded` was given below the state budget (internal: its caller counts
    the string instead)."""


_ANY_STRING: dict[tuple[str, str, int], fa.Dfa] = {}
# any JSON value of plain JSON syntax by (whitespace, depth, state budget): see `_Compiler.any_value`
_ANY_VALUE: dict[tuple[str, int, int], fa.Dfa] = {}


def _any_string(syntax: "JsonSyntax") -> fa.Dfa:
    """The automaton of any string in `syntax`, compiled once per process (it is in almost every schema)."""
    quote = getattr(syntax, "quote", None)
    key = (syntax.name, syntax.whitespace, quote.symbol_id if quote is not None else -1)
    dfa = _ANY_STRING.get(key)
    if dfa is None:
        dfa = _ANY_STRING[key] = fa.compile(syntax.string(ANY_TEXT))
    return dfa


@dataclass
class SchemaOptions:
    """How a schema is compiled. See `compile_schema`."""

    strict: bool = False
    whitespace: Whitespace = "flexible"
    max_depth: int = DEFAULT_MAX_DEPTH
    max_states: int = DEFAULT_MAX_STATES
    timeout_s: float = DEFAULT_TIMEOUT_S
    syntax: JsonSyntax | None = None  # None: JSON with `whitespace`
    relax: bool = False  # skip (and record) assertion keywords constrain cannot enforce; never with strict
    closed_objects: bool = False  # an object without `additionalProperties` takes no undeclared properties
    deepen_recursion: bool = True  # recursion cut at max_depth: deeper while the automaton stays small
    shallower: bool = False  # over the state budget with nesting cut at max_depth: shallower until it fits


@dataclass
class CompiledSchema:
    """The automaton of a schema plus what was ignored on the way (unknown, non-assertion keywords)."""

    dfa: fa.Dfa
    ignored_keywords: list[str] = field(default_factory=list)
    relaxed: list[tuple[str, str]] = field(default_factory=list)  # (pointer, reason) of skipped assertions
    # the deepest keyword whose automaton holds more than half of `dfa`'s states, else the schema (`largest_part`)
    largest: str = ""
    # how deep recursive `$ref`s and free-form values nest where either was cut: `max_depth`, shallower
    # (`shallower`: both) or deeper (`deepen_recursion`: the `$ref`s only; see `compile_schema`), None where neither was
    depth: int | None = None


def compile_schema(schema: Any, *, pointer: str = "", **options: Any) -> CompiledSchema:
    """Compile a JSON Schema to the minimal DFA of its valid instances' texts.

    Args:
        schema: a JSON Schema (dict or bool), drafts 4 to 2020-12 keyword spellings.
        pointer: JSON Pointer of `schema` inside the request (prefixed to every error pointer).
        strict: OpenAI strict mode: the schema must be in the strict subset; output compact.
        whitespace: "flexible" (an optional single space after `,` and `:`) or "compact" (none).
        max_depth: how deep recursive `$ref`s are unrolled, and how deep free-form values (no `type`) nest where
            they cannot nest to any depth on the cursor's stack (`_Compiler.any_value`: under `not`, below a key
            ranking, in a product, in Qwen XML arguments).
        deepen_recursion: when a recursive `$ref` is cut at `max_depth` in an automaton of at most
            1/`DEEPEN_FROM_SHARE` of the state budget, compile again unrolled `max_depth + 1`, `+ 2` (at most
            `DEEPEN_LEVELS` more) while that fits in 1/`DEEPEN_BUDGET_SHARE` of the budget, keeping the deepest that
            fits (budgets of states, not of time: the same schema always gets the same depth, but where the time
            budget runs out first). False: exactly `max_depth`.
        shallower: (off by default: `max_depth` is the caller's) when the automaton is over the state budget (or
            nests too deeply to compile) and it holds recursive `$ref`s or free-form values nested at most
            `max_depth` levels, compile again with `max_depth` 1, 2, ... below it, within the same time budget,
            keeping the deepest that fits: fewer levels of recursion and of free-form nesting, never a value the
            schema rejects (`CompiledSchema.depth` says how many). Not where a `oneOf` subtracts overlapping
            branches (a branch's nesting cut shallower would leave out of the overlap values the other branch
            keeps). False, or none fits: the error at `max_depth`.
        max_states: state budget of every intermediate automaton.
        timeout_s: compile-time budget.
        closed_objects: an object that declares `properties` but says nothing of `additionalProperties` takes no
            undeclared property (a documented narrowing used for tool arguments, whose functions take only the
            declared parameters); a bare `{"type": "object"}` stays free-form.
        relax: skip the assertion keywords constrain cannot enforce (`not`, `if`, `uniqueItems`, ...) and list
            them in `CompiledSchema.relaxed` instead of raising; refused together with `strict`.
        syntax: how values are written (default JSON); `Gemma4Syntax(quote_token_id)` or
            `XmlArgumentsSyntax()` for those tool-call formats' arguments (the root must be an object there).
    Returns:
        `CompiledSchema` with the DFA and the pointers of ignored unknown keywords.
    Raises:
        InvalidSchema: not a valid schema, or outside the strict subset under `strict`.
        UnsupportedSchema: a valid schema constrain cannot enforce exactly, or over budget.
    """
    opts = SchemaOptions(**options)
    if opts.whitespace not in ("flexible", "compact"):
        raise ValueError(f"whitespace must be 'flexible' or 'compact', got {opts.whitespace!r}")
    if opts.strict and opts.relax:
        raise ValueError("relax cannot be combined with strict: strict schemas are never relaxed")
    try:
        return _compile_schema(schema, opts, pointer)
    except RecursionError:
        # the compiler recurses once per level of the schema (and of an `enum`/`const` value): a document nested a
        # few hundred levels deep runs out of Python's stack (fewer, the deeper the caller's stack already is)
        depth, where = _deepest(schema, pointer)
        raise fa.BudgetExceeded(f"compiling the schema ran out of Python's stack: it nests {depth} levels of arrays "
                                f"and objects, the deepest at {where or '/'}", pointer=where) from None


def _deepest(document: Any, pointer: str) -> tuple[int, str]:
    """How many levels of arrays and objects `document` nests, and the JSON Pointer of its deepest one (the first
    found at that depth, `pointer` prefixed)."""
    best, where = 0, pointer
    stack = [(document, pointer, 1)]
    while stack:
        node, at, depth = stack.pop()
        if isinstance(node, (dict, list)):
            if depth > best:
                best, where = depth, at
            items = node.items() if isinstance(node, dict) else enumerate(node)
            stack.extend((value, join_pointer(at, key), depth + 1) for key, value in items)
    return best, where


def _compile_schema(schema: Any, opts: SchemaOptions, pointer: str) -> CompiledSchema:
    """`compile_schema` once its options are checked."""
    if opts.strict:
        opts.whitespace = "compact"
        check_strict(schema, pointer, True)
    deadline = time.monotonic() + opts.timeout_s
    from constrain import formats as _formats

    schema, ref_errors = _with_document_refs(schema, _formats.draft_of(schema), pointer)
    depth = opts.max_depth
    try:
        compiler, dfa, parts = _compile_variants(schema, opts, pointer, deadline, ref_errors, depth)
    except fa.BudgetExceeded as err:
        if not (opts.shallower and getattr(err, "nested", False)):
            raise
        compiler, dfa, parts, depth = _shallower(schema, opts, pointer, deadline, ref_errors, err)
    if (opts.deepen_recursion and depth == opts.max_depth and compiler.cut[0] and not dfa.is_empty
            and dfa.n_states <= opts.max_states // DEEPEN_FROM_SHARE):
        # a recursive `$ref` was cut at max_depth in a small automaton: deeper while it stays small (`DEEPEN_*`)
        small = dataclasses.replace(opts, max_states=max(1, opts.max_states // DEEPEN_BUDGET_SHARE))
        for depth in range(opts.max_depth + 1, opts.max_depth + 1 + DEEPEN_LEVELS):
            if time.monotonic() > deadline:
                break
            try:
                deeper = _compile_variants(schema, small, pointer, deadline, ref_errors, depth)
            except (fa.BudgetExceeded, UnsupportedSchema):
                break
            compiler, dfa, parts = deeper
            depth += 1
            if not compiler.cut[0]:
                break  # (nothing cut any more: the recursion ends by itself)
    if dfa.is_empty:
        universe = (
            "; under 'not', 'if' and 'maxContains' an object takes at most one key the schema does not name, and"
            " fractions at most 15 digits" if compiler._universe_cache else ""
        )
        raise UnsupportedSchema(
            "no JSON value satisfies this schema under constrain's writing rules"
            f" (recursion and free-form nesting are bounded at max_depth={opts.max_depth}{universe})",
            pointer=pointer,
        )
    return CompiledSchema(dfa, sorted(set(compiler.ignored)), sorted(set(compiler.relaxed)),
                          largest_part(parts, dfa.n_states, pointer),
                          depth if compiler.cut[0] or compiler.free_nesting[0] else None)


def _shallower(schema: Any, opts: SchemaOptions, pointer: str, deadline: float, ref_errors: dict[str, Exception],
               err: fa.BudgetExceeded) -> tuple["_Compiler", fa.Dfa, list[tuple[int, str]], int]:
    """The compile with recursive `$ref`s and free-form values nested fewer than `max_depth` levels, the most that
    fits the budgets (`compile_schema`'s `shallower`), and that depth; else `err` (the error at max_depth) again.

    Tried from 1 level up, each deeper one only after the one before fits (a deeper unrolling holds every state of
    a shallower one, and the failed compile at max_depth may have left little of the time budget: a first try at
    max_depth - 1 that ran out of time would give up where 1 level fits)."""
    best = None
    for depth in range(1, opts.max_depth):
        if time.monotonic() > deadline:
            break
        try:
            compiler, dfa, parts = _compile_variants(schema, dataclasses.replace(opts, max_depth=depth), pointer,
                                                     deadline, ref_errors, depth)
        except UnsupportedSchema:  # (BudgetExceeded included)
            break
        if compiler.subtracted[0]:
            break  # a `oneOf` minus its overlaps: shallower branches could accept a value valid in two
        if not (compiler.cut[0] or compiler.free_nesting[0]):
            return compiler, dfa, parts, depth  # (nothing cut at this depth: deeper is the same automaton)
        if not dfa.is_empty:
            best = (compiler, dfa, parts, depth)
    if best is None:
        raise err
    return best


def _compile_variants(schema: Any, opts: SchemaOptions, pointer: str, deadline: float,
                      ref_errors: dict[str, Exception], ref_depth: int) -> tuple["_Compiler", fa.Dfa, list[tuple[int, str]]]:
    """The compiler and DFA of `schema` with recursive `$ref`s unrolled `ref_depth` times. Long maxLengths counted and
    free-form values nested on a stack beside the automaton where they can be; where two meet in a product, or one
    lies beside an alternative that starts alike (the markers cannot be folded), the schema is compiled again within
    the same time budget: free-form values nested at most max_depth (if it made any; also when it is over the state
    budget with them), then without counters either."""
    made: list[_Compiler] = []
    for counters, stack in ((True, True), (True, False), (False, False)):
        if stack is False and counters and not (made and made[-1].stacked[0]):
            continue  # (no free-form value was nested on the stack: the same compile again)
        try:
            compiler, dfa, parts = _compile_with(schema, opts, pointer, deadline, counters=counters, stack=stack,
                                                 made=made, ref_errors=ref_errors, ref_depth=ref_depth)
        except fa.CountedProduct:
            continue
        except fa.BudgetExceeded as err:
            # over the state budget with deep values, try without (the stack adds a few hundred states: Github_hard
            # o82151 peaks at 26,493 states with it, 25,949 without)
            if stack and made[-1].stacked[0] and time.monotonic() < deadline:
                continue
            # (whether a shallower compile may fit: `_shallower`)
            err.nested = any(c.cut[0] or c.recursive[0] or c.free_nesting[0] for c in made)
            raise
        if counters and fa.has_counters(dfa):
            try:
                fa.contract_counters(dfa)
            except UnsupportedSchema:
                continue
        break
    return compiler, dfa, parts


def _compile_with(schema: Any, opts: SchemaOptions, pointer: str, deadline: float, *,
                  counters: bool, stack: bool = False, made: list | None = None,
                  ref_errors: dict[str, Exception] | None = None,
                  ref_depth: int | None = None) -> tuple["_Compiler", fa.Dfa, list[tuple[int, str]]]:
    """The compiler and DFA of `schema`, by `deadline` (`time.monotonic()`); `counters`: long `maxLength`s counted
    beside the automaton where they can be (see `_Compiler.string`); `stack` (with counters): free-form values nested
    to any depth (`any_value`); `ref_errors` as `_with_document_refs` returns them; recursive `$ref`s unrolled
    `ref_depth` times (default max_depth). The compiler is also appended to `made`."""
    compiler = _Compiler(schema, opts, pointer)
    compiler.ref_errors = ref_errors or {}
    compiler.ref_limit = opts.max_depth if ref_depth is None else ref_depth
    compiler.deadline = deadline
    compiler.counters = counters
    compiler.stack = counters and stack
    if made is not None:
        made.append(compiler)
    expr = compiler.value(schema, pointer, ())
    parts: list[tuple[int, str]] = []
    dfa = fa.compile(expr, max_states=opts.max_states, deadline=compiler.deadline, pointer=pointer, pointers=compiler.pointers, parts=parts)
    return compiler, dfa, parts


def _finite_texts(dfa: fa.Dfa, limit: int) -> list[bytes] | None:
    """Every text `dfa` accepts, if they are at most `limit` (None if more, or infinitely many)."""
    if dfa.is_empty:
        return []
    table = np.asarray(dfa.transitions)
    class_of = np.asarray(dfa.class_of)
    if len(class_of) > fa.N_BYTES and (table[:, np.unique(class_of[fa.N_BYTES:])] >= 0).any():
        return None  # special symbols: not a text
    bytes_of = [np.flatnonzero(class_of[: fa.N_BYTES] == c).tolist() for c in range(table.shape[1])]
    out: list[bytes] = []
    stack = [(int(dfa.start), b"", frozenset())]
    while stack:
        state, text, on_path = stack.pop()
        if state in on_path:
            return None  # a cycle: the automaton is trimmed, so infinitely many texts
        on_path = on_path | {state}
        if dfa.accepting[state]:
            out.append(text)
        for c in np.flatnonzero(table[state] >= 0).tolist():
            for byte in bytes_of[c]:
                stack.append((int(table[state, c]), text + bytes([byte]), on_path))
        if len(out) > limit or len(out) + len(stack) > limit * 64:
            return None
    return sorted(out)


# Keywords whose values are JSON data, not subschemas: an `id` key inside them declares nothing.
_DATA_KEYWORDS = frozenset({"enum", "const", "examples", "default"})
# Keywords whose value maps names to schemas: a name there is no keyword (a property may be called `default`).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas",
                          "dependencies"})


# Per draft, the keywords whose values are subschemas, as python-jsonschema's `referencing` crawls a document for
# `$id`s (an `$id` anywhere else, in an unknown keyword's value say, declares nothing): (in the value, in the items
# of an array, in the values of an object). `items` (either form) is added from draft 2019-09 back, `dependencies`
# (schema values) and up to draft 4 a schema-valued `additionalItems`/`additionalProperties` in `_subschemas`.
_LEGACY_SUBVALUES = frozenset({"definitions", "patternProperties", "properties"})
_SUBSCHEMA_KEYWORDS: dict[str, tuple[frozenset[str], frozenset[str], frozenset[str]]] = {
    "draft2020-12": (frozenset({"additionalProperties", "contains", "contentSchema", "else", "if", "items", "not",
                                "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties"}),
                     frozenset({"allOf", "anyOf", "oneOf", "prefixItems"}),
                     frozenset({"$defs", "definitions", "dependentSchemas", "patternProperties", "properties"})),
    "draft2019-09": (frozenset({"additionalItems", "additionalProperties", "contains", "contentSchema", "else", "if",
                                "not", "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties"}),
                     frozenset({"allOf", "anyOf", "oneOf"}),
                     frozenset({"$defs", "definitions", "dependentSchemas", "patternProperties", "properties"})),
    "draft7": (frozenset({"additionalItems", "additionalProperties", "contains", "else", "if", "not", "propertyNames",
                          "then"}), frozenset({"allOf", "anyOf", "oneOf"}), _LEGACY_SUBVALUES),
    "draft6": (frozenset({"additionalItems", "additionalProperties", "contains", "not", "propertyNames"}),
               frozenset({"allOf", "anyOf", "oneOf"}), _LEGACY_SUBVALUES),
    "draft4": (frozenset({"not"}), frozenset({"allOf", "anyOf", "oneOf"}), _LEGACY_SUBVALUES),
    "draft3": (frozenset(), frozenset({"extends"}), _LEGACY_SUBVALUES),
}


# Keywords that apply their subschemas to the value itself (the rest descend into its members, items or names).
_IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies",
                       "extends"})


def _in_place_loop(root: Any, draft: str) -> str | None:
    """The JSON Pointer (in `root`) of a `$ref` that leads back to itself through in-place keywords only (`$ref`,
    `allOf`, `not`, `if`, ...), without descending into the value, in a subschema the root reaches; else None.
    Such a schema never finishes validating anything ("the behavior is undefined", JSON Schema 2020-12 core 9.4.1;
    python-jsonschema recurses until its stack runs out). Unused `$defs` are not visited."""
    def edges(node: dict, where: str) -> list[tuple[bool, Any, str]]:
        """(in place?, subschema, its pointer) for every subschema of `node`, its `$ref` target included."""
        out: list[tuple[bool, Any, str]] = []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#") and (not ref[1:] or ref[1:].startswith("/")):
            target = _node_at(root, ref[1:])
            if isinstance(target, dict):
                out.append((True, target, ref[1:]))
            if draft in _REF_ALONE_DRAFTS:
                return out  # (its siblings are not keywords there)
        for path, sub in _subschemas(node, draft):
            if path[0] not in ("$defs", "definitions") and isinstance(sub, dict):
                out.append((path[0] in _IN_PLACE, sub, join_pointer(where, *path)))
        deps = node.get("dependencies")
        if draft in ("draft2019-09", "draft2020-12") and isinstance(deps, dict):
            out += [(True, sub, join_pointer(where, "dependencies", k)) for k, sub in deps.items() if isinstance(sub, dict)]
        return out

    if not isinstance(root, dict):
        return None
    # every subschema the root reaches, then a depth-first search of the in-place edges from each for a cycle
    reached: dict[int, tuple[dict, str]] = {id(root): (root, "")}
    todo = [(root, "")]
    while todo:
        node, where = todo.pop()
        for _, sub, at in edges(node, where):
            if id(sub) not in reached:
                reached[id(sub)] = (sub, at)
                todo.append((sub, at))
    done: set[int] = set()
    for start, at in reached.values():
        if id(start) in done:
            continue
        path = [(start, at, iter([e for e in edges(start, at) if e[0]]))]
        on_path = {id(start)}
        while path:
            node, where, rest = path[-1]
            step = next(rest, None)
            if step is None:
                path.pop()
                on_path.discard(id(node))
                done.add(id(node))
                continue
            _, sub, sub_at = step
            if id(sub) in on_path:
                # the loop runs from sub's place on the path to here: name its first `$ref`
                start_at = [id(n) for n, _, _ in path].index(id(sub))
                return join_pointer(next(w for n, w, _ in path[start_at:] if isinstance(n.get("$ref"), str)), "$ref")
            if id(sub) not in done:
                on_path.add(id(sub))
                path.append((sub, sub_at, iter([e for e in edges(sub, sub_at) if e[0]])))
    return None


def _subschemas(node: dict, draft: str) -> list[tuple[tuple[str | int, ...], Any]]:
    """The subschemas of `node` under `draft` that `referencing` crawls for `$id`s: (path from node, subschema)."""
    in_value, in_array, in_values = _SUBSCHEMA_KEYWORDS[draft]
    out: list[tuple[tuple[str | int, ...], Any]] = []
    for key, value in node.items():
        if key in in_value or (key == "items" and draft != "draft2020-12"):
            if isinstance(value, list) and key == "items":
                out.extend(((key, i), v) for i, v in enumerate(value))
            else:
                out.append(((key,), value))
        elif key in in_array and isinstance(value, list):
            out.extend(((key, i), v) for i, v in enumerate(value))
        elif key in in_values and isinstance(value, dict):
            out.extend(((key, k), v) for k, v in value.items())
        elif key == "dependencies" and draft not in ("draft2019-09", "draft2020-12") and isinstance(value, dict):
            out.extend(((key, k), v) for k, v in value.items() if isinstance(v, dict))
        elif key in ("additionalItems", "additionalProperties") and draft in ("draft3", "draft4") and isinstance(value, dict):
            out.append(((key,), value))
    return out


def _join_uri(base: str, ref: str) -> str:
    """`ref` resolved against the base URI `base` (RFC 3986, as `referencing` does; a fragment alone keeps the base
    whatever its scheme, `urn:` included)."""
    if ref.startswith("#"):
        return base + ref
    return urljoin(base, ref) if base else ref


def _pointer_ref(pointer: str) -> str:
    """A `$ref` to `pointer` in the document: its tokens are unquoted when read (`_Compiler.lookup`)."""
    return "#" + pointer.replace("%", "%25")


def _plain_refs(root: Any) -> bool:
    """Whether no object below `root` declares an `$id` or `id` (a string) and every `$ref` is a JSON Pointer
    fragment (`#` or `#/...`): then `lookup` resolves every `$ref` against the root as it is (one quick walk; objects
    and arrays may be subclasses of dict and list, as the server's frozen ones are)."""
    stack: list[tuple[Any, bool]] = [(root, False)]  # (node, a map of schemas?)
    pop, push = stack.pop, stack.append
    while stack:
        node, schemas = pop()
        if isinstance(node, list):
            for v in node:
                if isinstance(v, (dict, list)):
                    push((v, False))
        elif not isinstance(node, dict):
            continue
        elif schemas:
            for v in node.values():
                if isinstance(v, (dict, list)):
                    push((v, False))
        else:
            ref = node.get("$ref")
            if isinstance(ref, str) and ref != "#" and not ref.startswith("#/"):
                return False
            if node is not root and (isinstance(node.get("$id"), str) or isinstance(node.get("id"), str)):
                return False
            for k, v in node.items():
                if k not in _DATA_KEYWORDS and isinstance(v, (dict, list)):  # (a scalar holds neither)
                    push((v, k in _SCHEMA_MAPS))
    return True


def _with_document_refs(root: Any, draft: str, pointer: str = "") -> tuple[Any, dict[str, Exception]]:
    """`root` with every `$ref` that an `$id` scopes, or that names a schema by URI, rewritten as a JSON Pointer into
    `root` (`#/...`), as `referencing` resolves it: `$id`s (`id` in drafts 3-4) set the base URI of their subschemas
    (up to draft 7 not beside a `$ref`, which stands alone), `$anchor`s and `$dynamicAnchor`s (`$id: "#name"` up to
    draft 7) name subschemas within their resource. `root` itself when no `$id` below the root declares anything and
    every `$ref` is a JSON Pointer fragment (`lookup` resolves those against the root).

    A `$ref` that does not resolve in the document keeps its text when it names another document (`lookup` refuses
    it), else becomes a marker `lookup` raises the returned error for. `pointer`: where `root` sits in the request
    (the prefix of an error's pointer).
    """
    if _plain_refs(root):
        return root, {}
    draft = draft if draft in _SUBSCHEMA_KEYWORDS else "draft2020-12"
    legacy = draft in _REF_ALONE_DRAFTS
    id_key = "id" if draft in ("draft3", "draft4") else "$id"
    # the resources: absolute URI -> pointer (None: declared twice), and by pointer the base URI each sets; anchors
    # by (resource URI, name) -> pointers
    resources: dict[str, str | None] = {}
    base_at: dict[str, str] = {}
    anchors: dict[tuple[str, str], list[str]] = {}
    stack: list[tuple[Any, str, str]] = [(root, "", "")]
    while stack:
        node, at, base = stack.pop()
        if not isinstance(node, dict):
            continue
        declared = node.get(id_key)
        if isinstance(declared, str):
            try:
                uri, fragment = urldefrag(declared)
                joined = urldefrag(_join_uri(base, uri))[0] if uri else base
            except ValueError as err:  # (an IPv6 host without its closing bracket, ...)
                against = f" (against the base URI {base!r})" if base else ""
                raise InvalidSchema(f"{id_key!r} {declared!r}{against} is not a URI reference: {err}",
                                    pointer=pointer + join_pointer(at, id_key)) from None
            if uri and not (legacy and "$ref" in node):
                base = joined
                resources[base] = at if resources.get(base, at) == at else None
                base_at[at] = base
            if legacy and fragment and not uri:
                anchors.setdefault((base, fragment), []).append(at)
        if not legacy:
            for key in ("$anchor", "$dynamicAnchor") if draft == "draft2020-12" else ("$anchor",):
                if isinstance(node.get(key), str):
                    anchors.setdefault((base, node[key]), []).append(at)
        stack.extend((child, join_pointer(at, *path), base) for path, child in _subschemas(node, draft))
    resources.setdefault("", "")  # a document without `$id`: refs resolve against it
    errors: dict[str, Exception] = {}

    def resolved(ref: str, base: str) -> str:
        """`ref` (at base URI `base`) as a pointer into `root`, itself when it names another document (`lookup`
        refuses it), or a marker of its error."""
        try:
            uri, fragment = urldefrag(_join_uri(base, ref))
        except ValueError as err:
            against = f" (against the base URI {base!r})" if base else ""
            error: Exception = InvalidSchema(f"'$ref' {ref!r}{against} is not a URI reference: {err}")
        else:
            if uri not in resources:
                return ref
            start = resources[uri]
            if start is None:
                error = UnsupportedSchema(f"'$ref' {ref!r}: two subschemas declare the URI {uri!r}")
            elif fragment and not fragment.startswith("/"):
                where = anchors.get((uri, unquote(fragment)), [])
                if len(where) == 1:
                    return _pointer_ref(where[0])
                error = (UnsupportedSchema(f"'$ref' {ref!r}: the anchor is declared twice ({where[0] or '/'}, "
                                           f"{where[1]})") if where else
                         InvalidSchema(f"'$ref' {ref!r} does not resolve: no subschema of {uri or 'the document'} "
                                       "declares that anchor"))
            else:
                target = _pointer_ref(start) + fragment
                if _node_at(root, target[1:]) is not _MISSING:
                    return target
                error = InvalidSchema(f"'$ref' {ref!r} does not resolve: {uri or 'the document'} has nothing at "
                                      f"{fragment!r}")
        marker = f"#\x00{len(errors)}"  # (no JSON Pointer: '#' then a NUL)
        errors[marker] = error
        return marker

    # a copy of the document, its `$ref`s resolved where they sit; the values of data keywords shared, not copied
    copy = _shallow(root)
    walk: list[tuple[Any, Any, str, str, bool]] = [(root, copy, "", base_at.get("", ""), False)]  # (.., a map?)
    while walk:
        node, out, at, base, schemas = walk.pop()
        if isinstance(node, list):
            for i, child in enumerate(node):
                out[i] = _shallow(child)
                walk.append((child, out[i], join_pointer(at, i), base, False))
            continue
        if not isinstance(node, dict):
            continue
        if not schemas:  # (`properties` and the like: every value is a schema, whatever its name)
            base = base_at.get(at, base)
        for k, child in node.items():
            if schemas or k not in _DATA_KEYWORDS:
                out[k] = _shallow(child)
                walk.append((child, out[k], join_pointer(at, k), base, not schemas and k in _SCHEMA_MAPS))
        if not schemas and isinstance(node.get("$ref"), str):
            out["$ref"] = resolved(node["$ref"], base)
    return copy, errors


_MISSING = object()


def _node_at(root: Any, path: str) -> Any:
    """The value of `root` at the JSON Pointer `path` (URI-encoded tokens, as a `$ref`'s fragment writes them), or
    `_MISSING`."""
    node = root
    for token in path.split("/")[1:]:
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _shallow(value: Any) -> Any:
    """A one-level copy of a JSON object or array (a plain dict or list, whatever subclass it was); other values as
    they are."""
    if isinstance(value, dict):
        return dict(value)
    return list(value) if isinstance(value, list) else value


def _first_symbols(dfa: fa.Dfa) -> frozenset:
    """The symbols a text of `dfa` may start with: bytes as ints, special symbols as ("special", id)."""
    if dfa.is_empty:
        return frozenset()
    live = np.asarray(dfa.transitions)[dfa.start][np.asarray(dfa.class_of)] >= 0  # per symbol
    return frozenset(int(x) if x < 256 else ("special", dfa.specials[x - 256]) for x in np.flatnonzero(live))


def largest_part(parts: list[tuple[int, str]], states: int, pointer: str) -> str:
    """Where most of a schema's automaton comes from: the deepest pointed part that holds more than half of its
    `states` (a `pattern` rather than the property holding it), else `pointer`. Named when a step after the
    schema's own compile (the token index) runs out of time."""
    major = [p for n, p in parts if 2 * n > states]
    return max(major, key=lambda p: (p.count("/"), len(p))) if major else pointer


# ---------------------------------------------------------------------------
# strict mode (OpenAI Structured Outputs subset)
# ---------------------------------------------------------------------------


def _strict_error(message: str, pointer: str) -> InvalidSchema:
    return InvalidSchema(message, pointer=pointer, code="invalid_function_parameters")


def check_strict(node: Any, pointer: str = "", is_root: bool = True) -> None:
    """Raise `InvalidSchema` (code `invalid_function_parameters`) unless `node` is in OpenAI's strict subset."""
    if not isinstance(node, dict):
        raise _strict_error("strict mode needs every schema to be an object", pointer)
    for key in node:
        if key in ANNOTATIONS:
            continue
        if key not in STRICT_KEYWORDS:
            raise _strict_error(f"keyword '{key}' is not supported in strict mode", join_pointer(pointer, key))
    if is_root:
        if "anyOf" in node:
            raise _strict_error("the root schema must not be 'anyOf' in strict mode", join_pointer(pointer, "anyOf"))
        if node.get("type") != "object":
            raise _strict_error("the root schema must have type 'object' in strict mode", join_pointer(pointer, "type"))
    types = node.get("type")
    type_list = types if isinstance(types, list) else [types]
    if "object" in type_list or "properties" in node:
        if node.get("additionalProperties", None) is not False:
            raise _strict_error("'additionalProperties' is required to be supplied and to be false", pointer)
        props = node.get("properties", {})
        required = node.get("required", [])
        missing = [k for k in props if k not in required]
        if missing:
            raise _strict_error(
                f"'required' is required to be supplied and to be an array including every key in properties; missing {missing[0]!r}",
                join_pointer(pointer, "required"),
            )
    fmt = node.get("format")
    if fmt is not None and fmt not in STRICT_FORMATS:
        raise _strict_error(f"format '{fmt}' is not supported in strict mode", join_pointer(pointer, "format"))
    for key in ("properties", "$defs", "definitions"):
        for name, sub in (node.get(key) or {}).items():
            check_strict(sub, join_pointer(pointer, key, name), False)
    if "items" in node:
        check_strict(node["items"], join_pointer(pointer, "items"), False)
    for i, sub in enumerate(node.get("anyOf") or []):
        check_strict(sub, join_pointer(pointer, "anyOf", i), False)


# ---------------------------------------------------------------------------
# the compiler
# ---------------------------------------------------------------------------


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    raise TypeError(f"not a JSON value: {value!r}")


def _json_equal(a: Any, b: Any) -> bool:
    """JSON Schema equality: numbers by value, booleans distinct from numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _common_values(a: list[Any], b: list[Any]) -> list[Any]:
    """The values of `a` equal (`_json_equal`) to some value of `b`, in `a`'s order."""
    return [x for x in a if any(_json_equal(x, y) for y in b)]


def syntax_name(syntax: JsonSyntax) -> str:
    """The syntax's name where keys are written as JSON strings ("json"), whatever the whitespace."""
    return syntax.name if type(syntax) is JsonSyntax else f"{syntax.name} ({type(syntax).__name__})"


def _listed_strings(node: Any) -> list[str]:
    """The strings in every `const` and `enum` inside `node`."""
    out: list[str] = []
    if isinstance(node, list):
        for x in node:
            out += _listed_strings(x)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "const" and isinstance(value, str):
                out.append(value)
            elif key == "enum" and isinstance(value, list):
                out += [v for v in value if isinstance(v, str)]
            elif key not in ("default", "examples"):
                out += _listed_strings(value)
    return out


def ranked_names(nodes: Any, rank: dict[str, int] | None, lookup: Callable[[str], Any]) -> dict[str, int]:
    """`rank` extended by every property name `nodes` mention, in the order of first mention: `properties`,
    `required`, strings listed in `propertyNames`, dependency names, the keys of objects of two keys or more inside
    `enum` and `const` values; local `$ref`s followed through `lookup` (None: not followed). The key order below a `oneOf` or `not`
    (docs/guarantees.md), shared with the corpus writer."""
    out = dict(rank or {})
    seen: set[int] = set()

    def literal_keys(value: Any) -> None:
        # a ranked object takes at most one key the ranking does not name: an object value of two keys or more needs
        # slots for them (one key fits as the unnamed one, and every slot grows the universe of `not`)
        if isinstance(value, dict):
            for name, inner in value.items():
                if len(value) > 1:
                    out.setdefault(name, len(out))
                literal_keys(inner)
        elif isinstance(value, list):
            for inner in value:
                literal_keys(inner)

    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
            return
        if not isinstance(node, dict) or id(node) in seen:
            return
        seen.add(id(node))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            visit(lookup(ref))
        for name in node["properties"] if isinstance(node.get("properties"), dict) else ():
            out.setdefault(name, len(out))
        for name in node["required"] if isinstance(node.get("required"), list) else ():
            if isinstance(name, str):
                out.setdefault(name, len(out))
        if "propertyNames" in node:  # the names it lists may all be keys: give them slots too
            for name in _listed_strings(node["propertyNames"]):
                out.setdefault(name, len(out))
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            deps = node.get(key)
            for name, need in deps.items() if isinstance(deps, dict) else ():
                out.setdefault(name, len(out))
                for other in need if isinstance(need, list) else ():
                    if isinstance(other, str):
                        out.setdefault(other, len(out))
        for key, value in node.items():
            if key in ("enum", "const"):
                literal_keys(value)
            elif key not in ("examples", "default"):
                visit(value)

    visit(nodes)
    return out


def mentions_not(node: Any) -> bool:
    """Whether a `not` (or a keyword rewritten with one) that needs the universe (`_Compiler.complement`) occurs
    anywhere in `node`: a `not` or an `if` whose operand has an exact positive form (`negated`) counts only by what
    that form holds."""
    if isinstance(node, list):
        return any(mentions_not(x) for x in node)
    if not isinstance(node, dict):
        return False
    for k, v in node.items():
        if k in ("enum", "const"):
            continue
        if k == "maxContains":
            return True
        if k in ("not", "if"):
            positive = negated(v)
            if positive is None or mentions_not(positive):
                return True
            if k == "not":
                continue  # the operand itself is not compiled: its positive form is
        if mentions_not(v):
            return True
    return False


_JSON_TYPES = ("null", "boolean", "object", "array", "string", "number")


# Kinds of JSON values, for reading off a schema which ones it admits: numbers split into integral and fractional.
_KINDS = frozenset(("null", "boolean", "object", "array", "string", "integral", "fractional"))
_KINDS_OF_TYPE = {"null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
                  "string": {"string"}, "integer": {"integral"}, "number": {"integral", "fractional"}}
# How deep `disjoint_branches` follows a required property's schemas (a discriminator's value, its own properties).
_DISJOINT_DEPTH = 3


def _kind_of(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset(("null",))
    if isinstance(value, bool):
        return frozenset(("boolean",))
    if isinstance(value, int):
        return frozenset(("integral",))
    if isinstance(value, float):  # (1.0 is an integer from draft 6 on, not in draft 4: either)
        return frozenset(("integral", "fractional")) if value.is_integer() else frozenset(("fractional",))
    if isinstance(value, str):
        return frozenset(("string",))
    return frozenset(("array",)) if isinstance(value, list) else frozenset(("object",))


class _Facts:
    """What every value valid against a conjunction of schemas has, read off a few keywords (everything else may
    only narrow it further): its kinds, the only values it may be (None: not a finite list), and for objects the
    names it requires, the names it forbids and the schemas a present name's value meets."""

    __slots__ = ("kinds", "values", "required", "forbidden", "closed", "props", "visits")

    # Subschemas read at most (a DAG of `allOf`s over `$ref`s can name exponentially many paths); the facts of the
    # ones read hold whatever the others add, so stopping early only weakens them.
    _MAX_VISITS = 2048

    def __init__(self) -> None:
        self.visits = self._MAX_VISITS
        self.kinds: frozenset[str] = _KINDS
        self.values: list[Any] | None = None
        self.required: set[str] = set()
        self.forbidden: set[str] = set()
        self.closed: list[set[str]] = []  # per closed part (additionalProperties false, no patternProperties): its names
        self.props: dict[str, list[Any]] = {}

    def add(self, schema: Any, lookup: Callable[[str], Any], seen: frozenset[str] = frozenset()) -> None:
        """Conjoin `schema` (a `$ref` followed through `lookup`, its siblings left out: they only narrow)."""
        self.visits -= 1
        if self.visits < 0:
            return
        if schema is False:
            self.kinds = frozenset()
            return
        if not isinstance(schema, dict):
            return
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref not in seen:
                self.add(lookup(ref), lookup, seen | {ref})
            return
        t = schema.get("type")
        named = t if isinstance(t, list) else [t] if isinstance(t, str) else None
        if named is not None:
            self.kinds &= frozenset(k for n in named for k in _KINDS_OF_TYPE.get(n, _KINDS))
        listed = schema["enum"] if isinstance(schema.get("enum"), list) else [schema["const"]] if "const" in schema else None
        if listed is not None:
            self.values = listed if self.values is None else _common_values(self.values, listed)
        if self.values is not None:
            self.kinds &= frozenset(k for v in self.values for k in _kind_of(v))
        if isinstance(schema.get("required"), list):
            self.required.update(n for n in schema["required"] if isinstance(n, str))
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for name, sub in props.items():
            if sub is False or isinstance(sub, dict) and "not" in sub and negated(sub["not"]) is False:
                self.forbidden.add(name)  # (`{"not": {}}` too)
            else:
                self.props.setdefault(name, []).append(sub)
        if schema.get("additionalProperties") is False and not schema.get("patternProperties"):
            self.closed.append(set(props))
        for part in schema.get("allOf") if isinstance(schema.get("allOf"), list) else ():
            self.add(part, lookup, seen)
        if "not" in schema:
            positive = negated(schema["not"])
            if positive is not None and positive is not True:
                self.add(positive, lookup, seen)

    def forbids(self, name: str) -> bool:
        return name in self.forbidden or any(name not in names for names in self.closed)


def _facts(schemas: list[Any], lookup: Callable[[str], Any], memo: dict[tuple[int, ...], _Facts]) -> _Facts:
    key = tuple(id(s) for s in schemas)  # (the schemas outlive the call that memoises them)
    facts = memo.get(key)
    if facts is None:
        facts = memo[key] = _Facts()
        for s in schemas:
            facts.add(s, lookup)
    return facts


def _disjoint(a: _Facts, b: _Facts, lookup: Callable[[str], Any], depth: int, memo: dict) -> bool:
    """Whether no value has both `a` and `b` (False when the keywords read do not show it)."""
    both = a.kinds & b.kinds
    if not both:
        return True
    if a.values is not None and b.values is not None and not _common_values(a.values, b.values):
        return True
    if not both <= {"object"}:
        return False
    for name in a.required | b.required:  # present in every value of one side
        if a.forbids(name) or b.forbids(name):
            return True
        if depth and name in a.props and name in b.props and _disjoint(
                _facts(a.props[name], lookup, memo), _facts(b.props[name], lookup, memo), lookup, depth - 1, memo):
            return True
    return False


# `disjoint_branches` reads a oneOf of at most this many branches (a merged cross product can hold hundreds: the
# pairs grow as their square).
_DISJOINT_MAX_BRANCHES = 64


def disjoint_branches(rest: Any, branches: list[Any], lookup: Callable[[str], Any]) -> bool:
    """Whether no value is valid against two of `branches` (each with `rest`), read off the keywords: different
    kinds (`type`, `enum`, `const`), no common listed value, or for objects a name one branch requires that the other
    forbids (`additionalProperties: false` without `patternProperties`, or a `false` property) or whose value the two
    keep apart (a discriminator: `const`s, types, recursively). Only `rest`'s kinds, listed values and required
    names are read (as the compiler's merged schema and the corpus writer's conjunction both give them). Such a
    `oneOf` is its `anyOf`: it needs no key ranking and no products (docs/guarantees.md). False when unsure, and
    beyond `_DISJOINT_MAX_BRANCHES` branches; `lookup` resolves a `$ref` (None: unknown)."""
    if len(branches) > _DISJOINT_MAX_BRANCHES:
        return False
    memo: dict[tuple[int, ...], _Facts] = {}
    around = _facts([rest], lookup, memo)
    sides = []
    for branch in branches:
        f = _Facts()
        f.add(branch, lookup)
        f.kinds &= around.kinds
        f.required |= around.required
        if around.values is not None:
            f.values = around.values if f.values is None else _common_values(f.values, around.values)
        sides.append(f)
    return all(_disjoint(sides[i], sides[j], lookup, _DISJOINT_DEPTH, memo)
               for i in range(len(sides)) for j in range(i + 1, len(sides)))


def negated(operand: Any) -> Any:
    """The exact positive form of `not: operand`, where one needs no complement, else None. True and False stand for
    every value and none.

    - not {not: X} = X; not true = false; not false = true.
    - not {type: T} = the other types (None when T has `integer` without `number`: the numbers that are not integers
      have no type of their own).
    - not {required: R} = an object lacking one name of R: `{type: object, anyOf: [{_absent: [r]} for r in R]}`
      (`required` holds for every value that is not an object, so those fail it); with `type: object` in the
      operand, a value that is not an object passes too (`_absent` holds for every value that is not an object), so
      the `type` is left out; not {required: []} = false.
    - not {anyOf: [A, B]} = allOf[not A, not B]; not {allOf: [A, B]} = anyOf[not A, not B], each part rewritten too.

    Exact, and unlike the complement's universe these take any writing of a value: any key order, any number of
    undeclared keys, numbers with exponents, any depth (JSONSchemaBench Github_trivial o91408:
    `not: {required: [body, bodyValue]}` over annotations with `id` and `type`)."""
    if operand is True:
        return False
    if operand is False:
        return True
    if not isinstance(operand, dict):
        return None
    keys = {k for k in operand if k not in ANNOTATIONS}
    if not keys:
        return False
    if keys == {"not"}:
        return operand["not"]
    if len(keys) == 1 and keys <= {"anyOf", "allOf"}:
        (key,) = keys
        branches = operand[key]
        if not isinstance(branches, list) or not branches:
            return None
        parts = [negated(branch) for branch in branches]
        if any(p is None for p in parts):
            return None
        if key == "anyOf":  # every branch fails
            if any(p is False for p in parts):
                return False
            kept = [p for p in parts if p is not True]
            return {"allOf": kept} if kept else True
        if any(p is True for p in parts):  # allOf: some branch fails
            return True
        kept = [p for p in parts if p is not False]
        return {"anyOf": kept} if kept else False
    if keys == {"type"}:
        named = operand["type"] if isinstance(operand["type"], list) else [operand["type"]]
        if not all(t in _JSON_TYPES or t == "integer" for t in named) or ("integer" in named and "number" not in named):
            return None
        others = [t for t in _JSON_TYPES if t not in named]
        return {"type": others} if others else False
    names = operand.get("required")
    if "required" not in keys or not keys <= {"required", "type"} or not isinstance(names, list) \
            or not all(isinstance(n, str) for n in names) or operand.get("type", "object") != "object":
        return None
    names = list(dict.fromkeys(names))
    if not names:
        return False
    absent: dict = {"_absent": names} if len(names) == 1 else {"anyOf": [{"_absent": [n]} for n in names]}
    return absent if "type" in keys else {"type": "object", **absent}


def _holds_object(value: Any) -> bool:
    """Whether a JSON value is or holds an object."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(_holds_object(v) for v in value)


def _canonical_text(value: Any, rank: dict[str, int] | None) -> str:
    """`value` in compact writing-rule form: ranked keys first in rank order, numbers by `numbers.canonical_text`."""
    from constrain import numbers as _numbers

    if isinstance(value, dict):
        items = list(value.items())
        if rank is not None:
            items.sort(key=lambda kv: rank.get(kv[0], len(rank)))
        return "{" + ",".join(dump_json(k) + ":" + _canonical_text(v, rank) for k, v in items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_canonical_text(v, rank) for v in value) + "]"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _numbers.canonical_text(value)
    return dump_json(value)


def _count(schema: dict, key: str, pointer: str, default: int | None = None) -> int | None:
    """The value of count keyword `key` (`minLength`, `maxItems`, ...) of `schema`, `default` when absent.

    Raises:
        InvalidSchema: not a non-negative integer (an integral float such as 2.0 is one).
        UnsupportedSchema: above `MAX_COUNT`.
    """
    if key not in schema:
        return default
    v = schema[key]
    if isinstance(v, bool) or not (isinstance(v, int) or isinstance(v, float) and v.is_integer()) or v < 0:
        raise InvalidSchema(f"'{key}' must be a non-negative integer, got {v!r}", pointer=join_pointer(pointer, key))
    if v > MAX_COUNT:
        raise UnsupportedSchema(f"'{key}' {v!r} is above the largest count enforced ({MAX_COUNT})",
                                pointer=join_pointer(pointer, key))
    return int(v)


_MERGED_BOUNDS = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
                            "minItems", "maxItems", "minProperties", "maxProperties"})


def _names(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# what `allOf` merging reads of a keyword's value before the keyword's own compile would check it: (what it must be,
# the check)
_MERGED_SHAPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "required": ("an array of strings", _names),
    "type": ("a type name or an array of them", lambda v: isinstance(v, str) or _names(v)),
    "properties": ("an object", lambda v: isinstance(v, dict)),
    "anyOf": ("an array", lambda v: isinstance(v, list)),
    "oneOf": ("an array", lambda v: isinstance(v, list)),
    "enum": ("an array", lambda v: isinstance(v, list)),
}


def _check_shape(schema: dict, key: str, pointer: str) -> None:
    what, ok = _MERGED_SHAPES[key]
    if not ok(schema[key]):
        raise InvalidSchema(f"'{key}' must be {what}", pointer=join_pointer(pointer, key))


def _bound(schema: dict, key: str, pointer: str) -> int | float:
    """The value of a count or numeric bound keyword that `allOf` merges by min/max, checked as where it applies."""
    if key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = schema[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidSchema(f"'{key}' must be a number", pointer=join_pointer(pointer, key))
        return v
    return _count(schema, key, pointer)


def _desugar(schema: dict, pointer: str) -> dict:
    """`schema` with its conditional keywords rewritten as allOf parts of anyOf/not (exact equivalents).

    dependencies / dependentRequired / dependentSchemas: for each name, `name` absent (`_absent`, an internal keyword)
    or present together with its requirement. if/then/else: anyOf[allOf[if, then], allOf[not if, else]].
    then/else without if, and minContains/maxContains without contains, assert nothing (dropped).
    """
    if DESUGARED.isdisjoint(schema) and not (("minContains" in schema or "maxContains" in schema) and "contains" not in schema):
        return schema
    out = {k: v for k, v in schema.items() if k not in DESUGARED}
    if "contains" not in schema:
        out.pop("minContains", None)
        out.pop("maxContains", None)
    parts: list[Any] = []
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        if key not in schema:
            continue
        deps = schema[key]
        if not isinstance(deps, dict):
            raise InvalidSchema(f"'{key}' must be an object", pointer=join_pointer(pointer, key))
        for name, need in deps.items():
            where = join_pointer(pointer, key, name)
            if isinstance(need, list) and key != "dependentSchemas":
                if not all(isinstance(n, str) for n in need):
                    raise InvalidSchema(f"'{key}' arrays must hold property names", pointer=where)
                present: Any = {"required": [name, *need]}
            elif isinstance(need, (dict, bool)) and key != "dependentRequired":
                if need is True or need == {}:
                    continue
                present = {"allOf": [{"required": [name]}, need]}
            else:
                raise InvalidSchema(f"'{key}' values must be {'arrays' if key == 'dependentRequired' else 'schemas'}", pointer=where)
            parts.append({"anyOf": [{"_absent": [name]}, present]})
    if "if" in schema:
        cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
        if cond is True:
            parts.append(then)
        elif cond is False:
            parts.append(other)
        elif then is not True or other is not True:
            parts.append({"anyOf": [{"allOf": [cond, then]}, {"allOf": [{"not": cond}, other]}]})
    if not parts:
        return out
    return {**out, "allOf": [*out.get("allOf", []), *parts]} if isinstance(out.get("allOf", []), list) else out


def _common_multiple(a: int | float, b: int | float) -> int | float:
    """The least x that both multipleOf values divide: the values that are multiples of both are exactly x's
    multiples (for p1/q1 and p2/q2 in lowest terms, x = lcm(p1, p2) / gcd(q1, q2)), in the decimals the schema
    wrote (0.01 and 0.025 give 0.05). JSON numbers are decimals, so x is one too."""
    from constrain.numbers import _written

    wa, wb = _written(a), _written(b)
    x = Fraction(math.lcm(wa.numerator, wb.numerator), math.gcd(wa.denominator, wb.denominator))
    return x.numerator if x.denominator == 1 else float(Decimal(x.numerator) / Decimal(x.denominator))


class _Compiler:
    def __init__(self, root: Any, opts: SchemaOptions, pointer: str):
        self.root = root
        self.opts = opts
        self.base = pointer
        self.deadline = time.monotonic() + opts.timeout_s
        self.ignored: list[str] = []
        self.relaxed: list[tuple[str, str]] = []
        self.syntax: JsonSyntax = opts.syntax or JsonSyntax(opts.whitespace)
        from constrain import formats as _formats

        self.draft = _formats.draft_of(root)  # which `format`s assert anything (the rest are annotations)
        self.ref_errors: dict[str, Exception] = {}  # `$ref` marker -> its error (`_with_document_refs`)
        self._any_cache: dict[tuple[str, int, int], fa.Expr] = {}
        # Under a oneOf, every object orders its keys by one ranking of the names the oneOf mentions (and gives each
        # ranked name a slot wherever it may appear), so a value has one text in every branch: that is what makes
        # "valid against exactly one branch" checkable on texts. None elsewhere (keys in schema order).
        self.key_rank: dict[str, int] | None = None
        self._memo: dict[tuple, tuple[dict, fa.Expr]] = {}
        self._ranks: list[dict[str, int]] = []  # keeps every ranking alive: caches key on id(key_rank)
        self._universe_cache: dict[tuple[int, int], fa.Expr] = {}
        # Inside a `not` operand (negations > 0) a narrower language would widen the complement, so keywords that
        # constrain enforces narrowly (formats) are refused there, and `$ref` recursion may unroll one level deeper
        # than the universe of the complement nests (ref_limit).
        self.negations = 0
        self.ref_limit = opts.max_depth
        # Strings with a long maxLength may be counted (`string`); with `stack`, free-form values nest to any depth
        # (`any_value`; `stacked[0]` once one does, shared by the nested compilers).
        self.counters = False
        self.stack = False
        self.stacked = [False]
        # A format whose length cap is costly in the automaton (`formats.counted_format`: hostname) is counted too
        # where counting is on, but not in the branches of an `anyOf`/`oneOf` that start alike (`count_formats`
        # False there: see `_value`); `formats_counted[0]`: how many were (shared by the nested compilers).
        self.count_formats = True
        self.formats_counted = [0]
        self.cut = [False]  # whether a recursive `$ref` was cut at `ref_limit` (shared by the nested compilers)
        self.recursive = [False]  # whether a `$ref` was met inside its own expansion (likewise shared)
        self.free_nesting = [False]  # whether free-form values nest at most max_depth levels somewhere (likewise)
        self.subtracted = [False]  # whether a `oneOf` subtracts its branches' overlaps (likewise)
        self.loops_checked = [False]  # whether `_in_place_loop` ran (once recursion shows; shared likewise)
        # id(expression) -> the JSON Pointer of the sub-schema or keyword that made it, so that a budget error names
        # the innermost one being compiled (`fa.compile(pointers=)`); `_pointed` keeps those expressions alive, or
        # a freed one's id could be given to another
        self.pointers: dict[int, str] = {}
        self._pointed: list[fa.Expr] = []
        # where each subschema of the request sits: rewritten keywords (`_desugar`) and merged parts still report
        # errors at the subschema's own JSON Pointer
        self._where: dict[int, str] = {}
        stack = [(root, pointer)]
        while stack:
            node, where = stack.pop()
            # (scalars are not pushed: only a subschema's pointer is kept)
            if isinstance(node, dict):
                self._where.setdefault(id(node), where)
                stack += [(v, join_pointer(where, k)) for k, v in node.items()
                          if isinstance(v, (dict, list)) and k not in ("enum", "const", "default", "examples")]
            elif isinstance(node, list):
                stack += [(v, join_pointer(where, i)) for i, v in enumerate(node) if isinstance(v, (dict, list))]

    def unsupported(self, message: str, pointer: str) -> None:
        """An assertion keyword constrain cannot enforce: an error, or recorded and skipped under `relax`."""
        if not self.opts.relax:
            raise UnsupportedSchema(message, pointer=pointer)
        self.relaxed.append((pointer, message))

    def lookup_or_none(self, ref: str) -> Any:
        """The subschema `ref` points to, None when it does not resolve (the compile itself reports a bad `$ref`
        where it meets it)."""
        try:
            return self.lookup(ref, "")[0]
        except (InvalidSchema, UnsupportedSchema):
            return None

    def ranked(self, schemas: list[Any]) -> "_Compiler":
        """This compiler with a key ranking covering every property name mentioned in `schemas` (see `key_rank`)."""
        rank = ranked_names(schemas, self.key_rank, self.lookup_or_none)
        # No new name: the same ranking. An empty one orders nothing, so it is no ranking at all, and the plain
        # automata (the shared free-form value: 10 ms on nested_table's `oneOf`s over `{"type": "array"}`) serve.
        if len(rank) == len(self.key_rank or ()):
            return self
        self._ranks.append(rank)
        other = object.__new__(_Compiler)
        other.__dict__.update(self.__dict__)
        other.key_rank = rank
        return other

    def with_formats_narrowed(self) -> "_Compiler":
        """This compiler, with every format narrowed as `formats.format_expr` has it (none counted)."""
        if not self.count_formats:
            return self
        other = object.__new__(_Compiler)
        other.__dict__.update(self.__dict__)
        other.count_formats = False
        return other

    def branches(self, key: str, rest: dict, branches: list, pointer: str, refs: tuple[str, ...]) -> list[fa.Expr]:
        """The texts of each branch of `anyOf`/`oneOf` (`key`), with the keywords beside it (`rest`)."""
        exprs = []
        for i, branch in enumerate(branches):
            combined = {"allOf": [rest, branch]} if any(k not in ANNOTATIONS for k in rest) else branch
            exprs.append(self.value(combined, join_pointer(pointer, key, i), refs))
        return exprs

    def nested(self, syntax: JsonSyntax) -> "_Compiler":
        """This compiler, writing with another syntax (caches and budgets shared)."""
        if syntax is self.syntax:
            return self
        other = object.__new__(_Compiler)
        other.__dict__.update(self.__dict__)
        other.syntax = syntax
        return other

    # -- entry ---------------------------------------------------------------

    def point(self, expr: fa.Expr, pointer: str) -> fa.Expr:
        """Record `pointer` as where `expr` comes from (the first, innermost, record wins); returns `expr`."""
        if id(expr) not in self.pointers:
            self.pointers[id(expr)] = pointer
            self._pointed.append(expr)
        return expr

    def value(self, schema: Any, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        """The texts of the values valid against `schema`; `refs` is the stack of `$ref`s being expanded."""
        if time.monotonic() > self.deadline:
            raise fa.BudgetExceeded("schema compilation exceeded its time budget", pointer=pointer)
        if schema is True or schema == {}:
            return self.any_value(self.opts.max_depth)
        if schema is False:
            return fa.NOTHING
        if not isinstance(schema, dict):
            raise InvalidSchema(f"a schema must be an object or a boolean, got {type(schema).__name__}", pointer=pointer)
        pointer = self._where.get(id(schema), pointer)
        key = (id(schema), refs, self.syntax.name, self.syntax.whitespace, id(self.key_rank), self.count_formats)
        hit = self._memo.get(key)
        if hit is not None:
            return hit[1]
        original = schema
        schema, pointer, refs = self.resolve(schema, pointer, refs)
        if schema is None:  # recursion bound reached
            return fa.NOTHING
        # every `$ref` to one definition (at one depth of recursion) gives the same expression object, which the NFA
        # then builds once towards each continuation (`{"log": E}` and `{"exp": E}` share E's states)
        resolved = (id(schema), refs, *key[2:]) if schema is not original else None
        hit = self._memo.get(resolved) if resolved is not None else None
        if hit is not None:
            expr = hit[1]
        else:
            expr = self.point(self._value(schema, pointer, refs), pointer)
            if resolved is not None:
                self._memo[resolved] = (schema, expr)
        # the entry holds the schema itself: merged and rewritten schemas are temporary, and the id of a freed
        # one may be given to the next
        self._memo[key] = (original, expr)
        return expr

    def resolve(self, schema: dict, pointer: str, refs: tuple[str, ...]) -> tuple[dict | None, str, tuple[str, ...]]:
        """Follow `$ref` (merging sibling keywords), and flatten `allOf` into one schema."""
        seen = 0
        raw = schema
        schema = _desugar(schema, pointer)
        while "$ref" in schema:
            ref = schema["$ref"]
            if not isinstance(ref, str):
                raise InvalidSchema("'$ref' must be a string", pointer=join_pointer(pointer, "$ref"))
            if ref in refs:  # recursion
                self.recursive[0] = True
                if not self.loops_checked[0]:
                    # once per compile, whether some `$ref` loops back in place (never finishes validating)
                    self.loops_checked[0] = True
                    loop = _in_place_loop(self.root, self.draft)
                    if loop is not None:
                        raise InvalidSchema("'$ref' leads back to itself through in-place keywords ($ref, allOf,"
                                            " anyOf, oneOf, not, if/then/else, dependentSchemas) without descending"
                                            " into the value: an infinite loop, undefined in JSON Schema",
                                            pointer=self.base + loop)
            since_not = refs[len(refs) - refs[::-1].index(NOT_MARK):] if NOT_MARK in refs else refs
            if since_not.count(ref) >= self.ref_limit:
                self.cut[0] = True
                return None, pointer, refs
            target, target_pointer = self.lookup(ref, join_pointer(pointer, "$ref"))
            refs = refs + (ref,)
            seen += 1
            if seen > 64:
                raise UnsupportedSchema("chain of more than 64 '$ref's", pointer=pointer)
            siblings = {k: v for k, v in schema.items() if k != "$ref"}
            if siblings and self.draft in _REF_ALONE_DRAFTS:
                # up to draft 7 a `$ref` stands alone: its siblings are not keywords there (python-jsonschema skips
                # them too)
                self.ignored.extend(join_pointer(pointer, k) for k in siblings
                                    if k not in ANNOTATIONS and k not in ("$defs", "definitions"))
                siblings = {}
            if target is False:
                return None, pointer, refs
            if target is True:
                target = {}
            if not isinstance(target, dict):
                raise InvalidSchema(f"'$ref' target {ref!r} is not a schema", pointer=join_pointer(pointer, "$ref"))
            target = _desugar(target, target_pointer)
            if siblings and any(k not in ANNOTATIONS and k not in ("$defs", "definitions") for k in siblings):
                if "allOf" in target or any(k in target for k in UNEVALUATED) and self.unevaluated_applies():
                    # the target is resolved before the siblings merge in: its allOf parts' properties come before
                    # the siblings' (the target stands where the `$ref` was), and its unevaluated* see only what
                    # the target evaluates
                    target, target_pointer, refs = self.resolve(target, target_pointer, refs)
                    if target is None:
                        return None, pointer, refs
                schema = self.merge(target, siblings, target_pointer, pointer)
            else:
                schema, pointer = target, target_pointer
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise InvalidSchema("'allOf' must be a non-empty array", pointer=join_pointer(pointer, "allOf"))
            merged: dict = {k: v for k, v in schema.items() if k != "allOf"}
            for i, part in enumerate(parts):
                part_pointer = join_pointer(pointer, "allOf", i)
                if part is True:
                    continue
                if part is False:
                    return None, pointer, refs  # allOf with false: nothing is valid
                if not isinstance(part, dict):
                    raise InvalidSchema("allOf items must be schemas", pointer=part_pointer)
                resolved, _, refs = self.resolve(part, part_pointer, refs)
                if resolved is None:
                    return None, pointer, refs
                merged = self.merge(merged, resolved, pointer, part_pointer)
            schema = merged
            if "$ref" in schema or "allOf" in schema:
                return self.resolve(schema, pointer, refs)
        if any(k in schema for k in UNEVALUATED) and self.unevaluated_applies():
            schema = self.unevaluated(schema, pointer, self.in_place_choice(raw))
        return schema, pointer, refs

    def in_place_choice(self, schema: Any) -> str | None:
        """A keyword of `schema` or of its in-place parts (`allOf` items and `$ref` targets, transitively) whose
        annotations depend on which way a value goes (`anyOf`, `oneOf`, `if`, `dependentSchemas`, ...; `if` without
        `then` or `else` asserts nothing, yet its annotations count where it passes), else None."""
        seen: set[int] = set()
        todo = [schema]
        while todo:
            node = todo.pop()
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            for key in ("anyOf", "oneOf", "if", "dependentSchemas", "dependencies", "dependentRequired"):
                if key in node:
                    return key
            if isinstance(node.get("allOf"), list):
                todo.extend(node["allOf"])
            if isinstance(node.get("$ref"), str):
                todo.append(self.lookup_or_none(node["$ref"]))
        return None

    def unevaluated_applies(self) -> bool:
        """Whether `unevaluatedProperties` / `unevaluatedItems` assert anything: drafts 2019-09 and 2020-12 (older
        drafts do not define them: unknown keywords, annotations)."""
        return self.draft in ("draft2019-09", "draft2020-12")

    def unevaluated(self, schema: dict, pointer: str, choice: str | None) -> dict:
        """`schema` (its `$ref`s and `allOf` merged, each part's own unevaluated* rewritten first) with
        `unevaluatedProperties` as the `additionalProperties` of the merged object, and `unevaluatedItems` as the
        items after the merged prefix: exact when nothing else evaluates properties or items, that is beside no
        `anyOf`, `oneOf`, `if`/`then`/`else` or `dependentSchemas`/`dependencies`/`dependentRequired` (rewritten as
        `anyOf`, see `_desugar`), and for items no `contains`: `choice`, the first such keyword of the schema's
        in-place parts (`in_place_choice`), must be None. When a merged part's `additionalProperties` (or `items`
        after a prefix, `additionalItems`) evaluates everything, the keyword asserts nothing."""
        out = dict(schema)
        choice = choice or next((k for k in ("anyOf", "oneOf") if k in out), None)
        for key in UNEVALUATED:
            if key not in out:
                continue
            where = join_pointer(pointer, key)
            rest = out.pop(key)
            if choice is not None or (key == "unevaluatedItems" and "contains" in out):
                beside = "'contains'" if choice is None else f"'{choice}' (anyOf, oneOf, if, dependencies)"
                self.unsupported(f"'{key}' is enforced beside properties, items, allOf and $ref, not beside {beside}",
                                 where)
                continue
            if key == "unevaluatedProperties":
                sides = out.get("_sides", ())
                if "additionalProperties" not in out and not any("additionalProperties" in s for s in sides):
                    out["additionalProperties"] = rest
            elif isinstance(out.get("items"), list):  # draft 2019-09's tuple form
                out.setdefault("additionalItems", rest)
            else:
                out.setdefault("items", rest)
        return out

    def lookup(self, ref: str, pointer: str) -> tuple[Any, str]:
        """The subschema `$ref` `ref` names and its JSON Pointer; `ref` starts with '#' here unless it names another
        document (`_with_document_refs` rewrote those an `$id` scopes)."""
        if not ref.startswith("#"):
            raise UnsupportedSchema(f"'$ref' {ref!r} names a schema outside this document; only references within it"
                                    " are supported", pointer=pointer)
        error = self.ref_errors.get(ref)
        if error is not None:
            raise type(error)(error.message, pointer=pointer)
        path = ref[1:]
        node = _node_at(self.root, path) if not path or path.startswith("/") else _MISSING  # (anchors: rewritten)
        if node is _MISSING:
            raise InvalidSchema(f"'$ref' {ref!r} does not resolve", pointer=pointer)
        return node, self.base + path

    # -- merging (allOf, $ref with siblings) -------------------------------------

    def merge(self, a: dict, b: dict, pa: str, pb: str) -> dict:
        """One schema equivalent to allOf[a, b] for the keywords constrain applies."""
        out = dict(a)
        if any(k in a or k in b for k in ("prefixItems", "items", "additionalItems")):
            self._merge_arrays(a, b, out)
        for key, bv in b.items():
            if key in ANNOTATIONS or key in ("$defs", "definitions", "prefixItems", "items", "additionalItems"):
                out.setdefault(key, bv)
                continue
            if key in ("_patterns", "_formats", "_absent"):
                out[key] = [*out.get(key, []), *bv]
                continue
            if key == "_sides":
                continue  # combined after the loop
            if key in _MERGED_BOUNDS and not isinstance(bv, bool):
                _bound(b, key, pb)  # (checked where it is written: a merged value is compared with the next)
            elif key in _MERGED_SHAPES:
                _check_shape(b, key, pb)
            if key not in APPLIED and key not in UNSUPPORTED:  # unknown keywords are annotations
                out.setdefault(key, bv)
                continue
            if key not in out:
                out[key] = bv
                continue
            av = out[key]
            where = join_pointer(pb, key)
            if key == "type":
                ta = set(av if isinstance(av, list) else [av])
                tb = set(bv if isinstance(bv, list) else [bv])
                both = {t for t in ta if t in tb}
                if "integer" in ta and "number" in tb or "number" in ta and "integer" in tb:
                    both.add("integer")
                out[key] = sorted(both)
            elif key == "required":
                out[key] = list(dict.fromkeys([*av, *bv]))
            elif key == "properties":
                props = dict(av)
                for name, sub in bv.items():
                    props[name] = {"allOf": [props[name], sub]} if name in props else sub
                out[key] = props
            elif key in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum") and not isinstance(av, bool) and not isinstance(bv, bool):
                out[key] = max(_bound(out, key, pa), bv)  # (bv checked above)
            elif key in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum") and not isinstance(av, bool) and not isinstance(bv, bool):
                out[key] = min(_bound(out, key, pa), bv)
            elif key in ("enum", "const"):
                if key == "enum":
                    _check_shape(out, key, pa)  # (bv checked above)
                va = av if key == "enum" else [av]
                vb = bv if key == "enum" else [bv]
                out.pop("const", None)
                out["enum"] = _common_values(va, vb)
            elif key in ("anyOf", "oneOf"):
                out[key] = [{"allOf": [x, y]} for x in av for y in bv]
            elif key in ("additionalProperties", "propertyNames"):
                out[key] = {"allOf": [av, bv]}
            elif key == "not":  # not A and not B = not (A or B)
                out[key] = {"anyOf": [av, bv]}
            elif key == "patternProperties":
                if not isinstance(av, dict) or not isinstance(bv, dict):
                    raise InvalidSchema("'patternProperties' must be an object", pointer=where)
                patterns = dict(av)
                for pattern, sub in bv.items():
                    patterns[pattern] = {"allOf": [patterns[pattern], sub]} if pattern in patterns else sub
                out[key] = patterns
            elif key == "uniqueItems":
                out[key] = bool(av) or bool(bv)
            elif _json_equal(av, bv):
                continue
            elif key == "pattern":
                out.setdefault("_patterns", []).append((bv, where))
            elif key == "format":
                out.setdefault("_formats", []).append((bv, where))
            elif key == "multipleOf" and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                             for v in (av, bv)):
                out[key] = _common_multiple(av, bv)
            else:
                raise UnsupportedSchema(f"cannot merge two different '{key}' values in allOf", pointer=where)
        if "properties" in a and "properties" in b or "additionalProperties" in a or "additionalProperties" in b:
            self._merge_closed_objects(a, b, out)
        if "_sides" in a or "_sides" in b or ("patternProperties" in a or "patternProperties" in b) and any(
            side.get("additionalProperties", True) is not True for side in (a, b)
        ):
            # which keys a part's additionalProperties governs depends on that part's own properties and patterns:
            # keep each part's three keywords apart (`object` conjoins them key by key)
            object_keys = ("properties", "patternProperties", "additionalProperties")
            out["_sides"] = [
                s for side in (a, b)
                for s in (side["_sides"] if "_sides" in side else [{k: side[k] for k in object_keys if k in side}])
            ]
            for k in object_keys:
                out.pop(k, None)
        return out

    @staticmethod
    def _merge_arrays(a: dict, b: dict, out: dict) -> None:
        """Element i of allOf[a, b] must satisfy both sides' schema for position i."""

        def layout(side: dict) -> tuple[list, Any]:
            items = side.get("items", True)
            if isinstance(items, list):  # draft 4-7 tuple form
                return list(items), side.get("additionalItems", True)
            return list(side.get("prefixItems", [])), items

        pa, ra = layout(a)
        pb, rb = layout(b)
        n = max(len(pa), len(pb))
        prefix = [{"allOf": [pa[i] if i < len(pa) else ra, pb[i] if i < len(pb) else rb]} for i in range(n)]
        for key in ("prefixItems", "items", "additionalItems"):
            out.pop(key, None)
        if prefix:
            out["prefixItems"] = prefix
        if ra is not True or rb is not True:  # (neither: absent, as true is; `unevaluated` reads it so)
            out["items"] = {"allOf": [ra, rb]}

    @staticmethod
    def _merge_closed_objects(a: dict, b: dict, out: dict) -> None:
        # A property that one side does not declare is governed by that side's additionalProperties.
        props = dict(out.get("properties", {}))
        for side in (a, b):
            extra = side.get("additionalProperties", True)
            if extra is True:
                continue
            declared = side.get("properties", {})
            for name in list(props):
                if name not in declared:
                    props[name] = {"allOf": [props[name], extra]}
        if props:
            out["properties"] = props

    # -- dispatch by type ----------------------------------------------------------

    def _value(self, schema: dict, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        for key in schema:
            if key in APPLIED or key in ("_patterns", "_formats", "_absent", "_sides"):
                continue
            if key in ANNOTATIONS:
                continue
            if key in UNEVALUATED and not self.unevaluated_applies():
                self.ignored.append(join_pointer(pointer, key))  # (not a keyword of this draft)
                continue
            if key in UNSUPPORTED:
                self.unsupported(f"keyword '{key}' is not supported", join_pointer(pointer, key))
                continue
            if key == "$ref":
                continue
            self.ignored.append(join_pointer(pointer, key))
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = schema[key]
                if not isinstance(branches, list) or not branches:
                    raise InvalidSchema(f"'{key}' must be a non-empty array", pointer=join_pointer(pointer, key))
                rest = {k: v for k, v in schema.items() if k != key}
                # a oneOf whose branches no value satisfies two of is their union, in every branch's own key order
                union = key == "anyOf" or disjoint_branches(rest, branches, self.lookup_or_none)
                compiler = self if union else self.ranked([rest, *branches])
                if not union and mentions_not([rest, *branches]):
                    compiler = self.ranked([self.root, rest, *branches])
                counted_before = self.formats_counted[0]
                exprs = compiler.branches(key, rest, branches, pointer, refs)
                if self.formats_counted[0] > counted_before and fa.starts_alike(exprs):
                    # a counted format cap beside an alternative that starts alike (`anyOf: [hostname, ipv4]`): the
                    # counter's markers could not be folded and the whole schema would be compiled again without
                    # counters (Snowplow sp_371 then went over the state budget on its first try); these branches
                    # narrow the format instead
                    compiler = compiler.with_formats_narrowed()
                    exprs = compiler.branches(key, rest, branches, pointer, refs)
                if union:
                    return fa.union(*exprs)
                if mentions_not([rest, *branches]):
                    # a branch with `not` writes its values only in the universe's form: so must the others, or a
                    # value valid in two branches could have a text in one only
                    universe = compiler.universe(self.opts.max_depth)
                    exprs = [fa.intersect(e, universe) for e in exprs]
                return self.exactly_one(exprs, pointer)
        if "enum" in schema or "const" in schema:
            return self.enum(schema, pointer, refs)
        if "not" in schema:
            rest = {k: v for k, v in schema.items() if k != "not"}
            positive = negated(schema["not"])
            if positive is not None:
                if positive is False:
                    return fa.NOTHING
                return self.value({"allOf": [rest, positive]} if rest else positive, pointer, refs)
            # both sides under one key ranking, so that an object has one text in each (see `complement`)
            ranked = self.ranked([self.root, schema])
            negative = ranked.complement(schema["not"], join_pointer(pointer, "not"), refs)
            if all(k in ANNOTATIONS or k not in APPLIED and k not in ("_patterns", "_formats", "_absent", "_sides") for k in rest):
                return negative
            return fa.intersect(ranked._value(rest, pointer, refs), negative)
        types = self.types(schema, pointer)
        alternatives = []
        for t in types:
            if t == "integer" and "number" in types:
                continue
            alternatives.append(self.typed(t, schema, pointer, refs))
        return fa.union(*alternatives)

    def complement(self, operand: Any, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        """`not`: the texts of `universe` whose value is not valid against `operand`.

        Exact because the operand's language is saturated on the universe: every text of the universe that writes a
        valid value of the operand is in it (one key order, one number spelling, uniform whitespace, no key twice);
        so removing it removes exactly the valid values. The operand is compiled with its JSON Schema meaning
        (closed_objects off), formats refused, and `$ref` recursion unrolled one level past the universe's depth.
        """
        if operand is False:
            return self.any_value(self.opts.max_depth)
        if operand is True or operand == {}:
            return fa.NOTHING
        try:
            if self.syntax.name != "json":
                raise UnsupportedSchema(f"'not' is supported in JSON arguments only, not in {self.syntax.name}", pointer=pointer)
            if refs.count(NOT_MARK) >= MAX_NOT_NESTING:
                raise UnsupportedSchema(f"'not' nested more than {MAX_NOT_NESTING} times (through '$ref')", pointer=pointer)
            inner = object.__new__(_Compiler)
            inner.__dict__.update(self.__dict__)
            inner.opts = dataclasses.replace(self.opts, closed_objects=False, relax=False)
            inner.negations = self.negations + 1
            inner.ref_limit = self.opts.max_depth + 1
            positive = fa.compile(inner.value(operand, pointer, refs + (NOT_MARK,)), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)
        except (fa.BudgetExceeded, fa.CountedProduct):
            raise
        except UnsupportedSchema as err:
            if not self.opts.relax:
                raise
            self.relaxed.append((err.pointer, f"'not' skipped: {err}"))
            return self.any_value(self.opts.max_depth)
        return fa.difference(self.universe(self.opts.max_depth), positive)

    def universe(self, depth: int) -> fa.Expr:
        """The values a `not` ranges over, in one text each (see docs/guarantees.md, `not`).

        Numbers in `CANONICAL_NUMBER` form; object keys the ranking names in rank order, then at most one other key
        (two could repeat a key, and a text with a repeated key is not one value); nesting at most `depth`.
        """
        from constrain import numbers as _numbers

        syntax = self.syntax
        cache_key = (syntax.whitespace, depth, id(self.key_rank))
        hit = self._universe_cache.get(cache_key)
        if hit is not None:
            return hit
        values = [syntax.null, syntax.true, syntax.false, _numbers.CANONICAL_NUMBER, syntax.string(ANY_TEXT)]
        if depth > 0:
            inner = self.universe(depth - 1)
            values.append(fa.concat(syntax.arr_open, fa.optional(fa.concat(inner, fa.repeat(fa.concat(syntax.item_sep, inner), 0))), syntax.arr_close))
            rank = self.key_rank or {}
            others = fa.difference(ANY_TEXT, fa.union(*(fa.literal(n.encode()) for n in rank))) if rank else ANY_TEXT
            slots = [(syntax.member(syntax.key(n), inner), False) for n in sorted(rank, key=rank.get)]
            slots.append((syntax.member(syntax.extra_key(others), inner), False))
            values.append(fa.concat(syntax.obj_open, self.members_uncounted(slots, None), syntax.obj_close))
        expr = fa.compile(fa.union(*values), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers)
        self._universe_cache[cache_key] = expr
        return expr

    def exactly_one(self, exprs: list[fa.Expr], pointer: str) -> fa.Expr:
        """oneOf: the texts in exactly one branch (the union minus every pairwise overlap)."""
        dfas = [fa.compile(e, max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer) for e in exprs]
        firsts = [_first_symbols(d) for d in dfas]
        overlaps = []
        for i in range(len(dfas)):
            for j in range(i + 1, len(dfas)):
                if firsts[i].isdisjoint(firsts[j]):
                    continue  # no text starts in both (e.g. a string branch and a number branch): no product needed
                both = fa.compile(fa.intersect(dfas[i], dfas[j]), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)
                if not both.is_empty:
                    overlaps.append(both)
        if not overlaps:
            return fa.union(*dfas)
        self.subtracted[0] = True
        return fa.difference(fa.union(*dfas), fa.union(*overlaps))

    def types(self, schema: dict, pointer: str) -> list[str]:
        t = schema.get("type")
        if t is None:
            return ["null", "boolean", "object", "array", "string", "number"]
        names = t if isinstance(t, list) else [t]
        for name in names:
            if name not in TYPES:
                raise InvalidSchema(f"unknown type {name!r}", pointer=join_pointer(pointer, "type"))
        return list(dict.fromkeys(names))

    def typed(self, t: str, schema: dict, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        if t == "null":
            return self.syntax.null
        if t == "boolean":
            return fa.union(self.syntax.true, self.syntax.false)
        if t in ("array", "object") and self.syntax.containers_as_json:
            return self.nested(self.syntax.child()).typed(t, schema, pointer, refs)
        if t == "string":
            return self.string(schema, pointer)
        if t in ("integer", "number"):
            return self.number(t, schema, pointer)
        if t == "array":
            return self.array(schema, pointer, refs)
        return self.object(schema, pointer, refs)

    # -- scalars ---------------------------------------------------------------------

    def decoded_string(self, schema: dict, pointer: str) -> fa.Expr:
        """The decoded string values (UTF-8) allowed by the string keywords of `schema`."""
        return self._decoded_string(schema, pointer, False)[0]

    def _decoded_string(self, schema: dict, pointer: str, counted: bool) -> tuple[fa.Expr, bool]:
        """`decoded_string`, and whether it is counted: with `counted`, a string whose maxLength leaves
        `COUNTED_MIN_CHARS` or more characters beyond minLength is its minLength characters, then `fa.counted_chars`
        (the closing marker is the caller's); intersected with its pattern or format, if any."""
        lo, hi = _count(schema, "minLength", pointer, 0), _count(schema, "maxLength", pointer)
        if hi is not None and hi < lo:
            return fa.NOTHING, False
        parts: list[fa.Expr] = []
        format_cap = False  # a format's own length cap (`formats.counted_format`) became `hi`, to be counted
        patterns = [(schema["pattern"], join_pointer(pointer, "pattern"))] if "pattern" in schema else []
        patterns += schema.get("_patterns", [])
        formats = [(schema["format"], join_pointer(pointer, "format"))] if "format" in schema else []
        formats += schema.get("_formats", [])
        from constrain import formats as _formats
        from constrain import regex as _regex

        for pattern, where in patterns:
            if not isinstance(pattern, str):
                raise InvalidSchema("'pattern' must be a string", pointer=where)
            parts.append(self.point(_regex.pattern_expr(pattern, pointer=where), where))
        for name, where in formats:
            if not isinstance(name, str):
                raise InvalidSchema("'format' must be a string", pointer=where)
            if not _formats.is_asserted(name, self.draft, pointer=where):
                self.ignored.append(where)  # an annotation under the schema's draft (e.g. `uuid` in draft 7)
                continue
            if self.negations:
                # formats are enforced exactly or narrower; under `not` narrower would mean accepting valid values
                raise UnsupportedSchema(f"'format' {name!r} inside 'not' (or 'if', or 'maxContains') is not supported", pointer=where)
            uncut = _formats.counted_format(name)
            if uncut is not None:
                language, cap, narrow = uncut
                top = cap if hi is None else min(hi, cap)
                countable = counted and self.count_formats
                counts = countable and top - lo > COUNTED_FORMAT_MIN_CHARS
                # the format's language without its length cap, the cap then counted with maxLength (hostname: 253);
                # or, within a token's reach of minLength or past a lower maxLength where a counter could have been
                # kept, or with a minLength past the narrowed length, the cap in the exact product with the bounds
                # (hostname: at most ~24,000 states); else narrowed (`format_expr`)
                if counts or (countable and top > narrow) or lo > narrow:
                    format_cap = format_cap or counts
                    self.formats_counted[0] += counts
                    parts.append(self.point(language, where))
                    hi = top
                    continue
            parts.append(self.point(_formats.format_expr(name, pointer=where), where))
        if not parts and not lo and hi is None:
            return ANY_TEXT_ANY_LENGTH, False
        if not parts and counted and hi is not None and hi - lo >= COUNTED_MIN_CHARS:
            chars = fa.concat(fa.repeat(fa.ANY_CHAR, lo, lo), fa.counted_chars(hi - lo, fa.ANY_CHAR))
            return self.point(chars, join_pointer(pointer, "maxLength")), True
        if not parts:
            return self.point(fa.repeat(fa.ANY_CHAR, lo, hi), join_pointer(pointer, "maxLength" if hi is not None else "minLength")), False
        expr = parts[0]
        for part in parts[1:]:
            expr = fa.intersect(expr, part)
        if lo or hi is not None:
            # a pattern or format whose own lengths already lie within the bounds needs no length counter (the
            # product with one costs up to (states x maxLength) states: e.g. format email with maxLength 1024)
            shape = fa.compile(expr, max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)
            shortest, longest = char_length_range(shape)
            if shortest >= lo and longest is not None and (hi is None or longest <= hi):
                return shape, False
            where = join_pointer(pointer, "maxLength" if hi is not None else "minLength")
            if shape.specials:
                return fa.intersect(shape, self.point(fa.repeat(fa.ANY_CHAR, lo, hi), where)), False
            countable = counted and hi is not None
            if countable and (hi - lo >= COUNTED_MIN_CHARS or format_cap):
                return self.point(self.counted_shape(shape, lo, hi), where), True
            if countable and hi - lo > COUNTED_FORMAT_MIN_CHARS:
                # the exact length product while it stays small, else counted
                try:
                    product = self.length_bounded(shape, lo, hi, where, max_states=COUNTED_PRODUCT_STATES)
                except _ProductCapped:
                    return self.point(self.counted_shape(shape, lo, hi), where), True
                return self.point(product, where), False
            return self.point(self.length_bounded(shape, lo, hi, where), where), False
        return expr, False

    @staticmethod
    def counted_shape(shape: fa.Dfa, lo: int, hi: int) -> fa.Expr:
        """The strings of `shape` with `lo` to `hi` characters, the `hi - lo` beyond minLength counted
        (`fa.counted_chars`: the pattern's or format's own automaton, no length product)."""
        chars = fa.concat(fa.repeat(fa.ANY_CHAR, lo, lo), fa.counted_chars(hi - lo, fa.ANY_CHAR))
        return fa.intersect(chars, shape)

    def length_bounded(self, shape: fa.Dfa, lo: int, hi: int | None, pointer: str,
                       max_states: int | None = None) -> fa.Expr:
        """The strings of `shape` with `lo` to `hi` code points (`shape` has no special symbols).

        The product of `shape` with a code point counter, but a state whose every continuation fits the remaining
        bound forgets the count (it is saturated: for email with maxLength 1024 only the 10 states on a cycle
        count, and the product has 12.6k states, 10k minimised, where the plain product built 181k), and one that
        cannot reach acceptance within the bounds is dropped. Minimised by intersecting with `Σ*` (`fa.intersect`
        trims and minimises). `max_states`: a cap below the state budget on the product's states (before
        minimising); past it, `_ProductCapped`.
        """
        if shape.is_empty:
            return fa.NOTHING
        cap = self.opts.max_states if max_states is None else min(max_states, self.opts.max_states)
        n = shape.n_states
        cont = np.zeros(fa.N_BYTES, bool)
        cont[0x80:0xC0] = True  # UTF-8 continuation bytes: no new code point
        pair = shape.class_of[: fa.N_BYTES].astype(np.int64) * 2 + cont
        uniq, class_of = np.unique(pair, return_inverse=True)
        old_class = (uniq // 2).tolist()
        weight = [0 if u % 2 else 1 for u in uniq.tolist()]
        rows = shape.rows()
        succ = [[(rows[q][old_class[k]], weight[k]) for k in range(len(uniq))] for q in range(n)]
        inf = 1 << 60
        # fewest code points to acceptance: 0/1 BFS over reversed edges
        back: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for q in range(n):
            for t, w in set(succ[q]):
                if t >= 0:
                    back[t].append((q, w))
        fewest = [inf] * n
        queue = collections.deque()
        for q in range(n):
            if shape.accepting[q]:
                fewest[q] = 0
                queue.append(q)
        while queue:
            t = queue.popleft()
            for q, w in back[t]:
                if fewest[t] + w < fewest[q]:
                    fewest[q] = fewest[t] + w
                    (queue.appendleft if w == 0 else queue.append)(q)
        # most code points to acceptance: longest path, peeling states from the sinks; what is left reaches a cycle
        most = [inf] * n
        out_degree = [len({t for t, _ in succ[q] if t >= 0}) for q in range(n)]
        ready = [q for q in range(n) if out_degree[q] == 0]
        preds = [{q for q, _ in back[t]} for t in range(n)]
        while ready:
            t = ready.pop()  # every successor is settled (a state with a self-loop never gets here)
            most[t] = max([0] * bool(shape.accepting[t]) + [most[u] + w for u, w in succ[t] if u >= 0])
            for q in preds[t]:
                out_degree[q] -= 1
                if out_degree[q] == 0:
                    ready.append(q)
        native = _native.automata()
        if native is not None:
            product = self._length_product_native(native, shape, old_class, weight, class_of, fewest, most, lo, hi,
                                                  pointer, cap)
        else:
            product = self._length_product_python(shape, succ, class_of, fewest, most, lo, hi, pointer, cap)
        if product is None:
            return fa.NOTHING
        # minimised here: `fa.compile` takes a `Dfa` as it is, and an unminimised one enlarges every enclosing determinisation
        everything = fa.repeat(fa.byte_set([(0, 255)]), 0)
        return fa.compile(fa.intersect(product, everything), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)

    def _over_cap(self, cap: int, pointer: str) -> fa.BudgetExceeded:
        """The error of a length product past `cap` states: the state budget's, or `_ProductCapped` (the caller counts
        the string instead) when the cap is lower."""
        kind = _ProductCapped if cap < self.opts.max_states else fa.BudgetExceeded
        return kind(f"automaton exceeds the state budget of {cap} states", pointer=pointer)

    def _length_product_python(self, shape: fa.Dfa, succ: list[list[tuple[int, int]]], class_of: np.ndarray,
                               fewest: list[int], most: list[int], lo: int, hi: int | None,
                               pointer: str, cap: int) -> fa.Dfa | None:
        """`length_bounded`'s product, breadth first (None: no string of `shape` fits the bounds)."""
        inf = 1 << 60
        top = inf if hi is None else hi
        saturated = -1

        def normal(q: int, c: int) -> tuple[int, int] | None:
            if c == saturated:  # every continuation of a saturated state's fits too: it stays saturated
                return q, saturated
            if top - c < fewest[q]:
                return None
            if c >= lo and (hi is None or top - c >= most[q]):
                return q, saturated
            if c < lo and most[q] < lo - c:
                return None
            return q, c

        start = normal(shape.start, 0)
        if start is None:
            return None
        ids = {start: 0}
        order = [start]
        table: list[list[int]] = []
        i = 0
        while i < len(order):
            q, c = order[i]
            i += 1
            if i % 1024 == 0:
                fa.check_deadlines(pointer)
                if time.monotonic() > self.deadline:
                    raise fa.BudgetExceeded("schema compilation exceeded its time budget", pointer=pointer)
            row = []
            for t, w in succ[q]:
                key = None if t < 0 else normal(t, c if c == saturated else c + w)
                if key is None:
                    row.append(-1)
                    continue
                j = ids.get(key)
                if j is None:
                    j = ids[key] = len(order)
                    order.append(key)
                    if j >= cap:
                        raise self._over_cap(cap, pointer)
                row.append(j)
            table.append(row)
        accepting = np.array([bool(shape.accepting[q]) and (c == saturated or lo <= c <= top) for q, c in order])
        return fa.Dfa(np.array(table, np.int32).reshape(len(order), len(succ[0])), accepting, class_of.astype(np.int32), ())

    def _length_product_native(self, native: Any, shape: fa.Dfa, old_class: list[int], weight: list[int],
                               class_of: np.ndarray, fewest: list[int], most: list[int], lo: int, hi: int | None,
                               pointer: str, cap: int) -> fa.Dfa | None:
        """`_length_product_python` in C (`native.length_product`: the same states in the same order)."""
        deadline, flags = fa.native_limits(self.deadline)
        status, table, accepting = native.length_product(
            np.asarray(shape.transitions)[:, old_class], np.asarray(weight), fewest, most, shape.accepting,
            shape.start, lo, hi, cap, deadline, flags)
        if status == _native.DET_STATES:
            raise self._over_cap(cap, pointer)
        if status != _native.DET_OK:
            fa.check_deadlines(pointer)
            raise fa.BudgetExceeded("schema compilation exceeded its time budget", pointer=pointer)
        if not accepting.shape[0]:
            return None
        return fa.Dfa(table, accepting, class_of.astype(np.int32), ())

    def string(self, schema: dict, pointer: str) -> fa.Expr:
        decoded, is_counted = self._decoded_string(schema, pointer, self.may_count())
        if decoded is ANY_TEXT_ANY_LENGTH:
            return _any_string(self.syntax)
        if is_counted:
            return fa.concat(self.syntax.string(decoded), fa.counted_close())
        return self.syntax.string(decoded)

    def number(self, t: str, schema: dict, pointer: str) -> fa.Expr:
        from constrain import numbers as _numbers

        bounds = {}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
            if key in schema:
                v = schema[key]
                if isinstance(v, bool) and key.startswith("exclusive"):
                    continue  # draft 4 boolean form, folded below
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise InvalidSchema(f"'{key}' must be a number", pointer=join_pointer(pointer, key))
                if key == "multipleOf" and v <= 0:
                    raise InvalidSchema("'multipleOf' must be greater than 0", pointer=join_pointer(pointer, key))
                bounds[key] = v
        if schema.get("exclusiveMinimum") is True and "minimum" in bounds:
            bounds["exclusiveMinimum"] = bounds.pop("minimum")
        if schema.get("exclusiveMaximum") is True and "maximum" in bounds:
            bounds["exclusiveMaximum"] = bounds.pop("maximum")
        build = _numbers.integer_expr if t == "integer" else _numbers.number_expr
        return build(
            bounds.get("minimum"),
            bounds.get("maximum"),
            exclusive_minimum=bounds.get("exclusiveMinimum"),
            exclusive_maximum=bounds.get("exclusiveMaximum"),
            multiple_of=bounds.get("multipleOf"),
            pointer=pointer,
        )

    def literal_value(self, value: Any) -> fa.Expr:
        """The text of one JSON value in this syntax (object keys in the given order, or sorted)."""
        syntax = self.syntax
        if isinstance(value, float) and value.is_integer() or isinstance(value, int) and not isinstance(value, bool):
            whole = int(value)
            return fa.union(fa.literal(str(whole).encode()), fa.literal(f"{whole}.0".encode()))
        if isinstance(value, float):
            from constrain import numbers as _numbers

            return fa.union(fa.literal(dump_json(value).encode()), fa.literal(_numbers.canonical_text(value).encode()))
        if isinstance(value, str) and syntax.text(value) is None:
            return syntax.string(fa.literal(value.encode()))
        if isinstance(value, (str, bool)) or value is None:
            return fa.literal(syntax.text(value))
        if syntax.containers_as_json:
            return self.nested(syntax.child()).literal_value(value)
        inner = self.nested(syntax.child())
        if isinstance(value, list):
            return fa.concat(syntax.arr_open, fa.sequence_of([inner.literal_value(v) for v in value], syntax.item_sep), syntax.arr_close)
        if isinstance(value, dict):
            items = list(value.items())
            if syntax.sort_keys:
                items.sort(key=lambda kv: kv[0].lower())
            elif self.key_rank is not None:
                items.sort(key=lambda kv: self.key_rank.get(kv[0], len(self.key_rank)))
            members = [syntax.member(syntax.key(k), inner.literal_value(v)) for k, v in items]
            return fa.concat(syntax.obj_open, fa.sequence_of(members, syntax.member_sep), syntax.obj_close)
        raise InvalidSchema(f"not a JSON value: {value!r}", pointer="")

    def enum(self, schema: dict, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list):
                raise InvalidSchema("'enum' must be an array", pointer=join_pointer(pointer, "enum"))
            if "const" in schema:
                values = [v for v in values if _json_equal(v, schema["const"])]
        else:
            values = [schema["const"]]
        rest = {k: v for k, v in schema.items() if k not in ("enum", "const") and k not in ANNOTATIONS}
        if set(rest) <= {"type"}:
            types = set(self.types(schema, pointer))
            kept = [v for v in values if _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)]
        else:
            # filter the values by the other keywords, checked in plain JSON whatever the output syntax, each value
            # written in the writing rules: with an object among them (or under `not`, see `complement`), keys in the
            # order of one ranking of the schema's names on both sides -- the enum's own key order is not the
            # automaton's (`{"enum": [{"b": 1, "a": 2}]}` beside `properties` a, b)
            checker = self.nested(JsonSyntax("compact"))
            if mentions_not(rest) or any(_holds_object(v) for v in values):
                checker = checker.ranked([self.root, rest])
            check = fa.compile(checker._value(rest, pointer, refs), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)
            kept = [v for v in values if check.matches(_canonical_text(v, checker.key_rank).encode())]
        return self.point(fa.union(*(self.literal_value(v) for v in kept)), join_pointer(pointer, "enum" if "enum" in schema else "const"))

    def any_value(self, depth: int) -> fa.Expr:
        """Any JSON value in this syntax: nested to any depth where the cursor may keep a stack (`may_stack`); else
        arrays and objects nested at most `depth` levels."""
        syntax = self.syntax
        cache_key = (syntax.name, syntax.whitespace, depth, id(self.key_rank), self.may_stack())
        hit = self._any_cache.get(cache_key)
        if hit is not None:
            return hit
        from constrain import numbers as _numbers

        # Plain JSON without a key ranking is the same language in every schema: compiled once per process, like
        # `_any_string` (a schema with one free-form object property: 50 -> 23 ms). With a key ranking (under oneOf)
        # the language depends on the schema, and it is compiled per schema; Gemma 4's names its vocabulary's quote
        # token, compiled per schema too.
        stacked = self.may_stack()  # any depth: the deepest kinds on the cursor's stack
        if stacked:
            self.stacked[0] = True
        else:
            self.free_nesting[0] = True
        plain_json = type(syntax) is JsonSyntax and self.key_rank is None
        shared_key = (syntax.whitespace, "any depth" if stacked else depth, self.opts.max_states) if plain_json else None
        if shared_key is not None and shared_key in _ANY_VALUE:
            self._any_cache[cache_key] = _ANY_VALUE[shared_key]
            return _ANY_VALUE[shared_key]
        values = [syntax.null, syntax.true, syntax.false, _numbers.JSON_NUMBER, syntax.string(ANY_TEXT)]
        if stacked:
            member_key = fa.concat(syntax.extra_key(ANY_TEXT), syntax.colon)
            values = [fa.nested_values(FREE_FORM_WINDOW, fa.union(*values), member_key, syntax.item_sep, syntax.member_sep)]
        elif depth > 0:
            inner_compiler = self.nested(syntax.child())
            inner = inner_compiler.any_value(depth - 1)
            container = syntax.child() if syntax.containers_as_json else syntax
            items = fa.optional(fa.concat(inner, fa.repeat(fa.concat(container.item_sep, inner), 0)))
            rank = self.key_rank
            if rank is None or syntax.sort_keys:
                member = container.member(container.extra_key(ANY_TEXT), inner)
                members = fa.optional(fa.concat(member, fa.repeat(fa.concat(container.member_sep, member), 0)))
            else:  # ranked names in rank order, then any other keys
                others = fa.difference(ANY_TEXT, fa.union(*(fa.literal(n.encode()) for n in rank)))
                slots = [(container.member(container.key(n), inner), False) for n in sorted(rank, key=rank.get)]
                members = inner_compiler.nested(container).members_uncounted(slots, container.member(container.extra_key(others), inner))
            values += [fa.concat(container.arr_open, items, container.arr_close), fa.concat(container.obj_open, members, container.obj_close)]
        expr = fa.compile(fa.union(*values), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers)
        self._any_cache[cache_key] = expr
        if shared_key is not None:
            _ANY_VALUE[shared_key] = expr
        return expr

    # -- arrays --------------------------------------------------------------------------

    def array(self, schema: dict, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        lo, hi = _count(schema, "minItems", pointer, 0), _count(schema, "maxItems", pointer)
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", [])
        prefix_key = "prefixItems"
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, prefix_key = items, "items"
            items = schema.get("additionalItems", True)
            items_pointer = join_pointer(pointer, "additionalItems")
        else:
            items_pointer = join_pointer(pointer, "items")
        if not isinstance(prefix, list):
            raise InvalidSchema("'prefixItems' must be an array", pointer=join_pointer(pointer, "prefixItems"))
        inner = self.nested(self.syntax.child())
        sep = self.syntax.item_sep
        prefix_exprs = [inner.value(s, join_pointer(pointer, prefix_key, i), refs) for i, s in enumerate(prefix)]

        def counted_items(measured: tuple[int, int, bool]) -> bool:
            """Whether the items `rest`, so measured (`fa.measure`), are counted as this array's (`counted_array`)."""
            return (self.may_count() and not prefix_exprs and "contains" not in schema and hi is not None
                    and rest != fa.NOTHING and self.counts_items(measured, lo, hi))

        counted_before = self.formats_counted[0]
        rest = fa.NOTHING if items is False else inner.value(items, items_pointer, refs)
        if self.formats_counted[0] > counted_before and counted_items(fa.measure(rest)[:2] + (False,)):
            # items that count a format cap (hostname) are never counted as an array's items: narrowed, they are
            rest = inner.with_formats_narrowed().value(items, items_pointer, refs)
        if rest == fa.NOTHING:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and hi < lo:
            return fa.NOTHING
        # a prefix item that cannot be written caps the length before it
        for i, e in enumerate(prefix_exprs):
            if e == fa.NOTHING:
                hi = i if hi is None else min(hi, i)
                break
        if hi is not None and hi < lo:
            return fa.NOTHING
        if schema.get("uniqueItems") is True:
            distinct = self.distinct_items(schema, pointer, prefix_exprs, rest, lo, hi)
            if distinct is not None:
                return distinct
        if counted_items(fa.measure(rest)):
            return self.counted_array(rest, lo, hi, pointer)
        if "contains" in schema:
            counted = self.contains(schema, pointer, refs, prefix, items, lo, hi)
            if counted is not None:
                return counted

        def tail(i: int) -> fa.Expr:
            """Elements i.. (each preceded by a comma), given i elements so far."""
            if hi is not None and i >= hi:
                return fa.EMPTY
            if i >= len(prefix_exprs):
                more_lo = max(lo - i, 0)
                more_hi = None if hi is None else hi - i
                counted = fa.repeat(fa.concat(sep, rest), more_lo, more_hi)
                return self.point(counted, join_pointer(pointer, "maxItems" if hi is not None else "minItems"))
            step = fa.concat(sep, prefix_exprs[i], tail(i + 1))
            return step if i < lo else fa.optional(step)

        first = prefix_exprs[0] if prefix_exprs else rest
        body = fa.concat(first, tail(1)) if (hi is None or hi >= 1) else fa.NOTHING
        if lo == 0:
            body = fa.optional(body)
        return fa.concat(self.syntax.arr_open, body, self.syntax.arr_close)

    def may_stack(self) -> bool:
        """Whether a free-form value here may nest to any depth on the cursor's stack (`fa.nested_values`): with the
        stack on, outside `not` and key rankings, in plain JSON or Gemma 4 arguments (the same brackets at every
        level; Qwen XML writes its top level differently)."""
        return self.stack and not self.negations and self.key_rank is None and type(self.syntax) in (JsonSyntax, Gemma4Syntax)

    def may_count(self) -> bool:
        """Whether a long bound here may be counted beside the automaton: in plain JSON, outside `not` (a
        complement would count markers, not characters or items)."""
        return self.counters and not self.negations and type(self.syntax) is JsonSyntax

    @staticmethod
    def counts_items(item: tuple[int, int, bool], lo: int, hi: int) -> bool:
        """Whether an array of `lo`..`hi` items is counted (`counted_array`) rather than unrolled: many optional
        items, or a few heavy ones with room for the most commas one token may count (see COUNTED_UNROLLED_SIZE);
        never items that count themselves. `item`: its `fa.measure` (size, shortest text, markers)."""
        size, shortest, markers = item
        if markers:
            return False
        if hi - lo >= COUNTED_MIN_ITEMS:
            return True
        if hi - lo < 2 or (hi - lo) * size < COUNTED_UNROLLED_SIZE:
            return False
        apart = shortest + 1  # from one counted comma to the next: an item, then a comma
        most = min(COUNTED_MOST_COMMAS, 1 + (COUNTED_COMMA_TOKEN_BYTES - 1) // apart)
        return hi - 1 > most

    def counted_array(self, item: fa.Expr, lo: int, hi: int, pointer: str) -> fa.Expr:
        """Arrays of `lo`..`hi` items with the bound kept by the cursor (`fa.counted_open`): the first `lo` items
        unrolled, then a loop; every comma ticks, so `hi - 1` ticks at most."""
        syntax = self.syntax
        sep = fa.concat(fa.literal(b","), fa.counted_tick(), syntax.gap)
        loop = fa.repeat(fa.concat(sep, item), max(lo - 1, 0))
        body = fa.concat(item, loop) if lo else fa.optional(fa.concat(item, loop))
        counted = fa.concat(syntax.arr_open, fa.counted_open(hi - 1), body, syntax.arr_close, fa.counted_close())
        return self.point(counted, join_pointer(pointer, "maxItems"))

    def distinct_items(self, schema: dict, pointer: str, prefix_exprs: list[fa.Expr], rest: fa.Expr, lo: int,
                       hi: int | None) -> fa.Expr | None:
        """`uniqueItems: true` where the items are one of a few values: the arrays whose elements are pairwise
        distinct values (None: not enforced; `relax` skipped the keyword).

        Enforced exactly without `contains` when every position's texts (each `prefixItems` entry's, then the
        items') are a finite set and all of them together hold at most MAX_UNIQUE_VALUES distinct JSON values (an
        enum, booleans, ...; texts of equal values such as `1` and `1.0` count as one): the automaton remembers
        which values were written, 2**n sets at most. Anything else (strings, numbers, objects in general) would
        need an unbounded memory: `UnsupportedSchema`.
        """
        where = join_pointer(pointer, "uniqueItems")
        if "contains" in schema:
            self.unsupported("'uniqueItems': true is enforced only without 'contains'", where)
            return None
        classes: list[Any] = []  # the distinct values, in order of first appearance
        positions: list[dict[int, list[bytes]]] = []  # per position (prefix entries, then the items): class -> texts
        for expr in [*prefix_exprs, rest]:
            dfa = fa.compile(expr, max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers,
                             pointer=pointer)
            texts = _finite_texts(dfa, MAX_UNIQUE_VALUES * 4)
            if texts is None:
                break
            spelled: dict[int, list[bytes]] = {}
            for text in texts:
                try:
                    value = json.loads(text)
                except ValueError:  # a syntax whose items are not JSON texts (XML parameters): not enforced here
                    texts = None
                    break
                c = next((i for i, known in enumerate(classes) if _json_equal(known, value)), None)
                if c is None:
                    c = len(classes)
                    classes.append(value)
                spelled.setdefault(c, []).append(text)
            if texts is None:
                break
            positions.append(spelled)
        if len(positions) <= len(prefix_exprs) or len(classes) > MAX_UNIQUE_VALUES:
            self.unsupported(f"'uniqueItems': true is enforced only for items of at most {MAX_UNIQUE_VALUES} "
                             "values (an enum): these items take more", where)
            return None
        top = len(classes) if hi is None else min(hi, len(classes))
        sep = self.syntax.item_sep
        after: dict[int, fa.Expr] = {}

        def more(used: int) -> fa.Expr:
            """The rest of the array once the values in the bit set `used` were written, one element each."""
            if used not in after:
                count = used.bit_count()
                options = [fa.EMPTY] if count >= lo else []
                if count < top:
                    lead = fa.EMPTY if count == 0 else sep
                    spelled = positions[min(count, len(positions) - 1)]
                    options += [fa.concat(lead, fa.union(*(fa.literal(t) for t in texts)), more(used | 1 << c))
                                for c, texts in spelled.items() if not used >> c & 1]
                after[used] = fa.union(*options) if options else fa.NOTHING
            return after[used]

        for used in range((1 << len(classes)) - 1, -1, -1):  # the fullest sets first: no deep recursion
            more(used)
        return fa.concat(self.syntax.arr_open, more(0), self.syntax.arr_close)

    def contains(self, schema: dict, pointer: str, refs: tuple[str, ...], prefix: list, items: Any, lo: int, hi: int | None) -> fa.Expr | None:
        """Arrays with between minContains and maxContains elements valid against `contains` (None: no constraint).

        Each element is written either as an element that is valid against `contains` (allOf[its items schema,
        contains]) or, when maxContains counts, as one that is not (its items schema and the `not` of contains, in
        the universe of `complement`); texts of JSON values split into elements in one way only, so counts are exact.
        """
        where = join_pointer(pointer, "contains")
        bounds = {}
        for key, default in (("minContains", 1), ("maxContains", None)):
            bounds[key] = _count(schema, key, pointer, default)
        m, top = bounds["minContains"], bounds["maxContains"]
        if m == 0 and top is None:
            return None
        if top is not None and top < m or hi is not None and m > hi:
            return fa.NOTHING
        if top is not None and hi is not None and top >= hi:
            top = None  # (no array holds more matches than items: the bound says nothing)
            if m == 0:
                return None
        # the automaton counts matches up to the larger bound, a state (at least) per count
        key, bound = ("maxContains", top) if top is not None else ("minContains", m)
        if bound > self.opts.max_states:
            raise fa.BudgetExceeded(f"'{key}' {bound} counts elements past the state budget of {self.opts.max_states} "
                                    "states", pointer=join_pointer(pointer, key))
        sub = schema["contains"]
        # (each element is one of two alternatives that start alike: a format cap counted in them could not be folded)
        inner = self.nested(self.syntax.child()).with_formats_narrowed()
        if top is not None:
            inner = inner.ranked([self.root, schema])
        sep = self.syntax.item_sep
        cache: dict[int, tuple[fa.Expr, fa.Expr]] = {}

        def element(i: int) -> tuple[fa.Expr, fa.Expr]:
            """(texts of an element at position i not counted, texts of one that counts)."""
            k = min(i, len(prefix))
            if k not in cache:
                own = prefix[i] if i < len(prefix) else items
                own_pointer = join_pointer(pointer, "prefixItems" if "prefixItems" in schema else "items", i) if i < len(prefix) else join_pointer(pointer, "items")
                counted = inner.value({"allOf": [own, sub]}, where, refs)
                other = inner.value(own, own_pointer, refs)
                if top is not None:
                    other = fa.intersect(other, inner.complement(sub, where, refs))
                cache[k] = (other, counted)
            return cache[k]

        loop_from = max(len(prefix), lo, 1)
        loops: dict[int, fa.Expr] = {}

        def loop(c: int) -> fa.Expr:
            """Elements past `loop_from` (each after a comma) with c counted so far; only when hi is None."""
            if c not in loops:
                other, counted = element(loop_from)
                free = fa.repeat(fa.concat(sep, other), 0)
                done = fa.EMPTY if c >= m else fa.NOTHING
                if top is None and c >= m:
                    loops[c] = free
                elif top is not None and c >= top:
                    loops[c] = fa.concat(free, done)
                else:
                    nxt = min(c + 1, m) if top is None else c + 1
                    loops[c] = fa.concat(free, fa.union(done, fa.concat(sep, counted, loop(nxt))))
            return loops[c]

        steps: dict[tuple[int, int], fa.Expr] = {}

        def at(i: int, c: int) -> fa.Expr:
            if hi is None and i >= loop_from:
                return loop(c)
            if (i, c) not in steps:
                options = [fa.EMPTY] if i >= lo and c >= m else []
                if hi is None or i < hi:
                    other, counted = element(i)
                    lead = fa.EMPTY if i == 0 else sep
                    options.append(fa.concat(lead, other, at(i + 1, c)))
                    nxt = min(c + 1, m) if top is None else c + 1
                    if top is None or nxt <= top:
                        options.append(fa.concat(lead, counted, at(i + 1, nxt)))
                steps[i, c] = fa.union(*options) if options else fa.NOTHING
            return steps[i, c]

        for c in range(m if top is None else top, -1, -1):  # deepest counts first: no deep recursion
            loop(c) if hi is None else None
        return fa.concat(self.syntax.arr_open, at(0, 0), self.syntax.arr_close)

    # -- objects -------------------------------------------------------------------------

    def object(self, schema: dict, pointer: str, refs: tuple[str, ...]) -> fa.Expr:
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise InvalidSchema("'required' must be an array of strings", pointer=join_pointer(pointer, "required"))
        # Each side (one, or one per allOf part that `merge` could not fold) governs every key: its `properties`
        # entry and matching patterns, else its additionalProperties. closed_objects: a side that declares its
        # properties takes only those; a bare {"type": "object"} stays open.
        sides = []
        for side in schema.get("_sides") or [schema]:
            props = side.get("properties", {})
            if not isinstance(props, dict):
                raise InvalidSchema("'properties' must be an object", pointer=join_pointer(pointer, "properties"))
            closed = self.opts.closed_objects and "properties" in side
            sides.append((props, self.pattern_properties(side, pointer), side.get("additionalProperties", False if closed else True)))
        names_schema = schema.get("propertyNames", True)
        min_p, max_p = _count(schema, "minProperties", pointer, 0), _count(schema, "maxProperties", pointer)
        names_expr = names_dfa = key_texts = None
        if names_schema is not True:
            names_pointer = join_pointer(pointer, "propertyNames")
            try:
                names_expr = self.property_names(names_schema, names_pointer)
                names_dfa = fa.compile(names_expr, max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)
            except UnsupportedSchema as err:
                if isinstance(err, (fa.BudgetExceeded, fa.CountedProduct)) or syntax_name(self.syntax) != "json":
                    raise
                # any other subschema: a JSON key is a JSON string text, so the key texts are those of the values
                # valid against propertyNames (the string texts among them)
                names_expr = None
                key_texts = fa.compile(
                    self.nested(JsonSyntax("compact")).value(names_schema, names_pointer, refs),
                    max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=names_pointer,
                )
        absent = set(schema.get("_absent", ()))
        syntax = self.syntax
        inner = self.nested(syntax.child())
        extra_pointer = join_pointer(pointer, "additionalProperties")

        def conjunction(parts: list[tuple[Any, str]]) -> fa.Expr:
            parts = [(sub, where) for sub, where in parts if sub is not True and sub != {}]
            if any(sub is False for sub, _ in parts):
                return fa.NOTHING
            if not parts:
                return inner.value(True, pointer, refs)
            if len(parts) == 1:
                return inner.value(parts[0][0], parts[0][1], refs)
            return inner.value({"allOf": [sub for sub, _ in parts]}, parts[0][1], refs)

        def key_value(name: str) -> fa.Expr:
            """The values of property `name`: on every side, its declared schema and matching patterns, else extra."""
            if name in absent or (names_dfa is not None and not names_dfa.matches(name.encode())):
                return fa.NOTHING
            if key_texts is not None and not key_texts.matches(dump_json(name).encode()):
                return fa.NOTHING
            parts: list[tuple[Any, str]] = []
            for props, patterns, extra in sides:
                matching = [(sub, where) for dfa, sub, where in patterns if dfa.matches(name.encode())]
                if name in props:
                    parts += [(props[name], join_pointer(pointer, "properties", name)), *matching]
                elif matching:
                    parts += matching
                else:
                    parts.append((extra, extra_pointer))
            return conjunction(parts)

        declared = list(dict.fromkeys(name for props, _, _ in sides for name in props))
        slots = [(name, key_value(name), name in required) for name in declared]
        slots += [(name, key_value(name), True) for name in dict.fromkeys(required) if name not in declared]
        for name, value, is_required in slots:
            if is_required and value == fa.NOTHING:
                return fa.NOTHING
        named = {name for name, _, _ in slots} | absent
        slots = [s for s in slots if s[1] != fa.NOTHING]
        rank = self.key_rank
        if rank is not None:
            # a ranked name this object does not declare may still come as an extra property: give it its slot
            for name in rank:
                if name not in named:
                    value = key_value(name)
                    if value != fa.NOTHING:
                        slots.append((name, value, False))
            named |= set(rank)
        if syntax.sort_keys:
            slots.sort(key=lambda slot: slot[0].lower())
        elif rank is not None:
            slots.sort(key=lambda slot: rank.get(slot[0], len(rank)))
        members = [(syntax.member(syntax.key(name), value), is_required) for name, value, is_required in slots]
        extra_member = self.extra_member(sides, named, names_expr, key_texts, pointer, extra_pointer, conjunction)
        n_req = sum(1 for _, r in members if r)
        if max_p is not None and n_req > max_p:
            return fa.NOTHING
        if extra_member is None:  # at most the declared members: bounds past their number say nothing more
            if min_p > len(members):
                return fa.NOTHING
            if max_p is not None and max_p >= len(members):
                max_p = None
        counted = min_p > 0 or max_p is not None
        if counted:
            # the automaton counts members up to the larger bound, a state (at least) per count: one past the
            # state budget is refused before building an expression of that size
            key, bound = ("maxProperties", max_p) if max_p is not None else ("minProperties", min_p)
            if bound > self.opts.max_states:
                raise fa.BudgetExceeded(f"'{key}' {bound} counts members past the state budget of "
                                        f"{self.opts.max_states} states", pointer=join_pointer(pointer, key))
        body = self.members(members, extra_member, min_p, max_p) if counted else self.members_uncounted(members, extra_member)
        return fa.concat(syntax.obj_open, body, syntax.obj_close)

    def extra_member(self, sides: list, named: set[str], names_expr: fa.Expr | None, key_texts: fa.Dfa | None,
                     pointer: str, extra_pointer: str, conjunction: Any) -> fa.Expr | None:
        """`object`'s members under keys other than `named`: the keys partitioned by which patterns (of any side) they
        match, each part's value the conjunction of those patterns' schemas, else of the sides' additionalProperties;
        None when no other key may come."""
        if all(extra is False and not patterns for _, patterns, extra in sides):
            return None  # closed on every side: the partition below would find no member
        syntax = self.syntax
        key_text = fa.difference(ANY_TEXT, fa.union(*(fa.literal(n.encode()) for n in named))) if named else ANY_TEXT
        if names_expr is not None:
            key_text = fa.intersect(key_text, names_expr)
        all_patterns = [(dfa, where) for _, patterns, _ in sides for dfa, _, where in patterns]
        regions: list[tuple[fa.Expr, frozenset[int]]] = [(key_text, frozenset())]
        for i, (dfa, where) in enumerate(all_patterns):
            split = []
            for keys, matched in regions:
                for part, now in ((fa.intersect(keys, dfa), matched | {i}), (fa.difference(keys, dfa), matched)):
                    part = fa.compile(part, max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=pointer)
                    if not part.is_empty:
                        split.append((part, now))
            if len(split) > MAX_KEY_REGIONS:
                raise UnsupportedSchema(
                    f"the 'patternProperties' up to this one split the undeclared keys into more than {MAX_KEY_REGIONS} "
                    "sets by the patterns they match (each set is a member automaton of its own)", pointer=where)
            regions = split
        extra_members = []
        for keys, matched in regions:
            parts: list[tuple[Any, str]] = []
            i = 0
            for _, patterns, extra in sides:
                mine = [(sub, where) for k, (_, sub, where) in enumerate(patterns, start=i) if k in matched]
                i += len(patterns)
                parts += mine if mine else [(extra, extra_pointer)]
            value = conjunction(parts)
            if value != fa.NOTHING:
                key = syntax.extra_key(keys) if key_texts is None else fa.intersect(syntax.extra_key(keys), key_texts)
                extra_members.append(syntax.member(key, value))
        return fa.union(*extra_members) if extra_members else None

    def pattern_properties(self, schema: dict, pointer: str) -> list[tuple[fa.Dfa, Any, str]]:
        """(automaton of the decoded keys it matches, schema, pointer) per `patternProperties` entry."""
        if "patternProperties" not in schema:
            return []
        from constrain import regex as _regex

        entries = schema["patternProperties"]
        if not isinstance(entries, dict):
            raise InvalidSchema("'patternProperties' must be an object", pointer=join_pointer(pointer, "patternProperties"))
        out = []
        for pattern, sub in entries.items():
            where = join_pointer(pointer, "patternProperties", pattern)
            dfa = fa.compile(_regex.pattern_expr(pattern, pointer=where), max_states=self.opts.max_states, deadline=self.deadline, pointers=self.pointers, pointer=where)
            out.append((dfa, sub, where))
        return out

    def property_names(self, names_schema: Any, pointer: str) -> fa.Expr:
        if names_schema is False:
            return fa.NOTHING
        if not isinstance(names_schema, dict):
            raise InvalidSchema("'propertyNames' must be a schema", pointer=pointer)
        resolved, pointer, _ = self.resolve(names_schema, pointer, ())
        if resolved is None:
            return fa.NOTHING
        allowed = {"type", "minLength", "maxLength", "pattern", "format", "_patterns", "_formats", "enum", "const"}
        for key in resolved:
            if key not in allowed and key not in ANNOTATIONS:
                raise UnsupportedSchema(f"'propertyNames' with '{key}' is not supported", pointer=join_pointer(pointer, key))
        if resolved.get("type", "string") not in ("string", ["string"]):
            return fa.NOTHING
        if "enum" in resolved or "const" in resolved:
            values = resolved.get("enum", [resolved.get("const")])
            if not isinstance(values, list):
                raise InvalidSchema("'enum' must be an array", pointer=join_pointer(pointer, "enum"))
            return fa.union(*(fa.literal(v.encode()) for v in values if isinstance(v, str)))
        return self.decoded_string(resolved, pointer)

    def members_uncounted(self, members: list[tuple[fa.Expr, bool]], extra: fa.Expr | None) -> fa.Expr:
        """Declared members in order (optional ones skippable), then any number of extra members."""
        # Built back to front: after(i, any) = what may follow once slots < i are settled,
        # `any` telling whether a member was already written (so the next one needs a comma).
        n = len(members)
        after_none: fa.Expr = fa.EMPTY if extra is None else fa.optional(fa.concat(extra, fa.repeat(fa.concat(self.syntax.member_sep, extra), 0)))
        after_some: fa.Expr = fa.EMPTY if extra is None else fa.repeat(fa.concat(self.syntax.member_sep, extra), 0)
        for i in range(n - 1, -1, -1):
            member, is_required = members[i]
            take_none = fa.concat(member, after_some)
            take_some = fa.concat(self.syntax.member_sep, member, after_some)
            if is_required:
                after_none, after_some = take_none, take_some
            else:
                after_none, after_some = fa.union(take_none, after_none), fa.union(take_some, after_some)
        return after_none

    def members(self, members: list[tuple[fa.Expr, bool]], extra: fa.Expr | None, min_p: int, max_p: int | None) -> fa.Expr:
        """Like `members_uncounted`, with the number of members kept within [min_p, max_p]."""
        cap = (max_p if max_p is not None else min_p) + 1  # counts >= cap are equivalent when max_p is None

        def bump(c: int) -> int:
            return min(c + 1, cap) if max_p is None else c + 1

        def ok(c: int) -> bool:
            return c >= min_p and (max_p is None or c <= max_p)

        n = len(members)
        # after[c] for slot index i, built back to front
        counts = range(cap + 1)
        # extras[c]: what may follow once every declared slot is settled with c members written (built from the top
        # count down, iteratively: a large maxProperties must not recurse)
        extras: dict[int, fa.Expr] = {}
        for c in reversed(counts):
            done = fa.EMPTY if ok(c) else fa.NOTHING
            if extra is None or (max_p is not None and c >= max_p):
                extras[c] = done
            elif max_p is None and c == cap:
                extras[c] = fa.repeat(fa.concat(self.syntax.member_sep, extra), 0) if ok(c) else fa.NOTHING
            else:
                sep = self.syntax.member_sep if c > 0 else fa.EMPTY
                extras[c] = fa.union(done, fa.concat(sep, extra, extras[bump(c)]))
        after = dict(extras)
        for i in range(n - 1, -1, -1):
            member, is_required = members[i]
            nxt = {}
            for c in counts:
                if max_p is not None and c >= max_p:
                    take = fa.NOTHING
                else:
                    sep = self.syntax.member_sep if c > 0 else fa.EMPTY
                    take = fa.concat(sep, member, after[bump(c)])
                nxt[c] = take if is_required else fa.union(take, after[c])
            after = nxt
        return after[0]
