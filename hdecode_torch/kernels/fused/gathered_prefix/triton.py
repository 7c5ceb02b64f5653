"""Triton kernel of ``hdecode::gathered_prefix``: one program per row, any row length.

The row's float64 prefix is held in registers or in a scratch row (:func:`.._triton.row_layout`),
then the K ranges are read from it in tiles of at most :data:`MAX_BLOCK_K` and only the (B, K)
results are written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _triton as T
from .._triton import range_sums, row_prefix
from . import check_args

__all__ = ["MAX_BLOCK_K", "launch"]

#: Ranges handled per loop step of a program.
MAX_BLOCK_K = 2048


@triton.jit
def _gathered_prefix_kernel(X, stride_xb, stride_xm, SRC, W, HI, LO, OUT, SCRATCH, J, K, HAS_W: tl.constexpr,
                            HAS_LO: tl.constexpr, IN_REGS: tl.constexpr, BLOCK_J: tl.constexpr,
                            BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    P = SCRATCH + row * J  # read only in the scratch layout
    c = row_prefix(xrow, stride_xm, SRC, W, J, P, HAS_W, IN_REGS, BLOCK_J)
    out_row = OUT + row * K
    k0 = tl.full((), 0, tl.int32)
    while k0 < K:
        k = k0 + tl.arange(0, BLOCK_K)
        v = range_sums(c, P, xrow, stride_xm, SRC, W, HI, LO, k, K, HAS_W, HAS_LO, IN_REGS)
        tl.store(out_row + k, v.to(OUT.dtype.element_ty), mask=k < K)
        k0 += BLOCK_K


def launch(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
           lo: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.gathered_prefix` (same arguments and
    result; indices are not range-checked here).  x: (B, M) float, any strides (read in place).

    Rows held in scratch use a (B, J) float64 buffer."""
    check_args(x, src, weight, hi, lo, out_dtype)
    b, j, k = x.shape[0], src.shape[0], hi.shape[0]
    out = torch.empty((b, k), dtype=out_dtype, device=x.device)
    if b == 0 or k == 0:
        return out
    in_regs, block_j, scratch = T.row_buffers(x, j, j, out)
    with T.launch_context(x):
        _gathered_prefix_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, weight, hi, lo, out, scratch, j, k,
            HAS_W=weight is not None, HAS_LO=lo is not None, IN_REGS=in_regs, BLOCK_J=block_j,
            BLOCK_K=min(MAX_BLOCK_K, T.padded(k)), num_warps=T.num_warps(block_j), enable_fp_fusion=False)
    return out
