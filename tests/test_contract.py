"""The OpenAI tool contract, enforced while decoding: the contract matrix and the field-report regressions.

Matrix: every tool format (mistral and mistral_v3 are one "mistral" family, each with its own Tekken vocabulary) ×
tool_choice none / auto / required / named / allowed_tools(required) × parallel_tool_calls on/off × thinking on/off
(formats with a think rule) × a strict tool on/off. Each cell takes budgeted random walks through the mask and checks
the parsed message against the *request* (an oracle independent of the compiled policy): call count, names,
arguments valid per python-jsonschema, `length` never reporting calls, and mask/parser agreement at every prefix.

Regressions are named after the field reports of the contract reference (openai-tool-contract.md, Part 3).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from constrain.compiler import compile_index
from constrain.errors import MaskViolation
from constrain.parse import StreamParser, _Decoder, _readings, parse_output
from constrain.policy import MAX_PARALLEL_CALLS, Policy
from test_parse import counter_ids, encode

BFCL = Path("/work/shared/data/bfcl/openai/parallel_multiple.jsonl")
VOCAB_OF = {"hermes": "qwen3_vocab", "qwen3_xml": "qwen3_vocab", "gemma4": "gemma4_vocab",
            "llama3_json": "llama3_vocab", "mistral": "tekken_v11_vocab", "mistral_v3": "tekken_vocab",
            "json": "qwen3_vocab"}
FAMILY = {"mistral_v3": "mistral"}  # one family, two grammars, each on its own vocabulary
THINK_FORMATS = ("hermes", "qwen3_xml", "gemma4", "mistral")
# the text every call begins with (a turn's first call, for the array formats)
CALL_OPEN = {"hermes": "<tool_call>", "qwen3_xml": "<tool_call>", "gemma4": "<|tool_call>",
             "llama3_json": '{"name": "', "mistral": "[TOOL_CALLS]", "mistral_v3": "[TOOL_CALLS]", "json": '[{"name": "'}
CHOICES = ("none", "auto", "required", "named", "allowed")
WALKS_PER_CELL = 3
EXTRA_MAX = 60


# ---- tools: real BFCL ones (dots in names → `_`) and a strict variant


def _bfcl_record(i: int) -> list[dict]:
    with open(BFCL, encoding="utf-8") as fh:
        for k, line in enumerate(fh):
            if k == i:
                tools = json.loads(line)["tools"]
                for tool in tools:
                    tool["function"]["name"] = tool["function"]["name"].replace(".", "_")
                return tools
    raise LookupError(i)


SUM, PRIMES = _bfcl_record(0)  # math_toolkit_sum_of_multiples (integers + an integer array), _product_of_primes
RESTAURANT = _bfcl_record(15)[0]  # restaurant_search: two strings required, `rating` optional
STRICT_RESTAURANT = json.loads(json.dumps(RESTAURANT))
_params = STRICT_RESTAURANT["function"]["parameters"]
_params.pop("optional")  # BFCL's non-standard key: not in OpenAI's strict subset
_params["required"] = list(_params["properties"])
_params["additionalProperties"] = False
STRICT_RESTAURANT["function"]["strict"] = True
NAMED = "restaurant_search"
SUBSET = ("math_toolkit_product_of_primes", "restaurant_search")  # allowed_tools: sum_of_multiples left out


def tools_for(strict: bool) -> list[dict]:
    return [SUM, PRIMES, STRICT_RESTAURANT if strict else RESTAURANT]


def request_for(choice: str, parallel: bool, thinking: bool, strict: bool) -> dict:
    tool_choice = {
        "named": {"type": "function", "function": {"name": NAMED}},
        "allowed": {"type": "allowed_tools", "allowed_tools": {
            "mode": "required", "tools": [{"type": "function", "function": {"name": n}} for n in SUBSET]}},
    }.get(choice, choice)
    return {"tools": tools_for(strict), "tool_choice": tool_choice, "parallel_tool_calls": parallel,
            "chat_template_kwargs": {"enable_thinking": thinking}}


def expected(request: dict) -> tuple[int, int, set[str]]:
    """What the request allows, read from the request itself: (min calls, max calls, callable names)."""
    choice, names = request["tool_choice"], {t["function"]["name"] for t in request["tools"]}
    most = MAX_PARALLEL_CALLS if request["parallel_tool_calls"] else 1
    if choice == "none":
        return 0, 0, set()
    if choice == "auto":
        return 0, most, names
    if choice == "required":
        return 1, most, names
    if choice["type"] == "function":
        return 1, 1, {choice["function"]["name"]}
    return 1, most, {t["function"]["name"] for t in choice["allowed_tools"]["tools"]}


# ---- cells


def _cells() -> list[tuple[str, str, bool, bool, bool]]:
    out = []
    for fmt in VOCAB_OF:
        for choice in CHOICES:
            for parallel in (True, False):
                for thinking in ((False, True) if fmt in THINK_FORMATS else (False,)):
                    for strict in (False, True):
                        out.append((fmt, choice, parallel, thinking, strict))
    return out


CELLS = _cells()


def _cell_id(cell) -> str:
    fmt, choice, parallel, thinking, strict = cell
    return f"{fmt}-{choice}-{'par' if parallel else 'one'}-{'think' if thinking else 'nothink'}-" \
           f"{'strict' if strict else 'loose'}"


_INDEXES: dict[tuple, object] = {}


def index_for(request, vocab, fmt: str, thinking: bool):
    """One compile per (format, request); compile_index's own cache also shares equal policies."""
    key = (fmt, json.dumps(request, sort_keys=True))
    if key not in _INDEXES:
        _INDEXES[key] = compile_index(Policy.from_request(request), vocab, tool_format=fmt, thinking=thinking)
    return _INDEXES[key]


# ---- walks and checks


_KINDS: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}


def token_kinds(vocab, fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Per token id: structural (a special token, or bytes that begin the format's call opening) and one-byte."""
    key = (id(vocab), fmt)
    if key not in _KINDS:
        # a special opening token is reached through the special ids; a text opening through its pieces
        opening = b"\x00" if CALL_OPEN[fmt] in vocab.special_tokens else CALL_OPEN[fmt].encode()
        structural = np.zeros(len(vocab.token_bytes), dtype=bool)
        one_byte = np.zeros(len(vocab.token_bytes), dtype=bool)
        for i, b in enumerate(vocab.token_bytes):
            one_byte[i] = len(b) == 1
            structural[i] = bool(b) and opening.startswith(b)
        structural[list(vocab.special_ids)] = True
        _KINDS[key] = structural, one_byte
    return _KINDS[key]


def budgeted_walk(index, rng: random.Random, budget: int, structural: bool) -> list[int]:
    """Tokens drawn from `allowed_token_ids(budget=remaining)` until EOS: uniformly (`structural=False`), or with a
    bias toward special tokens, pieces of the call opening and one-byte tokens, so that auto turns reach the call
    markup too. The finishing EOS is not counted against the budget (the index's convention: EOS is free)."""
    vocab, fmt = index.vocab, index.meta["tool_format"]
    special, one_byte = token_kinds(vocab, fmt)
    opening = b"" if CALL_OPEN[fmt] in vocab.special_tokens else CALL_OPEN[fmt].encode()
    specials = set(vocab.special_ids)
    byte_id = {vocab.token_bytes[int(i)]: int(i) for i in np.flatnonzero(one_byte) if int(i) not in specials}
    state = index.start()
    ids: list[int] = []
    written = b""
    while not state.is_finished():
        remaining = budget - len(ids)
        assert remaining >= 0, "the walk overran its budget"
        allowed = state.allowed_token_ids(budget=remaining)
        assert len(allowed), "the budgeted mask is never empty before the output ends"
        pool = allowed
        nxt = byte_id.get(opening[len(written):len(written) + 1]) if opening.startswith(written) else None
        if structural and nxt is not None and nxt in allowed and (written or rng.random() < 0.5):
            pool = np.array([nxt])  # a text call opening (llama3_json, json), once begun, byte by byte
        elif structural:
            r = rng.random()
            pick = allowed[special[allowed]] if r < 0.3 else allowed[one_byte[allowed]] if r < 0.55 else allowed
            pool = pick if len(pick) else allowed
        tok = int(pool[rng.randrange(len(pool))])
        state.advance(tok, budget=remaining)
        ids.append(tok)
        written += vocab.token_bytes[tok]
    assert len(ids) - 1 <= budget  # the finishing EOS aside
    return ids


def check_prefixes(index, ids: list[int]) -> None:
    """Mask/parser agreement: every prefix the mask allowed is one the parser can still complete. The streaming
    parser fed it raises nothing; the prefix readings are not empty; a cut there never reports a call."""
    parser = StreamParser(index, id_factory=counter_ids())
    decoder = _Decoder(index)
    for k, t in enumerate(ids):
        parser.feed(t)
        decoder.feed(t)
        assert decoder.valid
        assert _readings(decoder, prefix=True), f"the parser cannot read the allowed prefix ids[:{k + 1}]"
        cut = parse_output(index, ids[:k + 1], "length")
        assert cut["finish_reason"] == "length" and "tool_calls" not in cut
    parser.finish("stop")
    assert parser.finish_reason in ("stop", "tool_calls")


def check_message(request: dict, msg: dict) -> int:
    """A complete output's message obeys the request; returns the number of calls."""
    lo, hi, names = expected(request)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in request["tools"]}
    assert "tool_calls" not in msg or msg["tool_calls"], "never an empty tool_calls list"
    calls = msg.get("tool_calls", [])
    assert lo <= len(calls) <= hi, (len(calls), lo, hi)
    if lo >= 1:
        assert msg["content"] is None, "no prose around a required call"
    named = isinstance(request["tool_choice"], dict) and request["tool_choice"]["type"] == "function"
    assert msg["finish_reason"] == ("tool_calls" if calls and not named else "stop")
    for call in calls:
        assert call["type"] == "function" and call["id"]
        name = call["function"]["name"]
        assert name in names, (name, names)
        args = json.loads(call["function"]["arguments"])
        assert isinstance(args, dict)
        jsonschema.validate(args, schemas[name])
    return len(calls)


def run_cell(index, request: dict, rng: random.Random, walks: int) -> list[int]:
    """Walk one cell; returns the call count of each walk."""
    counts = []
    for w in range(walks):
        budget = index.min_tokens_from_start() + rng.randint(0, EXTRA_MAX)
        ids = budgeted_walk(index, rng, budget, structural=w > 0)
        state = index.start()
        for t in ids[:-1]:
            state.advance(t)
        assert state.is_accepting(), "complete before the finishing EOS"
        msg = parse_output(index, ids, "stop", id_factory=counter_ids())
        counts.append(check_message(request, msg))
        cut = parse_output(index, ids, "length")
        assert cut["finish_reason"] == "length" and "tool_calls" not in cut
        check_prefixes(index, ids)
    return counts


# ---- the matrix


def test_matrix_size():
    """6 families (7 grammars) × 5 choices × parallel × thinking where a think rule exists × strict."""
    assert len({FAMILY.get(c[0], c[0]) for c in CELLS}) == 6
    assert len(CELLS) == 220 and len(set(CELLS)) == 220  # (4 × 2 + 3) × 5 × 2 × 2



@pytest.mark.parametrize("cell", CELLS, ids=_cell_id)
def test_contract_matrix(request, cell):
    fmt, choice, parallel, thinking, strict = cell
    vocab = request.getfixturevalue(VOCAB_OF[fmt])
    req = request_for(choice, parallel, thinking, strict)
    index = index_for(req, vocab, fmt, thinking)
    assert not index.meta["relaxed"], "these tools compile exactly: every argument is validated"
    counts = run_cell(index, req, random.Random(_cell_id(cell)), WALKS_PER_CELL)
    assert len(counts) == WALKS_PER_CELL
    if choice in ("required", "named", "allowed"):
        assert all(c >= 1 for c in counts)


@pytest.mark.parametrize("fmt", list(VOCAB_OF))
def test_auto_walks_reach_calls(request, fmt):
    """The matrix's auto cells are not vacuous: structural walks under auto + parallel do make calls (one, and
    more than one) and plain text turns."""
    vocab = request.getfixturevalue(VOCAB_OF[fmt])
    req = request_for("auto", True, False, True)
    index = index_for(req, vocab, fmt, False)
    rng = random.Random(f"auto-{fmt}")
    counts = []
    for _ in range(12):
        ids = budgeted_walk(index, rng, index.min_tokens_from_start() + rng.randint(20, EXTRA_MAX), structural=True)
        counts.append(check_message(req, parse_output(index, ids, "stop", id_factory=counter_ids())))
    assert 0 in counts and any(c >= 1 for c in counts), counts


# ---- regressions (contract reference, Part 3), on hand-written turns in each format's own markup

# (calls_open, one call of math_toolkit_product_of_primes {"count": 5}, call_sep, calls_close, end)
P = "math_toolkit_product_of_primes"
MARKUP = {
    "hermes": ("", f'<tool_call>\n{{"name": "{P}", "arguments": {{"count": 5}}}}\n</tool_call>', "\n", "",
               "<|im_end|>"),
    "qwen3_xml": ("", f"<tool_call>\n<function={P}>\n<parameter=count>\n5\n</parameter>\n</function>\n</tool_call>",
                  "\n", "", "<|im_end|>"),
    "gemma4": ("", f"<|tool_call>call:{P}{{count:5}}<tool_call|>", "", "", "<|tool_response>"),
    "llama3_json": ("", f'{{"name": "{P}", "parameters": {{"count": 5}}}}', "; ", "", "<|eot_id|>"),
    "mistral": ("", f'[TOOL_CALLS]{P}[ARGS]{{"count": 5}}', "", "", "</s>"),
    "mistral_v3": ("[TOOL_CALLS][", f'{{"name": "{P}", "arguments": {{"count": 5}}}}', ", ", "]", "</s>"),
    "json": ("[", f'{{"name": "{P}", "arguments": {{"count": 5}}}}', ", ", "]", ""),
}
# the thinking blocks (the qwen3_xml prompt already opened `<think>`)
THINK_OPEN = {"hermes": "<think>\n", "qwen3_xml": "", "gemma4": "<|channel>thought\n", "mistral": "[THINK]"}
THINK_CLOSE = {"hermes": "\n</think>\n\n", "qwen3_xml": "\n</think>\n\n", "gemma4": "<channel|>", "mistral": "[/THINK]"}


def compiled(request, fmt: str, choice: str, parallel: bool, thinking: bool = False):
    vocab = request.getfixturevalue(VOCAB_OF[fmt])
    req = request_for(choice, parallel, thinking, False)
    return req, vocab, index_for(req, vocab, fmt, thinking)


def fed(index, ids):
    state = index.start()
    for t in ids:
        state.advance(t)
    return state


def refuses(index, ids) -> bool:
    try:
        fed(index, ids)
    except MaskViolation:
        return True
    return False


def texts(vocab, ids) -> list[bytes]:
    return [vocab.token_bytes[int(t)] for t in ids]


def stream_outcome(index, ids, finish_reason):
    parser = StreamParser(index, id_factory=counter_ids())
    deltas = [d for t in ids for d in parser.feed(t)]
    deltas += parser.finish(finish_reason)
    return parser.finish_reason, [d for d in deltas if "tool_calls" in d]


@pytest.mark.parametrize("fmt", list(VOCAB_OF))
def test_vllm_50399_forced_repetition_always_ends(request, fmt):
    """vllm#50399: `required` repeated one call until max_tokens. Here, at every call boundary the turn can end in
    one more token (the close or end token is allowed), the call after the cap is refused, and a model that wants
    to repeat the call forever still ends inside a generous budget."""
    req, vocab, index = compiled(request, fmt, "required", True)
    opening, call, sep, close, end = MARKUP[fmt]
    ids = encode(vocab, opening)
    for k in range(MAX_PARALLEL_CALLS):
        ids += encode(vocab, (sep if k else "") + call)
        state = fed(index, ids)
        finish = encode(vocab, close + end)
        assert finish[0] in state.allowed_token_ids(), f"after call {k + 1} the turn can end"
        assert len(state.allowed_token_ids(budget=len(finish))) > 0
        done = fed(index, ids + finish)
        assert done.is_accepting()
        msg = parse_output(index, ids + finish, id_factory=counter_ids())
        assert check_message(req, msg) == k + 1
    assert refuses(index, ids + encode(vocab, sep + call)), "no call past the cap"

    # the repeating model: it wants the call again and again; refused, it samples what the mask allows
    wanted = encode(vocab, opening + call + (sep + call) * (MAX_PARALLEL_CALLS + 4))
    rng = random.Random(f"50399-{fmt}")
    budget = index.min_tokens_from_start() + 400
    state, out, i = index.start(), [], 0
    while not state.is_finished():
        allowed = state.allowed_token_ids(budget=budget - len(out))
        if i < len(wanted) and wanted[i] in allowed:
            tok, i = wanted[i], i + 1
        else:
            tok = int(rng.choice(allowed))
        state.advance(tok, budget=budget - len(out))
        out.append(tok)
    assert len(out) - 1 <= budget
    assert check_message(req, parse_output(index, out, id_factory=counter_ids())) == MAX_PARALLEL_CALLS


@pytest.mark.parametrize("fmt,thinking", [(f, False) for f in VOCAB_OF] + [(f, True) for f in THINK_FORMATS])
def test_llamacpp_27217_no_prose_before_a_required_call(request, fmt, thinking):
    """llama.cpp#27217: `required` let the model write unbounded prose before the call. Under required (and the
    allowed_tools subset) the first token of the answer (after the thinking block, if any) can only begin the call."""
    for choice in ("required", "allowed"):
        _, vocab, index = compiled(request, fmt, choice, True, thinking)
        state = index.start()
        if thinking:
            first = set(texts(vocab, state.allowed_token_ids()))
            if fmt != "qwen3_xml":  # qwen3_xml's prompt opened the block: thinking text comes first
                assert first <= {b"<think>", b"[THINK]", b"<|channel>", b"<|tool_call>"}, first
            state = fed(index, encode(vocab, THINK_OPEN[fmt] + "hmm" + THINK_CLOSE[fmt]))
        opening = CALL_OPEN[fmt].encode()
        allowed = texts(vocab, state.allowed_token_ids())
        assert allowed
        for t in allowed:
            assert t.startswith(opening) or opening.startswith(t), (choice, t)


@pytest.mark.parametrize("fmt", list(VOCAB_OF))
def test_vllm_53255_53363_no_empty_tool_calls(request, fmt):
    """vllm#53255 / #53363: `required` without a parsed call answered `finish_reason: "tool_calls"` with
    `tool_calls: []`. An empty output, prose (outside the language), or a half call never reports tool_calls."""
    _, vocab, index = compiled(request, fmt, "required", True)
    opening, call, _, _, end = MARKUP[fmt]
    half = opening + call[: len(call) // 2]
    for text in ("", "I think it is sunny." + end, half, half + end):
        ids = encode(vocab, text)
        for reason in ("stop", "length"):
            msg = parse_output(index, ids, reason)
            assert "tool_calls" not in msg and msg["finish_reason"] == reason, (text, reason, msg)
            got, calls = stream_outcome(index, ids, reason)
            assert got == reason and calls == []


@pytest.mark.parametrize("fmt", list(VOCAB_OF))
def test_vllm_53269_58228_length_is_never_hidden_as_tool_calls(request, fmt):
    """vllm#53269 (streaming) / #58228 (non-stream auto): a call cut by max_tokens was reported as `tool_calls`.
    At every cut of a two-call turn, `length` stays `length`, with no calls in the message and, streamed, no call
    sent before it closed."""
    for choice in ("auto", "required"):
        _, vocab, index = compiled(request, fmt, choice, True)
        opening, call, sep, close, end = MARKUP[fmt]
        first = encode(vocab, opening) + encode(vocab, call)
        ids = first + encode(vocab, sep + call) + encode(vocab, close + end)
        assert fed(index, ids).is_accepting()
        for cut in range(len(ids) + 1):
            msg = parse_output(index, ids[:cut], "length")
            assert msg["finish_reason"] == "length" and "tool_calls" not in msg, (choice, cut)
            got, calls = stream_outcome(index, ids[:cut], "length")
            assert got == "length", (choice, cut)
            if cut < len(first):
                assert calls == [], (choice, cut)


PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "maxItems": 1}},
    "required": ["tags"]}}}
ONE_ITEM = {"hermes": '<tool_call>\n{"name": "pick", "arguments": {"tags": ["a"',
            "qwen3_xml": '<tool_call>\n<function=pick>\n<parameter=tags>\n["a"',
            "gemma4": '<|tool_call>call:pick{tags:[<|"|>a<|"|>',
            "llama3_json": '{"name": "pick", "parameters": {"tags": ["a"',
            "mistral": '[TOOL_CALLS]pick[ARGS]{"tags": ["a"',
            "mistral_v3": '[TOOL_CALLS][{"name": "pick", "arguments": {"tags": ["a"',
            "json": '[{"name": "pick", "arguments": {"tags": ["a"'}


@pytest.mark.parametrize("fmt", list(VOCAB_OF))
def test_sglang_17998_max_items_one_closes(request, fmt):
    """sglang#17998: a `maxItems: 1` array stalled on whitespace. Inside the arguments, after one item only `]`
    continues (whitespace aside), the tightest budget still closes it, and budgeted walks end with valid arguments;
    with parallel_tool_calls false, after one call only the end of the turn continues."""
    for parallel in (True, False):
        vocab = request.getfixturevalue(VOCAB_OF[fmt])
        req = {"tools": [PICK, PRIMES], "tool_choice": {"type": "function", "function": {"name": "pick"}},
               "parallel_tool_calls": parallel}
        index = index_for(req, vocab, fmt, False)
        state = fed(index, encode(vocab, ONE_ITEM[fmt]))
        allowed = texts(vocab, state.allowed_token_ids())
        assert any(t.lstrip(b" \t\r\n").startswith(b"]") for t in allowed)
        for t in allowed:
            rest = t.lstrip(b" \t\r\n")
            assert rest == b"" or rest.startswith(b"]"), t
        tight = state.allowed_token_ids(budget=index.min_tokens(state.dfa_state))
        assert any(vocab.token_bytes[int(t)].lstrip().startswith(b"]") for t in tight)
        rng = random.Random(f"17998-{fmt}-{parallel}")
        for w in range(3):
            ids = budgeted_walk(index, rng, index.min_tokens_from_start() + rng.randint(0, EXTRA_MAX), w > 0)
            assert check_message(req, parse_output(index, ids, id_factory=counter_ids())) == 1

    # the call list itself: one call allowed → after it, no separator and no second call
    _, vocab, index = compiled(request, fmt, "required", False)
    opening, call, sep, close, end = MARKUP[fmt]
    ids = encode(vocab, opening + call)
    assert refuses(index, ids + encode(vocab, sep + call))
    assert fed(index, ids + encode(vocab, close + end)).is_accepting()
    assert len(fed(index, ids).allowed_token_ids(budget=max(len(encode(vocab, close + end)), 1))) > 0


@pytest.mark.parametrize("fmt", THINK_FORMATS)
def test_llamacpp_22537_grammar_does_not_leak_into_thinking(request, fmt):
    """llama.cpp#22537: the tool grammar leaked into `<think>` (and its lazy trigger deadlocked). With thinking on,
    thinking text is free (braces, quotes, a call's JSON spelled out) and a call can only begin once the block
    closes; what was thought is reasoning, never a call."""
    opening, call, _, close, end = MARKUP[fmt]
    for choice in ("auto", "required"):
        _, vocab, index = compiled(request, fmt, choice, True, True)
        call_open = vocab.special_tokens[CALL_OPEN[fmt]]
        thought = 'maybe {"name": "' + P + '", "arguments": {"count": 5}} or "quoted" {x}'
        state = fed(index, encode(vocab, THINK_OPEN[fmt]))
        for piece in ("{", '"', '{"', "}", "'"):
            allowed = set(texts(vocab, state.allowed_token_ids()))
            assert piece.encode() in allowed, piece
        assert call_open not in state.allowed_token_ids(), "no call inside the thinking block"
        state = fed(index, encode(vocab, THINK_OPEN[fmt] + thought))
        assert call_open not in state.allowed_token_ids(), "no call inside the thinking block"
        assert not state.is_accepting()
        ids = encode(vocab, THINK_OPEN[fmt] + thought + THINK_CLOSE[fmt] + opening + call + close + end)
        assert fed(index, ids).is_accepting()
        msg = parse_output(index, ids, id_factory=counter_ids())
        assert '{"name": "' in msg["reasoning_content"] and msg["content"] is None
        assert [c["function"]["name"] for c in msg["tool_calls"]] == [P]
        assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"count": 5}
