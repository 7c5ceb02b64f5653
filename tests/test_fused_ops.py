"""The fused ``hdecode::`` ops (hdecode_torch.kernels.fused).

- the torch implementations against naive float64 numpy sums for every documented use (node
  probabilities, masses per leaf depth, weighted sums, subtree sums, root-path sums through an Euler
  tour) on random trees with single-child chains and unbalanced depths and on the bundled trees; the
  fused decision against a numpy decision; wide batches and long rows against a NumPy scan (bit for
  bit); one-entry ranges exact; input dtypes, empty shapes, strided inputs, errors, determinism;
- torch.compile(fullgraph=True), torch.export and torch.library.opcheck;
- the Triton kernels under Triton's CPU interpreter, in a subprocess with TRITON_INTERPRET=1 (the
  interpreter is chosen when the kernels are defined, so it needs a fresh process), in both row
  layouts and on rows longer than one register tile, and compiled ahead of time for sm_90 (no GPU
  needed);
- the package imported and used with Triton unimportable, and its import pulling in neither Triton
  nor torch._dynamo / torch._inductor.

Run ``python tests/test_fused_ops.py`` to print the interpreter checks as JSON.
"""

from __future__ import annotations

import json
import math
import struct
import textwrap

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import hdecode_torch.kernels.fused as F
from hdecode_torch.kernels.fused._registry import OPS
from hdecode_torch.kernels.fused.best_ranked_above import best_ranked_above_torch
from hdecode_torch.kernels.fused.gathered_prefix import gathered_prefix_torch
from hdecode_torch.kernels.fused.row_check import POSITIVE_FINITE, row_check_torch, unit_sum_bounds

from testing import Operators
from triton_testing import (  # noqa: E402
    ROOT, block_imports, check_compiles_for_sm90, interpreter_results, needs_triton, run_python)

EPS = np.finfo(np.float64).eps


# -- index arrays of the documented uses, built from a parent array (test helper, not library code) --

def tree_indices(parent) -> dict:
    """Depth-first tables of a tree given as a parent array (-1 at the root), children in id order.

    Returns numpy arrays: depth, preorder ``pre`` and positions ``pre_pos``, subtree ``size``,
    ``leaves`` in depth-first order with each node's leaf range ``[leaf_lo, leaf_hi)``, the Euler
    tour ``euler``/``euler_w`` with ``entry`` positions, leaves sorted by (depth, depth-first
    position) ``depth_src`` with per-(node, depth) ranges ``depth_lo/depth_hi`` (k = n·E + e), and
    ``anc``: each node's ancestors, itself included.
    """
    parent = np.asarray(parent, dtype=np.int64)
    n = parent.shape[0]
    (root,) = np.flatnonzero(parent < 0)
    children = [[] for _ in range(n)]
    for c in range(n):
        if parent[c] >= 0:
            children[parent[c]].append(c)
    depth = np.zeros(n, dtype=np.int64)
    pre, euler, euler_w, entry = [], [], [], np.zeros(n, dtype=np.int64)
    stack = [(int(root), False)]
    while stack:
        v, leaving = stack.pop()
        euler.append(v)
        euler_w.append(-1.0 if leaving else 1.0)
        if leaving:
            continue
        entry[v] = len(euler) - 1
        pre.append(v)
        stack.append((v, True))
        for c in reversed(children[v]):
            depth[c] = depth[v] + 1
            stack.append((c, False))
    pre = np.asarray(pre, dtype=np.int64)
    pre_pos = np.empty(n, dtype=np.int64)
    pre_pos[pre] = np.arange(n)
    is_leaf = np.array([not ch for ch in children])
    size = np.ones(n, dtype=np.int64)
    leaf_count = is_leaf.astype(np.int64)
    for v in pre[::-1]:
        if parent[v] >= 0:
            size[parent[v]] += size[v]
            leaf_count[parent[v]] += leaf_count[v]
    leaves = pre[is_leaf[pre]]
    leaf_lo = np.cumsum(np.concatenate([[0], is_leaf[pre].astype(np.int64)]))[pre_pos]
    leaf_hi = leaf_lo + leaf_count
    leaf_pos = np.empty(n, dtype=np.int64)
    leaf_pos[leaves] = np.arange(len(leaves))
    depths = np.unique(depth[leaves])
    depth_src = leaves[np.lexsort((leaf_pos[leaves], depth[leaves]))]
    depth_lo = np.empty((n, len(depths)), dtype=np.int64)
    depth_hi = np.empty_like(depth_lo)
    offset = 0
    for e, d in enumerate(depths):
        block = leaf_pos[depth_src[depth[depth_src] == d]]  # increasing
        depth_lo[:, e] = offset + np.searchsorted(block, leaf_lo)
        depth_hi[:, e] = offset + np.searchsorted(block, leaf_hi)
        offset += len(block)
    anc = []
    for v in range(n):
        path = [v]
        while parent[path[-1]] >= 0:
            path.append(int(parent[path[-1]]))
        anc.append(np.asarray(path))
    return dict(n=n, parent=parent, depth=depth, is_leaf=is_leaf, leaf_count=leaf_count, pre=pre, pre_pos=pre_pos,
                size=size, leaves=leaves, leaf_lo=leaf_lo, leaf_hi=leaf_hi, euler=np.asarray(euler, dtype=np.int64),
                euler_w=np.asarray(euler_w), entry=entry, depths=depths, depth_src=depth_src,
                depth_lo=depth_lo.reshape(-1), depth_hi=depth_hi.reshape(-1), anc=anc)


def random_parent(rng, n: int) -> np.ndarray:
    """A random tree of n nodes with long single-child chains and unbalanced depths, ids shuffled."""
    parent = np.full(n, -1, dtype=np.int64)
    for v in range(1, n):
        r = rng.random()
        # extend the last node into a chain, hang under a shallow node, or anywhere
        parent[v] = v - 1 if r < 0.35 else rng.integers(0, max(1, v // 4)) if r < 0.6 else rng.integers(0, v)
    perm = rng.permutation(n)
    out = np.full(n, -1, dtype=np.int64)
    out[perm] = np.where(parent >= 0, perm[np.maximum(parent, 0)], -1)
    return out


def random_trees(seed: int = 0, count: int = 6):
    rng = np.random.default_rng(seed)
    trees = [np.array([-1]), np.array([-1, 0]), np.array([-1, 0, 1, 2, 0])]  # lone root, one chain, chain + leaf
    trees += [random_parent(rng, int(rng.integers(5, 60))) for _ in range(count)]
    return [tree_indices(p) for p in trees]


def bundled_indices(name: str) -> dict:
    t = tree_indices(hd.load_hierarchy(name).parent.numpy())
    assert t["leaves"].max() == t["is_leaf"].sum() - 1  # canonical ids: leaves are columns 0..L-1
    return t


def rank_depth(t) -> np.ndarray:
    """depth·N + (N - 1 - id): deepest first, then the smallest id."""
    n = t["n"]
    return t["depth"] * n + (n - 1 - np.arange(n))


def rank_information(t) -> np.ndarray:
    """Fewest leaves first (most informative), then deepest, then the smallest id; all distinct."""
    n = t["n"]
    order = np.lexsort((-np.arange(n), t["depth"], -t["leaf_count"]))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank


def uses(t, weights: bool = True) -> dict:
    """Index arrays (torch) of the five documented uses: name -> (x kind, src, weight, hi, lo)."""
    T = lambda a: torch.as_tensor(np.ascontiguousarray(a))  # noqa: E731
    return {
        "node_probabilities": ("leaf", T(t["leaves"]), None, T(t["leaf_hi"]), T(t["leaf_lo"])),
        "depth_masses": ("leaf", T(t["depth_src"]), None, T(t["depth_hi"]), T(t["depth_lo"])),
        "weighted": ("leaf", T(t["leaves"]), T(1.0 / (t["depth"][t["leaves"]] + 1.0)) if weights else None,
                     T(t["leaf_hi"]), T(t["leaf_lo"])),
        "subtree": ("node", T(t["pre"]), None, T(t["pre_pos"] + t["size"]), T(t["pre_pos"])),
        "root_path": ("node", T(t["euler"]), T(t["euler_w"]), T(t["entry"] + 1), None),
    }


def naive_uses(t, xl: np.ndarray, xn: np.ndarray) -> dict:
    """The five uses by their definitions, summing explicit member sets in float64."""
    n, b = t["n"], xl.shape[0]
    members = [[] for _ in range(n)]
    for m in range(n):
        for a in t["anc"][m]:
            members[a].append(m)
    depth, is_leaf, depths = t["depth"], t["is_leaf"], t["depths"]
    out = {k: np.zeros((b, n)) for k in ["node_probabilities", "weighted", "subtree", "root_path"]}
    out["depth_masses"] = np.zeros((b, n, len(depths)))
    for v in range(n):
        lv = [m for m in members[v] if is_leaf[m]]
        out["node_probabilities"][:, v] = xl[:, lv].sum(1)
        out["weighted"][:, v] = (xl[:, lv] / (depth[lv] + 1.0)).sum(1)
        for e, d in enumerate(depths):
            out["depth_masses"][:, v, e] = xl[:, [m for m in lv if depth[m] == d]].sum(1)
        out["subtree"][:, v] = xn[:, members[v]].sum(1)
        out["root_path"][:, v] = xn[:, t["anc"][v]].sum(1)
    out["depth_masses"] = out["depth_masses"].reshape(b, -1)
    return out


def scale(x: torch.Tensor, src, weight) -> np.ndarray:
    """Per row Σ_j |weight_j·x[src_j]|: the float64 rounding error of a range sum is a few J·eps of it."""
    g = x.double().index_select(1, src).abs()
    if weight is not None:
        g = g * weight.abs()
    return g.sum(1).numpy()


def assert_range_sums_close(got: torch.Tensor, ref: np.ndarray, j: int, row_scale: np.ndarray, what: str):
    got = got.double().numpy()
    tol = 4.0 * max(j, 1) * EPS * row_scale[:, None] + 1e-300
    err = np.abs(got - ref)
    assert got.shape == ref.shape, what
    assert (err <= tol).all(), f"{what}: max error {err.max():.3g}, tolerance {tol.min():.3g}"


def inputs(rng, t, b: int, dtype=torch.float64, m: int | None = None):
    """Leaf probabilities (B, M) and signed node values (B, N)."""
    m = t["n"] if m is None else m
    xl = torch.as_tensor(rng.dirichlet(np.full(m, 0.3), size=b)).to(dtype)
    xn = torch.as_tensor(rng.standard_normal((b, t["n"]))).to(dtype)
    return xl, xn


# -- torch kernels against the definitions -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_uses_match_definitions_on_random_trees(dtype):
    rng = np.random.default_rng(1)
    for t in random_trees(1):
        xl, xn = inputs(rng, t, 5, dtype)
        ref = naive_uses(t, xl.double().numpy(), xn.double().numpy())
        for name, (kind, src, weight, hi, lo) in uses(t).items():
            x = xl if kind == "leaf" else xn
            got = F.gathered_prefix(x, src, weight, hi, lo, torch.float64)
            assert got.dtype == torch.float64
            assert_range_sums_close(got, ref[name], len(src), scale(x, src, weight), f"{name} n={t['n']}")
            got32 = F.gathered_prefix(x, src, weight, hi, lo, torch.float32)
            # float32 output is the float64 result rounded once
            assert torch.equal(got32, got.to(torch.float32)), name


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_uses_match_definitions_on_bundled_trees(tree):
    t = bundled_indices(tree)
    rng = np.random.default_rng(2)
    xl, xn = inputs(rng, t, 3, torch.float32, m=int(t["is_leaf"].sum()))
    ref = naive_uses(t, xl.double().numpy(), xn.double().numpy())
    for name, (kind, src, weight, hi, lo) in uses(t).items():
        x = xl if kind == "leaf" else xn
        got = F.gathered_prefix(x, src, weight, hi, lo, torch.float64)
        assert_range_sums_close(got, ref[name], len(src), scale(x, src, weight), f"{tree} {name}")
    p = F.gathered_prefix(xl, *uses(t)["node_probabilities"][1:], torch.float64)
    assert np.allclose(p[:, t["pre"][0]].numpy(), 1.0, atol=1e-12)  # the root holds all the mass


def test_node_probabilities_match_the_library():
    h = hd.load_hierarchy("tieredimagenet-h")
    t = tree_indices(h.parent.numpy())
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(16, h.num_leaves, generator=g, dtype=torch.float64), 1)
    got = F.gathered_prefix(probs, *uses(t)["node_probabilities"][1:], torch.float64)
    assert torch.allclose(got, hd.node_probabilities(h, probs), rtol=0, atol=1e-13)


def numpy_decision(v: np.ndarray, rank: np.ndarray, threshold: float, fallback: int) -> np.ndarray:
    out = np.full(v.shape[0], fallback, dtype=np.int64)
    for b in range(v.shape[0]):
        ok = np.flatnonzero(v[b] > threshold)
        if len(ok):
            top = rank[ok].max()
            out[b] = ok[rank[ok] == top].min()
    return out


def dyadic_probs(rng, b: int, t, m: int, dtype) -> torch.Tensor:
    """(B, M) probabilities on the leaf columns, multiples of 1/64 so that every partial sum is exact;
    row 0 puts 1/2 on the first and on the last leaf of the depth-first order."""
    leaves = t["leaves"]
    counts = np.zeros((b, m))
    counts[:, leaves] = rng.multinomial(64, rng.dirichlet(np.full(len(leaves), 0.5)), size=b)
    counts[0, :] = 0
    counts[0, leaves[0]] += 32
    counts[0, leaves[-1]] += 32
    return torch.as_tensor(counts / 64.0).to(dtype)


@pytest.mark.parametrize("tree", ["random", "tieredimagenet-h"])
def test_best_ranked_above_is_the_rule_on_exact_probabilities(tree):
    rng = np.random.default_rng(4)
    trees = random_trees(4) if tree == "random" else [bundled_indices(tree)]
    for t in trees:
        m = t["n"] if tree == "random" else int(t["is_leaf"].sum())
        x = dyadic_probs(rng, 12, t, m, torch.float32)
        _, src, _, hi, lo = uses(t)["node_probabilities"]
        p = naive_uses(t, x.double().numpy(), np.zeros((12, t["n"])))["node_probabilities"]  # exact
        for rank, thr in [(rank_depth(t), 0.5), (rank_depth(t), (1 + 0.25) / 2), (rank_depth(t), 1.25),
                          (rank_information(t), 0.8), (np.zeros(t["n"], dtype=np.int64), 0.3)]:
            got = F.best_ranked_above(x, src, hi, lo, torch.as_tensor(rank), thr, -1)
            assert got.dtype == torch.int64 and got.shape == (12,)
            assert np.array_equal(got.numpy(), numpy_decision(p, rank, thr, -1)), (t["n"], thr)
        # row 0: the nodes holding exactly one of the two halves have p = 1/2, not above 1/2: the
        # deepest node above 1/2 is the lowest common ancestor of the two leaves
        first, last = (set(t["anc"][v].tolist()) for v in (t["leaves"][0], t["leaves"][-1]))
        lca = max(first & last, key=lambda v: t["depth"][v])
        assert F.best_ranked_above(x, src, hi, lo, torch.as_tensor(rank_depth(t)), 0.5, -1)[0] == lca


def test_deepest_majority_node_is_the_tree_distance_rule():
    t = bundled_indices("tieredimagenet-h")
    _, src, _, hi, lo = uses(t)["node_probabilities"]
    x = torch.softmax(torch.randn(64, len(src), generator=torch.Generator().manual_seed(5)) * 4, 1)
    p = F.gathered_prefix(x, src, None, hi, lo, torch.float64).numpy()
    got = F.best_ranked_above(x, src, hi, lo, torch.as_tensor(rank_depth(t)), 0.5, int(t["pre"][0])).numpy()
    for b in range(64):
        above = np.flatnonzero(p[b] > 0.5)
        deepest = above[t["depth"][above] == t["depth"][above].max()] if len(above) else [t["pre"][0]]
        assert got[b] == min(deepest)
        # the majority nodes form one root path: the answer lies below all of them
        assert set(above) <= set(t["anc"][got[b]].tolist())


def test_best_ranked_above_with_lo_none_and_rank_ties():
    x = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    src = torch.tensor([3, 2, 1, 0])
    hi = torch.tensor([1, 2, 3, 4, 0])  # prefix sums 0.4, 0.7, 0.9, 1.0, 0
    rank = torch.tensor([5, 7, 7, 1, 9])
    got = F.best_ranked_above(x, src, hi, None, rank, 0.5, 42)
    assert got.tolist() == [1, 42]  # ranks 7 tie at k = 1, 2: the smaller k
    assert F.best_ranked_above(x, src, hi, None, rank, -0.5, 42).tolist() == [4, 4]
    assert F.best_ranked_above(x, src, hi, None, rank, float("nan"), 42).tolist() == [42, 42]
    lowest = torch.iinfo(torch.int64).min
    assert F.best_ranked_above(x[:1], src, hi[:1], None, torch.tensor([lowest]), 0.0, 42).tolist() == [0]


def dyadic_rows(rng, b: int, m: int, dtype) -> torch.Tensor:
    """(B, M) entries k/256, 0 <= k < 256 (exact in every input dtype, every row sum exact in float64 in
    any order), then special values when m > 0: row 1 a NaN, row 2 +inf, row 3 -inf, row 4 all -0.0,
    row 5 one negative entry, row 6 +inf and -inf, row 7 only NaN."""
    x = torch.as_tensor(rng.integers(0, 256, (b, m)) / 256.0).to(dtype)
    if m:
        x[1, m // 2] = float("nan")
        x[2, 0] = float("inf")
        x[3, m - 1] = float("-inf")
        x[4] = -0.0
        x[5, (m - 1) // 3] = -1 / 256
        x[6, 0], x[6, m - 1] = float("inf"), float("-inf")
        x[7] = float("nan")
    return x


def row_check_bounds(x: torch.Tensor) -> list[tuple[float, float]]:
    """Bounds at and one float64 beyond row 0's exact sum, unbounded, the library's, and empty."""
    s0 = float(x[0].double().sum())
    inf = float("inf")
    return [(s0, s0), (math.nextafter(s0, inf), inf), (-inf, math.nextafter(s0, -inf)), (-inf, inf),
            POSITIVE_FINITE, unit_sum_bounds(1e-6), (0.0, 0.0), (-0.0, 0.0), (1.0, -1.0)]


def row_check_views(y: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """``y`` contiguous, column-major, as every other column of a wider table, broadcast, and with no row."""
    wide = torch.zeros(y.shape[0], 2 * y.shape[1], dtype=y.dtype)
    wide[:, 1::2] = y
    return [("contiguous", y), ("transposed", y.t().contiguous().t()), ("sliced", wide[:, 1::2]),
            ("broadcast", y[:1].expand(4, -1)), ("B=0", y[:0])]


def tolerance_edge_sums(tol: float) -> np.ndarray:
    """The 40 float64 values either side of each of ``unit_sum_bounds(tol)``, ``1 - tol`` and ``1 + tol``."""
    near = [1.0]
    for edge in [*unit_sum_bounds(tol), 1.0 - tol, 1.0 + tol]:
        below = above = edge
        near.append(edge)
        for _ in range(40):
            below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
            near += [below, above]
    return np.array(near)


def numpy_row_check(x: torch.Tensor, lo: float, hi: float) -> np.ndarray:
    """The row check by its definition in NumPy: no NaN, no entry < 0, lo <= float64 sum <= hi."""
    a = x.double().numpy()
    nan = np.isnan(a)
    no_negative = np.where(nan, 0.0, a).min(axis=1, initial=np.inf) >= 0
    with np.errstate(invalid="ignore"):  # +inf + -inf
        s = a.sum(axis=1)
    return ~nan.any(axis=1) & no_negative & (s >= lo) & (s <= hi)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_row_check_in_blocks_of_rows_is_the_whole_table(dtype, monkeypatch):
    """On a CPU the float64 sums of a narrower dtype run in blocks of rows (each block's float64 copy
    reused memory): the same flags as the whole table at once, and the definition's, on every view
    (special rows: NaN, negative, -0.0, infinities; rows that pass their own exact sum only)."""
    import importlib

    RC = importlib.import_module("hdecode_torch.kernels.fused.row_check")
    rng = np.random.default_rng(8)
    for m in [1, 2, 17, 300]:
        y = torch.cat([dyadic_rows(rng, 9, m, dtype) for _ in range(5)])  # 45 rows
        for lo, hi in row_check_bounds(y):
            for vname, v in row_check_views(y)[:3]:
                monkeypatch.setattr(RC, "BLOCK_BYTES", 1 << 40)
                whole = row_check_torch(v, lo, hi)
                for block in (1, 8 * m, 7 * 8 * m):  # 1 row, 1 row, 7 rows a block
                    monkeypatch.setattr(RC, "BLOCK_BYTES", block)
                    assert torch.equal(row_check_torch(v, lo, hi), whole), (m, lo, hi, vname, block)
                assert np.array_equal(whole.numpy(), numpy_row_check(v, lo, hi)), (m, lo, hi, vname)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_row_check_against_numpy(dtype):
    rng = np.random.default_rng(6)
    for m in [0, 1, 2, 17, 300]:
        y = dyadic_rows(rng, 9, m, dtype)
        for lo, hi in row_check_bounds(y):
            for vname, v in row_check_views(y):
                got = F.row_check(v, lo, hi)
                assert got.dtype == torch.bool and got.shape == (v.shape[0],)
                assert np.array_equal(got.numpy(), numpy_row_check(v, lo, hi)), (m, lo, hi, vname)
        if m:  # row 0 passes its own sum and fails one float64 beyond it; every special row fails
            s0 = float(y[0].double().sum())
            assert F.row_check(y, s0, s0).tolist() == [True] + [False] * 8
            assert F.row_check(y, -math.inf, math.inf).tolist() == [True, False, True, False, True, False, False,
                                                                    False, True]
    # empty rows sum to 0
    assert F.row_check(torch.empty(3, 0, dtype=dtype), -0.0, 0.0).tolist() == [True] * 3
    assert F.row_check(torch.empty(3, 0, dtype=dtype), *POSITIVE_FINITE).tolist() == [False] * 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_row_check_of_one_row_is_its_flag_in_the_table(dtype):
    """One row on a CPU is judged on the host (its float64 sum and its minimum read back): the flag the
    torch implementation gives that row within the table and the definition's, for every special row
    (NaN, infinities, -0.0, a negative entry), at every bound (its own exact sum, one float64 beyond it,
    none, empty, reversed) and view (sliced, column-major)."""
    rng = np.random.default_rng(9)
    for m in [1, 2, 17, 300]:
        y = dyadic_rows(rng, 9, m, dtype)
        for lo, hi in row_check_bounds(y):
            for vname, v in row_check_views(y)[:3]:
                whole = row_check_torch(v, lo, hi)
                want = numpy_row_check(v, lo, hi)
                for b in range(v.shape[0]):
                    got = F.row_check(v[b:b + 1], lo, hi)
                    assert got.dtype == torch.bool and got.shape == (1,)
                    assert got.item() == whole[b].item() == bool(want[b]), (m, lo, hi, vname, b)


@needs_triton
def test_row_check_bounds_are_never_compile_time_constants():
    """The lower bound of "positive" is the smallest subnormal, whose bits are 1, and Triton turns an integer
    argument equal to 1 into a compile-time constant: the kernel then failed to compile on a GPU
    (``lo_bits.to`` of a constant), so every count normalisation on CUDA raised a CompilationError."""
    assert struct.unpack("<q", struct.pack("<d", POSITIVE_FINITE[0]))[0] == 1
    proc = run_python("from hdecode_torch.kernels.fused.row_check import triton as RT\n"
                      "print(sorted(p.name for p in RT._row_check_kernel.params if p.do_not_specialize))")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["['hi_bits',", "'lo_bits']"]


def test_row_check_sums_in_float64():
    # float16 sums above 65504 do not overflow, and float32 rows are not rounded to float32
    assert F.row_check(torch.full((2, 100), 60000.0, dtype=torch.float16), 6e6, 6e6).tolist() == [True, True]
    x = torch.tensor([[1.0, 2.0 ** -30, 2.0 ** -30]], dtype=torch.float32)  # float32 would drop both
    s = 1.0 + 2.0 ** -29
    assert F.row_check(x, s, s).tolist() == [True]
    assert F.row_check(x, 1.0, math.nextafter(s, 0.0)).tolist() == [False]
    # +inf sums: finite entries past float64's range, or +inf itself; they pass only an infinite hi
    big = torch.tensor([[1e308, 1e308], [float("inf"), 0.0], [1e308, 0.0]], dtype=torch.float64)
    assert F.row_check(big, *POSITIVE_FINITE).tolist() == [False, False, True]
    assert F.row_check(big, 1.0, math.inf).tolist() == [True, True, True]
    # subnormal entries: positive sums
    tiny = torch.tensor([[POSITIVE_FINITE[0], 0.0], [0.0, -0.0]], dtype=torch.float64)
    assert F.row_check(tiny, *POSITIVE_FINITE).tolist() == [True, False]


@pytest.mark.parametrize("tol", [0.0, 1e-6, 1e-4, 1.4e-4, 5e-3, 0.3, 0.75, 3.0, 1e300])
def test_unit_sum_bounds_are_the_tolerance_test(tol):
    """``lo <= s <= hi`` iff ``abs(s - 1) <= tol`` on every float64 near the edges (where 1 ± tol
    rounded would be one float off), through the op too (a one-entry row sums to its entry)."""
    lo, hi = unit_sum_bounds(tol)
    s = tolerance_edge_sums(tol)
    want = np.abs(s - 1.0) <= tol
    assert np.array_equal((lo <= s) & (s <= hi), want)
    assert want.any() and not want.all()
    # the op also fails the negative rows (tol >= 1)
    assert np.array_equal(F.row_check(torch.as_tensor(s)[:, None], lo, hi).numpy(), want & (s >= 0))


def test_unit_sum_bounds_edges_and_errors():
    assert unit_sum_bounds(math.inf) == (-math.inf, math.inf)
    assert unit_sum_bounds(0.0) == (1.0, 1.0)
    lo, hi = unit_sum_bounds(1e-6)
    assert lo != 1.0 - 1e-6  # 1 - 1e-6 rounded fails |s - 1| <= 1e-6
    for bad in [-1e-9, float("nan")]:
        with pytest.raises(ValueError, match="`tol`"):
            unit_sum_bounds(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_input_check_accepts_the_same_rows(dtype):
    """The GPU plan's check (one ``row_check``) and the CPU plan's (a sum and a min) accept the same
    float64-exact row sums at the tolerance's edges, and the fused one's error names the failing row."""
    from hdecode_torch.core.validation import prepare_leaf_probs, row_sum_tolerance

    tol = row_sum_tolerance(dtype, 2)
    lo, hi = unit_sum_bounds(tol)
    one = torch.tensor(1.0, dtype=dtype)

    def edge(bound, outward):  # the last value of dtype within the bound, and the next one beyond it
        v = torch.tensor(bound, dtype=dtype)
        while (float(v) - bound) * outward > 0:
            v = torch.nextafter(v, one)
        return [float(v), float(torch.nextafter(v, outward * torch.tensor(math.inf, dtype=dtype)))]

    sums = edge(hi, 1) + edge(lo, -1)
    assert [abs(s - 1.0) <= tol for s in sums] == [True, False, True, False]
    for s, passes in zip(sums, [True, False, True, False]):
        x = torch.tensor([[0.5, 0.5], [s - 0.5, 0.5]], dtype=dtype)  # the second row sums to s exactly
        assert float(x[1].double().sum()) == s == float(x[1].sum())
        for fused in [True, False]:
            if passes:
                probs, _, _ = prepare_leaf_probs(x, 2, fused_check=fused)
                assert torch.equal(probs, x)
            else:
                with pytest.raises(ValueError, match="row 1 sums to"):
                    prepare_leaf_probs(x, 2, fused_check=fused)


def test_empty_shapes_and_strided_inputs():
    t = random_trees(7, 1)[-1]
    _, src, _, hi, lo = uses(t)["node_probabilities"]
    rank = torch.as_tensor(rank_depth(t))
    x = torch.rand(4, t["n"], dtype=torch.float64)
    assert F.gathered_prefix(x[:0], src, None, hi, lo).shape == (0, len(hi))
    assert F.best_ranked_above(x[:0], src, hi, lo, rank, 0.5, -1).shape == (0,)
    assert F.gathered_prefix(x, src, None, hi[:0], lo[:0]).shape == (4, 0)
    assert F.best_ranked_above(x, src, hi[:0], lo[:0], rank[:0], 0.5, -3).tolist() == [-3] * 4
    empty = torch.empty(0, dtype=torch.int64)
    zeros = torch.zeros(5, dtype=torch.int64)
    assert torch.equal(F.gathered_prefix(x, empty, None, zeros, zeros), torch.zeros(4, 5, dtype=torch.float64))
    assert F.best_ranked_above(x, empty, zeros, None, torch.arange(5), -1.0, 9).tolist() == [4] * 4
    assert F.gathered_prefix(torch.empty(3, 0), empty, None, zeros, None).shape == (3, 5)
    # strided, transposed and broadcast (stride 0) inputs give the contiguous results bit for bit
    base = torch.rand(t["n"], 8, dtype=torch.float32)
    for view in [base.t(), torch.rand(4, 2 * t["n"])[:, ::2], torch.rand(1, t["n"]).expand(6, -1)]:
        a = F.gathered_prefix(view, src, None, hi, lo, torch.float64)
        assert torch.equal(a, F.gathered_prefix(view.contiguous(), src, None, hi, lo, torch.float64))
        d = F.best_ranked_above(view, src, hi, lo, rank, 0.5, -1)
        assert torch.equal(d, F.best_ranked_above(view.contiguous(), src, hi, lo, rank, 0.5, -1))


def numpy_range_sums(x, src, weight, hi, lo) -> np.ndarray:
    """The range sums by their definition with a sequential float64 scan (NumPy), one-entry ranges read
    directly: what the torch implementation computes, bit for bit."""
    g = np.asarray(x, dtype=np.float64)[:, src]
    if weight is not None:
        g = g * weight
    c = np.zeros((g.shape[0], g.shape[1] + 1))
    np.cumsum(g, axis=1, out=c[:, 1:])
    if lo is None:
        return c[:, hi]
    out = c[:, hi] - c[:, lo]
    one = hi - lo == 1
    out[:, one] = g[:, lo[one]]
    return out


@pytest.mark.parametrize("case", ["tiered_wide", "long_rows"])
def test_torch_implementation_on_wide_batches_is_the_numpy_scan(case):
    """All rows in one go, whatever B and J: the same bits as a sequential NumPy scan."""
    rng = np.random.default_rng(13)
    if case == "tiered_wide":  # 3,000 rows of every use on tieredImageNet-H
        t = bundled_indices("tieredimagenet-h")
        xl, xn = inputs(rng, t, 3000, torch.float32, m=int(t["is_leaf"].sum()))
        cases = [(xl if kind == "leaf" else xn, src, weight, hi, lo)
                 for kind, src, weight, hi, lo in uses(t).values()]
    else:  # 40 rows of 40,000 gathered entries (J beyond the old 16,384 cap), a third of the ranges one entry
        m = 40_000
        ends, single = rng.integers(0, m + 1, (2, 2000)), rng.integers(0, m, 1000)
        lo = torch.as_tensor(np.concatenate([ends.min(0), single]))
        hi = torch.as_tensor(np.concatenate([ends.max(0), single + 1]))
        x = torch.as_tensor(rng.standard_normal((40, m)))
        src, weight = torch.as_tensor(rng.integers(0, m, m)), torch.as_tensor(rng.standard_normal(m))
        cases = [(x, src, weight, hi, lo), (x.float(), src, None, hi, lo), (x, src, weight, hi, None)]
    for x, src, weight, hi, lo in cases:
        want = numpy_range_sums(x.double().numpy(), src.numpy(), None if weight is None else weight.numpy(),
                                hi.numpy(), None if lo is None else lo.numpy())
        got = F.gathered_prefix(x, src, weight, hi, lo, torch.float64)
        assert np.array_equal(got.numpy(), want)
        assert torch.equal(F.gathered_prefix(x, src, weight, hi, lo, torch.float32), got.float())
        if weight is None:  # the decision reads the same sums
            rank = torch.as_tensor(rng.permutation(hi.shape[0]))
            for thr in [0.0, 0.5]:
                got = F.best_ranked_above(x, src, hi, lo, rank, thr, -1).numpy()
                assert np.array_equal(got, numpy_decision(want, rank.numpy(), thr, -1))


@pytest.mark.parametrize("rows", [1, 3])
def test_node_sums_read_both_ends_in_one_gather_or_two_with_the_same_bits(monkeypatch, rows):
    """The range sums the ops share (``_node_sums.node_sums``, with or without a weight, in a float32 or float64
    ``out``): one (B, 2K) gather of both ends or, beyond ``ONE_GATHER_BYTES``, two (B, K) gathers; the NumPy
    scan's bits either way, the same sums as ``gathered_prefix``'s, and the one gather two operators fewer."""
    from hdecode_torch.kernels.fused import _node_sums as NS

    rng = np.random.default_rng(21)
    m, k = 50, 40
    x = torch.as_tensor(rng.standard_normal((rows, m))).float()
    src, weight = torch.as_tensor(rng.integers(0, m, 60)), torch.as_tensor(rng.standard_normal(60))
    lo = torch.as_tensor(rng.integers(0, 60, k))
    hi = torch.minimum(lo + torch.as_tensor(rng.integers(1, 4, k)), torch.tensor(60))  # one-entry ranges too
    ends = NS.table_endpoints(hi, lo, 60)
    ops = []
    for limit in (1 << 25, 0):
        monkeypatch.setattr(NS, "ONE_GATHER_BYTES", limit)
        for w in (None, weight):
            want = numpy_range_sums(x.double().numpy(), src.numpy(), None if w is None else w.numpy(), hi.numpy(),
                                    lo.numpy())
            with Operators() as count:
                got = NS.node_sums(x, src, ends, w)
            ops.append(len(count.ops))
            assert np.array_equal(got.numpy(), want) and got.dtype == torch.float64
            out = torch.empty(rows, k)
            assert NS.node_sums(x, src, ends, w, out) is out and torch.equal(out, got.float())
            assert torch.equal(F.gathered_prefix(x, src, w, hi, lo, torch.float64), got)
    assert ops[0] == ops[2] - 2 and ops[1] == ops[3] - 2, ops


def test_one_entry_ranges_are_the_entry():
    """A range of one entry is weight·x[src[lo]] exactly, where a difference of running sums rounds (1
    after 1e16 is lost); so a node with one leaf below it holds that leaf's probability exactly."""
    x = torch.tensor([[1e16, 1.0, 3.0, -1e16, 0.5], [0.25, -0.0, 1e-300, 7.0, 2.0]], dtype=torch.float64)
    src, w = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1.0, 3.0, 0.1, 1.0, -2.0], dtype=torch.float64)
    hi, lo = torch.tensor([2, 3, 5, 4, 1]), torch.tensor([1, 2, 4, 0, 0])
    got = F.gathered_prefix(x, src, None, hi, lo)
    assert torch.equal(got[:, :3], x[:, [1, 2, 4]]) and got[0, 0] == 1.0
    assert torch.equal(F.gathered_prefix(x, src, w, hi, lo)[:, :3], (x * w)[:, [1, 2, 4]])
    assert torch.equal(F.gathered_prefix(x, src, w, hi, lo, torch.float32)[:, :3], (x * w)[:, [1, 2, 4]].float())
    # the decision compares the same sums: p = 1 in range 0 is above 0.5 (a difference would give 0)
    assert F.best_ranked_above(x, src, hi, lo, torch.tensor([5, 0, 0, 0, 0]), 0.5, -1).tolist() == [0, 2]
    # every leaf and single-leaf chain of a tree, through the library's node probabilities
    h = hd.Hierarchy.from_parents(random_parent(np.random.default_rng(14), 300))
    t = tree_indices(h.parent.numpy())
    probs = torch.softmax(torch.randn(8, h.num_leaves, generator=torch.Generator().manual_seed(4)) * 5, 1)
    with hd.plan_for("cuda"):
        p = hd.node_probabilities(h, probs)
    single = np.flatnonzero(t["leaf_count"] == 1)
    leaf_of = t["leaves"][t["leaf_lo"][single]]
    assert len(single) > h.num_leaves  # single-child chains above some leaves
    assert torch.equal(p[:, single], probs[:, leaf_of])


def test_deterministic():
    t = bundled_indices("inat19")
    rng = np.random.default_rng(8)
    xl, xn = inputs(rng, t, 64, torch.float32, m=int(t["is_leaf"].sum()))
    for kind, src, weight, hi, lo in uses(t).values():
        x = xl if kind == "leaf" else xn
        a, b = (F.gathered_prefix(x, src, weight, hi, lo, torch.float64) for _ in range(2))
        assert torch.equal(a.view(torch.int64), b.view(torch.int64))
    # a row sum exactly at a bound: the same verdict every time (a changing summation order could flip it)
    xa = xn.abs()
    s = xa.sum(1, dtype=torch.float64)  # the torch implementation's sums
    a, b = (F.row_check(xa, float(s[0]), float(s[0])) for _ in range(2))
    assert torch.equal(a, b) and bool(a[0])


def test_argument_errors():
    x = torch.rand(2, 4)
    src, hi, lo = torch.tensor([0, 1, 2, 3]), torch.tensor([4, 2]), torch.tensor([0, 1])
    with pytest.raises(TypeError, match="`src`"):
        F.gathered_prefix(x, src.int(), None, hi, lo)
    with pytest.raises(ValueError, match="`x`"):
        F.gathered_prefix(x[0], src, None, hi, lo)
    with pytest.raises(TypeError, match="`x`"):
        F.gathered_prefix(x.int(), src, None, hi, lo)
    with pytest.raises(ValueError, match="`weight`"):
        F.gathered_prefix(x, src, torch.ones(3, dtype=torch.float64), hi, lo)
    with pytest.raises(TypeError, match="`weight`"):
        F.gathered_prefix(x, src, torch.ones(4), hi, lo)
    with pytest.raises(ValueError, match="`lo`"):
        F.gathered_prefix(x, src, None, hi, lo[:1])
    with pytest.raises(TypeError, match="`out_dtype`"):
        F.gathered_prefix(x, src, None, hi, lo, torch.float16)
    with pytest.raises(ValueError, match="`src`.*got 4"):
        F.gathered_prefix(x, src + 1, None, hi, lo)
    with pytest.raises(ValueError, match="`hi`.*got 5"):
        F.gathered_prefix(x, src, None, hi + 1, lo)
    with pytest.raises(ValueError, match="`lo`.*got -1"):
        F.best_ranked_above(x, src, hi, lo - 1, torch.tensor([0, 1]), 0.5, -1)
    with pytest.raises(ValueError, match="`rank`"):
        F.best_ranked_above(x, src, hi, lo, torch.tensor([0]), 0.5, -1)
    with pytest.raises(ValueError, match="`hi` on the device of `x`"):
        F.gathered_prefix(x, src, None, hi.to("meta"), lo)
    with pytest.raises(TypeError, match="`x`"):
        F.row_check(torch.zeros(2, 2, dtype=torch.int64), 0.0, 1.0)
    with pytest.raises(ValueError, match="`x`"):
        F.row_check(torch.zeros(2), 0.0, 1.0)
    with pytest.raises(ValueError, match="`lo`"):
        F.row_check(x, float("nan"), 1.0)
    with pytest.raises(ValueError, match="`hi`"):
        F.row_check(x, 0.0, float("nan"))


def test_cpu_calls_run_the_torch_implementation_and_everything_else_the_op():
    """On plain CPU tensors an op's function calls its torch implementation directly (the dispatcher's way
    there costs more than a small batch's work); with a gradient to record, or under a dispatch mode (what
    the operator counts use), the op itself is dispatched; the same bits either way, and the tables'
    checks still catch a table changed in place."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.rand(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    src, hi, lo = torch.tensor([0, 1, 2, 3]), torch.tensor([4, 2]), torch.tensor([0, 1])

    def run(fn):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = fn()
        return out, any(e.key == "hdecode::gathered_prefix" for e in prof.key_averages())

    direct, seen = run(lambda: F.gathered_prefix(x, src, None, hi, lo))
    assert not seen and torch.equal(direct, torch.ops.hdecode.gathered_prefix(x, src, None, hi, lo, torch.float64))
    xg = x.clone().requires_grad_()
    out, seen = run(lambda: F.gathered_prefix(xg, src, None, hi, lo))
    assert seen and torch.equal(out.detach(), direct)
    out.sum().backward()
    assert torch.equal(xg.grad, torch.tensor([[1.0, 2.0, 1.0, 1.0]]).expand(3, -1).double())

    with Operators() as mode:
        out = F.gathered_prefix(x, src, None, hi, lo)
    assert mode.ops == ["hdecode.gathered_prefix.default"] and torch.equal(out, direct)
    src[0] = 4  # in place: a new version, checked again
    with pytest.raises(ValueError, match="`src`.*got 4"):
        F.gathered_prefix(x, src, None, hi, lo)


# -- torch.compile, torch.export, opcheck ---------------------------------------------------------------

class Decoder(torch.nn.Module):
    """Node probabilities, the tree-distance decision and the input check of one tree."""

    def __init__(self, t):
        super().__init__()
        _, src, _, hi, lo = uses(t)["node_probabilities"]
        for name, v in [("src", src), ("hi", hi), ("lo", lo), ("rank", torch.as_tensor(rank_depth(t)))]:
            self.register_buffer(name, v)
        self.root = int(t["pre"][0])

    def forward(self, probs):
        p = F.gathered_prefix(probs, self.src, None, self.hi, self.lo, torch.float32)
        node = F.best_ranked_above(probs, self.src, self.hi, self.lo, self.rank, 0.5, self.root)
        return p, node, F.row_check(probs, *unit_sum_bounds(1e-4))


def test_torch_compile_fullgraph():
    t = random_trees(9, 1)[-1]
    model = Decoder(t)
    probs = torch.softmax(torch.randn(5, t["n"], generator=torch.Generator().manual_seed(9)), 1)
    compiled = torch.compile(model, fullgraph=True)
    for a, b in zip(compiled(probs), model(probs)):
        assert torch.equal(a, b)


def test_torch_export():
    t = bundled_indices("tieredimagenet-h")
    model = Decoder(t)
    probs = torch.softmax(torch.randn(6, int(t["is_leaf"].sum())), 1)
    ep = torch.export.export(model, (probs,), dynamic_shapes={"probs": {0: torch.export.Dim("batch")}})
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert {"hdecode.gathered_prefix.default", "hdecode.best_ranked_above.default",
            "hdecode.row_check.default"} <= targets
    other = torch.softmax(torch.randn(3, probs.shape[1]), 1)
    for a, b in zip(ep.module()(other), model(other)):
        assert torch.equal(a, b)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck():
    x = torch.rand(3, 6)
    src, hi, lo = torch.tensor([5, 0, 2, 1]), torch.tensor([4, 2, 0]), torch.tensor([1, 0, 0])
    w = torch.rand(4, dtype=torch.float64)
    cases = [(torch.ops.hdecode.gathered_prefix.default, (x, src, w, hi, lo, torch.float32)),
             (torch.ops.hdecode.gathered_prefix.default, (x.half().t().contiguous().t(), src, None, hi, None,
                                                         torch.float64)),
             (torch.ops.hdecode.best_ranked_above.default, (x, src, hi, lo, torch.tensor([2, 0, 1]), 0.5, -1)),
             (torch.ops.hdecode.best_ranked_above.default, (x, src, hi, None, torch.tensor([2, 0, 1]), 9.0, 7)),
             (torch.ops.hdecode.row_check.default, (x.double(), 0.5, 3.5)),
             (torch.ops.hdecode.row_check.default, (x.bfloat16().t().contiguous().t(), -math.inf, math.inf))]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)


def test_registered_schemas():
    for name, schema in F.SCHEMAS.items():
        assert str(getattr(torch.ops.hdecode, name).default._schema) == "hdecode::" + schema


# -- Triton ---------------------------------------------------------------------------------------------

def interpreter_checks() -> dict:
    """Triton kernels (interpreted) against the torch implementations; name -> {ok, bitwise, detail}.

    Needs TRITON_INTERPRET=1 before Triton is imported.  The range sums run with rows in registers
    and again through the scratch row in tiles of 16 (``layout/``); rows longer than one register
    tile (``long/``) run as they would on a GPU.
    """
    from hdecode_torch.kernels.fused import _triton as T
    from hdecode_torch.kernels.fused.best_ranked_above import triton as bra
    from hdecode_torch.kernels.fused.gathered_prefix import triton as gp
    from hdecode_torch.kernels.fused.row_check import triton as rc

    assert T.interpreted(), "set TRITON_INTERPRET=1 before importing the kernels"
    torch.set_num_threads(1)
    results = {}

    def record(name, ok, bitwise=None, detail=""):
        results[name] = dict(ok=bool(ok), bitwise=None if bitwise is None else bool(bitwise), detail=str(detail))

    def compare(name, got, ref, j, row_scale):
        bitwise = torch.equal(got, ref)
        err = (got.double() - ref.double()).abs().numpy()
        tol = 4.0 * max(j, 1) * EPS * row_scale[:, None]
        if got.dtype == torch.float32:  # the two float64 values may round to neighbouring floats
            tol = tol + np.abs(ref.double().numpy()) * 2.0 ** -23
        record(name, got.shape == ref.shape and got.dtype == ref.dtype and bool((err <= tol).all()), bitwise,
               f"max err {err.max() if err.size else 0:.3g}")

    def both_ops(prefix, x, src, weight, hi, lo, rank, thresholds, j):
        for out_dtype in [torch.float64, torch.float32]:
            compare(f"{prefix}/values/{out_dtype}", gp.launch(x, src, weight, hi, lo, out_dtype),
                    gathered_prefix_torch(x, src, weight, hi, lo, out_dtype), j, scale(x, src, weight))
        for thr in thresholds:
            got = bra.launch(x, src, hi, lo, rank, thr, -1)
            ref = best_ranked_above_torch(x, src, hi, lo, rank, thr, -1)
            record(f"{prefix}/decision/{thr}", torch.equal(got, ref), None, f"{got.tolist()} vs {ref.tolist()}")

    rng = np.random.default_rng(10)
    trees = [("random", t) for t in random_trees(10, 3)] + [("tiered", bundled_indices("tieredimagenet-h"))]
    for label, t in trees:
        m = t["n"] if label == "random" else int(t["is_leaf"].sum())
        b = 4 if label == "random" else 3
        for dtype in [torch.float16, torch.bfloat16, torch.float32, torch.float64]:
            xl, xn = inputs(rng, t, b, dtype, m=m)
            for name, (kind, src, weight, hi, lo) in uses(t).items():
                if label == "tiered" and dtype != torch.float32 and name != "node_probabilities":
                    continue
                x = xl if kind == "leaf" else xn
                for out_dtype in [torch.float64, torch.float32]:
                    got = gp.launch(x, src, weight, hi, lo, out_dtype)
                    ref = gathered_prefix_torch(x, src, weight, hi, lo, out_dtype)
                    compare(f"gathered_prefix/{label}{t['n']}/{name}/{dtype}/{out_dtype}", got, ref, len(src),
                            scale(x, src, weight))
        x = dyadic_probs(rng, 6, t, m, torch.float32)
        xs = torch.softmax(torch.as_tensor(rng.standard_normal((6, m)) * 3), 1).float()
        _, src, _, hi, lo = uses(t)["node_probabilities"]
        for rank_name, rank, thr in [("depth", rank_depth(t), 0.5), ("depth", rank_depth(t), 0.625),
                                     ("information", rank_information(t), 0.8),
                                     ("ties", np.zeros(t["n"], np.int64), 0.3),
                                     ("none", rank_depth(t), 2.0)]:
            for xname, xx in [("dyadic", x), ("softmax", xs)]:
                rank_t = torch.as_tensor(rank)
                got = bra.launch(xx, src, hi, lo, rank_t, thr, -5)
                ref = best_ranked_above_torch(xx, src, hi, lo, rank_t, thr, -5)
                record(f"best_ranked_above/{label}{t['n']}/{rank_name}/{thr}/{xname}", torch.equal(got, ref), None,
                       f"{got.tolist()} vs {ref.tolist()}")
    # the scratch layout (any row length) in tiles of 16, several tiles per row: every use on the
    # random trees, node probabilities and decisions on tieredImageNet-H
    saved = T.MAX_REGISTER_ROW, T.SCAN_BLOCK
    T.MAX_REGISTER_ROW, T.SCAN_BLOCK = 0, 16
    try:
        for label, t in trees:
            m = t["n"] if label == "random" else int(t["is_leaf"].sum())
            xl, xn = inputs(rng, t, 3, torch.float32, m=m)
            for name, (kind, src, weight, hi, lo) in uses(t).items():
                if label == "tiered" and name != "node_probabilities":
                    continue
                x = xl if kind == "leaf" else xn
                rank = torch.as_tensor(rng.permutation(len(hi)))
                both_ops(f"layout/{label}{t['n']}/{name}", x, src, weight, hi, lo, rank,
                         [0.5, 0.9] if kind == "leaf" else [0.0], len(src))
    finally:
        T.MAX_REGISTER_ROW, T.SCAN_BLOCK = saved
    # rows longer than one register tile (J > MAX_REGISTER_ROW = the old limit of the kernels):
    # a leaf order over M = 20,000 columns, random ranges (a third of them one entry long)
    m = T.MAX_REGISTER_ROW + 3616
    src = torch.as_tensor(rng.permutation(m))
    ends, single = rng.integers(0, m + 1, (2, 400)), rng.integers(0, m, 200)
    lo = torch.as_tensor(np.concatenate([ends.min(0), single]))
    hi = torch.as_tensor(np.concatenate([ends.max(0), single + 1]))
    weight = torch.as_tensor(rng.standard_normal(m))
    x = torch.as_tensor(rng.dirichlet(np.full(m, 0.5), size=2)).float()
    rank = torch.as_tensor(rng.permutation(600))
    assert not T.row_layout(m, x.device)
    both_ops("long/unweighted", x, src, None, hi, lo, rank, [0.05, 0.5], m)
    both_ops("long/weighted_no_lo", x, src, weight, hi, None, rank, [0.0], m)
    compare("long/weighted", gp.launch(x, src, weight, hi, lo, torch.float64),
            gathered_prefix_torch(x, src, weight, hi, lo, torch.float64), m, scale(x, src, weight))
    # one-entry ranges are the entry itself, in both layouts: 1 after 1e16 is lost in a running sum
    xo = torch.tensor([[1e16, 1.0, 3.0, -1e16, 0.5], [0.25, -0.0, 1e-300, 7.0, 2.0]], dtype=torch.float64)
    so, wo = torch.tensor([0, 1, 2, 3, 4]), torch.tensor([1.0, 3.0, 0.1, 1.0, -2.0], dtype=torch.float64)
    ho, lw = torch.tensor([2, 3, 5, 4, 1]), torch.tensor([1, 2, 4, 0, 0])
    want = (xo * wo)[:, [1, 2, 4]]
    for regs in [True, False]:
        T.MAX_REGISTER_ROW = saved[0] if regs else 0
        try:
            for w in [None, wo]:
                got = gp.launch(xo, so, w, ho, lw, torch.float64)
                expect = want if w is not None else xo[:, [1, 2, 4]]
                record(f"one_entry/regs={regs}/weighted={w is not None}",
                       torch.equal(got[:, :3], expect) and torch.equal(got, gathered_prefix_torch(xo, so, w, ho, lw,
                                                                                                  torch.float64)),
                       None, got.tolist())
            got32 = gp.launch(xo, so, wo, ho, lw, torch.float32)
            record(f"one_entry/regs={regs}/float32", torch.equal(got32[:, :3], want.float()), None, got32.tolist())
        finally:
            T.MAX_REGISTER_ROW = saved[0]
    # several K tiles per program: the per-depth masses of tieredImageNet-H (K = N·E > MAX_BLOCK_K), and
    # tiny tiles with ties across tiles
    t = bundled_indices("tieredimagenet-h")
    kind, src, _, hi, lo = uses(t)["depth_masses"]
    x = torch.softmax(torch.as_tensor(rng.standard_normal((3, len(src))) * 3), 1)
    rank = torch.as_tensor(rng.permutation(len(hi)))
    for thr in [0.05, 0.3]:
        got = bra.launch(x, src, hi, lo, rank, thr, -1)
        record(f"tiles/depth_masses/{thr}", torch.equal(got, best_ranked_above_torch(x, src, hi, lo, rank, thr, -1)))
    compare("tiles/depth_masses/values", gp.launch(x, src, None, hi, lo, torch.float64),
            gathered_prefix_torch(x, src, None, hi, lo, torch.float64), len(src), scale(x, src, None))
    saved_k = gp.MAX_BLOCK_K, bra.MAX_BLOCK_K
    gp.MAX_BLOCK_K = bra.MAX_BLOCK_K = 16
    try:
        _, src, _, hi, lo = uses(t)["node_probabilities"]
        x = torch.softmax(torch.as_tensor(rng.standard_normal((4, len(src))) * 3), 1)
        for rname, rank in [("ties", torch.zeros(len(hi), dtype=torch.int64)),
                            ("depth", torch.as_tensor(rank_depth(t))),
                            ("lowest", torch.full((len(hi),), torch.iinfo(torch.int64).min))]:
            got = bra.launch(x, src, hi, lo, rank, 0.01, -1)
            record(f"tiles16/{rname}", torch.equal(got, best_ranked_above_torch(x, src, hi, lo, rank, 0.01, -1)),
                   None, got.tolist())
        compare("tiles16/values", gp.launch(x, src, None, hi, lo, torch.float64),
                gathered_prefix_torch(x, src, None, hi, lo, torch.float64), len(src), scale(x, src, None))
    finally:
        gp.MAX_BLOCK_K, bra.MAX_BLOCK_K = saved_k
    # edge shapes, strides, determinism
    t = random_trees(11, 1)[-1]
    _, src, _, hi, lo = uses(t)["node_probabilities"]
    rank = torch.as_tensor(rank_depth(t))
    x = torch.rand(5, t["n"], dtype=torch.float64)
    empty, zeros = torch.empty(0, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
    record("edge/B=0", gp.launch(x[:0], src, None, hi, lo, torch.float64).shape == (0, len(hi))
           and bra.launch(x[:0], src, hi, lo, rank, 0.5, -1).shape == (0,)
           and rc.launch(x[:0], 0.0, 1.0).shape == (0,))
    record("edge/K=0", gp.launch(x, src, None, hi[:0], lo[:0], torch.float64).shape == (5, 0)
           and bra.launch(x, src, hi[:0], lo[:0], rank[:0], 0.5, -2).tolist() == [-2] * 5)
    record("edge/J=0", torch.equal(gp.launch(x, empty, None, zeros, zeros, torch.float64),
                                   torch.zeros(5, 3, dtype=torch.float64))
           and bra.launch(x, empty, zeros, None, torch.arange(3), -1.0, 9).tolist() == [2] * 5)
    for vname, view in [("transposed", torch.rand(t["n"], 6).t()), ("sliced", torch.rand(4, 2 * t["n"])[:, 1::2]),
                        ("broadcast", torch.rand(1, t["n"]).expand(5, -1))]:
        record(f"strided/{vname}", torch.equal(gp.launch(view, src, None, hi, lo, torch.float64),
                                               gp.launch(view.contiguous(), src, None, hi, lo, torch.float64))
               and torch.equal(bra.launch(view, src, hi, lo, rank, 0.4, -1),
                               best_ranked_above_torch(view, src, hi, lo, rank, 0.4, -1)))
    xe = torch.as_tensor(rng.standard_normal((4, 2500)))
    a, b = (gp.launch(xe, torch.arange(2500), None, torch.arange(2501), None, torch.float64) for _ in range(2))
    record("deterministic/gathered_prefix", torch.equal(a, b))
    s0 = float(xe[0].sum())
    a, b = rc.launch(xe, s0, s0), rc.launch(xe, s0, s0)
    record("deterministic/row_check", torch.equal(a, b))
    # row_check: several blocks per row, special values, dtypes, strides, bounds at and one float64
    # beyond an exact sum (float32 bounds would round them together)
    for dtype in [torch.float16, torch.bfloat16, torch.float32, torch.float64]:
        for m in [0, 1, 17, 2500]:
            y = dyadic_rows(rng, 9, m, dtype)
            bounds = row_check_bounds(y)
            # every bound on the contiguous rows, the exact sum of row 0 on the other layouts (B > 0)
            cases = [("contiguous", y, b) for b in bounds] + [(vname, v, bounds[0]) for vname, v in
                                                               row_check_views(y)[1:-1]]
            for vname, v, (lo, hi) in cases:
                got = rc.launch(v, lo, hi)
                ok = (got.dtype == torch.bool and np.array_equal(got.numpy(), numpy_row_check(v, lo, hi))
                      and torch.equal(got, row_check_torch(v, lo, hi)))
                record(f"row_check/{dtype}/{m}/{vname}/{lo!r}/{hi!r}", ok, None, got.tolist())
    for tol in [1e-6, 1.4e-4, 5e-3]:  # one-entry rows at the library's bounds
        s = tolerance_edge_sums(tol)
        got = rc.launch(torch.as_tensor(s)[:, None], *unit_sum_bounds(tol)).numpy()
        record(f"row_check/tolerance/{tol}", np.array_equal(got, np.abs(s - 1.0) <= tol), None, got.tolist())
    x = torch.tensor([[1.0, 2.0 ** -30, 2.0 ** -30]], dtype=torch.float32)  # float32 would drop both
    big = torch.tensor([[1e308, 1e308], [float("inf"), 0.0], [1e308, 0.0], [POSITIVE_FINITE[0], -0.0]],
                       dtype=torch.float64)
    record("row_check/float64", rc.launch(torch.full((2, 100), 60000.0, dtype=torch.float16), 6e6, 6e6).tolist()
           == [True, True] and rc.launch(x, 1 + 2.0 ** -29, 1 + 2.0 ** -29).tolist() == [True]
           and rc.launch(big, *POSITIVE_FINITE).tolist() == [False, False, True, True]
           and rc.launch(big, 1.0, math.inf).tolist() == [True, True, True, False])
    # the CUDA dispatch, run on CPU tensors: Triton at any row length, torch when disabled
    calls = []
    for name, module in [("gathered_prefix", gp), ("best_ranked_above", bra), ("row_check", rc)]:
        module.launch = lambda *a, _orig=module.launch, _name=name: calls.append(_name) or _orig(*a)
    t = random_trees(12, 1)[-1]
    _, src, _, hi, lo = uses(t)["node_probabilities"]
    x = torch.rand(3, t["n"])
    ref = gathered_prefix_torch(x, src, None, hi, lo, torch.float64)
    out = OPS["gathered_prefix"].cuda(x, src, None, hi, lo, torch.float64)
    OPS["best_ranked_above"].cuda(x, src, hi, lo, torch.as_tensor(rank_depth(t)), 0.5, -1)
    checked = OPS["row_check"].cuda(x, 0.0, 1e9)
    record("dispatch/triton", calls == ["gathered_prefix", "best_ranked_above", "row_check"]
           and torch.equal(out, ref) and checked.tolist() == [True] * 3, None, calls)
    # index vectors that are strided views (one row of a transposed table): the kernels read index vectors
    # with unit stride, so the dispatch makes them contiguous (before, the ranges were read from the wrong
    # entries: per-leaf-depth masses of 2.0 on a GPU)
    table = torch.stack([hi, lo]).t().contiguous().t()  # (2, K) with strides (1, 2)
    out = OPS["gathered_prefix"].cuda(x, src, None, table[0], table[1], torch.float64)
    record("dispatch/strided_indices", not table[0].is_contiguous() and torch.equal(out, ref), None,
           (out - ref).abs().max())
    calls.clear()
    T.MAX_REGISTER_ROW = len(src) - 1
    try:
        out = OPS["gathered_prefix"].cuda(x, src, None, hi, lo, torch.float64)
        record("dispatch/long_rows_use_triton", calls == ["gathered_prefix"] and torch.equal(out, ref), None, calls)
    finally:
        T.MAX_REGISTER_ROW = saved[0]
    calls.clear()
    F.set_triton_enabled(False)
    try:
        out = OPS["gathered_prefix"].cuda(x, src, None, hi, lo, torch.float64)
        record("dispatch/disabled_uses_torch", calls == [] and torch.equal(out, ref), None, calls)
    finally:
        F.set_triton_enabled(True)
    try:
        OPS["gathered_prefix"].cuda(x, src, None, hi + 1, lo, torch.float64)
        record("dispatch/indices_checked", False)
    except ValueError as err:
        record("dispatch/indices_checked", calls == [] and "`hi`" in str(err), None, err)
    return results


@pytest.mark.plan_independent
@needs_triton
def test_triton_interpreter_matches_torch():
    results = interpreter_results("test_fused_ops")
    groups = {k.split("/")[0] for k in results}
    assert groups == {"gathered_prefix", "best_ranked_above", "layout", "long", "one_entry", "tiles", "tiles16",
                      "edge", "strided", "deterministic", "row_check", "dispatch"}, groups
    failed = {k: v for k, v in results.items() if not v["ok"]}
    assert not failed, failed
    # the interpreter scans sequentially like torch on the CPU, and a tile's scan starts from the
    # running sum, so the range sums agree bit for bit here in both layouts; on a GPU tl.cumsum is
    # a tree and they agree to a few ulps (the tolerance checked above)
    not_bitwise = [k for k, v in results.items() if k.split("/")[0] in ("gathered_prefix", "layout", "long")
                   and v["bitwise"] is False]
    assert not not_bitwise, not_bitwise


@pytest.mark.plan_independent
@needs_triton
def test_triton_kernels_compile_for_sm90():
    """The real compiler (not the interpreter) accepts every kernel variant, in both row layouts:
    TTIR -> PTX -> cubin.  The register layout at its largest row stays within the shared memory its
    layout rule assumes."""
    check_compiles_for_sm90("""
        from hdecode_torch.kernels.fused import _triton as T
        from hdecode_torch.kernels.fused.best_ranked_above import triton as bra
        from hdecode_torch.kernels.fused.gathered_prefix import triton as gp
        from hdecode_torch.kernels.fused.row_check import triton as rc
        def gp_sig(x, o, w, l):
            sig = {"X": "*" + x, "stride_xb": "i64", "stride_xm": "i32", "SRC": "*i64",
                   "W": "*fp64" if w else "constexpr", "HI": "*i64", "LO": "*i64" if l else "constexpr",
                   "OUT": "*" + o, "SCRATCH": "*fp64", "J": "i32", "K": "i32", "HAS_W": "constexpr",
                   "HAS_LO": "constexpr", "IN_REGS": "constexpr", "BLOCK_J": "constexpr", "BLOCK_K": "constexpr"}
            return sig, dict({"HAS_W": w, "HAS_LO": l}, **({} if w else {"W": None}), **({} if l else {"LO": None}))
        for x, o, w, l in [("bf16", "fp32", True, True), ("fp16", "fp64", False, False), ("fp64", "fp64", True, False)]:
            sig, c = gp_sig(x, o, w, l)
            build(gp._gathered_prefix_kernel, sig, dict(c, IN_REGS=True, BLOCK_J=1024, BLOCK_K=2048), 4)
            build(gp._gathered_prefix_kernel, sig, dict(c, IN_REGS=False, BLOCK_J=T.SCAN_BLOCK, BLOCK_K=2048),
                  T.num_warps(T.SCAN_BLOCK))
        bsig = {"X": "*fp32", "stride_xb": "i32", "stride_xm": "i32", "SRC": "*i64", "HI": "*i64", "LO": "*i64",
                "RANK": "*i64", "OUT": "*i64", "SCRATCH": "*fp64", "threshold": "fp64", "fallback": "i64", "J": "i32",
                "K": "i32", "HAS_LO": "constexpr", "IN_REGS": "constexpr", "BLOCK_J": "constexpr",
                "BLOCK_K": "constexpr"}
        k = build(bra._best_ranked_above_kernel, bsig,
                  {"HAS_LO": True, "IN_REGS": True, "BLOCK_J": T.MAX_REGISTER_ROW, "BLOCK_K": 16}, 16)
        assert k.metadata.shared <= 8 * T.MAX_REGISTER_ROW + 4096, k.metadata.shared
        build(bra._best_ranked_above_kernel, bsig,
              {"HAS_LO": True, "IN_REGS": False, "BLOCK_J": T.SCAN_BLOCK, "BLOCK_K": 2048}, 8)
        for x, stride in [("bf16", "i64"), ("fp32", "i32")]:
            build(rc._row_check_kernel, {"X": "*" + x, "stride_xb": stride, "stride_xm": stride, "OUT": "*i1",
                                         "lo_bits": "i64", "hi_bits": "i64", "M": "i32", "BLOCK": "constexpr"},
                  {"BLOCK": rc.ROW_BLOCK}, 4)
    """)


def test_import_pulls_in_neither_triton_nor_dynamo():
    # Only this package is imported (its parents are stand-ins), with the three modules made
    # unimportable; then the ops run on the CPU, still without them.
    code = block_imports("triton", "torch._dynamo", "torch._inductor") + textwrap.dedent("""
        import os, types, torch
        for name in ["hdecode_torch", "hdecode_torch.kernels"]:
            mod = types.ModuleType(name)
            mod.__path__ = [os.path.join({root!r}, *name.split("."))]
            sys.modules[name] = mod
        import hdecode_torch.kernels.fused as F
        x = torch.tensor([[0.25, 0.5, 0.25]])
        src, hi, lo = torch.tensor([2, 0, 1]), torch.tensor([3, 2]), torch.tensor([0, 1])
        print(F.gathered_prefix(x, src, None, hi, lo).tolist(), F.best_ranked_above(x, src, hi, lo,
              torch.tensor([0, 1]), 0.5, -1).tolist(), F.row_check(x, 1.0, 1.0).tolist())
        print(loaded("triton", "torch._dynamo", "torch._inductor"))
    """).replace("{root!r}", repr(ROOT))
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == ["[[1.0, 0.25]] [0] [True]", "[]"]


def test_works_without_triton():
    code = block_imports("triton") + textwrap.dedent("""
        import torch
        import hdecode_torch.kernels.fused as F
        from hdecode_torch.kernels.fused._registry import OPS
        x = torch.tensor([[0.25, 0.5, 0.25], [0.5, 0.125, 0.375]])
        src, hi, lo = torch.tensor([2, 0, 1]), torch.tensor([3, 2]), torch.tensor([0, 1])
        print(F.triton_available())
        print(F.gathered_prefix(x, src, None, hi, lo).tolist(), F.row_check(x, 1.0, 1.0).tolist())
        # the CUDA kernel's fallback path, run on CPU tensors
        print(OPS["gathered_prefix"].cuda(x, src, None, hi, lo, torch.float64).tolist(),
              OPS["best_ranked_above"].cuda(x, src, hi, lo, torch.tensor([0, 1]), 0.4, -1).tolist(),
              OPS["row_check"].cuda(x, 0.0, 0.5).tolist())
        print(loaded("triton"))
    """)
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines() == [
        "False",
        "[[1.0, 0.25], [1.0, 0.5]] [True, True]",
        "[[1.0, 0.25], [1.0, 0.5]] [0, 1] [False, False]",
        "[]",
    ]


if __name__ == "__main__":
    print(json.dumps(interpreter_checks(), indent=1))
