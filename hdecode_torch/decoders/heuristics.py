"""Heuristic decoders: common decision rules of the hierarchical-classification literature.

Each rule is a batched tensor program on the node-major probability table ``p`` (N, B)
of a :class:`~hdecode_torch.Posterior`: whole-batch reductions plus, where the rule walks
the tree, one step per tree level (never a loop over samples or nodes).

Tie rules (every decoder is deterministic: the same input on the same plan and device gives the
same node, in any batch and any chunking):

- rules that pick a *node* by a key (``confidence_threshold``, ``majority``, ``plurality``,
  ``darts``, ``expected_information``, ``information_threshold``, ``crm``): among exact
  ties on the key, the deeper node, then the smallest id.  On a unary chain the nodes
  share their leaf set, hence p, I and every key, so the lowest node of the chain wins.
  "Most informative" (max I(n)) is compared exactly, through the integer leaf counts |L(n)|,
  never through rounded logarithms;
- ``argmax_leaf`` and ``hie``: the smallest leaf id (so ``argmax_leaf`` is ``probs.argmax(-1)``);
- ``top_down``: at each step the child with the smallest id among the most probable ones.

Top-k inputs (:class:`~hdecode_torch.TopK`): every rule here decodes the list on its support
(:mod:`hdecode_torch.kernels.support`, :mod:`hdecode_torch.kernels.support_heuristics`), the node it picks on
the completed table with the tie rules above, in O(B·k·D·log(B·k·D)) (masses and keys in float64: equal to the
dense rule's node on the float64 completed table wherever its node sums are exact).
``confidence_threshold`` below 1/2: the nodes above tau then need not lie on one root path, and the most
informative of them may be any off-support node whose r·W(n) passes tau: the first such node of the
informative order, found between the row's support nodes by range maxima of W.  ``crm`` is ``lca_height``'s
support decoder.  Off the support
p̃(n) = r·W(n) and I(n) are tree tables, so each rule's best off-support node is the first node of a fixed
order of the tree (by its key with p̃ = r·W, ties as above) missing from the row's support.

What is the same on both plans (CPU and GPU, see :func:`~hdecode_torch.plan_for`).  The plans
compute the node probabilities differently: the CPU plan adds children level by level in the
compute dtype, the GPU plan takes differences of float64 prefix sums over the leaves in depth-first
order, rounded to the compute dtype (and p of a one-leaf node is that leaf's entry).  So:

- where every node sum of a row is exact on both plans (each partial sum representable in the
  compute dtype, e.g. rows of multiples of 1/16), every heuristic returns the same node on both,
  ties included;
- whatever the values, a node whose leaves of positive probability all lie under one child has
  that child's probability in exact arithmetic; the computed values can differ in the last bit
  on the GPU plan, so there :func:`mass_in_one_child` (exact integer counts) settles these ties
  as exact arithmetic does: ``confidence_threshold``, ``majority``, ``information_threshold``,
  ``darts`` and ``expected_information`` never return such a node in place of its child (on the
  CPU plan the sums add exact zeros and the tie already goes to the deeper child), and ``hie``
  takes the probability of such a parent from its leaf;
- otherwise, where two candidates' keys (or a probability and ``tau``) differ by less than the
  rounding of the sums, the plans may choose differently; either answer is the rule's for the
  row perturbed within that rounding.
"""

from __future__ import annotations

import math

import torch

from ..core.chunking import CPU_BLOCK_BYTES
from ..core.params import Flag, Param
from ..core.scalar_checks import check_nonnegative, check_unit_interval
from ..kernels.ancestry import is_ancestor
from ..kernels.descent import children_probs
from ..kernels.selection import above, argbest, most_informative_where
from ..kernels.support import support_best_leaf, support_deepest_above, support_least_lca_height, support_top_down
from ..kernels.support_heuristics import (support_darts, support_hie, support_information_threshold,
                                          support_most_informative_above, support_plurality)
from ..metrics.lca_height import lca_height_decode, lca_height_decode_fused
from .base import Decoder

__all__ = [
    "ArgmaxLeaf", "TopDown", "ConfidenceThreshold", "Majority", "Plurality", "Darts",
    "ExpectedInformation", "InformationThreshold", "HiE", "CRM",
    "darts_predict", "hierarchically_correct", "mass_in_one_child", "half_log_leaves",
]


# --------------------------------------------------------------------------- shared kernels
def darts_predict(h, p: torch.Tensor, lam: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """argmax_n (I(n) + lam) p(n) per column of the node-major table ``p`` (N, B), over the nodes
    ``mask`` (N, B) bool allows (default all); ties: deeper, then smaller id."""
    info = h.information.to(p.dtype)[:, None]
    return argbest(h, (info + lam) * p, higher_is_better=True, mask=mask)


def mass_in_one_child(post) -> torch.Tensor:
    """(N, B) bool: the internal nodes whose leaves of positive probability all lie under one child, or
    that have none.  Such a node's p(n) is its child's (or 0) in exact arithmetic, so a rule that
    prefers deeper nodes among equal probabilities never returns it.

    Taken from exact integer counts of the positive leaves under each node, hence the same on every
    plan and device, whereas the computed p(n) and p(child) can differ in the last bit: the GPU plan
    takes p of a one-leaf node from the leaf itself and p of its ancestors as differences of float64
    prefix sums (the CPU plan's per-level sums add exact zeros and keep them equal).  O(B·N), one tree
    sum of the counts and one scatter-add over parent links.
    """
    h = post.h
    count = post.positive_leaf_count  # (N, B), exact integers, shared by the decoders of this batch
    child, parent = h.cached("heuristics.parent_links", lambda: (
        torch.nonzero(h.parent >= 0).flatten(), h.parent[h.parent >= 0]))
    holds_all = (count.index_select(0, child) == count.index_select(0, parent)).to(torch.float64)
    held = torch.zeros_like(count).index_add_(0, parent, holds_all)  # children holding all their parent's mass
    internal = h.cached("heuristics.internal", lambda: (~h.is_leaf)[:, None])
    return internal & ((held > 0) | (count == 0))


def half_log_leaves(h) -> float:
    """½·log L rounded, i.e. nodes with at most about √L leaves.

    The command line's ``information_threshold``: half of a leaf's information, rounded to two decimals.
    """
    return round(0.5 * math.log(max(h.num_leaves, 1)), 2)


def hierarchically_correct(h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the target leaf lies under the predicted node (``pred`` ∈ A(target))."""
    return is_ancestor(h, pred, target)


# --------------------------------------------------------------------------- decoders
class ArgmaxLeaf(Decoder):
    """The most probable leaf (flat top-1).  Ties: the smallest leaf id, as ``probs.argmax(-1)``."""

    name = "argmax_leaf"
    description = "most probable leaf (flat top-1)"
    kind = "leaf"
    exact_on_dyadic = True
    algorithms = {"cpu": "argmax over the leaves", "gpu": "argmax over the leaves"}
    baseline = "benchmarks.baselines:Baselines.argmax_leaf"

    accepts_topk = True

    def _decode_default(self, post) -> torch.Tensor:
        return post.probs.argmax(dim=1)  # the first of equal maxima: the smallest id, on every backend

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_best_leaf(ct.h, ct.listed, ct.values, ct.indices, ct.prior)


class TopDown(Decoder):
    """Greedy descent: from the root, step to the most probable child until a leaf.

    Ties: the smallest child id.  Steps into children of probability 0 too, so the
    answer is always a leaf.
    """

    name = "top_down"
    description = "from the root, step to the most probable child until a leaf"
    kind = "leaf"
    exact_on_dyadic = True
    algorithms = {"cpu": "greedy descent, one step per level", "gpu": "greedy descent, one step per level"}
    baseline = "benchmarks.baselines:Baselines.top_down"

    def _decode_default(self, post) -> torch.Tensor:
        h, p = post.h, post.node
        cur = torch.full((post.batch_size,), h.root, dtype=torch.long, device=p.device)
        for depth in range(h.max_depth):
            kids, valid, pk = children_probs(h, p, cur, depth)
            step = kids.gather(1, pk.argmax(1, keepdim=True))[:, 0]  # first max: the smallest id
            cur = torch.where(valid[:, 0], step, cur)  # a leaf stays
        return cur

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_top_down(ct.h, ct.listed, ct.weights, ct.indices,
                                "topk_heaviest" if ct.prior is None else None)


class ConfidenceThreshold(Decoder):
    """The most informative node (max I(n)) with p(n) > tau.

    Ties in I (unary chains, or several nodes with as many leaves): the deeper node, then
    the smallest id.  With Σp = 1 the root always qualifies; if rounding leaves no node
    above ``tau``, the root is returned.  ``tau`` in [0, 1).  A node whose positive mass lies
    in one child is never returned (the child has the same p and more information), on both
    plans alike (module docstring).
    """

    name = "confidence_threshold"
    cpu_block_bytes = CPU_BLOCK_BYTES
    description = "most informative node with p(n) > tau"
    exact_on_dyadic = True
    algorithms = {"cpu": "most informative node above the threshold",
                  "gpu": "most informative node above the threshold, nodes whose mass lies in one child left out"}
    baseline = "benchmarks.baselines:Baselines.confidence_threshold"

    # The command line's tau: 1/2 is `majority`, already a decoder of its own; 0.8 is a distinct, more
    # cautious rule.
    PARAMS = (Param("tau", float, 0.5, check_unit_interval, doc="probability threshold in [0, 1)",
                    grid=(0.3, 0.0, 0.75),
                    flag=Flag("--tau", 0.8, "the most informative node with p(n) > tau, 0 <= tau < 1")),)

    def _decode_default(self, post) -> torch.Tensor:
        return most_informative_where(post.h, above(post.h, post.node, self.tau))

    def _decode_gpu(self, post) -> torch.Tensor:
        # A node whose mass lies in one child loses to that child in exact arithmetic (the same p, more
        # informative): left out, so that p(n) rounded an ulp above tau cannot let it through.
        return most_informative_where(post.h, (post.node > self.tau) & ~mass_in_one_child(post))

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        # Above tau >= 1/2 the nodes form one root path (two disjoint subtrees cannot both hold more than half
        # the mass), whose deepest node is the most informative: the support kernel's descent.  Below 1/2 they
        # need not: the most informative of them may lie anywhere off the support, a search of the informative
        # order.
        if self.tau < 0.5:
            return support_most_informative_above(ct.h, ct.listed, ct.weights, self.tau,
                                                  "topk_informative_max" if ct.prior is None else None)
        return support_deepest_above(ct.h, ct.listed, ct.weights, ct.indices, self.tau,
                                     "topk_heaviest" if ct.prior is None else None)


class Majority(ConfidenceThreshold):
    """``confidence_threshold`` with tau = 1/2: the deepest node with p(n) > 1/2.

    Nodes above 1/2 form a root path, so this is also the Bayes-optimal tree-distance decoder.
    """

    name = "majority"
    description = "deepest node with p(n) > 1/2 (confidence_threshold, tau = 1/2)"
    baseline = "benchmarks.baselines:Baselines.majority"

    PARAMS = ()
    tau = 0.5


class Plurality(Decoder):
    """The most informative node n with p(n) > p(z) for every z ∉ A(n).

    z ranges over n's strict descendants and over every node off n's root path; the root
    must beat all other nodes too.  Ties in I: the deeper node, then the smallest id.
    With Σp = 1 the deepest node holding all the mass always qualifies; if rounding leaves
    none, the root is returned.
    """

    name = "plurality"
    description = "most informative node more probable than every node outside its root path"
    exact_on_dyadic = True
    algorithms = {"cpu": "rank of each node's p(n) against its depth", "gpu": "rank of each node's p(n) against its depth"}
    baseline = "benchmarks.baselines:Baselines.plurality"

    def _decode_default(self, post) -> torch.Tensor:
        # Two qualifying nodes off each other's root paths would each beat the other, so the
        # qualifying nodes lie on one path, and each is the unique most probable child of its
        # parent: the path of a strict top-down descent.  Walk it, carrying the best probability
        # seen among the siblings passed (each sibling tops its subtree); n qualifies when p(n)
        # beats those and its best child.  The deepest qualifying node is the most informative.
        h, p = post.h, post.node
        bsz = post.batch_size
        cols = torch.arange(bsz, device=p.device)
        cur = torch.full((bsz,), h.root, dtype=torch.long, device=p.device)
        off = torch.full((bsz,), -math.inf, dtype=p.dtype, device=p.device)
        out = cur.clone()
        walking = torch.ones(bsz, dtype=torch.bool, device=p.device)
        for depth in range(h.max_depth + 1):
            kids, valid, pk = children_probs(h, p, cur, depth)
            best, j = pk.max(1)
            second = pk.scatter(1, j[:, None], -math.inf).amax(1)
            out = torch.where(walking & (p[cur, cols] > torch.maximum(off, best)), cur, out)
            walking &= valid[:, 0] & (best > second)  # at a leaf, or a tie for the top child: stop
            off = torch.maximum(off, second)
            cur = torch.where(walking, kids.gather(1, j[:, None])[:, 0], cur)
        return out

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_plurality(ct.h, ct.listed, ct.weights, "topk_heaviest" if ct.prior is None else None)


class Darts(Decoder):
    """DARTS (Deng et al. 2012): argmax_n (I(n) + lam) p(n), lam ≥ 0.

    lam = 0 maximises the expected information; lam → ∞ tends to the most probable node
    (the root, unless a smaller node holds all the mass).  Ties: the deeper node, then the
    smallest id.  :func:`~hdecode_torch.calibrate_darts` chooses lam for a target
    hierarchical accuracy.
    """

    name = "darts"
    cpu_block_bytes = CPU_BLOCK_BYTES
    description = "argmax (I(n) + lam) p(n), Deng et al. 2012"
    exact_on_dyadic = False  # I(n) is a logarithm
    algorithms = {"cpu": "argmax of (I(n) + lam) p(n)",
                  "gpu": "argmax of (I(n) + lam) p(n), nodes whose mass lies in one child left out"}
    baseline = "benchmarks.baselines:Baselines.darts"

    # The command line's lam: lam = 0 is `expected_information`, a decoder of its own.
    PARAMS = (Param("lam", float, 0.0, check_nonnegative, doc="weight of probability over information, >= 0",
                    grid=(0.5, 0.0, 3.0), flag=Flag("--lam", 1.0, "argmax (I(n) + lam) p(n)")),)

    def _decode_default(self, post) -> torch.Tensor:
        return darts_predict(post.h, post.node, self.lam)

    def _decode_gpu(self, post) -> torch.Tensor:
        # a node whose mass lies in one child never beats it in exact arithmetic (same p, I at most the child's)
        return darts_predict(post.h, post.node, self.lam, mask=~mass_in_one_child(post))

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_darts(ct.h, ct.listed, ct.weights, self.lam, "topk_darts_order" if ct.prior is None else None)


class ExpectedInformation(Darts):
    """argmax_n I(n) p(n) (DARTS with lam = 0).  Ties: the deeper node, then the smallest id."""

    name = "expected_information"
    description = "argmax I(n) p(n) (darts, lam = 0)"
    baseline = "benchmarks.baselines:Baselines.expected_information"

    PARAMS = ()
    lam = 0.0


class InformationThreshold(Decoder):
    """The most probable node with I(n) ≥ threshold.

    Ties: the deeper node, then the smallest id, so a node whose positive mass lies in one
    child (the same p, in exact arithmetic) loses to that child, on both plans alike (module
    docstring).  Leaves have the largest information, log L, so some node qualifies iff
    threshold ≤ log L; a larger threshold is a ``ValueError`` at construction
    (``threshold = 0`` allows every node, hence the root).
    """

    name = "information_threshold"
    cpu_block_bytes = CPU_BLOCK_BYTES
    description = "most probable node with I(n) >= threshold"
    exact_on_dyadic = True
    algorithms = {"cpu": "most probable node among those with I(n) >= threshold",
                  "gpu": "most probable node among those with I(n) >= threshold, nodes whose mass lies in one "
                         "child left out"}
    baseline = "benchmarks.baselines:Baselines.information_threshold"

    PARAMS = (Param("threshold", float, check=check_nonnegative, doc="least information I(n) = log(L/|L(n)|), >= 0",
                    grid=(0.0, 0.5, 1.2),
                    flag=Flag("--info-threshold", half_log_leaves, "the most probable node with I(n) >= threshold")),)

    def __init__(self, hierarchy, *args, **kw):
        super().__init__(hierarchy, *args, **kw)
        threshold = self.threshold
        max_info = math.log(hierarchy.num_leaves)
        if float(hierarchy.information.max()) < self.threshold:
            raise ValueError(
                f"Expected `threshold` to be at most the information of a leaf, log(L) = {max_info:.6g} "
                f"(L = {hierarchy.num_leaves}), but got {threshold}: no node would qualify"
            )


    def _allowed(self, h) -> torch.Tensor:
        return h.cached(("heuristics.info_at_least", self.threshold), lambda: (h.information >= self.threshold)[:, None])

    def _decode_default(self, post) -> torch.Tensor:
        return argbest(post.h, post.node, higher_is_better=True, mask=self._allowed(post.h))

    def _decode_gpu(self, post) -> torch.Tensor:
        # A node whose mass lies in one child ties with it in exact arithmetic, and the child, deeper and
        # at least as informative, wins: left out, so that rounding cannot break the tie the other way.
        allowed = self._allowed(post.h) & ~mass_in_one_child(post)
        return argbest(post.h, post.node, higher_is_better=True, mask=allowed)

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_information_threshold(ct.h, ct.listed, ct.weights, self._allowed(ct.h)[:, 0], self.threshold,
                                             "topk_info_threshold_order" if ct.prior is None else None)


class HiE(Decoder):
    """HiE (Jain et al. 2023): the leaf maximising p(parent(l)) · p(l).

    Ties: the smallest leaf id.  A root that is itself a leaf (1-node tree) uses p(l).
    """

    name = "hie"
    cpu_block_bytes = CPU_BLOCK_BYTES
    description = "leaf maximising p(parent(l)) * p(l), Jain et al. 2023"
    kind = "leaf"
    exact_on_dyadic = True
    algorithms = {"cpu": "argmax of p(parent(l)) p(l) over the leaves",
                  "gpu": "argmax of p(parent(l)) p(l) over the leaves, a parent whose mass lies in one child "
                         "taking the leaf's p"}
    baseline = "benchmarks.baselines:Baselines.hie"

    @staticmethod
    def _leaf_parent(h) -> torch.Tensor:
        return h.cached("heuristics.leaf_parent", lambda: torch.where(
            h.parent[: h.num_leaves] >= 0, h.parent[: h.num_leaves], torch.arange(h.num_leaves, device=h.device)))

    def _decode_default(self, post) -> torch.Tensor:
        parent_p = post.node.index_select(0, self._leaf_parent(post.h))
        return (parent_p * post.probs.t()).argmax(dim=0)  # first max: smallest id

    def _decode_gpu(self, post) -> torch.Tensor:
        # A parent whose mass lies in one child has that child's p in exact arithmetic: taken from the
        # leaf itself (exact), not from the parent's rounded sum, so such ties break as on the CPU plan.
        leaf_parent = self._leaf_parent(post.h)
        leaf_p = post.probs.t()
        alone = mass_in_one_child(post).index_select(0, leaf_parent)
        parent_p = torch.where(alone, leaf_p, post.node.index_select(0, leaf_parent))
        return (parent_p * leaf_p).argmax(dim=0)

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_hie(ct.h, ct.listed, ct.weights, ct.values, ct.indices, ct.prior,
                           "topk_hie_tables" if ct.prior is None else None)


class CRM(Decoder):
    """CRM (Karthik et al. 2021): the leaf minimising the expected LCA height (Bayes-optimal ``lca_height``).

    Ties: the deeper leaf, then the smallest id (the rule of ``argbest``).
    """

    name = "crm"
    cpu_block_bytes = CPU_BLOCK_BYTES
    description = "leaf minimising the expected LCA height (Karthik et al. 2021)"
    kind = "leaf"
    exact_on_dyadic = True
    algorithms = {"cpu": "lca_height's decoder: root-path sums of the mass that splits off",
                  "gpu": "lca_height's decoder: the fused hdecode::path_score_best"}
    baseline = "benchmarks.baselines:Baselines.crm"

    def _decode_default(self, post):
        return lca_height_decode(post)

    def _decode_gpu(self, post):
        return lca_height_decode_fused(post)

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        return support_least_lca_height(ct.h, ct.listed, ct.weights, ct.indices,
                                        "topk_lca" if ct.prior is None else None)
