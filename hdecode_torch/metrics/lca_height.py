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

from ..core.chunking import CPU_BLOCK_BYTES
from ..kernels.ancestry import lca
from ..kernels.certificate import certify_least_lca_height
from ..kernels.fused import path_score_best, trust_indices
from ..kernels.path_argbest import path_argbest
from ..kernels.selection import argbest, preference_order, tie_rank
from ..kernels.support import lca_height_candidates, least_lca_height_of, support_least_lca_height
from ..kernels.tree_sums import tree_ranges
from .base import NodeMetric
from .strategies import internal_path_sums_one_row, native_decides, one_row_path_sums, warm_torch_path

__all__ = ["LCAHeight", "lca_height_values", "lca_height_table", "lca_height_decode", "lca_height_decode_fused",
           "split_sums"]


def lca_height_values(h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return h.height[lca(h, pred, target)].to(torch.float64)


def split_sums(post) -> torch.Tensor:
    """(N, B) ``Σ_{j < k} height(a_j) (p(a_j) − p(a_{j+1}))`` along each node's root path."""
    h, p = post.h, post.node
    par = h.parent_or_root  # the root's own term is then 0
    alpha = h.cached(("lca_height_parent_height", p.dtype), lambda: h.height.to(p.dtype).index_select(0, par)[:, None])
    # index_select: faster on CPU than advanced indexing for whole-row gathers; the product is a temporary
    # of ours, summed in place
    return post.path_sum(p.index_select(0, par).sub_(p).mul_(alpha), overwrite=True)


def lca_height_table(post) -> torch.Tensor:
    """(N, B) expected LCA height of predicting each node."""
    return split_sums(post) + post.h.height.to(post.dtype)[:, None] * post.node


def lca_height_decode(post) -> torch.Tensor:
    """(B,) int64 the leaf of least expected LCA height (height(leaf) = 0, so the split sums suffice)."""
    h = post.h
    if one_row_path_sums(post):
        return _decode_one_row(post)
    return argbest(h, split_sums(post)[: h.num_leaves], higher_is_better=False)


def _one_row_tables(h, dtype):
    """``(alpha, leaves, leaf_parents)`` of :func:`_decode_one_row` (cached): height(parent(n)) in ``dtype``,
    the leaves in :func:`preference_order` and their parents."""
    def build():
        leaves = preference_order(h, h.num_leaves)
        return (h.height.to(dtype).index_select(0, h.parent_or_root), leaves,
                h.parent_or_root.index_select(0, leaves))
    return h.cached(("lca_height_one_row", dtype), build)


def _decode_one_row(post) -> torch.Tensor:
    """:func:`lca_height_decode` of one row on the CPU plan, the same bits in a dozen operators instead of
    two a tree level: the internal nodes' root-path sums of :func:`~.strategies.internal_path_sums_one_row`,
    then every leaf's v(l) + S(parent(l)) at once (the per-level sums' last addition), in :func:`argbest`'s
    preference order, whose first least entry is its choice.  O(Σ_{n internal} (d(n) + 1) + N)."""
    h = post.h
    alpha, leaves, leaf_parents = _one_row_tables(h, post.dtype)
    p = post.node.reshape(-1)  # a view, or a copy of a shared batch's strided column
    v = p.index_select(0, h.parent_or_root).sub_(p).mul_(alpha)  # split_sums' terms, bit for bit
    s = internal_path_sums_one_row(h, v)
    s = v.index_select(0, leaves).add_(s.index_select(0, leaf_parents))
    return leaves.index_select(0, s.argmin(0, keepdim=True))


def _native_route(post) -> bool:
    """Whether the CPU plan's decoder runs as one native pass a row (per-level sums, a batch the kernels take)."""
    return post.plan.tree_sums == "levels" and post.plan.backend == "torch" and native_decides(post)


def _native_args(h, dtype):
    """:func:`~hdecode_torch.kernels.path_argbest.path_argbest`'s arguments after ``(h, probs)`` for
    :func:`lca_height_decode`: v = (p(parent) − p)·height(parent), the split sums S, the leaves in preference order,
    least first (cached)."""
    def build():
        alpha = h.height.to(dtype).index_select(0, h.parent_or_root).contiguous()
        return ("split", alpha, False, None, None, preference_order(h, h.num_leaves).contiguous(), False)
    return h.cached(("lca_height_native_args", dtype), build)


def lca_height_decode_fused(post) -> torch.Tensor:
    """:func:`lca_height_decode` as one fused pass over the leaf probabilities: node sums, root-path
    sums and the choice (``hdecode::path_score_best``, float64), no (N, B) table."""
    return path_score_best(post.probs, *_fused_args(post.h))


def _fused_args(h):
    """The arguments of ``path_score_best`` after ``x`` for the LCA height (cached on the hierarchy):
    v(a) = height(parent(a))·(p(parent(a)) − p(a)), score = S + height·p, the leaves allowed."""
    def build():
        src, _, hi, lo = tree_ranges(h, "leaves")
        euler, sign, at, _ = tree_ranges(h, "path")
        parent = trust_indices(h.parent_or_root, h.num_nodes - 1)
        height = h.height.to(torch.float64)
        alpha = height.index_select(0, parent)
        alpha[h.root] = 0
        ones = torch.ones_like(height)
        return (src, hi, lo, parent, alpha, -alpha, euler, sign, at, ones, height, h.is_leaf, tie_rank(h), False)
    return h.cached("lca_height_fused_args", build)


class LCAHeight(NodeMetric):
    """height(LCA(h, y)): 0 for a correct leaf, larger for mistakes that split higher up."""

    name = "lca_height"
    cpu_block_bytes = CPU_BLOCK_BYTES
    kind = "leaf"
    higher_is_better = False
    description = "height of LCA(prediction, target), Karthik et al. 2021 (lower is better)"
    algorithms = {"cpu": "root-path sums of the mass that splits off, per level (one native pass a row on plain "
                         "float CPU tensors)",
                  "gpu": "the fused hdecode::path_score_best"}
    oracle, baseline = "reference:lca_height", "benchmarks.baselines:Baselines.lca_height"

    def _values(self, h, pred, target):
        return lca_height_values(h, pred, target)

    def expected_table(self, post):
        return lca_height_table(post)

    def _decode_default(self, post):
        if _native_route(post):  # the same sums and choice in one native pass a row, no (N, B) table
            pred = path_argbest(post.h, post.probs, *_native_args(post.h, post.dtype))
            if pred is not None:
                warm_torch_path(self, post, None)
                return pred
        return lca_height_decode(post)

    def _decode_gpu(self, post):
        return lca_height_decode_fused(post)

    accepts_topk = True

    def _decode_topk(self, ct):
        return support_least_lca_height(ct.h, ct.listed, ct.weights, ct.indices,
                                        "topk_lca" if ct.prior is None else None)

    def _candidates_topk(self, ct):
        return lca_height_candidates(ct.h, ct.listed, ct.weights, "topk_lca" if ct.prior is None else None)

    def _decode_certified_topk(self, ct):
        # the decoder's candidates once, for the decision and its certificate
        candidates = self._candidates_topk(ct)
        pred = least_lca_height_of(ct.h, candidates, ct.batch_size)
        return (pred, *certify_least_lca_height(ct.h, ct.listed, ct.polytope(), pred, candidates))

    def _certify_topk(self, ct, pred):
        return certify_least_lca_height(ct.h, ct.listed, ct.polytope(), pred, self._candidates_topk(ct))

    def _expected_topk(self, ct, pred):
        # Σ_s height(a_{s+1})·(p̃(a_{s+1}) − p̃(a_s)) up h's root path, + height(h)·p̃(h) (O(B·D·log k))
        path = ct.root_paths(pred)
        p = ct.node_mass(path)
        height = ct.h.height.to(torch.float64)
        return (height[path[:, 1:]] * (p[:, 1:] - p[:, :-1])).sum(1) + height[pred] * p[:, 0]
