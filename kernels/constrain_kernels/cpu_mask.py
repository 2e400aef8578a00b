"""Token masks applied to CPU logits in place, single-threaded: sparse rows by token ids, dense rows by one native pass.

Same semantics as `constrain_kernels.torch_ref.apply_token_mask`, bit for bit. A mask row becomes a `RowPlan` (the few allowed
ids, the few blocked ids, or the packed words), which callers with stable rows cache across steps (`PlanCache`).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Sequence

import numpy as np
import torch

from constrain_kernels import cpu_native
from constrain_kernels.torch_ref import UNCONSTRAINED, check_inputs

__all__ = ["PlanCache", "RowPlan", "apply_planned", "apply_token_mask", "plan_row"]

# Logits are handled as bit patterns (numpy has no bfloat16): the integer view and the pattern of -inf per dtype.
_NEG_INF = {
    torch.float32: (torch.int32, np.int32(np.float32("-inf").view(np.int32))),
    torch.float16: (torch.int16, np.int16(np.float16("-inf").view(np.int16))),
    torch.bfloat16: (torch.int16, np.int16(-128)),  # 0xFF80: the high half of float32 -inf
}
# The same patterns as unsigned ints, with the element width, for the native pass.
_NATIVE_NEG = {torch.float32: (32, 0xFF800000), torch.float16: (16, 0xFC00), torch.bfloat16: (16, 0xFF80)}
# A sparse plan lists at most this many ids, so a cached plan stays under 64 KiB. Still cheaper than the fused pass
# there: at 128k logits, 8192 allowed ids took ~22 us and 8192 blocked ids ~9 us against ~35 us for the pass.
MAX_SPARSE_IDS = 8192
# Without a cache, a row is only unpacked to ids when at most 1/_SCAN_FRACTION of its words need it: unpacking every
# word costs more than the fused pass it would replace.
_SCAN_FRACTION = 32
_SHIFTS = np.arange(32, dtype=np.int32)

ALLOWED, BLOCKED, DENSE = "allowed", "blocked", "dense"
_NATIVE_KIND = {ALLOWED: 0, BLOCKED: 1, DENSE: 2}


class RowPlan:
    """How one packed mask row is applied to a logits row `vocab` wide (`width = min(vocab, 32 * n_words)`).

    `kind` ALLOWED: `ids` (ascending int64) are the only allowed tokens; BLOCKED: `ids` are the only tokens below
    `width` that are not allowed; DENSE: `words` (int32 [ceil(width / 32)]) are applied by the fused pass.
    Tokens from `width` to `vocab` are never allowed, whatever the kind.
    """

    __slots__ = ("kind", "vocab", "width", "ids", "words", "native_args")

    def __init__(self, kind: str, vocab: int, width: int, *, ids: np.ndarray | None = None,
                 words: np.ndarray | None = None):
        if words is not None:
            words = np.ascontiguousarray(words, dtype=np.int32)
        if ids is not None:
            ids = np.ascontiguousarray(ids, dtype=np.int64)
        # The native pass writes by these ids and reads these words without bounds checks: check them once here.
        if not 0 <= width <= vocab:
            raise ValueError(f"width must lie in 0 .. vocab ({vocab}), got {width}")
        if kind == DENSE and (words is None or 32 * words.size < width):
            raise ValueError(f"a dense plan needs ceil(width / 32) = {(width + 31) // 32} words, got "
                             f"{None if words is None else words.size}")
        if kind in (ALLOWED, BLOCKED):
            if ids is None or ids.ndim != 1:
                raise ValueError(f"an {kind} plan needs 1-D ids")
            if ids.size and (ids[0] < 0 or ids[-1] >= width or (ids.size > 1 and not (np.diff(ids) > 0).all())):
                raise ValueError(f"ids must ascend strictly within 0 .. width - 1 ({width - 1})")
        elif kind != DENSE:
            raise ValueError(f"kind must be {ALLOWED!r}, {BLOCKED!r} or {DENSE!r}, got {kind!r}")
        self.kind, self.vocab, self.width, self.ids, self.words = kind, vocab, width, ids, words
        # `NativePass.apply_row`'s plan arguments: it reads ids and words by address, and the plan holds both arrays.
        self.native_args = cpu_native.NativePass.plan_args(
            _NATIVE_KIND[kind], 0 if ids is None else ids.ctypes.data, 0 if ids is None else ids.size,
            0 if words is None else words.ctypes.data, width)

    def __reduce__(self):
        # Addresses do not survive pickling: a copy is planned anew around its own arrays.
        return (_remake_plan, (self.kind, self.vocab, self.width, self.ids, self.words))


def _remake_plan(kind: str, vocab: int, width: int, ids: np.ndarray | None, words: np.ndarray | None) -> RowPlan:
    return RowPlan(kind, vocab, width, ids=ids, words=words)


def plan_row(words: np.ndarray, vocab: int, *, thorough: bool = True) -> RowPlan:
    """The plan of packed mask row `words` (int32 [n_words]) for logits `vocab` wide.

    With `thorough` (for plans that are cached), a sparse form is taken whenever its ids fit `MAX_SPARSE_IDS`, and
    a dense plan holds its own copy of the words; without it, a row is unpacked only when few words hold its ids, so
    planning stays cheaper than the pass it saves, and a dense plan may view `words`.
    """
    words = np.asarray(words, dtype=np.int32)
    width = min(vocab, 32 * words.shape[0])
    words = words[: (width + 31) // 32]
    used = words.shape[0]
    if thorough:  # gate on bit counts (bits past the width may be counted: ids are filtered below)
        n_allowed = int(np.bitwise_count(words.view(np.uint32)).sum())
        try_allowed = n_allowed <= MAX_SPARSE_IDS + 32
        try_blocked = 32 * used - n_allowed <= MAX_SPARSE_IDS + 32
    else:  # gate on word counts (cheaper)
        limit = max(1, used // _SCAN_FRACTION)
        try_allowed = np.count_nonzero(words) <= limit
        try_blocked = used - np.count_nonzero(words == -1) <= limit
    if try_allowed:
        live = np.flatnonzero(words != 0)
        ids = _bit_ids(words[live], live, width, want=1)
        if ids.size <= MAX_SPARSE_IDS:
            return RowPlan(ALLOWED, vocab, width, ids=ids)
    if try_blocked:
        holes_mask = words != -1
        holes = np.flatnonzero(holes_mask)
        ids = _bit_ids(words[holes], holes, width, want=0)
        if ids.size <= MAX_SPARSE_IDS:
            return RowPlan(BLOCKED, vocab, width, ids=ids)
    return RowPlan(DENSE, vocab, width, words=np.array(words) if thorough else words)


def _bit_ids(values: np.ndarray, positions: np.ndarray, width: int, *, want: int) -> np.ndarray:
    """Token ids below `width` whose bit equals `want`, in the words `values` found at word `positions`."""
    if not values.size:
        return np.zeros(0, dtype=np.int64)
    bits = ((values[:, None] >> _SHIFTS) & 1) == want
    w, b = np.nonzero(bits)
    ids = positions[w].astype(np.int64) * 32 + b
    return ids[ids < width]


class PlanCache:
    """A bounded, thread-safe LRU of `RowPlan`s by caller key (e.g. a row of an append-only mask table).

    A plan lists at most `MAX_SPARSE_IDS` ids or holds one row of words, so the cache stays under
    `max_entries * 64 KiB` (at a 262k vocabulary).
    """

    def __init__(self, max_entries: int = 512):
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._plans: OrderedDict[Hashable, RowPlan] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, words: np.ndarray, vocab: int) -> RowPlan:
        """The plan cached under `key` for logits `vocab` wide, planning `words` (thoroughly) on a miss.

        The caller guarantees that one key always stands for the same `words`.
        """
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None and plan.vocab == vocab:
                self._plans.move_to_end(key)
                return plan
        plan = plan_row(words, vocab)  # outside the lock: planning a dense row takes ~0.3 ms
        with self._lock:
            self._plans[key] = plan
            self._plans.move_to_end(key)
            if len(self._plans) > self.max_entries:
                self._plans.popitem(last=False)
        return plan

    def __len__(self) -> int:
        return len(self._plans)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


def apply_planned(logits: torch.Tensor, plans: Sequence[RowPlan | None]) -> None:
    """Apply one plan per logits row (None: row untouched) to CPU `logits` [rows, V] in place, on this thread.

    Same result, bit for bit, as `constrain_kernels.torch_ref.apply_token_mask` with each row's packed mask: every token the
    row's plan does not allow (and every token from the plan's `width` on) becomes -inf, others keep their bits.
    float32/float16/bfloat16, any strides. Every plan must have been made for this `V` (`plan_row(words, V)`).

    Raises:
        ValueError: a dtype, device, plan count or plan width outside this contract (nothing is written then).
    """
    if logits.dim() != 2 or logits.device.type != "cpu" or logits.dtype not in _NEG_INF:
        raise ValueError(f"logits must be 2-D float32/float16/bfloat16 on the CPU, got {logits.dtype} "
                         f"{tuple(logits.shape)} on {logits.device}")
    rows, vocab = logits.shape
    if len(plans) != rows:
        raise ValueError(f"need one plan per logits row ({rows}), got {len(plans)}")
    if not rows or not vocab:
        return
    widths = set()
    for r, plan in enumerate(plans):
        if plan is not None and plan.vocab != vocab:
            raise ValueError(f"row {r}'s plan is for logits {plan.vocab} wide, got {vocab}")
        if plan is not None and plan.kind == DENSE:
            widths.add(plan.width)
    if len(widths) > 1:
        raise ValueError(f"dense plans of one call must share one width, got {sorted(widths)}")
    native = cpu_native.load() if logits.stride(1) == 1 or vocab == 1 else None
    if native is not None:
        # One call into C per row: in a decoding loop this runs with the caches the model step has just swept, where
        # each numpy or torch entry point costs several times its warm price (bench_e2e.py prints the processor's
        # time per step inside generate).
        element_bits, native_neg = _NATIVE_NEG[logits.dtype]
        base, row_bytes = logits.data_ptr(), logits.stride(0) * logits.element_size()
        apply_row = native.apply_row
        for r, plan in enumerate(plans):
            if plan is not None:
                apply_row(base + r * row_bytes, vocab, element_bits, native_neg, plan.native_args)
        return
    int_dtype, neg = _NEG_INF[logits.dtype]
    det = logits.detach()
    x = det.view(int_dtype).numpy()  # shares memory and strides with the logits
    dense: list[int] = []
    # ALLOWED rows: save the allowed logits, fill each run of such rows with -inf at once (torch's fill is faster than
    # numpy's on wide rows, and one fill per run than one per row), then put the saved logits back.
    saved: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    run = -1
    for r, plan in enumerate(plans):
        if plan is not None and plan.kind == ALLOWED:
            row = x[r]
            saved.append((row, plan.ids, row[plan.ids]))
            if run < 0:
                run = r
            continue
        if run >= 0:
            det[run:r].fill_(float("-inf"))
            run = -1
        if plan is None:
            continue
        row = x[r]
        if plan.width < vocab:
            row[plan.width:] = neg
        if plan.kind == BLOCKED:
            row[plan.ids] = neg
        else:
            dense.append(r)
    if run >= 0:
        det[run:].fill_(float("-inf"))
    for row, ids, values in saved:
        row[ids] = values
    if dense:
        width = widths.pop()
        if len(dense) == rows:
            words = np.stack([plans[r].words for r in dense]) if rows > 1 else plans[0].words[None]
        else:  # rows handled above read as all-allowed words: the fused pass leaves them as they are
            words = np.full((rows, (width + 31) // 32), -1, dtype=np.int32)
            for r in dense:
                words[r] = plans[r].words
        _dense(logits[:, :width], torch.from_numpy(words))


def apply_token_mask(logits: torch.Tensor, mask_table: torch.Tensor, row_ids: torch.Tensor) -> None:
    """`constrain_kernels.torch_ref.apply_token_mask` for CPU tensors, bit for bit, on the calling thread (no cache).

    Logits rows with unit column stride go straight through the native pass (`constrain_kernels.cpu_native`: a row of masked
    stores costs about what planning it would). Elsewhere, or without the native pass, each row is planned afresh: a
    row with few allowed (or few blocked) tokens in few words is written by token ids (a fill and a scatter), the
    other rows by one compiled single-threaded pass. Nothing uses torch's thread pool (it stalls on busy cores:
    `benchmarks/bench_kernel.py`).

    Raises:
        ValueError: see `check_inputs`; also a CPU-only contract, and row ids outside `-1 .. n_rows - 1`.
    """
    check_inputs(logits, mask_table, row_ids)
    if logits.device.type != "cpu":
        raise ValueError(f"kernels.cpu_mask needs CPU tensors, got {logits.device}")
    rows, vocab = logits.shape
    if not rows or not vocab:
        return
    ids = row_ids.numpy()
    n_rows, n_words = mask_table.shape
    lo, hi = int(ids.min()), int(ids.max())
    if lo < UNCONSTRAINED or hi >= n_rows:
        raise ValueError(f"row_ids must lie in -1 .. {n_rows - 1}, got {lo} .. {hi}")
    if hi == UNCONSTRAINED:
        return
    det = logits.detach()
    native = cpu_native.load() if det.stride(1) == 1 or vocab == 1 else None
    if native is not None:
        table_t = mask_table if mask_table.stride(1) == 1 or n_words == 1 else mask_table.contiguous()
        width = min(vocab, 32 * n_words)
        element_bits, native_neg = _NATIVE_NEG[logits.dtype]
        base, row_bytes = det.data_ptr(), det.stride(0) * det.element_size()
        table_base, table_row_bytes = table_t.data_ptr(), table_t.stride(0) * 4
        x = det.view(_NEG_INF[logits.dtype][0]).numpy() if width < vocab else None
        for r, i in enumerate(ids.tolist()):
            if i != UNCONSTRAINED:
                native.block(base + r * row_bytes, table_base + i * table_row_bytes, width, element_bits, native_neg)
                if x is not None:
                    x[r, width:] = _NEG_INF[logits.dtype][1]
        return
    table = mask_table.numpy()
    seen: dict[int, RowPlan] = {}
    plans: list[RowPlan | None] = []
    for i in ids.tolist():
        plan = seen.get(i)
        if plan is None and i != UNCONSTRAINED:
            plan = seen[i] = plan_row(table[i], vocab, thorough=False)
        plans.append(plan)
    apply_planned(logits, plans)


# ---- the dense pass

_BITS = torch.tensor([1 << b for b in range(31)] + [-(2**31)], dtype=torch.int32)


def _dense_eager(logits: torch.Tensor, words: torch.Tensor, bits: torch.Tensor) -> None:
    rows, width = logits.shape
    used = words.shape[1]
    blocked = (words.unsqueeze(-1) & bits).view(rows, used * 32)[:, :width] == 0
    logits.masked_fill_(blocked, float("-inf"))


def _dense_one_row(logits: torch.Tensor, words: torch.Tensor, bits: torch.Tensor) -> None:
    # Its own code object, so dynamo keeps its graphs apart from the batched ones.
    _dense_eager(logits, words, bits)


_compiled: dict[str, object] = {}


def _dense(logits: torch.Tensor, words: torch.Tensor) -> None:
    """Block every token whose bit in `words` [rows, ceil(width / 32)] is 0, in `logits` [rows, width], in place.

    Compiled into a single-threaded loop: ~12 us per 128k row on this machine against ~8 ms when inductor's OpenMP
    region waits for a busy second core. One row keeps dynamo's automatic shapes (static width until it changes:
    15 us against 30 us with `dynamic=True` at [1, 128256]); batches use `dynamic=True` (8 rows: 58 us against 80).
    If compiling fails this warns once and runs eagerly.
    """
    one = logits.shape[0] == 1
    key = "one" if one else "batch"
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = torch.compile(_dense_one_row if one else _dense_eager, dynamic=None if one else True,
                                            options={"cpp.threads": 1})
    if fn is not _dense_eager:
        try:
            fn(logits, words, _BITS)
            return
        except Exception as err:  # noqa: BLE001 - any compiler failure means: use the eager ops
            warnings.warn(f"torch.compile of the CPU mask pass failed ({type(err).__name__}: {err}); using eager "
                          "torch", RuntimeWarning, stacklevel=2)
            _compiled[key] = _dense_eager
    _dense_eager(logits, words, _BITS)
