"""parse_output / StreamParser: generated ids → OpenAI message, whole and as deltas, failing closed.

Random budgeted walks over the real vocabularies (every format that has landed) on BFCL tools, in every tool_choice
mode; hand-written fixtures; regressions named after the field reports in the contract reference, Part 3.
"""

from __future__ import annotations

import itertools
import json
import random

import jsonschema
import numpy as np
import pytest

from constrain.compiler import compile_index
from constrain.errors import UnsupportedSchema
from constrain.grammar import GRAMMAR_DIR
from constrain.parse import StreamParser, _gemma4_value, _xml_value, new_call_id, parse_output
from constrain.policy import Policy
from paths import DATA  # noqa: E402

BFCL = DATA / "bfcl" / "openai"
VOCAB_OF = {"hermes": "qwen3_vocab", "qwen3_xml": "qwen3_vocab", "json": "qwen3_vocab", "gemma4": "gemma4_vocab",
            "llama3_json": "llama3_vocab", "mistral": "tekken_v11_vocab", "mistral_v3": "tekken_vocab"}
FORMATS = [f for f in VOCAB_OF if (GRAMMAR_DIR / f"{f}.lark").exists()]
# (tool_choice, parallel_tool_calls, thinking)
MODES = [("required", True, False), ("required", False, False), ("auto", True, False), ("auto", False, True),
         ("named", None, False), ("none", None, False)]

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}
GET = {"type": "function", "function": {"name": "get", "parameters": {"type": "object", "properties": {}}}}


# ---- helpers


def counter_ids():
    n = itertools.count()
    return lambda: f"call_{next(n):024d}"


def bfcl_tools(category: str, n: int) -> list[list[dict]]:
    out = []
    with open(BFCL / f"{category}.jsonl", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            tools = []
            for tool in rec["tools"]:
                tool = json.loads(json.dumps(tool))
                tool["function"]["name"] = tool["function"]["name"].replace(".", "_")
                tools.append(tool)
            if len({t["function"]["name"] for t in tools}) == len(tools):
                out.append(tools)
            if len(out) == n:
                break
    return out


def policy_for(tools: list[dict], choice: str, parallel: bool | None) -> Policy:
    fields: dict = {"tools": tools}
    if choice == "named":
        fields["tool_choice"] = {"type": "function", "function": {"name": tools[-1]["function"]["name"]}}
    else:
        fields["tool_choice"] = choice
    if parallel is not None:
        fields["parallel_tool_calls"] = parallel
    return Policy.from_request(**fields)


_SHORT: dict[int, tuple[object, np.ndarray]] = {}


def _short_tokens(vocab) -> np.ndarray:
    """bool [vocab_size]: the special and one-byte tokens of `vocab` (cached per vocabulary object)."""
    hit = _SHORT.get(id(vocab))
    if hit is None or hit[0] is not vocab:
        table = np.zeros(vocab.vocab_size, dtype=bool)
        table[[t for t, b in enumerate(vocab.token_bytes) if len(b) == 1]] = True
        table[list(vocab.special_ids)] = True
        hit = _SHORT[id(vocab)] = (vocab, table)
    return hit[1]


def walk(index, rng: random.Random, extra: int) -> list[int]:
    """A random output drawn from the budgeted masks (biased toward special and one-byte tokens for structure)."""
    short_tokens = _short_tokens(index.vocab)
    state = index.start()
    budget = index.min_tokens_from_start() + extra
    ids: list[int] = []
    while not state.is_finished():
        allowed = state.allowed_token_ids(budget=max(budget - len(ids), 0))
        assert len(allowed), "the budgeted mask is never empty before the output ends"
        if rng.random() < 0.35:
            short = allowed[short_tokens[allowed]]
            tok = int(rng.choice(short)) if len(short) else int(rng.choice(allowed))
        else:
            tok = int(rng.choice(allowed))
        state.advance(tok)
        ids.append(tok)
    return ids


def reassemble(deltas: list[dict], thinking: bool, finish_reason: str) -> dict:
    """The message a client builds from the deltas (keyed on `index`, openai/codex#7517)."""
    msg: dict = {"role": "assistant", "content": None}
    if thinking:
        msg["reasoning_content"] = None
    calls: list[dict] = []
    for delta in deltas:
        assert len(delta) == 1, delta
        for key in ("content", "reasoning_content"):
            if key in delta:
                assert delta[key], "no empty fragments"
                msg[key] = (msg[key] or "") + delta[key]
        for tc in delta.get("tool_calls", []):
            i = tc["index"]
            if i == len(calls):  # the head: id, type and the whole name, arguments ""
                assert tc["id"].startswith("call_") and tc["type"] == "function" and tc["function"]["arguments"] == ""
                calls.append({"id": tc["id"], "type": "function",
                              "function": {"name": tc["function"]["name"], "arguments": ""}})
            else:
                assert i == len(calls) - 1, "calls stream one after another"
                assert set(tc) == {"index", "function"} and set(tc["function"]) == {"arguments"}
                calls[i]["function"]["arguments"] += tc["function"]["arguments"]
    if calls:
        msg["tool_calls"] = calls
    msg["finish_reason"] = finish_reason
    return msg


def stream(index, ids, finish_reason="stop", **kw):
    parser = StreamParser(index, id_factory=counter_ids(), **kw)
    deltas = [d for t in ids for d in parser.feed(t)]
    deltas += parser.finish(finish_reason)
    return reassemble(deltas, bool(index.meta["thinking"]), parser.finish_reason), deltas


def check_message(index, msg: dict) -> None:
    """A complete output's message satisfies the policy."""
    policy = index.meta["policy"]
    calls = msg.get("tool_calls") or []
    relaxed = {name for name, _, _ in index.meta["relaxed"]}
    assert "tool_calls" not in msg or calls, "never an empty tool_calls list (vllm#53255)"
    assert policy.min_calls <= len(calls) <= policy.max_calls
    if calls:
        assert msg["finish_reason"] == ("stop" if policy.named else "tool_calls")
    else:
        assert msg["finish_reason"] == "stop"
    for call in calls:
        name = call["function"]["name"]
        assert name in policy.allowed
        args = json.loads(call["function"]["arguments"])
        assert isinstance(args, dict)
        if name not in relaxed:
            jsonschema.validate(args, policy.tool(name).parameters)


def check_cut(index, ids: list[int]) -> None:
    """A cut output never reports a call; streamed, it ends with `length` and the same content."""
    msg = parse_output(index, ids, "length")
    assert msg["finish_reason"] == "length" and "tool_calls" not in msg
    texts = set(index.vocab.special_tokens) - {""}
    for key in ("content", "reasoning_content"):
        assert not any(t in (msg.get(key) or "") for t in texts if t.startswith(("<", "["))), "no markup leaks"
    got, _ = stream(index, ids, "length")
    assert got["finish_reason"] == "length"
    assert got["content"] == msg["content"] and got.get("reasoning_content") == msg.get("reasoning_content")
    state = index.start()
    for t in ids:
        state.advance(t)
    if not state.is_accepting():
        stopped = parse_output(index, ids, "stop")
        assert stopped["finish_reason"] == "stop" and "tool_calls" not in stopped


# ---- random walks over BFCL tools, every landed format, every mode


def _cases():
    out = []
    for fmt in FORMATS:
        n_records = 2 if fmt == "hermes" else 1
        for mode in MODES:
            out.append(pytest.param(fmt, mode, n_records, id=f"{fmt}-{mode[0]}-{'par' if mode[1] else 'one'}"
                                    f"{'-think' if mode[2] else ''}"))
    return out


@pytest.mark.parametrize("fmt,mode,n_records", _cases())
def test_random_walks(request, fmt, mode, n_records):
    vocab = request.getfixturevalue(VOCAB_OF[fmt])
    choice, parallel, thinking = mode
    rng = random.Random(f"{fmt}{mode}")
    records = bfcl_tools("parallel_multiple", n_records) + [[WEATHER, GET]]
    n_done = 0
    for tools in records:
        try:
            index = compile_index(policy_for(tools, choice, parallel), vocab, tool_format=fmt,
                                  thinking=thinking and fmt in ("hermes", "qwen3_xml", "gemma4", "mistral"))
        except UnsupportedSchema:
            continue
        for _ in range(4):
            ids = walk(index, rng, extra=rng.randint(0, 40))
            msg = parse_output(index, ids, id_factory=counter_ids())
            check_message(index, msg)
            for eager in (False, True):
                got, _ = stream(index, ids, stream_arguments=eager)
                assert got == msg, (fmt, mode, eager)
            check_cut(index, ids[: rng.randrange(len(ids))])
            n_done += 1
    assert n_done


# ---- hand-written hermes fixtures


_BY_BYTES: dict[int, dict[bytes, int]] = {}


def _by_bytes(vocab) -> dict[bytes, int]:
    got = _BY_BYTES.get(id(vocab))
    if got is None:
        got = _BY_BYTES[id(vocab)] = {}
        special = set(vocab.special_ids)
        for i, b in enumerate(vocab.token_bytes):
            if b and i not in special:
                got.setdefault(b, i)
    return got


def encode(vocab, text: str, *, one_byte: bool = False) -> list[int]:
    """Ids for `text`: special-token spellings as their ids, other bytes by greedy longest match (or one byte per
    token with `one_byte`: another tokenization of the same text)."""
    specials = sorted((t for t in vocab.special_tokens if t), key=len, reverse=True)
    by_bytes = _by_bytes(vocab)
    ids, i = [], 0
    while i < len(text):
        sp = next((t for t in specials if text.startswith(t, i)), None)
        if sp:
            ids.append(vocab.special_tokens[sp])
            i += len(sp)
            continue
        j = i + 1
        while j < len(text) and not any(text.startswith(t, j) for t in specials):
            j += 1
        data = text[i:j].encode()
        k = 0
        while k < len(data):
            n = 1 if one_byte else min(len(data) - k, 24)
            while data[k:k + n] not in by_bytes:
                n -= 1
            ids.append(by_bytes[data[k:k + n]])
            k += n
        i = j
    return ids


@pytest.fixture(scope="module")
def hermes_auto(qwen3_vocab):
    return compile_index(Policy.from_request(tools=[WEATHER, GET], tool_choice="auto"), qwen3_vocab,
                         tool_format="hermes")


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'


@pytest.mark.parametrize("text,content,calls", [
    ("Hello there.<|im_end|>", "Hello there.", []),
    (CALL + "<|im_end|>", None, [("get_weather", '{"city": "Paris", "days": 3}')]),
    ("Let me check.\n" + CALL + "<|im_end|>", "Let me check.", [("get_weather", '{"city": "Paris", "days": 3}')]),
    ("a\n\n" + CALL + '\n<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call><|im_end|><|endoftext|>',
     "a\n", [("get_weather", '{"city": "Paris", "days": 3}'), ("get", "{}")]),
    ("<|im_end|>", None, []),
])
def test_hermes_fixtures(qwen3_vocab, hermes_auto, text, content, calls):
    for ids in (encode(qwen3_vocab, text), encode(qwen3_vocab, text, one_byte=True)):
        msg = parse_output(hermes_auto, ids, id_factory=counter_ids())
        assert msg["content"] == content
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls", [])] == calls
        assert msg["finish_reason"] == ("tool_calls" if calls else "stop")
        # token by token or all at once, any tokenization: the same message
        assert stream(hermes_auto, ids)[0] == msg
        assert stream(hermes_auto, ids, stream_arguments=True)[0] == msg


def test_stream_holds_back_what_may_open_a_call(qwen3_vocab, hermes_auto):
    """A newline may separate text from a call, and `get` may be the start of `get_weather`: nothing is sent early."""
    parser = StreamParser(hermes_auto, id_factory=counter_ids(), stream_arguments=True)
    sent = [d for t in encode(qwen3_vocab, "Hi\n") for d in parser.feed(t)]
    assert "".join(d.get("content", "") for d in sent) == "Hi"
    sent = [d for t in encode(qwen3_vocab, '<tool_call>\n{"name": "get') for d in parser.feed(t)]
    assert sent == []  # `\n` was the separator, the name is not known yet
    sent = [d for t in encode(qwen3_vocab, '_weather') for d in parser.feed(t)]
    assert sent[0]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_stream_arguments_fragments(qwen3_vocab, hermes_auto):
    ids = encode(qwen3_vocab, CALL + "<|im_end|>")
    _, deltas = stream(hermes_auto, ids, stream_arguments=True)
    assert len([d for d in deltas if "tool_calls" in d]) > 2  # head, then several fragments
    _, held = stream(hermes_auto, ids)
    assert len(held) == 2  # head, then the whole arguments once the call closed


def test_named_choice_finishes_stop(qwen3_vocab):
    """OpenAI answers a named tool_choice with finish_reason "stop" (vllm PR #25054); we do the same."""
    index = compile_index(policy_for([WEATHER, GET], "named", None), qwen3_vocab, tool_format="hermes")
    msg = parse_output(index, encode(qwen3_vocab, '<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call><|im_end|>'))
    assert msg["finish_reason"] == "stop" and msg["tool_calls"][0]["function"]["name"] == "get"


# ---- regressions (contract reference, Part 3)


@pytest.fixture(scope="module")
def hermes_required(qwen3_vocab):
    return compile_index(Policy.from_request(tools=[WEATHER, GET], tool_choice="required"), qwen3_vocab,
                         tool_format="hermes")


def test_53255_required_without_a_call_never_reports_tool_calls(qwen3_vocab, hermes_required):
    for text in ("", "<tool_call>\n{\"name\": \"get\"", "Sure, here is the weather.<|im_end|>"):
        for reason in ("stop", "length"):
            msg = parse_output(hermes_required, encode(qwen3_vocab, text), reason)
            assert "tool_calls" not in msg and msg["finish_reason"] == reason


def test_53363_prose_under_required_is_not_a_call(qwen3_vocab, hermes_required):
    msg = parse_output(hermes_required, encode(qwen3_vocab, "I think it is sunny.<|im_end|>"))
    assert msg == {"role": "assistant", "content": "I think it is sunny.", "finish_reason": "stop"}


def test_53269_streamed_cut_call_reports_length(qwen3_vocab, hermes_required):
    ids = encode(qwen3_vocab, CALL + "<|im_end|>")
    for cut in range(1, len(ids)):
        for eager in (False, True):
            got, _ = stream(hermes_required, ids[:cut], "length", stream_arguments=eager)
            assert got["finish_reason"] == "length"
            if not eager:
                assert "tool_calls" not in got or cut >= len(ids) - 1


def test_58228_length_wins_over_a_complete_call(qwen3_vocab, hermes_auto):
    ids = encode(qwen3_vocab, CALL + "<|im_end|>")
    msg = parse_output(hermes_auto, ids, "length")
    assert msg["finish_reason"] == "length" and "tool_calls" not in msg


def test_47903_cut_call_leaks_no_markup(qwen3_vocab, hermes_auto):
    ids = encode(qwen3_vocab, "Checking.\n" + CALL + "<|im_end|>")
    for cut in range(len(ids)):
        msg = parse_output(hermes_auto, ids[:cut], "length")
        assert "<tool_call>" not in (msg["content"] or "") and "{" not in (msg["content"] or "")
        assert stream(hermes_auto, ids[:cut], "length")[0]["content"] == msg["content"]


def test_foreign_ids_fail_closed(qwen3_vocab, hermes_auto):
    """Ids the mask would never allow (an undeclared tool): the text as content, finish "stop", no call."""
    text = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call><|im_end|>'
    msg = parse_output(hermes_auto, encode(qwen3_vocab, text))
    assert "tool_calls" not in msg and msg["finish_reason"] == "stop" and "rm_rf" in msg["content"]
    got, _ = stream(hermes_auto, encode(qwen3_vocab, text))
    assert "tool_calls" not in got and got["finish_reason"] == "stop"


def test_repeated_argument_key_fails_closed(qwen3_vocab):
    """A free-form object may repeat an undeclared key (no byte automaton can forbid two equal keys): the turn is in
    the mask's language, yet the call is ambiguous, so it is not reported — whole or streamed."""
    put = {"type": "function", "function": {"name": "put", "parameters": {"type": "object"}}}
    index = compile_index(Policy.from_request(tools=[put], tool_choice="auto"), qwen3_vocab, tool_format="hermes")
    for args, reported in (('{"a": 1, "b": {"c": 2}}', True), ('{"a": 1, "a": 2}', False), ('{"b": {"c": 1, "c": 2}}', False)):
        ids = encode(qwen3_vocab, f'<tool_call>\n{{"name": "put", "arguments": {args}}}\n</tool_call><|im_end|>')
        state = index.start()
        for t in ids:
            state.advance(t)
        assert state.is_accepting(), args  # the mask allows it
        msg = parse_output(index, ids)
        got, _ = stream(index, ids)
        assert ("tool_calls" in msg) == reported == ("tool_calls" in got), (args, msg)
        if not reported:
            assert msg["finish_reason"] == got["finish_reason"] == "stop"


def test_arguments_nested_past_the_stack_fail_closed(qwen3_vocab):
    """Free-form arguments nest at most `MAX_SPILLED` containers past the automaton's window: a deeper output is not
    in the mask's language, and reading it back (whole or streamed) reports no call instead of raising
    (RecursionError, before the cap); arguments the cap allows still read back."""
    from constrain.automaton import MAX_SPILLED
    from constrain.parse import _usable_arguments

    put = {"type": "function", "function": {"name": "put", "parameters": {"type": "object"}}}
    index = compile_index(Policy.from_request(tools=[put], tool_choice="auto"), qwen3_vocab, tool_format="hermes")
    for depth, reported in ((MAX_SPILLED, True), (MAX_SPILLED + 10, False), (1200, False)):
        args = '{"a": ' + "[" * depth + "]" * depth + "}"
        ids = encode(qwen3_vocab, f'<tool_call>\n{{"name": "put", "arguments": {args}}}\n</tool_call><|im_end|>')
        msg = parse_output(index, ids)
        got, _ = stream(index, ids)
        assert ("tool_calls" in msg) == reported == ("tool_calls" in got), depth
        if reported:
            assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == json.loads(args)
        else:
            assert msg["finish_reason"] == got["finish_reason"] == "stop"
    assert not _usable_arguments('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")


def test_streaming_deltas_carry_index_and_one_head(qwen3_vocab, hermes_auto):
    """openai/codex#7517: every tool_calls entry has `index`; id/type/name only in the first delta of a call."""
    text = CALL + '\n<tool_call>\n{"name": "get", "arguments": {}}\n</tool_call><|im_end|>'
    _, deltas = stream(hermes_auto, encode(qwen3_vocab, text), stream_arguments=True)
    heads = [tc for d in deltas for tc in d.get("tool_calls", []) if "id" in tc]
    assert [h["index"] for h in heads] == [0, 1]
    assert all("index" in tc for d in deltas for tc in d.get("tool_calls", []))


# ---- argument conversion (gemma4, qwen3_xml)


def test_gemma4_arguments_to_json():
    q = "\ud800"
    text = "{a:" + q + 'say "hi", {ok}' + q + ",b:3,c:true,d:None,e:{f:[1,-0.5,1e-05]},g:[]}"
    assert _gemma4_value(text, q) == {"a": 'say "hi", {ok}', "b": 3, "c": True, "d": None,
                                      "e": {"f": [1, -0.5, 1e-05]}, "g": []}
    with pytest.raises(ValueError):
        _gemma4_value("{a:3", q)


@pytest.mark.parametrize("raw,schema,value", [
    ("Paris", {"type": "string"}, "Paris"),
    ("3", {"type": "string"}, "3"),
    ("3", {"type": "integer"}, 3),
    ("0.5", {"type": "number"}, 0.5),
    ("True", {"type": "boolean"}, True),
    ("false", {"type": "boolean"}, False),
    ("None", {"type": ["integer", "null"]}, None),
    ("7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 7),
    ("x7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x7"),
    ('{"a": [1]}', {"type": "object"}, {"a": [1]}),
    ("[1, 2]", {}, [1, 2]),
    ("a\nmulti-line <b>", {}, "a\nmulti-line <b>"),
])
def test_qwen3_xml_values_by_schema(raw, schema, value):
    assert _xml_value(raw, schema, {"properties": {"k": schema}}) == value


def test_new_call_id():
    ids = {new_call_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(i.startswith("call_") and len(i) == 29 and i[5:].isalnum() for i in ids)
