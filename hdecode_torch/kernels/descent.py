"""One step down the tree for every sample at once: the children of each sample's current node.

Rules that walk from the root (``top_down``, ``plurality``) only ever look at the children of
B current nodes, never at all N.  A step at depth d reads a (B, K_d) window of the children
CSR, K_d the widest node at depth d, so a whole descent reads B·Σ_d K_d entries, far fewer than
B·N on the trees classifiers use, with no host sync.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["widest_by_depth", "children_window", "children_probs"]


def widest_by_depth(h) -> list[int]:
    """K_d, the largest number of children of a node at depth d, for d = 0..D (cached)."""
    def build():
        t = h._tree
        widest = np.zeros(h.max_depth + 1, dtype=np.int64)
        np.maximum.at(widest, t.depth, t.children_ptr[1:] - t.children_ptr[:-1])
        return widest.tolist()
    return h.cached("widest_by_depth", build)


def children_window(h, nodes: torch.Tensor, depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The children of ``nodes`` (B,) int64, all at depth ``depth`` or leaves.

    Returns ``(kids, valid)``, both (B, max(K_d, 1)): the children in increasing id order,
    left-packed, and which entries are real (a leaf's row is all invalid; invalid entries hold
    a valid id).  At least one column, so reductions over a row are always defined.
    """
    width = max(widest_by_depth(h)[depth], 1)
    start = h.children_ptr[nodes]
    degree = h.children_ptr[nodes + 1] - start
    offset = torch.arange(width, device=nodes.device)
    valid = offset[None, :] < degree[:, None]
    pos = (start[:, None] + offset[None, :]).clamp(max=max(h.children.numel() - 1, 0))
    return h.children[pos], valid


def children_probs(h, p: torch.Tensor, nodes: torch.Tensor, depth: int):
    """:func:`children_window` plus the children's probabilities for their own sample.

    p: (N, B) node-major node probabilities; nodes: (B,) the current node of each sample.
    Returns ``(kids, valid, pk)``: pk (B, K) float, -inf on invalid entries.
    """
    kids, valid = children_window(h, nodes, depth)
    cols = torch.arange(nodes.shape[0], device=nodes.device)[:, None]
    return kids, valid, p[kids, cols].masked_fill(~valid, float("-inf"))
