#!/usr/bin/env python
"""Time fitting and applying a risk-controlled decoder (``hd.RiskControl``) on the CPU.

    python -m benchmarks.risk_control                       # both bundled trees, 20,000 rows, one thread
    python -m benchmarks.risk_control --tree inat19 --rows 20000 --threads 1 --json out.json
    python -m benchmarks.risk_control --chunk-bytes 19,20,21,22,23   # the fit by chunk size (2^k bytes)
    python -m benchmarks.risk_control --segments 1,8,16,32          # the fit by the prefix sums' scan segment

Calibrated synthetic outputs (``hdecode_torch.synthetic``).  Reports the median and the minimum wall time
(ms) of: ``fit`` with conformal risk control and with a confidence bound (δ = 0.1) at α = 0.1; its parts,
the input check (building the checked :class:`~hdecode_torch.Posterior`), the rows' critical values
(``loss_steps``: one gather of the children of each target's ancestors) and within them the float64
prefix sums of the leaf probabilities, and the choice of λ from the critical values (``fit_steps``: one
sort); ``decode`` of the same rows; and the walk down every row's top-down path that the other losses
take (``loss_steps`` of ``loss="overshoot"``).  Before timing, it checks that the critical values equal
the walk's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # `python benchmarks/risk_control.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
import hdecode_torch.decoders.risk_control as rcm  # noqa: E402
import hdecode_torch.kernels.top_down_path as tdp  # noqa: E402
from hdecode_torch.kernels.top_down_path import leaf_prefix  # noqa: E402
from hdecode_torch.synthetic import synthetic_outputs  # noqa: E402
from benchmarks.measure import time_call  # noqa: E402

CPU = torch.device("cpu")


def bench_tree(tree: str, rows: int, repeats: int, min_time: float = 0.5, chunk_bytes=(), segments=()) -> dict:
    h = hd.load_hierarchy(tree)
    probs, targets = synthetic_outputs(h, rows, seed=0)
    crc = hd.RiskControl(h, alpha=0.1)
    ucb = hd.RiskControl(h, alpha=0.1, delta=0.1)
    over = hd.RiskControl(h, alpha=1.0, loss="overshoot")
    steps = crc.loss_steps(probs, targets)
    post, y = crc._inputs(probs, targets, False)
    walked = crc._walk(post, y)[0]
    if not (torch.equal(steps.at, walked.at) and torch.equal(steps.jump, walked.jump)):
        raise AssertionError(f"{tree}: the critical values differ from the walk's")
    crc.fit_steps(steps)
    ucb.fit(probs, targets)
    chunk = min(rows, rcm.CPU_CHAIN_BYTES // (8 * (h.num_leaves + 1)))

    def prefix_sums():
        for a in range(0, rows, chunk):
            leaf_prefix(h, probs[a:a + chunk])

    calls = {
        "fit (conformal)": lambda: crc.fit(probs, targets),
        "fit (confidence bound)": lambda: ucb.fit(probs, targets),
        "  input check": lambda: hd.Posterior(h, probs, name="probs"),
        "  critical values": lambda: crc.loss_steps(probs, targets),
        "    prefix sums": prefix_sums,
        "  choose lambda: fit_steps": lambda: crc.fit_steps(steps),
        "decode": lambda: crc.decode(probs),
        "walk (overshoot loss_steps)": lambda: over.loss_steps(probs, targets),
    }
    saved = rcm.CPU_CHAIN_BYTES
    for k in chunk_bytes:
        def fit_at(k=k):
            rcm.CPU_CHAIN_BYTES = 2**k
            try:
                crc.fit(probs, targets)
            finally:
                rcm.CPU_CHAIN_BYTES = saved
        calls[f"fit, chunks of 2^{k} bytes"] = fit_at
    for m in segments:
        def fit_with(m=m):
            saved_m = tdp.PREFIX_SEGMENT
            tdp.PREFIX_SEGMENT = m
            try:
                crc.fit(probs, targets)
            finally:
                tdp.PREFIX_SEGMENT = saved_m
        calls[f"fit, scan segments of {m}"] = fit_with
    times = {name: time_call(fn, CPU, repeats=repeats, min_time=min_time) for name, fn in calls.items()}
    return {"tree": tree, "N": h.num_nodes, "L": h.num_leaves, "depth": h.max_depth, "rows": rows,
            "chunk_rows": chunk, "lambda": crc.lam, "lambda_ucb": ucb.lam,
            "ms": {k: {"median": 1e3 * v["median_s"], "min": 1e3 * v["min_s"]} for k, v in times.items()}}


def main(argv=None) -> list:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tree", default="tieredimagenet-h,inat19", help="comma-separated bundled trees")
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds to spend at least on each timing")
    ap.add_argument("--chunk-bytes", default="", help="comma-separated k: also time the fit with chunks of 2^k bytes")
    ap.add_argument("--segments", default="", help="comma-separated m: also time the fit with the prefix sums "
                    "scanned in segments of m entries")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = []
    for tree in args.tree.split(","):
        r = bench_tree(tree, args.rows, args.repeats, args.min_time,
                       [int(k) for k in args.chunk_bytes.split(",") if k.strip()],
                       [int(m) for m in args.segments.split(",") if m.strip()])
        results.append(r)
        print(f"{tree}: N = {r['N']}, L = {r['L']}, D = {r['depth']}, {r['rows']} rows in chunks of {r['chunk_rows']}, "
              f"threads = {args.threads}; fitted lambda {r['lambda']:.4g} (conformal), {r['lambda_ucb']:.4g} (bound)")
        for name, t in r["ms"].items():
            print(f"  {name:<28} median {t['median']:8.1f} ms   min {t['min']:8.1f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
