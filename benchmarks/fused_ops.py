#!/usr/bin/env python
"""Time the torch kernels of the fused ``hdecode::`` ops on the CPU against the library's own code.

    python -m benchmarks.fused_ops                       # tieredImageNet-H, B = 4096, one thread
    python -m benchmarks.fused_ops --tree inat19 --batch 4096 --threads 1 --json out.json

Reports the median and the minimum wall time (ms) of: the library's node probabilities (with and without the input
check), node probabilities as float64 gathered-prefix range sums (float64 and float32 output), the fused
deepest-node-above-1/2 decision, and the per-row input check (``row_check``); the fused structural decoders
(``path_score_best``) against the library's Zhao (structural) and LCA-height decoders; the exact hF_β
solver (``hf_beta_best_k``) on the candidates the GPU
plan packs for the same batch, and the whole hF_β decoder on both plans for scale.  The library's
decoders run with ``validate=False`` (the ops do not check their input).  The Triton kernels need a
GPU and are not timed here.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

if __package__ in (None, ""):  # `python benchmarks/fused_ops.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
import hdecode_torch.kernels.fused as F  # noqa: E402
from hdecode_torch.kernels.fused import trust_indices  # noqa: E402
from hdecode_torch.kernels.fused.row_check import unit_sum_bounds  # noqa: E402
from hdecode_torch.kernels.selection import tie_rank  # noqa: E402
from hdecode_torch.kernels.tree_sums import tree_ranges  # noqa: E402
from hdecode_torch.metrics import hf_beta as HF  # noqa: E402
from hdecode_torch.metrics.zhao import information_gain  # noqa: E402
from benchmarks.measure import time_call  # noqa: E402


def leaf_ranges(parent: np.ndarray):
    """Leaves in depth-first order (children by id) and each node's leaf range [lo, hi) in it, plus depths."""
    n = len(parent)
    children = [[] for _ in range(n)]
    for c in range(n):
        if parent[c] >= 0:
            children[parent[c]].append(c)
    depth = np.zeros(n, dtype=np.int64)
    lo, hi, leaves = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), []
    stack = [(int(np.flatnonzero(parent < 0)[0]), False)]
    while stack:
        v, leaving = stack.pop()
        if leaving:
            hi[v] = len(leaves)
            continue
        lo[v] = len(leaves)
        if not children[v]:
            leaves.append(v)
        stack.append((v, True))
        for c in reversed(children[v]):
            depth[c] = depth[v] + 1
            stack.append((c, False))
    return np.asarray(leaves), lo, hi, depth


def path_score_args(h, kind: str) -> tuple:
    """Arguments of ``F.path_score_best`` after x: the structural decoder of Zhao or of the LCA height."""
    src, _, hi, lo = tree_ranges(h, "leaves")
    euler_src, sign, at, _ = tree_ranges(h, "path")
    parent = trust_indices(h.parent_or_root, h.num_nodes - 1)
    n = h.num_nodes
    if kind == "zhao":
        zeros = torch.zeros(n, dtype=torch.float64)
        gamma = 2 / (h.information + math.log(h.num_leaves))
        return (src, hi, lo, parent, zeros, information_gain(h), euler_src, sign, at, gamma, zeros,
                torch.ones(n, dtype=torch.bool), tie_rank(h), True)
    height = h.height.to(torch.float64)
    alpha = height.index_select(0, parent)
    alpha[h.root] = 0
    return (src, hi, lo, parent, alpha, -alpha, euler_src, sign, at, torch.ones(n, dtype=torch.float64), height,
            h.is_leaf, tie_rank(h), False)


def exact_solver_inputs(h, probs, beta: float):
    """(q, count, depths, r): what the GPU plan's exact hF_β solver receives when decoding ``probs``."""
    seen = []
    original = HF.hf_beta_best_k

    def spy(q, count, depths, r):
        seen.append((q, count, depths, r))
        return original(q, count, depths, r)
    HF.hf_beta_best_k = spy
    try:
        with hd.plan_for("cuda"):
            hd.get_metric("hf_beta", h, beta=beta).decode(probs, validate=False)
    finally:
        HF.hf_beta_best_k = original
    return seen[0]


def time_ms(fn, min_time: float = 1.0, repeats: int = 7) -> tuple[float, float]:
    """(median, min) wall time in ms after one warm-up call."""
    t = time_call(fn, torch.device("cpu"), repeats=repeats, min_time=min_time, max_repeats=10**9)
    return 1e3 * t["median_s"], 1e3 * t["min_s"]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="tieredimagenet-h")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    h = hd.load_hierarchy(args.tree)
    n = h.num_nodes
    leaves, lo, hi, depth = leaf_ranges(h.parent.numpy())
    src, lo, hi = (torch.as_tensor(a) for a in (leaves, lo, hi))
    rank = torch.as_tensor(depth * n + (n - 1 - np.arange(n)))
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(args.batch, h.num_leaves, generator=g), dim=1)

    p_lib = hd.node_probabilities(h, probs, validate=False).double()
    p_op = F.gathered_prefix(probs, src, None, hi, lo, torch.float64)
    err = float((p_lib - p_op).abs().max())

    zhao = hd.get_metric("zhao", h, strategy="structural")
    lca = hd.get_metric("lca_height", h)
    zargs, largs = path_score_args(h, "zhao"), path_score_args(h, "lca_height")
    agree = {"zhao": float((F.path_score_best(probs, *zargs) == zhao.decode(probs, validate=False)).double().mean()),
             "lca_height": float((F.path_score_best(probs, *largs) == lca.decode(probs, validate=False)).double().mean())}
    q, count, depths, r = exact_solver_inputs(h, probs, 1.0)
    hf = hd.get_metric("hf_beta", h, beta=1.0)
    unit_bounds = unit_sum_bounds(1e-4)

    def gpu_plan(metric):
        def run():
            with hd.plan_for("cuda"):
                return metric.decode(probs, validate=False)
        return run

    cases = {
        "hd.node_probabilities (float32, checked)": lambda: hd.node_probabilities(h, probs),
        "hd.node_probabilities (float32, validate=False)": lambda: hd.node_probabilities(h, probs, validate=False),
        "gathered_prefix torch, float64 out": lambda: F.gathered_prefix(probs, src, None, hi, lo, torch.float64),
        "gathered_prefix torch, float32 out": lambda: F.gathered_prefix(probs, src, None, hi, lo, torch.float32),
        "best_ranked_above torch (deepest p > 1/2)": lambda: F.best_ranked_above(probs, src, hi, lo, rank, 0.5, h.root),
        "row_check torch (rows sum to 1 within 1e-4)": lambda: F.row_check(probs, *unit_bounds),
        "copy of the input (floor)": lambda: probs.clone(),
        "zhao structural decode (library, CPU plan)": lambda: zhao.decode(probs, validate=False),
        "zhao structural decode (library, GPU plan on the CPU)": gpu_plan(zhao),
        "path_score_best torch (Zhao)": lambda: F.path_score_best(probs, *zargs),
        "lca_height decode (library, CPU plan)": lambda: lca.decode(probs, validate=False),
        "lca_height decode (library, GPU plan on the CPU)": gpu_plan(lca),
        "path_score_best torch (LCA height)": lambda: F.path_score_best(probs, *largs),
        f"hf_beta_best_k torch, hF_1's candidates (C = {q.shape[1]})": lambda: F.hf_beta_best_k(q, count, depths, r),
        "hF_1 decode (library, CPU plan: certified)": lambda: hf.decode(probs, validate=False),
        "hF_1 decode (library, GPU plan on the CPU: exact)": gpu_plan(hf),
    }
    result = {"tree": args.tree, "batch": args.batch, "threads": args.threads, "N": n, "L": h.num_leaves,
              "torch": torch.__version__, "max_abs_diff_vs_library": err, "path_score_best_agreement": agree,
              "median_ms": {}, "min_ms": {}}
    print(f"{args.tree}: N = {n}, L = {h.num_leaves}, B = {args.batch}, threads = {args.threads}, "
          f"torch {torch.__version__}; max |library - op| = {err:.2e}; path_score_best = library decoders on "
          f"{agree['zhao']:.1%} (Zhao), {agree['lca_height']:.1%} (LCA height) of the rows")
    print(f"  {'':55s} {'median':>9s} {'min':>9s} (ms)")
    for name, fn in cases.items():
        med, low = time_ms(fn)
        result["median_ms"][name], result["min_ms"][name] = med, low
        print(f"  {name:55s} {med:9.3f} {low:9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
