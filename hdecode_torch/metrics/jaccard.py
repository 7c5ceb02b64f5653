"""Jaccard index of ancestor-closed node sets: |h⁺ ∩ y⁺| / |h⁺ ∪ y⁺|.

Expected value of a closed set of size k: Σ_l p(l) c(l) / (k + d(l) + 1 − c(l)), c(l) = |h⁺ ∩ A(l)|
counted down the root path (one root-path sum).
"""

from __future__ import annotations

import torch

from ..kernels.tree_sums import path_sum
from .base import SetMetric

__all__ = ["Jaccard", "jaccard_from_counts", "jaccard_expected"]


def jaccard_from_counts(inter, size, ysize):
    return inter / (size + ysize - inter)


def jaccard_expected(post, sets: torch.Tensor) -> torch.Tensor:
    """(B,) expected Jaccard index of closed sets (B, N) bool."""
    h = post.h
    counts = path_sum(h, sets.t().to(post.dtype))[: h.num_leaves]  # (L, B)
    k = sets.sum(1).to(post.dtype)
    ysize = (h.leaf_depth.to(post.dtype) + 1)[:, None]
    return (post.probs.t() * counts / (k[None, :] + ysize - counts)).sum(0)


class Jaccard(SetMetric):
    """Jaccard index |h⁺ ∩ y⁺| / |h⁺ ∪ y⁺|."""

    name = "jaccard"
    higher_is_better = True
    has_decoder = False
    description = "Jaccard index |h+ & y+| / |h+ | y+| of ancestor-closed sets"

    def _from_counts(self, inter, size, ysize):
        return jaccard_from_counts(inter, size, ysize)

    def _expected_sets(self, post, sets):
        return jaccard_expected(post, sets)
