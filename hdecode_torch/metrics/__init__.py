"""Hierarchical metrics (SPEC §2): values, expected values and Bayes-optimal decoding."""

from .base import BaseMetric, NodeMetric, SetMetric
from .cost_matrix import CostMatrixMetric
from .leaf import Accuracy, LCAHeight
from .node import TreeDistance, TreeDistanceC, WuPalmer, Zhao
from .posterior import Posterior
from .registry import get_metric, list_metrics
from .sets import Hamming, HFBeta, Jaccard

__all__ = [
    "BaseMetric", "NodeMetric", "SetMetric", "Posterior", "get_metric", "list_metrics",
    "Accuracy", "LCAHeight", "TreeDistance", "TreeDistanceC", "WuPalmer", "Zhao",
    "HFBeta", "Hamming", "Jaccard", "CostMatrixMetric",
]
