"""Heuristic decoders: common decision rules of the hierarchical-classification literature.

Each rule is a batched tensor program on the node-major probability table ``p`` (N, B)
of a :class:`~hdecode_torch.Posterior`: whole-batch reductions plus, where the rule walks
the tree, one step per tree level (never a loop over samples or nodes).

Tie rules (every decoder is deterministic, on CPU and GPU alike):

- rules that pick a *node* by a key (``confidence_threshold``, ``majority``, ``plurality``,
  ``darts``, ``expected_information``, ``information_threshold``, ``crm``): among exact
  ties on the key, the deeper node, then the smallest id.  On a unary chain the nodes
  share their leaf set, hence p, I and every key, so the lowest node of the chain wins.
  "Most informative" (max I(n)) is compared exactly, through the integer leaf counts |L(n)|,
  never through rounded logarithms;
- ``argmax_leaf`` and ``hie``: the smallest leaf id (so ``argmax_leaf`` is ``probs.argmax(-1)``);
- ``top_down``: at each step the child with the smallest id among the most probable ones.
"""

from __future__ import annotations

import math

import torch

from ..core.params import Param
from ..core.validation import check_nonnegative, check_unit_interval
from ..kernels.ancestry import is_ancestor
from ..kernels.descent import children_probs
from ..kernels.selection import argbest, most_informative_where
from ..metrics.lca_height import lca_height_decode, lca_height_decode_fused
from .base import Decoder

__all__ = [
    "ArgmaxLeaf", "TopDown", "ConfidenceThreshold", "Majority", "Plurality", "Darts",
    "ExpectedInformation", "InformationThreshold", "HiE", "CRM",
    "darts_predict", "hierarchically_correct",
]


# --------------------------------------------------------------------------- shared kernels
def darts_predict(h, p: torch.Tensor, lam: float) -> torch.Tensor:
    """argmax_n (I(n) + lam) p(n) per column of the node-major table ``p`` (N, B); ties: deeper, then smaller id."""
    info = h.information.to(p.dtype)[:, None]
    return argbest(h, (info + lam) * p, higher_is_better=True)


def hierarchically_correct(h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the target leaf lies under the predicted node (``pred`` ∈ A(target))."""
    return is_ancestor(h, pred, target)


# --------------------------------------------------------------------------- decoders
class ArgmaxLeaf(Decoder):
    """The most probable leaf (flat top-1).  Ties: the smallest leaf id, as ``probs.argmax(-1)``."""

    name = "argmax_leaf"
    description = "most probable leaf (flat top-1)"

    def _decode_cpu(self, post) -> torch.Tensor:
        return post.probs.argmax(dim=1)  # the first of equal maxima: the smallest id, on every backend


class TopDown(Decoder):
    """Greedy descent: from the root, step to the most probable child until a leaf.

    Ties: the smallest child id.  Steps into children of probability 0 too, so the
    answer is always a leaf.
    """

    name = "top_down"
    description = "from the root, step to the most probable child until a leaf"

    def _decode_cpu(self, post) -> torch.Tensor:
        h, p = post.h, post.node
        cur = torch.full((post.batch_size,), h.root, dtype=torch.long, device=p.device)
        for depth in range(h.max_depth):
            kids, valid, pk = children_probs(h, p, cur, depth)
            step = kids.gather(1, pk.argmax(1, keepdim=True))[:, 0]  # first max: the smallest id
            cur = torch.where(valid[:, 0], step, cur)  # a leaf stays
        return cur


class ConfidenceThreshold(Decoder):
    """The most informative node (max I(n)) with p(n) > tau.

    Ties in I (unary chains, or several nodes with as many leaves): the deeper node, then
    the smallest id.  With Σp = 1 the root always qualifies; if rounding leaves no node
    above ``tau``, the root is returned.  ``tau`` in [0, 1).
    """

    name = "confidence_threshold"
    description = "most informative node with p(n) > tau"

    PARAMS = (Param("tau", float, 0.5, check_unit_interval, doc="probability threshold in [0, 1)"),)

    def _decode_cpu(self, post) -> torch.Tensor:
        return most_informative_where(post.h, post.node > self.tau)


class Majority(ConfidenceThreshold):
    """``confidence_threshold`` with tau = 1/2: the deepest node with p(n) > 1/2.

    Nodes above 1/2 form a root path, so this is also the Bayes-optimal tree-distance decoder.
    """

    name = "majority"
    description = "deepest node with p(n) > 1/2 (confidence_threshold, tau = 1/2)"

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

    def _decode_cpu(self, post) -> torch.Tensor:
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


class Darts(Decoder):
    """DARTS (Deng et al. 2012): argmax_n (I(n) + lam) p(n), lam ≥ 0.

    lam = 0 maximises the expected information; lam → ∞ tends to the most probable node
    (the root, unless a smaller node holds all the mass).  Ties: the deeper node, then the
    smallest id.  :func:`~hdecode_torch.calibrate_darts` chooses lam for a target
    hierarchical accuracy.
    """

    name = "darts"
    description = "argmax (I(n) + lam) p(n), Deng et al. 2012"

    PARAMS = (Param("lam", float, 0.0, check_nonnegative, doc="weight of probability over information, >= 0"),)

    def _decode_cpu(self, post) -> torch.Tensor:
        return darts_predict(post.h, post.node, self.lam)


class ExpectedInformation(Darts):
    """argmax_n I(n) p(n) (DARTS with lam = 0).  Ties: the deeper node, then the smallest id."""

    name = "expected_information"
    description = "argmax I(n) p(n) (darts, lam = 0)"

    PARAMS = ()
    lam = 0.0


class InformationThreshold(Decoder):
    """The most probable node with I(n) ≥ threshold.

    Ties: the deeper node, then the smallest id.  Leaves have the largest information,
    log L, so some node qualifies iff threshold ≤ log L; a larger threshold is a
    ``ValueError`` at construction (``threshold = 0`` allows every node, hence the root).
    """

    name = "information_threshold"
    description = "most probable node with I(n) >= threshold"

    PARAMS = (Param("threshold", float, check=check_nonnegative, doc="least information I(n) = log(L/|L(n)|), >= 0"),)

    def __init__(self, hierarchy, *args, **kw):
        super().__init__(hierarchy, *args, **kw)
        threshold = self.threshold
        max_info = math.log(hierarchy.num_leaves)
        if float(hierarchy.information.max()) < self.threshold:
            raise ValueError(
                f"Expected `threshold` to be at most the information of a leaf, log(L) = {max_info:.6g} "
                f"(L = {hierarchy.num_leaves}), but got {threshold}: no node would qualify"
            )


    def _decode_cpu(self, post) -> torch.Tensor:
        h = post.h
        allowed = h.cached(("heuristics.info_at_least", self.threshold),
                           lambda: (h.information >= self.threshold)[:, None])
        return argbest(h, post.node, higher_is_better=True, mask=allowed)


class HiE(Decoder):
    """HiE (Jain et al. 2023): the leaf maximising p(parent(l)) · p(l).

    Ties: the smallest leaf id.  A root that is itself a leaf (1-node tree) uses p(l).
    """

    name = "hie"
    description = "leaf maximising p(parent(l)) * p(l), Jain et al. 2023"

    def _decode_cpu(self, post) -> torch.Tensor:
        h = post.h
        leaf_parent = h.cached("heuristics.leaf_parent", lambda: torch.where(
            h.parent[: h.num_leaves] >= 0, h.parent[: h.num_leaves], torch.arange(h.num_leaves, device=h.device)))
        return (post.node.index_select(0, leaf_parent) * post.probs.t()).argmax(dim=0)  # first max: smallest id


class CRM(Decoder):
    """CRM (Karthik et al. 2021): the leaf minimising the expected LCA height (Bayes-optimal ``lca_height``).

    Ties: the deeper leaf, then the smallest id (the rule of ``argbest``).
    """

    name = "crm"
    description = "leaf minimising the expected LCA height (Karthik et al. 2021)"

    def _decode_cpu(self, post):
        return lca_height_decode(post)

    def _decode_gpu(self, post):
        return lca_height_decode_fused(post)
