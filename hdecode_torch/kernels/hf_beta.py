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


def hf_beta_bound(h, beta: float) -> torch.Tensor:
    """(N,) float64 lower bound on p(n) for n to belong to an optimal hF_β set (SPEC §4.3)."""
    def build():
        big_d = float(h.max_depth)
        b2 = beta * beta
        return (h.min_leaf_depth.to(torch.float64) + 1) / ((big_d + 1) * (1 + b2 * (big_d + 1)))
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
    # Candidates in (depth, id) order, so a stable sort keeps ancestors first among ties.
    order = h.cached("depth_order", lambda: torch.sort(h.depth * h.num_nodes + torch.arange(h.num_nodes, device=h.depth.device)).indices)
    pos, valid = compact(keep[order], fill=h.num_nodes)
    ids = torch.where(valid, order[pos.clamp(max=h.num_nodes - 1)], torch.full_like(pos, h.num_nodes))
    c = ids.shape[0]
    q_ext = torch.cat([q, q.new_zeros(1, q.shape[1], bsz)])
    qc = q_ext[ids, :, torch.arange(bsz, device=p.device)[None, :]]  # (C, B, E)
    e = leaf_depths.to(dt)
    b2 = beta * beta
    out = torch.zeros(bsz, h.num_nodes + 1, dtype=torch.bool, device=p.device)
    best_val = torch.full((bsz,), -1.0, dtype=dt, device=p.device)
    best_k = torch.ones(bsz, dtype=torch.long, device=p.device)
    best_rank = torch.zeros(c, bsz, dtype=torch.long, device=p.device)
    count = valid.sum(0)
    # Blocks of k bound the (K, C, B) temporaries by the memory budget.
    per_k = max(1, c * bsz * (dt.itemsize * 3 + 8))
    block = max(1, get_memory_budget() // per_k)
    ks_all = torch.arange(1, c + 1, device=p.device, dtype=dt)
    # Any closed set of size k scores at most UB(k) = Σ_e Q_e(root)(1+β²)(e+1)/(k+β²(e+1)),
    # since |S ∩ A(l)| ≤ d(l)+1; UB decreases in k, so once UB(k) is below every sample's best
    # score no larger k can win and the loop stops (one host sync per block of k).
    root_mass = q[h.root]  # (E, B)
    starts = [0] + list(range(min(16, c), c, block))  # a small first block gives a good lower bound early
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else c
        if start > 0:
            k_next = float(start + 1)
            ub = ((1 + b2) * (e[:, None] + 1) / (k_next + b2 * (e[:, None] + 1)) * root_mass).sum(0)
            if bool((ub < best_val).all()):
                break
        ks = ks_all[start:stop]  # (K,)
        w = (1 + b2) / (ks[:, None] + b2 * (e[None, :] + 1))  # (K, E)
        delta = torch.einsum("cbe,ke->kcb", qc, w)  # (K, C, B)
        delta = delta.masked_fill(~valid[None], float("-inf"))
        srt, idx = torch.sort(delta, dim=1, descending=True, stable=True)
        csum = srt.clamp(min=0).cumsum(1)  # -inf padding sits after every valid entry
        kk = ks.long() - 1
        val = csum.gather(1, kk[:, None, None].expand(-1, 1, bsz))[:, 0]  # (K, B)
        val = torch.where(ks.long()[:, None] <= count[None, :], val, torch.full_like(val, -1.0))
        top_val, top_i = val.max(0)  # first max: smallest k in the block
        better = top_val > best_val
        best_val = torch.where(better, top_val, best_val)
        best_k = torch.where(better, ks.long()[top_i], best_k)
        rank_of = idx[top_i, :, torch.arange(bsz, device=p.device)].t()  # (C, B) sorted order for the best k
        best_rank = torch.where(better[None, :], rank_of, best_rank)
    take = torch.arange(c, device=p.device)[:, None] < best_k[None, :]
    chosen = torch.where(take, ids.gather(0, best_rank), torch.full_like(ids, h.num_nodes))
    out.scatter_(1, chosen.t(), True)
    return out[:, : h.num_nodes]
