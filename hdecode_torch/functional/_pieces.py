"""The steps every call goes through, shared by the functions of :mod:`hdecode_torch.functional` and by
:class:`~hdecode_torch.HierarchicalMetric` (as torchmetrics' ``_x_update``/``_x_compute`` pieces are shared
by its functions and classes): telling decoded predictions from scores, checking a batch with one host read,
per-sample values in float64, their reduction in the caller's dtype, and the three calls on a built metric
or decoder (:func:`score`, :func:`expect`, :func:`decode_by`) that every named and generic function makes.
"""

from __future__ import annotations

import torch

from ..core.posterior import Posterior
from ..core.node_sets import is_sparse_sets
from ..core.topk import TopK
from ..core.conversion import as_tensor
from ..core.index_checks import RangeCheck, as_node_ids, as_targets, check_node_sets, check_ranges
from ..decoders.registry import get_decoder
from ..hierarchy import Hierarchy
from ..metrics.base import BaseMetric, value_dtype
from ..metrics.registry import METRICS, get_metric

__all__ = ["prediction_kind", "checked_scores", "checked_predictions", "values_update", "values_compute",
           "REDUCTIONS", "as_hierarchy", "on_tree", "metric_on", "leaf_input", "score", "expect", "decode_by",
           "certifies", "certifying_metrics", "check_certify"]

REDUCTIONS = ("none", "mean", "sum")


def prediction_kind(preds, name: str = "preds"):
    """``(kind, preds)``: what ``preds`` holds, told apart by its dtype alone (no host read).

    - ``"scores"``: a floating tensor (B, L) or (L,) of probabilities or logits, or a
      :class:`~hdecode_torch.Posterior`: still to be decoded;
    - ``"sets"``: a bool tensor (B, N) or (N,), decoded node sets;
    - ``"nodes"``: an integer tensor (B,) or (), decoded node ids.

    Arrays and lists are converted to tensors (returned); complex input is a ``TypeError``.
    """
    if isinstance(preds, Posterior):
        return "scores", preds
    if is_sparse_sets(preds):  # a top-k decode's sets: scored from their entries, never densified
        return "sets", preds
    t = as_tensor(preds, name)
    if t.is_complex():
        raise TypeError(f"Expected `{name}` to be float scores, int64 node ids or bool node sets, but got dtype "
                        f"{t.dtype}")
    if t.dtype == torch.bool:
        return "sets", t
    return ("scores" if t.is_floating_point() else "nodes"), t


def checked_scores(h, scores, target, *, from_logits, validate: bool, name: str = "preds"):
    """``(posterior, target)``: scores (B, L) float (or a Posterior) and target (B,) int leaf ids, checked
    together with one host read; the target on the scores' device as int64."""
    L = h.num_leaves
    if isinstance(scores, Posterior):
        post = Posterior.of(h, scores)
        t = as_targets(target, L, device=post.device)
        check_ranges([RangeCheck(t, L, "target", "leaf ids")], validate)
    else:
        x = as_tensor(scores, name)
        t = as_targets(target, L, device=x.device)
        post = Posterior(h, x.detach(), from_logits=from_logits, validate=validate, name=name,
                         extra_checks=[RangeCheck(t, L, "target", "leaf ids")])
    if t.dim() == 1 and t.shape[0] != post.batch_size:
        raise ValueError(f"Expected `target` to have {post.batch_size} entries (one per row of `{name}`), but got "
                         f"{t.shape[0]}")
    return post, t


def checked_predictions(h, kind: str, preds: torch.Tensor, target, *, validate: bool, name: str = "preds"):
    """``(preds, target)``: decoded predictions (``kind`` ``"nodes"``: (B,) node ids; ``"sets"``: (B, N) bool
    sets) and target (B,) leaf ids, checked together with one host read; the target on the predictions'
    device as int64."""
    n, L = h.num_nodes, h.num_leaves
    if kind == "sets":
        p = check_node_sets(preds, n, name=name)
        check = None
        batch = p.shape[0] if p.dim() == 2 else None
    else:
        p = as_node_ids(preds, n, name=name)
        check = RangeCheck(p, n, name, "node ids")
        batch = p.shape[0] if p.dim() == 1 else None
    t = as_targets(target, L, batch, device=p.device)
    check_ranges([check, RangeCheck(t, L, "target", "leaf ids")], validate)
    return p, t


def values_update(metric, pred, target, *, validate: bool = False) -> torch.Tensor:
    """(B,) float64 per-sample values of ``metric`` (a built metric) on decoded predictions; ``validate``:
    check them (False where the caller already has)."""
    return metric(pred, target, validate=validate, dtype=torch.float64)


def values_compute(values, reduction: str = "mean", dtype: torch.dtype | None = None) -> torch.Tensor:
    """The per-sample float64 ``values`` (a tensor, or a list of (B,) tensors) as ``reduction`` says, cast to
    ``dtype`` (default: torch's default dtype).

    ``"none"``: the values; ``"sum"`` / ``"mean"``: their float64 sum taken in sorted order, so that it
    does not depend on how the samples were split into batches or processes (a float64 sum depends on
    its order), then divided by their number for the mean (NaN for no values).  O(B log B).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"Expected `reduction` to be one of {REDUCTIONS}, but got {reduction!r}")
    dtype = value_dtype(dtype)
    if isinstance(values, (list, tuple)):
        if len(values) == 1:  # one update (e.g. the callback's one block per epoch): nothing to concatenate
            values = values[0]
        else:
            values = torch.cat([v.reshape(-1) for v in values]) if values else torch.zeros(0, dtype=torch.float64)
    if reduction == "none":
        return values.to(dtype)
    flat = values.reshape(-1).to(torch.float64)
    total = torch.sort(flat).values.sum()
    return (total if reduction == "sum" else total / flat.numel()).to(dtype)


# --------------------------------------------------------------------------- calls on a built component
def as_hierarchy(hierarchy) -> Hierarchy:
    """``hierarchy``, checked to be a :class:`~hdecode_torch.Hierarchy` (the functions' first check, before
    the component's parameters are)."""
    if not isinstance(hierarchy, Hierarchy):
        raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
    return hierarchy


def on_tree(component, hierarchy):
    """``component``, checked to be built on ``hierarchy``'s tree (a built one passed with another tree)."""
    if component.hierarchy is not hierarchy and not component.hierarchy.same_tree(hierarchy):
        raise ValueError(f"Expected a {component.component_kind} on {hierarchy!r}, but `{component.key}` is on "
                         f"{component.hierarchy!r}")
    return component


def metric_on(spec, hierarchy, params: dict) -> BaseMetric:
    """The metric a spec (or a built metric) names, on ``hierarchy``'s tree."""
    return on_tree(get_metric(spec, as_hierarchy(hierarchy), **params), hierarchy)


def leaf_input(component, leaf_probs, from_logits, normalize, validate, *, defer: bool):
    """``leaf_probs`` as the method takes it: as given for probabilities, else a Posterior converting logits
    or normalising (its check deferred to the decoder's one host read when ``defer``)."""
    if from_logits is False and not normalize:
        return leaf_probs
    if isinstance(leaf_probs, Posterior):
        raise ValueError("`leaf_probs` is a Posterior, whose probabilities are already converted and checked: "
                         "`from_logits` and `normalize` apply to tensors only")
    return Posterior(component.hierarchy, leaf_probs, from_logits=from_logits, normalize=normalize,
                     validate=component._validate(validate), defer_check=defer)


def score(m: BaseMetric, preds, target, *, decoder, from_logits, reduction, dtype, validate) -> torch.Tensor:
    """The values of the built metric ``m`` (what ``functional.<metric>`` and ``functional.value`` return):
    decoded predictions scored as they are; float scores decoded by ``decoder`` first, checked together
    with the target in one host read."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"Expected `reduction` to be one of {REDUCTIONS}, but got {reduction!r}")
    validate = m._validate(validate)
    kind, preds = prediction_kind(preds)
    if kind != "scores":
        return values_compute(values_update(m, preds, target, validate=validate), reduction, dtype)
    dec = get_decoder(decoder, m.hierarchy, metric=m, validate=validate)
    post, t = checked_scores(m.hierarchy, preds, target, from_logits=from_logits, validate=validate)
    values = values_update(m, dec.decode(post), t)  # predictions of a decoder, targets checked with the scores
    return values_compute(values, reduction, post.dtype if dtype is None else dtype)


def expect(m: BaseMetric, leaf_probs, preds, *, from_logits, normalize, validate, chunk_size) -> torch.Tensor:
    """``m.expected`` of the leaf input (``functional.expected_<metric>`` and ``functional.expected``)."""
    probs = leaf_input(m, leaf_probs, from_logits, normalize, validate, defer=False)
    return m.expected(probs, preds, validate=validate, chunk_size=chunk_size)


def certifies(component) -> bool:
    """Whether ``component`` (a metric, or a metric class) certifies its top-k decisions
    (``decode(topk, certify=True)``): a metric that decodes top-k lists and defines ``_certify_topk``."""
    cls = component if isinstance(component, type) else type(component)
    return issubclass(cls, BaseMetric) and bool(cls.accepts_topk) and cls._certify_topk is not BaseMetric._certify_topk


def certifying_metrics() -> list[str]:
    """The registered metrics that certify their top-k decisions, by name."""
    return [n for n in METRICS.names() if certifies(METRICS.get_class(n))]


def check_certify(component, certify) -> bool:
    """``certify`` checked: a bool, and True only for a metric that certifies its top-k decisions (the error
    names the metrics that do)."""
    if not isinstance(certify, bool):
        raise TypeError(f"Expected `certify` to be a bool, but got {certify!r}")
    if certify and not certifies(component):
        what = f"`{component.name}`" if isinstance(component, BaseMetric) else f"the decoder `{component.name}`"
        raise ValueError(f"Expected `certify` to be False for {what}, which gives no certificate of a top-k "
                         f"decision, but got True (the optimal decoders of {', '.join(certifying_metrics())} do)")
    return certify


def decode_by(component, leaf_probs, *, from_logits, normalize, validate, chunk_size, within,
              certify: bool = False):
    """``component.decode`` of the leaf input, a metric's or a decoder's (``functional.decode_<name>``,
    ``functional.decode`` and ``functional.decode_with``); ``certify`` (metrics): ``(pred, certified,
    regret_bound)`` of a top-k input, as ``metric.decode(topk, certify=True)``."""
    kwargs = {"validate": validate, "chunk_size": chunk_size, "within": within}
    if check_certify(component, certify):
        kwargs["certify"] = True
    if TopK.of(leaf_probs) is not None:
        # As it is: the component's decode takes top-k lists, and says why logits or normalising do not apply.
        return component.decode(leaf_probs, from_logits=from_logits, normalize=normalize, **kwargs)
    probs = leaf_input(component, leaf_probs, from_logits, normalize, validate, defer=True)
    return component.decode(probs, **kwargs)
