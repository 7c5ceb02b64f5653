"""Self-checks of the NumPy oracle ``tests/reference.py``: known values, theorems, definitions and
enumeration.

These tests exercise only the oracle, never the library, so that the library tests built on it
compare against something trustworthy; the heuristics and their parameters come from the library's
registry through the harness, so that a registered decoder without a reference fails here.
"""

import math

import numpy as np
import pytest

import reference as ref
from harness import exact_on_dyadic, heuristic_pairs, metric_names, returns_leaves


def _deep_siblings_tree(depth):
    """A chain from the root down to depth-1, then two sibling leaves at ``depth``."""
    # leaves 0, 1; internal 2..depth+1; node 2 is their parent (depth-1), root = depth+1.
    parents = [2, 2] + [i + 1 for i in range(2, depth + 1)] + [-1]
    return np.array(parents)


def _trees(seed, count, **kw):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield rng, ref.TreeInfo(ref.random_tree(rng, **kw))


# --------------------------------------------------------------------------- trees

def test_small_constructors():
    assert ref.chain_tree(1).tolist() == [-1]
    assert ref.chain_tree(3).tolist() == [1, 2, -1]
    assert ref.star_tree(3).tolist() == [3, 3, 3, -1]
    info = ref.TreeInfo(ref.chain_tree(2))  # 1-leaf tree: root -> leaf
    assert (info.N, info.L, info.root) == (2, 1, 1)
    assert info.info.tolist() == [0.0, 0.0]
    full = ref.TreeInfo(ref.full_tree(2, 3))
    assert (full.N, full.L, full.max_depth) == (15, 8, 3)
    assert all(full.depth[l] == 3 for l in full.leaves)


def test_canonicalize_and_validation():
    parents = np.array([-1, 0, 0, 1, 1])  # root 0; leaves 2, 3, 4
    canon, new_id = ref.canonicalize(parents, return_perm=True)
    assert ref.is_canonical(canon)
    assert new_id.tolist() == [3, 4, 0, 1, 2]
    assert canon.tolist() == [3, 4, 4, -1, 3]
    with pytest.raises(ValueError):
        ref.TreeInfo(parents)  # not canonical
    for bad in ([-1, -1], [1, 0], [0], [], [2, 2, 5]):
        with pytest.raises(ValueError):
            ref.TreeInfo(np.array(bad, dtype=np.int64))


def test_random_trees_are_canonical_and_varied():
    rng = np.random.default_rng(0)
    varied = unary = root_elsewhere = 0
    for _ in range(300):
        parents = ref.random_tree(rng)
        assert ref.is_canonical(parents)
        info = ref.TreeInfo(parents)
        assert 2 <= info.L and info.N <= 12
        varied += len({int(info.depth[l]) for l in info.leaves}) > 1
        unary += any(len(c) == 1 for c in info.children)
        root_elsewhere += info.root != info.N - 1
    assert varied > 150 and unary > 150 and root_elsewhere > 100
    one_leaf = [ref.TreeInfo(ref.random_tree(rng, num_nodes_max=4, min_leaves=1)).L for _ in range(200)]
    assert 1 in one_leaf
    for _ in range(50):
        info = ref.TreeInfo(ref.random_tree(rng, unary_prob=0.0, forbid_unary=True))
        assert all(len(c) != 1 for c in info.children)


def test_treeinfo_quantities():
    for _, info in _trees(1, 60, num_nodes_max=14):
        for n in range(info.N):
            anc = info.ancestors(n)
            assert anc[0] == n and anc[-1] == info.root and len(anc) == info.depth[n] + 1
            lu = info.leaves_under(n)
            assert info.leaf_count[n] == len(lu)
            assert info.dmin[n] == min(info.depth[l] for l in lu)
            assert info.height[n] == max(info.depth[l] for l in lu) - info.depth[n]
            assert math.isclose(info.info[n], math.log(info.L / len(lu)))
            for m in range(info.N):
                common = set(info.ancestors(n)) & set(info.ancestors(m))
                assert info.lca(n, m) == max(common, key=lambda a: info.depth[a])


def test_node_probs_parent_is_sum_of_children():
    for rng, info in _trees(2, 60):
        p = ref.random_distribution(rng, info.L, "random")
        pn = ref.node_probs(info, p)
        assert math.isclose(pn[info.root], 1.0, rel_tol=1e-12)
        for n in range(info.N):
            if info.children[n]:
                assert math.isclose(pn[n], sum(pn[c] for c in info.children[n]), rel_tol=1e-12, abs_tol=1e-15)
            else:
                assert pn[n] == p[n]


def test_random_distributions():
    rng = np.random.default_rng(3)
    for kind in ref.DISTRIBUTION_KINDS + ("random",):
        for L in (1, 2, 7):
            p = ref.random_distribution(rng, L, kind)
            assert p.shape == (L,) and np.all(p >= 0) and math.isclose(p.sum(), 1.0, rel_tol=1e-12)
    assert np.sum(ref.random_distribution(rng, 20, "sparse") == 0) >= 10
    assert np.sum(ref.random_distribution(rng, 20, "onehot") == 1) == 1
    d = ref.random_distribution(rng, 5, "dyadic")
    assert np.all(d * 16 == np.round(d * 16)) and d.sum() == 1.0


# --------------------------------------------------------------------------- metrics

def test_known_metric_values():
    info = ref.TreeInfo(_deep_siblings_tree(9))
    assert info.depth[0] == info.depth[1] == 9
    assert math.isclose(ref.wu_palmer(info, 0, 1), 8 / 9)
    assert ref.wu_palmer(info, 0, 0) == 1.0
    assert ref.wu_palmer(info, info.root, 0) == 0.0
    assert ref.tree_distance(info, 0, 1) == 2.0
    assert ref.tree_distance(info, info.root, 1) == 9.0
    assert ref.tree_distance_c(info, 0, 1, c=0.5) == 2.0 + 4.5
    assert ref.lca_height(info, 0, 1) == 1.0 and ref.lca_height(info, 1, 1) == 0.0
    assert ref.accuracy(info, 1, 1) == 1.0 and ref.accuracy(info, 2, 1) == 0.0
    # Zhao: I(leaf) = log 2, I(parent of both) = 0.
    assert ref.zhao(info, 0, 1) == 0.0 and ref.zhao(info, 0, 0) == 1.0
    # Sets: exact target set.
    a1 = info.ancestor_set(1)
    for beta in (0.5, 1.0, 2.0):
        assert ref.hf_beta(info, a1, 1, beta=beta) == pytest.approx(1.0)
        assert ref.hf_beta(info, 1, 1, beta=beta) == pytest.approx(1.0)
    assert ref.hamming(info, a1, 1) == 0.0 and ref.jaccard(info, a1, 1) == 1.0
    # Sibling as a set: 9 of 10 shared, |h+| = |y+| = 10.
    assert ref.hf_beta(info, {0}, 1) == pytest.approx(0.9)
    assert ref.hamming(info, ref.set_to_mask(info, a1 - {1} | {0}), 1) == pytest.approx(0.2)
    assert ref.jaccard(info, [0], 1) == pytest.approx(9 / 11)
    # Degenerate trees.
    single = ref.TreeInfo(ref.chain_tree(1))
    assert ref.wu_palmer(single, 0, 0) == 1.0 and ref.zhao(single, 0, 0) == 1.0
    one_leaf = ref.TreeInfo(ref.chain_tree(2))
    assert ref.wu_palmer(one_leaf, 1, 0) == 0.0 and ref.zhao(one_leaf, 1, 0) == 1.0


def test_zhao_and_hf_closed_forms():
    for rng, info in _trees(4, 40):
        for h in range(info.N):
            for y in info.leaves:
                a = info.lca(h, y)
                assert ref.zhao(info, h, y) == pytest.approx(
                    2 * math.log(info.L / info.leaf_count[a])
                    / (math.log(info.L / info.leaf_count[h]) + math.log(info.L)))
        for s in list(ref.closed_sets_frozen(info))[:30]:
            for y in info.leaves:
                inter = len(s & info.ancestor_set(y))
                for beta in (0.5, 2.0):
                    closed = (1 + beta**2) * inter / (len(s) + beta**2 * (info.depth[y] + 1))
                    assert ref.hf_beta(info, s, y, beta=beta) == pytest.approx(closed, rel=1e-12)


def test_cost_matrix_and_expected():
    for rng, info in _trees(5, 20):
        p = ref.random_distribution(rng, info.L, "dirichlet")
        for name in ("wu_palmer", "zhao", "tree_distance", "hf_beta", "lca_height", "accuracy"):
            C = ref.cost_matrix(info, name)
            assert C.shape == (info.N, info.L)
            for l in info.leaves:
                assert C[l, l] == pytest.approx(0.0, abs=1e-15)  # exact prediction costs 0
            for h in range(info.N):
                e = ref.expected(info, name, p, h)
                ce = ref.expected(info, C, p, h)
                assert ce == pytest.approx(1 - e if ref.higher_is_better(name) else e, abs=1e-12)
        if min(info.depth[l] for l in info.leaves) >= 1:
            assert np.all(ref.cost_matrix(info, "wu_palmer")[info.root] == 1.0)
        for l in info.leaves:
            assert ref.expected(info, "accuracy", p, l) == p[l]


def test_dense_costs_match_the_definitions():
    """The vectorized dense costs equal the definitions' loops, for every registered node metric;
    single-node and 1-leaf trees included (the 0/0 conventions)."""
    trees = [info for _, info in _trees(14, 40, num_nodes_max=13, unary_prob=0.3, min_leaves=1)]
    trees += [ref.TreeInfo(ref.chain_tree(1)), ref.TreeInfo(ref.chain_tree(3))]
    params = {"tree_distance_c": {"c": 0.7}}
    for info in trees:
        for name in metric_names():
            if ref.metric_kind(name) == "set":
                continue
            kw = params.get(name, {})
            np.testing.assert_allclose(ref.dense_cost(info, name, **kw), ref.cost_matrix(info, name, **kw),
                                       rtol=0, atol=1e-14, err_msg=f"{name} {info}")


# --------------------------------------------------------------------------- closed sets

def test_closed_set_counts():
    for n in range(1, 8):
        assert len(list(ref.closed_sets(ref.TreeInfo(ref.chain_tree(n))))) == n
    for k in range(1, 8):
        assert len(list(ref.closed_sets(ref.TreeInfo(ref.star_tree(k))))) == 2 ** k
    for _, info in _trees(6, 40, num_nodes_max=13):
        sets = list(ref.closed_sets_frozen(info))
        assert len(sets) == len(set(sets)) == ref.count_closed_sets(info)
        for s in sets:
            assert info.root in s and ref.is_closed(info, s)
        masks = list(ref.closed_sets(info))
        assert {ref.mask_to_set(m) for m in masks} == set(sets)
        # every node's ancestor set is one of them
        assert all(info.ancestor_set(n) in set(sets) for n in range(info.N))


# --------------------------------------------------------------------------- optimal decoding

def test_tree_distance_bruteforce_equals_theorem_and_majority():
    for rng, info in _trees(7, 80):
        for kind in ("dirichlet", "peaked", "sparse", "dyadic", "onehot"):
            p = ref.random_distribution(rng, info.L, kind)
            best, opt = ref.optimal(info, "tree_distance", p)
            rule = ref.tree_distance_closed_form(info, p)
            assert rule in opt
            assert ref.heuristic("majority", info, p) == rule
            assert ref.expected(info, "tree_distance", p, rule) == pytest.approx(best, abs=1e-12)
            for c in (0.3, 1.5):
                best_c, opt_c = ref.optimal(info, "tree_distance_c", p, c=c)
                assert ref.tree_distance_closed_form(info, p, c=c) in opt_c


def test_hamming_bruteforce_equals_closed_form():
    for rng, info in _trees(8, 40, num_nodes_max=10):
        p = ref.random_distribution(rng, info.L, "random")
        best, opt = ref.optimal(info, "hamming", p)
        assert ref.hamming_closed_form(info, p) in opt


def test_hf_beta_bruteforce_respects_safe_bound():
    """SPEC §4.3: every node of an optimal hF_beta set satisfies the corrected bound."""
    for rng, info in _trees(9, 40, num_nodes_max=10):
        p = ref.random_distribution(rng, info.L, "random")
        pn = ref.node_probs(info, p)
        for beta in (0.5, 1.0, 2.0):
            best, opt = ref.optimal(info, "hf_beta", p, beta=beta)
            assert 0 < best <= 1
            for s in opt:
                assert ref.is_closed(info, s) and info.root in s
                assert ref.is_optimal(info, "hf_beta", p, s, beta=beta)
                for n in s:
                    assert pn[n] >= ref.hf_beta_safe_bound(info, n, beta) - 1e-12
                    if n != info.root:  # the decoder's stage-2 pruning (metrics/hf_beta.py)
                        assert pn[n] >= ref.hf_beta_value_bound(info, n, beta, best) - 1e-12


def test_hf_beta_value_bound_is_tight_somewhere():
    """The value bound is not vacuous: on some inputs an optimal set holds a node within 40% of it."""
    ratios = []
    for rng, info in _trees(12, 30, num_nodes_max=10):
        p = ref.random_distribution(rng, info.L, "random")
        pn = ref.node_probs(info, p)
        best, opt = ref.optimal(info, "hf_beta", p, beta=1.0)
        ratios += [pn[n] / ref.hf_beta_value_bound(info, n, 1.0, best) for s in opt for n in s if n != info.root]
    assert min(ratios) >= 1 - 1e-9 and min(ratios) < 1.4


def test_optimal_simple_cases():
    info = ref.TreeInfo(ref.star_tree(3))
    p = np.array([1.0, 0.0, 0.0])
    assert ref.optimal(info, "hf_beta", p) == (1.0, {frozenset({0, 3})})
    assert ref.optimal(info, "accuracy", p) == (1.0, {0})
    # uniform on a star: every leaf ties for accuracy and lca_height
    u = np.full(3, 1 / 3)
    assert ref.optimal(info, "accuracy", u)[1] == {0, 1, 2}
    assert ref.optimal(info, "lca_height", u)[1] == {0, 1, 2}
    # Wu-Palmer on a uniform star: root scores 0, a leaf scores 1/3.
    best, opt = ref.optimal(info, "wu_palmer", u)
    assert best == pytest.approx(1 / 3) and opt == {0, 1, 2}
    # custom cost matrix equals the named metric
    C = ref.cost_matrix(info, "zhao")
    assert ref.optimal(info, C, u)[1] == ref.optimal(info, "zhao", u)[1]
    assert not ref.is_optimal(info, "accuracy", p, 3)


def test_crm_and_leaf_metrics():
    for rng, info in _trees(10, 40):
        for kind in ("random", "dyadic"):
            p = ref.random_distribution(rng, info.L, kind)
            _, opt = ref.optimal(info, "lca_height", p)
            crm = ref.heuristic("crm", info, p)
            assert crm in opt
            if kind == "dyadic":  # exact sums: exact ties, decided by the rule (deeper, then smaller id)
                assert crm == max(opt, key=lambda l: (info.depth[l], -l)), (info, p, opt)
            _, opt = ref.optimal(info, "accuracy", p)
            assert ref.heuristic("argmax_leaf", info, p) == min(opt)


# --------------------------------------------------------------------------- heuristics

def _applies(name, kw, info):
    """False for an information threshold above log L (no node qualifies: the decoder refuses)."""
    return name != "information_threshold" or kw["threshold"] <= math.log(info.L)


def test_heuristics_on_onehot():
    for rng, info in _trees(11, 40):
        p = ref.random_distribution(rng, info.L, "onehot")
        leaf = int(np.argmax(p))
        for name, kw in heuristic_pairs() + [("confidence_threshold", {"tau": 0.9})]:
            if _applies(name, kw, info):
                assert ref.heuristic(name, info, p, **kw) == leaf, (name, kw)


def test_unary_chain_goes_deeper():
    # root 4 -> 3 -> 2 -> {0, 1}: nodes 3 and 2 ... 4 -> 3 is unary, 3 -> 2 unary.
    info = ref.TreeInfo(np.array([2, 2, 3, 4, -1]))
    p = np.array([0.5, 0.5])
    assert ref.heuristic("majority", info, p) == 2          # p = 1 on the chain 4, 3, 2: deepest
    assert ref.heuristic("confidence_threshold", info, p, tau=0.0) in (0, 1)
    assert ref.heuristic("plurality", info, p) == 2
    assert ref.heuristic("darts", info, p, lam=1.0) == 2    # (0+1)*1 = 1 on the chain; leaves (log2+1)/2 < 1
    assert ref.heuristic("information_threshold", info, p, threshold=0.0) == 2
    # exact: only the bottom of the chain (4 and 3 are shadowed by the deeper 2)
    assert ref.heuristic_candidates("majority", info, p, tol=0.0) == {2}
    # leaves sit exactly on the threshold p = 1/2: with tolerance either side is allowed
    assert ref.heuristic_candidates("majority", info, p) == {0, 1, 2}
    assert ref.heuristic_candidates("confidence_threshold", info, p, tau=0.0) == {0, 1}
    assert ref.heuristic_candidates("darts", info, p, lam=1.0) == {2}
    with pytest.raises(ValueError, match="threshold"):
        ref.heuristic("information_threshold", info, p, threshold=1.0)
    for tau in (-0.1, 1.0):
        with pytest.raises(ValueError, match="tau"):
            ref.heuristic("confidence_threshold", info, p, tau=tau)


def test_plurality_definition_and_candidates():
    """Every heuristic's answer (its rule: ``reference.heuristic``) is one its definition allows (the candidate
    sets), and, where its keys are exact (dyadic p), one of the exact ties (tol = 0)."""
    for rng, info in _trees(12, 60):
        for kind in ("dirichlet", "dyadic", "sparse", "uniform"):
            p = ref.random_distribution(rng, info.L, kind)
            pn = ref.node_probs(info, p)
            # plurality answer qualifies (for dyadic p the sums are exact)
            n = ref.heuristic("plurality", info, p)
            if kind == "dyadic":
                assert all(pn[n] > pn[z] for z in range(info.N) if z not in info.ancestor_set(n))
            for name, kw in heuristic_pairs():
                if not _applies(name, kw, info):
                    continue
                ans = ref.heuristic(name, info, p, **kw)
                cands = ref.heuristic_candidates(name, info, p, **kw)
                assert ans in cands, (name, kw, kind)
                assert cands <= set(range(info.N))
                if returns_leaves(name):
                    assert all(c < info.L for c in cands)
                if kind == "dyadic" and exact_on_dyadic(name):
                    assert ans in ref.heuristic_candidates(name, info, p, tol=0.0, **kw), (name, kw, info, p)


def test_darts_and_information_threshold_by_definition():
    for rng, info in _trees(13, 40):
        p = ref.random_distribution(rng, info.L, "dirichlet")
        pn = ref.node_probs(info, p)
        for lam in (0.0, 0.5, 3.0):
            n = ref.heuristic("darts", info, p, lam=lam)
            assert all((info.info[n] + lam) * pn[n] >= (info.info[m] + lam) * pn[m] for m in range(info.N))
        n = ref.heuristic("information_threshold", info, p, threshold=0.0)
        assert pn[n] == max(pn)
        assert info.leaf_count[n] == min(info.leaf_count[m] for m in range(info.N) if pn[m] == pn[n])
        n = ref.heuristic("hie", info, p)
        scores = [pn[info.parents[l]] * p[l] for l in info.leaves]
        assert scores[n] == max(scores)


# --------------------------------------------------------------------------- Jaccard's enumeration

def test_jaccard_enumeration_is_every_closed_set_with_the_counting_formula():
    """The exhaustive Jaccard table holds every closed set once, and its values equal the counting form
    |S ∩ y⁺| / (|S| + d(y) + 1 − |S ∩ y⁺|) computed by matrix products."""
    for _, info in _trees(1, 30, num_nodes_max=10, unary_prob=0.3, min_leaves=1):
        enum = ref.JaccardEnumeration(info)
        assert len(enum.sets) == ref.count_closed_sets(info)
        assert {ref.mask_to_set(m) for m in enum.sets} == set(ref.closed_sets_frozen(info))
        inc = np.zeros((info.N, info.L))
        for y in info.leaves:
            inc[info.ancestors(y), y] = 1
        inter = enum.sets.astype(float) @ inc
        want = inter / (enum.k[:, None] + (info.depth[: info.L] + 1)[None, :] - inter)
        np.testing.assert_allclose(enum.J, want, rtol=0, atol=1e-15)
