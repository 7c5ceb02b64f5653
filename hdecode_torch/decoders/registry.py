"""Decoder names -> classes, and the ``"optimal"`` wrapper around a metric's own decoder."""

from __future__ import annotations

import torch

from .._component import build_component
from .base import Decoder
from .heuristics import (
    CRM, ArgmaxLeaf, ConfidenceThreshold, Darts, ExpectedInformation, HiE, InformationThreshold, Majority,
    Plurality, TopDown,
)

__all__ = ["DECODERS", "OptimalDecoder", "get_decoder", "list_decoders"]


class OptimalDecoder(Decoder):
    """The Bayes-optimal decoder of a metric, as a :class:`Decoder`.

    ``decode`` returns what ``get_metric(metric, h, **params).decode`` returns: (B,) int64 node ids
    for node and leaf metrics, (B, N) bool sets for set metrics.
    """

    name = "optimal"
    description = "Bayes-optimal decoder of a metric: get_decoder('optimal', h, metric='wu_palmer', **params)"

    def __init__(self, hierarchy, metric="accuracy", *, validate: bool = True, **metric_params):
        super().__init__(hierarchy, validate=validate)
        from ..metrics import get_metric

        self.metric = get_metric(metric, hierarchy, **metric_params)
        if self.metric.hierarchy is not hierarchy and not self.metric.hierarchy.same_tree(hierarchy):
            raise ValueError(f"Expected `metric` to be defined on {hierarchy!r}, but it is on {self.metric.hierarchy!r}")
        if not self.metric.has_decoder:
            raise ValueError(f"Metric `{self.metric.key}` has no Bayes-optimal decoder; use a heuristic decoder "
                             "instead (e.g. 'majority') and score its predictions with the metric")

    @property
    def kind(self) -> str:
        return self.metric.kind

    @property
    def params(self) -> dict:
        return dict(self.metric.params)

    @property
    def key(self) -> str:
        return f"optimal:{self.metric.key}"

    def __repr__(self) -> str:
        return f"OptimalDecoder({self.hierarchy!r}, metric={self.metric!r})"

    def decode(self, leaf_probs, *, validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        return self.metric.decode(leaf_probs, validate=self._validate(validate), chunk_size=chunk_size)

    def _decode(self, post) -> torch.Tensor:
        return self.metric._decode(post)


#: One line per decoder.
DECODERS: dict[str, type[Decoder]] = {
    cls.name: cls
    for cls in (ArgmaxLeaf, TopDown, ConfidenceThreshold, Majority, Plurality, Darts, ExpectedInformation,
                InformationThreshold, HiE, CRM, OptimalDecoder)
}


def list_decoders() -> dict[str, str]:
    """``{name: one-line description}`` of every decoder :func:`get_decoder` builds."""
    return {name: cls.description for name, cls in DECODERS.items()}


def get_decoder(name, hierarchy, **params) -> Decoder:
    """The decoder ``name`` on ``hierarchy``, e.g. ``get_decoder("darts", h, lam=0.5)``.

    Parameters: ``tau`` in [0, 1) (``confidence_threshold``, default 1/2), ``lam`` >= 0
    (``darts``, default 0), ``threshold`` >= 0 (``information_threshold``, required), and
    ``validate``.  ``get_decoder("optimal", h, metric="wu_palmer", **metric_params)`` wraps
    the metric's Bayes-optimal decoder.  A :class:`Decoder` passed as ``name`` is returned
    as is.  Unknown names or parameters and out-of-range values raise ``ValueError``.
    """
    if isinstance(name, Decoder):
        return name
    if not isinstance(name, str):
        raise TypeError(f"Expected `name` to be a decoder name, but got {type(name).__name__}")
    if name not in DECODERS:
        raise ValueError(f"Unknown decoder {name!r}; available: {', '.join(sorted(DECODERS))}")
    cls = DECODERS[name]
    if cls is OptimalDecoder:  # its metric checks the metric's parameters
        return cls(hierarchy, **params)
    return build_component(cls, "decoder", name, hierarchy, params)
