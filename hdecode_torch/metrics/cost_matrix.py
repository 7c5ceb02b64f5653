"""A user-supplied node × leaf cost matrix as a metric."""

from __future__ import annotations

import torch

from ..kernels.validation import as_tensor
from .base import NodeMetric
from .posterior import Posterior

__all__ = ["CostMatrixMetric"]


class CostMatrixMetric(NodeMetric):
    """Any metric given as a dense matrix ``cost[h, y]`` over (node, leaf) pairs.

    cost: (N, L) float, finite.  ``higher_is_better=False`` (the default) treats it as a
    cost to minimise; ``True`` as a utility (a similarity) to maximise.
    """

    name = "cost_matrix"
    description = "user-supplied (N, L) cost matrix"

    def __init__(self, hierarchy, cost, higher_is_better: bool = False, name: str | None = None, **kw):
        super().__init__(hierarchy, **kw)
        c = as_tensor(cost, "cost")
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

    def cost_on(self, device, dtype) -> torch.Tensor:
        """The cost matrix on ``device`` in ``dtype`` (cached)."""
        key = (torch.device(device), dtype)
        if key not in self._cost_on:
            self._cost_on[key] = self.cost.to(device=device, dtype=dtype)
        return self._cost_on[key]

    def _values(self, h, pred, target):
        return self.cost.to(pred.device)[pred, target]

    def _bytes_per_sample(self, h):
        return 8 * h.num_nodes * 2

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """(N, B) ``cost @ probsᵀ``."""
        return self.cost_on(post.device, post.dtype) @ post.probs.t()
