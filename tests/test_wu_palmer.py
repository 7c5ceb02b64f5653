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


def test_auto_decodes_caterpillar_1000_in_seconds_and_as_the_other_strategies():
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
