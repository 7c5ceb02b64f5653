"""Set metrics: hierarchical F-beta, Hamming loss and Jaccard index of ancestor-closed node sets.

With h⁺ the ancestor closure of the prediction and y⁺ = A(y) (the root counts):
hF_β = (1+β²)|h⁺∩y⁺| / (|h⁺| + β²|y⁺|), Hamming = |h⁺ Δ y⁺| / |y⁺|, Jaccard = |h⁺∩y⁺| / |h⁺∪y⁺|.
"""

from __future__ import annotations

import torch

from ..kernels.tree_sums import path_sum
from ..kernels.validation import check_positive
from ..kernels.closed_forms import hamming_set
from ..kernels.hf_beta import decode_hf_beta
from .base import SetMetric
from .posterior import Posterior

__all__ = ["HFBeta", "Hamming", "Jaccard"]


class HFBeta(SetMetric):
    """Hierarchical F_β score of the predicted set's ancestor closure."""

    name = "hf_beta"
    higher_is_better = True
    description = "hierarchical F-beta of ancestor-closed node sets"

    def __init__(self, hierarchy, beta: float = 1.0, **kw):
        super().__init__(hierarchy, **kw)
        self.beta = check_positive(beta, "beta")

    @property
    def params(self):
        return {"beta": self.beta}

    def _decode(self, post: Posterior) -> torch.Tensor:
        return decode_hf_beta(post.h, post.node, self.beta)

    def _from_counts(self, inter, size, ysize):
        r = 1.0 / (1.0 + self.beta ** 2)  # (1+β²)x/(a+β²b) = x/(ra+(1−r)b): finite for any β
        return inter / (r * size + (1 - r) * ysize)

    def _bytes_per_sample(self, h):
        # (N, B) node sums and masks, float64 prefix sums (L, B), (B, C, E) candidate tables
        return 8 * (2 * h.num_nodes + h.num_leaves) + 64 * h.num_leaf_depths * (h.max_depth + 1)

    def _expected_sets(self, post: Posterior, sets: torch.Tensor) -> torch.Tensor:
        """``Σ_{n ∈ h⁺} Δ_k(n)`` with k = |h⁺| and Δ_k(n) = Σ_{l ∈ L(n)} p(l)(1+β²)/(k + β²(d(l)+1))."""
        # Σ_{n∈h⁺} Δ_k(n) = Σ_l p(l) c(l) w(k, d(l)) with c(l) = |h⁺ ∩ A(l)|: one root-path sum of
        # the sets, no (N, E, B) table.
        h, dt = post.h, post.dtype
        counts = path_sum(h, sets.t().to(dt))[: h.num_leaves]  # (L, B)
        k = sets.sum(1).to(dt)  # (B,)
        r = 1.0 / (1.0 + self.beta ** 2)
        w = 1 / (r * k[None, :] + (1 - r) * (h.leaf_depth.to(dt)[:, None] + 1))  # (L, B)
        return (post.probs.t() * counts * w).sum(0)


class Hamming(SetMetric):
    """Hamming loss |h⁺ Δ y⁺| / |y⁺| (lower is better)."""

    name = "hamming"
    higher_is_better = False
    description = "symmetric difference |h+ xor y+| / |y+| (lower is better)"

    def _decode(self, post: Posterior) -> torch.Tensor:
        return hamming_set(post.h, self.inverse_depth_mass(post))

    def _from_counts(self, inter, size, ysize):
        return (size + ysize - 2 * inter) / ysize

    def inverse_depth_mass(self, post: Posterior) -> torch.Tensor:
        """(N, B) W(n) = Σ_{l ∈ L(n)} p(l) / (d(l) + 1)."""
        h = post.h
        return post.weighted_node("inv_depth", 1.0 / (h.leaf_depth.to(torch.float64) + 1))

    def _expected_sets(self, post: Posterior, sets: torch.Tensor) -> torch.Tensor:
        """``|h⁺| W(root) + 1 − 2 Σ_{n ∈ h⁺} W(n)``."""
        w = self.inverse_depth_mass(post)
        s = sets.to(w.dtype)
        return s.sum(1) * w[post.h.root] + 1 - 2 * torch.einsum("nb,bn->b", w, s)


class Jaccard(SetMetric):
    """Jaccard index |h⁺ ∩ y⁺| / |h⁺ ∪ y⁺|."""

    name = "jaccard"
    higher_is_better = True
    description = "Jaccard index |h+ & y+| / |h+ | y+| of ancestor-closed sets"

    def _from_counts(self, inter, size, ysize):
        return inter / (size + ysize - inter)

    def _expected_sets(self, post: Posterior, sets: torch.Tensor) -> torch.Tensor:
        """``Σ_l p(l) c(l) / (k + d(l) + 1 − c(l))``, c(l) = |h⁺ ∩ A(l)| counted down the root path."""
        h = post.h
        counts = path_sum(h, sets.t().to(post.dtype))[: h.num_leaves]  # (L, B)
        k = sets.sum(1).to(post.dtype)
        ysize = (h.leaf_depth.to(post.dtype) + 1)[:, None]
        return (post.probs.t() * counts / (k[None, :] + ysize - counts)).sum(0)
