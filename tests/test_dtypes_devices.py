"""Dtypes and devices.

- float16 / bfloat16 probabilities are checked with their own row-sum tolerance, then decided
  in float32; float32 stays float32 and float64 stays float64;
- integer / bool / complex probabilities are a TypeError, NaN / inf a ValueError, in every dtype;
- the work runs on the probabilities' device: the hierarchy is moved there (one cached copy
  per device), and ``pred`` too (``expected``); ``m(pred, target)`` runs on ``pred``'s device and
  moves ``target`` there.  Outputs live on that device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from hdecode_torch import Hierarchy
from harness import ALL_FLOAT_DTYPES, bundled, heuristic_pairs, metric_pairs, model_like

HALF = [torch.float16, torch.bfloat16]
METRICS = metric_pairs(decodable=True, full=False)
HEURISTICS = heuristic_pairs(full=False)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def tree():
    return bundled("inat19")[0]


@pytest.fixture(scope="module")
def probs(tree):
    rng = np.random.default_rng(0)
    return torch.as_tensor(np.concatenate([model_like(rng, tree, 4, k) for k in ("peaked", "diffuse", "confused")]))


def _all_decoders(h):
    for name, params in METRICS:
        yield name, hd.get_metric(name, h, **params)
    for name, params in HEURISTICS:
        yield name, hd.get_decoder(name, h, **params)


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_is_decided_in_float32(tree, probs, dtype):
    x = probs.to(dtype)
    up = x.float()  # exactly what the library computes with
    node = hd.node_probabilities(tree, x)
    assert node.dtype == torch.float32
    assert torch.equal(node, hd.node_probabilities(tree, up, validate=False))
    for name, dec in _all_decoders(tree):
        out = dec.decode(x)
        assert torch.equal(out, dec.decode(up, validate=False)), name
    for name, params in METRICS:
        m = hd.get_metric(name, tree, **params)
        pred = m.decode(x)
        e = m.expected(x, pred)
        assert e.dtype == torch.float32, name
        assert torch.equal(e, m.expected(up, pred, validate=False)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64_are_kept(tree, probs, dtype):
    x = probs.to(dtype)
    assert hd.node_probabilities(tree, x).dtype == dtype
    assert hd.Posterior(tree, x).probs.dtype == dtype
    for name, params in METRICS:
        m = hd.get_metric(name, tree, **params)
        assert m.expected(x, m.decode(x)).dtype == dtype, name
        # values of node ids: torch's default dtype, or the one asked for (computed in float64 either way)
        assert m(torch.tensor([0]), torch.tensor([0])).dtype == torch.get_default_dtype(), name
        assert m(torch.tensor([0]), torch.tensor([0]), dtype=dtype).dtype == dtype, name


def test_half_precision_row_sum_tolerance(tree):
    L = tree.num_leaves
    base = torch.full((2, L), 1.0 / L, dtype=torch.float64)
    base[:, 0] += 3e-3  # rows sum to 1.003
    for dtype in HALF:
        hd.node_probabilities(tree, base.to(dtype))  # 1.003 is within the half-precision tolerance
    with pytest.raises(ValueError, match=r"tolerance 0.0001\d* for torch.float32 input"):
        hd.node_probabilities(tree, base.float())
    # a softmax computed in half precision over 1,010 classes passes without normalize=True
    logits = torch.randn(8, L, generator=torch.Generator().manual_seed(1)) * 3
    for dtype in HALF:
        p = torch.softmax(logits.to(dtype), 1)
        hd.get_metric("hf_beta", tree).decode(p)
        assert torch.equal(hd.node_probabilities(tree, logits.to(dtype), from_logits=True),
                           hd.node_probabilities(tree, logits.to(dtype).float(), from_logits=True))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8, torch.bool, torch.complex64])
def test_non_float_probabilities_are_type_errors(tree, dtype):
    x = torch.zeros(2, tree.num_leaves).to(dtype)
    for name, dec in _all_decoders(tree):
        with pytest.raises(TypeError, match=f"floating-point tensor, but got dtype {dtype}"):
            dec.decode(x)
    with pytest.raises(TypeError, match="floating-point"):
        hd.node_probabilities(tree, x, normalize=True)
    with pytest.raises(TypeError, match="floating-point"):
        hd.node_probabilities(tree, np.zeros((2, tree.num_leaves), dtype=np.int64))


@pytest.mark.parametrize("dtype", ALL_FLOAT_DTYPES)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_are_value_errors_in_every_dtype(tree, dtype, value):
    x = torch.full((3, tree.num_leaves), 1.0 / tree.num_leaves, dtype=torch.float64)
    x[2, 5] = value
    x = x.to(dtype)
    for fn in (lambda: hd.node_probabilities(tree, x), lambda: hd.node_probabilities(tree, x, normalize=True),
               lambda: hd.get_metric("wu_palmer", tree).decode(x), lambda: hd.get_decoder("darts", tree).decode(x)):
        with pytest.raises(ValueError, match="`leaf_probs` to be finite, but row 2 contains"):
            fn()
    if value != float("-inf"):  # -inf is a valid (masked) logit
        with pytest.raises(ValueError, match="row 2"):
            hd.node_probabilities(tree, x, from_logits=True)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.int64])
def test_integer_targets_and_predictions_of_any_width(tree, dtype):
    m = hd.get_metric("tree_distance", tree)
    pred = torch.tensor([0, 5, 100])
    target = torch.tensor([0, 7, 90])
    want = m(pred, target)
    assert torch.equal(m(pred.to(dtype), target.to(dtype)), want)
    P = torch.full((3, tree.num_leaves), 1.0 / tree.num_leaves, dtype=torch.float64)
    assert torch.equal(m.expected(P, pred.to(dtype)), m.expected(P, pred))


def test_hierarchy_moves_to_the_probabilities_device_cpu(tree, probs):
    h = tree.to("cpu")
    assert h is tree  # already there: no copy
    post = hd.Posterior(h, probs)
    assert post.h.device == probs.device and post.h is h
    for name, dec in _all_decoders(h):
        out = dec.decode(probs)
        assert out.device == probs.device, name
    m = hd.get_metric("wu_palmer", tree)
    assert torch.equal(m.decode(probs), hd.get_metric("wu_palmer", Hierarchy.from_parents(tree.parents_list)).decode(probs))


def test_each_device_gets_one_cached_copy(tree):
    h = Hierarchy.from_parents(tree.parents_list)
    assert h.to("cpu") is h and h.to(torch.device("cpu")) is h
    if torch.cuda.is_available():
        g = h.to("cuda")
        assert g is h.to("cuda") is h.to("cuda:0") and g.device.type == "cuda"
        assert g.to("cpu") is h
        assert g.same_tree(h) and g.ancestors.device.type == "cuda"


@cuda
def test_cuda_probabilities_with_cpu_hierarchy(tree, probs):
    x = probs.cuda()
    for name, dec in _all_decoders(tree):  # tree on CPU, probabilities on CUDA
        out = dec.decode(x)
        assert out.device.type == "cuda", name
        want = dec.decode(probs)
        if isinstance(dec, hd.metrics.BaseMetric) and not torch.equal(out.cpu(), want):
            # GPU sums may round differently: a different answer must be an exact-arithmetic tie
            torch.testing.assert_close(dec.expected(probs, out.cpu()), dec.expected(probs, want), rtol=1e-9, atol=1e-12)
        else:
            assert torch.equal(out.cpu(), want), name
    node = hd.node_probabilities(tree, x)
    assert node.device.type == "cuda"
    torch.testing.assert_close(node.cpu(), hd.node_probabilities(tree, probs))
    # and the other way round: a CUDA hierarchy with CPU probabilities runs on the CPU
    g = tree.to("cuda")
    out = hd.get_metric("hf_beta", g).decode(probs)
    assert out.device.type == "cpu" and torch.equal(out, hd.get_metric("hf_beta", tree).decode(probs))


@cuda
def test_cuda_predictions_and_targets_on_another_device(tree, probs):
    x = probs.cuda()
    pred_cpu = torch.tensor([0, 5, 100] * 4)
    target_cpu = torch.tensor([0, 7, 90] * 4)
    for name, params in METRICS:
        m = hd.get_metric(name, tree, **params)
        e = m.expected(x, pred_cpu)  # pred is moved to the probabilities' device
        assert e.device.type == "cuda"
        torch.testing.assert_close(e.cpu(), m.expected(probs, pred_cpu))
        v = m(pred_cpu.cuda(), target_cpu)  # target is moved to pred's device
        assert v.device.type == "cuda" and torch.equal(v.cpu(), m(pred_cpu, target_cpu))
        v = m(pred_cpu, target_cpu.cuda())
        assert v.device.type == "cpu"
    cost = hd.get_metric("tree_distance", tree).dense_matrix()  # CPU cost matrix, CUDA probabilities
    cm = hd.CostMatrixMetric(tree, cost)
    assert torch.equal(cm.decode(x).cpu(), cm.decode(probs))
    lam = hd.calibrate_darts(tree, x, target_cpu, 0.9)
    assert lam == pytest.approx(hd.calibrate_darts(tree, probs, target_cpu, 0.9), rel=1e-3)


@cuda
def test_cuda_errors_name_the_argument(tree):
    x = torch.full((2, tree.num_leaves), 1.0 / tree.num_leaves, device="cuda")
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match="row 1 contains NaN"):
        hd.get_metric("hamming", tree).decode(x)
    ok = torch.full((2, tree.num_leaves), 1.0 / tree.num_leaves, device="cuda")
    with pytest.raises(ValueError, match="`pred` in 0..1189"):
        hd.get_metric("wu_palmer", tree).expected(ok, torch.tensor([0, 5000]))
    with pytest.raises(ValueError, match="`target` in 0..1009"):
        hd.get_metric("wu_palmer", tree)(torch.tensor([0, 1], device="cuda"), torch.tensor([0, 5000]))


def test_cost_matrix_dtypes(tree):
    h = Hierarchy.from_parents(ref.full_tree(3, 2))
    cost64 = hd.get_metric("tree_distance", h).dense_matrix()
    for cost in (cost64, cost64.float(), cost64.to(torch.int64), cost64.numpy(), cost64.tolist()):
        cm = hd.CostMatrixMetric(h, cost)
        assert cm.cost.dtype == torch.float64
        P = torch.softmax(torch.randn(4, h.num_leaves, generator=torch.Generator().manual_seed(0)), 1)
        assert torch.equal(cm.decode(P), hd.get_metric("tree_distance", h).decode(P))
        assert cm.expected(P.half(), cm.decode(P)).dtype == torch.float32
