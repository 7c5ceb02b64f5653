"""Metric names (SPEC §2) -> classes."""

from __future__ import annotations

import inspect

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


def _accepted(cls) -> tuple[list[str], list[str]]:
    """(keyword parameters ``cls(hierarchy, ...)`` accepts, the required ones), following ``**kw`` up the MRO."""
    accepted: list[str] = []
    required: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[2:]  # self, hierarchy
        for prm in params:
            if prm.kind in (prm.VAR_KEYWORD, prm.VAR_POSITIONAL) or prm.name in accepted:
                continue
            accepted.append(prm.name)
            if prm.default is inspect.Parameter.empty:
                required.append(prm.name)
        if not any(prm.kind == prm.VAR_KEYWORD for prm in params):
            break
    return accepted, required


def get_metric(name: str, hierarchy, **params) -> BaseMetric:
    """The metric ``name`` (SPEC §2) on ``hierarchy`` with its parameters (``beta=``, ``c=``).

    ``name="cost_matrix"`` takes ``cost=`` (N, L).  Unknown names and parameters raise
    ``ValueError`` (listing the accepted ones); a parameter of the wrong type raises
    ``TypeError``, one out of range ``ValueError``.
    """
    if isinstance(name, BaseMetric):
        return name
    if not isinstance(name, str):
        raise TypeError(f"Expected `name` to be a metric name, but got {type(name).__name__}")
    key = ALIASES.get(name, name)
    if key == "cost_matrix":
        cls = CostMatrixMetric
    elif key in METRICS:
        cls = METRICS[key]
    else:
        raise ValueError(f"Unknown metric {name!r}; available: {', '.join(sorted(METRICS))} (and 'cost_matrix')")
    accepted, required = _accepted(cls)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"Bad parameters for metric {name!r}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
                         f"accepted: {', '.join(accepted) or 'none'}")
    missing = [p for p in required if p not in params]
    if missing:
        raise ValueError(f"Bad parameters for metric {name!r}: it requires {', '.join(map(repr, missing))}")
    return cls(hierarchy, **params)
