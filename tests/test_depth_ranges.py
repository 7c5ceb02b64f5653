"""Per-leaf-depth masses from prefix sums (kernels/depth_ranges.py) against the (N, E, B) table."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from hdecode_torch.kernels import depth_ranges as dr
from hdecode_torch.kernels.depth_ranges import depth_masses, depth_prefix_sums, depth_range_ends, depth_ranges
from hdecode_torch import Hierarchy
from hdecode_torch.core.posterior import Posterior
from harness import DEVICES, batch, bundled, random_trees


def _all_masses(h, P):
    """(N + 1, E, B) masses of every node and of the padding id N, from the prefix sums."""
    bsz = P.shape[0]
    p = Posterior(h, P).node
    prefix = depth_prefix_sums(h, p[: h.num_leaves])
    ids = torch.arange(h.num_nodes + 1, device=P.device).repeat(bsz)
    rows = torch.arange(bsz, device=P.device).repeat_interleave(h.num_nodes + 1)
    return depth_masses(h, prefix, rows, ids).view(bsz, h.num_nodes + 1, -1).permute(1, 2, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_masses_equal_the_subtree_table_on_random_trees(device):
    rng = np.random.default_rng(3)
    for h, info in random_trees(17, 30, num_nodes_max=25, deep_bias=0.5):
        h = h.to(device)
        P = torch.as_tensor(batch(rng, 5, info.L), device=device)
        got = _all_masses(h, P)
        want = Posterior(h, P).by_leaf_depth()
        torch.testing.assert_close(got[: h.num_nodes], want, rtol=0, atol=1e-15)
        assert (got[h.num_nodes] == 0).all()  # the padding id


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_masses_and_order_on_bundled_trees(tree):
    h, info = bundled(tree)
    rng = np.random.default_rng(4)
    P = torch.as_tensor(batch(rng, 6, info.L))
    torch.testing.assert_close(_all_masses(h, P)[: h.num_nodes], Posterior(h, P).by_leaf_depth(), rtol=0, atol=1e-14)
    ranges = depth_ranges(h)
    order = ranges.leaf_order
    assert torch.equal(torch.sort(order).values, torch.arange(h.num_leaves))
    depth = h.leaf_depth[order]
    assert (depth[1:] >= depth[:-1]).all()
    # Each run is exactly the node's leaves at that depth.
    for n in np.random.default_rng(0).choice(h.num_nodes, 25, replace=False):
        under = set(info.leaves_under(int(n)))
        ends = depth_range_ends(h, torch.tensor([int(n)]))[0]
        e_count = ranges.depths.numel()
        for e, d in enumerate(ranges.depths.tolist()):
            run = order[int(ends[e_count + e]): int(ends[e])].tolist()
            assert set(run) == {l for l in under if info.depth[l] == d}


def test_prefix_sums_are_float64_for_float32_input():
    h, info = bundled("tieredimagenet-h")
    P = torch.softmax(torch.randn(3, info.L) * 4, 1)
    prefix = depth_prefix_sums(h, P.t())
    assert prefix.dtype == torch.float64 and prefix.shape == (info.L + 1, 3)
    assert (prefix[0] == 0).all()
    torch.testing.assert_close(prefix[-1], P.double().sum(1), rtol=0, atol=1e-12)


def _deep_tree(num_nodes, depth, seed=0):
    """A chain of ``depth`` nodes with the others hung at random below earlier nodes: leaves at
    hundreds of distinct depths."""
    rng = np.random.default_rng(seed)
    parents = np.empty(num_nodes, dtype=np.int64)
    parents[0], parents[1:depth] = -1, np.arange(depth - 1)
    parents[depth:] = (rng.random(num_nodes - depth) * np.arange(depth, num_nodes)).astype(np.int64)
    return Hierarchy.from_parents(parents.tolist())


def test_ends_by_search_equal_the_table(monkeypatch):
    """Trees with many leaf depths search the sorted keys: the same runs, so the same masses bit for bit."""
    rng = np.random.default_rng(5)
    trees = [h for h, _ in random_trees(19, 12, num_nodes_max=40, deep_bias=0.7)] + [bundled("tieredimagenet-h")[0]]
    for h in trees:
        ids = torch.arange(h.num_nodes + 1)
        table = depth_range_ends(h, ids)
        assert depth_ranges(h).ends is not None
        monkeypatch.setattr(dr, "TABLE_MAX_DEPTHS", 0)
        fresh = Hierarchy.from_parents(h.parents_list)
        assert depth_ranges(fresh).ends is None
        assert torch.equal(depth_range_ends(fresh, ids), table)
        assert torch.equal(depth_range_ends(fresh, ids[:, None].expand(-1, 3)), table[:, None].expand(-1, 3, -1))
        P = torch.as_tensor(batch(rng, 3, h.num_leaves))
        prefix = depth_prefix_sums(h, Posterior(h, P).node[: h.num_leaves])
        rows = torch.arange(3).repeat_interleave(h.num_nodes + 1)
        assert torch.equal(depth_masses(fresh, prefix, rows, ids.repeat(3)), depth_masses(h, prefix, rows, ids.repeat(3)))
        monkeypatch.undo()


def test_tree_tables_stay_linear_in_the_nodes_on_deep_trees():
    """The run ends were (N + 1, E) tables: 2.4 GiB on a 400k-node tree with leaves at 817 depths."""
    h = _deep_tree(3000, 300)
    assert h.num_leaf_depths > 200
    r = depth_ranges(h)
    assert r.ends is None
    for t in (r.leaf_order, r.keys, r.start, r.stop, r.depths):
        assert t.numel() <= h.num_nodes + 1
    # The padding id N has empty runs; a node's runs hold exactly its leaves.
    ends = depth_range_ends(h, torch.tensor([h.num_nodes, h.root]))
    e = h.num_leaf_depths
    assert (ends[0, :e] == ends[0, e:]).all()
    assert int((ends[1, :e] - ends[1, e:]).sum()) == h.num_leaves


_MEMORY_SCRIPT = r"""
import resource, sys
import numpy as np, torch
import hdecode_torch as hd
plan, metric = sys.argv[1:3]
rng = np.random.default_rng(0)
parents = np.empty(40000, dtype=np.int64)
parents[0], parents[1:300] = -1, np.arange(299)
parents[300:] = (rng.random(40000 - 300) * np.arange(300, 40000)).astype(np.int64)
h = hd.Hierarchy.from_parents(parents.tolist())  # as _deep_tree(40000, 300)
P = torch.as_tensor(rng.dirichlet(np.full(h.num_leaves, 0.3), size=2))
hd.set_memory_budget(4 << 20)
small = hd.Hierarchy.from_parents([-1, 0, 0, 1, 1, 2, 2])
with hd.plan_for(plan):  # the operators' first use is not the decoder's memory
    hd.get_decoder("optimal", small, metric=metric).decode(torch.full((2, 4), 0.25, dtype=torch.float64))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with hd.plan_for(plan):
    hd.get_decoder("optimal", h, metric=metric).decode(P)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("metric", ["hf_beta", "jaccard"])
def test_deep_trees_decode_within_the_budget_plus_linear_tables(plan, metric):
    """hF_β and Jaccard on a 40,000-node tree with leaves at ~300 depths, 2 samples, a 4 MiB budget,
    peak memory growth in a subprocess: the run-ends tables alone took 0.37 GiB (an (N + 1, E) int64
    search, int32 copies, an int64 concatenation); now tens of MiB."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, plan, metric], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout.strip().splitlines()[-1]) < 120
