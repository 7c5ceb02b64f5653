"""Zhao et al.'s information-content similarity 2 I(LCA(h, y)) / (I(h) + I(y)), I(n) = log(L / |L(n)|).

Expected value of predicting node h: I(y) = log L for every leaf, and I(LCA) telescopes along h's
root path — the mass under an ancestor a gains I(a) − I(parent(a)) — so

    E[Zhao(h, y)] = 2 / (I(h) + log L) · Σ_{a ∈ A(h)} (I(a) − I(parent(a))) p(a),

one root-path sum, O(B·N).  With a single leaf every I is 0; the value is then defined as 1.  Pruning
bounds (Lemma 4.3 / Prop. E.6 of Plaud et al. 2025), with λ = log L: on its own leaves n beats its
parent π by 2I(n)/(I(n)+λ) − 2I(π)/(I(π)+λ) (0 on a single-child chain); on a leaf of L(a_n) \\ L(n)
whose LCA with n is a, it loses 2 I(a) c_n, c_n = 1/(I(π)+λ) − 1/(I(n)+λ), with I(a) between I(a_n)
and I(π).  Zhao keeps many candidates (its gains are small near the leaves), so ``auto`` takes the
structural risks.

Top-k inputs (``probs.topk(k)``, :class:`~hdecode_torch.TopK`): with p̃(a) − r·W(a) zero off the support,
the root-path sum is r·G(h) (a tree table) plus the listed part of the deepest support ancestor, so the
decoder scores the support exactly and searches off it only the subtrees whose bound reaches the best found:
exact for the completed distribution, never B × L (:mod:`hdecode_torch.kernels.support_similarity`).
"""

from __future__ import annotations

import math

import torch

from ..kernels.ancestry import lca, top_ancestor
from ..kernels.candidates import PruningStatistics
from ..kernels.fused import path_score_best, trust_indices
from ..kernels.selection import tie_rank
from ..kernels.support_similarity import expected_zhao, zhao_tables
from ..kernels.tree_sums import tree_ranges
from .strategies import (StrategyNodeMetric, internal_path_sums_one_row, one_row_path_sums, ordered_path_sum_,
                         preference_layout)
from .wu_palmer import path_below_root, similarity_topk_best

__all__ = ["Zhao", "zhao_values", "zhao_table", "information_gain"]


def zhao_values(h, pred: torch.Tensor, target: torch.Tensor, meet: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``2 I(LCA) / (I(pred) + I(target))`` (1 where both are 0) of broadcastable int64 node and
    leaf ids; ``meet``: their LCAs where known."""
    info = h.information
    num = 2 * info[lca(h, pred, target) if meet is None else meet]
    den = info[pred] + info[target]
    return torch.where(den > 0, num / den.clamp(min=1e-300), torch.ones_like(den))


def information_gain(h) -> torch.Tensor:
    """(N,) float64 I(n) − I(parent(n)), 0 at the root (cached)."""
    def build():
        info = h.information
        gain = info - info[h.parent_or_root]
        gain[h.root] = 0
        return gain
    return h.cached("info_gain", build)


def zhao_table(post) -> torch.Tensor:
    """(N, B) ``2 / (I(h) + log L) · Σ_{a ∈ A(h)} (I(a) − I(parent(a))) p(a)``."""
    h = post.h
    s = post.path_sum(information_gain(h).to(post.dtype)[:, None] * post.node, overwrite=True)
    if h.num_leaves == 1:
        return torch.ones_like(s)
    den = (h.information + math.log(h.num_leaves)).to(post.dtype)[:, None]
    return 2 * s / den


#: Shallowest tree whose one-row table :func:`zhao_ordered_table` sums with
#: :func:`~.strategies.internal_path_sums_one_row` (about nine operators whatever the depth) rather than per
#: level (two a level, each cheap at one row): measured faster on tieredImageNet-H (depth 12), slower on
#: iNat19 (depth 7) (benchmarks/README.md, "Node decoders at one row, round two").
ONE_ROW_MIN_DEPTH = 10


def _ordered_factors(h, dtype):
    """(ΔI, (I + log L) / 2) in ``dtype``, (N, 1) each, rows in preference order (cached): the halved
    denominator is exact (a power of two), so ``S / ((I + log L) / 2)`` rounds as ``2·S / (I + log L)``."""
    def build():
        order = preference_layout(h)[0]
        den = (h.information + math.log(h.num_leaves)).to(dtype)
        return information_gain(h).to(dtype)[order, None], (den / 2)[order, None]
    return h.cached(("zhao_ordered_factors", dtype), build)


def zhao_ordered_table(post) -> torch.Tensor:
    """:func:`zhao_table` with its rows in preference order (bit for bit): the node sums gathered in that
    order, scaled, summed along root paths and divided in place."""
    h = post.h
    gain, half_den = _ordered_factors(h, post.dtype)
    if h.max_depth >= ONE_ROW_MIN_DEPTH and one_row_path_sums(post):
        # one row: the internal nodes' sums in three operators, the leaves' last addition at once (the same bits)
        node_gain = h.cached(("zhao_gain", post.dtype), lambda: information_gain(h).to(post.dtype))
        v = post.node.reshape(-1) * node_gain
        s = internal_path_sums_one_row(h, v)
        j = h.num_leaves
        torch.add(v[:j], s.index_select(0, h.parent[:j]), out=s[:j])
        return s.index_select(0, preference_layout(h)[0]).view(-1, 1).div_(half_den)
    s = ordered_path_sum_(h, post.node.index_select(0, preference_layout(h)[0]).mul_(gain))
    return s.div_(half_den)


def _fused_args(h):
    """The arguments of ``path_score_best`` after ``x`` for Zhao's similarity (cached on the hierarchy):
    v(a) = (I(a) − I(parent(a)))·p(a), score = 2·S / (I + log L), every node allowed."""
    def build():
        src, _, hi, lo = tree_ranges(h, "leaves")
        euler, sign, at, _ = tree_ranges(h, "path")
        parent = trust_indices(h.parent_or_root, h.num_nodes - 1)
        zeros = torch.zeros(h.num_nodes, dtype=torch.float64, device=h.device)
        gamma = 2 / (h.information + math.log(h.num_leaves))
        allowed = torch.ones(h.num_nodes, dtype=torch.bool, device=h.device)
        return (src, hi, lo, parent, zeros, information_gain(h), euler, sign, at, gamma, zeros, allowed,
                tie_rank(h), True)
    return h.cached("zhao_fused_args", build)


class Zhao(StrategyNodeMetric):
    """Zhao et al.'s information-content similarity 2 I(LCA) / (I(h) + I(y))."""

    name = "zhao"
    higher_is_better = True
    description = "Zhao similarity 2 I(LCA) / (I(h) + I(y)), information content I"
    algorithms = {"cpu": "I(LCA) telescoped along root paths (strategy 'auto'), in one native pass a row on plain "
                         "float CPU tensors",
                  "gpu": "the fused hdecode::path_score_best on the structural strategy, else as on the CPU"}
    oracle, baseline = "reference:zhao", "benchmarks.baselines:Baselines.zhao"

    def _values(self, h, pred, target):
        return zhao_values(h, pred, target)

    def _lca_values(self, h, pred, target, meet):
        return zhao_values(h, pred, target, meet)

    def _decode_gpu(self, post):
        h = post.h
        if h.num_leaves > 1 and self.resolved_strategy(post.plan, h) == "structural":
            # node sums, the root-path sum and the choice in one fused pass (float64)
            return path_score_best(post.probs, *_fused_args(h))
        return self._decode_default(post)

    def native_args(self, post):
        h = post.h
        if h.num_leaves == 1:
            return None

        def build():
            # zhao_ordered_table's factors in node order: S = Σ ΔI·p along root paths, divided by (I + log L) / 2
            den = (h.information + math.log(h.num_leaves)).to(post.dtype)
            return ("scaled", information_gain(h).to(post.dtype).contiguous(), False, "divide", (den / 2).contiguous(),
                    preference_layout(h)[0].contiguous(), True)
        return h.cached(("zhao_native_args", post.dtype), build)

    def expected_table(self, post):
        return zhao_table(post)

    def ordered_table(self, post):
        return zhao_ordered_table(post) if post.h.num_leaves > 1 else None

    def pruning_bounds(self, h) -> PruningStatistics:
        info = h.information
        lam = math.log(h.num_leaves)
        par = h.parent_or_root
        top = top_ancestor(h)
        nonroot = h.depth > 0
        deep = h.depth > 1
        zero = torch.zeros_like(info)
        if h.num_leaves == 1:  # every similarity is 1: nothing to prune
            return PruningStatistics(True, True, zero, zero, zero, zero, top)
        gain = torch.where(nonroot, 2 * info / (info + lam) - 2 * info[par] / (info[par] + lam), zero)
        c = 1 / (info[par] + lam) - 1 / (info + lam)
        m_out = torch.where(deep, 2 * info[top] * c, zero)
        M_out = torch.where(deep, 2 * info[par] * c, zero)
        return PruningStatistics(True, True, gain, gain, m_out, M_out, top)

    accepts_topk = True

    def _decode_topk(self, ct):
        # Ψ and its subtree maxima: a tree table for the uniform completion, per call for a prior
        tables = zhao_tables(ct.h, ct.weights, "topk_zhao" if ct.prior is None else None)
        return similarity_topk_best(ct, "zhao", tables)

    def _expected_topk(self, ct, pred):
        return expected_zhao(ct.h, ct.node_mass, pred)

    def pair_values(self, post, node, sample):
        """``2/(I(h)+λ) Σ_{a ∈ A(h)} ΔI(a) p(a)`` along each candidate's root path."""
        h = post.h
        if h.num_leaves == 1:
            return torch.ones(node.shape, dtype=post.dtype, device=node.device)
        gain = (information_gain(h).to(post.dtype)[:, None] * post.node).reshape(-1)  # (N·B,)
        anc = path_below_root(h, node)  # (M, D); ΔI(root) = 0
        inside = anc < h.num_nodes
        rows = anc.clamp(max=h.num_nodes - 1) * post.batch_size + sample[:, None]
        s = (gain[rows] * inside).sum(1)
        den = (h.information.index_select(0, node) + math.log(h.num_leaves)).to(post.dtype)
        return 2 * s / den
