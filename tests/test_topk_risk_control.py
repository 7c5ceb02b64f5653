"""Top-k inputs to risk control: ``RiskControl.decode`` (and ``ThresholdDescent``'s) of a top-k list is the node
the λ-stopped top-down descent reaches on the completed (B, L) table (``TopK.completed``), computed on the list's
support: equal to the dense decoder's node exactly, ties included (dyadic lists and λ, so that p = λ and equal
children are exact ties on both sides), on small random trees and on both bundled trees, under both plans, in
float32 and float64, uniform and prior completions, rows where the unlisted mass wins; k = L is the dense answer
bit for bit; a λ fitted on dense calibration rows decodes lists; every entry point takes the list."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from harness import FLOAT_DTYPES, bundled, model_like, random_trees
from test_topk_heuristics import PLANS, UNITS, dyadic_lists, integer_prior

#: λ values: 0 (every positive step), multiples of 2^-16 that dyadic node masses can equal (p = λ: no step),
#: and 1/2 (the deepest node above one half).
LAMS = [0.0, 1 / UNITS, 1 / 16, 0.5]


def _rc(h, lam):
    rc = hd.RiskControl(h, alpha=0.1)
    rc.lam = lam  # as fit() sets it
    return rc


def _topk(vals, idx, prior, dtype):
    return hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx),
                   prior=None if prior is None else torch.tensor(prior, dtype=torch.float64))


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_equals_the_dense_descent_on_small_random_trees(plan, dtype, completion):
    rng = np.random.default_rng(31)
    stops = off = 0
    for h, _ in random_trees(7, 30, num_nodes_max=30, unary_prob=0.25):
        L = h.num_leaves
        for k in sorted({1, 2, max(1, L // 2), max(1, L - 1)}):
            prior = integer_prior(rng, L) if completion == "prior" else None
            vals, idx = dyadic_lists(rng, L, 16, k, prior)
            topk = _topk(vals, idx, prior, dtype)
            full = topk.completed(L)
            support = torch.zeros(len(idx), h.num_nodes + 1, dtype=torch.bool)
            support.scatter_(1, h.ancestors[torch.tensor(idx)].reshape(len(idx), -1), True)
            for lam in LAMS:
                d = _rc(h, lam) if lam != 1 / 16 else hd.decoders.ThresholdDescent(h, lam=lam)  # the family itself
                with hd.plan_for(plan):
                    got, want = d.decode(topk), d.decode(full)
                assert torch.equal(got, want), (lam, torch.nonzero(got != want).flatten().tolist())
                stops += int((~h.is_leaf[got]).sum())
                off += int((~support.gather(1, got[:, None])).sum())
    assert stops > 0 and off > 0  # stopped above a leaf, and stepped into the completion's own nodes


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
def test_a_lambda_fitted_on_dense_rows_decodes_lists_as_the_dense_table(tree, plan):
    h, _ = bundled(tree)
    rng = np.random.default_rng(7)
    calib = torch.tensor(np.concatenate([model_like(rng, h, 100, kind) for kind in ("peaked", "confused")]))
    y = torch.multinomial(calib, 1, generator=torch.Generator().manual_seed(0))[:, 0]
    rc = hd.RiskControl(h, alpha=0.1).fit(calib, y)
    assert 0 < rc.lam < 1
    probs = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    prior = integer_prior(rng, h.num_leaves)
    for k in (1, 10, 100):
        for p in (None, prior):
            vals, idx = dyadic_lists(rng, h.num_leaves, probs.shape[0], k, p, weights=probs)
            topk = _topk(vals, idx, p, torch.float32)
            with hd.plan_for(plan):
                assert torch.equal(rc.decode(topk), rc.decode(topk.completed(h.num_leaves)))


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_k_equal_to_L_is_the_dense_answer_bit_for_bit(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(8)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "confused")]),
                         dtype=dtype)
    t = probs.topk(h.num_leaves)
    for lam in (0.0, 0.05, 0.5):
        rc = _rc(h, lam)
        with hd.plan_for(plan):
            dense = rc.decode(probs)
            assert torch.equal(rc.decode(t), dense)
            assert torch.equal(rc.decode(hd.TopK(t.values, t.indices)), dense)


def test_every_entry_point_takes_the_list():
    h, _ = bundled("inat19")
    rng = np.random.default_rng(9)
    probs = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    vals, idx = dyadic_lists(rng, h.num_leaves, probs.shape[0], 10, weights=probs)
    topk = _topk(vals, idx, None, torch.float32)
    rc = _rc(h, 0.0625)
    want = rc.decode(topk.completed(h.num_leaves))
    assert torch.equal(rc.decode(topk), want)
    assert torch.equal(rc.decode(torch.return_types.topk((topk.values, topk.indices))), want)
    assert torch.equal(rc.decode(topk, chunk_size=5), want)
    one = rc.decode(hd.TopK(topk.values[3], topk.indices[3]))
    assert one.shape == () and one == want[3]
    head = hd.DecodingHead(h, rc)
    assert torch.equal(head(topk), want)
    target = torch.tensor(idx[:, 0])
    ours = hd.HierarchicalMetric(h, "tree_distance", decoder=rc)
    ours.update(topk, target)
    dense = hd.HierarchicalMetric(h, "tree_distance", decoder=rc)
    dense.update(topk.completed(h.num_leaves), target)
    assert torch.equal(ours.compute(), dense.compute())


def test_an_unfitted_decoder_says_so_on_a_list():
    h, _ = bundled("tieredimagenet-h")
    with pytest.raises(RuntimeError, match=r"RiskControl is not fitted yet"):
        hd.RiskControl(h).decode(torch.tensor([[0.5, 0.2]]).topk(2))


# ------------------------------------------------------------------------------------------ fitting on lists
KINDS = ["miss", "budget", "overshoot", "custom"]


def _make(h, kind, **kw):
    if kind == "miss":
        return hd.RiskControl(h, **kw)
    if kind == "budget":
        return hd.RiskControl(h, budget=1, **kw)
    if kind == "overshoot":
        return hd.RiskControl(h, loss="overshoot", **kw)
    table = (h.depth[:, None] - h.depth[hd.kernels.lca(h, torch.arange(h.num_nodes)[:, None].expand(-1, h.num_leaves),
                                                       torch.arange(h.num_leaves).expand(h.num_nodes, -1))]).double()
    return hd.RiskControl(h, loss=table.clamp_max(1.0) * 0.5 + (table > 1) * 0.5, **kw)  # monotone, in [0, 1]


def _same_steps(a, b):
    assert a.binary == b.binary and a.bound == b.bound
    assert torch.equal(a.at, b.at) and torch.equal(a.jump, b.jump)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_fit_on_lists_equals_the_fit_on_the_completed_table(kind, completion):
    # the loss steps need only the path's masses and the target: from the support, the dense walk's values
    rng = np.random.default_rng(37)
    for h, _ in random_trees(5, 30, num_nodes_max=30, unary_prob=0.25):
        L = h.num_leaves
        for k in sorted({1, max(1, L // 2), max(1, L - 1)}):
            prior = integer_prior(rng, L) if completion == "prior" else None
            vals, idx = dyadic_lists(rng, L, 48, k, prior)
            topk = _topk(vals, idx, prior, torch.float64)
            full = topk.completed(L)
            y = torch.multinomial(full, 1, generator=torch.Generator().manual_seed(k))[:, 0]
            _same_steps(_make(h, kind).loss_steps(topk, y), _make(h, kind).loss_steps(full, y))
            a, b = _make(h, kind, alpha=0.3).fit(topk, y), _make(h, kind, alpha=0.3).fit(full, y)
            assert a.lam == b.lam and a.calibration_risk == b.calibration_risk
            ra, rb = a.risk_coverage(topk, y), b.risk_coverage(full, y)
            for f in ("lam", "risk", "mean_depth"):
                assert torch.equal(getattr(ra, f), getattr(rb, f)), f


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_fit_on_model_like_lists_of_the_bundled_trees(tree):
    h, _ = bundled(tree)
    rng = np.random.default_rng(11)
    probs = np.concatenate([model_like(rng, h, 100, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    for k in (10, 100):
        vals, idx = dyadic_lists(rng, h.num_leaves, probs.shape[0], k, weights=probs)
        topk = _topk(vals, idx, None, torch.float32)
        full = topk.completed(h.num_leaves)
        y = torch.multinomial(full.double(), 1, generator=torch.Generator().manual_seed(1))[:, 0]
        for kind in ("miss", "overshoot"):
            a, b = _make(h, kind, alpha=0.2).fit(topk, y), _make(h, kind, alpha=0.2).fit(full, y)
            assert a.lam == b.lam and a.calibration_risk == b.calibration_risk
            assert torch.equal(a.decode(topk), b.decode(full))


def test_fit_on_lists_refuses_what_does_not_apply():
    h, _ = bundled("tieredimagenet-h")
    t = torch.tensor([[0.5, 0.2]]).topk(2)
    with pytest.raises(ValueError, match=r"from_logits does not apply"):
        hd.RiskControl(h).loss_steps(t, torch.tensor([0]), from_logits=True)
    with pytest.raises(ValueError, match=r"`within` is not supported with a top-k input"):
        hd.RiskControl(h).loss_steps(t, torch.tensor([0]), within=torch.tensor([h.root]))
    with pytest.raises(ValueError, match=r"one row per calibration example"):
        hd.RiskControl(h).loss_steps(torch.tensor([0.5, 0.2]).topk(2), torch.tensor([0]))
