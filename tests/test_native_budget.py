"""The native kernels' scratch (allocated in C, unseen by torch) under the memory budget.

Each wrapper computes its kernel's scratch (``hdecode_torch.kernels.native.budget``) and runs the kernel only where
it fits ``get_memory_budget()``; else the torch path runs.  Decisions are the same either way: native on, native
off, a small and the default budget, on a deep caterpillar, random trees and a bundled tree."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from hdecode_torch.kernels.native import budget as nb
from hdecode_torch.kernels.path_argbest import path_argbest
from harness import bundled, random_trees

pytestmark = pytest.mark.skipif(not native.available(), reason="native kernels not built")

PLAN = os.environ.get("HDECODE_TEST_PLAN", "cpu")
DECODERS = [("accuracy", {}), ("lca_height", {}), ("tree_distance", {}), ("wu_palmer", {}), ("zhao", {}),
            ("hf_beta", {"beta": 1.0}), ("hf_beta", {"beta": 0.5}), ("hamming", {}), ("jaccard", {})]


def caterpillar(d: int) -> hd.Hierarchy:
    """A spine of d internal nodes with a leaf at every level: 2d + 1 nodes, leaves at d depths."""
    return hd.Hierarchy.from_parents([-1] + list(range(d - 1)) + list(range(d)) + [d - 1])


@pytest.fixture(autouse=True)
def _restore_budget():
    yield
    hd.set_memory_budget(None)


def _decide(h, name, params, P, budget, on):
    hd.set_memory_budget(budget)
    with native.use_native(on), hd.plan_for(PLAN):
        return hd.get_decoder("optimal", h, metric=name, **params).decode(P)


def _trees():
    yield "caterpillar(120)", caterpillar(120)
    for i, (h, _) in enumerate(random_trees(3, 3)):
        yield f"random{i}", h
    yield "tiered", bundled("tiered")[0]


@pytest.mark.parametrize("name,params", DECODERS, ids=[f"{n}{p.get('beta', '')}" for n, p in DECODERS])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decisions_equal_native_on_off_small_and_default_budget(name, params, dtype):
    """A 4 KiB budget (every node kernel's scratch over it: the torch path) and the default (the kernels), native
    on and off: the same decisions on every row, B = 4 and an empty batch."""
    rng = np.random.default_rng(5)
    for label, h in _trees():
        if name in ("hf_beta", "jaccard") and label == "tiered" and dtype == torch.float32:
            continue  # the float64 rows cover the bundled tree; keeps the test's time down
        P = torch.as_tensor(rng.dirichlet(np.full(h.num_leaves, 0.3), size=4), dtype=dtype)
        want = _decide(h, name, params, P, None, True)
        for budget, on in ((4 << 10, True), (4 << 10, False), (None, False)):
            got = _decide(h, name, params, P, budget, on)
            assert torch.equal(got, want), (label, budget, on)
        assert _decide(h, name, params, P[:0], 4 << 10, True).shape[0] == 0


def test_path_argbest_stands_aside_over_the_budget():
    """The wrapper returns None exactly where its scratch is over the budget, and the decoder's answer is the
    torch path's there."""
    h = caterpillar(300)
    P = torch.as_tensor(np.random.default_rng(0).dirichlet(np.full(h.num_leaves, 0.3), size=3))
    need = nb.path_argbest_scratch(h.num_nodes, 8, 8)
    assert need == 8 * h.num_nodes * 24
    coef = torch.ones(h.num_nodes, dtype=torch.float64)
    cands = torch.arange(h.num_leaves)
    args = (P, "scaled", coef, False, None, None, cands, True)
    for budget, runs in ((need, True), (need - 1, False)):
        hd.set_memory_budget(budget)
        got = path_argbest(h, *args)
        assert (got is not None) == runs
    hd.set_memory_budget(need)
    assert path_argbest(h, *args).shape == (3,)


def test_node_sums_stand_aside_over_the_budget():
    h = caterpillar(200)
    x = torch.rand(5, h.num_leaves, dtype=torch.float64)
    need = nb.node_sums_scratch(h.num_nodes, 8)
    hd.set_memory_budget(need)
    on = native.leaf_to_node_sum(h, x.t(), torch.float64)
    assert on is not None
    hd.set_memory_budget(need - 1)
    assert native.leaf_to_node_sum(h, x.t(), torch.float64) is None
    assert native.deepest_above(h, x, 0.5, torch.float64) is None
    with native.use_native(False):
        from hdecode_torch.kernels.tree_sums import leaf_to_node_sum

        assert torch.equal(leaf_to_node_sum(h, x.t(), "levels"), on)  # bit for bit, the torch path's sums


def test_hf_beta_rows_scratch_formula():
    """The formula counts the kernel's allocations (hf_beta.c: cand, rank, sorted, pv/ub/dk, w, cum, ad/wt)."""
    n, e, max_c = 1000, 7, 256
    allocs = n * 8 + n * 16 + e * 8 + e * (min(max_c, n) + 2) * 8 + e * 8 + n * 16 + 3 * n * 8
    assert nb.hf_beta_rows_scratch(n, e, max_c) == allocs
    assert nb.hf_beta_rows_scratch(0, 0, max_c) == 64 + 16 + 8 * 2


def _allowed_counts(gains, entry, nxt, b, kidx):
    """Each pair's allowed candidates A (no disallowed ancestor), as the kernel keeps them (NumPy, per pair)."""
    kk = gains.shape[1]
    g, ent, nx = gains.numpy(), entry.numpy(), nxt.numpy()
    out = []
    for bb, k in zip(b.tolist(), kidx.tolist()):
        gp = g.reshape(-1)[ent[bb] * kk + k]
        c = gp.shape[0]
        cover = np.zeros(c + 1, dtype=np.int64)
        bad = ~(gp > -np.inf)
        bad[0] = False
        for i in np.flatnonzero(bad):
            cover[i] += 1
            cover[max(nx[bb, i], i + 1)] -= 1
        out.append(int((np.cumsum(cover)[:c] == 0).sum()))
    return out


def test_jaccard_knapsack_scratch_within_the_torch_paths_floor():
    """Jaccard's native knapsack holds one pair's table at a time; the NumPy path it replaces holds at least one
    pair's table whatever the budget (a chunk is never less than a pair).  On a deep caterpillar at a 1 MiB
    budget, every pair's native scratch is within that pair's NumPy table plus (A + 1)·(value size + 1) and the
    per-call O(C) buffers, and within the O(1) bound the formula states."""
    import importlib

    js = importlib.import_module("hdecode_torch.kernels.fused.jaccard_sets")  # the package, not its function

    h = caterpillar(400)
    P = torch.as_tensor(np.random.default_rng(1).dirichlet(np.full(h.num_leaves, 0.3), size=2))
    seen = []
    inner = js.knapsack_sets

    def spy(gains, entry, nxt, b, kidx, budget):
        seen.append((gains.clone(), entry.clone(), nxt.clone(), b.clone(), kidx.clone()))
        return inner(gains, entry, nxt, b, kidx, budget)

    import hdecode_torch.metrics.jaccard as J

    J.knapsack_sets = spy
    try:
        hd.set_memory_budget(1 << 20)
        with hd.plan_for("cpu"):
            sets = hd.get_decoder("optimal", h, metric="jaccard").decode(P)
    finally:
        J.knapsack_sets = inner
    assert seen and sets.shape == (2, h.num_nodes)
    pairs = 0
    for gains, entry, nxt, b, kidx in seen:
        c, s = entry.shape[1], gains.element_size()
        for a, k in zip(_allowed_counts(gains, entry, nxt, b, kidx), kidx.tolist()):
            need = nb.jaccard_pair_scratch(a, k, c, s)
            assert need <= nb.jaccard_scratch_bound(c, s)
            if a > k:
                floats, bools, _ = js._table_cost(a, k, a - k, 1, s)
                extra = c * s + 32 * (c + 1)
                assert need <= floats * s + bools + (a + 1) * (s + 1) + extra
                pairs += 1
    assert pairs > 0


_RSS_SCRIPT = r"""
import sys
import numpy as np, torch
import hdecode_torch as hd
from hdecode_torch.kernels import native
from hdecode_torch.kernels.native import budget as nb
n, budget, on = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
rng = np.random.default_rng(0)
parents = np.empty(n, dtype=np.int64)
parents[0] = -1
parents[1:] = (rng.random(n - 1) * np.arange(1, n)).astype(np.int64)
h = hd.Hierarchy.from_parents(parents.tolist())
P = torch.as_tensor(rng.dirichlet(np.full(h.num_leaves, 0.3), size=2))
dec = hd.get_decoder("optimal", h, metric="lca_height")


def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


with native.use_native(on), hd.plan_for("cpu"):
    dec.decode(P[:1])  # the tree's tables, both paths' (the native wrapper warms the torch path's)
    hd.set_memory_budget(budget)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss("VmRSS:")
    pred = dec.decode(P)
    growth = rss("VmHWM:") - before
print(growth * 1024, nb.path_argbest_scratch(h.num_nodes, 8, 8), pred.tolist())
"""


def _rss(n, budget, on):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    res = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(n), str(budget), "1" if on else "0"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    growth, scratch, pred = res.stdout.strip().splitlines()[-1].split(" ", 2)
    return int(growth), int(scratch), pred


def test_native_scratch_is_held_to_the_budget_in_a_process():
    """lca_height on a 200,000-node random tree, B = 2: the native kernel's scratch (8·N·24 bytes, ~38 MB) over a
    4 MiB budget is not allocated (the torch path runs: its growth, with native off too, within the budget plus
    16 MiB of the B = 2 tables and allocator slack); at the default budget the kernel runs and its scratch shows in
    the peak.  The same predictions in all three."""
    n, small = 200_000, 4 << 20
    on_small, scratch, pred = _rss(n, small, True)
    off_small, _, pred_off = _rss(n, small, False)
    on_big, _, pred_big = _rss(n, 512 << 20, True)
    assert scratch > small and pred == pred_off == pred_big
    assert on_small <= small + (16 << 20) and on_small <= off_small + (4 << 20)
    assert on_big >= 0.9 * scratch  # the measurement sees the C scratch where it runs


def test_the_scratch_limit_follows_set_memory_budget():
    """The kernels sit below ``core`` and keep their own copy of the budget: ``set_memory_budget`` sets it."""
    from hdecode_torch.kernels.native import budget

    try:
        hd.set_memory_budget(4096)
        assert budget.fits(4096) and not budget.fits(4097)
        assert budget.fits(10_000, budget=10_000)  # an explicit budget wins
    finally:
        hd.set_memory_budget(None)
    assert budget.fits(hd.get_memory_budget()) and not budget.fits(hd.get_memory_budget() + 1)
