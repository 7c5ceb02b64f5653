"""Every Bayes-optimal decoder against exhaustive oracles: brute force over nodes, enumeration of
every ancestor-closed set on small random trees, and slow exact references on the bundled trees."""

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import hdecode_torch as hd
import reference as ref
from harness import (
    batch, bundled, dense_cost, heuristic_pairs, metric_cases, metric_names, metric_pairs, model_like, random_trees,
    silence_root_threshold, strategies, tolerance,
)
from testing import DEVICES, Tester, grid

DECODABLE = metric_pairs(decodable=True)
#: Metrics with explicit decoding strategies (their classes declare STRATEGIES), and those with the
#: structural candidate filter (strategy "candidates").
STRATEGY_METRICS = [n for n in metric_names(decodable=True) if strategies(n) != [None]]
CANDIDATE_METRICS = [n for n in STRATEGY_METRICS if "candidates" in strategies(n)]


def _pred_for_ref(m, pred_row):
    if m.kind == "set":
        return np.asarray(pred_row, dtype=bool)
    return int(pred_row)


def _check_optimal(info, name, params, P, pred, m, rtol=1e-9):
    for b in range(P.shape[0]):
        best, _ = ref.optimal(info, name, P[b], **params)
        got = ref.expected(info, name, P[b], _pred_for_ref(m, pred[b]), **params)
        assert got == pytest.approx(best, rel=rtol, abs=max(1e-12, rtol * 1e-3)), (name, params, b, P[b])


_OPTIMA = {}


def _optimum(info, name, params, p):
    """The brute-force best expected value of the row p, cached: every plan decodes the same rows."""
    key = (info.parents.tobytes(), name, tuple(sorted(params.items())), p.tobytes())
    if key not in _OPTIMA:
        _OPTIMA[key] = ref.optimal(info, name, p, **params)[0]
    return _OPTIMA[key]


@pytest.mark.parametrize("name,params", metric_cases(decodable=True))
@grid()
def test_exact_on_small_random_trees(name, params, plan, device, dtype):
    """Every registered decoder against brute force (enumeration of every closed set for set metrics),
    float64 exactly, float32 up to the rounding of its input, on both plans, by every entry point."""
    tester = Tester(plan, device, dtype)
    kind = hd.metrics.metric_class(name).kind
    rtol = tolerance(dtype)
    rng = np.random.default_rng(11)
    trees = 40 if kind != "set" else 25
    if dtype != torch.float64:
        trees //= 4
    for h, info in random_trees(7, trees, num_nodes_max=11):
        P = tester.rows(batch(rng, 10, info.L)).double().cpu().numpy()  # the rounded input is the distribution
        pred = tester.decode(h, name, P, **params).numpy()
        for b in range(P.shape[0]):
            got = ref.expected(info, name, P[b], pred[b].astype(bool) if kind == "set" else int(pred[b]), **params)
            assert got == pytest.approx(_optimum(info, name, params, P[b]), rel=rtol, abs=max(1e-12, rtol * 1e-3)), \
                (name, params, b, P[b])
        if kind == "set":
            assert pred[:, h.root].all()
            par = info.parents
            for row in pred:  # ancestor-closed
                nodes = np.flatnonzero(row)
                assert all(row[par[n]] for n in nodes if par[n] >= 0)


@pytest.mark.parametrize("device", DEVICES)
def test_hf_beta_on_trees_with_shallow_heavy_leaves(device):
    """Where the paper's Lemma 4.4 is wrong (SPEC §4.3): unbalanced trees, a heavy shallow leaf."""
    rng = np.random.default_rng(5)
    for h, info in random_trees(8, 25, num_nodes_max=12, deep_bias=0.6):
        P = batch(rng, 6, info.L)
        shallow = int(np.argmin(info.depth[: info.L]))
        P = 0.5 * P
        P[:, shallow] += 0.5
        for beta in (0.5, 1.0, 2.0):
            m = hd.get_metric("hf_beta", h.to(device), beta=beta)
            pred = m.decode(torch.as_tensor(P, device=device)).cpu().numpy()
            _check_optimal(info, "hf_beta", {"beta": beta}, P, pred, m)


def _slow_node_optimum(info, name, params, P):
    cost = dense_cost(info, name, **params)  # (N, L), lower is better
    if hd.metrics.metric_class(name).kind == "leaf":
        cost = cost[: info.L]
    return (P @ cost.T).min(1)


def _slow_hf_beta_optimum(info, P, beta):
    """Δ_k decomposition over *all* nodes (no pruning), in numpy.  k is capped by a direct bound:
    U(S) ≤ (1+β²)(D+1)/(k+β²) for |S⁺| = k, and U* ≥ U({root}) ≥ (1+β²)/(1+β²(D+1))."""
    b2 = beta * beta
    leaf_depth = np.asarray(info.depth[: info.L])
    big_d = leaf_depth.max()
    kmax = min(info.N, int((big_d + 1) * (1 + b2 * (big_d + 1)) - b2) + 1)
    inc = np.zeros((info.N, info.L))
    for l in range(info.L):
        inc[info.ancestors(l), l] = 1
    out = []
    for p in P:
        ks = np.arange(1, kmax + 1)[:, None]
        w = p[None, :] * (1 + b2) / (ks + b2 * (leaf_depth[None, :] + 1))  # (K, L)
        delta = -np.sort(-(w @ inc.T), axis=1)  # (K, N) descending
        out.append(max(delta[k - 1, :k].sum() for k in range(1, kmax + 1)))
    return np.array(out)


@silence_root_threshold  # DECODABLE holds c >= 1
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("kind", ["peaked", "diffuse", "confused", "shallow"])
def test_node_decoders_exact_on_bundled_trees(tree, kind):
    h, info = bundled(tree)
    rng = np.random.default_rng(sum(map(ord, tree + kind)))  # stable across processes (str hashes are not)
    P = model_like(rng, h, 40, kind)
    for name, params in DECODABLE:
        m = hd.get_metric(name, h, **params)
        if m.kind == "set":
            continue
        pred = m.decode(torch.as_tensor(P))
        got = m.expected(torch.as_tensor(P), pred).numpy()
        best = _slow_node_optimum(info, name, params, P)
        want = 1 - best if m.higher_is_better else best
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=f"{name} {params}")


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_set_decoders_exact_on_bundled_trees(tree):
    h, info = bundled(tree)
    rng = np.random.default_rng(2)
    P = np.concatenate([model_like(rng, h, 2, k) for k in ("peaked", "diffuse", "confused", "shallow")])
    for beta in (0.5, 1.0, 2.0):
        m = hd.get_metric("hf_beta", h, beta=beta)
        pred = m.decode(torch.as_tensor(P))
        got = m.expected(torch.as_tensor(P), pred).numpy()
        np.testing.assert_allclose(got, _slow_hf_beta_optimum(info, P, beta), rtol=1e-10)
    m = hd.get_metric("hamming", h)
    pred = m.decode(torch.as_tensor(P)).numpy()
    for b in range(P.shape[0]):
        assert set(np.flatnonzero(pred[b])) == set(ref.hamming_closed_form(info, P[b]))


def test_paper_bound_is_wrong_ours_is_not():
    """On tieredImageNet-H with a heavy shallow leaf, pruning with the paper's Lemma 4.4 loses hF_0.5."""
    h, info = bundled("tieredimagenet-h")
    rng = np.random.default_rng(0)
    P = model_like(rng, h, 60, "shallow")
    beta = 0.5
    m = hd.get_metric("hf_beta", h, beta=beta)
    ours = m.expected(torch.as_tensor(P), m.decode(torch.as_tensor(P))).numpy()
    b2 = beta ** 2
    dmax = h.max_leaf_depth.numpy()
    paper_keep = lambda pn: pn >= 1 / (1 + b2 * (dmax + 1))  # noqa: E731
    worse = 0
    for b, p in enumerate(P):
        pn = ref.node_probs(info, p)
        keep = paper_keep(pn)
        keep[h.root] = True
        best_paper = 0.0
        leaf_depth = info.depth[: info.L]
        for k in range(1, int(keep.sum()) + 1):
            w = p * (1 + b2) / (k + b2 * (leaf_depth + 1))
            delta = h.leaf_ancestor_incidence(torch.float64).t().matmul(torch.as_tensor(w)).numpy()
            delta[~keep] = -np.inf
            best_paper = max(best_paper, np.sort(delta)[::-1][:k].sum())
        assert ours[b] >= best_paper - 1e-12
        worse += ours[b] > best_paper + 1e-9
    assert worse > 0  # the paper's pruning is sub-optimal on some of these inputs


@pytest.mark.parametrize("name,strategy", [(n, s) for n in STRATEGY_METRICS for s in strategies(n)]
                         + [(n, "candidates-root-paths") for n in CANDIDATE_METRICS])
def test_strategies_agree(name, strategy):
    for tree in ("tieredimagenet-h", "inat19"):
        h, info = bundled(tree)
        rng = np.random.default_rng(1)
        P = torch.as_tensor(np.concatenate([model_like(rng, h, 20, k) for k in ("peaked", "diffuse", "confused", "shallow")]))
        m = hd.get_metric(name, h, strategy=strategy.split("-")[0])
        if strategy.endswith("root-paths"):
            m.DENSE_MAX_ENTRIES = 0  # as on a tree too large for the dense matrix
        ref_m = hd.get_metric(name, h, strategy=strategies(name)[0])
        got = m.expected(P, m.decode(P))
        torch.testing.assert_close(got, ref_m.expected(P, ref_m.decode(P)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("name,params,p_a", [("tree_distance", {}, 0.5), ("tree_distance_c", {"c": 0.5}, 0.75)])
def test_tree_distance_exact_tie_goes_to_the_shallower_node(name, params, p_a, plan):
    """p(a) = (1+c)/2 exactly: predicting a and predicting its parent (the root) have the same expected
    distance, and the strict rule p(n) > (1+c)/2 keeps the root.  Just above, a's leaf 0 (all of a's mass) is
    taken."""
    h = hd.Hierarchy.from_parents([3, 3, 4, 5, 5, -1])  # leaves 0, 1 under a = 3, leaf 2 under b = 4, root 5
    probs = torch.tensor([[p_a, 0.0, 1 - p_a], [p_a + 2**-20, 0.0, 1 - p_a - 2**-20]], dtype=torch.float64)
    with hd.plan_for(plan):
        m = hd.get_metric(name, h, **params)
        tie = m.expected(probs[:1], torch.tensor([3])), m.expected(probs[:1], torch.tensor([5]))
        assert torch.equal(*tie)
        assert m.decode(probs).tolist() == [5, 0]
        assert m.decode(probs.float()).tolist() == [5, 0]


def test_readme_states_the_tie_rule_the_code_follows():
    """The README said node metrics' ties all go to the deepest node; tree_distance's go to the shallower one."""
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    start = text.index("Ties are broken deterministically")
    rule = " ".join(text[start:text.index("\n\n", start)].split())
    assert "except `tree_distance` and `tree_distance_c`" in rule and "goes to the shallower node" in rule


def test_cost_matrix_metric_reasonable_and_not():
    rng = np.random.default_rng(3)
    for h, info in random_trees(9, 30, num_nodes_max=12):
        P = batch(rng, 8, info.L)
        for name in ("wu_palmer", "tree_distance", "lca_height"):
            cost = dense_cost(info, name)
            for strategy in ("candidates", "dense"):
                m = hd.CostMatrixMetric(h, cost, strategy=strategy)
                pred = m.decode(torch.as_tensor(P)).numpy()
                for b in range(len(P)):
                    assert P[b] @ cost[pred[b]] == pytest.approx((P[b] @ cost.T).min(), abs=1e-12)
        noise = rng.random((info.N, info.L))  # not hierarchically reasonable: exhaustive fallback
        m = hd.CostMatrixMetric(h, noise)
        assert not m.is_hierarchically_reasonable
        pred = m.decode(torch.as_tensor(P)).numpy()
        np.testing.assert_allclose([P[b] @ noise[pred[b]] for b in range(len(P))], (P @ noise.T).min(1), atol=1e-12)
        util = hd.CostMatrixMetric(h, noise, higher_is_better=True)
        pred = util.decode(torch.as_tensor(P)).numpy()
        np.testing.assert_allclose([P[b] @ noise[pred[b]] for b in range(len(P))], (P @ noise.T).max(1), atol=1e-12)


def test_reasonableness_checks_on_bundled_trees():
    h, _ = bundled("tieredimagenet-h")
    wp = hd.get_metric("wu_palmer", h).dense_pruning(h)
    assert wp.reasonable and wp.root_form
    hi, _ = bundled("inat19")
    zh = hd.get_metric("zhao", hi).dense_pruning(hi)
    assert not zh.reasonable  # single-child chains: node and parent cost the same


@pytest.mark.parametrize("name,params", metric_cases(decodable=True))
def test_chunking_and_batch_composition(name, params):
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(4)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 6, k) for k in ("peaked", "diffuse", "confused", "shallow")]))
    m = hd.get_metric(name, h, **params)
    full = m.decode(P)
    assert torch.equal(m.decode(P, chunk_size=5), full)
    assert torch.equal(m.decode(P[7]), full[7])
    assert torch.equal(m.decode(P.flip(0)).flip(0), full)


@pytest.mark.parametrize("name,params", metric_cases(decodable=True))
def test_float32_matches_float64_and_empty_batch(name, params):
    h, _ = bundled("inat19")
    rng = np.random.default_rng(6)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 10, k) for k in ("peaked", "diffuse", "confused")]))
    m = hd.get_metric(name, h, **params)
    e64 = m.expected(P, m.decode(P))
    e32 = m.expected(P, m.decode(P.float()))
    torch.testing.assert_close(e32, e64, rtol=1e-5, atol=1e-6)
    for dt in (torch.float16, torch.bfloat16):
        e_half = m.expected(P, m.decode(P.to(dt), validate=False))
        assert ((e_half - e64) * (1 if m.higher_is_better else -1)).min() > -0.02
    empty = m.decode(torch.zeros(0, h.num_leaves))
    assert empty.shape == ((0, h.num_nodes) if m.kind == "set" else (0,))


@st.composite
def tree_and_probs(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    par = ref.random_tree(rng, num_nodes_max=draw(st.integers(3, 10)), unary_prob=draw(st.floats(0, 0.5)))
    info = ref.TreeInfo(par)
    kind = draw(st.sampled_from(["dirichlet", "peaked", "uniform", "onehot", "sparse", "dyadic"]))
    return hd.Hierarchy.from_parents(par), info, ref.random_distribution(rng, info.L, kind), rng


@silence_root_threshold  # DECODABLE holds c >= 1
@given(tree_and_probs(), st.sampled_from(DECODABLE))
def test_optimal_beats_every_other_prediction(data, metric):
    h, info, p, rng = data
    name, params = metric
    m = hd.get_metric(name, h, **params)
    pred = m.decode(torch.as_tensor(p))
    mine = ref.expected(info, name, p, _pred_for_ref(m, pred.numpy()), **params)
    sign = 1 if m.higher_is_better else -1
    others = [ref.heuristic(hn, info, p, **kw) for hn, kw in heuristic_pairs(full=False)]
    others += list(rng.integers(0, info.N, 5))
    if m.kind == "set":
        others = [ref.set_to_mask(info, info.ancestors(int(o))) for o in others]
        others += [ref.closure(info, set(np.flatnonzero(rng.random(info.N) < 0.5)) | {info.root}) for _ in range(5)]
    elif m.kind == "leaf":
        others = [o for o in others if o < info.L] + [int(rng.integers(0, info.L))]
    for o in others:
        assert sign * mine >= sign * ref.expected(info, name, p, o, **params) - 1e-12


def test_hf_beta_decoder_compiles_correctly():
    """Inductor once dropped a candidate compaction's scatter (issued before a graph break) and
    returned wrong hF_β sets.  The decoder, compiled whole (graph breaks at its host syncs),
    must equal eager."""
    from hdecode_torch.metrics.hf_beta import hf_beta_decode

    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(9)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 8, k) for k in ("peaked", "diffuse", "confused", "shallow")]))
    eager = hf_beta_decode(hd.Posterior(h, P), 2.0)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda x: hf_beta_decode(hd.Posterior(h, x, validate=False), 2.0))(P), eager)


def test_candidate_strategy_compiles_correctly():
    """Wu-Palmer's candidates use a sparse CSR product, which Dynamo cannot trace: it must run
    eagerly inside a compiled caller and give the eager predictions."""
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(10)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 8, k) for k in ("peaked", "diffuse", "confused", "shallow")]))
    m = hd.get_metric("wu_palmer", h, strategy="candidates")
    torch._dynamo.reset()
    assert torch.equal(torch.compile(lambda x: m.decode(x, validate=False))(P), m.decode(P))


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_hf_beta_chunks_change_nothing(beta):
    """Chunks see other candidate counts, other stage-1 bounds and other rounds of checks."""
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(8)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 150, k) for k in ("peaked", "diffuse", "confused", "shallow")]))
    m = hd.get_metric("hf_beta", h, beta=beta)
    assert torch.equal(m.decode(P), m.decode(P, chunk_size=100))


def test_hf_beta_value_bound_matches_reference():
    from hdecode_torch.metrics.hf_beta import hf_beta_bound, hf_beta_value_bound
    for h, info in random_trees(13, 5, num_nodes_max=14):
        for beta in (0.3, 1.0, 3.0):
            tau = hf_beta_value_bound(h, beta).numpy()
            want = [ref.hf_beta_value_bound(info, n, beta, 1.0) for n in range(info.N)]
            np.testing.assert_allclose(tau, want, rtol=1e-14)
            # With the weakest value, U({root}) >= 1/(r + a(D)), it is at least the safe form of the paper's bound.
            r = 1 / (1 + beta * beta)
            root_value = 1 / (r + (1 - r) * (info.max_depth + 1))
            assert (tau * root_value >= hf_beta_bound(h, beta).numpy() * (1 - 1e-12)).all()


@pytest.mark.parametrize("beta", [0.5, 2.0])
@pytest.mark.parametrize("k_ref", ["one", "all", "expected"])
def test_hf_beta_certification_survives_a_bad_reference_order(beta, k_ref):
    """The stage-2 solver sorts candidates by Δ at a reference k̂ and certifies every other k.  With
    k̂ = 1 or k̂ = C the prefix order is wrong for many k: the exact fallback must repair it.  Compared
    with every k solved by a full sort (and with the GPU plan's exact solver), over the same
    candidates (the set of the fixed bound, a superset)."""
    from hdecode_torch.kernels.candidates import candidate_pairs
    from hdecode_torch.metrics.hf_beta import _PrefixSolver, hf_beta_bound
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(21)
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 40, k) for k in ("peaked", "diffuse", "confused", "shallow")]))
    post = hd.Posterior(h, P)
    p = post.node
    keep = p >= hf_beta_bound(h, beta)[:, None]
    sample, node, _ = candidate_pairs(h, keep, p)
    r = 1 / (1 + beta * beta)
    solver = _PrefixSolver(post, r)
    count = torch.bincount(sample, minlength=P.shape[0])
    guess = {"one": torch.ones_like(count), "all": count,
             "expected": (h.leaf_depth.double() @ p[: h.num_leaves] + 1).round().long()}[k_ref]
    cands = solver.from_pairs(sample, node)
    ids = cands.ids
    best_k, delta = solver.certified(cands, guess)
    got = torch.sort(delta.masked_fill(ids == h.num_nodes, 0), dim=1, descending=True).values.cumsum(1)
    got = got.gather(1, (best_k - 1)[:, None])[:, 0]
    exact_k, _ = hd.kernels.fused.hf_beta_best_k(cands.q, cands.count, solver.depths.double(), r)
    assert torch.equal(exact_k, best_k)
    # Every k by brute force: Δ_k of every candidate, fully sorted.
    q = cands.q  # (B, C, E) masses of the packed candidates
    ks = torch.arange(1, ids.shape[1] + 1)
    w = 1 / (r * ks.double()[:, None] + (1 - r) * (solver.depths[None, :] + 1))  # (K, E)
    dk = torch.einsum("bce,ke->bkc", q, w)
    vk = torch.sort(dk, dim=2, descending=True).values.cumsum(2).diagonal(dim1=1, dim2=2)  # (B, K)
    vk = torch.where(ks[None, :] <= count[:, None], vk, torch.full_like(vk, -1.0))
    want, want_k = vk.max(1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert torch.equal(best_k, want_k + 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("k_ref", ["one", "expected"])
def test_hf_beta_settled_set_sizes_pass_the_test_they_skip(beta, dtype, k_ref):
    """The certification settles most set sizes k from Δ_k̂ alone (Δ_k/Δ_k̂ between ρ_min(k) and ρ_max(k)).
    Every k it settles must be one whose test on the rounded Δ_k, as the certification computes them, passes
    (the smallest Δ_k in the length-k prefix at least the largest after it): else skipping that test could
    change a decision.  Negative masses (an unchecked input) settle nothing."""
    from hdecode_torch.kernels.candidates import candidate_pairs
    from hdecode_torch.metrics.hf_beta import _PrefixSolver, hf_beta_bound
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(34)
    kinds = ("peaked", "diffuse", "confused", "shallow")
    P = torch.as_tensor(np.concatenate([model_like(rng, h, 50, k) for k in kinds]))
    post = hd.Posterior(h, P.to(dtype))
    p = post.node
    keep = p >= hf_beta_bound(h, beta).to(dtype)[:, None]
    keep[h.root] = True
    sample, node, _ = candidate_pairs(h, keep, p)
    solver = _PrefixSolver(post, 1 / (1 + beta * beta))
    count = torch.bincount(sample, minlength=P.shape[0])
    guess = {"one": torch.ones_like(count), "expected": (post.expected_leaf_depth() + 1).round().long()}[k_ref]
    _, _, _, q, d_ref, k_hat, _, count, _ = solver.solve(solver.from_pairs(sample, node), guess)
    c, e = q.shape[1:]
    w = solver.weights_upto(c)
    ratio = w[None, :, [0, e - 1]] / solver.weights_at(k_hat, c)[:, None, [0, e - 1]]
    cols = torch.arange(c)
    settled = solver._settled(ratio, d_ref, q) & (cols[None, :] < count[:, None])
    b, kk = settled.nonzero().unbind(1)
    assert b.numel() > 0.1 * count.sum()  # not an empty claim, even with the poor order of k̂ = 1
    dk = torch.bmm(q.index_select(0, b), w.index_select(0, kk)[:, :, None])[:, :, 0]  # Δ_k as the certification has it
    prefix = cols[None, :] <= kk[:, None]
    inside = dk.masked_fill(~prefix, float("inf")).amin(1)
    after = dk.masked_fill(prefix | (cols[None, :] >= count[b][:, None]), float("-inf")).amax(1)
    assert (inside >= after).all()
    assert not solver._settled(ratio, d_ref, -q).any()


@pytest.mark.parametrize("name", CANDIDATE_METRICS)
def test_structural_pruning_bounds_are_safe(name):
    """The per-node bounds behind strategy="candidates" enclose the exact Lemma 4.3 / Prop. E.6
    statistics of the dense cost matrix (so they can only keep more candidates)."""
    from hdecode_torch.kernels.candidates import pruning_statistics

    trees = [bundled("tieredimagenet-h")[0], bundled("inat19")[0]] + [h for h, _ in random_trees(12, 60, num_nodes_max=14)]
    for h in trees:
        m = hd.get_metric(name, h, strategy="candidates")
        exact = pruning_statistics(h, 1 - m.dense_matrix())
        bound = m.pruning(h)
        assert exact.root_form and bound.root_form
        assert torch.equal(exact.top, bound.top)
        tol = 1e-12
        nonroot = h.depth > 0
        assert bool((bound.m_in[nonroot] <= exact.m_in[nonroot] + tol).all())
        assert bool((bound.M_in[nonroot] >= exact.M_in[nonroot] - tol).all())
        has_out = exact.M_out != 0
        assert bool((bound.m_out[has_out] <= exact.m_out[has_out] + tol).all())
        assert bool((bound.M_out[has_out] >= exact.M_out[has_out] - tol).all())


@pytest.mark.parametrize("name", CANDIDATE_METRICS)
@pytest.mark.parametrize("values", ["sampled dense", "root paths"])
def test_structural_candidates_exact_on_random_trees(name, values):
    """Both ways of scoring the candidates: sampled products with the dense matrix (small
    trees) and sums over the candidates' root paths (trees too large for an N×L matrix)."""
    rng = np.random.default_rng(13)
    for h, info in random_trees(14, 40, num_nodes_max=12):
        m = hd.get_metric(name, h, strategy="candidates")
        if values == "root paths":
            m.DENSE_MAX_ENTRIES = 0
        P = batch(rng, 10, info.L)
        pred = m.decode(torch.as_tensor(P)).numpy()
        _check_optimal(info, name, {}, P, pred, m)


# --------------------------------------------------------------------------- strategies and degenerate parameters
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


def test_hf_beta_with_a_huge_beta_in_float32():
    """(1+β²)/(k+β²(e+1)) was inf/inf once β² overflowed; the weights are now written with r = 1/(1+β²)."""
    h = hd.Hierarchy.from_parents([5, 5, 6, 6, 6, 7, 7, -1])
    x = torch.tensor([0.4, 0.1, 0.3, 0.1, 0.1], dtype=torch.float64)
    m = hd.get_metric("hf_beta", h, beta=1e20)
    assert bool(m.decode(x).all())  # float64: correct, the whole tree
    assert torch.equal(m.decode(x.float()), m.decode(x))
