"""Input checks shared by every public entry point: bad input gets a clear error, never a wrong answer.

Each check is one fused reduction and a single host sync, and every public function
takes ``validate=False`` to skip it on trusted hot paths.  Messages name the argument,
what was expected, what was found, and the fix.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import NamedTuple

import numpy as np
import torch


__all__ = [
    "ROW_SUM_TOLERANCE",
    "row_sum_tolerance",
    "compute_dtype",
    "as_tensor",
    "prepare_leaf_probs",
    "RangeCheck",
    "check_ranges",
    "as_targets",
    "as_node_ids",
    "check_node_sets",
    "check_positive",
    "check_nonnegative",
    "check_unit_interval",
    "warn_user",
]

#: The part of the row-sum tolerance that does not grow with the number of classes, per dtype of the
#: *input*: rounding each entry to the storage dtype moves a sum by up to eps/2 (float16 5e-4,
#: bfloat16 4e-3), so rows that summed to 1 before a cast do not sum to 1 within 1e-6 after it.
ROW_SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
}


def row_sum_tolerance(dtype: torch.dtype, num_classes: int = 1) -> float:
    """Largest |row sum − 1| accepted for probabilities stored in ``dtype`` over ``num_classes`` columns.

    ``ROW_SUM_TOLERANCE[dtype] + eps_acc · √L · log₂ L``: the first term covers rounding each entry to
    ``dtype``, the second the accumulation error of the softmax that produced the row (its sum is
    accumulated in float32 for float32 and half inputs, in float64 for float64; eps_acc is that
    dtype's epsilon).  That is 1.4e-4 at L = 1,000, 2.1e-3 at L = 7·10⁵ and 8.9e-3 at L = 10⁷ for
    float32, above the error of a float32 softmax's row sum and below a row off by 2%, which is always
    rejected.
    """
    acc = torch.finfo(torch.float64 if dtype == torch.float64 else torch.float32).eps
    growth = acc * math.sqrt(num_classes) * math.log2(num_classes) if num_classes > 1 else 0.0
    return ROW_SUM_TOLERANCE.get(dtype, 1e-4) + growth


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (float32, float16, bfloat16) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_tensor(x, name: str) -> torch.Tensor:
    """Accept dense tensors, numpy arrays and nested lists; anything else is a TypeError."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise TypeError(f"Expected `{name}` to be a dense tensor, but got layout {x.layout}: pass `{name}.to_dense()`")
        if x.device.type == "meta":
            raise ValueError(f"Expected `{name}` to hold data, but it is a meta tensor (shape {tuple(x.shape)})")
        return x
    if isinstance(x, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(x)
            if arr.dtype == object:
                raise TypeError(f"mixed or non-numeric entries (numpy dtype {arr.dtype})")
            return torch.as_tensor(arr)
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise TypeError(f"Expected `{name}` to be a tensor or array of numbers: {exc}") from None
    raise TypeError(f"Expected `{name}` to be a torch.Tensor, but got {type(x).__name__}")


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first caller outside this package, however deep the call."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


# --------------------------------------------------------------------------- range checks
class RangeCheck(NamedTuple):
    """``tensor`` (integer ids) must lie in ``0..hi-1``; ``what`` names the ids in messages."""

    tensor: torch.Tensor
    hi: int
    name: str
    what: str


def _range_flag(c: RangeCheck, device) -> torch.Tensor:
    t = c.tensor
    ok = ((t >= 0) & (t < c.hi)).all()
    return ok if ok.device == device else ok.to(device)


def _raise_range_error(c: RangeCheck) -> None:
    t = c.tensor.reshape(-1)
    out = (t < 0) | (t >= c.hi)
    bad = t[out]
    pos = int(out.nonzero()[0])
    raise ValueError(
        f"Expected `{c.name}` in 0..{c.hi - 1} ({c.what}), but got {int(bad[0])} at position {pos} "
        f"({bad.numel()} value(s) out of range)"
    )


def range_flags(checks, device) -> list[torch.Tensor]:
    """One 0-d bool tensor on ``device`` per :class:`RangeCheck` (no host sync)."""
    return [_range_flag(c, device) for c in checks]


def raise_first_range_error(checks, oks) -> None:
    for c, ok in zip(checks, oks):
        if not ok:
            _raise_range_error(c)


def check_ranges(checks, validate: bool = True) -> None:
    """Check every :class:`RangeCheck` with a single host sync (nothing when ``validate=False``)."""
    checks = [c for c in checks if c is not None]
    if not validate or not checks:
        return
    device = checks[0].tensor.device
    oks = torch.stack(range_flags(checks, device)).tolist()  # the one host sync
    if not all(oks):
        raise_first_range_error(checks, oks)


# --------------------------------------------------------------------------- probabilities
def row_sums(x: torch.Tensor) -> torch.Tensor:
    """(B,) float64 row sums of a (B, L) float table, accurate whatever L.

    torch reduces a float32/half row by cascade (CPU) or tree (CUDA) summation, accumulating in
    float32: the rounding error grows like eps·log L, not eps·L, far below any row-sum tolerance, so the sums are taken in the input's precision and only the
    (B,) result is converted; converting every entry to float64 first costs several times more.
    """
    return x.sum(dim=1).to(torch.float64)

#: A table larger than ``CHECK_BLOCKED_FROM_BYTES`` (it does not stay in the cache between two passes) is
#: checked in blocks of rows of about ``CHECK_BLOCK_BYTES``: each block is summed and searched for its
#: minimum while it is still in the cache, one pass over memory instead of two.  Smaller tables take the
#: two passes, fewer operators (benchmarks/README.md, "Risk control").
CHECK_BLOCK_BYTES = 2**21
CHECK_BLOCKED_FROM_BYTES = 2**25


def row_sums_and_min(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row_sums(x), x.amin())`` of a (B, L) float table: (B,) float64 and a 0-d tensor (NaN if any entry is).

    On the CPU a table larger than ``CHECK_BLOCKED_FROM_BYTES`` is read block by block of rows, both
    reductions on a block while it is in the cache; each row is summed as :func:`row_sums` sums it.
    """
    rows = max(1, CHECK_BLOCK_BYTES // max(1, x.shape[1] * x.element_size()))
    if x.numel() * x.element_size() <= CHECK_BLOCKED_FROM_BYTES or x.shape[0] <= rows or x.device.type != "cpu":
        return row_sums(x), x.amin()
    sums = x.new_empty(x.shape[0])
    lows = []
    for a in range(0, x.shape[0], rows):
        block = x[a:a + rows]
        torch.sum(block, 1, out=sums[a:a + rows])
        lows.append(block.amin())
    return sums.to(torch.float64), torch.stack(lows).amin()


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


class Check:
    """A deferred input check: 0-d bool flags on the device, and what to do with their host values.

    The flags are computed with the data; :meth:`settle` reads them (one host read, or none when the
    caller reads them with other values it needs, see ``Posterior.read``) and raises the error, or
    warns, that their values stand for.  ``fine``: a 0-d bool on the device, true when there is
    nothing to raise or warn (by default every flag true), for callers that read one value and settle
    the flags only when it is false.  Settled once.

    ``stats``: optional ``(values, judge, on_device)``, a check decided on the host from a few batch
    statistics rather than on the device: ``values`` (S,) float, read with the flags; ``judge`` maps
    their host values to the first flag's value; ``on_device()`` gives that flag as a 0-d bool on the
    device (for ``fine``).  Comparing a handful of floats in Python costs less than the operators
    that would compare them on the device.
    """

    def __init__(self, flags: list[torch.Tensor], act, fine: torch.Tensor | None = None, stats=None):
        self.flags, self.act, self._fine, self.stats = flags, act, fine, stats
        self.done = not flags and stats is None

    def settle(self, values: list | None = None) -> None:
        """Act on the flags' values (read here when ``values`` is None)."""
        if self.done:
            return
        if values is None:  # the one host read
            values = self._read()
        self.done = True
        self.act([bool(v) for v in values])

    def _read(self) -> list:
        if self.stats is None:
            return [self.flags[0].item()] if len(self.flags) == 1 else torch.stack(self.flags).tolist()
        stats, judge, _ = self.stats
        if not self.flags:
            return [judge(stats.tolist())]
        got = torch.cat([stats.to(torch.float64), torch.stack(self.flags).to(torch.float64)]).tolist()
        return [judge(got[:stats.numel()])] + got[stats.numel():]

    def fine(self) -> torch.Tensor:
        """0-d bool on the device: nothing to raise or warn."""
        if self._fine is None:
            flags = ([self.stats[2]()] if self.stats is not None else []) + list(self.flags)
            ok = flags[0]
            for f in flags[1:]:
                ok = ok & f
            self._fine = ok
        return self._fine


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


#: How far outside [0, 1] an entry must lie for ``from_logits="auto"`` to read its batch as logits.
AUTO_MARGIN = 1e-3


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
        probs, check = _checked_probs(x, checks, name, tol, normalize, in_dtype, validate, fused_check)
    elif not x.numel():
        probs, check = x, (_range_check(checks, x.device) if validate else None)
    else:
        probs, check = _checked_logits(x, checks, name, tol, normalize, kind, validate, num_leaves)
    if check is not None and not defer:
        check.settle()
        check = None
    return probs, unbatched, check


def _range_check(checks, device) -> Check:
    flags = range_flags(checks, device)
    return Check(flags, lambda oks: raise_first_range_error(checks, oks))


def _checked_logits(x, checks, name, tol, normalize, kind, validate, num_leaves):
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
                _raise_probs_error(x, sums, (True, True), name, tol, True, x.dtype)
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


def _checked_probs(x, checks, name, tol, normalize, in_dtype, validate, fused_check):
    if not validate:
        return (x / x.sum(dim=1, keepdim=True) if normalize else x), None
    if x.numel() == 0:
        return x, _range_check(checks, x.device)
    # Row sums and a min (one pass over memory, block by block, on a large CPU table), or one fused pass
    # whose per-row flags give the batch's flag at once; no host read here.  NaN and +inf make a row sum
    # non-finite and NaN makes the min NaN, so the one flag covers finiteness too; the error path then
    # finds out exactly what is wrong.
    stats = None
    if fused_check:
        from ..kernels.fused.row_check import POSITIVE_FINITE, row_check, unit_sum_bounds

        # the bounds pass exactly the float64 sums the unfused test below passes
        ok = row_check(x, *(POSITIVE_FINITE if normalize else unit_sum_bounds(tol))).all()
        # float64 sums as the op takes them, only where the output needs them (or below, an error)
        sums = x.sum(dim=1, dtype=torch.float64) if normalize else None
    elif normalize:
        sums, low = row_sums_and_min(x)
        ok = (low >= 0) & ((sums > 0) & torch.isfinite(sums)).all()
    else:
        sums, stats = None, _unit_sum_stats(x, tol)
    # divided in float64: a float32 row may sum past float32's range
    out = (x / sums.clamp(min=torch.finfo(torch.float64).tiny)[:, None]).to(x.dtype) if normalize else x

    overflow = []

    def act(oks):
        if not oks[0]:
            if sums is not None:
                s = sums
            else:  # the sums the check judged: the fused op's float64 ones, or row_sums
                s = x.sum(dim=1, dtype=torch.float64) if fused_check else row_sums(x)
            finite, nonneg_ = bool(torch.isfinite(x).all()), bool((x >= 0).all())
            if normalize and finite and nonneg_ and not bool((s <= 0).any()):
                overflow.append(True)  # finite entries whose float32 sum overflows
            else:
                _raise_probs_error(x, s, (finite, nonneg_), name, tol, normalize, in_dtype)
        raise_first_range_error(checks, oks[1:])
    if stats is None:
        check = Check([ok] + range_flags(checks, x.device), act)
    else:
        check = Check(range_flags(checks, x.device), act, stats=stats)
    if normalize:
        # Settled here (the output depends on it): rows whose sum overflowed are rescaled by their
        # maximum first.
        check.settle()
        if overflow:
            scaled = x / x.amax(dim=1, keepdim=True)
            out = (scaled / row_sums(scaled)[:, None]).to(x.dtype)
        return out, None
    return out, check


def _unit_sum_stats(x: torch.Tensor, tol: float):
    """The ``stats`` of a :class:`Check` that every row of x (B ≥ 1, L ≥ 1) is non-negative and sums to 1
    within ``tol``: ``(smallest row sum, largest row sum, smallest entry)``, judged on the host.

    The float64 test ``abs(s - 1) <= tol`` passes an interval of sums, so it passes every row exactly
    when it passes the smallest and the largest row sum; NaN anywhere makes a statistic NaN, which
    fails it, and so does an infinite sum.  The row sums are :func:`row_sums`' (taken in the input's
    precision, exact in float64), so the decision is the row-by-row test's.  Four operators (sum,
    extremes, minimum, stack) whatever B.
    """
    if x.numel() * x.element_size() > CHECK_BLOCKED_FROM_BYTES and x.device.type == "cpu":
        sums, low = row_sums_and_min(x)  # float64 sums, exact: compared as float64
        values = torch.stack([sums.amin(), sums.amax(), low.to(torch.float64)])
    else:
        sums = x.sum(dim=1)
        values = torch.stack([*torch.aminmax(sums), x.amin()])

    def judge(v) -> bool:
        lo, hi, low = v
        return abs(lo - 1.0) <= tol and abs(hi - 1.0) <= tol and low >= 0

    def on_device() -> torch.Tensor:
        v = values.to(torch.float64)
        return ((v[:2] - 1).abs() <= tol).all() & (v[2] >= 0)

    return values, judge, on_device


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


def _raise_probs_error(x, sums, flags, name, tol, normalize, in_dtype):
    finite, nonneg = flags
    if not finite:
        bad = ~torch.isfinite(x)
        row = int(bad.any(1).nonzero()[0])
        what = "NaN" if bool(torch.isnan(x[row]).any()) else "infinite"
        raise ValueError(f"Expected `{name}` to be finite, but row {row} contains {what} values (NaN or infinite "
                         "probabilities are never valid; check the model's output)")
    if not nonneg:
        row = int((x < 0).any(1).nonzero()[0])
        hint = " These look like logits: pass from_logits=True (or apply softmax)."
        raise ValueError(
            f"Expected `{name}` to be probabilities (>= 0), but row {row} has a negative entry "
            f"({float(x[row].min()):.4g}).{hint}"
        )
    if normalize:
        row = int((sums <= 0).nonzero()[0])
        raise ValueError(f"Cannot normalize `{name}`: row {row} sums to {float(sums[row]):.4g} (expected a positive sum)")
    bad = ((sums - 1).abs() > tol).nonzero()
    row = int(bad[0])
    raise ValueError(
        f"Expected each row of `{name}` to sum to 1 (tolerance {tol:g} for {in_dtype} input), but row {row} sums "
        f"to {float(sums[row]):.6g} ({bad.numel()} bad row(s)). Pass normalize=True to renormalize, or "
        "from_logits=True if these are logits"
    )


# --------------------------------------------------------------------------- ids
def _integer_ids(x, name: str, what: str) -> torch.Tensor:
    t = as_tensor(x, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"Expected `{name}` to hold integer {what}, but got dtype {t.dtype}")
    return t


def as_targets(target, num_leaves: int, batch: int | None = None, *, name: str = "target",
               device: torch.device | None = None) -> torch.Tensor:
    """Type and shape checks of (B,) or () integer class indices (no host sync).  Returns int64."""
    t = _integer_ids(target, name, "class indices")
    if t.dim() > 1:
        raise ValueError(f"Expected `{name}` to have shape (B,) or (), but got {tuple(t.shape)}")
    if batch is not None and t.dim() == 1 and t.shape[0] != batch:
        raise ValueError(f"Expected `{name}` to have {batch} entries (one per sample), but got {t.shape[0]}")
    return t.to(device=device if device is not None else t.device, dtype=torch.long)


def as_node_ids(pred, num_nodes: int, *, name: str = "pred", device: torch.device | None = None) -> torch.Tensor:
    """Type and shape checks of (B,) or () integer node ids (no host sync).  Returns int64."""
    t = _integer_ids(pred, name, "node ids")
    if t.dim() > 1:
        raise ValueError(f"Expected `{name}` to have shape (B,) or () (node ids), but got {tuple(t.shape)}")
    return t.to(device=device if device is not None else t.device, dtype=torch.long)


def check_node_sets(pred, num_nodes: int, *, name: str = "pred", device: torch.device | None = None) -> torch.Tensor:
    """pred: (B, N) or (N,) bool node sets.  Returns bool on ``device``."""
    t = as_tensor(pred, name)
    if t.dtype != torch.bool:
        raise TypeError(f"Expected `{name}` as a node set to be a bool tensor, but got dtype {t.dtype}")
    if t.dim() not in (1, 2) or t.shape[-1] != num_nodes:
        raise ValueError(f"Expected `{name}` to have shape (B, {num_nodes}) or ({num_nodes},), but got {tuple(t.shape)}")
    return t.to(device) if device is not None else t


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a real number, but got {type(value).__name__}")
    value = float(value)
    if value != value:
        raise ValueError(f"Expected `{name}` to be a number, but got nan")
    return value


def check_positive(value, name: str) -> float:
    v = _number(value, name)
    if not (v > 0) or v == float("inf"):
        raise ValueError(f"Expected `{name}` to be a float > 0, but got {value}")
    return v


def check_nonnegative(value, name: str) -> float:
    v = _number(value, name)
    if not (v >= 0) or v == float("inf"):
        raise ValueError(f"Expected `{name}` to be a float >= 0, but got {value}")
    return v


def check_unit_interval(value, name: str) -> float:
    """A value in [0, 1)."""
    v = _number(value, name)
    if not (0 <= v < 1):
        raise ValueError(f"Expected `{name}` to be a float in [0, 1), but got {value}")
    return v


# --------------------------------------------------------------------------- deferred checks
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
