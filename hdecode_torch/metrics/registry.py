"""The registry of metrics: names -> classes, aliases, and what each offers."""

from __future__ import annotations

from ..core.registry import Registry
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

__all__ = ["METRICS", "get_metric", "list_metrics", "metric_class", "has_optimal_decoder", "register_metric"]

METRICS = Registry("metric", BaseMetric)
# The one list of the built-in metrics, in the order they are listed; each class declares its own facts
# (aliases, listed, parameters, ...).
for _cls in (Accuracy, LCAHeight, TreeDistance, TreeDistanceC, WuPalmer, Zhao, HFBeta, Hamming, Jaccard,
             CostMatrixMetric):
    METRICS.register(_cls)


def register_metric(cls: type | None = None, *, aliases=(), replace: bool = False):
    """Register a metric class (a subclass of ``NodeMetric`` or ``SetMetric`` with ``name``,
    ``description`` and ``PARAMS``) under its name and its declared ``aliases``; usable as a class decorator.

    It can then be named everywhere a built-in metric can: ``get_metric``, ``DecodingHead``,
    ``HierarchicalMetric``, the Lightning callback and ``hdecode --import MODULE``.
    """
    return METRICS.register(cls, aliases=aliases, replace=replace)


def list_metrics() -> dict[str, str]:
    """``{name: one-line description}`` of every registered metric."""
    return METRICS.describe()


def metric_class(name: str) -> type[BaseMetric]:
    """The class of the metric ``name`` (aliases and ``"cost_matrix"`` accepted)."""
    return METRICS.get_class(name)


def has_optimal_decoder(metric) -> bool:
    """Whether a metric (a name, a class or an instance) has an exact Bayes-optimal decoder."""
    if isinstance(metric, str):
        metric = metric_class(metric)
    return bool(metric.has_decoder)


def get_metric(spec, hierarchy, **params) -> BaseMetric:
    """The metric a spec names, on ``hierarchy``: ``"wu_palmer"``, ``"hf_beta[beta=0.5]"``,
    ``("hf_beta", {"beta": 0.5})``, or a name with keyword parameters (``beta=``, ``c=``,
    ``strategy=``); a built metric is returned as is.

    ``"cost_matrix"`` takes ``cost=`` (N, L).  Unknown names (with a suggestion) and parameters raise
    ``ValueError`` listing the accepted ones; a parameter of the wrong type raises ``TypeError``, one
    out of range ``ValueError``.
    """
    return METRICS.build(spec, hierarchy, **params)
