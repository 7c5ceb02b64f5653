"""Top-k inputs (hd.TopK, ``probs.topk(k)``): the decision is the Bayes-optimal one for the completed
distribution (uniform or prior completion), equal by expected score to the dense decoder on the completed
(B, L) table and to brute force over every node, on small random trees (unbalanced, single-child chains),
on both bundled trees, under both plans, in float32 and float64; k = L gives the dense answer bit for bit;
bad lists get errors naming the argument; a top-k decode on a large tree never grows with B × L."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import hdecode_torch as hd
import reference as ref
from harness import FLOAT_DTYPES, bundled, dense_cost, model_like, random_trees, tolerance
from testing import ValuesOnlyMetric
from hdecode_torch.core.topk import CompletedTopK
from memory_testing import MiB, assert_growths_below

#: The metrics that decode top-k inputs, with a parameter grid.
CASES = [("accuracy", {}), ("lca_height", {}), ("tree_distance", {}), ("tree_distance_c", {"c": 0.5}),
         ("tree_distance_c", {"c": 0.0}), ("tree_distance_c", {"c": 2.0})]
PLANS = ["cpu", "cuda"]


def _case_id(case):
    name, params = case
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def _metric(name, h, params):
    if name == "tree_distance_c" and params.get("c", 0) >= 1:
        with pytest.warns(UserWarning, match="at least 1"):
            return hd.get_metric(name, h, **params)
    return hd.get_metric(name, h, **params)


def random_lists(rng, L, B, k, kind="any"):
    """(values (B, k) float64, indices (B, k) int64): distinct random leaves per row, masses of total
    in [0, 1] (often far below 1: a large missing mass moves the optimum off the listed leaves)."""
    idx = np.stack([rng.permutation(L)[:k] for _ in range(B)])
    vals = np.stack([rng.dirichlet(np.full(k, rng.choice([0.2, 1.0, 5.0]))) for _ in range(B)])
    if k < L:
        total = rng.choice([1.0, 0.97, 0.5, 0.1, 0.0], size=B) if kind == "any" else np.ones(B)
        total = np.where(rng.random(B) < 0.3, rng.uniform(0, 1, B), total)
        vals *= total[:, None]
    return vals, idx


def random_prior(rng, L):
    prior = rng.dirichlet(np.ones(L))
    prior[rng.random(L) < 0.3] = 0  # leaves the prior deems impossible
    prior[rng.integers(L)] += 0.1
    return prior


def _brute_force_check(h, info, name, params, topk, pred, rtol):
    """pred is optimal for the completed table: its expected cost against brute force over every node
    (leaves for leaf metrics) with the NumPy cost matrix."""
    q = topk.completed(h.num_leaves, torch.float64).numpy()
    cost = dense_cost(info, name, **params) @ q.T  # (N, B)
    best = (cost[: h.num_leaves] if name in ("accuracy", "lca_height") else cost).min(0)
    got = cost[pred.numpy(), np.arange(q.shape[0])]
    scale = np.maximum(1.0, np.abs(best))
    assert np.all(got <= best + rtol * scale), (name, params, np.flatnonzero(got > best + rtol * scale))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_optimal_on_small_random_trees(case, plan, dtype, completion):
    name, params = case
    rng = np.random.default_rng(17)
    seen_off_support = 0
    for h, info in random_trees(5, 25, num_nodes_max=30, unary_prob=0.25):
        m = _metric(name, h, params)
        L = h.num_leaves
        for k in sorted({1, 2, max(1, L // 2), max(1, L - 1)}):
            vals, idx = random_lists(rng, L, 12, k)
            prior = torch.tensor(random_prior(rng, L)) if completion == "prior" else None
            if prior is not None:
                # rows whose unlisted leaves all have prior 0 cannot hold missing mass: list it as missing = 0
                full = ((prior.numpy() > 0).sum() - (prior.numpy()[idx] > 0).sum(1)) == 0
                vals[full] = rng.dirichlet(np.ones(k), size=int(full.sum()))
            topk = hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx), prior=prior)
            with hd.plan_for(plan):
                pred = m.decode(topk)
                dense_pred = m.decode(topk.completed(L))
                got = m.expected(topk, pred)
            full = topk.completed(L, torch.float64)
            ours, theirs = m.expected(full, pred), m.expected(full, dense_pred)
            tol = tolerance(dtype)
            sign = 1 if m.higher_is_better else -1
            assert torch.all(sign * (ours - theirs) >= -tol * theirs.abs().clamp_min(1)), (name, L, k)
            torch.testing.assert_close(got, ours.to(got.dtype), rtol=tol, atol=tol)
            _brute_force_check(h, info, name, params, topk, pred, 1e-9)
            anc = h.ancestors
            support = torch.zeros(12, h.num_nodes + 1, dtype=torch.bool)
            support.scatter_(1, anc[torch.tensor(idx)].reshape(12, -1), True)
            seen_off_support += int((~support.gather(1, pred[:, None])).sum())
    if name != "tree_distance_c" or params["c"] < 1:
        assert seen_off_support > 0  # the completion's own optimum was exercised


@given(seed=st.integers(0, 2**31 - 1), k_frac=st.floats(0, 1), scale=st.sampled_from([1.0, 0.6, 0.05]))
def test_hypothesis_trees_and_lists(seed, k_frac, scale):
    rng = np.random.default_rng(seed)
    par = ref.random_tree(rng, num_nodes_max=int(rng.integers(2, 20)), unary_prob=0.3, min_leaves=1)
    h, info = hd.Hierarchy.from_parents(par), ref.TreeInfo(par)
    L = h.num_leaves
    k = 1 + int(k_frac * (L - 1))
    idx = np.stack([rng.permutation(L)[:k] for _ in range(4)])
    vals = rng.dirichlet(np.ones(k), size=4) * (scale if k < L else 1.0)
    topk = hd.TopK(torch.tensor(vals), torch.tensor(idx))
    for name, params in CASES[:5]:
        m = hd.get_metric(name, h, **params)
        _brute_force_check(h, info, name, params, topk, m.decode(topk), 1e-9)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bundled_trees_match_the_dense_decoder(tree, plan, dtype):
    h, info = bundled(tree)
    rng = np.random.default_rng(3)
    probs = np.concatenate([model_like(rng, h, 16, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    probs = torch.tensor(probs, dtype=dtype)
    prior = torch.tensor(random_prior(rng, h.num_leaves))
    for k in (1, 10, 100):
        t = probs.topk(k)
        scale = torch.tensor(rng.choice([1.0, 0.5, 0.1], size=probs.shape[0]), dtype=dtype)[:, None]
        for topk in (hd.TopK(t.values, t.indices), hd.TopK(t.values * scale, t.indices, prior=prior)):
            full = topk.completed(h.num_leaves, torch.float64)
            for name, params in CASES[:5]:
                m = hd.get_metric(name, h, **params)
                with hd.plan_for(plan):
                    pred, dense_pred = m.decode(topk), m.decode(topk.completed(h.num_leaves))
                ours, theirs = m.expected(full, pred), m.expected(full, dense_pred)
                sign = 1 if m.higher_is_better else -1
                tol = tolerance(dtype)
                assert torch.all(sign * (ours - theirs) >= -tol * theirs.abs().clamp_min(1)), (name, k)
                torch.testing.assert_close(m.expected(topk, pred), ours.to(m.expected(topk, pred).dtype),
                                           rtol=tol, atol=tol)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_k_equal_to_L_is_the_dense_answer_bit_for_bit(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(4)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "confused")]),
                         dtype=dtype)
    t = probs.topk(h.num_leaves)
    for name, params in CASES[:5]:
        m = hd.get_metric(name, h, **params)
        with hd.plan_for(plan):
            dense = m.decode(probs)
            assert torch.equal(m.decode(t), dense)
            assert torch.equal(m.decode(hd.TopK(t.values, t.indices)), dense)
            assert torch.equal(m.expected(t, dense), m.expected(probs, dense))


@pytest.mark.parametrize("case", CASES[:5], ids=_case_id)
def test_support_path_with_every_leaf_listed(case):
    # k = L is decoded as the dense table; the support kernels themselves, with nothing unlisted (r = 0),
    # still give an optimal decision
    name, params = case
    h, info = bundled("tieredimagenet-h")
    rng = np.random.default_rng(5)
    probs = torch.tensor(model_like(rng, h, 16, "confused"))
    topk = hd.TopK(*probs.topk(h.num_leaves))
    m = hd.get_metric(name, h, **params)
    ct = CompletedTopK(h, topk)
    pred = m._decode_topk(ct)
    ours, theirs = m.expected(probs, pred), m.expected(probs, m.decode(probs))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m._expected_topk(ct, pred), ours, rtol=1e-12, atol=1e-12)


def test_topk_result_and_unbatched_rows():
    h, _ = bundled("tieredimagenet-h")
    probs = torch.tensor(model_like(np.random.default_rng(6), h, 4, "diffuse"))
    for name, params in CASES[:5]:
        m = hd.get_metric(name, h, **params)
        t = probs.topk(20)
        batched = m.decode(t)
        assert batched.shape == (4,) and batched.dtype == torch.long
        assert torch.equal(m.decode(hd.TopK(t.values, t.indices)), batched)
        one = m.decode(probs[1].topk(20))
        assert one.shape == () and one == batched[1]
        e = m.expected(probs[1].topk(20), one)
        assert e.shape == () and e == m.expected(t, batched)[1]


def test_completed_table():
    values = torch.tensor([[0.5, 0.2], [0.1, 0.0]])
    indices = torch.tensor([[3, 0], [1, 2]])
    full = hd.TopK(values, indices).completed(5)
    torch.testing.assert_close(full, torch.tensor([[0.2, 0.1, 0.1, 0.5, 0.1], [0.3, 0.1, 0.0, 0.3, 0.3]]))
    prior = torch.tensor([0.0, 1.0, 1.0, 2.0, 0.0])
    full = hd.TopK(values, indices, prior=prior).completed(5, torch.float64)
    torch.testing.assert_close(full, torch.tensor([[0.2, 0.15, 0.15, 0.5, 0.0], [0.0, 0.1, 0.0, 0.9, 0.0]],
                                                  dtype=torch.float64))
    full = hd.TopK(values, indices, missing=torch.tensor([0.3, 0.9])).completed(5, torch.float64)
    assert full.sum(1).tolist() == pytest.approx([1.0, 1.0])


def test_chunks_give_the_same_answer():
    h, _ = bundled("inat19")
    probs = torch.tensor(model_like(np.random.default_rng(8), h, 40, "confused"))
    topk = hd.TopK(*probs.topk(7))
    for name, params in CASES[:5]:
        m = hd.get_metric(name, h, **params)
        assert torch.equal(m.decode(topk, chunk_size=3), m.decode(topk))


# ------------------------------------------------------------------------------------------ errors
@pytest.fixture
def tree():
    return bundled("tieredimagenet-h")[0]


@pytest.mark.parametrize("values,indices,kwargs,match", [
    ([[0.5, 0.2]], [[3, 3]], {}, r"`indices` to be distinct within each row, but row 0"),
    ([[0.5, -0.2]], [[3, 4]], {}, r"`values` to be non-negative"),
    ([[0.5, float("nan")]], [[3, 4]], {}, r"`values` to be finite"),
    ([[0.5, 0.2]], [[3]], {}, r"`indices` to have the shape of `values`"),
    ([[0.5, 0.2]], [[3.0, 4.0]], {}, r"`indices` to hold integer leaf ids"),
    ([[1, 0]], [[3, 4]], {}, r"`values` to be a floating-point tensor"),
    (torch.zeros(2, 0), torch.zeros(2, 0, dtype=torch.long), {}, r"at least one leaf per row"),
    ([[[0.5]]], [[[3]]], {}, r"`values` to have shape \(B, k\) or \(k,\)"),
    ([[0.5, 0.2]], [[3, 4]], {"missing": -0.1}, r"`missing` to be finite and >= 0"),
    ([[0.5, 0.2]], [[3, 4]], {"missing": torch.ones(3)}, r"`missing` to be a float or have shape \(1,\)"),
    ([[0.5, 0.2]], [[3, 4]], {"prior": torch.ones(2, 2)}, r"`prior` to have shape \(L,\)"),
])
def test_bad_lists_are_refused_at_construction(values, indices, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        hd.TopK(torch.as_tensor(values) if not isinstance(values, torch.Tensor) else values,
                torch.as_tensor(indices) if not isinstance(indices, torch.Tensor) else indices, **kwargs)


def test_bad_lists_for_a_hierarchy_are_refused(tree):
    m = hd.get_metric("tree_distance", tree)
    L = tree.num_leaves
    with pytest.raises(ValueError, match=rf"`indices` to be leaf ids in 0..{L - 1}, but got {L}"):
        m.decode(hd.TopK(torch.tensor([[0.5, 0.2]]), torch.tensor([[3, L]])))
    with pytest.raises(ValueError, match=rf"at most L = {L} leaves per row"):
        m.decode(hd.TopK(torch.full((1, L + 1), 1.0 / (L + 1)), torch.arange(L + 1)[None]))
    with pytest.raises(ValueError, match=r"`values` of each row to sum to at most 1 .* row 1 sums to 1.2"):
        m.decode(hd.TopK(torch.tensor([[0.5, 0.2], [0.7, 0.5]]), torch.tensor([[3, 4], [3, 4]])))
    with pytest.raises(ValueError, match=r"`values` \+ `missing` to sum to 1 .* row 0 sums to 0.8"):
        m.decode(hd.TopK(torch.tensor([[0.5, 0.2]]), torch.tensor([[3, 4]]), missing=0.1))
    full = torch.full((1, L), 0.5 / L, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"sum to 1 when every leaf is listed \(k = L = {L}\), but row 0 sums to 0.5"):
        m.decode(full.topk(L))
    with pytest.raises(ValueError, match=rf"`prior` to have {L} entries"):
        m.decode(hd.TopK(torch.tensor([[0.5, 0.2]]), torch.tensor([[3, 4]]), prior=torch.ones(3)))
    prior = torch.zeros(L)
    prior[[3, 4]] = 1
    with pytest.raises(ValueError, match=r"`prior` to give positive mass to the unlisted leaves"):
        m.decode(hd.TopK(torch.tensor([[0.5, 0.2]]), torch.tensor([[3, 4]]), prior=prior))
    # no missing mass, nothing to spread: accepted
    assert m.decode(hd.TopK(torch.tensor([[0.5, 0.5]]), torch.tensor([[3, 4]]), prior=prior)).shape == (1,)
    with pytest.raises(ValueError, match=r"from_logits and normalize do not apply"):
        m.decode(torch.tensor([[0.5, 0.2]]).topk(2), from_logits=True)
    with pytest.raises(ValueError, match=r"`within` is not supported with a top-k input"):
        m.decode(torch.tensor([[0.5, 0.2]]).topk(2), within=0)
    with pytest.raises(ValueError, match=r"Expected `pred` to have shape \(1,\)"):
        m.expected(torch.tensor([[0.5, 0.2]]).topk(2), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"node ids"):
        m.expected(torch.tensor([[0.5, 0.2]]).topk(2), torch.tensor([tree.num_nodes]))


def test_metrics_without_a_top_k_decoder_say_so(tree):
    # every built-in metric decodes top-k lists (a cost matrix too); a user's metric given by its values alone
    # is decoded through its dense (N, L) matrix and names itself
    assert set(hd.core.topk.TOPK_METRICS) == set(hd.list_metrics()) | {"cost_matrix"}
    m = ValuesOnlyMetric(tree)
    topk = torch.tensor([[0.5, 0.2]]).topk(2)
    with pytest.raises(ValueError, match=r"`values_only` does not decode top-k inputs \(accuracy, "):
        m.decode(topk)
    with pytest.raises(ValueError, match=r"`values_only` does not decode top-k inputs"):
        m.expected(topk, torch.tensor([tree.root]))


def test_benchmark_runs_and_checks_its_decisions(tmp_path):
    import json

    from benchmarks import topk as bench

    path = tmp_path / "topk.json"
    assert bench.main(["--trees", "synthetic-tiny", "--rows", "8", "--ks", "3", "--repeats", "1",
                       "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"][0]["results"]
    assert [r["metric"] for r in rows] == bench.METRICS
    assert all(r["agrees"] and r["dense_us"] > 0 and r["topk_us"] > 0 for r in rows)


def test_heuristics_refuse_a_top_k_input_by_name(tree):
    # every registered heuristic decodes top-k lists (tests/test_topk_heuristics.py); the optimal decoder of a
    # metric without a top-k decoder names the metric
    with pytest.raises(ValueError, match=r"`values_only` does not decode top-k inputs"):
        hd.get_decoder("optimal", tree, metric=ValuesOnlyMetric(tree)).decode(torch.tensor([[0.5, 0.2]]).topk(2))


# ------------------------------------------------------------------------------------------ memory
def test_a_top_k_decode_never_grows_with_B_times_L(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: the dense (B, L) float32 table alone would be 390 MiB; the support
    # tables are B·k·(D+1) entries (benchmarks/README.md: the same on a 1M-node tree)
    assert_growths_below(top_k_growths("metrics"), 8, 256 * MiB)
    assert_growths_below(top_k_growths("budget"), 2, 40 * MiB)  # at a 32 MiB budget
