"""Device plans: ``hd.plan_for``, what each plan chooses, and what the GPU plan costs.

The GPU plan runs here on CPU tensors.  Its cost is counted the way a GPU pays it: operators that
launch a kernel (a fused ``hdecode::`` op counts as one) and host reads (values the host must wait
for), per decode call, with the limits the GPU path is held to.  The same counts must hold on a tree
five times deeper: a GPU pays per launch, so nothing may loop over the tree's levels.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import harness
import reference as ref
from benchmarks.plan_cost import cost_of, deepened
from harness import batch, bundled, metric_cases, model_like, random_trees, tolerance

def gpu_cost(fn, x):
    """(operators, host reads, operators by name) of ``fn(x)`` under the GPU plan, after a warm-up call."""
    c = cost_of(fn, x, "cuda")
    return c.ops, c.reads, c.by_op


#: Limits of the GPU plan: operators per validated call and host reads per call (the input check's flag
#: is read with the decoder's own read where it has one).  The targets of the fixed-cost work: a call is
#: its kernels, whatever the batch and the tree (the deeper variant below must count the same, ±2).
LIMITS = {"node_probabilities": (12, 1), "accuracy": (15, 1), "tree_distance": (15, 1), "tree_distance_c": (15, 1),
          "hamming": (20, 1), "lca_height": (20, 1), "zhao": (20, 1), "wu_palmer": (20, 1), "hf_beta": (40, 1),
          "jaccard": (60, 3)}  # the op's torch implementation reads its pairs' allowed counts; the Triton kernel none


def _calls(h):
    yield "node_probabilities", lambda x: hd.node_probabilities(h, x)
    for c in metric_cases(decodable=True):
        name, params = c.values
        m = hd.get_metric(name, h, **params)
        yield m.key, m.decode


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@harness.silence_root_threshold
def test_gpu_plan_operator_and_host_read_budgets(tree):
    h, _ = bundled(tree)
    x = torch.as_tensor(model_like(np.random.default_rng(0), h, 64, "confused"), dtype=torch.float32)
    deep = deepened(h)
    assert deep.max_depth == h.max_depth + 48
    deep_calls = dict(_calls(deep))
    for key, fn in _calls(h):
        name = key.split("[")[0]
        assert name in LIMITS, f"no GPU-plan limit declared for {name!r}"
        max_ops, max_reads = LIMITS[name]
        ops, reads, by_op = gpu_cost(fn, x)
        assert ops <= max_ops and reads <= max_reads, (tree, key, ops, reads, by_op)
        deep_ops, deep_reads, _ = gpu_cost(deep_calls[key], x)
        assert abs(deep_ops - ops) <= 2 and deep_reads == reads, (tree, key, ops, deep_ops)


def test_validate_false_reads_nothing_on_the_gpu_plan():
    """Decoders whose output size does not depend on the data make no host read at all without the
    input check (what a CUDA graph capture needs)."""
    h, _ = bundled("tieredimagenet-h")
    x = torch.as_tensor(model_like(np.random.default_rng(1), h, 32, "peaked"), dtype=torch.float32)
    for name in ("accuracy", "tree_distance", "hamming", "lca_height", "zhao", "wu_palmer"):
        m = hd.get_metric(name, h)
        _, reads, _ = gpu_cost(lambda p: m.decode(p, validate=False), x)
        assert reads == 0, name


@pytest.mark.parametrize("name,params", metric_cases(decodable=True))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_plan_is_exact_on_small_random_trees(name, params, dtype):
    """The GPU plan against the oracle (enumeration of every closed set for set metrics)."""
    rng = np.random.default_rng(17)
    for h, info in random_trees(23, 12, num_nodes_max=11, unary_prob=0.3):
        m = hd.get_metric(name, h, **params)
        x = torch.as_tensor(batch(rng, 8, info.L)).to(dtype)
        P = x.double().numpy()
        with hd.plan_for("cuda"):
            pred = m.decode(x).numpy()
        for b in range(P.shape[0]):
            best, _ = ref.optimal(info, name, P[b], **params)
            row = np.asarray(pred[b], dtype=bool) if m.kind == "set" else int(pred[b])
            got = ref.expected(info, name, P[b], row, **params)
            assert got == pytest.approx(best, rel=tolerance(dtype), abs=1e-12), (name, params, b)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
@harness.silence_root_threshold
def test_gpu_plan_equals_cpu_plan_on_bundled_trees(tree):
    """Same decisions (up to exact ties of the expected value) and same expected values to float64 rounding."""
    h, _ = bundled(tree)
    rng = np.random.default_rng(3)
    x = torch.as_tensor(np.concatenate([model_like(rng, h, 25, k) for k in ("peaked", "diffuse", "confused",
                                                                             "shallow")]))
    for c in metric_cases(decodable=True):
        name, params = c.values
        m = hd.get_metric(name, h, **params)
        cpu = m.decode(x)
        with hd.plan_for("cuda"):
            gpu = m.decode(x)
        torch.testing.assert_close(m.expected(x, gpu), m.expected(x, cpu), rtol=1e-12, atol=1e-12)
        assert (gpu == cpu).double().mean() > 0.99, m.key


def test_plan_for_chooses_and_nests():
    with hd.plan_for("cpu"):  # the starting point, whatever plan the test session runs under
        _plan_for_chooses_and_nests()


def _plan_for_chooses_and_nests():
    h, _ = bundled("tieredimagenet-h")
    cpu = hd.core.resolve_plan(h, torch.device("cpu"))
    assert cpu.name == "cpu" and cpu.tree_sums == "levels" and not cpu.batch_major
    with hd.plan_for("cuda"):
        plan = hd.core.resolve_plan(h, torch.device("cpu"))
        assert plan.name == "gpu" and plan.tree_sums == "prefix" and plan.batch_major
        with hd.plan_for(torch.device("cpu")):
            assert hd.core.resolve_plan(h, torch.device("cpu")).tree_sums == "levels"
        assert hd.core.resolve_plan(h, torch.device("cpu")).name == "gpu"
    assert hd.core.resolve_plan(h, torch.device("cpu")).name == "cpu"
    # deep trees: the CPU plan leaves the per-level sums too
    deep = hd.Hierarchy.from_parents(list(range(1, 600)) + [-1])  # a chain of 600 nodes
    assert hd.core.resolve_plan(deep, torch.device("cpu")).tree_sums == "prefix"
    with pytest.raises(TypeError, match="`device`"):
        with hd.plan_for(3.5):
            pass
    wp = hd.get_metric("wu_palmer", h)
    assert wp.resolved_strategy(hd.core.resolve_plan(h, torch.device("cpu"))) in ("candidates", "structural")
    with hd.plan_for("cuda"):
        assert wp.resolved_strategy(hd.core.resolve_plan(h, torch.device("cpu"))) == "dense"


def test_gpu_plan_tables_are_batch_major_views():
    h, _ = bundled("inat19")
    x = torch.softmax(torch.randn(5, h.num_leaves, dtype=torch.float64), 1)
    with hd.plan_for("cuda"):
        post = hd.Posterior(h, x)
        node = post.node
        assert node.shape == (h.num_nodes, 5) and node.t().is_contiguous()
        assert torch.equal(node[: h.num_leaves], x.t())  # leaves hold the input exactly
        q = post.by_leaf_depth()
        assert q.shape == (h.num_nodes, h.num_leaf_depths, 5) and q.permute(2, 1, 0).is_contiguous()
    torch.testing.assert_close(node, hd.Posterior(h, x).node, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("n", [3, 2000])
def test_a_chain_compiles_and_decodes_on_both_plans(n):
    """A single chain: depth N-1, one leaf; every decoder returns the deepest node of the chain (or the leaf)."""
    h = hd.Hierarchy.from_parents(list(range(1, n)) + [-1])
    assert h.max_depth == n - 1 and h.num_leaves == 1
    x = torch.ones(2, 1)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            for name in ("tree_distance", "lca_height", "zhao", "wu_palmer", "accuracy"):
                assert hd.get_metric(name, h).decode(x).tolist() == [0, 0], (plan, name)
            sets = hd.get_metric("hf_beta", h).decode(x)
            assert bool(sets.all()), plan


@harness.silence_root_threshold
def test_gpu_plan_counts_do_not_grow_with_the_batch():
    """Two samples cost the operators and host reads of 64 (±2): the cost of a call is fixed.  One sample
    costs the host reads of 64 and no more operators (some decoders take shortcuts at one row, with the
    same bits: hF_β's packed row has no padding to mask)."""
    h, _ = bundled("inat19")
    rng = np.random.default_rng(3)
    one = torch.as_tensor(model_like(rng, h, 1, "peaked"), dtype=torch.float32)
    two = torch.as_tensor(model_like(rng, h, 2, "peaked"), dtype=torch.float32)
    many = torch.as_tensor(model_like(rng, h, 64, "diffuse"), dtype=torch.float32)
    for key, fn in _calls(h):
        ops1, reads1, _ = gpu_cost(fn, one)
        ops2, reads2, _ = gpu_cost(fn, two)
        ops64, reads64, _ = gpu_cost(fn, many)
        assert abs(ops2 - ops64) <= 2 and reads2 == reads64, (key, ops2, ops64, reads2, reads64)
        assert ops1 <= ops64 + 2 and reads1 == reads64, (key, ops1, ops64, reads1, reads64)


def test_gpu_plan_jaccard_masses_are_not_chunked_at_the_cpus_size():
    """2,048 rows of tieredImageNet-H (ten leaf depths: some 80 MiB of the masses' temporaries) cost the
    operators of 64 on the GPU plan: its chunks are a quarter of the budget, not the CPU plan's 32 MiB, under
    which every further 32 MiB was one more round of gathers (104 operators against 86 here; at B = 40,737,
    707 operators on a CPU and 15 ms on an H100)."""
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(3)
    m = hd.get_metric("jaccard", h)
    few, many = (torch.as_tensor(model_like(rng, h, b, "confused"), dtype=torch.float32) for b in (64, 2048))
    # operators only: on CPU tensors the op's torch implementation reads its pairs' groups, as many as the
    # rows hold (the Triton kernel reads none)
    assert gpu_cost(m.decode, many)[0] == gpu_cost(m.decode, few)[0]


def test_graph_body_checks_its_input_without_a_host_read():
    """A captured head's check runs in the graph: the body returns the check's flag on the device and
    reads nothing; the flag is true for valid input and false for any input the eager check refuses."""
    h, _ = bundled("tieredimagenet-h")
    x = torch.as_tensor(model_like(np.random.default_rng(2), h, 16, "peaked"), dtype=torch.float32)
    for name, kw in [("tree_distance", {}), ("wu_palmer", {}), ("zhao", {}), ("hamming", {})]:
        head = hd.DecodingHead(h, name, **kw)
        with hd.plan_for("cuda"):
            head._graph_body(h, x, check=True)  # tree tables built
            reads = []
            with pytest.MonkeyPatch.context() as mp:
                for attr in ("tolist", "item", "__bool__", "__int__", "__float__"):
                    orig = getattr(torch.Tensor, attr)
                    mp.setattr(torch.Tensor, attr, lambda self, *a, _o=orig, **k: reads.append(1) or _o(self, *a, **k))
                out, flag = head._graph_body(h, x, check=True)
            assert reads == [] and flag.dtype == torch.bool and flag.dim() == 0
            assert bool(flag) and torch.equal(out, head(x))
            bad = x.clone()
            bad[3, 0] = -0.25
            _, flag = head._graph_body(h, bad, check=True)
            assert not bool(flag)
            bad[3, 0] = float("nan")
            _, flag = head._graph_body(h, bad, check=True)
            assert not bool(flag)
