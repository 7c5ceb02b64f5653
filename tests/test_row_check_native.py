"""The probability rows' input check on a CPU in one native pass (``kernels/native/row_check.c``).

The statistics are compared exactly with a NumPy reference of the documented order (entry j added to the float64
partial sum j mod 8, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))), on contiguous and strided rows of
every length around the 8-entry step; the per-row flags of ``hdecode::row_check`` with the torch implementation's
away from the tolerance's edges; NaN, infinities, negative entries and -0.0; and the errors a user sees, the
same with the native kernels on and off.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.core.row_checks import raise_probs_error, row_sum_tolerance, unit_sum_stats
from hdecode_torch.kernels import native
from hdecode_torch.kernels.fused.row_check import POSITIVE_FINITE, row_check, row_check_torch, unit_sum_bounds
from hdecode_torch.kernels.native import row_check as native_row_check

from harness import bundled
from testing import Operators

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable here: {native.unavailable_reason()}")


def _reference_sum(row: np.ndarray) -> float:
    """The kernel's float64 sum of one row: eight sequential partial sums (cumsum adds in order), then a tree."""
    x = row.astype(np.float64)
    s = [float(np.cumsum(x[k::8])[-1]) if x[k::8].size else 0.0 for k in range(8)]
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


def _reference_stats(x: np.ndarray) -> tuple[float, float, float]:
    sums = [_reference_sum(r) for r in x]
    nan = any(math.isnan(s) for s in sums)
    low = min(0.0, float(np.min(x))) if x.size else 0.0
    return (math.nan if nan else min(sums), math.nan if nan else max(sums), low)


def _rows(rng, b, m, dtype):
    # widely spread magnitudes: a different order of the additions would round differently
    x = rng.random((b, m)) * np.exp2(rng.integers(-30, 3, size=(b, m)))
    return torch.as_tensor(x / x.sum(1, keepdims=True)).to(dtype)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stats_are_the_documented_sums_on_every_layout(dtype):
    rng = np.random.default_rng(0)
    for m in (1, 3, 7, 8, 9, 15, 16, 17, 608, 1010):
        for b in (1, 2, 5):
            x = _rows(rng, b, m, dtype)
            for view in (x, x.t().contiguous().t(), torch.cat([x, x], 1)[:, ::2]):
                got = native_row_check.row_stats(view)
                want = _reference_stats(view.numpy())
                assert got.dtype == torch.float64 and got.tolist() == list(want), (m, b, view.stride())


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_infinities_and_negative_entries(dtype):
    x = torch.zeros(3, 20, dtype=dtype)
    x[:, :16] = 1 / 16  # the special values go to column 18, a zero: -0.0 there leaves a valid row
    cases = {"nan": (0, math.nan), "inf": (1, math.inf), "-inf": (2, -math.inf), "neg": (1, -1e-3),
             "negzero": (2, -0.0)}
    for name, (row, v) in cases.items():
        y = x.clone()
        y[row, 18] = v
        lo, hi, low = native_row_check.row_stats(y).tolist()
        judged = unit_sum_stats(y, 1e-4)[1]([lo, hi, low])
        assert judged == (name == "negzero"), name
        flags = native_row_check.row_check(y, *unit_sum_bounds(1e-4))
        assert torch.equal(flags, row_check_torch(y, *unit_sum_bounds(1e-4))), name
        if name == "nan":
            assert math.isnan(lo) and math.isnan(hi)
        elif name == "-inf":
            assert lo == -math.inf and low == -math.inf
    both = x.clone()
    both[0, 0], both[0, 1] = math.inf, -math.inf  # inf - inf: NaN
    assert math.isnan(native_row_check.row_stats(both)[0])


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_check_flags_are_the_torch_implementations(dtype):
    rng = np.random.default_rng(1)
    x = _rows(rng, 64, 333, dtype)
    x[3] *= 1.01  # a row off by 1%: fails
    x[5, 7] = -1e-9
    for bounds in (unit_sum_bounds(row_sum_tolerance(dtype, 333)), POSITIVE_FINITE, (2.0, 1.0)):
        want = row_check_torch(x, *bounds)
        assert torch.equal(native_row_check.row_check(x, *bounds), want)
        assert torch.equal(row_check(x, *bounds), want)  # the op: its native kernel on a plain CPU tensor
        assert torch.equal(row_check(x[:1], *bounds), want[:1])  # one row, its own path
    assert native_row_check.row_check(x[:, :0], 0.0, 1.0).tolist() == [True] * 64  # empty rows sum to 0


@needs_native
def test_a_row_is_judged_the_same_whatever_its_batch():
    rng = np.random.default_rng(2)
    x = _rows(rng, 200, 608, torch.float32)
    stats = [native_row_check.row_stats(x[b:b + 1]).tolist() for b in range(200)]
    whole = native_row_check.row_stats(x).tolist()
    assert whole[0] == min(s[0] for s in stats) and whole[1] == max(s[1] for s in stats)


def test_not_applied_where_torch_must_see_the_operators():
    x = torch.full((2, 4), 0.25)
    with native.use_native(False):
        assert native_row_check.row_stats(x) is None and native_row_check.row_check(x, 0.0, 2.0) is None
    assert native_row_check.row_stats(x.half()) is None
    assert native_row_check.row_stats(x[:0]) is None
    with Operators() as ops:  # a dispatch mode is active: the torch path, whose operators it counts
        assert native_row_check.row_stats(x) is None
    assert not ops.ops


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_the_errors_a_user_sees_do_not_change(plan):
    h, _ = bundled("tieredimagenet-h")
    m = hd.get_metric("tree_distance", h)
    x = torch.full((4, h.num_leaves), 1 / h.num_leaves)
    bad = {"sum": x.clone(), "neg": x.clone(), "nan": x.clone()}
    bad["sum"][2] *= 1.5
    bad["neg"][1, 5] = -0.01
    bad["nan"][3, 0] = math.nan
    for key, y in bad.items():
        messages = []
        for on in (True, False):
            with hd.plan_for(plan), native.use_native(on), pytest.raises(ValueError) as err:
                m.decode(y)
            messages.append(str(err.value))
        assert messages[0] == messages[1], key
        assert f"row {dict(sum=2, neg=1, nan=3)[key]}" in messages[0], messages[0]
    with hd.plan_for(plan):
        assert torch.equal(m.decode(x), m.decode(x.double()))


def test_an_error_found_by_other_sums_still_names_a_row():
    """A check whose sums were taken in another order can reject a row these sums put just inside the
    tolerance: the message then names the row farthest from 1 instead of failing to find one."""
    x = torch.full((3, 4), 0.25, dtype=torch.float64)
    sums = torch.tensor([1.0, 1.0 + 0.9e-6, 1.0 - 0.5e-6], dtype=torch.float64)
    with pytest.raises(ValueError, match="row 1 sums to"):
        raise_probs_error(x, sums, (True, True), "leaf_probs", 1e-6, False, torch.float64)
