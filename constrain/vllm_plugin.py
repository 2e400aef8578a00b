"""vLLM logits processor: a request's constraint (`SamplingParams.extra_args["constrain"]`) → its `TokenState` per
step → its mask applied to that request's logits row. One class serves vLLM 0.32's V1 runner and Model Runner V2.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from constrain.errors import ConstrainError, MaskViolation
from constrain.index import TokenIndex, TokenState

# vLLM is optional: without it the class is a plain object (the V2 half is unit-tested with fakes).
_BASES: list[type] = []
try:  # the V1 interface imports torch and vllm itself; only in a vLLM install
    from vllm.v1.sample.logits_processor.interface import LogitsProcessor as _V1LogitsProcessor
    from vllm.v1.sample.logits_processor.interface import MoveDirectionality as _Move

    _BASES.append(_V1LogitsProcessor)
except ImportError:
    _Move = None
try:  # import-light by design in vLLM (the frontend loads it to validate params)
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as _V2LogitsProcessor

    _BASES.append(_V2LogitsProcessor)
except ImportError:
    pass
if not _BASES:
    _BASES.append(object)

__all__ = ["EXTRA_ARGS_KEY", "ConstrainLogitsProcessor", "constraint_of"]

EXTRA_ARGS_KEY = "constrain"
REQUEST_FIELDS = frozenset({"tools", "tool_choice", "parallel_tool_calls", "response_format"})
_FIELDS = REQUEST_FIELDS | {"tool_format"}
DEFAULT_TOOL_FORMAT = "hermes"
# Distinct masks kept on the device before the table is rebuilt from the rows in use (64 MiB at a 128k vocab).
MAX_TABLE_ROWS = 4096
_EOS_ONLY = -3  # table key of a request whose constraint could not be enforced: it may only end

_log = logging.getLogger(__name__)


def constraint_of(sampling_params: Any) -> dict[str, Any] | None:
    """The constraint a request carries, or None when it has none (then it is left unconstrained).

    It travels in `sampling_params.extra_args["constrain"]` (HTTP: `vllm_xargs`), as a JSON string (the only way
    through `vllm_xargs`) or, offline, as a dict, holding `tools`, `tool_choice`, `parallel_tool_calls`,
    `response_format` (as in a Chat Completions body) and `tool_format` (a `constrain.grammar.FORMATS` name,
    default "hermes").

    Raises:
        ValueError: not JSON, not an object, an unknown field, or an unknown `tool_format`.
    """
    extra = getattr(sampling_params, "extra_args", None) or {}
    raw = extra.get(EXTRA_ARGS_KEY)
    if raw is None:
        return None
    if isinstance(raw, (str, bytes)):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as err:
            raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a JSON object, got invalid JSON: {err}") from err
    else:
        data = raw
    if not isinstance(data, Mapping):
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] has unknown fields {unknown}; expected {sorted(_FIELDS)}")
    out = dict(data)
    fmt = out.setdefault("tool_format", DEFAULT_TOOL_FORMAT)
    from constrain.grammar import FORMATS

    if fmt not in FORMATS:
        raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}].tool_format must be one of {list(FORMATS)}, got {fmt!r}")
    return out


def _policy_of(constraint: Mapping[str, Any]) -> Any:
    from constrain.policy import Policy

    return Policy.from_request({k: v for k, v in constraint.items() if k in REQUEST_FIELDS})


COMPILE_TIMEOUT_S = 30.0
"""Seconds one request's constraint may take to compile in the worker (as `constrain serve --compile-timeout`);
past it the compile stops (`BudgetExceeded`) and the request may only end, never run unconstrained."""


class _RequestState:
    """One constrained request: its cursor, how many of its output tokens were fed, and its `max_tokens`."""

    __slots__ = ("index", "cursor", "n_fed", "max_tokens", "output_ids", "budgeted", "failed")

    def __init__(self, index: TokenIndex | None, max_tokens: int | None, output_ids: list[int] | None):
        self.index = index  # None: the constraint could not be compiled, the request may only end
        self.cursor: TokenState | None = None if index is None else index.start()
        self.n_fed = 0
        self.max_tokens = max_tokens
        self.output_ids = output_ids  # V1: a live reference to the request's output ids
        # Budgeted masks only when a complete output fits in max_tokens with the EOS counted (see `budget`).
        self.budgeted = index is not None and max_tokens is not None and index.completes_within(max_tokens - 1)
        self.failed = index is None

    def feed(self, tokens: Any) -> None:
        for tok in tokens:
            tok = int(tok)
            if tok < 0:  # an async-scheduling placeholder: the rest is not sampled yet
                break
            if not self.failed and self.cursor is not None:
                try:
                    self.cursor.advance(tok, self.budget(self.n_fed))
                except MaskViolation as err:
                    # Something after the mask (another processor, an all -inf row) let a token through: the request
                    # may only end from here on (fail closed; its output then reads back as text, not calls).
                    _log.error("constrain: token %d after %d output tokens was outside the mask (%s); "
                               "this request may only end now", tok, self.n_fed, err)
                    self.failed = True
            self.n_fed += 1

    def budget(self, n_generated: int) -> int | None:
        """Tokens still allowed including the next one, with the EOS inside `max_tokens` (vLLM counts it)."""
        if not self.budgeted:
            return None
        return max(self.max_tokens - n_generated - 1, 0)


class ConstrainLogitsProcessor(*_BASES):
    """vLLM logits processor enforcing each request's tool policy; requests without one are untouched.

    Guarantee: a constrained request's row has every token outside its `TokenState.mask` set to -inf each step
    (padding past the tokenizer included), so its output is a prefix of the policy's language in its `tool_format`,
    and a whole output when it ends on EOS. With `max_tokens` (the EOS counted, as vLLM counts it), masks are
    budgeted so the output is complete by then, when `index.completes_within(max_tokens - 1)`; below that the
    masks are unbudgeted and the output is cut with `finish_reason="length"` (no shorter valid output exists).

    Interfaces (one class, both loaders of the `vllm.logits_processors` entry-point group accept it):
      * V1 runner (`vllm.v1.sample.logits_processor.LogitsProcessor`, the CPU runner): `__init__(vllm_config,
        device, is_pin_memory)`, `validate_params`, `update_state(batch_update)`, `apply(logits)` on the whole
        `[num_reqs, vocab]` batch; requests are tracked by batch index through removed → added → moved, and each
        request's output ids (a live list) are fed lazily in `apply`, after async scheduling filled placeholders.
      * Model Runner V2 (`vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`): `__init__(vllm_config,
        req_states)`, `add_request(slot, sampling_params)`, `apply(logits, ctx)`; rows map to slots through
        `ctx.expanded_idx_mapping`, a row's committed length is `pos - expanded_local_pos + 1`, the newest
        committed token is the `input_ids` of the slot's first row (older ones are read from
        `req_states.all_token_ids` on a jump, e.g. after preemption or accepted drafts), and a row at local offset
        `j > 0` (speculative decoding) is masked at the committed state advanced by the `j` draft tokens before it.

    The tokenizer is loaded from `vllm_config.model_config.tokenizer` on the first constrained request; EOS ids are
    the ones vLLM stops on (the tokenizer's EOS and the generation config's `eos_token_id`); the logits width is the
    model's vocab size. Indexes come from `constrain.compile_index` (cached across requests).

    Raises (from `validate_params`, in the frontend, so HTTP answers 400): ValueError for a malformed constraint,
    a policy `Policy.from_request` rejects (the message carries its JSON pointer), `structured_outputs` on the same
    request, or `min_tokens > 0` (its EOS ban could empty a row whose grammar may only end).
    A constraint that compiles in the frontend but not for this vocabulary (e.g. a `tool_format` whose special tokens
    the tokenizer lacks) is logged as an error in the worker and that request may only end (EOS only): it fails
    closed rather than crash the engine or run unconstrained.
    """

    def __init__(self, vllm_config: Any, *args: Any):
        model_config = getattr(vllm_config, "model_config", None)
        self._model_config = model_config
        self._vocab_size = None if model_config is None else int(model_config.get_vocab_size())
        self._vocab: Any = None
        if len(args) == 2:  # V1: (device, is_pin_memory)
            self._mode, self._device, self._req_states = "v1", args[0], None
        elif len(args) == 1:  # Model Runner V2: (req_states)
            self._mode, self._req_states = "v2", args[0]
            self._device = args[0].device
        else:
            raise TypeError(f"ConstrainLogitsProcessor takes (vllm_config, device, is_pin_memory) or "
                            f"(vllm_config, req_states), got {1 + len(args)} arguments")
        self._requests: dict[int, _RequestState] = {}  # V1: batch index; V2: slot
        # Distinct masks on the device: (table key) -> table row; host rows are appended, the device copy follows.
        self._slot_of: dict[tuple[Any, int], int] = {}
        self._keep: dict[int, TokenIndex] = {}  # id -> index, so a table key's id is never reused while keyed
        self._host_rows: list[np.ndarray] = []
        self._table: Any = None
        self._n_synced = 0
        self._plans: Any = None  # CPU logits: a constrain_kernels.cpu_mask.PlanCache by table row

    # ---- both interfaces

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Reject a malformed constraint at admission (HTTP 400); requests without one pass."""
        constraint = constraint_of(sampling_params)
        if constraint is None:
            return
        if getattr(sampling_params, "structured_outputs", None) is not None:
            raise ValueError("a request cannot carry both structured_outputs and a constrain constraint")
        if (getattr(sampling_params, "min_tokens", 0) or 0) > 0:
            raise ValueError("min_tokens > 0 is not supported with a constrain constraint (it bans EOS where the "
                             "grammar may need it)")
        try:
            _policy_of(constraint)
        except ConstrainError as err:
            pointer = getattr(err, "pointer", "")
            raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]{pointer}: {err}") from err
        except TypeError as err:
            raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}]: {err}") from err

    def is_argmax_invariant(self) -> bool:
        """False: masking changes what greedy decoding picks."""
        return False

    def apply(self, logits: Any, ctx: Any = None) -> Any:
        """Mask every constrained request's row of `logits` ([rows, vocab] float, on device) in place."""
        if not self._requests:
            return logits
        if self._mode == "v1":
            keys = self._rows_v1(logits.shape[0])
        else:
            keys = self._rows_v2(ctx)
        if all(k is None for k in keys):
            return logits
        self._apply_keys(logits, keys)
        return logits

    # ---- V1

    def update_state(self, batch_update: Any) -> None:
        """V1: track requests by batch index (removed → added → moved); tokens are fed later, in `apply`."""
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._requests.pop(index, None)
        for index, params, _prompt_ids, output_ids in batch_update.added:
            state = self._new_request(params, output_ids)
            if state is None:
                self._requests.pop(index, None)
            else:
                self._requests[index] = state
        for a, b, direction in batch_update.moved:
            entry_a = self._requests.pop(a, None)
            entry_b = self._requests.pop(b, None)
            if entry_a is not None:
                self._requests[b] = entry_a
            if entry_b is not None and _is_swap(direction):
                self._requests[a] = entry_b

    def _rows_v1(self, rows: int) -> list[Any]:
        keys: list[Any] = [None] * rows
        for index, state in self._requests.items():
            if index >= rows:
                continue
            out = state.output_ids
            if len(out) > state.n_fed:
                state.feed(out[state.n_fed:])
            keys[index] = self._key_of(state, state.cursor, state.n_fed)
        return keys

    # ---- Model Runner V2

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """V2: (re)initialise slot `req_idx`; True when this request is constrained."""
        state = self._new_request(sampling_params, None)
        if state is None:
            self._requests.pop(req_idx, None)
            return False
        self._requests[req_idx] = state
        return True

    def apply_staged_writes(self) -> None:
        """V2: nothing is staged (masks are copied in `apply`)."""

    def _rows_v2(self, ctx: Any) -> list[Any]:
        import torch

        # One device→host copy for the batch layout: slot, local offset, input token and position per row.
        layout = torch.stack([ctx.expanded_idx_mapping.to(torch.int64), ctx.expanded_local_pos.to(torch.int64),
                              ctx.input_ids.to(torch.int64), ctx.pos.to(torch.int64)]).cpu().tolist()
        slots, local, ids, pos = layout
        req = self._req_states
        keys: list[Any] = [None] * len(slots)
        synced: dict[int, TokenState] = {}  # slot -> cursor at its committed tokens, this step
        # slot -> (cursor after its live drafts, drafts looked at, drafts fed, dead: a draft left the language)
        drafts: dict[int, tuple[TokenState | None, int, int, bool]] = {}
        order = sorted(range(len(slots)), key=lambda r: (slots[r], local[r]))
        row_at = {(slots[r], local[r]): r for r in order}
        for r in order:
            slot = slots[r]
            state = self._requests.get(slot)
            if state is None:
                continue
            if slot not in synced:
                prompt_len = int(req.prompt_len.np[slot])
                committed = max(pos[r] - local[r] + 1 - prompt_len, 0)
                self._sync_v2(slot, state, committed, ids[r] if local[r] == 0 else None)
                synced[slot] = state.cursor
                drafts[slot] = (state.cursor, 0, 0, False)
            cursor, offset, n_live, dead = drafts[slot]
            while offset < local[r]:
                # Row offset j sees the drafts fed at rows 1..j of its slot (their input ids).
                offset += 1
                draft_row = row_at.get((slot, offset))
                if draft_row is None:
                    raise ValueError(f"slot {slot} has a row at local offset {local[r]} but none at {offset}")
                if not dead and cursor is not None:
                    nxt = cursor.fork()
                    try:
                        nxt.advance(ids[draft_row], state.budget(state.n_fed + offset - 1))
                        cursor, n_live = nxt, offset
                    except MaskViolation:
                        # The draft is rejected at or before this row, so its sample is discarded: keep a live mask.
                        dead = True
            drafts[slot] = (cursor, offset, n_live, dead)
            keys[r] = self._key_of(state, cursor, state.n_fed + n_live)
        return keys

    def _sync_v2(self, slot: int, state: _RequestState, committed: int, newest: int | None) -> None:
        """Feed `state` up to `committed` output tokens; the newest is `newest` when given, older from the device."""
        if committed < state.n_fed:  # not expected (a slot is re-added on preemption); replay from the start
            if state.index is not None:
                state.cursor, state.n_fed, state.failed = state.index.start(), 0, False
        if committed == state.n_fed:
            return
        if committed == state.n_fed + 1 and newest is not None:
            state.feed([newest])
            return
        prompt_len = int(self._req_states.prompt_len.np[slot])
        tokens = self._req_states.all_token_ids.gpu[slot, prompt_len + state.n_fed: prompt_len + committed]
        state.feed(tokens.cpu().tolist())

    # ---- shared

    def _new_request(self, params: Any, output_ids: list[int] | None) -> _RequestState | None:
        try:
            constraint = constraint_of(params)
        except ValueError as err:  # validate_params rejects these before they reach the worker
            _log.error("constrain: invalid constraint reached the worker (%s); the request may only end", err)
            return self._failed_request(params, output_ids)
        if constraint is None:
            return None
        from constrain.automaton import Deadline
        from constrain.compiler import compile_index

        deadline = Deadline(COMPILE_TIMEOUT_S)
        try:
            with deadline.active():
                index = compile_index(_policy_of(constraint), self._vocabulary(), tool_format=constraint["tool_format"],
                                      deadline=deadline)
                # what `_RequestState` reads of the budget tables, under the same deadline
                return _RequestState(index, getattr(params, "max_tokens", None), output_ids)
        except ConstrainError as err:
            _log.error("constrain: the constraint does not compile for this model's vocabulary (%s at %s); "
                       "the request may only end", err, getattr(err, "pointer", ""))
            return self._failed_request(params, output_ids)

    def _failed_request(self, params: Any, output_ids: list[int] | None) -> _RequestState:
        return _RequestState(None, None, output_ids)

    def _vocabulary(self) -> Any:
        if self._vocab is None:
            self._vocab = _load_vocabulary(self._model_config, self._vocab_size)
        return self._vocab

    def _key_of(self, state: _RequestState, cursor: TokenState | None, n_generated: int) -> tuple[Any, ...]:
        """(table key, cursor, budget) of a row; the key names a mask row of one index, or the EOS-only mask."""
        if state.failed or cursor is None:
            return ((_EOS_ONLY, 0), None, None)
        index = cursor.index
        self._keep[id(index)] = index
        budget = state.budget(n_generated)
        return ((id(index), cursor.mask_row(budget)), cursor, budget)

    def _eos_only_mask(self) -> np.ndarray:
        vocab = self._vocabulary()
        mask = np.zeros((vocab.vocab_size + 31) // 32, dtype=np.uint32)
        for t in vocab.eos_ids:
            mask[t // 32] |= np.uint32(1 << (t % 32))
        return mask.view(np.int32)

    def _apply_keys(self, logits: Any, keys: list[Any]) -> None:
        import torch

        from constrain_kernels import UNCONSTRAINED, apply_token_mask

        if len(self._host_rows) + len(keys) > MAX_TABLE_ROWS:
            self._reset_table()
        slots = []
        for entry in keys:
            if entry is None:
                slots.append(UNCONSTRAINED)
                continue
            key, cursor, budget = entry
            slot = self._slot_of.get(key)
            if slot is None:
                mask = self._eos_only_mask() if cursor is None else cursor.mask(budget)
                slot = len(self._host_rows)
                self._host_rows.append(np.ascontiguousarray(mask, dtype=np.int32))
                self._slot_of[key] = slot
            slots.append(slot)
        if logits.device.type == "cpu":  # no device table: each distinct mask is planned once, applied in place
            from constrain_kernels.cpu_mask import PlanCache, apply_planned

            if self._plans is None:
                self._plans = PlanCache()
            vocab_size = logits.shape[1]
            apply_planned(logits, [None if s == UNCONSTRAINED else self._plans.get(s, self._host_rows[s], vocab_size)
                                   for s in slots])
            return
        table = self._sync_table(logits.device)
        row_ids = torch.tensor(slots, dtype=torch.int32).to(logits.device, non_blocking=True)
        apply_token_mask(logits, table, row_ids)

    def _reset_table(self) -> None:
        self._slot_of.clear()
        self._host_rows.clear()
        self._keep = {id(s.index): s.index for s in self._requests.values() if s.index is not None}
        self._table, self._n_synced = None, 0
        if self._plans is not None:
            self._plans.clear()  # plans are keyed by table row, which restart from 0

    def _sync_table(self, device: Any) -> Any:
        """The device table with every host row; only rows added since the last step are copied."""
        from constrain.processor import sync_device_table

        n_words = self._host_rows[0].shape[0]
        self._table, self._n_synced = sync_device_table(self._host_rows, self._table, self._n_synced, n_words, device)
        return self._table[: len(self._host_rows)]


def _is_swap(direction: Any) -> bool:
    return getattr(direction, "name", direction) == "SWAP" or (_Move is not None and direction == _Move.SWAP)


def _stop_ids(tokenizer: Any, generation_config: Mapping[str, Any] | None) -> list[int]:
    """The ids vLLM stops on by default: the tokenizer's EOS plus the generation config's `eos_token_id`."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    extra = (generation_config or {}).get("eos_token_id")
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(t) for t in extra)
    return sorted(ids)


def _load_vocabulary(model_config: Any, vocab_size: int | None) -> Any:
    """The model's `Vocabulary`: vLLM's tokenizer path, vLLM's stop ids as EOS, the model's logits width."""
    from transformers import AutoTokenizer

    from constrain.vocabulary import Vocabulary

    if model_config is None:
        raise ValueError("vllm_config.model_config is needed to load the tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(
        model_config.tokenizer,
        revision=getattr(model_config, "tokenizer_revision", None),
        trust_remote_code=bool(getattr(model_config, "trust_remote_code", False)),
    )
    generation_config = model_config.try_get_generation_config()  # {} when the model has none
    eos = _stop_ids(tokenizer, generation_config) or None
    return Vocabulary.from_tokenizer(tokenizer, eos_ids=eos, vocab_size=vocab_size)
