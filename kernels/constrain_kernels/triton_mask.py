"""Token masks applied to logits in place, as one Triton kernel: the same semantics as `constrain_kernels.torch_ref`, bit for bit."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from constrain_kernels.torch_ref import UNCONSTRAINED, check_inputs

__all__ = ["UNCONSTRAINED", "apply_token_mask"]

# One program covers BLOCK tokens of one row. 4096 tokens = 128 mask words keeps a 152k row to 38 programs; under the
# interpreter (CPU) a larger block means fewer Python-level launches.
_BLOCK = 4096
_BLOCK_INTERPRET = 32768


def _mask_kernel(logits_ptr, stride_row, stride_col, table_ptr, stride_table, row_ids_ptr, vocab, n_words,
                 BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(row_ids_ptr + r).to(tl.int64)
    # UNCONSTRAINED (-1): nothing is read or written (a vector, not a scalar: the interpreter needs mask vectors).
    constrained = tl.full([BLOCK], 0, tl.int64) + row >= 0
    in_vocab = offs < vocab
    word = offs // 32
    # Past the table's width the word reads as 0: nothing allowed there.
    live = in_vocab & constrained
    words = tl.load(table_ptr + tl.maximum(row, 0) * stride_table + word, mask=live & (word < n_words), other=0)
    blocked = (((words >> (offs % 32)) & 1) == 0) & live
    neg_inf = tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    # Only blocked entries are written and the logits are never read: the kernel moves mask words + blocked stores.
    tl.store(logits_ptr + r * stride_row + offs.to(tl.int64) * stride_col, neg_inf, mask=blocked)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.cache
def _compiled(interpret: bool):
    # Decorated on first use, not at import: `triton.jit` reads TRITON_INTERPRET when it decorates.
    return triton.jit(_mask_kernel)


def apply_token_mask(logits: torch.Tensor, mask_table: torch.Tensor, row_ids: torch.Tensor) -> None:
    """Set every logit whose token is not allowed to -inf, in place, in one Triton launch (no host sync).

    Args:
        logits: float32/float16/bfloat16 [rows, V], any strides, on a CUDA device (or on the CPU with
            `TRITON_INTERPRET=1`, Triton's interpreter, which the tests use).
        mask_table: int32 [n_rows, n_words] on `logits.device`; bit `t % 32` of word `t // 32` allows token `t`;
            tokens past the tokenizer must have their bits 0 (as `TokenIndex.mask_table()` guarantees).
        row_ids: int32 [rows] on `logits.device`: the table row per logits row, or `UNCONSTRAINED` (-1) to leave the
            row untouched; other values must lie in `0 .. n_rows - 1` (not checked: that would sync).

    Semantics, as a plain loop (identical to `constrain_kernels.torch_ref.apply_token_mask`):

        for r in range(rows):
            if row_ids[r] == -1:
                continue
            words = mask_table[row_ids[r]]
            for t in range(V):
                if t >= 32 * n_words or not (words[t // 32] >> (t % 32)) & 1:
                    logits[r, t] = -inf

    Raises:
        ValueError: see `constrain_kernels.torch_ref.check_inputs`, or CPU tensors without `TRITON_INTERPRET=1`.
    """
    check_inputs(logits, mask_table, row_ids)
    interpret = _interpreting()
    if logits.device.type == "cpu" and not interpret:
        raise ValueError("the Triton kernel needs GPU tensors; for CPU tensors set TRITON_INTERPRET=1 (or use torch_ref)")
    rows, vocab = logits.shape
    if rows == 0 or vocab == 0:
        return
    block = _BLOCK_INTERPRET if interpret else _BLOCK
    grid = (rows, triton.cdiv(vocab, block))
    _compiled(interpret)[grid](
        logits, logits.stride(0), logits.stride(1), mask_table, mask_table.stride(0), row_ids, vocab,
        mask_table.shape[1], BLOCK=block,
    )
