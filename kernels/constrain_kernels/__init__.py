"""Mask kernels: packed int32 token masks applied to logits in place, on the logits' device (torch and Triton).

`apply_token_mask` picks the Triton kernel for CUDA tensors when Triton imports (else the torch reference compiled into
one fused loop), and `constrain_kernels.cpu_mask` for CPU tensors; all have the same semantics bit for bit (see
`constrain_kernels.torch_ref.apply_token_mask`).
"""

from __future__ import annotations

import warnings

import torch

from constrain_kernels import cpu_mask, torch_ref
from constrain_kernels.torch_ref import UNCONSTRAINED

__all__ = ["UNCONSTRAINED", "apply_token_mask"]

_triton_apply = None
_triton_state = "untried"  # "untried" | "ok" | "missing"


def _triton():
    global _triton_apply, _triton_state
    if _triton_state == "untried":
        try:
            from constrain_kernels.triton_mask import apply_token_mask as fn
        except ImportError as err:
            _triton_state = "missing"
            warnings.warn(f"Triton is not importable ({err}); masking CUDA logits with the slower torch kernel",
                          RuntimeWarning, stacklevel=3)
        else:
            _triton_apply, _triton_state = fn, "ok"
    return _triton_apply


def apply_token_mask(logits: torch.Tensor, mask_table: torch.Tensor, row_ids: torch.Tensor) -> None:
    """Set every logit whose token is not allowed to -inf, in place (Triton on CUDA, `constrain_kernels.cpu_mask` on CPU).

    Args:
        logits: float32/float16/bfloat16 [rows, V], any strides.
        mask_table: int32 [n_rows, n_words] on `logits.device`; bit `t % 32` of word `t // 32` allows token `t`;
            bits of ids past the tokenizer must be 0 (as `TokenIndex.mask_table()` guarantees).
        row_ids: int32 [rows] on `logits.device`: a table row per logits row, or `UNCONSTRAINED` (-1): row untouched.

    Semantics, as a plain loop:

        for r in range(rows):
            if row_ids[r] == -1:
                continue
            for t in range(V):
                if t >= 32 * n_words or not (mask_table[row_ids[r]][t // 32] >> (t % 32)) & 1:
                    logits[r, t] = -inf

    Raises:
        ValueError: shapes, dtypes or devices outside this contract.
    """
    if logits.device.type == "cpu":
        cpu_mask.apply_token_mask(logits, mask_table, row_ids)
        return
    if logits.is_cuda:
        fn = _triton()
        if fn is not None:
            fn(logits, mask_table, row_ids)
            return
    torch_ref.apply_token_mask_fused(logits, mask_table, row_ids)
