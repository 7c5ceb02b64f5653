"""Jaccard at one row: the knapsacks of ``hdecode::jaccard_sets`` on CPU tensors (NumPy arrays) against an
enumeration of the closed sets with the tie rule, and the operators a one-row call runs on each plan."""

from __future__ import annotations

import collections
import importlib
import itertools

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from harness import bundled, model_like
from testing import Operators

JS = importlib.import_module("hdecode_torch.kernels.fused.jaccard_sets")
J = importlib.import_module("hdecode_torch.metrics.jaccard")
checks = importlib.import_module("hdecode_torch.kernels.fused._checks")


def _forest(rng, c):
    """(nxt,) of a random rooted tree of c positions in preorder: nxt[i] = i + the size of i's subtree."""
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, c)]
    children = collections.defaultdict(list)
    for i, p in enumerate(parent[1:], 1):
        children[p].append(i)
    order, stack = [], [0]
    while stack:
        v = stack.pop()
        order.append(v)
        stack.extend(reversed(children[v]))
    size = [1] * c
    for v in reversed(order):
        size[v] += sum(size[w] for w in children[v])
    pos = {v: i for i, v in enumerate(order)}
    par = [-1] + [pos[parent[order[i]]] for i in range(1, c)]
    return np.array([i + size[order[i]] for i in range(c)]), par


def _best_by_enumeration(g, par, k):
    """(value, members) of the best closed set of k positions holding position 0 (-inf gains: never taken),
    ties to the set holding the first position at which two optimal sets differ."""
    c = len(g)
    best = (float("-inf"), None)
    for rest in itertools.combinations(range(1, c), k - 1):
        s = {0, *rest}
        if any(par[i] not in s for i in rest) or any(g[i] == float("-inf") for i in rest):
            continue
        v = g[0]
        for i in sorted(rest):  # the knapsack adds the gains from the deepest position up: exact here anyway
            v += g[i]
        key = (v, tuple(i in s for i in range(c)))
        if best[1] is None or key > best:
            best = key
    if best[1] is None:
        return float("-inf"), (True,) + (False,) * (c - 1)
    return best


@pytest.mark.parametrize("on", [False, True], ids=["numpy", "native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_knapsacks_are_the_enumeration(dtype, on):
    """knapsack_sets on CPU tensors (the NumPy path: both table layouts, the pairs' allowed candidates packed, their
    walks; and the native kernel) returns each pair's best closed set of its size and, among sets of equal value
    (dyadic gains: exact ties, many), the first in preorder; pairs without a set of their size get -inf and the
    root alone."""
    if on and not native.available():
        pytest.skip(f"native kernels unavailable here: {native.unavailable_reason()}")
    rng = np.random.default_rng(5)
    layouts = collections.Counter()
    real = JS.pair_chunks

    def spy(*a):
        got = real(*a)
        layouts.update(t[2] for _, _, t in got)
        return got
    JS.pair_chunks, saved = spy, JS.pair_chunks
    try:
        with native.use_native(on):
            _knapsacks_against_enumeration(rng, dtype)
    finally:
        JS.pair_chunks = saved
    if not on:
        assert layouts[True] and layouts[False], layouts  # both layouts were solved
    else:
        assert not layouts  # the native kernel solved every pair


def _knapsacks_against_enumeration(rng, dtype):
    """Sixty random forests of 2-9 candidates in 1-3 rows, dyadic gains, five pairs each, against enumeration."""
    for trial in range(60):
        bsz, c = int(rng.integers(1, 4)), int(rng.integers(2, 10))
        nxt, pars = zip(*[_forest(rng, c) for _ in range(bsz)])
        gains = torch.as_tensor(rng.integers(0, 4, (bsz * c, c)) / 4, dtype=dtype)
        gains[torch.as_tensor(rng.random((bsz * c, c)) < 0.2)] = float("-inf")
        gains[::c] = gains[::c].clamp(min=0)  # the roots: always allowed
        b = torch.as_tensor(rng.integers(0, bsz, 5))
        kidx = torch.as_tensor(rng.integers(0, c, 5))
        entry = torch.arange(bsz * c).view(bsz, c)
        val, members = JS.knapsack_sets(gains, entry, torch.as_tensor(np.stack(nxt)), b, kidx, 1 << 20)
        for r in range(5):
            rows = gains[entry[b[r]], kidx[r]].tolist()
            want_v, want_m = _best_by_enumeration(rows, pars[int(b[r])], int(kidx[r]) + 1)
            assert float(val[r]) == want_v, (trial, r)
            assert tuple(members[r].tolist()) == want_m, (trial, r)


def _ops(fn):
    fn()  # tree tables and cached width tables
    with Operators() as counter:
        fn()
    return len(counter.ops)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_one_row_operators(tree):
    """A model-like row's call runs at most 440 ATen operators (views included) on the CPU plan, and the GPU
    plan's op at most 235 inside it on CPU tensors: 656 / 365 on tieredImageNet-H and 740 / 480 on iNat19 on
    453a7ad, whose banded knapsack, its walk and the pairs' packing stepped torch operators per candidate
    position; the same set on both plans."""
    h, _ = bundled(tree)
    x = torch.as_tensor(model_like(np.random.default_rng(2), h, 1, "confused"), dtype=torch.float32)
    metric = hd.get_metric("jaccard", h)
    with hd.plan_for("cpu"):
        cpu_ops = _ops(lambda: metric.decode(x))
    args = []
    inner = J.jaccard_sets
    J.jaccard_sets = lambda *a: args.append(a) or inner(*a)
    try:
        with hd.plan_for("cuda"):
            gpu = metric.decode(x)
    finally:
        J.jaccard_sets = inner
    op_ops = _ops(lambda: JS.jaccard_sets_torch(*args[0]))
    with hd.plan_for("cpu"):
        assert torch.equal(gpu, metric.decode(x))
    assert cpu_ops <= 440 and op_ops <= 235, (cpu_ops, op_ops)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_tables_first_built_under_inference_mode(plan):
    """A tree whose tables are first built under ``torch.inference_mode`` (a Lightning validation loop) decodes
    inside and outside it, twice, as a tree built outside it: the op's cached width tables read the version
    counter of the tree's leaf depths, which inference tensors do not have (a RuntimeError on the first merge
    of its one-row tables)."""
    h, _ = bundled("inat19")
    x = torch.as_tensor(model_like(np.random.default_rng(4), h, 3, "confused"), dtype=torch.float32)
    with hd.plan_for(plan):
        want = hd.get_metric("jaccard", h).decode(x)
        fresh = hd.Hierarchy.from_parents(h.parent.tolist())
        metric = hd.get_metric("jaccard", fresh)
        with torch.inference_mode():
            got = [metric.decode(x), metric.decode(x)]
        got += [metric.decode(x), metric.decode(x)]
    for g in got:
        assert torch.equal(g, want)


def test_one_row_operators_do_not_depend_on_the_caches_filling_up():
    """A warm call leaves every table it reads in the derived-table cache, however full it was: with the cache
    one entry short of its limit the next call runs the operators it runs with an empty cache (clearing a whole
    cache when full dropped the first tables a call had read: 451 operators against 422 in the suite), and the
    cache stays within its limit."""
    h, _ = bundled("tieredimagenet-h")
    x = torch.as_tensor(model_like(np.random.default_rng(2), h, 1, "confused"), dtype=torch.float32)
    metric = hd.get_metric("jaccard", h)
    cache = checks._DERIVED
    try:
        with hd.plan_for("cpu"):
            # The tree's own tables (cached on the hierarchy, not in this cache) built first: the torch path
            # counted here builds one the native path never needs, so a first call ever counts one more.
            _ops(lambda: metric.decode(x))
            cache.clear()
            empty = _ops(lambda: metric.decode(x))
            cache.clear()
            for i in range(checks.CACHE_ENTRIES - 1):
                cache[("filler", i)] = ((), (), None)
            full = _ops(lambda: metric.decode(x))
        assert full == empty, (full, empty)
        assert len(cache) == checks.CACHE_ENTRIES
        assert ("filler", 0) not in cache and ("filler", checks.CACHE_ENTRIES - 2) in cache  # oldest out
    finally:
        cache.clear()  # no filler left for the tests after this one
