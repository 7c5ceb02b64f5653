"""What every entry point shares: the device plan (resolved once per call), input checks, the batch's
statistics (:class:`Posterior`), memory chunking, the component template, parameters, specs and
registries of metrics and decoders."""

from .plan import Plan, get_backend, get_memory_budget, plan_for, resolve_plan, set_backend, set_memory_budget
from .posterior import Posterior
from .probabilities import node_probabilities
from .topk import TopK
from .row_checks import ROW_SUM_TOLERANCE, row_sum_tolerance

__all__ = ["Posterior", "TopK", "node_probabilities", "ROW_SUM_TOLERANCE", "row_sum_tolerance", "get_memory_budget",
           "set_memory_budget", "set_backend", "get_backend", "Plan", "plan_for", "resolve_plan"]
