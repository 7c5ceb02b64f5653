"""Heuristic decoders (SPEC §4.2): common decision rules of the hierarchical-classification literature.

Each rule is a batched tensor program on the node-major probability table ``p`` (N, B)
of a :class:`~hdecode_torch.Posterior`: whole-batch reductions plus, where the rule walks
the tree, one step per tree level (never a loop over samples or nodes).

Tie rules (every decoder is deterministic, on CPU and GPU alike):

- rules that pick a *node* by a key (``confidence_threshold``, ``majority``, ``plurality``,
  ``darts``, ``expected_information``, ``information_threshold``, ``crm``): among exact
  ties on the key, the deeper node, then the smallest id.  On a unary chain the nodes
  share their leaf set, hence p, I and every key, so the lowest node of the chain wins
  (SPEC §4.2).  "Most informative" (max I(n)) is compared exactly, through the integer
  leaf counts |L(n)|, never through rounded logarithms;
- ``argmax_leaf`` and ``hie``: the smallest leaf id (so ``argmax_leaf`` is ``probs.argmax(-1)``);
- ``top_down``: at each step the child with the smallest id among the most probable ones.
"""

from __future__ import annotations

import math

import torch

from ..kernels.ancestry import argbest
from ..kernels.validation import check_nonnegative, check_unit_interval
from ..metrics.posterior import Posterior
from .base import Decoder

__all__ = [
    "ArgmaxLeaf", "TopDown", "ConfidenceThreshold", "Majority", "Plurality", "Darts",
    "ExpectedInformation", "InformationThreshold", "HiE", "CRM",
    "darts_predict", "hierarchically_correct",
]


# --------------------------------------------------------------------------- tree tables
def _nonroot(h) -> tuple[torch.Tensor, torch.Tensor]:
    """(every non-root node, its parent), cached."""
    def build():
        ids = torch.arange(h.num_nodes, device=h.device)
        child = ids[h.parent >= 0]
        return child, h.parent[child]
    return h.cached("heuristics.nonroot", build)


def _informative_rank(h) -> torch.Tensor:
    """(N,) int64, a distinct rank per node: fewer leaves first (max I, exact), then deeper, then smaller id.

    Folding the three-level order into one integer turns "most informative allowed node"
    into a single masked max with no ties to break afterwards.
    """
    def build():
        n, d1 = h.num_nodes, h.max_depth + 1
        ids = torch.arange(n, device=h.device)
        return (h.num_leaves - h.leaf_count) * (d1 * n) + h.depth * n + (n - 1 - ids)
    return h.cached("heuristics.informative_rank", build)


def _most_informative(h, allowed: torch.Tensor) -> torch.Tensor:
    """allowed: (N, B) bool.  Per column, the allowed node of highest :func:`_informative_rank`;
    the root where none is allowed (possible only through rounding when Σp < 1)."""
    rank = _informative_rank(h)
    masked = torch.where(allowed, rank[:, None], torch.full_like(rank[:, None], -1))
    best, idx = masked.max(dim=0)
    return torch.where(best >= 0, idx, torch.full_like(idx, h.root))


def _first_argmax(values: torch.Tensor) -> torch.Tensor:
    """values: (K, B).  Index of the first maximal row per column, independent of backend."""
    k = values.shape[0]
    best = values.max(dim=0, keepdim=True).values
    ids = torch.arange(k, device=values.device)
    key = torch.where(values == best, (k - 1 - ids)[:, None], torch.full_like(ids[:, None], -1))
    return key.argmax(dim=0)


def _reduce_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor, reduce: str) -> torch.Tensor:
    """In place ``out[index[j]] = reduce(out[index[j]], src[j])`` over rows (out (N, B), src (K, B)).

    ``scatter_reduce_`` rather than the still-beta ``index_reduce_``; max and min do not
    depend on the order of accumulation, so the result is deterministic on every backend.
    """
    return out.scatter_reduce_(0, index[:, None].expand_as(src), src, reduce, include_self=True)


def _child_max(h, p: torch.Tensor) -> torch.Tensor:
    """(N, B) max of p over each node's children, -inf on leaves."""
    child, par = _nonroot(h)
    return _reduce_rows(torch.full_like(p, -math.inf), par, p[child], "amax")


# --------------------------------------------------------------------------- shared kernels
def darts_predict(h, p: torch.Tensor, lam: float) -> torch.Tensor:
    """argmax_n (I(n) + lam) p(n) per column of the node-major table ``p`` (N, B); ties: deeper, then smaller id."""
    info = h.information.to(p.dtype)[:, None]
    return argbest(h, (info + lam) * p, higher_is_better=True)


def hierarchically_correct(h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(B,) bool: the target leaf lies under the predicted node (``pred`` ∈ A(target))."""
    return h.ancestors[target, h.depth[pred]] == pred


# --------------------------------------------------------------------------- decoders
class ArgmaxLeaf(Decoder):
    """The most probable leaf (flat top-1).  Ties: the smallest leaf id, as ``probs.argmax(-1)``."""

    name = "argmax_leaf"
    description = "most probable leaf (flat top-1)"

    def _decode(self, post: Posterior) -> torch.Tensor:
        return _first_argmax(post.probs.t())


class TopDown(Decoder):
    """Greedy descent: from the root, step to the most probable child until a leaf.

    Ties: the smallest child id.  Steps into children of probability 0 too, so the
    answer is always a leaf.
    """

    name = "top_down"
    description = "from the root, step to the most probable child until a leaf"

    def _decode(self, post: Posterior) -> torch.Tensor:
        h, p = post.h, post.node
        n = h.num_nodes
        child, par = _nonroot(h)
        best = _child_max(h, p)
        # choice[n, b] = the smallest child of n attaining the best child probability (n if a leaf),
        # so each descent step is one gather for the whole batch.
        is_best = p[child] == best[par]
        cand = torch.where(is_best, child[:, None], torch.full_like(child[:, None], n))
        choice = _reduce_rows(torch.full_like(p, n, dtype=torch.long), par, cand, "amin")
        leaf = torch.arange(n, device=p.device)[:, None].expand_as(choice)
        choice = torch.where(choice == n, leaf, choice)
        cur = torch.full((post.batch_size,), h.root, dtype=torch.long, device=p.device)
        for _ in range(h.max_depth):
            cur = choice.gather(0, cur[None])[0]
        return cur


class ConfidenceThreshold(Decoder):
    """The most informative node (max I(n)) with p(n) > tau.

    Ties in I (unary chains, or several nodes with as many leaves): the deeper node, then
    the smallest id.  With Σp = 1 the root always qualifies; if rounding leaves no node
    above ``tau``, the root is returned.  ``tau`` in [0, 1).
    """

    name = "confidence_threshold"
    description = "most informative node with p(n) > tau"

    def __init__(self, hierarchy, tau: float = 0.5, *, validate: bool = True):
        super().__init__(hierarchy, validate=validate)
        self.tau = check_unit_interval(tau, "tau")

    @property
    def params(self) -> dict:
        return {"tau": self.tau}

    def _decode(self, post: Posterior) -> torch.Tensor:
        return _most_informative(post.h, post.node > self.tau)


class Majority(ConfidenceThreshold):
    """``confidence_threshold`` with tau = 1/2: the deepest node with p(n) > 1/2.

    Nodes above 1/2 form a root path, so this is also the Bayes-optimal tree-distance decoder.
    """

    name = "majority"
    description = "deepest node with p(n) > 1/2 (confidence_threshold, tau = 1/2)"

    def __init__(self, hierarchy, *, validate: bool = True):
        super().__init__(hierarchy, 0.5, validate=validate)

    @property
    def params(self) -> dict:
        return {}


class Plurality(Decoder):
    """The most informative node n with p(n) > p(z) for every z ∉ A(n).

    z ranges over n's strict descendants and over every node off n's root path; the root
    must beat all other nodes too.  Ties in I: the deeper node, then the smallest id.
    With Σp = 1 the deepest node holding all the mass always qualifies; if rounding leaves
    none, the root is returned.
    """

    name = "plurality"
    description = "most informative node more probable than every node outside its root path"

    def _decode(self, post: Posterior) -> torch.Tensor:
        h, p = post.h, post.node
        child, par = _nonroot(h)
        ninf = torch.full_like(p, -math.inf)
        best = _child_max(h, p)  # also max over all strict descendants: p only grows going up
        # Best probability among each node's siblings, from the top-2 children of its parent.
        pc = p[child]
        is_best = pc == best[par]
        count = torch.zeros_like(p).index_add_(0, par, is_best.to(p.dtype))
        second = _reduce_rows(ninf.clone(), par, pc.masked_fill(is_best, -math.inf), "amax")
        sib = ninf.clone()
        sib[child] = torch.where(~is_best | (count[par] > 1), best[par], second[par])
        # Off-path nodes of n are the sibling subtrees along A(n), each topped by the sibling itself.
        off = sib
        for nodes in h.levels[1:]:
            off[nodes] = torch.maximum(off[nodes], off[h.parent[nodes]])
        return _most_informative(h, p > torch.maximum(best, off))


class Darts(Decoder):
    """DARTS (Deng et al. 2012): argmax_n (I(n) + lam) p(n), lam ≥ 0.

    lam = 0 maximises the expected information; lam → ∞ tends to the most probable node
    (the root, unless a smaller node holds all the mass).  Ties: the deeper node, then the
    smallest id.  :func:`~hdecode_torch.calibrate_darts` chooses lam for a target
    hierarchical accuracy.
    """

    name = "darts"
    description = "argmax (I(n) + lam) p(n), Deng et al. 2012"

    def __init__(self, hierarchy, lam: float = 0.0, *, validate: bool = True):
        super().__init__(hierarchy, validate=validate)
        self.lam = check_nonnegative(lam, "lam")

    @property
    def params(self) -> dict:
        return {"lam": self.lam}

    def _decode(self, post: Posterior) -> torch.Tensor:
        return darts_predict(post.h, post.node, self.lam)


class ExpectedInformation(Darts):
    """argmax_n I(n) p(n) (DARTS with lam = 0).  Ties: the deeper node, then the smallest id."""

    name = "expected_information"
    description = "argmax I(n) p(n) (darts, lam = 0)"

    def __init__(self, hierarchy, *, validate: bool = True):
        super().__init__(hierarchy, 0.0, validate=validate)

    @property
    def params(self) -> dict:
        return {}


class InformationThreshold(Decoder):
    """The most probable node with I(n) ≥ threshold.

    Ties: the deeper node, then the smallest id.  Leaves have the largest information,
    log L, so some node qualifies iff threshold ≤ log L; a larger threshold is a
    ``ValueError`` at construction (``threshold = 0`` allows every node, hence the root).
    """

    name = "information_threshold"
    description = "most probable node with I(n) >= threshold"

    def __init__(self, hierarchy, threshold: float, *, validate: bool = True):
        super().__init__(hierarchy, validate=validate)
        self.threshold = check_nonnegative(threshold, "threshold")
        max_info = math.log(hierarchy.num_leaves)
        if float(hierarchy.information.max()) < self.threshold:
            raise ValueError(
                f"Expected `threshold` to be at most the information of a leaf, log(L) = {max_info:.6g} "
                f"(L = {hierarchy.num_leaves}), but got {threshold}: no node would qualify"
            )

    @property
    def params(self) -> dict:
        return {"threshold": self.threshold}

    def _decode(self, post: Posterior) -> torch.Tensor:
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

    def _decode(self, post: Posterior) -> torch.Tensor:
        h = post.h
        leaf_parent = h.cached("heuristics.leaf_parent", lambda: torch.where(
            h.parent[: h.num_leaves] >= 0, h.parent[: h.num_leaves], torch.arange(h.num_leaves, device=h.device)))
        return _first_argmax(post.node[leaf_parent] * post.probs.t())


class CRM(Decoder):
    """CRM (Karthik et al. 2021): the leaf minimising the expected LCA height (Bayes-optimal ``lca_height``).

    Ties: the deeper leaf, then the smallest id (the rule of ``argbest``).
    """

    name = "crm"
    description = "leaf minimising the expected LCA height (Karthik et al. 2021)"

    def __init__(self, hierarchy, *, validate: bool = True):
        super().__init__(hierarchy, validate=validate)
        from ..metrics import get_metric

        self._metric = get_metric("lca_height", hierarchy)

    def _decode(self, post: Posterior) -> torch.Tensor:
        return self._metric._decode(post)
