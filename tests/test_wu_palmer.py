"""Wu-Palmer's decoding strategies: which one ``auto`` takes, and what it costs.

Issue 31's leftover: on caterpillar(1000) (2,001 nodes, N·L just above the dense limit) the CPU plan's
``auto`` rule took candidates along their root paths, D·E = 10⁶ leaf-depth masses per (sample,
candidate) pair, and B = 2 took 273 s where the structural table takes well under a second.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

import hdecode_torch as hd

ROOT = pathlib.Path(hd.__file__).resolve().parent.parent


def caterpillar(depth: int) -> hd.Hierarchy:
    # a spine of `depth` internal nodes with one leaf at every level, two under the deepest
    return hd.Hierarchy.from_parents([-1] + list(range(depth - 1)) + list(range(depth)) + [depth - 1])


def test_auto_takes_the_structural_table_where_root_paths_are_long():
    from hdecode_torch.core.plan import resolve_plan

    h = caterpillar(1000)
    m = hd.get_metric("wu_palmer", h)
    assert m.resolved_strategy(resolve_plan(h, "cpu")) == "structural"
    for depth in (60, 200):  # shallower caterpillars: root paths still hold half the tree
        assert hd.get_metric("wu_palmer", caterpillar(depth)).candidates_are_faster(caterpillar(depth), False) is False


def test_auto_keeps_the_candidates_on_wide_trees():
    from benchmarks.workloads import random_tree

    h = hd.Hierarchy.from_parents(random_tree(20_000, 12, seed=1))  # 29,449 nodes, depth 12, 10 leaf depths
    assert h.num_leaf_depths >= 2
    assert hd.get_metric("wu_palmer", h).candidates_are_faster(h, False) is True


def test_auto_decodes_caterpillar_1000_in_seconds_and_optimally_on_both_plans():
    # In a subprocess with a time limit: the old rule's candidates ran for minutes.
    code = textwrap.dedent("""
        import time, torch
        torch.set_num_threads(1)
        import hdecode_torch as hd
        depth = 1000
        h = hd.Hierarchy.from_parents([-1] + list(range(depth - 1)) + list(range(depth)) + [depth - 1])
        torch.manual_seed(0)
        probs = torch.distributions.Dirichlet(torch.full((h.num_leaves,), 0.1, dtype=torch.float64)).sample((2,))
        out = {}
        for plan in ("cpu", "cuda"):
            with hd.plan_for(plan):
                t = time.perf_counter()
                out[plan] = hd.get_metric("wu_palmer", h).decode(probs)
                print(plan, time.perf_counter() - t, out[plan].tolist(), flush=True)
        m = hd.get_metric("wu_palmer", h)
        e = m.expected(probs, out["cpu"])
        assert torch.equal(out["cpu"], out["cuda"]), out
        # the best node's value against every node's (structural, float64)
        post = hd.Posterior(h, probs)
        table = hd.metrics.wu_palmer.wu_palmer_table(post)
        assert torch.allclose(e, table.max(0).values, rtol=0, atol=1e-12), (e, table.max(0).values)
        print("OK")
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("OK"), done.stdout


# ------------------------------------------------------------------ the GPU plan's fused structural decoder
def _random_trees():
    from benchmarks.workloads import random_tree

    trees = [hd.load_hierarchy("tieredimagenet-h"), caterpillar(12), hd.Hierarchy.from_parents([-1, 0, 0, 0]),
             hd.Hierarchy.from_parents([-1, 0])]
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        trees.append(hd.Hierarchy.from_parents(random_tree(int(torch.randint(2, 300, (1,), generator=g)),
                                                           int(torch.randint(1, 12, (1,), generator=g)), seed=seed)))
    return trees


def _rows(h, dtype, kind, seed=0, b=29):
    g = torch.Generator().manual_seed(seed)
    if kind == "ties":  # two leaves of one half each: exact ties between nodes are common
        p = torch.zeros(b, h.num_leaves, dtype=torch.float64)
        p.scatter_(1, torch.randint(0, h.num_leaves, (b, 2), generator=g), 0.5)
        return (p / p.sum(1, keepdim=True)).to(dtype)
    scale = 3.0 if kind == "peaked" else 0.3
    return torch.softmax(torch.randn(b, h.num_leaves, generator=g, dtype=torch.float64) * scale, 1).to(dtype)


def test_fused_op_only_where_the_tables_are_large():
    # On an H100 the op's fixed launches per leaf depth cost more than the small trees' tables
    h = hd.load_hierarchy("tieredimagenet-h")
    m = hd.get_metric("wu_palmer", h, strategy="structural")
    with hd.plan_for("cuda"):
        assert not m._fused(hd.Posterior(h, torch.full((1, h.num_leaves), 1 / h.num_leaves)).plan, h)


def test_fused_gpu_plan_decoder_is_the_structural_table_bit_for_bit(monkeypatch):
    # The GPU plan's structural decode runs as hdecode::wu_palmer_best; the unfused (N, E, B) table and
    # argbest, as the GPU plan decoded before, give the same node for every row (same roundings).
    from hdecode_torch.kernels.selection import argbest
    from hdecode_torch.metrics.wu_palmer import WuPalmer, wu_palmer_table

    monkeypatch.setattr(WuPalmer, "FUSED_MIN_ROW_BYTES", 0)  # the op on every tree
    for h in _random_trees():
        m = hd.get_metric("wu_palmer", h, strategy="structural")
        for dtype in (torch.float32, torch.float64):
            for kind in ("peaked", "flat", "ties"):
                p = _rows(h, dtype, kind, seed=h.num_nodes)
                with hd.plan_for("cuda"):
                    post = hd.Posterior(h, p)
                    assert m._fused(post.plan, h)
                    got = m.decode(p)
                    want = argbest(h, wu_palmer_table(post), True)
                assert torch.equal(got, want), (h.num_nodes, dtype, kind)


def test_fused_decoder_is_optimal_against_the_dense_matrix(monkeypatch):
    from hdecode_torch.metrics.wu_palmer import WuPalmer

    monkeypatch.setattr(WuPalmer, "FUSED_MIN_ROW_BYTES", 0)
    for h in _random_trees()[1:]:
        m = hd.get_metric("wu_palmer", h, strategy="structural")
        dense = m.dense_matrix()  # (N, L) float64 values of every pair
        p = _rows(h, torch.float64, "peaked", seed=1)
        with hd.plan_for("cuda"):
            got = m.decode(p)
        values = p @ dense.t()  # (B, N)
        best = values.max(1).values
        assert torch.allclose(values.gather(1, got[:, None])[:, 0], best, rtol=0, atol=1e-12)
        # among the nodes within rounding of the best, the deepest (then the smallest id) is taken
        near = values >= best[:, None] - 1e-12
        depth = torch.where(near, h.depth[None, :], -1)
        assert torch.equal(h.depth[got], depth.max(1).values)


def test_wu_palmer_best_op_edge_cases_and_errors():
    import pytest

    from hdecode_torch.kernels.fused import wu_palmer_best
    from hdecode_torch.metrics.wu_palmer import _fused_args

    h = hd.load_hierarchy("tieredimagenet-h")
    args = _fused_args(h)
    assert wu_palmer_best(torch.empty(0, h.num_leaves), *args).shape == (0,)
    p = _rows(h, torch.float32, "peaked", b=5)
    p[2] = float("nan")  # a NaN row reaches every score of its row: nothing to choose
    got = wu_palmer_best(p, *args)
    assert got[2].item() == -1 and (got[[0, 1, 3, 4]] >= 0).all()
    # strides: a transposed copy decodes alike
    q = _rows(h, torch.float64, "flat", b=7)
    assert torch.equal(wu_palmer_best(q.t().contiguous().t(), *args), wu_palmer_best(q, *args))
    with pytest.raises(ValueError, match="`at`"):
        wu_palmer_best(q, *args[:7], args[7][:-1], args[8])
    with pytest.raises(TypeError, match="`depth`"):
        wu_palmer_best(q, *args[:3], args[3].float(), *args[4:])
    with pytest.raises(ValueError, match="`hi`"):
        wu_palmer_best(q, args[0], args[1][:-1], *args[2:])
    result = torch.library.opcheck(torch.ops.hdecode.wu_palmer_best.default, (q, *args))
    assert set(result.values()) == {"SUCCESS"}, result


def test_gpu_plan_operators_do_not_grow_with_the_batch_on_a_wide_tree():
    # One chunk for B = 2 and B = 32 (the fused op's rows are small), a fixed count of operators per
    # call, and inside the op a fixed count per leaf depth whatever B (no loop over rows).
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.plan_cost import cost_of
    from benchmarks.workloads import random_tree
    from hdecode_torch.kernels import native

    h = hd.Hierarchy.from_parents(random_tree(20_000, 12, seed=1))
    m = hd.get_metric("wu_palmer", h)
    ops, nested = {}, {}
    hd.set_memory_budget(64 * 2**20)  # the unfused table took 14.6 MB a row here: 8 chunks at B = 32
    try:
        for b in (2, 32):
            p = _rows(h, torch.float32, "peaked", b=b)
            ops[b] = cost_of(m.decode, p, "cuda").ops
            # the op's torch implementation (what runs in place of its kernels; on CPU tensors a native pass would)
            with hd.plan_for("cuda"), native.use_native(False):
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    # the decoder's own operators: the input check's torch implementation sums a CPU table in
                    # blocks of rows (a CPU-only memory measure; one launch on a GPU, counted by `ops` above)
                    m.decode(p, validate=False)
            nested[b] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    finally:
        hd.set_memory_budget(None)
    assert ops[2] == ops[32] <= 20, ops
    assert nested[2] == nested[32], nested


def test_fused_decoder_stays_within_the_memory_budget():
    # The op's rows are chunked by its own size per row: peak growth within the budget (float32 and
    # float64 rows), the (N, E) tables of the unfused decoder are never built.
    from memory_testing import MiB, peak_growths

    got = peak_growths("""
    from benchmarks.workloads import random_tree
    h = hd.Hierarchy.from_parents(random_tree(20_000, 12, seed=1))  # 29,449 nodes, 10 leaf depths
    m = hd.get_metric("wu_palmer", h)
    hd.set_memory_budget(24 * 2**20)
    for dtype in (torch.float32, torch.float64):
        probs = torch.softmax(torch.randn(64, h.num_leaves, dtype=torch.float64) * 3, 1).to(dtype)
        with hd.plan_for("cuda"):
            m.decode(probs[:1])
            growth(lambda: m.decode(probs))
    """)
    assert len(got) == 2 and max(got) < 24 * MiB, got


def _tie_rows(h, dtype):
    # model-like rows, uniform rows (every node of a level tied) and two-leaf rows (ties between branches)
    g = torch.Generator().manual_seed(3)
    soft = torch.softmax(torch.randn(5, h.num_leaves, generator=g, dtype=torch.float64) * 4, 1)
    pair = torch.zeros(3, h.num_leaves, dtype=torch.float64)
    pair[torch.arange(3), torch.tensor([0, 1, 2])] = 0.5
    pair[torch.arange(3), torch.tensor([h.num_leaves - 1, h.num_leaves - 2, 3])] += 0.5
    return torch.cat([soft, torch.full((2, h.num_leaves), 1.0 / h.num_leaves, dtype=torch.float64), pair]).to(dtype)


def _unary_tree():
    # single-child chains (Zhao's equal rows) and leaves at three depths
    return hd.Hierarchy.from_parents([9, 9, 10, 11, 11, 12, 12, 8, -1, 13, 8, 10, 14, 8, 7])


@pytest.mark.parametrize("name", ["wu_palmer", "zhao"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19", "unary"])
def test_ordered_table_is_the_expected_table_in_preference_order_bit_for_bit(name, dtype, tree):
    """The CPU plan's structural decoder builds its table with the rows in argbest's preference order: the
    expected values bit for bit, and the same node as argbest over the expected table, at B = 1 and 10."""
    from hdecode_torch.core.posterior import Posterior
    from hdecode_torch.kernels.selection import argbest, preference_order

    h = _unary_tree() if tree == "unary" else hd.load_hierarchy(tree)
    metric = hd.get_metric(name, h, strategy="structural")
    order = preference_order(h, h.num_nodes)
    rows = _tie_rows(h, dtype)
    with hd.plan_for("cpu"):  # the CPU plan's table (the suite also runs under the GPU plan)
        for x in (rows, rows[:1]):
            post = Posterior(h, x)
            want = metric.expected_table(post)
            got = metric.ordered_table(Posterior(h, x))
            assert got.dtype == dtype and got.shape == (h.num_nodes, x.shape[0])
            assert torch.equal(got, want.index_select(0, order))
            assert metric.decode(x).tolist() == argbest(h, want, True).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [1, 9])
def test_leaves_at_one_depth_masses_are_the_node_sums_bit_for_bit(dtype, batch):
    """On a tree whose leaves sit at one depth (iNat19) the CPU plan's Wu-Palmer table starts from the
    node sums p(n) instead of the per-leaf-depth table: both must hold the same bits."""
    from hdecode_torch.core.posterior import Posterior

    h = hd.load_hierarchy("inat19")
    assert h.num_leaf_depths == 1
    x = _tie_rows(h, dtype)[:batch]
    with hd.plan_for("cpu"):
        assert torch.equal(Posterior(h, x).by_leaf_depth()[:, 0], Posterior(h, x).node)
