"""The CPU plan's per-level node sums at batch, bit for bit against their definition: one ``index_add_``
per tree level over all its nodes, the leaves' rows copied from the transposed batch-major input.

The decisions (and the recorded decisions) depend on every bit of p(n), so the faster ways of the same
sums (the leaves added in one call straight from their rows, the leaves' rows transposed by the SIMD
kernel in blocks) must give exactly those bits, on trees whose leaves sit beside internal siblings at
many depths, in sums whose rounding depends on the order of the additions.
"""

from __future__ import annotations

import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import tree_sums
from hdecode_torch.kernels.tree_sums import (
    FLOAT32_MAX_FAN_IN, copy_transposed_, internal_level_pairs, leaf_to_node_sum, level_pairs, node_major,
    subtree_sum,
)

from harness import bundled, random_trees


def _per_level(h, values):
    """The definition: ``values`` (N, *) summed in place, one ``index_add_`` per level over all its nodes."""
    rows = values.view(values.shape[0]) if values.dim() > 1 and values.numel() == values.shape[0] else values
    for nodes, parents in level_pairs(h):
        rows.index_add_(0, parents, rows.index_select(0, nodes))
    return values


def _leaf_sums_by_definition(h, leaf_values):
    acc = tree_sums.accumulation_dtype(h, leaf_values.dtype)
    out = torch.zeros((h.num_nodes,) + tuple(leaf_values.shape[1:]), dtype=acc)
    out[: h.num_leaves] = leaf_values
    out = _per_level(h, out)
    return out.to(leaf_values.dtype)


def _trees():
    star = hd.Hierarchy.from_parents([-1] + [0] * (FLOAT32_MAX_FAN_IN + 5))  # float64 sums
    return ([bundled("tieredimagenet-h")[0], bundled("inat19")[0], star, hd.Hierarchy.from_parents([-1, 0])]
            + [h for h, _ in random_trees(17, 8)])


def _order_sensitive(g, shape, dtype):
    """Values over many binades: a sum of several of them rounds differently in another order."""
    x = torch.rand(shape, generator=g, dtype=torch.float64) * torch.exp2(-30 * torch.rand(shape, generator=g,
                                                                                          dtype=torch.float64))
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 2, 9, 300])
def test_node_sums_are_the_per_level_definition_bit_for_bit(dtype, batch):
    g = torch.Generator().manual_seed(batch)
    with hd.plan_for("cpu"):  # the per-level sums are the CPU plan's
        for h in _trees():
            probs = _order_sensitive(g, (batch, h.num_leaves), dtype)
            want = _leaf_sums_by_definition(h, probs.t())
            got = leaf_to_node_sum(h, probs.t(), "levels")
            assert got.dtype == dtype and torch.equal(got, want), h
            assert torch.equal(leaf_to_node_sum(h, probs.t().contiguous(), "levels"), want)  # node-major input
            assert torch.equal(hd.node_probabilities(h, probs, validate=False).t(), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_subtree_sums_are_the_per_level_definition_bit_for_bit(dtype):
    """Internal nodes with values of their own, and a (N, E, B) table (the per-leaf-depth masses' shape)."""
    g = torch.Generator().manual_seed(5)
    for h in _trees():
        for shape in [(h.num_nodes, 1), (h.num_nodes, 7), (h.num_nodes, 3, 5)]:
            v = _order_sensitive(g, shape, dtype)
            assert torch.equal(subtree_sum(h, v, "levels"), _per_level(h, v.clone())), (h, shape)


def test_leaves_are_added_in_one_call_and_levels_of_leaves_only_are_skipped():
    h = bundled("inat19")[0]  # every leaf at depth 7: its level holds no internal node
    leaf_parent, pairs = internal_level_pairs(h)
    assert torch.equal(leaf_parent, h.parent[: h.num_leaves] - h.num_leaves)
    assert len(pairs) == h.max_depth - 1 == len(level_pairs(h)) - 1
    assert all(bool((nodes >= h.num_leaves).all()) and nodes.numel() for nodes, _ in pairs)
    leaf_parent, pairs = internal_level_pairs(hd.Hierarchy.from_parents([-1, 0]))
    assert leaf_parent.tolist() == [0] and pairs == []


@pytest.mark.parametrize("batch,width", [(8, 3), (9, 608), (300, 1010), (1000, 77), (5, 40), (64, 1), (130, 2)])
def test_transposed_copy_is_a_copy(batch, width, monkeypatch):
    """The SIMD transposition (where this build has it) in blocks, a last short block included, equals
    ``copy_``; whatever it cannot take (float64, a node-major input, few columns, too wide a table for
    blocks of 64 rows) goes to ``copy_``."""
    monkeypatch.setattr(tree_sums, "TRANSPOSE_BLOCK_BYTES", 4 * width * 64)  # blocks of 64 rows
    assert tree_sums._fast_transpose(torch.empty(batch, width).t(), torch.float32) == (
        batch >= 8 and width > 1 and tree_sums._simd_transpose())
    monkeypatch.setattr(tree_sums, "TRANSPOSE_BLOCK_BYTES", 4 * width * 63)
    assert not tree_sums._fast_transpose(torch.empty(batch, width).t(), torch.float32)
    monkeypatch.setattr(tree_sums, "TRANSPOSE_BLOCK_BYTES", 4 * width * 64)
    g = torch.Generator().manual_seed(width)
    x = torch.randn(batch, width, generator=g)
    for values in (x.t(), x.t().contiguous(), x.t().double(), x[:, : max(1, width // 2)].t()):
        out = torch.full(values.shape, float("nan"), dtype=values.dtype)
        assert copy_transposed_(out, values) is out and torch.equal(out, values)
    for values in (x.t(), x.t().double()):
        for dtype in (torch.float32, torch.float64):
            got = node_major(values, dtype)
            assert got.dtype == dtype and torch.equal(got, values.to(dtype))
            if not tree_sums._fast_transpose(values, dtype):
                assert (got.data_ptr() == values.data_ptr()) == (values.dtype == dtype)  # .to(): no copy
    x.requires_grad_()
    out = torch.empty(width, batch)
    assert torch.equal(copy_transposed_(out, x.t()), x.detach().t())  # a tensor that needs a gradient: copy_


def test_node_sums_keep_their_gradient():
    """A table that records a gradient is summed one call per level over all its nodes (autograd refuses
    the leaves' rows added in place into their own table): values and gradients as the definition's."""
    h = bundled("tieredimagenet-h")[0]
    g = torch.Generator().manual_seed(2)
    x = _order_sensitive(g, (h.num_leaves, 3), torch.float64).requires_grad_()
    w = torch.randn(h.num_nodes, 3, generator=g, dtype=torch.float64)
    got = leaf_to_node_sum(h, x, "levels")
    (got * w).sum().backward()
    want = _leaf_sums_by_definition(h, x.detach())
    assert torch.equal(got.detach(), want)
    # d/dx_l of Σ_n w_n p(n) is the sum of w over the leaf's root path
    anc = h.ancestors[: h.num_leaves]
    path_w = torch.where((anc < h.num_nodes)[..., None], w[anc.clamp(max=h.num_nodes - 1)], 0.0).sum(1)
    assert torch.allclose(x.grad, path_w)
