"""Ancestors and lowest common ancestors from the ancestors-by-depth table (no N x L matrix)."""

from __future__ import annotations

import torch

__all__ = ["lca_depth", "lca", "ancestor_closure", "ancestor_mask", "path_counts"]


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


def path_counts(h, sets: torch.Tensor, leaves: torch.Tensor) -> torch.Tensor:
    """|sets[b] ∩ A(leaves[b])|: how many nodes of each set lie on its leaf's root path.

    sets: (B, N) bool; leaves: (B,) int64.  Returns (B,) int64.
    """
    padded = torch.cat([sets, sets.new_zeros(sets.shape[0], 1)], 1)
    return padded.gather(1, h.ancestors[leaves]).sum(1)
