"""Jaccard's native knapsack (``kernels/native/jaccard.c``, behind ``jaccard_sets.knapsack_sets`` on CPU tensors):
the NumPy path's values (raw bits) and sets for every pair, and the decoders' decisions on both plans with the
native kernels on and off.

Inputs: the knapsacks' own arguments captured from real decodes (bundled trees and random trees with single-child
chains, both plans, float32 and float64), and synthetic ones built to hit the corner cases: gains on a coarse grid
(ties between taking and skipping at many states), disallowed candidates (-inf and NaN) with allowed ones under
them, sizes no allowed set reaches, padding columns, deep caterpillars whose bounds leave a band of one state
(the layout by candidates skipped) and shallow wide rows (the layout by nodes left).  Where this machine has no C
compiler the comparisons skip (the NumPy path is then what runs).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import hdecode_torch as hd
from hdecode_torch.kernels import native

from harness import bundled, model_like, random_trees

JS = sys.modules["hdecode_torch.kernels.fused.jaccard_sets"]
J = sys.modules["hdecode_torch.metrics.jaccard"]
needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable here: {native.unavailable_reason()}")
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def _both(gains, entry, nxt, b, kidx, budget=1 << 24):
    """(native, NumPy) results of knapsack_sets on the same arguments; the native one is checked to have run."""
    with native.use_native(True):
        assert JS._knapsack_sets_native(gains, entry, nxt, b, kidx, gains.new_empty(b.numel()),
                                        torch.empty(b.numel(), entry.shape[1], dtype=torch.bool)) is not None
        got = JS.knapsack_sets(gains, entry, nxt, b, kidx, budget)
    with native.use_native(False):
        ref = JS.knapsack_sets(gains, entry, nxt, b, kidx, budget)
    return got, ref


def _assert_same(got, ref, what=""):
    (v, m), (v0, m0) = got, ref
    assert v.dtype == v0.dtype and m.dtype == m0.dtype == torch.bool and m.shape == m0.shape, what
    assert torch.equal(v.view(BITS[v.dtype]), v0.view(BITS[v0.dtype])), what
    assert torch.equal(m, m0), what


def _synthetic(h, rng, bsz, dtype, grid=True, p_bad=0.15, full=False):
    """Random knapsack arguments on tree ``h``: per sample a random ancestor-closed candidate list in preorder
    (root first), padded to the widest; gains (M + 1, K) on a grid of 0.25 (ties) or continuous, some -inf or NaN
    (disallowed), the padding row -inf; every size with probability 1/2 (all with ``full``)."""
    n = h.num_nodes
    pre, size = h.pos.numpy(), h.size.numpy()
    parent = h.parent.numpy()
    order = np.argsort(pre)
    lists = []
    for _ in range(bsz):
        keep = np.zeros(n, dtype=bool)
        keep[h.root] = True
        for v in order[1:]:  # preorder: a parent is decided before its children
            keep[v] = keep[parent[v]] and rng.random() < 0.8
        lists.append(order[keep[order]])
    c = max(len(x) for x in lists)
    kk = c
    m = sum(len(x) for x in lists)
    entry = np.full((bsz, c), m, dtype=np.int64)
    nxt = np.full((bsz, c), c, dtype=np.int64)
    at = 0
    for r, ids in enumerate(lists):
        entry[r, :len(ids)] = np.arange(at, at + len(ids))
        at += len(ids)
        pos = pre[ids]
        nxt[r, :len(ids)] = np.searchsorted(pos, pos + size[ids])
    g = (np.round(rng.random((m + 1, kk)) * 8) / 4) if grid else rng.random((m + 1, kk))
    g[rng.random(g.shape) < p_bad] = -np.inf
    g[rng.random(g.shape) < p_bad / 4] = np.nan
    g[m] = -np.inf
    pairs = [(r, k) for r in range(bsz) for k in range(kk) if full or rng.random() < 0.5]
    b = np.array([p[0] for p in pairs], dtype=np.int64).reshape(-1)
    kidx = np.array([p[1] for p in pairs], dtype=np.int64).reshape(-1)
    return (torch.from_numpy(g).to(dtype), torch.from_numpy(entry), torch.from_numpy(nxt), torch.from_numpy(b),
            torch.from_numpy(kidx))


def _caterpillar(depth):
    """A chain of ``depth`` internal nodes with one leaf hanging at each level and a last leaf at the bottom."""
    parents, leaves = [], []
    # ids: leaves 0..depth, internal nodes depth + 1.. (root last-first canonical order is not required here)
    num_leaves = depth + 1
    internal = list(range(num_leaves, num_leaves + depth))
    parents = [0] * (num_leaves + depth)
    for i, v in enumerate(internal):
        parents[v] = -1 if i == 0 else internal[i - 1]
        parents[i] = v  # leaf i hangs at level i + 1
    parents[depth] = internal[-1]
    del leaves
    return hd.Hierarchy.from_parents(parents)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_synthetic_pairs_bit_for_bit(dtype):
    rng = np.random.default_rng(5)
    trees = [bundled("tieredimagenet-h")[0], bundled("inat19")[0]] + [h for h, _ in random_trees(31, 40)]
    trees += [hd.Hierarchy.from_parents([-1, 0]), _caterpillar(6)]
    for i, h in enumerate(trees):
        big = h.num_nodes > 200
        for grid in (True, False):
            args = _synthetic(h, rng, 2 if big else 5, dtype, grid=grid, p_bad=0.02 if big else 0.15)
            _assert_same(*_both(*args), (i, grid))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_band_layout_and_every_size(dtype):
    """Deep caterpillars with every size: sizes near the allowed count (a band of a few states, stored by candidates
    skipped), small sizes (stored by nodes left), sizes beyond it (-inf, the root alone)."""
    rng = np.random.default_rng(8)
    for depth in (3, 17, 60):
        h = _caterpillar(depth)
        for p_bad in (0.0, 0.05):
            args = _synthetic(h, rng, 3, dtype, grid=True, p_bad=p_bad, full=True)
            got, ref = _both(*args)
            _assert_same(got, ref, (depth, p_bad))
            assert torch.isfinite(ref[0]).any() and torch.isinf(ref[0]).any()


@needs_native
def test_edge_cases():
    dt = torch.float64
    # no pair, and no column
    g = torch.zeros(3, 2, dtype=dt)
    e = torch.zeros(1, 2, dtype=torch.long)
    _assert_same(*_both(g, e, torch.full((1, 2), 2), torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)))
    v, m = JS.knapsack_sets(g, torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.long),
                            torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), 1 << 20)
    assert v.shape == (1,) and m.shape == (1, 0)
    # the root alone (size 1), a -0.0 root gain, equal gains everywhere (take at every tie)
    g = torch.tensor([[-0.0, 1.0], [0.5, 0.5], [0.5, 0.5], [float("-inf")] * 2], dtype=dt)
    entry = torch.tensor([[0, 1, 2]])
    nxt = torch.tensor([[3, 2, 3]])
    got, ref = _both(g, entry, nxt, torch.zeros(2, dtype=torch.long), torch.tensor([0, 1]))
    _assert_same(got, ref)
    assert ref[1].tolist() == [[True, False, False], [True, True, False]]  # ties: the first in preorder
    # strided gains and a strided entry table give the same as contiguous ones
    rng = np.random.default_rng(2)
    g, entry, nxt, b, kidx = _synthetic(random_trees(3, 1).__next__()[0], rng, 4, dt, full=True)
    wide = torch.full((g.shape[0], 2 * g.shape[1]), 7.0, dtype=dt)
    wide[:, ::2] = g
    ewide = torch.zeros(entry.shape[0], 2 * entry.shape[1], dtype=torch.long)
    ewide[:, ::2] = entry
    _assert_same(_both(wide[:, ::2], ewide[:, ::2], nxt, b, kidx)[0], _both(g, entry, nxt, b, kidx)[1])


def _capture(h, P, plan):
    """The knapsack_sets arguments of a decode of rows P on ``plan`` (NumPy path, the arguments cloned)."""
    seen, inner = [], JS.knapsack_sets

    def spy(gains, entry, nxt, b, kidx, budget):
        seen.append(tuple(t.clone() for t in (gains, entry, nxt, b, kidx)) + (budget,))
        return inner(gains, entry, nxt, b, kidx, budget)
    JS.knapsack_sets = J.knapsack_sets = spy
    try:
        with hd.plan_for(plan), native.use_native(False):
            hd.get_metric("jaccard", h).decode(P)
    finally:
        JS.knapsack_sets = J.knapsack_sets = inner
    return seen


@needs_native
@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decoders_own_knapsacks_bit_for_bit(plan, dtype):
    """The knapsacks of real decodes (model-like rows of both bundled trees, random rows of random trees)."""
    rng = np.random.default_rng(11)
    cases = []
    for tree in ("tieredimagenet-h", "inat19"):
        h, _ = bundled(tree)
        cases.append((h, np.concatenate([model_like(rng, h, 8, k) for k in ("peaked", "diffuse", "confused",
                                                                             "shallow")])))
    for h, _ in random_trees(12, 25):
        cases.append((h, rng.dirichlet(np.full(h.num_leaves, 0.3), size=6)))
    total = 0
    for h, P in cases:
        for args in _capture(h, torch.from_numpy(P).to(dtype), plan):
            _assert_same(*_both(*args), (h.num_nodes, plan))
            total += args[3].numel()
    assert total > 100


class _Counter(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@needs_native
def test_stands_aside_where_torch_must_see_operators():
    g, entry, nxt, b, kidx = _synthetic(bundled("inat19")[0], np.random.default_rng(0), 2, torch.float64)
    out = (g.new_empty(b.numel()), torch.empty(b.numel(), entry.shape[1], dtype=torch.bool))
    with native.use_native(False):
        assert JS._knapsack_sets_native(g, entry, nxt, b, kidx, *out) is None
    with _Counter():
        assert JS._knapsack_sets_native(g, entry, nxt, b, kidx, *out) is None
    assert JS._knapsack_sets_native(g.half(), entry, nxt, b, kidx, *out) is None  # no half kernel
    assert JS._knapsack_sets_native(g, entry, nxt, b, kidx, *out) is not None


def _decode(h, P, plan, on):
    with hd.plan_for(plan), native.use_native(on):
        return hd.get_metric("jaccard", h).decode(P)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_decisions_native_on_and_off(plan):
    """Both bundled trees and random trees with single-child chains, float32 and float64, an empty batch, a
    strided input, B = 1 and B = 4,000 (row by row the same decisions as its rows decoded alone)."""
    rng = np.random.default_rng(23)
    trees = [bundled("tieredimagenet-h")[0], bundled("inat19")[0]] + [h for h, _ in random_trees(29, 12)]
    for h in trees:
        P = torch.from_numpy(np.concatenate([rng.dirichlet(np.full(h.num_leaves, a), size=4) for a in (0.05, 1.0)]))
        for dt in (torch.float32, torch.float64):
            x = P.to(dt)
            assert torch.equal(_decode(h, x, plan, True), _decode(h, x, plan, False))
            assert torch.equal(_decode(h, x[:1], plan, True), _decode(h, x[:1], plan, False))
            assert _decode(h, x[:0], plan, True).shape == (0, h.num_nodes)
            strided = torch.zeros(x.shape[0], 2 * h.num_leaves, dtype=dt)
            strided[:, 1::2] = x
            assert torch.equal(_decode(h, strided[:, 1::2], plan, True), _decode(h, x, plan, False))


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_large_batch_row_by_row(plan):
    from benchmarks.workloads import model_like_probs
    from benchmarks.baselines import Baselines

    h, _ = bundled("tieredimagenet-h")
    t = Baselines(h.parents_list).t
    P = torch.from_numpy(model_like_probs(t.ancestors, t.depth, t.num_leaves, 4000, seed=3)).float()
    big = _decode(h, P, plan, True)
    assert torch.equal(big, _decode(h, P, plan, False))
    for i in np.random.default_rng(0).choice(4000, 12, replace=False):
        assert torch.equal(big[i:i + 1], _decode(h, P[i:i + 1], plan, True)), i


@needs_native
def test_masses_bit_for_bit():
    """depth_masses / depth_masses_packed (the native pass Jaccard reads its masses with) against their torch path:
    both prefix layouts, strided views, padding ids (N), an empty list, bundled and random trees (several leaf
    depths)."""
    from hdecode_torch.kernels.depth_ranges import depth_masses, depth_masses_packed, depth_prefix_sums, depth_ranges

    rng = np.random.default_rng(4)
    trees = [bundled("tieredimagenet-h")[0], bundled("inat19")[0]] + [h for h, _ in random_trees(41, 20)]
    checked = 0
    for h in trees:
        if depth_ranges(h).ends is None:
            continue
        n, bsz = h.num_nodes, 5
        x = torch.from_numpy(rng.dirichlet(np.full(h.num_leaves, 0.5), size=bsz))
        with native.use_native(False):
            prefix = depth_prefix_sums(h, x.t())  # (L + 1, B) leaf-major
        wide = torch.zeros(2 * prefix.shape[0], bsz, dtype=torch.float64)
        wide[::2] = prefix
        for pre in (prefix, prefix.t().contiguous().t(), wide[::2]):
            rows = torch.from_numpy(rng.integers(0, bsz, 40))
            ids = torch.from_numpy(rng.integers(0, n + 1, 40))  # N: padding
            got = depth_masses(h, pre, rows, ids)
            with native.use_native(False):
                ref = depth_masses(h, pre, rows, ids)
            assert torch.equal(got.view(torch.int64), ref.view(torch.int64))
            assert depth_masses(h, pre, rows[:0], ids[:0]).shape == (0, h.num_leaf_depths)
            packed = torch.from_numpy(rng.integers(0, n + 1, (bsz, 7)))
            got = depth_masses_packed(h, pre.t(), packed)
            with native.use_native(False):
                ref = depth_masses_packed(h, pre.t(), packed)
            assert got.shape == ref.shape and torch.equal(got.view(torch.int64), ref.view(torch.int64))
            checked += 1
    assert checked >= 9
