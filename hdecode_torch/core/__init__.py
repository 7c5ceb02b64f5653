"""What every entry point shares: input checks, the batch's statistics (:class:`Posterior`), memory chunking."""

from .chunking import get_memory_budget, set_memory_budget
from .plan import Plan, current_plan, plan_for
from .posterior import Posterior
from .validation import ROW_SUM_TOLERANCE, row_sum_tolerance

__all__ = ["Posterior", "ROW_SUM_TOLERANCE", "row_sum_tolerance", "get_memory_budget", "set_memory_budget", "Plan", "plan_for",
           "current_plan"]
