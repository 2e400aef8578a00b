"""vLLM plugin, Model Runner V2 half: fake `LogitsProcRequestState`/`LogitsContext` (no vLLM needed), real index."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import constrain
from constrain.vllm_plugin import ConstrainLogitsProcessor, constraint_of

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "strict": True,
        "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]}}, "required": ["unit"],
                       "additionalProperties": False},
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
PROMPT = [7, 8, 9]
MAX_LEN = 256


def request(tools=(WEATHER,), tool_choice="required", max_tokens=64, **fields):
    c = {"tools": list(tools), "tool_choice": tool_choice, "parallel_tool_calls": False, "tool_format": "llama3_json",
         **fields}
    return SimpleNamespace(extra_args={"constrain": json.dumps(c)}, max_tokens=max_tokens, structured_outputs=None,
                           min_tokens=0)


def plain(max_tokens=64):
    return SimpleNamespace(extra_args=None, max_tokens=max_tokens, structured_outputs=None, min_tokens=0)


def index_of(sp, vocab):
    c = constraint_of(sp)
    policy = constrain.Policy.from_request({k: v for k, v in c.items() if k != "tool_format"})
    return constrain.compile_index(policy, vocab, tool_format=c["tool_format"])


class FakeRunner:
    """Model Runner V2's view for a logits processor: per-slot committed tokens on the 'device', a step's layout."""

    def __init__(self, vocab, max_reqs=4):
        self.vocab = vocab
        self.tokens = torch.zeros((max_reqs, MAX_LEN), dtype=torch.int32)
        self.prompt_len = np.zeros(max_reqs, dtype=np.int32)
        self.total_len = np.zeros(max_reqs, dtype=np.int32)
        req_states = SimpleNamespace(
            device=torch.device("cpu"), max_num_reqs=max_reqs, vocab_size=vocab.vocab_size,
            all_token_ids=SimpleNamespace(gpu=self.tokens), prompt_len=SimpleNamespace(np=self.prompt_len),
            prefill_len=SimpleNamespace(np=self.prompt_len.copy()), total_len=SimpleNamespace(np=self.total_len))
        config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: vocab.vocab_size))
        self.proc = ConstrainLogitsProcessor(config, req_states)
        self.proc._vocab = vocab  # the engine loads it from model_config.tokenizer; here the fixture's

    def add(self, slot, sp, prompt=PROMPT, output=()):
        seq = list(prompt) + list(output)
        self.tokens[slot, : len(seq)] = torch.tensor(seq, dtype=torch.int32)
        self.prompt_len[slot] = len(prompt)
        self.total_len[slot] = len(seq)
        return self.proc.add_request(slot, sp)

    def commit(self, slot, token):
        self.tokens[slot, self.total_len[slot]] = token
        self.total_len[slot] += 1

    def ctx(self, slots, drafts=None):
        """One row per slot (in the given order), plus one row per draft token for slots in `drafts`."""
        rows = []
        for slot in slots:
            last = int(self.total_len[slot]) - 1
            rows.append((slot, 0, int(self.tokens[slot, last]), last))
            for j, tok in enumerate((drafts or {}).get(slot, ()), 1):
                rows.append((slot, j, tok, last + j))
        t = torch.tensor(rows, dtype=torch.int64).T
        return SimpleNamespace(expanded_idx_mapping=t[0].to(torch.int32), expanded_local_pos=t[1].to(torch.int32),
                               input_ids=t[2].to(torch.int32), pos=t[3], idx_mapping=t[0].unique().to(torch.int32),
                               idx_mapping_np=t[0].unique().numpy(), seq_lens_upper_bound_np=None)

    def apply(self, slots, drafts=None, seed=0):
        ctx = self.ctx(slots, drafts)
        logits = torch.randn((ctx.input_ids.shape[0], self.vocab.vocab_size),
                             generator=torch.Generator().manual_seed(seed))
        raw = logits.clone()
        out = self.proc.apply(logits, ctx)
        assert out is logits
        return raw, logits


def allowed(row: torch.Tensor) -> np.ndarray:
    return np.flatnonzero(torch.isfinite(row).numpy())


def expected(cursor, budget=None) -> np.ndarray:
    return cursor.allowed_token_ids(budget)


@pytest.fixture(scope="module")
def runner_factory(llama3_vocab):
    return lambda **kw: FakeRunner(llama3_vocab, **kw)


def test_one_class_both_constructors(llama3_vocab):
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: llama3_vocab.vocab_size))
    assert ConstrainLogitsProcessor(config, torch.device("cpu"), False)._mode == "v1"
    state = SimpleNamespace(device=torch.device("cpu"))
    assert ConstrainLogitsProcessor(config, state)._mode == "v2"
    with pytest.raises(TypeError):
        ConstrainLogitsProcessor(config)
    assert ConstrainLogitsProcessor(config, state).is_argmax_invariant() is False


def test_masks_applied_per_row(runner_factory, llama3_vocab):
    run = runner_factory()
    a, b = request(), request(tools=(WEATHER, TIME), tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert run.add(0, a) and run.add(1, b) and not run.add(2, plain())
    raw, masked = run.apply([2, 1, 0])  # rows are not in slot order
    assert torch.equal(masked[0], raw[0])  # unconstrained row untouched
    np.testing.assert_array_equal(allowed(masked[1]), expected(index_of(b, llama3_vocab).start(), 64 - 1))
    np.testing.assert_array_equal(allowed(masked[2]), expected(index_of(a, llama3_vocab).start(), 64 - 1))
    kept = torch.isfinite(masked[2])
    assert torch.equal(masked[2][kept], raw[2][kept])  # allowed logits keep their values


def test_no_constrained_request_is_a_no_op(runner_factory):
    run = runner_factory()
    run.add(0, plain())
    raw, masked = run.apply([0])
    assert torch.equal(raw, masked)


def _decode(run, slots, steps, seed=0):
    """Greedy decoding through the processor: each slot samples the argmax of its masked row and commits it."""
    done = set()
    for step in range(steps):
        live = [s for s in slots if s not in done]
        if not live:
            break
        _, masked = run.apply(live, seed=seed + step)
        for row, slot in enumerate(live):
            tok = int(masked[row].argmax())
            assert torch.isfinite(masked[row, tok])
            run.commit(slot, tok)
            if tok in run.vocab.eos_ids:
                done.add(slot)
    return done


def test_state_advances_to_a_whole_call(runner_factory, llama3_vocab):
    run = runner_factory()
    sps = {0: request(), 3: request(tools=(WEATHER, TIME))}
    for slot, sp in sps.items():
        run.add(slot, sp)
    run.add(1, plain())
    done = _decode(run, [0, 1, 3], 64)
    for slot, sp in sps.items():
        assert slot in done
        out = run.tokens[slot, run.prompt_len[slot]: run.total_len[slot]].tolist()
        message = constrain.parse_output(index_of(sp, llama3_vocab), out, "stop")
        assert len(message["tool_calls"]) == 1, message


def test_table_reset_keeps_masks_exact(runner_factory, llama3_vocab, monkeypatch):
    # A tiny table limit rebuilds the table (and drops the CPU plans keyed by its rows) every step or two.
    monkeypatch.setattr("constrain.vllm_plugin.MAX_TABLE_ROWS", 3)
    run = runner_factory()
    sps = {0: request(), 2: request(tools=(WEATHER, TIME))}
    cursors = {}
    for slot, sp in sps.items():
        run.add(slot, sp)
        cursors[slot] = index_of(sp, llama3_vocab).start()
    live = list(sps)
    for step in range(64):
        live = [s for s in live if not cursors[s].is_finished()]
        if not live:
            break
        _, masked = run.apply(live, seed=step)
        for row, slot in enumerate(live):
            budget = max(64 - int(run.total_len[slot] - run.prompt_len[slot]) - 1, 0)
            np.testing.assert_array_equal(allowed(masked[row]), expected(cursors[slot], budget))
            tok = int(masked[row].argmax())
            run.commit(slot, tok)
            cursors[slot].advance(tok, budget)
    assert not live


def test_slot_reuse_reinitialises(runner_factory, llama3_vocab):
    run = runner_factory()
    run.add(0, request())
    _decode(run, [0], 5)
    # The slot is recycled for an unconstrained request: its rows are untouched from now on.
    run.add(0, plain())
    raw, masked = run.apply([0])
    assert torch.equal(raw, masked)
    # And for a new constrained request: it starts at the start state, not where the old one stopped.
    sp = request(tools=(TIME,))
    run.add(0, sp)
    _, masked = run.apply([0])
    np.testing.assert_array_equal(allowed(masked[0]), expected(index_of(sp, llama3_vocab).start(), 63))


def test_committed_jump_reads_the_device_tokens(runner_factory, llama3_vocab):
    """Resumption after preemption (output already there) and several tokens committed in one step."""
    sp = request()
    index = index_of(sp, llama3_vocab)
    text = llama3_vocab.token_bytes
    cursor = index.start()
    out = []
    for _ in range(4):  # walk 4 allowed tokens
        tok = int(cursor.allowed_token_ids()[0])
        assert text[tok]
        cursor.advance(tok)
        out.append(tok)
    run = runner_factory()
    run.add(2, sp, output=out[:2])
    _, masked = run.apply([2])
    ref = index.start()
    for t in out[:2]:
        ref.advance(t)
    np.testing.assert_array_equal(allowed(masked[0]), expected(ref, 64 - 2 - 1))
    run.commit(2, out[2])
    run.commit(2, out[3])
    _, masked = run.apply([2])
    np.testing.assert_array_equal(allowed(masked[0]), expected(cursor, 64 - 4 - 1))


def test_draft_rows_see_their_drafts(runner_factory, llama3_vocab):
    sp = request()
    index = index_of(sp, llama3_vocab)
    run = runner_factory()
    run.add(1, sp)
    start = index.start()
    d1 = int(start.allowed_token_ids(63)[0])
    after = start.fork()
    after.advance(d1)
    bad = 0  # "!" cannot start a call: rows after a rejected draft keep the last live mask (never an empty row)
    assert bad not in set(start.allowed_token_ids())
    _, masked = run.apply([1], drafts={1: [d1, bad]})
    np.testing.assert_array_equal(allowed(masked[0]), expected(start, 63))
    np.testing.assert_array_equal(allowed(masked[1]), expected(after, 62))
    np.testing.assert_array_equal(allowed(masked[2]), expected(after, 62))


@pytest.mark.parametrize("slack", [0, 2])
def test_budget_ends_within_max_tokens(runner_factory, llama3_vocab, slack):
    sp = request(tools=(WEATHER, TIME), max_tokens=None)
    need = index_of(sp, llama3_vocab).min_tokens_from_start()
    sp.max_tokens = need + 1 + slack  # the EOS counted, as vLLM counts it
    run = runner_factory()
    run.add(0, sp)
    done = _decode(run, [0], sp.max_tokens, seed=3)
    assert 0 in done
    assert run.total_len[0] - run.prompt_len[0] <= sp.max_tokens


def test_max_tokens_below_shortest_output_keeps_the_grammar(runner_factory, llama3_vocab):
    sp = request(max_tokens=3)
    run = runner_factory()
    run.add(0, sp)
    _, masked = run.apply([0])
    np.testing.assert_array_equal(allowed(masked[0]), expected(index_of(sp, llama3_vocab).start()))


def test_format_missing_from_vocabulary_may_only_end(runner_factory, llama3_vocab):
    run = runner_factory()
    assert run.add(0, request(tool_format="hermes"))  # Llama 3 has no <tool_call> tokens
    _, masked = run.apply([0])
    assert set(allowed(masked[0])) == set(llama3_vocab.eos_ids)


def test_compile_past_its_deadline_may_only_end(runner_factory, llama3_vocab, monkeypatch):
    """A constraint that does not compile within `COMPILE_TIMEOUT_S` stops there and the request may only end."""
    import constrain.vllm_plugin as plugin

    monkeypatch.setattr(plugin, "COMPILE_TIMEOUT_S", 0.0)
    fresh = {"type": "function", "function": {"name": "deadline_probe", "parameters": {  # not in the index cache
        "type": "object", "properties": {"q": {"type": "string", "pattern": "^[a-z]{1,40}$"}}, "required": ["q"]}}}
    run = runner_factory()
    assert run.add(0, request(tools=(fresh,)))
    _, masked = run.apply([0])
    assert set(allowed(masked[0])) == set(llama3_vocab.eos_ids)
    monkeypatch.setattr(plugin, "COMPILE_TIMEOUT_S", 30.0)
    run.add(1, request(tools=(fresh,)))  # within the deadline the same constraint compiles and masks
    _, masked = run.apply([1])
    np.testing.assert_array_equal(allowed(masked[0]), expected(index_of(request(tools=(fresh,)), llama3_vocab).start(), 63))


def test_padding_past_the_tokenizer_is_masked(llama3_vocab):
    wide = constrain.Vocabulary(llama3_vocab.token_bytes, special_ids=llama3_vocab.special_ids,
                                eos_ids=llama3_vocab.eos_ids, vocab_size=llama3_vocab.vocab_size + 70)
    run = FakeRunner(wide)
    run.add(0, request())
    _, masked = run.apply([0])
    assert not torch.isfinite(masked[0, llama3_vocab.vocab_size:]).any()


@pytest.mark.parametrize("sp", [
    SimpleNamespace(extra_args={"constrain": "{nope"}, structured_outputs=None, min_tokens=0),
    SimpleNamespace(extra_args={"constrain": "[1]"}, structured_outputs=None, min_tokens=0),
    SimpleNamespace(extra_args={"constrain": json.dumps({"tools": [WEATHER], "colour": 1})}, structured_outputs=None,
                    min_tokens=0),
    SimpleNamespace(extra_args={"constrain": json.dumps({"tools": [WEATHER], "tool_format": "x"})},
                    structured_outputs=None, min_tokens=0),
    SimpleNamespace(extra_args={"constrain": json.dumps({"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "nope"}}})}, structured_outputs=None, min_tokens=0),
    SimpleNamespace(extra_args={"constrain": json.dumps({"tools": [WEATHER]})}, structured_outputs=object(),
                    min_tokens=0),
    SimpleNamespace(extra_args={"constrain": json.dumps({"tools": [WEATHER]})}, structured_outputs=None,
                    min_tokens=2),
])
def test_validate_params_rejects(sp):
    with pytest.raises(ValueError):
        ConstrainLogitsProcessor.validate_params(sp)


def test_validate_params_accepts():
    ConstrainLogitsProcessor.validate_params(plain())
    ConstrainLogitsProcessor.validate_params(request())
    offline_dict = SimpleNamespace(extra_args={"constrain": {"tools": [WEATHER], "tool_choice": "required"}},
                                   structured_outputs=None, min_tokens=0)
    ConstrainLogitsProcessor.validate_params(offline_dict)
    assert constraint_of(offline_dict)["tool_format"] == "hermes"
