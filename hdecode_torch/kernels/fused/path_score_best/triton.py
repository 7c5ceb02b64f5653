"""Triton kernel of ``hdecode::path_score_best``: one program per row, any tree size.

In registers when the leaf prefix, the N nodes and the T tour entries all fit one tile
(:func:`.._triton.row_layout` of the widest): the leaf prefix (``tl.cumsum``), every node's p read
from it, p of each parent (``tl.gather``), v, the Euler tour's prefix sums of ±v, S and the score
of every node, and the selection (two max reductions).  Otherwise the same steps through a float64
scratch row of J + 2N + T entries (leaf prefix, p, v, tour prefix), each step a loop over tiles
separated from the next by a block barrier, and the selection over tiles of nodes in increasing
id keeping the best (score, rank, id) so far.  Only the B node ids are written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _triton as T
from .._triton import prefix_to_memory, range_sums, row_prefix
from . import check_args

__all__ = ["launch"]

_INT64_MIN = tl.constexpr(-9223372036854775807 - 1)


@triton.jit
def _best_of_tile(score, n, live, ALLOWED, RANK, N, HIGHER: tl.constexpr):
    """(best score, its largest rank, the smallest such n; N where no node of the tile is left)."""
    if not HIGHER:
        score = -score
    # NaN and the worst infinity are never chosen (NaN > -inf is false)
    ok = live & (tl.load(ALLOWED + n, mask=live, other=0) != 0) & (score > float("-inf"))
    score = tl.where(ok, score, float("-inf"))
    top = tl.max(score, axis=0)
    hit = ok & (score == top)
    key = tl.where(hit, tl.load(RANK + n, mask=live, other=0), _INT64_MIN)
    top_rank = tl.max(key, axis=0)
    first = tl.min(tl.where(hit & (key == top_rank), n, N), axis=0).to(tl.int64)
    return top, top_rank, first


@triton.jit
def _path_score_best_kernel(X, stride_xb, stride_xm, SRC, HI, LO, PARENT, ALPHA, BETA, ESRC, SIGN, AT, GAMMA,
                            DELTA, ALLOWED, RANK, OUT, SCRATCH, J, N, T, HIGHER: tl.constexpr,
                            IN_REGS: tl.constexpr, JP: tl.constexpr, NP: tl.constexpr, TP: tl.constexpr):
    # in registers JP, NP, TP cover J, N and T; through scratch they are the tile widths
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    PC = SCRATCH + row * (J + 2 * N + T)  # scratch layout: leaf prefix (J), then p (N), v (N), tour prefix (T)
    c = row_prefix(xrow, stride_xm, SRC, SRC, J, PC, False, IN_REGS, JP)
    if IN_REGS:
        n = tl.arange(0, NP)
        live = n < N
        p = range_sums(c, c, xrow, stride_xm, SRC, SRC, HI, LO, n, N, False, True, True)
        par = tl.load(PARENT + n, mask=live, other=0)
        v = (tl.load(ALPHA + n, mask=live, other=0.0) * tl.gather(p, par, axis=0)
             + tl.load(BETA + n, mask=live, other=0.0) * p)
        t = tl.arange(0, TP)
        in_t = t < T
        g = tl.gather(v, tl.load(ESRC + t, mask=in_t, other=0), axis=0) * tl.load(SIGN + t, mask=in_t, other=0.0)
        path = tl.cumsum(g, axis=0)
        at = tl.load(AT + n, mask=live, other=0)
        s = tl.where(at > 0, tl.gather(path, tl.maximum(at - 1, 0), axis=0), 0.0)
        score = tl.load(GAMMA + n, mask=live, other=0.0) * s + tl.load(DELTA + n, mask=live, other=0.0) * p
        _, _, best = _best_of_tile(score, n, live, ALLOWED, RANK, N, HIGHER)
    else:
        PP = PC + J
        PV = PP + N
        PE = PV + N
        n0 = tl.full((), 0, tl.int32)
        while n0 < N:
            n = n0 + tl.arange(0, NP)
            p = range_sums(0.0, PC, xrow, stride_xm, SRC, SRC, HI, LO, n, N, False, True, False)
            tl.store(PP + n, p, mask=n < N)
            n0 += NP
        tl.debug_barrier()
        n0 = tl.full((), 0, tl.int32)
        while n0 < N:
            n = n0 + tl.arange(0, NP)
            live = n < N
            par = tl.load(PARENT + n, mask=live, other=0)
            v = (tl.load(ALPHA + n, mask=live, other=0.0) * tl.load(PP + par, mask=live, other=0.0)
                 + tl.load(BETA + n, mask=live, other=0.0) * tl.load(PP + n, mask=live, other=0.0))
            tl.store(PV + n, v, mask=live)
            n0 += NP
        tl.debug_barrier()
        prefix_to_memory(PV, 1, ESRC, SIGN, T, PE, True, TP)
        tl.debug_barrier()
        best_score = tl.full((), float("-inf"), tl.float64)
        best_rank = tl.full((), _INT64_MIN, tl.int64)
        best = tl.full((), -1, tl.int64)
        n0 = tl.full((), 0, tl.int32)
        while n0 < N:
            n = n0 + tl.arange(0, NP)
            live = n < N
            at = tl.load(AT + n, mask=live, other=0)
            s = tl.load(PE + at - 1, mask=live & (at > 0), other=0.0)
            score = (tl.load(GAMMA + n, mask=live, other=0.0) * s
                     + tl.load(DELTA + n, mask=live, other=0.0) * tl.load(PP + n, mask=live, other=0.0))
            top, top_rank, first = _best_of_tile(score, n, live, ALLOWED, RANK, N, HIGHER)
            # tiles come in increasing n: a later one wins with a better score, or an equal one of larger rank
            take = (first < N) & ((best < 0) | (top > best_score) | ((top == best_score) & (top_rank > best_rank)))
            best_score = tl.where(take, top, best_score)
            best_rank = tl.where(take, top_rank, best_rank)
            best = tl.where(take, first, best)
            n0 += NP
    tl.store(OUT + row, tl.where((best >= 0) & (best < N), best, -1))


def launch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, parent: torch.Tensor,
           alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor, sign: torch.Tensor, at: torch.Tensor,
           gamma: torch.Tensor, delta: torch.Tensor, allowed: torch.Tensor, rank: torch.Tensor,
           higher_is_better: bool) -> torch.Tensor:
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.path_score_best` (same arguments and
    result; indices are not range-checked here).  x: (B, M) float, any strides (read in place).
    Rows held in scratch use a (B, J + 2N + T) float64 buffer."""
    check_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    b, j, n, t = x.shape[0], src.shape[0], hi.shape[0], euler_src.shape[0]
    out = torch.full((b,), -1, dtype=torch.int64, device=x.device)
    if b == 0 or n == 0:
        return out
    in_regs, block, scratch = T.row_buffers(x, max(j, n, t), j + 2 * n + t, out)
    jp, np_, tp = (T.padded(v) for v in (j, n, t)) if in_regs else (block, block, block)
    with T.launch_context(x):
        _path_score_best_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta,
            allowed.view(torch.uint8), rank, out, scratch, j, n, t, HIGHER=bool(higher_is_better),
            IN_REGS=in_regs, JP=jp, NP=np_, TP=tp, num_warps=T.num_warps(block), enable_fp_fusion=False)
    return out
