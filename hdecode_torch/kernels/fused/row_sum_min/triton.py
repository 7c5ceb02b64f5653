"""Triton kernel of ``hdecode::row_sum_min``: one program per row, the row read in blocks of :data:`ROW_BLOCK`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _triton as T
from . import check

__all__ = ["ROW_BLOCK", "launch"]

#: Columns per loop step.
ROW_BLOCK = 1024


@triton.jit
def _row_sum_min_kernel(X, stride_xb, stride_xm, OUT, M, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    acc = tl.zeros((BLOCK,), tl.float64)
    low = tl.full((BLOCK,), float("inf"), tl.float64)
    nan = tl.zeros((BLOCK,), tl.int32)
    m0 = tl.full((), 0, tl.int32)
    while m0 < M:
        m = m0 + tl.arange(0, BLOCK)
        live = m < M
        v = tl.load(xrow + m * stride_xm, mask=live, other=0.0).to(tl.float64)
        acc += v
        low = tl.minimum(low, tl.where(live, v, float("inf")))
        # GPU min drops NaN: track it on its own so that it reaches both outputs
        nan = tl.maximum(nan, (v != v).to(tl.int32))
        m0 += BLOCK
    has_nan = tl.max(nan, axis=0) > 0
    total = tl.where(has_nan, float("nan"), tl.sum(acc, axis=0))
    smallest = tl.where(has_nan, float("nan"), tl.min(low, axis=0))
    tl.store(OUT + row * 2, total)
    tl.store(OUT + row * 2 + 1, smallest)


def launch(x: torch.Tensor) -> torch.Tensor:
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.row_sum_min` (same argument and result)."""
    check(x)
    b, m = x.shape
    out = torch.empty((b, 2), dtype=torch.float64, device=x.device)
    if b == 0:
        return out
    with T.launch_context(x):
        _row_sum_min_kernel[(b,)](x, x.stride(0), x.stride(1), out, m, BLOCK=min(ROW_BLOCK, T.padded(m)),
                                  num_warps=4, enable_fp_fusion=False)
    return out
