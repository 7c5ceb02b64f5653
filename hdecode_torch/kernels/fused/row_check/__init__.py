"""``hdecode::row_check``: whether each row is non-negative, free of NaN and has its float64 sum within
bounds, in one pass: the input check of probabilities, a flag per row."""

from __future__ import annotations

import functools
import math
import sys

import torch

from ...native import row_check as _native
from .._checks import check_float_tensor
from .._registry import call, direct, register

__all__ = ["row_check", "row_check_torch", "unit_sum_bounds", "POSITIVE_FINITE", "SCHEMA"]

SCHEMA = "row_check(Tensor x, float lo, float hi) -> Tensor"

#: ``(lo, hi)`` with ``lo <= s <= hi`` exactly when the float64 ``s`` is > 0 and finite: the smallest
#: positive (subnormal) float64 and the largest finite one.
POSITIVE_FINITE = (math.ulp(0.0), sys.float_info.max)


def row_check(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """Per-row input check in one pass (``hdecode::row_check``).

    Row b passes iff it holds no NaN, every entry is >= 0 (``-0.0`` is) and its float64 sum s
    satisfies ``lo <= s <= hi``, two float64 comparisons of s itself (no difference, nothing rounded
    after the sum): +inf sums pass only when ``hi`` is +inf; an empty row sums to 0.  E.g.
    ``row_check(x, *unit_sum_bounds(tol)).all()`` (rows summing to 1 within tol) and
    ``row_check(x, *POSITIVE_FINITE).all()`` (sums > 0 and finite).

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides.
        lo, hi: float, not NaN; ``lo > hi`` passes no row.
    Returns:
        (B,) bool.  O(B·M), any M, deterministic.  The sum accumulates in float64 in a fixed order
        (torch: its float64 ``sum``; Triton: per-lane running sums over blocks of the row, then a
        tree over the lanes; the native CPU kernel: four partial sums of every fourth entry); the
        orders agree to a few float64 ulps of the row's absolute sum, so only a sum that close to
        ``lo`` or ``hi`` can be judged differently by two of them.
    Raises:
        ValueError / TypeError naming the argument for a wrong shape or dtype of ``x`` or a NaN bound.
    """
    lo, hi = float(lo), float(hi)
    if x.dim() == 2 and x.shape[0] == 1 and x.shape[1] and direct(x) and x.is_floating_point():
        return _one_row(x, lo, hi)
    return call("row_check", x, lo, hi)


def _one_row(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """:func:`row_check` of a single non-empty row on a CPU: the native kernel where it applies, else its two
    statistics compared on the host (reading a CPU tensor costs a fifth of a microsecond, each elementwise
    operator a few), the same statistics and the same float64 comparisons as :func:`row_check_torch`: a
    float64 sum and a float16/bfloat16/float32/float64 minimum are exact as Python floats, and NaN fails both
    tests."""
    check(x, lo, hi)
    out = _native.row_check(x, lo, hi)
    if out is not None:
        return out
    s, v = x.sum(dim=1, dtype=torch.float64).item(), x.amin().item()
    return torch.full((1,), lo <= s <= hi and v >= 0, dtype=torch.bool)


def check(x, lo, hi) -> None:
    """Shape and dtype of ``x``; ``lo`` and ``hi`` not NaN."""
    check_float_tensor(x, "x")
    for name, v in (("lo", lo), ("hi", hi)):
        if math.isnan(v):
            raise ValueError(f"Expected `{name}` to be a number (an infinity is allowed), but got {v}")


@functools.lru_cache(maxsize=64)
def unit_sum_bounds(tol: float) -> tuple[float, float]:
    """``(lo, hi)`` such that ``lo <= s <= hi`` iff ``abs(s - 1) <= tol`` in float64, for every float64 s.

    ``1 - tol`` and ``1 + tol`` rounded can sit one float on the wrong side of that test, so the
    bounds are moved to the last float64 that passes it: ``s - 1`` rounded is non-decreasing in s
    and round-to-nearest is symmetric, so the floats that pass form one interval.  tol: float >= 0
    (+inf: every float64 but NaN passes).
    """
    tol = float(tol)
    if not tol >= 0:
        raise ValueError(f"Expected `tol` to be a float >= 0, but got {tol}")

    def passes(s: float) -> bool:
        return abs(s - 1.0) <= tol

    lo, hi = 1.0 - tol, 1.0 + tol
    while not passes(hi):
        hi = math.nextafter(hi, 1.0)
    while hi < math.inf and passes(math.nextafter(hi, math.inf)):
        hi = math.nextafter(hi, math.inf)
    while not passes(lo):
        lo = math.nextafter(lo, 1.0)
    while lo > -math.inf and passes(math.nextafter(lo, -math.inf)):
        lo = math.nextafter(lo, -math.inf)
    return lo, hi


def row_check_torch(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """The torch implementation of :func:`row_check` (every device): a float64 sum and a minimum per row."""
    check(x, lo, hi)
    if lo > hi:
        return torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    bsz, m = x.shape
    if 8 * bsz * m > 2 * BLOCK_BYTES and x.dtype != torch.float64 and x.device.type == "cpu":
        # A float64 sum of a narrower dtype converts its input first: in blocks of rows, each block's
        # float64 copy reused memory (a whole table's was fresh pages, which on a CPU cost more than
        # the sums).  Each row's sum is the same operation on the same row, so the same bits.
        rows = max(1, BLOCK_BYTES // (8 * m))
        total = x.new_empty(bsz, dtype=torch.float64)
        low = x.new_empty(bsz)
        for a in range(0, bsz, rows):
            torch.sum(x[a:a + rows], 1, dtype=torch.float64, out=total[a:a + rows])
            torch.amin(x[a:a + rows], 1, out=low[a:a + rows])
    else:
        total = x.sum(dim=1, dtype=torch.float64)  # NaN anywhere makes it NaN, which fails the test
        low = x.amin(dim=1) if m else None  # amin propagates NaN
    # lo <= s <= hi as s == clamp(s, lo, hi): python floats against a float64 tensor, compared in float64;
    # clamp keeps NaN (NaN != NaN) and an infinite sum equals its clamp only when the bound is infinite
    ok = total.clamp(lo, hi) == total
    if m:
        ok &= low >= 0
    return ok


#: Rows of a CPU table whose float64 copy takes about this many bytes are checked together.
BLOCK_BYTES = 1 << 21


def _fake(x, lo, hi):
    check(x, lo, hi)
    return x.new_empty((x.shape[0],), dtype=torch.bool)


def _native_kernel(x, lo, hi):
    check(x, lo, hi)
    return _native.row_check(x, lo, hi)


register("row_check", SCHEMA, row_check_torch, _fake, check, __name__ + ".triton", native=_native_kernel)
