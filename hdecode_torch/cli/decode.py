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
from ..decoders.risk_control import ThresholdDescent
from ..functional._pieces import certifies, certifying_metrics
from .commands import output_format
from .common import (
    DEFAULT_CALIBRATION_SPLIT, DEFAULT_SEED, CLIError, Progress, build_heuristics,
    build_metrics, calibration_report, calibration_split, check_applicable, fit_calibration, fit_risk_control,
    import_modules,
    load_any_hierarchy, one_spec,
    load_probs, load_targets, resolve_device, set_threads,
)
from .evaluation import chunk_posterior, has_optimal, rows_probabilities
from .io import StagedWrites, one_line


def _decoder(h, args):
    """(label, decode function, metric-or-decoder object) for --metric, --decoder or --risk-lambda; checks that
    the parameters given apply to it.  None for --alpha: its decoder is fitted on the rows (``_fit_risk``)."""
    import_modules(args.imports)
    if args.alpha is not None or args.risk_lambda is not None:
        check_applicable(args, metric_flag="--metric", decoder_flag="--decoder")
        if args.alpha is not None:
            return None
        dec = ThresholdDescent(h, lam=args.risk_lambda)
        return decoder_label(decoder=dec), dec.decode, dec
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
    """(B, N) bool, dense or sparse COO -> per row, its node ids ordered root first (by depth, then id)."""
    if sets.layout == torch.sparse_coo:  # a top-k decision: its entries, never the (B, N) mask
        rows, cols = sets.coalesce().indices()
    else:
        rows, cols = sets.nonzero(as_tuple=True)
    key = rows * (h.num_nodes * (h.max_depth + 1)) + h.depth.to(cols.device)[cols] * h.num_nodes + cols
    order = torch.argsort(key)
    counts = torch.bincount(rows, minlength=sets.shape[0]).tolist()
    return [chunk.tolist() for chunk in torch.split(cols[order], counts)]


def write_predictions(h, pred: torch.Tensor, path: str | None, names: bool, certificate=None) -> None:
    """Write (B,) int64 node ids or (B, N) bool sets to ``path`` (by extension), or as lines to
    stdout (no ``path``) or to a device or a pipe.  ``certificate``: ``(certified (B,) bool,
    regret_bound (B,) float64)`` of top-k decisions, written next to each (a .csv's columns, a .jsonl's
    fields, a .npz's or .pt's arrays, tab-separated on the lines of stdout).

    Sparse COO (B, N) bool sets (a set metric's top-k decision) are written without the (B, N) mask: a .pt
    holds the sparse tensor itself, a .npz the arrays 'pred_indices' (2, nnz) int64 (row, node) pairs and
    'pred_shape' (2,) int64 (B, N); the text formats list each row's nodes as for dense sets; .npy (one
    dense array) is refused."""
    pred = pred.cpu()
    is_set = pred.dtype == torch.bool
    sparse = pred.layout == torch.sparse_coo
    ext = output_format(path, names)
    if sparse:
        if ext == ".npy":
            raise CLIError(SPARSE_NPY)
        pred = pred.coalesce()
    items = None if ext in (".npy", ".npz", ".pt") else (set_members(h, pred) if is_set else pred.tolist())
    label = h.label
    if certificate is not None:
        certified, bound = (t.cpu() for t in certificate)
        # repr: the shortest text that reads back as the same float64
        cert_items = list(zip(certified.tolist(), (repr(b) for b in bound.tolist())))

    def text(it):
        if is_set:
            return ";".join(label(n) if names else str(n) for n in it)
        return label(it) if names else str(it)

    def lines(f):
        if certificate is None:
            for it in items:
                f.write(text(it) + "\n")
        else:
            for it, (c, b) in zip(items, cert_items):
                f.write(f"{text(it)}\t{str(c).lower()}\t{b}\n")

    if path is None:
        lines(sys.stdout)
        return

    def fill(f):
        if ext is None:
            lines(f)
        elif ext == ".npy":
            np.save(f, pred.numpy())
        elif ext == ".npz":
            if sparse:
                arrays = {"pred_indices": pred.indices().numpy(), "pred_shape": np.array(pred.shape, dtype=np.int64)}
            else:
                arrays = {"pred": pred.numpy()}
            if certificate is not None:
                arrays.update(certified=certified.numpy(), regret_bound=bound.numpy())
            np.savez(f, **arrays)
        elif ext == ".pt":
            # Serialised in memory first: torch's archive writer turns a failed write into an opaque
            # RuntimeError, a plain write keeps the reason (a full disk, a file-size limit).
            buf = io.BytesIO()
            torch.save(pred if certificate is None else
                       {"pred": pred, "certified": certified, "regret_bound": bound}, buf)
            f.write(buf.getbuffer())
        elif ext == ".jsonl":
            for i, it in enumerate(items):
                rec = {"nodes": it} if is_set else {"node": it}
                if names:
                    rec["names" if is_set else "name"] = [label(n) for n in it] if is_set else label(it)
                if certificate is not None:
                    rec["certified"] = cert_items[i][0]
                    rec["regret_bound"] = float(cert_items[i][1])
                f.write(json.dumps(rec) + "\n")
        else:
            w = csv.writer(f)
            head = [("names" if names else "nodes") if is_set else ("name" if names else "node")]
            if certificate is None:
                w.writerow(head)
                w.writerows([text(it)] for it in items)
            else:
                w.writerow(head + ["certified", "regret_bound"])
                w.writerows([text(it), str(c).lower(), b] for it, (c, b) in zip(items, cert_items))

    with StagedWrites() as staged:
        staged.write(path, "--output", fill, text=ext not in (".npy", ".npz", ".pt"))


#: Why a set metric's top-k decisions are not written to .npy.
SPARSE_NPY = ("--output: a set metric's decisions on top-k lists are sparse node sets, and a .npy file holds one "
              "dense array; write .npz (arrays 'pred_indices' (2, nnz) and 'pred_shape'), .pt (a sparse COO "
              "tensor), .csv or .jsonl")


def certificate_summary(key: str, certified: torch.Tensor, bound: torch.Tensor) -> str:
    """One line: how many rows are certified, and the mean regret bound (over every row, 0 where certified)."""
    n = certified.numel()
    if n == 0:
        return f"{key}: no rows to certify"
    done = int(certified.sum())
    return (f"{key}: {done} of {n} rows certified ({done / n:.1%}); mean regret bound "
            f"{float(bound.to(torch.float64).mean()):.4g}")


def _check_top_k_input(args) -> None:
    if args.calibrate:
        raise CLIError("--calibrate: --probs holds a top-k list; a calibration is fitted on every logit")
    if args.from_logits is True:
        raise CLIError("--from-logits: --probs holds a top-k list, whose missing mass is unknown for logits (the "
                       "softmax needs every logit); save the top-k of the probabilities")
    if args.normalize:
        raise CLIError("--normalize: --probs holds a top-k list; the mass its values leave is the unlisted leaves'")


def _split(args, num_rows: int, what: str) -> tuple[float, int, torch.Tensor, torch.Tensor]:
    """``(fraction, seed, fit rows, other rows)`` of --calibration-split and --seed; refuses a split with no fit row
    (the other rows may be none: every row is decoded)."""
    split = DEFAULT_CALIBRATION_SPLIT if args.calibration_split is None else args.calibration_split
    seed = DEFAULT_SEED if args.seed is None else args.seed
    fit_rows, other_rows = calibration_split(num_rows, split, seed)
    if fit_rows.numel() == 0:
        raise CLIError(f"--calibration-split {split:g} of {num_rows} rows selects no row to {what}")
    return split, seed, fit_rows, other_rows


def _fit_risk(args, h, rows, targets, where: str, progress: Progress):
    """(label, decode function, decoder) of risk control fitted on ``rows`` ((n, L) checked probabilities or a
    TopK of (n, k) lists) and ``targets`` (n,) at --alpha/--delta; says on standard error what it promises."""
    progress.stage("decode: fitting risk control")
    rc, info = fit_risk_control(h, rows, targets, args.alpha, args.delta, where)
    key = decoder_label(decoder=rc)
    # repr: every digit, so that --risk-lambda decodes later rows with the same decoder
    reuse = (f"the λ of the calibrated probabilities: --risk-lambda {rc.lam!r} decodes other rows with this decoder "
             "only after the same calibration" if args.calibrate else
             f"--risk-lambda {rc.lam!r} decodes other rows with this decoder")
    progress.write(f"{args._parser.prog}: risk control: {key}: λ = {rc.lam!r} fitted on {info['calibration_rows']} "
                   f"rows (their miss rate {info['calibration_miss_rate']:.4f}); {info['guarantee']}: the fit rows are "
                   f"those calibration rows, and the promise is for new rows, not for the fit rows themselves, which "
                   f"are decoded too ({reuse})")
    return key, rc.decode, rc


def _decode_top_k(args, topk: TopK, obj, decode, device, progress: Progress):
    """(B,) int64 the decisions of a top-k list (a ``values``/``indices`` file), in --batch-size rows at a time;
    with --certify, ``(pred, certified, regret_bound)``."""
    _check_top_k_input(args)
    if args.metric is None and not obj.accepts_topk:
        raise CLIError(f"--decoder {args.decoder}: {one_line(no_top_k_decoder(f'the decoder `{obj.name}`'))}")
    if not obj.accepts_topk:
        raise CLIError(f"--metric {args.metric}: {one_line(no_top_k_decoder(f'`{obj.name}`'))}")
    if args.certify and not certifies(obj):
        raise CLIError(f"--certify: `{obj.name}` gives no certificate of a top-k decision; "
                       f"{', '.join(certifying_metrics())} do")
    values, indices = topk.values.to(device), topk.indices.to(device)
    bsz = values.shape[0]
    progress.stage(f"decode: {obj.key} (top-{topk.k} lists)", total=bsz)
    parts = []
    for start in range(0, bsz, args.batch_size):
        stop = min(start + args.batch_size, bsz)
        chunk = TopK(values[start:stop], indices[start:stop])
        out = decode(chunk, certify=True) if args.certify else (decode(chunk),)
        parts.append([t.cpu() for t in out])
        progress.update(stop - start)
    progress.close()
    if not parts:
        if getattr(obj, "kind", None) == "set":
            return torch.zeros(0, obj.hierarchy.num_nodes, dtype=torch.bool).to_sparse()
        empty = (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.bool),
                 torch.zeros(0, dtype=torch.float64))
        return empty if args.certify else empty[0]
    out = tuple(torch.cat(t) for t in zip(*parts))  # sparse sets: row blocks in order, still one entry each
    return out if args.certify else out[0]


def run(args: argparse.Namespace, progress: Progress) -> int:
    """The command line was checked by ``commands.check_decode``."""
    with set_threads(args.threads):
        progress.stage("decode: loading the hierarchy")
        h = load_any_hierarchy(args.hierarchy, args.leaf_order)
        device = resolve_device(args.device)
        chosen = _decoder(h, args)
        progress.stage("decode: reading the model outputs")
        probs = load_probs(args.probs, h, top_k=True)
        if isinstance(probs, TopK) and chosen is None:  # --alpha: λ fitted on the fit rows' lists
            _check_top_k_input(args)
            num = int(probs.values.shape[0])
            targets = load_targets(args.targets, h, num)
            if num == 0:
                raise CLIError("--alpha: --probs has no rows")
            split, _, fit_rows, _ = _split(args, num, "fit λ on")
            chosen = _fit_risk(args, h, TopK(probs.values[fit_rows], probs.indices[fit_rows]), targets[fit_rows],
                               f"--calibration-split {split:g} of {num} rows", progress)
        if isinstance(probs, TopK):
            key, decode, obj = chosen
            if getattr(obj, "kind", None) == "set" and output_format(args.output, args.names) == ".npy":
                raise CLIError(SPARSE_NPY)  # before the decode
            out = _decode_top_k(args, probs, obj, decode, device, progress)
            pred, certificate = (out[0], out[1:]) if args.certify else (out, None)
            write_predictions(h, pred, args.output, args.names, certificate)
            if args.output is not None:
                print(f"{key}: {pred.shape[0]} predictions written to {args.output}", file=sys.stderr)
            if certificate is not None:
                print(certificate_summary(key, *certificate), file=sys.stderr)
            return 0
        if args.certify:
            raise CLIError("--certify: --probs holds dense (B, L) probabilities, whose decisions are exact: there "
                           "is no unknown completion to certify (a certificate is of a top-k list, a .npz or .pt "
                           "with 'values' and 'indices')")
        B = probs.shape[0]
        if args.calibrate or args.alpha is not None:
            targets = load_targets(args.targets, h, B)
            if B == 0:
                raise CLIError(f"{'--calibrate' if args.calibrate else '--alpha'}: --probs has no rows")
            what = "fit the calibration on" if args.calibrate else "fit λ on"
            split, seed, fit_rows, other_rows = _split(args, B, what)
            t_rows = lam_rows = fit_rows
            if args.calibrate and args.alpha is not None:  # T and λ each on half of the held-out rows
                if fit_rows.numel() < 2:
                    raise CLIError(f"--calibrate with --alpha fits the calibration and λ on half each of the "
                                   f"--calibration-split {split:g} of {B} rows, but it holds {fit_rows.numel()} row")
                t_pick, lam_pick = calibration_split(fit_rows.numel(), 0.5, seed)
                t_rows, lam_rows = fit_rows[t_pick], fit_rows[lam_pick]
            if args.calibrate:
                progress.stage(f"decode: fitting the calibration ({args.calibrate})")
                scaler, info = fit_calibration(h, probs, targets, t_rows, other_rows, args.calibrate)
                if scaler is not None:
                    with torch.no_grad():
                        probs = scaler(probs.to(torch.float64)).to(probs.dtype)
                progress.write(f"{args._parser.prog}: calibration: {calibration_report(info)}")
            if args.alpha is not None:
                cal = rows_probabilities(h, probs, lam_rows, from_logits=args.from_logits, normalize=args.normalize)
                part = "half of " if args.calibrate else ""
                chosen = _fit_risk(args, h, cal, targets[lam_rows],
                                   f"{part}--calibration-split {split:g} of {B} rows", progress)
        key, decode, obj = chosen
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

