"""Ancestors and lowest common ancestors from the ancestors-by-depth table (no N x L matrix)."""

from __future__ import annotations

import torch

__all__ = ["argbest_pairs", "lca_depth", "lca", "ancestor_closure", "ancestor_mask", "argbest"]


def lca_depth(h, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Depth of LCA(a, b).  a, b: broadcastable int64 node ids.  Returns int64, their broadcast shape.

    Root paths agree on a prefix, so the LCA depth is the length of that prefix minus one.
    """
    anc_a = h.ancestors[a]
    anc_b = h.ancestors[b]
    same = (anc_a == anc_b) & (anc_a < h.num_nodes)
    return same.sum(-1) - 1


def lca(h, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """LCA(a, b) node ids, int64, broadcast shape of ``a`` and ``b``."""
    a, b = torch.broadcast_tensors(a, b)
    d = lca_depth(h, a, b)
    return h.ancestors[a].gather(-1, d.unsqueeze(-1)).squeeze(-1)


def ancestor_mask(h, nodes: torch.Tensor) -> torch.Tensor:
    """nodes: (B,) int64 -> (B, N) bool with True on A(node) (the node and its ancestors)."""
    out = torch.zeros(nodes.shape[0], h.num_nodes + 1, dtype=torch.bool, device=nodes.device)
    out.scatter_(1, h.ancestors[nodes], True)
    return out[:, : h.num_nodes]


def ancestor_closure(h, sets: torch.Tensor) -> torch.Tensor:
    """sets: (B, N) bool -> (B, N) bool, ``∪_{n ∈ set} A(n)`` (the root is added when the set is non-empty)."""
    from .tree_sums import subtree_sum

    counts = subtree_sum(h, sets.t().to(torch.int32))
    return (counts > 0).t()


def _tie_rank(h) -> torch.Tensor:
    """(N,) int64 preference among tied nodes: deeper first, then smaller id (larger is preferred)."""
    n = h.num_nodes
    return h.cached("tie_rank", lambda: h.depth * n + (n - 1 - torch.arange(n, device=h.depth.device)))


def _tie_order(h, k: int) -> torch.Tensor:
    """(k,) int64 the nodes 0..k-1 from most to least preferred among ties (deeper, then smaller id)."""
    return h.cached(("tie_order", k), lambda: torch.argsort(_tie_rank(h)[:k], descending=True))


def argbest(h, values: torch.Tensor, higher_is_better: bool, mask: torch.Tensor | None = None,
            prefer_deep: bool = True, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Best entry per column of a node-major score table, with deterministic ties.

    values: (K, B) float scores; ``ids``: (K, B) int64 node id of each entry (default: row
    ``k`` is node ``k``, e.g. K = N for all nodes or K = L for the leaves); mask: optional
    (K, B) bool of allowed entries.  Among exactly tied best scores the deepest node wins
    (unless ``prefer_deep=False``: then the first row), then the smallest id.  Returns (B,)
    int64 node ids.  No host sync.

    ``max``/``min`` return the first best entry of a column (documented for every backend).
    With rows ``0..K-1`` the rows are read in the order of preference (deepest first, then
    smallest id), so that first entry is already the tie winner: one pass (2.5x faster than
    finding tied columns afterwards, tieredImageNet-H, B = 4000).  With per-column ``ids`` the
    rule runs as two scatter reductions over the entries (:func:`argbest_pairs`).
    """
    fill = float("-inf") if higher_is_better else float("inf")
    v = values if mask is None else values.masked_fill(~mask, fill)
    k, bsz = v.shape
    if prefer_deep and k and ids is not None:
        sample = torch.arange(bsz, device=v.device).repeat(k)
        return argbest_pairs(h, v.reshape(-1), sample, ids.reshape(-1), bsz, higher_is_better)
    if prefer_deep and k:
        order = _tie_order(h, k)
        v = v.index_select(0, order)
        return order[(v.max(dim=0) if higher_is_better else v.min(dim=0)).indices]
    first = (v.max(dim=0) if higher_is_better else v.min(dim=0)).indices
    return first if ids is None else ids.gather(0, first[None])[0]


def argbest_pairs(h, values: torch.Tensor, sample: torch.Tensor, node: torch.Tensor, batch_size: int,
                  higher_is_better: bool) -> torch.Tensor:
    """Best node per sample over a list of (sample, node) candidates, with :func:`argbest`'s ties.

    values, sample, node: (M,) float, int64, int64 (every sample has at least one entry).
    Among exactly tied best values the deepest node wins, then the smallest id.  Returns
    (B,) int64.  No host sync: two scatter reductions.
    """
    v = values if higher_is_better else -values
    best = torch.full((batch_size,), float("-inf"), dtype=v.dtype, device=v.device)
    best = best.scatter_reduce(0, sample, v, "amax")
    n = h.num_nodes
    rank = _tie_rank(h)[node]  # distinct per node: depth * N + (N - 1 - id)
    key = torch.where(v == best[sample], rank, torch.full_like(rank, -1))
    top = torch.full((batch_size,), -1, dtype=torch.long, device=v.device).scatter_reduce(0, sample, key, "amax")
    return torch.where(top >= 0, n - 1 - top % n, torch.full_like(top, h.root))
