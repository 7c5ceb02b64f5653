"""Node decoders at one row, round two: the one-row shortcuts compute the batch path's bits, so a row's
decision never depends on the batch it came in (both trees, both plans, float32 and float64, every row
of a batch decoded on its own); and what each shortcut spares a one-row call (operators dispatched)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.core.posterior import Posterior
from hdecode_torch.kernels import fused as F
from hdecode_torch.kernels.fused.path_score_best import path_score_best_torch
from hdecode_torch.kernels.selection import preference_order
from hdecode_torch.kernels.tree_sums import tree_ranges
from hdecode_torch.metrics import lca_height as lca_module, strategies, zhao as zhao_module
from harness import batch, bundled, model_like, random_trees
from test_fused_decoders import dyadic_rows, numpy_best
from testing import Operators
from testing import PLANS

TREES = ["tieredimagenet-h", "inat19"]
DTYPES = [torch.float32, torch.float64]


def _rows(h, dtype, seed=0, count=48):
    """Model-like rows and rows with exact ties (uniform, one-hot, dyadic), in ``dtype``."""
    rng = np.random.default_rng(seed)
    kinds = ["peaked", "diffuse", "confused", "shallow"]
    like = np.concatenate([model_like(rng, h, count // 8, kind) for kind in kinds])
    tied = batch(rng, count // 2, h.num_leaves, kinds=("uniform", "onehot", "dyadic", "sparse"))
    return torch.as_tensor(np.concatenate([like, tied]), dtype=dtype)


def _each_row(metric, p):
    return torch.cat([metric.decode(p[b:b + 1]) for b in range(p.shape[0])])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("tree", TREES)
def test_lca_height_one_row_decides_as_its_batch(tree, plan, dtype):
    """Every row of a batch decoded alone (the CPU plan's one-row shortcut) gets its batch decision."""
    h, _ = bundled(tree)
    p = _rows(h, dtype)
    metric = hd.get_metric("lca_height", h)
    with hd.plan_for(plan):
        assert torch.equal(_each_row(metric, p), metric.decode(p))
        assert torch.equal(metric.decode(p[0]), metric.decode(p[:1])[0])  # unbatched: the same row


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tree", TREES)
def test_lca_height_one_row_sums_are_the_per_level_bits(tree, dtype):
    """The shortcut's leaf scores are the per-level split sums bit for bit (not merely the same argmin)."""
    h, _ = bundled(tree)
    p = _rows(h, dtype, seed=1, count=16)
    leaves = preference_order(h, h.num_leaves)
    with hd.plan_for("cpu"):
        table = lca_module.split_sums(Posterior(h, p))[: h.num_leaves].index_select(0, leaves)
        for b in range(p.shape[0]):
            post = Posterior(h, p[b:b + 1])
            assert strategies.one_row_path_sums(post)
            alpha, order, parents = lca_module._one_row_tables(h, dtype)
            v = post.node.view(-1).index_select(0, h.parent_or_root).sub_(post.node.view(-1)).mul_(alpha)
            s = strategies.internal_path_sums_one_row(h, v)
            got = v.index_select(0, order).add_(s.index_select(0, parents))
            assert torch.equal(got, table[:, b]) and torch.equal(torch.signbit(got), torch.signbit(table[:, b]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lca_height_one_row_on_random_trees(dtype):
    """Unbalanced trees with single-child chains, depth 1 and up: each row alone decides as its batch,
    on the CPU plan (the shortcut) and with the shortcut turned off (the per-level sums)."""
    rng = np.random.default_rng(7)
    for h, _ in random_trees(3, 30, num_nodes_max=40):
        p = torch.as_tensor(batch(rng, 12, h.num_leaves), dtype=dtype)
        metric = hd.get_metric("lca_height", h)
        with hd.plan_for("cpu"):
            want = metric.decode(p)
            assert torch.equal(_each_row(metric, p), want)


def test_lca_height_beyond_the_bound_takes_the_per_level_sums(monkeypatch):
    """A tree over the shortcut's bound decodes one row with the per-level sums, to the same leaf."""
    h, _ = bundled("tieredimagenet-h")
    p = _rows(h, torch.float32, seed=2, count=8)
    metric = hd.get_metric("lca_height", h)
    with hd.plan_for("cpu"):
        fast = _each_row(metric, p)
        monkeypatch.setattr(strategies, "ONE_ROW_MAX_TERMS", 0)
        assert not strategies.one_row_path_sums(Posterior(h, p[:1]))
        assert torch.equal(_each_row(metric, p), fast)


@pytest.mark.parametrize("tree", TREES)
def test_lca_height_one_row_operators(tree):
    """The CPU plan's one-row decision after the node sums: a dozen operators whatever the depth (the
    per-level root-path sums took two a level: 32 on tieredImageNet-H, 22 on iNat19)."""
    h, _ = bundled(tree)
    p = _rows(h, torch.float32, count=8)[:1]
    with hd.plan_for("cpu"):
        post = Posterior(h, p)
        post.node
        lca_module.lca_height_decode(post)
        with Operators() as seen:
            lca_module.lca_height_decode(post)
    assert len(seen.ops) <= 12, seen.ops


def _definition(h, x, alpha, beta, euler_src, sign, at, gamma, delta) -> np.ndarray:
    """(B, N) float64 ``path_score_best``'s scores as its docstring defines them: E the exclusive prefix of
    sign·v(euler_src), S(n) = E[at[n]] (at = 0 reads E[0] = 0)."""
    src, _, hi, lo = tree_ranges(h, "leaves")
    c = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(x.double().numpy()[:, src.numpy()], 1)], 1)
    p = c[:, hi.numpy()] - c[:, lo.numpy()]
    v = alpha.numpy() * p[:, h.parent_or_root.numpy()] + beta.numpy() * p
    e = np.concatenate([np.zeros((x.shape[0], 1)), np.cumsum(sign.numpy() * v[:, euler_src.numpy()], 1)], 1)
    return gamma.numpy() * e[:, at.numpy()] + delta.numpy() * p


def test_path_score_best_reads_both_prefixes_as_defined():
    """Library tables (every node's entry ≥ 1: the inclusive prefix read one entry earlier) and tables where
    allowed nodes read E[0] = 0 (the zero column kept): each the definition's best node exactly (dyadic
    rows, small integer coefficients), at one row as in the batch."""
    rng = np.random.default_rng(11)
    for h, _ in random_trees(12, 12, num_nodes_max=30):
        n = h.num_nodes
        src, _, hi, lo = tree_ranges(h, "leaves")
        euler_src, sign, at, _ = tree_ranges(h, "path")
        zero_at = at.clone()
        zero_at[torch.as_tensor(rng.random(n) < 0.3)] = 0
        parent = h.parent_or_root
        x = dyadic_rows(rng, 6, h.num_leaves)
        alpha, beta, gamma, delta = (torch.as_tensor(rng.integers(-2, 3, n).astype(np.float64)) for _ in range(4))
        allowed = torch.ones(n, dtype=torch.bool)
        rank = torch.as_tensor(rng.permutation(n))
        for entries in (at, zero_at):
            want = numpy_best(_definition(h, x, alpha, beta, euler_src, sign, entries, gamma, delta),
                              allowed.numpy(), rank.numpy(), False)
            args = (src, hi, lo, parent, alpha, beta, euler_src, sign, entries, gamma, delta, allowed, rank, False)
            assert F.path_score_best(x, *args).tolist() == want.tolist()
            assert [int(F.path_score_best(x[b:b + 1], *args)) for b in range(x.shape[0])] == want.tolist()


@pytest.mark.parametrize("tree", TREES)
def test_path_score_best_one_row_operators(tree):
    """The torch implementation of ``hdecode::path_score_best`` on one row of the LCA height (the GPU plan on a
    CPU): no zero column for the root-path prefix, columns read by one ``index_select`` (36 operators before)."""
    h, _ = bundled(tree)
    p = _rows(h, torch.float32, count=8)[:1]
    args = lca_module._fused_args(h)
    want = path_score_best_torch(p, *args)
    with Operators() as seen:
        got = path_score_best_torch(p, *args)
    assert torch.equal(got, want)
    assert len(seen.ops) <= 29, seen.ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("name", ["wu_palmer", "zhao"])
def test_candidates_one_row_decides_as_its_batch(name, tree, plan, dtype):
    """The pruned candidates of one row (the CPU plan's Wu-Palmer on tieredImageNet-H): listed in preference
    order, scored on their own pattern, the first best: every row alone gets its batch decision."""
    h, _ = bundled(tree)
    p = _rows(h, dtype, seed=3)
    metric = hd.get_metric(name, h, strategy="candidates")
    with hd.plan_for(plan):
        assert torch.equal(_each_row(metric, p), metric.decode(p))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["wu_palmer", "zhao"])
def test_candidates_one_row_on_random_trees(name, dtype):
    """Unbalanced random trees with chains (exact ties among a chain's nodes): the one-row candidates decide as
    the batch's, on the CPU plan."""
    rng = np.random.default_rng(5)
    for h, _ in random_trees(4, 25, num_nodes_max=40):
        if h.num_leaves < 2:
            continue
        p = torch.as_tensor(batch(rng, 12, h.num_leaves), dtype=dtype)
        metric = hd.get_metric(name, h, strategy="candidates")
        with hd.plan_for("cpu"):
            assert torch.equal(_each_row(metric, p), metric.decode(p))


@pytest.mark.parametrize("dtype", DTYPES)
def test_candidate_mask_one_row_is_the_blocks_mask(dtype):
    """One sample's paired comparison keeps exactly the nodes the blocked tests keep, row by row."""
    from hdecode_torch.kernels import candidates as C

    h, _ = bundled("tieredimagenet-h")
    stats = hd.get_metric("wu_palmer", h).dense_pruning(h)
    p = _rows(h, dtype, seed=4, count=16)
    with hd.plan_for("cpu"):
        node = Posterior(h, p).node
        whole = C.candidate_mask(h, node, stats)
        for b in range(p.shape[0]):
            one = C.candidate_mask(h, node[:, b:b + 1].contiguous(), stats)
            assert torch.equal(one, whole[:, b:b + 1])


def test_sampled_rows_are_the_sampled_products():
    """Candidates' values scored on their own (M, 1) pattern, in any order, are the (N, 1) pattern's bits."""
    from hdecode_torch.kernels.candidates import sampled_products, sampled_rows

    h, _ = bundled("tieredimagenet-h")
    metric = hd.get_metric("wu_palmer", h)
    rng = np.random.default_rng(6)
    for dtype in DTYPES:
        cost = metric.similarity_matrix(h, dtype)
        p = _rows(h, dtype, seed=6, count=8)
        for b in range(p.shape[0]):
            node = torch.as_tensor(np.sort(rng.choice(h.num_nodes, 40, replace=False)))
            want = sampled_products(cost, p[b:b + 1], node, torch.zeros_like(node))
            shuffled = torch.as_tensor(rng.permutation(40))
            got = sampled_rows(cost, p[b:b + 1], node.index_select(0, shuffled))
            assert torch.equal(got, want.index_select(0, shuffled))


def test_wu_palmer_one_row_operators():
    """Wu-Palmer's one-row candidates on tieredImageNet-H (the CPU plan): the paired comparison, the list in
    preference order, its first best (74 operators a validated call before)."""
    h, _ = bundled("tieredimagenet-h")
    p = _rows(h, torch.float32, count=8)[:1]
    metric = hd.get_metric("wu_palmer", h)
    with hd.plan_for("cpu"):
        metric.decode(p)
        with Operators() as seen:
            metric.decode(p)
    assert len(seen.ops) <= 67, seen.ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("tree", TREES)
def test_zhao_one_row_decides_as_its_batch(tree, plan, dtype):
    """Zhao's structural table of one row (the internal nodes' sums at once on tieredImageNet-H's CPU plan,
    per level on iNat19's): every row alone gets its batch decision."""
    h, _ = bundled(tree)
    p = _rows(h, dtype, seed=8)
    metric = hd.get_metric("zhao", h)
    with hd.plan_for(plan):
        assert torch.equal(_each_row(metric, p), metric.decode(p))


@pytest.mark.parametrize("dtype", DTYPES)
def test_zhao_one_row_table_is_the_per_level_bits(dtype):
    """The one-row table is the batch table's column bit for bit, on tieredImageNet-H (deep enough)."""
    h, _ = bundled("tieredimagenet-h")
    assert h.max_depth >= zhao_module.ONE_ROW_MIN_DEPTH
    p = _rows(h, dtype, seed=9, count=16)
    with hd.plan_for("cpu"):
        table = zhao_module.zhao_ordered_table(Posterior(h, p))
        for b in range(p.shape[0]):
            got = zhao_module.zhao_ordered_table(Posterior(h, p[b:b + 1]))
            assert torch.equal(got, table[:, b:b + 1]) and torch.equal(got.signbit(), table[:, b:b + 1].signbit())


@pytest.mark.parametrize("dtype", DTYPES)
def test_zhao_one_row_on_random_trees(monkeypatch, dtype):
    """Unbalanced random trees with chains, the shortcut taken at every depth: each row decides as its batch."""
    monkeypatch.setattr(zhao_module, "ONE_ROW_MIN_DEPTH", 1)
    rng = np.random.default_rng(10)
    for h, _ in random_trees(13, 25, num_nodes_max=40):
        if h.num_leaves < 2:
            continue
        p = torch.as_tensor(batch(rng, 12, h.num_leaves), dtype=dtype)
        metric = hd.get_metric("zhao", h, strategy="structural")
        with hd.plan_for("cpu"):
            assert torch.equal(_each_row(metric, p), metric.decode(p))


@pytest.mark.parametrize("name", ["lca_height", "zhao", "wu_palmer"])
def test_one_row_chunk_of_a_shared_posterior(name):
    """A one-row chunk of a Posterior whose node sums were computed for the whole batch (a strided column)
    takes the one-row paths and decides as the batch."""
    h, _ = bundled("tieredimagenet-h")
    p = _rows(h, torch.float32, seed=12, count=8)
    metric = hd.get_metric(name, h)
    with hd.plan_for("cpu"):
        post = Posterior(h, p)
        post.node
        want = metric.decode(p)
        for b in range(p.shape[0]):
            chunk = post.chunk(b, b + 1)
            assert chunk.node.stride(0) == p.shape[0]  # a column of the batch's table
            assert torch.equal(metric._decode_default(chunk), want[b:b + 1])
