"""Ancestors and lowest common ancestors from the ancestors-by-depth table (no N x L matrix)."""

from __future__ import annotations

import torch

__all__ = ["lca_depth", "lca", "ancestor_closure", "ancestor_mask", "argbest"]


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


def argbest(h, values: torch.Tensor, higher_is_better: bool, mask: torch.Tensor | None = None,
            prefer_deep: bool = True, ids: torch.Tensor | None = None) -> torch.Tensor:
    """Best entry per column of a node-major score table, with deterministic ties.

    values: (K, B) float scores; ``ids``: (K, B) int64 node id of each entry (default: row
    ``k`` is node ``k``, e.g. K = N for all nodes or K = L for the leaves); mask: optional
    (K, B) bool of allowed entries.  Among exactly tied best scores the deepest node wins
    (unless ``prefer_deep=False``), then the smallest id.  Returns (B,) int64 *node ids*.
    """
    v = values if higher_is_better else -values
    if mask is not None:
        v = v.masked_fill(~mask, float("-inf"))
    best = v.max(dim=0, keepdim=True).values
    n = h.num_nodes
    if ids is None:
        ids = torch.arange(values.shape[0], device=values.device)[:, None].expand_as(values)
    key = (h.depth[ids] * n if prefer_deep else 0) + (n - 1 - ids)  # deeper first, then smaller id
    key = torch.where(v == best, key, torch.full_like(key, -1))
    pos = key.argmax(dim=0, keepdim=True)
    return ids.gather(0, pos)[0]
