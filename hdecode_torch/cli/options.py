"""Defaults, names and argument types of the command line, without torch.

``hdecode --help``, ``--version`` and every error argparse reports are answered from this
module and :mod:`.commands` alone, before torch (about two seconds to import) is loaded.  So the
metric and decoder names the help texts list, and the options of their parameters with their
defaults, come from the torch-free copy of the classes' declarations (:mod:`.catalogue`).  Every option
that several subcommands take is defined here once, with one default, so that ``--tau``,
``--batch-size``, ... mean the same everywhere.  Parameters of a metric or decoder (``--beta``,
``--c``, ``--tau``, ``--lam``, ``--info-threshold``: each a ``Flag`` on the parameter it sets) default
to ``None`` on the command line: giving one for a metric or decoder that is not selected is an error,
not ignored.
"""

from __future__ import annotations

import argparse
import math

from .catalogue import CATALOGUE

# ---------------------------------------------------------------------------- names (from the catalogue)
#: ``hdecode_torch.list_metrics()``, in its order.
METRIC_NAMES = tuple(n for n, f in CATALOGUE["metrics"].items() if f["listed"])
#: ``hdecode_torch.list_decoders()`` without ``optimal``, in its order.
HEURISTIC_NAMES = tuple(n for n, f in CATALOGUE["decoders"].items() if f["listed"] and n != "optimal")
#: ``hdecode_torch.list_hierarchies()``.
HIERARCHY_NAMES = ("inat19", "tieredimagenet-h")
#: ``hdecode_torch.synthetic.DEFAULT_NOISE``.
SYNTHETIC_NOISE = 0.75


def _flags(kind: str) -> list[tuple[str, dict]]:
    """``(owner, flag facts)`` of every parameter option the catalogue's ``kind`` ("metrics"/"decoders") declares."""
    return [(owner, flag) for owner, facts in CATALOGUE[kind].items() for flag in facts["flags"]]


#: ``(owner, flag facts)`` of the metrics' and the decoders' parameter options, in registration order.
METRIC_FLAGS, DECODER_FLAGS = _flags("metrics"), _flags("decoders")


def _flag_default(owner: str, param: str, key: str = "default"):
    for who, flag in METRIC_FLAGS + DECODER_FLAGS:
        if who == owner and flag["param"] == param:
            return flag[key]
    raise KeyError((owner, param))


# ---------------------------------------------------------------------------- defaults (one place)
DEFAULT_HIERARCHY = "tieredimagenet-h"
# Every metric, one entry each; a metric with a swept parameter (hf_beta over --betas) is expanded.
DEFAULT_METRICS = list(METRIC_NAMES)
# The parameters' command-line defaults, as their classes declare them (names kept for importers).
DEFAULT_BETA = _flag_default("hf_beta", "beta")  # decode, plot agreement: one hf_beta
DEFAULT_BETAS = tuple(_flag_default("hf_beta", "beta", "sweep"))  # compare, plot gain: hf_beta at each
DEFAULT_C = _flag_default("tree_distance_c", "c")
DEFAULT_TAU = _flag_default("confidence_threshold", "tau")
DEFAULT_LAM = _flag_default("darts", "lam")
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


def add_flag(p, owner: str, flag: dict, *, multi: bool = False) -> None:
    """The option of one declared parameter (``flag``: its facts, as in the catalogue), for ``owner``.

    ``multi``: the command scores several metrics, so an option with a ``sweep`` takes several values
    under its plural (``--betas``, the singular an alias; default: the sweep).  Unset, it is ``None``.
    """
    kind = finite_float(flag["lower"], lo_open=flag["lower_open"]) if flag["lower"] is not None else finite_float()
    option, param = flag["option"], flag["param"]
    if multi and flag["sweep"]:
        p.add_argument(option + "s", option, dest=option.lstrip("-").replace("-", "_") + "s", type=kind, nargs="+",
                       default=None, metavar=param.upper(),
                       help=f"{owner}: {flag['help']}; several values score one metric each (default: "
                            f"{' '.join(f'{v:g}' for v in flag['sweep'])})")
    else:
        p.add_argument(option, *([option + "s"] if flag["sweep"] else []), type=kind, default=None,
                       metavar=param.upper(), help=f"{owner}: {flag['help']} (default: {flag['default_text']})")


def add_metric_params(p, *, multi: bool, flags=None) -> None:
    """The options of the metrics' parameters (``flags``: ``(owner, facts)``, default: the catalogue's)."""
    p.set_defaults(_metric_params=multi)  # which options an --import module's metrics get (cli.common)
    for owner, flag in METRIC_FLAGS if flags is None else flags:
        add_flag(p, owner, flag, multi=multi)


def add_decoder_param_args(p, flags=None) -> None:
    """The options of the decoders' parameters (``flags``: ``(owner, facts)``, default: the catalogue's)."""
    p.set_defaults(_decoder_params=True)
    for owner, flag in DECODER_FLAGS if flags is None else flags:
        add_flag(p, owner, flag)


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
    add_split_arg(p, "--calibrate, --alpha: the fraction of the rows, drawn at random (--seed), used to fit the "
                     "calibration or λ (with both: half of them each); every row is decoded"
                  if decode else
                  "--calibrate, --alpha: the fraction of the rows, drawn at random (--seed), held out to fit the "
                  "calibration and λ (with both: half of them each) and not scored", hi_open=not decode)


def add_split_arg(p, what: str, *, hi_open: bool = True) -> None:
    p.add_argument("--calibration-split", type=finite_float(0.0, lo_open=True, hi=1.0, hi_open=hi_open),
                   default=None, metavar="FRACTION", help=f"{what} (default: {DEFAULT_CALIBRATION_SPLIT})")
