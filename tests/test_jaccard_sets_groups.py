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
