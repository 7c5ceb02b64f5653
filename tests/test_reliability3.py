"""Reliability, round three (issue 24): the library's entry points take what docs/validation.md says they
take, and a decision does not depend on the plan where the node sums are exact, nor on the batch."""

from __future__ import annotations


import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hdecode_torch as hd
import reference as ref
from hdecode_torch import Posterior
from test_properties import trees
from harness import (bundled, heuristic_cases, heuristic_pairs, metric_cases, metric_pairs, param,
                     random_trees, silence_root_threshold)


@pytest.fixture(scope="module")
def h():
    return bundled("tieredimagenet-h")[0]


def _logits(h, b=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h.num_leaves, generator=g, dtype=dtype) * 3


# --------------------------------------------------------------------------- from_logits / normalize
@pytest.mark.parametrize("name,params", metric_cases(decodable=True, full=False))
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


@pytest.mark.parametrize("name,params", heuristic_cases(full=False))
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


# --------------------------------------------------------------------------- the two plans
THREE_LEAF_TREES = {"star": [3, 3, 3, -1], "pair_first": [3, 3, 4, 4, -1], "pair_last": [4, 3, 3, 4, -1]}
#: the heuristics over their grids, and the parameters that put a threshold between the tree's levels
TIE_CASES = [(n, p) for n, p in heuristic_pairs(full=True) if p.get("threshold", 0) <= np.log(3)] + [
    ("information_threshold", {"threshold": 0.3}), ("confidence_threshold", {"tau": 0.25})]
TIE_PARAMS = [param(n, p) for n, p in TIE_CASES]


def _rows_with_a_zero(seed, count, L=3):
    """Dirichlet rows with one entry set to exactly 0 and the rest rescaled: the sums are not exact, but a
    node whose other children are empty has its child's probability in exact arithmetic."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(L), size=count)
    p[np.arange(count), rng.integers(0, L, count)] = 0
    return torch.as_tensor(p / p.sum(1, keepdims=True))


def _both_plans(dec, x):
    with hd.plan_for("cpu"):
        a = dec.decode(x)
    with hd.plan_for("cuda"):
        b = dec.decode(x)
    return a, b


@pytest.mark.parametrize("tree", list(THREE_LEAF_TREES))
@pytest.mark.parametrize("name,params", TIE_PARAMS)
def test_heuristics_break_ties_with_an_empty_sibling_alike_on_both_plans(tree, name, params):
    """Issue 24: information_threshold picked a shallower node on the GPU plan on 41 of 400 three-leaf
    float64 rows: p(parent) of a leaf whose sibling is empty came out of a prefix difference an ulp above
    the leaf's own entry."""
    h = hd.Hierarchy.from_parents(THREE_LEAF_TREES[tree])
    dec = hd.get_decoder(name, h, **params)
    for dtype in (torch.float64, torch.float32):
        x = _rows_with_a_zero(7, 400).to(dtype)
        a, b = _both_plans(dec, x)
        bad = (a != b).nonzero().flatten()
        assert bad.numel() == 0, (dtype, x[bad[:3]].tolist(), a[bad[:3]].tolist(), b[bad[:3]].tolist())


def test_single_child_mass_is_exact_and_changes_nothing_on_the_cpu_plan():
    """The GPU plan's tie rule for nodes whose mass lies in one child gives, on the CPU plan's sums (where
    such a node's p equals its child's bit for bit), exactly the CPU plan's decisions."""
    from hdecode_torch.decoders.heuristics import mass_in_one_child

    for h, _ in random_trees(11, 6, num_nodes_max=30, unary_prob=0.3):
        rng = np.random.default_rng(h.num_nodes)
        x = torch.as_tensor(rng.dirichlet(np.ones(h.num_leaves) * 0.3, size=64))
        x[(x < 0.05) & (x < x.amax(1, keepdim=True))] = 0
        x = x / x.sum(1, keepdim=True)
        for plan in ("cpu", "cuda"):
            with hd.plan_for(plan):
                post = Posterior(h, x)
                got = mass_in_one_child(post)
            # reference: per node and row, the number of children with positive mass
            count = hd.node_probabilities(h, (x > 0).double(), validate=False).t()  # positive leaves per node
            kids = torch.zeros_like(count)
            for c in range(h.num_nodes):
                if h.parent[c] >= 0:
                    kids[h.parent[c]] += (count[c] > 0).double()
            want = (~h.is_leaf)[:, None] & (kids <= 1)
            assert torch.equal(got, want), plan
        with hd.plan_for("cpu"):
            post = Posterior(h, x)
            for name, params in TIE_CASES:
                dec = hd.get_decoder(name, h, **params)
                if type(dec)._decode_gpu is not type(dec)._decode_cpu:
                    assert torch.equal(dec._decode_gpu(post), dec._decode_cpu(post)), name


# --------------------------------------------------------------------------- batch composition
#: Every registered decoder: the optimal decoder of every metric and every heuristic (the first case of each
#: parameter grid).
ALL_DECODERS = [("optimal", {"metric": n, **p}) for n, p in metric_pairs(decodable=True, full=False)] + \
    heuristic_pairs(full=False)
#: Optimal decoders whose decision on rows of multiples of 1/16 is computed without rounding on both plans
#: (node sums compared with dyadic thresholds, or weighted by integers).  The others weigh the
#: probabilities by non-dyadic numbers (1/(d+1), logarithms, depth ratios, 1/(β²|h|+|y|)) that the two
#: plans round in different orders, so a tie in exact arithmetic can go either way on either plan.
EXACT_ON_DYADIC = {"accuracy", "lca_height", "tree_distance", "tree_distance_c"}


def _decoders(h):
    for name, params in ALL_DECODERS:
        try:
            yield name, params, hd.get_decoder(name, h, **params)
        except ValueError as exc:  # a threshold above log L on a small tree: refused at construction
            assert "threshold" in str(exc), exc


def _dyadic(rng, count, L):
    """Rows of multiples of 1/16: every node sum is exact on both plans, in float32 and float64."""
    return np.stack([rng.multinomial(16, rng.dirichlet(np.ones(L))) / 16 for _ in range(count)])


@silence_root_threshold
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow])
@given(trees(max_nodes=40), st.integers(1, 5), st.booleans(), st.integers(1, 4),
       st.sampled_from(["float64", "float32"]), st.randoms(use_true_random=False))
def test_decisions_do_not_depend_on_batch_chunking_or_plan(tree, B, dyadic, chunk, dtype, rnd):
    """Issue 24: a row decoded alone, in any batch (shuffled, or among 2 to 40 other rows: matrix
    products change their rounding with the number of columns) and in any chunking gives the same
    prediction on the same plan; on dyadic rows, whose node sums are exact on both plans, the same on
    either plan (every heuristic, and the optimal decoders in ``EXACT_ON_DYADIC``)."""
    h, info, rng = tree
    dtype = getattr(torch, dtype)
    pad = 40
    if dyadic:
        rows = _dyadic(rng, B + pad, info.L)
    else:
        kinds = ("uniform", "dirichlet", "sparse", "peaked", "onehot")  # uniform rows tie wherever subtrees match
        rows = np.stack([ref.random_distribution(rng, info.L, kinds[i % len(kinds)]) for i in range(B + pad)])
    x, other = torch.as_tensor(rows[:B]).to(dtype), torch.as_tensor(rows[B:]).to(dtype)
    perm = list(range(B))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    # among 2, 12 and 40 others: a matrix product rounds differently with 1, 2-8, 9-15 and more columns
    batches = [(cut, torch.cat([other[:cut], x, other[cut: 2 * cut]])) for cut in (1, 6, 20)]
    by_plan = {}
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            for name, params, dec in _decoders(h):
                full = dec.decode(x)
                case = (plan, name, params)
                assert torch.equal(dec.decode(x, chunk_size=chunk), full), case
                assert torch.equal(dec.decode(x[perm])[torch.argsort(perm)], full), case
                for cut, padded in batches:
                    assert torch.equal(dec.decode(padded)[cut: cut + B], full), (case, cut)
                assert torch.equal(dec.decode(padded, chunk_size=chunk)[cut: cut + B], full), case
                for b in range(B):
                    assert torch.equal(dec.decode(x[b]), full[b]), (case, b)
                by_plan.setdefault((name, str(params)), []).append(full)
    if dyadic:
        for (name, params), (cpu, gpu) in by_plan.items():
            if name != "optimal" or eval(params)["metric"] in EXACT_ON_DYADIC:
                assert torch.equal(cpu, gpu), (name, params, rows[:B] * 16, cpu, gpu)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("name", ["zhao", "wu_palmer"])
def test_dense_strategy_ties_do_not_depend_on_the_batch(plan, name):
    """Found by the property above: the dense strategy (the GPU plan's default while the (N, L) matrix fits)
    took one matrix product of the whole batch, which rounds a column differently with the number of
    columns, so exact ties (uniform rows, symmetric subtrees, Zhao's unary chains) went to another node
    when the row was decoded alone, in a batch of 2, 9 or 40."""
    for h, info in random_trees(3, 12, num_nodes_max=40, unary_prob=0.2):
        rng = np.random.default_rng(h.num_nodes)
        rows = np.stack([ref.random_distribution(rng, info.L, ("dyadic", "uniform")[i % 2]) for i in range(40)])
        for strategy in ("auto", "dense"):
            m = hd.get_metric(name, h, strategy=strategy)
            for dtype in (torch.float64, torch.float32):
                x = torch.as_tensor(rows).to(dtype)
                with hd.plan_for(plan):
                    full = m.decode(x)
                    for size in (1, 2, 9):
                        parts = torch.cat([m.decode(x[i: i + size]) for i in range(0, 18, size)])
                        assert torch.equal(parts, full[: parts.shape[0]]), (info.parents, strategy, dtype, size)
