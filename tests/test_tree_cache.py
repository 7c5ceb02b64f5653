"""The per-tree cache (``h.cached``): what one component caches on a hierarchy is never read by another."""

import torch

import hdecode_torch as hd
from hdecode_torch.metrics import NodeMetric


def _depth_gap_class(scale: float):
    """A values-only metric class named ``Custom``, as two user modules could each define one."""
    def _values(self, h, pred, target):
        return scale * (h.depth[pred] - h.depth[target]).abs().to(torch.float64)

    return type("Custom", (NodeMetric,), {"name": f"custom_{scale:g}", "description": "scaled depth gap",
                                          "higher_is_better": False, "_values": _values})


def test_metrics_whose_classes_share_a_name_keep_their_own_dense_tables():
    h = hd.load_hierarchy("tieredimagenet-h")
    x = torch.softmax(torch.randn(4, h.num_leaves, generator=torch.Generator().manual_seed(0), dtype=torch.float64), 1)
    one, two = _depth_gap_class(1.0)(h), _depth_gap_class(2.0)(h)
    assert type(one).__qualname__ == type(two).__qualname__
    for m in (one, two, one):  # each built once, then read back
        want = m.dense_matrix() @ x.t()
        assert torch.equal(m.expected_table(hd.Posterior(h, x)), want)
    assert torch.equal(two.expected_table(hd.Posterior(h, x)), 2 * one.expected_table(hd.Posterior(h, x)))


def test_a_subclass_that_keeps_the_metric_s_name_keeps_its_own_similarity_tables():
    # the strategies' tables (matrix, distinct rows, pruning statistics) were keyed on the metric's name
    class DoubledWuPalmer(hd.metrics.WuPalmer):  # inherits the name "wu_palmer"
        def _lca_values(self, h, pred, target, meet):
            return 2 * super()._lca_values(h, pred, target, meet)

    h = hd.load_hierarchy("tieredimagenet-h")
    built_in, doubled = hd.get_metric("wu_palmer", h), DoubledWuPalmer(h)
    assert doubled.name == built_in.name
    first = built_in.similarity_matrix(h)
    assert torch.equal(doubled.similarity_matrix(h), 2 * first)
    assert torch.equal(built_in.similarity_matrix(h), first)
    rows, _ = doubled.distinct_rows(h)
    assert torch.equal(rows.max(), 2 * built_in.distinct_rows(h)[0].max())
