"""``HierarchicalMetric``: any hierarchical metric of any decoder's predictions, as a torchmetrics ``Metric``."""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ..hierarchy import Hierarchy
from ..core.validation import input_kind
from .module import decoder_label, resolve_decoder, resolve_metric, shared_posterior

__all__ = ["HierarchicalMetric"]

_TORCHMETRICS_KWARGS = ("compute_on_cpu", "dist_sync_on_step", "process_group", "dist_sync_fn",
                        "distributed_available_fn", "sync_on_compute", "compute_with_cache")


class HierarchicalMetric(Metric):
    """Mean of a hierarchical metric over the predictions of a decoder.

    ``update(scores, target)``: scores (B, L) float probabilities (or logits with
    ``from_logits=True``), target (B,) int leaf ids.  The decoder turns the scores into
    predictions and ``metric(pred, target)`` scores them per sample; ``compute()``
    returns their mean as a float64 scalar (NaN before any update).

    Args:
        hierarchy: the class tree.
        metric: a name, ``(name, params)`` or built metric; ``params`` are its parameters.
        decoder: ``"optimal"`` (the metric's own Bayes-optimal decoder; ``ValueError`` for a
            metric without one), a heuristic name, ``(name, params)`` or a Decoder.
        from_logits: ``False`` (default) the scores are probabilities, ``True`` logits (softmax
            applied), ``"auto"`` decided per batch (see :class:`~hdecode_torch.DecodingHead`).
        validate: check the scores and targets (one host sync each per update).
        compute_on_cpu, dist_sync_on_step, process_group, sync_on_compute, ...: passed to
            :class:`torchmetrics.Metric`.

    States: with ``exact=True`` (default) the per-sample values (float64, concatenated
    across processes) and ``compute()`` sums them in sorted order, so the mean is bitwise
    the same for any number of processes or batch split (a float64 sum depends on its
    order); memory is 8 bytes per sample.  ``exact=False`` keeps only ``total`` and
    ``count`` (float64 scalars summed across processes): constant memory, equal up to the
    last bits of float64.  Under DDP the value is the mean over every process's samples;
    DistributedSampler's padding repeats samples, so use a dataset size divisible by the
    world size.  :attr:`higher_is_better` comes from the metric.

    Several instances updated with the same tensor object (a ``MetricCollection``, or
    one after another) share one :class:`~hdecode_torch.Posterior`, so node
    probabilities are computed once per batch.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    total: torch.Tensor
    count: torch.Tensor

    def __init__(self, hierarchy: Hierarchy, metric="accuracy", decoder="optimal", from_logits: bool | str = False,
                 validate: bool = True, exact: bool = True, **params):
        base_kwargs = {k: params.pop(k) for k in _TORCHMETRICS_KWARGS if k in params}
        super().__init__(**base_kwargs)
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        self.hierarchy = hierarchy
        self.metric = resolve_metric(hierarchy, metric, **params)
        self.decoder = resolve_decoder(hierarchy, decoder, self.metric, validate=validate)
        input_kind(from_logits)  # checked here, not at the first batch
        self.from_logits = from_logits if from_logits == "auto" else bool(from_logits)
        self.validate = bool(validate)
        # torchmetrics treats higher_is_better as a class constant and forbids setting it; here it
        # depends on the metric, so it goes into the instance dict, where attribute lookup finds it first.
        self.__dict__["higher_is_better"] = bool(self.metric.higher_is_better)
        self.exact = bool(exact)
        if self.exact:
            self.add_state("values", default=[], dist_reduce_fx="cat")
        else:
            self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("count", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        # MetricCollection merges members whose states are equal after the first update into a
        # "compute group" and then updates only one of them.  Two decoders that happen to agree
        # on the first batch would be merged and report the same value forever; a constant state
        # spelling out the configuration keeps different configurations apart.
        sig = torch.tensor(list(f"{self.key}|{self.from_logits}".encode()), dtype=torch.float64)
        self.add_state("signature", sig, dist_reduce_fx="max")

    @property
    def key(self) -> str:
        """``"<metric key>/<decoder key>"``, e.g. ``"hf_beta[beta=0.5]/optimal"``."""
        return f"{self.metric.key}/{decoder_label(self.decoder, self.metric)}"

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        """scores: (B, L) float (or a Posterior); target: (B,) int64 leaf ids."""
        post = shared_posterior(self.hierarchy, scores, from_logits=self.from_logits, validate=self.validate)
        pred = self.decoder.decode(post)
        if isinstance(target, torch.Tensor):
            target = target.to(pred.device)
        values = self.metric(pred, target, validate=self.validate)
        if self.exact:
            self.values.append(values.to(torch.float64))
        else:
            self.total += values.sum().to(self.total.device)
            self.count += values.numel()

    def compute(self) -> torch.Tensor:
        """Mean value over every sample seen (all processes), float64 scalar (NaN before any update)."""
        if not self.exact:
            return self.total / self.count
        values = dim_zero_cat(self.values) if len(self.values) else torch.zeros(0, dtype=torch.float64)
        return torch.sort(values).values.sum() / values.numel()

    def extra_repr(self) -> str:
        return f"metric={self.metric.key}, decoder={decoder_label(self.decoder, self.metric)}"
