"""Top-k decodes on a deep tree stay within the memory budget: a caterpillar (a spine of d internal nodes, one leaf
hanging at each: depth d, d distinct leaf depths), where hF_β's and Jaccard's candidates number about N and their
per-leaf-depth masses are (C, E) ~ d² per row.  Each decode runs in a fresh process (the peak resident set with a
fixed mmap threshold, as in test_jaccard's caterpillar tests); the sets must equal those decoded without a budget,
and score as the dense decoder's on the completed table."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import json, sys
import numpy as np, torch
import hdecode_torch as hd
torch.set_num_threads(1)
plan, d, bsz, budget, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(",")
h = hd.Hierarchy.from_parents([-1] + list(range(d - 1)) + list(range(d)) + [d - 1])
P = torch.as_tensor(np.random.default_rng(1).dirichlet(np.full(h.num_leaves, 0.3), size=bsz))
topk = hd.TopK(*P.topk(100, dim=1))
small = hd.Hierarchy.from_parents([-1, 0, 0, 1, 1, 2, 2])
first = hd.TopK(topk.values[:1], topk.indices[:1])


def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))


def component(name, tree):
    if name == "cost_matrix":  # the tree distance as a matrix: its top-k path without the structural decoder
        return hd.get_metric("cost_matrix", tree, cost=hd.get_metric("tree_distance", tree).dense_matrix())
    if name == "risk_control":
        rc = hd.decoders.RiskControl(tree)
        rc.lam = 0.05
        return rc
    params = {"confidence_threshold": {"tau": 0.8}, "darts": {"lam": 1.0}, "information_threshold": {"threshold": 1.0}}
    if name in hd.core.topk.TOPK_METRICS:
        return hd.get_metric(name, tree)
    return hd.get_decoder(name, tree, **params.get(name, {}))


out = {}
with hd.plan_for(plan):
    for name in names:
        m = component(name, h)
        hd.set_memory_budget(budget << 20)
        component(name, small).decode(torch.full((2, 4), 0.25, dtype=torch.float64).topk(2))
        m.decode(first)  # the operators' first use and the tree's tables are not the call's memory
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident set starts again from the current one
        before = rss("VmRSS:")
        got = m.decode(topk)
        growth = (rss("VmHWM:") - before) / 1024
        res = {"growth": growth}
        if name in ("hf_beta", "jaccard"):
            hd.set_memory_budget(None)
            res["same"] = torch.equal(m.decode(topk).to_dense(), got.to_dense())
            dense = topk.completed(h.num_leaves, torch.float64)
            want = m.expected(dense, m.decode(dense))
            res["score_gap"] = float(((m.expected(dense, got.to_dense()) - want).abs() / want).max())
        out[name] = res
print(json.dumps(out))
"""


def deep_topk_decodes(plan: str, spine: int, rows: int, budget_mib: int, names) -> dict:
    """{name: {"growth": MiB, and for hF_β and Jaccard "same" (the sets without a budget) and "score_gap" (largest
    relative gap to the dense decoder's expected score)}} of top-100 decodes of ``rows`` Dirichlet rows on a
    caterpillar of ``spine`` internal nodes at a ``budget_mib`` budget, in a fresh process."""
    # A fixed mmap threshold: glibc returns every large block when it is freed, so the peak is what was held.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    res = subprocess.run([sys.executable, "-c", _SCRIPT, plan, str(spine), str(rows), str(budget_mib), ",".join(names)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("metric, bound", [("hf_beta", 32), ("jaccard", 64)])
def test_set_metrics_on_a_deep_caterpillar_within_the_budget(metric, bound, plan):
    """A 2,001-node caterpillar (1,000 leaf depths, ~1,500 hF_β candidates a row), B = 4, k = 100, a 16 MiB
    budget: on 22f3678 hF_β grew 183 MiB and Jaccard 102 MiB (CPU plan): the masses of every candidate at once
    with some 160 bytes of temporaries per (candidate, depth), both stages' (C, E) tables beside all of them, and
    Jaccard's closure of the candidates as (C, D + 1) root paths.  Now 23 / 47 MiB on both plans (Jaccard: its
    knapsacks' share of the budget beside one row's (C, E) masses)."""
    got = deep_topk_decodes(plan, 1000, 4, 16, [metric])[metric]
    assert got["same"]
    assert got["score_gap"] <= 1e-12
    assert got["growth"] < bound


HEURISTICS = ("tree_distance", "lca_height", "wu_palmer", "zhao", "hamming", "cost_matrix", "argmax_leaf", "top_down",
              "majority", "confidence_threshold", "crm", "plurality", "hie", "darts", "expected_information",
              "information_threshold", "risk_control")


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_other_top_k_decoders_on_a_deep_caterpillar_within_the_budget(plan):
    """Every other top-k decoder (metrics and heuristics) on a 1,001-node caterpillar at B = 8 and a 16 MiB
    budget: wu_palmer grew 7.4 MiB on both plans, crm 2.2, every other one under 2."""
    got = deep_topk_decodes(plan, 500, 8, 16, HEURISTICS)
    assert set(got) == set(HEURISTICS)
    growth = {name: round(r["growth"], 1) for name, r in got.items()}
    assert max(growth.values()) < 16, growth
