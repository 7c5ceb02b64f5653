"""``HierarchicalMetric``: any hierarchical metric of any decoder's predictions, as a torchmetrics ``Metric``."""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ..hierarchy import Hierarchy
from ..core.validation import input_kind
from .module import decoder_label, pair_name, resolve_pair, shared_posterior

__all__ = ["HierarchicalMetric"]

#: Range of the per-sample value of each registered metric (plot axes): similarities and scores in
#: [0, 1], costs from 0 up.
_PLOT_BOUNDS = {
    "accuracy": (0.0, 1.0), "wu_palmer": (0.0, 1.0), "zhao": (0.0, 1.0), "hf_beta": (0.0, 1.0), "jaccard": (0.0, 1.0),
    "tree_distance": (0.0, None), "tree_distance_c": (0.0, None), "lca_height": (0.0, None), "hamming": (0.0, None),
}

_TORCHMETRICS_KWARGS = ("compute_on_cpu", "dist_sync_on_step", "process_group", "dist_sync_fn",
                        "distributed_available_fn", "sync_on_compute", "compute_with_cache")


class HierarchicalMetric(Metric):
    """Mean of a hierarchical metric over the predictions of a decoder.

    ``update(scores, target)``: scores (B, L) float, target (B,) int leaf ids in ``0..L-1``.
    The decoder turns the scores into predictions and ``metric(pred, target)`` scores them per
    sample; ``compute()`` returns their mean as a float64 scalar (NaN before any update).

    Args:
        hierarchy: the class tree.
        metric: a name, ``(name, params)`` or built metric; ``params`` are its parameters.
        decoder: ``"optimal"`` (the metric's own Bayes-optimal decoder; ``ValueError`` for a
            metric without one), a heuristic name, ``(name, params)`` or a Decoder.
        from_logits: what ``scores`` holds.  ``False`` (default): probabilities, each row
            non-negative and summing to 1.  ``True``: logits, a softmax is applied (input that
            looks like probabilities gets a warning).  ``"auto"``: decided per batch on the
            device, probabilities if every row is a distribution, else logits.
        validate: check the scores and targets (one host sync per update); errors name the
            argument (``scores``, ``target``).
        exact: how the values are kept (below).
        compute_on_cpu, dist_sync_on_step, process_group, sync_on_compute, ...: passed to
            :class:`torchmetrics.Metric`.

    Name: each instance's class is a subclass named after its pair, ``<metric>_<decoder>``
    (:attr:`name`, e.g. ``hf_beta0.5_optimal``, ``tree_distance_darts0.5``), so that
    ``MetricCollection([...])`` (which keys members by class name) takes a list of them.
    ``plot()`` draws values like torchmetrics' own metrics, on the metric's range (``[0, 1]``
    for accuracy, Wu-Palmer, Zhao, hF_β and Jaccard; from 0 for the costs).  Pickling stores the
    tree, not its cached tables (rebuilt on first use): about 0.1 MB for tieredImageNet-H.

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
        self.metric, self.decoder = resolve_pair(hierarchy, metric, decoder, validate, **params)
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
        lower, upper = _plot_bounds(self.metric)
        self.__dict__["plot_lower_bound"], self.__dict__["plot_upper_bound"] = lower, upper
        if type(self) is HierarchicalMetric:  # a user's subclass keeps its own class
            self.__class__ = _named_class(self.name)

    def __reduce__(self):
        # The per-pair subclass is made at run time; rebuild it by name instead of pickling it by reference.
        return _restore, (self.name,), self.__getstate__()

    @property
    def name(self) -> str:
        """``<metric>_<decoder>`` with parameter values, safe in file names and logger keys, e.g.
        ``hf_beta0.5_optimal``."""
        return pair_name(self.metric.key, decoder_label(self.decoder, self.metric))

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

    def plot(self, val=None, ax=None):
        """Plot one value, or a sequence of values as a curve (``compute()`` when ``val`` is None).

        val: a float tensor from ``forward``/``compute``, or a list of them; ax: a matplotlib axis
        to draw on.  Returns ``(figure, axis)``; needs matplotlib (``pip install "hdecode_torch[plot]"``).
        """
        return self._plot(val, ax)

    def extra_repr(self) -> str:
        return f"metric={self.metric.key}, decoder={decoder_label(self.decoder, self.metric)}"


def _plot_bounds(metric) -> tuple[float | None, float | None]:
    """(lower, upper) range of the metric's per-sample value, None where unbounded or unknown."""
    if metric.name in _PLOT_BOUNDS:
        return _PLOT_BOUNDS[metric.name]
    cost = getattr(metric, "cost", None)
    if isinstance(cost, torch.Tensor) and cost.numel():
        return float(cost.min()), float(cost.max())
    return None, None


_NAMED: dict[str, type] = {}


def _named_class(name: str) -> type:
    """The subclass of :class:`HierarchicalMetric` called ``name`` (one per name)."""
    if name not in _NAMED:
        _NAMED[name] = type(name, (HierarchicalMetric,), {"__module__": __name__, "__qualname__": name,
                                                          "__doc__": HierarchicalMetric.__doc__})
    return _NAMED[name]


def _restore(name: str) -> HierarchicalMetric:
    return HierarchicalMetric.__new__(_named_class(name))
