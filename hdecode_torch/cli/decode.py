"""``hdecode decode``: turn a file of leaf probabilities into predictions for a metric or a decoder."""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys

import numpy as np
import torch

from ..core.spec import OPTIMAL
from ..core.spec import label as decoder_label
from ..core.topk import TopK, no_top_k_decoder
from .commands import output_format
from .common import (
    DEFAULT_CALIBRATION_SPLIT, DEFAULT_SEED, CLIError, Progress, build_heuristics,
    build_metrics, calibration_report, calibration_split, check_applicable, fit_calibration, import_modules,
    load_any_hierarchy, one_spec,
    load_probs, load_targets, resolve_device, set_threads,
)
from .evaluation import chunk_posterior, has_optimal
from .io import StagedWrites, one_line


def _decoder(h, args):
    """(label, decode function, metric-or-decoder object) for --metric or --decoder; checks that the
    parameters given apply to it."""
    import_modules(args.imports)
    if args.metric is not None:
        metric = build_metrics(h, [one_spec(args.metric, "--metric")], args)[0]
        check_applicable(args, metrics=[metric], metric_flag="--metric", decoder_flag="--decoder")
        if not has_optimal(metric):
            raise CLIError(f"--metric {args.metric}: No Bayes-optimal decoder for `{metric.name}`; pick another "
                           "metric or a --decoder")
        return decoder_label(metric, OPTIMAL), metric.decode, metric
    dec = build_heuristics(h, [one_spec(args.decoder, "--decoder")], args)[0]
    check_applicable(args, decoders=[dec], metric_flag="--metric", decoder_flag="--decoder")
    return decoder_label(decoder=dec), dec.decode, dec


def set_members(h, sets: torch.Tensor) -> list[list[int]]:
    """(B, N) bool -> per row, its node ids ordered root first (by depth, then id)."""
    rows, cols = sets.nonzero(as_tuple=True)
    key = rows * (h.num_nodes * (h.max_depth + 1)) + h.depth.to(cols.device)[cols] * h.num_nodes + cols
    order = torch.argsort(key)
    counts = torch.bincount(rows, minlength=sets.shape[0]).tolist()
    return [chunk.tolist() for chunk in torch.split(cols[order], counts)]


def write_predictions(h, pred: torch.Tensor, path: str | None, names: bool) -> None:
    """Write (B,) int64 node ids or (B, N) bool sets to ``path`` (by extension), or as lines to
    stdout (no ``path``) or to a device or a pipe."""
    pred = pred.cpu()
    is_set = pred.dtype == torch.bool
    ext = output_format(path, names)
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
        if ext is None:
            for it in items:
                f.write(text(it) + "\n")
        elif ext == ".npy":
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
        staged.write(path, "--output", fill, text=ext not in (".npy", ".pt"))


def _decode_top_k(args, topk: TopK, obj, decode, device, progress: Progress) -> torch.Tensor:
    """(B,) int64 the decisions of a top-k list (a ``values``/``indices`` file), in --batch-size rows at a time."""
    if args.calibrate:
        raise CLIError("--calibrate: --probs holds a top-k list; a calibration is fitted on every logit")
    if args.from_logits is True:
        raise CLIError("--from-logits: --probs holds a top-k list, whose missing mass is unknown for logits (the "
                       "softmax needs every logit); save the top-k of the probabilities")
    if args.normalize:
        raise CLIError("--normalize: --probs holds a top-k list; the mass its values leave is the unlisted leaves'")
    if args.metric is None and not obj.accepts_topk:
        raise CLIError(f"--decoder {args.decoder}: {one_line(no_top_k_decoder(f'the decoder `{obj.name}`'))}")
    if not obj.accepts_topk:
        raise CLIError(f"--metric {args.metric}: {one_line(no_top_k_decoder(f'`{obj.name}`'))}")
    values, indices = topk.values.to(device), topk.indices.to(device)
    bsz = values.shape[0]
    progress.stage(f"decode: {obj.key} (top-{topk.k} lists)", total=bsz)
    parts = []
    for start in range(0, bsz, args.batch_size):
        stop = min(start + args.batch_size, bsz)
        parts.append(decode(TopK(values[start:stop], indices[start:stop])).cpu())
        progress.update(stop - start)
    progress.close()
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def run(args: argparse.Namespace, progress: Progress) -> int:
    """The command line was checked by ``commands.check_decode``."""
    with set_threads(args.threads):
        progress.stage("decode: loading the hierarchy")
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        key, decode, obj = _decoder(h, args)
        progress.stage("decode: reading the model outputs")
        probs = load_probs(args.probs, h, top_k=True)
        if isinstance(probs, TopK):
            pred = _decode_top_k(args, probs, obj, decode, device, progress)
            write_predictions(h, pred, args.output, args.names)
            if args.output is not None:
                print(f"{key}: {pred.shape[0]} predictions written to {args.output}", file=sys.stderr)
            return 0
        B = probs.shape[0]
        if args.calibrate:
            targets = load_targets(args.targets, h, B)
            if B == 0:
                raise CLIError("--calibrate: --probs has no rows")
            split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
            seed = DEFAULT_SEED if args.seed is None else args.seed
            fit_rows, other_rows = calibration_split(B, split, seed)
            if fit_rows.numel() == 0:
                raise CLIError(f"--calibration-split {split:g} of {B} rows selects no row to fit the calibration on")
            progress.stage(f"decode: fitting the calibration ({args.calibrate})")
            scaler, info = fit_calibration(h, probs, targets, fit_rows, other_rows, args.calibrate)
            if scaler is not None:
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
    progress.close()
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

