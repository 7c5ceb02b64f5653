"""The ``hdecode`` command line: every subcommand's options, and the checks of their combinations.

Nothing here imports torch: ``main`` parses and checks the command line with this module alone, so
that ``--help``, ``--version`` and a mistake in the options are answered at once; the subcommand's
module (``compare``, ``decode``, ``plot``, ``info``), which loads torch, is imported only to run it.
Each subparser names it: ``set_defaults(_run="module:function", _check=function)``.
"""

from __future__ import annotations

import argparse
import os

from .io import CLIError, check_distinct_inputs, check_output_path, is_special_file, require_stdout
from .names import check_before_torch
from .options import (
    DEFAULT_ALPHA, DEFAULT_DPI, DEFAULT_GAIN_NOISE, DEFAULT_GAIN_SAMPLES, DEFAULT_GAIN_SEEDS,
    DEFAULT_METRICS, DEFAULT_NUM_SAMPLES, DEFAULT_RESOLUTION, DEFAULT_RISK_POINTS, DEFAULT_SEED, DEFAULT_TABLE_WIDTH,
    HEURISTIC_NAMES, MAX_DPI, MAX_SEED, METRIC_NAMES, SYNTHETIC_NOISE, add_calibration_args, add_decoder_param_args,
    add_hierarchy_args, add_input_kind_args, add_metric_params, add_progress_arg, add_risk_args, add_run_args,
    add_split_arg, finite_float, int_in, unit_open, DEFAULT_BINS, DEFAULT_DISTORTION, DEFAULT_STRENGTH, DISTORTIONS,
)

__all__ = ["build_parser", "OUTPUT_FORMATS", "output_format"]

OUTPUT_FORMATS = (".npy", ".npz", ".pt", ".csv", ".jsonl")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="hdecode", allow_abbrev=False,
        description="Bayes-optimal decoding of hierarchical classifiers: compare decoders, decode, plot.",
        epilog="Options are spelled out in full (no abbreviations); `hdecode COMMAND --help` lists them.")
    parser.add_argument("--version", action="version", version=f"hdecode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_add_compare, _add_decode, _add_plot, _add_info):
        add(sub)
    return parser


def _given(value) -> bool:
    return value is not None and value is not False


def _check_calibration_input(args) -> None:
    if args.from_logits is not True:
        if args.from_logits == "auto":
            raise CLIError("--calibrate scales logits: give --from-logits, not --from-logits auto (a calibration "
                           "fitted to rows that may be probabilities means nothing)")
        raise CLIError("--calibrate scales logits: add --from-logits (and pass logits as --probs)")


# --------------------------------------------------------------------------- compare
def _add_compare(sub) -> None:
    p = sub.add_parser(
        "compare", help="score every decoder on every metric (synthetic calibrated outputs or your own)",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Score the Bayes-optimal decoder of each metric and every heuristic decoder on every metric,\n"
            "and print one table with standard errors: a row per metric, a column per decoder\n"
            "(--transpose: the other way round), wrapped to the terminal's width (to --width, or to\n"
            f"{DEFAULT_TABLE_WIDTH} characters in a file or a pipe).  The names are the keys of --json.\n\n"
            "Without --probs: synthetic outputs on the hierarchy, calibrated by construction (the labels\n"
            "are drawn from the probabilities), so the optimal decoder of each metric must be the best of\n"
            "its row up to sampling noise.  With --probs/--targets: your model's outputs ('-' reads\n"
            "one of them from standard input: .npy/.pt bytes or a text table).\n\n"
            "Set metrics (hf_beta, hamming, jaccard) score a heuristic's node as the set of its\n"
            "ancestors.\n\n"
            "--calibrate (with --from-logits) fits a temperature on a random part of the rows and scores\n"
            "the others with logits / T: over-confident models then get better optimal decisions.\n\n"
            "--alpha A fits risk control (hd.RiskControl: descend from the root while the most probable\n"
            "child has p > λ) on a random part of the rows, and shows, on the others, its miss rate (the\n"
            "target not under the answer) and the mean depth of its answers next to every optimal and\n"
            "heuristic decoder's: on rows exchangeable with the calibration rows, its expected miss rate\n"
            "is at most A (with --delta D: at most A with probability 1 - D).  On top-k lists, λ is fitted\n"
            "on the calibration rows' lists, each read as its completed distribution (the missing mass\n"
            "spread over the unlisted leaves), exactly as on that dense table."),
        epilog=("examples:\n"
                "  hdecode compare\n"
                "  hdecode compare --noise 1.5 --num-samples 50000 --json results.json\n"
                "  hdecode compare --hierarchy inat19 --probs val_logits.npy --targets val_labels.npy --from-logits\n"
                "  hdecode compare --probs val_logits.npy --targets val_labels.npy --from-logits --calibrate\n"
                "  hdecode compare --alpha 0.1\n"
                "  hdecode compare --probs val_probs.npy --targets val_labels.npy --alpha 0.05 --delta 0.1\n"
                "  hdecode compare --hierarchy inat19 --probs val_top10.npz --targets val_labels.npy --alpha 0.1\n"
                "  hdecode compare --metrics tree_distance,hf_beta --betas 1 --decoders argmax_leaf,majority"))
    p.set_defaults(_run="compare:run", _check=check_compare, _parser=p)
    add_hierarchy_args(p)
    src = p.add_argument_group("model outputs")
    src.add_argument("--probs", metavar="FILE", help="(B, L) probabilities (or logits with --from-logits): "
                     ".npy, .pt, .csv, .tsv or .txt; column j is leaf j of the hierarchy; '-' reads standard input; "
                     "or top-k lists of probabilities, a .npz (or a .pt dict) with 'values' and 'indices' (B, k): "
                     "the metrics and heuristics that decode them run, the others are named as not applicable; "
                     "--alpha fits and scores risk control on them")
    src.add_argument("--targets", metavar="FILE", help="(B,) true leaf ids: .npy, .pt, .csv or .txt (one per line); "
                     "'-' reads standard input")
    add_input_kind_args(src)
    add_calibration_args(src, decode=False)
    src.add_argument("--num-samples", type=int_in(1, 10 ** 8), default=None, metavar="B",
                     help=f"synthetic outputs: number of samples (default: {DEFAULT_NUM_SAMPLES})")
    src.add_argument("--noise", type=finite_float(0.0, lo_open=True), default=None,
                     help=f"synthetic outputs: temperature of the logit model, larger = more underdetermined "
                          f"(default: {SYNTHETIC_NOISE}; the argmax leaf is then right about half the time)")
    src.add_argument("--seed", type=int_in(0, MAX_SEED), default=None,
                     help=f"random seed of the synthetic outputs, or of the --calibrate split "
                          f"(default: {DEFAULT_SEED})")
    add_risk_args(p.add_argument_group("risk control"), alpha_default=None)
    sel = p.add_argument_group("metrics and decoders")
    sel.add_argument("--metrics", "--metric", dest="metrics", nargs="+", metavar="NAME",
                     help="metric names or specs such as hf_beta[beta=0.5], comma or space separated (default: all: "
                          f"{', '.join(DEFAULT_METRICS)})")
    add_metric_params(sel, multi=True)
    sel.add_argument("--decoders", "--decoder", dest="decoders", nargs="+", metavar="NAME",
                     help="heuristic decoder names or specs such as darts[lam=2], comma or space separated, or all "
                          "(default: all: "
                          f"{', '.join(HEURISTIC_NAMES)}); the optimal decoder is always included")
    add_decoder_param_args(sel)
    run_ = p.add_argument_group("run")
    add_run_args(run_)
    run_.add_argument("--json", metavar="PATH", help="also write the results as JSON (schema_version 1: metadata "
                      "with the setting, timings and versions, apart from the results)")
    out = p.add_argument_group("table")
    out.add_argument("--transpose", action="store_true",
                     help="a row per decoder and a column per metric (default: a row per metric)")
    out.add_argument("--width", type=int_in(20, 100_000), default=None,
                     help="wrap the table to this many characters (default: the terminal's width; "
                          f"{DEFAULT_TABLE_WIDTH} when the output is not a terminal)")


def check_compare(args) -> None:
    inputs = {"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
              "--leaf-order": args.leaf_order}
    check_distinct_inputs(inputs)
    if args.json is not None:
        check_output_path(args.json, "--json", inputs=inputs)
    else:
        require_stdout("no --json is given: the results would be lost")
    _check_source(args, "compare", "score decoders", [("--calibrate", args.calibrate)],
                  ", calibrated by construction")
    if args.probs is not None:
        if args.seed is not None and not args.calibrate and args.alpha is None:
            raise CLIError("--seed applies to synthetic outputs or to the --calibrate / --alpha split, not to --probs "
                           "alone")
        if args.calibrate:
            _check_calibration_input(args)
    if args.calibration_split is not None and not args.calibrate and args.alpha is None:
        raise CLIError("--calibration-split applies to --calibrate and --alpha")
    if args.delta is not None and args.alpha is None:
        raise CLIError("--delta applies to --alpha (the confidence bound of risk control at level alpha)")
    check_before_torch(args, metrics=args.metrics or DEFAULT_METRICS, decoders=args.decoders or HEURISTIC_NAMES,
                       files=("--probs", "--targets"))


# --------------------------------------------------------------------------- decode
def _add_decode(sub) -> None:
    p = sub.add_parser(
        "decode", help="decode a file of probabilities with a metric's optimal decoder or a heuristic",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Decode (B, L) leaf probabilities into hierarchical predictions.\n\n"
            "--metric M: the Bayes-optimal prediction for metric M (node ids; for the set metrics\n"
            "hf_beta, hamming and jaccard, ancestor-closed node sets).  --decoder D: a heuristic (node ids).\n"
            "--alpha A: risk control (node ids), fitted on a held-out split of the rows with --targets:\n"
            "on new rows exchangeable with the fit rows (not on the fit rows themselves), its expected miss\n"
            "rate is at most A (with --delta D: at most A with probability 1 - D); every row is decoded.\n"
            "--risk-lambda λ: the same decoder at a λ fitted earlier, without --targets.\n\n"
            "Output (--output, by extension): .npy / .pt: (B,) int64 node ids, or (B, N) bool set masks;\n"
            ".npz: the same as the array 'pred' (with --certify, also 'certified' and 'regret_bound').\n"
            "A set metric's decisions on top-k lists are sparse, never a (B, N) mask: .pt holds a sparse\n"
            "COO (B, N) bool tensor, .npz the arrays 'pred_indices' ((2, nnz) int64 row, node pairs) and\n"
            "'pred_shape' ((B, N)); .npy is refused; the text formats are the same as for dense sets.\n"
            ".csv: one row per sample (column 'node', or 'nodes' with ';'-separated ids, root first);\n"
            ".jsonl: one JSON object per line ({\"node\": id} or {\"nodes\": [ids]}).  Without --output,\n"
            "or to a device or a pipe (-o /dev/null), one line per sample as on stdout.  --names writes\n"
            "readable labels instead of ids (.csv, stdout) or next to them (.jsonl).  The output is\n"
            "written to a temporary file and moved into place when complete: an error, Ctrl-C or a\n"
            "SIGTERM leaves an existing file as it was.\n\n"
            "--probs - reads standard input: .npy or .pt bytes (recognised by their first bytes) or a\n"
            "text table (comma, tab or whitespace separated)."),
        epilog=("examples:\n"
                "  hdecode decode --probs probs.npy --metric hf_beta --beta 0.5 --output sets.jsonl --names\n"
                "  hdecode decode --hierarchy tree.csv --probs logits.pt --from-logits --metric wu_palmer\n"
                "  hdecode decode --probs probs.npy --decoder darts --lam 0.5 --output pred.npy\n"
                "  hdecode decode --probs val_logits.npy --from-logits --calibrate --targets val_labels.npy "
                "--metric zhao -o pred.csv\n"
                "  hdecode decode --probs probs.npy --targets labels.npy --alpha 0.1 --output pred.npy\n"
                "  hdecode decode --probs test_probs.npy --risk-lambda 0.8422 --output pred.npy\n"
                "  python make_probs.py | hdecode decode --probs - --metric tree_distance"))
    p.set_defaults(_run="decode:run", _check=check_decode, _parser=p)
    add_hierarchy_args(p)
    src = p.add_argument_group("model outputs")
    src.add_argument("--probs", required=True, metavar="FILE",
                     help="(B, L) probabilities (or logits with --from-logits): .npy, .pt, .csv, .tsv or .txt; "
                          "'-' reads standard input; or top-k lists of probabilities, a .npz (or a .pt dict) with "
                          "'values' and 'indices' (B, k), decoded exactly for their completed distribution by every "
                          "metric and decoder and by risk control (--alpha fits λ on the fit rows' lists, each read "
                          "as its completed distribution)")
    add_input_kind_args(src)
    what = p.add_argument_group("what to decode (one of --metric, --decoder, --alpha, --risk-lambda)")
    # Not required=True: argparse would name only some of the four; check_decode names them all.
    one = what.add_mutually_exclusive_group()
    one.add_argument("--metric", "--metrics", dest="metric", metavar="NAME",
                     help=f"optimal decoder of this metric ({', '.join(METRIC_NAMES)})")
    one.add_argument("--decoder", "--decoders", dest="decoder", metavar="NAME",
                     help=f"a heuristic decoder ({', '.join(HEURISTIC_NAMES)})")
    one.add_argument("--alpha", type=unit_open, default=None, metavar="A",
                     help="risk control (hd.RiskControl, its own decoder: not with --metric or --decoder): fit λ on "
                          "a held-out split of the rows (--targets, --calibration-split, --seed) so that the expected "
                          "miss rate (the target not under the answer) is at most A, 0 < A < 1, on new rows "
                          "exchangeable with them, then decode every row from the root, stepping into the most "
                          "probable child while its p > λ; λ, the fit rows' miss rate and the guarantee are printed "
                          "on standard error")
    one.add_argument("--risk-lambda", type=finite_float(0.0), default=None, metavar="LAMBDA",
                     help="decode with risk control's decoder at a λ >= 0 fitted earlier (the one --alpha prints, "
                          "or compare --alpha's: risk_control.lambda in its --json, all digits): from the root, step "
                          "into the most probable child while its p > LAMBDA; no --targets needed")
    add_metric_params(what, multi=False)
    add_decoder_param_args(what)
    what.add_argument("--delta", type=unit_open, default=None, metavar="D",
                      help="--alpha with an upper confidence bound instead: with probability at least 1 - D over the "
                           "fit rows (i.i.d. like the new rows), the fitted decoder's miss rate is at most A")
    cal = p.add_argument_group("calibration and risk-control fit")
    add_calibration_args(cal, decode=True)
    cal.add_argument("--targets", metavar="FILE",
                     help="--calibrate, --alpha: (B,) true leaf ids of the --probs rows (.npy, .pt, .csv, .txt; '-': "
                          "stdin)")
    cal.add_argument("--seed", type=int_in(0, MAX_SEED), default=None,
                     help=f"--calibrate, --alpha: seed of the random split (default: {DEFAULT_SEED})")
    out = p.add_argument_group("output")
    out.add_argument("--output", "-o", metavar="FILE", help=f"write predictions to FILE ({', '.join(OUTPUT_FORMATS)}; "
                                                            "a device or a pipe gets the lines of stdout)")
    out.add_argument("--names", action="store_true", help="readable node labels instead of ids (text outputs)")
    out.add_argument("--certify", action="store_true",
                     help="top-k lists: also write each row's certificate, 'certified' (the decision is optimal under "
                          "every completion of the list) and 'regret_bound' (a bound on its expected-score regret "
                          "otherwise), as .csv columns, .jsonl fields, .npz/.pt arrays or tab-separated on stdout, "
                          "and print the fraction certified and the mean bound (--metric accuracy, lca_height, "
                          "tree_distance, tree_distance_c, hamming)")
    add_run_args(p.add_argument_group("run"))


def output_format(path: str | None, names: bool) -> str | None:
    """The format of ``--output``: an extension of OUTPUT_FORMATS, or ``None`` for the lines of
    standard output (no ``--output``, or a device or a pipe such as ``/dev/null``)."""
    if path is None or (is_special_file(path) and os.path.splitext(path)[1].lower() not in OUTPUT_FORMATS):
        return None
    ext = os.path.splitext(path)[1].lower()
    if ext not in OUTPUT_FORMATS:
        raise CLIError(f"--output: unknown format {ext or '(no extension)'!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if names and ext in (".npy", ".npz", ".pt"):
        raise CLIError("--names needs a text output (.csv, .jsonl or stdout); .npy/.npz/.pt hold ids")
    return ext


def check_decode(args) -> None:
    # Everything that can be checked without the data is checked first, so that a mistake does not
    # surface only after a long decode.
    inputs = {"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
              "--leaf-order": args.leaf_order}
    check_distinct_inputs(inputs)
    if args.output is not None:
        check_output_path(args.output, "--output", inputs=inputs)
    ext = output_format(args.output, args.names)
    if args.metric is None and args.decoder is None and args.alpha is None and args.risk_lambda is None:
        raise CLIError("what to decode: give one of --metric, --decoder, --alpha (risk control fitted on the rows) "
                       "or --risk-lambda (risk control's decoder at a known λ)")
    if args.delta is not None and args.alpha is None:
        raise CLIError("--delta applies to --alpha (the confidence bound of risk control at level alpha)")
    if args.certify:
        if args.decoder is not None:
            raise CLIError(f"--certify: certificates are of a --metric's optimal decisions, not of --decoder "
                           f"{args.decoder}")
        for flag, value in (("--alpha", args.alpha), ("--risk-lambda", args.risk_lambda)):
            if value is not None:
                raise CLIError(f"--certify: certificates are of a --metric's optimal decisions, not of risk "
                               f"control ({flag})")
        if ext == ".npy":
            raise CLIError("--certify: a .npy file holds one array; write the decisions and their certificates to "
                           ".npz, .pt, .csv or .jsonl")
    if args.output is None:
        require_stdout("no --output is given: the predictions would be lost")
    if args.calibrate:
        _check_calibration_input(args)
        if args.targets is None:
            raise CLIError("--calibrate fits the calibration on labelled rows: add --targets FILE (the true leaf ids "
                           "of the --probs rows)")
    if args.alpha is not None and args.targets is None:
        raise CLIError("--alpha fits risk control's λ on labelled rows: add --targets FILE (the true leaf ids of the "
                       "--probs rows)")
    if not args.calibrate and args.alpha is None:
        for flag, value in (("--targets", args.targets), ("--calibration-split", args.calibration_split),
                            ("--seed", args.seed)):
            if value is not None:
                raise CLIError(f"{flag} applies to --calibrate and --alpha")
    check_before_torch(args, metrics=[args.metric] if args.metric is not None else [],
                       decoders=[args.decoder] if args.decoder is not None else [], metric_flag="--metric",
                       decoder_flag="--decoder", heuristics_only=False, single=True, files=("--probs", "--targets"))


# --------------------------------------------------------------------------- plot
def _add_plot(sub) -> None:
    p = sub.add_parser("plot", help="figures: decoder agreement on the simplex, gain of optimal decoding vs noise, "
                                    "risk-coverage curve, node reliability per depth", allow_abbrev=False,
                       description="Figures of the paper, recomputed: `plot agreement` and `plot gain`; the "
                                   "risk-coverage curve of risk control: `plot risk`; and the reliability of the "
                                   "node probabilities at each depth of the tree: `plot reliability`.")
    psub = p.add_subparsers(dest="plot_command", required=True, metavar="FIGURE")
    image_help = ("image file to write: .png, .pdf, .svg, ... (no extension: .png is added); written to a temporary "
                  "file and moved into place when complete")
    dpi_help = f"resolution of raster images, 10..{MAX_DPI} (default: {DEFAULT_DPI})"

    a = psub.add_parser(
        "agreement", help="where a metric's optimal decoder agrees with a heuristic, on the 3-leaf simplex",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Agreement map (the paper's Fig. 2): on the tree root -> (X, C), X -> (A, B), every point of\n"
            "the probability simplex over the leaves A, B, C is decoded by the optimal decoder of --metric\n"
            "and by each --decoder (heuristic); green where they predict the same node (or, for set\n"
            "metrics, the same ancestor set), red where they differ."),
        epilog="example:\n"
               "  hdecode plot agreement --metric hf_beta --beta 1 --decoders majority --output agreement.png\n"
               "  hdecode plot agreement --metric wu_palmer --decoders all --output wu_palmer.png")
    a.set_defaults(_run="plot:run_agreement", _check=check_plot_agreement, _parser=a)
    a.add_argument("--metric", "--metrics", dest="metric", default="hf_beta",
                   help="metric whose optimal decoder is mapped (default: hf_beta)")
    add_metric_params(a, multi=False)
    a.add_argument("--decoders", "--decoder", "--heuristic", "--heuristics", dest="decoders", nargs="+",
                   metavar="NAME", help="heuristic decoder(s), comma or space separated, or all (default: majority)")
    add_decoder_param_args(a)
    a.add_argument("--resolution", type=int_in(2, 1000), default=DEFAULT_RESOLUTION,
                   help=f"grid steps per simplex edge, 2..1000; the map has resolution² cells (default: "
                        f"{DEFAULT_RESOLUTION})")
    a.add_argument("--output", "-o", required=True, metavar="IMAGE", help=image_help)
    a.add_argument("--dpi", type=int_in(10, MAX_DPI), default=DEFAULT_DPI, help=dpi_help)
    add_progress_arg(a)

    g = psub.add_parser(
        "gain", help="relative gain (%%) of optimal decoding over each heuristic vs the noise level",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The paper's blur experiment on synthetic calibrated outputs: for each noise level (the\n"
            "temperature of the synthetic model; larger = more underdetermined) and seed, draw outputs,\n"
            "decode them with each metric's optimal decoder and each heuristic, and plot the relative gain\n"
            "(%) of optimal decoding over each heuristic: 100·(U_opt − U_h)/|U_h| for a score,\n"
            "100·(C_h − C_opt)/C_h for a cost.  Lines: mean over seeds; bands: 95% confidence intervals."),
        epilog="example:\n  hdecode plot gain --output gain.png\n"
               "  hdecode plot gain --metrics tree_distance,wu_palmer --num-seeds 5 --num-samples 5000 "
               "--output gain.png")
    g.set_defaults(_run="plot:run_gain", _check=check_plot_gain, _parser=g)
    add_hierarchy_args(g)
    g.add_argument("--metrics", "--metric", dest="metrics", nargs="+", metavar="NAME",
                   help="metrics, one panel each (default: hf_beta at each --betas)")
    add_metric_params(g, multi=True)
    g.add_argument("--decoders", "--decoder", dest="decoders", nargs="+", metavar="NAME",
                   help="heuristics, comma or space separated, or all (default: all)")
    add_decoder_param_args(g)
    g.add_argument("--noise", type=finite_float(0.0, lo_open=True), nargs="+", default=None,
                   help=f"noise levels > 0 (default: {' '.join(f'{x:g}' for x in DEFAULT_GAIN_NOISE)})")
    g.add_argument("--num-seeds", type=int_in(1, 10_000), default=None,
                   help=f"seeds per noise level, for the confidence bands (default: {DEFAULT_GAIN_SEEDS})")
    g.add_argument("--seeds", dest="old_seeds", type=int_in(1, 10_000), default=None, help=argparse.SUPPRESS)
    g.add_argument("--seed", type=int_in(0, MAX_SEED - 10_000), default=DEFAULT_SEED,
                   help=f"the first seed; seeds SEED..SEED+num_seeds-1 are used (default: {DEFAULT_SEED})")
    g.add_argument("--num-samples", type=int_in(1, 10 ** 8), default=DEFAULT_GAIN_SAMPLES,
                   help=f"samples per seed and noise level (default: {DEFAULT_GAIN_SAMPLES})")
    add_run_args(g)
    g.add_argument("--output", "-o", required=True, metavar="IMAGE", help=image_help)
    g.add_argument("--json", metavar="PATH", help="also write the plotted numbers as JSON (schema_version 1; NaN "
                                                  "gains are null)")
    g.add_argument("--dpi", type=int_in(10, MAX_DPI), default=DEFAULT_DPI, help=dpi_help)
    _add_plot_risk(psub, image_help, dpi_help)
    _add_plot_reliability(psub, image_help, dpi_help)


def check_plot_agreement(args) -> None:
    check_before_torch(args, metrics=[args.metric], decoders=args.decoders or ["majority"], metric_flag="--metric",
                       single=True)


def check_plot_gain(args) -> None:
    check_before_torch(args, metrics=args.metrics or ["hf_beta"], decoders=args.decoders or HEURISTIC_NAMES)


def _add_figure_source_args(p):
    """The tree and where a figure's outputs come from: --probs/--targets files, or synthetic ones
    (--num-samples, --noise, --seed); returns the "model outputs" group for more options."""
    add_hierarchy_args(p)
    src = p.add_argument_group("model outputs")
    src.add_argument("--probs", metavar="FILE", help="(B, L) probabilities (or logits with --from-logits): "
                     ".npy, .pt, .csv, .tsv or .txt; '-' reads standard input")
    src.add_argument("--targets", metavar="FILE", help="(B,) true leaf ids: .npy, .pt, .csv or .txt; '-' reads "
                     "standard input")
    add_input_kind_args(src)
    src.add_argument("--num-samples", type=int_in(2, 10 ** 8), default=None, metavar="B",
                     help=f"synthetic outputs: number of samples (default: {DEFAULT_NUM_SAMPLES})")
    src.add_argument("--noise", type=finite_float(0.0, lo_open=True), default=None,
                     help=f"synthetic outputs: temperature of the logit model (default: {SYNTHETIC_NOISE})")
    src.add_argument("--seed", type=int_in(0, MAX_SEED), default=None,
                     help=f"random seed of the synthetic outputs and of the split (default: {DEFAULT_SEED})")
    return src


def _add_plot_risk(psub, image_help: str, dpi_help: str) -> None:
    r = psub.add_parser(
        "risk", aliases=["risk-coverage"], help="risk-coverage curve of risk control: miss rate and depth vs lambda",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The risk-coverage curve of hd.RiskControl (descend from the root while the most probable\n"
            "child has p > λ): λ is fitted at --alpha (and --delta) on a random part of the rows\n"
            "(--calibration-split, --seed); on the other rows, the miss rate (the target not under the\n"
            "answer) and the mean depth of the answers as λ moves from 0 (deepest) to 1 (the root), with\n"
            f"the fitted λ and the level marked, at {DEFAULT_RISK_POINTS} evenly spaced λ (--points) and the\n"
            "fitted one.\n\n"
            "Without --probs: synthetic calibrated outputs on the hierarchy.  With --probs/--targets:\n"
            "your model's outputs, or top-k lists of probabilities (a .npz or a .pt dict with 'values'\n"
            "and 'indices', (B, k)): λ and the curve are then those of their completed distribution (the\n"
            "missing mass spread over the unlisted leaves), exactly as on that dense table."),
        epilog="examples:\n  hdecode plot risk --output risk.png\n"
               "  hdecode plot risk --probs val_probs.npy --targets val_labels.npy --alpha 0.05 --delta 0.1 "
               "--output risk.png --json risk.json")
    r.set_defaults(_run="plot:run_risk", _check=check_plot_risk, _parser=r)
    _add_figure_source_args(r)
    risk = r.add_argument_group("risk control")
    add_risk_args(risk, alpha_default=DEFAULT_ALPHA)
    add_split_arg(risk, "the fraction of the rows, drawn at random (--seed), used to fit λ; the curve is drawn on "
                        "the others")
    risk.add_argument("--points", type=int_in(2, 1_000_000), default=DEFAULT_RISK_POINTS,
                      help=f"evenly spaced λ in [0, 1] where the curve is drawn (default: {DEFAULT_RISK_POINTS})")
    add_run_args(r, batch=False, imports=False)
    r.add_argument("--output", "-o", required=True, metavar="IMAGE", help=image_help)
    r.add_argument("--json", metavar="PATH", help="also write the plotted numbers as JSON (schema_version 1)")
    r.add_argument("--dpi", type=int_in(10, MAX_DPI), default=DEFAULT_DPI, help=dpi_help)


def check_plot_risk(args) -> None:
    check_distinct_inputs({"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
                           "--leaf-order": args.leaf_order})
    _check_source(args, "plot risk", "fit and draw the curve")
    check_before_torch(args, files=("--probs", "--targets"))


def _add_plot_reliability(psub, image_help: str, dpi_help: str) -> None:
    r = psub.add_parser(
        "reliability", help="reliability diagrams of the node probabilities, one per depth, before/after calibration",
        allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "The optimal decoders read p(n) at every node of the tree.  For each depth, the (row, node)\n"
            "pairs are binned by p(n) (--bins), and each bin's mean p(n) is drawn against how often its\n"
            "node holds the label: on the diagonal where the model is calibrated.  The title of each\n"
            "panel gives the depth's node ECE.  With --calibrate, the calibration is fitted on a random\n"
            "part of the rows (--calibration-split, --seed) and both curves are drawn on the others.\n\n"
            "Without --probs: a synthetic model with a known miscalibration (--distortion, --strength),\n"
            "its logits scored against labels drawn from the true probabilities.  With --probs/--targets:\n"
            "your model's outputs."),
        epilog="examples:\n  hdecode plot reliability --calibrate hierarchical --output reliability.png\n"
               "  hdecode plot reliability --probs val_logits.npy --targets val_labels.npy --from-logits "
               "--calibrate hierarchical --output reliability.png --json reliability.json")
    r.set_defaults(_run="plot:run_reliability", _check=check_plot_reliability, _parser=r)
    src = _add_figure_source_args(r)
    src.add_argument("--distortion", choices=DISTORTIONS, default=None,
                     help=f"synthetic outputs: how the model distorts the true probabilities (default: "
                          f"{DEFAULT_DISTORTION}: flatter conditionals near the root, sharper deep down)")
    src.add_argument("--strength", type=finite_float(0.0, lo_open=True), default=None, metavar="K",
                     help=f"synthetic outputs: the distortion's strength, 1 = none (default: {DEFAULT_STRENGTH:g})")
    cal = r.add_argument_group("calibration")
    add_calibration_args(cal, decode=False)
    r.add_argument("--bins", type=int_in(2, 1000), default=DEFAULT_BINS,
                   help=f"equal-width bins of p(n) in [0, 1] (default: {DEFAULT_BINS})")
    add_run_args(r, batch=False, imports=False)
    r.add_argument("--output", "-o", required=True, metavar="IMAGE", help=image_help)
    r.add_argument("--json", metavar="PATH", help="also write the plotted numbers as JSON (schema_version 1; empty "
                                                  "bins are null)")
    r.add_argument("--dpi", type=int_in(10, MAX_DPI), default=DEFAULT_DPI, help=dpi_help)


def check_plot_reliability(args) -> None:
    check_distinct_inputs({"--probs": args.probs, "--targets": args.targets, "--hierarchy": args.hierarchy,
                           "--leaf-order": args.leaf_order})
    _check_source(args, "plot reliability", "compare the probabilities with the labels",
                  synthetic_note=" from a model with a known miscalibration")
    if args.probs is not None:
        for flag, val in (("--distortion", args.distortion), ("--strength", args.strength)):
            if val is not None:
                raise CLIError(f"{flag} applies to synthetic outputs, not to --probs")
        if args.calibrate:
            _check_calibration_input(args)
    if args.calibration_split is not None and not args.calibrate:
        raise CLIError("--calibration-split applies to --calibrate")
    check_before_torch(args, files=("--probs", "--targets"))


def _check_source(args, command: str, purpose: str, probs_only=(), synthetic_note: str = "") -> None:
    """Where the outputs come from: synthetic ones (no --probs; the options of files refused) or files
    (--probs with --targets; the options of synthetic outputs refused).  ``probs_only``: more
    (flag, value) pairs that apply to files only."""
    if args.probs is None:
        if args.targets is not None:
            raise CLIError(f"--targets needs --probs (without --probs, {command} draws synthetic outputs)")
        for flag, given in (("--from-logits", args.from_logits), ("--normalize", args.normalize), *probs_only):
            if _given(given):
                raise CLIError(f"{flag} applies to --probs (without --probs, {command} draws synthetic outputs"
                               f"{synthetic_note})")
        return
    for flag, val in (("--num-samples", args.num_samples), ("--noise", args.noise)):
        if val is not None:
            raise CLIError(f"{flag} applies to synthetic outputs, not to --probs")
    if args.targets is None:
        raise CLIError(f"--probs needs --targets (the true leaf ids) to {purpose}")


# --------------------------------------------------------------------------- info
def _add_info(sub) -> None:
    p = sub.add_parser("info", help="statistics of a hierarchy and its leaves in column order",
                       allow_abbrev=False,
                       description="Print statistics of a bundled hierarchy or of a JSON/CSV/edge-list file (sizes, "
                                   "depths, branching, single-child chains), and its leaves in the model's column "
                                   "order: column j of --probs is the j-th leaf listed.",
                       epilog="examples:\n  hdecode info --hierarchy inat19\n"
                              "  hdecode info --hierarchy tree.csv --json\n"
                              "  hdecode info --hierarchy tree.csv --leaf-order classes.txt",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(_run="info:run", _check=check_info, _parser=p)
    add_hierarchy_args(p)
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of text (schema_version 1: the statistics and the leaf order under "
                        "results)")
    add_progress_arg(p)


def check_info(args) -> None:
    require_stdout("info prints to it")

