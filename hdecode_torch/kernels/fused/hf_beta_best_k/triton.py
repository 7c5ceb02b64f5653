"""Triton kernel of ``hdecode::hf_beta_best_k``: one program per row, any candidate count C.

Blocks of BK values of k at a time.  V(k), the sum of the k largest Δ_k, is the sum of Δ_k over the
candidates of rank < k, with ranks by pairwise comparison in a fixed order (larger Δ_k first, then
smaller column): exactly k candidates pass, so ties need no care.  The candidates are ranked in
tiles of CB columns, each counted against the candidates in chunks of CC columns, a (BK, CB, CC)
comparison tile; Δ_k of a chunk is recomputed from q with the same operations as the tile's own
Δ_k, so a candidate compares equal to itself.  Only k <= count and real candidates are visited.
Work per row O(C²·E + C³) in registers, no memory traffic but q.

Why ranks and not ``tl.sort`` of each (BK, C) tile: per entry, a bitonic sort takes
log C (log C + 1)/2 compare-and-swap rounds, each exchanging data between threads, the ranks C
comparisons against a broadcast chunk; and a sort needs the whole row in one tile, ranks any C.
At the C the hF_β decoder packs on the bundled trees (tens) both are small next to launching and
reading q, and neither was timed on a GPU; under Triton's CPU interpreter, which the tests use,
the sort was an order of magnitude slower.  The weights w_e(k) come in a (C, E) table computed by
torch with the torch implementation's operations, so both use the same bits of w.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _triton as T
from . import check_args, hf_beta_weights

__all__ = ["MAX_RANK_COLUMNS", "launch"]

#: Widest tile of candidates ranked at once (CB); more candidates take several tiles.
MAX_RANK_COLUMNS = 256
#: Entries of a program's (BK, CB, CC) comparison tile, and the chunk width CC.
_RANK_TILE = 8192
_RANK_CHUNK = 16


@triton.jit
def _delta_tile(qrow, stride_qc, stride_qe, W, ks, live_k, cols, real, E, BK: tl.constexpr, WIDTH: tl.constexpr):
    # (BK, WIDTH) Δ_k(c) = Σ_e q[c, e]·w_e(k), summed over e in order; -inf outside the real candidates
    d = tl.zeros((BK, WIDTH), W.dtype.element_ty)
    e = tl.full((), 0, tl.int32)
    while e < E:
        qe = tl.load(qrow + cols * stride_qc + e * stride_qe, mask=real, other=0.0)
        we = tl.load(W + ks * E + e, mask=live_k, other=0.0)
        d = d + we[:, None] * qe[None, :]
        e += 1
    return tl.where(real[None, :], d, float("-inf"))


@triton.jit
def _hf_beta_best_k_kernel(Q, stride_qb, stride_qc, stride_qe, COUNT, W, KOUT, DOUT, C, E,
                           CB: tl.constexpr, BK: tl.constexpr, CC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    qrow = Q + row * stride_qb
    cnt = tl.minimum(tl.load(COUNT + row), C)  # memory safety only: the op checks 0 <= count <= C
    best_v = tl.full((), float("-inf"), W.dtype.element_ty)
    best_k = tl.full((), 0, tl.int64)
    k0 = tl.full((), 0, tl.int32)
    while k0 < cnt:
        ks = k0 + tl.arange(0, BK)  # k − 1
        live_k = ks < cnt
        v = tl.zeros((BK,), W.dtype.element_ty)
        c0 = tl.full((), 0, tl.int32)
        while c0 < cnt:
            cols = c0 + tl.arange(0, CB)
            dk = _delta_tile(qrow, stride_qc, stride_qe, W, ks, live_k, cols, cols < cnt, E, BK, CB)
            ahead = tl.zeros((BK, CB), tl.int32)  # candidates ranked before each column, for each k
            j0 = tl.full((), 0, tl.int32)
            while j0 < cnt:
                cj = j0 + tl.arange(0, CC)
                dj = _delta_tile(qrow, stride_qc, stride_qe, W, ks, live_k, cj, cj < cnt, E, BK, CC)
                a = dj[:, None, :]
                b = dk[:, :, None]
                first = (a > b) | ((a == b) & (cj[None, None, :] < cols[None, :, None]))
                ahead += tl.sum(first.to(tl.int32), axis=2)
                j0 += CC
            # padding columns (-inf) have every real candidate ahead: rank count > k − 1
            v += tl.sum(tl.where(ahead <= ks[:, None], dk, 0.0), axis=1)  # rank < k
            c0 += CB
        v = tl.where(live_k, v, float("-inf"))
        tile_v = tl.max(v, axis=0)
        tile_k = tl.min(tl.where(v == tile_v, ks, k0 + BK), axis=0).to(tl.int64)
        # blocks come in increasing k: a later one wins only with a strictly larger value
        take = tile_v > best_v
        best_v = tl.where(take, tile_v, best_v)
        best_k = tl.where(take, tile_k, best_k)
        k0 += BK
    tl.store(KOUT + row, best_k + 1)
    # Δ_{best_k} of every column (padding columns included: finite, the caller masks them)
    c0 = tl.full((), 0, tl.int32)
    while c0 < C:
        cols = c0 + tl.arange(0, CB)
        in_c = cols < C
        d = tl.zeros((CB,), W.dtype.element_ty)
        e = tl.full((), 0, tl.int32)
        while e < E:
            qe = tl.load(qrow + cols * stride_qc + e * stride_qe, mask=in_c, other=0.0)
            d = d + qe * tl.load(W + best_k * E + e)
            e += 1
        tl.store(DOUT + row * C + cols, d, mask=in_c)
        c0 += CB


def launch(q: torch.Tensor, count: torch.Tensor, depths: torch.Tensor, r: float):
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.hf_beta_best_k` (same arguments and
    result; ``count`` is not range-checked here).  q: (B, C, E) float32/float64, any strides."""
    check_args(q, count, depths, r)
    b, c, e = q.shape
    best_k = torch.ones((b,), dtype=torch.int64, device=q.device)
    delta = torch.empty((b, c), dtype=q.dtype, device=q.device)
    if b == 0 or c == 0:
        return best_k, delta
    w = hf_beta_weights(torch.arange(1, c + 1, device=q.device), depths, r, q.dtype).contiguous()  # (C, E)
    cb = min(T.padded(c), MAX_RANK_COLUMNS)
    cc = min(cb, _RANK_CHUNK)
    bk = max(1, min(T.padded(c), _RANK_TILE // (cb * cc)))
    with T.launch_context(q):
        _hf_beta_best_k_kernel[(b,)](q, q.stride(0), q.stride(1), q.stride(2), count, w, best_k, delta, c, e,
                                     CB=cb, BK=bk, CC=cc, num_warps=4 if cb <= 32 else 8, enable_fp_fusion=False)
    return best_k, delta
