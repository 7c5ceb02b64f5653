"""The one list of metrics: names -> classes, aliases, and what each offers."""

from __future__ import annotations

from .._component import build_component
from .accuracy import Accuracy
from .base import BaseMetric
from .cost_matrix import CostMatrixMetric
from .hamming import Hamming
from .hf_beta import HFBeta
from .jaccard import Jaccard
from .lca_height import LCAHeight
from .tree_distance import TreeDistance, TreeDistanceC
from .wu_palmer import WuPalmer
from .zhao import Zhao

__all__ = ["METRICS", "ALIASES", "get_metric", "list_metrics", "metric_class", "has_optimal_decoder"]

#: One line per built-in metric.
METRICS: dict[str, type[BaseMetric]] = {
    cls.name: cls
    for cls in (Accuracy, LCAHeight, TreeDistance, TreeDistanceC, WuPalmer, Zhao, HFBeta, Hamming, Jaccard)
}
ALIASES = {"mistake_severity": "tree_distance", "crm": "lca_height", "hf": "hf_beta", "top1": "accuracy"}


def list_metrics() -> dict[str, str]:
    """``{name: one-line description}`` of every built-in metric."""
    return {name: cls.description for name, cls in METRICS.items()}


def metric_class(name: str) -> type[BaseMetric]:
    """The class of the metric ``name`` (aliases and ``"cost_matrix"`` accepted)."""
    if not isinstance(name, str):
        raise TypeError(f"Expected `name` to be a metric name, but got {type(name).__name__}")
    key = ALIASES.get(name, name)
    if key == "cost_matrix":
        return CostMatrixMetric
    if key not in METRICS:
        raise ValueError(f"Unknown metric {name!r}; available: {', '.join(sorted(METRICS))} (and 'cost_matrix')")
    return METRICS[key]


def has_optimal_decoder(metric) -> bool:
    """Whether a metric (a name, a class or an instance) has an exact Bayes-optimal decoder."""
    if isinstance(metric, str):
        metric = metric_class(metric)
    return bool(metric.has_decoder)


def get_metric(name: str, hierarchy, **params) -> BaseMetric:
    """The metric ``name`` on ``hierarchy`` with its parameters (``beta=``, ``c=``, ``strategy=``).

    ``name="cost_matrix"`` takes ``cost=`` (N, L).  A built metric is returned as is.  Unknown
    names and parameters raise ``ValueError`` (listing the accepted ones); a parameter of the wrong
    type raises ``TypeError``, one out of range ``ValueError``.
    """
    if isinstance(name, BaseMetric):
        return name
    return build_component(metric_class(name), "metric", name, hierarchy, params)
