"""Hamming loss of ancestor-closed node sets: |h⁺ Δ y⁺| / |y⁺| (lower is better).

With W(n) = Σ_{l ∈ L(n)} p(l)/(d(l)+1), the expected loss of a closed set S is
|S|·W(root) + 1 − 2 Σ_{n ∈ S} W(n): each node adds W(root) − 2 W(n).  The optimal set holds exactly
the nodes with W(n) > W(root)/2; it is ancestor-closed because W decreases down the tree, and holds
the root whenever W(root) > 0 (always, for a distribution).  O(B·N).
"""

from __future__ import annotations

import torch

from .base import SetMetric

__all__ = ["Hamming", "hamming_from_counts", "inverse_depth_mass", "hamming_expected", "hamming_decode"]


def hamming_from_counts(inter, size, ysize):
    return (size + ysize - 2 * inter) / ysize


def inverse_depth_mass(post) -> torch.Tensor:
    """(N, B) W(n) = Σ_{l ∈ L(n)} p(l) / (d(l) + 1)."""
    h = post.h
    # the weights in float64, rounded once to the probabilities' dtype: a tree-only table, cached
    weights = h.cached(("inverse_leaf_depth", post.dtype),
                       lambda: (1.0 / (h.leaf_depth.to(torch.float64) + 1)).to(post.dtype)[:, None])
    return post.weighted_node("inv_depth", weights)


def hamming_expected(post, sets: torch.Tensor) -> torch.Tensor:
    """(B,) ``|h⁺| W(root) + 1 − 2 Σ_{n ∈ h⁺} W(n)`` of closed sets (B, N) bool."""
    w = inverse_depth_mass(post)
    s = sets.to(w.dtype)
    return s.sum(1) * w[post.h.root] + 1 - 2 * torch.einsum("nb,bn->b", w, s)


def hamming_decode(post) -> torch.Tensor:
    """(B, N) bool: n is in the set iff W(n) > W(root)/2."""
    w = inverse_depth_mass(post)
    return (w > 0.5 * w[post.h.root]).t()


class Hamming(SetMetric):
    """Hamming loss |h⁺ Δ y⁺| / |y⁺| (lower is better)."""

    name = "hamming"
    higher_is_better = False
    description = "symmetric difference |h+ xor y+| / |y+| (lower is better)"
    algorithms = {"cpu": "closed form: W(n) > W(root)/2", "gpu": "closed form: W(n) > W(root)/2"}
    oracle, baseline = "reference:hamming", "benchmarks.baselines:Baselines.hamming"

    def _decode_default(self, post):
        return hamming_decode(post)

    def _from_counts(self, inter, size, ysize):
        return hamming_from_counts(inter, size, ysize)

    def _expected_sets(self, post, sets):
        return hamming_expected(post, sets)
