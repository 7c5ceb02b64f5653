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
    DEFAULT_BETAS, DEFAULT_C, DEFAULT_METRICS, CLIError, Progress, add_decoder_param_args, add_hierarchy_args,
    build_heuristics, build_metrics, heuristic_names, hierarchy_description,
    load_any_hierarchy, load_probs, load_targets, resolve_device, split_names,
)
from .evaluation import Evaluation, evaluate

# About 10 s on a loaded 2-core CPU (single thread); the standard error of a [0, 1] metric is then ~0.003
# and that of a paired difference between decoders usually below 0.001.
DEFAULT_NUM_SAMPLES = 20_000
DEFAULT_BATCH_SIZE = 1024

SHORT_METRIC = {"accuracy": "accuracy", "lca_height": "lca_height", "tree_distance": "tree_dist",
                "tree_distance_c": "tree_dist_c", "wu_palmer": "wu_palmer", "zhao": "zhao", "hf_beta": "hF",
                "hamming": "hamming", "jaccard": "jaccard"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "compare", help="score every decoder on every metric (synthetic calibrated outputs or your own)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Score the Bayes-optimal decoder of each metric and every heuristic decoder on every metric,\n"
            "and print one table with standard errors.\n\n"
            "Without --probs: synthetic outputs on the hierarchy, calibrated by construction (the labels\n"
            "are drawn from the probabilities), so the optimal decoder of each metric must be the best of\n"
            "its column up to sampling noise.  With --probs/--targets: your model's outputs.\n\n"
            "Set metrics (hf_beta, hamming, jaccard) score a heuristic's node as the set of its\n"
            "ancestors.  jaccard has no exact optimal decoder: its optimal cell is n/a."),
        epilog=("examples:\n"
                "  hdecode compare\n"
                "  hdecode compare --noise 1.5 --num-samples 50000 --json results.json\n"
                "  hdecode compare --hierarchy inat19 --probs val_logits.npy --targets val_labels.npy --from-logits\n"
                "  hdecode compare --metrics tree_distance,hf_beta --betas 1 --decoders argmax_leaf,majority"))
    add_hierarchy_args(p)
    src = p.add_argument_group("model outputs")
    src.add_argument("--probs", metavar="FILE", help="(B, L) probabilities (or logits with --from-logits): "
                     ".npy, .pt or .csv; column j is leaf j of the hierarchy")
    src.add_argument("--targets", metavar="FILE", help="(B,) true leaf ids: .npy, .pt, .csv or .txt (one per line)")
    src.add_argument("--from-logits", action="store_true", help="--probs holds logits: apply a softmax")
    src.add_argument("--normalize", action="store_true", help="renormalize rows of --probs that do not sum to 1")
    src.add_argument("--num-samples", type=int, default=None, metavar="B",
                     help=f"synthetic outputs: number of samples (default: {DEFAULT_NUM_SAMPLES})")
    src.add_argument("--noise", type=float, default=None,
                     help=f"synthetic outputs: temperature of the logit model, larger = more underdetermined "
                          f"(default: {DEFAULT_NOISE}; the argmax leaf is then right about half the time)")
    src.add_argument("--seed", type=int, default=None, help="synthetic outputs: random seed (default: 0)")
    sel = p.add_argument_group("metrics and decoders")
    sel.add_argument("--metrics", nargs="+", metavar="NAME",
                     help=f"metric names, comma or space separated (default: all: {', '.join(DEFAULT_METRICS)})")
    sel.add_argument("--betas", type=float, nargs="+", default=list(DEFAULT_BETAS),
                     help="the betas of hf_beta (default: 0.5 1 2)")
    sel.add_argument("--c", type=float, default=DEFAULT_C,
                     help=f"tree_distance_c: cost c per level of the prediction's depth (default: {DEFAULT_C})")
    sel.add_argument("--decoders", nargs="+", metavar="NAME",
                     help="heuristic decoder names, comma or space separated (default: all: "
                          f"{', '.join(heuristic_names())}); the optimal decoder is always included")
    add_decoder_param_args(sel)
    run_ = p.add_argument_group("run")
    run_.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda if available, else cpu)")
    run_.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                      help=f"samples per chunk; one Posterior per chunk is shared by all decoders (default: {DEFAULT_BATCH_SIZE})")
    run_.add_argument("--threads", type=int, default=1,
                      help="CPU threads for torch (default: 1: the kernels are many small per-level operations, "
                           "for which extra threads mostly add overhead, and thrash on a busy machine)")
    run_.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    run_.add_argument("--no-progress", action="store_true", help="no progress bar")
    run_.add_argument("--width", type=int, default=None,
                      help="wrap the table to this many characters (default: the terminal width; no wrapping "
                           "when the output is not a terminal)")
    p.set_defaults(func=run)


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


def to_json(ev: Evaluation, setting: dict) -> dict:
    def num(x):
        x = float(x)
        return x if math.isfinite(x) else None

    out = {"metrics": {}, "stderr": {}, "paired_stderr": {}, "best": {}, "gain_percent": {}, "setting": setting}
    for m, metric in enumerate(ev.metrics):
        vals = {"higher_is_better": bool(metric.higher_is_better)}
        ses = {}
        ref = 0 if ev.available[m, 0] else ev.best(m)
        paired = {"reference": ev.decoders[ref]}
        gains = {}
        for d, key in enumerate(ev.decoders):
            ok = bool(ev.available[m, d])
            vals[key] = num(ev.mean[m, d]) if ok else None
            ses[key] = num(ev.stderr[m, d]) if ok else None
            paired[key] = num(ev.paired_stderr[m, d, ref]) if ok else None
            if d and ev.available[m, 0]:
                gains[key] = num(relative_gain(metric, float(ev.mean[m, 0]), float(ev.mean[m, d])))
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
    if args.batch_size <= 0:
        raise CLIError(f"--batch-size must be positive, got {args.batch_size}")
    if args.threads <= 0:
        raise CLIError(f"--threads must be positive, got {args.threads}")
    h = load_any_hierarchy(args.hierarchy, args.leaf_order)
    device = resolve_device(args.device)
    metrics = build_metrics(h, split_names(args.metrics) or DEFAULT_METRICS, args.betas, args.c)
    heuristics = build_heuristics(h, split_names(args.decoders) or heuristic_names(), args.tau, args.lam,
                                  args.info_threshold)
    setting = {"hierarchy": args.hierarchy, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves}
    if args.probs is None:
        if args.targets is not None:
            raise CLIError("--targets needs --probs (without --probs, compare draws synthetic outputs)")
        if args.from_logits or args.normalize:
            raise CLIError("--from-logits/--normalize apply to --probs")
        num = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
        noise = DEFAULT_NOISE if args.noise is None else args.noise
        seed = 0 if args.seed is None else args.seed
        if num <= 0:
            raise CLIError(f"--num-samples must be positive, got {num}")
        if not (noise > 0 and math.isfinite(noise)):
            raise CLIError(f"--noise must be a finite number > 0, got {noise}")
        probs, targets = synthetic_outputs(h, num, noise, seed, device=device)
        setting.update(source="synthetic", noise=noise, seed=seed, num_samples=num)
        source = (f"{num} synthetic calibrated samples (noise {noise:g}, seed {seed}): the labels are drawn "
                  "from the probabilities, so each metric's optimal decoder is best up to sampling noise")
    else:
        for flag, val in (("--num-samples", args.num_samples), ("--noise", args.noise), ("--seed", args.seed)):
            if val is not None:
                raise CLIError(f"{flag} applies to synthetic outputs, not to --probs")
        if args.targets is None:
            raise CLIError("--probs needs --targets (the true leaf ids) to score decoders")
        probs = load_probs(args.probs, h)
        targets = load_targets(args.targets, h, probs.shape[0])
        if probs.shape[0] == 0:
            raise CLIError(f"--probs: {args.probs!r} has no rows")
        probs, targets = probs.to(device), targets.to(device)
        setting.update(source="files", probs=os.path.abspath(args.probs), targets=os.path.abspath(args.targets),
                       from_logits=bool(args.from_logits), normalize=bool(args.normalize),
                       num_samples=int(probs.shape[0]))
        source = f"{probs.shape[0]} samples from {args.probs}" + (" (logits)" if args.from_logits else "")
    setting.update(device=str(device), batch_size=args.batch_size,
                   decoders={d.key: {"name": d.name, **d.params} for d in heuristics},
                   metrics={m.key: {"name": m.name, **m.params} for m in metrics})

    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    progress = Progress(int(probs.shape[0]), "compare", enabled=not args.no_progress)
    try:
        ev = evaluate(h, probs, targets, metrics, heuristics, batch_size=args.batch_size,
                      from_logits=args.from_logits, normalize=args.normalize, progress=progress)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    finally:
        progress.close()
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - start
    setting["elapsed_s"] = round(elapsed, 3)

    tty = sys.stdout.isatty()
    width = args.width if args.width is not None else (shutil.get_terminal_size().columns if tty else None)
    color = tty and not os.environ.get("NO_COLOR")
    print(f"hierarchy: {hierarchy_description(args.hierarchy, h)}")
    print(f"data:      {source}")
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
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(to_json(ev, setting), f, indent=2)
        except OSError as exc:
            raise CLIError(f"--json: cannot write {args.json!r}: {exc.strerror}") from None
    return 0
