"""Tool calls end to end on mixed-keyword schemas: tools whose parameters are objects of random mixed-keyword
properties (`test_schema_mixed`'s generator), compiled into each landed format's index, walked token by token through
the budgeted masks and read back by `parse_output` and `StreamParser`. Every call reported names an offered tool and
carries arguments that validate against its schema, and streaming gives the same message.

Not asserted here: that a `required` turn holds a call. A walk may repeat an undeclared key (the automaton cannot
compare unbounded keys), and the parser then reports no call (docs/guarantees.md, "keys"); `test_parse.py` checks the
call counts on real tools. A seeded run of this check before it became a test (150 tool sets per format, every format:
113-118 compiled and 330-343 walks each) found no invalid call.
"""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

import test_parse as P
import test_schema_mixed as T
from constrain.automaton import BudgetExceeded, Deadline
from constrain.compiler import compile_index
from constrain.errors import InvalidSchema, UnsupportedSchema
from constrain.parse import parse_output

META = jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA)


def _tools(r: random.Random) -> list[dict]:
    tools = []
    for k in range(r.randint(1, 2)):
        props = {name: T._schema(r, 1) for name in r.sample(T.NAMES, r.randint(1, 3))}
        params = {"type": "object", "properties": props, "required": r.sample(list(props), r.randint(0, len(props)))}
        if r.random() < .5:
            params["additionalProperties"] = False
        if '"$ref"' in json.dumps(params):
            params["$defs"] = {"d": T._schema(r, 2)}
        tools.append({"type": "function", "function": {"name": f"f{k}", "parameters": params}})
    return tools


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["hermes", "qwen3_xml", "gemma4", "llama3_json", "mistral"])
def test_mixed_keyword_tools_give_valid_calls(request, fmt):
    vocab = request.getfixturevalue(P.VOCAB_OF[fmt])
    n_walks = 0
    for seed in range(100, 116):
        r = random.Random(seed)
        tools = _tools(r)
        if not all(META.is_valid(t["function"]["parameters"]) for t in tools):
            continue
        choice, parallel, _ = r.choice([m for m in P.MODES if m[0] != "none"])
        try:
            # under a deadline, as the server compiles: a few tool sets build minutes-long min-token tables
            with Deadline(20.0).active():
                index = compile_index(P.policy_for(tools, choice, parallel), vocab, tool_format=fmt, cache=None)
                index.min_tokens_from_start()
        except (InvalidSchema, UnsupportedSchema, BudgetExceeded):
            continue
        offered = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        for _ in range(2):
            ids = P.walk(index, r, extra=r.randint(0, 30))
            msg = parse_output(index, ids, id_factory=P.counter_ids())
            for call in msg.get("tool_calls") or []:
                name = call["function"]["name"]
                assert name in offered, (seed, name)
                jsonschema.validate(json.loads(call["function"]["arguments"]), offered[name])
            got, _ = P.stream(index, ids)
            assert got == msg, (seed, fmt)
            n_walks += 1
    assert n_walks >= 10
