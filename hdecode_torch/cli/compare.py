"""``hdecode compare``: every metric x every decoder on one set of model outputs, in one table."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
import textwrap
import time

import torch

from ..core.spec import OPTIMAL
from ..core.spec import label as canonical_label
from ..core.topk import TopK
from ..synthetic import synthetic_outputs
from .common import (
    DEFAULT_CALIBRATION_SPLIT, DEFAULT_METRICS, DEFAULT_SEED, CLIError, Progress,
    build_heuristics, build_metrics, calibration_check, calibration_label, calibration_report, calibration_split,
    check_applicable, fit_calibration,
    fit_risk_control, held_out_split, heuristic_selection, hierarchy_description, json_document, load_any_hierarchy,
    load_probs, load_targets, resolve_device, set_threads, split_names, import_modules,
)
from .evaluation import Evaluation, evaluate, has_optimal, rows_probabilities, topk_rows
from .io import STDIN, StagedWrites, one_line
from .options import DEFAULT_NUM_SAMPLES, DEFAULT_TABLE_WIDTH, SYNTHETIC_NOISE

GAIN_LABEL = "gain of optimal vs best heuristic"
HEADER_MIN_WIDTH = 16  # a column header this long is never broken


# --------------------------------------------------------------------------- formatting
def _decimals(se: list[float]) -> int:
    finite = [s for s in se if s is not None and math.isfinite(s) and s > 0]
    if not finite:
        return 4
    return int(min(5, max(2, math.ceil(-math.log10(max(finite))) + 1)))


def metric_label(metric) -> str:
    """The metric's key (as in --json) and whether higher (↑) or lower (↓) is better."""
    return f"{metric.key} {'↑' if metric.higher_is_better else '↓'}"


def relative_gain(metric, optimal: float, other: float) -> float:
    """Gain (%) of ``optimal`` over ``other``: positive when optimal is better, for either direction."""
    if other == 0 or not (math.isfinite(optimal) and math.isfinite(other)):
        return math.nan
    diff = optimal - other if metric.higher_is_better else other - optimal
    return 100.0 * diff / abs(other)


def metric_cells(ev: Evaluation, m: int) -> tuple[list[tuple[str, bool]], str]:
    """The cells of metric ``m`` for every decoder, ``(text, is_best)`` with ``value±se`` and a mark
    (``*`` best, ``~`` within 2 paired standard errors of the best), and the gain of optimal over the
    best heuristic (``+0.73%``, or ``n/a``)."""
    D = len(ev.decoders)
    metric = ev.metrics[m]
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
    gain = "n/a"
    if ev.available[m, 0] and D > 1:
        sign = 1.0 if metric.higher_is_better else -1.0
        best_h = max(range(1, D), key=lambda d: sign * float(ev.mean[m, d]))
        g = relative_gain(metric, float(ev.mean[m, 0]), float(ev.mean[m, best_h]))
        gain = f"{g:+.2f}%" if math.isfinite(g) else "n/a"
    return cells, gain


def _header_lines(header: str, width: int) -> list[str]:
    """A column header on as few lines as keep the column as narrow as its values (``width``), broken
    only before a ``[`` or after a ``_``, so that the lines read in order are the name itself
    (``confidence_`` / ``threshold`` / ``[tau=0.8]``).  A header a little wider than the values
    (``tree_distance ↓``) stays whole."""
    width = max(width, HEADER_MIN_WIDTH)
    if len(header) <= width:
        return [header]
    pieces = [p for p in re.split(r"(?<=_)|(?=\[)", header) if p]
    lines = [""]
    for piece in pieces:
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    return lines


def _blocks(widths: list[int], room: int) -> list[list[int]]:
    """Columns in consecutive blocks each at most ``room`` wide (a column wider than ``room`` alone):
    as few blocks as possible, and of those the split whose widest block is narrowest, so that the
    last block is not left with a single column."""
    n = len(widths)
    count, used = 1, 0
    for w in widths:  # the fewest blocks: greedy
        if used and used + w > room:
            count, used = count + 1, 0
        used += w
    # best[k][i]: the narrowest widest block splitting columns i.. into k blocks (linear partition).
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[n] * (n + 1) for _ in range(count + 1)]
    best[0][n] = 0
    for k in range(1, count + 1):
        for i in range(n - 1, -1, -1):
            total = 0
            for j in range(i + 1, n + 1):
                total += widths[j - 1]
                if total > room and j > i + 1:
                    break
                cand = max(total, best[k - 1][j])
                if cand <= best[k][i]:  # ties: the earlier blocks fuller
                    best[k][i], cut[k][i] = cand, j
    out, i = [], 0
    for k in range(count, 0, -1):
        out.append(list(range(i, cut[k][i])))
        i = cut[k][i]
    return [b for b in out if b]


def render_grid(corner: str, labels: list[str], columns: list[tuple[str, list[tuple[str, bool]]]], *,
                footer: tuple[str, list[str]] | None = None, width: int | None = None, color: bool = False) -> str:
    """A table of ``labels`` (rows) by ``columns`` (``(header, [(cell, bold), ...])``), values right-aligned,
    an optional ``footer`` row (``(label, [text per column])``) under a rule; wrapped into blocks of
    whole columns, each repeating the row labels, so that no line is wider than ``width``."""
    bold, reset = ("\033[1m", "\033[0m") if color else ("", "")
    label_w = max(len(corner), *(len(x) for x in labels), len(footer[0]) if footer else 0)
    value_w = [max([len(c) for c, _ in cells] + ([len(footer[1][i])] if footer else [])) for i, (_, cells)
               in enumerate(columns)]
    heads = [_header_lines(h, value_w[i]) for i, (h, _) in enumerate(columns)]
    col_w = [max(value_w[i], *(len(x) for x in heads[i])) for i in range(len(columns))]
    room = (width - label_w) if width else sum(w + 2 for w in col_w)
    lines = []
    for bi, block in enumerate(_blocks([w + 2 for w in col_w], room)):
        if bi:
            lines.append("")
        depth = max(len(heads[i]) for i in block)
        for k in range(depth):
            left = corner if k == depth - 1 else ""
            parts = [(([""] * (depth - len(heads[i])) + heads[i])[k]).rjust(col_w[i]) for i in block]
            lines.append((left.ljust(label_w) + "".join("  " + x for x in parts)).rstrip())
        rule = "-" * (label_w + sum(col_w[i] + 2 for i in block))
        lines.append(rule)
        for r, label in enumerate(labels):
            row = label.ljust(label_w)
            for i in block:
                text, is_best = columns[i][1][r]
                text = text.rjust(col_w[i])
                row += "  " + (f"{bold}{text}{reset}" if is_best and color else text)
            lines.append(row.rstrip())
        if footer:
            lines.append(rule)
            lines.append(footer[0].ljust(label_w) + "".join("  " + footer[1][i].rjust(col_w[i]) for i in block))
    return "\n".join(lines)


def render_table(ev: Evaluation, *, color: bool = False, width: int | None = None, transpose: bool = False) -> str:
    """A row per metric (its --json key and ↑/↓), a column per decoder (``optimal`` first, then the
    gain of optimal over the best heuristic, then each heuristic); ``transpose``: a row per decoder,
    a column per metric, the gains in the last row.  '*' marks the best decoder of a metric, '~' one
    within 2 paired standard errors of it.  Wrapped to ``width`` characters."""
    per_metric = [metric_cells(ev, m) for m in range(len(ev.metrics))]
    if transpose:
        columns = [(metric_label(metric), cells) for metric, (cells, _) in zip(ev.metrics, per_metric)]
        return render_grid("decoder", list(ev.decoders), columns,
                           footer=(GAIN_LABEL, [gain for _, gain in per_metric]), width=width, color=color)
    labels = [metric_label(metric) for metric in ev.metrics]
    columns = [(key, [cells[d] for cells, _ in per_metric]) for d, key in enumerate(ev.decoders)]
    columns.insert(1, ("gain", [(gain, False) for _, gain in per_metric]))
    return render_grid("metric", labels, columns, width=width, color=color)


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


COVERAGE_LEGEND = ("miss rate: how often the target is not under the answer (a node set: some node of it is not an "
                   "ancestor of the target), ± its standard error; mean depth: of the answers (a node set: its nodes "
                   "below the root). M/optimal is metric M's Bayes-optimal decoder.")


def render_coverage(cov, *, width: int | None = None) -> str:
    """A row per decoder (risk control first, then each metric's optimal decoder and each heuristic), its miss
    rate and the mean depth of its answers, each ± its standard error."""
    columns = []
    for header, mean, se in (("miss rate", cov.miss, cov.miss_stderr), ("mean depth", cov.depth, cov.depth_stderr)):
        dec = _decimals(se.tolist())
        columns.append((header, [(f"{float(m):.{dec}f}±{float(e):.{dec}f}", False) for m, e in zip(mean, se)]))
    return render_grid("decoder", list(cov.decoders), columns, width=width)


def coverage_json(cov) -> dict:
    """``{"miss_rate": {decoder: value}, "miss_rate_stderr": ..., "mean_depth": ..., "mean_depth_stderr": ...}``."""
    return {name: dict(zip(cov.decoders, values.tolist())) for name, values in
            (("miss_rate", cov.miss), ("miss_rate_stderr", cov.miss_stderr), ("mean_depth", cov.depth),
             ("mean_depth_stderr", cov.depth_stderr))}


def check_report(check: dict, from_logits) -> str:
    """What the calibration check of the scored rows says, and what to do about it."""
    depths = check["miscalibrated_depths"]
    if not depths:
        return (f"the node probabilities of the {check['rows']} rows look calibrated: at every depth, the node ECE "
                "is within what labels drawn from the probabilities themselves show (the noise floor)")
    fix = ("rerun with --calibrate hierarchical (or --calibrate auto) to fit a calibration on part of the rows"
           if from_logits is True else
           "pass the logits (or the log of the probabilities) with --from-logits --calibrate hierarchical to fit a "
           "calibration on part of the rows")
    return (f"the node probabilities are miscalibrated beyond sampling noise at depth "
            f"{', '.join(str(d) for d in depths)} (node ECE above its noise floor, below). The optimal decoders "
            f"are optimal for calibrated probabilities: {fix}")


def render_node_ece(calibration: dict | None, check: dict | None, width: int | None) -> str:
    """The node ECE per depth 1..D as a table: raw and calibrated with the calibrated rows' noise floor
    (``calibration``), or the scored rows' ECE and noise floor (``check``); '!' marks a depth above it."""
    if calibration is not None:
        ece = calibration["node_ece"]
        where = f"{ece['rows']} rows"
        rows = [("raw", ece["before"], None), ("calibrated", ece["after"], ece["miscalibrated_depths"]),
                ("noise floor", ece["noise_floor"], None)]
    elif check is not None:
        where = "scored rows"
        rows = [("node ECE", check["ece"], check["miscalibrated_depths"]), ("noise floor", check["noise_floor"], None)]
    else:
        return ""
    depths = range(1, len(rows[0][1]))
    if not depths:
        return ""
    columns = [(f"depth {d}", [(f"{values[d]:.4f}{'!' if flagged is not None and d in flagged else ' '}", False)
                               for _, values, flagged in rows]) for d in depths]
    legend = ("node ECE of p(n) over the nodes of each depth (15 bins); noise floor: the largest ECE of 200 label "
              "sets drawn from the probabilities themselves, what calibrated probabilities show by chance; ! above it")
    table = render_grid(f"node ECE ({where})", [label for label, _, _ in rows], columns, width=width)
    return table + "\n" + textwrap.fill(legend, width or DEFAULT_TABLE_WIDTH, break_on_hyphens=False)


# --------------------------------------------------------------------------- top-k lists
NO_TOPK = "does not decode top-k lists"


def not_applicable_line(na: dict) -> str:
    """What ``topk_applicable`` left out, in one paragraph: the names that take no top-k list, then any other
    reason by name."""
    plain = [key for key, why in na.items() if why == NO_TOPK]
    other = [f"{key} ({why})" for key, why in na.items() if why != NO_TOPK]
    parts = ([f"{', '.join(plain)} (no decoder of top-k lists: left out)"] if plain
             else []) + other
    return "; ".join(parts)


def check_topk_options(args) -> None:
    """The options that need every leaf's probability, refused for a --probs of top-k lists (``compare``'s, and
    ``plot risk``'s, which has no --calibrate)."""
    for flag, given, why in (
            ("--from-logits", args.from_logits is not False, "the missing mass of a top-k of logits is unknown (the "
             "softmax needs every logit); save the top-k of the probabilities"),
            ("--normalize", bool(args.normalize), "the mass its values leave is the unlisted leaves'"),
            ("--calibrate", bool(getattr(args, "calibrate", None)), "a calibration is fitted on every logit")):
        if given:
            raise CLIError(f"{flag}: --probs holds top-k lists; {why}")


def topk_at(topk: TopK, rows: torch.Tensor) -> TopK:
    """The lists of ``rows`` (b,) int64, in that order."""
    return TopK(topk.values[rows], topk.indices[rows])


def topk_applicable(metrics: list, heuristics: list, topk: TopK):
    """``(metrics, heuristics, not_applicable)``: what runs on top-k lists, and ``{key: reason}`` for what
    does not.  A heuristic runs where it decodes the list's first row (its ``accepts_topk``, and what its
    parameters allow, e.g. ``confidence_threshold`` below 1/2 does not); a metric's row is kept where its
    optimal decoder takes top-k lists (``accepts_topk``) or some heuristic runs (the metric scores its
    nodes), its optimal column then n/a.  The reason of a metric or heuristic left out is ``NO_TOPK``
    unless the decoder gave another."""
    na = {}
    first = topk_rows(topk, 0, 1)
    kept_heuristics = []
    for d in heuristics:
        key = canonical_label(decoder=d)
        if not getattr(d, "accepts_topk", False):
            na[key] = NO_TOPK
            continue
        try:
            d.decode(first)
        except ValueError as exc:  # the decoder's reason, e.g. a parameter its top-k rule does not cover
            na[key] = one_line(exc)
            continue
        kept_heuristics.append(d)
    kept_metrics = []
    for m in metrics:
        optimal = has_optimal(m) and m.accepts_topk
        if optimal or kept_heuristics:
            kept_metrics.append(m)
            if not optimal:  # its row holds the heuristics' values, its optimal column n/a
                na[canonical_label(m, OPTIMAL)] = NO_TOPK
        else:
            na[m.key] = NO_TOPK
    return kept_metrics, kept_heuristics, na


# --------------------------------------------------------------------------- run
def run(args: argparse.Namespace, progress: Progress) -> int:
    """The command line was checked by ``commands.check_compare``."""
    start = time.perf_counter()
    timings = {}
    calibration = check = None
    with set_threads(args.threads):
        progress.stage("compare: loading the hierarchy")
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        import_modules(args.imports)
        names = split_names(args.metrics, "--metrics") if args.metrics is not None else DEFAULT_METRICS
        metrics = build_metrics(h, names, args)
        heuristics = build_heuristics(h, heuristic_selection(args.decoders, "--decoders"), args)
        check_applicable(args, metrics=metrics, decoders=heuristics)
        setting = {"hierarchy": args.hierarchy, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves}
        t0 = time.perf_counter()
        split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
        seed = DEFAULT_SEED if args.seed is None else args.seed
        rc = risk = None
        not_applicable = None
        if args.probs is None:
            num = DEFAULT_NUM_SAMPLES if args.num_samples is None else args.num_samples
            noise = SYNTHETIC_NOISE if args.noise is None else args.noise
            progress.stage(f"compare: drawing {num} synthetic samples")
            probs, targets = synthetic_outputs(h, num, noise, seed, device=device)
            setting.update(source="synthetic", noise=noise, seed=seed, num_samples=num)
            source = (f"{num} synthetic calibrated samples (noise {noise:g}, seed {seed}): the labels are drawn "
                      "from the probabilities, so each metric's optimal decoder is best up to sampling noise")
            if args.alpha is not None:
                lam_rows, other_rows = held_out_split(num, split, seed, "fit λ on")
                progress.stage("compare: fitting risk control")
                rc, risk = fit_risk_control(h, probs[lam_rows], targets[lam_rows], args.alpha, args.delta,
                                            f"--calibration-split {split:g} of {num} rows")
                probs, targets = probs[other_rows], targets[other_rows]
                setting.update(calibration_split=split, scored_rows=int(other_rows.numel()))
                source = (f"{other_rows.numel()} of {num} synthetic calibrated samples (noise {noise:g}, seed "
                          f"{seed}; the other {lam_rows.numel()} fit risk control): the labels are drawn from the "
                          "probabilities, so each metric's optimal decoder is best up to sampling noise")
        else:
            progress.stage("compare: reading the model outputs")
            probs = load_probs(args.probs, h, top_k=True)
        if isinstance(probs, TopK):
            check_topk_options(args)
            num = int(probs.values.shape[0])
            targets = load_targets(args.targets, h, num)
            if num == 0:
                raise CLIError(f"--probs: {args.probs!r} has no rows")
            metrics, heuristics, not_applicable = topk_applicable(metrics, heuristics, probs)
            if not metrics:
                raise CLIError(f"--probs holds top-k lists, which none of the selected metrics' optimal decoders "
                               f"nor heuristics decode: {not_applicable_line(not_applicable)}")
            where = "standard input" if args.probs == STDIN else args.probs
            setting.update(source="files", input="top-k lists", k=probs.k,
                           probs=args.probs if args.probs == STDIN else os.path.abspath(args.probs),
                           targets=args.targets if args.targets == STDIN else os.path.abspath(args.targets),
                           num_samples=num)
            source = f"{num} top-{probs.k} lists from {where} (the missing mass spread over the unlisted leaves)"
            probs = TopK(probs.values.to(device), probs.indices.to(device))
            targets = targets.to(device)
            if args.alpha is not None:  # the dense path's split and fit, on the lists' completed distribution
                lam_rows, other_rows = held_out_split(num, split, seed, "fit λ on")
                lam_rows, other_rows = lam_rows.to(device), other_rows.to(device)
                progress.stage("compare: fitting risk control")
                rc, risk = fit_risk_control(h, topk_at(probs, lam_rows), targets[lam_rows], args.alpha, args.delta,
                                            f"--calibration-split {split:g} of {num} rows")
                probs, targets = topk_at(probs, other_rows), targets[other_rows]
                setting.update(calibration_split=split, seed=seed, scored_rows=int(other_rows.numel()))
                source = (f"{other_rows.numel()} held-out top-{probs.k} lists from {where} (the missing mass spread "
                          f"over the unlisted leaves; risk control fitted on {lam_rows.numel()} other rows)")
        elif args.probs is not None:
            targets = load_targets(args.targets, h, probs.shape[0])
            if probs.shape[0] == 0:
                raise CLIError(f"--probs: {args.probs!r} has no rows")
            where = "standard input" if args.probs == STDIN else args.probs
            num = int(probs.shape[0])
            setting.update(source="files", probs=args.probs if args.probs == STDIN else os.path.abspath(args.probs),
                           targets=args.targets if args.targets == STDIN else os.path.abspath(args.targets),
                           from_logits=args.from_logits, normalize=bool(args.normalize), num_samples=num)
            kind = {True: " (logits)", "auto": " (probabilities or logits, decided per chunk)"}.get(args.from_logits, "")
            source = f"{num} samples from {where}{kind}"
            if args.calibrate or args.alpha is not None:
                what = "fit the calibration on" if args.calibrate else "fit λ on"
                fit_rows, other_rows = held_out_split(num, split, seed, what)
                t_rows = lam_rows = fit_rows
                if args.calibrate and args.alpha is not None:  # T and λ each on half of the held-out rows
                    if fit_rows.numel() < 2:
                        raise CLIError(f"--calibrate with --alpha fits the calibration and λ on half each of the "
                                       f"--calibration-split {split:g} of {num} rows, but it holds "
                                       f"{fit_rows.numel()} row")
                    t_pick, lam_pick = calibration_split(fit_rows.numel(), 0.5, seed)
                    t_rows, lam_rows = fit_rows[t_pick], fit_rows[lam_pick]
                scaler = None
                if args.calibrate:
                    progress.stage(f"compare: fitting the calibration ({args.calibrate})")
                    scaler, calibration = fit_calibration(h, probs, targets, t_rows, other_rows, args.calibrate)
                    timings["calibration_s"] = calibration["seconds"]
                    setting.update(calibrate=args.calibrate)
                    if scaler is not None:
                        with torch.no_grad():
                            probs = scaler(probs.to(torch.float64))  # calibrated logits (or log-probabilities)
                if args.alpha is not None:
                    progress.stage("compare: fitting risk control")
                    cal = rows_probabilities(h, probs, lam_rows, from_logits=args.from_logits,
                                             normalize=args.normalize)
                    part = "half of " if args.calibrate else ""
                    rc, risk = fit_risk_control(h, cal, targets[lam_rows], args.alpha, args.delta,
                                                f"{part}--calibration-split {split:g} of {num} rows")
                probs, targets = probs[other_rows], targets[other_rows]
                setting.update(calibration_split=split, seed=seed, scored_rows=int(other_rows.numel()))
                held = []
                if args.calibrate:
                    verb = "checked" if calibration.get("applied") == "none" else "fitted"
                    held.append(f"{calibration_label(calibration)} {verb} on {t_rows.numel()}")
                if rc is not None:
                    held.append(f"risk control fitted on {lam_rows.numel()}")
                source = f"{other_rows.numel()} held-out samples from {where}{kind} ({'; '.join(held)} other rows)"
            probs, targets = probs.to(device), targets.to(device)
            if not args.calibrate:
                progress.stage("compare: checking the calibration")
                check = calibration_check(h, probs, targets, args.from_logits, args.normalize)
        if risk is not None:
            timings["risk_control_s"] = risk.pop("seconds")
            setting.update(alpha=args.alpha, delta=args.delta)
        timings["data_s"] = round(time.perf_counter() - t0, 3)
        setting.update(device=str(device), batch_size=args.batch_size, threads=args.threads,
                       decoders={d.key: {"name": d.name, **d.params} for d in heuristics},
                       metrics={m.key: {"name": m.name, **m.params} for m in metrics})
        progress.stage("compare: decoding and scoring", total=num if isinstance(probs, TopK) else int(probs.shape[0]))
        t0 = time.perf_counter()
        ev = evaluate(h, probs, targets, metrics, heuristics, batch_size=args.batch_size,
                      from_logits=args.from_logits, normalize=args.normalize, progress=progress,
                      coverage=None if rc is None else [rc])
        timings["evaluation_s"] = round(time.perf_counter() - t0, 3)
    progress.close()
    elapsed = time.perf_counter() - start
    timings["total_s"] = round(elapsed, 3)

    tty = sys.stdout.isatty()
    width = args.width if args.width is not None else (shutil.get_terminal_size().columns if tty else
                                                       DEFAULT_TABLE_WIDTH)
    color = tty and not os.environ.get("NO_COLOR")

    def say(head: str, text: str) -> None:
        print(textwrap.fill(text, width, initial_indent=(head + " ").ljust(11), subsequent_indent=" " * 11,
                            break_on_hyphens=False))

    say("hierarchy:", hierarchy_description(args.hierarchy, h))
    say("data:", source)
    if calibration is not None:
        say("calibration:", calibration_report(calibration))
    if check is not None:
        say("check:", check_report(check, args.from_logits))
    ece_table = render_node_ece(calibration, check, width)
    if ece_table:
        print()
        print(ece_table)
    params = [canonical_label(decoder=d) for d in heuristics if d.params]
    say("decoders:", "optimal = each metric's Bayes-optimal decoder, vs "
        f"{len(heuristics)} heuristic{'s' if len(heuristics) != 1 else ''}" + (f" ({', '.join(params)})" if params
                                                                               else ""))
    if not_applicable:
        say("not applicable:", not_applicable_line(not_applicable))
    print()
    print(render_table(ev, color=color, width=width, transpose=args.transpose))
    print()
    gain = "the last row" if args.transpose else "gain"
    legend = ("value±se: mean over samples ± its standard error. * the best decoder of the metric (ties included); "
              "~ within 2 standard errors of the best on the *paired* difference (same samples, so differences are "
              "measured more precisely than each ± suggests; paired standard errors are in --json). ↑ higher is "
              f"better, ↓ lower is better. {gain}: relative improvement of optimal over the best heuristic. The "
              "names are the keys of --json.")
    print(textwrap.fill(legend, width, break_on_hyphens=False))
    if rc is not None:
        print()
        say("risk:", f"{canonical_label(decoder=rc)}: λ = {risk['lambda']:.4g} fitted on {risk['calibration_rows']} "
                     "held-out rows "
                     f"(their miss rate {risk['calibration_miss_rate']:.4f}); {risk['guarantee']}. On the "
                     f"{ev.num_samples} scored rows:")
        print()
        print(render_coverage(ev.coverage, width=width))
        print()
        print(textwrap.fill(COVERAGE_LEGEND, width, break_on_hyphens=False))
    print(f"({elapsed:.1f} s on {device})")
    if args.json is not None:
        results = to_json(ev)
        if calibration is not None:
            results["calibration"] = {k: v for k, v in calibration.items() if k != "seconds"}
        if check is not None:
            results["calibration_check"] = check
        if not_applicable is not None:
            results["not_applicable"] = not_applicable
        if rc is not None:
            results["risk_control"] = {"decoder": canonical_label(decoder=rc), **risk, "scored_rows": ev.num_samples,
                                       **coverage_json(ev.coverage)}
        doc = json_document("compare", {"setting": setting, "timings": timings}, results)
        with StagedWrites() as staged:
            staged.write(args.json, "--json", lambda f: json.dump(doc, f, indent=2, allow_nan=False), text=True)
    return 0
