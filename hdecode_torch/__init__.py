"""hdecode_torch: Bayes-optimal decoding of hierarchical classifiers, batched on CPU and GPU.

A model gives p(leaf | x); each hierarchical metric has its own best prediction.
``get_metric(name, hierarchy).decode(leaf_probs)`` returns it for a whole batch.
"""

from .core import ROW_SUM_TOLERANCE, Posterior, get_memory_budget, plan_for, row_sum_tolerance, set_memory_budget
from .hierarchy import Hierarchy, list_hierarchies, load_hierarchy
from .kernels import node_probabilities
from .metrics import CostMatrixMetric, get_metric, has_optimal_decoder, list_metrics

__version__ = "0.1.0"

__all__ = [
    "Hierarchy", "load_hierarchy", "list_hierarchies", "node_probabilities",
    "get_metric", "list_metrics", "has_optimal_decoder", "CostMatrixMetric", "Posterior", "ROW_SUM_TOLERANCE",
    "row_sum_tolerance", "get_memory_budget", "set_memory_budget", "plan_for", "__version__",
]

from .decoders import RiskControl, calibrate_darts, get_decoder, list_decoders  # noqa: E402

__all__ += ["get_decoder", "list_decoders", "calibrate_darts", "RiskControl"]

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
