"""The check of probability rows: the row-sum tolerance per dtype and number of classes, accurate row sums,
and the deferred :class:`Check` that carries a batch's flags to the call's one host read.

Each row must be non-negative, free of NaN and sum to 1 within :func:`row_sum_tolerance`
(``normalize=True``: a positive, finite sum, then divided by it).  The statistics are computed on the
device and read once, when the check is settled (at once with ``normalize=True``, whose output depends
on it)."""

from __future__ import annotations

import math

import torch

from ..kernels.fused.row_check import POSITIVE_FINITE, row_check, unit_sum_bounds
from ..kernels.native.row_check import row_stats
from .index_checks import raise_first_range_error, range_flags

__all__ = ["ROW_SUM_TOLERANCE", "row_sum_tolerance", "row_sums", "row_sums_and_min", "CHECK_BLOCK_BYTES",
           "CHECK_BLOCKED_FROM_BYTES", "Check", "range_only_check", "checked_probs", "raise_probs_error"]


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


def range_only_check(checks, device) -> Check:
    """The :class:`Check` of ``checks`` (range checks) alone: a batch with no entries to check."""
    flags = range_flags(checks, device)
    return Check(flags, lambda oks: raise_first_range_error(checks, oks))


def checked_probs(x, checks, name, tol, normalize, in_dtype, validate, fused_check):
    """``(probs, check)`` of a (B, L) float32/float64 table ``x`` read as probabilities (the arguments as
    :func:`~hdecode_torch.core.validation.prepare_leaf_probs` resolved them; ``tol`` from
    :func:`row_sum_tolerance`): the rows divided by their sums with ``normalize=True``, and the
    :class:`Check` still to settle (``None`` once settled, or with ``validate=False``)."""
    if not validate:
        return (x / x.sum(dim=1, keepdim=True) if normalize else x), None
    if x.numel() == 0:
        return x, range_only_check(checks, x.device)
    # Row sums and a min (one pass over memory, block by block, on a large CPU table), or one fused pass
    # whose per-row flags give the batch's flag at once; no host read here.  NaN and +inf make a row sum
    # non-finite and NaN makes the min NaN, so the one flag covers finiteness too; the error path then
    # finds out exactly what is wrong.
    stats = None
    if fused_check:
        # the bounds pass exactly the float64 sums the unfused test below passes
        ok = row_check(x, *(POSITIVE_FINITE if normalize else unit_sum_bounds(tol)))
        # one row: its flag is the batch's (a view; ``all`` is an operator, a few µs at one row)
        ok = ok.view(()) if x.shape[0] == 1 else ok.all()
        # float64 sums as the op takes them, only where the output needs them (or below, an error)
        sums = x.sum(dim=1, dtype=torch.float64) if normalize else None
    elif normalize:
        sums, low = row_sums_and_min(x)
        ok = (low >= 0) & ((sums > 0) & torch.isfinite(sums)).all()
    else:
        sums, stats = None, unit_sum_stats(x, tol)
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
                raise_probs_error(x, s, (finite, nonneg_), name, tol, normalize, in_dtype)
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


def unit_sum_stats(x: torch.Tensor, tol: float):
    """The ``stats`` of a :class:`Check` that every row of x (B ≥ 1, L ≥ 1) is non-negative and sums to 1
    within ``tol``: ``(smallest row sum, largest row sum, smallest entry)``, judged on the host.

    The float64 test ``abs(s - 1) <= tol`` passes an interval of sums, so it passes every row exactly
    when it passes the smallest and the largest row sum; NaN anywhere makes a statistic NaN, which
    fails it, and so does an infinite sum.  On a CPU one native pass makes all three (float64 sums in a
    fixed order a row, so a row's verdict never depends on its batch:
    :func:`~hdecode_torch.kernels.native.row_check.row_stats`); elsewhere the row sums are :func:`row_sums`'
    (taken in the input's precision, exact in float64), in four operators (sum, extremes, minimum, stack)
    whatever B ≥ 2, and for one row ``(its sum, smallest entry)`` in three.
    """
    values = row_stats(x)
    if values is None:
        values = _torch_stats(x)
    def judge(v) -> bool:
        lo, hi, low = v if len(v) == 3 else (v[0], v[0], v[1])
        return abs(lo - 1.0) <= tol and abs(hi - 1.0) <= tol and low >= 0

    def on_device() -> torch.Tensor:
        v = values.to(torch.float64)
        k = v.numel() - 1  # the sums' entries: both extremes, or one row's sum
        return ((v[:k] - 1).abs() <= tol).all() & (v[k] >= 0)

    return values, judge, on_device


def _torch_stats(x: torch.Tensor) -> torch.Tensor:
    """:func:`unit_sum_stats`' statistics by torch operators: (3,) or, for one row, (2,) ``(its sum, smallest entry)``."""
    if x.numel() * x.element_size() > CHECK_BLOCKED_FROM_BYTES and x.device.type == "cpu":
        sums, low = row_sums_and_min(x)  # float64 sums, exact: compared as float64
        return torch.stack([sums.amin(), sums.amax(), low.to(torch.float64)])
    if x.shape[0] == 1:
        # one row: its sum is both extremes, and the (1,) sum and minimum join without aminmax and the 0-d
        # stack (three operators instead of four, a few µs at one row; the same sum, the same minimum)
        return torch.cat([x.sum(dim=1), x.amin(dim=1)])
    sums = x.sum(dim=1)
    return torch.stack([*torch.aminmax(sums), x.amin()])


def raise_probs_error(x, sums, flags, name, tol, normalize, in_dtype):
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
    # a check whose float64 sums were taken in another order can reject a row these sums put a few ulps
    # inside the tolerance: name the row farthest from 1
    row = int(bad[0]) if bad.numel() else int((sums - 1).abs().argmax())
    raise ValueError(
        f"Expected each row of `{name}` to sum to 1 (tolerance {tol:g} for {in_dtype} input), but row {row} sums "
        f"to {float(sums[row]):.6g} ({bad.numel()} bad row(s)). Pass normalize=True to renormalize, or "
        "from_logits=True if these are logits"
    )
