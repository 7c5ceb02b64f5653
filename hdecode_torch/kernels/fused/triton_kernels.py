"""Triton kernels of the fused ops: one program per row, the whole row in registers.

Imported lazily (on the first CUDA call of an ``hdecode::`` op, or explicitly): importing this
module imports Triton.  The launchers take CUDA tensors, or CPU tensors when the environment has
``TRITON_INTERPRET=1`` before this module is imported (Triton's interpreter, used by the tests).

Design (why one program per row): the prefix sum of a row of J gathered values is computed in
registers with ``tl.cumsum`` (float64), every range sum is read from it with ``tl.gather``, and only
the K outputs (or one int64 decision) are written.  The input is read once; no (B, J) prefix table
ever reaches memory.  A program holds the J prefix sums in registers, so J is capped at
:data:`MAX_J`; the K ranges are processed in tiles of at most :data:`MAX_BLOCK_K`, so K is not capped.

Numerics: products ``weight[j]·x[src[j]]`` are rounded before they are summed (FMA contraction is
disabled), and the scan is a fixed tree, so the result is deterministic; it equals the torch
reference (a sequential scan) to a few float64 ulps of the row's running sum, not bit for bit.
Index arrays are read unchecked: the ``hdecode::`` ops check them before launching.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .reference import (check_best_ranked_above_args, check_gathered_prefix_args, check_hf_beta_best_k_args,
                        check_path_score_best_args, check_row_sum_min_args, hf_beta_weights)

__all__ = ["MAX_J", "MAX_BLOCK_K", "MAX_C", "MAX_N", "fits", "fits_best_k", "fits_path_score", "interpreted",
           "gathered_prefix_triton", "best_ranked_above_triton", "row_sum_min_triton", "hf_beta_best_k_triton",
           "path_score_best_triton"]

#: Largest J (gathered entries per row) handled by one program: its float64 prefix sums live in
#: registers (16384 values over 512 threads = 32 doubles a thread).  Larger rows use the torch path.
MAX_J = 16384
#: Ranges handled per loop step of a program.
MAX_BLOCK_K = 2048
#: Columns per loop step of ``row_sum_min``.
ROW_BLOCK = 1024

_INT64_MIN = tl.constexpr(-9223372036854775807 - 1)


@triton.jit
def _weighted_prefix(xrow, stride_xm, SRC, W, J, HAS_W: tl.constexpr, JP: tl.constexpr):
    # c[j] = Σ_{i<=j} w[i]·x[src[i]] (inclusive), float64; padding lanes add 0
    j = tl.arange(0, JP)
    live = j < J
    s = tl.load(SRC + j, mask=live, other=0)
    v = tl.load(xrow + s * stride_xm, mask=live, other=0.0).to(tl.float64)
    if HAS_W:
        v = v * tl.load(W + j, mask=live, other=0.0)
    return tl.cumsum(v, axis=0)


@triton.jit
def _range_sum(c, HI, LO, k, K, HAS_LO: tl.constexpr):
    # C[hi] - C[lo] with the exclusive prefix C[i] = c[i-1], C[0] = 0
    live = k < K
    hi = tl.load(HI + k, mask=live, other=0)
    v = tl.where(hi > 0, tl.gather(c, tl.maximum(hi - 1, 0), axis=0), 0.0)
    if HAS_LO:
        lo = tl.load(LO + k, mask=live, other=0)
        v = v - tl.where(lo > 0, tl.gather(c, tl.maximum(lo - 1, 0), axis=0), 0.0)
    return v


@triton.jit
def _gathered_prefix_kernel(X, stride_xb, stride_xm, SRC, W, HI, LO, OUT, J, K,
                            HAS_W: tl.constexpr, HAS_LO: tl.constexpr, JP: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = _weighted_prefix(X + row * stride_xb, stride_xm, SRC, W, J, HAS_W, JP)
    out_row = OUT + row * K
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        v = _range_sum(c, HI, LO, k, K, HAS_LO)
        tl.store(out_row + k, v.to(OUT.dtype.element_ty), mask=k < K)


@triton.jit
def _best_ranked_above_kernel(X, stride_xb, stride_xm, SRC, HI, LO, RANK, OUT, threshold: tl.float64,
                              fallback: tl.int64, J, K, HAS_LO: tl.constexpr, JP: tl.constexpr,
                              BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = _weighted_prefix(X + row * stride_xb, stride_xm, SRC, SRC, J, False, JP)
    best_rank = tl.full((), _INT64_MIN, tl.int64)
    best_k = tl.full((), -1, tl.int64)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        live = k < K
        ok = (_range_sum(c, HI, LO, k, K, HAS_LO) > threshold) & live
        r = tl.load(RANK + k, mask=live, other=0)
        tile_rank = tl.max(tl.where(ok, r, _INT64_MIN), axis=0)
        # smallest k of the tile's best rank; K when nothing in the tile passes
        tile_k = tl.min(tl.where(ok & (r == tile_rank), k, K), axis=0).to(tl.int64)
        # tiles come in increasing k: a later tile wins only with a strictly larger rank
        take = (tile_k < K) & ((best_k < 0) | (tile_rank > best_rank))
        best_rank = tl.where(take, tile_rank, best_rank)
        best_k = tl.where(take, tile_k, best_k)
    tl.store(OUT + row, tl.where(best_k >= 0, best_k, fallback))


@triton.jit
def _row_sum_min_kernel(X, stride_xb, stride_xm, OUT, M, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    acc = tl.zeros((BLOCK,), tl.float64)
    low = tl.full((BLOCK,), float("inf"), tl.float64)
    nan = tl.zeros((BLOCK,), tl.int32)
    for m0 in range(0, M, BLOCK):
        m = m0 + tl.arange(0, BLOCK)
        live = m < M
        v = tl.load(xrow + m * stride_xm, mask=live, other=0.0).to(tl.float64)
        acc += v
        low = tl.minimum(low, tl.where(live, v, float("inf")))
        # GPU min drops NaN: track it on its own so that it reaches both outputs
        nan = tl.maximum(nan, (v != v).to(tl.int32))
    has_nan = tl.max(nan, axis=0) > 0
    total = tl.where(has_nan, float("nan"), tl.sum(acc, axis=0))
    smallest = tl.where(has_nan, float("nan"), tl.min(low, axis=0))
    tl.store(OUT + row * 2, total)
    tl.store(OUT + row * 2 + 1, smallest)


def interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return type(_gathered_prefix_kernel).__name__ == "InterpretedFunction"


_SHARED_MEMORY: dict[int, int] = {}


def _shared_memory(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED_MEMORY:
        props = torch.cuda.get_device_properties(index)
        _SHARED_MEMORY[index] = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
    return _SHARED_MEMORY[index]


def fits(num_gathered: int, device: torch.device | None = None) -> bool:
    """Whether rows of ``num_gathered`` (= J) entries fit one program.

    J <= :data:`MAX_J`, and on a CUDA ``device`` the J float64 prefix sums fit the shared memory a
    block may use (``tl.gather`` stages them there: 128 KiB at J = 16384, more than GPUs before
    sm_80 offer).
    """
    if num_gathered > MAX_J:
        return False
    if device is None or device.type != "cuda":
        return True
    return 8 * max(16, triton.next_power_of_2(num_gathered)) + 4096 <= _shared_memory(device)


def _launch_context(x: torch.Tensor):
    if x.device.type == "cuda":
        return torch.cuda.device(x.device)
    if not interpreted():
        raise RuntimeError(f"The Triton kernels take CUDA tensors (got {x.device}); CPU tensors need "
                           "TRITON_INTERPRET=1 in the environment before this module is imported")
    return contextlib.nullcontext()


def _row_config(x: torch.Tensor, j: int, k: int) -> tuple[int, int, int]:
    if not fits(j, x.device):
        raise ValueError(f"Expected at most MAX_J = {MAX_J} gathered entries per row, but got J = {j}; "
                         "use the torch path (the hdecode:: ops switch to it automatically)")
    jp = max(16, triton.next_power_of_2(j))
    block_k = min(MAX_BLOCK_K, max(16, triton.next_power_of_2(k)))
    num_warps = 4 if jp <= 1024 else 8 if jp <= 4096 else 16
    return jp, block_k, num_warps


def gathered_prefix_triton(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                           lo: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Triton kernel of ``hdecode::gathered_prefix`` (same arguments and result; see
    :func:`hdecode_torch.kernels.fused.gathered_prefix`).  Indices are not range-checked here.

    x: (B, M) float, any strides (read in place); J = len(src) <= :data:`MAX_J`.  Returns (B, K).
    """
    check_gathered_prefix_args(x, src, weight, hi, lo, out_dtype)
    b, j, k = x.shape[0], src.shape[0], hi.shape[0]
    jp, block_k, num_warps = _row_config(x, j, k)
    out = torch.empty((b, k), dtype=out_dtype, device=x.device)
    if b == 0 or k == 0:
        return out
    with _launch_context(x):
        _gathered_prefix_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, weight, hi, lo, out, j, k,
            HAS_W=weight is not None, HAS_LO=lo is not None, JP=jp, BLOCK_K=block_k,
            num_warps=num_warps, enable_fp_fusion=False)
    return out


def best_ranked_above_triton(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                             rank: torch.Tensor, threshold: float, fallback: int) -> torch.Tensor:
    """Triton kernel of ``hdecode::best_ranked_above`` (same arguments and result; see
    :func:`hdecode_torch.kernels.fused.best_ranked_above`).  Indices are not range-checked here.

    Returns (B,) int64; only these B integers are written.
    """
    check_best_ranked_above_args(x, src, hi, lo, rank)
    b, j, k = x.shape[0], src.shape[0], hi.shape[0]
    jp, block_k, num_warps = _row_config(x, j, k)
    out = torch.empty((b,), dtype=torch.int64, device=x.device)
    if b == 0:
        return out
    with _launch_context(x):
        _best_ranked_above_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, hi, lo, rank, out, float(threshold), int(fallback), j, k,
            HAS_LO=lo is not None, JP=jp, BLOCK_K=block_k, num_warps=num_warps, enable_fp_fusion=False)
    return out


def row_sum_min_triton(x: torch.Tensor) -> torch.Tensor:
    """Triton kernel of ``hdecode::row_sum_min`` (see :func:`hdecode_torch.kernels.fused.row_sum_min`).

    x: (B, M) float, any strides, any M (the row is read in blocks).  Returns (B, 2) float64.
    """
    check_row_sum_min_args(x)
    b, m = x.shape
    out = torch.empty((b, 2), dtype=torch.float64, device=x.device)
    if b == 0:
        return out
    block = min(ROW_BLOCK, max(16, triton.next_power_of_2(m)))
    with _launch_context(x):
        _row_sum_min_kernel[(b,)](x, x.stride(0), x.stride(1), out, m, BLOCK=block, num_warps=4,
                                  enable_fp_fusion=False)
    return out


# -- hdecode::hf_beta_best_k ------------------------------------------------------------------------
#
# One program per row, blocks of BK values of k at a time.  V(k), the sum of the k largest Δ_k, is
# the sum of Δ_k over the candidates of rank < k, with ranks by pairwise comparison in a fixed order
# (larger Δ_k first, then smaller column): exactly k candidates pass, so ties need no care.  A
# candidate's rank is counted against the candidates in chunks of CC columns, a (BK, CP, CC)
# comparison tile; Δ_k of a chunk is recomputed from q with the same operations as the block's own
# Δ_k, so a candidate compares equal to itself.  Only k <= count and chunks of real candidates are
# visited.  Work per row O(C²·E + C³) in registers, no memory traffic but q.
#
# Why ranks and not tl.sort of each (BK, CP) tile: per entry, a bitonic sort takes log C (log C + 1)/2
# compare-and-swap rounds, each exchanging data between threads, the ranks C comparisons against a
# broadcast chunk; the sort needs fewer rounds from C ≈ 16 on.  At the C the hF_β decoder packs
# (tens: 21 on tieredImageNet-H at B = 4096) both are small next to launching and reading q, and
# neither was timed on a GPU.  What decided: under Triton's CPU interpreter, which the tests use,
# the sort took about 1.4 s per row at C = 32 against 0.1 s for the ranks.  The weights w_e(k) come
# in a (C, E) table computed by torch with the reference's operations, so both kernels use the
# same bits of w.

#: Largest candidate count C handled by one program; larger C uses the torch path.
MAX_C = 256
#: Entries of a program's (BK, CP, CC) comparison tile, and the chunk width CC.
_RANK_TILE = 8192
_RANK_CHUNK = 16


@triton.jit
def _delta_tile(qrow, stride_qc, stride_qe, W, ks, live_k, cols, real, E, BK: tl.constexpr, WIDTH: tl.constexpr):
    # (BK, WIDTH) Δ_k(c) = Σ_e q[c, e]·w_e(k), summed over e in order; -inf outside the real candidates
    d = tl.zeros((BK, WIDTH), W.dtype.element_ty)
    for e in range(0, E):
        qe = tl.load(qrow + cols * stride_qc + e * stride_qe, mask=real, other=0.0)
        we = tl.load(W + ks * E + e, mask=live_k, other=0.0)
        d = d + we[:, None] * qe[None, :]
    return tl.where(real[None, :], d, float("-inf"))


@triton.jit
def _hf_beta_best_k_kernel(Q, stride_qb, stride_qc, stride_qe, COUNT, W, KOUT, DOUT, C, E,
                           CP: tl.constexpr, BK: tl.constexpr, CC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    qrow = Q + row * stride_qb
    cnt = tl.minimum(tl.load(COUNT + row), C)  # memory safety only: the op checks 0 <= count <= C
    cols = tl.arange(0, CP)
    real = cols < cnt
    best_v = tl.full((), float("-inf"), W.dtype.element_ty)
    best_k = tl.full((), 0, tl.int64)
    for k0 in range(0, cnt, BK):
        ks = k0 + tl.arange(0, BK)  # k − 1
        live_k = ks < cnt
        dk = _delta_tile(qrow, stride_qc, stride_qe, W, ks, live_k, cols, real, E, BK, CP)
        ahead = tl.zeros((BK, CP), tl.int32)  # candidates ranked before each column, for each k
        for j0 in range(0, cnt, CC):
            cj = j0 + tl.arange(0, CC)
            dj = _delta_tile(qrow, stride_qc, stride_qe, W, ks, live_k, cj, cj < cnt, E, BK, CC)
            a = dj[:, None, :]
            b = dk[:, :, None]
            first = (a > b) | ((a == b) & (cj[None, None, :] < cols[None, :, None]))
            ahead += tl.sum(first.to(tl.int32), axis=2)
        v = tl.sum(tl.where(ahead <= ks[:, None], dk, 0.0), axis=1)  # rank < k
        v = tl.where(live_k, v, float("-inf"))
        tile_v = tl.max(v, axis=0)
        tile_k = tl.min(tl.where(v == tile_v, ks, k0 + BK), axis=0).to(tl.int64)
        # blocks come in increasing k: a later one wins only with a strictly larger value
        take = tile_v > best_v
        best_v = tl.where(take, tile_v, best_v)
        best_k = tl.where(take, tile_k, best_k)
    tl.store(KOUT + row, best_k + 1)
    # Δ_{best_k} of every column (padding columns included: finite, the caller masks them)
    in_c = cols < C
    d = tl.zeros((CP,), W.dtype.element_ty)
    for e in range(0, E):
        qe = tl.load(qrow + cols * stride_qc + e * stride_qe, mask=in_c, other=0.0)
        d = d + qe * tl.load(W + best_k * E + e)
    tl.store(DOUT + row * C + cols, d, mask=in_c)


def fits_best_k(num_candidates: int, device: torch.device | None = None) -> bool:
    """Whether rows of ``num_candidates`` (= C) candidates fit one program: C <= :data:`MAX_C`."""
    return num_candidates <= MAX_C


def hf_beta_best_k_triton(q: torch.Tensor, count: torch.Tensor, depths: torch.Tensor, r: float):
    """Triton kernel of ``hdecode::hf_beta_best_k`` (same arguments and result; see
    :func:`hdecode_torch.kernels.fused.hf_beta_best_k`).  ``count`` is not range-checked here.

    q: (B, C, E) float32/float64, any strides; C <= :data:`MAX_C`.  Returns ((B,) int64, (B, C)).
    """
    check_hf_beta_best_k_args(q, count, depths, r)
    b, c, e = q.shape
    if not fits_best_k(c, q.device):
        raise ValueError(f"Expected at most MAX_C = {MAX_C} candidates per row, but got C = {c}; use the torch "
                         "path (the hdecode:: ops switch to it automatically)")
    best_k = torch.ones((b,), dtype=torch.int64, device=q.device)
    delta = torch.empty((b, c), dtype=q.dtype, device=q.device)
    if b == 0 or c == 0:
        return best_k, delta
    w = hf_beta_weights(torch.arange(1, c + 1, device=q.device), depths, r, q.dtype).contiguous()  # (C, E)
    cp = max(16, triton.next_power_of_2(c))
    cc = min(cp, _RANK_CHUNK)
    bk = max(1, min(cp, _RANK_TILE // (cp * cc)))
    with _launch_context(q):
        _hf_beta_best_k_kernel[(b,)](q, q.stride(0), q.stride(1), q.stride(2), count, w, best_k, delta, c, e,
                                     CP=cp, BK=bk, CC=cc, num_warps=4 if cp <= 32 else 8, enable_fp_fusion=False)
    return best_k, delta


# -- hdecode::path_score_best ---------------------------------------------------------------------
#
# One program per row, everything in registers: the leaf prefix sums (tl.cumsum), every node's p
# read from them (tl.gather), p of each parent (tl.gather), v, the Euler tour's prefix sums of
# ±v (tl.gather then tl.cumsum), S and the score of every node, and the selection (two max
# reductions).  Only the B node ids are written.

#: Largest N (nodes) and J (gathered leaves) handled by one program; the Euler tour may have up to
#: 2·MAX_N entries.  Larger trees use the torch path.
MAX_N = 4096


@triton.jit
def _path_score_best_kernel(X, stride_xb, stride_xm, SRC, HI, LO, PARENT, ALPHA, BETA, ESRC, SIGN, AT, GAMMA,
                            DELTA, ALLOWED, RANK, OUT, J, N, T, HIGHER: tl.constexpr, JP: tl.constexpr,
                            NP: tl.constexpr, TP: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = _weighted_prefix(X + row * stride_xb, stride_xm, SRC, SRC, J, False, JP)
    n = tl.arange(0, NP)
    live = n < N
    p = _range_sum(c, HI, LO, n, N, True)
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
    if not HIGHER:
        score = -score
    # NaN and the worst infinity are never chosen (NaN > -inf is false)
    ok = live & (tl.load(ALLOWED + n, mask=live, other=0) != 0) & (score > float("-inf"))
    score = tl.where(ok, score, float("-inf"))
    hit = ok & (score == tl.max(score, axis=0))
    key = tl.where(hit, tl.load(RANK + n, mask=live, other=0), _INT64_MIN)
    first = tl.min(tl.where(hit & (key == tl.max(key, axis=0)), n, NP), axis=0).to(tl.int64)
    tl.store(OUT + row, tl.where(first < NP, first, -1))


def fits_path_score(num_gathered: int, num_nodes: int, tour: int, device: torch.device | None = None) -> bool:
    """Whether one program holds a row: J, N <= :data:`MAX_N`, T <= 2·MAX_N, and on a CUDA
    ``device`` the largest gathered table (float64) fits the shared memory a block may use."""
    if max(num_gathered, num_nodes) > MAX_N or tour > 2 * MAX_N:
        return False
    if device is None or device.type != "cuda":
        return True
    widest = max(16, triton.next_power_of_2(max(num_gathered, num_nodes, tour, 1)))
    return 8 * widest + 4096 <= _shared_memory(device)


def path_score_best_triton(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor,
                           parent: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor,
                           sign: torch.Tensor, at: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor,
                           allowed: torch.Tensor, rank: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """Triton kernel of ``hdecode::path_score_best`` (same arguments and result; see
    :func:`hdecode_torch.kernels.fused.path_score_best`).  Indices are not range-checked here.

    x: (B, M) float, any strides (read in place).  Returns (B,) int64; only these B integers are written.
    """
    check_path_score_best_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed,
                               rank)
    b, j, n, t = x.shape[0], src.shape[0], hi.shape[0], euler_src.shape[0]
    if not fits_path_score(j, n, t, x.device):
        raise ValueError(f"Expected J, N <= MAX_N = {MAX_N} and at most {2 * MAX_N} tour entries, but got J = {j}, "
                         f"N = {n}, {t} entries; use the torch path (the hdecode:: ops switch to it automatically)")
    out = torch.full((b,), -1, dtype=torch.int64, device=x.device)
    if b == 0 or n == 0:
        return out
    jp, np_, tp = (max(16, triton.next_power_of_2(v)) for v in (j, n, t))
    widest = max(jp, np_, tp)
    num_warps = 4 if widest <= 1024 else 8 if widest <= 4096 else 16
    with _launch_context(x):
        _path_score_best_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta,
            allowed.view(torch.uint8), rank, out, j, n, t, HIGHER=bool(higher_is_better), JP=jp, NP=np_, TP=tp,
            num_warps=num_warps, enable_fp_fusion=False)
    return out
