"""Node-level calibration per depth (ECE and reliability diagrams) against a brute-force NumPy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import functional as F
from hdecode_torch.functional._calibration import _node_calibration_compute, _node_calibration_update
from hdecode_torch.synthetic import synthetic_miscalibrated
from harness import random_trees


def _reference(h, probs: np.ndarray, target: np.ndarray, n_bins: int):
    """Loops over nodes: p(n) by summing its leaves, the hit by walking up from the target."""
    par = np.asarray(h.parents_list)
    n, L = len(par), h.num_leaves
    depth = np.zeros(n, dtype=int)
    for m in range(n):
        a = m
        while par[a] >= 0:
            depth[m] += 1
            a = par[a]
    D = depth[:L].max()
    counts, conf, hits = (np.zeros((D + 1, n_bins)) for _ in range(3))
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    for i in range(probs.shape[0]):
        path = set()
        a = target[i]
        while a >= 0:
            path.add(a)
            a = par[a]
        node_p = np.zeros(n)
        for leaf in range(L):
            a = leaf
            while a >= 0:
                node_p[a] += probs[i, leaf]
                a = par[a]
        for m in range(n):
            b = min(max(np.searchsorted(edges, node_p[m], side="right") - 1, 0), n_bins - 1)
            counts[depth[m], b] += 1
            conf[depth[m], b] += node_p[m]
            hits[depth[m], b] += m in path
    ece = np.abs(conf - hits).sum(1) / counts.sum(1)
    return counts, conf, hits, ece


def _cases():
    rng = np.random.default_rng(0)
    for h, _ in random_trees(1, 10, num_nodes_max=16, unary_prob=0.3):
        z = rng.normal(size=(40, h.num_leaves)) * rng.uniform(0.5, 4)
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        yield h, p, rng.integers(0, h.num_leaves, 40)
    for name in ("tieredimagenet-h", "inat19"):
        h = hd.load_hierarchy(name)
        z, y, _ = synthetic_miscalibrated(h, 25, "flat_leaves", 2.0, seed=1, dtype=torch.float64)
        yield h, z.exp().numpy(), y.numpy()


@pytest.mark.parametrize("n_bins", [1, 7, 15])
def test_matches_the_brute_force_reference(n_bins):
    for h, p, y in _cases():
        counts, conf, hits, ece = _reference(h, p, y, n_bins)
        got = F.node_reliability(torch.as_tensor(p), torch.as_tensor(y), h, n_bins=n_bins)
        np.testing.assert_array_equal(got.counts.numpy(), counts)
        some = counts > 0
        np.testing.assert_allclose(got.confidence.numpy()[some], conf[some] / counts[some], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(got.frequency.numpy()[some], hits[some] / counts[some], rtol=1e-12)
        assert np.isnan(got.confidence.numpy()[~some]).all() and np.isnan(got.frequency.numpy()[~some]).all()
        err = F.node_calibration_error(torch.as_tensor(p), torch.as_tensor(y), h, n_bins=n_bins)
        assert err.dtype == torch.float64 and err.shape == (h.max_depth + 1,)
        np.testing.assert_allclose(err.numpy(), ece, atol=1e-12)
        assert float(err[0]) < 1e-12  # the root: p = 1, always hit


def test_chunks_plans_logits_and_float32_agree():
    h = hd.load_hierarchy("tieredimagenet-h")
    z, y, _ = synthetic_miscalibrated(h, 300, "depth", 3.0, seed=2, dtype=torch.float64)
    want = F.node_calibration_error(z.exp(), y, h)
    torch.testing.assert_close(F.node_calibration_error(z, y, h, from_logits=True), want, atol=1e-12, rtol=0)
    before = hd.get_memory_budget()
    try:
        hd.set_memory_budget(48 * h.num_nodes * 7)  # 7 rows per chunk
        torch.testing.assert_close(F.node_calibration_error(z.exp(), y, h), want, atol=1e-12, rtol=0)
    finally:
        hd.set_memory_budget(None)
    assert hd.get_memory_budget() == before
    with hd.plan_for("cuda"):
        torch.testing.assert_close(F.node_calibration_error(z.exp(), y, h), want, atol=1e-12, rtol=0)
    torch.testing.assert_close(F.node_calibration_error(z.exp().float(), y, h), want, atol=1e-5, rtol=0)
    # The pieces: the ECE is the compute step of the update's sums, which add over batches.
    a = _node_calibration_update(z[:100].exp(), y[:100], h)
    b = _node_calibration_update(z[100:].exp(), y[100:], h)
    torch.testing.assert_close(_node_calibration_compute(*(x + w for x, w in zip(a, b))), want, atol=1e-12,
                               rtol=0)


def test_calibrated_probabilities_have_a_smaller_error_than_distorted_ones():
    h = hd.load_hierarchy("inat19")
    z, y, p = synthetic_miscalibrated(h, 3000, "sharp_leaves", 3.0, seed=3)
    raw = F.node_calibration_error(z, y, h, from_logits=True)
    true = F.node_calibration_error(p, y, h)
    # Every depth below the root is worse for the distorted model.
    assert bool((raw[1:] > 2 * true[1:]).all())


def test_empty_batch_and_errors():
    h = hd.load_hierarchy("inat19")
    err = F.node_calibration_error(torch.zeros(0, h.num_leaves), torch.zeros(0, dtype=torch.long), h)
    assert err.shape == (h.max_depth + 1,) and bool(torch.isnan(err).all())
    p = torch.full((2, h.num_leaves), 1.0 / h.num_leaves)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="`n_bins` to be an int >= 1"):
            F.node_calibration_error(p, torch.zeros(2, dtype=torch.long), h, n_bins=bad)
    with pytest.raises(ValueError, match="target"):
        F.node_reliability(p, torch.tensor([0, h.num_leaves]), h)
    with pytest.raises(ValueError, match="sum to 1|sums to|rows"):
        F.node_calibration_error(p * 2, torch.zeros(2, dtype=torch.long), h)


def test_the_torchmetrics_class_accumulates_the_same_error():
    pytest.importorskip("torchmetrics")
    h = hd.load_hierarchy("inat19")
    z, y, _ = synthetic_miscalibrated(h, 400, "depth", 2.0, seed=4)
    metric = hd.NodeCalibrationError(h, n_bins=10, from_logits=True)
    for rows in torch.arange(400).split(150):
        metric.update(z[rows], y[rows])
    torch.testing.assert_close(metric.compute(), F.node_calibration_error(z, y, h, n_bins=10, from_logits=True),
                               atol=1e-12, rtol=0)
    metric.reset()
    assert float(metric.counts.sum()) == 0
    with pytest.raises(ValueError, match="`n_bins`"):
        hd.NodeCalibrationError(h, n_bins=0)
