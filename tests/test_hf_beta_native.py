"""hF_β's native CPU kernels (``kernels/native/hf_beta.c``): the candidate listing and the per-leaf-depth masses
give the torch path's pairs, values and masses bit for bit (raw bits), on random unbalanced trees with
single-child chains, both bundled trees, float32 and float64, empty batches, strided inputs, B = 1 and
B = 4,000 equal row by row.  The native decoder (its own float64 arithmetic after the masses) decides as the
torch path: equal sets but for rare ties within the dtype's rounding (their expected scores checked equal);
a batch decides as its rows alone; rows it does not take fall back.
``use_native(False)`` runs the torch path (the kernels are not called).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from hdecode_torch.kernels.candidates import bounded_pairs, candidate_pairs
from hdecode_torch.kernels.depth_ranges import depth_masses, depth_masses_packed, depth_prefix_sums, depth_ranges
from hdecode_torch.kernels.native import hf_beta as native_hf_beta
from hdecode_torch.metrics.hf_beta import _prefix_bounds

from harness import batch, bundled, random_trees

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable here: {native.unavailable_reason()}")
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}
DTYPES = [torch.float32, torch.float64]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in BITS:
        return torch.equal(a.contiguous().view(BITS[a.dtype]), b.contiguous().view(BITS[b.dtype]))
    return torch.equal(a, b)


def _assert_same_decisions(h, probs, on, off, beta):
    """Equal sets row by row, but for rare ties: a row may differ where its two sets' expected scores (in float64)
    are equal to the rounding of the dtype.  The torch path compares sums in the values' dtype, the native decoder
    float64 sums with exact ties (within 2^-42) to the smallest k; on such rows the GPU plan's solver (another
    order of sums) also splits as one or the other (seen: a dyadic float64 row of two sets of score 0.6375, sizes
    2 and 3, where the native decoder and the GPU plan take the smallest k as documented and the torch path the
    other; a float32 row whose scores differ by 7e-8)."""
    if torch.equal(on, off):
        return
    rows = (on != off).any(1).nonzero().flatten()
    assert rows.numel() <= max(1, probs.shape[0] // 20)
    from hdecode_torch.metrics.hf_beta import hf_beta_expected
    post = hd.Posterior(h, probs.index_select(0, rows).double())
    a, b = hf_beta_expected(post, on[rows], beta), hf_beta_expected(post, off[rows], beta)
    rtol = 2e-6 if probs.dtype == torch.float32 else 1e-12
    assert torch.allclose(a, b, rtol=rtol, atol=0), (a, b)


def _trees():
    yield from (h for h, _ in random_trees(11, 6, num_nodes_max=60))
    yield from (h for h, _ in random_trees(12, 4, num_nodes_max=10))
    yield bundled("tieredimagenet-h")[0]
    yield bundled("inat19")[0]


def _node_probs(h, bsz: int, dtype, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    probs = torch.from_numpy(batch(rng, bsz, h.num_leaves)).to(dtype) if bsz else torch.zeros(0, h.num_leaves,
                                                                                             dtype=dtype)
    return hd.node_probabilities(h, probs).t().contiguous() if bsz else torch.zeros(h.num_nodes, 0, dtype=dtype)


def _both(fn):
    with native.use_native(True):
        on = fn()
    with native.use_native(False):
        off = fn()
    return on, off


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bsz", [0, 1, 4, 37])
def test_pairs_bits(dtype, bsz):
    for h in _trees():
        p = _node_probs(h, bsz, dtype, seed=bsz)
        bound = _prefix_bounds(h, 1.0, dtype).bound_slack
        assert native_hf_beta.kept_pairs(p, bound, depth_ranges(h).leaf_order.new_zeros(0), h.root) is None
        on, off = _both(lambda: bounded_pairs(h, p, bound))
        for a, b in zip(on, off):
            assert _same_bits(a, b)
        # the listing the mask gives (every node kept where p >= its bound), the root always kept
        keep = p >= bound
        keep[h.root] = True
        for a, b in zip(on, candidate_pairs(h, keep, p)):
            assert _same_bits(a, b)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
def test_pairs_strided_and_thresholds(dtype):
    h = bundled("tieredimagenet-h")[0]
    p = _node_probs(h, 8, dtype, seed=3)
    strided = torch.empty(8, h.num_nodes, dtype=dtype)
    strided.copy_(p.t())
    view = strided.t()  # (N, B) with strides (1, N): batch-major storage
    for bound in (torch.zeros(h.num_nodes, 1, dtype=dtype), torch.full((h.num_nodes, 1), 2.0, dtype=dtype),
                  _prefix_bounds(h, 0.5, dtype).bound_slack, p[:, :1].clone()):  # ties: p == bound is kept
        on, off = _both(lambda: bounded_pairs(h, view, bound))
        for a, b in zip(on, off):
            assert _same_bits(a, b)
        assert (on[1] == h.root).sum() == 8  # the root of every row, whatever the bound


@needs_native
def test_pairs_large_batch_row_by_row():
    h = bundled("tieredimagenet-h")[0]
    p = _node_probs(h, 4000, torch.float32, seed=5)
    bound = _prefix_bounds(h, 1.0, torch.float32).bound_slack
    sample, node, value = bounded_pairs(h, p, bound)
    with native.use_native(False):
        assert all(_same_bits(a, b) for a, b in zip((sample, node, value), bounded_pairs(h, p, bound)))
    for b in (0, 1, 1999, 3999):
        one = bounded_pairs(h, p[:, b:b + 1], bound)
        at = sample == b
        assert torch.equal(one[1], node[at]) and _same_bits(one[2], value[at])


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bsz", [0, 1, 4, 300])
def test_masses_bits(dtype, bsz):
    for h in _trees():
        if depth_ranges(h).ends is None:
            continue
        probs = _node_probs(h, bsz, torch.float64, seed=bsz)[: h.num_leaves]
        prefix = depth_prefix_sums(h, probs)  # (L + 1, B) leaf-major
        rng = np.random.default_rng(bsz)
        m = 3 * max(bsz, 1) if bsz else 0
        rows = torch.from_numpy(rng.integers(0, max(bsz, 1), m)).long()
        ids = torch.from_numpy(rng.integers(0, h.num_nodes + 1, m)).long()  # N: padding, zero masses
        for table in (prefix, prefix.t().contiguous().t()):  # leaf-major and batch-major storage
            on, off = _both(lambda: depth_masses(h, table, rows, ids, dtype=dtype))
            assert _same_bits(on, off)
            if m:
                assert native_hf_beta.pair_masses(table, depth_ranges(h).ends, rows, ids, dtype) is not None
        assert not bool((on[ids == h.num_nodes] != 0).any())


def test_off_runs_torch(monkeypatch):
    """With the kernels off, neither is called (the torch path runs)."""
    h = bundled("tieredimagenet-h")[0]
    calls = []
    for name in ("kept_pairs", "pair_masses"):
        real = getattr(native_hf_beta, name)

        def spy(*args, _real=real, _name=name):
            got = _real(*args)
            calls.append((_name, got is not None))
            return got
        monkeypatch.setattr(native_hf_beta, name, spy)
    p = torch.softmax(torch.randn(3, h.num_leaves, dtype=torch.float64) * 3, 1)
    with native.use_native(False), hd.plan_for("cpu"):
        hd.get_metric("hf_beta", h, beta=1.0).decode(p)
    assert calls and not any(ran for _, ran in calls)
    if native.available():
        calls.clear()
        with hd.plan_for("cpu"):
            hd.get_metric("hf_beta", h, beta=1.0).decode(p)
        assert {name for name, ran in calls if ran} == {"kept_pairs", "pair_masses"}


@needs_native
@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decisions_on_off(plan, dtype):
    trees = list(_trees())
    for i, h in enumerate(trees):
        for bsz in ([1, 5] if i < len(trees) - 2 else [1, 64]):
            probs = torch.from_numpy(batch(np.random.default_rng(i + bsz), bsz, h.num_leaves)).to(dtype)
            for beta in (1.0, 0.5, 2.0):
                metric = hd.get_metric("hf_beta", h, beta=beta)
                with hd.plan_for(plan):
                    on, off = _both(lambda: metric.decode(probs))
                _assert_same_decisions(h, probs, on, off, beta)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bsz", [1, 5])
def test_packed_masses_bits(dtype, bsz):
    """The GPU plan's packed (B, C) masses (depth_masses_packed) on a CPU, native against torch."""
    for h in _trees():
        if depth_ranges(h).ends is None:
            continue
        probs = _node_probs(h, bsz, torch.float64, seed=bsz + 7)[: h.num_leaves]
        prefix = depth_prefix_sums(h, probs).t().contiguous()  # (B, L + 1) batch-major, as the plan keeps it
        rng = np.random.default_rng(bsz + 7)
        for c in (0, 1, 9):
            ids = torch.from_numpy(rng.integers(0, h.num_nodes + 1, (bsz, c))).long()
            for table in (prefix, prefix.t().contiguous().t()):
                on, off = _both(lambda: depth_masses_packed(h, table, ids, dtype=dtype))
                assert on.shape == (bsz, c, h.num_leaf_depths) and _same_bits(on, off)


@needs_native
@pytest.mark.parametrize("dtype", DTYPES)
def test_decoder_against_torch_path_many_trees(dtype):
    """The native decoder (every stage-2 set size solved in float64) decides as the torch path (prefix sets
    certified k by k) on random trees with single-child chains, every distribution kind, β from 0.1 to 10."""
    for i, (h, _) in enumerate(random_trees(31, 25, num_nodes_max=40)):
        probs = torch.from_numpy(batch(np.random.default_rng(i), 24, h.num_leaves)).to(dtype)
        for beta in (0.1, 0.5, 1.0, 2.0, 10.0):
            metric = hd.get_metric("hf_beta", h, beta=beta)
            with hd.plan_for("cpu"):
                on, off = _both(lambda: metric.decode(probs))
            _assert_same_decisions(h, probs, on, off, beta)


@needs_native
@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
def test_decoder_large_batch_and_rows_alone(beta):
    h = bundled("tieredimagenet-h")[0]
    rng = np.random.default_rng(int(beta * 10))
    probs = torch.from_numpy(batch(rng, 4000, h.num_leaves)).float()
    metric = hd.get_metric("hf_beta", h, beta=beta)
    with hd.plan_for("cpu"):
        on, off = _both(lambda: metric.decode(probs))
        _assert_same_decisions(h, probs, on, off, beta)
        for b in (0, 7, 3999):
            assert torch.equal(metric.decode(probs[b:b + 1]), on[b:b + 1])
        strided = torch.empty(h.num_leaves, 6).t()  # batch-major values with strides (1, 6)
        strided.copy_(probs[:6])
        assert torch.equal(metric.decode(strided), on[:6])


@needs_native
def test_decoder_falls_back_beyond_its_candidates(monkeypatch):
    """A row keeping more stage-2 candidates than the native solver takes runs the torch path (same decisions)."""
    from hdecode_torch.metrics import hf_beta as hfb
    h = bundled("tieredimagenet-h")[0]
    probs = torch.from_numpy(batch(np.random.default_rng(4), 12, h.num_leaves))
    metric = hd.get_metric("hf_beta", h, beta=2.0)
    with hd.plan_for("cpu"):
        want = metric.decode(probs)
        got = []
        real = native_hf_beta.decide_rows
        monkeypatch.setattr(native_hf_beta, "decide_rows", lambda *a, **k: got.append(real(*a, **k)) or got[-1])
        monkeypatch.setattr(hfb, "_NATIVE_MAX_CANDIDATES", 1)
        assert torch.equal(metric.decode(probs), want)
    assert got == [None]


@needs_native
def test_gpu_plans_tree_tables_are_built_whichever_path_runs_first():
    """The GPU plan's tree-only tables (its τ and chain weights, the packing rank) are built by its first call
    even where the native decoder answers it: a later call that must run the torch path (an operator count, a
    trace) then counts only its own work, the operators of every later call (it counted 28 more: 86 against 58)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    h = hd.Hierarchy.from_parents(bundled("tieredimagenet-h")[0].parents_list)  # no table cached yet
    x = torch.softmax(torch.randn(1, h.num_leaves, generator=torch.Generator().manual_seed(0)) * 3, 1)
    metric = hd.get_metric("hf_beta", h, beta=1.0)
    counts = []
    with hd.plan_for("cuda"):
        metric.decode(x)  # plain CPU tensors: the native decoder
        for _ in range(3):
            Count.n = 0
            with Count():
                metric.decode(x)
            counts.append(Count.n)
    assert counts[0] <= counts[1] + 2 and counts[1] == counts[2], counts
