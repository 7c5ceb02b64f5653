#!/usr/bin/env python
"""What calibration buys the decoders: realised scores on synthetic models with a known miscalibration.

    python -m benchmarks.calibration                      # both bundled trees, every distortion, one thread
    python -m benchmarks.calibration --tree inat19 --distortions depth:3,none:1 --json out.json

For each distortion (``hdecode_torch.synthetic.synthetic_miscalibrated``: labels drawn from a true p*,
the model reporting a distorted q), fits on the first ``--rows`` rows and scores on the next ``--rows``:
the raw outputs, one temperature (``TemperatureScaler``), the hierarchical scaler's families
(``HierarchicalScaler``: ``depth``, T then one temperature per depth of the conditionals; ``depth_leaf``,
per depth and leaf/internal child, the default), and the oracle p* itself.  For each, the mean realised
hF_1, Wu-Palmer and Jaccard of the metric's Bayes-optimal decision, with the standard error of the
per-row difference from the temperature's (paired: the same rows), the share of the temperature's gap
to the oracle it recovers, the held-out NLL and the mean node ECE over depths 1..D
(``functional.node_calibration_error``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

if __package__ in (None, ""):  # `python benchmarks/calibration.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from hdecode_torch import functional as F  # noqa: E402
from hdecode_torch.synthetic import synthetic_miscalibrated  # noqa: E402

METRICS = {"hF_1": ("hf_beta", {"beta": 1.0}), "Wu-Palmer": ("wu_palmer", {}), "Jaccard": ("jaccard", {})}
DISTORTIONS = ("none:1", "global:2", "depth:3", "depth:0.333", "sharp_leaves:2", "flat_leaves:2")
FAMILIES = ("depth", "depth_leaf")


def evaluate(tree: str, distortion: str, strength: float, rows: int = 8000, seed: int = 1,
             families=FAMILIES) -> dict:
    """The table's cells for one tree and distortion (see the module docstring)."""
    h = hd.load_hierarchy(tree)
    z, y, p = synthetic_miscalibrated(h, 2 * rows, distortion, strength, seed=seed, dtype=torch.float64)
    fit, held = slice(0, rows), slice(rows, 2 * rows)
    logp = {"raw": torch.log_softmax(z[held], 1)}
    seconds = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a fit's warnings (e.g. near-separable rows) are not the point here
        hd.HierarchicalScaler(h, families[0]).fit(z[:50], y[:50])  # warm-up: the tree's tables, first calls
        start = time.perf_counter()
        temp = hd.TemperatureScaler().fit(z[fit], y[fit])
        seconds["temperature"] = time.perf_counter() - start
        with torch.no_grad():
            logp["temperature"] = torch.log_softmax(temp(z[held]), 1)
        for family in families:
            start = time.perf_counter()
            scaler = hd.HierarchicalScaler(h, family).fit(z[fit], y[fit])
            seconds[family] = time.perf_counter() - start
            with torch.no_grad():
                logp[family] = scaler(z[held]).detach()
    logp["oracle"] = p[held].log()
    metrics = {name: hd.get_metric(spec, h, **params) for name, (spec, params) in METRICS.items()}
    values = {}
    for method, lp in logp.items():
        probs = torch.softmax(lp, 1)  # exact row sums for the decoders' input check
        values[method] = {name: m(m.decode(probs), y[held], dtype=torch.float64) for name, m in metrics.items()}
    out = {"tree": tree, "distortion": distortion, "strength": strength, "rows": rows, "methods": {}}
    for method, lp in logp.items():
        cell = {"nll": float(-lp.gather(1, y[held][:, None]).mean()),
                "node_ece": float(F.node_calibration_error(torch.softmax(lp, 1), y[held], h)[1:].mean()),
                "fit_s": seconds.get(method)}
        for name in metrics:
            v, t, o = values[method][name], values["temperature"][name], values["oracle"][name]
            diff = v - t
            gap = float((o - t).mean())
            cell[name] = {"mean": float(v.mean()), "diff": float(diff.mean()),
                          "se": float(diff.std() / diff.numel() ** 0.5),
                          "recovered": float(diff.mean()) / gap if gap != 0 else None}
        out["methods"][method] = cell
    return out


def print_table(result: dict) -> None:
    print(f"\n{result['tree']}, {result['distortion']} (k = {result['strength']:g}), fitted on {result['rows']:,} "
          f"rows, scored on {result['rows']:,} others")
    print("| | " + " | ".join(METRICS) + " | NLL | node ECE | fit (s) |")
    print("|---|" + "---|" * (len(METRICS) + 3))
    for method, cell in result["methods"].items():
        parts = []
        for name in METRICS:
            c = cell[name]
            text = f"{c['mean']:.4f}"
            if method not in ("temperature",):
                # The share recovered means something only where the gap is well above its noise.
                gap = result["methods"]["oracle"][name]
                shown = c["recovered"] is not None and method != "oracle" and gap["diff"] > 4 * gap["se"]
                rec = f", {100 * c['recovered']:.0f}%" if shown else ""
                text += f" ({c['diff']:+.4f} ± {c['se']:.4f}{rec})"
            parts.append(text)
        fit = "" if cell["fit_s"] is None else f"{cell['fit_s']:.1f}"
        print(f"| {method} | " + " | ".join(parts) + f" | {cell['nll']:.4f} | {cell['node_ece']:.5f} | {fit} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", default="tieredimagenet-h,inat19", help="comma-separated bundled trees")
    ap.add_argument("--distortions", default=",".join(DISTORTIONS), help="name:strength, comma-separated")
    ap.add_argument("--rows", type=int, default=8000, help="rows fitted on, and as many scored on")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--families", default=",".join(FAMILIES), help="HierarchicalScaler families, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--print-json", default=None, help="print the tables of a --json file and exit")
    args = ap.parse_args(argv)
    if args.print_json:
        with open(args.print_json) as f:
            for result in json.load(f)["results"]:
                print_table(result)
        return 0
    torch.set_num_threads(args.threads)
    results = []
    for tree in args.tree.split(","):
        for spec in args.distortions.split(","):
            name, strength = spec.split(":")
            result = evaluate(tree, name, float(strength), args.rows, args.seed, tuple(args.families.split(",")))
            print_table(result)
            sys.stdout.flush()
            results.append(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": args.threads, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
