"""Hamming loss of ancestor-closed node sets: |h⁺ Δ y⁺| / |y⁺| (lower is better).

With W(n) = Σ_{l ∈ L(n)} p(l)/(d(l)+1), the expected loss of a closed set S is
|S|·W(root) + 1 − 2 Σ_{n ∈ S} W(n): each node adds W(root) − 2 W(n).  The optimal set holds exactly
the nodes with W(n) > W(root)/2; it is ancestor-closed because W decreases down the tree, and holds
the root whenever W(root) > 0 (always, for a distribution).  O(B·N).

On a top-k input (:class:`~hdecode_torch.TopK`) the same rule is applied to the completed distribution
on its support (:mod:`hdecode_torch.kernels.support_hamming`): the nodes with W(n) > W(root)/2 form one
root path (W is additive over disjoint subtrees), the ancestor closure of its deepest node, found on the
support and below it in closed form; O(B·k·D), the decision a coalesced sparse COO bool (B, N) set.  Its
expected value reads W on the set's nodes only, O(nnz·log(B·k)).  Its certificate (``certify=True``)
bounds D(n) = 2W(n) − W(root) over the completions the list is consistent with, node by node, W(root)
moving too (:func:`~hdecode_torch.kernels.support_hamming.hamming_certificate`: sound; conservative
where the leaf-depth ranges are wide).
"""

from __future__ import annotations

import torch

from ..core.node_sets import sparse_node_sets
from ..kernels import native
from ..kernels.support import walk_up
from ..kernels.support_hamming import (flat_node_mass, hamming_certificate, inverse_depth_listed,
                                       inverse_depth_weights, root_mass, support_hamming_path)
from .base import SetMetric

__all__ = ["Hamming", "hamming_from_counts", "inverse_depth_mass", "hamming_expected", "hamming_decode"]


def hamming_from_counts(inter, size, ysize):
    return (size + ysize - 2 * inter) / ysize


def _inverse_leaf_depth(post) -> torch.Tensor:
    """(L, 1) 1 / (d(l) + 1) in float64, rounded once to the probabilities' dtype: a tree-only table, cached."""
    h = post.h
    return h.cached(("inverse_leaf_depth", post.dtype),
                    lambda: (1.0 / (h.leaf_depth.to(torch.float64) + 1)).to(post.dtype)[:, None])


def inverse_depth_mass(post) -> torch.Tensor:
    """(N, B) W(n) = Σ_{l ∈ L(n)} p(l) / (d(l) + 1)."""
    return post.weighted_node("inv_depth", _inverse_leaf_depth(post))


def hamming_expected(post, sets: torch.Tensor) -> torch.Tensor:
    """(B,) ``|h⁺| W(root) + 1 − 2 Σ_{n ∈ h⁺} W(n)`` of closed sets (B, N) bool."""
    w = inverse_depth_mass(post)
    s = sets.to(w.dtype)
    return s.sum(1) * w[post.h.root] + 1 - 2 * torch.einsum("nb,bn->b", w, s)


def hamming_decode(post) -> torch.Tensor:
    """(B, N) bool: n is in the set iff W(n) > W(root)/2, the product and the comparison in the probabilities'
    dtype (fused with the sums W in one native pass a row where the Posterior can: :meth:`Posterior.node_rule
    <hdecode_torch.Posterior.node_rule>`)."""
    h, probs = post.h, post.probs
    return post.node_rule(lambda w: w > 0.5 * w[h.root],
                          lambda w, acc: native.above_root_share(h, probs, w, 0.5, acc),
                          "inv_depth", _inverse_leaf_depth(post)).t()


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

    accepts_topk = True

    def _scaled(self, ct):
        """(scaled list, W') of a CompletedTopK: W(n) = Σ_{l ∈ L(n)} q(l)/(d(l)+1) as a node mass."""
        weights = inverse_depth_weights(ct.h, ct.prior)
        return inverse_depth_listed(ct.h, ct.listed, ct.values, ct.indices, ct.prior), weights

    def _decode_topk(self, ct):
        h = ct.h
        listed, weights = self._scaled(ct)
        deepest, some = support_hamming_path(h, listed, weights, ct.indices,
                                             "topk_hamming_heavy" if ct.prior is None else None)
        paths = walk_up(h, deepest, h.max_depth)  # (B, D+1), the root repeated past the top
        keep = some[:, None].expand_as(paths)  # W(root) = 0: no node passes, the empty set (as dense)
        rows = torch.arange(paths.shape[0], device=paths.device)[:, None].expand_as(paths)
        return sparse_node_sets(rows[keep], paths[keep], paths.shape[0], h.num_nodes)

    def _certify_topk(self, ct, sets):
        listed, weights = self._scaled(ct)
        return hamming_certificate(ct.h, listed, weights, ct.polytope(), sets)

    def _expected_topk(self, ct, sets):
        # |S|·W(root) + 1 − 2 Σ_{n ∈ S} W(n) over the closed sparse sets' entries, O(nnz·log(B·k))
        listed, weights = self._scaled(ct)
        rows, nodes = sets.indices()
        b = ct.batch_size
        size = torch.zeros(b, dtype=torch.float64, device=rows.device).index_add_(
            0, rows, torch.ones_like(rows, dtype=torch.float64))
        total = torch.zeros(b, dtype=torch.float64, device=rows.device).index_add_(
            0, rows, flat_node_mass(ct.h, listed, weights, rows, nodes))
        return size * root_mass(ct.h, listed, weights) + 1 - 2 * total
