"""A custom (N, L) cost matrix on top-k inputs: the exhaustive decision of the completed distribution from k columns
per row, against the dense decoder on the completed table, the exhaustive oracle, and k = L bit for bit."""

import numpy as np
import pytest
import torch

import hdecode_torch as hd

from harness import bundled, random_trees
from testing import PLANS


def _lists(rng, h, b, k, prior=None, missing_zero=False):
    p = rng.dirichlet(np.full(h.num_leaves, 0.3), size=b)
    if missing_zero:
        p[:, k:] = 0
        p /= p.sum(1, keepdims=True)
    t = torch.from_numpy(p).topk(k)
    return hd.TopK(t.values, t.indices, prior=prior)


def _costs(h, info, rng):
    wp = hd.get_metric("wu_palmer", h).dense_matrix()
    return [(torch.from_numpy(rng.random((h.num_nodes, h.num_leaves))), False),  # not hierarchically reasonable
            (1 - wp, False), (wp, True)]  # reasonable: the pruning dense decoder


@pytest.mark.parametrize("plan", PLANS)
def test_random_trees_against_the_dense_decoder_and_the_oracle(plan):
    rng = np.random.default_rng(0)
    for h, info in random_trees(11, 12):
        for cost, hib in _costs(h, info, rng):
            m = hd.CostMatrixMetric(h, cost, higher_is_better=hib)
            c = cost.numpy()
            for k in sorted({1, max(1, h.num_leaves // 2), h.num_leaves - 1}):
                prior = torch.from_numpy(rng.random(h.num_leaves) + 0.1) if k % 2 else None
                for top in (_lists(rng, h, 6, k, prior), _lists(rng, h, 6, k, prior, missing_zero=True)):
                    q = top.completed(h.num_leaves).to(torch.float64)
                    with hd.plan_for(plan):
                        pred = m.decode(top)
                        got = m.expected(top, pred)
                    # the oracle: every node's expected cost on the completed table
                    table = q.numpy() @ c.T
                    best = table.max(1) if hib else table.min(1)
                    np.testing.assert_allclose(got.numpy(), best, rtol=1e-12, atol=1e-12)
                    np.testing.assert_allclose(got.numpy(), table[np.arange(6), pred.numpy()], rtol=1e-12, atol=1e-12)
                    dense = m.decode(q)
                    np.testing.assert_allclose(m.expected(q, dense).numpy(), got.numpy(), rtol=1e-12, atol=1e-12)


def test_bundled_tree_and_k_equal_to_L_bit_for_bit():
    h, info = bundled("tieredimagenet-h")
    rng = np.random.default_rng(1)
    p = torch.from_numpy(rng.dirichlet(np.full(h.num_leaves, 0.05), size=24)).to(torch.float32)
    for cost, hib in _costs(h, info, rng):
        m = hd.CostMatrixMetric(h, cost, higher_is_better=hib)
        for k in (1, 10, 100):
            top = p.topk(k)
            pred = m.decode(top)
            q = hd.TopK(top.values, top.indices).completed(h.num_leaves).to(torch.float64)
            dense = m.decode(q)
            torch.testing.assert_close(m.expected(top, pred).double(), m.expected(q, dense).double(), rtol=1e-6, atol=1e-7)
            assert (pred == dense).float().mean() >= 0.95  # the same node but at near-ties
        full = p.topk(h.num_leaves)
        assert torch.equal(m.decode(full), m.decode(p))
        assert torch.equal(m.expected(full, m.decode(p)), m.expected(p, m.decode(p)))
        one = p[0].topk(10)
        assert m.decode(one).shape == () and m.decode(one) == m.decode(p[:1].topk(10))[0]


def test_entry_points_take_the_lists():
    h, _ = bundled("inat19")
    g = torch.Generator().manual_seed(2)
    cost = torch.rand(h.num_nodes, h.num_leaves, generator=g, dtype=torch.float64)
    m = hd.CostMatrixMetric(h, cost)
    p = torch.rand(8, h.num_leaves, generator=g).softmax(1)
    top = p.topk(20)
    want = m.decode(top)
    assert torch.equal(hd.DecodingHead(h, m)(top), want)
    assert torch.equal(hd.DecodingHead(h, m)(p.topk(h.num_leaves)), hd.DecodingHead(h, m)(p))
    y = torch.randint(0, h.num_leaves, (8,), generator=g)
    hm = hd.HierarchicalMetric(h, m)
    hm.update(top, y)
    torch.testing.assert_close(hm.compute(), m(want, y).mean(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"`cost_matrix` gives no certificate"):
        m.decode(top, certify=True)
