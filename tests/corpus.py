"""Shared-corpus harness: loaders, the canonical instance writer, a crash-proof runner and the baseline ratchet.

In: the JSONL corpora under /work/shared/data. Out: per schema a compile status, per instance a verdict
against python-jsonschema (the oracle), and the comparison of such results with a committed baseline.
"""

from __future__ import annotations

import json
import math
import re
import multiprocessing
import multiprocessing.connection
import random
import time
import traceback
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Iterable

import jsonschema
from paths import DATA  # noqa: E402

from constrain.schema import disjoint_branches, mentions_not, negated, ranked_names  # the key order the writing rules give (not validity)


BASELINES = Path(__file__).resolve().parent / "baselines"

# Compile options every corpus run uses (the public defaults, spelled out so a default change shows up here).
OPTIONS = {"strict": False, "whitespace": "flexible", "max_depth": 3, "max_states": 100_000, "timeout_s": 10.0}
# A worker that has not answered after this long is killed and its schema recorded as a hang.
HARD_TIMEOUT_S = 120.0

SCHEMA_STATUSES = ("compiled", "InvalidSchema", "UnsupportedSchema", "BudgetExceeded", "crash", "hang")
# Instance verdicts, best first. `oracle_error`: python-jsonschema itself failed on the instance.
RESULTS = ("agree", "not_canonicalisable", "oracle_error", "false_reject", "false_accept")
_RANK = {"agree": 0, "not_canonicalisable": 1, "oracle_error": 1, "false_reject": 2, "false_accept": 3}


@dataclass
class Instance:
    id: str
    data: Any
    label: bool | None = None  # the upstream `valid` label, where the corpus has one


@dataclass
class Case:
    id: str
    group: str  # the row of the report table (dataset, keyword group, tool category)
    schema: Any
    instances: list[Instance] = field(default_factory=list)
    draft: str | None = None  # the oracle's draft when the schema has no `$schema` (Draft 2020-12 if None)

    @property
    def compiled_schema(self) -> Any:
        """The schema as the compiler is given it: with its draft's `$schema` when it names none (the test suite's
        draft-7 files leave the draft to the runner), so that compiler and oracle read the same draft."""
        uri = _META_URIS.get(self.draft)
        if uri is None or not isinstance(self.schema, dict) or "$schema" in self.schema:
            return self.schema
        return {"$schema": uri, **self.schema}


# the `$schema` of each oracle draft a corpus names (`Case.draft`)
_META_URIS = {"Draft7Validator": "http://json-schema.org/draft-07/schema#"}


# ---------------------------------------------------------------------------
# loaders
# ---------------------------------------------------------------------------


def _jsonl(path: Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def jsonschemabench() -> list[Case]:
    """JSONSchemaBench: one case per schema, grouped by dataset, with upstream's valid/invalid instances."""
    cases = []
    for path in sorted((DATA / "jsonschemabench").glob("*.jsonl")):
        for rec in _jsonl(path):
            instances = [Instance(str(i), t["data"], t["valid"]) for i, t in enumerate(rec["tests"])]
            cases.append(Case(rec["id"], rec["dataset"], rec["schema"], instances))
    return cases


def json_schema_test_suite() -> list[Case]:
    """JSON-Schema-Test-Suite: one case per schema group, grouped by keyword group."""
    cases = []
    for n, rec in enumerate(_jsonl(DATA / "json-schema-test-suite" / "tests.jsonl")):
        instances = [Instance(str(i), t["data"], t["valid"]) for i, t in enumerate(rec["tests"])]
        stem = rec["file"].rsplit("/", 1)[-1].removesuffix(".json")
        draft = _DRAFTS[rec["draft"]]
        cases.append(Case(f"{rec['draft']}/{stem}/{n}", rec["keyword_group"], rec["schema"], instances, draft))
    return cases


class _Tools:
    """Distinct tool schemas; instances are the arguments of example and ground-truth calls."""

    def __init__(self) -> None:
        self.cases: dict[str, Case] = {}
        self.by_name: dict[tuple[str, str], str] = {}

    def add(self, group: str, name: str, schema: Any) -> str:
        key = json.dumps(schema, sort_keys=True)
        base = f"{group}/{name}"
        case_id, n = base, 1
        while case_id in self.cases and json.dumps(self.cases[case_id].schema, sort_keys=True) != key:
            n += 1
            case_id = f"{base}#{n}"
        self.cases.setdefault(case_id, Case(case_id, group, schema))
        self.by_name[(group, name)] = case_id
        return case_id

    def call(self, group: str, name: str, instance_id: str, arguments: Any) -> None:
        case_id = self.by_name.get((group, name))
        if case_id is not None:
            self.cases[case_id].instances.append(Instance(instance_id, arguments))


def tools() -> list[Case]:
    """BFCL (per category), MCP reference servers and StableToolBench tool parameter schemas."""
    t = _Tools()
    bfcl = DATA / "bfcl" / "openai"
    single = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple", "irrelevance", "sql"]
    for category in single:
        for rec in _jsonl(bfcl / f"{category}.jsonl"):
            group = f"BFCL/{category}"
            for tool in rec["tools"]:
                t.add(group, tool["function"]["name"], tool["function"]["parameters"])
            for i, call in enumerate(rec.get("example_calls") or []):
                # a name may be shared by two different schemas in one category: attach to the case's own tool
                for tool in rec["tools"]:
                    if tool["function"]["name"] == call["name"]:
                        t.add(group, call["name"], tool["function"]["parameters"])
                t.call(group, call["name"], f"{rec['id']}/{i}", call["arguments"])
    for rec in _jsonl(bfcl / "multi_turn_func_doc.jsonl"):
        for tool in rec["tools"]:
            t.add("BFCL/multi_turn", f"{rec['func_doc_file']}.{tool['function']['name']}", tool["function"]["parameters"])
    names = {}
    for rec in _jsonl(bfcl / "multi_turn_func_doc.jsonl"):
        for tool in rec["tools"]:
            names.setdefault(tool["function"]["name"], f"{rec['func_doc_file']}.{tool['function']['name']}")
    for category in ("multi_turn_base", "multi_turn_long_context", "multi_turn_miss_func", "multi_turn_miss_param"):
        for rec in _jsonl(bfcl / f"{category}.jsonl"):
            for turn, calls in enumerate(rec.get("ground_truth_calls") or []):
                for i, call in enumerate(calls):
                    if call["name"] in names:
                        t.call("BFCL/multi_turn", names[call["name"]], f"{rec['id']}/{turn}/{i}", call["arguments"])
    for rec in _jsonl(DATA / "mcp_reference_servers" / "tools.jsonl"):
        for tool in rec["tools"]:
            t.add("MCP", f"{rec['server']}.{tool['function']['name']}", tool["function"]["parameters"])
    for path in sorted((DATA / "stabletoolbench" / "openai").glob("*.jsonl")):
        for rec in _jsonl(path):
            for tool in rec["tools"]:
                t.add(f"StableToolBench/{rec['group']}", tool["function"]["name"], tool["function"]["parameters"])
    return list(t.cases.values())


CORPORA: dict[str, Callable[[], list[Case]]] = {
    "jsonschemabench": jsonschemabench,
    "json_schema_test_suite": json_schema_test_suite,
    "tools": tools,
}


def sample(cases: list[Case], n_per_group: int, seed: int = 0) -> list[Case]:
    """A seeded sample of at most `n_per_group` cases from each group (for --quick and development)."""
    rng = random.Random(seed)
    groups: dict[str, list[Case]] = {}
    for c in cases:
        groups.setdefault(c.group, []).append(c)
    out = []
    for members in groups.values():
        out += members if len(members) <= n_per_group else rng.sample(members, n_per_group)
    return out


# ---------------------------------------------------------------------------
# the oracle
# ---------------------------------------------------------------------------


_DRAFTS = {"draft2020-12": "Draft202012Validator", "draft7": "Draft7Validator"}


def validator(schema: Any, draft: str | None = None) -> jsonschema.protocols.Validator:
    """python-jsonschema for `schema`: its `$schema` draft, else `draft` (a jsonschema class name) or Draft 2020-12;
    format assertion on."""
    default = getattr(jsonschema, draft or "Draft202012Validator")
    cls = jsonschema.validators.validator_for(schema, default=default)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# ---------------------------------------------------------------------------
# the canonical writer
# ---------------------------------------------------------------------------


class NotCanonicalisable(Exception):
    """The instance has no text in constrain's writing rules (lone surrogate, non-finite number, unresolvable $ref)."""


class CanonicalWriter:
    """Writes instances of one schema in constrain's writing rules (docs/guarantees.md).

    Object keys: the declared properties in schema order (after `$ref`; `allOf`: the parent's, then each part's new
    ones; `anyOf`/`oneOf`: then the first branch the instance validates against; dependencies and `if`/`then`/`else`
    as the allOf parts the compiler rewrites them to), then required names that no `properties` declares, in
    `required` order, then undeclared keys in the instance's order. Below a `oneOf` (but one whose branches no value
    satisfies two of, `schema.disjoint_branches`: written as an anyOf) every object, at any depth, orders the names
    the oneOf mentions by their first mention there (unnamed keys last); under `not` (and a `oneOf` that
    mentions one, the `else` side of `if`, the elements of a `maxContains` array) by the schema-wide ranking of every
    name the schema mentions (constrain/schema.py `_Compiler.ranked`). A key's value is
    written under its `properties` entry and every `patternProperties` entry it matches, else `additionalProperties`.
    Integral numbers without a fraction, other numbers without an exponent, strings as
    `json.dumps(ensure_ascii=False)`. Compact separators unless `separators` says otherwise.
    """

    def __init__(self, schema: Any, separators: tuple[str, str] = (",", ":"), oracle: Any = None):
        self.root = schema
        self.oracle = oracle if oracle is not None else validator(schema)
        self.comma, self.colon = separators

    def text(self, data: Any) -> bytes:
        try:
            return self._write([self.root], data, None).encode("utf-8")
        except UnicodeEncodeError as err:
            raise NotCanonicalisable("lone surrogate in a string") from err

    # conjunctions: a list of schemas that all apply to the same value

    def _lookup(self, ref: str) -> Any:
        try:
            return self.oracle._resolver.lookup(ref).contents
        except Exception as err:  # referencing raises several unrelated classes
            raise NotCanonicalisable(f"cannot resolve $ref {ref!r}") from err

    def _desugar(self, schema: dict, data: Any) -> dict:
        """`schema` with dependencies and if/then/else as allOf parts holding an anyOf of the one branch that holds
        for `data` (the compiler rewrites them into anyOf parts: per dependency `name` absent or present with its
        requirement; `if`: allOf[if, then] or allOf[not if, else]), so that their keys come where an anyOf's
        branch's do: after the rest of the conjunction, a `$ref`'s siblings included."""
        if not any(k in schema for k in _DESUGARED):
            return schema
        out = {k: v for k, v in schema.items() if k not in _DESUGARED}
        parts: list[Any] = []
        for key in ("dependencies", "dependentRequired", "dependentSchemas"):
            deps = schema.get(key)
            for name, need in deps.items() if isinstance(deps, dict) and isinstance(data, dict) else ():
                if name not in data:
                    continue
                if isinstance(need, list) and key != "dependentSchemas":
                    parts.append({"anyOf": [{"required": [name, *need]}]})
                elif isinstance(need, (dict, bool)) and key != "dependentRequired" and need is not True and need != {}:
                    parts.append({"anyOf": [{"allOf": [{"required": [name]}, need]}]})
        if "if" in schema:
            cond, then, other = schema["if"], schema.get("then", True), schema.get("else", True)
            if cond is True:
                parts.append(then)
            elif cond is False:
                parts.append(other)
            elif then is not True or other is not True:
                branch = {"allOf": [cond, then]} if self._valid(cond, data) else {"allOf": [{"not": cond}, other]}
                parts.append({"anyOf": [branch]})
        if not parts:
            return out
        return {**out, "allOf": [*out.get("allOf", []), *parts]} if isinstance(out.get("allOf", []), list) else out

    def _flatten(self, schema: Any, data: Any, out: list[dict], chain: tuple[int, ...] = ()) -> None:
        if not isinstance(schema, dict) or id(schema) in chain:
            return
        chain = chain + (id(schema),)
        schema = self._desugar(schema, data)
        if "$ref" in schema:
            self._flatten(self._lookup(schema["$ref"]), data, out, chain)
            schema = {k: v for k, v in schema.items() if k != "$ref"}
        if "allOf" in schema and isinstance(schema["allOf"], list):
            self._flatten({k: v for k, v in schema.items() if k != "allOf"}, data, out, chain)
            for part in schema["allOf"]:
                self._flatten(part, data, out, chain)
            return
        positive = negated(schema["not"]) if "not" in schema else None
        if positive not in (None, True, False):
            # as the compiler: a `not` with an exact positive form is that form, after the rest (`schema.negated`)
            self._flatten({k: v for k, v in schema.items() if k != "not"}, data, out, chain)
            self._flatten(positive, data, out, chain)
            return
        out.append(schema)

    def _conjuncts(self, schemas: list[Any], data: Any, rank: dict[str, int] | None) -> tuple[list[dict], dict[str, int] | None]:
        """Flattened conjunction, with each anyOf/oneOf replaced by its first branch `data` is valid against, and
        the key ranking in force for `data` (`rank` extended below a `oneOf` and under a `not`)."""
        flat: list[dict] = []
        for s in schemas:
            self._flatten(s, data, flat)
        expanded: set[tuple[str, int]] = set()
        while True:
            # as the compiler: every anyOf first (its branches' anyOfs too), then the oneOfs, whose branches (the
            # cross product when several merge) are written under one ranking of the names they and the rest mention
            # (of the whole schema's names when they mention a `not`: `_Compiler.ranked`)
            for key in ("anyOf", "oneOf"):
                todo = [i for i, c in enumerate(flat) if (key, i) not in expanded and isinstance(c.get(key), list) and c[key]]
                if todo:
                    break
            else:
                break
            if key == "oneOf":
                others = [{k: v for k, v in c.items() if k not in ("anyOf", "oneOf")} for c in flat]
                rest = _merged_view(others)
                combos: list[list[Any]] = [[]]
                for i in todo:
                    combos = [[*combo, b] for combo in combos for b in flat[i][key]]
                nodes = [rest, *combos]
                # (a oneOf no value satisfies two branches of is written as its anyOf: `schema.disjoint_branches`)
                if not disjoint_branches({"allOf": others}, [{"allOf": combo} for combo in combos], self._lookup_or_none):
                    rank = self._ranked(rank, [self.root, *nodes] if mentions_not(nodes) else nodes)
            for i in todo:
                expanded.add((key, i))
                branches = flat[i][key]
                self._flatten(next((b for b in branches if self._valid(b, data)), branches[0]), data, flat)
        # a `not` ranks the keys of the whole value, except where an enum/const writes it (the enum's own text); one
        # the compiler rewrites without the universe (`schema.negated`) was replaced by its positive form in `_flatten`
        if any("not" in c and negated(c["not"]) is None for c in flat) and not any("const" in c or "enum" in c for c in flat):
            rank = self._ranked(rank, [self.root, _merged_view(flat)])
        return flat, rank

    def _lookup_or_none(self, ref: str) -> Any:
        try:
            return self._lookup(ref)
        except NotCanonicalisable:
            return None

    def _ranked(self, rank: dict[str, int] | None, nodes: list[Any]) -> dict[str, int]:
        """`rank` extended by every property name `nodes` mention, in the order of first mention (`properties`,
        `required`, strings listed in `propertyNames`, dependencies; local `$ref`s followed where they occur)."""
        return ranked_names(nodes, rank, self._lookup_or_none)

    def _valid(self, schema: Any, data: Any) -> bool:
        try:
            return self.oracle.evolve(schema=schema).is_valid(data)
        except Exception:  # the oracle failing on one branch only makes the branch not chosen
            return False

    def _listed_value(self, conj: list[dict], data: Any, rank: dict[str, int] | None) -> str | None:
        """The text of `data` when a const/enum lists it: its own key order (or the ranking's)."""
        for c in conj:
            for value in ([c["const"]] if "const" in c else []) + (c["enum"] if isinstance(c.get("enum"), list) else []):
                if isinstance(value, (dict, list)) and _json_equal(value, data):
                    return self._write([], value, rank)
        return None

    def _write(self, schemas: list[Any], data: Any, rank: dict[str, int] | None) -> str:
        if isinstance(data, dict):
            conj, rank = self._conjuncts(schemas, data, rank)
            listed = self._listed_value(conj, data, rank)
            if listed is not None:
                return listed
            order: list[str] = []
            for key in ("properties", "required"):  # declared names, then required names no properties declares
                for c in conj:
                    names = c.get(key)
                    if isinstance(names, (dict, list)):
                        # (a name listed twice, `dependentRequired: {a: [a]}`, is written once)
                        order += [k for k in dict.fromkeys(names) if isinstance(k, str) and k in data and k not in order]
            order += [k for k in data if k not in order]
            if rank is not None:
                order.sort(key=lambda k: rank.get(k, len(rank)))
            members = []
            for k in order:
                subs = []
                evaluated = False
                for c in conj:
                    props = c.get("properties") if isinstance(c.get("properties"), dict) else {}
                    patterns = c.get("patternProperties") if isinstance(c.get("patternProperties"), dict) else {}
                    matching = [sub for pattern, sub in patterns.items() if _search(pattern, k)]
                    evaluated |= k in props or bool(matching) or "additionalProperties" in c
                    if k in props:
                        subs += [props[k], *matching]
                    elif matching:
                        subs += matching
                    elif isinstance(c.get("additionalProperties"), dict):
                        subs.append(c["additionalProperties"])
                if not evaluated:  # (a key no part evaluates is written under unevaluatedProperties)
                    subs += [c["unevaluatedProperties"] for c in conj if isinstance(c.get("unevaluatedProperties"), dict)]
                members.append(json.dumps(k, ensure_ascii=False) + self.colon + self._write(subs, data[k], rank))
            return "{" + self.comma.join(members) + "}"
        if isinstance(data, list):
            conj, rank = self._conjuncts(schemas, data, rank)
            listed = self._listed_value(conj, data, rank)
            if listed is not None:
                return listed
            # an element valid against `contains` is written as one (allOf[its items schema, contains]); under
            # `maxContains` every element is written in the schema-wide key ranking
            counting = [c["contains"] for c in conj if "contains" in c and (c.get("minContains", 1) != 0 or "maxContains" in c)]
            if any("contains" in c and "maxContains" in c for c in conj):
                rank = self._ranked(rank, [self.root, _merged_view(conj)])
            items = []
            for i, v in enumerate(data):
                subs = [s for c in conj if (s := _item_schema(c, i)) is not None]
                if not any(_evaluates_item(c, i) for c in conj):  # (written under unevaluatedItems)
                    subs += [c["unevaluatedItems"] for c in conj if isinstance(c.get("unevaluatedItems"), dict)]
                subs += [s for s in counting if self._valid(s, v)]
                items.append(self._write(subs, v, rank))
            return "[" + self.comma.join(items) + "]"
        return number_text(data) if isinstance(data, (int, float)) and not isinstance(data, bool) else json.dumps(data, ensure_ascii=False)


# keywords the compiler rewrites into allOf parts (`constrain.schema._desugar`)
_DESUGARED = frozenset({"dependencies", "dependentRequired", "dependentSchemas", "if", "then", "else"})


def _merged_view(conj: list[dict]) -> dict:
    """The conjunction as one schema, for the order in which names are first mentioned (as the compiler's merged
    schema: all `properties` names, then all `required` names, then the keywords' subschemas part by part)."""
    view: dict[str, Any] = {}
    for c in conj:
        for k, v in c.items():
            if k == "properties" and isinstance(v, dict) and isinstance(view.get(k, {}), dict):
                props = view.setdefault(k, {})
                for name, sub in v.items():
                    props[name] = [props[name], sub] if name in props else sub
            elif k == "required" and isinstance(v, list) and isinstance(view.get(k, []), list):
                view[k] = list(dict.fromkeys([*view.get(k, []), *v]))
            else:
                view[k] = [view[k], v] if k in view else v
    return view


def _search(pattern: str, key: str) -> bool:
    """Whether `pattern` matches `key` anywhere (as python-jsonschema reads patternProperties; an unreadable pattern
    matches nothing here, and the oracle reports it)."""
    try:
        return re.search(pattern, key) is not None
    except re.error:
        return False


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_equal, a, b))
    return a == b


def _evaluates_item(schema: dict, i: int) -> bool:
    """Whether `schema`'s own `prefixItems`/`items`/`additionalItems` evaluate the i-th item."""
    prefix, rest = schema.get("prefixItems"), schema.get("items")
    if isinstance(rest, list):  # draft 4-7 tuple form
        prefix, rest = rest, schema.get("additionalItems")
    return (isinstance(prefix, list) and i < len(prefix)) or rest is not None


def _item_schema(schema: dict, i: int) -> Any:
    prefix = schema.get("prefixItems")
    rest = schema.get("items")
    if isinstance(rest, list):  # draft 4-7 tuple form
        prefix, rest = rest, schema.get("additionalItems")
    if isinstance(prefix, list) and i < len(prefix):
        return prefix[i]
    return rest if isinstance(rest, dict) else None


def number_text(x: int | float) -> str:
    """A number in the writing rules: integral values without a fraction, never an exponent.

    Kept apart from `constrain.numbers.canonical_text` on purpose: the compiler spells enum values with that function,
    and the instances it is judged on must not be written by the code under test."""
    if isinstance(x, int):
        return str(x)
    if not math.isfinite(x):
        raise NotCanonicalisable(f"non-finite number {x!r}")
    if x.is_integer():
        return str(int(x))
    text = repr(x)
    if "e" in text or "E" in text:
        text = format(Decimal(text), "f")
    return text


# ---------------------------------------------------------------------------
# running one case
# ---------------------------------------------------------------------------


def short_reason(err: Exception) -> str:
    """The first words of an error message, for grouping failures."""
    words = str(getattr(err, "message", err)).split()
    return " ".join(words[:6])


def run_case(case: Case, options: dict | None = None) -> dict:
    """Compile one schema and judge its instances: {status, reason, pointer, ms, states, instances{id: verdict}, label_disagreements}."""
    from constrain import InvalidSchema, UnsupportedSchema
    from constrain import automaton as fa
    from constrain.schema import compile_schema

    out: dict[str, Any] = {"status": None, "reason": "", "pointer": None, "ms": None, "states": None, "instances": {}, "label_disagreements": 0}
    start = time.perf_counter()
    try:
        compiled = compile_schema(case.compiled_schema, **(options or OPTIONS))
    except fa.BudgetExceeded as err:
        out.update(status="BudgetExceeded", reason=short_reason(err), pointer=err.pointer)
    except UnsupportedSchema as err:
        out.update(status="UnsupportedSchema", reason=short_reason(err), pointer=err.pointer)
    except InvalidSchema as err:
        out.update(status="InvalidSchema", reason=short_reason(err), pointer=err.pointer)
    except Exception as err:  # any other exception is a compiler bug: record it, do not stop the corpus
        out.update(status="crash", reason=f"{type(err).__name__}: {err}"[:200], trace=traceback.format_exc()[-2000:])
    out["ms"] = round((time.perf_counter() - start) * 1000, 1)
    if out["status"] is not None:
        return out
    out["status"] = "compiled"
    out["states"] = compiled.dfa.n_states
    try:
        oracle = validator(case.schema, case.draft)
    except Exception as err:  # the oracle rejects the schema (e.g. a regex Python's re cannot read)
        out["oracle_error"] = short_reason(err)
        oracle = None
    writer = CanonicalWriter(case.schema, oracle=oracle) if oracle is not None else None
    for inst in case.instances:
        out["instances"][inst.id] = judge(compiled.dfa, oracle, writer, inst, out)
    return out


def judge(dfa: Any, oracle: Any, writer: CanonicalWriter | None, inst: Instance, out: dict | None = None) -> str:
    """One instance's verdict: does the automaton's membership agree with the oracle's validity?"""
    if oracle is None or writer is None:
        return "oracle_error"
    try:
        valid = oracle.is_valid(inst.data)
    except Exception:  # e.g. a pattern in a dialect Python's re does not read
        return "oracle_error"
    try:
        text = writer.text(inst.data)
        # the text must denote a value of the same validity (draft 4: `1.0` is not an integer, its text `1` is)
        if oracle.is_valid(json.loads(text)) != valid:
            raise NotCanonicalisable("the canonical text changes the instance's validity")
    except NotCanonicalisable:
        return "not_canonicalisable"
    accepted = dfa.matches(text)
    if out is not None and inst.label is not None and inst.label != valid:
        out["label_disagreements"] += 1
        if accepted == inst.label:  # the compiler sides with upstream against the oracle (regex dialect, formats)
            out.setdefault("label_sides", []).append(inst.id)
    if accepted == valid:
        return "agree"
    return "false_accept" if accepted else "false_reject"


# ---------------------------------------------------------------------------
# a crash- and hang-proof pool
# ---------------------------------------------------------------------------

_CASES: list[Case] = []


def _worker(conn: multiprocessing.connection.Connection, options: dict | None) -> None:
    while True:
        i = conn.recv()
        if i is None:
            return
        try:
            result = run_case(_CASES[i], options)
        except BaseException as err:  # noqa: BLE001 - reported to the parent as a crash
            result = {"status": "crash", "reason": f"{type(err).__name__}: {err}"[:200], "instances": {}}
        conn.send((i, result))


def run_cases(cases: list[Case], workers: int = 2, options: dict | None = None, hard_timeout_s: float = HARD_TIMEOUT_S,
              progress: Callable[[dict[str, dict], int], None] | None = None) -> dict[str, dict]:
    """`run_case` on every case in `workers` forked processes; a process past `hard_timeout_s` is killed (status 'hang').

    `progress(results so far, total)` is called after each case (for progress lines and checkpoints).
    """
    global _CASES
    _CASES = cases
    ctx = multiprocessing.get_context("fork")
    results: dict[str, dict] = {}
    todo = list(range(len(cases)))[::-1]
    slots: list[dict] = []

    def start() -> dict:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child, options), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "task": None, "since": 0.0}

    def feed(slot: dict) -> None:
        if todo:
            slot["task"] = todo.pop()
            slot["since"] = time.monotonic()
            slot["conn"].send(slot["task"])
        else:
            slot["task"] = None

    try:
        for _ in range(max(1, min(workers, len(cases)))):
            slot = start()
            slots.append(slot)
            feed(slot)
        while any(s["task"] is not None for s in slots):
            busy = [s for s in slots if s["task"] is not None]
            ready = multiprocessing.connection.wait([s["conn"] for s in busy], timeout=1.0)
            for s in busy:
                if s["conn"] in ready:
                    try:
                        i, result = s["conn"].recv()
                    except EOFError:  # the worker died (e.g. out of memory)
                        i, result = s["task"], {"status": "crash", "reason": "worker died", "instances": {}}
                        s["proc"].join()
                        s.update(start())
                    results[cases[i].id] = result
                    feed(s)
                    if progress:
                        progress(results, len(cases))
                elif time.monotonic() - s["since"] > hard_timeout_s:
                    s["proc"].kill()
                    s["proc"].join()
                    results[cases[s["task"]].id] = {"status": "hang", "reason": f"no answer in {hard_timeout_s:.0f} s", "instances": {}}
                    s.update(start())
                    feed(s)
    finally:
        for s in slots:
            if s["proc"].is_alive():
                s["conn"].send(None)
                s["proc"].join(timeout=5)
                if s["proc"].is_alive():
                    s["proc"].kill()
        _CASES = []
    return results


# ---------------------------------------------------------------------------
# baselines (the ratchet)
# ---------------------------------------------------------------------------


def to_baseline(results: dict[str, dict]) -> dict:
    """The committed form: per schema its status and per instance its verdict."""
    return {
        "options": OPTIONS,
        "schemas": {
            cid: {"status": r["status"], **({"instances": dict(sorted(r["instances"].items()))} if r["instances"] else {})}
            for cid, r in sorted(results.items())
        },
    }


def load_baseline(name: str) -> dict:
    with open(BASELINES / f"{name}.json", encoding="utf-8") as f:
        return json.load(f)


def write_baseline(name: str, results: dict[str, dict]) -> Path:
    BASELINES.mkdir(parents=True, exist_ok=True)
    path = BASELINES / f"{name}.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_baseline(results), f, indent=0, sort_keys=False, ensure_ascii=False)
        f.write("\n")
    return path


def is_time_budget(result: dict) -> bool:
    """A compile stopped by `timeout_s`: depends on machine load, so the ratchet does not judge it."""
    return result["status"] == "BudgetExceeded" and "time budget" in result.get("reason", "")


def compare(baseline: dict, results: dict[str, dict]) -> tuple[list[str], list[str], list[str]]:
    """(regressions, improvements, unstable) of `results` against `baseline`.

    Regressions: a schema that compiled and no longer does; an instance whose verdict got worse
    (agree → false_reject → false_accept); a false accept the baseline does not list; a schema the
    corpus lost. Unstable: a status change into or out of the time budget (machine load, not code).
    """
    regressions, improvements, unstable = [], [], []
    base = baseline["schemas"]
    for cid, r in sorted(results.items()):
        b = base.get(cid, {"status": None})
        if b["status"] == "compiled" and r["status"] != "compiled":
            (unstable if is_time_budget(r) else regressions).append(f"{cid}: compiled -> {r['status']} ({r.get('reason', '')})")
        elif b["status"] != "compiled" and r["status"] == "compiled":
            improvements.append(f"{cid}: {b['status']} -> compiled")
        elif b["status"] != r["status"] and not is_time_budget(r):
            improvements.append(f"{cid}: {b['status']} -> {r['status']} ({r.get('reason', '')})")
        b_inst = b.get("instances", {})
        for iid, verdict in sorted(r["instances"].items()):
            old = b_inst.get(iid)
            if old == verdict:
                continue
            if verdict == "false_accept" or (old == "agree" and verdict == "false_reject"):
                regressions.append(f"{cid} instance {iid}: {old} -> {verdict}")
            elif old is not None and _RANK[verdict] < _RANK[old]:
                improvements.append(f"{cid} instance {iid}: {old} -> {verdict}")
    regressions += [f"{cid}: in the baseline but not in the corpus" for cid in sorted(set(base) - set(results))]
    return regressions, improvements, unstable


# ---------------------------------------------------------------------------
# random walks (soundness)
# ---------------------------------------------------------------------------


class Walker:
    """Samples accepted texts of a DFA: uniform over live byte classes, stopping at accepting states with
    probability `p_stop`, and past `soft_len` bytes only along shortest paths to acceptance."""

    def __init__(self, dfa: Any, p_stop: float = 0.3, soft_len: int = 200):
        from constrain import automaton as fa

        # counted strings' markers folded away: their bounds (2,048+ characters) lie past what `soft_len` lets a
        # string reach; deep values' stack kept (`fa.nested_values`)
        dfa, counters = fa.contract_counters(dfa)
        self.step = None  # with deep values: (state, byte, stack) -> state, refills taken as the cursor takes them
        if counters is not None and counters.refill is not None:
            views = (memoryview(dfa.transitions.ravel()), dfa.n_classes, dfa.class_of[:256].tolist(),
                     memoryview(counters.effect.ravel()), counters.limits)
            spill, refill = memoryview(counters.spill.ravel()), memoryview(counters.refill.ravel())
            self.step = lambda state, byte, stack: fa.walk_counted(*views, state, bytes([byte]), 0, -1, spill, refill, stack)[0]
        self.dfa = dfa
        self.rows = dfa.rows()
        self.p_stop = p_stop
        self.soft_len = soft_len
        self.dist = fa.shortest_distances(dfa).tolist()
        self.bytes_of: dict[int, list[int]] = {}
        for b in range(256):
            self.bytes_of.setdefault(int(dfa.class_of[b]), []).append(b)

    def walk(self, rng: random.Random) -> bytes:
        state, out, stack = self.dfa.start, bytearray(), []
        while True:
            row = self.rows[state]
            live = [(cls, t) for cls, bs in self.bytes_of.items() if (t := row[cls]) >= 0]
            if self.dfa.accepting[state] and (not live or rng.random() < self.p_stop or len(out) >= self.soft_len):
                return bytes(out)
            if len(out) >= self.soft_len:
                best = min(self.dist[t] for _, t in live)
                live = [(c, t) for c, t in live if self.dist[t] == best]
            cls, nxt = rng.choice(live)
            out.append(rng.choice(self.bytes_of[cls]))
            state = nxt if self.step is None else self.step(state, out[-1], stack)


def walk_violations(schema: Any, dfa: Any, n: int, seed: int = 0, draft: str | None = None) -> list[str]:
    """Texts sampled from `dfa` that are not JSON or not valid against `schema` (empty when sound)."""
    rng = random.Random(seed)
    oracle = validator(schema, draft)
    walker = Walker(dfa)
    bad = []
    for _ in range(n):
        text = walker.walk(rng)
        try:
            value = json.loads(text)
        except ValueError as err:
            bad.append(f"not JSON ({err}): {text[:200]!r}")
            continue
        errors = [e.message for e in oracle.iter_errors(value)][:1]
        if errors:
            bad.append(f"invalid ({errors[0][:120]}): {text[:200]!r}")
    return bad


def token_walk(index: Any, rng: random.Random, soft_len: int = 60, hard_len: int = 400) -> tuple[list[int], bool]:
    """Random token ids allowed by `index`'s masks, ending with EOS: uniform over allowed tokens, EOS with
    probability 0.3 where accepting; past `soft_len` tokens, the candidate leaving the fewest bytes to acceptance.
    Returns (ids without EOS, whether EOS was reached)."""
    from constrain import automaton as fa

    import numpy as np

    vocab, dfa = index.vocab, index.dfa
    eos = np.array(sorted(vocab.eos_ids))
    dist = fa.shortest_distances(dfa)
    # byte-level vocabularies have a token for every byte: closing along shortest paths always has a candidate
    single = np.array([t for t, b in enumerate(vocab.token_bytes) if len(b) == 1 and t not in vocab.special_ids])
    st, ids = index.start(), []
    while len(ids) < hard_len:
        allowed = st.allowed_token_ids()
        pool = allowed[~np.isin(allowed, eos)]
        closing = len(ids) >= soft_len
        if st.is_accepting() and (not len(pool) or closing or rng.random() < 0.3):
            st.advance(int(allowed[np.isin(allowed, eos)][0]))
            return ids, True
        if not closing:
            tok = int(pool[rng.randrange(len(pool))])
        else:
            picks = [int(pool[rng.randrange(len(pool))]) for _ in range(16)] + single[np.isin(single, pool)].tolist()
            tok = min(picks, key=lambda t: dist[dfa.step(st.dfa_state, vocab.token_bytes[t])])
        st.advance(tok)
        ids.append(tok)
    return ids, False


def token_accepts(index: Any, ids: list[int]) -> bool:
    """Whether the masks allow `ids` one by one and the text ends accepting (then EOS is allowed too)."""
    from constrain import MaskViolation

    st = index.start()
    try:
        for tok in ids:
            st.advance(tok)
        if not st.is_accepting():
            return False
        st.advance(index.vocab.eos_ids[0])
    except MaskViolation:
        return False
    return True


def summarize(cases: list[Case], results: dict[str, dict]) -> dict[str, dict]:
    """Per group: schemas, compiled, statuses, instance verdict counts and label disagreements."""
    table: dict[str, dict] = {}
    for c in cases:
        r = results[c.id]
        row = table.setdefault(c.group, {"schemas": 0, **{s: 0 for s in SCHEMA_STATUSES}, **{v: 0 for v in RESULTS},
                                         "instances": 0, "not_run": 0, "label_disagreements": 0, "ms": [],
                                         "label_sides_false_accept": 0, "label_sides_false_reject": 0})
        row["schemas"] += 1
        row[r["status"]] += 1
        row["instances"] += len(c.instances)
        row["not_run"] += len(c.instances) - len(r["instances"])
        row["label_disagreements"] += r.get("label_disagreements", 0)
        if r.get("ms") is not None:
            row["ms"].append(r["ms"])
        for v in r["instances"].values():
            row[v] += 1
        for iid in r.get("label_sides", []):
            row["label_sides_" + r["instances"][iid]] += 1
    return table

