"""Every metric and decoder as plain functions of tensors and a hierarchy, next to the classes (as
``torchmetrics.functional`` sits next to torchmetrics' classes).

One rule names them all, for every registered metric ``<metric>`` and decoder ``<decoder>``::

    <metric>(preds, target, hierarchy, *, <params>)           per-sample values (or their mean, sum)
    expected_<metric>(leaf_probs, preds, hierarchy, *, <params>)   Σ_l p(l) <metric>(preds, l)
    decode_<metric>(leaf_probs, hierarchy, *, <params>, within=None)   the metric's Bayes-optimal prediction
    decode_<decoder>(leaf_probs, hierarchy, *, <params>, within=None)  a heuristic decoder's prediction

e.g. ``wu_palmer(preds, target, h)``, ``hf_beta(preds, target, h, beta=0.5)``,
``expected_wu_palmer(probs, preds, h)``, ``decode_hf_beta(probs, h, beta=0.5)``,
``decode_darts(probs, h, lam=1.0)``.  The parameters of a metric or decoder (its ``PARAMS``) are
keyword-only.  The generic entry points take the name (or any spec, ``"hf_beta[beta=0.5]"``, or a built
metric) first: :func:`value`, :func:`expected`, :func:`decode` (a metric's Bayes-optimal decoder) and
:func:`decode_with` (any decoder).

The functions of the built-in metrics and decoders are written out, one module per concept
(``_accuracy.py``, ``_lca_height.py``, ``_tree_distance.py``, ``_wu_palmer.py``, ``_zhao.py``,
``_hf_beta.py``, ``_hamming.py``, ``_jaccard.py``; the ten heuristics in ``_heuristics.py``, as their
classes share a module).  A metric or decoder registered later (``hd.register_metric``,
``hd.register_decoder``) gets the same functions on first access (``functional.my_metric``), made from
its class (``_generated.py``), and the generic entry points take its name.

Each function builds the metric or decoder and makes one call through the pieces they all share
(``_pieces.py``: ``score``, ``expect``, ``decode_by``), so a function returns exactly what
the method does: ``wu_palmer(preds, target, h) == get_metric("wu_palmer", h)(preds, target)``.  Building
one costs no more than reusing it (what depends on the tree alone is cached on the hierarchy), except
``cost_matrix``, which checks its matrix at each build: build a ``CostMatrixMetric`` once and pass it
to the generic functions.

The metric functions take what a torchmetrics metric takes: decoded predictions ((B,) int64 node ids;
set metrics also (B, N) bool node sets) are scored as they are; (B, L) float scores are decoded first
(by the metric's own Bayes-optimal decoder unless ``decoder=`` names another), as
:class:`~hdecode_torch.HierarchicalMetric` does, which computes through the same steps.
"""

from __future__ import annotations

import warnings

import torch

from ..decoders.registry import DECODERS, get_decoder
from ..metrics.registry import METRICS
from ._accuracy import accuracy, decode_accuracy, expected_accuracy
from ._calibration import NodeReliability, node_calibration_error, node_reliability
from ._calibration_check import NodeCalibrationCheck, node_calibration_check
from . import _generated
from ._generated import functions_of as _functions_of, metric_functions as _metric_functions
from ._hamming import decode_hamming, expected_hamming, hamming
from ._heuristics import (
    decode_argmax_leaf, decode_confidence_threshold, decode_crm, decode_darts, decode_expected_information,
    decode_hie, decode_information_threshold, decode_majority, decode_plurality, decode_top_down,
)
from ._hf_beta import decode_hf_beta, expected_hf_beta, hf_beta
from ._jaccard import decode_jaccard, expected_jaccard, jaccard
from ._lca_height import decode_lca_height, expected_lca_height, lca_height
from ._pieces import as_hierarchy as _as_hierarchy, decode_by as _decode_by, expect as _expect
from ._pieces import metric_on as _metric_on, on_tree as _on_tree, score as _score
from ._tree_distance import (
    decode_tree_distance, decode_tree_distance_c, expected_tree_distance, expected_tree_distance_c, tree_distance,
    tree_distance_c,
)
from ._wu_palmer import decode_wu_palmer, expected_wu_palmer, wu_palmer
from ._zhao import decode_zhao, expected_zhao, zhao

#: The functions written out for the built-in metrics and decoders, by concept.
_WRITTEN = (
    "accuracy", "expected_accuracy", "decode_accuracy",
    "lca_height", "expected_lca_height", "decode_lca_height",
    "tree_distance", "expected_tree_distance", "decode_tree_distance",
    "tree_distance_c", "expected_tree_distance_c", "decode_tree_distance_c",
    "wu_palmer", "expected_wu_palmer", "decode_wu_palmer",
    "zhao", "expected_zhao", "decode_zhao",
    "hf_beta", "expected_hf_beta", "decode_hf_beta",
    "hamming", "expected_hamming", "decode_hamming",
    "jaccard", "expected_jaccard", "decode_jaccard",
    "decode_argmax_leaf", "decode_top_down", "decode_confidence_threshold", "decode_majority", "decode_plurality",
    "decode_darts", "decode_expected_information", "decode_information_threshold", "decode_hie", "decode_crm",
)

__all__ = ["value", "expected", "decode", "decode_with", "node_calibration_error", "node_reliability",
           "NodeReliability", "node_calibration_check", "NodeCalibrationCheck", *_WRITTEN]


# --------------------------------------------------------------------------- the generic entry points
def value(metric, preds, target, hierarchy, *, decoder="optimal", from_logits: bool | str = False,
          reduction: str = "none", dtype: torch.dtype | None = None, validate: bool | None = None,
          **params) -> torch.Tensor:
    """The values of ``metric`` on ``preds`` against ``target``.

    Args:
        metric: a metric spec (``"wu_palmer"``, ``"hf_beta[beta=0.5]"``, ``("hf_beta", {"beta": 0.5})``)
            or a built metric on ``hierarchy``; ``params`` are its parameters (``beta=0.5``).
        preds: what is scored, told apart by its dtype: (B,) or () integer node ids, or (B, N) or (N,)
            bool node sets (set metrics), scored as they are; or (B, L) or (L,) float scores (or a
            :class:`~hdecode_torch.Posterior`), decoded by ``decoder`` first.
        target: (B,) or () int64 leaf ids in ``0..L-1``.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        decoder: what decodes float scores: ``"optimal"`` (the metric's Bayes-optimal decoder), a decoder
            spec (``"darts[lam=1]"``) or a built decoder; unused for decoded predictions.
        from_logits: what float scores hold: probabilities (``False``), logits (``True``) or ``"auto"``.
        reduction: ``"none"`` (per-sample values, (B,)), ``"mean"`` or ``"sum"`` (0-d; the float64 sum
            taken in sorted order, so it does not depend on the order of the samples).
        dtype: the result's floating dtype.  Default: the scores' compute dtype (float64 kept, float32
            otherwise) for scores, torch's default dtype (float32) for decoded predictions.
        validate: check the input (one host read); default: the metric's default (True).

    Returns:
        (B,) (or ()) values for ``reduction="none"``, else a 0-d tensor, on the predictions' device.
        Values are computed in float64 and cast once.  ``value("wu_palmer", pred, target, h)`` equals
        ``get_metric("wu_palmer", h)(pred, target)``.
    """
    return _score(_metric_on(metric, hierarchy, params), preds, target, decoder=decoder, from_logits=from_logits,
                  reduction=reduction, dtype=dtype, validate=validate)


def expected(metric, leaf_probs, preds, hierarchy, *, from_logits: bool | str = False, normalize: bool = False,
             validate: bool | None = None, chunk_size: int | None = None, **params) -> torch.Tensor:
    """The expected value ``Σ_l p(l) m(preds, l)`` of ``metric`` under each leaf distribution.

    Args:
        metric: a metric spec or a built metric on ``hierarchy``; ``params`` are its parameters.
        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`).
        preds: (B,) or () int64 node ids; set metrics also take (B, N) or (N,) bool node sets.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        from_logits: ``True``: ``leaf_probs`` holds logits (a softmax is applied); ``"auto"``: decided
            per batch.  normalize: divide each row by its sum instead of requiring it to be 1.
        validate: check the input (one host read per call, two with logits); default True.
        chunk_size: samples per chunk (default: bounded by the memory budget).

    Returns:
        (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
        dtype), on their device: ``get_metric(metric, hierarchy, **params).expected(leaf_probs, preds)``.
    """
    return _expect(_metric_on(metric, hierarchy, params), leaf_probs, preds, from_logits=from_logits,
                   normalize=normalize, validate=validate, chunk_size=chunk_size)


def decode(metric, leaf_probs, hierarchy, *, from_logits: bool | str = False, normalize: bool = False,
           validate: bool | None = None, chunk_size: int | None = None, within=None, certify: bool = False,
           **params):
    """The Bayes-optimal prediction for ``metric``: the prediction of best expected value.

    Args:
        metric: a metric spec or a built metric on ``hierarchy``; ``params`` are its parameters.
        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`); or a top-k
            list of probabilities, ``probs.topk(k)`` or a :class:`~hdecode_torch.TopK` ((B, k) values and
            leaf ids), for the metrics whose decoder takes one (``metric.accepts_topk``): the decision of
            the completed distribution.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        from_logits, normalize, validate, chunk_size: as for :func:`expected`.
        within: (B,) int64 node ids (or one id for all rows), the node each row's answer must lie under:
            the row is decoded on that node's subtree, its probabilities renormalised there (None or the
            root: the whole tree).
        certify: with a top-k input, also return each row's certificate (accuracy, lca_height,
            tree_distance, tree_distance_c): whether the decision is optimal under every completion the
            list is consistent with (each unlisted leaf at most the row's smallest listed value, their
            total the missing mass), and an upper bound on its expected-score regret over them.  A
            ``ValueError`` naming ``certify`` for dense probabilities (their decision is exact) and for a
            metric without a certificate.

    Returns:
        (B,) int64 node ids for leaf and node metrics, (B, N) bool ancestor-closed node sets for set
        metrics (unbatched for a (L,) input): ``get_metric(metric, hierarchy, **params).decode(leaf_probs)``.
        With ``certify=True``: ``(pred, certified, regret_bound)``, (B,) int64, (B,) bool and (B,) float64
        (0 where certified), as ``get_metric(metric, hierarchy, **params).decode(topk, certify=True)``.
        A metric without an exact decoder raises ``NotImplementedError``.
    """
    return _decode_by(_metric_on(metric, hierarchy, params), leaf_probs, from_logits=from_logits,
                      normalize=normalize, validate=validate, chunk_size=chunk_size, within=within, certify=certify)


def decode_with(decoder, leaf_probs, hierarchy, *, from_logits: bool | str = False, normalize: bool = False,
                validate: bool | None = None, chunk_size: int | None = None, within=None,
                **params) -> torch.Tensor:
    """The prediction of any decoder.

    Args:
        decoder: a decoder spec (``"darts"``, ``"darts[lam=0.5]"``, ``"optimal:hf_beta[beta=0.5]"``) or a
            built decoder on ``hierarchy``; ``params`` are its parameters (``lam=0.5``).
        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`).
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        from_logits, normalize, validate, chunk_size: as for :func:`expected`; within: as for :func:`decode`.

    Returns:
        (B,) int64 node ids (optimal decoders of set metrics: (B, N) bool sets), unbatched for a (L,)
        input: ``get_decoder(decoder, hierarchy, **params).decode(leaf_probs)``.
    """
    d = _on_tree(get_decoder(decoder, _as_hierarchy(hierarchy), **params), hierarchy)
    return _decode_by(d, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                      chunk_size=chunk_size, within=within)


# --------------------------------------------------------------------------- registered later
# The generator's two entry points were names of this module when it generated every function; old imports
# keep working, warned once.
_MOVED = {"metric_functions": "`functional.<metric>`, `functional.expected_<metric>`, `functional.decode_<metric>`",
          "decoder_function": "`functional.decode_<decoder>`"}
_WARNED: set[str] = set()


def __getattr__(name: str):
    if name in _MOVED:
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"`hdecode_torch.functional.{name}` is deprecated: register the class "
                          f"(hd.register_metric / hd.register_decoder) and use {_MOVED[name]}", DeprecationWarning,
                          stacklevel=2)
        return getattr(_generated, name)
    # The functions of a metric or decoder registered after this module loaded (made anew at each
    # access, so that a replaced registration is followed).
    function = _functions_of(name) if not name.startswith("__") else None
    if function is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return function


def __dir__() -> list[str]:
    later = [n for m in METRICS.names() for n in _metric_functions(METRICS.get_class(m)) if n not in _WRITTEN]
    later += [f"decode_{d}" for d in DECODERS.names() if d != "optimal" and f"decode_{d}" not in _WRITTEN]
    return sorted(set(globals()) | set(later))
