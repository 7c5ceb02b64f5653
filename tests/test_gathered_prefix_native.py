"""The native kernel of ``hdecode::gathered_prefix`` (``kernels/native/range_sums.c``): on plain float CPU tensors
it gives the torch implementation's range sums bit for bit (the same float64 table, additions in the same order,
one difference and one rounding a range), for every input and output dtype, weights or none, ranges from 0 or
from ``lo`` (one-entry and empty ranges included), any strides and batch sizes around its groups of 8 rows; it
raises the torch implementation's errors; it stands aside over the memory budget, under an operator count and
when turned off; and the GPU plan's node sums and decisions on a CPU are the same with it or without it."""

from __future__ import annotations

import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from hdecode_torch.kernels.fused import gathered_prefix
from hdecode_torch.kernels.fused._registry import OPS
from hdecode_torch.kernels.native.budget import gathered_prefix_scratch
from torch.utils._python_dispatch import TorchDispatchMode

from harness import bundled, random_trees

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable here: {native.unavailable_reason()}")


@pytest.fixture(autouse=True)
def _restore_budget():
    yield
    hd.set_memory_budget(None)


class _Spy:
    """Counts the native kernel's answers (True: it ran, False: it stood aside) while installed."""

    def __enter__(self):
        self.op = OPS["gathered_prefix"]
        self.calls = []
        impl = self.op.native

        def counted(*a):
            out = impl(*a)
            self.calls.append(out is not None)
            return out
        OPS["gathered_prefix"] = self.op.__class__(**{**self.op.__dict__, "native": counted})
        return self

    def __exit__(self, *exc):
        OPS["gathered_prefix"] = self.op


def _both(*args):
    with _Spy() as spy:
        fast = gathered_prefix(*args)
    with native.use_native(False):
        slow = gathered_prefix(*args)
    return fast, slow, spy.calls


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def _ranges(g, j, k):
    lo = torch.randint(0, j + 1, (k,), generator=g)
    hi = torch.minimum(lo + torch.randint(0, 4, (k,), generator=g), torch.tensor(j))  # empty, one-entry, longer
    hi[: k // 3] = torch.randint(0, j + 1, (k // 3,), generator=g)  # long ranges
    lo[: k // 3] = torch.minimum(lo[: k // 3], hi[: k // 3])
    return hi, lo


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("from_zero", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 8, 9, 37])
def test_the_native_kernel_gives_the_torch_implementations_bits(dtype, out_dtype, weighted, from_zero, rows):
    g = torch.Generator().manual_seed(rows * 31 + weighted)
    m, j, k = 23, 41, 30
    # magnitudes far apart, signs mixed: every rounding of the prefix shows
    x = (torch.randn(rows, m, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (rows, m), generator=g))
    x = x.to(dtype)
    src = torch.randint(0, m, (j,), generator=g)
    weight = torch.rand(j, generator=g, dtype=torch.float64) * 3 if weighted else None
    hi, lo = _ranges(g, j, k)
    fast, slow, calls = _both(x, src, weight, hi, None if from_zero else lo, out_dtype)
    assert calls == [True], "the native kernel did not run"
    assert fast.dtype == slow.dtype == out_dtype and fast.shape == (rows, k)
    assert torch.equal(_bits(fast), _bits(slow))


@needs_native
@pytest.mark.parametrize("layout", ["transposed", "sliced"])
def test_any_strides(layout):
    g = torch.Generator().manual_seed(5)
    base = torch.rand(30, 19, generator=g, dtype=torch.float32)
    x = base.t() if layout == "transposed" else base[::2, 3:]
    src = torch.randint(0, x.shape[1], (25,), generator=g)
    hi, lo = _ranges(g, 25, 17)
    fast, slow, calls = _both(x, src, None, hi, lo, torch.float64)
    assert calls == [True] and torch.equal(_bits(fast), _bits(slow))


@needs_native
def test_empty_inputs():
    x = torch.rand(4, 6, dtype=torch.float64)
    src = torch.tensor([0, 2, 5])
    hi, lo = torch.tensor([3, 1]), torch.tensor([0, 0])
    for args, shape in (((x[:0], src, None, hi, lo, torch.float64), (0, 2)),
                        ((x, src, None, hi[:0], lo[:0], torch.float64), (4, 0))):
        fast, slow, calls = _both(*args)
        assert calls == [True] and fast.shape == slow.shape == shape
    zeros = torch.zeros(5, dtype=torch.long)
    fast, slow, _ = _both(x, src[:0], None, zeros, zeros, torch.float32)  # no source: every range 0
    assert torch.equal(fast, torch.zeros(4, 5)) and torch.equal(fast, slow)


@needs_native
def test_errors_are_the_torch_implementations():
    x = torch.rand(3, 5)
    src, hi, lo = torch.tensor([0, 4]), torch.tensor([2]), torch.tensor([0])
    for bad, match in (((x, torch.tensor([0, 5]), None, hi, lo, torch.float64), "src"),
                       ((x, src, None, torch.tensor([3]), lo, torch.float64), "hi"),
                       ((x, src, None, hi, lo, torch.int64), "out_dtype")):
        with pytest.raises((ValueError, TypeError), match=match):
            gathered_prefix(*bad)
        with native.use_native(False), pytest.raises((ValueError, TypeError), match=match):
            gathered_prefix(*bad)


@needs_native
def test_stands_aside_over_the_budget_when_off_and_under_an_operator_count():
    x = torch.rand(9, 12, dtype=torch.float64)
    src, hi, lo = torch.arange(12), torch.tensor([12, 5]), torch.tensor([0, 4])
    hd.set_memory_budget(gathered_prefix_scratch(12) - 1)
    fast, slow, calls = _both(x, src, None, hi, lo, torch.float64)
    assert calls == [False] and torch.equal(fast, slow)
    hd.set_memory_budget(gathered_prefix_scratch(12))
    assert _both(x, src, None, hi, lo, torch.float64)[2] == [True]
    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))
    with _Spy() as spy, Count():
        counted = gathered_prefix(x, src, None, hi, lo, torch.float64)
    assert spy.calls == [] and any("hdecode.gathered_prefix" in s for s in seen)
    assert torch.equal(counted, slow)


def _trees():
    yield bundled("tieredimagenet-h")[0]
    yield bundled("inat19")[0]
    yield hd.Hierarchy.from_parents([3, 3, 4, 4, 5, 6, -1])  # single-child chains
    for h, _ in random_trees(11, 4):
        yield h


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_gpu_plans_node_sums_and_decisions_on_a_cpu_are_the_same(dtype):
    for h in _trees():
        g = torch.Generator().manual_seed(h.num_nodes)
        probs = torch.softmax(4 * torch.randn(21, h.num_leaves, generator=g, dtype=torch.float64), 1).to(dtype)
        got = {}
        for on in (True, False):
            with native.use_native(on), hd.plan_for("cuda"):
                post = hd.Posterior(h, probs)
                assert post.plan.batch_major  # its node sums are gathered_prefix's range sums
                sets = {name: hd.get_metric(name, h).decode(probs) for name in ("jaccard", "hamming", "wu_palmer")}
                got[on] = (post.node.clone(), post.depth_prefix().clone(), sets)
        (n1, d1, s1), (n0, d0, s0) = got[True], got[False]
        assert torch.equal(_bits(n1), _bits(n0)) and torch.equal(_bits(d1), _bits(d0)), h.num_nodes
        for name in s1:
            assert torch.equal(s1[name], s0[name]), (name, h.num_nodes)
