"""The torch implementation of ``hdecode::jaccard_sets`` on large batches: rows solved in groups by
candidate count and knapsacks in width classes give the same sets, bit for bit, as the whole table
at once, and the GPU plan's decisions stay the CPU plan's."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch

import hdecode_torch as hd
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
    (the GPU plan passes 4 GiB): many small chunks, the default and no cap give the same sets."""
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
