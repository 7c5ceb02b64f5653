"""Triton kernel of ``hdecode::best_ranked_above``: one program per row, any row length.

The row's prefix as in :mod:`..gathered_prefix.triton`; the ranges are visited in tiles in
increasing k, keeping the best (rank, k) so far; only the B decisions are written.
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

_INT64_MIN = tl.constexpr(-9223372036854775807 - 1)


@triton.jit
def _best_ranked_above_kernel(X, stride_xb, stride_xm, SRC, HI, LO, RANK, OUT, SCRATCH, threshold: tl.float64,
                              fallback: tl.int64, J, K, HAS_LO: tl.constexpr, IN_REGS: tl.constexpr,
                              BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    P = SCRATCH + row * J  # read only in the scratch layout
    c = row_prefix(xrow, stride_xm, SRC, SRC, J, P, False, IN_REGS, BLOCK_J)
    best_rank = tl.full((), _INT64_MIN, tl.int64)
    best_k = tl.full((), -1, tl.int64)
    k0 = tl.full((), 0, tl.int32)
    while k0 < K:
        k = k0 + tl.arange(0, BLOCK_K)
        live = k < K
        ok = (range_sums(c, P, xrow, stride_xm, SRC, SRC, HI, LO, k, K, False, HAS_LO, IN_REGS) > threshold) & live
        r = tl.load(RANK + k, mask=live, other=0)
        tile_rank = tl.max(tl.where(ok, r, _INT64_MIN), axis=0)
        # smallest k of the tile's best rank; K when nothing in the tile passes
        tile_k = tl.min(tl.where(ok & (r == tile_rank), k, K), axis=0).to(tl.int64)
        # tiles come in increasing k: a later tile wins only with a strictly larger rank
        take = (tile_k < K) & ((best_k < 0) | (tile_rank > best_rank))
        best_rank = tl.where(take, tile_rank, best_rank)
        best_k = tl.where(take, tile_k, best_k)
        k0 += BLOCK_K
    tl.store(OUT + row, tl.where(best_k >= 0, best_k, fallback))


def launch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None, rank: torch.Tensor,
           threshold: float, fallback: int) -> torch.Tensor:
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.best_ranked_above` (same arguments and
    result; indices are not range-checked here).  Rows held in scratch use a (B, J) float64 buffer."""
    check_args(x, src, hi, lo, rank)
    b, j, k = x.shape[0], src.shape[0], hi.shape[0]
    out = torch.empty((b,), dtype=torch.int64, device=x.device)
    if b == 0:
        return out
    in_regs, block_j, scratch = T.row_buffers(x, j, j, out)
    with T.launch_context(x):
        _best_ranked_above_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, hi, lo, rank, out, scratch, float(threshold), int(fallback), j, k,
            HAS_LO=lo is not None, IN_REGS=in_regs, BLOCK_J=block_j, BLOCK_K=min(MAX_BLOCK_K, T.padded(k)),
            num_warps=T.num_warps(block_j), enable_fp_fusion=False)
    return out
