"""``hdecode decode``: turn a file of leaf probabilities into predictions for a metric or a decoder."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys

import numpy as np
import torch

from .common import (
    DEFAULT_BETA, DEFAULT_C, DEFAULT_CALIBRATION_SPLIT, DEFAULT_SEED, MAX_SEED, CLIError, Progress,
    add_calibration_args, add_decoder_param_args, add_hierarchy_args, add_metric_params, add_run_args,
    build_heuristics, build_metrics, calibration_report, calibration_split, check_applicable, fit_calibration,
    heuristic_names, int_in, load_any_hierarchy, load_probs, load_targets, resolve_device, set_threads,
)
from .evaluation import chunk_posterior, has_optimal
from .io import StagedWrites, check_distinct_inputs, check_output_path, require_stdout

OUTPUT_FORMATS = (".npy", ".pt", ".csv", ".jsonl")


def add_parser(sub) -> None:
    from ..metrics import list_metrics

    p = sub.add_parser(
        "decode", help="decode a file of probabilities with a metric's optimal decoder or a heuristic",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Decode (B, L) leaf probabilities into hierarchical predictions.\n\n"
            "--metric M: the Bayes-optimal prediction for metric M (node ids; for the set metrics\n"
            "hf_beta, hamming and jaccard, ancestor-closed node sets).  --decoder D: a heuristic (node ids).\n\n"
            "Output (--output, by extension): .npy / .pt: (B,) int64 node ids, or (B, N) bool set masks;\n"
            ".csv: one row per sample (column 'node', or 'nodes' with ';'-separated ids, root first);\n"
            ".jsonl: one JSON object per line ({\"node\": id} or {\"nodes\": [ids]}).  Without --output,\n"
            "one line per sample on stdout.  --names writes readable labels instead of ids (.csv,\n"
            "stdout) or next to them (.jsonl).  The output is written to a temporary file and moved\n"
            "into place when complete: an error or Ctrl-C leaves an existing file as it was.\n\n"
            "--probs - reads standard input: .npy or .pt bytes (recognised by their first bytes) or a\n"
            "text table (comma, tab or whitespace separated)."),
        epilog=("examples:\n"
                "  hdecode decode --probs probs.npy --metric hf_beta --beta 0.5 --output sets.jsonl --names\n"
                "  hdecode decode --hierarchy tree.csv --probs logits.pt --from-logits --metric wu_palmer\n"
                "  hdecode decode --probs probs.npy --decoder darts --lam 0.5 --output pred.npy\n"
                "  hdecode decode --probs val_logits.npy --from-logits --calibrate --targets val_labels.npy "
                "--metric zhao -o pred.csv\n"
                "  python make_probs.py | hdecode decode --probs - --metric tree_distance"))
    p.set_defaults(func=run, _parser=p)
    add_hierarchy_args(p)
    src = p.add_argument_group("model outputs")
    src.add_argument("--probs", required=True, metavar="FILE",
                     help="(B, L) probabilities (or logits with --from-logits): .npy, .pt, .csv, .tsv or .txt; "
                          "'-' reads standard input")
    src.add_argument("--from-logits", action="store_true", help="--probs holds logits: apply a softmax")
    src.add_argument("--normalize", action="store_true", help="renormalize rows that do not sum to 1")
    what = p.add_argument_group("what to decode (one of --metric, --decoder)")
    one = what.add_mutually_exclusive_group(required=True)
    one.add_argument("--metric", "--metrics", dest="metric", metavar="NAME",
                     help=f"optimal decoder of this metric ({', '.join(list_metrics())})")
    one.add_argument("--decoder", "--decoders", dest="decoder", metavar="NAME",
                     help=f"a heuristic decoder ({', '.join(heuristic_names())})")
    add_metric_params(what, multi=False)
    add_decoder_param_args(what)
    cal = p.add_argument_group("calibration")
    add_calibration_args(cal, decode=True)
    cal.add_argument("--targets", metavar="FILE",
                     help="--calibrate: (B,) true leaf ids of the --probs rows (.npy, .pt, .csv, .txt; '-': stdin)")
    cal.add_argument("--seed", type=int_in(0, MAX_SEED), default=None,
                     help=f"--calibrate: seed of the random split (default: {DEFAULT_SEED})")
    out = p.add_argument_group("output")
    out.add_argument("--output", "-o", metavar="FILE", help=f"write predictions to FILE ({', '.join(OUTPUT_FORMATS)})")
    out.add_argument("--names", action="store_true", help="readable node labels instead of ids (text outputs)")
    add_run_args(p.add_argument_group("run"))


def _decoder(h, args):
    """(key, decode function, metric-or-decoder object) for --metric or --decoder; checks that the
    parameters given apply to it."""
    if args.metric is not None:
        if "," in args.metric:
            raise CLIError(f"--metric takes one metric, got {args.metric!r} (hdecode compare scores several)")
        metric = build_metrics(h, [args.metric.strip()], [args.beta if args.beta is not None else DEFAULT_BETA],
                               args.c if args.c is not None else DEFAULT_C)[0]
        check_applicable(args, metrics=[metric], metric_flag="--metric", decoder_flag="--decoder")
        if not has_optimal(metric):
            raise CLIError(f"--metric {args.metric}: No Bayes-optimal decoder for `{metric.name}`; pick another "
                           "metric or a --decoder")
        return metric.key, metric.decode, metric
    if "," in args.decoder:
        raise CLIError(f"--decoder takes one decoder, got {args.decoder!r} (hdecode compare scores several)")
    dec = build_heuristics(h, [args.decoder.strip()], args.tau, args.lam, args.info_threshold)[0]
    check_applicable(args, decoders=[dec], metric_flag="--metric", decoder_flag="--decoder")
    return dec.key, dec.decode, dec


def set_members(h, sets: torch.Tensor) -> list[list[int]]:
    """(B, N) bool -> per row, its node ids ordered root first (by depth, then id)."""
    rows, cols = sets.nonzero(as_tuple=True)
    key = rows * (h.num_nodes * (h.max_depth + 1)) + h.depth.to(cols.device)[cols] * h.num_nodes + cols
    order = torch.argsort(key)
    counts = torch.bincount(rows, minlength=sets.shape[0]).tolist()
    return [chunk.tolist() for chunk in torch.split(cols[order], counts)]


def _format_error(path: str | None, names: bool) -> None:
    ext = os.path.splitext(path)[1].lower() if path else None
    if ext is not None and ext not in OUTPUT_FORMATS:
        raise CLIError(f"--output: unknown format {ext or '(no extension)'!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if names and ext in (".npy", ".pt"):
        raise CLIError("--names needs a text output (.csv, .jsonl or stdout); .npy/.pt hold ids")


def write_predictions(h, pred: torch.Tensor, path: str | None, names: bool) -> None:
    """Write (B,) int64 node ids or (B, N) bool sets to ``path`` (by extension) or to stdout."""
    pred = pred.cpu()
    is_set = pred.dtype == torch.bool
    _format_error(path, names)
    ext = os.path.splitext(path)[1].lower() if path else None
    items = None if ext in (".npy", ".pt") else (set_members(h, pred) if is_set else pred.tolist())
    label = h.label

    def text(it):
        if is_set:
            return ";".join(label(n) if names else str(n) for n in it)
        return label(it) if names else str(it)

    if path is None:
        out = sys.stdout
        for it in items:
            out.write(text(it) + "\n")
        return

    def fill(f):
        if ext == ".npy":
            np.save(f, pred.numpy())
        elif ext == ".pt":
            # Serialised in memory first: torch's archive writer turns a failed write into an opaque
            # RuntimeError, a plain write keeps the reason (a full disk, a file-size limit).
            buf = io.BytesIO()
            torch.save(pred, buf)
            f.write(buf.getbuffer())
        elif ext == ".jsonl":
            for it in items:
                rec = {"nodes": it} if is_set else {"node": it}
                if names:
                    rec["names" if is_set else "name"] = [label(n) for n in it] if is_set else label(it)
                f.write(json.dumps(rec) + "\n")
        else:
            w = csv.writer(f)
            w.writerow([("names" if names else "nodes") if is_set else ("name" if names else "node")])
            w.writerows([text(it)] for it in items)

    with StagedWrites() as staged:
        staged.write(path, "--output", fill, text=ext in (".csv", ".jsonl"))


def run(args: argparse.Namespace) -> int:
    # Everything that can be checked without the data is checked first, so that a mistake does not
    # surface only after a long decode.
    inputs = {"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
              "--leaf-order": args.leaf_order}
    check_distinct_inputs(inputs)
    if args.output is not None:
        check_output_path(args.output, "--output", inputs=inputs)
    _format_error(args.output, args.names)
    if args.output is None:
        require_stdout("no --output is given: the predictions would be lost")
    if args.calibrate:
        if not args.from_logits:
            raise CLIError("--calibrate scales logits: add --from-logits (and pass logits as --probs)")
        if args.targets is None:
            raise CLIError("--calibrate fits the temperature on labelled rows: add --targets FILE (the true leaf ids "
                           "of the --probs rows)")
    else:
        for flag, value in (("--targets", args.targets), ("--calibration-split", args.calibration_split),
                            ("--seed", args.seed)):
            if value is not None:
                raise CLIError(f"{flag} applies to --calibrate")
    progress = Progress("decode: loading", enabled=not args.no_progress)
    with progress, set_threads(args.threads):
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        key, decode, obj = _decoder(h, args)
        probs = load_probs(args.probs, h)
        B = probs.shape[0]
        if args.calibrate:
            targets = load_targets(args.targets, h, B)
            if B == 0:
                raise CLIError("--calibrate: --probs has no rows")
            split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
            seed = DEFAULT_SEED if args.seed is None else args.seed
            fit_rows, other_rows = calibration_split(B, split, seed)
            if fit_rows.numel() == 0:
                raise CLIError(f"--calibration-split {split:g} of {B} rows selects no row to fit the temperature on")
            progress.stage("decode: fitting the temperature")
            scaler, info = fit_calibration(probs, targets, fit_rows, other_rows)
            with torch.no_grad():
                probs = scaler(probs.to(torch.float64)).to(probs.dtype)
            progress.write(f"{args._parser.prog}: calibration: {calibration_report(info)}")
        probs = probs.to(device)
        progress.stage(f"decode: {key}", total=B)
        parts = []
        for start in range(0, B, args.batch_size):
            stop = min(start + args.batch_size, B)
            post = chunk_posterior(h, probs, start, stop, from_logits=args.from_logits, normalize=args.normalize)
            parts.append(decode(post).cpu())
            progress.update(stop - start)
    if parts:
        pred = torch.cat(parts)
    elif getattr(obj, "kind", None) == "set":
        pred = torch.zeros(0, h.num_nodes, dtype=torch.bool)
    else:
        pred = torch.zeros(0, dtype=torch.long)
    write_predictions(h, pred, args.output, args.names)
    if args.output is not None:
        print(f"{key}: {pred.shape[0]} predictions written to {args.output}", file=sys.stderr)
    return 0

