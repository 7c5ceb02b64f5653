"""The certificate of a top-k decision (``decode(topk, certify=True)``) against adversarial completions.

On small random trees (unbalanced, single-child chains), every vertex of the polytope of completions the
list is consistent with (⌊m/c⌋ unlisted leaves at the cap c = max(v_k, m/|U|), one at the remainder, the
rest 0: a linear objective's extremes over the polytope are at its vertices) is decoded by brute force
over every node with the reference's cost matrix: a certified row's decision must be optimal at every
vertex, and the regret bound must be at least the regret at every vertex.  Both plans, uniform and prior
completions, lists that are a distribution's top k and lists that are not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from harness import random_trees
from memory_testing import MiB, assert_growths_below

CASES = [("accuracy", {}), ("lca_height", {}), ("tree_distance", {}), ("tree_distance_c", {"c": 0.5})]
PLANS = ["cpu", "cuda"]
TOL = 1e-9
_COST = {}


def _case_id(case):
    name, params = case
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def _cost(info, name, params):
    """(N, L) reference costs (1 − value for accuracy), cached per tree."""
    key = (tuple(np.asarray(info.parents).tolist()), name, tuple(sorted(params.items())))
    if key not in _COST:
        _COST[key] = ref.cost_matrix(info, name, **params)
    return _COST[key]


def vertices(L, indices, values, missing):
    """(V, L) float64 every vertex of the row's polytope of completions (listed leaves at their values)."""
    unlisted = sorted(set(range(L)) - set(indices.tolist()))
    base = np.zeros(L)
    base[indices] = values
    if not unlisted:
        return base[None]
    m = float(missing)
    cap = max(float(values.min()), m / len(unlisted))
    if m <= 0 or cap <= 0:
        return base[None]
    full = min(int(np.floor(m / cap + 1e-12)), len(unlisted))
    rest = max(m - full * cap, 0.0)
    out = []
    for chosen in itertools.combinations(unlisted, full):
        others = [u for u in unlisted if u not in chosen] if rest > 1e-15 else [None]
        for r in others:
            q = base.copy()
            q[list(chosen)] = cap
            if r is not None:
                q[r] = rest
            out.append(q)
    return np.stack(out)


def regrets(info, name, params, q, pred):
    """(V,) the regret of pred at each completion q (V, L): its expected cost minus the best over every
    node (every leaf for a leaf metric)."""
    cost = _cost(info, name, params)
    exp = q @ cost.T  # (V, N)
    cands = exp[:, : info.L] if ref.metric_kind(name) == "leaf" else exp
    return exp[:, pred] - cands.min(1)


def rows(rng, L, B):
    """(values (B, k), indices (B, k), missing (B,) or None), k drawn: the top k of peaked, flat and sparse
    distributions, and (half the time) random leaves with masses of total below 1 (not any distribution's
    top k: the cap is then raised to m/|U| where m cannot fit under v_k)."""
    k = int(rng.integers(1, L + 1))
    kinds = ["peaked", "dirichlet", "uniform", "sparse", "onehot"]
    if rng.random() < 0.5 or k == L:
        p = np.stack([ref.random_distribution(rng, L, kinds[i % len(kinds)]) for i in range(B)])
        top = torch.from_numpy(p).topk(k)
        return top.values, top.indices, None
    idx = torch.from_numpy(np.stack([rng.permutation(L)[:k] for _ in range(B)]))
    vals = np.stack([rng.dirichlet(np.full(k, 0.5)) for _ in range(B)]) * rng.uniform(0.3, 1.0, (B, 1))
    vals = torch.from_numpy(vals).sort(1, descending=True).values
    return vals, idx, torch.from_numpy(1 - vals.sum(1).numpy())


def _check_rows(info, name, params, topk, pred, certified, bound):
    L = info.L
    m = topk.missing_mass().numpy()
    for b in range(pred.shape[0]):
        q = vertices(L, topk.indices[b].numpy(), topk.values[b].numpy(), m[b])
        r = regrets(info, name, params, q, int(pred[b]))
        if certified[b]:
            assert r.max() <= TOL, (name, b, r.max())
            assert float(bound[b]) == 0
        assert float(bound[b]) >= r.max() - TOL, (name, b, float(bound[b]), r.max())


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_certificate_never_beaten(case, plan):
    name, params = case
    rng = np.random.default_rng(35)
    seen = []
    for h, info in random_trees(350, 25, num_nodes_max=13):
        m = hd.get_metric(name, h, **params)
        for prior in (None, "prior"):
            vals, idx, missing = rows(rng, h.num_leaves, 6)
            if prior is not None:
                w = rng.dirichlet(np.ones(h.num_leaves)) + 0.01
                topk = hd.TopK(vals, idx, missing, prior=torch.from_numpy(w))
            else:
                topk = hd.TopK(vals, idx, missing)
            with hd.plan_for(plan):
                pred, certified, bound = m.decode(topk, certify=True)
                assert torch.equal(pred, m.decode(topk))
            assert certified.dtype == torch.bool and bound.dtype == torch.float64
            assert torch.equal(certified, bound == 0)  # a positive bound: some completion beats pred
            _check_rows(info, name, params, topk, pred, certified, bound)
            seen.append(certified)
    frac = torch.cat(seen).to(torch.float64).mean().item()
    assert 0 < frac < 1, frac


@pytest.mark.parametrize("case", CASES[1:], ids=_case_id)
def test_fraction_certified_between_peaked_and_flat(case):
    """A distribution's top k: peaked rows are certified, flat ones are not, on a bundled tree."""
    name, params = case
    h = hd.load_hierarchy("tieredimagenet-h")
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, h.num_leaves, generator=g, dtype=torch.float64)
    logits[:32, 0] += 30  # peaked: one leaf holds nearly all the mass
    top = torch.softmax(logits, 1).topk(10)
    _, certified, bound = hd.get_metric(name, h, **params).decode(top, certify=True)
    assert certified[:32].all()
    assert not certified[32:].all()
    assert (bound[32:] > 0).any()


def test_accuracy_of_a_top_k_list_is_always_certified():
    """No unlisted leaf can outweigh the k-th listed one, so the top listed leaf is the argmax of every
    completion; a list whose missing mass cannot fit under v_k (not a top k) may not be."""
    h, info = next(random_trees(7, 1, num_nodes_max=14, min_leaves=6))
    rng = np.random.default_rng(0)
    p = torch.from_numpy(np.stack([ref.random_distribution(rng, h.num_leaves, "dirichlet") for _ in range(32)]))
    acc = hd.get_metric("accuracy", h)
    for k in range(1, h.num_leaves + 1):
        _, certified, bound = acc.decode(p.topk(k), certify=True)
        assert certified.all() and (bound == 0).all()
    vals = torch.tensor([[0.2, 0.1]], dtype=torch.float64)
    lists = hd.TopK(vals, torch.tensor([[0, 1]]))  # m = 0.7 over L − 2 leaves: each may hold 0.7 / (L − 2)
    pred, certified, bound = acc.decode(lists, certify=True)
    cap = 0.7 / (h.num_leaves - 2)
    assert int(pred) == 0 and bool(certified[0]) == (cap <= 0.2)
    assert float(bound[0]) == pytest.approx(max(0.0, min(0.7, cap) - 0.2), abs=1e-15)
    _check_rows(info, "accuracy", {}, lists, pred, certified, bound)


def test_unbatched_and_k_equal_l():
    h = hd.load_hierarchy("tieredimagenet-h")
    p = torch.softmax(torch.randn(h.num_leaves, generator=torch.Generator().manual_seed(1)) * 4, 0)
    for name in ("accuracy", "lca_height", "tree_distance"):
        m = hd.get_metric(name, h)
        pred, certified, bound = m.decode(p.topk(5), certify=True)
        assert pred.shape == certified.shape == bound.shape == ()
        assert torch.equal(pred, m.decode(p.topk(5)))
        # every leaf listed: the completion is the list itself, its exact decision certified
        pred, certified, bound = m.decode(p.topk(h.num_leaves), certify=True)
        assert torch.equal(pred, m.decode(p)) and bool(certified) and float(bound) == 0


def test_chunks_give_the_same_certificate():
    h = hd.load_hierarchy("inat19")
    p = torch.softmax(torch.randn(40, h.num_leaves, generator=torch.Generator().manual_seed(2)) * 3, 1)
    for name in ("lca_height", "tree_distance_c"):
        m = hd.get_metric(name, h)
        whole = m.decode(p.topk(20), certify=True)
        parts = m.decode(p.topk(20), certify=True, chunk_size=7)
        for a, b in zip(whole, parts):
            assert torch.equal(a, b)


def test_certify_needs_a_top_k_input():
    h = hd.load_hierarchy("tieredimagenet-h")
    p = torch.softmax(torch.randn(3, h.num_leaves), 1)
    with pytest.raises(ValueError, match=r"top-k input.*`certify=True`"):
        hd.get_metric("tree_distance", h).decode(p, certify=True)
    cost = torch.rand(h.num_nodes, h.num_leaves, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"`cost_matrix` gives no certificate of a top-k decision"):
        hd.get_metric("cost_matrix", h, cost=cost).decode(p.topk(5), certify=True)
    with pytest.raises(ValueError, match=r"`hf_beta` gives no certificate of a top-k decision"):
        hd.get_metric("hf_beta", h).decode(p.topk(5), certify=True)


def test_benchmark_runs(tmp_path):
    from benchmarks import topk_certificate as bench

    out = tmp_path / "cert.json"
    assert bench.main(["--trees", "tieredimagenet-h", "--rows", "8", "--ks", "1", "50", "--repeats", "1",
                       "--json", str(out)]) == 0
    import json
    rows = json.loads(out.read_text())["results"][0]["results"]
    assert {(r["metric"], r["k"]) for r in rows} == {(m, k) for m in bench.METRICS for k in (1, 50)}
    assert all(0 <= r["certified"] <= 1 and r["same_pred"] for r in rows)
    assert all(r["certified"] == 1 for r in rows if r["metric"] == "accuracy")


def test_a_certificate_never_grows_with_B_times_L(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: the dense (B, L) float32 table alone would be 390 MiB; the certificate
    # reads the same support tables as the decode, plus the decision's path and its off-path children
    assert_growths_below(top_k_growths("certificate"), 6, 256 * MiB)
