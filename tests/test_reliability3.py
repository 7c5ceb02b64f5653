"""Reliability, round three (issue 24): the library's entry points take what docs/validation.md says they
take, and a decision does not depend on the plan where the node sums are exact, nor on the batch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import Posterior
from harness import bundled, heuristic_pairs, metric_pairs, silence_root_threshold


@pytest.fixture(scope="module")
def h():
    return bundled("tieredimagenet-h")[0]


def _logits(h, b=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h.num_leaves, generator=g, dtype=dtype) * 3


# --------------------------------------------------------------------------- from_logits / normalize
@silence_root_threshold
@pytest.mark.parametrize("name,params", metric_pairs(decodable=True, full=False))
def test_metric_decode_and_expected_take_from_logits_and_normalize(h, name, params):
    """Issue 24: docs/validation.md lists `from_logits` for metrics and decoders, but `decode` and `expected`
    raised "unexpected keyword"."""
    m = hd.get_metric(name, h, **params)
    z = _logits(h)
    p = torch.softmax(z, 1)
    want = m.decode(p)
    assert torch.equal(m.decode(z, from_logits=True), want)
    assert torch.equal(m.decode(z, from_logits="auto"), want)
    assert torch.equal(m.decode(p, from_logits="auto"), want)
    assert torch.equal(m.decode(p, from_logits=False), want)
    assert torch.equal(m.decode(p * 7, normalize=True), m.decode(p * 7 / (p * 7).sum(1, keepdim=True)))
    assert torch.equal(m.decode(z[0], from_logits=True), want[0])  # unbatched
    e = m.expected(p, want)
    torch.testing.assert_close(m.expected(z, want, from_logits=True), e)
    torch.testing.assert_close(m.expected(z, want, from_logits="auto"), e)
    torch.testing.assert_close(m.expected(p * 3, want, normalize=True), e)
    # the optimal decoder of the metric forwards them
    dec = hd.get_decoder("optimal", h, metric=m)
    assert torch.equal(dec.decode(z, from_logits=True), want)


@pytest.mark.parametrize("name,params", heuristic_pairs(full=False))
def test_heuristic_decode_takes_from_logits_and_normalize(h, name, params):
    dec = hd.get_decoder(name, h, **params)
    z = _logits(h, seed=1)
    p = torch.softmax(z, 1)
    want = dec.decode(p)
    assert torch.equal(dec.decode(z, from_logits=True), want)
    assert torch.equal(dec.decode(z, from_logits="auto"), want)
    assert torch.equal(dec.decode(p * 2, normalize=True), dec.decode(p * 2 / (p * 2).sum(1, keepdim=True)))


def test_conversion_errors_name_the_input(h):
    m = hd.get_metric("wu_palmer", h)
    p = torch.softmax(_logits(h), 1)
    with pytest.raises(ValueError, match="Expected `from_logits` to be False .*, True .* or 'auto', but got 'yes'"):
        m.decode(p, from_logits="yes")
    with pytest.raises(ValueError, match="Cannot tell whether `leaf_probs` holds probabilities or logits"):
        m.decode(torch.full_like(p, 0.5), from_logits="auto")
    with pytest.raises(ValueError, match="normalize=True is for unnormalised probabilities"):
        m.expected(_logits(h), m.decode(p), from_logits="auto", normalize=True)
    with pytest.raises(ValueError, match="sum to 1"):
        m.expected(p * 2, m.decode(p))  # not normalized: refused, as before
    with pytest.warns(UserWarning, match="looks like probabilities"):
        m.decode(p, from_logits=True)  # a softmax of probabilities: warned, as everywhere


def test_a_posterior_is_converted_already(h):
    """A Posterior holds probabilities: from_logits / normalize given with one are an error, not ignored."""
    z = _logits(h)
    post = Posterior(h, z, from_logits=True)
    m = hd.get_metric("zhao", h)
    dec = hd.get_decoder("darts", h, lam=0.5)
    want = m.decode(torch.softmax(z, 1))
    assert torch.equal(m.decode(post), want) and torch.equal(m.decode(post, from_logits=False), want)
    for call in (lambda **kw: m.decode(post, **kw), lambda **kw: dec.decode(post, **kw),
                 lambda **kw: m.expected(post, want, **kw),
                 lambda **kw: hd.get_decoder("optimal", h, metric=m).decode(post, **kw)):
        for kw in ({"from_logits": True}, {"from_logits": "auto"}, {"normalize": True}):
            with pytest.raises(ValueError, match=f"`leaf_probs` is a Posterior, whose probabilities are converted "
                                                 f"already: {next(iter(kw))}="):
                call(**kw)
        with pytest.raises(ValueError, match="Expected `from_logits`"):
            call(from_logits=2)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_decode_with_logits_reads_the_host_once(h, plan, monkeypatch):
    """The one-host-read design holds with the conversions: the deferred check of the logits (or of the
    "auto" decision) is read with the decision, as that of probabilities is."""
    from test_input_kinds import _host_reads

    z = _logits(h, b=32, seed=3).float()
    with hd.plan_for(plan):
        for name in ("tree_distance", "hamming"):
            m = hd.get_metric(name, h)
            m.decode(z, from_logits=True)  # tree tables built
            for kind in (True, "auto"):
                assert _host_reads(monkeypatch, lambda: m.decode(z, from_logits=kind)) == 1, (name, kind)
