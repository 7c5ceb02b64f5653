"""Set predictions on top-k inputs (Hamming): the decision is the coalesced sparse COO bool (B, N) set of the
completed distribution's optimum, equal by expected score (float64, 1e-12 relative) to the dense decoder on
the completed (B, L) table and to the exhaustive oracle on small random trees, on both bundled trees, under
both plans, in float32 and float64; k = L gives the dense decision bit for bit (as sparse); the expected value
reads only the set's entries; a decode on the 100k-leaf tree never grows with B × N."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from harness import FLOAT_DTYPES, bundled, model_like, random_trees
from hdecode_torch.core.topk import CompletedTopK
from memory_testing import MiB, assert_growths_below
from test_cli import run_cli_on_cpu
from testing import assert_callback_scores_top_k, assert_top_k_under_gloo_equals_one_process

PLANS = ["cpu", "cuda"]


def lists(rng, L, B, k, kind):
    """(values (B, k) float64, indices (B, k) int64, missing or None): distinct leaves per row.

    kind: "dirichlet" (totals in [0, 1], often far below 1: the unlisted mass wins), "peaked" (one listed
    leaf holds most), "dyadic" (multiples of 1/16), "complete" (total 1 and ``missing = 0``)."""
    idx = np.stack([rng.permutation(L)[:k] for _ in range(B)])
    if kind == "dyadic":
        bins = k + (k < L)  # a bin for the missing mass where a leaf is unlisted
        counts = np.stack([rng.multinomial(16, np.ones(bins) / bins) for _ in range(B)])
        vals = counts[:, :k] / 16.0
        return vals, idx, None
    vals = rng.dirichlet(np.full(k, 0.3 if kind == "peaked" else 1.0), size=B)
    if kind == "complete" or k == L:
        return vals / vals.sum(1, keepdims=True), idx, (0.0 if kind == "complete" else None)
    total = rng.choice([1.0, 0.9, 0.5, 0.1, 0.0], size=B)
    total = np.where(rng.random(B) < 0.3, rng.uniform(0, 1, B), total)
    return vals * total[:, None], idx, None


def _prior(rng, L):
    prior = rng.dirichlet(np.ones(L))
    prior[rng.random(L) < 0.3] = 0
    prior[rng.integers(L)] += 0.1
    return torch.tensor(prior)


def _check_sparse(sets, shape):
    assert sets.layout == torch.sparse_coo and sets.dtype == torch.bool and tuple(sets.shape) == shape
    assert sets.is_coalesced() and bool(sets.values().all())


def _fsum_expected(info, q, sets):
    """(B,) the oracle's expected Hamming loss (math.fsum) of dense (B, N) bool sets under (B, L) q."""
    return np.array([ref.expected(info, "hamming", q[b], frozenset(np.flatnonzero(sets[b]).tolist()))
                     for b in range(q.shape[0])])


@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("completion", ["uniform", "prior"])
def test_optimal_on_random_trees(plan, dtype, completion):
    rng = np.random.default_rng(31)
    off_support = exhaustive = 0
    for h, info in random_trees(7, 32, num_nodes_max=24, unary_prob=0.25):
        m = hd.get_metric("hamming", h)
        L = h.num_leaves
        for k in sorted({1, 2, max(1, L // 2), max(1, L - 1)}):
            for kind in ("dirichlet", "peaked", "dyadic", "complete"):
                vals, idx, missing = lists(rng, L, 6, k, kind)
                prior = _prior(rng, L) if completion == "prior" else None
                if prior is not None:  # a row whose unlisted leaves all weigh 0 holds no missing mass
                    empty = ((prior.numpy() > 0).sum() - (prior.numpy()[idx] > 0).sum(1)) == 0
                    vals[empty] = rng.dirichlet(np.ones(k), size=int(empty.sum()))
                topk = hd.TopK(torch.tensor(vals, dtype=dtype), torch.tensor(idx), missing=missing, prior=prior)
                with hd.plan_for(plan):
                    sets = m.decode(topk)
                    dense = m.decode(topk.completed(L, torch.float64))
                    got = m.expected(topk, sets)
                _check_sparse(sets, (6, h.num_nodes))
                full = topk.completed(L, torch.float64)
                ours, theirs = m.expected(full, sets), m.expected(full, dense)
                torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(got, ours.to(got.dtype), rtol=1e-12 if dtype == torch.float64 else 1e-6,
                                           atol=1e-12 if dtype == torch.float64 else 1e-6)
                q = full.numpy()
                pred = sets.to_dense().numpy()
                assert ref.is_closed(info, np.flatnonzero(pred[0]).tolist())
                best = _fsum_expected(info, q, np.stack([ref.set_to_mask(info, ref.hamming_closed_form(info, q[b]))
                                                         for b in range(6)]))
                np.testing.assert_allclose(_fsum_expected(info, q, pred), best, rtol=1e-12, atol=1e-12)
                if h.num_nodes <= 9:  # every closed set
                    exhaustive += 1
                    for b in range(6):
                        assert ref.is_optimal(info, "hamming", q[b], frozenset(np.flatnonzero(pred[b]).tolist()),
                                              rtol=1e-12, atol=1e-12)
                listed = torch.zeros(6, h.num_nodes + 1, dtype=torch.bool)
                listed.scatter_(1, h.ancestors[torch.tensor(idx)].reshape(6, -1), True)
                off_support += int((sets.to_dense() & ~listed[:, : h.num_nodes]).any(1).sum())
    assert off_support > 0 and exhaustive > 0  # the completion's own nodes, and the exhaustive oracle, exercised


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_bundled_trees_match_the_dense_decoder(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(8)
    probs = np.concatenate([model_like(rng, h, 12, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    probs = torch.tensor(probs, dtype=dtype)
    prior = _prior(rng, h.num_leaves)
    m = hd.get_metric("hamming", h)
    for k in (1, 10, 100):
        t = probs.topk(k)
        scale = torch.tensor(rng.choice([1.0, 0.5, 0.1], size=probs.shape[0]), dtype=dtype)[:, None]
        for topk in (hd.TopK(t.values, t.indices), hd.TopK(t.values * scale, t.indices, prior=prior)):
            full = topk.completed(h.num_leaves, torch.float64)
            with hd.plan_for(plan):
                sets = m.decode(topk)
                dense = m.decode(full)
            _check_sparse(sets, (probs.shape[0], h.num_nodes))
            ours, theirs = m.expected(full, sets), m.expected(full, dense)
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(m.expected(topk, sets).double(), ours, rtol=1e-5, atol=1e-6)
            if dtype == torch.float64:
                torch.testing.assert_close(m.expected(topk, sets), ours, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("plan", PLANS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_k_equal_to_L_is_the_dense_decision_bit_for_bit(tree, plan, dtype):
    h, _ = bundled(tree)
    rng = np.random.default_rng(9)
    probs = torch.tensor(np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "confused")]),
                         dtype=dtype)
    t = probs.topk(h.num_leaves)
    m = hd.get_metric("hamming", h)
    with hd.plan_for(plan):
        dense = m.decode(probs)
        for top in (t, hd.TopK(t.values, t.indices)):
            sets = m.decode(top)
            _check_sparse(sets, (16, h.num_nodes))
            assert torch.equal(sets.to_dense(), dense)
        assert torch.equal(m.expected(t, sets), m.expected(probs, dense))
        assert torch.equal(m.expected(t, dense), m.expected(probs, dense))


def test_support_path_with_every_leaf_listed():
    # k = L is decoded as the dense table; the support kernels themselves, with nothing unlisted (r = 0), still
    # give an optimal set and its expected value
    h, _ = bundled("tieredimagenet-h")
    probs = torch.tensor(model_like(np.random.default_rng(5), h, 16, "confused"))
    m = hd.get_metric("hamming", h)
    ct = CompletedTopK(h, hd.TopK(*probs.topk(h.num_leaves)))
    sets = m._decode_topk(ct)
    ours, theirs = m.expected(probs, sets.to_dense()), m.expected(probs, m.decode(probs))
    torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m._expected_topk(ct, sets), ours, rtol=1e-12, atol=1e-12)


def test_unbatched_rows_and_every_kind_of_prediction():
    h, _ = bundled("inat19")
    probs = torch.tensor(model_like(np.random.default_rng(6), h, 4, "diffuse"))
    m = hd.get_metric("hamming", h)
    t = probs.topk(20)
    batched = m.decode(t)
    _check_sparse(batched, (4, h.num_nodes))
    one = m.decode(probs[1].topk(20))
    _check_sparse(one, (h.num_nodes,))
    assert torch.equal(one.to_dense(), batched.to_dense()[1])
    e = m.expected(t, batched)
    assert m.expected(probs[1].topk(20), one) == e[1]
    dense = batched.to_dense()
    assert torch.equal(m.expected(t, dense), e)  # dense bool sets, sparse sets and node ids: the same values
    deepest = (dense.long() * (h.depth + 1)[None]).argmax(1)
    torch.testing.assert_close(m.expected(t, deepest), e, rtol=1e-12, atol=1e-12)
    target = torch.tensor([0, 5, 9, 100])
    assert torch.equal(m(batched, target), m(dense, target))


def test_rows_without_mass_give_the_empty_set_as_dense():
    # W(root) = 0: no node passes W(root)/2, the dense decoder's empty set
    h = hd.Hierarchy.from_parents([4, 4, 5, 5, 5, -1])
    m = hd.get_metric("hamming", h)
    topk = hd.TopK(torch.tensor([[0.0, 0.0], [0.5, 0.5]]), torch.tensor([[0, 1], [0, 2]]), missing=0.0)
    sets = m.decode(topk, validate=False)
    dense = m.decode(topk.completed(4), validate=False)
    assert torch.equal(sets.to_dense(), dense)
    assert not dense[0].any()
    same, certified, bound = m.decode(topk, certify=True, validate=False)
    assert torch.equal(same.to_dense(), dense)
    assert certified.tolist() == [True, True] and not bound.any()  # missing = 0: no completion but this one


# ------------------------------------------------------------------------------------------ certificate
def _regrets(h, q, sets):
    """(V,) the Hamming regret of the closed set ``sets`` (N,) bool at each completion q (V, L): its expected
    loss 1 − Σ_{n ∈ S} D(n) minus the best, 1 − Σ_n max(0, D(n)), with D(n) = 2W(n) − W(root)."""
    anc = h.ancestors.numpy()  # (N, D+1), padded with N
    member = np.zeros((h.num_nodes, h.num_leaves))
    for leaf in range(h.num_leaves):
        for a in anc[leaf]:
            if a < h.num_nodes:
                member[a, leaf] = 1
    w = (q / (h.leaf_depth.numpy() + 1.0)) @ member.T  # (V, N)
    gap = 2 * w - w[:, [h.root]]
    return np.clip(gap, 0, None).sum(1) - gap[:, sets].sum(1)


@pytest.mark.parametrize("plan", PLANS)
def test_certificate_never_beaten(plan):
    from test_topk_certificate import rows, vertices

    rng = np.random.default_rng(36)
    certified_rows = total = 0
    for h, info in random_trees(351, 25, num_nodes_max=13):
        m = hd.get_metric("hamming", h)
        for prior in (None, "prior"):
            vals, idx, missing = rows(rng, h.num_leaves, 6)
            w = torch.from_numpy(rng.dirichlet(np.ones(h.num_leaves)) + 0.01) if prior else None
            topk = hd.TopK(vals, idx, missing, prior=w)
            with hd.plan_for(plan):
                sets, certified, bound = m.decode(topk, certify=True)
                assert torch.equal(sets.to_dense(), m.decode(topk).to_dense())
            dense = sets.to_dense().numpy()
            mass = topk.missing_mass().numpy()
            for b in range(dense.shape[0]):
                q = vertices(h.num_leaves, topk.indices[b].numpy(), topk.values[b].numpy(), mass[b])
                r = _regrets(h, q, dense[b])
                if certified[b]:
                    assert r.max() <= 1e-9 and float(bound[b]) == 0
                assert float(bound[b]) >= r.max() - 1e-9, (b, float(bound[b]), r.max())
                certified_rows += int(certified[b])
                total += 1
    assert 0 < certified_rows < total  # both kinds of rows seen


# ------------------------------------------------------------------------------------------ memory
def test_a_top_k_set_decode_never_grows_with_B_times_N(top_k_growths):
    # 100k leaves, B = 1,024, k = 100: a dense (B, N) bool decision alone would be about 130 MiB, the (B, L)
    # float32 table 390 MiB; the support tables are B·k·(D+1) entries, the sets B·(D+1)
    assert_growths_below(top_k_growths("sets"), 6, 128 * MiB)  # decode, expected and certify on both plans


# ------------------------------------------------------------------------------------------ entry points
#: The set metrics whose optimal decoder takes a top-k list (their entry points are checked alike).
SET_CASES = [("hamming", {}), ("hf_beta", {}), ("jaccard", {})]


def _model_rows(h, seed=0, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    rows = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    return torch.tensor(rows, dtype=dtype)


def _same_sets(a, b):
    _check_sparse(a, tuple(b.shape))
    assert torch.equal(a.indices(), b.coalesce().indices())


@pytest.mark.parametrize("name,params", SET_CASES)
def test_functional_and_decoding_head_give_the_sparse_sets(name, params):
    h, _ = bundled("inat19")
    probs = _model_rows(h)
    m = hd.get_metric(name, h, **params)
    F = hd.functional
    head = hd.DecodingHead(h, name, **params)
    y = torch.randint(0, h.num_leaves, (probs.shape[0],), generator=torch.Generator().manual_seed(0))
    for k in (1, 10, 100):
        t = probs.topk(k)
        want = m.decode(hd.TopK(t.values, t.indices))
        _same_sets(getattr(F, f"decode_{name}")(t, h, **params), want)
        _same_sets(F.decode(name, t, h, **params), want)
        _same_sets(head(t), want)
        _same_sets(hd.DecodingHead(h, name, from_logits="auto", **params)(t), want)
        if name == "hamming":  # a fixed-size decoder: its graph head decodes top-k lists eagerly
            _same_sets(hd.DecodingHead(h, name, cuda_graph=True, **params)(t), want)
        assert head.returns_sets
        torch.testing.assert_close(getattr(F, f"expected_{name}")(t, want, h, **params), m.expected(t, want),
                                   rtol=0, atol=0)
        assert torch.equal(getattr(F, name)(want, y, h, **params), getattr(F, name)(want.to_dense(), y, h, **params))
    full = probs.topk(h.num_leaves)  # k = L: the dense answer bit for bit
    assert torch.equal(head(full).to_dense(), head(probs))
    assert torch.equal(getattr(F, f"decode_{name}")(full, h, **params).to_dense(),
                       getattr(F, f"decode_{name}")(probs, h, **params))
    one = head(probs[0].topk(10))
    _check_sparse(one, (h.num_nodes,))
    assert torch.equal(one.to_dense(), head(probs.topk(10)).to_dense()[0])
    with pytest.raises(TypeError, match=r"`example` to be a torch.Tensor"):
        head.export(probs.topk(10))
    if name != "hamming":  # hF_β and Jaccard give no certificate
        with pytest.raises(ValueError, match=rf"`{name}` gives no certificate"):
            m.decode(probs.topk(10), certify=True)
        return
    for k in (10, h.num_leaves):  # certificates through every entry point, k = L included (all certified)
        want = m.decode(probs.topk(k), certify=True)
        for got in (hd.DecodingHead(h, name, certify=True, **params)(probs.topk(k)),
                    getattr(F, f"decode_{name}")(probs.topk(k), h, certify=True, **params)):
            _same_sets(got[0], want[0])
            assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])
        if k == h.num_leaves:
            assert bool(want[1].all()) and not bool(want[2].any())
            assert torch.equal(want[0].to_dense(), m.decode(probs))
    one = m.decode(probs[3].topk(10), certify=True)
    _check_sparse(one[0], (h.num_nodes,))
    assert one[1].shape == () and one[2].shape == ()


@pytest.mark.parametrize("name,params", SET_CASES)
def test_hierarchical_metric_scores_sparse_sets_of_top_k_lists(name, params):
    h, _ = bundled("inat19")
    probs = _model_rows(h, seed=1)
    target = torch.randint(0, h.num_leaves, (probs.shape[0],), generator=torch.Generator().manual_seed(0))
    m = hd.get_metric(name, h, **params)
    for k in (10, h.num_leaves):
        t = probs.topk(k)
        ours = hd.HierarchicalMetric(h, name, **params)
        ours.update(t, target)
        ours.update(hd.TopK(t.values[:5], t.indices[:5]), target[:5])
        sets = m.decode(hd.TopK(t.values, t.indices))
        values = torch.cat([m(sets, target, dtype=torch.float64), m(sets.to_dense()[:5], target[:5],
                                                                      dtype=torch.float64)])
        assert ours.compute().dtype == torch.float64
        torch.testing.assert_close(ours.compute(), values.mean(), rtol=1e-12, atol=0)
        decoded = hd.HierarchicalMetric(h, name, **params)  # the sparse sets themselves, already decoded
        decoded.update(sets, target)
        dense_sets = hd.HierarchicalMetric(h, name, **params)
        dense_sets.update(sets.to_dense(), target)
        assert torch.equal(decoded.compute(), dense_sets.compute())
        if k == h.num_leaves:  # the dense path's value bit for bit
            dense = hd.HierarchicalMetric(h, name, **params)
            dense.update(probs, target)
            dense.update(probs[:5], target[:5])
            assert torch.equal(ours.compute(), dense.compute())


def test_hierarchical_metric_on_top_k_sets_under_gloo_equals_one_process(tmp_path):
    h, _ = bundled("inat19")
    target = torch.randint(0, h.num_leaves, (32,), generator=torch.Generator().manual_seed(2))
    assert_top_k_under_gloo_equals_one_process(tmp_path, "inat19", _model_rows(h, seed=6), target, SET_CASES)


def test_lightning_callback_scores_top_k_sets(tmp_path):
    pytest.importorskip("pytorch_lightning")
    h, _ = bundled("inat19")
    # a node metric beside the sets: one callback logs both kinds of decision
    assert_callback_scores_top_k(h, [name for name, _ in SET_CASES] + ["tree_distance"], SET_CASES)


def _read_sets(path, fmt, shape):
    import json

    if fmt == "npz":
        z = np.load(path)
        assert sorted(z.files) == ["pred_indices", "pred_shape"] and tuple(z["pred_shape"]) == shape
        idx = torch.from_numpy(z["pred_indices"])
    elif fmt == "pt":
        t = torch.load(path)
        assert t.layout == torch.sparse_coo and tuple(t.shape) == shape
        idx = t.coalesce().indices()
    else:
        if fmt == "csv":
            lines = path.read_text().splitlines()
            assert lines[0] == "nodes"
            lines = lines[1:]
        elif fmt == "jsonl":
            lines = [";".join(map(str, json.loads(line)["nodes"])) for line in path.read_text().splitlines()]
        else:
            lines = path.splitlines()
        assert len(lines) == shape[0]
        pairs = [(r, int(n)) for r, line in enumerate(lines) for n in line.split(";")]
        idx = torch.tensor(pairs).t()
    return torch.sparse_coo_tensor(idx, torch.ones(idx.shape[1], dtype=torch.bool), shape,
                                   check_invariants=True).coalesce()


@pytest.mark.parametrize("fmt", ["npz", "pt", "csv", "jsonl", "stdout"])
def test_cli_decodes_a_top_k_file_into_sparse_sets(tmp_path, capsys, fmt):
    h, _ = bundled("inat19")
    probs = _model_rows(h, seed=2, dtype=torch.float32)
    for k in (10, h.num_leaves):
        t = probs.topk(k)
        path = tmp_path / f"topk{k}.npz"
        np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
        for name, params in SET_CASES:
            out = tmp_path / f"pred.{fmt}"
            where = [] if fmt == "stdout" else ["-o", out]
            code, stdout, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", path, "--metric", name,
                                      "--batch-size", 10, *where], capsys)
            assert code == 0, err
            want = hd.get_metric(name, h, **params).decode(hd.TopK(t.values, t.indices))
            got = _read_sets(stdout if fmt == "stdout" else out, fmt, (probs.shape[0], h.num_nodes))
            assert torch.equal(got.indices(), want.indices()), (name, k, fmt)
            if k == h.num_leaves:
                assert torch.equal(got.to_dense(), hd.get_metric(name, h, **params).decode(probs))


def test_cli_writes_the_certificate_next_to_each_set(tmp_path, capsys):
    h, _ = bundled("inat19")
    t = _model_rows(h, seed=4).topk(20)
    path = tmp_path / "topk.npz"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    want = hd.get_metric("hamming", h).decode(hd.TopK(t.values, t.indices), certify=True)
    out = tmp_path / "pred.npz"
    code, _, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", path, "--metric", "hamming",
                         "--batch-size", 7, "--certify", "-o", out], capsys)
    assert code == 0, err
    z = np.load(out)
    assert torch.equal(torch.from_numpy(z["pred_indices"]), want[0].indices())
    assert torch.equal(torch.from_numpy(z["certified"]), want[1])
    assert torch.equal(torch.from_numpy(z["regret_bound"]), want[2])
    done = int(want[1].sum())
    assert f"hamming/optimal: {done} of 32 rows certified" in err, err


def test_cli_refuses_a_npy_output_for_sparse_sets(tmp_path, capsys):
    h, _ = bundled("inat19")
    t = _model_rows(h).topk(10)
    path = tmp_path / "topk.npz"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    code, _, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", path, "--metric", "hamming",
                         "-o", tmp_path / "p.npy"], capsys)
    assert code == 2 and "--output: a set metric's decisions on top-k lists are sparse node sets" in err, err
    assert not (tmp_path / "p.npy").exists()
