"""``from_logits``: what each input convention accepts, and that "auto" refuses what it cannot decide."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import hdecode_torch as hd
from harness import bundled


@pytest.fixture(scope="module")
def h():
    return bundled("inat19")[0]


def _probs(h, b=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, h.num_leaves, generator=g, dtype=torch.float64) * 3, 1)


def test_auto_refuses_probabilities_with_a_tiny_negative_entry(h):
    """Used to be read as logits and softmaxed (node probabilities off by up to 0.56)."""
    p = _probs(h)
    p[2, 7] = -1e-12
    with pytest.raises(ValueError, match=r"Cannot tell whether `leaf_probs` holds probabilities or logits: row 2 has "
                                         r"a negative entry"):
        hd.node_probabilities(h, p, from_logits="auto")
    with pytest.raises(ValueError, match="negative entry"):
        hd.get_metric("tree_distance", h).decode(p)  # probabilities: refused too, as before
    # a clear case of each kind is decided
    logits = torch.randn(4, h.num_leaves, dtype=torch.float64)
    torch.testing.assert_close(hd.node_probabilities(h, logits, from_logits="auto"),
                               hd.node_probabilities(h, logits, from_logits=True))
    torch.testing.assert_close(hd.node_probabilities(h, _probs(h), from_logits="auto"),
                               hd.node_probabilities(h, _probs(h)))


def test_auto_refuses_values_in_the_unit_interval_that_are_not_distributions(h):
    x = torch.full((3, h.num_leaves), 0.5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"entries are in \[0\.5, 0\.5\] but row 0 sums to 505"):
        hd.node_probabilities(h, x, from_logits="auto")
    # just past the margin it is logits
    x[1, 3] = 1.01
    torch.testing.assert_close(hd.node_probabilities(h, x, from_logits="auto"),
                               hd.node_probabilities(h, x, from_logits=True))


def test_auto_with_normalize_normalizes_counts_and_refuses_negatives(h):
    counts = torch.randint(0, 5, (4, h.num_leaves)).double()
    counts[:, 0] += 1  # no zero row
    want = hd.node_probabilities(h, counts, normalize=True)
    torch.testing.assert_close(hd.node_probabilities(h, counts, from_logits="auto", normalize=True), want)
    logits = torch.randn(4, h.num_leaves, dtype=torch.float64)
    with pytest.raises(ValueError, match="normalize=True is for unnormalised probabilities, but `leaf_probs` has "
                                         "negative entries"):
        hd.node_probabilities(h, logits, from_logits="auto", normalize=True)


def _host_reads(monkeypatch, fn) -> int:
    """Tensor -> Python conversions during ``fn()`` (each a device-to-host read on a GPU)."""
    calls = []
    with monkeypatch.context() as m:
        for attr in ("tolist", "item", "__bool__", "__int__", "__float__"):
            def wrapper(self, *a, _orig=getattr(torch.Tensor, attr), **k):
                calls.append(1)
                return _orig(self, *a, **k)
            m.setattr(torch.Tensor, attr, wrapper)
        fn()
    return len(calls)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_deferred_check_reads_once_and_raises_the_same_error(h, plan, monkeypatch):
    """A decoder's input check is read with the decoder's own host read (one in all on the GPU plan),
    and bad input still raises the check's own error, not whatever the decoder did with the bad values."""
    p = _probs(h, 32).float()
    with hd.plan_for(plan):
        for name, kw in [("tree_distance", {}), ("hf_beta", {"beta": 2.0}), ("wu_palmer", {}), ("hamming", {})]:
            m = hd.get_metric(name, h, **kw)
            m.decode(p)
            checked = _host_reads(monkeypatch, lambda: m.decode(p))
            unchecked = _host_reads(monkeypatch, lambda: m.decode(p, validate=False))
            if plan == "cuda" or name in ("tree_distance", "hamming"):
                assert checked == 1, name
            # the check rides on the decoder's own read where it has one (hF_β's candidate count)
            assert unchecked == checked - (0 if (plan == "cuda" and name == "hf_beta") else 1), name
            bad = p.clone()
            bad[5, 3] = float("nan")
            with pytest.raises(ValueError, match="row 5 contains NaN"):
                m.decode(bad)
            bad[5, 3] = -0.5
            with pytest.raises(ValueError, match="row 5 has a negative entry"):
                m.decode(bad)


# ---------------------------------------------------------------- what each entry point accepts (docs/validation.md)
def _logits(h, b=5, seed=1):
    return torch.randn(b, h.num_leaves, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


def test_from_logits_values_and_normalize_with_logits(h):
    """0 and 1 are False and True; other values are refused naming `from_logits`; normalize=True changes
    nothing for logits (the softmax sums to 1), for every converting entry point."""
    z, p = _logits(h), _probs(h)
    m, d = hd.get_metric("wu_palmer", h), hd.get_decoder("majority", h)
    soft = torch.softmax(z, 1)
    assert torch.equal(hd.node_probabilities(h, z, from_logits=1), hd.node_probabilities(h, soft))
    assert torch.equal(hd.node_probabilities(h, p, from_logits=0), hd.node_probabilities(h, p))
    for kind in ("yes", None, 2, "Auto"):
        with pytest.raises(ValueError, match="Expected `from_logits` to be False"):
            m.decode(z, from_logits=kind)
    assert torch.equal(hd.node_probabilities(h, z, from_logits=True, normalize=True),
                       hd.node_probabilities(h, z, from_logits=True))
    assert torch.equal(m.decode(z, from_logits=True, normalize=True), m.decode(soft))
    assert torch.equal(d.decode(z, from_logits=True, normalize=True), d.decode(soft))
    pred = m.decode(soft)
    assert torch.equal(m.expected(z, pred, from_logits=True, normalize=True), m.expected(soft, pred))


def test_head_and_metric_take_no_normalize(h):
    """DecodingHead and HierarchicalMetric convert with from_logits only: `normalize=` is an unknown
    metric parameter, refused by name, not ignored."""
    for make in (lambda: hd.DecodingHead(h, "wu_palmer", normalize=True),
                 lambda: hd.HierarchicalMetric(h, "wu_palmer", normalize=True)):
        with pytest.raises(ValueError, match="unknown parameter\\(s\\) 'normalize'"):
            make()
    z = _logits(h)
    head = hd.DecodingHead(h, "wu_palmer", from_logits="auto")
    assert torch.equal(head(z), hd.get_metric("wu_palmer", h).decode(z, from_logits=True))
    metric = hd.HierarchicalMetric(h, "wu_palmer", from_logits="auto")
    target = torch.arange(z.shape[0])
    metric.update(z[0], target[0])  # one (L,) row with a () target
    metric.update(z[1:], target[1:])
    want = hd.get_metric("wu_palmer", h)
    got = metric.compute()
    assert got.dtype == z.dtype  # the mean comes back in the scores' dtype
    torch.testing.assert_close(got, want(want.decode(z, from_logits=True), target).mean().to(z.dtype))


@pytest.mark.parametrize("key, from_logits", [("logits", True), ("logit", True), ("scores", True), ("probs", False),
                                              ("probabilities", False), ("prob", False), ("leaf_probs", False),
                                              ("out", None)])
@pytest.mark.skipif(not any(importlib.util.find_spec(m) for m in ("lightning", "pytorch_lightning")),
                    reason="needs lightning")
def test_callback_reads_the_input_kind_from_its_output_key(h, key, from_logits):
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    if from_logits is None:
        with pytest.raises(ValueError, match=f"Cannot tell whether `output_key='{key}'` holds logits"):
            HierarchicalMetricsCallback(h, metrics=["wu_palmer"], output_key=key)
        return
    cb = HierarchicalMetricsCallback(h, metrics=["wu_palmer"], output_key=key)
    assert [m.from_logits for m in cb.metrics.values()] == [from_logits]


def test_temperature_scaler_takes_logits_of_any_shape_and_fits_only_logits(h):
    scaler = hd.TemperatureScaler(2.0)
    z = _logits(h, 6).float().reshape(2, 3, h.num_leaves)
    torch.testing.assert_close(scaler(z), z / 2)
    assert scaler(z).dtype == torch.float32
    with pytest.raises(TypeError, match="floating-point"):
        scaler(torch.ones(3, h.num_leaves, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(B, L\)"):
        hd.TemperatureScaler().fit(z, torch.zeros(2, dtype=torch.long))


def test_calibrate_darts_decides_auto_as_the_explicit_kind(h):
    z, p = _logits(h, 40), _probs(h, 40)
    target = torch.randint(0, h.num_leaves, (40,), generator=torch.Generator().manual_seed(2))
    assert hd.calibrate_darts(h, z, target, 0.3, from_logits="auto") == \
        hd.calibrate_darts(h, z, target, 0.3, from_logits=True)
    assert hd.calibrate_darts(h, p, target, 0.3, from_logits="auto") == hd.calibrate_darts(h, p, target, 0.3)
