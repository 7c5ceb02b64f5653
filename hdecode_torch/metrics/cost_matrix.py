"""A user-supplied node × leaf cost matrix as a metric.

Expected values are one (N, L) @ (L, B) product.  The decoder checks once, at construction, whether
the cost is hierarchically reasonable (Plaud et al. 2025, eq. 1–2, or the Prop. E.6 form when costs
are equal under the root); if so it prunes with Lemma 4.3 and scores the surviving candidates by
sampled products, O(B·(N + C·L)); otherwise it searches every node, O(B·N·L).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from ..core.params import REQUIRED, Param
from ..core.conversion import as_tensor
from ..kernels.candidates import PruningStatistics, candidate_mask, pruning_statistics, sampled_products
from ..kernels.selection import argbest, argbest_pairs
from ..kernels.true_entries import true_pairs
from .base import NodeMetric

__all__ = ["CostMatrixMetric"]


class CostMatrixMetric(NodeMetric):
    """Any metric given as a dense matrix ``cost[h, y]`` over (node, leaf) pairs.

    cost: (N, L) float, finite.  ``higher_is_better=False`` (the default) treats it as a
    cost to minimise; ``True`` as a utility (a similarity) to maximise.
    """

    name = "cost_matrix"
    description = "user-supplied (N, L) cost matrix"
    listed = False  # needs its matrix: built with get_metric("cost_matrix", h, cost=...)
    algorithms = {"cpu": "pruned candidates and sampled products, or the exhaustive (N,L)@(L,B) product",
                  "gpu": "pruned candidates and sampled products, or the exhaustive (N,L)@(L,B) product"}

    STRATEGIES = ("auto", "candidates", "dense")
    PARAMS = (Param("cost", object, in_key=False, doc="(N, L) float cost (or utility) of every (node, leaf) pair"),
              Param("higher_is_better", object, False, in_key=False, doc="whether the matrix is a utility"),
              Param("strategy", str, "auto", choices=STRATEGIES, in_key=False,
                    doc="auto/candidates: prune when the cost is hierarchically reasonable; dense: search every node"))

    def __init__(self, hierarchy, cost=REQUIRED, higher_is_better: bool = False, name: str | None = None,
                 strategy: str = "auto", *, validate: bool = True):
        given = {} if cost is REQUIRED else {"cost": cost}
        super().__init__(hierarchy, higher_is_better=higher_is_better, strategy=strategy, validate=validate, **given)
        c = as_tensor(cost, "cost")
        if c.is_complex():
            raise TypeError(f"Expected `cost` to be a real (float) matrix, but got dtype {c.dtype}")
        if not isinstance(higher_is_better, (bool, np.bool_)):
            raise TypeError(f"Expected `higher_is_better` to be a bool, but got {type(higher_is_better).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"Expected `name` to be a string, but got {type(name).__name__}")
        if not c.is_floating_point():
            c = c.to(torch.float64)
        shape = (hierarchy.num_nodes, hierarchy.num_leaves)
        if tuple(c.shape) != shape:
            raise ValueError(f"Expected `cost` to have shape (num_nodes, num_leaves) = {shape}, but got {tuple(c.shape)}")
        if not bool(torch.isfinite(c).all()):
            raise ValueError("Expected `cost` to be finite, but it contains NaN or infinite values")
        self.cost = c.to(torch.float64)
        self.higher_is_better = bool(higher_is_better)
        if name is not None:
            self.name = name
        self._cost_on: dict = {}
        self._pruning: PruningStatistics | None = None

    def on_subtree(self, sub):
        """The cost restricted to the subtree's (node, leaf) pairs."""
        nodes, leaves = sub.nodes.cpu(), sub.leaves.cpu()
        return type(self)(sub.hierarchy, self.cost[nodes][:, leaves], self.higher_is_better, self.name,
                          self.strategy, validate=False)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cost_on"] = {}  # copies of `cost` per device and dtype: rebuilt on first use
        return state

    @property
    def pruning(self) -> PruningStatistics:
        """Lemma 4.3 / Prop. E.6 statistics, computed once (vectorized over N×L)."""
        if self._pruning is None:
            h = self.hierarchy
            as_cost = -self.cost if self.higher_is_better else self.cost
            self._pruning = pruning_statistics(h, as_cost.to(h.device))
        return self._pruning

    @property
    def is_hierarchically_reasonable(self) -> bool:
        """Whether the cost satisfies the paper's conditions (eq. 2 and eq. 1 or its root form)."""
        return self.pruning.reasonable

    def cost_on(self, device, dtype) -> torch.Tensor:
        """The cost matrix on ``device`` in ``dtype`` (cached)."""
        key = (torch.device(device), dtype)
        if key not in self._cost_on:
            self._cost_on[key] = self.cost.to(device=device, dtype=dtype)
        return self._cost_on[key]

    def _values(self, h, pred, target):
        return self.cost_on(pred.device, torch.float64)[pred, target]

    def _bytes_per_sample(self, h, plan):
        return 8 * h.num_nodes * 2

    def fixed_size(self, plan, h=None) -> "CostMatrixMetric":
        """This metric, or for a pruning one (a hierarchically reasonable cost, strategy other than
        ``"dense"``) a copy taking the exhaustive (N, B) table, which decides the same."""
        if self.strategy == "dense" or not self.is_hierarchically_reasonable:
            return self
        fixed = copy.copy(self)
        fixed.strategy = "dense"
        return fixed

    def _decode_default(self, post) -> torch.Tensor:
        """Pruned candidates when the cost is hierarchically reasonable, else exhaustive search.

        ``strategy="dense"`` always takes the exhaustive (N, B) table; ``"candidates"`` and
        ``"auto"`` prune (falling back to exhaustive when the cost is not reasonable).
        """
        h = post.h
        stats = self.pruning
        if self.strategy == "dense" or not stats.reasonable:
            return argbest(h, self.expected_table(post), self.higher_is_better)
        if stats.m_in.device != h.device:
            stats = self._pruning = stats.to(h.device)
        mask = candidate_mask(h, post.node, stats)
        node, sample = true_pairs(mask)  # node-major: the rows of a CSR mask
        risk = sampled_products(self.cost_on(post.device, post.dtype), post.probs, node, sample)
        return argbest_pairs(h, risk, sample, node, post.batch_size, self.higher_is_better)

    def expected_table(self, post) -> torch.Tensor:
        """(N, B) ``cost @ probsᵀ``."""
        return self.cost_on(post.device, post.dtype) @ post.probs.t()

    # ------------------------------------------------------------------ top-k inputs
    accepts_topk = True

    def _topk_parts(self, ct):
        """The completion's weights folded into the matrix: ``(cost (N, L) float64, full (N,) float64, coef (B, k)
        float64)`` with Σ_l q(l)·cost[n, l] = r·full[n] + Σ_j coef[:, j]·cost[n, indices[:, j]].

        q(l) = v(l) on the listed leaves and r·w(l) on the others (w = 1 or the prior), so
        Σ_l q(l) cost[n, l] = r·Σ_l w(l) cost[n, l] + Σ_listed (v(l) − r·w(l)) cost[n, l]: full = cost @ w once,
        O(N·L) (the matrix's own size), and k columns per row.
        """
        h = ct.h
        cost = self.cost_on(h.device, torch.float64)
        if ct.prior is None:
            full = cost.sum(1)
            w_listed = torch.ones_like(ct.values)
        else:
            full = cost @ ct.prior
            w_listed = ct.prior[ct.indices]
        return cost, full, ct.values - ct.listed.rate[:, None] * w_listed

    def _decode_topk(self, ct):
        """The best node of the completed distribution by exhaustive search: the (N, B) table of expected costs
        (as the dense ``strategy="dense"`` decoder's), built from k columns per row (a loop over k, each step
        (N, B)); never a (B, L) table.  Ties: the deepest node, then the smallest id.  O(N·L + N·B·k)."""
        cost, full, coef = self._topk_parts(ct)
        table = full[:, None] * ct.listed.rate[None, :]
        for j in range(ct.k):
            table = table + cost.index_select(1, ct.indices[:, j]) * coef[:, j]
        return argbest(ct.h, table, self.higher_is_better)

    def _expected_topk(self, ct, pred):
        cost, full, coef = self._topk_parts(ct)
        return full[pred] * ct.listed.rate + (cost[pred[:, None], ct.indices] * coef).sum(1)
