"""The check of a classifier's leaf scores, the one every public entry point runs: bad input gets a clear
error, never a wrong answer.

:func:`prepare_leaf_probs` converts the scores (``conversion``), reads them as probabilities
(``row_checks``) or logits (``logits``), and checks ids passed along (``index_checks``) in the same
reduction: one host read per call, none with ``validate=False``.  :func:`leaf_row_flags` is the same
check row by row, for callers that read it later.  Messages name the argument, what was expected,
what was found, and the fix.

The names of those modules (and of ``scalar_checks``) are importable from here too: code outside the
package (tests, benchmarks, users) imports them from this module.  Patch a constant where it is defined.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .conversion import as_tensor, compute_dtype, warn_user
from .index_checks import (RangeCheck, as_node_ids, as_targets, check_node_sets, check_ranges, raise_first_range_error,
                           range_flags)
from .logits import AUTO_MARGIN, checked_logits, input_kind
from .row_checks import (CHECK_BLOCK_BYTES, CHECK_BLOCKED_FROM_BYTES, ROW_SUM_TOLERANCE, Check, checked_probs,
                         range_only_check, row_sum_tolerance, row_sums, row_sums_and_min)
from .scalar_checks import check_nonnegative, check_positive, check_unit_interval

__all__ = ["prepare_leaf_probs", "leaf_row_flags", "RowFlags",
           # defined in the modules named above, importable here too
           "ROW_SUM_TOLERANCE", "row_sum_tolerance", "row_sums", "row_sums_and_min", "CHECK_BLOCK_BYTES",
           "CHECK_BLOCKED_FROM_BYTES", "Check", "compute_dtype", "as_tensor", "warn_user", "input_kind", "AUTO_MARGIN",
           "RangeCheck", "range_flags", "raise_first_range_error", "check_ranges", "as_targets", "as_node_ids",
           "check_node_sets", "check_positive", "check_nonnegative", "check_unit_interval"]


def _input_array(leaf_probs, num_leaves: int, name: str) -> tuple[torch.Tensor, bool]:
    """(B, L) floating-point tensor and whether the input was 1-D; type and shape errors name ``name``."""
    x = as_tensor(leaf_probs, name)
    if not x.is_floating_point():
        what = "complex" if x.is_complex() else ("bool" if x.dtype == torch.bool else "integer")
        hint = {
            "integer": " (class indices? decoders take probabilities; cast with .float() if these are counts "
                       "and pass normalize=True)",
            "bool": " (a one-hot mask? cast with .float())",
            "complex": "",
        }[what]
        raise TypeError(f"Expected `{name}` to be a floating-point tensor, but got dtype {x.dtype}{hint}")
    if x.dim() not in (1, 2):
        raise ValueError(f"Expected `{name}` to have shape (B, {num_leaves}) or ({num_leaves},), but got {tuple(x.shape)}")
    unbatched = x.dim() == 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.shape[1] != num_leaves:
        raise ValueError(
            f"Expected `{name}` to have {num_leaves} columns (one per leaf of the hierarchy), but got shape "
            f"{tuple(x.shape)}"
        )
    return x, unbatched


def prepare_leaf_probs(
    leaf_probs,
    num_leaves: int,
    *,
    name: str = "leaf_probs",
    normalize: bool = False,
    from_logits: bool | str = False,
    validate: bool = True,
    extra_checks=(),
    fused_check: bool = False,
    defer: bool = False,
) -> tuple[torch.Tensor, bool, Check | None]:
    """Check and convert leaf probabilities to a ``(B, L)`` tensor in the compute dtype.

    leaf_probs: (B, L) or (L,) float.  Returns ``(probs, unbatched, check)``: ``probs`` is (B, L)
    float32 (float64 kept), ``unbatched`` tells whether the input was 1-D, and ``check`` is the
    :class:`Check` still to settle (``None`` once settled, or with ``validate=False``).

    What the input holds, ``from_logits``:

    - ``False`` (the default everywhere): probabilities, each row non-negative and summing to 1
      within :func:`row_sum_tolerance` (``normalize=True`` divides each row by its sum instead);
    - ``True``: logits, turned into probabilities by a softmax (``-inf`` is allowed: probability 0,
      as long as each row has a finite entry).  Input that looks like probabilities (non-negative
      rows summing to 1) is almost surely not logits: it gets a warning, since a softmax of
      probabilities is a silently wrong answer;
    - ``"auto"``: decided for the whole batch.  Probabilities if every row is a distribution (with
      ``normalize=True``: if no entry is negative); logits if some entry lies more than
      ``AUTO_MARGIN`` outside [0, 1].  Anything else cannot be decided and is an error that says why
      (e.g. entries in [0, 1] whose rows do not sum to 1, or probabilities with tiny negative
      entries), as is ``normalize=True`` on a batch with negative entries.  Decided on the device.

    ``extra_checks``: :class:`RangeCheck` s (e.g. predictions or targets on the same device) checked
    in the same reduction, so that a whole call reads the host once.  ``defer=True`` returns the
    check unsettled, for the caller to read with other values it needs (one host read per call in
    all).  With ``validate=False`` nothing is checked and nothing is read.  ``fused_check``: check the
    rows in one fused pass (``hdecode::row_check``; what the GPU plan does).
    """
    kind = input_kind(from_logits)
    x, unbatched = _input_array(leaf_probs, num_leaves, name)
    in_dtype = x.dtype
    if in_dtype not in (torch.float32, torch.float64):
        x = x.to(compute_dtype(in_dtype))
    checks = [c for c in extra_checks if c is not None] if validate else []
    tol = row_sum_tolerance(in_dtype, num_leaves)
    if kind == "probs":
        probs, check = checked_probs(x, checks, name, tol, normalize, in_dtype, validate, fused_check)
    elif not x.numel():
        probs, check = x, (range_only_check(checks, x.device) if validate else None)
    else:
        probs, check = checked_logits(x, checks, name, tol, normalize, kind, validate, num_leaves)
    if check is not None and not defer:
        check.settle()
        check = None
    return probs, unbatched, check


class RowFlags(NamedTuple):
    """Per-row outcome of the leaf-score check (see :func:`leaf_row_flags`): (B,) bool tensors."""

    valid: torch.Tensor
    is_dist: torch.Tensor


def leaf_row_flags(x: torch.Tensor, from_logits: bool | str = False) -> RowFlags:
    """The check of :func:`prepare_leaf_probs`, row by row, on ``x``'s device and without a host sync.

    For callers that read the outcome later, together with other values (e.g. once per epoch instead
    of once per batch), and get the message of a failed row from ``prepare_leaf_probs`` on it.

    x: (B, L) float scores, as ``prepare_leaf_probs`` takes them (reduced in the compute dtype, with
    the row-sum tolerance of ``x.dtype``).  Returns :class:`RowFlags`, two (B,) bool tensors:

    - ``is_dist``: the row is non-negative and sums to 1 within :func:`row_sum_tolerance` (what
      ``from_logits=True`` warns about and ``"auto"`` decides with, over a whole batch);
    - ``valid``: the row passes the check for ``from_logits``: ``False`` is ``is_dist`` (NaN and ±inf
      fail it); ``True`` has neither NaN nor +inf and a finite entry; ``"auto"`` is the logits
      condition and, for the batch as a whole, decidable (every row a distribution, or some entry
      more than ``AUTO_MARGIN`` outside [0, 1]), so pass one batch at a time.

    O(B·L): four reductions over ``x``.
    """
    kind = input_kind(from_logits)
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"Expected `x` to be a float tensor, but got {getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"Expected `x` to have shape (B, L) with L >= 1, but got {tuple(x.shape)}")
    tol = row_sum_tolerance(x.dtype, x.shape[1])
    x = x.to(compute_dtype(x.dtype))
    row_min = x.amin(dim=1)
    is_dist = (row_min >= 0) & ((row_sums(x) - 1).abs() <= tol)  # NaN fails both comparisons
    if kind == "probs":
        return RowFlags(is_dist, is_dist)
    row_max = x.amax(dim=1)  # NaN if the row holds one, +inf if it holds +inf, -inf if every entry is -inf
    valid = (row_max > float("-inf")) & (row_max < float("inf"))
    if kind == "auto" and x.shape[0]:
        decided = is_dist.all() | (row_min.amin() < -AUTO_MARGIN) | (row_max.amax() > 1 + AUTO_MARGIN)
        valid = valid & decided
    return RowFlags(valid, is_dist)
