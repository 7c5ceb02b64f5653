"""The Triton kernel of ``hdecode::jaccard_sets`` (``kernels/fused/jaccard_sets/triton.py``).

Under Triton's CPU interpreter (a subprocess with TRITON_INTERPRET=1): the GPU plan's Jaccard decoder
with the kernel in place of the op, exact against the enumeration oracle of ``test_jaccard`` on small
random trees, on the documented tie rule (mirrored subtrees with dyadic masses) and on model-like
rows of the bundled trees against the plain tree knapsack; on every call the kernel's sets equal the
torch implementation's.  Edge shapes (rows without candidates or without mass, tables wider than
one tile, fewer programs than rows) on the op itself.  And the real compiler builds it for sm_90.

Run ``python tests/test_jaccard_triton.py`` to print the interpreter checks as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from triton_testing import check_compiles_for_sm90, interpreter_results, needs_triton  # noqa: E402


def interpreter_checks() -> dict:
    """name -> {"ok": bool, "detail": ...}; run with TRITON_INTERPRET=1 set before Triton is imported."""
    import zlib

    import numpy as np
    import torch

    import hdecode_torch as hd
    import reference as ref
    import test_jaccard as TJ
    from harness import bundled, model_like
    from hdecode_torch.kernels.fused import _triton as T
    from hdecode_torch.kernels.fused.jaccard_sets import jaccard_sets_torch
    from hdecode_torch.kernels.fused.jaccard_sets import triton as JT
    from hdecode_torch.metrics import jaccard as J

    assert T.interpreted(), "set TRITON_INTERPRET=1 before importing the kernels"
    results = {}
    calls = []

    def record(name, ok, detail=None):
        results[name] = {"ok": bool(ok), "detail": None if ok else repr(detail)[:2000]}

    def kernel_in_place(*args):
        want = jaccard_sets_torch(*args)
        got = JT.launch(*args)
        calls.append(bool(torch.equal(got, want)))
        return got

    op = J.jaccard_sets
    J.jaccard_sets = kernel_in_place  # the GPU plan's decoder now runs the kernel
    try:
        # exact against enumeration: small random trees, every row kind, float64 and float32
        rng = np.random.default_rng(7)
        bad = []
        for tree, (par, info, h) in enumerate(TJ.small_trees(77, 14)):
            P = np.stack([TJ.distribution(rng, info, kind) for kind in TJ.KINDS])
            enum = ref.JaccardEnumeration(info)
            best = enum.values(P).max(0)
            for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-6)):
                sets = TJ.decode(h, P, dtype, "cuda").numpy()
                got = np.array([enum.value_of(sets[b], P[b]) for b in range(len(P))])
                if not np.all(got >= best - tol):
                    bad.append((par.tolist(), dtype, (best - got).max()))
        record("enumeration", not bad and len(calls) == 28 and all(calls), (bad, calls))

        # the tie rule: mirrored subtrees with mirrored dyadic masses
        rng = np.random.default_rng(15)
        bad, ties = [], 0
        for _ in range(24):
            par, twin = TJ.mirrored_tree(rng, int(rng.integers(2, 6)))
            info = ref.TreeInfo(par)
            h = hd.Hierarchy.from_parents(par)
            p = np.zeros(info.L)
            first = [y for y in range(info.L) if y < twin[y]]
            p[first] = rng.multinomial(8, np.full(len(first), 1 / len(first))) / 16.0
            p[twin[first]] = p[first]
            enum = ref.JaccardEnumeration(info)
            vals = enum.values(p[None])[:, 0]
            want = TJ.rule_choice(enum, vals)
            got = TJ.decode(h, p[None], torch.float64, "cuda")[0].numpy()
            ties += int((vals >= vals.max() - 1e-12).sum() > 1)
            if not np.array_equal(got, want):
                bad.append((par.tolist(), p.tolist()))
        record("tie_rule", not bad and ties >= 6 and all(calls), (bad, ties))

        # the bundled trees: model-like rows against the plain tree knapsack
        for name in ("tieredimagenet-h", "inat19"):
            h, info = bundled(name)
            slow = ref.SlowJaccard(np.asarray(h.parents_list))
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            P = np.concatenate([model_like(rng, h, 1, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
            want = np.array([slow.solve(p)[0] for p in P])
            n = len(calls)
            sets = TJ.decode(h, P, torch.float64, "cuda")
            got = hd.get_metric("jaccard", h).expected(torch.as_tensor(P), sets).numpy()
            with hd.plan_for("cpu"):
                cpu = hd.get_metric("jaccard", h).decode(torch.as_tensor(P))
            record(f"bundled/{name}", np.allclose(got, want, rtol=1e-12, atol=0) and len(calls) == n + 1
                   and all(calls) and torch.equal(sets, cpu), (got, want, calls))

        # iNat19's float32 row 17 (model_like_probs, seed 0): sizes 7 and 8 within the masses' float32 error,
        # not within float64 rounding; the kernel's tie rule takes 8 as the CPU plan does (7 on 22f3678)
        from benchmarks.baselines import Baselines
        from benchmarks.workloads import model_like_probs

        h, _ = bundled("inat19")
        t = Baselines(h.parents_list).t
        p = torch.from_numpy(model_like_probs(t.ancestors, t.depth, t.num_leaves, 18, seed=0)[17:])
        n = len(calls)
        sets = TJ.decode(h, p, torch.float32, "cuda")
        want = TJ.decode(h, p, torch.float32, "cpu")
        record("float32_tie/inat19_row17", int(sets.sum()) == 8 and torch.equal(sets, want) and len(calls) == n + 1
               and all(calls), (int(sets.sum()), calls))
    finally:
        J.jaccard_sets = op

    # a row's decision alone and beside a wider row (on afab9d5 the slack counted the batch's width)
    bad = []
    cases = TJ.batch_slack_cases()
    for alone, batch, _, best_k in cases:
        one, both = JT.launch(*alone, 1 << 24), JT.launch(*batch, 1 << 24)
        c = one.shape[1]
        ok = (torch.equal(one, jaccard_sets_torch(*alone, 1 << 24))
              and torch.equal(both, jaccard_sets_torch(*batch, 1 << 24))
              and int(one.sum()) == best_k and torch.equal(both[0, :c], one[0]) and not both[0, c:].any())
        if not ok:
            bad.append((int(one.sum()), int(both[0].sum()), best_k))
    record("batch_independence", len(cases) >= 5 and not bad, (len(cases), bad))

    # the op itself: a chain of 70 nodes (C = K = 70: three candidate tiles, two size tiles), a row
    # without candidates and a row without mass (lb above every value), 2 programs for 4 rows
    h = hd.Hierarchy.from_parents(ref.chain_tree(70))
    tabs = J._tables(h)
    n = h.num_nodes
    order = tabs.order
    c = n
    ids = order[None, :].repeat(4, 1)
    q = torch.zeros(4, c, 1, dtype=torch.float64)
    q[[0, 2, 3]] = 1.0
    count = torch.tensor([c, 0, c, c])
    lb = torch.tensor([0.5, 0.0, 2.0, 0.9], dtype=torch.float64)
    k_ref = torch.tensor([71, 1, 5, 200])
    args = (q, ids, count, lb, k_ref, tabs.pre, tabs.end, tabs.depth, tabs.dmin1, tabs.depths, tabs.max_depth,
            0.0, 1e-15)
    want = jaccard_sets_torch(*args, 1 << 20)
    got = JT.launch(*args, 2 * JT.scratch_bytes_per_program(c))
    expect = torch.zeros(4, c, dtype=torch.bool)
    expect[[0, 3]] = True
    record("edge/chain_empty_massless", torch.equal(got, want) and torch.equal(got, expect), (got.sum(1), want.sum(1)))
    return results


@pytest.mark.plan_independent
@needs_triton
def test_jaccard_kernel_under_the_interpreter():
    results = interpreter_results("test_jaccard_triton")
    assert set(results) == {"enumeration", "tie_rule", "bundled/tieredimagenet-h", "bundled/inat19",
                            "batch_independence", "edge/chain_empty_massless", "float32_tie/inat19_row17"}, results
    failed = {k: v for k, v in results.items() if not v["ok"]}
    assert not failed, failed


@pytest.mark.plan_independent
@needs_triton
def test_jaccard_kernel_compiles_for_sm90():
    check_compiles_for_sm90("""
        from hdecode_torch.kernels.fused.jaccard_sets import triton as jt
        sig = {"Q": "*fp64", "sqb": "i64", "sqc": "i64", "sqe": "i64", "IDS": "*i64", "COUNT": "*i64",
               "LB": "*fp64", "KREF": "*i64", "PRE": "*i64", "END": "*i64", "DEPTH": "*i64", "DMIN1": "*fp64",
               "W": "*fp64", "COVER": "*fp64", "OUT": "*i8", "FS": "*fp64", "IS": "*i32",
               "B": "i32", "C": "i32", "E": "i32", "SCAL": "*fp64", "CB": "constexpr", "KB": "constexpr"}
        for cb, kb in ((16, 16), (32, 64)):
            build(jt._jaccard_sets_kernel, sig, {"CB": cb, "KB": kb}, 4)
    """)


if __name__ == "__main__":
    print(json.dumps(interpreter_checks(), indent=1))


def test_gpu_check_script_runs_its_cpu_parts(tmp_path):
    """``benchmarks/jaccard_gpu_check.py`` without CUDA: the CPU plan against the GPU plan's torch
    implementation on CPU tensors, the CUDA parts reported as skipped."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks import jaccard_gpu_check as G

    path = tmp_path / "out.json"
    code = G.main(["--batch-sizes", "1,5", "--min-time", "0", "--device", "cpu", "--json", str(path)])
    data = json.loads(path.read_text())
    assert code == 0 and data["ok"] is True and len(data["results"]) == 4
    for r in data["results"]:
        assert r["cuda"].startswith("skipped") and r["gpu_plan_on_cpu_vs_cpu"] == {"rows": 0, "max_value_gap": 0.0}
        assert r["cpu_plan_ms"] > 0 and r["gpu_plan_on_cpu_ms"] > 0
