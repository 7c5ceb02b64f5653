"""LCA height (Karthik et al. 2021, "No cost likelihood manipulation at test time for making better
mistakes"): height(LCA(h, y)), 0 for a correct leaf, larger for mistakes that split higher up.

Expected value of predicting node h, with a_0 = root, ..., a_k = h its root path: the mass that
leaves the path at a_j (p(a_j) − p(a_{j+1})) has its LCA with h at a_j, so

    E[height(LCA(h, y))] = Σ_{j<k} height(a_j) (p(a_j) − p(a_{j+1})) + height(h) p(h),

one root-path sum, O(B·N), no L×L matrix.  The optimal decoder (Karthik et al.'s CRM) is the leaf
of least expected height, exactly; ties: the deeper leaf, then the smallest id.
"""

from __future__ import annotations

import torch

from ..kernels.ancestry import lca
from ..kernels.selection import argbest
from ..kernels.tree_sums import path_sum
from .base import NodeMetric

__all__ = ["LCAHeight", "lca_height_values", "lca_height_table", "lca_height_decode", "split_sums"]


def lca_height_values(h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return h.height[lca(h, pred, target)].to(torch.float64)


def split_sums(post) -> torch.Tensor:
    """(N, B) ``Σ_{j < k} height(a_j) (p(a_j) − p(a_{j+1}))`` along each node's root path."""
    h, p = post.h, post.node
    height = h.height.to(p.dtype)
    par = h.parent_or_root  # the root's own term is then 0
    # index_select: faster on CPU than advanced indexing for whole-row gathers
    return path_sum(h, height.index_select(0, par)[:, None] * (p.index_select(0, par) - p))


def lca_height_table(post) -> torch.Tensor:
    """(N, B) expected LCA height of predicting each node."""
    return split_sums(post) + post.h.height.to(post.dtype)[:, None] * post.node


def lca_height_decode(post) -> torch.Tensor:
    """(B,) int64 the leaf of least expected LCA height (height(leaf) = 0, so the split sums suffice)."""
    h = post.h
    return argbest(h, split_sums(post)[: h.num_leaves], higher_is_better=False)


class LCAHeight(NodeMetric):
    """height(LCA(h, y)): 0 for a correct leaf, larger for mistakes that split higher up."""

    name = "lca_height"
    kind = "leaf"
    higher_is_better = False
    description = "height of LCA(prediction, target), Karthik et al. 2021 (lower is better)"

    def _values(self, h, pred, target):
        return lca_height_values(h, pred, target)

    def expected_table(self, post):
        return lca_height_table(post)

    def _decode(self, post):
        return lca_height_decode(post)
