"""The fused decoder ops ``hdecode::hf_beta_best_k`` and ``hdecode::path_score_best``.

- ``hf_beta_best_k`` against the hF_β metric's own exact solver (the GPU plan's call of the op) on the
  candidates the GPU plan packs on both bundled trees, against a float64 numpy brute force, and
  wired into the decoder (the GPU plan with the op gives the CPU plan's sets);
- ``path_score_best`` against the library's Zhao (structural) and LCA-height decoders on the bundled
  trees and random trees, and against a numpy evaluation of its definition (exact on dyadic inputs,
  so that ties and the rank rule are checked exactly);
- wide batches against a numpy evaluation of the definitions; edge cases, errors, determinism,
  torch.compile(fullgraph=True), torch.export, opcheck;
- the Triton kernels under Triton's CPU interpreter (one subprocess with TRITON_INTERPRET=1), in both
  row layouts, with more candidates and nodes than one tile holds, and compiled ahead of time for sm_90;
- both ops used with Triton unimportable.

``zhao_call`` and ``lca_height_call`` below build the op's arguments from a hierarchy: they are
the calls the structural decoders make.

Run ``python tests/test_fused_decoders.py`` to print the interpreter checks as JSON.
"""

from __future__ import annotations

import json
import math
import textwrap
import time

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
import hdecode_torch.kernels.fused as F
from hdecode_torch.kernels.depth_ranges import depth_ranges
from hdecode_torch.kernels.fused import trust_indices
from hdecode_torch.kernels.fused._registry import OPS
from hdecode_torch.kernels.fused.hf_beta_best_k import hf_beta_best_k_torch, hf_beta_weights
from hdecode_torch.kernels.fused.path_score_best import path_score_best_torch
from hdecode_torch.kernels.selection import tie_rank
from hdecode_torch.kernels.tree_sums import tree_ranges
from hdecode_torch.metrics import hf_beta as HF
from hdecode_torch.metrics.zhao import information_gain

import harness  # tests/ is on sys.path (conftest.py, and the subprocesses' PYTHONPATH)

from triton_testing import (  # noqa: E402
    ROOT, block_imports, check_compiles_for_sm90, interpreter_results, needs_triton, run_python)

BUNDLED = ["tieredimagenet-h", "inat19"]


# -- the calls the metrics make ------------------------------------------------------------------------

def path_score_args(h, kind: str) -> tuple:
    """The arguments of ``path_score_best`` after x for the structural decoder of ``kind`` on ``h``."""
    src, _, hi, lo = tree_ranges(h, "leaves")
    euler_src, sign, at, _ = tree_ranges(h, "path")
    parent = trust_indices(h.parent_or_root, h.num_nodes - 1)
    n, dev = h.num_nodes, h.device
    if kind == "zhao":  # 2/(I(n) + log L) · Σ_{a ∈ A(n)} (I(a) − I(parent(a))) p(a)
        zeros = torch.zeros(n, dtype=torch.float64, device=dev)
        gamma = 2 / (h.information + math.log(h.num_leaves))
        allowed = torch.ones(n, dtype=torch.bool, device=dev)
        return (src, hi, lo, parent, zeros, information_gain(h), euler_src, sign, at, gamma, zeros, allowed,
                tie_rank(h), True)
    # LCA height: Σ_{a ∈ A(n)} height(parent(a))·(p(parent(a)) − p(a)) + height(n)·p(n), over the leaves
    height = h.height.to(torch.float64)
    alpha = height.index_select(0, parent)
    alpha[h.root] = 0
    ones = torch.ones(n, dtype=torch.float64, device=dev)
    return (src, hi, lo, parent, alpha, -alpha, euler_src, sign, at, ones, height, h.is_leaf, tie_rank(h), False)


def zhao_call(h, leaf_probs):
    """Zhao's structural decoder (L >= 2; with one leaf every node scores 1)."""
    return F.path_score_best(leaf_probs, *path_score_args(h, "zhao"))


def lca_height_call(h, leaf_probs):
    """The LCA-height decoder (Karthik et al.'s CRM): the leaf of least expected LCA height."""
    return F.path_score_best(leaf_probs, *path_score_args(h, "lca_height"))


# -- helpers ----------------------------------------------------------------------------------------------

def solver_cases(h, probs, beta):
    """The (candidates, (best_k, delta), r) the GPU plan's exact solver sees when decoding ``probs``."""
    seen = []
    original = HF.hf_beta_best_k

    def spy(q, count, depths, r):
        out = original(q, count, depths, r)
        seen.append((SimpleNamespace(q=q, count=count), out, r))
        return out
    HF.hf_beta_best_k = spy
    try:
        # the plan's torch path (on plain CPU tensors the native decoder would run, without this solver)
        with hd.plan_for("cuda"), native.use_native(False):
            hd.get_metric("hf_beta", h, beta=beta).decode(probs)
    finally:
        HF.hf_beta_best_k = original
    assert len(seen) == 1
    return seen[0]


def numpy_values(q, count, depths, r) -> np.ndarray:
    """(B, C) float64 V(k) for k = 1..C (-inf beyond count), by brute force."""
    q = q.double().numpy()
    b, c, _ = q.shape
    ks = np.arange(1, c + 1, dtype=np.float64)
    w = 1 / (r * ks[:, None] + (1 - r) * (depths.numpy()[None, :] + 1))  # (K, E)
    v = np.full((b, c), -np.inf)
    for i in range(b):
        n = int(count[i])
        if n == 0:
            continue
        dk = w[:n] @ q[i, :n].T  # (k, c)
        top = -np.sort(-dk, axis=1)
        v[i, :n] = np.cumsum(top, axis=1)[np.arange(n), np.arange(n)]
    return v


def check_best_k(best_k, values, count, rtol) -> list[int]:
    """Rows where ``best_k`` is not the first maximiser of ``values`` up to rounding."""
    bad = []
    for i in range(values.shape[0]):
        n = int(count[i])
        k = int(best_k[i])
        if n == 0:
            if k != 1:
                bad.append(i)
            continue
        v = values[i, :n]
        tol = rtol * max(1.0, abs(v).max())
        first = int(np.argmax(v)) + 1
        if not 1 <= k <= n or v[k - 1] < v.max() - tol:
            bad.append(i)  # not a maximiser
        elif k != first and (k > first and v[first - 1] > v[k - 1] + tol or k < first and v[k - 1] < v.max() - tol):
            bad.append(i)  # a clearly better smaller k, or a smaller k that is not a maximiser
    return bad


def random_q(rng, b, c, e, dtype=torch.float64, zero_pad=True):
    q = torch.as_tensor(rng.dirichlet(np.ones(c * e) * 0.3, size=b).reshape(b, c, e)).to(dtype)
    count = torch.as_tensor(rng.integers(0, c + 1, b))
    count[0] = c
    if zero_pad:
        q[torch.arange(c)[None, :] >= count[:, None]] = 0
    depths = torch.as_tensor(np.sort(rng.choice(12, e, replace=False)).astype(np.float64))
    return q, count, depths


def numpy_path_scores(h, x, alpha, beta, gamma, delta) -> np.ndarray:
    """(B, N) float64 scores of ``path_score_best``'s definition, from the ancestor table."""
    anc = h.ancestors.numpy()
    n, num_leaves = h.num_nodes, h.num_leaves
    is_anc = np.zeros((n, n + 1))
    is_anc[np.repeat(np.arange(n), anc.shape[1]), anc.reshape(-1)] = 1
    is_anc = is_anc[:, :n]  # is_anc[m, a]: a is an ancestor of m (m included)
    p = x.double().numpy() @ is_anc[:num_leaves]  # (B, N)
    parent = h.parent_or_root.numpy()
    v = alpha.numpy() * p[:, parent] + beta.numpy() * p
    s = v @ is_anc.T
    return gamma.numpy() * s + delta.numpy() * p


def numpy_best(score, allowed, rank, higher) -> np.ndarray:
    s = score if higher else -score
    ok = allowed[None, :] & (s > -np.inf)  # neither NaN nor the worst infinity
    s = np.where(ok, s, -np.inf)
    hit = ok & (s == s.max(1, keepdims=True))
    out = np.full(s.shape[0], -1)
    for i in range(s.shape[0]):
        idx = np.flatnonzero(hit[i])
        if idx.size:
            out[i] = idx[np.argmax(rank[idx])]  # the first of the largest rank: the smallest id
    return out


def dyadic_rows(rng, b, num_leaves, dtype=torch.float64):
    """Rows of multiples of 1/16 summing to 1: every node sum and path sum below is exact."""
    counts = rng.multinomial(16, np.ones(num_leaves) / num_leaves, size=b)
    return torch.as_tensor(counts / 16.0).to(dtype)


def library_tables(h, x):
    post = hd.Posterior(h, x.double())
    return {"zhao": hd.get_metric("zhao", h).expected_table(post),
            "lca_height": hd.get_metric("lca_height", h).expected_table(post)}


def agree_with_library(h, x, kind, got, tables) -> list:
    """Rows where ``got`` differs from the library's decoder by more than a tie within rounding."""
    if kind == "zhao":
        lib = hd.get_metric("zhao", h, strategy="structural").decode(x)
    else:
        lib = hd.get_metric("lca_height", h).decode(x)
    table = tables[kind]  # (N, B) float64 expected values
    rtol = 1e-9 if x.dtype == torch.float64 else 2e-5
    cols = torch.arange(x.shape[0])
    a, b = table[got, cols], table[lib, cols]
    far = (a - b).abs() > rtol * torch.maximum(a.abs(), b.abs()).clamp(min=1.0)
    return [(i, int(got[i]), int(lib[i])) for i in torch.nonzero((got != lib) & far)[:, 0].tolist()]


# -- hf_beta_best_k -------------------------------------------------------------------------------------

@pytest.mark.parametrize("tree", BUNDLED)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hf_beta_best_k_is_the_exact_solver(tree, dtype):
    h = hd.load_hierarchy(tree)
    g = torch.Generator().manual_seed(3)
    depths = depth_ranges(h).depths.to(torch.float64)
    for beta, scale in [(1.0, 3.0), (0.5, 1.0), (4.0, 6.0)]:
        probs = torch.softmax(scale * torch.randn(256, h.num_leaves, generator=g, dtype=torch.float64), 1).to(dtype)
        cands, (ref_k, ref_delta), r = solver_cases(h, probs, beta)
        best_k, delta = F.hf_beta_best_k(cands.q, cands.count, depths, r)
        assert best_k.dtype == torch.int64 and delta.dtype == dtype and delta.shape == cands.q.shape[:2]
        assert torch.equal(best_k, ref_k), (beta, torch.nonzero(best_k != ref_k)[:5])
        real = torch.arange(cands.q.shape[1]) < cands.count[:, None]
        atol = 1e-12 if dtype == torch.float64 else 0.0
        rtol = 0.0 if dtype == torch.float64 else 2.0 ** -23
        torch.testing.assert_close(delta[real], ref_delta[real], atol=atol, rtol=rtol)
        assert bool(delta.isfinite().all())
        # and the brute force in float64 (near-ties excepted)
        values = numpy_values(cands.q, cands.count, depths, r)
        assert not check_best_k(best_k, values, cands.count, 1e-9 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize("tree", BUNDLED + ["random"])
def test_hf_beta_decoder_with_the_op_gives_the_cpu_plans_sets(tree, monkeypatch):
    trees = [hd.load_hierarchy(tree)] if tree != "random" else [h for h, _ in harness.random_trees(5, 6,
                                                                                                    num_nodes_max=40)]
    rng = np.random.default_rng(4)
    for h in trees:
        x = torch.as_tensor(harness.batch(rng, 48, h.num_leaves))
        for beta in [1.0, 3.0]:
            metric = hd.get_metric("hf_beta", h, beta=beta)
            cpu = metric.decode(x)
            with hd.plan_for("cuda"):
                gpu = metric.decode(x)
            # the certified and the exact solver share their tie rules: the same sets, not just equal values
            assert torch.equal(gpu, cpu), (h.num_nodes, beta, torch.nonzero((gpu != cpu).any(1))[:5, 0])


def test_hf_beta_best_k_random_and_edge_cases():
    rng = np.random.default_rng(5)
    for c, e in [(1, 1), (5, 3), (17, 2), (40, 4)]:
        q, count, depths = random_q(rng, 20, c, e)
        for r in [1 / 2, 1 / 17, 1.0, 1e-300]:
            best_k, delta = F.hf_beta_best_k(q, count, depths, r)
            assert not check_best_k(best_k, numpy_values(q, count, depths, r), count, 1e-12)
            w = hf_beta_weights(best_k, depths, r, q.dtype)
            torch.testing.assert_close(delta, torch.einsum("bce,be->bc", q, w), rtol=1e-14, atol=1e-16)
    q, count, depths = random_q(rng, 9, 12, 3)
    best_k, delta = F.hf_beta_best_k(q, count, depths, 0.4)
    # padding columns are ignored whatever they hold
    q2 = q.clone()
    q2[torch.arange(12)[None, :] >= count[:, None]] = 7.0
    b2, d2 = F.hf_beta_best_k(q2, count, depths, 0.4)
    real = torch.arange(12)[None, :] < count[:, None]
    assert torch.equal(b2, best_k) and torch.equal(d2[real], delta[real])
    # any strides give the same bits
    qt = q.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    assert not qt.is_contiguous()
    b3, d3 = F.hf_beta_best_k(qt, count, depths, 0.4)
    assert torch.equal(b3, best_k) and torch.equal(d3, delta)
    # count 0 gives k = 1; B = 0; C = 0
    assert F.hf_beta_best_k(q, torch.zeros(9, dtype=torch.int64), depths, 0.4)[0].tolist() == [1] * 9
    assert [t.shape for t in F.hf_beta_best_k(q[:0], count[:0], depths, 0.4)] == [(0,), (0, 12)]
    k0, d0 = F.hf_beta_best_k(q[:, :0], torch.zeros(9, dtype=torch.int64), depths, 0.4)
    assert k0.tolist() == [1] * 9 and d0.shape == (9, 0)
    # exact ties: one leaf depth 0 and r = 1 give w(k) = 1/k, and masses (1/2, 1/2, 0, 0) give
    # V(1) = V(2) = 1/2 exactly: the first maximum, k = 1; with r = 1/2, w(k) = 2/(k+1) and k = 2 wins
    d0 = torch.tensor([0.0], dtype=torch.float64)
    half = torch.tensor([[[0.5], [0.5], [0.0], [0.0]]], dtype=torch.float64)
    assert F.hf_beta_best_k(half, torch.tensor([4]), d0, 1.0)[0].tolist() == [1]
    assert F.hf_beta_best_k(half, torch.tensor([4]), d0, 0.5)[0].tolist() == [2]
    # equal candidates with r < 1: V(k) = k·m·2/(k+1) grows with k, all of them are taken
    same = torch.full((2, 4, 1), 0.25, dtype=torch.float64)
    assert F.hf_beta_best_k(same, torch.tensor([4, 3]), d0, 0.5)[0].tolist() == [4, 3]


def test_hf_beta_best_k_argument_errors():
    q, count, depths = torch.rand(2, 3, 2), torch.tensor([3, 1]), torch.tensor([1.0, 2.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="`q`"):
        F.hf_beta_best_k(q[0], count, depths, 0.5)
    with pytest.raises(TypeError, match="`q`"):
        F.hf_beta_best_k(q.half(), count, depths, 0.5)
    with pytest.raises(TypeError, match="`count`"):
        F.hf_beta_best_k(q, count.int(), depths, 0.5)
    with pytest.raises(ValueError, match="`count`"):
        F.hf_beta_best_k(q, count[:1], depths, 0.5)
    with pytest.raises(ValueError, match="`count`.*got 4"):
        F.hf_beta_best_k(q, count + 1, depths, 0.5)
    with pytest.raises(ValueError, match="`count`.*got -1"):
        F.hf_beta_best_k(q, count - 2, depths, 0.5)
    with pytest.raises(TypeError, match="`depths`"):
        F.hf_beta_best_k(q, count, depths.float(), 0.5)
    with pytest.raises(ValueError, match="`depths`"):
        F.hf_beta_best_k(q, count, depths[:1], 0.5)
    for r in [0.0, -1.0, 1.5, float("nan")]:
        with pytest.raises(ValueError, match="`r`"):
            F.hf_beta_best_k(q, count, depths, r)


# -- path_score_best ------------------------------------------------------------------------------------

@pytest.mark.parametrize("tree", BUNDLED)
def test_path_score_best_is_the_structural_decoders_on_bundled_trees(tree):
    h = hd.load_hierarchy(tree)
    rng = np.random.default_rng(6)
    x = torch.as_tensor(harness.model_like(rng, h, 192, "confused"))
    x = torch.cat([x, torch.as_tensor(harness.batch(rng, 64, h.num_leaves))])
    for dtype in [torch.float64, torch.float32]:
        xd = x.to(dtype)
        tables = library_tables(h, xd)
        for kind, call in [("zhao", zhao_call), ("lca_height", lca_height_call)]:
            got = call(h, xd)
            assert got.dtype == torch.int64 and got.shape == (x.shape[0],)
            assert not agree_with_library(h, xd, kind, got, tables), (kind, dtype)
            if kind == "lca_height":
                assert bool((got < h.num_leaves).all())


def test_path_score_best_is_the_structural_decoders_on_random_trees():
    rng = np.random.default_rng(7)
    for h, _ in harness.random_trees(8, 25, num_nodes_max=30):
        x = torch.as_tensor(harness.batch(rng, 24, h.num_leaves))
        tables = library_tables(h, x)
        for kind, call in [("zhao", zhao_call), ("lca_height", lca_height_call)]:
            got = call(h, x)
            assert not agree_with_library(h, x, kind, got, tables), (h.parents_list, kind)


def test_path_score_best_is_its_definition():
    """Random coefficients, masks and ranks against numpy; dyadic inputs and small integer coefficients
    make every sum exact, so ties (and the rank rule among them) are checked exactly."""
    rng = np.random.default_rng(8)
    for h, _ in harness.random_trees(9, 15, num_nodes_max=40):
        n = h.num_nodes
        src, hi, lo, parent, *_ = path_score_args(h, "zhao")
        euler_src, sign, at = path_score_args(h, "zhao")[6:9]
        for exact in [True, False]:
            if exact:
                x = dyadic_rows(rng, 16, h.num_leaves)
                coef = [torch.as_tensor(rng.integers(-2, 3, n).astype(np.float64)) for _ in range(4)]
            else:
                x = torch.as_tensor(harness.batch(rng, 16, h.num_leaves))
                coef = [torch.as_tensor(rng.standard_normal(n)) for _ in range(4)]
            alpha, beta, gamma, delta = coef
            allowed = torch.as_tensor(rng.random(n) < 0.7)
            rank = torch.as_tensor(rng.integers(0, 4, n))  # repeated ranks: then the smallest id
            score = numpy_path_scores(h, x, alpha, beta, gamma, delta)
            for higher in [True, False]:
                got = F.path_score_best(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta,
                                        allowed, rank, higher).numpy()
                want = numpy_best(score, allowed.numpy(), rank.numpy(), higher)
                if exact:
                    assert np.array_equal(got, want), (h.parents_list, got, want)
                else:
                    s = score if higher else -score
                    rows = np.arange(len(got))
                    assert np.array_equal(got < 0, want < 0) and bool(allowed.numpy()[got[got >= 0]].all())
                    assert np.allclose(s[rows, got], s[rows, want], rtol=1e-12, atol=1e-14)


def test_path_score_best_ties_nan_and_nothing_allowed():
    h, _ = next(harness.random_trees(10, 1, num_nodes_max=25))
    n = h.num_nodes
    args = list(path_score_args(h, "zhao"))
    x = torch.as_tensor(harness.batch(np.random.default_rng(1), 3, h.num_leaves))
    zeros = torch.zeros(n, dtype=torch.float64)
    # every score 0: the allowed node of largest rank
    args[4], args[5], args[9], args[10] = zeros, zeros, zeros, zeros
    rank = torch.as_tensor(np.random.default_rng(2).permutation(n))
    args[11], args[12] = torch.arange(n) % 3 == 1, rank
    best = int(torch.where(args[11], rank, -1).argmax())
    for higher in [True, False]:
        assert F.path_score_best(x, *args[:13], higher).tolist() == [best] * 3
    # NaN scores never win: a NaN input reaches p(root), hence (0·NaN = NaN) every root-path sum of
    # its row, which then has no candidate (-1) like a row with no allowed node
    args = list(path_score_args(h, "lca_height"))
    xn = x.clone()
    xn[0, 3] = float("nan")
    got = F.path_score_best(xn, *args)
    assert got[0] == -1 and torch.equal(got[1:], lca_height_call(h, x)[1:]) and bool((got[1:] >= 0).all())
    args[11] = torch.zeros(n, dtype=torch.bool)
    assert F.path_score_best(x, *args).tolist() == [-1] * 3
    # infinite scores: the best infinity wins, the worst one is never chosen
    args = list(path_score_args(h, "zhao"))
    args[4], args[5], args[9] = zeros, zeros, zeros  # score = delta·p, p > 0 on every node of these rows
    xp = torch.full((2, h.num_leaves), 1.0 / h.num_leaves, dtype=torch.float64)
    for higher, good, bad in [(True, float("inf"), float("-inf")), (False, float("-inf"), float("inf"))]:
        delta = torch.zeros(n, dtype=torch.float64)
        delta[2], delta[5] = good, bad
        only5 = torch.arange(n) == 5
        args[10] = delta
        assert F.path_score_best(xp, *args[:13], higher).tolist() == [2, 2]
        assert F.path_score_best(xp, *args[:11], only5, args[12], higher).tolist() == [-1, -1]


def test_path_score_best_inputs_strides_and_determinism():
    h = hd.load_hierarchy("tieredimagenet-h")
    rng = np.random.default_rng(11)
    x = torch.as_tensor(harness.model_like(rng, h, 40, "peaked"))
    args = path_score_args(h, "zhao")
    want = F.path_score_best(x, *args)
    for view in [x.t().contiguous().t(), torch.stack([x, x], 2).reshape(x.shape[0], -1)[:, ::2]]:
        assert torch.equal(F.path_score_best(view, *args), want)
    assert torch.equal(F.path_score_best(x[:1].expand(5, -1), *args), want[:1].expand(5))
    # half-precision inputs are read exactly and summed in float64
    for dtype in [torch.float16, torch.bfloat16, torch.float32]:
        xh = x.to(dtype)
        assert torch.equal(F.path_score_best(xh, *args), F.path_score_best(xh.double(), *args))
    assert torch.equal(F.path_score_best(x, *args), want)
    assert F.path_score_best(x[:0], *args).shape == (0,)


def test_path_score_best_argument_errors():
    h, _ = next(harness.random_trees(12, 1, num_nodes_max=20))
    args = list(path_score_args(h, "lca_height"))
    x = torch.rand(2, h.num_leaves)
    n = h.num_nodes

    def call(i, value, exc, match):
        bad = list(args)
        bad[i] = value
        with pytest.raises(exc, match=match):
            F.path_score_best(x, *bad)
    call(0, args[0].int(), TypeError, "`src`")
    call(1, args[1][:-1], ValueError, "`lo`")
    call(3, args[3][:-1], ValueError, "`parent`")
    call(3, torch.full((n,), n), ValueError, f"`parent`.*got {n}")
    call(4, args[4].float(), TypeError, "`alpha`")
    call(8, args[8][:-1], ValueError, "`at`")
    call(6, torch.full_like(args[6], -1), ValueError, "`euler_src`.*got -1")
    call(7, args[7][:-1], ValueError, "`sign`")
    call(8, torch.full((n,), 2 * n + 1), ValueError, "`at`")
    call(11, args[11].to(torch.uint8), TypeError, "`allowed`")
    call(12, args[12][:1], ValueError, "`rank`")
    call(0, args[0] + h.num_leaves, ValueError, "`src`")
    with pytest.raises(TypeError, match="`x`"):
        F.path_score_best(x.long(), *args)


# -- torch.compile, torch.export, opcheck ------------------------------------------------------------------

class Decoders(torch.nn.Module):
    """Zhao's and the LCA height's structural decoders of one tree, and one hF_β solve."""

    def __init__(self, h):
        super().__init__()
        for kind in ["zhao", "lca_height"]:
            for i, t in enumerate(path_score_args(h, kind)[:13]):
                self.register_buffer(f"{kind}{i}", t)
        self.register_buffer("depths", depth_ranges(h).depths.to(torch.float64))

    def forward(self, probs, q, count):
        a = F.path_score_best(probs, *(getattr(self, f"zhao{i}") for i in range(13)), True)
        b = F.path_score_best(probs, *(getattr(self, f"lca_height{i}") for i in range(13)), False)
        k, delta = F.hf_beta_best_k(q, count, self.depths, 0.5)
        return a, b, k, delta


def _decoder_inputs(h, b, seed):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(3 * torch.randn(b, h.num_leaves, generator=g), 1)
    q = torch.rand(b, 7, h.num_leaf_depths, generator=g)
    return probs, q, torch.randint(0, 8, (b,), generator=g)


def test_torch_compile_fullgraph():
    h, _ = next(harness.random_trees(13, 1, num_nodes_max=30))
    model = Decoders(h)
    inputs = _decoder_inputs(h, 5, 0)
    compiled = torch.compile(model, fullgraph=True)
    for a, b in zip(compiled(*inputs), model(*inputs)):
        assert torch.equal(a, b)


def test_torch_export():
    h = hd.load_hierarchy("tieredimagenet-h")
    model = Decoders(h)
    batch = torch.export.Dim("batch")
    ep = torch.export.export(model, _decoder_inputs(h, 6, 1),
                             dynamic_shapes={"probs": {0: batch}, "q": {0: batch}, "count": {0: batch}})
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert targets.count("hdecode.path_score_best.default") == 2 and "hdecode.hf_beta_best_k.default" in targets
    other = _decoder_inputs(h, 3, 2)
    for a, b in zip(ep.module()(*other), model(*other)):
        assert torch.equal(a, b)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck():
    h, _ = next(harness.random_trees(14, 1, num_nodes_max=20))
    q, count, depths = random_q(np.random.default_rng(3), 4, 6, 2)
    x = torch.rand(3, h.num_leaves)
    cases = [(torch.ops.hdecode.hf_beta_best_k.default, (q, count, depths, 0.25)),
             (torch.ops.hdecode.hf_beta_best_k.default, (q.float().transpose(1, 2).contiguous().transpose(1, 2),
                                                        count, depths, 1.0)),
             (torch.ops.hdecode.path_score_best.default, (x, *path_score_args(h, "zhao"))),
             (torch.ops.hdecode.path_score_best.default, (x.double().t().contiguous().t(),
                                                         *path_score_args(h, "lca_height")))]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_registered_schemas():
    for name in ["hf_beta_best_k", "path_score_best"]:
        assert str(getattr(torch.ops.hdecode, name).default._schema) == "hdecode::" + F.SCHEMAS[name]


# -- Triton ---------------------------------------------------------------------------------------------

def interpreter_checks() -> dict:
    """Triton kernels (interpreted) against the torch implementations; name -> {ok, detail}.

    Needs TRITON_INTERPRET=1 before Triton is imported.  The interpreter runs one program after the
    other with a large per-operation cost, so the bulk of the hF_β checks runs with one large tile
    per row (fewer, larger numpy calls), and a few rows with the tile the GPU uses.  The
    path_score_best checks run with rows in registers and again through the scratch row in tiles
    of 16 (``path_layout/``); ``large/`` has more candidates (C > 256) and nodes (N > 16,384) than
    one tile holds, as on a GPU.
    """
    from hdecode_torch.kernels.fused import _triton as T
    from hdecode_torch.kernels.fused.hf_beta_best_k import triton as hb
    from hdecode_torch.kernels.fused.path_score_best import triton as ps

    assert T.interpreted(), "set TRITON_INTERPRET=1 before importing the kernels"
    torch.set_num_threads(1)
    results = {}

    def record(name, ok, detail=""):
        results[name] = dict(ok=bool(ok), detail=str(detail))

    def best_k_case(name, q, count, depths, r):
        start = time.perf_counter()
        got_k, got_d = hb.launch(q, count, depths, r)
        seconds = time.perf_counter() - start
        ref_k, ref_d = hf_beta_best_k_torch(q, count, depths, r)
        rtol = 1e-12 if q.dtype == torch.float64 else 1e-5
        bad = check_best_k(got_k, numpy_values(q, count, depths, r), count, rtol)
        scale = q.double().sum(2).amax(1, keepdim=True).clamp(min=1e-300)
        err = float(((got_d.double() - ref_d.double()).abs() / scale).max()) if got_d.numel() else 0.0
        tol = 1e-13 if q.dtype == torch.float64 else 2e-6
        record(f"hf_beta_best_k/{name}", not bad and err <= tol and got_d.dtype == q.dtype
               and bool(got_d.isfinite().all()),
               f"rows {bad}, delta err {err:.3g}, same k {torch.equal(got_k, ref_k)}, {seconds:.2f} s")

    rng = np.random.default_rng(12)
    saved_tile = hb._RANK_TILE
    hb._RANK_TILE = 1 << 20
    try:
        for tree in BUNDLED:
            h = hd.load_hierarchy(tree)
            depths = depth_ranges(h).depths.to(torch.float64)
            g = torch.Generator().manual_seed(1)
            for dtype, beta in [(torch.float64, 1.0), (torch.float32, 3.0)]:
                probs = torch.softmax(3 * torch.randn(6, h.num_leaves, generator=g, dtype=torch.float64), 1)
                cands, _, r = solver_cases(h, probs.to(dtype), beta)
                best_k_case(f"{tree}/{dtype}/beta{beta}", cands.q, cands.count, depths, r)
        for c, e in [(1, 1), (7, 3), (16, 1), (17, 4), (100, 2), (256, 1)]:
            q, count, depths = random_q(rng, 6, c, e)
            best_k_case(f"random/C{c}/E{e}", q, count, depths, 0.3)
        q, count, depths = random_q(rng, 6, 20, 3, dtype=torch.float32, zero_pad=False)
        best_k_case("random/float32/garbage_padding", q, count, depths, 0.7)
        best_k_case("random/strided", q.permute(2, 0, 1).contiguous().permute(1, 2, 0), count, depths, 0.7)
        same = torch.full((3, 5, 1), 0.125, dtype=torch.float64)
        best_k_case("ties/r1", same, torch.tensor([5, 2, 0]), torch.tensor([1.0], dtype=torch.float64), 1.0)
        best_k_case("ties/r0.5", same, torch.tensor([5, 2, 0]), torch.tensor([1.0], dtype=torch.float64), 0.5)
        got = hb.launch(same[:, :0], torch.zeros(3, dtype=torch.int64),
                                       torch.tensor([1.0], dtype=torch.float64), 0.5)
        got0 = hb.launch(same[:0], torch.zeros(0, dtype=torch.int64),
                                        torch.tensor([1.0], dtype=torch.float64), 0.5)
        record("hf_beta_best_k/edge/C0_B0", got[0].tolist() == [1, 1, 1] and got[1].shape == (3, 0)
               and got0[0].shape == (0,) and got0[1].shape == (0, 5))
        a = hb.launch(q, count, depths, 0.7)
        b = hb.launch(q, count, depths, 0.7)
        record("hf_beta_best_k/deterministic", torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
    finally:
        hb._RANK_TILE = saved_tile
    # the GPU's tile: several k blocks and candidate chunks per row
    for c, e in [(40, 3)]:  # 5 blocks of 8 k, 3 chunks of 16 candidates
        q, count, depths = random_q(rng, 2, c, e)
        best_k_case(f"gpu_tile/C{c}/E{e}", q, count, depths, 0.5)

    # path_score_best, in both row layouts
    def path_case(name, x, args):
        start = time.perf_counter()
        got = ps.launch(x, *args)
        seconds = time.perf_counter() - start
        ref = path_score_best_torch(x, *args)
        record(name, torch.equal(got, ref), f"{got.tolist()[:8]} vs {ref.tolist()[:8]}, {seconds:.2f} s")

    trees = [("tiered", hd.load_hierarchy("tieredimagenet-h"))]
    trees += [(f"random{i}", t) for i, (t, _) in enumerate(harness.random_trees(15, 3, num_nodes_max=40))]
    saved = T.MAX_REGISTER_ROW, T.SCAN_BLOCK
    for group, small_tiles in [("path_score_best", False), ("path_layout", True)]:
        if small_tiles:
            T.MAX_REGISTER_ROW, T.SCAN_BLOCK = 0, 16
        try:
            for label, h in trees[1:] if small_tiles else trees:
                x = torch.as_tensor(harness.batch(rng, 6, h.num_leaves))
                for kind in ["zhao", "lca_height"]:
                    args = path_score_args(h, kind)
                    for dtype in [torch.float64, torch.float32, torch.bfloat16]:
                        path_case(f"{group}/{label}/{kind}/{dtype}", x.to(dtype), args)
                    path_case(f"{group}/{label}/{kind}/dyadic", dyadic_rows(rng, 6, h.num_leaves), args)
                n = h.num_nodes
                src, hi, lo, parent, *_ = path_score_args(h, "zhao")
                euler_src, sign, at = path_score_args(h, "zhao")[6:9]
                coef = [torch.as_tensor(rng.integers(-2, 3, n).astype(np.float64)) for _ in range(4)]
                allowed = torch.as_tensor(rng.random(n) < 0.6)
                rank = torch.as_tensor(rng.integers(0, 3, n))
                for higher in [True, False]:
                    args = (src, hi, lo, parent, coef[0], coef[1], euler_src, sign, at, coef[2], coef[3], allowed,
                            rank, higher)
                    path_case(f"{group}/{label}/ties/{higher}", dyadic_rows(rng, 6, h.num_leaves), args)
            h = trees[1][1]
            args = list(path_score_args(h, "lca_height"))
            x = torch.as_tensor(harness.batch(rng, 4, h.num_leaves))
            xn = x.clone()
            xn[0, 0] = float("nan")
            xn[1] = float("nan")
            path_case(f"{group}/nan", xn, args)
            path_case(f"{group}/strided", torch.cat([x, x], 1)[:, 1::2], args)
            inf_args = list(path_score_args(h, "zhao"))
            zeros = torch.zeros(h.num_nodes, dtype=torch.float64)
            inf_args[4], inf_args[5], inf_args[9] = zeros, zeros, zeros
            inf_args[10] = torch.where(torch.arange(h.num_nodes) % 3 == 0, float("inf"), float("-inf")).double()
            for higher in [True, False]:
                inf_args[13] = higher
                path_case(f"{group}/infinities/{higher}", x, inf_args)
            path_case(f"{group}/broadcast", x[:1].expand(3, -1), args)
            record(f"{group}/B0", ps.launch(x[:0], *args).shape == (0,))
            args[11] = torch.zeros(h.num_nodes, dtype=torch.bool)
            path_case(f"{group}/nothing_allowed", x, args)
        finally:
            T.MAX_REGISTER_ROW, T.SCAN_BLOCK = saved

    # beyond one tile, as on a GPU: more candidates than the old cap (MAX_C = 256) and than one ranking
    # tile; more nodes, leaves and tour entries than a register row (the old cap was MAX_N = 4096)
    hb._RANK_TILE = 1 << 20
    try:
        q, count, depths = random_q(rng, 2, 300, 2)
        best_k_case("large/C300", q, count, depths, 0.4)
    finally:
        hb._RANK_TILE = saved_tile
    saved_columns = hb.MAX_RANK_COLUMNS
    hb.MAX_RANK_COLUMNS = 16
    try:
        q, count, depths = random_q(rng, 2, 40, 3)  # 3 column tiles of 16
        best_k_case("large/column_tiles", q, count, depths, 0.6)
    finally:
        hb.MAX_RANK_COLUMNS = saved_columns
    parent = np.full(T.MAX_REGISTER_ROW + 700, -1)
    parent[1:] = [int(rng.integers(max(0, v - 30), v)) for v in range(1, len(parent))]
    big = hd.Hierarchy.from_parents(parent)
    assert not T.row_layout(big.num_nodes, torch.device("cpu")) and big.num_nodes > 4096
    x = torch.as_tensor(harness.batch(rng, 3, big.num_leaves))
    for kind in ["zhao", "lca_height"]:
        path_case(f"large/{big.num_nodes}_nodes/{kind}", x, path_score_args(big, kind))
        path_case(f"large/{big.num_nodes}_nodes/{kind}/float32", x.float(), path_score_args(big, kind))

    # the CUDA dispatch, run on CPU tensors: Triton at any size, torch when disabled
    calls = []
    for name, module in [("hf_beta_best_k", hb), ("path_score_best", ps)]:
        module.launch = lambda *a, _orig=module.launch, _name=name: calls.append(_name) or _orig(*a)
    q, count, depths = random_q(rng, 3, 9, 2)
    h = trees[1][1]
    x = torch.as_tensor(harness.batch(rng, 3, h.num_leaves))
    args = path_score_args(h, "zhao")
    k_ref = hf_beta_best_k_torch(q, count, depths, 0.5)[0]
    p_ref = path_score_best_torch(x, *args)
    k = OPS["hf_beta_best_k"].cuda(q, count, depths, 0.5)[0]
    p = OPS["path_score_best"].cuda(x, *args)
    record("dispatch/triton", calls == ["hf_beta_best_k", "path_score_best"]
           and torch.equal(k, k_ref) and torch.equal(p, p_ref), calls)
    calls.clear()
    hb.MAX_RANK_COLUMNS, T.MAX_REGISTER_ROW = 4, h.num_nodes - 1
    try:
        k = OPS["hf_beta_best_k"].cuda(q, count, depths, 0.5)[0]
        p = OPS["path_score_best"].cuda(x, *args)
        record("dispatch/large_uses_triton", calls == ["hf_beta_best_k", "path_score_best"]
               and torch.equal(k, k_ref) and torch.equal(p, p_ref), calls)
    finally:
        hb.MAX_RANK_COLUMNS, T.MAX_REGISTER_ROW = saved_columns, saved[0]
    calls.clear()
    F.set_triton_enabled(False)
    try:
        k = OPS["hf_beta_best_k"].cuda(q, count, depths, 0.5)[0]
        p = OPS["path_score_best"].cuda(x, *args)
        record("dispatch/disabled_uses_torch", calls == [] and torch.equal(k, k_ref) and torch.equal(p, p_ref), calls)
    finally:
        F.set_triton_enabled(True)
    for name, fn in [("count", lambda: OPS["hf_beta_best_k"].cuda(q, count + 10, depths, 0.5)),
                     ("parent", lambda: OPS["path_score_best"].cuda(x, *args[:3], args[3] + h.num_nodes, *args[4:]))]:
        try:
            fn()
            record(f"dispatch/checked/{name}", False)
        except ValueError as err:
            record(f"dispatch/checked/{name}", calls == [] and f"`{name}`" in str(err), err)
    return results


@pytest.mark.plan_independent
@needs_triton
def test_triton_interpreter_matches_torch():
    results = interpreter_results("test_fused_decoders")
    groups = {k.split("/")[0] for k in results}
    assert groups == {"hf_beta_best_k", "path_score_best", "path_layout", "large", "dispatch"}, groups
    assert len(results) > 100
    failed = {k: v for k, v in results.items() if not v["ok"]}
    assert not failed, failed


@pytest.mark.plan_independent
@needs_triton
def test_triton_kernels_compile_for_sm90():
    """The real compiler (not the interpreter) accepts both kernels, path_score_best in both row
    layouts; the register layout at its largest row within the shared memory its rule assumes."""
    check_compiles_for_sm90("""
        from hdecode_torch.kernels.fused import _triton as T
        from hdecode_torch.kernels.fused.hf_beta_best_k import triton as hb
        from hdecode_torch.kernels.fused.path_score_best import triton as ps
        for dt, cb, bk in [("fp64", 16, 16), ("fp32", hb.MAX_RANK_COLUMNS, 2)]:
            sig = {"Q": "*" + dt, "stride_qb": "i64", "stride_qc": "i64", "stride_qe": "i64", "COUNT": "*i64",
                   "W": "*" + dt, "KOUT": "*i64", "DOUT": "*" + dt, "C": "i32", "E": "i32", "CB": "constexpr",
                   "BK": "constexpr", "CC": "constexpr"}
            build(hb._hf_beta_best_k_kernel, sig, {"CB": cb, "BK": bk, "CC": 16}, 4 if cb <= 32 else 8)
        sig = {"X": "*fp32", "stride_xb": "i64", "stride_xm": "i64", "SRC": "*i64", "HI": "*i64", "LO": "*i64",
               "PARENT": "*i64", "ALPHA": "*fp64", "BETA": "*fp64", "ESRC": "*i64", "SIGN": "*fp64", "AT": "*i64",
               "GAMMA": "*fp64", "DELTA": "*fp64", "ALLOWED": "*u8", "RANK": "*i64", "OUT": "*i64",
               "SCRATCH": "*fp64", "J": "i32", "N": "i32", "T": "i32", "HIGHER": "constexpr", "IN_REGS": "constexpr",
               "JP": "constexpr", "NP": "constexpr", "TP": "constexpr"}
        for xt, higher, regs, n, warps in [("fp32", True, True, 1024, 8),
                                           ("bf16", False, True, T.MAX_REGISTER_ROW // 2, 16),
                                           ("fp16", True, False, T.SCAN_BLOCK, T.num_warps(T.SCAN_BLOCK))]:
            tp = 2 * n if regs else n
            k = build(ps._path_score_best_kernel, dict(sig, X="*" + xt),
                      {"HIGHER": higher, "IN_REGS": regs, "JP": n, "NP": n, "TP": tp}, warps)
            if regs:
                assert k.metadata.shared <= 8 * tp + 4096, k.metadata.shared
    """)


def test_works_without_triton_and_imports_neither_triton_nor_dynamo():
    # Only the fused package is imported (its parents are stand-ins) with Triton, torch._dynamo and
    # torch._inductor unimportable; both ops run on the CPU and through the CUDA kernels' torch
    # fallback (on CPU tensors).  The tree: root 4 over leaf 2 and node 3, node 3 over leaves 0 and 1.
    code = block_imports("triton", "torch._dynamo", "torch._inductor") + textwrap.dedent("""
        import os, types
        import torch
        for name in ["hdecode_torch", "hdecode_torch.kernels"]:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join(ROOT, *name.split("."))]
            sys.modules[name] = mod
        import hdecode_torch.kernels.fused as F
        from hdecode_torch.kernels.fused._registry import OPS
        T = lambda *v: torch.tensor(v)
        D = lambda *v: torch.tensor(v, dtype=torch.float64)
        height = D(0, 0, 0, 1, 2)
        alpha = D(1, 1, 2, 2, 0)  # height of the parent, 0 at the root
        args = (T(2, 0, 1), T(2, 3, 1, 3, 3), T(1, 2, 0, 1, 0), T(3, 3, 4, 4, 4), alpha, -alpha,
                T(4, 2, 2, 3, 0, 0, 1, 1, 3, 4), D(1, 1, -1, 1, 1, -1, 1, -1, -1, -1), T(5, 7, 2, 4, 1),
                D(1, 1, 1, 1, 1), height, T(1, 1, 1, 0, 0).bool(), T(9, 8, 7, 1, 0), False)
        x = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
        q = torch.tensor([[[0.5], [0.3], [0.2]], [[1.0], [0.0], [0.0]]], dtype=torch.float64)
        count, depths = T(3, 1), D(0)
        print(F.triton_available())
        print(F.path_score_best(x, *args).tolist(), OPS["path_score_best"].cuda(x, *args).tolist(),
              F.hf_beta_best_k(q, count, depths, 0.5)[0].tolist(),
              OPS["hf_beta_best_k"].cuda(q, count, depths, 0.5)[0].tolist())
        print(loaded("triton", "torch._dynamo", "torch._inductor"))
    """).replace("ROOT", repr(ROOT))
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # expected LCA heights: leaf 0: 0.2·2 + 0.3·1 = 0.7, leaf 1: 0.2·2 + 0.5·1 = 0.9, leaf 2: 0.8·2 (row 0);
    # leaf 2: 0.2·2 (row 1).  hF_β with r = 1/2 and one leaf depth 0: V = 0.5, 0.8·2/3, 1·2/4 for k = 1, 2, 3
    assert proc.stdout.splitlines() == ["False", "[0, 2] [0, 2] [2, 1] [2, 1]", "[]"]


if __name__ == "__main__":
    print(json.dumps(interpreter_checks(), indent=1))


# -- jaccard_sets ------------------------------------------------------------------------------------------

def _jaccard_case(tree="tieredimagenet-h", b=24, seed=3):
    """The arguments of the GPU plan's jaccard_sets call while decoding ``b`` model-like rows."""
    import sys
    J = sys.modules["hdecode_torch.metrics.jaccard"]
    h = hd.load_hierarchy(tree)
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(np.concatenate([harness.model_like(rng, h, b // 2, k) for k in ("peaked", "confused")]))
    seen = []
    original = J.jaccard_sets

    def spy(*args):
        seen.append(args)
        return original(*args)
    J.jaccard_sets = spy
    try:
        with hd.plan_for("cuda"):
            sets = hd.get_metric("jaccard", h).decode(x)
    finally:
        J.jaccard_sets = original
    assert len(seen) == 1
    return h, x, sets, seen[0]


def test_jaccard_sets_is_the_decoder_and_passes_opcheck():
    h, x, sets, args = _jaccard_case()
    members = F.jaccard_sets(*args)
    ids = args[1]
    got = torch.zeros(x.shape[0], h.num_nodes + 1, dtype=torch.bool).scatter_(
        1, torch.where(members, ids, h.num_nodes), True)[:, : h.num_nodes]
    got[:, h.root] = True
    assert torch.equal(got, sets)
    assert torch.equal(got, hd.get_metric("jaccard", h).decode(x))  # the CPU plan's sets
    if hasattr(torch.library, "opcheck"):
        result = torch.library.opcheck(torch.ops.hdecode.jaccard_sets.default, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_jaccard_sets_empty_rows_and_argument_errors():
    h, x, _, args = _jaccard_case(b=4)
    q, ids, count, lb, k_ref, *rest = args
    # no candidate column at all, and no row
    assert F.jaccard_sets(q[:, :0], ids[:, :0], torch.zeros_like(count), lb, k_ref, *rest).shape == (4, 0)
    assert F.jaccard_sets(q[:0], ids[:0], count[:0], lb[:0], k_ref[:0], *rest).shape == (0, ids.shape[1])
    # a bound above every value rules every size out: no set
    assert not F.jaccard_sets(q, ids, count, torch.full_like(lb, 2.0), k_ref, *rest).any()
    with pytest.raises(TypeError, match="`q`"):
        F.jaccard_sets(q.float(), ids, count, lb, k_ref, *rest)
    with pytest.raises(ValueError, match="`ids`"):
        F.jaccard_sets(q, ids[:, 1:], count, lb, k_ref, *rest)
    with pytest.raises(TypeError, match="`lb`"):
        F.jaccard_sets(q, ids, count, lb.float(), k_ref, *rest)
