"""Defaults, names and argument types of the command line, without torch.

``hdecode --help``, ``--version`` and every error argparse reports are answered from this
module and :mod:`.commands` alone, before torch (about two seconds to import) is loaded.  So the
names the help texts list are a static table here: ``tests/test_cli.py`` checks that they are the
library's registries.  Every option that several subcommands take is defined here once, with one
default, so that ``--tau``, ``--batch-size``, ... mean the same everywhere.  Parameters of a metric
or decoder (``--beta``, ``--c``, ``--tau``, ``--lam``, ``--info-threshold``) default to ``None`` on
the command line: giving one for a metric or decoder that is not selected is an error, not ignored.
"""

from __future__ import annotations

import argparse
import math

# ---------------------------------------------------------------------------- names (static copies)
#: ``hdecode_torch.list_metrics()``, in its order.
METRIC_NAMES = ("accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao", "hf_beta",
                "hamming", "jaccard")
#: ``hdecode_torch.list_decoders()`` without ``optimal``, in its order.
HEURISTIC_NAMES = ("argmax_leaf", "top_down", "confidence_threshold", "majority", "plurality", "darts",
                   "expected_information", "information_threshold", "hie", "crm")
#: ``hdecode_torch.list_hierarchies()``.
HIERARCHY_NAMES = ("inat19", "tieredimagenet-h")
#: ``hdecode_torch.synthetic.DEFAULT_NOISE``.
SYNTHETIC_NOISE = 0.75

# ---------------------------------------------------------------------------- defaults (one place)
DEFAULT_HIERARCHY = "tieredimagenet-h"
# Every metric, one entry each; hf_beta is expanded over --betas.
DEFAULT_METRICS = list(METRIC_NAMES)
DEFAULT_BETA = 1.0  # decode, plot agreement: one hf_beta
DEFAULT_BETAS = (0.5, 1.0, 2.0)  # compare, plot gain: hf_beta at each
# tree_distance_c's rule is "deepest node with p(n) > (1 + c)/2": c = 1/2 moves the threshold from
# 1/2 to 3/4, a visible change, while any c >= 1 puts it at >= 1, which only the root reaches.
DEFAULT_C = 0.5
# confidence_threshold: tau = 1/2 is `majority`, already a decoder of its own; 0.8 is a distinct,
# more cautious rule.
DEFAULT_TAU = 0.8
DEFAULT_LAM = 1.0  # darts; lam = 0 is `expected_information`, a decoder of its own
DEFAULT_BATCH_SIZE = 1024
DEFAULT_THREADS = 1
DEFAULT_DPI = 120
DEFAULT_SEED = 0
DEFAULT_CALIBRATION_SPLIT = 0.5
DEFAULT_ALPHA = 0.1  # plot risk: the level of the fitted λ it marks
# plot risk: the curve is drawn at this many evenly spaced λ in [0, 1] (and at the fitted λ): every row's
# path has a threshold of its own, so the exact curve has up to B·D steps, too many for a JSON file.
DEFAULT_RISK_POINTS = 1001
# About 10 s on a loaded 2-core CPU (single thread); the standard error of a [0, 1] metric is then ~0.003
# and that of a paired difference between decoders usually below 0.001.
DEFAULT_NUM_SAMPLES = 20_000
# plot gain: small enough for well under a minute on a 2-core CPU (7 noise levels x 3 seeds x 2000 samples).
DEFAULT_GAIN_NOISE = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
DEFAULT_GAIN_SEEDS = 3
DEFAULT_GAIN_SAMPLES = 2000
DEFAULT_RESOLUTION = 200  # plot agreement: grid steps per simplex edge
#: Tables printed to a file or a pipe are wrapped to this width (a terminal: its own width).
DEFAULT_TABLE_WIDTH = 100
MAX_SEED = 2 ** 63 - 1
MAX_DPI = 1200
MAX_FIGURE_PIXELS = 60_000_000  # ~240 MB of RGBA while drawing

C_HELP = (f"tree_distance_c: cost c >= 0 per level of the prediction's depth (default: {DEFAULT_C}). Its optimal "
          "rule predicts the deepest node with p(n) > (1+c)/2, so any c >= 1 makes that threshold >= 1 and the "
          "root the answer for every sample")


# ---------------------------------------------------------------------------- argument types
def int_in(lo: int, hi: int):
    """An argparse type: an int in ``lo..hi`` (the message names the range; argparse adds the flag)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not lo <= value <= hi:
            top = "2^63-1" if hi == MAX_SEED else str(hi)
            raise argparse.ArgumentTypeError(f"expected an integer in {lo}..{top}, got {text}")
        return value
    parse.__name__ = "int"
    return parse


def finite_float(lo: float | None = None, *, lo_open: bool = False, hi: float | None = None, hi_open: bool = False):
    """An argparse type: a finite float, optionally bounded."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad = not math.isfinite(value)
        bad |= lo is not None and (value <= lo if lo_open else value < lo)
        bad |= hi is not None and (value >= hi if hi_open else value > hi)
        if bad:
            parts = []
            if lo is not None:
                parts.append(f"{'>' if lo_open else '>='} {lo:g}")
            if hi is not None:
                parts.append(f"{'<' if hi_open else '<='} {hi:g}")
            raise argparse.ArgumentTypeError(f"expected a finite number{' ' + ' and '.join(parts) if parts else ''}, "
                                             f"got {text}")
        return value
    parse.__name__ = "float"
    return parse


positive_float = finite_float(0.0, lo_open=True)


def from_logits_value(text: str):
    """``--from-logits [auto|true|false]``: the library's ``from_logits`` (True, False or ``"auto"``)."""
    value = {"auto": "auto", "true": True, "false": False}.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected auto, true or false, got {text!r}")
    return value


from_logits_value.__name__ = "auto|true|false"


# ---------------------------------------------------------------------------- shared options
def add_hierarchy_args(p, default: str | None = DEFAULT_HIERARCHY) -> None:
    p.add_argument("--hierarchy", default=default, metavar="NAME|FILE",
                   help=f"bundled tree ({', '.join(HIERARCHY_NAMES)}), a JSON tree file (parents/ids, as written "
                        "by Hierarchy.to_json), or a parent,child edge list (CSV/TSV); '-' reads standard input"
                        + (f" (default: {default})" if default else ""))
    p.add_argument("--leaf-order", metavar="FILE",
                   help="for an edge list: the leaves' names in the model's column order, one per line ('-': "
                        "standard input). Default: the names sorted, by numeric value when every leaf name is a "
                        "number (2 before 10); `hdecode info` prints the order")


def add_input_kind_args(p) -> None:
    """``--from-logits [auto]`` and ``--normalize``: what ``--probs`` holds."""
    p.add_argument("--from-logits", nargs="?", const=True, default=False, type=from_logits_value, metavar="auto",
                   help="--probs holds logits: apply a softmax. '--from-logits auto' decides per chunk: "
                        "probabilities where every row is a distribution, else logits (entries in [0, 1] whose "
                        "rows do not sum to 1 are an error)")
    p.add_argument("--normalize", action="store_true", help="renormalize rows of --probs that do not sum to 1")


def add_metric_params(p, *, multi: bool) -> None:
    if multi:
        p.add_argument("--betas", "--beta", dest="betas", type=positive_float, nargs="+", default=None,
                       metavar="BETA", help="hf_beta: its betas > 0, one metric each (default: "
                                            f"{' '.join(f'{b:g}' for b in DEFAULT_BETAS)})")
    else:
        p.add_argument("--beta", "--betas", dest="beta", type=positive_float, default=None,
                       help=f"hf_beta: beta > 0 (default: {DEFAULT_BETA:g})")
    p.add_argument("--c", type=finite_float(0.0), default=None, help=C_HELP)


def add_decoder_param_args(p) -> None:
    p.add_argument("--tau", type=finite_float(), default=None,
                   help=f"confidence_threshold: the most informative node with p(n) > tau, 0 <= tau < 1 "
                        f"(default: {DEFAULT_TAU})")
    p.add_argument("--lam", type=finite_float(), default=None,
                   help=f"darts: argmax (I(n) + lam) p(n) (default: {DEFAULT_LAM:g})")
    p.add_argument("--info-threshold", type=finite_float(), default=None, metavar="T",
                   help="information_threshold: the most probable node with I(n) >= T (default: ½·log L rounded, "
                        "i.e. nodes with at most about √L leaves)")


def add_run_args(p, *, batch: bool = True, threads: bool = True, device: bool = True, imports: bool = True) -> None:
    if device:
        p.add_argument("--device", default="auto",
                       help="cpu, cuda, cuda:1, ... (default: auto = cuda if available, else cpu)")
    if batch:
        p.add_argument("--batch-size", type=int_in(1, 10 ** 9), default=DEFAULT_BATCH_SIZE,
                       help=f"samples per chunk (default: {DEFAULT_BATCH_SIZE})")
    if threads:
        p.add_argument("--threads", type=int_in(1, 4096), default=DEFAULT_THREADS,
                       help=f"CPU threads for torch (default: {DEFAULT_THREADS}: the kernels are many small per-level "
                            "operations, for which extra threads mostly add overhead, and thrash on a busy machine)")
    if imports:
        _add_import_arg(p)
    add_progress_arg(p)


def _add_import_arg(p) -> None:
    p.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=None,
                   help="import this Python module first (repeatable), found in the current folder or on the Python "
                        "path, or a file PATH.py: a module that registers metrics or decoders of its own "
                        "(hdecode_torch.register_metric / register_decoder) makes their names usable in --metrics "
                        "and --decoders")


def add_progress_arg(p) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress line (it is shown on a terminal only, on standard error)")


unit_open = finite_float(0.0, lo_open=True, hi=1.0, hi_open=True)


def add_risk_args(p, *, alpha_default: float | None) -> None:
    """``--alpha`` and ``--delta``: the level of risk control and the error probability of its confidence bound."""
    default = "" if alpha_default is None else f" (default: {alpha_default:g})"
    p.add_argument("--alpha", type=unit_open, default=alpha_default, metavar="A",
                   help="risk control: the miss rate to allow, 0 < A < 1 (the target not under the answer): λ of "
                        "hd.RiskControl is fitted on a held-out split of the rows (--calibration-split, --seed) by "
                        "conformal risk control, so that on rows exchangeable with them the expected miss rate is at "
                        f"most A{default}")
    p.add_argument("--delta", type=unit_open, default=None, metavar="D",
                   help="risk control with an upper confidence bound instead: with probability at least 1 - D over "
                        "the calibration rows (i.i.d. like the new rows), the fitted decoder's miss rate is at most A")


CALIBRATIONS = ("temperature", "hierarchical", "auto")
#: hd.synthetic.DISTORTIONS, written here so that the command line is checked before torch loads (a test
#: checks that they are the same).
DISTORTIONS = ("none", "global", "depth", "sharp_leaves", "flat_leaves")
DEFAULT_DISTORTION, DEFAULT_STRENGTH, DEFAULT_BINS = "depth", 2.0, 15


def add_calibration_args(p, *, decode: bool) -> None:
    what = ("fit it on a held-out split of the rows (--calibration-split, needs --targets), then decode every row "
            "with the calibrated logits" if decode else
            "fit it on a held-out split of the rows (--calibration-split) and score the other rows only")
    where = "printed on standard error" if decode else "shown above the table and in --json"
    p.add_argument("--calibrate", nargs="?", const="temperature", default=None, choices=CALIBRATIONS,
                   metavar="KIND",
                   help=f"calibrate the logits (needs --from-logits): {what}. KIND: temperature (the default: one "
                        "temperature T), hierarchical (hd.HierarchicalScaler: the confidence of every depth of the "
                        "tree moves on its own), auto (hierarchical when the node probabilities of the fit rows "
                        "are miscalibrated beyond sampling noise, else none). The fitted parameters, the NLL and "
                        f"the node ECE per depth before/after are {where}")
    add_split_arg(p, "--calibrate: the fraction of the rows, drawn at random (--seed), used to fit the calibration"
                  if decode else
                  "--calibrate, --alpha: the fraction of the rows, drawn at random (--seed), held out to fit the "
                  "calibration and λ (with both: half of them each) and not scored", hi_open=not decode)


def add_split_arg(p, what: str, *, hi_open: bool = True) -> None:
    p.add_argument("--calibration-split", type=finite_float(0.0, lo_open=True, hi=1.0, hi_open=hi_open),
                   default=None, metavar="FRACTION", help=f"{what} (default: {DEFAULT_CALIBRATION_SPLIT})")
