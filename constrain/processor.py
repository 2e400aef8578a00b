"""transformers logits processor: each row's generated ids → its token-index state → its mask applied to the scores."""

from __future__ import annotations

import inspect
import threading
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import LogitsProcessor

from constrain.errors import MaskViolation
from constrain.index import TokenIndex
from constrain_kernels import UNCONSTRAINED, apply_token_mask
from constrain_kernels.cpu_mask import PlanCache, RowPlan, apply_planned

__all__ = ["MaskProcessor", "apply_token_mask"]

_DEAD = -2  # slot marker of a node whose prefix left the language (resolved to an all-zero table row)
_UNSET = object()  # a node whose CPU plan was not looked up yet

# CPU plans of an index's mask rows, shared by every processor on that index (rows of an index never change, and a
# `generate` call would otherwise replan each mask it meets: ~0.3 ms per dense row).
_INDEX_PLANS: weakref.WeakKeyDictionary[TokenIndex, PlanCache] = weakref.WeakKeyDictionary()
_INDEX_PLANS_LOCK = threading.Lock()


def _plans_of(index: TokenIndex) -> PlanCache:
    with _INDEX_PLANS_LOCK:
        plans = _INDEX_PLANS.get(index)
        if plans is None:
            plans = _INDEX_PLANS[index] = PlanCache(max_entries=256)
        return plans


def sync_device_table(
    host_rows: list[np.ndarray], table: torch.Tensor | None, n_synced: int, n_words: int, device: torch.device
) -> tuple[torch.Tensor, int]:
    """Copy the host mask rows not yet on `device` into the (grown, if needed) device table.

    Returns the table (capacity ≥ len(host_rows), rows beyond it unused) and the number of rows now on the device.
    Only rows added since the last call are copied (pinned and non-blocking on CUDA): one small copy per new state.
    """
    n = len(host_rows)
    if table is None or table.device != device:
        n_synced = 0
        table = torch.zeros((max(2 * n, 16), n_words), dtype=torch.int32, device=device)
    elif n > table.shape[0]:
        grown = torch.zeros((2 * n, n_words), dtype=torch.int32, device=device)
        grown[:n_synced] = table[:n_synced]
        table = grown
    if n > n_synced:
        fresh = torch.from_numpy(np.stack(host_rows[n_synced:]))
        if device.type == "cuda":
            fresh = fresh.pin_memory()
        table[n_synced:n].copy_(fresh, non_blocking=True)
        n_synced = n
    return table, n_synced


class MaskProcessor(LogitsProcessor):
    """Constrains `generate` to the language of a `TokenIndex`: per step, every row's disallowed logits become -inf.

    A row's state is derived from its own generated ids (`input_ids[r, prompt_length:]`) through a prefix trie shared
    by the rows of one request, never from the row's position or the previous call: beam reordering,
    `num_return_sequences` copies and assisted-decoding rollbacks all resolve to the right state. Rows are mapped to
    requests as transformers lays them out: with `n` indexes and `rows` rows, row `r` belongs to request
    `r // (rows // n)`. Tokens after an EOS are padding and are ignored (the row keeps its finished mask: EOS only).

    EOS is allowed exactly where the index's state accepts. With `budget` (the `max_new_tokens` of this `generate`
    call), a row with `k` generated tokens gets `TokenState.mask(budget - k)`: every output is complete when EOS is
    sampled or when the budget runs out. Logits past the index's mask width are set to -inf.

    Device work per step is one int32 copy of the row ids and one `apply_token_mask` launch; the masks live in a table
    on the scores' device that grows only when a row reaches a mask it has not used before. CPU scores skip the table:
    each distinct mask is planned once (`constrain_kernels.cpu_mask.PlanCache`: its allowed or blocked ids when few, else its
    words) and applied on the calling thread.

    A prefix that leaves the language (e.g. an assisted-decoding candidate the draft model proposed) makes its row
    dead: every logit of a dead row is -inf, so nothing it proposes can be sampled from it. With `debug=True` such a
    token raises instead, and each token is also checked against its budgeted mask.

    Args:
        index_or_indexes: one `TokenIndex` for every row, or a sequence with one entry per request of the batch
            (`None` leaves that request unconstrained). All indexes must share one mask width.
        prompt_length: `input_ids.shape[1]` of the prompt passed to `generate` (left padding included).
        budget: `max_new_tokens` of this call for budget-aware masking, or None.
        debug: raise `MaskViolation` when a generated token was not allowed (under the budget, if one is set).

    Raises:
        ValueError: no index given, mixed mask widths, a negative `prompt_length`, or a `budget` below
            some index's `min_tokens_from_start()` (no complete output fits).
    """

    supports_continuous_batching = False  # rows of a continuous batch do not share one prompt_length

    def __init__(self, index_or_indexes: TokenIndex | Sequence[TokenIndex | None], prompt_length: int, *,
                 budget: int | None = None, debug: bool = False):
        if isinstance(index_or_indexes, TokenIndex):
            per_request: tuple[TokenIndex | None, ...] = (index_or_indexes,)
        else:
            per_request = tuple(index_or_indexes)
        if not per_request or all(idx is None for idx in per_request):
            raise ValueError("MaskProcessor needs at least one TokenIndex, got none")
        for i, idx in enumerate(per_request):
            if idx is not None and not isinstance(idx, TokenIndex):
                raise ValueError(f"indexes[{i}] must be a TokenIndex or None, got {type(idx).__name__}")
        distinct: list[TokenIndex] = []
        for idx in per_request:
            if idx is not None and all(idx is not d for d in distinct):
                distinct.append(idx)
        widths = {idx.n_words for idx in distinct}
        if len(widths) != 1:
            raise ValueError(f"all indexes must share one mask width, got n_words {sorted(widths)}")
        if int(prompt_length) != prompt_length or prompt_length < 0:
            raise ValueError(f"prompt_length must be an int >= 0, got {prompt_length!r}")
        if budget is not None:
            if int(budget) != budget or budget < 1:
                raise ValueError(f"budget must be an int >= 1 (max_new_tokens) or None, got {budget!r}")
            for idx in distinct:
                if not idx.completes_within(budget):
                    raise ValueError(f"budget {budget} is below the {idx.min_tokens_from_start()} tokens the shortest "
                                     f"valid output needs")
        self._indexes = per_request
        self._n_words = widths.pop()
        self._n_tokens = max(idx.vocab.n_tokens for idx in distinct)
        self.prompt_length = int(prompt_length)
        self.budget = None if budget is None else int(budget)
        self.debug = bool(debug)
        # Prefix trie over every request's generated ids. Node n: its cursor (None: dead or unconstrained), depth
        # (tokens generated), request, and the table slot of its mask (computed on first use).
        self._cursor: list[Any] = []
        self._depth: list[int] = []
        self._request: list[int] = []
        self._slot: list[int | None] = []
        self._child: dict[tuple[int, int], int] = {}
        self._node_plan: list[Any] = []  # per node: its slot's CPU plan (None: unconstrained), or _UNSET
        self._roots: list[int] = [self._new_node(None if idx is None else idx.start(), 0, b)
                                  for b, idx in enumerate(per_request)]
        # Distinct masks used so far, host side, and their device copy (appended to, never rebuilt).
        self._slot_of: dict[tuple[int, int], int] = {}
        self._host_rows: list[np.ndarray] = []
        self._table: torch.Tensor | None = None
        self._n_synced = 0
        self._plan_of: list[tuple[PlanCache, Hashable]] = []  # per slot: where its CPU plan is cached, and its key
        self._slot_plan: list[RowPlan | None] = []  # per slot: its plan once fetched (for `_plan_vocab` wide scores)
        self._plan_vocab = -1
        self._own_plans = PlanCache(max_entries=4)  # the dead row's
        # The previous call's generated ids and nodes: the usual step extends each row by one token.
        self._prev_ids: torch.Tensor | None = None
        self._prev_nodes: list[int] = []
        self._prev_requests: torch.Tensor | None = None
        self._requests_of: dict[tuple[int, int], torch.Tensor] = {}  # (rows, rows per request) -> request of each row

    # ---- transformers entry point

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        rows = input_ids.shape[0]
        if scores.shape[0] != rows:
            raise ValueError(f"scores has {scores.shape[0]} rows, input_ids {rows}")
        if scores.shape[1] < self._n_tokens:
            raise ValueError(f"scores are {scores.shape[1]} wide, narrower than the tokenizer's {self._n_tokens} tokens")
        if input_ids.shape[1] < self.prompt_length:
            raise ValueError(f"input_ids has {input_ids.shape[1]} columns, fewer than prompt_length {self.prompt_length}")
        n_req = len(self._indexes)
        if rows % n_req:
            raise ValueError(f"{rows} rows cannot be split evenly over {n_req} requests")
        generated = input_ids[:, self.prompt_length:]
        if generated.device.type != "cpu":
            generated = generated.cpu()  # the one device→host transfer of a step
        nodes = self._nodes_for(generated, rows // n_req)
        if scores.device.type == "cpu":
            apply_planned(scores, self._plans_for(nodes, scores.shape[1]))
            return scores
        slots = [self._slot_for(n) for n in nodes]
        table = self._sync_table(scores.device)
        row_ids = torch.tensor(slots, dtype=torch.int32).to(scores.device, non_blocking=True)
        apply_token_mask(scores, table, row_ids)
        return scores

    # transformers' LogitsProcessorList calls `inspect.signature(processor.__call__)` before every call (5.x); a
    # precomputed signature spares it parsing this function again on every step.
    __call__.__signature__ = inspect.signature(__call__)

    # ---- prefix → state

    def _new_node(self, cursor: Any, depth: int, request: int) -> int:
        self._cursor.append(cursor)
        self._depth.append(depth)
        self._request.append(request)
        self._slot.append(None if cursor is not None or self._indexes[request] is None else _DEAD)
        self._node_plan.append(_UNSET)
        return len(self._cursor) - 1

    def _step(self, node: int, token: int) -> int:
        """The node after `token` from `node` (memoized); finished and dead nodes absorb every token."""
        key = (node, token)
        child = self._child.get(key)
        if child is not None:
            return child
        cursor = self._cursor[node]
        if cursor is None or cursor.is_finished():
            child = node  # unconstrained, dead, or padding after EOS
        else:
            nxt = cursor.fork()
            try:
                if self.debug:
                    nxt.advance(token, None if self.budget is None else max(self.budget - self._depth[node], 0))
                else:
                    nxt.advance(token)
            except MaskViolation as err:
                if self.debug:
                    raise MaskViolation(f"generated token {token} after {self._depth[node]} tokens of request "
                                        f"{self._request[node]} was outside its mask: {err}") from err
                nxt = None
            child = self._new_node(nxt, self._depth[node] + 1, self._request[node])
        self._child[key] = child
        return child

    def _nodes_for(self, generated: torch.Tensor, per_request: int) -> list[int]:
        rows, length = generated.shape
        prev = self._prev_ids
        if (prev is not None and length and prev.shape[1] == length - 1 and prev.shape[0] == rows
                and self._prev_requests is self._requests_of.get((rows, per_request))
                and torch.equal(generated[:, :-1], prev)):
            # Sampling / greedy: each row extends itself by one token (the fast path of every plain step).
            child = self._child
            nodes = []
            for parent, token in zip(self._prev_nodes, generated[:, -1].tolist(), strict=True):
                node = child.get((parent, token))
                nodes.append(self._step(parent, token) if node is None else node)
            self._prev_ids, self._prev_nodes = generated, nodes
            return nodes
        requests = self._requests_of.get((rows, per_request))
        if requests is None:
            requests = self._requests_of[(rows, per_request)] = torch.arange(rows) // per_request
        prev = self._prev_ids
        parents: list[int | None] = [None] * rows
        if length == 0:
            nodes = [self._roots[b] for b in requests.tolist()]
        else:
            if prev is not None and prev.shape[1] == length - 1:
                head = generated[:, :-1]
                if prev.shape[0] == rows and requests is self._prev_requests and torch.equal(head, prev):
                    parents = list(self._prev_nodes)  # sampling / greedy: each row extends itself
                elif prev.shape[0]:
                    # Beam reordering: a row extends whichever previous row of its own request it matches.
                    match = (head[:, None, :] == prev[None, :, :]).all(-1)
                    match &= requests[:, None] == self._prev_requests[None, :]
                    has = match.any(1).tolist()
                    first = match.to(torch.uint8).argmax(1).tolist()
                    parents = [self._prev_nodes[first[r]] if has[r] else None for r in range(rows)]
            last = generated[:, -1].tolist()
            nodes = []
            for r, parent in enumerate(parents):
                if parent is None:  # a rollback or an unseen prefix: walk the trie from the request's root
                    node = self._roots[int(requests[r])]
                    for tok in generated[r, :-1].tolist():
                        node = self._step(node, tok)
                    parent = node
                nodes.append(self._step(parent, last[r]))
        self._prev_ids, self._prev_nodes, self._prev_requests = generated, nodes, requests
        return nodes

    # ---- masks

    def _plans_for(self, nodes: list[int], vocab_size: int) -> list[RowPlan | None]:
        """Each node's CPU plan for scores `vocab_size` wide (None: unconstrained), cached per node and per slot."""
        if vocab_size != self._plan_vocab:
            self._slot_plan = [None] * len(self._slot_plan)
            self._node_plan = [_UNSET] * len(self._cursor)
            self._plan_vocab = vocab_size
        node_plan = self._node_plan
        plans = []
        for n in nodes:
            plan = node_plan[n]
            if plan is _UNSET:
                s = self._slot_for(n)
                plan = None
                if s != UNCONSTRAINED:
                    plan = self._slot_plan[s]
                    if plan is None:
                        cache, key = self._plan_of[s]
                        plan = self._slot_plan[s] = cache.get(key, self._host_rows[s], vocab_size)
                node_plan[n] = plan
            plans.append(plan)
        return plans

    def _slot_for(self, node: int) -> int:
        slot = self._slot[node]
        if slot is None:
            request = self._request[node]
            cursor = self._cursor[node]
            if self._indexes[request] is None:
                slot = UNCONSTRAINED
            else:
                budget = None if self.budget is None else max(self.budget - self._depth[node], 0)
                row = cursor.mask_row(budget)
                key = (id(cursor.index), row)
                slot = self._slot_of.get(key)
                if slot is None:
                    slot = self._add_row(key, cursor.mask(budget), (_plans_of(cursor.index), row))
            self._slot[node] = slot
        elif slot == _DEAD:
            slot = self._slot_of.get(("dead", 0))
            if slot is None:
                slot = self._add_row(("dead", 0), np.zeros(self._n_words, dtype=np.int32), (self._own_plans, "dead"))
        return slot

    def _add_row(self, key: tuple[Any, int], mask: np.ndarray, plan_of: tuple[PlanCache, Hashable]) -> int:
        slot = len(self._host_rows)
        self._host_rows.append(mask)
        self._plan_of.append(plan_of)
        self._slot_plan.append(None)
        self._slot_of[key] = slot
        return slot

    def _sync_table(self, device: torch.device) -> torch.Tensor:
        """The device table with every host row in it; only rows added since the last step are copied."""
        self._table, self._n_synced = sync_device_table(self._host_rows, self._table, self._n_synced, self._n_words, device)
        return self._table[: len(self._host_rows)]
