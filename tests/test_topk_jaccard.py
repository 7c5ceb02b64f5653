"""Jaccard on top-k inputs (``metrics/jaccard.py``'s ``jaccard_decode_topk``, ``kernels/support_jaccard.py``): the
decision is the Bayes-optimal set of the completed distribution, equal by expected score (1e-12 relative, float64)
to the dense decoder on the completed table and to the exhaustive oracle, on small random trees (unbalanced,
single-child chains), rows of every kind (Dirichlet, peaked, dyadic, missing = 0, rows where the unlisted mass
wins), uniform and prior completions, both bundled trees, both plans, float32 and float64; k = L is the dense
answer bit for bit; the expected value of any closed set matches the dense one; the entry points take the list;
a decode on a 100k-leaf tree never grows with B × L."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from harness import bundled, model_like, random_trees
from hdecode_torch import functional as F
from hdecode_torch.core.topk import CompletedTopK
from hdecode_torch.kernels.depth_ranges import depth_masses, depth_prefix_sums
from hdecode_torch.kernels.support_jaccard import completion_prefix, depth_listed, depth_masses_topk
from test_topk import random_lists, random_prior
from test_topk_heuristics import dyadic_lists, integer_prior
from memory_testing import MiB, assert_growths_below

PLANS = ["cpu", "cuda"]
RTOL = 1e-12


def _decode(m, topk, plan):
    with hd.plan_for(plan):
        return m.decode(topk)


def _is_sparse_closed(h, sets):
    """A coalesced sparse bool (B, N) set, every row closed under ancestors and holding the root."""
    assert sets.layout == torch.sparse_coo and sets.is_coalesced() and sets.dtype == torch.bool
    dense = sets.to_dense()
    closed = hd.kernels.ancestry.ancestor_closure(h, dense)
    assert torch.equal(closed, dense) and dense[:, h.root].all()
    return dense


def _check_optimal(m, topk, pred, dtype, best=None):
    """pred's expected score under the completion equals the dense decoder's on the completed table (and the
    oracle's ``best``), within 1e-12 relative in float64; expected() of the list gives the same value."""
    h = m.hierarchy
    L = h.num_leaves
    full = topk.completed(L, torch.float64)
    dense = _is_sparse_closed(h, pred)
    ours = m.expected(full, dense)
    theirs = m.expected(full, m.decode(topk.completed(L, dtype)))
    scale = theirs.abs().clamp_min(1e-300)
    if dtype == torch.float64:
        assert torch.all((ours - theirs).abs() <= RTOL * scale), (ours - theirs).abs().max()
    else:  # the dense decoder works in float32; the top-k one in float64: never worse beyond float32 rounding
        assert torch.all(ours >= theirs - 2e-6 * scale)
    if best is not None:
        best = torch.as_tensor(best)
        assert torch.all((ours - best).abs() <= RTOL * best.abs().clamp_min(1e-300)), (ours - best).abs().max()
    got = m.expected(hd.TopK(topk.values.double(), topk.indices, prior=topk.prior,
                             missing=None if topk.missing is None else topk.missing), pred)
    assert torch.all((got - ours).abs() <= RTOL * ours.abs().clamp_min(1e-300))
    return dense


def _off_support(h, idx, dense):
    """The number of chosen nodes outside the ancestors of the listed leaves."""
    anc = h.ancestors
    support = torch.zeros(dense.shape[0], h.num_nodes + 1, dtype=torch.bool)
    support.scatter_(1, anc[torch.as_tensor(idx)].reshape(dense.shape[0], -1), True)
    return int((dense & ~support[:, : h.num_nodes]).sum())


# ------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_exact_against_the_oracle_on_small_random_trees(plan, dtype, completion):
    rng = np.random.default_rng(5)
    off = 0
    for h, info in random_trees(11, 30, num_nodes_max=13, unary_prob=0.3, min_leaves=1):
        m = hd.get_metric("jaccard", h)
        L = h.num_leaves
        enum = ref.JaccardEnumeration(info)
        for k in sorted({1, 2, max(1, L // 2), max(1, L - 1)}):
            if k >= L:
                continue
            prior = random_prior(rng, L) if completion == "prior" else None
            vals, idx = random_lists(rng, L, 8, k)
            if prior is not None:  # rows whose unlisted leaves all have prior 0 list everything as missing = 0
                full = ((prior > 0).sum() - (prior[idx] > 0).sum(1)) == 0
                vals[full] = rng.dirichlet(np.ones(k), size=int(full.sum()))
            dv, di = dyadic_lists(rng, L, 8, k)  # missing 0 .. the largest the unlisted leaves hold
            vals, idx = np.concatenate([vals, dv]), np.concatenate([idx, di])
            if prior is not None:
                full = ((prior > 0).sum() - (prior[idx] > 0).sum(1)) == 0
                vals[full] = rng.dirichlet(np.ones(k), size=int(full.sum()))
            topk = hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx),
                           prior=None if prior is None else torch.tensor(prior))
            pred = _decode(m, topk, plan)
            best = enum.values(topk.completed(L, torch.float64).numpy()).max(0)
            dense = _check_optimal(m, topk, pred, dtype, best)
            off += _off_support(h, idx, dense)
    assert off > 0  # sets reaching off the support (the completion's own mass) were exercised


@pytest.mark.parametrize("plan", PLANS)
def test_larger_random_trees_match_the_dense_decoder(plan):
    rng = np.random.default_rng(8)
    off = 0
    for h, info in random_trees(12, 12, num_nodes_max=60, unary_prob=0.25):
        m = hd.get_metric("jaccard", h)
        L = h.num_leaves
        for k in sorted({1, 3, max(1, L // 3), max(1, L - 1)}):
            vals, idx = random_lists(rng, L, 16, k)
            pred = _decode(m, hd.TopK(torch.tensor(vals), torch.tensor(idx)), plan)
            off += _off_support(h, idx, _check_optimal(m, hd.TopK(torch.tensor(vals), torch.tensor(idx)), pred,
                                                       torch.float64))
            prior = integer_prior(rng, L)
            dv, di = dyadic_lists(rng, L, 8, k, prior=prior)
            topk = hd.TopK(torch.tensor(dv), torch.tensor(di), prior=torch.tensor(prior, dtype=torch.float64))
            _check_optimal(m, topk, _decode(m, topk, plan), torch.float64)
    assert off > 0


def test_the_unlisted_mass_wins():
    # a root over two subtrees: one leaf alone under its parent (the only listed leaf, 0.1), and 6 leaves under
    # another node, which the missing 0.9 is spread over: the optimal set goes down that node, off the support
    h = hd.Hierarchy.from_parents([-1, 0, 0, 1] + [2] * 6)
    m = hd.get_metric("jaccard", h)
    parent = h.parent[: h.num_leaves]
    siblings = torch.bincount(parent, minlength=h.num_nodes)[parent]
    lonely, big = int(torch.nonzero(siblings == 1)[0, 0]), int(parent[siblings > 1][0])
    topk = hd.TopK(torch.tensor([[0.1]], dtype=torch.float64), torch.tensor([[lonely]]))
    enum = ref.JaccardEnumeration(ref.TreeInfo(np.asarray(h.parents_list)))
    best = enum.values(topk.completed(h.num_leaves, torch.float64).numpy()).max(0)
    dense = _check_optimal(m, topk, m.decode(topk), torch.float64, best)
    assert dense[0, big] and _off_support(h, [[lonely]], dense) == 1


@pytest.mark.parametrize("plan", PLANS)
def test_deep_caterpillars_match_the_dense_decoder(plan):
    # depth 200: the first bound scores the root path at the sizes around E[d(y)] + 1 only (its (D+1)²·E table
    # of every size would be too large), and sets reach down long single-leaf levels
    from test_decoders import caterpillar

    rng = np.random.default_rng(10)
    for depth in (40, 200):
        h = caterpillar(depth)
        m = hd.get_metric("jaccard", h)
        L = h.num_leaves
        for k in (1, 5, L // 2):
            vals, idx = random_lists(rng, L, 6, k)
            topk = hd.TopK(torch.tensor(vals), torch.tensor(idx))
            _check_optimal(m, topk, _decode(m, topk, plan), torch.float64)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_bundled_trees_match_the_dense_decoder(tree, plan, dtype):
    h, _ = bundled(tree)
    m = hd.get_metric("jaccard", h)
    rng = np.random.default_rng(3)
    probs = np.concatenate([model_like(rng, h, 6, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    probs = torch.tensor(probs, dtype=dtype)
    prior = torch.tensor(random_prior(rng, h.num_leaves))
    for k in (1, 10, 100):
        t = probs.topk(k)
        _check_optimal(m, hd.TopK(t.values, t.indices), _decode(m, t, plan), dtype)
        scaled = hd.TopK(t.values * 0.5, t.indices, prior=prior)  # half the mass completed by the prior
        _check_optimal(m, scaled, _decode(m, scaled, plan), dtype)
    vals, idx = dyadic_lists(rng, h.num_leaves, probs.shape[0], 20, weights=probs.double().numpy())
    topk = hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx))
    _check_optimal(m, topk, _decode(m, topk, plan), dtype)
    zero = hd.TopK(t.values / t.values.sum(1, keepdim=True), t.indices, missing=0.0)  # missing = 0
    _check_optimal(m, zero, _decode(m, zero, plan), dtype)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_k_equal_to_L_is_the_dense_answer_bit_for_bit(tree, plan, dtype):
    h, _ = bundled(tree)
    m = hd.get_metric("jaccard", h)
    rng = np.random.default_rng(4)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 4, kind) for kind in ("peaked", "confused")]),
                         dtype=dtype)
    with hd.plan_for(plan):
        got = m.decode(probs.topk(h.num_leaves))
        want = m.decode(probs)
        assert got.layout == torch.sparse_coo and torch.equal(got.to_dense(), want)
        sets = want.clone()
        assert torch.equal(m.expected(probs.topk(h.num_leaves), sets), m.expected(probs, sets))


# ------------------------------------------------------------------------------------------ expected values
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_expected_value_of_any_closed_set(completion):
    rng = np.random.default_rng(6)
    for h, info in random_trees(13, 10, num_nodes_max=40, unary_prob=0.25):
        m = hd.get_metric("jaccard", h)
        L, n = h.num_leaves, h.num_nodes
        k = max(1, L // 3)
        vals, idx = random_lists(rng, L, 10, k)
        prior = torch.tensor(random_prior(rng, L)) if completion == "prior" else None
        if prior is not None:
            full = ((prior.numpy() > 0).sum() - (prior.numpy()[idx] > 0).sum(1)) == 0
            vals[full] = rng.dirichlet(np.ones(k), size=int(full.sum()))
        topk = hd.TopK(torch.tensor(vals), torch.tensor(idx), prior=prior)
        sets = torch.tensor(rng.random((10, n)) < 0.3)
        sets = hd.kernels.ancestry.ancestor_closure(h, sets)
        sets[:, h.root] = True
        full = topk.completed(L, torch.float64)
        want = m.expected(full, sets)
        for pred in (sets, sets.to_sparse(), torch.tensor(rng.integers(0, n, 10))):
            got = m.expected(topk, pred)
            ref_pred = pred.to_dense() if pred.layout == torch.sparse_coo else pred
            want = m.expected(full, ref_pred)
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, want, rtol=RTOL, atol=1e-15)
        one = m.expected(hd.TopK(topk.values[2], topk.indices[2], prior=prior), sets[2])
        assert one.shape == () and abs(float(one) - float(m.expected(full[2], sets[2]))) <= 1e-12


def test_depth_masses_of_the_completion():
    rng = np.random.default_rng(7)
    for h, _ in random_trees(14, 8, num_nodes_max=50, unary_prob=0.3):
        L = h.num_leaves
        k = max(1, L // 2)
        vals, idx = random_lists(rng, L, 6, k)
        for prior in (None, torch.tensor(random_prior(rng, L))):
            v = vals.copy()
            if prior is not None:
                full = ((prior.numpy() > 0).sum() - (prior.numpy()[idx] > 0).sum(1)) == 0
                v[full] = rng.dirichlet(np.ones(k), size=int(full.sum()))
            topk = hd.TopK(torch.tensor(v), torch.tensor(idx), prior=prior)
            ct = CompletedTopK(h, topk)
            dl = depth_listed(h, ct.values, ct.indices, ct.listed.rate, ct.prior)
            rows = torch.arange(6).repeat_interleave(h.num_nodes + 1)
            nodes = torch.arange(h.num_nodes + 1).repeat(6)  # N: padding, zero masses
            got = depth_masses_topk(h, dl, completion_prefix(h, ct.prior), rows, nodes, chunk=7)
            prefix = depth_prefix_sums(h, topk.completed(L, torch.float64).t())
            want = depth_masses(h, prefix, rows, nodes)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-14)


# ------------------------------------------------------------------------------------------ entry points
def test_every_entry_point_takes_the_list():
    h, _ = bundled("inat19")
    rng = np.random.default_rng(9)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused",
                                                                                  "shallow")]))
    m = hd.get_metric("jaccard", h)
    t = probs.topk(10)
    topk = hd.TopK(t.values, t.indices)
    want = m.decode(topk)
    assert want.layout == torch.sparse_coo and want.shape == (32, h.num_nodes)
    for got in (m.decode(t), F.decode_jaccard(topk, h), F.decode_jaccard(t, h), hd.DecodingHead(h, "jaccard")(t),
                m.decode(topk, chunk_size=5)):
        assert got.layout == torch.sparse_coo and torch.equal(got.to_dense(), want.to_dense())
    one = m.decode(hd.TopK(topk.values[3], topk.indices[3]))
    assert one.shape == (h.num_nodes,) and torch.equal(one.to_dense(), want.to_dense()[3])
    torch.testing.assert_close(F.expected_jaccard(topk, want, h), m.expected(topk.completed(h.num_leaves,
                                                                                            torch.float64),
                                                                              want.to_dense()), rtol=RTOL, atol=0)
    # HierarchicalMetric: the sets' values against the targets
    target = torch.randint(0, h.num_leaves, (32,), generator=torch.Generator().manual_seed(0))
    ours = hd.HierarchicalMetric(h, "jaccard")
    ours.update(t, target)
    torch.testing.assert_close(ours.compute(), m(want, target, dtype=torch.float64).mean(), rtol=RTOL, atol=0)
    # k = L through the same entry points: the dense answer bit for bit
    full = probs.topk(h.num_leaves)
    assert torch.equal(F.decode_jaccard(full, h).to_dense(), F.decode_jaccard(probs, h))
    assert torch.equal(hd.DecodingHead(h, "jaccard")(full).to_dense(), hd.DecodingHead(h, "jaccard")(probs))
    dense = hd.HierarchicalMetric(h, "jaccard")
    dense.update(probs, target)
    ours = hd.HierarchicalMetric(h, "jaccard")
    ours.update(full, target)
    assert torch.equal(ours.compute(), dense.compute())


def test_certify_is_refused():
    h, _ = bundled("tieredimagenet-h")
    with pytest.raises(ValueError, match=r"`jaccard` gives no certificate of a top-k decision"):
        hd.get_metric("jaccard", h).decode(torch.tensor([[0.5, 0.2]]).topk(2), certify=True)


# ------------------------------------------------------------------------------------------ memory
def test_a_top_k_decode_never_grows_with_B_times_L(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: the dense (B, L) float32 table alone would be 390 MiB, a (B, N) bool 132 MiB
    assert_growths_below(top_k_growths("jaccard"), 3, 128 * MiB)  # both plans, and expected
