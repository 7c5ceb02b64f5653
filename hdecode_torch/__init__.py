"""hdecode_torch: Bayes-optimal decoding of hierarchical classifiers, batched on CPU and GPU.

A model gives p(leaf | x); each hierarchical metric has its own best prediction.
``get_metric(name, hierarchy).decode(leaf_probs)`` returns it for a whole batch.
"""

from .core import (ROW_SUM_TOLERANCE, Posterior, get_backend, get_memory_budget, node_probabilities, plan_for,
                   row_sum_tolerance, set_backend, set_memory_budget)
from .hierarchy import Hierarchy, list_hierarchies, load_hierarchy
from .metrics import CostMatrixMetric, get_metric, has_optimal_decoder, list_metrics, register_metric

__version__ = "0.1.0"

__all__ = [
    "Hierarchy", "load_hierarchy", "list_hierarchies", "node_probabilities",
    "get_metric", "list_metrics", "has_optimal_decoder", "register_metric", "CostMatrixMetric", "Posterior",
    "ROW_SUM_TOLERANCE", "row_sum_tolerance", "get_memory_budget", "set_memory_budget", "set_backend", "get_backend",
    "plan_for", "__version__",
]

from .decoders import calibrate_darts, get_decoder, list_decoders, register_decoder  # noqa: E402

__all__ += ["get_decoder", "list_decoders", "register_decoder", "calibrate_darts"]

from .integrations.module import DecodingHead  # noqa: E402
from .integrations.temperature import TemperatureScaler  # noqa: E402

# HierarchicalMetricsCallback stays out of __all__: a star import must not need Lightning.
__all__ += ["DecodingHead", "TemperatureScaler", "HierarchicalMetric"]


def __getattr__(name):
    # torchmetrics and Lightning load on first use, so `import hdecode_torch` stays fast.
    if name in ("HierarchicalMetric", "HierarchicalMetricsCallback"):
        from . import integrations

        return getattr(integrations, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
