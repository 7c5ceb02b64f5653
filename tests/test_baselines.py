"""The benchmark's per-sample NumPy baselines (``benchmarks/baselines.py``) against the oracle.

The benchmark times the library against these baselines and checks that their predictions agree; they
are a second implementation, not an oracle, so they are checked here against ``reference.py``: their
values against the definitions, their decoders against brute force and the heuristics' rules.
"""

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from benchmarks import baselines
from benchmarks.baselines import Baselines, expected_score
from harness import bundled, exact_on_dyadic, heuristic_pairs, metric_names, metric_pairs, model_like
from test_jaccard import KINDS, decode, distribution, small_trees  # Jaccard's tree and row makers


def _trees(seed, count, **kw):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield rng, ref.TreeInfo(ref.random_tree(rng, **kw))


def test_baselines_values_match_the_definitions():
    """The benchmark's vectorized values (dense costs, expected scores) equal the definitions', for every
    registered metric; single-node and 1-leaf trees included (the 0/0 conventions)."""
    trees = [info for _, info in _trees(14, 40, num_nodes_max=13, unary_prob=0.3, min_leaves=1)]
    trees += [ref.TreeInfo(ref.chain_tree(1)), ref.TreeInfo(ref.chain_tree(3))]
    rng = np.random.default_rng(15)
    params = {"tree_distance_c": {"c": 0.7}, "hf_beta": {"beta": 0.5}}
    for info in trees:
        t = Baselines(info.parents).t
        p = ref.random_distribution(rng, info.L, "random")
        for name in metric_names():
            kw = params.get(name, {})
            if name in baselines.NODE_METRICS:
                np.testing.assert_allclose(baselines.dense_cost(t, name, **kw), ref.cost_matrix(info, name, **kw),
                                           rtol=0, atol=1e-14)
            preds = list(range(info.N))
            if ref.metric_kind(name) == "set":
                preds = [ref.set_to_mask(info, s) for s in list(ref.closed_sets_frozen(info))[:20]]
            for pred in preds:
                assert baselines.expected_score(t, name, pred, p, **kw) == pytest.approx(
                    ref.expected(info, name, p, pred, **kw), rel=1e-12, abs=1e-14), (name, info)


def test_baseline_heuristics_follow_their_rules():
    """Every heuristic baseline returns a node its definition allows, and on dyadic rows (exact sums),
    where its keys are exact, the reference's node, ties included."""
    for rng, info in _trees(16, 40, num_nodes_max=12, unary_prob=0.3):
        base = Baselines(info.parents)
        for kind in ("dirichlet", "dyadic", "sparse", "uniform"):
            p = ref.random_distribution(rng, info.L, kind)
            for name, kw in heuristic_pairs():
                if name == "information_threshold" and kw["threshold"] > np.log(info.L):
                    continue
                got = int(base.decoder(name, **kw)(p))
                assert got in ref.heuristic_candidates(name, info, p, **kw), (name, kw, info, p)
                if kind == "dyadic" and exact_on_dyadic(name):
                    assert got == ref.heuristic(name, info, p, **kw), (name, kw, info, p)


def test_baseline_optimal_decoders_are_optimal():
    """Every metric's baseline decoder reaches the brute-force optimum (every closed set for set metrics),
    and the closed forms and hF_β bounds are the reference's."""
    for rng, info in _trees(17, 25, num_nodes_max=10, unary_prob=0.3):
        base = Baselines(info.parents)
        for kind in ("dirichlet", "peaked", "dyadic"):
            p = ref.random_distribution(rng, info.L, kind)
            for name, kw in metric_pairs(decodable=True, full=False):
                got = base.decoder(name, **kw)(p)
                pred = ref.mask_to_set(got) if ref.metric_kind(name) == "set" else int(got)
                assert ref.is_optimal(info, name, p, pred, **kw), (name, kw, info, p)
            if kind == "dyadic":  # exact sums: the same node and set
                assert base.tree_distance_c(p, c=0.5) == ref.tree_distance_closed_form(info, p, c=0.5)
                assert ref.mask_to_set(base.hamming(p)) == ref.hamming_closed_form(info, p)
        for beta in (0.5, 2.0):
            np.testing.assert_allclose(baselines.hf_beta_safe_bound(base.t, beta),
                                       [ref.hf_beta_safe_bound(info, n, beta) for n in range(info.N)], rtol=1e-15)
            np.testing.assert_allclose(baselines.hf_beta_value_bound(base.t, beta),
                                       [ref.hf_beta_value_bound(info, n, beta, 1.0) for n in range(info.N)],
                                       rtol=1e-15)


def test_jaccard_baseline_matches_library():
    """The Jaccard baseline scores as the library does on the bundled trees (both exact: the library
    against the slow knapsack in test_jaccard.py, the baseline against enumeration below), and its
    float64 scoring of a set agrees with the library's."""
    for tree in ("tieredimagenet-h", "inat19"):
        h, _ = bundled(tree)
        rng = np.random.default_rng(11)
        P = np.concatenate([model_like(rng, h, 2, kind) for kind in ("peaked", "diffuse", "shallow")])
        base = Baselines(np.asarray(h.parents_list))
        lib = decode(h, P).numpy()
        mine = np.stack([base.jaccard(p) for p in P])
        scores = np.array([expected_score(base.t, "jaccard", s, p) for s, p in zip(mine, P)])
        np.testing.assert_allclose([expected_score(base.t, "jaccard", s, p) for s, p in zip(lib, P)], scores,
                                   rtol=1e-12)
        np.testing.assert_allclose(hd.get_metric("jaccard", h).expected(torch.as_tensor(P), torch.as_tensor(mine)),
                                   scores, rtol=1e-12)


def test_jaccard_baseline_exact_on_small_trees():
    rng = np.random.default_rng(12)
    for par, info, _ in small_trees(13, 50):
        enum = ref.JaccardEnumeration(info)
        base = Baselines(par)
        for kind in KINDS:
            p = distribution(rng, info, kind)
            assert enum.value_of(base.jaccard(p), p) == pytest.approx(enum.values(p[None]).max(), abs=1e-12)


