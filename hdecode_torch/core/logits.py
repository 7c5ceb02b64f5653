"""Logits: ``from_logits`` read as a kind of input, the softmax, and ``from_logits="auto"``, which tells a
batch of probabilities from a batch of logits on the device (or says why it cannot)."""

from __future__ import annotations

import numpy as np
import torch

from .conversion import warn_user
from .index_checks import raise_first_range_error, range_flags
from .row_checks import Check, raise_probs_error, row_sums

__all__ = ["AUTO_MARGIN", "input_kind", "checked_logits"]


#: How far outside [0, 1] an entry must lie for ``from_logits="auto"`` to read its batch as logits.
AUTO_MARGIN = 1e-3


def input_kind(from_logits) -> str:
    """``"probs"``, ``"logits"`` or ``"auto"`` from a ``from_logits`` argument (False, True or "auto")."""
    if from_logits is True or from_logits is False:
        return "logits" if from_logits else "probs"
    if isinstance(from_logits, str) and from_logits == "auto":
        return "auto"
    if isinstance(from_logits, (int, np.bool_)) and not isinstance(from_logits, bool) and from_logits in (0, 1):
        return "logits" if from_logits else "probs"
    raise ValueError(f"Expected `from_logits` to be False (probabilities), True (logits) or 'auto', but got "
                     f"{from_logits!r}")


def checked_logits(x, checks, name, tol, normalize, kind, validate, num_leaves):
    """``(probs, check)`` of a non-empty (B, L) float32/float64 table ``x`` read as logits (``kind`` =
    ``"logits"``: a softmax) or decided (``"auto"``: probabilities if every row is one, logits if some
    entry lies more than ``AUTO_MARGIN`` outside [0, 1]), with the :class:`Check` still to settle
    (``None`` with ``validate=False``).  The arguments as
    :func:`~hdecode_torch.core.validation.prepare_leaf_probs` resolved them."""
    if kind == "logits" and not validate:
        # Nothing to check: no statistics (an exported graph, whose batch may be empty, then holds no
        # reduction over the whole batch, which has no value on an empty one).
        return torch.softmax(x, dim=1), None
    # The shared statistics: float64 row sums (NaN and +inf make them non-finite), the row maxima
    # (NaN or +inf if a row holds one, -inf if every entry is -inf) and minima.  The batch's extremes are
    # compared through the rows' (all/any): a whole-batch amin has no value on an empty batch, which an
    # exported graph (whose batch size is symbolic) must still take.
    sums = row_sums(x)
    row_max, row_min = x.amax(dim=1), x.amin(dim=1)
    nonneg = (row_min >= 0).all()
    if kind == "auto":
        if normalize:
            probs_like = nonneg
            out = torch.where(probs_like, x / sums.clamp(min=torch.finfo(torch.float64).tiny)[:, None].to(x.dtype),
                              torch.softmax(x, dim=1))
        else:
            probs_like = nonneg & ((sums - 1).abs() <= tol).all()
            out = torch.where(probs_like, x, torch.softmax(x, dim=1))
        if not validate:
            return out, None
        finite = ((row_max > float("-inf")) & (row_max < float("inf"))).all()  # logits may hold -inf
        clearly_logits = (row_min < -AUTO_MARGIN).any() | (row_max > 1 + AUTO_MARGIN).any()
        decided = probs_like | clearly_logits
        ok_normalize = nonneg | ~torch.tensor(normalize, device=x.device)
        sums_ok = ((sums > 0) & torch.isfinite(sums)).all() | ~probs_like | ~torch.tensor(normalize, device=x.device)

        def act(oks):
            if not oks[0]:
                _raise_logits_error(x, name)
            if not oks[1]:
                raise ValueError(f"normalize=True is for unnormalised probabilities, but `{name}` has negative "
                                 f"entries (smallest {float(row_min.min()):.4g}): pass from_logits=True for logits")
            if not oks[2]:
                raise_probs_error(x, sums, (True, True), name, tol, True, x.dtype)
            if not oks[3]:
                _raise_undecided(x, sums, name, tol)
            raise_first_range_error(checks, oks[4:])
        return out, Check([finite, ok_normalize, sums_ok, decided] + range_flags(checks, x.device), act)
    out = torch.softmax(x, dim=1)
    if not validate:
        return out, None
    finite = ((row_max > float("-inf")) & (row_max < float("inf"))).all()
    is_dist = nonneg & ((sums - 1).abs() <= tol).all()

    def act(oks):
        if not oks[0]:
            _raise_logits_error(x, name)
        raise_first_range_error(checks, oks[2:])
        if oks[1] and num_leaves > 1:
            warn_user(f"`{name}` looks like probabilities (non-negative rows summing to 1), but from_logits=True "
                      "applies a softmax to it, which is then wrong: pass from_logits=False for probabilities "
                      "(or from_logits='auto')")
    ranges = range_flags(checks, x.device)
    fine = finite & ~is_dist
    for f in ranges:
        fine = fine & f
    return out, Check([finite, is_dist] + ranges, act, fine)


def _raise_undecided(x, sums, name, tol):
    """Why ``from_logits="auto"`` cannot tell probabilities from logits for this batch."""
    lowest, highest = float(x.amin()), float(x.amax())
    if lowest < 0:
        row = int((x < 0).any(1).nonzero()[0])
        raise ValueError(f"Cannot tell whether `{name}` holds probabilities or logits: row {row} has a negative "
                         f"entry ({float(x[row].min()):.4g}) too small for logits to be likely, and rows sum to "
                         f"{float(sums.min()):.6g}..{float(sums.max()):.6g}. Pass from_logits=False for "
                         "probabilities (clamp the negative entries first) or from_logits=True for logits")
    bad = ((sums - 1).abs() > tol).nonzero()
    row = int(bad[0]) if bad.numel() else 0
    raise ValueError(f"Cannot tell whether `{name}` holds probabilities or logits: its entries are in "
                     f"[{lowest:.4g}, {highest:.4g}] but row {row} sums to {float(sums[row]):.6g}. Pass "
                     "normalize=True for unnormalised probabilities, or from_logits=True for logits")


def _raise_logits_error(x, name):
    if bool(torch.isnan(x).any()):
        row = int(torch.isnan(x).any(1).nonzero()[0])
        raise ValueError(f"Expected `{name}` (logits) to be free of NaN, but row {row} contains NaN")
    if bool(torch.isposinf(x).any()):
        row = int(torch.isposinf(x).any(1).nonzero()[0])
        raise ValueError(f"Expected `{name}` (logits) to be finite or -inf, but row {row} contains +inf")
    row = int((x.amax(dim=1) == float("-inf")).nonzero()[0])
    raise ValueError(f"Expected each row of `{name}` (logits) to have a finite entry, but row {row} is all -inf "
                     "(every class masked)")
