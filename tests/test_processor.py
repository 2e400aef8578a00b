"""MaskProcessor: tiny seeded random models on real tokenizers; every output is accepted by a fresh cursor."""

from __future__ import annotations

import json
import threading

import jsonschema
import numpy as np
import pytest
import torch

from constrain.compiler import compile_index, compile_json_schema
from constrain.errors import MaskViolation
from constrain.policy import Policy
from constrain.processor import MaskProcessor
from constrain.vocabulary import Vocabulary, qwen3_vocabulary
from models import hf_tokenizer, tiny_model

transformers = pytest.importorskip("transformers")

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
TAGS = {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4}
FLAG = {"type": "boolean"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}


# ---- fixtures: one tokenizer + model per family, built once per module


@pytest.fixture(scope="module")
def llama():
    tok = hf_tokenizer("llama3")
    vocab = Vocabulary.from_tokenizer(tok)
    pad = vocab.eos_ids[0]
    # Logits wider than the tokenizer (128257) and than the mask width (4009 words = 128288): padding is masked.
    model = tiny_model("llama", 128320, eos_ids=list(vocab.eos_ids), pad_id=pad, seed=1)
    tok.pad_token_id = pad
    tok.padding_side = "left"
    return tok, vocab, model


@pytest.fixture(scope="module")
def qwen():
    # Token bytes from the qwen2 GGUF with Qwen3's added tokens overlaid (<tool_call> 151657 ...); the HF tokenizer
    # of the same GGUF encodes prompts (its ids agree on every base token).
    tok = hf_tokenizer("qwen3")
    vocab = qwen3_vocabulary()
    model = tiny_model("qwen3", vocab.vocab_size, eos_ids=list(vocab.eos_ids), pad_id=vocab.eos_ids[0], seed=2)
    tok.padding_side = "left"
    return tok, vocab, model


@pytest.fixture(scope="module")
def phi():
    tok = hf_tokenizer("phi3")
    vocab = Vocabulary.from_tokenizer(tok)
    model = tiny_model("llama", vocab.vocab_size, eos_ids=list(vocab.eos_ids), pad_id=tok.pad_token_id, seed=3)
    tok.padding_side = "left"
    return tok, vocab, model


# ---- checks


def walk(index, ids):
    """A fresh cursor fed `ids` up to and including the first EOS (the rest is padding). Raises MaskViolation."""
    cursor = index.start()
    for t in ids:
        cursor.advance(int(t))
        if cursor.is_finished():
            break
    return cursor


def text_of(vocab, ids) -> str:
    """The generated text up to the first EOS, special tokens spelled out."""
    names = {i: s for s, i in vocab.special_tokens.items()}
    out = b""
    for t in ids:
        if t in vocab.eos_ids:
            break
        out += names[t].encode() if t in names else vocab.token_bytes[t]
    return out.decode("utf-8")


def check_json(index, vocab, ids, schema, *, complete: bool):
    cursor = walk(index, ids)
    if complete:
        assert cursor.is_accepting(), text_of(vocab, ids)
        jsonschema.validate(json.loads(text_of(vocab, ids)), schema)


def check_tool_call(index, vocab, ids, tool):
    cursor = walk(index, ids)
    assert cursor.is_accepting()
    text = text_of(vocab, ids)
    calls = [part.split("</tool_call>")[0] for part in text.split("<tool_call>")[1:]]
    assert calls, text
    for call in calls:
        data = json.loads(call)
        assert data["name"] == tool["function"]["name"]
        jsonschema.validate(data["arguments"], tool["function"]["parameters"])


def prompt(tok, texts):
    enc = tok(texts, return_tensors="pt", padding=True)
    return enc, enc.input_ids.shape[1]


# ---- generate end to end


def test_mixed_batch_one_index_per_row_greedy_with_padding(llama):
    tok, vocab, model = llama
    schemas = [PERSON, TAGS, None]
    indexes = [None if s is None else compile_json_schema(s, vocab) for s in schemas]
    enc, plen = prompt(tok, ["Describe a person as JSON:", "colors", "Say something unconstrained please"])
    proc = MaskProcessor(indexes, plen, budget=24, debug=True)
    out = model.generate(**enc, max_new_tokens=24, do_sample=False, logits_processor=[proc])
    for r, (schema, index) in enumerate(zip(schemas, indexes)):
        if index is not None:
            check_json(index, vocab, out[r, plen:].tolist(), schema, complete=True)
    # The unconstrained row (-1) is untouched: it matches a plain run of the same batch.
    plain = model.generate(**enc, max_new_tokens=24, do_sample=False)
    assert out[2].tolist() == plain[2].tolist()


def test_sampling_num_return_sequences_mixed_tool_policy_and_schema(qwen):
    tok, vocab, model = qwen
    policy = Policy.from_request(tools=[WEATHER], tool_choice="required")
    tools = compile_index(policy, vocab, tool_format="hermes")
    person = compile_json_schema(PERSON, vocab)
    enc, plen = prompt(tok, ["What is the weather in Paris?", "A person:"])
    proc = MaskProcessor([tools, person], plen, budget=48, debug=True)
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=48, do_sample=True, num_return_sequences=3, logits_processor=[proc])
    assert out.shape[0] == 6
    for r in range(6):
        ids = out[r, plen:].tolist()
        if r < 3:
            check_tool_call(tools, vocab, ids, WEATHER)
        else:
            check_json(person, vocab, ids, PERSON, complete=True)


@pytest.mark.parametrize("family", ["llama", "qwen"])
def test_beam_search(request, family):
    tok, vocab, model = request.getfixturevalue(family)
    index = compile_json_schema(TAGS, vocab)
    enc, plen = prompt(tok, ["Pick colors:", "x"])
    proc = MaskProcessor(index, plen, budget=16, debug=True)
    out = model.generate(**enc, max_new_tokens=16, num_beams=3, num_return_sequences=2, do_sample=False,
                         logits_processor=[proc])
    assert out.shape[0] == 4
    for r in range(4):
        check_json(index, vocab, out[r, plen:].tolist(), TAGS, complete=True)


def test_assisted_decoding_rollbacks(llama):
    tok, vocab, model = llama
    draft = tiny_model("llama", model.config.vocab_size, eos_ids=list(vocab.eos_ids), pad_id=vocab.eos_ids[0], seed=9)
    index = compile_json_schema(PERSON, vocab)
    enc, plen = prompt(tok, ["Person:"])
    proc = MaskProcessor(index, plen, budget=20)
    out = model.generate(**enc, max_new_tokens=20, do_sample=False, assistant_model=draft, logits_processor=[proc])
    check_json(index, vocab, out[0, plen:].tolist(), PERSON, complete=True)
    # Assisted greedy decoding yields exactly what plain greedy decoding under the same mask yields.
    plain = model.generate(**enc, max_new_tokens=20, do_sample=False,
                           logits_processor=[MaskProcessor(index, plen, budget=20)])
    assert out[0].tolist() == plain[0].tolist()


def test_streaming_text_iterator(phi):
    tok, vocab, model = phi
    index = compile_json_schema(PERSON, vocab)
    enc, plen = prompt(tok, ["Person:"])
    streamer = transformers.TextIteratorStreamer(tok, skip_prompt=True, skip_special_tokens=True)
    proc = MaskProcessor(index, plen, budget=20, debug=True)
    box = {}

    def run():
        box["out"] = model.generate(**enc, max_new_tokens=20, do_sample=True, logits_processor=[proc],
                                    streamer=streamer)

    worker = threading.Thread(target=run)
    worker.start()
    streamed = "".join(streamer)
    worker.join()
    ids = box["out"][0, plen:].tolist()
    check_json(index, vocab, ids, PERSON, complete=True)
    assert streamed == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("max_new", [8, 9, 13])
def test_truncation_with_budget_is_complete(phi, max_new):
    tok, vocab, model = phi
    index = compile_json_schema(PERSON, vocab)
    assert index.min_tokens_from_start() <= 8  # 8: the tightest budget is exercised
    enc, plen = prompt(tok, ["Person:", "Someone else:"])
    proc = MaskProcessor(index, plen, budget=max_new, debug=True)
    torch.manual_seed(max_new)
    out = model.generate(**enc, max_new_tokens=max_new, do_sample=True, num_return_sequences=2,
                         logits_processor=[proc])
    for r in range(out.shape[0]):
        check_json(index, vocab, out[r, plen:].tolist(), PERSON, complete=True)


def test_truncation_without_budget_is_an_accepted_prefix(phi):
    tok, vocab, model = phi
    index = compile_json_schema({"type": "array", "items": {"type": "string"}}, vocab)
    enc, plen = prompt(tok, ["Strings:"])
    proc = MaskProcessor(index, plen, debug=True)
    out = model.generate(**enc, max_new_tokens=8, do_sample=True, logits_processor=[proc])
    walk(index, out[0, plen:].tolist())  # cut off, but never outside the language


# ---- the processor called directly


def allowed(scores: torch.Tensor) -> list[np.ndarray]:
    return [np.flatnonzero(torch.isfinite(row).numpy()) for row in scores]


def expected(index, ids, budget=None) -> np.ndarray:
    cursor = walk(index, ids)
    return cursor.allowed_token_ids(budget)


def spell(index, vocab, text: bytes) -> list[int]:
    """`text` as single-byte tokens, checked against the cursor on the way."""
    by_byte = {b: t for t, b in enumerate(vocab.token_bytes) if len(b) == 1 and t not in vocab.special_ids}
    ids = [by_byte[bytes([ch])] for ch in text]
    walk(index, ids)
    return ids


@pytest.fixture(scope="module")
def person_phi(phi):
    _, vocab, _ = phi
    index = compile_json_schema(PERSON, vocab)
    return vocab, index, spell(index, vocab, b'{"name":"ab","age":7}')


def test_rows_follow_their_prefix_not_their_position(person_phi):
    vocab, index, ids = person_phi
    other = spell(index, vocab, b'{"name":"x","age":12}')
    V = vocab.vocab_size + 7  # wider than the mask: the tail is -inf
    proc = MaskProcessor(index, 2)
    # Extension, rollback, jump back, extension again, beams swapping rows, duplicated rows.
    calls = [(ids[:3], other[:3]), (ids[:4], other[:4]), (ids[:2], other[:2]), (ids[:5], other[:5]),
             (other[:6], ids[:6]), (other[:7], other[:7]), (ids[:9], other[:12])]
    for prefixes in calls:
        width = max(len(p) for p in prefixes)
        # Right-pad the shorter prefix's row with a valid continuation so both rows have one length.
        rows = [[5, 6] + p + (ids if p == ids[: len(p)] else other)[len(p): width] for p in prefixes]
        scores = torch.zeros(2, V)
        proc(torch.tensor(rows), scores)
        for row, got in zip(rows, allowed(scores)):
            np.testing.assert_array_equal(got, expected(index, row[2:]))


def test_budget_masks_and_finished_rows(person_phi):
    vocab, index, ids = person_phi
    budget = len(ids) + 2
    proc = MaskProcessor(index, 0, budget=budget)
    for k in range(len(ids) + 1):
        scores = torch.zeros(1, vocab.vocab_size)
        proc(torch.tensor([ids[:k]]), scores)
        np.testing.assert_array_equal(allowed(scores)[0], expected(index, ids[:k], budget - k))
    eos = vocab.eos_ids[0]
    # After EOS the row is padding: any pad id is tolerated and only EOS stays allowed.
    for tail in ([eos], [eos, 0], [eos, 0, 0]):
        scores = torch.zeros(1, vocab.vocab_size)
        proc(torch.tensor([ids + tail]), scores)
        np.testing.assert_array_equal(allowed(scores)[0], sorted(vocab.eos_ids))


def test_off_language_prefix_dead_row_or_violation(person_phi):
    vocab, index, ids = person_phi
    bad = ids[:1] + [ids[0]]  # `{{` is not JSON
    scores = torch.zeros(2, vocab.vocab_size)
    MaskProcessor(index, 0)(torch.tensor([ids[:2], bad]), scores)
    assert torch.isfinite(scores[0]).any() and not torch.isfinite(scores[1]).any()
    with pytest.raises(MaskViolation):
        MaskProcessor(index, 0, debug=True)(torch.tensor([bad]), torch.zeros(1, vocab.vocab_size))
    # Under a budget, debug also checks each token against its budgeted mask.
    long_name = ids[:9] + ids[9:10] * 40
    with pytest.raises(MaskViolation):
        MaskProcessor(index, 0, budget=60, debug=True)(torch.tensor([long_name]), torch.zeros(1, vocab.vocab_size))


def test_argument_errors(person_phi):
    vocab, index, _ = person_phi
    with pytest.raises(ValueError):
        MaskProcessor([], 0)
    with pytest.raises(ValueError):
        MaskProcessor(index, 0, budget=index.min_tokens_from_start() - 1)
    with pytest.raises(ValueError):
        MaskProcessor(index, 0)(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, vocab.n_tokens - 1))
    with pytest.raises(ValueError):
        MaskProcessor([index, index], 0)(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, vocab.vocab_size))


@pytest.mark.gpu
def test_device_table_on_cuda(person_phi):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    vocab, index, ids = person_phi
    proc = MaskProcessor(index, 0)
    for k in range(len(ids)):
        scores = torch.zeros(2, vocab.vocab_size, device="cuda")
        proc(torch.tensor([ids[:k], ids[:k]], device="cuda"), scores)
        for got in allowed(scores.cpu()):
            np.testing.assert_array_equal(got, expected(index, ids[:k]))
