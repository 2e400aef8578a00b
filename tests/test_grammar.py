"""Format grammars: every `grammars/<format>.lark` loads, compiles with a policy, accepts / rejects / leaves open its
fixture outputs (tests/fixtures/formats/<format>/{accepted,rejected,prefix_only}), and random walks over its token
index only ever produce text of the format's shape."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from constrain import grammar as _grammar
from constrain.compiler import compile_index
from constrain.grammar import FORMATS, load_format
from constrain.policy import Policy
from constrain.vocabulary import Vocabulary

FIXTURES = Path(__file__).parent / "fixtures" / "formats"
# Formats with a grammar file; `mistral_v3` joins once constrain.grammar.FORMATS names it.
ALL_FORMATS = tuple(sorted(p.stem for p in _grammar.GRAMMAR_DIR.glob("*.lark")))

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"tz": {"type": "string"}}}}},
]
EOS_TEXT = "<eos>"


def _needs_format(name: str) -> None:
    if name not in FORMATS:
        pytest.skip(f"{name!r} is not in constrain.grammar.FORMATS yet (grammars/{name}.lark exists)")


def _specials(name: str) -> list[str]:
    fmt = load_format(name)
    return sorted(set(fmt.special_texts().values()) | set(fmt.meta.get("string_quote", ())))


def byte_vocab(name: str) -> Vocabulary:
    """One token per byte, plus the format's special tokens and `<eos>`; every end token of the format is an EOS."""
    specials = _specials(name) + [EOS_TEXT]
    tokens = [bytes([i]) for i in range(256)] + [s.encode() for s in specials]
    ids = {s: 256 + i for i, s in enumerate(specials)}
    ends = {"<|im_end|>", "<|eot_id|>", "</s>", "<|tool_response>", "<turn|>", EOS_TEXT}
    return Vocabulary(tokens, special_ids=ids.values(), eos_ids=[ids[s] for s in specials if s in ends])


def to_ids(text: str, vocab: Vocabulary, name: str) -> list[int]:
    specials = sorted(_specials(name) + [EOS_TEXT], key=len, reverse=True)
    pattern = "(" + "|".join(re.escape(s) for s in specials) + ")"
    ids: list[int] = []
    for i, piece in enumerate(re.split(pattern, text)):
        if i % 2:
            ids.append(vocab.special_tokens[piece])
        else:
            ids.extend(piece.encode("utf-8"))
    return ids


def walk(index, ids) -> tuple[bool, bool]:
    """(every token was in the mask, the walk ends accepting)."""
    state = index.start()
    for t in ids:
        if not (int(state.mask()[t >> 5]) >> (t & 31)) & 1:
            return False, False
        state.advance(t)
    return True, state.is_accepting()


def _fixtures(group: str):
    return sorted((p.parent.parent.name, p) for p in FIXTURES.glob(f"*/{group}/*.txt"))


def _index(name: str, tool_choice: str, *, thinking: bool = False):
    policy = Policy.from_request(tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=True)
    return compile_index(policy, byte_vocab(name), tool_format=name, thinking=thinking)


# ---------------------------------------------------------------------------------------------------------------------
# files


@pytest.mark.parametrize("name", ALL_FORMATS)
def test_format_file_follows_the_conventions(name):
    _needs_format(name)
    fmt = load_format(name)
    assert fmt.source.startswith(f"// {name}: "), "header: the format first"
    assert fmt.arguments in ("json", "gemma4", "qwen3_xml")
    for rule in fmt.rules:
        assert rule in ("call", "call_sep", "calls_open", "calls_close", "content", "content_sep", "end", "text_end",
                        "think"), rule
    for term in fmt.terminals:
        assert term.isupper(), term


def test_every_format_has_fixtures():
    for name in ALL_FORMATS:
        if name == "hermes":
            continue  # hermes' fixtures belong to the lead's grammar tests
        for group in ("accepted", "rejected", "prefix_only"):
            assert list((FIXTURES / name / group).glob("*.txt")), (name, group)


# ---------------------------------------------------------------------------------------------------------------------
# fixtures: accepted under tool_choice=auto (text or calls), rejected / prefix-only under required


@pytest.mark.parametrize("name,path", _fixtures("accepted"), ids=lambda v: getattr(v, "stem", v))
def test_accepted(name, path):
    _needs_format(name)
    vocab = byte_vocab(name)
    assert walk(_index(name, "auto"), to_ids(path.read_text(encoding="utf-8"), vocab, name)) == (True, True)


@pytest.mark.parametrize("name,path", _fixtures("rejected"), ids=lambda v: getattr(v, "stem", v))
def test_rejected(name, path):
    _needs_format(name)
    vocab = byte_vocab(name)
    allowed, _ = walk(_index(name, "required"), to_ids(path.read_text(encoding="utf-8"), vocab, name))
    assert not allowed


@pytest.mark.parametrize("name,path", _fixtures("prefix_only"), ids=lambda v: getattr(v, "stem", v))
def test_prefix_only(name, path):
    _needs_format(name)
    vocab = byte_vocab(name)
    assert walk(_index(name, "required"), to_ids(path.read_text(encoding="utf-8"), vocab, name)) == (True, False)


def test_tool_choice_none_allows_no_call():
    for name in ("qwen3_xml", "gemma4", "llama3_json", "mistral", "json"):
        vocab = byte_vocab(name)
        call = next((FIXTURES / name / "accepted").glob("one_call.txt")).read_text(encoding="utf-8")
        index = compile_index(Policy.from_request(tools=TOOLS, tool_choice="none"), vocab, tool_format=name)
        allowed, accepting = walk(index, to_ids(call, vocab, name))
        assert not (allowed and accepting), name


def test_thinking_blocks():
    cases = {
        "qwen3_xml": "I should call.\n</think>\n\n<tool_call>\n<function=get_time>\n</function>\n</tool_call><|im_end|>",
        "gemma4": "<|channel>thought\nHmm<channel|><|tool_call>call:get_time{}<tool_call|><|tool_response>",
        "mistral": "[THINK]Hmm[/THINK][TOOL_CALLS]get_time[ARGS]{}</s>",
    }
    for name, text in cases.items():
        vocab = byte_vocab(name)
        assert walk(_index(name, "required", thinking=True), to_ids(text, vocab, name)) == (True, True), name
    # Gemma 4's thought channel is optional: the model may go straight to the call
    vocab = byte_vocab("gemma4")
    text = "<|tool_call>call:get_time{}<tool_call|><|tool_response>"
    assert walk(_index("gemma4", "required", thinking=True), to_ids(text, vocab, "gemma4")) == (True, True)


# ---------------------------------------------------------------------------------------------------------------------
# random walks: uniform among allowed tokens under a budget; the text always has the format's shape

_NAME = r"(get_weather|get_time)"
_SHAPES = {
    "qwen3_xml": (r"<tool_call>\n<function=" + _NAME + r">\n((?:<parameter=\w+>\n(?:(?!\n</parameter>).)*\n"
                  r"</parameter>\n)*)</function>\n</tool_call>", "\n", "", "", "<|im_end|>"),
    "gemma4": (r"<\|tool_call>call:" + _NAME + r"(\{.*?\})<tool_call\|>", "", "", "", r"(<\|tool_response>|<turn\|>)"),
    "llama3_json": (r'\{"name": "' + _NAME + r'", "parameters": (\{.*?\})\}', "; ", "", "", "<|eot_id|>"),
    "mistral": (r"\[TOOL_CALLS\]" + _NAME + r"(?:\[CALL_ID\][A-Za-z0-9]{9})?\[ARGS\](\{.*?\})", "", "", "", "</s>"),
    "mistral_v3": (r'\{"name": "' + _NAME + r'", "arguments": (\{.*?\})(?:, "id": "[A-Za-z0-9]{9}")?\}', ", ",
                   r"\[TOOL_CALLS\] ?\[", r"\]", "</s>"),
    "json": (r'\{"name": "' + _NAME + r'", "arguments": (\{.*?\})\}', ", ", r"\[", r"\]", re.escape(EOS_TEXT)),
}


def _shape(name: str) -> re.Pattern[str]:
    call, sep, open_, close, end = _SHAPES[name]
    end = end if name in ("gemma4", "json") else re.escape(end)
    sep = re.escape(sep)
    vocab = byte_vocab(name)
    eos = "|".join(re.escape(vocab.token_bytes[i].decode()) for i in vocab.eos_ids)
    return re.compile(f"{open_}{call}(?:{sep}{call})*{close}{end}(?:{eos})*", re.S)  # EOS again once finished


@pytest.mark.parametrize("name", sorted(_SHAPES))
def test_random_walks_have_the_format_shape(name):
    _needs_format(name)
    vocab = byte_vocab(name)
    index = _index(name, "required")
    rng = random.Random(7)
    shape = _shape(name)
    for _ in range(20):
        state = index.start()
        out: list[int] = []
        budget = 400  # EOS counted too: a few spare tokens
        while not state.is_finished():
            allowed = state.allowed_token_ids(budget)
            assert len(allowed), "a budgeted walk never gets stuck"
            t = int(rng.choice(allowed))
            state.advance(t, budget)
            budget -= 1
            out.append(t)
        text = b"".join(vocab.token_bytes[t] for t in out).decode("utf-8")  # special tokens as their text
        assert shape.fullmatch(text), text
        if load_format(name).arguments == "json":
            for m in re.finditer(_SHAPES[name][0], text, re.S):
                args, _ = json.JSONDecoder().raw_decode(text, m.start(2))  # the regex's lazy `}` may cut a string
                assert isinstance(args, dict)
                if m.group(1) == "get_weather":
                    assert isinstance(args["city"], str) and set(args) <= {"city", "days"}


def test_a_shallower_policy_compiles_an_over_budget_recursive_tool_and_records_its_depth():
    import dataclasses

    from constrain.automaton import BudgetExceeded

    tree = {"type": "object", "properties": {k: {"$ref": "#"} for k in "abcdefghijklmnopqrstuvwxyz"},
            "additionalProperties": False}
    tools = [{"type": "function", "function": {"name": "flag", "parameters": {"type": "object"}}},
             {"type": "function", "function": {"name": "tree", "parameters": tree}}]
    policy = Policy.from_request(tools=tools, tool_choice={"type": "function", "function": {"name": "tree"}})
    vocab = byte_vocab("hermes")
    with pytest.raises(BudgetExceeded) as err:
        compile_index(policy, vocab, tool_format="hermes", cache=None)
    assert err.value.pointer.startswith("/tools/1/function/parameters")
    index = compile_index(dataclasses.replace(policy, shallower=True), vocab, tool_format="hermes", cache=None)
    assert index.meta["shallower"] == (("/tools/1/function/parameters", 2),)
    text = '<tool_call>\n{"name": "tree", "arguments": {"a": {"b": {}}, "c": {}}}\n</tool_call><|im_end|>'
    deeper = text.replace('{"b": {}}', '{"b": {"c": {}}}')
    assert walk(index, to_ids(text, vocab, "hermes")) == (True, True)  # 2 levels inside the arguments
    assert walk(index, to_ids(deeper, vocab, "hermes")) == (False, False)  # 3: what the budget cost
