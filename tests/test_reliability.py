"""Answers that used to be wrong in silence, tracebacks, and scale limits of the library API.

Each test pins one behaviour: the input convention (probabilities unless told otherwise, a warning
for probabilities handed over as logits, an explicit "auto"), caches that must not outlive their
data, defaults that are not degenerate, gradients a decoder must not need, row-sum tolerances that
follow the arithmetic, bit-for-bit repeatability, depth-independent compilation, chunked heuristics.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hdecode_torch as hd
from harness import bundled, heuristic_pairs, metric_pairs, model_like
from hdecode_torch.core.validation import prepare_leaf_probs, row_sum_tolerance


@pytest.fixture(scope="module")
def tiered():
    return bundled("tieredimagenet-h")[0]


@pytest.fixture(scope="module")
def probs(tiered):
    return torch.as_tensor(model_like(np.random.default_rng(0), tiered, 64, "confused"), dtype=torch.float32)


# --------------------------------------------------------------------------- one input convention
def test_every_entry_point_takes_probabilities_by_default(tiered, probs):
    want = hd.get_metric("wu_palmer", tiered).decode(probs)
    assert torch.equal(hd.DecodingHead(tiered, "wu_palmer")(probs), want)
    metric = hd.HierarchicalMetric(tiered, "wu_palmer")
    metric.update(probs, want.clamp(max=tiered.num_leaves - 1))
    assert torch.equal(hd.get_decoder("optimal", tiered, metric="wu_palmer").decode(probs), want)


@pytest.mark.parametrize("name", ["wu_palmer", "hf_beta", "tree_distance"])
def test_probabilities_given_as_logits_warn_and_auto_decides(tiered, probs, name):
    """A softmax of probabilities changed 823–959 predictions in 1,000 without a word."""
    right = hd.DecodingHead(tiered, name)(probs)
    with pytest.warns(UserWarning, match="looks like probabilities.*from_logits=True"):
        hd.DecodingHead(tiered, name, from_logits=True)(probs)
    with pytest.warns(UserWarning, match="looks like probabilities"):
        hd.HierarchicalMetric(tiered, name, from_logits=True).update(probs.clone(), torch.zeros(64, dtype=torch.long))
    logits = probs.log()
    auto = hd.DecodingHead(tiered, name, from_logits="auto")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # neither input warns in auto mode
        assert torch.equal(auto(probs), right)
        assert torch.equal(auto(logits), hd.DecodingHead(tiered, name, from_logits=True)(logits))


def test_auto_refuses_what_it_cannot_tell_apart(tiered):
    x = torch.full((2, tiered.num_leaves), 0.5 / tiered.num_leaves)  # in [0, 1], sums to 1/2
    with pytest.raises(ValueError, match="Cannot tell whether .* probabilities or logits.*normalize=True"):
        hd.node_probabilities(tiered, x, from_logits="auto")
    with pytest.raises(ValueError, match="`from_logits` to be False .*, True .* or 'auto'"):
        hd.node_probabilities(tiered, x, from_logits="yes")
    with pytest.raises(ValueError, match="`from_logits`"):
        hd.DecodingHead(tiered, "accuracy", from_logits="logits")
    masked = torch.randn(2, tiered.num_leaves)
    masked[:, 5:] = float("-inf")  # masked classes are logits
    torch.testing.assert_close(hd.node_probabilities(tiered, masked, from_logits="auto")[:, : tiered.num_leaves],
                               torch.softmax(masked, 1))


def test_a_refilled_buffer_is_not_a_stale_posterior(tiered):
    """Inference tensors have no version counter: reuse keyed on identity would return the first batch."""
    rng = np.random.default_rng(1)
    b1, b2 = (torch.as_tensor(model_like(rng, tiered, 32, k), dtype=torch.float32) for k in ("peaked", "diffuse"))
    t1, t2 = torch.randint(0, tiered.num_leaves, (32,)), torch.randint(0, tiered.num_leaves, (32,))
    fresh = hd.HierarchicalMetric(tiered, "wu_palmer")
    fresh.update(b1, t1)
    fresh.update(b2, t2)
    with torch.inference_mode():
        buf = torch.empty_like(b1)
        m = hd.HierarchicalMetric(tiered, "wu_palmer")
        buf.copy_(b1)
        m.update(buf, t1)
        buf.copy_(b2)
        m.update(buf, t2)
        assert float(m.compute()) == float(fresh.compute())


# --------------------------------------------------------------------------- defaults and parameters
def test_tree_distance_c_default_is_not_degenerate(tiered, probs):
    m = hd.get_metric("tree_distance_c", tiered)
    assert m.c == 0.5
    assert (m.decode(probs) != tiered.root).any()  # c = 1 made the root the answer for every row
    with pytest.warns(UserWarning, match="c = 1 >= 1.*root for every input"):
        hd.get_metric("tree_distance_c", tiered, c=1.0)


def test_a_huge_beta_is_a_clear_error_not_an_overflow(tiered, probs):
    with pytest.raises(ValueError, match=r"`beta` to be a float in \(0, 1e\+150\]"):
        hd.get_metric("hf_beta", tiered, beta=1e300)
    sets = hd.get_metric("hf_beta", tiered, beta=1e100).decode(probs[:2])  # recall: the whole tree wins
    assert sets.shape == (2, tiered.num_nodes) and bool(sets[:, tiered.root].all())


# --------------------------------------------------------------------------- gradients
def test_a_decoding_head_in_a_model_needs_no_no_grad(tiered):
    """The README's own use: nn.Sequential(backbone, head) on inputs that require grad."""
    backbone = nn.Linear(16, tiered.num_leaves)
    x = torch.randn(8, 16)
    for name, params in (("hf_beta", {"beta": 0.5}), ("wu_palmer", {}), ("lca_height", {})):
        model = nn.Sequential(backbone, hd.DecodingHead(tiered, name, from_logits=True, **params))
        out = model(x)
        assert not out.requires_grad
        with torch.no_grad():
            assert torch.equal(out, model(x))
    big = hd.Hierarchy.from_parents(_wide_tree(60_000))
    model = nn.Sequential(nn.Linear(4, big.num_leaves), hd.DecodingHead(big, "wu_palmer", from_logits=True))
    assert model(torch.randn(2, 4)).shape == (2,)


def _wide_tree(n):
    """About n nodes: a root, sqrt(n) internal nodes, the rest leaves spread over them (canonical ids)."""
    k = int(math.sqrt(n))
    leaves = n - k - 1
    return [leaves + (i % k) for i in range(leaves)] + [n - 1] * k + [-1]


def test_expected_values_keep_their_gradient_on_both_plans(tiered):
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


# --------------------------------------------------------------------------- framework outputs
@pytest.mark.parametrize("num_classes", [1000, 100_000, 2_000_000])
def test_a_float32_softmax_of_any_width_is_accepted(num_classes):
    """On the CPU a float32 softmax over 2M classes sums to 1 ± 6e-4; a fixed 1e-4 rejected it."""
    g = torch.Generator().manual_seed(num_classes)
    logits = torch.randn(3, num_classes, generator=g) * 3
    logits[0, 0] += 40  # one peaked row
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            p = torch.softmax(logits, 1)
        finally:
            torch.set_num_threads(1)
        prepare_leaf_probs(p, num_classes)  # no error
        assert float((p.double().sum(1) - 1).abs().max()) <= row_sum_tolerance(torch.float32, num_classes)
    bad = p.clone()
    bad[1] *= 1.02  # a row off by 2%
    with pytest.raises(ValueError, match="sum to 1"):
        prepare_leaf_probs(bad, num_classes)


def test_row_sum_tolerance_rule():
    assert row_sum_tolerance(torch.float32, 1) == hd.ROW_SUM_TOLERANCE[torch.float32]
    tol = [row_sum_tolerance(torch.float32, n) for n in (10, 10**3, 10**5, 10**6, 10**7)]
    assert tol == sorted(tol) and tol[-1] < 0.02  # grows with L, still rejects a 2% error at 10M classes
    assert row_sum_tolerance(torch.float64, 10**7) < 1e-5
    assert row_sum_tolerance(torch.float16, 1000) < 0.01


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_same_input_same_bits_for_every_public_output(tiered, plan):
    x = torch.as_tensor(model_like(np.random.default_rng(5), tiered, 40, "diffuse"), dtype=torch.float32)
    with hd.plan_for(plan):
        assert torch.equal(hd.node_probabilities(tiered, x), hd.node_probabilities(tiered, x.clone()))
        for name, params in metric_pairs(decodable=True, full=False):
            m = hd.get_metric(name, tiered, **params)
            pred = m.decode(x)
            assert torch.equal(pred, m.decode(x.clone())), name
            assert torch.equal(m.expected(x, pred), m.expected(x.clone(), pred)), name
        for name, params in heuristic_pairs(full=False):
            d = hd.get_decoder(name, tiered, **params)
            assert torch.equal(d.decode(x), d.decode(x.clone())), name


# --------------------------------------------------------------------------- scale
def test_a_chain_of_100k_nodes_compiles_without_a_depth_table():
    """A 100k chain failed with a 74.5 GiB ancestors table; building is O(N log N) whatever the depth."""
    n = 100_000
    h = hd.Hierarchy.from_parents(list(range(1, n)) + [-1])
    assert h.max_depth == n - 1 and not h.ancestor_table_fits
    assert "ancestors" not in h._cache and "levels" not in h._cache
    with pytest.raises(ValueError, match="too deep for it"):
        h.ancestors
    x = torch.ones(3, 1)
    assert hd.get_metric("tree_distance", h).decode(x).tolist() == [0, 0, 0]
    assert hd.get_metric("lca_height", h).decode(x).tolist() == [0, 0, 0]
    assert hd.get_metric("zhao", h)(torch.tensor([0, n - 1]), torch.tensor([0, 0])).tolist() == [1.0, 1.0]  # one leaf
    d = n - 1 - n // 2  # depth of node n // 2, an ancestor of the leaf: it is their LCA
    wp = hd.get_metric("wu_palmer", h)(torch.tensor([n // 2]), torch.tensor([0]), dtype=torch.float64).item()
    assert wp == pytest.approx(2 * d / (d + n - 1), rel=1e-12)


def test_heuristics_follow_the_memory_budget(tiered, probs, monkeypatch):
    """Heuristic decoders used to ignore set_memory_budget (+2.8 GB at B = 200k with a 64 MiB budget)."""
    seen = []
    dec = hd.get_decoder("plurality", tiered)
    original = type(dec)._decode

    def spy(self, post):
        seen.append(post.batch_size)
        return original(self, post)

    monkeypatch.setattr(type(dec), "_decode", spy)
    whole = dec.decode(probs)
    budget = hd.get_memory_budget()
    try:
        hd.set_memory_budget(dec._bytes_per_sample(tiered, hd.core.resolve_plan(tiered, torch.device("cpu"))) * 10)
        seen.clear()
        assert torch.equal(dec.decode(probs), whole)
        assert max(seen) <= 10 and sum(seen) == probs.shape[0]
    finally:
        hd.set_memory_budget(budget)


@pytest.mark.parametrize("parents", [[-1, 0, True], (-1, 0, False), [-1, 0, np.bool_(True)]])
def test_a_boolean_parent_is_refused_not_read_as_a_node_id(parents):
    # numpy would read True as node 1: a JSON tree with `true` in it must not build a wrong tree
    with pytest.raises(TypeError, match=r"parents\[2\]"):
        hd.Hierarchy.from_parents(parents)
    with pytest.raises(TypeError, match=r"parents\[2\]"):
        hd.Hierarchy.from_json_dict({"parents": list(parents)})
