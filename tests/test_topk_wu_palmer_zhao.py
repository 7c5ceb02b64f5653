"""Top-k inputs to Wu-Palmer and Zhao: the decision is the Bayes-optimal node of the completed distribution
(uniform or prior completion), equal by expected score (1e-12 relative, float64) to the dense decoder on the
completed (B, L) table and to brute force over every node (the NumPy oracle), the same node wherever the
dense decoder's best beats its runner-up by more than rounding (dyadic rows included); on small random trees
(unbalanced, single-child chains) with Dirichlet, peaked, dyadic and model-like rows, k from 1 to L − 1,
missing = 0, priors and rows where the unlisted mass wins; on both bundled trees, under both plans, in
float32 and float64, unbatched; k = L is the dense answer bit for bit; every entry point (the class,
``hd.functional``, ``DecodingHead``, ``HierarchicalMetric``, the command line) takes the list; a decode on a
100k-leaf tree never grows with B × L."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import hdecode_torch.functional as F
import reference as ref
from harness import FLOAT_DTYPES, bundled, dense_cost, model_like, random_trees, tolerance
from test_topk import random_lists, random_prior
from test_topk_heuristics import dyadic_lists, integer_prior
from memory_testing import MiB, assert_growths_below

NAMES = ["wu_palmer", "zhao"]
PLANS = ["cpu", "cuda"]
#: Relative agreement of float64 expected scores (the exactness claim).
RTOL = 1e-12


def _rows(rng, h, kind, k, prior):
    """(values, indices) of one kind of rows: "random" (Dirichlet masses of total often far below 1, so the
    unlisted mass often wins), "dyadic" (masses and completion multiples of 2^-16, missing = 0 to the most
    that fits), "peaked" / "dirichlet" (the top k of a full distribution of that kind), "model" (model-like
    rows: the top k of diffuse or sibling-confused distributions)."""
    L = h.num_leaves
    if kind == "random":
        return random_lists(rng, L, 12, k)
    if kind == "dyadic":
        return dyadic_lists(rng, L, 12, k, prior)
    if kind == "model":
        full = model_like(rng, h, 12, str(rng.choice(["peaked", "diffuse", "confused"])))
    else:
        full = ref.random_distributions(rng, 12, L, kind)
    idx = np.argsort(-full, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(full, idx, 1), idx


def _check(h, info, name, topk, dtype=torch.float64, plan="cpu", dense_pred_same=True):
    """The top-k decision against the dense decoder on the completed table and the oracle; returns it."""
    L = h.num_leaves
    m = hd.get_metric(name, h)
    with hd.plan_for(plan):
        pred = m.decode(topk)
        dense_pred = m.decode(topk.completed(L))
        got = m.expected(topk, pred)
    full = topk.completed(L, torch.float64)
    ours, theirs = m.expected(full, pred), m.expected(full, dense_pred)
    tol = RTOL if dtype == torch.float64 else tolerance(dtype)
    assert torch.all(ours >= theirs - tol * theirs.abs().clamp_min(1e-300)), (name, (ours - theirs).min())
    torch.testing.assert_close(got.double(), ours, rtol=tol, atol=tol)  # expected() on the list itself
    # expected() of any node, on the support or off it
    anyone = torch.randint(0, h.num_nodes, (full.shape[0],), generator=torch.Generator().manual_seed(L))
    torch.testing.assert_close(m.expected(topk, anyone).double(), m.expected(full, anyone), rtol=tol, atol=tol)
    # the oracle: brute force over every node of the completed table with the NumPy similarity matrix
    table = 1 - dense_cost(info, name) @ full.numpy().T  # (N, B) expected similarity
    best = table.max(0)
    mine = table[pred.numpy(), np.arange(full.shape[0])]
    assert np.all(mine >= best - max(tol, 1e-12) * np.abs(best)), (name, (mine - best).min())
    if dense_pred_same and dtype == torch.float64:
        # the same node wherever the optimum is not tied within rounding (ties of Wu-Palmer's quotients are
        # not exact in floating point, so only a clear winner must be the same node)
        ranked = np.sort(table, 0)
        clear = ranked[-1] - ranked[-2] > 1e-9 * np.abs(ranked[-1]).clip(1e-300)
        same = pred.numpy() == dense_pred.numpy()
        assert np.all(same | ~clear), (name, np.flatnonzero(~same & clear))
    return pred


def _off_support(h, idx, pred):
    support = torch.zeros(idx.shape[0], h.num_nodes + 1, dtype=torch.bool)
    support.scatter_(1, h.ancestors[torch.as_tensor(idx)].reshape(idx.shape[0], -1), True)
    return int((~support.gather(1, pred[:, None])).sum())


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_optimal_on_small_random_trees(name, completion):
    rng = np.random.default_rng(41)
    off, rows = 0, 0
    kinds = ["random", "dyadic", "peaked", "dirichlet", "model"]
    for t, (h, info) in enumerate(random_trees(11, 36, num_nodes_max=30, unary_prob=0.25)):
        L = h.num_leaves
        if L < 2:
            continue
        for k in sorted({1, 2, max(1, L // 3), max(1, L // 2), max(1, L - 1)} - {L}):
            kind = kinds[(t + k) % len(kinds)]
            prior = None
            if completion == "prior":
                prior = integer_prior(rng, L) if kind == "dyadic" else random_prior(rng, L)
            vals, idx = _rows(rng, h, kind, k, prior)
            if prior is not None and kind != "dyadic":
                # rows whose unlisted leaves all have prior 0 cannot hold missing mass: list it as missing = 0
                full = ((prior > 0).sum() - (prior[idx] > 0).sum(1)) == 0
                vals[full] = rng.dirichlet(np.ones(k), size=int(full.sum()))
            missing = None
            if kind in ("random", "dyadic") and rng.random() < 0.3:
                missing = torch.tensor(1 - vals.sum(1)).clamp_min(0)  # the same mass, given explicitly
            topk = hd.TopK(torch.tensor(vals), torch.tensor(idx), missing=missing,
                           prior=None if prior is None else torch.tensor(prior, dtype=torch.float64))
            pred = _check(h, info, name, topk)
            off += _off_support(h, idx, pred)
            rows += pred.numel()
    assert rows > 300 and off > 0  # the completion's own optimum (off the support) was exercised


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_plans_and_dtypes_on_small_random_trees(name, plan, dtype):
    rng = np.random.default_rng(5)
    for h, info in random_trees(13, 12, num_nodes_max=25, unary_prob=0.3):
        L = h.num_leaves
        for k in sorted({1, max(1, L // 2), max(1, L - 1)} - {L}):
            vals, idx = random_lists(rng, L, 12, k)
            _check(h, info, name, hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx)), dtype, plan)


@pytest.mark.parametrize("name", NAMES)
def test_missing_zero_and_rows_where_the_unlisted_mass_wins(name):
    # a single-child chain above two leaves and a wide subtree: with the whole mass unlisted the optimum is
    # deep in the unlisted part; with missing = 0 it is among the listed leaves' ancestors
    rng = np.random.default_rng(3)
    for h, info in random_trees(17, 10, num_nodes_max=40, unary_prob=0.3):
        L = h.num_leaves
        k = max(1, L // 4)
        if k >= L:
            continue
        idx = np.stack([rng.permutation(L)[:k] for _ in range(6)])
        tiny = np.full((6, k), 1e-3 / k)  # almost everything unlisted
        pred = _check(h, info, name, hd.TopK(torch.tensor(tiny), torch.tensor(idx)))
        full = hd.TopK(torch.tensor(tiny), torch.tensor(idx)).completed(L, torch.float64)
        assert torch.equal(pred, hd.get_metric(name, h).decode(full))
        whole = rng.dirichlet(np.ones(k), size=6)
        _check(h, info, name, hd.TopK(torch.tensor(whole), torch.tensor(idx), missing=0.0))


def test_a_flat_tree_whose_unlisted_leaves_tie():
    # every unlisted leaf of a flat tree has the same expected similarity: the smallest id wins, as densely
    h = hd.Hierarchy.from_parents([8] * 8 + [-1])
    info = ref.TreeInfo(np.asarray(h.parents_list))
    for name in NAMES:
        topk = hd.TopK(torch.tensor([[0.05, 0.01], [0.4, 0.3]], dtype=torch.float64), torch.tensor([[3, 0], [5, 6]]))
        pred = _check(h, info, name, topk)
        assert pred.tolist() == hd.get_metric(name, h).decode(topk.completed(8)).tolist() == [1, 5]


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("plan", PLANS)
def test_bundled_trees_match_the_dense_decoder(tree, name, plan):
    h, info = bundled(tree)
    rng = np.random.default_rng(7)
    for kind in ("peaked", "diffuse", "confused"):
        probs = torch.tensor(model_like(rng, h, 16, kind))
        for k in (1, 10, 100):
            t = probs.topk(k)
            _check(h, info, name, hd.TopK(t.values, t.indices), plan=plan)
    vals, idx = random_lists(rng, h.num_leaves, 16, 20)  # lists far from summing to 1
    for dtype in FLOAT_DTYPES:
        _check(h, info, name, hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx)), dtype, plan)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_k_equal_to_L_is_the_dense_answer_bit_for_bit(tree, name, dtype):
    h, _ = bundled(tree)
    probs = torch.tensor(model_like(np.random.default_rng(1), h, 24, "diffuse"), dtype=dtype)
    m = hd.get_metric(name, h)
    t = probs.topk(h.num_leaves)
    for plan in PLANS:
        with hd.plan_for(plan):
            assert torch.equal(m.decode(t), m.decode(probs))
            pred = m.decode(probs)
            assert torch.equal(m.expected(t, pred), m.expected(probs, pred))


@pytest.mark.parametrize("name", NAMES)
def test_unbatched_rows_and_chunks(name):
    h, info = bundled("inat19")
    probs = torch.tensor(model_like(np.random.default_rng(2), h, 40, "confused"))
    t = probs.topk(20)
    m = hd.get_metric(name, h)
    batch = m.decode(t)
    one = m.decode(probs[3].topk(20))
    assert one.shape == () and one == batch[3]
    assert m.expected(probs[3].topk(20), one).shape == ()
    hd.set_memory_budget(1 << 16)  # rows in several chunks
    try:
        assert torch.equal(m.decode(t), batch)
    finally:
        hd.set_memory_budget(None)


# ----------------------------------------------------------------------------------------- entry points
@pytest.mark.parametrize("name", NAMES)
def test_functional_head_and_metric_take_top_k_lists(name):
    h, _ = bundled("inat19")
    probs = torch.tensor(model_like(np.random.default_rng(4), h, 32, "peaked"), dtype=torch.float32)
    target = torch.randint(0, h.num_leaves, (32,), generator=torch.Generator().manual_seed(0))
    m = hd.get_metric(name, h)
    decode = {"wu_palmer": F.decode_wu_palmer, "zhao": F.decode_zhao}[name]
    expected = {"wu_palmer": F.expected_wu_palmer, "zhao": F.expected_zhao}[name]
    for k in (10, h.num_leaves):
        t = probs.topk(k)
        want = m.decode(t)
        assert torch.equal(decode(t, h), want)
        assert torch.equal(F.decode(name, t, h), want)
        assert torch.equal(hd.DecodingHead(h, name)(t), want)
        assert torch.equal(expected(t, want, h), m.expected(t, want))
        hm = hd.HierarchicalMetric(h, name)
        hm.update(t, target)
        want_mean = m(want, target, dtype=torch.float64).mean()
        torch.testing.assert_close(hm.compute().double(), want_mean, rtol=1e-6, atol=0)
        if k == h.num_leaves:  # the dense answer bit for bit
            assert torch.equal(want, m.decode(probs))
            dense = hd.HierarchicalMetric(h, name)
            dense.update(probs, target)
            assert torch.equal(hm.compute(), dense.compute())


@pytest.mark.parametrize("name", NAMES)
def test_cli_decode_takes_top_k_lists(name, tmp_path, capsys):
    from hdecode_torch.cli.main import main

    h, _ = bundled("inat19")
    probs = torch.tensor(model_like(np.random.default_rng(6), h, 12, "confused"), dtype=torch.float32)
    t = probs.topk(25)
    path = tmp_path / "lists.npz"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    assert main(["decode", "--hierarchy", "inat19", "--metric", name, "--probs", str(path)]) == 0
    lines = capsys.readouterr().out.split()
    assert [int(x) for x in lines] == hd.get_metric(name, h).decode(t).tolist()


# ------------------------------------------------------------------------------------------------ memory
def test_a_decode_on_the_100k_tree_never_grows_with_B_times_L(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: the dense (B, L) float32 table alone would be 390 MiB, the structural
    # (N, E) tables of Wu-Palmer per row far more; the support tables are B·k·(D+1) entries
    # measured: 92 (Wu-Palmer), 61 (Zhao) MiB
    assert_growths_below(top_k_growths("wu_palmer_zhao"), 4, 160 * MiB)
