"""The torch implementation of ``hdecode::jaccard_sets`` on large batches: rows solved in groups by
candidate count and knapsacks in width classes give the same sets, bit for bit, as the whole table
at once, and the GPU plan's decisions stay the CPU plan's."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from harness import bundled, model_like
from benchmarks import jaccard_gpu_check as gpu_check

JS = importlib.import_module("hdecode_torch.kernels.fused.jaccard_sets")


def op_args(h, P):
    """The arguments the GPU plan's decoder passes to the op for rows P."""
    return gpu_check.op_args(hd.get_metric("jaccard", h), torch.as_tensor(P))


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_groups_and_width_classes_are_the_whole_table(tree, monkeypatch):
    h, _ = bundled(tree)
    rng = np.random.default_rng(41)
    P = np.concatenate([model_like(rng, h, 150, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    args = op_args(h, P)
    bsz, c, _ = args[0].shape
    assert bsz * c * c >= JS.GROUP_CELLS and c > 16  # two groups of rows or more, width classes
    counts = args[2]
    assert int((counts <= 16).sum()) > 0 and int((counts > 16).sum()) > 0
    grouped = JS.jaccard_sets_torch(*args)
    monkeypatch.setattr(JS, "GROUP_CELLS", 1 << 62)
    whole = JS.jaccard_sets_torch(*args)
    assert torch.equal(grouped, whole)
    assert int(grouped.sum()) > bsz  # more than the roots: real sets
    monkeypatch.undo()
    with hd.plan_for("cpu"):
        cpu = hd.get_metric("jaccard", h).decode(torch.as_tensor(P))
    with hd.plan_for("cuda"):
        gpu = hd.get_metric("jaccard", h).decode(torch.as_tensor(P))
    assert torch.equal(cpu, gpu)


def _pair_chunks_by_definition(counts, ks, es, budget):
    """The chunks as first written: each b tried by taking the maxima over a..b anew (quadratic)."""
    from hdecode_torch.kernels.fused.jaccard_sets import _table_cost

    def cost(a, b):
        band = max(x - y for x, y in zip(counts[a:b], ks[a:b]))
        return _table_cost(counts[a], max(ks[a:b]), band, b - a, es)

    chunks, a = [], 0
    while a < len(counts):
        b = a + 1
        while b < len(counts) and cost(a, b + 1)[0] * es + cost(a, b + 1)[1] <= budget:
            b += 1
        chunks.append((a, b, cost(a, b)))
        a = b
    return chunks


def test_pair_chunks_equal_their_definition():
    from hdecode_torch.kernels.fused.jaccard_sets import pair_chunks

    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 60))
        counts = sorted(rng.integers(2, 400, n).tolist(), reverse=True)
        ks = [int(rng.integers(0, c)) for c in counts]  # each pair has room: count > k
        es, budget = int(rng.choice([4, 8])), int(rng.choice([1, 1 << 10, 1 << 16, 1 << 20, 1 << 24]))
        assert pair_chunks(counts, ks, es, budget) == _pair_chunks_by_definition(counts, ks, es, budget)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_cpu_table_budget_keeps_the_sets(tree, monkeypatch):
    """On a CPU the knapsack tables are chunked within ``CPU_BUDGET`` whatever budget the caller passes
    (the GPU plan passes 4 GiB): many small chunks, the default and no cap give the same sets (the NumPy path,
    which the native kernels, one pair at a time, replace where they apply)."""
    monkeypatch.setitem(native._STATE, "on", False)
    h, _ = bundled(tree)
    rng = np.random.default_rng(43)
    P = np.concatenate([model_like(rng, h, 120, kind) for kind in ("peaked", "diffuse", "confused")])
    args = op_args(h, P)
    capped = JS.jaccard_sets_torch(*args)
    chunks = []
    real = JS.pair_chunks
    monkeypatch.setattr(JS, "pair_chunks", lambda *a: chunks.append(len(real(*a))) or real(*a))
    solved = {}
    for budget in (1 << 62, 1 << 12):
        monkeypatch.setattr(JS, "CPU_BUDGET", budget)
        chunks.clear()
        assert torch.equal(JS.jaccard_sets_torch(*args), capped), budget
        solved[budget] = sum(chunks)  # knapsack chunks over all groups of pairs
    assert solved[1 << 12] > 10 * solved[1 << 62], solved
    assert int(capped.sum()) > capped.shape[0]  # more than the roots: real sets


def test_group_widths():
    """Two width classes per doubling from 8, the batch's width last: a row's (C, K) tables are at most
    (3/2)² its own count's square beyond 8 columns."""
    assert JS.group_widths(9) == [8, 9]
    assert JS.group_widths(42) == [8, 12, 16, 24, 32, 42]
    assert JS.group_widths(100) == [8, 12, 16, 24, 32, 48, 64, 96, 100]
    for c in range(9, 300):
        w = JS.group_widths(c)
        assert w[-1] == c and all(a < b <= 3 * a // 2 for a, b in zip(w, w[1:])), (c, w)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_narrow_groups_are_the_whole_table(tree, monkeypatch):
    """Rows of 8 candidates or fewer, of 9-12 and of 13-16 solved in groups of their own, merged into wider
    ones (the default) or all at once: the same sets, bit for bit."""
    h, _ = bundled(tree)
    rng = np.random.default_rng(47)
    P = np.concatenate([model_like(rng, h, 200, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    args = op_args(h, P)
    bsz, c, _ = args[0].shape
    counts = args[2]
    classes = torch.searchsorted(counts.new_tensor(JS.group_widths(c)), counts)
    assert len(set(classes.tolist()) & {0, 1, 2}) >= 2 and bsz * c * c >= JS.GROUP_CELLS
    default = JS.jaccard_sets_torch(*args)
    monkeypatch.setattr(JS, "GROUP_MERGE_CELLS", 0)  # every width class its own group
    separate = JS.jaccard_sets_torch(*args)
    monkeypatch.setattr(JS, "GROUP_CELLS", 1 << 62)
    whole = JS.jaccard_sets_torch(*args)
    assert torch.equal(default, whole) and torch.equal(separate, whole)
    assert int(whole.sum()) > bsz


def test_gains_window_is_the_unfolded_rows():
    """:func:`gains` reads each entry's window of sizes by a gather: the entries of the strided rows
    ``t[r, K − d(r) : 2K − d(r)]`` it was read from before, -inf for k ≤ d, whatever the block of rows."""
    rng = np.random.default_rng(5)
    for kmax, e, rows in ((7, 1, 300), (12, 3, 70_000), (30, 10, 500)):
        q = torch.as_tensor(rng.random((rows, e)))
        depth = torch.as_tensor(rng.integers(0, kmax + 3, rows))
        depths = torch.as_tensor(np.sort(rng.choice(np.arange(1.0, 20.0), e, replace=False)))
        g = JS.gains(q, depth, depths, kmax)
        w = JS.gain_weights(depths, kmax, torch.float64)
        s = q @ w.t()
        d = depth.clamp(max=kmax)
        t = torch.cat([torch.full((rows, kmax), float("-inf"), dtype=torch.float64),
                       torch.addcmul(s[:, :kmax], d.double()[:, None], s[:, kmax:])], 1)
        want = t.unfold(1, kmax, 1)[torch.arange(rows), kmax - d]
        assert torch.equal(torch.isinf(g), depth[:, None] >= torch.arange(1, kmax + 1))
        assert torch.allclose(g, want, rtol=1e-15, atol=0) and torch.equal(g.isinf(), want.isinf())


def test_gpu_plan_one_leaf_depth_copies_no_node_table():
    """With one leaf depth the GPU plan's masses are the node sums gathered where needed: no padded
    (B, N + 1) copy of the node table (a concatenation), and the CPU plan's sets."""
    from benchmarks.plan_cost import cost_of

    h, _ = bundled("inat19")
    rng = np.random.default_rng(3)
    x = torch.as_tensor(np.concatenate([model_like(rng, h, 40, kind) for kind in ("peaked", "confused")]))
    m = hd.get_metric("jaccard", h)
    cost = cost_of(m.decode, x, "cuda")
    assert "cat" not in cost.by_op and cost.ops <= 51, (cost.ops, cost.by_op)
    with hd.plan_for("cpu"):
        cpu = m.decode(x)
    with hd.plan_for("cuda"):
        assert torch.equal(m.decode(x), cpu)
