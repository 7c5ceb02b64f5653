"""Node metrics: tree distance (and its depth-penalised form), Wu-Palmer and Zhao similarities.

Expected values for every node are sums over the node's root path of the probability
mass that splits off there, so they cost O(N·B) (O(N·E·B) for Wu-Palmer, E distinct
leaf depths), never O(N·L).
"""

from __future__ import annotations

import math

import torch

from ..kernels.ancestry import argbest_pairs, lca, lca_depth
from ..kernels.closed_forms import deepest_above
from ..kernels.depth_ranges import depth_masses, depth_ranges
from ..kernels.pruning import PruningStatistics, candidate_mask
from ..kernels.tree_sums import path_sum
from ..kernels.validation import check_nonnegative
from .base import NodeMetric
from .posterior import Posterior

__all__ = ["TreeDistance", "TreeDistanceC", "WuPalmer", "Zhao"]


def _ancestor_mass(post: Posterior) -> torch.Tensor:
    """(N, B) ``Σ_{a ∈ A(n), a ≠ root} p(a)`` = E[d(LCA(n, y))]."""
    return post._get("ancestor_mass", lambda: path_sum(post.h, post.node, include_root=False))


class TreeDistance(NodeMetric):
    """Length of the tree path between prediction and target: d(h) + d(y) − 2 d(LCA)."""

    name = "tree_distance"
    higher_is_better = False
    description = "path length between prediction and target (mistake severity; lower is better)"

    def _values(self, h, pred, target):
        d = h.depth
        return (d[pred] + d[target] - 2 * lca_depth(h, pred, target)).to(torch.float64)

    threshold = 0.5

    def _decode(self, post: Posterior) -> torch.Tensor:
        """Deepest node with p(n) > (1 + c) / 2 (c = 0 here), the root if none."""
        return deepest_above(post.h, post.node, self.threshold)

    def expected_table(self, post: Posterior) -> torch.Tensor:
        h, p = post.h, post.node
        depth = h.depth.to(p.dtype)[:, None]
        return depth + post.expected_leaf_depth()[None, :] - 2 * _ancestor_mass(post)


class TreeDistanceC(TreeDistance):
    """Tree distance plus ``c · d(h)`` (Cao et al. 2024), c ≥ 0."""

    name = "tree_distance_c"
    description = "tree distance + c * depth(prediction) (lower is better)"

    def __init__(self, hierarchy, c: float = 1.0, **kw):
        super().__init__(hierarchy, **kw)
        self.c = check_nonnegative(c, "c")
        self.threshold = (1 + self.c) / 2

    @property
    def params(self):
        return {"c": self.c}

    def _values(self, h, pred, target):
        return super()._values(h, pred, target) + self.c * h.depth[pred].to(torch.float64)

    def expected_table(self, post):
        return super().expected_table(post) + self.c * post.h.depth.to(post.dtype)[:, None]


class _DecodeStrategy(NodeMetric):
    """Node metrics with several exact decoding strategies.

    ``strategy``:

    - ``"structural"``: the expected value of every node from root-path sums (no N×L tensor);
    - ``"candidates"``: the paper's pruning (Lemma 4.3 in its Prop. E.6 form: both metrics
      are equal for a node and its parent on leaves whose LCA with it is the root) as a
      batched candidate mask, then the expected value of the candidates only.  While the
      dense (N, L) matrix is small, with the matrix's exact pruning statistics and sampled
      products ``cost[n] · p`` on the candidate pairs only; on larger trees with thresholds
      from per-node bounds of the cost structure (safe: a looser bound only keeps more
      candidates; a test checks them against the exact statistics) and sums over each
      candidate's ancestors (no N×L tensor);
    - ``"dense"``: one (N, L) @ (L, B) product with the dense matrix (small trees);
    - ``"auto"``: the one measured fastest for this metric and tree size.

    Measured on the 2-core CPU, one thread (structural / candidates / dense): Wu-Palmer on
    tieredImageNet-H, B = 4000: 123 / 22 / 48 ms; on iNat19: 20 / 44 / 105 ms; on a
    100k-leaf tree, B = 64: 438 / 90 ms / —; on a 1M-node tree 115 / 20 ms per sample.
    Zhao: 10 / 41 / 45 ms, 18 / 108 / 109 ms, 105 / 143 ms / —.  Zhao keeps many candidates
    (its gains are small near the leaves), so ``auto`` takes the structural risks for it.
    """

    STRATEGIES = ("auto", "structural", "dense", "candidates")
    DENSE_MAX_ENTRIES = 2_000_000

    def __init__(self, hierarchy, strategy: str = "auto", **kw):
        super().__init__(hierarchy, **kw)
        if strategy not in self.STRATEGIES:
            raise ValueError(f"Expected `strategy` to be one of {self.STRATEGIES}, but got {strategy!r}")
        self.strategy = strategy
        self._as_cost: dict = {}

    def _resolved_strategy(self) -> str:
        if self.strategy != "auto":
            return self.strategy
        h = self.hierarchy
        return "candidates" if self._candidates_are_faster(h, self._dense_fits(h)) else "structural"

    def _dense_fits(self, h) -> bool:
        """Whether the dense (N, L) matrix is small enough to use."""
        return h.num_nodes * h.num_leaves <= self.DENSE_MAX_ENTRIES

    def _candidates_are_faster(self, h, small: bool) -> bool:
        """Whether pruned candidates (scored with the dense matrix when ``small``, else along their
        root paths) beat the structural risks."""
        return False

    def as_cost_matrix_metric(self, strategy: str = "dense"):
        """This metric as a dense :class:`CostMatrixMetric` (built once per ``strategy``; small trees)."""
        if strategy not in self._as_cost:
            from .cost_matrix import CostMatrixMetric

            h = self.hierarchy
            if h.num_nodes * h.num_leaves > 50 * self.DENSE_MAX_ENTRIES:
                raise ValueError(f"The dense strategy needs an N×L matrix ({h.num_nodes}×{h.num_leaves}); "
                                 "use strategy='structural' or 'candidates' on a tree this large")
            self._as_cost[strategy] = CostMatrixMetric(h, self.dense_matrix(), higher_is_better=self.higher_is_better,
                                                       name=self.name, strategy=strategy, validate=False)
        return self._as_cost[strategy]

    def pruning(self, h) -> PruningStatistics:
        """Safe Lemma 4.3 / Prop. E.6 statistics of the cost 1 − similarity, per node (cached)."""
        return h.cached(("pruning", self.name), lambda: self._pruning_bounds(h))

    def _decode(self, post: Posterior) -> torch.Tensor:
        strategy = self._resolved_strategy()
        if strategy == "structural":
            return super()._decode(post)
        if strategy == "dense":
            return self.as_cost_matrix_metric()._decode(post)
        h = post.h
        if self._dense_fits(h):
            # The dense matrix fits: the candidates' values are a sampled product with it.
            return self.as_cost_matrix_metric("candidates")._decode(post)
        node, sample = candidate_mask(h, post.node, self.pruning(h)).nonzero().unbind(1)
        values = self._pair_values(post, node, sample)
        return argbest_pairs(h, values, sample, node, post.batch_size, self.higher_is_better)

    def _pruning_bounds(self, h) -> PruningStatistics:
        raise NotImplementedError

    def _pair_values(self, post: Posterior, node: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """(M,) expected value of node ``node[i]`` for sample ``sample[i]``, from its root path only."""
        raise NotImplementedError


def _top_ancestor(h) -> torch.Tensor:
    """(N,) a_n: the child of the root above n (the root for the root)."""
    nodes = torch.arange(h.num_nodes, device=h.depth.device)
    return torch.where(h.depth > 0, h.ancestors[:, 1], nodes)


def _path_below_root(h, node: torch.Tensor) -> torch.Tensor:
    """(M, D) the ancestors of ``node`` (M,) below the root, root side first; N past its depth."""
    return h.ancestors.index_select(0, node)[:, 1:]


class WuPalmer(_DecodeStrategy):
    """Wu-Palmer similarity 2 d(LCA) / (d(h) + d(y))."""

    name = "wu_palmer"
    higher_is_better = True
    description = "Wu-Palmer similarity 2 d(LCA) / (d(h) + d(y))"

    def _candidates_are_faster(self, h, small: bool) -> bool:
        # Measured on this 2-core CPU (one thread): structural costs ≈ 3.8 ns per node × leaf
        # depth × sample; pruned candidates with sampled dense products ≈ (4 + 0.005 L) ns per
        # node × sample (the mask, then ~13 candidates × L per sample).  tieredImageNet-H (10
        # leaf depths, B = 4000): candidates 22 ms vs structural 123 ms (dense 48); iNat19 (1 leaf
        # depth): structural 20 ms vs candidates 44 ms.  Without the dense matrix, each
        # candidate reads D·E masses: a loss on the bundled trees (274 ms on tieredImageNet-H)
        # but the mask is all that grows with N: per sample, 1.4 vs 6.9 ms on the 100k-leaf
        # tree (10 leaf depths), 20 vs 115 ms on the 1M-node one (14).
        if small:
            return 4 + 0.005 * h.num_leaves < 3.8 * h.num_leaf_depths
        return h.num_leaf_depths >= 2

    def _bytes_per_sample(self, h):
        if self._resolved_strategy() == "candidates":  # node sums, mask, float64 prefix sums
            return 4 * h.num_nodes * 12 + 8 * (h.num_leaves + 1)
        return 4 * h.num_nodes * (2 * h.num_leaf_depths + 4) * 2

    def _values(self, h, pred, target):
        d = h.depth.to(torch.float64)
        return 2 * lca_depth(h, pred, target).to(torch.float64) / (d[pred] + d[target])

    def _pruning_bounds(self, h) -> PruningStatistics:
        # Non-root n at depth k, leaf l at depth e.  On its own leaves n beats its parent by
        # 2e/((k+e)(k−1+e)), decreasing in e ≥ k: extremes at the shallowest/deepest leaf below n.
        # On a leaf of L(a_n) \ L(n) with LCA depth j ∈ [1, k−1] it loses 2j/((k−1+e)(k+e)):
        # at most with j = k−1 and e = d_min(a_n), at least with j = 1 and e = d_max(a_n).
        k = h.depth.to(torch.float64)
        top = _top_ancestor(h)

        def inside(e):
            return 2 * e / ((k + e) * (k - 1 + e))

        def outside(j, e):
            return 2 * j / ((k - 1 + e) * (k + e))

        lo, hi = h.min_leaf_depth.to(torch.float64), h.max_leaf_depth.to(torch.float64)
        nonroot = h.depth > 0
        deep = h.depth > 1  # a node below the root's children has leaves outside it with LCA ≠ root
        zero = torch.zeros_like(k)
        fix = lambda t, where: torch.where(where, t, zero)  # noqa: E731
        return PruningStatistics(
            reasonable=True, root_form=True,
            m_in=fix(inside(hi), nonroot), M_in=fix(inside(lo), nonroot),
            m_out=fix(outside(1.0, hi[top]), deep), M_out=fix(outside(k - 1, lo[top]), deep), top=top)

    def _pair_values(self, post, node, sample):
        """``Σ_e 2/(d(h)+e) Σ_{a ∈ A(h) \\ root} Q_e(a)``, the masses Q_e read from depth-first prefix
        sums: D·E lookups per candidate, no (N, E, B) table."""
        h = post.h
        anc = _path_below_root(h, node)  # (M, D)
        m, d = anc.shape
        q = depth_masses(h, post.depth_prefix(), sample.repeat_interleave(d), anc.reshape(-1))
        q = q.view(m, d, -1).sum(1)  # (M, E) float64
        e = depth_ranges(h).depths.to(torch.float64)
        # d(h) + e ≥ 1 wherever the masses are not 0 (h below the root)
        w = 2.0 / (h.depth.index_select(0, node).to(torch.float64)[:, None] + e).clamp(min=1)
        return (q * w).sum(1).to(post.dtype)

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """``Σ_e 2 / (d(h) + e) · Σ_{a ∈ A(h) \\ root} Q_e(a)`` with Q_e the mass of leaves at depth e."""
        h = post.h
        q = post.by_leaf_depth()  # (N, E, B)
        s = path_sum(h, q, include_root=False)
        e = post.leaf_depth_values().to(post.dtype)
        w = 2.0 / (h.depth.to(post.dtype)[:, None] + e[None, :])  # (N, E); d(h) + e >= 1
        return torch.einsum("neb,ne->nb", s, w)


class Zhao(_DecodeStrategy):
    """Zhao et al.'s information-content similarity 2 I(LCA) / (I(h) + I(y)), I(n) = log(L / |L(n)|).

    With a single leaf every I is 0; the value is then defined as 1.
    """

    name = "zhao"
    higher_is_better = True
    description = "Zhao similarity 2 I(LCA) / (I(h) + I(y)), information content I"
    # Structural risks cost O(N·B), the dense product O(N·L·B): structural always wins
    # (tieredImageNet-H, B = 4000: 21 ms vs 49 ms).

    def _values(self, h, pred, target):
        info = h.information
        num = 2 * info[lca(h, pred, target)]
        den = info[pred] + info[target]
        return torch.where(den > 0, num / den.clamp(min=1e-300), torch.ones_like(den))

    def _pruning_bounds(self, h) -> PruningStatistics:
        # λ = log L = I(leaf).  On its own leaves n beats its parent by the same amount
        # 2I(n)/(I(n)+λ) − 2I(π)/(I(π)+λ) (0 on a single-child chain).  On a leaf of
        # L(a_n) \ L(n) whose LCA with n is a, it loses 2 I(a) c_n, c_n = 1/(I(π)+λ) − 1/(I(n)+λ),
        # with I(a) between I(a_n) and I(π).
        info = h.information
        lam = math.log(h.num_leaves)
        par = h.parent_or_root
        top = _top_ancestor(h)
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

    def _pair_values(self, post, node, sample):
        """``2/(I(h)+λ) Σ_{a ∈ A(h)} ΔI(a) p(a)`` along each candidate's root path."""
        h = post.h
        if h.num_leaves == 1:
            return torch.ones(node.shape, dtype=post.dtype, device=node.device)
        gain = (_info_gain(h).to(post.dtype)[:, None] * post.node).reshape(-1)  # (N·B,)
        anc = _path_below_root(h, node)  # (M, D); ΔI(root) = 0
        inside = anc < h.num_nodes
        rows = anc.clamp(max=h.num_nodes - 1) * post.batch_size + sample[:, None]
        s = (gain[rows] * inside).sum(1)
        den = (h.information.index_select(0, node) + math.log(h.num_leaves)).to(post.dtype)
        return 2 * s / den

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """``2 / (I(h) + log L) · Σ_{a ∈ A(h)} (I(a) − I(parent(a))) p(a)``: I(LCA) telescoped along the path."""
        h = post.h
        info = h.information
        s = path_sum(h, _info_gain(h).to(post.dtype)[:, None] * post.node)
        den = (info + math.log(h.num_leaves)).to(post.dtype)[:, None]
        if h.num_leaves == 1:
            return torch.ones_like(s)
        return 2 * s / den


def _info_gain(h) -> torch.Tensor:
    """(N,) float64 I(n) − I(parent(n)), 0 at the root."""
    def build():
        info = h.information
        gain = info - info[h.parent_or_root]
        gain[h.root] = 0
        return gain
    return h.cached("info_gain", build)
