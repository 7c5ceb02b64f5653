"""The registry of decoders: names -> classes, and the ``"optimal"`` wrapper around a metric's own decoder."""

from __future__ import annotations

import torch

from ..core.params import Param
from ..core.registry import Registry
from ..metrics import BaseMetric, get_metric
from .base import Decoder
from .heuristics import (
    CRM, ArgmaxLeaf, ConfidenceThreshold, Darts, ExpectedInformation, HiE, InformationThreshold, Majority,
    Plurality, TopDown,
)

__all__ = ["DECODERS", "OptimalDecoder", "get_decoder", "list_decoders", "register_decoder", "decoder_class"]


class OptimalDecoder(Decoder):
    """The Bayes-optimal decoder of a metric, as a :class:`Decoder`.

    ``decode`` returns what ``get_metric(metric, h, **params).decode`` returns: (B,) int64 node ids
    for node and leaf metrics, (B, N) bool sets for set metrics.  ``metric``: any metric spec
    (``"wu_palmer"``, ``"hf_beta[beta=0.5]"``, a built metric); extra keywords are its parameters.
    """

    name = "optimal"
    description = "Bayes-optimal decoder of a metric: get_decoder('optimal', h, metric='wu_palmer', **params)"
    algorithms = {"cpu": "the metric's own", "gpu": "the metric's own"}
    PARAMS = (Param("metric", object, "accuracy", in_key=False, doc="the metric whose Bayes-optimal decoder to use"),)

    def __init__(self, hierarchy, metric="accuracy", *, validate: bool = True, **metric_params):
        super().__init__(hierarchy, metric=metric, validate=validate)
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
        """``"<metric key>/optimal"``, e.g. ``"hf_beta[beta=0.5]/optimal"`` (``core.spec.label``)."""
        return f"{self.metric.key}/optimal"

    def __repr__(self) -> str:
        return f"OptimalDecoder({self.hierarchy!r}, metric={self.metric!r})"

    def decode(self, leaf_probs, *, from_logits: bool | str = False, normalize: bool = False,
               validate: bool | None = None, chunk_size: int | None = None, within=None) -> torch.Tensor:
        return self.metric.decode(leaf_probs, from_logits=from_logits, normalize=normalize,
                                  validate=self._validate(validate), chunk_size=chunk_size, within=within)

    def _decode(self, post) -> torch.Tensor:
        return self.metric._decode(post)


DECODERS = Registry("decoder", Decoder)
# The one list of the built-in decoders, in the order they are listed; each class declares its own facts.
for _cls in (ArgmaxLeaf, TopDown, ConfidenceThreshold, Majority, Plurality, Darts, ExpectedInformation,
             InformationThreshold, HiE, CRM, OptimalDecoder):
    DECODERS.register(_cls)


def register_decoder(cls: type | None = None, *, aliases=(), replace: bool = False):
    """Register a decoder class (a subclass of :class:`Decoder` with ``name``, ``description``,
    ``PARAMS`` and ``_decode_default``) under its name; usable as a class decorator.

    It can then be named everywhere a built-in decoder can: ``get_decoder``, ``DecodingHead``,
    ``HierarchicalMetric``, the Lightning callback and ``hdecode --import MODULE``.
    """
    return DECODERS.register(cls, aliases=aliases, replace=replace)


def list_decoders() -> dict[str, str]:
    """``{name: one-line description}`` of every registered decoder."""
    return DECODERS.describe()


def decoder_class(name: str) -> type[Decoder]:
    """The class of the decoder ``name``."""
    return DECODERS.get_class(name)


def get_decoder(spec, hierarchy, *, metric=None, validate: bool | None = None, **params) -> Decoder:
    """The decoder a spec names, on ``hierarchy``: ``"darts"``, ``"darts[lam=0.5]"``, ``("darts",
    {"lam": 0.5})``, or a name with keyword parameters (``tau=`` in [0, 1) for
    ``confidence_threshold``, ``lam=`` >= 0 for ``darts``, ``threshold=`` >= 0 for
    ``information_threshold``, and ``validate=``); a built :class:`Decoder` is returned as is.

    ``"optimal"`` is the Bayes-optimal decoder of ``metric`` (a metric spec or a built metric, whose
    parameters may follow as keywords); its key ``"hf_beta[beta=0.5]/optimal"`` or ``"optimal:hf_beta[beta=0.5]"``
    names it in one string.
    Unknown names (with a suggestion) or parameters and out-of-range values raise ``ValueError``; a
    metric without an exact decoder raises ``ValueError`` here rather than at the first batch.
    ``validate``: the decoder's default for its input check (ignored for a built decoder).
    """
    if isinstance(spec, Decoder):
        return DECODERS.build(spec, hierarchy, **params)
    if validate is not None:
        params["validate"] = validate
    if metric is not None:
        if not isinstance(metric, (str, tuple, list, BaseMetric)):
            raise TypeError(f"Expected `metric` to be a metric spec or a built metric, but got {type(metric).__name__}")
        if isinstance(spec, str) and spec == "optimal":
            return OptimalDecoder(hierarchy, metric, **params)
    return DECODERS.build(spec, hierarchy, **params)
