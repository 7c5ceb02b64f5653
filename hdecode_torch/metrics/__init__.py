"""Hierarchical metrics: one module per metric (values, expected values, Bayes-optimal decoder), and
their registry."""

from .accuracy import Accuracy
from .base import BaseMetric, NodeMetric, SetMetric
from .cost_matrix import CostMatrixMetric
from .hamming import Hamming
from .hf_beta import HFBeta
from .jaccard import Jaccard
from .lca_height import LCAHeight
from .registry import METRICS, get_metric, has_optimal_decoder, list_metrics, metric_class, register_metric
from .tree_distance import TreeDistance, TreeDistanceC
from .wu_palmer import WuPalmer
from .zhao import Zhao

__all__ = [
    "BaseMetric", "NodeMetric", "SetMetric", "METRICS", "get_metric", "list_metrics", "metric_class",
    "has_optimal_decoder", "register_metric", "Accuracy", "LCAHeight", "TreeDistance", "TreeDistanceC", "WuPalmer",
    "Zhao", "HFBeta", "Hamming", "Jaccard", "CostMatrixMetric",
]
