"""Top-1 accuracy: 1 if the predicted node is the target leaf, else 0.

Expected value of predicting node n: p(n) if n is a leaf, 0 otherwise.  Optimal decoder: the most
probable leaf (ties: the smallest id, as ``argmax``).  O(B·L).
"""

from __future__ import annotations

import torch

from ..kernels.certificate import certify_best_leaf
from ..kernels.support import support_best_leaf
from .base import NodeMetric

__all__ = ["Accuracy", "accuracy_values", "accuracy_table", "accuracy_decode"]


def accuracy_values(h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """pred, target: int64 node and leaf ids (same shape).  Returns float64 1/0."""
    return (pred == target).to(torch.float64)


def accuracy_table(post) -> torch.Tensor:
    """(N, B): p(n) on the leaves, 0 on internal nodes."""
    out = post.node.clone()
    out[post.h.num_leaves:] = 0
    return out


def accuracy_decode(post) -> torch.Tensor:
    """(B,) int64 argmax leaf, the smallest id among ties."""
    return post.probs.argmax(dim=1)


class Accuracy(NodeMetric):
    """1 if the predicted node is the target leaf, else 0."""

    name = "accuracy"
    kind = "leaf"
    higher_is_better = True
    description = "1 if the predicted leaf is the target (top-1 accuracy)"
    aliases = ("top1",)
    algorithms = {"cpu": "argmax leaf", "gpu": "argmax leaf"}
    oracle, baseline = "reference:accuracy", "benchmarks.baselines:Baselines.accuracy"

    def _values(self, h, pred, target):
        return accuracy_values(h, pred, target)

    def expected_table(self, post):
        return accuracy_table(post)

    def _decode_default(self, post):
        return accuracy_decode(post)

    accepts_topk = True

    def _decode_topk(self, ct):
        return support_best_leaf(ct.h, ct.listed, ct.values, ct.indices, ct.prior)

    def _certify_topk(self, ct, pred):
        return certify_best_leaf(ct.polytope(), ct.values, ct.indices, pred)

    def _expected_topk(self, ct, pred):
        q = ct.node_mass(pred[:, None])[:, 0]  # a leaf's node mass is q(leaf)
        return torch.where(pred < ct.h.num_leaves, q, 0.0)
