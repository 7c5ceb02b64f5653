"""Wu-Palmer similarity 2 d(LCA(h, y)) / (d(h) + d(y)) (Wu and Palmer 1994).

Expected value of predicting node h.  Write Q_e(a) for the mass of the leaves under a at depth e
(e ranges over the E distinct leaf depths).  A target at depth e shares d(LCA) = |A(h) ∩ A(y)| − 1
levels with h, one for every ancestor a ≠ root of h above it, so

    E[WP(h, y)] = Σ_e 2/(d(h) + e) · Σ_{a ∈ A(h), a ≠ root} Q_e(a),

E root-path sums, O(B·N·E), no N×L matrix (``"structural"``; on the GPU plan one fused op,
``hdecode::wu_palmer_best``, one leaf depth at a time: O(N + L) memory per sample instead of
O(N·E)).  The optimal decoder is the best node (ties: the deepest, then the smallest id); see
:mod:`.strategies` for the candidate and dense strategies.  Pruning bounds (Plaud et al. 2025,
Lemma 4.3 / Prop. E.6), for a non-root n at depth k and a leaf l at depth e: on its own leaves n beats its
parent by 2e/((k+e)(k−1+e)), decreasing in e ≥ k (extremes at the shallowest and deepest leaf below n); on a
leaf of L(a_n) \\ L(n) (a_n the child of the root above n) with LCA depth j ∈ [1, k−1] it loses
2j/((k−1+e)(k+e)): at most with j = k−1 and e = d_min(a_n), at least with j = 1 and e = d_max(a_n).

Top-k inputs (``probs.topk(k)``, :class:`~hdecode_torch.TopK`): the expected value splits into r times the
similarity under the completion's weights (a tree table) plus a correction carried by the listed leaves
alone, so the decoder scores the support exactly and searches off it only the subtrees whose bound reaches
the best found: exact for the completed distribution, never B × L
(:mod:`hdecode_torch.kernels.support_similarity`).
"""

from __future__ import annotations

import torch

from ..kernels.ancestry import lca_depth, top_ancestor
from ..kernels.candidates import PruningStatistics
from ..kernels.depth_ranges import depth_masses, depth_range_ends, depth_ranges
from ..kernels.fused import trust_indices, wu_palmer_best
from ..core.chunking import chunk_ranges
from ..core.plan import resolve_plan
from ..kernels.selection import tie_rank
from ..kernels.support_similarity import expected_wu_palmer, similarity_best, wu_palmer_tables
from ..kernels.tree_sums import tree_ranges
from .strategies import StrategyNodeMetric, ordered_path_sum_, preference_layout

__all__ = ["WuPalmer", "wu_palmer_values", "wu_palmer_table", "path_below_root", "similarity_topk_best"]


def wu_palmer_values(h, pred: torch.Tensor, target: torch.Tensor, meet: torch.Tensor | None = None) -> torch.Tensor:
    """float64 ``2 d(LCA) / (d(pred) + d(target))`` of broadcastable int64 node and leaf ids; ``meet``:
    their LCAs where known (no root paths read)."""
    d = h.depth.to(torch.float64)
    shared = lca_depth(h, pred, target) if meet is None else h.depth[meet]
    return 2 * shared.to(torch.float64) / (d[pred] + d[target])


def wu_palmer_table(post) -> torch.Tensor:
    """(N, B) ``Σ_e 2 / (d(h) + e) · Σ_{a ∈ A(h) \\ root} Q_e(a)``."""
    h = post.h
    q = post.by_leaf_depth()  # (N, E, B)
    s = post.path_sum(q, include_root=False)
    e = post.leaf_depth_values().to(post.dtype)
    w = 2.0 / (h.depth.to(post.dtype)[:, None] + e[None, :])  # (N, E); d(h) + e >= 1
    # an elementwise product and a sum over the leaf depths: an einsum here is a batched matrix product
    # over the N nodes, which the CPU runs as one small product per node
    if s.shape[1] == 1:  # leaves at one depth: no sum to take (it would cost a zeroed table and a pass)
        return s[:, 0] * w[:, 0, None]
    return (s * w[:, :, None]).sum(1)


def wu_palmer_ordered_table(post) -> torch.Tensor:
    """:func:`wu_palmer_table` with its rows in preference order (bit for bit): the per-leaf-depth masses
    gathered in that order (the copy the root-path sum would make), summed along root paths and weighted
    in place."""
    h = post.h
    order = preference_layout(h)[0]
    # Leaves at one depth: Q is p(n), which the per-level sums build with the same additions as
    # by_leaf_depth's table (leaf rows, zeros, the same level order and accumulation dtype), so the node
    # sums other decoders of the batch share serve (tests/test_wu_palmer.py checks the bits).
    q = post.node[:, None] if h.num_leaf_depths == 1 else post.by_leaf_depth()
    s = ordered_path_sum_(h, q.index_select(0, order), include_root=False)
    w = h.cached(("wu_palmer_ordered_weights", post.dtype), lambda: (2.0 / (
        h.depth.to(post.dtype)[:, None] + post.leaf_depth_values().to(post.dtype)[None, :]))[order])
    if s.shape[1] == 1:
        return s[:, 0].mul_(w[:, 0, None])
    return s.mul_(w[:, :, None]).sum(1)


def path_below_root(h, node: torch.Tensor) -> torch.Tensor:
    """(M, D) the ancestors of ``node`` (M,) below the root, root side first; N past its depth."""
    return h.ancestors.index_select(0, node)[:, 1:]


def _fused_args(h):
    """The arguments of ``wu_palmer_best`` after ``x`` (cached on the hierarchy): the leaves in
    (depth, depth-first) order, every node's run at every leaf depth (E·N ends, leaf depth major), the
    depths and the Euler tour without the root."""
    def build():
        r = depth_ranges(h)
        n, j, e = h.num_nodes, h.num_leaves, h.num_leaf_depths
        ends = depth_range_ends(h, torch.arange(n, device=h.device)).t()  # (2E, N)
        euler, sign, at, _ = tree_ranges(h, "path_below_root")
        return (trust_indices(r.leaf_order, j - 1), trust_indices(ends[:e].reshape(-1), j),
                trust_indices(ends[e:].reshape(-1), j), h.depth.to(torch.float64), r.depths.to(torch.float64),
                euler, sign, at, tie_rank(h))
    return h.cached("wu_palmer_fused_args", build)


def similarity_topk_best(ct, metric: str, tables) -> torch.Tensor:
    """(B,) int64 the best node of a :class:`~hdecode_torch.core.topk.CompletedTopK` for ``metric``
    ("wu_palmer" or "zhao", :func:`~hdecode_torch.kernels.support_similarity.similarity_best`), in chunks of
    rows whose support tables and per-leaf-depth sums fit the plan's budget."""
    h = ct.h
    # the support tables (about 20 entries per support slot) and, per slot, Λ's E sums and their copies
    per_row = 8 * ct.k * (h.max_depth + 1) * (20 + 3 * h.num_leaf_depths)
    chunks = chunk_ranges(ct.batch_size, per_row, resolve_plan(h, ct.values.device).budget)
    return torch.cat([similarity_best(h, part.listed, part.weights, metric, tables)
                      for part in (ct.chunk(a, b) for a, b in chunks)])


class WuPalmer(StrategyNodeMetric):
    """Wu-Palmer similarity 2 d(LCA) / (d(h) + d(y))."""

    name = "wu_palmer"
    higher_is_better = True
    description = "Wu-Palmer similarity 2 d(LCA) / (d(h) + d(y))"
    algorithms = {"cpu": "strategy 'auto': candidates where leaves sit at several depths, structural otherwise",
                  "gpu": "strategy 'auto': dense while the matrix fits, else structural (the fused "
                         "hdecode::wu_palmer_best on large trees)"}
    oracle, baseline = "reference:wu_palmer", "benchmarks.baselines:Baselines.wu_palmer"

    def candidates_are_faster(self, h, small: bool) -> bool:
        # A rule fitted to CPU timings (benchmarks/README.md, "Device plans"): structural risks cost a
        # constant per node × leaf depth × sample, pruned candidates scored by sampled dense products a
        # cost per node × sample that grows with L; on trees too large for the dense matrix the
        # candidates win as soon as leaves sit at several depths.
        if small:
            return 4 + 0.005 * h.num_leaves < 3.8 * h.num_leaf_depths
        # Candidates read their root paths from the ancestors-by-depth table.  A (sample, candidate)
        # pair sums D+1 ancestors × E leaf-depth masses, each about twice a structural entry's cost,
        # where the structural table costs N × E per sample: with tens of candidates per sample, the
        # candidates win only while a root path is much shorter than the tree (not on a caterpillar,
        # whose root paths hold half its nodes).
        return (h.num_leaf_depths >= 2 and h.ancestor_table_fits
                and 2 * self.CANDIDATES_PER_SAMPLE * (h.max_depth + 1) <= h.num_nodes)

    #: Candidates per sample the ``auto`` rule assumes on trees too large for the dense matrix (a bound
    #: on the typical count, which is known only once a batch's pruning has run).
    CANDIDATES_PER_SAMPLE = 64

    #: Bytes of the unfused structural tables per sample from which the GPU plan decodes with the fused
    #: op: on small trees its fixed launches per leaf depth cost more than the tables they save (on an
    #: H100, tieredImageNet-H at B = 1 to 4,096 took 0.16-0.20 ms more per call), on large ones the
    #: tables would be split into chunks that each pay the call's operators again.  Both give the same
    #: node bit for bit, so the rule changes no decision.
    FUSED_MIN_ROW_BYTES = 1 << 20

    def _fused(self, plan, h) -> bool:
        # The GPU plan's structural decoder as one op, on trees whose (N, E) tables per sample are large,
        # while the run ends fit their O(N·E) table (few leaf depths: every tree but very deep ones).
        return (plan.gpu and self.resolved_strategy(plan, h) == "structural"
                and self.structural_bytes_per_sample(h, plan) >= self.FUSED_MIN_ROW_BYTES
                and depth_ranges(h).ends is not None)

    def _decode_gpu(self, post):
        if self._fused(post.plan, post.h):
            return wu_palmer_best(post.probs, *_fused_args(post.h))
        return self._decode_default(post)

    def native_args(self, post):
        h = post.h
        if h.num_leaf_depths != 1:  # the per-leaf-depth table has no native pass (the candidates are faster there)
            return None

        def build():
            # wu_palmer_ordered_table's with leaves at one depth: S = Σ p along root paths below the root, × 2/(d + e)
            w = 2.0 / (h.depth.to(post.dtype) + post.leaf_depth_values().to(post.dtype))
            return ("scaled", torch.ones(h.num_nodes, dtype=post.dtype), True, "multiply", w.contiguous(),
                    preference_layout(h)[0].contiguous(), True)
        return h.cached(("wu_palmer_native_args", post.dtype), build)

    def _bytes_per_sample(self, h, plan):
        if self._fused(plan, h):
            # wu_palmer_best's rows, whatever E: its float64 prefix table (2L) and, at its peak, a leaf
            # depth's masses, their Euler-tour table (2N) and root-path sums, and the running scores
            return 16 * h.num_leaves + 52 * h.num_nodes
        return super()._bytes_per_sample(h, plan)

    def structural_bytes_per_sample(self, h, plan):
        # (N, E) tables per sample: the masses, their root-path sums and the weighted sums (per level); on
        # the depth-first layout the root-path sums also copy the masses and gather a float64 prefix of
        # the Euler tour (2N per row)
        e = h.num_leaf_depths
        return 8 * h.num_nodes * ((6 if plan.batch_major else 3) * e + 2) + 16 * h.num_leaves

    def _values(self, h, pred, target):
        return wu_palmer_values(h, pred, target)

    def _lca_values(self, h, pred, target, meet):
        return wu_palmer_values(h, pred, target, meet)

    def expected_table(self, post):
        return wu_palmer_table(post)

    def ordered_table(self, post):
        return wu_palmer_ordered_table(post)

    def pruning_bounds(self, h) -> PruningStatistics:
        k = h.depth.to(torch.float64)
        top = top_ancestor(h)

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

    accepts_topk = True

    def _topk_tables(self, ct):
        # Ω and its subtree maxima: a tree table for the uniform completion, per call for a prior
        return wu_palmer_tables(ct.h, ct.prior, "topk_wu_palmer" if ct.prior is None else None)

    def _decode_topk(self, ct):
        return similarity_topk_best(ct, "wu_palmer", self._topk_tables(ct))

    def _expected_topk(self, ct, pred):
        return expected_wu_palmer(ct.h, ct.listed, self._topk_tables(ct), pred)

    def pair_bytes(self, h):
        return self.PAIR_ENTRY_BYTES * (h.max_depth + 1) * h.num_leaf_depths

    #: Bytes per (ancestor, leaf depth) entry of a pair: both ends' int32 ranges and their int64 copies,
    #: the two gathered float64 prefix sums and their difference.
    PAIR_ENTRY_BYTES = 64

    def pair_values(self, post, node, sample):
        """``Σ_e 2/(d(h)+e) Σ_{a ∈ A(h) \\ root} Q_e(a)``, the masses Q_e read from depth-first prefix
        sums: D·E lookups per candidate, no (N, E, B) table.  The caller bounds the number of pairs by
        :meth:`pair_bytes`; a single pair whose D·E masses exceed the budget by themselves (a deep tree
        with leaves at many depths) is taken in blocks of leaf depths, whose sums over the ancestors may
        round differently in the last bit."""
        h = post.h
        anc = path_below_root(h, node)  # (M, D)
        m, d = anc.shape
        ranges = depth_ranges(h)
        prefix = post.depth_prefix()  # (L + 1, B) float64
        ids, rows = anc.reshape(-1), sample.repeat_interleave(d)
        num_depths = ranges.depths.numel()
        width = num_depths if m > 1 else max(1, post.plan.budget // max(1, self.PAIR_ENTRY_BYTES * d))
        if width >= num_depths:
            q = depth_masses(h, prefix, rows, ids).view(m, d, -1).sum(1)  # (M, E) float64
        else:
            q = torch.empty(m, num_depths, dtype=torch.float64, device=node.device)
            for e0 in range(0, num_depths, width):  # a loop over blocks of leaf depths
                hi = ranges.hi[:, e0:e0 + width].index_select(0, ids).long()
                lo = ranges.lo[:, e0:e0 + width].index_select(0, ids).long()
                q[:, e0:e0 + width] = (prefix[hi, rows[:, None]] - prefix[lo, rows[:, None]]).view(m, d, -1).sum(1)
        e = depth_ranges(h).depths.to(torch.float64)
        # d(h) + e ≥ 1 wherever the masses are not 0 (h below the root)
        w = 2.0 / (h.depth.index_select(0, node).to(torch.float64)[:, None] + e).clamp(min=1)
        return (q * w).sum(1).to(post.dtype)
