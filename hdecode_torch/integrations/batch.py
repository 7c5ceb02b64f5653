"""``BatchDecoder``: a picklable callable that decodes a batch dict, for the engines that bring the data.

Ray Data's ``map_batches`` (a callable class run as a stateful actor on ``dict[str, ndarray]``
batches), Spark's ``predict_batch_udf`` (a predict function made once per Python worker) and
Lightning's prediction writers all take a callable of a batch; this is that callable.  It holds
no maths: each batch becomes one :class:`~hdecode_torch.Posterior` whose node sums every decoder
shares, and each decoder's ``decode`` runs on it, so a row's answer is what
``get_decoder(spec, h).decode`` gives for it, whatever the batch it arrives in.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..core.posterior import Posterior
from ..core.spec import label, parse_spec
from ..core.logits import input_kind
from ..decoders import Decoder, get_decoder
from ..decoders.registry import DECODERS
from ..hierarchy import Hierarchy
from ..metrics import METRICS, BaseMetric

__all__ = ["BatchDecoder", "column_name"]

_KEYS = {"probs": False, "logits": True}


def column_name(decoder: Decoder) -> str:
    """The output column of ``decoder``: its label (:func:`~hdecode_torch.core.spec.label`) written with
    letters, digits, ``_`` and ``-`` only, so that it is a valid Arrow, Spark and file name:
    ``<metric>_optimal`` for a metric's Bayes-optimal decoder (``wu_palmer_optimal``,
    ``hf_beta0p5_optimal``), the decoder's key otherwise (``majority``, ``darts0p5``)."""
    return label(decoder=decoder, safe=True)


def _resolve(hierarchy: Hierarchy, spec) -> Decoder:
    """A decoder spec, or a metric spec or built metric standing for its Bayes-optimal decoder."""
    if isinstance(spec, BaseMetric):
        return get_decoder("optimal", hierarchy, metric=spec)
    name, _ = parse_spec(spec, "decoder")
    if isinstance(name, str) and name not in DECODERS and name in METRICS:
        return get_decoder("optimal", hierarchy, metric=spec)
    dec = get_decoder(spec, hierarchy)
    if dec.hierarchy is not hierarchy and not dec.hierarchy.same_tree(hierarchy):
        raise ValueError(f"Expected every decoder in `decoders` to be on {hierarchy!r}, but `{dec.key}` is on "
                         f"{dec.hierarchy!r}")
    return dec


class BatchDecoder:
    """Maps a batch dict ``{"probs" | "logits": (B, L) scores, ...}`` to the same dict plus one column
    of predictions per decoder.

    Made for the engines that run a callable on each block of a large table where the table lives::

        ds.map_batches(hd.BatchDecoder, fn_constructor_kwargs={"hierarchy": h, "decoders": [...]},
                       concurrency=4, batch_size=4096)                          # Ray Data
        predict_batch_udf(lambda: hd.BatchDecoder(h, [...], keep_scores=False).predict, ...)  # Spark

    An instance pickles as its tree's arrays (no derived table), the decoder specs and the calibrator's
    parameters; unpickled (on a worker), it builds the tree's tables and the decoders on its device
    again.  Every row's prediction is the one ``get_decoder(spec, hierarchy).decode`` gives for that
    row alone: it does not depend on how the rows are batched or partitioned.

    Args:
        hierarchy: the class tree; its leaves ``0..L-1`` are the scores' columns.
        decoders: a list of decoder specs (``"majority"``, ``"darts[lam=0.5]"``,
            ``"optimal:hf_beta[beta=0.5]"``, built decoders) or metric specs (``"wu_palmer"``,
            ``"hf_beta[beta=0.5]"``, built metrics), a metric standing for its Bayes-optimal decoder.
        from_logits: what the scores hold.  ``None`` (default): the input column's name tells,
            ``"probs"`` probabilities (each row non-negative, summing to 1), ``"logits"`` logits (a
            softmax is applied).  ``True`` / ``False`` require that column; ``"auto"`` takes either
            and decides per batch, probabilities if every row is a distribution, else logits.
        calibrator: an ``nn.Module`` mapping (B, L) logits to (B, L) logits (e.g.
            :class:`~hdecode_torch.TemperatureScaler`), applied before the softmax; needs logits.
            A copy is kept, moved to ``device`` and put in evaluation mode.
        device: where the decoding runs (default: ``"cuda"`` where available, else the CPU).
            Predictions come back where the scores came from.
        validate: check each batch (one host sync per batch): a bad row is a ``ValueError``.
        keep_scores: ``False`` leaves the scores' column out of the output (it is usually the
            largest; Spark's ``predict_batch_udf`` wants the new columns only).

    Call: ``batch`` a mapping with exactly one of ``"probs"``, ``"logits"``: a (B, L) float NumPy
    array or tensor (float16, bfloat16, float32 or float64; B may be 0).  Returns a new dict: the
    other columns as they came, then, under :attr:`columns`, a (B,) int64 array of node ids per
    decoder (a (B, N) bool array of ancestor-closed node sets for set metrics' optimal decoders),
    NumPy arrays for a NumPy input, tensors on the scores' device for a tensor input.  Cost: one
    Posterior per batch (node sums O(B·N)), then each decoder's own cost.
    """

    def __init__(self, hierarchy: Hierarchy, decoders: Sequence = ("optimal:accuracy",),
                 from_logits: bool | str | None = None, calibrator: nn.Module | None = None,
                 device: str | torch.device | None = None, validate: bool = True, keep_scores: bool = True):
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        if isinstance(decoders, (str, Decoder, BaseMetric)) or not isinstance(decoders, Sequence) or not decoders:
            raise TypeError(f"Expected `decoders` to be a non-empty list of decoder or metric specs, e.g. "
                            f"['wu_palmer', 'majority'], but got {decoders!r}")
        if from_logits is not None:
            input_kind(from_logits)
            from_logits = from_logits if from_logits == "auto" else bool(from_logits)
        if calibrator is not None:
            if not isinstance(calibrator, nn.Module):
                raise TypeError(f"Expected `calibrator` to be an nn.Module (logits -> logits), but got "
                                f"{type(calibrator).__name__}")
            if from_logits is False or from_logits == "auto":
                raise ValueError(f"Expected `from_logits` to be True or None with a `calibrator` (it calibrates "
                                 f"logits), but got {from_logits!r}")
        for arg, value in (("validate", validate), ("keep_scores", keep_scores)):
            if not isinstance(value, bool):
                raise TypeError(f"Expected `{arg}` to be a bool, but got {value!r}")
        self._spec = {"decoders": list(decoders), "from_logits": from_logits, "device": device,
                      "validate": validate, "keep_scores": keep_scores}
        self.from_logits, self.validate, self.keep_scores = from_logits, validate, keep_scores
        self.device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device is None else device)
        self.hierarchy = hierarchy.to(self.device)
        #: The decoders, in the order given.
        self.decoders: list[Decoder] = [_resolve(self.hierarchy, spec) for spec in decoders]
        #: The output column of each decoder, in the same order.
        self.columns: list[str] = [column_name(d) for d in self.decoders]
        repeated = sorted({c for c in self.columns if self.columns.count(c) > 1})
        if repeated:
            raise ValueError(f"Expected distinct decoders in `decoders`, but {repeated} is requested twice")
        clash = sorted(set(self.columns) & set(_KEYS))
        if clash:
            raise ValueError(f"A decoder's column cannot be named like an input column: {clash}")
        self.calibrator = None
        if calibrator is not None:
            self.calibrator = copy.deepcopy(calibrator).to(self.device).eval()
            self.calibrator.requires_grad_(False)

    # ----------------------------------------------------------------- pickling
    def __getstate__(self):
        calibrator = None if self.calibrator is None else copy.deepcopy(self.calibrator).cpu()
        return {**self._spec, "hierarchy": self.hierarchy.to("cpu"), "calibrator": calibrator}

    def __setstate__(self, state):
        self.__init__(**state)

    def __repr__(self) -> str:
        return (f"BatchDecoder({self.hierarchy!r}, decoders={self.columns}, from_logits={self.from_logits!r}, "
                f"device={self.device})")

    # ----------------------------------------------------------------- the call
    def _scores(self, batch: Mapping):
        if not isinstance(batch, Mapping):
            raise TypeError(f"Expected `batch` to be a dict of columns, but got {type(batch).__name__}")
        present = [k for k in _KEYS if k in batch]
        if len(present) != 1:
            raise ValueError(f"Expected `batch` to hold exactly one of the columns 'probs' and 'logits', but it "
                             f"has {sorted(map(str, batch))}")
        key = present[0]
        kind = _KEYS[key] if self.from_logits is None else self.from_logits
        if kind != "auto" and kind != _KEYS[key]:
            raise ValueError(f"Expected a {'logits' if kind else 'probs'} column with from_logits={kind}, but "
                             f"`batch` has {key!r}")
        if self.calibrator is not None and key != "logits":
            raise ValueError(f"Expected a 'logits' column with a `calibrator`, but `batch` has {key!r}")
        return key, kind

    def __call__(self, batch: Mapping) -> dict:
        """The predictions of every decoder on ``batch`` (class docstring)."""
        key, kind = self._scores(batch)
        value = batch[key]
        numpy = isinstance(value, np.ndarray)
        if numpy:
            with warnings.catch_warnings():
                # Engines hand out read-only views of their blocks; nothing here writes into its input.
                warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
                scores = torch.from_numpy(value)
        elif isinstance(value, torch.Tensor):
            scores = value.detach()
        else:
            raise TypeError(f"Expected `batch[{key!r}]` to be a NumPy array or a tensor, but got "
                            f"{type(value).__name__}")
        if scores.dim() != 2 or not scores.is_floating_point():
            raise ValueError(f"Expected `batch[{key!r}]` to be a (B, L) floating-point array, but got shape "
                             f"{tuple(scores.shape)} and dtype {scores.dtype}")
        home = scores.device
        scores = scores.to(self.device)
        with torch.no_grad():
            if self.calibrator is not None:
                scores = self.calibrator(scores)
            post = Posterior(self.hierarchy, scores, from_logits=kind, validate=self.validate, name=key,
                             defer_check=True)
            preds = [d.decode(post) for d in self.decoders]
        out = {k: v for k, v in batch.items() if self.keep_scores or k != key}
        for name, pred in zip(self.columns, preds):
            pred = pred.to(home)
            out[name] = pred.numpy() if numpy else pred
        return out

    def predict(self, scores):
        """``scores`` (B, L) (probabilities, or logits with ``from_logits=True`` or a calibrator) -> the
        predictions alone, as Spark's ``predict_batch_udf`` wants them: ``{column: array}``."""
        key = "logits" if self.from_logits is True or self.calibrator is not None else "probs"
        out = self({key: scores})
        return {name: out[name] for name in self.columns}
