"""The steps every scoring goes through, shared by the functions of :mod:`hdecode_torch.functional` and by
:class:`~hdecode_torch.HierarchicalMetric` (as torchmetrics' ``_x_update``/``_x_compute`` pieces are shared
by its functions and classes): telling decoded predictions from scores, checking a batch with one host read,
per-sample values in float64, and their reduction in the caller's dtype.
"""

from __future__ import annotations

import torch

from ..core.posterior import Posterior
from ..core.conversion import as_tensor
from ..core.index_checks import RangeCheck, as_node_ids, as_targets, check_node_sets, check_ranges
from ..metrics.base import value_dtype

__all__ = ["prediction_kind", "checked_scores", "checked_predictions", "values_update", "values_compute",
           "REDUCTIONS"]

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
