#!/usr/bin/env python
"""The measurement behind the CPU plan's depth rule: per-level tree sums against prefix sums.

    python -m benchmarks.plan_rules                      # tieredImageNet-H + k single-child levels, B = 1024
    python -m benchmarks.plan_rules --extra 0,96,384,768 --batch 4096 --json out.json

The CPU plan sums node probabilities and root-path sums one tree level at a time while the tree has at
most ``MAX_LEVELS`` levels, and by the GPU plan's prefix sums beyond.  This script puts a spine of
``k`` single-child nodes above the root of a bundled tree (the same leaves, ``k`` more levels) and times
``node_probabilities``, the LCA-height decoder and Zhao (structural) with each kind of tree sums, on one
CPU thread: the median wall time of ``--repeats`` calls after a warm-up call.  Both give the same
predictions (checked before timing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # `python benchmarks/plan_rules.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
import hdecode_torch.core.plan as plan  # noqa: E402
from benchmarks.measure import time_call  # noqa: E402
from benchmarks.plan_cost import deepened  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="tieredimagenet-h")
    ap.add_argument("--extra", default="0,24,96,192,384,768", help="spine lengths k, comma-separated")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = hd.load_hierarchy(args.tree)
    x = torch.softmax(torch.randn(args.batch, base.num_leaves) * 3, dim=1)
    saved = plan.MAX_LEVELS
    rows = []
    print(f"{args.tree} + k single-child levels, B = {args.batch}, {args.threads} thread(s), ms per call "
          f"(median of {args.repeats})")
    print(f"{'k':>5} {'levels':>6} | {'per-level: np':>13} {'lca':>7} {'zhao':>7} | {'prefix: np':>10} {'lca':>7} "
          f"{'zhao':>7} | prefix/per-level")
    try:
        for k in (int(v) for v in args.extra.split(",")):
            h = deepened(base, k) if k else base
            fns = {"node_probabilities": lambda p, h=h: hd.node_probabilities(h, p),
                   "lca_height": hd.get_metric("lca_height", h).decode,
                   "zhao": hd.get_metric("zhao", h, strategy="structural").decode}
            times, preds = {}, {}
            for mode, limit in (("levels", 10**9), ("prefix", 0)):
                plan.MAX_LEVELS = limit
                for name, fn in fns.items():
                    preds[mode, name] = fn(x)
                    times[mode, name] = 1e3 * time_call(lambda fn=fn: fn(x), x.device, repeats=args.repeats,
                                                         min_time=0, max_repeats=args.repeats)["median_s"]
            for name in ("lca_height", "zhao"):
                if not torch.equal(preds["levels", name], preds["prefix", name]):
                    raise SystemExit(f"k={k}: {name} differs between the two kinds of tree sums")
            ratio = sum(times["prefix", n] for n in fns) / sum(times["levels", n] for n in fns)
            row = {"extra": k, "levels": h.max_depth + 1, **{f"{m}_{n}_ms": t for (m, n), t in times.items()},
                   "prefix_over_levels": ratio}
            rows.append(row)
            print(f"{k:5d} {h.max_depth + 1:6d} | {times['levels', 'node_probabilities']:13.2f} "
                  f"{times['levels', 'lca_height']:7.2f} {times['levels', 'zhao']:7.2f} | "
                  f"{times['prefix', 'node_probabilities']:10.2f} {times['prefix', 'lca_height']:7.2f} "
                  f"{times['prefix', 'zhao']:7.2f} | {ratio:.2f}", flush=True)
    finally:
        plan.MAX_LEVELS = saved
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tree": args.tree, "batch": args.batch, "threads": args.threads, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
