"""One row (B = 1), the call a serving model makes per request: what the decode template and the tree's
cached tables spare it, on both plans.  Decisions are the oracle suites' and the recorded ones'; these
tests pin the fixed costs that do not depend on the data (operators dispatched, tables re-derived)."""

from __future__ import annotations

import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.core.component import HierarchyComponent
from hdecode_torch.metrics import jaccard as jaccard_module
from testing import PLANS, Operators


@pytest.fixture(scope="module")
def h():
    return hd.load_hierarchy("tieredimagenet-h")


def _row(h, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(1, h.num_leaves, generator=g, dtype=torch.float64) * 3, 1).float()


@pytest.mark.parametrize("plan", PLANS)
def test_no_detach_of_a_row_without_gradient(h, plan):
    """A decision records no gradient: a row that needs none is decoded as it is (one dispatcher call fewer),
    one that needs one is detached, with the same decision."""
    p = _row(h)
    metric = hd.get_metric("accuracy", h)
    with hd.plan_for(plan):
        metric.decode(p)
        with Operators() as seen:
            out = metric.decode(p)
        assert "aten.detach.default" not in seen.ops
        q = p.clone().requires_grad_()
        with Operators() as seen_grad:
            out_grad = metric.decode(q)
    assert "aten.detach.default" in seen_grad.ops
    assert not out_grad.requires_grad
    assert torch.equal(out, out_grad)
    assert out.tolist() == [int(p.argmax())]


class _Budgetless(HierarchyComponent):
    """A component whose per-sample memory cannot be estimated: only a split of the batch asks for it."""

    name = "budgetless"
    kind = "leaf"

    def _bytes_per_sample(self, h, plan):
        raise RuntimeError("bytes per sample asked for")

    def _decode_default(self, post):
        return post.probs.argmax(1)


@pytest.mark.parametrize("plan", PLANS)
def test_one_row_is_never_chunked(h, plan):
    """One row is one chunk whatever the budget: its decode computes no budget split (two rows still do)."""
    p = _row(h)
    c = _Budgetless(h)
    with hd.plan_for(plan):
        assert c.decode(p).tolist() == [int(p.argmax())]
        assert c.decode(p[0]).tolist() == int(p.argmax())
        with pytest.raises(RuntimeError, match="bytes per sample"):
            c.decode(torch.cat([p, p]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_expected_leaf_depth_converts_no_tree_table(h, dtype):
    """E[d(y)] of a new batch is one product: the leaf depths in the probabilities' dtype are the tree's,
    converted once, with the same value as converting them per call."""
    p = _row(h).to(dtype)
    hd.Posterior(h, p).expected_leaf_depth()
    post = hd.Posterior(h, p)
    with Operators() as seen:
        got = post.expected_leaf_depth()
    assert not any("_to_copy" in op for op in seen.ops), seen.ops
    assert torch.equal(got, p @ h.leaf_depth.to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_jaccard_tau_cached_per_dtype(h, dtype):
    """Jaccard's node bound τ in the probabilities' dtype is built once per tree and dtype (the value of
    converting it per call), and a one-row decode on either plan gives the same set."""
    tables = jaccard_module._tables(h)
    tau = jaccard_module._tau_as(h, tables, dtype)
    assert jaccard_module._tau_as(h, tables, dtype) is tau
    assert tau.dtype == dtype and torch.equal(tau, tables.tau.to(dtype))
    p = _row(h, seed=3).to(dtype)
    metric = hd.get_metric("jaccard", h)
    with hd.plan_for("cpu"):
        a = metric.decode(p)
    with hd.plan_for("cuda"):
        b = metric.decode(p)
    assert a.shape == (1, h.num_nodes) and bool(a[0, h.root])
    assert torch.allclose(metric.expected(p, a), metric.expected(p, b), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_candidate_slack_factors_cached_per_dtype(h, dtype):
    """Wu-Palmer's candidates (the CPU plan's choice on tieredImageNet-H) compare with per-node factors
    that depend on the tree only: built once per dtype, not again in every call (twenty operators)."""
    metric = hd.get_metric("wu_palmer", h)
    p = _row(h).to(dtype)
    first = metric.decode(p)
    with Operators() as seen:
        again = metric.decode(p)
    assert "aten.abs.default" not in seen.ops
    assert torch.equal(first, again)
    stats = metric.dense_pruning(h)
    up_in = stats.slack_factors(dtype)[0]
    eps = 16 * torch.finfo(dtype).eps
    assert up_in.shape == (h.num_nodes, 1) and up_in.dtype == dtype
    assert torch.equal(up_in[:, 0], (stats.M_in + eps * stats.M_in.abs()).to(dtype))

@pytest.mark.parametrize("name, op", [("lca_height", "path_score_best"), ("tree_distance", "best_ranked_above")])
def test_fused_decoder_looks_its_tables_up_once_per_call(h, monkeypatch, name, op):
    """The GPU plan's fused decoders, run by their torch implementations on a CPU, find their checked and
    derived tree tables with one cache lookup per call (each lookup costs about an operator at one row),
    and decide as before: the CPU plan's node, which their float64 sums agree with on these rows."""
    import importlib

    checks = importlib.import_module("hdecode_torch.kernels.fused._checks")
    module = importlib.import_module(f"hdecode_torch.kernels.fused.{op}")
    metric = hd.get_metric(name, h)
    lookups = []
    original = checks.derived

    def counted(tag, sources, build, *keep):
        lookups.append(tag)
        return original(tag, sources, build, *keep)

    # every module that looks tables up by this name (the shared checks, the op, the range sums)
    for mod in (checks, module, importlib.import_module("hdecode_torch.kernels.fused.gathered_prefix")):
        monkeypatch.setattr(mod, "derived", counted)
    for seed in range(3):
        p = _row(h, seed)
        with hd.plan_for("cuda"):
            got = metric.decode(p)
        with hd.plan_for("cpu"):
            want = metric.decode(p)
        assert torch.equal(got, want), (seed, got, want)
    lookups.clear()
    with hd.plan_for("cuda"):
        metric.decode(_row(h, 4))
    assert len(lookups) == 1, lookups
