"""``hdecode compare``: every metric x every decoder on one set of model outputs, in one table."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time

import torch

from ..synthetic import DEFAULT_NOISE, synthetic_outputs
from .common import (
    DEFAULT_BETAS, DEFAULT_C, DEFAULT_CALIBRATION_SPLIT, DEFAULT_METRICS, DEFAULT_SEED, MAX_SEED,
    CLIError, Progress, add_calibration_args, add_decoder_param_args, add_hierarchy_args, add_metric_params,
    add_run_args, build_heuristics, build_metrics, calibration_report, calibration_split, check_applicable,
    finite_float, fit_calibration, heuristic_names, heuristic_selection, hierarchy_description, int_in,
    json_document, load_any_hierarchy, load_probs, load_targets, resolve_device, set_threads, split_names,
)
from .evaluation import Evaluation, evaluate
from .io import STDIN, StagedWrites, check_distinct_inputs, check_output_path, require_stdout

# About 10 s on a loaded 2-core CPU (single thread); the standard error of a [0, 1] metric is then ~0.003
# and that of a paired difference between decoders usually below 0.001.
DEFAULT_NUM_SAMPLES = 20_000

SHORT_METRIC = {"accuracy": "accuracy", "lca_height": "lca_height", "tree_distance": "tree_dist",
                "tree_distance_c": "tree_dist_c", "wu_palmer": "wu_palmer", "zhao": "zhao", "hf_beta": "hF",
                "hamming": "hamming", "jaccard": "jaccard"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="score every decoder on every metric (synthetic calibrated outputs or your own)",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Score the Bayes-optimal decoder of each metric and every heuristic decoder on every metric,\n"
            "and print one table with standard errors.\n\n"
            "Without --probs: synthetic outputs on the hierarchy, calibrated by construction (the labels\n"
            "are drawn from the probabilities), so the optimal decoder of each metric must be the best of\n"
            "its column up to sampling noise.  With --probs/--targets: your model's outputs ('-' reads\n"
            "one of them from standard input: .npy/.pt bytes or a text table).\n\n"
            "Set metrics (hf_beta, hamming, jaccard) score a heuristic's node as the set of its\n"
            "ancestors.\n\n"
            "--calibrate (with --from-logits) fits a temperature on a random part of the rows and scores\n"
            "the others with logits / T: over-confident models then get better optimal decisions."),
        epilog=("examples:\n"
                "  hdecode compare\n"
                "  hdecode compare --noise 1.5 --num-samples 50000 --json results.json\n"
                "  hdecode compare --hierarchy inat19 --probs val_logits.npy --targets val_labels.npy --from-logits\n"
                "  hdecode compare --probs val_logits.npy --targets val_labels.npy --from-logits --calibrate\n"
                "  hdecode compare --metrics tree_distance,hf_beta --betas 1 --decoders argmax_leaf,majority"))
    p.set_defaults(func=run, _parser=p)
    add_hierarchy_args(p)
    src = p.add_argument_group("model outputs")
    src.add_argument("--probs", metavar="FILE", help="(B, L) probabilities (or logits with --from-logits): "
                     ".npy, .pt, .csv, .tsv or .txt; column j is leaf j of the hierarchy; '-' reads standard input")
    src.add_argument("--targets", metavar="FILE", help="(B,) true leaf ids: .npy, .pt, .csv or .txt (one per line); "
                     "'-' reads standard input")
    src.add_argument("--from-logits", action="store_true", help="--probs holds logits: apply a softmax")
    src.add_argument("--normalize", action="store_true", help="renormalize rows of --probs that do not sum to 1")
    add_calibration_args(src, decode=False)
    src.add_argument("--num-samples", type=int_in(1, 10 ** 8), default=None, metavar="B",
                     help=f"synthetic outputs: number of samples (default: {DEFAULT_NUM_SAMPLES})")
    src.add_argument("--noise", type=finite_float(0.0, lo_open=True), default=None,
                     help=f"synthetic outputs: temperature of the logit model, larger = more underdetermined "
                          f"(default: {DEFAULT_NOISE}; the argmax leaf is then right about half the time)")
    src.add_argument("--seed", type=int_in(0, MAX_SEED), default=None,
                     help=f"random seed of the synthetic outputs, or of the --calibrate split "
                          f"(default: {DEFAULT_SEED})")
    sel = p.add_argument_group("metrics and decoders")
    sel.add_argument("--metrics", "--metric", dest="metrics", nargs="+", metavar="NAME",
                     help=f"metric names, comma or space separated (default: all: {', '.join(DEFAULT_METRICS)})")
    add_metric_params(sel, multi=True)
    sel.add_argument("--decoders", "--decoder", dest="decoders", nargs="+", metavar="NAME",
                     help="heuristic decoder names, comma or space separated, or all (default: all: "
                          f"{', '.join(heuristic_names())}); the optimal decoder is always included")
    add_decoder_param_args(sel)
    run_ = p.add_argument_group("run")
    add_run_args(run_)
    run_.add_argument("--json", metavar="PATH", help="also write the results as JSON (schema_version 1: metadata "
                      "with the setting, timings and versions, apart from the results)")
    run_.add_argument("--width", type=int_in(20, 100_000), default=None,
                      help="wrap the table to this many characters (default: the terminal width; no wrapping "
                           "when the output is not a terminal)")


# --------------------------------------------------------------------------- formatting
def _decimals(se: list[float]) -> int:
    finite = [s for s in se if s is not None and math.isfinite(s) and s > 0]
    if not finite:
        return 4
    return int(min(5, max(2, math.ceil(-math.log10(max(finite))) + 1)))


def _header(metric) -> str:
    base = SHORT_METRIC.get(metric.name, metric.name)
    params = "".join(f"{v:g}" for v in metric.params.values())
    return f"{base}{params} {'↑' if metric.higher_is_better else '↓'}"


def relative_gain(metric, optimal: float, other: float) -> float:
    """Gain (%) of ``optimal`` over ``other``: positive when optimal is better, for either direction."""
    if other == 0 or not (math.isfinite(optimal) and math.isfinite(other)):
        return math.nan
    diff = optimal - other if metric.higher_is_better else other - optimal
    return 100.0 * diff / abs(other)


def render_table(ev: Evaluation, *, color: bool = False, width: int | None = None) -> str:
    """Rows = decoders, columns = metrics; '*' best of the column, '~' within 2 paired standard errors of it."""
    D = len(ev.decoders)
    bold, reset = ("\033[1m", "\033[0m") if color else ("", "")
    columns = []
    for m, metric in enumerate(ev.metrics):
        dec = _decimals([float(ev.stderr[m, d]) for d in range(D) if ev.available[m, d]])
        best = ev.best(m)
        tied = ev.tied_with_best(m)
        cells = []
        for d in range(D):
            if not ev.available[m, d]:
                cells.append(("n/a", False))
                continue
            top = d == best or abs(float(ev.mean[m, d]) - float(ev.mean[m, best])) <= 1e-12
            mark = "*" if top else ("~" if tied[d] else " ")
            cells.append((f"{float(ev.mean[m, d]):.{dec}f}±{float(ev.stderr[m, d]):.{dec}f}{mark}", top))
        gain_ok = ev.available[m, 0] and D > 1
        if gain_ok:
            others = [d for d in range(1, D)]
            sign = 1.0 if metric.higher_is_better else -1.0
            best_h = max(others, key=lambda d: sign * float(ev.mean[m, d]))
            g = relative_gain(metric, float(ev.mean[m, 0]), float(ev.mean[m, best_h]))
            gain = f"{g:+.2f}%" if math.isfinite(g) else "n/a"
        else:
            gain = "n/a"
        columns.append((_header(metric), cells, gain))
    label_w = max(len("gain of optimal vs best heuristic"), *(len(k) for k in ev.decoders))
    widths = [max(len(hdr), len(gain), *(len(c) for c, _ in cells)) for hdr, cells, gain in columns]

    # Wrap by blocks of whole metric columns, so each block still shows every decoder of a metric.
    blocks, cur, used = [], [], label_w
    for i, w in enumerate(widths):
        if cur and width and used + 2 + w > width:
            blocks.append(cur)
            cur, used = [], label_w
        cur.append(i)
        used += 2 + w
    blocks.append(cur)

    lines = []
    for bi, block in enumerate(blocks):
        if bi:
            lines.append("")
        head = "decoder".ljust(label_w) + "".join("  " + columns[i][0].rjust(widths[i]) for i in block)
        lines.append(head)
        lines.append("-" * len(head))
        for d in range(D):
            row = ev.decoders[d].ljust(label_w)
            for i in block:
                text, is_best = columns[i][1][d]
                text = text.rjust(widths[i])
                row += "  " + (f"{bold}{text}{reset}" if is_best and color else text)
            lines.append(row)
        lines.append("-" * len(head))
        lines.append("gain of optimal vs best heuristic".ljust(label_w)
                     + "".join("  " + columns[i][2].rjust(widths[i]) for i in block))
    return "\n".join(lines)


def to_json(ev: Evaluation) -> dict:
    """The results of an evaluation: means, standard errors, paired standard errors, best and gains."""
    out = {"metrics": {}, "stderr": {}, "paired_stderr": {}, "best": {}, "gain_percent": {}}
    for m, metric in enumerate(ev.metrics):
        vals = {"higher_is_better": bool(metric.higher_is_better)}
        ses = {}
        ref = 0 if ev.available[m, 0] else ev.best(m)
        paired = {"reference": ev.decoders[ref]}
        gains = {}
        for d, key in enumerate(ev.decoders):
            ok = bool(ev.available[m, d])
            vals[key] = float(ev.mean[m, d]) if ok else None
            ses[key] = float(ev.stderr[m, d]) if ok else None
            paired[key] = float(ev.paired_stderr[m, d, ref]) if ok else None
            if d and ev.available[m, 0]:
                gains[key] = relative_gain(metric, float(ev.mean[m, 0]), float(ev.mean[m, d]))
        out["metrics"][metric.key] = vals
        out["stderr"][metric.key] = ses
        out["paired_stderr"][metric.key] = paired
        out["best"][metric.key] = ev.decoders[ev.best(m)]
        if gains:
            out["gain_percent"][metric.key] = gains
    return out


# --------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    inputs = {"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
              "--leaf-order": args.leaf_order}
    check_distinct_inputs(inputs)
    if args.json is not None:
        check_output_path(args.json, "--json", inputs=inputs)
    else:
        require_stdout("no --json is given: the results would be lost")
    if args.probs is None:
        if args.targets is not None:
            raise CLIError("--targets needs --probs (without --probs, compare draws synthetic outputs)")
        for flag, given in (("--from-logits", args.from_logits), ("--normalize", args.normalize),
                            ("--calibrate", args.calibrate)):
            if given:
                raise CLIError(f"{flag} applies to --probs (without --probs, compare draws synthetic outputs, "
                               "calibrated by construction)")
    else:
        for flag, val in (("--num-samples", args.num_samples), ("--noise", args.noise)):
            if val is not None:
                raise CLIError(f"{flag} applies to synthetic outputs, not to --probs")
        if args.seed is not None and not args.calibrate:
            raise CLIError("--seed applies to synthetic outputs or to the --calibrate split, not to --probs alone")
        if args.targets is None:
            raise CLIError("--probs needs --targets (the true leaf ids) to score decoders")
        if args.calibrate and not args.from_logits:
            raise CLIError("--calibrate scales logits: add --from-logits (and pass logits as --probs)")
    if args.calibration_split is not None and not args.calibrate:
        raise CLIError("--calibration-split applies to --calibrate")

    progress = Progress("compare: loading", enabled=not args.no_progress)
    timings = {}
    calibration = None
    with progress, set_threads(args.threads):
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        names = split_names(args.metrics, "--metrics") if args.metrics is not None else DEFAULT_METRICS
        betas = list(dict.fromkeys(args.betas)) if args.betas is not None else list(DEFAULT_BETAS)
        metrics = build_metrics(h, names, betas, DEFAULT_C if args.c is None else args.c)
        heuristics = build_heuristics(h, heuristic_selection(args.decoders, "--decoders"), args.tau, args.lam,
                                      args.info_threshold)
        check_applicable(args, metrics=metrics, decoders=heuristics)
        setting = {"hierarchy": args.hierarchy, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves}
        t0 = time.perf_counter()
        if args.probs is None:
            num = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
            noise = DEFAULT_NOISE if args.noise is None else args.noise
            seed = DEFAULT_SEED if args.seed is None else args.seed
            progress.stage(f"compare: drawing {num} synthetic samples")
            probs, targets = synthetic_outputs(h, num, noise, seed, device=device)
            setting.update(source="synthetic", noise=noise, seed=seed, num_samples=num)
            source = (f"{num} synthetic calibrated samples (noise {noise:g}, seed {seed}): the labels are drawn "
                      "from the probabilities, so each metric's optimal decoder is best up to sampling noise")
        else:
            probs = load_probs(args.probs, h)
            targets = load_targets(args.targets, h, probs.shape[0])
            if probs.shape[0] == 0:
                raise CLIError(f"--probs: {args.probs!r} has no rows")
            where = "standard input" if args.probs == STDIN else args.probs
            setting.update(source="files", probs=args.probs if args.probs == STDIN else os.path.abspath(args.probs),
                           targets=args.targets if args.targets == STDIN else os.path.abspath(args.targets),
                           from_logits=bool(args.from_logits), normalize=bool(args.normalize),
                           num_samples=int(probs.shape[0]))
            source = f"{probs.shape[0]} samples from {where}" + (" (logits)" if args.from_logits else "")
            if args.calibrate:
                split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
                seed = DEFAULT_SEED if args.seed is None else args.seed
                fit_rows, other_rows = calibration_split(probs.shape[0], split, seed)
                if fit_rows.numel() == 0 or other_rows.numel() == 0:
                    raise CLIError(f"--calibration-split {split:g} of {probs.shape[0]} rows leaves no row to "
                                   f"{'fit the temperature on' if fit_rows.numel() == 0 else 'score'}")
                progress.stage("compare: fitting the temperature")
                scaler, calibration = fit_calibration(probs, targets, fit_rows, other_rows)
                with torch.no_grad():
                    probs = scaler(probs[other_rows].to(torch.float64))
                targets = targets[other_rows]
                timings["calibration_s"] = calibration["seconds"]
                setting.update(calibrate=True, calibration_split=split, seed=seed, scored_rows=int(other_rows.numel()))
                source = (f"{other_rows.numel()} held-out samples from {where} (logits / T, T = "
                          f"{calibration['temperature']:.4g} fitted on the other {fit_rows.numel()})")
            probs, targets = probs.to(device), targets.to(device)
        timings["data_s"] = round(time.perf_counter() - t0, 3)
        setting.update(device=str(device), batch_size=args.batch_size, threads=args.threads,
                       decoders={d.key: {"name": d.name, **d.params} for d in heuristics},
                       metrics={m.key: {"name": m.name, **m.params} for m in metrics})
        progress.stage("compare: decoding and scoring", total=int(probs.shape[0]))
        t0 = time.perf_counter()
        ev = evaluate(h, probs, targets, metrics, heuristics, batch_size=args.batch_size,
                      from_logits=args.from_logits, normalize=args.normalize, progress=progress)
        timings["evaluation_s"] = round(time.perf_counter() - t0, 3)
    elapsed = time.perf_counter() - start
    timings["total_s"] = round(elapsed, 3)

    tty = sys.stdout.isatty()
    width = args.width if args.width is not None else (shutil.get_terminal_size().columns if tty else None)
    color = tty and not os.environ.get("NO_COLOR")
    print(f"hierarchy: {hierarchy_description(args.hierarchy, h)}")
    print(f"data:      {source}")
    if calibration is not None:
        print(f"calibration: {calibration_report(calibration)}")
    params = [d.key for d in heuristics if d.params]
    print("decoders:  optimal = each metric's Bayes-optimal decoder, vs "
          f"{len(heuristics)} heuristic{'s' if len(heuristics) != 1 else ''}"
          + (f" ({', '.join(params)})" if params else ""))
    print()
    print(render_table(ev, color=color, width=width))
    print()
    print("value±se: mean over samples ± its standard error.  * best of the column (ties included);")
    print("~ within 2 standard errors of the best on the *paired* difference (same samples, so differences")
    print("  are measured more precisely than each ± suggests; paired standard errors are in --json).")
    print("↑ higher is better, ↓ lower is better.  gain: relative improvement of optimal over the best heuristic.")
    print(f"({elapsed:.1f} s on {device})")
    if args.json is not None:
        results = to_json(ev)
        if calibration is not None:
            results["calibration"] = {k: v for k, v in calibration.items() if k != "seconds"}
        doc = json_document("compare", {"setting": setting, "timings": timings}, results)
        with StagedWrites() as staged:
            staged.write(args.json, "--json", lambda f: json.dump(doc, f, indent=2, allow_nan=False), text=True)
    return 0
