"""Engine-benchmark workloads: real tool-call and JSON Schema grammars, built once per engine from one spec.

A workload is a sequence of parts, each either literal text or a JSON Schema value; every engine builds the same
language from it with its own public composition API (see `bench_engine.py`). Output style is compact JSON
(`,` and `:` with no whitespace) for every engine; every object schema is closed (`additionalProperties: false`)
so that engines whose default is open objects enforce the same language.

Sources: BFCL v4 (openai tool format) under /work/shared/data/bfcl/openai, JSONSchemaBench under
/work/shared/data/jsonschemabench (override the root with $CONSTRAIN_DATA).
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(os.environ.get("CONSTRAIN_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


@dataclass(frozen=True)
class Literal:
    text: str


@dataclass(frozen=True)
class Json:
    schema: Any


@dataclass
class Workload:
    name: str
    parts: list  # of Literal | Json
    description: str
    quick: bool = False  # part of --quick (CI)
    notes: list[str] = field(default_factory=list)

    @property
    def single_schema(self) -> Any | None:
        """The schema when the whole workload is one JSON value (no literal text around it)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Json):
            return self.parts[0].schema
        return None


def closed(schema: Any) -> Any:
    """A copy with `additionalProperties: false` on every object schema that does not set it; `description`s dropped."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            node.pop("description", None)
            if (node.get("type") == "object" or "properties" in node) and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for key, value in list(node.items()):
                if key in ("enum", "const", "default", "examples"):
                    continue
                if key == "properties" and isinstance(value, dict):
                    for sub in value.values():
                        walk(sub)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(schema)
    return schema


def _jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def bfcl_tools() -> list[dict]:
    """Distinct BFCL functions (first occurrence wins) from multiple, parallel_multiple, simple_python, parallel."""
    seen: set[str] = set()
    tools = []
    for split in ("multiple", "parallel_multiple", "simple_python", "parallel"):
        for row in _jsonl(DATA / "bfcl" / "openai" / f"{split}.jsonl"):
            for tool in row["tools"]:
                fn = tool["function"]
                if fn["name"] not in seen:
                    seen.add(fn["name"])
                    tools.append(fn)
    return tools


def call_schema(fn: dict) -> dict:
    """One call object `{"name": <const>, "arguments": <params>}` for a BFCL function."""
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, "arguments": closed(fn["parameters"])},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def any_call(tools: list[dict]) -> dict:
    return {"anyOf": [call_schema(fn) for fn in tools]}


def _find_tool(name: str) -> dict:
    for fn in bfcl_tools():
        if fn["name"] == name:
            return fn
    raise KeyError(name)


def _bench_schema(dataset: str, schema_id: str) -> dict:
    for row in _jsonl(DATA / "jsonschemabench" / f"{dataset}.jsonl"):
        if row["id"] == schema_id:
            schema = dict(row["schema"])
            schema.pop("$schema", None)
            return closed(schema)
    raise KeyError(schema_id)


def workloads(quick: bool = False) -> list[Workload]:
    tools = bfcl_tools()
    weather = _find_tool("get_current_weather")  # simple_python_187
    email = _find_tool("send_email")
    email_params = copy.deepcopy(email["parameters"])
    # BFCL's send_email has `to` as one string; the brief's variant: an array of up to 10 email strings.
    email_params["properties"]["to"] = {"type": "array", "items": {"type": "string", "format": "email"},
                                        "minItems": 1, "maxItems": 10}
    hermes_head = '<tool_call>\n{"name":"get_weather","arguments":'
    out = [
        Workload("hermes_1tool", [Literal(hermes_head), Json(closed(weather["parameters"])), Literal("}\n</tool_call>")],
                 "forced tool in Hermes text; ARGS = BFCL get_current_weather params", quick=True),
        Workload("required_10", [Json(any_call(tools[:10]))], "one call object, anyOf over 10 BFCL tools", quick=True),
        Workload("required_50", [Json(any_call(tools[:50]))], "one call object, anyOf over 50 BFCL tools"),
        Workload("nested_table", [Json(_bench_schema("Github_medium", "Github_medium---o34889"))],
                 "JSONSchemaBench Github_medium o34889 (arrays of objects, enums, oneOf, minItems)"),
        Workload("nested_users", [Json(_bench_schema("Github_easy", "Github_easy---o6237"))],
                 "JSONSchemaBench Github_easy o6237 (array of objects, pattern, email/date-time formats, maxLength 1024)"),
        Workload("send_email_to_array", [Json(call_schema({"name": "send_email", "parameters": email_params}))],
                 "BFCL send_email call with `to` an array of 1..10 format:email strings (derived)"),
        Workload("parallel_1to5_of_5", [Json({"type": "array", "items": any_call(tools[:5]), "minItems": 1,
                                               "maxItems": 5})],
                 "array of 1..5 call objects over 5 BFCL tools"),
        Workload("required_20", [Json(any_call(tools[:20]))], "one call object, anyOf over 20 BFCL tools"),
    ]
    return [w for w in out if w.quick] if quick else out
