"""Metric names (SPEC §2) -> classes."""

from __future__ import annotations

from .base import BaseMetric
from .cost_matrix import CostMatrixMetric
from .leaf import Accuracy, LCAHeight
from .node import TreeDistance, TreeDistanceC, WuPalmer, Zhao
from .sets import Hamming, HFBeta, Jaccard

__all__ = ["METRICS", "ALIASES", "get_metric", "list_metrics"]

METRICS: dict[str, type[BaseMetric]] = {
    cls.name: cls
    for cls in (Accuracy, LCAHeight, TreeDistance, TreeDistanceC, WuPalmer, Zhao, HFBeta, Hamming, Jaccard)
}
ALIASES = {"mistake_severity": "tree_distance", "crm": "lca_height", "hf": "hf_beta", "top1": "accuracy"}


def list_metrics() -> dict[str, str]:
    """``{name: one-line description}`` of every built-in metric."""
    return {name: cls.description for name, cls in METRICS.items()}


def get_metric(name: str, hierarchy, **params) -> BaseMetric:
    """The metric ``name`` (SPEC §2) on ``hierarchy`` with its parameters (``beta=``, ``c=``).

    ``name="cost_matrix"`` takes ``cost=`` (N, L).  Unknown names and parameters raise ValueError.
    """
    if isinstance(name, BaseMetric):
        return name
    if not isinstance(name, str):
        raise TypeError(f"Expected `name` to be a metric name, but got {type(name).__name__}")
    key = ALIASES.get(name, name)
    if key == "cost_matrix":
        return CostMatrixMetric(hierarchy, **params)
    if key not in METRICS:
        raise ValueError(f"Unknown metric {name!r}; available: {', '.join(sorted(METRICS))} (and 'cost_matrix')")
    try:
        return METRICS[key](hierarchy, **params)
    except TypeError as exc:
        raise ValueError(f"Bad parameters for metric {name!r}: {exc}") from None
