"""The native kernels of the node decoders' fused ops (``kernels/native/node_scores.c``): ``hdecode::path_score_best``
(Zhao's similarity, the LCA height) and ``hdecode::wu_palmer_best`` (Wu-Palmer) on plain float CPU tensors give the
torch implementations' answers row by row (the same float64 sums in the same order), and the node decoders of both
plans decide with them where they apply, as their oracles and the torch paths do."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native
from hdecode_torch.kernels.fused import path_score_best, wu_palmer_best
from hdecode_torch.kernels.fused._registry import OPS
from hdecode_torch.metrics import lca_height as lca_module
from hdecode_torch.metrics import wu_palmer as wp_module
from hdecode_torch.metrics import zhao as zhao_module

import reference as ref
from harness import batch, bundled, random_trees
from torch.utils._python_dispatch import TorchDispatchMode

needs_native = pytest.mark.skipif(not native.available(),
                                  reason=f"native kernels unavailable here: {native.unavailable_reason()}")

#: name -> (the op, the metric module whose _fused_args give its tables)
OPS_UNDER_TEST = {"zhao": (path_score_best, zhao_module), "lca_height": (path_score_best, lca_module),
                  "wu_palmer": (wu_palmer_best, wp_module)}


def _trees():
    chain = hd.Hierarchy.from_parents([3, 3, 4, 4, 5, 6, -1])  # leaves 0-2 beside single-child chains 4 -> 5 -> 6
    return [bundled("tieredimagenet-h")[0], bundled("inat19")[0], chain] + [h for h, _ in random_trees(29, 10)]


def _rows(h, b, dtype, seed=0):
    """(b, L) rows that make ties and near ties: model-like softmaxes, dyadic rows, one-hot rows, uniform rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.softmax(3 * torch.randn(b, h.num_leaves, generator=g, dtype=torch.float64), 1)
    if b >= 4:
        x[1::4] = torch.from_numpy(batch(np.random.default_rng(seed), len(range(1, b, 4)), h.num_leaves))
        x[2::4] = 1 / h.num_leaves
        x[3::4] = 0
        x[3::4, int(g.seed()) % h.num_leaves] = 1
    return x.to(dtype)


def _native_and_torch(name, h, x):
    op, module = OPS_UNDER_TEST[name]
    args = module._fused_args(h)
    calls = []
    impl = OPS[op.__name__].native

    def counted(*a):
        out = impl(*a)
        calls.append(out is not None)
        return out

    OPS[op.__name__] = OPS[op.__name__].__class__(**{**OPS[op.__name__].__dict__, "native": counted})
    try:
        fast = op(x, *args)
    finally:
        OPS[op.__name__] = OPS[op.__name__].__class__(**{**OPS[op.__name__].__dict__, "native": impl})
    with native.use_native(False):
        slow = op(x, *args)
    return fast, slow, calls


@needs_native
@pytest.mark.parametrize("name", sorted(OPS_UNDER_TEST))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_kernels_answer_as_the_torch_implementations(name, dtype):
    for h in _trees():
        if name != "lca_height" and h.num_leaves == 1:
            continue
        x = _rows(h, 37, dtype)
        fast, slow, calls = _native_and_torch(name, h, x)
        assert calls == [True], "the native kernel did not run"
        assert fast.dtype == torch.int64 and torch.equal(fast, slow), (name, h.num_nodes)


@needs_native
@pytest.mark.parametrize("name", sorted(OPS_UNDER_TEST))
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_one_row_equals_the_batch_row_by_row(name, tree):
    h = bundled(tree)[0]
    op, module = OPS_UNDER_TEST[name]
    args = module._fused_args(h)
    for dtype in (torch.float32, torch.float64):
        x = _rows(h, 4000, dtype, seed=3)
        full = op(x, *args)
        with native.use_native(False):
            assert torch.equal(full, op(x, *args))
        picks = list(range(0, 4000, 97)) + [3999]
        one = torch.cat([op(x[i:i + 1], *args) for i in picks])
        assert torch.equal(one, full[picks])


@needs_native
@pytest.mark.parametrize("name", sorted(OPS_UNDER_TEST))
def test_strided_empty_and_non_finite_inputs(name):
    h = bundled("tieredimagenet-h")[0]
    op, module = OPS_UNDER_TEST[name]
    args = module._fused_args(h)
    wide = _rows(h, 24, torch.float64, seed=5).repeat(1, 2)
    for x in (wide[:, ::2], wide[::3, 1::2], wide.t().contiguous().t()[:, : h.num_leaves], wide[:0, :h.num_leaves],
              wide[:, :h.num_leaves].float()[::2]):
        fast, slow, calls = _native_and_torch(name, h, x)
        assert calls == [True] and torch.equal(fast, slow)
    x = _rows(h, 16, torch.float64, seed=7)
    x[0, 3] = float("nan")
    x[1] = float("nan")
    x[2, 5] = float("inf")
    x[3, 0] = -float("inf")
    x[4, :] = 0
    x[5, 7] = 1e300
    x[6] = -0.0
    x[7, ::3] = 5e-324  # subnormal
    for dtype in (torch.float32, torch.float64):
        fast, slow, calls = _native_and_torch(name, h, x.to(dtype))
        assert calls == [True] and torch.equal(fast, slow)
    assert (fast[:2] == -1).all()  # a NaN reaches every root-path sum of its row: no node left


@needs_native
def test_the_kernels_stand_aside_and_the_torch_implementations_raise():
    h = bundled("inat19")[0]
    x = torch.softmax(torch.randn(3, h.num_leaves), 1)
    for name, (op, module) in OPS_UNDER_TEST.items():
        impl = OPS[op.__name__].native
        args = module._fused_args(h)
        assert impl(x.half(), *args) is None  # no kernel for the dtype
        assert impl(x.requires_grad_(False)[None], *args) is None  # not (B, M)
        with native.use_native(False):
            assert impl(x, *args) is None
        bad = list(args)
        bad[0] = bad[0].clone()
        bad[0][0] = h.num_leaves + 5  # a leaf index out of range: never read by the kernel
        with pytest.raises(ValueError):
            op(x, *bad)


def _oracle_best(info, name, p):
    """The best nodes (all of them, for ties) of one row by the NumPy oracle."""
    f = getattr(ref, name)
    nodes = range(info.L) if name == "lca_height" else range(info.N)
    values = {n: sum(p[y] * f(info, n, y) for y in range(info.L) if p[y] > 0) for n in nodes}
    best = (min if name == "lca_height" else max)(values.values())
    return {n for n, v in values.items() if abs(v - best) <= 1e-9 * max(1.0, abs(best))}


#: leaves 0-4 all at depth 3, single-child chains 9 -> 7 and 6 -> 2 (Wu-Palmer's native pass needs leaves at one depth)
ONE_DEPTH = [5, 5, 6, 7, 7, 8, 8, 9, 10, 10, -1]


def _one_depth_trees():
    return [(hd.Hierarchy.from_parents(ONE_DEPTH), ref.TreeInfo(np.asarray(ONE_DEPTH)))]


class _Calls:
    """Counts the native passes (``path_argbest`` returning a decision) made inside the block."""

    def __init__(self, monkeypatch):
        import hdecode_torch.metrics.lca_height as lca_metric
        import hdecode_torch.metrics.strategies as strategies
        from hdecode_torch.kernels.path_argbest import path_argbest

        self.count = 0

        def counted(*args):
            out = path_argbest(*args)
            self.count += out is not None
            return out
        monkeypatch.setattr(strategies, "path_argbest", counted)
        monkeypatch.setattr(lca_metric, "path_argbest", counted)


@needs_native
@pytest.mark.parametrize("name", ["zhao", "wu_palmer", "lca_height"])
def test_the_cpu_plan_decides_in_the_native_pass_as_the_oracles(name, monkeypatch):
    calls = _Calls(monkeypatch)
    trees = _one_depth_trees() if name == "wu_palmer" else list(random_trees(37, 6)) + _one_depth_trees()
    for h, info in trees:
        if h.num_leaves < 2:
            continue
        metric = hd.get_metric(name, h)
        p = batch(np.random.default_rng(h.num_nodes), 12, h.num_leaves)
        before = calls.count
        with hd.plan_for("cpu"):
            fast = metric.decode(torch.from_numpy(p))
            one = torch.cat([metric.decode(torch.from_numpy(p[i:i + 1])) for i in range(3)])
        assert calls.count == before + 4, f"{name} did not decide in the native pass"
        assert torch.equal(one, fast[:3])
        for row in range(p.shape[0]):
            assert int(fast[row]) in _oracle_best(info, name, p[row]), (name, row, int(fast[row]))


def _tie_rows(h, dtype, b=40, seed=0):
    """Model-like rows, uniform rows (every node of a level tied), two-leaf rows (ties between branches), one-hot
    rows, dyadic rows and rows with NaN, infinities, zeros, a negative zero and subnormals."""
    g = torch.Generator().manual_seed(seed)
    x = torch.softmax(4 * torch.randn(b, h.num_leaves, generator=g, dtype=torch.float64), 1)
    leaves = h.num_leaves
    x[1] = 1 / leaves
    x[2] = 0
    x[2, 0] = x[2, leaves - 1] = 0.5
    x[3] = 0
    x[3, leaves // 2] = 1
    x[4] = torch.from_numpy(batch(np.random.default_rng(seed), 1, leaves, kinds=("dyadic",)))[0]
    x[5, 0] = float("nan")
    x[6, -1] = float("inf")
    x[7, 0] = -float("inf")
    x[8] = 0
    x[9] = -0.0
    x[10, ::2] = 5e-324
    return x.to(dtype)


@needs_native
@pytest.mark.parametrize("name", ["zhao", "wu_palmer", "lca_height"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_native_pass_decides_as_the_torch_path(name, dtype, monkeypatch):
    """The CPU plan's decisions with the native pass and without (its per-level tables, argbest's ties), row by
    row: random trees with single-child chains, a star of wide fan-in (float32 summed in float64), both bundled
    trees, ties, non-finite values, strided rows, one row and an empty batch."""
    calls = _Calls(monkeypatch)
    star = hd.Hierarchy.from_parents([-1] + [0] * 40_000)
    trees = [bundled("tieredimagenet-h")[0], bundled("inat19")[0], star, hd.Hierarchy.from_parents(ONE_DEPTH)]
    trees += [h for h, _ in random_trees(47, 10)]
    for h in trees:
        metric = hd.get_metric(name, h, **({} if name == "lca_height" else {"strategy": "structural"}))
        x = _tie_rows(h, dtype)
        wide = torch.stack([x, x], 2).reshape(x.shape[0], -1)  # wide[:, ::2] is x, strided
        with hd.plan_for("cpu"):
            before = calls.count
            # unchecked rows: the non-finite ones reach the decoders as they are
            got = [metric.decode(v, validate=False) for v in (x, wide[:, ::2], x.t().contiguous().t(),
                                                              x[:1], x[:0])]
            native_ran = calls.count > before
            with native.use_native(False):
                want = [metric.decode(v, validate=False) for v in (x, x, x, x[:1], x[:0])]
        if name != "wu_palmer" or h.num_leaf_depths == 1:
            assert native_ran, (name, h.num_nodes)
        for a, b in zip(got, want):
            assert torch.equal(a, b), (name, h.num_nodes, a, b)


@needs_native
@pytest.mark.parametrize("name", ["zhao", "wu_palmer", "lca_height"])
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_the_native_pass_decides_one_row_as_the_batch(name, tree):
    h = bundled(tree)[0]
    metric = hd.get_metric(name, h)
    for dtype in (torch.float32, torch.float64):
        x = _rows(h, 4000, dtype, seed=11)
        with hd.plan_for("cpu"):
            full = metric.decode(x)
            with native.use_native(False):
                assert torch.equal(full, metric.decode(x))
            picks = list(range(0, 4000, 89)) + [3999]
            assert torch.equal(torch.cat([metric.decode(x[i:i + 1]) for i in picks]), full[picks])


@needs_native
@pytest.mark.parametrize("name", ["zhao", "wu_palmer", "lca_height"])
def test_decisions_with_the_kernels_on_and_off_on_both_plans(name):
    """Model-like rows on the bundled trees: the same decisions with the native kernels and without, on both plans
    (the GPU plan's fused ops run their native kernels on CPU tensors)."""
    for tree in ("tieredimagenet-h", "inat19"):
        h = bundled(tree)[0]
        for strategy in ((None,) if name == "lca_height" else ("auto", "structural")):
            metric = hd.get_metric(name, h, **({} if strategy is None else {"strategy": strategy}))
            for dtype in (torch.float32, torch.float64):
                x = torch.softmax(2 * torch.randn(300, h.num_leaves, generator=torch.Generator().manual_seed(1),
                                                  dtype=torch.float64), 1).to(dtype)
                for plan in ("cpu", "cuda"):
                    with hd.plan_for(plan):
                        fast = metric.decode(x)
                        with native.use_native(False):
                            slow = metric.decode(x)
                    assert torch.equal(fast, slow), (tree, strategy, dtype, plan)
class _Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@needs_native
@pytest.mark.parametrize("name", ["zhao", "wu_palmer", "lca_height"])
@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_a_counted_call_after_the_kernels_finds_the_torch_paths_tables(name, plan):
    """A call that must run torch operators after native calls builds no tree table inside the count."""
    parents = [h.parent.tolist() for h, _ in random_trees(43, 1)][0]
    counts = []
    for warm_native in (False, True):
        h = hd.Hierarchy.from_parents(parents)  # a fresh tree: no cached table
        metric = hd.get_metric(name, h)
        with hd.plan_for(plan):
            for rows in (1, 40):
                x = torch.softmax(torch.randn(rows, h.num_leaves), 1)
                with native.use_native(warm_native):
                    metric.decode(x)
                with _Count() as c:
                    metric.decode(x)
                counts.append(c.ops)
    assert counts[:2] == counts[2:] and min(counts) > 0


@needs_native
@pytest.mark.parametrize("name", ["zhao", "wu_palmer", "lca_height"])
def test_partial_groups_of_rows_decide_as_the_full_batch(name, monkeypatch):
    """A batch that is not a multiple of the kernel's 8 lanes computes its last group on the lanes in use only:
    every batch size 1-17 gives each row the decision the torch path and the whole batch give it."""
    calls = _Calls(monkeypatch)
    for h in [bundled("inat19")[0], hd.Hierarchy.from_parents(ONE_DEPTH)] + [h for h, _ in random_trees(53, 3)]:
        if name == "wu_palmer" and h.num_leaf_depths != 1:
            continue
        metric = hd.get_metric(name, h, **({} if name == "lca_height" else {"strategy": "structural"}))
        for dtype in (torch.float32, torch.float64):
            x = _tie_rows(h, dtype, b=17, seed=h.num_nodes)
            with hd.plan_for("cpu"):
                full = metric.decode(x, validate=False)
                with native.use_native(False):
                    assert torch.equal(full, metric.decode(x, validate=False))
                before = calls.count
                for b in range(1, 18):
                    assert torch.equal(metric.decode(x[-b:], validate=False), full[-b:]), (name, h.num_nodes, b)
                assert calls.count == before + 17
