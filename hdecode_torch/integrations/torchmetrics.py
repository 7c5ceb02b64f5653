"""``HierarchicalMetric``: any hierarchical metric of any decoder's predictions, as a torchmetrics ``Metric``."""

from __future__ import annotations

import threading
import weakref

import torch
from torchmetrics import Metric

from ..core.posterior import Posterior
from ..core.node_sets import is_sparse_sets
from ..core.topk import TopK
from ..core.logits import input_kind
from ..decoders import Decoder, OptimalDecoder
from ..decoders.registry import DECODERS
from ..functional._calibration import _check_bins, _node_calibration_compute, _node_calibration_update
from ..functional._pieces import (
    checked_predictions, checked_scores, prediction_kind, values_compute, values_update,
)
from ..hierarchy import Hierarchy
from ..core.spec import label
from .module import resolve_pair, top_k_metric

__all__ = ["HierarchicalMetric", "NodeCalibrationError"]

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

    ``update(preds, target)``: target (B,) int leaf ids in ``0..L-1``; ``preds`` is told apart by its
    dtype alone (no host read):

    - (B, L) float scores (probabilities or logits, see ``from_logits``; or a
      :class:`~hdecode_torch.Posterior`): the decoder turns them into predictions;
    - (B,) integer node ids, or (B, N) bool node sets (set metrics; dense, or sparse COO as a top-k
      decode returns them): predictions already decoded, scored as they are (the decoder is not used);
    - a top-k list of probabilities (:class:`~hdecode_torch.TopK` or ``probs.topk(k)``), with the
      optimal decoder of accuracy, lca_height, tree_distance, tree_distance_c or hamming: decoded as
      ``metric.decode(topk)`` does (the decision of its completed distribution, O(B·k·D); a set
      metric's sparse COO sets scored from their entries, O(nnz·D)), then scored; a ValueError for other decoders and for ``from_logits=True`` (``"auto"`` takes the
      list as probabilities).  Not shared with other instances (each decodes it).

    ``metric(pred, target)`` scores each sample (in float64, as
    :func:`hdecode_torch.functional.value` does); ``compute()`` returns their mean as a 0-d tensor in
    the dtype of the last update's scores as computed (float64 kept, float32 for every other floating
    dtype), or in torch's default dtype (float32) for decoded predictions and before any update (NaN).

    Args:
        hierarchy: the class tree.
        metric: a name, ``(name, params)`` or built metric; ``params`` are its parameters.
        decoder: ``"optimal"`` (the metric's own Bayes-optimal decoder; ``ValueError`` for a
            metric without one), a heuristic name, ``(name, params)`` or a Decoder.
        from_logits: what float ``preds`` hold.  ``False`` (default): probabilities, each row
            non-negative and summing to 1.  ``True``: logits, a softmax is applied (input that
            looks like probabilities gets a warning).  ``"auto"``: decided per batch on the
            device, probabilities if every row is a distribution, else logits.
        validate: check the predictions or scores and the targets (one host read per batch, shared by
            the instances updated with it, see below); errors name the argument (``preds``, ``target``).
        exact: how the values are kept (below).
        compute_on_cpu, dist_sync_on_step, process_group, sync_on_compute, ...: passed to
            :class:`torchmetrics.Metric`.

    Name: :attr:`key` is the pair's label (:func:`~hdecode_torch.core.spec.label`, e.g.
    ``hf_beta[beta=0.5]/optimal``); each instance's class is a subclass named after it, written with
    letters, digits and ``_`` (:attr:`name`, e.g. ``hf_beta0p5_optimal``, ``tree_distance_darts0p5``), so that
    ``MetricCollection([...])`` (which keys members by class name) takes a list of them.
    ``plot()`` draws values like torchmetrics' own metrics, on the metric's range (``[0, 1]``
    for accuracy, Wu-Palmer, Zhao, hF_β and Jaccard; from 0 for the costs).  Pickling stores the
    tree, not its cached tables (rebuilt on first use): about 0.1 MB for tieredImageNet-H.

    States: with ``exact=True`` (default) the per-sample values (float64, concatenated
    across processes) and ``compute()`` sums them in sorted order (then casts), so the mean is bitwise
    the same for any number of processes or batch split (a float64 sum depends on its
    order); memory is 8 bytes per sample.  ``exact=False`` keeps only ``total`` and
    ``count`` (float64 scalars summed across processes): constant memory, equal up to the
    last bits of float64.  Under DDP the value is the mean over every process's samples;
    DistributedSampler's padding repeats samples, so use a dataset size divisible by the
    world size.  :attr:`higher_is_better` comes from the metric.

    **Sharing.**  Instances updated one after another with the same ``preds`` and ``target``
    (a ``MetricCollection``, with or without compute groups, or a loop) share the batch: one input
    check; for scores, one :class:`~hdecode_torch.Posterior` (node probabilities summed once) and
    each decoder's predictions, decoded once and scored by every metric that uses that decoder (a
    built-in heuristic with the same parameters counts as the same decoder; optimal and user
    decoders are shared by object); decoded predictions are scored once per metric object.  A batch
    is recognised by its objects and their values: the first update keeps a copy of ``preds`` (a
    Posterior's probabilities) and ``target``, and a later instance shares the batch only if its
    arguments are the same objects, bit for bit equal to that copy, compared on their device (one
    host read per instance; two when ``preds`` and ``target`` are on different devices).  A buffer
    refilled in place is therefore a new batch however it was written (under
    ``torch.inference_mode()``, through a numpy view or ``.data``, which bump no version counter).
    An instance updated twice starts a new batch.  The copy (the size of the arguments) is held
    until the next batch.  Each instance's values are exactly those of an unshared update.
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
        self._value_dtype: torch.dtype | None = None  # of the last update's values (see compute)
        lower, upper = _plot_bounds(self.metric)
        self.__dict__["plot_lower_bound"], self.__dict__["plot_upper_bound"] = lower, upper
        if type(self) is HierarchicalMetric:  # a user's subclass keeps its own class
            self.__class__ = _named_class(self.name)

    def __reduce__(self):
        # The per-pair subclass is made at run time; rebuild it by name instead of pickling it by reference.
        return _restore, (self.name,), self.__getstate__()

    @property
    def name(self) -> str:
        """:attr:`key` written with letters, digits and ``_`` (``label(..., safe=True)``), safe in file names,
        logger keys and ``MetricCollection`` keys, e.g. ``hf_beta0p5_optimal``."""
        return label(self.metric, self.decoder, safe=True)

    @property
    def key(self) -> str:
        """The pair's label (:func:`~hdecode_torch.core.spec.label`), ``"<metric key>/<decoder label>"``, e.g.
        ``"hf_beta[beta=0.5]/optimal"``; :attr:`name` is the same label written for identifiers."""
        return label(self.metric, self.decoder)

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        """preds: (B, L) float scores (or a Posterior), decoded by the decoder; or decoded predictions,
        (B,) int node ids or (B, N) bool node sets, scored as they are; or a top-k list (see the class
        docstring).  target: (B,) int leaf ids."""
        topk = TopK.of(preds)
        if topk is not None:
            pred = top_k_metric(self.decoder, self.from_logits, "This HierarchicalMetric").decode(
                topk, validate=self.validate)
            values = values_update(self.metric, pred, target, validate=self.validate)
            self._value_dtype = torch.float64 if topk.values.dtype == torch.float64 else torch.float32
        elif is_sparse_sets(preds):  # decoded sparse sets (a top-k decision): scored from their entries
            values = values_update(self.metric, preds, target, validate=self.validate)
            self._value_dtype = None
        else:
            given, self._given_batch = getattr(self, "_given_batch", None), None
            batch = given if given is not None and _takes(given, self) else _shared_batch(self, preds, target)
            batch.users.add(id(self))
            values = batch.values(self.metric, self.decoder)  # float64
            self._value_dtype = batch.dtype
        if self.exact:
            self.values.append(values)
        else:
            self.total += values.sum().to(self.total.device)
            self.count += values.numel()

    def compute(self) -> torch.Tensor:
        """Mean value over every sample seen (all processes): a 0-d tensor in the dtype of the last update
        (see the class docstring), summed in float64 (NaN before any update)."""
        dtype = getattr(self, "_value_dtype", None)
        if not self.exact:
            return values_compute(self.total / self.count, "none", dtype)
        # A list of per-update values, or one tensor while synchronised across processes.
        return values_compute(self.values, "mean", dtype)

    def reset(self) -> None:
        super().reset()
        self._value_dtype = None

    def plot(self, val=None, ax=None):
        """Plot one value, or a sequence of values as a curve (``compute()`` when ``val`` is None).

        val: a float tensor from ``forward``/``compute``, or a list of them; ax: a matplotlib axis
        to draw on.  Returns ``(figure, axis)``; needs matplotlib (``pip install "hdecode_torch[plot]"``).
        """
        return self._plot(val, ax)

    def extra_repr(self) -> str:
        return self.key


# --------------------------------------------------------------------------- one batch, shared
def decoder_identity(decoder: Decoder):
    """A key equal for decoders that predict the same from the same :class:`Posterior`.

    A built-in heuristic is identified by its class and exact parameter values (not its key, which
    rounds them); any other decoder (optimal decoders, which belong to a metric object, and user
    classes, whose state is unknown) by the object itself.
    """
    if type(decoder) in _BUILTIN_HEURISTICS:
        return type(decoder), tuple(sorted(decoder.params.items()))
    return "object", id(decoder)


_BUILTIN_HEURISTICS = frozenset(cls for name in DECODERS.names()
                                 if (cls := DECODERS.get_class(name)) is not OptimalDecoder)


class NodeCalibrationError(Metric):
    """Expected calibration error of the node probabilities p(n), per depth, as a torchmetrics ``Metric``.

    ``update(probs, target)``: probs (B, L) float probabilities (logits with ``from_logits=True``),
    target (B,) int leaf ids.  ``compute()``: (D+1,) float64, the ECE of p(n) over the (row, node) pairs
    of each depth in ``n_bins`` equal-width bins of [0, 1] (see
    :func:`~hdecode_torch.functional.node_calibration_error`, which gives the same values on the
    concatenated batches up to rounding).  The states are the (D+1, n_bins) float64 sums of counts,
    confidences and hits, summed across processes under DDP.  O(B·N·log n_bins) per update.
    """

    higher_is_better = False
    full_state_update = False

    def __init__(self, hierarchy: Hierarchy, n_bins: int = 15, from_logits: bool | str = False,
                 validate: bool = True, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        input_kind(from_logits)
        self.hierarchy = hierarchy
        self.n_bins = _check_bins(n_bins)
        self.from_logits = from_logits
        self.validate = bool(validate)
        shape = (hierarchy.max_depth + 1, self.n_bins)
        for name in ("counts", "confidence_sum", "hit_sum"):
            self.add_state(name, torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, probs: torch.Tensor, target: torch.Tensor) -> None:
        counts, conf, hits = _node_calibration_update(probs, target, self.hierarchy.to(self.counts.device),
                                                      self.n_bins, self.from_logits, self.validate)
        self.counts += counts
        self.confidence_sum += conf
        self.hit_sum += hits

    def compute(self) -> torch.Tensor:
        return _node_calibration_compute(self.counts, self.confidence_sum, self.hit_sum)


class _SharedBatch:
    """One batch as every :class:`HierarchicalMetric` updated with it sees it: the checked targets and either
    the checked Posterior of the scores and each decoder's predictions, or the checked decoded predictions;
    each (metric, decoder)'s per-sample float64 values; ``dtype``, that of the metrics' results."""

    def __init__(self, h, post: Posterior | None, decoded: torch.Tensor | None, target: torch.Tensor, key: tuple):
        self.h, self.post, self.decoded, self.target, self.key = h, post, decoded, target, key
        self.snapshot: tuple | None = None  # the arguments and copies of their values, to share across calls
        self.dtype = post.dtype if post is not None else torch.get_default_dtype()
        self.preds: dict = {}
        self.scored: dict = {}
        self.users: set[int] = set()  # ids of the metrics updated with it

    def _ident(self, decoder: Decoder):
        """Which predictions ``decoder`` gives on this batch: its identity, or "given" for decoded predictions."""
        return "given" if self.post is None else decoder_identity(decoder)

    def prediction(self, decoder: Decoder) -> torch.Tensor:
        if self.post is None:
            return self.decoded
        ident = decoder_identity(decoder)
        if ident not in self.preds:
            self.preds[ident] = decoder.decode(self.post)
        return self.preds[ident]

    def values(self, metric, decoder: Decoder) -> torch.Tensor:
        """(B,) float64 values of ``metric`` on ``decoder``'s predictions (or on the decoded predictions)."""
        key = (id(metric), self._ident(decoder))
        if key not in self.scored:
            # The predictions come from a decoder or were checked, and the targets were checked with them.
            self.scored[key] = values_update(metric, self.prediction(decoder), self.target)
        return self.scored[key]

    def score(self, members) -> None:
        """Decode once per decoder and score each metric object's node-id predictions in one call (the values
        are elementwise in (prediction, target): the same as one call per decoder).

        A set metric scores node ids through (B, N) node masks: on the CPU plan, one call per decoder keeps
        them in cache (grouped, they took longer); on the GPU plan, one call saves the launches.
        """
        group_sets = self.post is not None and self.post.plan.gpu
        groups: dict = {}
        for m in members:
            pred = self.prediction(m.decoder)
            ident = self._ident(m.decoder)
            if (id(m.metric), ident) in self.scored:
                continue
            alone = pred.dtype == torch.bool or (m.metric.kind == "set" and not group_sets)
            group = groups.setdefault((id(m.metric), ident if alone else None), (m.metric, {}))
            group[1][ident] = pred
        for metric, preds in groups.values():
            if len(preds) == 1:
                (ident, pred), = preds.items()
                self.scored[(id(metric), ident)] = values_update(metric, pred, self.target)
                continue
            both = values_update(metric, torch.cat(list(preds.values())), self.target.repeat(len(preds)))
            for ident, part in zip(preds, both.split(self.target.shape[0])):
                self.scored[(id(metric), ident)] = part


#: This thread's last batch (``batch``), which the next instance updated with the same arguments shares: how the
#: members of a ``MetricCollection`` (or a loop over instances) share one check and decoding.  The one
#: thread-local cache of the package; ``update_together`` hands its batch to each member instead.
_local = threading.local()


def _content(x):
    """The tensor whose values decide a batch's answer: scores, decoded predictions or targets; a Posterior's
    probabilities."""
    return x.probs if isinstance(x, Posterior) else x


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` with floats read as integers of their width: equal exactly when bit for bit equal (a NaN equals
    itself, -0.0 differs from 0.0), which is what makes two batches give the same answer."""
    if t.is_floating_point():
        return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _snapshot(preds, target):
    """Weak references to an update's arguments and copies of their values, to recognise the same batch later;
    None when they cannot be recognised (arrays and lists are converted anew at every call)."""
    xs = (_content(preds), target)
    if not all(isinstance(x, torch.Tensor) for x in xs):
        return None
    return (weakref.ref(preds), weakref.ref(target)), tuple(x.detach().clone() for x in xs)


def _same_batch(snapshot, preds, target) -> bool:
    """Whether ``preds`` and ``target`` are the objects of ``snapshot`` and hold bit for bit the values copied
    there (one host read; none when the objects differ)."""
    (ref_p, ref_t), snapshot = snapshot
    if ref_p() is not preds or ref_t() is not target:
        return False
    xs = (_content(preds), target)
    if not all(isinstance(x, torch.Tensor) and x.shape == s.shape and x.dtype == s.dtype and x.device == s.device
               for x, s in zip(xs, snapshot)):
        return False
    if snapshot[0].device != snapshot[1].device:
        return all(torch.equal(_bits(s), _bits(x)) for s, x in zip(snapshot, xs))
    same = [(_bits(s) == _bits(x)).all() for s, x in zip(snapshot, xs)]
    return bool(torch.stack(same).all())


def _options(metric: "HierarchicalMetric", kind: str) -> tuple:
    """What must be equal for two metrics to share a batch of this kind (the input kind of scores matters)."""
    return kind, input_kind(metric.from_logits) if kind == "scores" else None, metric.validate


def _new_batch(metric: "HierarchicalMetric", kind: str, x, target, options: tuple) -> _SharedBatch:
    h = metric.hierarchy
    if kind == "scores":
        post, t = checked_scores(h, x, target, from_logits=metric.from_logits, validate=metric.validate)
        return _SharedBatch(h, post, None, t, options)
    decoded, t = checked_predictions(h, kind, x, target, validate=metric.validate)
    return _SharedBatch(h, None, decoded, t, options)


def _shared_batch(metric: "HierarchicalMetric", preds, target) -> _SharedBatch:
    """The batch ``(preds, target)`` checked (scores with their Posterior), shared with the metrics updated
    with it before (see the class docstring); ``metric`` is being updated with it."""
    kind, x = prediction_kind(preds)
    options = _options(metric, kind)
    entry = getattr(_local, "batch", None)
    # Identity and in-place version counters cannot tell a refilled buffer from the batch it held (writes
    # under inference_mode, through a numpy view or .data bump no counter): only the values can.
    if (entry is not None and entry.key == options and entry.snapshot is not None and _takes(entry, metric)
            and _same_batch(entry.snapshot, preds, target)):
        return entry
    entry = _new_batch(metric, kind, x, target, options)
    entry.snapshot = _snapshot(preds, target)
    _local.batch = entry
    return entry


def _takes(batch: _SharedBatch, metric: "HierarchicalMetric") -> bool:
    """Whether ``metric`` may be updated with ``batch`` (checked with its options, on its tree, not yet used by it)."""
    return (id(metric) not in batch.users and batch.key == _options(metric, batch.key[0])
            and (batch.h is metric.hierarchy or batch.h.same_tree(metric.hierarchy)))


def update_together(members, preds, target) -> None:
    """``m.update(preds, target)`` for every ``m`` of ``members``, sharing one checked batch, with the values of
    each metric object computed in one call for all its decoders' node-id predictions (what a grouped caller
    such as the Lightning callback knows in advance; members updated one by one share the decoding only).

    Within this one call the arguments cannot change, so the batch is handed to each member without comparing
    their values (and without the thread's shared batch).
    """
    members = list(members)
    if not members:
        return
    kind, x = prediction_kind(preds)
    options = _options(members[0], kind)
    batch = _new_batch(members[0], kind, x, target, options)
    batch.score([m for m in members if _options(m, kind) == options])
    for m in members:
        m._given_batch = batch  # taken by m.update when m's options and tree match, else m checks its own
        try:
            m.update(preds, target)
        finally:
            m._given_batch = None


def release_shared_batch() -> None:
    """Drop this thread's shared batch (its Posterior's tables, the predictions and the copy of its values)."""
    _local.batch = None


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
