"""Offline `vllm.LLM` with the constrain logits processor: constrained and unconstrained requests in one batch."""

from __future__ import annotations

import json

import jsonschema
import pytest

import constrain

from conftest import FQCN, HAVE_VLLM, entry_point_registered

if not HAVE_VLLM:
    pytest.skip("vLLM runs in .venv-vllm (.ci/vllm)", allow_module_level=True)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "strict": True,
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
                       "additionalProperties": False},
    },
}
PROMPT = "What is the weather in Paris?"


def constraint(tools, tool_choice="required", parallel=False, tool_format="llama3_json") -> dict:
    return {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel, "tool_format": tool_format}


def index_of(c: dict, vocab):
    policy = constrain.Policy.from_request({k: v for k, v in c.items() if k != "tool_format"})
    return constrain.compile_index(policy, vocab, tool_format=c["tool_format"])


def params(c: dict | None, **kw):
    from vllm import SamplingParams

    kw.setdefault("max_tokens", 96)
    kw.setdefault("temperature", 1.0)
    extra = None if c is None else {"constrain": json.dumps(c)}
    return SamplingParams(extra_args=extra, **kw)


def check_calls(message: dict, tools: list[dict], finish_reason: str = "tool_calls") -> list[dict]:
    assert message["finish_reason"] == finish_reason, message
    calls = message["tool_calls"]
    by_name = {t["function"]["name"]: t for t in tools}
    for call in calls:
        tool = by_name[call["function"]["name"]]
        jsonschema.validate(json.loads(call["function"]["arguments"]), tool["function"]["parameters"])
    return calls


def test_both_loaders_accept_the_class():
    """vLLM's V1 loader and Model Runner V2's loader (which rejects V1-only classes) both take the one class."""
    from vllm.v1.sample.logits_processor import _load_logitsprocs_by_fqcns
    from vllm.v1.worker.gpu.sample.logits_processor.loader import (
        _load_v2_logitsprocs_by_fqcns,
        _load_v2_logitsprocs_plugins,
    )

    from constrain.vllm_plugin import ConstrainLogitsProcessor

    assert _load_logitsprocs_by_fqcns([FQCN]) == [ConstrainLogitsProcessor]
    assert _load_v2_logitsprocs_by_fqcns([FQCN]) == [ConstrainLogitsProcessor]
    if entry_point_registered():
        assert ConstrainLogitsProcessor in _load_v2_logitsprocs_plugins()


def test_constrained_next_to_unconstrained(llm, vocab):
    c = constraint([WEATHER])
    outs = llm.generate([PROMPT, PROMPT, PROMPT], [params(c, seed=1), params(None, seed=2), params(c, seed=3)],
                        use_tqdm=False)
    index = index_of(c, vocab)
    for out in (outs[0], outs[2]):
        comp = out.outputs[0]
        assert comp.finish_reason == "stop", comp
        message = constrain.parse_output(index, list(comp.token_ids), "stop")
        assert len(check_calls(message, [WEATHER])) == 1
    # The unconstrained neighbour samples from the random model as it likes: not a call.
    free = outs[1].outputs[0]
    assert len(free.token_ids) > 0
    assert "tool_calls" not in constrain.parse_output(index, list(free.token_ids), free.finish_reason)


def test_many_policies_in_one_batch(llm, vocab):
    """Different policies, n=2 copies and greedy rows share a batch; every constrained row reads back as calls."""
    cases = [
        (constraint([WEATHER, TIME]), dict(seed=4, n=2)),
        (constraint([WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}}),
         dict(temperature=0.0)),
        (constraint([WEATHER, TIME], parallel=True), dict(seed=5, max_tokens=160)),
        (None, dict(seed=6)),
    ]
    outs = llm.generate([PROMPT] * len(cases), [params(c, **kw) for c, kw in cases], use_tqdm=False)
    for (c, kw), out in zip(cases, outs):
        if c is None:
            continue
        index = index_of(c, vocab)
        assert len(out.outputs) == kw.get("n", 1)
        for comp in out.outputs:
            assert comp.finish_reason == "stop", comp
            named = isinstance(c["tool_choice"], dict)
            message = constrain.parse_output(index, list(comp.token_ids), "stop")
            calls = check_calls(message, [WEATHER, TIME], "stop" if named else "tool_calls")
            if named:
                assert [call["function"]["name"] for call in calls] == ["get_time"]
            if not c["parallel_tool_calls"]:
                assert len(calls) == 1


@pytest.mark.parametrize("slack", [0, 3])
def test_budget_completes_within_max_tokens(llm, vocab, slack):
    """max_tokens just above the shortest call (EOS counted): every sample still ends on EOS with a whole call."""
    c = constraint([WEATHER])
    need = index_of(c, vocab).min_tokens_from_start()
    max_tokens = need + 1 + slack
    outs = llm.generate([PROMPT] * 4, [params(c, seed=10 + i, max_tokens=max_tokens) for i in range(4)],
                        use_tqdm=False)
    for out in outs:
        comp = out.outputs[0]
        assert len(comp.token_ids) <= max_tokens
        assert comp.finish_reason == "stop", comp
        check_calls(constrain.parse_output(index_of(c, vocab), list(comp.token_ids), "stop"), [WEATHER])


def test_max_tokens_below_shortest_output_is_cut_not_relaxed(llm, vocab):
    c = constraint([WEATHER])
    index = index_of(c, vocab)
    comp = llm.generate([PROMPT], [params(c, seed=7, max_tokens=5)], use_tqdm=False)[0].outputs[0]
    assert comp.finish_reason == "length"
    cursor = index.start()
    for t in comp.token_ids:
        cursor.advance(t)  # still a prefix of the language
    assert not cursor.is_accepting()


@pytest.mark.parametrize("bad", [
    "{not json",
    json.dumps({"tools": [WEATHER], "tool_choice": "required", "colour": "red"}),
    json.dumps({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    json.dumps({"tools": [WEATHER], "tool_format": "no_such_format"}),
])
def test_invalid_constraint_is_rejected_at_admission(llm, bad):
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError  # what vLLM turns a validate_params ValueError into (HTTP 400)

    with pytest.raises((ValueError, VLLMValidationError)):
        llm.generate([PROMPT], [SamplingParams(max_tokens=8, extra_args={"constrain": bad})], use_tqdm=False)
    # The engine is still serving afterwards.
    assert llm.generate([PROMPT], [SamplingParams(max_tokens=4)], use_tqdm=False)[0].outputs[0].token_ids


def test_format_missing_from_vocabulary_fails_closed(llm):
    """hermes needs <tool_call> tokens Llama 3 lacks: the request may only end (EOS), the engine keeps serving."""
    comp = llm.generate([PROMPT], [params(constraint([WEATHER], tool_format="hermes"), seed=8)],
                        use_tqdm=False)[0].outputs[0]
    assert comp.finish_reason == "stop"
    assert len(comp.token_ids) == 1 and comp.token_ids[0] in (128001, 128009)
