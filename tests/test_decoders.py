"""What every decoder (the exact decoder of each metric and each heuristic) promises alike.

Degenerate inputs with defined answers: empty batches, single samples, one-hot and uniform
distributions, exact ties, zero-probability subtrees, one-leaf trees, chains, a 100k-leaf star,
and leaves at very different depths.  A row's decision does not depend on the batch around it, on
the chunking, nor (where the node sums are exact) on the plan; the same input gives the same bits;
a decoder in a model needs no ``torch.no_grad()``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import hdecode_torch as hd
import reference as ref
from hdecode_torch import Hierarchy
from harness import (
    bundled, case_id, expect_warnings, heuristic_pairs, metric_pairs, model_like, random_trees, returns_leaves,
    root_threshold, silence_root_threshold, strategies,
)
from test_properties import trees

METRICS = metric_pairs()  # every registered metric over its parameter grid (c >= 1 included)
DECODABLE = metric_pairs(decodable=True)
HEURISTICS = heuristic_pairs(full=False)  # thresholds every tree here allows (information_threshold: 0)


def caterpillar(depth: int) -> Hierarchy:
    """A spine of ``depth`` internal nodes with one leaf hanging at every level: leaf depths 1..depth."""
    # node 0 root; spine nodes 0..depth-1; leaf i hangs from spine node i-1 (depth i); deepest leaf under the last
    parents = [-1] + list(range(depth - 1))  # spine
    parents += [i for i in range(depth)]  # one leaf under each spine node
    parents += [depth - 1]  # a second leaf under the deepest spine node
    return Hierarchy.from_parents(parents)


TREES = {
    "small": Hierarchy.from_parents([5, 5, 6, 6, 6, 7, 7, -1]),
    "one_leaf": Hierarchy.from_parents([1, -1]),
    "chain": Hierarchy.from_parents(ref.chain_tree(6)),
    "star": Hierarchy.from_parents(ref.star_tree(5)),
    "caterpillar": caterpillar(6),
}


def _info(h):
    return ref.TreeInfo(np.asarray(h.parents_list))


def _metric(h, name, params, **extra):
    """The metric, expecting the library's warning where the parameters make the root always optimal."""
    with expect_warnings(name, params):
        return hd.get_metric(name, h, **params, **extra)


def _decoders(h):
    """(label, decode, kind, root_only) of every exact decoder and heuristic; root_only: the root is
    always optimal (tree_distance_c with c >= 1)."""
    for name, params in DECODABLE:
        m = _metric(h, name, params)
        yield case_id(name, params), m.decode, m.kind, root_threshold(name, params)
    for name, params in HEURISTICS:
        kind = "leaf" if returns_leaves(name) else "node"
        yield case_id(name, params), hd.get_decoder(name, h, **params).decode, kind, False


# --------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("tree", list(TREES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_empty_batch_has_the_right_shape_everywhere(tree, dtype):
    h = TREES[tree]
    empty = torch.zeros(0, h.num_leaves, dtype=dtype)
    node = hd.node_probabilities(h, empty)
    assert node.shape == (0, h.num_nodes) and node.dtype == dtype
    assert hd.node_probabilities(h, empty, from_logits=True).shape == (0, h.num_nodes)
    assert hd.node_probabilities(h, empty, normalize=True).shape == (0, h.num_nodes)
    no_ids = torch.zeros(0, dtype=torch.long)
    for label, decode, kind, _ in _decoders(h):
        out = decode(empty)
        want = (0, h.num_nodes) if kind == "set" else (0,)
        assert out.shape == want and out.dtype == (torch.bool if kind == "set" else torch.int64), label
    for name, params in METRICS:
        m = _metric(h, name, params)
        e = m.expected(empty, no_ids)
        assert e.shape == (0,) and e.dtype == dtype, name
        v = m(no_ids, no_ids)
        assert v.shape == (0,) and v.dtype == torch.get_default_dtype(), name
        if m.kind == "set":
            no_sets = torch.zeros(0, h.num_nodes, dtype=torch.bool)
            assert m.expected(empty, no_sets).shape == (0,)
            assert m(no_sets, no_ids).shape == (0,)
        assert m.decode(empty, chunk_size=1).shape == ((0, h.num_nodes) if m.kind == "set" else (0,))


@pytest.mark.parametrize("tree", list(TREES))
def test_single_sample_gives_unbatched_outputs(tree):
    h = TREES[tree]
    rng = np.random.default_rng(0)
    P = torch.as_tensor(ref.random_distributions(rng, 3, h.num_leaves, "random"))
    x = P[1]
    assert hd.node_probabilities(h, x).shape == (h.num_nodes,)
    for label, decode, kind, _ in _decoders(h):
        one, full = decode(x), decode(P)
        assert one.shape == ((h.num_nodes,) if kind == "set" else ()), label
        assert torch.equal(one, full[1]), label
    for name, params in DECODABLE:  # the "optimal" wrapper unbatches exactly once
        with expect_warnings(name, params):
            dec = hd.get_decoder("optimal", h, metric=name, **params)
        one, full = dec.decode(x), dec.decode(P)
        assert torch.equal(one, full[1]) and one.dim() == full.dim() - 1, name
        assert torch.equal(dec.decode(hd.Posterior(h, x)), one), name
    for name, params in METRICS:
        m = _metric(h, name, params)
        pred = torch.tensor(h.root)
        e = m.expected(x, pred)
        assert e.shape == () and float(e) == pytest.approx(float(m.expected(P, pred.expand(3))[1]))
        assert m(pred, torch.tensor(0)).shape == ()
        if m.kind == "set":
            s = torch.zeros(h.num_nodes, dtype=torch.bool)
            s[h.root] = True
            assert m.expected(x, s).shape == () and m(s, torch.tensor(0)).shape == ()


# --------------------------------------------------------------------------- distributions
def test_one_hot_distributions_decode_to_that_leaf():
    trees = list(random_trees(11, 8, num_nodes_max=12, unary_prob=0.3)) + [(h, _info(h)) for h in TREES.values()]
    for h, info in trees:
        P = torch.eye(h.num_leaves, dtype=torch.float64)
        leaves = torch.arange(h.num_leaves)
        for name, params in DECODABLE:
            m = _metric(h, name, params)
            out = m.decode(P)
            if m.kind == "set":
                paths = torch.zeros(h.num_leaves, h.num_nodes + 1, dtype=torch.bool)
                paths.scatter_(1, h.ancestors[: h.num_leaves], True)
                assert torch.equal(out, paths[:, : h.num_nodes]), (name, info)
            elif root_threshold(name, params):
                assert bool((out == h.root).all()), name  # threshold (1 + c) / 2 >= 1: nothing qualifies
            else:
                assert torch.equal(out, leaves), (name, info, out)
            e = m.expected(P, out)
            if not params.get("c"):  # the exact prediction scores the metric's best value (c charges its depth)
                torch.testing.assert_close(e, torch.full_like(e, 1.0 if m.higher_is_better else 0.0))
            preds = [ref.mask_to_set(o) for o in out.numpy()] if m.kind == "set" else out.tolist()
            want = [ref.expected(info, name, P[y].numpy(), preds[y], **params) for y in range(h.num_leaves)]
            torch.testing.assert_close(e, torch.tensor(want, dtype=e.dtype), rtol=1e-12, atol=1e-12)
        for name, params in HEURISTICS:
            assert torch.equal(hd.get_decoder(name, h, **params).decode(P), leaves), (name, info)


def test_uniform_distributions_follow_the_tie_rules_exactly():
    # Full binary trees: 1/L is dyadic, every node sum is exact, so ties are exact ties.
    for depth in (1, 2, 3):
        par = ref.full_tree(2, depth)
        h, info = Hierarchy.from_parents(par), ref.TreeInfo(par)
        p = np.full(info.L, 1.0 / info.L)
        x = torch.as_tensor(p)
        for name, params in HEURISTICS:
            got = int(hd.get_decoder(name, h, **params).decode(x))
            assert got == ref.heuristic(name, info, p, **params), (name, depth)
        for name, params in DECODABLE:
            # Ties are decided on computed values: the dense strategies sum a symmetric node's costs in
            # another order, so mathematically tied nodes can differ in the last bit; the structural
            # sums are bitwise equal on symmetric subtrees.
            extra = {"strategy": "structural"} if "structural" in strategies(name) else {}
            m = _metric(h, name, params, **extra)
            got = m.decode(x)
            pred = ref.mask_to_set(got.numpy()) if m.kind == "set" else int(got)
            assert ref.is_optimal(info, name, p, pred, **params), (name, depth, pred)
            if name.startswith("tree_distance"):  # the closed form of SPEC §4.1 decides ties
                assert pred == ref.tree_distance_closed_form(info, p, **params), (name, depth, pred)
            elif m.kind != "set":  # among the exact optima: deepest, then smallest id (leaf metrics: smallest id)
                _, opt = ref.optimal(info, name, p, **params)
                key = (lambda n: -n) if m.kind == "leaf" else (lambda n: (info.depth[n], -n))
                assert pred == max(opt, key=key), (name, depth, pred, opt)
        assert int(hd.get_metric("accuracy", h).decode(x)) == 0
        assert int(hd.get_metric("tree_distance", h).decode(x)) == h.root
        assert int(hd.get_decoder("top_down", h).decode(x)) == 0  # smallest child at every step


def test_exact_ties_between_leaves_at_different_depths():
    # r -> a (leaf, depth 1), r -> x -> {b, c}; p = (1/2, 1/2, 0): leaves a and b tie for lca_height
    h = Hierarchy.from_dict({"r": ["a", "x"], "x": ["b", "c"]}, leaf_order=["a", "b", "c"])
    x = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    lca = hd.get_metric("lca_height", h)
    e = lca.expected(x.expand(3, -1), torch.arange(3))
    assert e.tolist() == [1.0, 1.0, 1.5]
    assert int(lca.decode(x)) == 1  # the deeper leaf, then the smallest id
    assert int(hd.get_decoder("crm", h).decode(x)) == 1  # crm = optimal lca_height, ties included
    assert int(hd.get_metric("accuracy", h).decode(x)) == 0
    assert int(hd.get_decoder("argmax_leaf", h).decode(x)) == 0
    assert int(hd.get_metric("tree_distance", h).decode(x)) == h.root  # p = 1/2 is not > 1/2
    assert int(hd.get_decoder("majority", h).decode(x)) == h.root
    assert int(hd.get_decoder("plurality", h).decode(x)) == h.root  # a and x tie: neither beats the other
    # decisions on ties are deterministic: the same answer whatever the batch around them
    P = torch.stack([x, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), x])
    for label, decode, kind, _ in _decoders(h):
        out = decode(P)
        assert torch.equal(out[0], out[2]) and torch.equal(out[0], decode(x)), label


def test_zero_probability_subtrees_are_never_predicted():
    rng = np.random.default_rng(5)
    for h, info in random_trees(12, 12, num_nodes_max=14, unary_prob=0.3):
        # zero out the subtree of a random non-root node (keeping some mass elsewhere)
        P = np.stack([ref.random_distribution(rng, info.L, "dirichlet") for _ in range(4)])
        for b in range(4):
            n = int(rng.integers(0, info.N))
            if n == info.root:
                continue
            under = info.leaves_under(n)
            if len(under) == info.L:
                continue
            if P[b, under].sum() >= P[b].sum() - 1e-9:
                continue
            P[b, under] = 0.0
            P[b] /= P[b].sum()
        x = torch.as_tensor(P)
        node = hd.node_probabilities(h, x)
        for label, decode, kind, _ in _decoders(h):
            out = decode(x)
            if kind == "set":
                assert bool((node[out] > 0).all()), (label, info)
            else:
                assert bool((node.gather(1, out[:, None]) > 0).all()), (label, info, out)


# --------------------------------------------------------------------------- special trees
@pytest.mark.parametrize("tree", ["one_leaf", "chain"])
def test_one_leaf_trees(tree):
    """Root -> leaf, or a unary chain: every decoder returns the leaf (sets: the whole tree)."""
    h = TREES[tree]
    info = _info(h)
    assert h.num_leaves == 1
    x = torch.ones(3, 1, dtype=torch.float64)
    for label, decode, kind, root_only in _decoders(h):
        out = decode(x)
        if kind == "set":
            assert bool(out.all()), label
        elif root_only:
            assert bool((out == h.root).all()), label
        else:
            assert bool((out == 0).all()), (label, out)
    full = torch.ones(3, h.num_nodes, dtype=torch.bool)
    for name, params in METRICS:  # the only leaf, or the whole tree: the exact prediction
        m = _metric(h, name, params)
        exact = full if m.kind == "set" else torch.zeros(3, dtype=torch.long)
        e = m.expected(x, exact)
        if not params.get("c"):  # the metric's best value (c charges the leaf's depth)
            torch.testing.assert_close(e, torch.full_like(e, 1.0 if m.higher_is_better else 0.0), rtol=0, atol=1e-15)
        want = ref.expected(info, name, [1.0], info.ancestor_set(0) if m.kind == "set" else 0, **params)
        assert e.tolist() == pytest.approx([want] * 3, rel=1e-12, abs=1e-12), (name, params)
    for name, value in [("accuracy", 1.0), ("tree_distance", 0.0), ("wu_palmer", 1.0), ("zhao", 1.0),
                        ("lca_height", 0.0)]:  # exactly, with the default parameters
        assert hd.get_metric(name, h).expected(x, torch.zeros(3, dtype=torch.long)).tolist() == [value] * 3, name
    for name in ("hf_beta", "jaccard"):
        assert hd.get_metric(name, h).expected(x, full).tolist() == [1.0] * 3
    assert hd.get_metric("zhao", h)(torch.tensor([h.root]), torch.tensor([0])).tolist() == [1.0]
    assert hd.calibrate_darts(h, x, torch.zeros(3, dtype=torch.long), 1.0) == 0.0


def test_chain_node_probabilities_and_ties_go_deep():
    h = Hierarchy.from_parents([1, 2, 3, -1, 3])  # chain 3 -> 2 -> 1 -> 0 plus a leaf 4 under the root
    h = Hierarchy.from_parents(h.parents_list)
    x = torch.tensor([[0.75, 0.25]], dtype=torch.float64)
    node = hd.node_probabilities(h, x)
    assert node[0].tolist()[: h.num_leaves] == [0.75, 0.25]
    chain = [n for n in range(h.num_nodes) if float(node[0, n]) == 0.75]
    deepest = max(chain, key=lambda n: int(h.depth[n]))
    assert deepest == 0
    for name in ("majority", "plurality", "expected_information"):
        assert int(hd.get_decoder(name, h).decode(x)[0]) == 0, name  # unary chain: the deepest node wins
    assert int(hd.get_metric("tree_distance", h).decode(x)[0]) == 0


def test_star_with_100k_leaves():
    L = 100_000
    h = Hierarchy.from_parents(ref.star_tree(L))
    x = torch.zeros(3, L)
    x[0] = 1.0 / L  # uniform
    x[1, 12345] = 1.0  # one-hot
    x[2, 7], x[2, 99_999] = 0.75, 0.25
    want = {"accuracy": [0, 12345, 7], "lca_height": [0, 12345, 7], "tree_distance": [L, 12345, 7],
            "wu_palmer": [0, 12345, 7], "zhao": [0, 12345, 7], "argmax_leaf": [0, 12345, 7], "majority": [L, 12345, 7],
            "top_down": [0, 12345, 7], "hie": [0, 12345, 7], "crm": [0, 12345, 7], "plurality": [L, 12345, 7]}
    for name, expected in want.items():
        dec = hd.get_metric(name, h) if name in hd.list_metrics() else hd.get_decoder(name, h)
        assert dec.decode(x).tolist() == expected, name
    for name in ("hf_beta", "hamming"):
        sets = hd.get_metric(name, h).decode(x)
        assert sets.shape == (3, L + 1) and bool(sets[:, L].all())
        assert sets[0].sum() == 1  # uniform: the root alone
        assert sets[1].nonzero().flatten().tolist() == [12345, L]
    # hF_1 of {root, 7} = 2 * (1 + 0.75) / (2 + 2) = 0.875 beats {root} (2/3) and {root, 7, 99999} (0.8)
    assert hd.get_metric("hf_beta", h).decode(x[2]).nonzero().flatten().tolist() == [7, L]


def test_leaves_at_very_different_depths():
    # leaves at depths 1..20 along a spine: node metrics against the brute-force reference
    h = caterpillar(20)
    info = _info(h)
    rng = np.random.default_rng(2)
    P = np.stack([ref.random_distribution(rng, info.L, k) for k in ("dirichlet", "peaked", "sparse")]
                 + [np.eye(info.L)[int(np.argmin(info.depth[: info.L]))]])
    x = torch.as_tensor(P)
    for name, params in DECODABLE:
        m = _metric(h, name, params)
        out = m.decode(x)
        for b in range(len(P)):
            if m.kind == "set":
                pred = ref.mask_to_set(out[b].numpy())
                assert ref.is_closed(info, pred) and info.root in pred
                sign = 1 if m.higher_is_better else -1
                mine = ref.expected(info, name, P[b], pred, **params)
                for n in range(info.N):  # every single path A(n) is a closed set too
                    assert sign * mine >= sign * ref.expected(info, name, P[b], n, **params) - 1e-12
            else:
                assert ref.is_optimal(info, name, P[b], int(out[b]), **params), (name, b)
    # set metrics against exhaustive enumeration on a shallower caterpillar (2^depth closed sets)
    h, info = caterpillar(8), _info(caterpillar(8))
    P = np.stack([ref.random_distribution(rng, info.L, k) for k in ("dirichlet", "peaked", "sparse")])
    for name, params in DECODABLE:
        if hd.metrics.metric_class(name).kind != "set":
            continue
        out = hd.get_metric(name, h, **params).decode(torch.as_tensor(P))
        for b in range(len(P)):
            assert ref.is_optimal(info, name, P[b], ref.mask_to_set(out[b].numpy()), **params), (name, b)


# --------------------------------------------------------------------------- batch, chunking, plan
#: Every registered decoder: the optimal decoder of every metric and every heuristic (the first case of
#: each parameter grid).
ALL_DECODERS = [("optimal", {"metric": n, **p}) for n, p in metric_pairs(decodable=True, full=False)] + \
    heuristic_pairs(full=False)
#: Optimal decoders whose decision on rows of multiples of 1/16 is computed without rounding on both plans
#: (node sums compared with dyadic thresholds, or weighted by integers).  The others weigh the
#: probabilities by non-dyadic numbers (1/(d+1), logarithms, depth ratios, 1/(β²|h|+|y|)) that the two
#: plans round in different orders, so a tie in exact arithmetic can go either way on either plan.
EXACT_ON_DYADIC = {"accuracy", "lca_height", "tree_distance", "tree_distance_c"}


def _all_decoders(h):
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
            for name, params, dec in _all_decoders(h):
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
def test_same_input_same_bits_for_every_public_output(plan):
    tiered = bundled("tieredimagenet-h")[0]
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


# --------------------------------------------------------------------------- gradients
def test_a_decoding_head_in_a_model_needs_no_no_grad():
    tiered = bundled("tieredimagenet-h")[0]
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
