"""Small tree kernels against direct per-column definitions: argbest's tie rule, the children
window of a descent step."""

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels.selection import argbest, argbest_pairs
from hdecode_torch.kernels.descent import children_window, widest_by_depth
from harness import DEVICES, bundled, random_trees


def _argbest_reference(info, values, higher, mask, ids):
    out = []
    for b in range(values.shape[1]):
        # masked entries are ±inf: a fully masked column still follows the tie rule
        col = values[:, b] if mask is None else np.where(mask[:, b], values[:, b], -np.inf if higher else np.inf)
        best = col.max() if higher else col.min()
        node = lambda k: int(ids[k, b]) if ids is not None else k  # noqa: E731
        tied = [k for k in range(values.shape[0]) if col[k] == best]
        out.append(max((node(k) for k in tied), key=lambda n: (int(info.depth[n]), -n)))
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("higher", [True, False])
@pytest.mark.parametrize("rows", ["nodes", "leaves", "ids"])
def test_argbest_ties_go_deep_then_small(device, higher, rows):
    rng = np.random.default_rng(5)
    for h, info in random_trees(19, 20, num_nodes_max=16):
        h = h.to(device)
        k = {"nodes": info.N, "leaves": info.L, "ids": min(4, info.N)}[rows]
        values = rng.integers(0, 3, size=(k, 9)).astype(np.float64)  # many exact ties
        ids = None
        if rows == "ids":
            ids = np.sort(np.stack([rng.choice(info.N, k, replace=False) for _ in range(9)], 1), axis=0)
        mask = rng.random((k, 9)) < 0.8
        for m in (None, mask):
            v = torch.as_tensor(values, device=device)
            m_t = None if m is None else torch.as_tensor(m, device=device)
            if ids is None:
                got = argbest(h, v, higher, mask=m_t)
            else:  # entries of other nodes than their rows: every entry as a (sample, node) pair
                v = v if m_t is None else v.masked_fill(~m_t, float("-inf") if higher else float("inf"))
                sample = torch.arange(9, device=device).repeat(k)
                got = argbest_pairs(h, v.reshape(-1), sample, torch.as_tensor(ids, device=device).reshape(-1), 9,
                                    higher)
            assert got.cpu().tolist() == _argbest_reference(info, values, higher, m, ids)


@pytest.mark.parametrize("device", DEVICES)
def test_children_window_is_the_csr_children(device):
    for h, info in list(random_trees(23, 10, num_nodes_max=20)) + [bundled("inat19")]:
        h = h.to(device)
        kids_of = {n: [] for n in range(info.N)}
        for n in range(info.N):
            if info.parents[n] >= 0:
                kids_of[int(info.parents[n])].append(n)
        for depth in range(info.max_depth + 1):
            nodes = torch.tensor([n for n in range(info.N) if info.depth[n] == depth], device=device)
            kids, valid = children_window(h, nodes, depth)
            assert kids.shape[1] == max(widest_by_depth(h)[depth], 1)
            for row, n in enumerate(nodes.tolist()):
                assert kids[row][valid[row]].tolist() == sorted(kids_of[n])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("higher", [True, False])
def test_argbest_pairs_matches_argbest_on_masked_tables(device, higher):
    rng = np.random.default_rng(6)
    for h, info in random_trees(29, 20, num_nodes_max=16):
        h = h.to(device)
        values = torch.as_tensor(rng.integers(0, 3, size=(info.N, 7)).astype(np.float64), device=device)
        mask = torch.as_tensor(rng.random((info.N, 7)) < 0.6, device=device)
        mask[0] = True  # every sample keeps a candidate
        node, sample = mask.nonzero().unbind(1)
        got = argbest_pairs(h, values[node, sample], sample, node, 7, higher)
        assert torch.equal(got, argbest(h, values, higher, mask=mask))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("higher", [True, False])
def test_argbest_pairs_of_one_sample_is_its_answer_in_the_batch(device, higher):
    """One sample takes whole-list reductions instead of the scatters: each sample's pairs alone give its
    answer in the batch, with exact ties, infinities, NaN (the root, as in a batch) and a single pair."""
    rng = np.random.default_rng(7)
    for h, info in random_trees(31, 20, num_nodes_max=16):
        h = h.to(device)
        values = rng.integers(0, 3, size=(info.N, 7)).astype(np.float64)
        values[rng.integers(0, info.N), 3] = np.inf
        values[rng.integers(0, info.N), 4] = -np.inf
        nan_row = rng.integers(0, info.N)
        values[nan_row, 5] = np.nan
        mask = torch.as_tensor(rng.random((info.N, 7)) < 0.6, device=device)
        mask[0] = True
        mask[nan_row, 5] = True
        mask[1:, 6] = False  # a sample with one pair
        node, sample = mask.nonzero().unbind(1)
        v = torch.as_tensor(values, device=device)[node, sample]
        batch = argbest_pairs(h, v, sample, node, 7, higher)
        for b in range(7):
            one = sample == b
            got = argbest_pairs(h, v[one], sample[one] - b, node[one], 1, higher)
            assert got.shape == (1,) and got.dtype == torch.int64
            assert got.item() == batch[b].item(), (info.parents, b)
        assert batch[5].item() == h.root  # a NaN value: no entry equals the best


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sampled_products_equal_the_dense_product(device, dtype):
    from hdecode_torch.kernels.candidates import sampled_products

    g = torch.Generator().manual_seed(0)
    cost = torch.rand(30, 20, generator=g, dtype=dtype).to(device)
    probs = torch.rand(9, 20, generator=g, dtype=dtype).to(device)
    mask = (torch.rand(30, 9, generator=g) < 0.3).to(device)
    node, sample = mask.nonzero().unbind(1)
    got = sampled_products(cost, probs, node, sample)
    torch.testing.assert_close(got, (cost @ probs.t())[node, sample])
    empty = torch.zeros(0, dtype=torch.long, device=device)
    assert sampled_products(cost, probs, empty, empty).shape == (0,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_level_sums_of_one_row_are_its_bits_in_any_batch(dtype):
    """A single sample's per-level sums (a one-column table, summed as a 1-D one) hold exactly the bits
    of the same sample's column in a batch: node sums, root-path sums with and without the root, on
    the bundled trees, random trees and a star wider than float32's fan-in limit (float64 sums)."""
    from hdecode_torch import Hierarchy
    from hdecode_torch.kernels.tree_sums import FLOAT32_MAX_FAN_IN, leaf_to_node_sum, path_sum, subtree_sum

    star = Hierarchy.from_parents([-1] + [0] * (FLOAT32_MAX_FAN_IN + 5))
    trees = [bundled("tieredimagenet-h")[0], bundled("inat19")[0], star] + [h for h, _ in random_trees(31, 6)]
    g = torch.Generator().manual_seed(3)
    for h in trees:
        x = torch.rand(h.num_leaves, 9, generator=g, dtype=torch.float64).to(dtype)
        x = x / x.sum(0)  # sums of many terms: rounding that depends on the order of the additions
        nodes = leaf_to_node_sum(h, x, "levels")
        v = torch.rand(h.num_nodes, 9, generator=g, dtype=torch.float64).to(dtype)
        for b in (0, 4, 8):
            one = leaf_to_node_sum(h, x[:, b:b + 1], "levels")
            assert one.shape == (h.num_nodes, 1) and torch.equal(one[:, 0], nodes[:, b])
            assert torch.equal(leaf_to_node_sum(h, x.t()[b:b + 1].t(), "levels"), one)  # a transposed row
            assert torch.equal(subtree_sum(h, v[:, b:b + 1], "levels")[:, 0], subtree_sum(h, v, "levels")[:, b])
            for root in (True, False):
                assert torch.equal(path_sum(h, v[:, b:b + 1], root, "levels")[:, 0], path_sum(h, v, root, "levels")[:, b])


def test_float32_node_sums_on_a_very_wide_node():
    """Sequential float32 accumulation over 100k children drifted by 1e-3; wide nodes sum in float64."""
    n = 100_000
    h = hd.Hierarchy.from_parents([n] * n + [-1])
    p = torch.full((2, n), 1.0 / n, dtype=torch.float32)
    root = hd.node_probabilities(h, p)[:, h.root]
    assert root.dtype == torch.float32
    assert float((root - 1).abs().max()) < 1e-6
    assert int(hd.get_metric("tree_distance", h).decode(p)[0]) == h.root


def _candidate_mask_definition(h, p, stats):
    """The candidate mask written out on whole (N, B) tables, parents dropped by a float count."""
    dt = p.dtype
    eps = 16 * torch.finfo(dt).eps
    up = lambda t: (t + eps * t.abs()).to(dt)[:, None]  # noqa: E731
    down = lambda t: (t - eps * t.abs()).to(dt)[:, None]  # noqa: E731
    s = p[stats.top] if stats.root_form else torch.ones_like(p)
    rest = (s - p).clamp(min=0)
    drop_self = up(stats.M_in) * p + eps * eps < down(stats.m_out) * rest
    beats = down(stats.m_in) * p > up(stats.M_out) * rest + eps * eps
    child = torch.nonzero(h.parent >= 0)[:, 0]
    dropped = torch.zeros_like(p).index_add_(0, h.parent[child], beats[child].to(dt)) > 0
    return ~(drop_self | dropped)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block", [1, 7, 1 << 15, 1 << 40])
def test_candidate_mask_in_blocks_of_nodes_is_the_definition(monkeypatch, dtype, block):
    # The CPU computes the mask a block of node rows at a time: every block size gives the mask of the
    # whole-table formula, entry for entry (Wu-Palmer's exact statistics and the cost-bound ones).
    from hdecode_torch.kernels import candidates

    monkeypatch.setattr(candidates, "CANDIDATE_BLOCK_ENTRIES", block)
    h = bundled("tieredimagenet-h")[0]
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(6 * torch.randn(37, h.num_leaves, generator=g, dtype=torch.float64), 1).to(dtype)
    p = hd.node_probabilities(h, probs).t().contiguous()
    m = hd.get_metric("wu_palmer", h)
    exact = m.dense_pruning(h)
    # and the form with s = 1 (costs that differ under the root), the blocks' buffers filled with ones
    ones = candidates.PruningStatistics(exact.reasonable, False, exact.m_in, exact.M_in, exact.m_out, exact.M_out,
                                        exact.top)
    for stats in (exact, m.pruning(h), hd.get_metric("zhao", h).pruning(h), ones):
        got = candidates.candidate_mask(h, p, stats)
        want = _candidate_mask_definition(h, p, stats)
        assert torch.equal(got, want)
        assert 0 < int(got.sum()) < got.numel()
