"""Triton kernel of ``hdecode::jaccard_sets``: the whole solver of a row in one program, one launch.

A program takes rows ``pid, pid + P, ...`` (P programs, as many as the memory budget gives scratch
tables for, at most B and :data:`MAX_PROGRAMS`) and, for each, runs the steps of the torch
implementation on the row alone:

1. the gains g_k(i) of its candidates (C × K, K = C), each a sum over the leaf depths in order of
   rounded products (FMA contraction is off), -inf where k ≤ d(i), written to the program's scratch
   table; lb raised to the best closed prefix at k̂ − 3..k̂ + 3 (``closed_prefix_bound``: each column's
   smallest gain at k̂ over its ancestors by pairwise comparison, its rank by pairwise comparison, ties
   by column, and the prefix sums added in rank order, as the torch implementation's cumulative sum);
   then -inf where the node bound p(i) + mass_abs ≥ τ_k(i)·lb·(1 − mass_rel) fails (the root always
   allowed);
2. the size screen: min(the Lagrangian top-k bound, G(k)) against lb, λ_k the gain at k of the
   candidate ranked k-th by its gain at ``k_ref`` (ranks by pairwise comparison, ties by column);
3. the preorder knapsack F(i, j) = max(g_i + F(i + 1, j − 1), F(nxt(i), j)) of each size kept,
   one position at a time with all j of a tile at once, its table in the program's scratch;
4. the smallest kept size within float64 rounding of the best value (the row's own slacks, from its
   count: ``row_slacks``), whose knapsack is run again
   and walked forward from the root (take v_i iff taking it is at least as good as not).

Exactness and ties: every knapsack value is computed by the same float64 operations, in the same
order, as the torch implementation, and the choice between sizes is the same formula; the gains are
where the two differ, as the torch implementation's come from a matrix product whose summation order
its BLAS chooses.  The size screen is a bound, not a tie rule: a size it drops cannot be within
rounding of the best (its value is below lb ≤ the optimum by more than the slack), so dropping fewer
or more such sizes changes nothing.  A row whose bound rules every size out (no mass) gets no column.

Work per row O(C·K·E) for the gains, O(C²) for the ancestors' minima and the ranks, O(C·k) per knapsack of a kept size;
scratch per program (2C + 2)·K float64 and 2C int64.  No host read, no atomics; the launcher runs a
few small tree- and size-only torch operations (the weight tables) and one launch, whatever B.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import _triton as T
from . import check_args, gain_weights

__all__ = ["MAX_PROGRAMS", "launch", "scratch_bytes_per_program"]

#: Widest tile of candidates (rows of the gain table) and of sizes / knapsack columns at a time.
_CB = 32
_KB = 64
#: Most programs of a launch: beyond what a GPU keeps resident more programs only queue, and each
#: holds its own scratch tables; rows are dealt round-robin, each solved alone (no effect on results).
MAX_PROGRAMS = 4096


@triton.jit
def _gain_tile(qrow, sqc, sqe, W, i, live_i, k, live_k, d_i, K, E, KB: tl.constexpr, CB: tl.constexpr):
    # (CB, KB) S1 + d·S2 at m = k + 1 − d (k here is size − 1), -inf where m < 1; sums over e in order
    m = (k[None, :] + 1) - d_i[:, None]
    ok = live_i[:, None] & live_k[None, :] & (m >= 1)
    s1 = tl.zeros((CB, KB), tl.float64)
    s2 = tl.zeros((CB, KB), tl.float64)
    e = tl.full((), 0, tl.int32)
    while e < E:
        qe = tl.load(qrow + i * sqc + e * sqe, mask=live_i, other=0.0)
        w1 = tl.load(W + (m - 1) * E + e, mask=ok, other=0.0)
        w2 = tl.load(W + (K + m - 1) * E + e, mask=ok, other=0.0)
        s1 = s1 + qe[:, None] * w1
        s2 = s2 + qe[:, None] * w2
        e += 1
    g = s1 + d_i.to(tl.float64)[:, None] * s2
    return tl.where(ok, g, float("-inf"))


@triton.jit
def _knapsack(G, F, NX, cnt, k, K, KB: tl.constexpr):
    """Fill F(i, j), i = cnt..1, j < k, of size k (row stride K); returns g_0 + F(1, k − 1)."""
    lanes = tl.arange(0, KB)
    j0 = tl.full((), 0, tl.int32)
    while j0 < k:
        jj = j0 + lanes
        tl.store(F + cnt * K + jj, tl.where(jj == 0, 0.0, float("-inf")), mask=jj < k)
        j0 += KB
    tl.debug_barrier()
    i = cnt - 1
    while i >= 1:
        g = tl.load(G + i * K + k - 1)
        nx = tl.load(NX + i)
        j0 = tl.full((), 0, tl.int32)
        while j0 < k:
            jj = j0 + lanes
            live = jj < k
            prev = tl.load(F + (i + 1) * K + jj - 1, mask=live & (jj >= 1), other=float("-inf"))
            take = prev + g
            skip = tl.load(F + nx * K + jj, mask=live, other=float("-inf"))
            new = tl.where(jj == 0, 0.0, tl.where(take >= skip, take, skip))
            tl.store(F + i * K + jj, new, mask=live)
            j0 += KB
        tl.debug_barrier()
        i -= 1
    return tl.load(G + k - 1) + tl.load(F + K + k - 1)


@triton.jit
def _jaccard_sets_kernel(Q, sqb, sqc, sqe, IDS, COUNT, LB, KREF, PRE, END, DEPTH, DMIN1, W, COVER,
                         OUT, FS, IS, B, C, E, SCAL, CB: tl.constexpr, KB: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # float64 scalars from a tensor: a Python float argument would be an fp32 one on CUDA
    max_depth = tl.load(SCAL)
    keep_rel = tl.load(SCAL + 1)
    mass_rel = tl.load(SCAL + 2)
    mass_abs = tl.load(SCAL + 3)
    u64 = tl.load(SCAL + 4)
    K = C
    fs = FS + pid.to(tl.int64) * ((2 * C + 2) * K)
    G = fs  # (C, K) gains
    F = fs + C * K  # (C + 1, K) knapsack values
    V = F + (C + 1) * K  # (K,) the value of each size, -inf where dropped
    NX = IS + pid.to(tl.int64) * (2 * C)  # (C,) nxt(i)
    ORD = NX + C  # (C,) the column ranked r-th
    ci = tl.arange(0, CB)
    kl = tl.arange(0, KB)
    row = pid.to(tl.int64)
    while row < B:
        qrow = Q + row * sqb
        cnt = tl.minimum(tl.load(COUNT + row), C).to(tl.int32)  # the op checks 0 <= count <= C
        lb = tl.load(LB + row)
        # the row's own rounding slacks (row_slacks: the same exact integers and roundings)
        slack_v = 2.0 * ((cnt + E + 16).to(tl.float64) * u64 + mass_rel)
        slack_up = 1.0 + slack_v
        slack_down = 1.0 - 2.0 * (cnt + E + 16).to(tl.float64) * u64  # the tie rule's: without mass_rel
        slack_abs = (4 * cnt).to(tl.float64) * mass_abs
        # 1. nxt(i) (the first position after v_i's subtree: the candidates whose preorder position
        # is below v_i's subtree end), and the gains with the node bound
        i0 = tl.full((), 0, tl.int32)
        while i0 < cnt:
            i = i0 + ci
            live_i = i < cnt
            node = tl.load(IDS + row * C + i, mask=live_i, other=0)
            stop = tl.load(END + node, mask=live_i, other=0)
            nx = tl.zeros((CB,), tl.int32)
            j0 = tl.full((), 0, tl.int32)
            while j0 < cnt:
                j = j0 + ci
                nj = tl.load(IDS + row * C + j, mask=j < cnt, other=0)
                pj = tl.load(PRE + nj, mask=j < cnt, other=0)
                nx += tl.sum(((j[None, :] < cnt) & (pj[None, :] < stop[:, None])).to(tl.int32), axis=1)
                j0 += CB
            tl.store(NX + i, nx, mask=live_i)
            d_i = tl.load(DEPTH + node, mask=live_i, other=0)
            k0 = tl.full((), 0, tl.int32)
            while k0 < K:
                k = k0 + kl
                live_k = k < K
                g = _gain_tile(qrow, sqc, sqe, W, i, live_i, k, live_k, d_i, K, E, KB, CB)
                tl.store(G + i[:, None] * K + k[None, :], g, mask=live_i[:, None] & live_k[None, :])
                k0 += KB
            i0 += CB
        tl.debug_barrier()
        # 1b. lb raised to the best closed prefix at k̂ − 3..k̂ + 3 (closed_prefix_bound): each column's
        # smallest gain at k̂ along its root path (in V), the order by it (in ORD), the prefix sums in it
        kp = tl.maximum(tl.minimum(tl.load(KREF + row), cnt), 1).to(tl.int32) - 1
        i0 = tl.full((), 0, tl.int32)
        while i0 < cnt:
            i = i0 + ci
            live_i = i < cnt
            low = tl.full((CB,), float("inf"), tl.float64)
            j0 = tl.full((), 0, tl.int32)
            while j0 < cnt:
                j = j0 + ci
                live_j = j < cnt
                kj = tl.load(G + j * K + kp, mask=live_j, other=float("inf"))
                nj = tl.load(NX + j, mask=live_j, other=0)
                anc = live_j[None, :] & (j[None, :] <= i[:, None]) & (nj[None, :] > i[:, None])
                low = tl.minimum(low, tl.min(tl.where(anc, kj[None, :], float("inf")), axis=1))
                j0 += CB
            tl.store(V + i, low, mask=live_i)
            i0 += CB
        tl.debug_barrier()
        i0 = tl.full((), 0, tl.int32)
        while i0 < cnt:
            i = i0 + ci
            live_i = i < cnt
            li = tl.load(V + i, mask=live_i, other=float("-inf"))
            rank = tl.zeros((CB,), tl.int32)
            j0 = tl.full((), 0, tl.int32)
            while j0 < cnt:
                j = j0 + ci
                lj = tl.load(V + j, mask=j < cnt, other=float("-inf"))
                ahead = (lj[None, :] > li[:, None]) | ((lj[None, :] == li[:, None]) & (j[None, :] < i[:, None]))
                rank += tl.sum(((j[None, :] < cnt) & ahead).to(tl.int32), axis=1)
                j0 += CB
            tl.store(ORD + rank, i, mask=live_i)
            i0 += CB
        tl.debug_barrier()
        sl = tl.arange(0, 8)
        ks = tl.maximum(tl.minimum(tl.load(KREF + row) + (sl - 3), cnt), 1).to(tl.int32)
        sums = tl.zeros((8,), tl.float64)
        r = tl.full((), 0, tl.int32)
        while r < cnt:
            at = tl.load(ORD + r)
            sums += tl.load(G + at * K + ks - 1, mask=(sl < 7) & (r < ks), other=0.0)
            r += 1
        prefix = tl.max(tl.where(sl < 7, sums, float("-inf")), axis=0)
        prefix = tl.where(cnt > 0, prefix, float("-inf"))
        lb = tl.maximum(lb, prefix * (1.0 - slack_v / 2) - slack_abs / 2)
        scale = lb * keep_rel
        # 1c. the node bound p(i) + mass_abs ≥ τ_k(i)·lb·(1 − mass_rel) on the gains (the root always allowed)
        i0 = tl.full((), 0, tl.int32)
        while i0 < cnt:
            i = i0 + ci
            live_i = i < cnt
            node = tl.load(IDS + row * C + i, mask=live_i, other=0)
            dmin = tl.minimum(tl.load(DMIN1 + node, mask=live_i, other=0.0), max_depth + 1.0)
            pv = tl.zeros((CB,), tl.float64)
            e = tl.full((), 0, tl.int32)
            while e < E:
                pv = pv + tl.load(qrow + i * sqc + e * sqe, mask=live_i, other=0.0)
                e += 1
            k0 = tl.full((), 0, tl.int32)
            while k0 < K:
                k = k0 + kl
                live = live_i[:, None] & (k < K)[None, :]
                g = tl.load(G + i[:, None] * K + k[None, :], mask=live, other=float("-inf"))
                kf = (k + 1).to(tl.float64)
                tau = tl.maximum(kf[None, :], dmin[:, None]) / (2 * kf[None, :] + max_depth - 1)
                allowed = ((pv + mass_abs)[:, None] >= tau * scale) | (i == 0)[:, None]
                tl.store(G + i[:, None] * K + k[None, :], tl.where(allowed, g, float("-inf")), mask=live)
                k0 += KB
            i0 += CB
        tl.debug_barrier()
        # 2. ranks by the gain at k_ref (larger first, then smaller column), the column of each rank
        kr = tl.minimum(tl.maximum(tl.load(KREF + row), 1), K).to(tl.int32) - 1
        i0 = tl.full((), 0, tl.int32)
        while i0 < cnt:
            i = i0 + ci
            live_i = i < cnt
            gi = tl.load(G + i * K + kr, mask=live_i, other=float("-inf"))
            rank = tl.zeros((CB,), tl.int32)
            j0 = tl.full((), 0, tl.int32)
            while j0 < cnt:
                j = j0 + ci
                gj = tl.load(G + j * K + kr, mask=j < cnt, other=float("-inf"))
                ahead = (gj[None, :] > gi[:, None]) | ((gj[None, :] == gi[:, None]) & (j[None, :] < i[:, None]))
                rank += tl.sum(((j[None, :] < cnt) & ahead).to(tl.int32), axis=1)
                j0 += CB
            tl.store(ORD + rank, i, mask=live_i)
            i0 += CB
        tl.debug_barrier()
        # the bound of each size, and V(k) of the sizes it keeps
        best = tl.full((), float("-inf"), tl.float64)
        k0 = tl.full((), 0, tl.int32)
        while k0 < cnt:
            k = k0 + kl
            live_k = k < cnt
            kf = (k + 1).to(tl.float64)
            at = tl.load(ORD + k, mask=live_k, other=0)
            lam = tl.load(G + at * K + k, mask=live_k, other=0.0)
            lam = tl.maximum(lam, 0.0)
            ub = tl.zeros((KB,), tl.float64)
            i = tl.full((), 0, tl.int32)
            while i < cnt:
                ub += tl.maximum(tl.load(G + i * K + k, mask=live_k, other=0.0) - lam, 0.0)
                i += 1
            ub += lam * kf
            root = tl.zeros((KB,), tl.float64)
            e = tl.full((), 0, tl.int32)
            while e < E:
                root += tl.load(qrow + e * sqe) * tl.load(COVER + k * E + e, mask=live_k, other=0.0)
                e += 1
            ub = tl.minimum(ub, root)
            spread = slack_v * (max_depth + 1.0) / kf + slack_abs
            keep = live_k & (ub * slack_up + spread >= lb)
            tl.store(V + k, tl.full((KB,), float("-inf"), tl.float64), mask=live_k)
            # the kept sizes of this tile, one knapsack each
            t = tl.full((), 0, tl.int32)
            while t < KB:
                if tl.sum(tl.where(kl == t, keep.to(tl.int32), 0), axis=0) > 0:
                    size = k0 + t + 1
                    v = _knapsack(G, F, NX, cnt, size, K, KB)
                    tl.store(V + size - 1, v)
                    best = tl.maximum(best, v)
                t += 1
            k0 += KB
        tl.debug_barrier()
        # 3. the smallest kept size within rounding of the best (none: no column)
        kbest = tl.full((), 0, tl.int32)
        k = tl.full((), 1, tl.int32)
        while k <= cnt:
            v = tl.load(V + k - 1)
            hit = (kbest == 0) & (v > float("-inf")) & (v >= best * slack_down - slack_abs)
            kbest = tl.where(hit, k, kbest)
            k += 1
        c0 = tl.full((), 0, tl.int32)
        while c0 < C:
            tl.store(OUT + row * C + c0 + ci, tl.zeros((CB,), tl.int8), mask=c0 + ci < C)
            c0 += CB
        if kbest > 0:
            _knapsack(G, F, NX, cnt, kbest, K, KB)
            tl.store(OUT + row * C, tl.full((), 1, tl.int8))
            left = kbest - 1
            pos = tl.full((), 1, tl.int32)
            i = tl.full((), 1, tl.int32)
            while i < cnt:
                if i == pos:
                    nx = tl.load(NX + i)
                    take = tl.load(F + (i + 1) * K + left - 1, mask=left >= 1, other=float("-inf")) + \
                        tl.load(G + i * K + kbest - 1)
                    skip = tl.load(F + nx * K + left, mask=left >= 1, other=float("inf"))
                    t = (left >= 1) & (take >= skip)
                    tl.store(OUT + row * C + i, t.to(tl.int8))
                    left = tl.where(t, left - 1, left)
                    pos = tl.where(t, i + 1, nx)
                i += 1
        tl.debug_barrier()
        row += nprog


def scratch_bytes_per_program(c: int) -> int:
    """Bytes of scratch one program uses for candidate tables of width ``c``."""
    return 8 * ((2 * c + 2) * c + 2 * c)


def launch(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget):
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.jaccard_sets` (same arguments and result;
    ``count`` is not range-checked here)."""
    check_args(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    bsz, c, num_e = q.shape
    dev = q.device
    out = torch.zeros(bsz, c, dtype=torch.bool, device=dev)
    if bsz == 0 or c == 0:
        return out
    u64 = torch.finfo(torch.float64).eps / 2
    kmax = c
    kf = torch.arange(1, kmax + 1, device=dev, dtype=torch.float64)
    w = gain_weights(depths, kmax, torch.float64).contiguous()  # (2K, E)
    cover = (torch.minimum(kf[:, None], depths + 1) / torch.maximum(kf[:, None], depths + 1)).contiguous()
    scal = torch.tensor([float(max_depth), 1 - float(mass_rel), float(mass_rel), float(mass_abs), u64],
                        dtype=torch.float64, device=dev)
    programs = max(1, min(bsz, MAX_PROGRAMS, int(budget) // scratch_bytes_per_program(c)))
    fs = torch.empty(programs * (2 * c + 2) * c, dtype=torch.float64, device=dev)
    iscr = torch.empty(programs * 2 * c, dtype=torch.int32, device=dev)
    with T.launch_context(q):
        _jaccard_sets_kernel[(programs,)](
            q, q.stride(0), q.stride(1), q.stride(2), ids.contiguous(), count, lb, k_ref, pre, end, depth, dmin1,
            w, cover, out.view(torch.int8), fs, iscr, bsz, c, num_e, scal,
            CB=min(T.padded(c), _CB), KB=min(T.padded(c), _KB), num_warps=4, enable_fp_fusion=False)
    return out
