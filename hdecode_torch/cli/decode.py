"""``hdecode decode``: turn a file of leaf probabilities into predictions for a metric or a decoder."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

import numpy as np
import torch

from ..core.posterior import Posterior
from .common import (
    CLIError, add_decoder_param_args, add_hierarchy_args, build_heuristics, build_metrics, heuristic_names,
    load_any_hierarchy, load_probs, resolve_device,
)
from .evaluation import has_optimal

OUTPUT_FORMATS = (".npy", ".pt", ".csv", ".jsonl")


def add_parser(sub) -> None:
    from ..metrics import list_metrics

    p = sub.add_parser(
        "decode", help="decode a file of probabilities with a metric's optimal decoder or a heuristic",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Decode (B, L) leaf probabilities into hierarchical predictions.\n\n"
            "--metric M: the Bayes-optimal prediction for metric M (node ids; for the set metrics\n"
            "hf_beta and hamming, ancestor-closed node sets).  --decoder D: a heuristic (node ids).\n\n"
            "Output (--output, by extension): .npy / .pt: (B,) int64 node ids, or (B, N) bool set masks;\n"
            ".csv: one row per sample (column 'node', or 'nodes' with ';'-separated ids, root first);\n"
            ".jsonl: one JSON object per line ({\"node\": id} or {\"nodes\": [ids]}).  Without --output,\n"
            "one line per sample on stdout.  --names writes readable labels instead of ids (.csv,\n"
            "stdout) or next to them (.jsonl)."),
        epilog=("examples:\n"
                "  hdecode decode --probs probs.npy --metric hf_beta --beta 0.5 --output sets.jsonl --names\n"
                "  hdecode decode --hierarchy tree.csv --probs logits.pt --from-logits --metric wu_palmer\n"
                "  hdecode decode --probs probs.npy --decoder darts --lam 0.5 --output pred.npy"))
    add_hierarchy_args(p)
    p.add_argument("--probs", required=True, metavar="FILE",
                   help="(B, L) probabilities (or logits with --from-logits): .npy, .pt or .csv")
    p.add_argument("--from-logits", action="store_true", help="--probs holds logits: apply a softmax")
    p.add_argument("--normalize", action="store_true", help="renormalize rows that do not sum to 1")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--metric", metavar="NAME", help=f"optimal decoder of this metric ({', '.join(list_metrics())})")
    what.add_argument("--decoder", metavar="NAME", help=f"a heuristic decoder ({', '.join(heuristic_names())})")
    p.add_argument("--beta", type=float, default=1.0, help="hf_beta: beta (default: 1)")
    p.add_argument("--c", type=float, default=0.5, help="tree_distance_c: c (default: 0.5)")
    add_decoder_param_args(p, tau=0.5, lam=0.0)
    p.add_argument("--names", action="store_true", help="readable node labels instead of ids (text outputs)")
    p.add_argument("--output", "-o", metavar="FILE", help=f"write predictions to FILE ({', '.join(OUTPUT_FORMATS)})")
    p.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda if available, else cpu)")
    p.add_argument("--batch-size", type=int, default=4096, help="samples per chunk (default: 4096)")
    p.set_defaults(func=run)


def _decoder(h, args):
    if args.metric is not None:
        metric = build_metrics(h, [args.metric], [args.beta], args.c)[0]
        if not has_optimal(metric):
            raise CLIError(f"--metric {args.metric}: No Bayes-optimal decoder for `{metric.name}` (exact rules exist "
                           "for every metric but jaccard); pick another metric or a --decoder")
        return metric.key, metric.decode
    dec = build_heuristics(h, [args.decoder], args.tau, args.lam, args.info_threshold)[0]
    return dec.key, dec.decode


def set_members(h, sets: torch.Tensor) -> list[list[int]]:
    """(B, N) bool -> per row, its node ids ordered root first (by depth, then id)."""
    rows, cols = sets.nonzero(as_tuple=True)
    key = rows * (h.num_nodes * (h.max_depth + 1)) + h.depth.to(cols.device)[cols] * h.num_nodes + cols
    order = torch.argsort(key)
    counts = torch.bincount(rows, minlength=sets.shape[0]).tolist()
    return [chunk.tolist() for chunk in torch.split(cols[order], counts)]


def write_predictions(h, pred: torch.Tensor, path: str | None, names: bool) -> None:
    pred = pred.cpu()
    is_set = pred.dtype == torch.bool
    ext = os.path.splitext(path)[1].lower() if path else None
    if ext is not None and ext not in OUTPUT_FORMATS:
        raise CLIError(f"--output: unknown format {ext or '(no extension)'!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if names and ext in (".npy", ".pt"):
        raise CLIError("--names needs a text output (.csv, .jsonl or stdout); .npy/.pt hold ids")
    if ext == ".npy":
        np.save(path, pred.numpy())
        return
    if ext == ".pt":
        torch.save(pred, path)
        return
    items = set_members(h, pred) if is_set else pred.tolist()
    label = h.label
    if ext == ".jsonl":
        with open(path, "w") as f:
            for it in items:
                rec = {"nodes": it} if is_set else {"node": it}
                if names:
                    rec["names" if is_set else "name"] = [label(n) for n in it] if is_set else label(it)
                f.write(json.dumps(rec) + "\n")
        return

    def text(it):
        if is_set:
            return ";".join(label(n) if names else str(n) for n in it)
        return label(it) if names else str(it)

    if ext == ".csv":
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow([("names" if names else "nodes") if is_set else ("name" if names else "node")])
            w.writerows([text(it)] for it in items)
        return
    out = sys.stdout
    for it in items:
        out.write(text(it) + "\n")


def run(args: argparse.Namespace) -> int:
    if args.batch_size <= 0:
        raise CLIError(f"--batch-size must be positive, got {args.batch_size}")
    if args.output:
        ext = os.path.splitext(args.output)[1].lower()
        if ext not in OUTPUT_FORMATS:
            raise CLIError(f"--output: unknown format {ext or '(no extension)'!r}; use one of {', '.join(OUTPUT_FORMATS)}")
        if args.names and ext in (".npy", ".pt"):
            raise CLIError("--names needs a text output (.csv, .jsonl or stdout); .npy/.pt hold ids")
    h = load_any_hierarchy(args.hierarchy, args.leaf_order)
    device = resolve_device(args.device)
    key, decode = _decoder(h, args)
    probs = load_probs(args.probs, h).to(device)
    parts = []
    for start in range(0, probs.shape[0], args.batch_size):
        post = Posterior(h, probs[start:start + args.batch_size], from_logits=args.from_logits,
                         normalize=args.normalize, name="probs")
        parts.append(decode(post))
    if parts:
        pred = torch.cat(parts)
    elif args.metric is not None and build_metrics(h, [args.metric], [args.beta], args.c)[0].kind == "set":
        pred = torch.zeros(0, h.num_nodes, dtype=torch.bool)
    else:
        pred = torch.zeros(0, dtype=torch.long)
    write_predictions(h, pred, args.output, args.names)
    if args.output:
        print(f"{key}: {pred.shape[0]} predictions written to {args.output}", file=sys.stderr)
    return 0
