"""Top-k inputs to the heuristic decoders: the node each rule picks on the completed (B, L) distribution
(``TopK.completed``), computed on the list's support, equal to the dense heuristic's node on that table
exactly, ties included (lists of dyadic masses whose completion is dyadic too, so both sums are exact), on
small random trees (unbalanced, single-child chains) and on both bundled trees, under both plans, in
float32 and float64, uniform and prior completions; k = L is the dense answer bit for bit; every entry point
(the class, ``hd.functional``, ``DecodingHead``, the command line) takes the list, confidence_threshold below
1/2 too (its nodes then leave the root path); lca_height's (crm's) ties off the support are the dense rule's; a
decode on a 100k-leaf tree never grows with B × L."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import hdecode_torch.functional as F
from harness import FLOAT_DTYPES, bundled, model_like, random_trees
from memory_testing import MiB, assert_growths_below

#: The heuristics that decode top-k inputs, with their parameters (``info``: information_threshold's threshold
#: as a fraction of a leaf's information log L, the most a tree allows).
CASES = [("argmax_leaf", {}), ("top_down", {}), ("majority", {}), ("confidence_threshold", {"tau": 0.5}),
         ("confidence_threshold", {"tau": 0.75}), ("confidence_threshold", {"tau": 0.95}),
         ("confidence_threshold", {"tau": 0.1}), ("confidence_threshold", {"tau": 0.25}),
         ("confidence_threshold", {"tau": 0.4}), ("crm", {}),
         ("plurality", {}), ("hie", {}), ("darts", {"lam": 0.5}), ("darts", {"lam": 3.0}),
         ("expected_information", {}), ("information_threshold", {"info": 0.25}),
         ("information_threshold", {"info": 0.5}), ("information_threshold", {"info": 1.0})]
#: The rules whose keys are products of masses (or of a mass and a logarithm): computed in float64 on a list.
PRODUCT_KEYS = ("hie", "darts", "expected_information")
PLANS = ["cpu", "cuda"]
#: Masses are multiples of 2^-16: every node sum of the completed table is exact in float32 and float64.
UNITS = 2**16


def _case_id(case):
    name, params = case
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def dyadic_lists(rng, L, B, k, prior=None, weights=None):
    """(values (B, k) float64, indices (B, k) int64): distinct random leaves, masses multiples of 2^-16 and a
    missing mass m = c·U·2^-16 (U the unlisted leaves' weight, c an integer), so each unlisted leaf holds
    c·w(l)·2^-16: a dyadic completion.  c ranges from 0 (missing = 0) to the largest that fits (rows where
    the unlisted mass wins).  ``weights``: (B, L) masses to list the top k of (model-like rows), else random
    leaves with Dirichlet masses, some rows with equal masses (ties)."""
    w = np.ones(L, dtype=np.int64) if prior is None else prior.astype(np.int64)
    if weights is None:
        idx = np.stack([rng.permutation(L)[:k] for _ in range(B)])
    else:
        idx = np.argsort(-weights, axis=1, kind="stable")[:, :k]
    unlisted = w.sum() - w[idx].sum(1)
    out = np.zeros((B, k), dtype=np.int64)
    for b in range(B):
        cmax = UNITS // unlisted[b] if unlisted[b] > 0 else 0
        c = int(rng.choice([0, 1, max(cmax // 8, 0), max(cmax // 2, 0), cmax]))
        rest = UNITS - c * unlisted[b]
        if weights is not None:
            v = weights[b, idx[b]] / weights[b, idx[b]].sum()
        elif rng.random() < 0.25:
            v = np.ones(k) / k
        else:
            v = rng.dirichlet(np.full(k, rng.choice([0.2, 1.0, 5.0])))
        units = np.floor(v * rest).astype(np.int64)
        units[0] += rest - units.sum()
        out[b] = units
    return out / UNITS, idx


def integer_prior(rng, L):
    prior = rng.integers(0, 4, size=L)
    prior[rng.integers(L)] = 3
    return prior


def _params(h, params):
    """The decoder's parameters on ``h`` (``info`` → ``threshold``)."""
    if "info" in params:
        return {"threshold": params["info"] * float(h.information.max())}
    return params


def _decoder(name, h, params):
    return hd.get_decoder(name, h, **_params(h, params))


def _check_equal(h, name, params, vals, idx, prior, dtype, plan):
    L = h.num_leaves
    topk = hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx),
                   prior=None if prior is None else torch.tensor(prior, dtype=torch.float64))
    d = _decoder(name, h, params)
    # the product keys are rounded to float32 on a float32 table (ties that float64 separates): their reference
    # is the float64 table, the same masses
    ref = torch.float64 if name in PRODUCT_KEYS else None
    with hd.plan_for(plan):
        got = d.decode(topk)
        want = d.decode(topk.completed(L, ref))
    assert torch.equal(got, want), (name, params, plan, dtype, torch.nonzero(got != want).flatten().tolist())
    return got


def _off_support(h, idx, pred):
    support = torch.zeros(idx.shape[0], h.num_nodes + 1, dtype=torch.bool)
    support.scatter_(1, h.ancestors[torch.tensor(idx)].reshape(idx.shape[0], -1), True)
    return int((~support.gather(1, pred[:, None])).sum())


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_equals_the_dense_heuristic_on_small_random_trees(case, plan, dtype, completion):
    name, params = case
    rng = np.random.default_rng(23)
    off = 0
    for h, _ in random_trees(7, 30, num_nodes_max=30, unary_prob=0.25):
        L = h.num_leaves
        for k in sorted({1, 2, max(1, L // 2), max(1, L - 1), L}):
            prior = integer_prior(rng, L) if completion == "prior" else None
            vals, idx = dyadic_lists(rng, L, 16, k, prior)
            pred = _check_equal(h, name, params, vals, idx, prior, dtype, plan)
            off += _off_support(h, idx, pred)
    assert off > 0  # the completion's own nodes were chosen, not only listed leaves' ancestors


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_equals_the_dense_heuristic_on_the_bundled_trees(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(5)
    probs = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    prior = integer_prior(rng, h.num_leaves)
    for k in (1, 10, 100):
        for p in (None, prior):
            vals, idx = dyadic_lists(rng, h.num_leaves, probs.shape[0], k, p, weights=probs)
            for name, params in CASES:
                _check_equal(h, name, params, vals, idx, p, dtype, plan)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_k_equal_to_L_is_the_dense_answer_bit_for_bit(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(6)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "confused")]),
                         dtype=dtype)
    t = probs.topk(h.num_leaves)
    for name, params in CASES:
        d = _decoder(name, h, params)
        with hd.plan_for(plan):
            dense = d.decode(probs)
            assert torch.equal(d.decode(t), dense)
            assert torch.equal(d.decode(hd.TopK(t.values, t.indices)), dense)


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_lca_height_breaks_ties_off_the_support_as_the_dense_decoder(plan, completion):
    # crm is lca_height's decoder: its top-k node is the dense one, ties included.  Among off-support leaves of
    # equal expected height the dense rule takes the deeper, then the smaller id; the support kernel took the
    # minimiser under the first child of least g (by child id), and where r = 0 a minimiser of T rather than the
    # deepest leaf (ties only: the same expected height, a shallower or larger-id leaf).
    rng = np.random.default_rng(29)
    ties = 0
    for h, _ in random_trees(7, 30, num_nodes_max=30, unary_prob=0.25):
        L = h.num_leaves
        m = hd.get_metric("lca_height", h)
        for k in sorted({1, 2, max(1, L // 2), max(1, L - 1)}):
            prior = integer_prior(rng, L) if completion == "prior" else None
            vals, idx = dyadic_lists(rng, L, 16, k, prior)
            topk = hd.TopK(torch.tensor(vals), torch.tensor(idx),
                           prior=None if prior is None else torch.tensor(prior, dtype=torch.float64))
            full = topk.completed(L)
            with hd.plan_for(plan):
                got, want = m.decode(topk), m.decode(full)
            assert torch.equal(got, want), torch.nonzero(got != want).flatten().tolist()
            # rows whose best expected height is reached by several leaves: where the tie rule decides
            scores = m.expected(full[:, None, :].expand(-1, L, -1).reshape(-1, L), torch.arange(L).repeat(len(vals)))
            best = scores.view(-1, L).min(1, keepdim=True).values
            ties += int(((scores.view(-1, L) == best).sum(1) > 1).sum())
    assert ties > 50


# ------------------------------------------------------------------------------------------ entry points
def _lists(h, seed=0, k=10):
    rng = np.random.default_rng(seed)
    probs = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    vals, idx = dyadic_lists(rng, h.num_leaves, probs.shape[0], k, weights=probs)
    return hd.TopK(torch.tensor(vals, dtype=torch.float32), torch.tensor(idx))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_every_entry_point_takes_the_list(case):
    name, params = case
    h, _ = bundled("inat19")
    params = _params(h, params)
    topk = _lists(h)
    want = _decoder(name, h, params).decode(topk.completed(h.num_leaves, torch.float64))
    assert torch.equal(_decoder(name, h, params).decode(topk), want)
    assert torch.equal(getattr(F, f"decode_{name}")(topk, h, **params), want)
    assert torch.equal(hd.DecodingHead(h, "tree_distance", decoder=(name, params))(topk), want)
    t = torch.return_types.topk((topk.values, topk.indices))
    assert torch.equal(_decoder(name, h, params).decode(t), want)
    one = _decoder(name, h, params).decode(hd.TopK(topk.values[3], topk.indices[3]))
    assert one.shape == () and one == want[3]
    assert torch.equal(_decoder(name, h, params).decode(topk, chunk_size=5), want)


@pytest.mark.parametrize("case", CASES[1:2] + CASES[6:], ids=_case_id)
def test_hierarchical_metric_scores_a_heuristic_from_the_list(case):
    name, params = case
    h, _ = bundled("inat19")
    decoder = (name, _params(h, params))
    topk = _lists(h, seed=1)
    target = torch.arange(topk.values.shape[0]) % h.num_leaves
    ours = hd.HierarchicalMetric(h, "tree_distance", decoder=decoder)
    ours.update(topk, target)
    dense = hd.HierarchicalMetric(h, "tree_distance", decoder=decoder)
    dense.update(topk.completed(h.num_leaves, torch.float64), target)
    assert torch.equal(ours.compute(), dense.compute())


def test_cli_decodes_a_top_k_file_with_a_heuristic(tmp_path, capsys):
    from hdecode_torch.cli.main import main

    h, _ = bundled("inat19")
    topk = _lists(h, seed=2)
    path = tmp_path / "lists.npz"
    np.savez(path, values=topk.values.numpy(), indices=topk.indices.numpy())
    for name, flag, params in [("top_down", [], {}), ("majority", [], {}), ("argmax_leaf", [], {}),
                               ("confidence_threshold", ["--tau", 0.8], {"tau": 0.8}),
                               ("confidence_threshold", ["--tau", 0.3], {"tau": 0.3}), ("crm", [], {}),
                               ("plurality", [], {}), ("hie", [], {}), ("darts", ["--lam", 1.0], {"lam": 1.0}),
                               ("expected_information", [], {}),
                               ("information_threshold", ["--info-threshold", 2.0], {"threshold": 2.0})]:
        out = tmp_path / "pred.npy"
        try:
            code = main([str(a) for a in ["decode", "--hierarchy", "inat19", "--probs", path, "--decoder", name,
                                          *flag, "--batch-size", 7, "-o", out]])
        except SystemExit as exc:
            code = exc.code
        err = capsys.readouterr().err
        assert code == 0, err
        want = _decoder(name, h, params).decode(topk.completed(h.num_leaves, torch.float64))
        assert torch.equal(torch.from_numpy(np.load(out)), want), name


def test_a_list_is_checked_against_the_tree():
    h, _ = bundled("tieredimagenet-h")
    d = hd.get_decoder("top_down", h)
    L = h.num_leaves
    with pytest.raises(ValueError, match=rf"`indices` to be leaf ids in 0..{L - 1}, but got {L}"):
        d.decode(hd.TopK(torch.tensor([[0.5, 0.2]]), torch.tensor([[3, L]])))
    with pytest.raises(ValueError, match=r"from_logits and normalize do not apply"):
        d.decode(torch.tensor([[0.5, 0.2]]).topk(2), from_logits=True)
    with pytest.raises(ValueError, match=r"`within` is not supported with a top-k input"):
        d.decode(torch.tensor([[0.5, 0.2]]).topk(2), within=0)


# ------------------------------------------------------------------------------------------ memory
def test_a_top_k_decode_never_grows_with_B_times_L(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: the dense (B, L) float32 table alone would be 390 MiB
    assert_growths_below(top_k_growths("heuristics"), 24, 256 * MiB)  # RiskControl's too
