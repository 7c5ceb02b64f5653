"""The top-down path kernels: the leaf order, node probabilities from its prefix sums, and the miss loss's
critical values read in one gather, against the walk down every row's path and a plain reference.

- every node's run of the leaf order holds exactly its leaves, children's runs partition their parent's
  in order of their smallest leaf, and the order is the identity when the leaf ids follow a depth-first
  listing (iNat19) and not otherwise (tieredImageNet-H);
- a child's computed p never exceeds its parent's, rounding included (float32 and float64 rows);
- ``miss_critical_values`` equals the walk's critical values bit for bit (random trees with single-child
  chains, ties, zero-probability targets, both bundled trees, both plans, any block size), and the
  miss critical value read from a plain reference path; the walk is taken when the tables would be too
  large.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import hdecode_torch.kernels.top_down_path as tdp
import reference as ref
from harness import batch, bundled, devices, dtypes, random_trees
from hdecode_torch.synthetic import synthetic_outputs

BUNDLED = ["tieredimagenet-h", "inat19"]


def trees(seed: int, count: int = 12):
    yield from random_trees(seed, count, num_nodes_max=24, unary_prob=0.3, deep_bias=0.5)


def node_p(h, probs: torch.Tensor) -> torch.Tensor:
    """(B, N) p(n) as the kernels compute it: differences of the leaf order's prefix sums."""
    prefix = tdp.leaf_prefix(h, probs)
    lo, hi = tdp.leaf_layout(h)[1].unbind(1)
    return prefix[:, hi] - prefix[:, lo]


def walked(rc, probs, y):
    post, y = rc._inputs(probs, y, False)
    return rc._walk(post, y)[0]


def ref_critical_value(info: ref.TreeInfo, p: np.ndarray, y: int) -> float:
    """The miss critical value from a plain walk: p of the first path node off y's branch (0 if none)."""
    node = info.root
    while info.children[node]:
        node = max(info.children[node], key=lambda c: (p[c], -c))  # ties: the smallest id
        if y not in info.leaves_under(node):
            return float(p[node])
    return 0.0


# --------------------------------------------------------------------------- the leaf order
@pytest.mark.parametrize("seed", range(4))
def test_each_node_is_one_run_of_the_leaf_order(seed):
    for h, info in list(trees(seed)) + [bundled(t) for t in BUNDLED]:
        order, bounds = tdp.leaf_layout(h)
        order = np.arange(h.num_leaves) if order is None else order.numpy()
        lo, hi = bounds.numpy().T
        for n in range(h.num_nodes):
            assert sorted(order[lo[n]:hi[n]]) == info.leaves_under(n)
            kids = sorted(info.children[n], key=lambda c: min(info.leaves_under(c)))
            if kids:  # the children split the parent's run, by their smallest leaf
                assert [lo[c] for c in kids] == [lo[n]] + [hi[c] for c in kids[:-1]] and hi[kids[-1]] == hi[n]


def test_the_leaf_order_is_the_identity_when_the_ids_follow_a_depth_first_listing():
    assert tdp.leaf_layout(hd.load_hierarchy("inat19"))[0] is None
    assert tdp.leaf_layout(hd.load_hierarchy("tieredimagenet-h"))[0] is not None
    # children listed against their ids' order: still a depth-first numbering of the leaves
    h = hd.Hierarchy.from_parents([5, 5, 4, 4, 6, 6, -1])
    assert tdp.leaf_layout(h)[0] is None
    h = hd.Hierarchy.from_parents([5, 4, 5, 4, 6, 6, -1])  # leaves 0 and 2 share a parent: not contiguous
    assert tdp.leaf_layout(h)[0] is not None


@dtypes
@pytest.mark.parametrize("seed", range(3))
def test_a_child_never_exceeds_its_parent(seed, dtype):
    rng = np.random.default_rng(seed)
    for h, info in list(trees(seed)) + [bundled(t) for t in BUNDLED]:
        probs = torch.as_tensor(batch(rng, 64, h.num_leaves), dtype=dtype)
        p = node_p(h, probs)
        nonroot = torch.nonzero(h.parent >= 0)[:, 0]
        assert bool((p[:, nonroot] <= p[:, h.parent[nonroot]]).all())
        want = torch.as_tensor(np.stack([ref.node_probs(info, row) for row in probs.double().numpy()]))
        torch.testing.assert_close(p, want, rtol=0, atol=1e-12 if dtype == torch.float64 else 1e-6)


# --------------------------------------------------------------------------- the miss loss's critical values
@pytest.mark.parametrize("seed", range(6))
def test_critical_values_equal_the_walk_and_a_plain_path(seed):
    rng = np.random.default_rng(100 + seed)
    for h, info in trees(seed):
        probs = torch.as_tensor(batch(rng, 60, h.num_leaves), dtype=torch.float32)
        probs[::7] = 1.0 / h.num_leaves  # all equal: every step is a tie
        y = torch.as_tensor(rng.integers(0, h.num_leaves, 60))  # zero-probability targets included
        rc = hd.RiskControl(h, alpha=0.5)
        steps = rc.loss_steps(probs, y)
        want = walked(rc, probs, y)
        assert torch.equal(steps.at, want.at) and torch.equal(steps.jump, want.jump)
        p = node_p(h, probs).numpy()
        plain = [ref_critical_value(info, p[i], int(y[i])) for i in range(60)]
        assert steps.at[:, 0].tolist() == plain


@pytest.mark.parametrize("tree", BUNDLED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_critical_values_equal_the_walk_on_bundled_trees(tree, dtype):
    h = hd.load_hierarchy(tree)
    probs, y = synthetic_outputs(h, 3000, seed=3)
    probs = probs.to(dtype)
    rc = hd.RiskControl(h, alpha=0.1)
    want = walked(rc, probs, y)
    chains = tdp.miss_chains(h)
    for block in (None, 1, 7, 1000):
        at, leaves = tdp.miss_critical_values(h, chains, probs, y, block)
        assert torch.equal(at, want.at[:, 0]) and torch.equal(leaves.double(), want.jump[:, 0])
    assert torch.equal(rc.loss_steps(probs, y).at, want.at)


@devices
def test_critical_values_on_both_plans(device):
    h = hd.load_hierarchy("inat19")
    probs, y = synthetic_outputs(h, 2000, seed=4)
    want = hd.RiskControl(h, alpha=0.1).loss_steps(probs, y)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            got = hd.RiskControl(h, alpha=0.1).loss_steps(probs.to(device), y.to(device))
        assert torch.equal(got.jump.cpu(), want.jump)
        if device == "cpu":
            assert torch.equal(got.at.cpu(), want.at)
        else:  # a GPU sums a subtree's probabilities in another order: the same to a few ulps
            torch.testing.assert_close(got.at.cpu(), want.at, rtol=1e-12, atol=1e-15)


def test_too_large_a_table_falls_back_to_the_walk(monkeypatch):
    par = hd.load_hierarchy("tieredimagenet-h").parents_list
    probs, y = synthetic_outputs(hd.load_hierarchy("tieredimagenet-h"), 500, seed=5)
    monkeypatch.setattr(tdp, "MISS_CHAIN_MAX_ENTRIES", 1000)
    h = hd.Hierarchy.from_parents(par)  # a fresh tree: no cached tables
    assert tdp.miss_chains(h) is None
    rc = hd.RiskControl(h, alpha=0.1)
    post, yy = rc._inputs(probs, y, False)
    assert rc._miss_steps(post, yy) is None
    steps = rc.loss_steps(probs, y)
    monkeypatch.undo()
    assert torch.equal(steps.at, hd.RiskControl(hd.load_hierarchy("tieredimagenet-h"), alpha=0.1).loss_steps(probs, y).at)


def test_a_single_leaf_is_never_missed_and_an_empty_batch_has_no_rows():
    h = hd.Hierarchy.from_parents([-1, 0])  # the root and its one leaf
    steps = hd.RiskControl(h, alpha=0.5).loss_steps(torch.ones(3, 1), torch.zeros(3, dtype=torch.long))
    assert steps.at.tolist() == [[0.0]] * 3 and steps.jump.tolist() == [[0.0]] * 3
    h = hd.load_hierarchy("inat19")
    for loss, alpha, width in (("miss", 0.1, 1), ("overshoot", 1.0, h.max_depth)):
        steps = hd.RiskControl(h, alpha=alpha, loss=loss).loss_steps(torch.zeros(0, h.num_leaves),
                                                                      torch.zeros(0, dtype=torch.long))
        assert steps.at.shape == (0, width) and steps.jump.shape == (0, width)


@pytest.mark.parametrize("segment", [1, 3, 16, 2048])
def test_prefix_sums_by_segments_are_exact_enough_batch_free_and_shared_by_both_kernels(segment, monkeypatch):
    monkeypatch.setattr(tdp, "PREFIX_SEGMENT", segment)
    h = hd.load_hierarchy("tieredimagenet-h")
    probs, y = synthetic_outputs(h, 257, seed=6)
    prefix = tdp.leaf_prefix(h, probs)
    order = tdp.leaf_layout(h)[0]
    exact = torch.cat([torch.zeros(257, 1, dtype=torch.float64), probs.double()[:, order].cumsum(1)], 1)
    torch.testing.assert_close(prefix, exact, rtol=0, atol=1e-14)
    assert bool((prefix.diff(dim=1) >= 0).all())
    for i in (0, 100, 256):  # a row alone gets the same bits as in its batch
        assert torch.equal(tdp.leaf_prefix(h, probs[i:i + 1])[0], prefix[i])
    rc = hd.RiskControl(h, alpha=0.1)
    want = walked(rc, probs, y)
    at, _ = tdp.miss_critical_values(h, tdp.miss_chains(h), probs, y, 50)
    assert torch.equal(at, want.at[:, 0])


@pytest.mark.parametrize("seed", range(3))
def test_critical_values_equal_the_walk_on_a_large_random_recursive_tree(seed):
    """Thousands of nodes, leaves at every depth, nodes with many children: the tables' padding and
    indexing at scale."""
    rng = np.random.default_rng(seed)
    h = hd.Hierarchy.from_parents([-1] + [int(rng.integers(0, i)) for i in range(1, 3000)])
    probs = torch.as_tensor(batch(rng, 300, h.num_leaves), dtype=torch.float32)
    y = torch.as_tensor(rng.integers(0, h.num_leaves, 300))
    y[::2] = probs[::2].argmax(1)  # one-hot rows (every sixth) lead straight to their target
    rc = hd.RiskControl(h, alpha=0.1)
    steps, want = rc.loss_steps(probs, y), walked(rc, probs, y)
    assert tdp.miss_chains(h) is not None
    assert torch.equal(steps.at, want.at) and torch.equal(steps.jump, want.jump)
    assert 0 < float(steps.jump.mean()) < 1  # some rows leave their target's branch, some never do
