"""hF_β on top-k inputs: the decision is the Bayes-optimal set for the completed distribution (uniform or prior
completion), equal by expected score (1e-12 relative in float64) to the dense decoder on the completed (B, L)
table and to exhaustive enumeration of the closed sets on small trees; random trees (unbalanced, single-child
chains), both bundled trees, both plans, float32 and float64, β in {0.5, 1, 2}; k = L gives the dense answer bit
for bit (as sparse sets); the entry points give the class's answer; a decode on the 100k-leaf tree never grows
with B × L."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import hdecode_torch as hd
import hdecode_torch.functional as F
import reference as ref
from harness import FLOAT_DTYPES, bundled, model_like, random_trees, tolerance
from hdecode_torch.core.topk import CompletedTopK
from hdecode_torch.kernels.ancestry import ancestor_closure
from hdecode_torch.kernels.depth_ranges import depth_ranges
from hdecode_torch.kernels.support_hf_beta import depth_listed, depth_masses_topk, heavy_nodes, heavy_order
from hdecode_torch.metrics.hf_beta import hf_beta_bound
from memory_testing import MiB, assert_growths_below

BETAS = [0.5, 1.0, 2.0]
PLANS = ["cpu", "cuda"]
ROW_KINDS = ["dirichlet", "peaked", "dyadic", "missing0", "unlisted_wins"]


def lists(rng, L, B, k, kind):
    """(values (B, k) float64, indices (B, k) int64, missing or None) of one kind of row.

    dirichlet: masses of total 1, 0.5, 0.1 or 0; peaked: one leaf near 0.9; dyadic: 1/2, 1/4, ... (ties in
    the node masses); missing0: values of total 1 and ``missing = 0`` given (nothing spread);
    unlisted_wins: a tiny listed mass, the completion decides."""
    idx = np.stack([rng.permutation(L)[:k] for _ in range(B)])
    missing = None
    if kind == "dirichlet":
        vals = rng.dirichlet(np.full(k, rng.choice([0.2, 1.0, 5.0])), size=B)
        vals *= rng.choice([1.0, 0.5, 0.1, 0.0], size=B)[:, None]
    elif kind == "peaked":
        vals = rng.dirichlet(np.ones(k), size=B) * 0.1
        vals[:, 0] += 0.85
    elif kind == "dyadic":
        vals = np.tile(0.5 ** np.arange(1, k + 1), (B, 1))
    elif kind == "missing0":
        vals = rng.dirichlet(np.ones(k), size=B) * rng.uniform(0.9999, 1.0, size=(B, 1))
        missing = 0.0
        vals /= vals.sum(1, keepdims=True)
    else:
        vals = rng.dirichlet(np.ones(k), size=B) * 1e-3
    return vals, idx, missing


def random_prior(rng, L):
    prior = rng.dirichlet(np.ones(L))
    prior[rng.random(L) < 0.3] = 0
    prior[rng.integers(L)] += 0.1
    return prior


def _dense_check(m, topk, pred, dtype, plan):
    """pred (sparse) scores as well as the dense decoder on the completed table; expected(topk, pred) is the
    dense expected value of pred.  Returns the number of (row, node) entries of pred with no listed leaf
    under the node, and the number of rows whose set is the dense decoder's."""
    h = m.hierarchy
    L = h.num_leaves
    assert pred.layout == torch.sparse_coo and pred.is_coalesced() and pred.shape == (topk.values.shape[0], h.num_nodes)
    dense_sets = pred.to_dense()
    assert dense_sets[:, h.root].all()
    assert torch.equal(ancestor_closure(h, dense_sets), dense_sets)
    full = topk.completed(L, torch.float64)
    with hd.plan_for(plan):
        dense_pred = m.decode(topk.completed(L))
        got = m.expected(topk, pred)
    ours, theirs = m.expected(full, dense_sets), m.expected(full, dense_pred)
    rtol = 1e-12 if dtype == torch.float64 else tolerance(dtype)
    assert torch.all(ours >= theirs - rtol * theirs.abs().clamp_min(1e-300)), (ours - theirs).min()
    torch.testing.assert_close(got, ours.to(got.dtype), rtol=1e-12 if dtype == torch.float64 else 1e-6, atol=1e-15)
    support = torch.zeros(full.shape[0], h.num_nodes + 1, dtype=torch.bool)
    indices = topk.indices.reshape(full.shape[0], -1)
    for j in range(indices.shape[1]):
        support.scatter_(1, h.ancestors[indices[:, j]], True)  # (B, D+1) root paths, N past the root
    return int((dense_sets & ~support[:, : h.num_nodes]).sum()), int((dense_sets == dense_pred).all(1).sum())


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_optimal_on_random_trees(plan, dtype, completion):
    rng = np.random.default_rng(35)
    off_support = 0
    trees = 0
    for h, _ in random_trees(11, 32, num_nodes_max=40, unary_prob=0.3):
        trees += 1
        L = h.num_leaves
        prior = torch.tensor(random_prior(rng, L)) if completion == "prior" else None
        for beta in BETAS:
            m = hd.get_metric("hf_beta", h, beta=beta)
            for k in sorted({1, 2, max(1, L // 2), max(1, L - 1)}):
                if k >= L:
                    continue
                kind = ROW_KINDS[(trees + k + int(4 * beta)) % len(ROW_KINDS)]
                vals, idx, missing = lists(rng, L, 10, k, kind)
                if prior is not None:
                    # rows whose unlisted leaves all have prior 0 cannot hold missing mass
                    empty = ((prior.numpy() > 0).sum() - (prior.numpy()[idx] > 0).sum(1)) == 0
                    vals[empty] /= vals[empty].sum(1, keepdims=True).clip(min=1e-300)
                    vals[empty & (vals.sum(1) == 0)] = 1.0 / k
                topk = hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx), missing=missing, prior=prior)
                with hd.plan_for(plan):
                    pred = m.decode(topk)
                off_support += _dense_check(m, topk, pred, dtype, plan)[0]
    assert trees == 32
    assert off_support > 0  # sets holding nodes with no listed leaf were exercised


@pytest.mark.parametrize("beta", BETAS)
def test_equals_the_exhaustive_oracle_on_small_trees(beta):
    rng = np.random.default_rng(int(beta * 10))
    checked = 0
    for h, info in random_trees(7, 30, num_nodes_max=11, unary_prob=0.3):
        L = h.num_leaves
        if L < 2:
            continue
        m = hd.get_metric("hf_beta", h, beta=beta)
        for kind in ROW_KINDS:
            k = int(rng.integers(1, L))
            vals, idx, missing = lists(rng, L, 3, k, kind)
            topk = hd.TopK(torch.tensor(vals), torch.tensor(idx), missing=missing)
            pred = m.decode(topk).to_dense()
            full = topk.completed(L, torch.float64).numpy()
            for b in range(3):
                best, _ = ref.optimal(info, "hf_beta", full[b], beta=beta)
                got = ref.expected(info, "hf_beta", full[b], frozenset(pred[b].nonzero()[:, 0].tolist()), beta=beta)
                assert got >= best - 1e-12 * max(best, 1e-300), (got, best, kind, k)
                checked += 1
    assert checked >= 150


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bundled_trees_match_the_dense_decoder(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(3)
    probs = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    probs = torch.tensor(probs, dtype=dtype)
    prior = torch.tensor(random_prior(rng, h.num_leaves))
    same = rows = 0
    for beta in BETAS:
        m = hd.get_metric("hf_beta", h, beta=beta)
        for k in (1, 10, 100):
            t = probs.topk(k)
            scale = torch.tensor(rng.choice([1.0, 0.5, 0.01], size=probs.shape[0]), dtype=dtype)[:, None]
            for topk in (hd.TopK(t.values, t.indices), hd.TopK(t.values * scale, t.indices, prior=prior)):
                with hd.plan_for(plan):
                    pred = m.decode(topk)
                same += _dense_check(m, topk, pred, dtype, plan)[1]
                rows += probs.shape[0]
    if dtype == torch.float64:  # the same candidates, solver and ties: the same sets but at rounding-level ties
        assert same >= 0.95 * rows, (same, rows)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_k_equal_to_L_is_the_dense_answer_bit_for_bit(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(4)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 6, kind) for kind in ("peaked", "confused")]),
                         dtype=dtype)
    t = probs.topk(h.num_leaves)
    for beta in BETAS:
        m = hd.get_metric("hf_beta", h, beta=beta)
        with hd.plan_for(plan):
            dense = m.decode(probs)
            for lists_ in (t, hd.TopK(t.values, t.indices)):
                got = m.decode(lists_)
                assert got.layout == torch.sparse_coo and torch.equal(got.to_dense(), dense)
            assert torch.equal(m.expected(t, dense), m.expected(probs, dense))
            assert torch.equal(m.expected(t, m.decode(t)), m.expected(probs, dense))


@pytest.mark.parametrize("beta", BETAS)
def test_support_path_with_every_leaf_listed(beta):
    # k = L is decoded as the dense table; the support path itself, with nothing unlisted (r = 0), is optimal
    h, _ = bundled("tieredimagenet-h")
    probs = torch.tensor(model_like(np.random.default_rng(5), h, 12, "confused"))
    ct = CompletedTopK(h, hd.TopK(*probs.topk(h.num_leaves)))
    m = hd.get_metric("hf_beta", h, beta=beta)
    pred = m._decode_topk(ct)
    ours, theirs = m.expected(probs, pred.to_dense()), m.expected(probs, m.decode(probs))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=0)
    torch.testing.assert_close(m._expected_topk(ct, pred), ours, rtol=1e-12, atol=0)


def test_unbatched_rows_chunks_and_lists():
    h, _ = bundled("inat19")
    probs = torch.tensor(model_like(np.random.default_rng(6), h, 12, "diffuse"))
    m = hd.get_metric("hf_beta", h, beta=2.0)
    t = probs.topk(20)
    batched = m.decode(t)
    assert torch.equal(m.decode(hd.TopK(t.values, t.indices)).to_dense(), batched.to_dense())
    assert torch.equal(m.decode(t, chunk_size=5).to_dense(), batched.to_dense())
    one = m.decode(probs[3].topk(20))
    assert one.layout == torch.sparse_coo and one.shape == (h.num_nodes,)
    assert torch.equal(one.to_dense(), batched.to_dense()[3])
    e = m.expected(probs[3].topk(20), one)
    assert e.shape == () and e == m.expected(t, batched)[3]
    # predictions as node ids or dense sets score the same as their sparse closure
    ids = torch.randint(0, h.num_nodes, (12,), generator=torch.Generator().manual_seed(0))
    full = hd.TopK(t.values, t.indices).completed(h.num_leaves, torch.float64)
    torch.testing.assert_close(m.expected(t, ids), m.expected(full, ids), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(m.expected(t, batched.to_dense()), m.expected(full, batched.to_dense()),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_depth_masses_are_the_completed_tables(completion):
    # Q_e(n) of every node equals the dense per-leaf-depth sums of the completed table
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(9)
    L, B, k = h.num_leaves, 6, 30
    vals, idx, _ = lists(rng, L, B, k, "dirichlet")
    prior = torch.tensor(random_prior(rng, L)) if completion == "prior" else None
    topk = hd.TopK(torch.tensor(vals), torch.tensor(idx), prior=prior)
    ct = CompletedTopK(h, topk)
    full = topk.completed(L, torch.float64)
    dl = depth_listed(h, ct.values, ct.indices, ct.listed, ct.prior)
    rows = torch.arange(B).repeat_interleave(h.num_nodes)
    nodes = torch.arange(h.num_nodes).repeat(B)
    got = depth_masses_topk(h, dl, rows, nodes).view(B, h.num_nodes, -1)
    depths = depth_ranges(h).depths
    leaf_anc = torch.zeros(L, h.num_nodes + 1, dtype=torch.float64).scatter_(1, h.ancestors[:L], 1.0)[:, : h.num_nodes]
    for e, d in enumerate(depths.tolist()):
        at = (h.leaf_depth[:L] == d).to(torch.float64)
        want = (full * at) @ leaf_anc  # (B, N)
        torch.testing.assert_close(got[:, :, e], want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("beta", BETAS)
def test_heavy_nodes_hold_every_off_support_node_past_the_bound(beta):
    h, _ = bundled("inat19")
    rng = np.random.default_rng(10)
    L, B = h.num_leaves, 16
    vals, idx, _ = lists(rng, L, B, 3, "unlisted_wins")
    vals[:4] = 0.0  # everything missing: the heaviest nodes pass
    topk = hd.TopK(torch.tensor(vals), torch.tensor(idx))
    ct = CompletedTopK(h, topk)
    bound = hf_beta_bound(h, beta)
    rows, nodes = heavy_nodes(heavy_order(h, ct.weights, bound), ct.listed.rate)
    got = torch.zeros(B, h.num_nodes, dtype=torch.bool)
    got[rows, nodes] = True
    p = ct.listed.rate[:, None] * ct.weights[None, :]  # r·W(n), the off-support mass
    want = p >= bound[None, :]
    want[:, h.root] = False
    assert want.sum() > 0 and not (want & ~got).any()
    assert not (got & (p < bound[None, :] * (1 - 1e-6))).any()  # nothing far below the bound


# ------------------------------------------------------------------------------------------ entry points
@pytest.mark.parametrize("beta", BETAS)
def test_functional_and_integrations_give_the_class_answer(beta):
    h, _ = bundled("inat19")
    rng = np.random.default_rng(11)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "confused")]))
    m = hd.get_metric("hf_beta", h, beta=beta)
    target = torch.randint(0, h.num_leaves, (probs.shape[0],), generator=torch.Generator().manual_seed(1))
    head = hd.DecodingHead(h, "hf_beta", beta=beta)
    for k in (1, 10, h.num_leaves):
        t = probs.topk(k)
        want = m.decode(hd.TopK(t.values, t.indices))
        assert want.layout == torch.sparse_coo
        for got in (F.decode_hf_beta(t, h, beta=beta), head(t), head(hd.TopK(t.values, t.indices))):
            assert got.layout == torch.sparse_coo and torch.equal(got.to_dense(), want.to_dense())
        torch.testing.assert_close(F.expected_hf_beta(t, want, h, beta=beta), m.expected(t, want), rtol=0, atol=0)
        metric = hd.HierarchicalMetric(h, "hf_beta", beta=beta)
        metric.update(t, target)
        torch.testing.assert_close(metric.compute(), m(want, target, dtype=torch.float64).mean(), rtol=1e-12, atol=0)
        if k == h.num_leaves:  # the dense answers bit for bit
            assert torch.equal(want.to_dense(), m.decode(probs))
            assert torch.equal(head(t).to_dense(), head(probs))
            dense = hd.HierarchicalMetric(h, "hf_beta", beta=beta)
            dense.update(probs, target)
            assert torch.equal(metric.compute(), dense.compute())


# ------------------------------------------------------------------------------------------ memory
def test_a_top_k_decode_never_grows_with_B_times_L(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: the dense (B, L) float32 table alone would be 390 MiB, a (B, N) bool
    # set 132 MiB; the support tables are B·k·(D+1) entries, the candidates a few per depth and row
    assert_growths_below(top_k_growths("hf_beta"), 5, 128 * MiB)  # β = 1, 0.5 on both plans, and expected


@pytest.mark.parametrize("plan", PLANS)
def test_deep_trees_with_many_leaf_depths(plan):
    # a caterpillar of depth 40 (40 leaf depths: the runs are found by sorted search, no table of ends)
    depth = 40
    parents = [-1]
    for d in range(depth):
        parents += [2 * d, 2 * d]  # a leaf and the next spine node under each spine node
    h = hd.Hierarchy.from_parents(parents)
    assert h.num_leaf_depths > 16
    rng = np.random.default_rng(12)
    L = h.num_leaves
    for beta in BETAS:
        m = hd.get_metric("hf_beta", h, beta=beta)
        for k, kind in ((1, "unlisted_wins"), (5, "dirichlet"), (20, "peaked"), (L - 1, "dyadic")):
            vals, idx, missing = lists(rng, L, 8, k, kind)
            topk = hd.TopK(torch.tensor(vals), torch.tensor(idx), missing=missing)
            with hd.plan_for(plan):
                pred = m.decode(topk)
            _dense_check(m, topk, pred, torch.float64, plan)


@given(seed=st.integers(0, 2**31 - 1), k_frac=st.floats(0, 1), scale=st.sampled_from([1.0, 0.6, 0.05, 0.0]),
       beta=st.sampled_from(BETAS))
@settings(max_examples=60, deadline=None)
def test_hypothesis_trees_and_lists_against_the_oracle(seed, k_frac, scale, beta):
    rng = np.random.default_rng(seed)
    par = ref.random_tree(rng, num_nodes_max=int(rng.integers(3, 11)), unary_prob=0.3, min_leaves=2)
    h, info = hd.Hierarchy.from_parents(par), ref.TreeInfo(par)
    L = h.num_leaves
    k = 1 + int(k_frac * (L - 2))
    idx = np.stack([rng.permutation(L)[:k] for _ in range(3)])
    vals = rng.dirichlet(np.ones(k), size=3) * scale
    topk = hd.TopK(torch.tensor(vals), torch.tensor(idx))
    pred = hd.get_metric("hf_beta", h, beta=beta).decode(topk).to_dense()
    full = topk.completed(L, torch.float64).numpy()
    for b in range(3):
        best, _ = ref.optimal(info, "hf_beta", full[b], beta=beta)
        got = ref.expected(info, "hf_beta", full[b], frozenset(pred[b].nonzero()[:, 0].tolist()), beta=beta)
        assert got >= best - 1e-12 * best
