"""Exact hF_β set decoding: the paper's decomposition by set size k, with a provably safe pruning.

For an ancestor-closed set S of size k the expected hF_β is Σ_{n ∈ S} Δ_k(n), with
Δ_k(n) = Σ_{l ∈ L(n)} p(l) (1+β²) / (k + β²(d(l)+1)).  Δ_k never increases from a parent to a
child, so the k nodes of largest Δ_k, ancestors first among ties, form a closed set: the best
one of size k.  The optimum is the best over k.

Which nodes can be dropped (SPEC §4.3, correcting the paper's Lemma 4.4):
n ∈ S* ⇒ p(n) ≥ (d_min(n)+1) / ((D+1)(1 + β²(D+1))), d_min(n) the shallowest leaf under n and
D the deepest leaf.  The surviving set Q(p) is ancestor-closed, holds S*, and has at most
(D+1)²(1+β²(D+1)) nodes (each tree level carries mass ≤ 1).
"""

from __future__ import annotations

import torch

from .chunking import get_memory_budget
from .pruning import compact

__all__ = ["hf_beta_bound", "decode_hf_beta"]


def _recall_share(beta: float) -> float:
    """r = 1/(1+β²): hF_β = |h⁺∩y⁺| / (r|h⁺| + (1−r)|y⁺|), finite for every β > 0."""
    return 1.0 / (1.0 + beta * beta)


def hf_beta_bound(h, beta: float) -> torch.Tensor:
    """(N,) float64 lower bound on p(n) for n to belong to an optimal hF_β set (SPEC §4.3)."""
    def build():
        big_d = float(h.max_depth)
        r = _recall_share(beta)
        # (d_min+1) / ((D+1)(1+β²(D+1))), written with r = 1/(1+β²) so a huge β gives no inf/inf.
        return (h.min_leaf_depth.to(torch.float64) + 1) * r / ((big_d + 1) * (r + (1 - r) * (big_d + 1)))
    return h.cached(("hf_beta_bound", beta), build)


def decode_hf_beta(h, p: torch.Tensor, q: torch.Tensor, leaf_depths: torch.Tensor, beta: float) -> torch.Tensor:
    """Optimal hF_β sets.

    p: (N, B) node probabilities; q: (N, E, B) per-leaf-depth masses (q[n, e] = mass of the
    leaves under n at depth ``leaf_depths[e]``); leaf_depths: (E,) int64.  Returns (B, N)
    bool, ancestor-closed.  Ties: among sets of equal expected score the smallest k wins;
    within a k, nodes of equal Δ_k are taken shallowest first, then by smallest id.
    """
    dt = p.dtype
    bsz = p.shape[1]
    if bsz == 0:
        return torch.zeros(0, h.num_nodes, dtype=torch.bool, device=p.device)
    bound = hf_beta_bound(h, beta).to(dt)
    keep = p >= bound[:, None] * (1 - 64 * torch.finfo(dt).eps)  # slack: rounding may only add candidates
    keep[h.root] = True
    # Work is padded to the batch's largest candidate count: samples grouped by count (a loop
    # over a few groups, not over samples) pad far less — measured 1.5-2.3x on tieredImageNet-H.
    groups = min(8, bsz // _MIN_GROUP)
    if groups <= 1:
        return _decode_candidates(h, p, q, keep, torch.arange(bsz, device=p.device), leaf_depths, beta)
    perm = torch.argsort(keep.sum(0))
    out = torch.empty(bsz, h.num_nodes, dtype=torch.bool, device=p.device)
    for cols in torch.tensor_split(perm, groups):
        out[cols] = _decode_candidates(h, p[:, cols], q, keep[:, cols], cols, leaf_depths, beta)
    return out


_MIN_GROUP = 256


def _decode_candidates(h, p, q, keep, cols, leaf_depths, beta):
    """:func:`decode_hf_beta` on the samples ``cols`` (their node probabilities ``p`` (N, B) and
    candidate mask ``keep`` (N, B)); ``q`` is the whole batch's (N, E, B_all) table."""
    dt = p.dtype
    bsz = p.shape[1]
    # Candidates in (depth, id) order, so a stable sort keeps ancestors first among ties.
    order = h.cached("depth_order", lambda: torch.sort(h.depth * h.num_nodes + torch.arange(h.num_nodes, device=h.depth.device)).indices)
    pos, valid = compact(keep[order], fill=h.num_nodes)
    ids = torch.where(valid, order[pos.clamp(max=h.num_nodes - 1)], torch.full_like(pos, h.num_nodes))
    c = ids.shape[0]
    qc = q[ids.clamp(max=h.num_nodes - 1), :, cols[None, :]]  # (C, B, E)
    qc = qc.masked_fill(~valid[:, :, None], 0.0)
    e = leaf_depths.to(dt)
    r = _recall_share(beta)
    out = torch.zeros(bsz, h.num_nodes + 1, dtype=torch.bool, device=p.device)
    best_val = torch.full((bsz,), -1.0, dtype=dt, device=p.device)
    best_k = torch.ones(bsz, dtype=torch.long, device=p.device)
    count = valid.sum(0)
    # Blocks of k bound the (K, C, B) temporaries by the memory budget.
    per_k = max(1, c * bsz * (dt.itemsize * 4 + 8))
    block = max(1, get_memory_budget() // per_k)
    ks_all = torch.arange(1, c + 1, device=p.device, dtype=dt)
    # Which k can still win.  For k ≥ k0, 1/(k + b_e) ≤ 1/(k0 + b_e) · (k0 + b_max)/(k + b_max)
    # (b_e = β²(e+1)), so Δ_k(n) ≤ Δ_k0(n) · (k0 + b_max)/(k + b_max) and any closed set of size k
    # scores at most UB(k) = [sum of the k largest Δ_k0] · (k0 + b_max)/(k + b_max).  After a small
    # first block of k gives each sample a score to beat, the loop stops at the largest k with
    # UB(k) ≥ that score anywhere in the batch (one host sync).
    first = min(32, c)
    b_max = (1 - r) * (h.max_depth + 1)  # the deepest node is a leaf
    starts = [0] + list(range(first, c, block))
    k_stop = c
    for i, start in enumerate(starts):
        stop = min(starts[i + 1] if i + 1 < len(starts) else c, k_stop)
        if start >= stop:
            break
        if start == first:
            w0 = 1 / (first * r + (1 - r) * (e + 1))  # (E,)
            d0 = torch.einsum("cbe,e->cb", qc, w0).masked_fill(~valid, 0.0)
            top = torch.sort(d0, dim=0, descending=True).values.cumsum(0)  # (C, B)
            ub = top * ((first * r + b_max) / (ks_all * r + b_max))[:, None]
            alive = ub >= best_val[None, :] * (1 - 64 * torch.finfo(dt).eps)
            k_stop = int(torch.where(alive, ks_all[:, None].long(), torch.zeros_like(alive, dtype=torch.long)).max())
            stop = min(stop, k_stop)
            if start >= stop:
                break
        ks = ks_all[start:stop]  # (K,)
        w = 1 / (ks[:, None] * r + (1 - r) * (e[None, :] + 1))  # (K, E): (1+β²)/(k+β²(e+1))
        # (K, B, C): candidates last so the per-(k, sample) sort runs over contiguous memory.
        # Only the sum of the top k matters here, so an unstable value sort suffices; the
        # winning set is ordered once, stably, after the loop.
        delta = torch.einsum("cbe,ke->kbc", qc, w)
        delta = delta.masked_fill(~valid.t()[None], float("-inf"))
        srt = torch.sort(delta, dim=2, descending=True).values
        csum = srt.clamp(min=0).cumsum(2)  # -inf padding sits after every valid entry
        kk = ks.long() - 1
        val = csum.gather(2, kk[:, None, None].expand(-1, bsz, 1))[:, :, 0]  # (K, B)
        val = torch.where(ks.long()[:, None] <= count[None, :], val, torch.full_like(val, -1.0))
        top_val, top_i = val.max(0)  # first max: smallest k in the block
        better = top_val > best_val
        best_val = torch.where(better, top_val, best_val)
        best_k = torch.where(better, ks.long()[top_i], best_k)
    # The best set: the best k nodes by Δ_{k*}, ties to the shallower (candidates are in depth order).
    w = 1 / (best_k.to(dt)[:, None] * r + (1 - r) * (e[None, :] + 1))  # (B, E)
    delta = torch.einsum("cbe,be->bc", qc, w).masked_fill(~valid.t(), float("-inf"))
    rank = torch.sort(delta, dim=1, descending=True, stable=True).indices.t()  # (C, B)
    take = torch.arange(c, device=p.device)[:, None] < best_k[None, :]
    chosen = torch.where(take, ids.gather(0, rank), torch.full_like(ids, h.num_nodes))
    out.scatter_(1, chosen.t(), True)
    return out[:, : h.num_nodes]
