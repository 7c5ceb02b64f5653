"""Degenerate inputs with defined answers: empty batches, single samples, one-hot and uniform
distributions, exact ties, zero-probability subtrees, one-leaf trees, chains, a 100k-leaf star,
and leaves at very different depths."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from hdecode_torch import Hierarchy
from harness import (
    case_id, expect_warnings, heuristic_pairs, metric_pairs, random_trees, returns_leaves, root_threshold, strategies,
)

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


def test_hf_beta_with_a_huge_beta_in_float32():
    """(1+β²)/(k+β²(e+1)) was inf/inf once β² overflowed; the weights are now written with r = 1/(1+β²)."""
    h = TREES["small"]
    x = torch.tensor([0.4, 0.1, 0.3, 0.1, 0.1], dtype=torch.float64)
    m = hd.get_metric("hf_beta", h, beta=1e20)
    assert bool(m.decode(x).all())  # float64: correct, the whole tree
    assert torch.equal(m.decode(x.float()), m.decode(x))


def test_float32_node_sums_on_a_very_wide_node():
    """Sequential float32 accumulation over 100k children drifted by 1e-3; wide nodes sum in float64."""
    n = 100_000
    h = hd.Hierarchy.from_parents([n] * n + [-1])
    p = torch.full((2, n), 1.0 / n, dtype=torch.float32)
    root = hd.node_probabilities(h, p)[:, h.root]
    assert root.dtype == torch.float32
    assert float((root - 1).abs().max()) < 1e-6
    assert int(hd.get_metric("tree_distance", h).decode(p)[0]) == h.root
