"""Leaf metrics: top-1 accuracy and the LCA height (mistake severity of Karthik et al.)."""

from __future__ import annotations

import torch

from ..kernels.ancestry import argbest, lca
from ..kernels.tree_sums import path_sum
from .base import NodeMetric
from .posterior import Posterior

__all__ = ["Accuracy", "LCAHeight"]


class Accuracy(NodeMetric):
    """1 if the predicted node is the target leaf, else 0."""

    name = "accuracy"
    kind = "leaf"
    higher_is_better = True
    description = "1 if the predicted leaf is the target (top-1 accuracy)"

    def _values(self, h, pred, target):
        return (pred == target).to(torch.float64)

    def _decode(self, post: Posterior) -> torch.Tensor:
        """argmax leaf (ties: smallest id)."""
        return post.probs.argmax(dim=1)

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """(N, B): p(n) on leaves, 0 on internal nodes."""
        out = post.node.clone()
        out[post.h.num_leaves:] = 0
        return out


class LCAHeight(NodeMetric):
    """height(LCA(h, y)): 0 for a correct leaf, larger for mistakes that split higher up."""

    name = "lca_height"
    kind = "leaf"
    higher_is_better = False
    description = "height of LCA(prediction, target), Karthik et al. 2021 (lower is better)"

    def _values(self, h, pred, target):
        return h.height[lca(h, pred, target)].to(torch.float64)

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """(N, B) ``Σ_j height(a_j) (p(a_j) - p(a_{j+1})) + height(h) p(h)`` over h's root path a_0..a_k = h:
        the mass that splits off the path at a_j has its LCA with h at a_j."""
        height = post.h.height.to(post.dtype)
        return _split_sums(post) + height[:, None] * post.node

    def _decode(self, post: Posterior) -> torch.Tensor:
        """The leaf of least expected LCA height (Karthik et al.'s CRM), exactly; ties: the deeper
        leaf, then the smallest id (the node rule)."""
        h = post.h
        return argbest(h, _split_sums(post)[: h.num_leaves], higher_is_better=False)  # height(leaf) = 0


def _split_sums(post: Posterior) -> torch.Tensor:
    """(N, B) ``Σ_{j < k} height(a_j) (p(a_j) − p(a_{j+1}))`` along each node's root path."""
    h, p = post.h, post.node
    height = h.height.to(p.dtype)
    par = h.parent_or_root  # the root's own term is then 0
    # index_select: 25% faster on CPU than advanced indexing for whole-row gathers
    return path_sum(h, height.index_select(0, par)[:, None] * (p.index_select(0, par) - p))
