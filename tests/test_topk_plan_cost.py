"""What a top-k decode costs a GPU: operators and host reads of one validated call on the GPU plan.

Counted as tests/test_plan.py counts the dense calls (``hd.plan_for("cuda")`` on CPU tensors, after a
warm-up call that builds the tree's tables): every operator is a kernel launch on a GPU and every host read
a full device sync.  The list's checks (``hd.TopK(values, indices)``), the bound list, its support table and
the off-support searches are shared by every metric: a call reads the device a fixed number of times, at
every batch size, and the limits below hold at B = 2 and at B = 1,024 alike.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from benchmarks.plan_cost import cost_of
from benchmarks.topk import HEURISTICS, METRICS
from harness import bundled, model_like

#: (operators, host reads) per validated top-k call on tieredImageNet-H, at k = 10 and 100 and any batch.
LIMITS = {"accuracy": (70, 2), "tree_distance": (250, 4), "tree_distance_c": (250, 4), "lca_height": (370, 6),
          "wu_palmer": (1000, 11), "zhao": (870, 11), "hamming": (300, 5), "hf_beta": (440, 14),
          "hf_beta[beta=0.5]": (440, 14), "jaccard": (470, 17), "argmax_leaf": (70, 2), "top_down": (1420, 4),
          "majority": (250, 4), "confidence_threshold": (250, 4),
          "confidence_threshold[tau=0.3]": (270, 3), "crm": (370, 6), "plurality": (2400, 4),
          "hie": (290, 5), "darts": (250, 4), "expected_information": (250, 4), "information_threshold": (250, 5)}
#: Those whose operator counts depend on the rows as well as on the tree (a level loop that stops at the deepest
#: listed leaf, the similarity metrics' bounded descent, the sets' candidate rounds); of them, those whose host
#: reads do too (the descent and the rounds read a size per level).
DATA_DEPENDENT_OPS = {"lca_height", "crm", "wu_palmer", "zhao", "hf_beta", "hf_beta[beta=0.5]", "jaccard"}
DATA_DEPENDENT_READS = {"wu_palmer", "zhao", "jaccard"}


def _decoders(h):
    for name, params in [(m, None) for m in METRICS] + HEURISTICS:
        yield name, hd.get_metric(name, h) if params is None else hd.get_decoder(name, h, **params)


def _cost(m, probs, k):
    values, indices = probs.topk(k)
    c = cost_of(lambda v: m.decode(hd.TopK(v, indices)), values)
    return c.ops, c.reads, c.by_op


@pytest.mark.parametrize("k", [10, 100])
def test_topk_gpu_plan_operator_and_host_read_budgets(k):
    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(0)
    few = torch.as_tensor(model_like(rng, h, 2, "confused"), dtype=torch.float32)
    many = torch.as_tensor(model_like(rng, h, 1024, "confused"), dtype=torch.float32)
    for name, m in _decoders(h):
        max_ops, max_reads = LIMITS[name]
        ops2, reads2, _ = _cost(m, few, k)
        ops, reads, by_op = _cost(m, many, k)
        top = sorted(by_op.items(), key=lambda kv: -kv[1])[:8]
        assert ops <= max_ops and reads <= max_reads, (name, k, ops, reads, top)
        assert ops2 <= max_ops and reads2 <= max_reads, (name, k, ops2, reads2)
        if name not in DATA_DEPENDENT_OPS:
            assert ops2 == ops, (name, k, ops2, ops)
        if name not in DATA_DEPENDENT_READS:
            assert reads2 == reads, (name, k, reads2, reads)


def test_the_gpu_plans_masked_kernels_equal_the_cpu_plans_selections():
    """``Listed.compact`` off (the GPU plan's kernels: entries masked, not selected) gives the support table
    field for field and the first free ranks value for value, on lists of a bundled tree and random pairs with
    never-asked groups (−1) among them."""
    from hdecode_torch.core.topk import CompletedTopK
    from hdecode_torch.kernels.support import first_free_rank, support_table

    h, _ = bundled("tieredimagenet-h")
    rng = np.random.default_rng(5)
    probs = torch.as_tensor(model_like(rng, h, 64, "confused"), dtype=torch.float32)
    for k in (1, 10, 100):
        with hd.plan_for("cpu"):  # the CPU plan's lists select (whatever plan the suite runs under)
            ct = CompletedTopK(h, hd.TopK(*probs.topk(k)))
        assert ct.compact
        masked = ct.listed._replace(compact=False)
        for with_entry in (False, True):
            a = support_table(h, ct.listed, ct.weights, with_entry)
            b = support_table(h, masked, ct.weights, with_entry)
            for name, x, y in zip(a._fields, a, b):
                assert (x is None and y is None) or torch.equal(x, y), (k, with_entry, name)
    g = torch.Generator().manual_seed(2)
    for m, groups, span in ((1, 1, 1), (50, 3, 4), (5000, 400, 9)):
        group = torch.randint(-1, groups, (m,), generator=g)
        rank = torch.randint(0, span, (m,), generator=g)
        query = torch.randint(0, groups + 2, (300,), generator=g)
        keep = group >= 0
        want = first_free_rank(group[keep], rank[keep], query)
        assert torch.equal(first_free_rank(group, rank, query, span, groups + 2, compact=False), want)
        brute = [min(set(range(span + 1)) - set(rank[keep & (group == q)].tolist())) for q in query.tolist()]
        assert want.tolist() == brute
