"""Per-leaf-depth masses from prefix sums (kernels/depth_ranges.py) against the (N, E, B) table."""

import numpy as np
import pytest
import torch

from hdecode_torch.kernels.depth_ranges import depth_masses, depth_prefix_sums, depth_ranges
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
        for e, d in enumerate(ranges.depths.tolist()):
            run = order[int(ranges.lo[n, e]): int(ranges.hi[n, e])].tolist()
            assert set(run) == {l for l in under if info.depth[l] == d}


def test_prefix_sums_are_float64_for_float32_input():
    h, info = bundled("tieredimagenet-h")
    P = torch.softmax(torch.randn(3, info.L) * 4, 1)
    prefix = depth_prefix_sums(h, P.t())
    assert prefix.dtype == torch.float64 and prefix.shape == (info.L + 1, 3)
    assert (prefix[0] == 0).all()
    torch.testing.assert_close(prefix[-1], P.double().sum(1), rtol=0, atol=1e-12)
