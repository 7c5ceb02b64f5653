"""Top-k inputs on every device of ``tests.testing.DEVICES`` (CUDA where present): each metric's optimal
decision and each heuristic's node, decoded from lists on that device under the plan the device picks, is
that of the CPU: the expected score of the device's decision under the completed distribution equals the
float64 dense decision's on the completed (B, L) table, and a heuristic's node is the CPU top-k decoder's node
(the same float64 lists); the results live on the input's device.  The other top-k test files run on CPU
tensors (both plans); this one is where a CUDA run checks the top-k paths' tables and indices on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from harness import bundled, model_like
from testing import DEVICES

METRICS = [("accuracy", {}), ("tree_distance", {}), ("tree_distance_c", {"c": 0.5}), ("lca_height", {}),
           ("wu_palmer", {}), ("zhao", {}), ("hamming", {}), ("hf_beta", {"beta": 1.0}),
           ("hf_beta", {"beta": 0.5}), ("jaccard", {})]
HEURISTICS = [("argmax_leaf", {}), ("top_down", {}), ("majority", {}), ("confidence_threshold", {"tau": 0.75}),
              ("crm", {}), ("plurality", {}), ("hie", {}), ("darts", {"lam": 0.5}), ("expected_information", {}),
              ("information_threshold", {"threshold": 2.0})]
KS = (1, 10, 100)
ROWS = 48


def _lists(tree, dtype):
    """Model-shaped float rows of a bundled tree (peaked, confused between relatives, a shallow leaf's share)."""
    h, _ = bundled(tree)
    rng = np.random.default_rng(7)
    p = np.concatenate([model_like(rng, h, ROWS // 3, kind) for kind in ("peaked", "confused", "shallow")])
    return h, torch.from_numpy(p).to(dtype)


def _dense(pred):
    """``pred`` (node ids, or sets dense or sparse COO) as a strided tensor."""
    return pred.to_dense() if pred.layout == torch.sparse_coo else pred


def _expected(m, full, pred):
    """E[m] of ``pred`` (node ids, dense or sparse sets; any device) under the CPU float64 table ``full``."""
    return m.expected(full, _dense(pred.cpu()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_metrics_decode_lists_on_the_device(device, tree, dtype):
    h, probs = _lists(tree, dtype)
    for k in KS:
        top = probs.topk(k)
        full = hd.TopK(top.values.double(), top.indices).completed(h.num_leaves)
        lists = hd.TopK(top.values.to(device), top.indices.to(device))
        for name, params in METRICS:
            m = hd.get_metric(name, h, **params)
            pred = m.decode(lists)
            assert pred.device.type == device and pred.shape[0] == ROWS, (name, k)
            best = m.expected(full, m.decode(full))
            got = _expected(m, full, pred)
            # float32 lists: the decision of rounded values, within their rounding of the best expected score
            tol = 1e-10 if dtype == torch.float64 else 2e-5
            worse = (best - got) if m.higher_is_better else (got - best)
            assert float(worse.max()) <= tol * float(best.abs().max().clamp_min(1)), (name, params, k)
            # the score on the device is the CPU's score of the same decision
            on_device = m.expected(hd.TopK(top.values.double().to(device), top.indices.to(device)), pred)
            assert on_device.device.type == device
            torch.testing.assert_close(on_device.cpu(), got, rtol=1e-9, atol=1e-12, msg=lambda s: f"{name} {k}: {s}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_heuristics_decode_lists_on_the_device(device, tree):
    h, probs = _lists(tree, torch.float64)
    rc = hd.RiskControl(h, alpha=0.1).fit(probs, probs.argmax(1))
    for k in KS:
        top = probs.topk(k)
        cpu_lists = hd.TopK(top.values, top.indices)
        lists = hd.TopK(top.values.to(device), top.indices.to(device))
        for name, params in HEURISTICS + [("risk_control", None)]:
            dec = rc if params is None else hd.get_decoder(name, h, **params)
            got = dec.decode(lists)
            assert got.device.type == device, name
            assert torch.equal(got.cpu(), dec.decode(cpu_lists)), (name, k)
            if k == h.num_leaves:
                assert torch.equal(got.cpu(), dec.decode(probs)), name


@pytest.mark.parametrize("device", DEVICES)
def test_cost_matrix_and_entry_points_on_the_device(device):
    h, probs = _lists("tieredimagenet-h", torch.float64)
    cost = 1 - hd.get_metric("wu_palmer", h).dense_matrix()
    m = hd.CostMatrixMetric(h, cost)
    top = probs.topk(10)
    full = hd.TopK(top.values, top.indices).completed(h.num_leaves)
    lists = hd.TopK(top.values.to(device), top.indices.to(device))
    pred = m.decode(lists)
    assert pred.device.type == device
    torch.testing.assert_close(m.expected(full, pred.cpu()), m.expected(full, m.decode(full)), rtol=1e-12, atol=1e-12)
    # the head and the metric take the list on the device and agree with the class
    for name, params in (("hamming", {}), ("lca_height", {})):
        head = hd.DecodingHead(h, name, **params).to(device)
        want = hd.get_metric(name, h, **params).decode(hd.TopK(top.values, top.indices))
        assert torch.equal(_dense(head(lists).cpu()), _dense(want)), name
        target = probs.argmax(1)
        metric = hd.HierarchicalMetric(h, name, **params).to(device)
        metric.update(lists, target.to(device))
        cpu_metric = hd.HierarchicalMetric(h, name, **params)
        cpu_metric.update(hd.TopK(top.values, top.indices), target)
        torch.testing.assert_close(metric.compute().cpu(), cpu_metric.compute(), rtol=1e-12, atol=1e-12)
