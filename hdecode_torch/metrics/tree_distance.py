"""Tree distance (mistake severity): the length d(h) + d(y) − 2 d(LCA(h, y)) of the tree path between
prediction and target, and its depth-penalised form tree distance + c·d(h) (Cao et al. 2024).

Expected value of predicting node h: d(h) + E[d(y)] − 2 E[d(LCA(h, y))] (+ c·d(h)), with
E[d(LCA(h, y))] = Σ_{a ∈ A(h), a ≠ root} p(a) — one root-path sum, O(B·N).

Optimal decoder (closed form): moving from a node n to its child m changes the expected distance by
1 − 2 p(m) (+ c), so the risk falls along the path of children with p(m) > (1 + c)/2 and rises
elsewhere: the answer is the deepest node with p(n) > (1 + c)/2, the root if none (Ramaswamy et al.
2015; Cao et al. 2024).  The nodes with p(n) > 1/2 form one root path, so there are no ties between
nodes of equal depth; on a single-child chain the deeper node wins.  The rule is strict: a child m with
p(m) exactly (1 + c)/2 has the expected distance of its parent and is not taken, so that exact tie goes
to the shallower node.  O(B·N).
"""

from __future__ import annotations

import torch

from ..core.chunking import CPU_BLOCK_BYTES
from ..core.params import Flag, Param
from ..core.conversion import warn_user
from ..core.scalar_checks import check_nonnegative
from ..kernels.ancestry import lca_depth
from ..kernels.certificate import certify_deepest_above, path_intervals, tree_distance_regret_bound
from ..kernels import native
from ..kernels.selection import deepest_above, deepest_above_from_leaves
from ..kernels.support import support_deepest_above
from .base import NodeMetric

__all__ = ["TreeDistance", "TreeDistanceC", "tree_distance_values", "tree_distance_table", "tree_distance_decode",
           "DEFAULT_C", "tree_distance_decode_fused"]

#: Default depth penalty of ``tree_distance_c``: the decision threshold moves from p(n) > 1/2 to
#: p(n) > 3/4.  Any c ≥ 1 puts the threshold (1 + c)/2 at 1 or above, which no node can pass: the
#: optimal prediction is then the root for every input.
DEFAULT_C = 0.5


def tree_distance_values(h, pred: torch.Tensor, target: torch.Tensor, c: float = 0.0) -> torch.Tensor:
    d = h.depth
    out = (d[pred] + d[target] - 2 * lca_depth(h, pred, target)).to(torch.float64)
    return out + c * d[pred].to(torch.float64) if c else out


def tree_distance_table(post, c: float = 0.0) -> torch.Tensor:
    """(N, B) expected (penalised) tree distance of predicting each node."""
    depth = post.h.depth.to(post.dtype)[:, None]
    return (1 + c) * depth + post.expected_leaf_depth()[None, :] - 2 * post.ancestor_mass()


def tree_distance_decode(post, c: float = 0.0) -> torch.Tensor:
    """(B,) int64 the deepest node with p(n) > (1 + c)/2 (compared in the probabilities' dtype), the root if none,
    from the Posterior's node probabilities (:meth:`Posterior.node_rule <hdecode_torch.Posterior.node_rule>`:
    fused with the node sums in one native pass a row where it can be)."""
    h, probs, t = post.h, post.probs, (1 + c) / 2
    return post.node_rule(lambda p: deepest_above(h, p, t), lambda _, acc: native.deepest_above(h, probs, t, acc))


def tree_distance_decode_fused(post, c: float = 0.0) -> torch.Tensor:
    """:func:`tree_distance_decode` as one fused pass over the leaf probabilities (float64 node sums
    and the decision, ``hdecode::best_ranked_above``): no (N, B) table."""
    return deepest_above_from_leaves(post.h, post.probs, (1 + c) / 2)


class TreeDistance(NodeMetric):
    """Length of the tree path between prediction and target: d(h) + d(y) − 2 d(LCA)."""

    name = "tree_distance"
    cpu_block_bytes = CPU_BLOCK_BYTES
    higher_is_better = False
    description = "path length between prediction and target (mistake severity; lower is better)"
    aliases = ("mistake_severity",)
    algorithms = {"cpu": "closed form: deepest node with p(n) > (1+c)/2",
                  "gpu": "closed form: deepest node with p(n) > (1+c)/2, the fused hdecode::best_ranked_above"}
    oracle, baseline = "reference:tree_distance", "benchmarks.baselines:Baselines.tree_distance"
    c = 0.0

    def _values(self, h, pred, target):
        return tree_distance_values(h, pred, target, self.c)

    def expected_table(self, post):
        return tree_distance_table(post, self.c)

    def _decode_default(self, post):
        return tree_distance_decode(post, self.c)

    def _decode_gpu(self, post):
        return tree_distance_decode_fused(post, self.c)

    accepts_topk = True

    def _decode_topk(self, ct):
        return support_deepest_above(ct.h, ct.listed, ct.weights, ct.indices, (1 + self.c) / 2,
                                     "topk_heaviest" if ct.prior is None else None)

    def _certify_topk(self, ct, pred):
        poly = ct.polytope()
        path = path_intervals(ct.h, ct.listed, poly, pred)
        t = (1 + self.c) / 2
        certified = certify_deepest_above(path, pred, ct.h.root, t)
        return certified, tree_distance_regret_bound(ct.h, path, poly, pred, t, certified)

    def _expected_topk(self, ct, pred):
        # (1 + c)·d(h) + E[d(y)] − 2 Σ_{a ∈ A(h), a ≠ root} p̃(a), on h's root path (O(B·D·log k))
        path = ct.root_paths(pred)
        p = torch.where(path != ct.h.root, ct.node_mass(path), 0.0)
        return (1 + self.c) * ct.h.depth[pred].to(torch.float64) + ct.expected_leaf_depth() - 2 * p.sum(1)


class TreeDistanceC(TreeDistance):
    """Tree distance plus ``c · d(h)`` (Cao et al. 2024), c ≥ 0.

    The optimal prediction is the deepest node with p(n) > (1 + c)/2.  ``c`` defaults to 1/2
    (threshold 3/4); with c ≥ 1 the threshold is at least 1 and the root is always optimal, which
    this class warns about.
    """

    name = "tree_distance_c"
    description = "tree distance + c * depth(prediction) (lower is better)"
    aliases = ()
    oracle, baseline = "reference:tree_distance_c", "benchmarks.baselines:Baselines.tree_distance_c"

    PARAMS = (Param("c", float, DEFAULT_C, check_nonnegative, doc="cost per level of the prediction's depth, >= 0",
                    grid=(0.5, 0.0, 2.0),
                    flag=Flag("--c", None, "cost c >= 0 per level of the prediction's depth. Its optimal rule predicts "
                                           "the deepest node with p(n) > (1+c)/2, so any c >= 1 makes that threshold "
                                           ">= 1 and the root the answer for every sample", lower=0.0)),)

    def __init__(self, hierarchy, *args, **kw):
        super().__init__(hierarchy, *args, **kw)
        if self.c >= 1:
            warn_user(f"tree_distance_c with c = {self.c:g} >= 1: the decision threshold (1 + c)/2 is at least 1, so "
                      "the optimal prediction is the root for every input")
