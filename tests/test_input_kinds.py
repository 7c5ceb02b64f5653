"""``from_logits``: what each input convention accepts, and that "auto" refuses what it cannot decide."""

from __future__ import annotations

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
