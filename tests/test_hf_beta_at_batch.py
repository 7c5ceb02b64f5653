"""hF_β at batch on the CPU plan: the NumPy pair listing (candidate_pairs), the row moves and the int32 mass positions give
the values the ATen operators they replace give (the decisions rest on them bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import depth_ranges as dr
from hdecode_torch.kernels import candidates, native
from hdecode_torch.kernels.candidates import candidate_pairs
from hdecode_torch.kernels.depth_ranges import depth_masses, depth_prefix_sums
from hdecode_torch.metrics import hf_beta as hfb
from harness import batch, bundled, random_trees


def _masks(rng, n, bsz, share):
    keep = torch.as_tensor(rng.random((n, bsz)) < share)
    return keep


def _aten_pairs(h, keep, p):
    """The pairs as ATen lists them: the transposed mask's nonzero entries (sample-major, depth order)."""
    order = candidates.depth_order(h)
    sample, rank = keep.index_select(0, order).t().contiguous().nonzero().unbind(1)
    node = order.index_select(0, rank)
    return sample, node, p.reshape(-1).index_select(0, node * p.shape[1] + sample)


@pytest.mark.parametrize("share", [0.005, 0.03, 0.2, 0.9])
@pytest.mark.parametrize("bsz", [2, 7, 300])
def test_numpy_pairs_equal_aten_pairs(share, bsz):
    # 0.005 and 0.03 take the radix sort by sample, 0.2 and 0.9 the transposed mask (one entry in 20)
    rng = np.random.default_rng(int(share * 1000) + bsz)
    for h in [bundled("tieredimagenet-h")[0]] + [t for t, _ in random_trees(5, 4, num_nodes_max=60)]:
        keep = _masks(rng, h.num_nodes, bsz, share)
        p = torch.as_tensor(rng.random((h.num_nodes, bsz)), dtype=torch.float32)
        got, want = candidate_pairs(h, keep, p), _aten_pairs(h, keep, p)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype
            assert torch.equal(a, b)


def test_pairs_beyond_16_bit_samples_fall_back(monkeypatch):
    rng = np.random.default_rng(1)
    h = bundled("tieredimagenet-h")[0]
    keep = _masks(rng, h.num_nodes, 9, 0.01)
    p = torch.as_tensor(rng.random((h.num_nodes, 9)), dtype=torch.float32)
    radix = candidate_pairs(h, keep, p)
    monkeypatch.setattr(candidates, "_RADIX_MAX_SAMPLES", 5)
    for a, b, c in zip(candidate_pairs(h, keep, p), _aten_pairs(h, keep, p), radix):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("bsz", [1, 6])
def test_rows_in_order_is_the_expanded_gather(bsz):
    g = torch.Generator().manual_seed(bsz)
    q = torch.rand(bsz, 9, 4, generator=g)
    order = torch.argsort(torch.rand(bsz, 9, generator=g), dim=1)
    assert torch.equal(hfb._rows_in_order(q, order), q.gather(1, order[:, :, None].expand_as(q)))


@pytest.mark.parametrize("batch_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masses_by_int32_positions_equal_the_int64_ones(monkeypatch, dtype, batch_major):
    h, info = bundled("tieredimagenet-h")
    rng = np.random.default_rng(2)
    P = torch.as_tensor(batch(rng, 40, info.L))
    prefix = depth_prefix_sums(h, hd.Posterior(h, P).node[: h.num_leaves])  # (L + 1, B)
    if batch_major:  # the CPU plan's layout: (B, L + 1) storage
        prefix = prefix.t().contiguous().t()
    m = 3000
    rows = torch.as_tensor(np.sort(rng.integers(0, 40, m)))
    ids = torch.as_tensor(rng.integers(0, h.num_nodes + 1, m))  # N: padding, zero masses
    assert m * h.num_leaf_depths >= dr.INT32_MIN_ENTRIES
    with native.use_native(False):  # the torch paths (the native one: tests/test_hf_beta_native.py)
        got = depth_masses(h, prefix, rows, ids, dtype=dtype)
        monkeypatch.setattr(dr, "INT32_MIN_ENTRIES", 1 << 62)  # the int64 ends, as a row's few pairs take
        old = depth_masses(h, prefix, rows, ids, dtype=dtype)
    # the masses as they were formed before: the float64 difference of the two ends, then the cast
    ends = prefix[dr.depth_range_ends(h, ids), rows[:, None]].view(m, 2, h.num_leaf_depths)
    want = (ends[:, 0] - ends[:, 1]).to(dtype)
    assert got.dtype == old.dtype == dtype
    assert torch.equal(got, want) and torch.equal(old, want)
    assert (got[ids == h.num_nodes] == 0).all()
    assert (got[ids == h.root].sum(1) > 0).all()


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
def test_a_batch_decides_as_its_rows_alone(beta):
    # the batch takes the NumPy listing (many rows), the rows alone the ATen one
    h, info = bundled("tieredimagenet-h")
    rng = np.random.default_rng(5)
    x = torch.as_tensor(batch(rng, 64, info.L), dtype=torch.float32)
    m = hd.get_metric("hf_beta", h, beta=beta)
    with hd.plan_for("cpu"):
        whole = m.decode(x)
        alone = torch.cat([m.decode(x[i:i + 1]) for i in range(0, 64, 9)])
    assert torch.equal(whole[::9], alone)
