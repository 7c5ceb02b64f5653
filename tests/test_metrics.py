"""Every metric against the plain reference implementation (tests/reference.py)."""

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from harness import (
    baseline, batch, benchmark_baselines, bundled, heuristic_names, metric_cases, metric_names, metric_pairs,
    model_like, oracle, random_trees, silence_root_threshold, tolerance,
)
from testing import Tester, grid, tensor


def _ref_set(info, mask):
    return np.asarray(mask, dtype=bool)


def test_registry_is_covered():
    """Every registered metric and decoder has a reference implementation (so the harness tests it), and
    every heuristic its facts in the harness."""
    assert metric_names() and heuristic_names()
    for name in metric_names():
        assert name in ref.METRICS, f"metric {name!r} has no reference implementation in tests/reference.py"
        assert oracle(name) is ref.METRICS[name][2] and callable(baseline(name, "metric")), name  # its hooks
        cls = hd.metrics.metric_class(name)
        assert cls.kind == ref.metric_kind(name) and cls.higher_is_better == ref.higher_is_better(name)
    info = ref.TreeInfo(ref.full_tree(2, 2))
    for name in heuristic_names():
        assert name in ref.HEURISTICS, f"decoder {name!r} has no reference implementation in tests/reference.py"
        cls = hd.decoders.decoder_class(name)
        assert cls.kind in ("leaf", "node") and isinstance(cls.exact_on_dyadic, bool), name  # the facts declared
        p = np.full(info.L, 1.0 / info.L)  # the reference runs it and formulates its candidates
        assert ref.heuristic(name, info, p) in ref.heuristic_candidates(name, info, p), name
        assert baseline(name)(benchmark_baselines(info), p) == ref.heuristic(name, info, p), name  # its hook


@pytest.mark.parametrize("name,params", list(metric_cases()))
@grid()
def test_values_and_expected_on_random_trees(name, params, plan, device, dtype):
    tester = Tester(plan, device, dtype)
    rng = np.random.default_rng(sum(map(ord, name)))
    rtol = 1e-10 if dtype == torch.float64 else tolerance(dtype)
    atol = 1e-12 if dtype == torch.float64 else rtol  # sums of O(depth) terms cancel near 0
    for h, info in random_trees(1, 25 if dtype == torch.float64 else 8, num_nodes_max=13):
        h = h.to(device)
        m = hd.get_metric(name, h, **params)
        B = 12
        P = tester.rows(batch(rng, B, info.L)).double().cpu().numpy()  # the rounded rows are the input
        y = rng.integers(0, info.L, B)
        pred = rng.integers(0, info.N, B)
        # values are computed in float64 and cast once: exact up to the rounding of `dtype`
        vtol = 1e-12 if dtype == torch.float64 else torch.finfo(dtype).eps
        got = m(tensor(pred, torch.long, device), tensor(y, torch.long, device), dtype=dtype).cpu().numpy()
        assert got.dtype == (np.float64 if dtype == torch.float64 else np.float32)
        want = [ref.metric_value(info, name, int(pred[b]), int(y[b]), **params) for b in range(B)]
        np.testing.assert_allclose(got, want, rtol=vtol, atol=1e-12)
        e = tester.expected(h, name, P, pred, **params).numpy()
        assert e.dtype == (np.float64 if dtype == torch.float64 else np.float32)
        e_want = [ref.expected(info, name, P[b], int(pred[b]), **params) for b in range(B)]
        np.testing.assert_allclose(e, e_want, rtol=rtol, atol=atol)
        if m.kind == "set":
            masks = rng.random((B, info.N)) < 0.4
            got = m(tensor(masks, torch.bool, device), tensor(y, torch.long, device), dtype=dtype)
            assert got.dtype == dtype
            want = [ref.metric_value(info, name, masks[b], int(y[b]), **params) for b in range(B)]
            np.testing.assert_allclose(got.cpu().numpy(), want, rtol=vtol, atol=1e-12)
            e = tester.expected(h, name, P, masks, **params).numpy()
            e_want = [ref.expected(info, name, P[b], masks[b], **params) for b in range(B)]
            np.testing.assert_allclose(e, e_want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("name,params", list(metric_cases()))
def test_values_and_expected_on_bundled_trees(tree, name, params):
    h, info = bundled(tree)
    rng = np.random.default_rng(3)
    m = hd.get_metric(name, h, **params)
    B = 6
    P = model_like(rng, h, B, "confused")
    y = rng.integers(0, info.L, B)
    pred = np.concatenate([rng.integers(0, info.N, B - 2), y[:1], [h.root]])
    got = m(torch.as_tensor(pred), torch.as_tensor(y), dtype=torch.float64).numpy()
    want = [ref.metric_value(info, name, int(pred[b]), int(y[b]), **params) for b in range(B)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    e = m.expected(torch.as_tensor(P), torch.as_tensor(pred)).numpy()
    e_want = [ref.expected(info, name, P[b], int(pred[b]), **params) for b in range(B)]
    np.testing.assert_allclose(e, e_want, rtol=1e-9, atol=1e-12)


def test_known_values():
    # A chain of depth 8 ending in two sibling leaves at depth 9.
    parents = {f"n{i}": [f"n{i + 1}"] for i in range(8)}
    parents["n8"] = ["a", "b"]
    h = hd.Hierarchy.from_dict(parents, leaf_order=["a", "b"])
    a, b = torch.tensor([0]), torch.tensor([1])
    assert hd.get_metric("wu_palmer", h)(a, b).item() == pytest.approx(8 / 9)
    assert hd.get_metric("tree_distance", h)(a, b).item() == 2
    assert hd.get_metric("mistake_severity", h)(a, a).item() == 0
    assert hd.get_metric("lca_height", h)(a, b).item() == 1
    assert hd.get_metric("hf_beta", h, beta=1.0)(a, b).item() == pytest.approx(0.9)
    assert hd.get_metric("jaccard", h)(a, b).item() == pytest.approx(9 / 11)
    assert hd.get_metric("hamming", h)(a, b).item() == pytest.approx(2 / 10)
    root = torch.tensor([h.root])
    assert hd.get_metric("wu_palmer", h)(root, b).item() == 0
    assert hd.get_metric("tree_distance_c", h, c=0.5)(root, b).item() == 9


def test_wu_palmer_and_zhao_match_dense_cost():
    h, info = bundled("tieredimagenet-h")
    nodes = torch.arange(h.num_nodes).repeat_interleave(h.num_leaves)
    leaves = torch.arange(h.num_leaves).repeat(h.num_nodes)
    for name in ("wu_palmer", "zhao"):
        got = hd.get_metric(name, h)(nodes, leaves, dtype=torch.float64).view(h.num_nodes, h.num_leaves).numpy()
        want = 1 - ref.dense_cost(info, name)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_cost_matrix_metric_equals_builtin():
    h, info = bundled("inat19")
    rng = np.random.default_rng(0)
    cost = ref.dense_cost(info, "tree_distance")
    m = hd.CostMatrixMetric(h, cost)
    P = torch.as_tensor(model_like(rng, h, 5, "diffuse"))
    pred = torch.as_tensor(rng.integers(0, h.num_nodes, 5))
    builtin = hd.get_metric("tree_distance", h)
    torch.testing.assert_close(m.expected(P, pred), builtin.expected(P, pred))
    assert torch.equal(m(pred, torch.arange(5)), builtin(pred, torch.arange(5)))


def test_node_probabilities_match_reference():
    for h, info in random_trees(5, 30):
        rng = np.random.default_rng(1)
        P = batch(rng, 7, info.L)
        got = hd.node_probabilities(h, torch.as_tensor(P)).numpy()
        want = np.stack([ref.node_probs(info, p) for p in P])
        np.testing.assert_allclose(got, want, atol=1e-12)
        one = hd.node_probabilities(h, torch.as_tensor(P[0]))
        assert one.shape == (info.N,)


@silence_root_threshold  # metric_pairs holds c >= 1
def test_value_and_expected_dtypes():
    """Values of node ids: computed in float64, returned in torch's default dtype unless ``dtype=`` asks;
    expected values: in the probabilities' compute dtype (float64 kept, float32 otherwise)."""
    h, info = bundled("tieredimagenet-h")
    rng = np.random.default_rng(7)
    P = torch.as_tensor(model_like(rng, h, 6, "confused"))
    y = torch.as_tensor(rng.integers(0, h.num_leaves, 6))
    for name, params in metric_pairs():
        m = hd.get_metric(name, h, **params)
        pred = m.decode(P)
        exact = m(pred, y, dtype=torch.float64)
        assert exact.dtype == torch.float64, name
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            assert torch.equal(m(pred, y, dtype=dtype), exact.to(dtype)), (name, dtype)  # one rounding
        assert torch.equal(m(pred, y), exact.to(torch.float32)), name
        default = torch.get_default_dtype()
        try:
            torch.set_default_dtype(torch.float64)
            assert torch.equal(m(pred, y), exact), name
        finally:
            torch.set_default_dtype(default)
        for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            e = m.expected(P.to(dtype), pred)
            assert e.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), (name, dtype)
        with pytest.raises(TypeError, match="`dtype`"):
            m(pred, y, dtype=torch.int64)
        with pytest.raises(TypeError, match="`dtype`"):
            m(pred, y, dtype="float64")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_node_probabilities_dtypes(dtype):
    h, _ = bundled("tieredimagenet-h")
    P = torch.softmax(torch.randn(9, h.num_leaves, dtype=torch.float64), 1)
    out = hd.node_probabilities(h, P.to(dtype))
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    torch.testing.assert_close(out[:, h.root], torch.ones(9, dtype=out.dtype), atol=1e-2, rtol=0)
    ref_out = hd.node_probabilities(h, P.to(dtype).to(torch.float64), validate=False)
    torch.testing.assert_close(out.to(torch.float64), ref_out, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- parameters and gradients
def _confused(h, rows=64):
    """float32 rows of a model confused between siblings and cousins."""
    return torch.as_tensor(model_like(np.random.default_rng(0), h, rows, "confused"), dtype=torch.float32)


def test_tree_distance_c_default_is_not_degenerate():
    tiered = bundled("tieredimagenet-h")[0]
    probs = _confused(tiered)
    m = hd.get_metric("tree_distance_c", tiered)
    assert m.c == 0.5
    assert (m.decode(probs) != tiered.root).any()  # c = 1 made the root the answer for every row
    with pytest.warns(UserWarning, match="c = 1 >= 1.*root for every input"):
        hd.get_metric("tree_distance_c", tiered, c=1.0)


def test_a_huge_beta_is_a_clear_error_not_an_overflow():
    tiered = bundled("tieredimagenet-h")[0]
    probs = _confused(tiered)
    with pytest.raises(ValueError, match=r"`beta` to be a float in \(0, 1e\+150\]"):
        hd.get_metric("hf_beta", tiered, beta=1e300)
    sets = hd.get_metric("hf_beta", tiered, beta=1e100).decode(probs[:2])  # recall: the whole tree wins
    assert sets.shape == (2, tiered.num_nodes) and bool(sets[:, tiered.root].all())


def test_expected_values_keep_their_gradient_on_both_plans():
    tiered = bundled("tieredimagenet-h")[0]
    x = torch.softmax(torch.randn(3, tiered.num_leaves, dtype=torch.float64), 1).requires_grad_()
    m = hd.get_metric("zhao", tiered)
    pred = torch.tensor([3, 700, tiered.root])
    grads = []
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            (g,) = torch.autograd.grad(m.expected(x, pred).sum(), x)
        grads.append(g)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-12)
    assert grads[0].abs().sum() > 0
