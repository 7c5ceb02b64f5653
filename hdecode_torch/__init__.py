"""hdecode_torch: Bayes-optimal decoding of hierarchical classifiers, batched on CPU and GPU.

A model gives p(leaf | x); each hierarchical metric has its own best prediction.
``get_metric(name, hierarchy).decode(leaf_probs)`` returns it for a whole batch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# The public names load on first use (PEP 562): `import hdecode_torch` costs nothing, so that the
# `hdecode` command (hdecode_torch.cli) answers --help, --version and a bad command line before
# torch is imported (about two seconds).  `hd.X`, `from hdecode_torch import X` and `import *`
# load the module of X then.
_LAZY = {
    "ROW_SUM_TOLERANCE": ".core", "Posterior": ".core", "get_memory_budget": ".core", "plan_for": ".core",
    "row_sum_tolerance": ".core", "set_memory_budget": ".core", "node_probabilities": ".core",
    "set_backend": ".core", "get_backend": ".core", "TopK": ".core",
    "Hierarchy": ".hierarchy", "list_hierarchies": ".hierarchy", "load_hierarchy": ".hierarchy",
    "CostMatrixMetric": ".metrics", "get_metric": ".metrics", "has_optimal_decoder": ".metrics",
    "list_metrics": ".metrics", "register_metric": ".metrics",
    "calibrate_darts": ".decoders", "get_decoder": ".decoders", "list_decoders": ".decoders",
    "register_decoder": ".decoders", "RiskControl": ".decoders",
    "DecodingHead": ".integrations.module", "TemperatureScaler": ".integrations.temperature",
    "BatchDecoder": ".integrations.batch", "merge_shards": ".integrations.shards",
    "HierarchicalScaler": ".integrations.hierarchical_scaler",
    # torchmetrics and Lightning load with these only.
    "HierarchicalMetric": ".integrations", "HierarchicalMetricsCallback": ".integrations",
    "DecodingPredictionWriter": ".integrations", "NodeCalibrationError": ".integrations",
}
_SUBMODULES = {"cli", "core", "decoders", "functional", "hierarchy", "integrations", "kernels", "metrics", "synthetic"}

# HierarchicalMetricsCallback and DecodingPredictionWriter stay out of __all__: a star import must not need Lightning.
__all__ = [
    "Hierarchy", "load_hierarchy", "list_hierarchies", "node_probabilities",
    "get_metric", "list_metrics", "has_optimal_decoder", "register_metric", "CostMatrixMetric", "Posterior",
    "TopK", "ROW_SUM_TOLERANCE", "row_sum_tolerance", "get_memory_budget", "set_memory_budget", "set_backend", "get_backend",
    "plan_for", "__version__", "get_decoder", "list_decoders", "register_decoder", "calibrate_darts", "RiskControl",
    "DecodingHead", "TemperatureScaler", "HierarchicalScaler", "HierarchicalMetric", "NodeCalibrationError",
    "BatchDecoder", "merge_shards",
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later lookups do not come back here
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


if TYPE_CHECKING:  # what static analysis sees: the same names, imported eagerly
    from . import functional
    from .core import (ROW_SUM_TOLERANCE, Posterior, TopK, get_backend, get_memory_budget, node_probabilities,
                       plan_for, row_sum_tolerance, set_backend, set_memory_budget)
    from .decoders import RiskControl, calibrate_darts, get_decoder, list_decoders, register_decoder
    from .hierarchy import Hierarchy, list_hierarchies, load_hierarchy
    from .integrations import HierarchicalMetric, HierarchicalMetricsCallback, NodeCalibrationError
    from .integrations.batch import BatchDecoder
    from .integrations.prediction_writer import DecodingPredictionWriter
    from .integrations.shards import merge_shards
    from .integrations.module import DecodingHead
    from .integrations.hierarchical_scaler import HierarchicalScaler
    from .integrations.temperature import TemperatureScaler
    from .metrics import CostMatrixMetric, get_metric, has_optimal_decoder, list_metrics, register_metric
