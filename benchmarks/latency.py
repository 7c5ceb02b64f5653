#!/usr/bin/env python
"""The fixed cost of a call: latency of one validated public call at small and mid batch sizes, on both
plans, and what the GPU plan's call costs a GPU (operators, host reads) on the large trees too.

    python -m benchmarks.latency                              # tieredImageNet-H, B = 1, 16, 256, 4096
    python -m benchmarks.latency --trees tiered,inat --batch-sizes 1,16 --json latency.json
    python -m benchmarks.latency --counts-only --large        # operator counts on the 100k-leaf and 1M-node trees
    python -m benchmarks.latency --trees tiered,inat --batch-sizes 1 --clock thread   # one row, on a shared machine

Latency: median wall time of ``metric.decode(p)`` (validated, probabilities in float32, one thread), each
call after warm-up calls that build the tree's cached tables, under ``hd.plan_for("cpu")`` and
``hd.plan_for("cuda")`` on CPU tensors, and the copy of the input (the floor of any call); ``optimal`` is
the sum over the ten optimal decoders (every metric's, hF_β at β = 1 and 0.5), what decoding one row with
all of them costs.  At B = 1 also the paper-style per-sample NumPy code on the same row (``benchmarks.baselines``: its
node sums per tree level, ``np``, and as the paper's own loop over the nodes, ``py``), timed the same way, and
each decoder's speed-up over both on either plan (issue 34's "≥ 10× the paper's per-sample code at B = 1").
``--clock thread`` times the calling thread's CPU time instead of wall time: on a
machine shared with other work it leaves out the time the thread waits to be scheduled.  A CPU shows most of what a GPU pays per call: Python per operator, checks, host reads.

Counts: ATen operators that launch a kernel (a fused ``hdecode::`` op counts one) and host reads of one
validated call under the GPU plan (``benchmarks.plan_cost``), at B = 1, at the batch sizes given, and with
``--large`` on the synthetic 100k-leaf tree at B = 256 and the 1M-node tree at B = 64; plus the operators
nested inside the fused ops there (torch.profiler: a loop over rows inside a fused op shows as nested
operators that grow with B), against a B = 2 call.  The decisions are checked equal on both plans first.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/latency.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from benchmarks.baselines import Baselines, expected_score  # noqa: E402
from benchmarks.plan_cost import cost_of  # noqa: E402
from benchmarks.workloads import TREE_ALIASES, load_tree  # noqa: E402

__all__ = ["DECODERS", "latency", "baseline_latency", "counts", "nested_ops", "main"]

#: What is timed: (label, metric name, parameters).  node_probabilities is timed through hd.node_probabilities.
DECODERS = [("node_probabilities", None, {}), ("accuracy", "accuracy", {}), ("tree_distance", "tree_distance", {}),
            ("tree_distance_c", "tree_distance_c", {}), ("lca_height", "lca_height", {}),
            ("wu_palmer", "wu_palmer", {}), ("zhao", "zhao", {}), ("hamming", "hamming", {}),
            ("hf_beta", "hf_beta", {"beta": 1.0}), ("hf_0.5", "hf_beta", {"beta": 0.5}), ("jaccard", "jaccard", {})]

#: The clocks ``--clock`` chooses from: wall time, or the calling thread's CPU time.
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}


def _call(h, name, params):
    if name is None:
        return lambda p: hd.node_probabilities(h, p)
    return hd.get_metric(name, h, **params).decode


def _probs(h, batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, h.num_leaves, generator=g) * 2.5
    logits[torch.arange(batch), torch.randint(0, h.num_leaves, (batch,), generator=g)] += 5
    return torch.softmax(logits.double(), 1).float()


def _median_us(fn, min_time: float, max_calls: int = 2000, clock=time.perf_counter) -> float:
    for _ in range(5):
        fn()
    times, spent = [], 0.0
    while (spent < min_time or len(times) < 7) and len(times) < max_calls:
        t = clock()
        fn()
        d = clock() - t
        times.append(d)
        spent += d
    return 1e6 * statistics.median(times)


def latency(h, batch: int, plan: str, min_time: float, clock: str = "wall") -> dict:
    """{label: µs per validated call} of every decoder under ``plan``, ``optimal`` their sum over the
    optimal decoders (node_probabilities left out) and ``copy`` the input's copy."""
    p = _probs(h, batch)
    tick = CLOCKS[clock]
    out = {}
    with hd.plan_for(plan):
        for label, name, params in DECODERS:
            fn = _call(h, name, params)
            out[label] = _median_us(lambda: fn(p), min_time, clock=tick)
    out["optimal"] = sum(out[label] for label, name, _ in DECODERS if name is not None)
    out["copy"] = _median_us(lambda: p.clone(), min_time, clock=tick)
    return out


def baseline_latency(h, min_time: float, clock: str = "wall") -> dict:
    """{"np": {label: µs}, "py": {label: µs}}: the per-sample NumPy baselines on the row :func:`latency` decodes at
    B = 1 (float64, as the baselines take it), node sums per level (``np``) and by the paper's loop over the nodes
    (``py``); a decoder without a baseline (accuracy) is left out.  Each baseline's answer is checked against the
    library's (the same node or set, or an equal expected score) before it is timed."""
    row = _probs(h, 1)
    pl = row[0].double().numpy()
    tick = CLOCKS[clock]
    bl = Baselines(h.parents_list)
    out: dict = {"np": {}, "py": {}}
    for key, base in (("np", bl), ("py", bl.with_traversal("python"))):
        for label, name, params in DECODERS:
            if name is None:
                fn = base.node_probs
            else:
                m = hd.get_metric(name, h, **params)
                try:
                    accepted = inspect.signature(base.decoder(name)).parameters
                except ValueError:  # no per-sample baseline (accuracy's is the argmax)
                    continue
                # the metric's own settings (tree_distance_c's c: the baseline's default differs)
                kw = {q.name: getattr(m, q.name) for q in type(m).PARAMS if q.name in accepted}
                fn = base.decoder(name, **kw)
                ours = m.decode(row)[0].numpy()
                a, b = (expected_score(bl.t, name, pred, pl, **kw) for pred in (ours, fn(pl)))
                if abs(a - b) > 1e-6 * max(abs(a), abs(b), 1e-12):
                    raise SystemExit(f"{label}: the per-sample baseline's answer differs in expected value "
                                     f"({b} against the library's {a})")
            out[key][label] = _median_us(lambda: fn(pl), min_time, clock=tick)
    return out


def counts(h, batch: int) -> dict:
    """{label: (operators, host reads)} of one validated call under the GPU plan."""
    p = _probs(h, batch)
    out = {}
    for label, name, params in DECODERS:
        c = cost_of(_call(h, name, params), p, "cuda")
        out[label] = (c.ops, c.reads)
    return out


def nested_ops(h, batch: int) -> dict:
    """{label: ATen operators of one GPU-plan call as torch.profiler sees them}, nested ones included."""
    from torch.profiler import ProfilerActivity, profile

    p = _probs(h, batch)
    out = {}
    with hd.plan_for("cuda"):
        for label, name, params in DECODERS:
            fn = _call(h, name, params)
            fn(p)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn(p)
            out[label] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    return out


def _check_plans(h, batch: int) -> None:
    p = _probs(h, batch, seed=1)
    for label, name, params in DECODERS:
        if name is None:
            continue
        m = hd.get_metric(name, h, **params)
        with hd.plan_for("cpu"):
            a = m.decode(p)
        with hd.plan_for("cuda"):
            b = m.decode(p)
        ea, eb = m.expected(p, a), m.expected(p, b)
        if not torch.allclose(ea, eb, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{label}: the plans' decisions differ in expected value on {h!r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default="tiered", help=f"comma-separated ({', '.join(TREE_ALIASES)})")
    ap.add_argument("--batch-sizes", default="1,16,256,4096")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    ap.add_argument("--counts-only", action="store_true", help="operator and host-read counts only")
    ap.add_argument("--large", action="store_true", help="also count on the 100k-leaf (B = 256) and 1M-node (B = 64) trees")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall time, or the thread's CPU time (a shared machine)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    report = {"date": time.strftime("%Y-%m-%d"), "threads": args.threads, "clock": args.clock,
              "torch": torch.__version__, "trees": {}}
    for tree in args.trees.split(","):
        h, _ = load_tree(tree)
        _check_plans(h, 64)
        entry = report["trees"][tree] = {"counts": {b: counts(h, b) for b in sorted({1, *sizes})}}
        print(f"\n{tree}: N = {h.num_nodes}, L = {h.num_leaves}, depth {h.max_depth}")
        print("  GPU-plan cost of one validated call, operators (host reads):")
        labels = [d[0] for d in DECODERS]
        print("  " + f"{'B':>6} " + " ".join(f"{lab[:12]:>12}" for lab in labels))
        for b, c in entry["counts"].items():
            print("  " + f"{b:6d} " + " ".join(f"{f'{c[lab][0]} ({c[lab][1]})':>12}" for lab in labels))
        if args.counts_only:
            continue
        entry["latency_us"] = {}
        for plan in ("cpu", "cuda"):
            for b in sizes:
                entry["latency_us"][f"{plan}/{b}"] = latency(h, b, plan, args.min_time, args.clock)
        print(f"  µs per validated call, {args.threads} thread(s) (median, {args.clock} clock):")
        shown = labels + ["optimal", "copy"]
        print("  " + f"{'plan':>5} {'B':>6} " + " ".join(f"{lab[:12]:>12}" for lab in shown))
        for key, lat in entry["latency_us"].items():
            plan, b = key.split("/")
            print("  " + f"{plan:>5} {int(b):6d} " + " ".join(f"{lat[lab]:12.0f}" for lab in shown))
        if 1 in sizes:
            base = entry["baseline_us"] = baseline_latency(h, args.min_time, args.clock)
            print("  the paper-style per-sample NumPy code on the same row (µs; np: node sums per level, py: the "
                  "paper's loop over the nodes), and each plan's speed-up over it at B = 1:")
            for key in ("np", "py"):
                print("  " + f"{key:>5} {1:6d} " + " ".join(
                    f"{base[key][lab]:12.0f}" if lab in base[key] else f"{'-':>12}" for lab in labels))
            for plan in ("cpu", "cuda"):
                lat = entry["latency_us"][f"{plan}/1"]
                for key in ("np", "py"):
                    print("  " + f"{f'{plan}÷{key}':>12} " + " ".join(
                        f"{base[key][lab] / lat[lab]:11.1f}×" if lab in base[key] else f"{'-':>12}"
                        for lab in labels))
    if args.large:
        for tree, batch in (("100k", 256), ("1m", 64)):
            h, _ = load_tree(tree)
            c = counts(h, batch)
            nested, nested2 = nested_ops(h, batch), nested_ops(h, 2)
            report["trees"][tree] = {"batch": batch, "counts": c, "nested_ops": nested, "nested_ops_b2": nested2}
            print(f"\n{tree}: N = {h.num_nodes}, L = {h.num_leaves}, B = {batch}: GPU-plan operators (host reads); "
                  "operators nested in fused ops, this B vs B = 2")
            for label, _, _ in DECODERS:
                print(f"  {label:20s} {c[label][0]:5d} ({c[label][1]})   nested {nested[label]:6d} vs {nested2[label]:6d}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
