"""Options, defaults and helpers shared by the subcommands.

Every option that several subcommands take is defined here once, with one default, so that
``--tau``, ``--batch-size``, ... mean the same everywhere.  Parameters of a metric or decoder
(``--beta``, ``--c``, ``--tau``, ``--lam``, ``--info-threshold``) default to ``None`` on the
command line: giving one for a metric or decoder that is not selected is an error, not ignored.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..hierarchy import Hierarchy, list_hierarchies, load_hierarchy
from .io import STDIN, CLIError, describe, load_array, one_line, read_input_text

if TYPE_CHECKING:
    from ..integrations.temperature import TemperatureScaler

__all__ = [
    "CLIError", "load_any_hierarchy", "hierarchy_description", "load_array", "load_probs", "load_targets",
    "resolve_device", "DEFAULT_METRICS", "DEFAULT_BETA", "DEFAULT_BETAS", "DEFAULT_C", "DEFAULT_TAU", "DEFAULT_LAM",
    "DEFAULT_BATCH_SIZE", "DEFAULT_THREADS", "DEFAULT_DPI", "DEFAULT_SEED", "DEFAULT_CALIBRATION_SPLIT",
    "default_info_threshold", "build_metrics", "build_heuristics", "heuristic_names", "split_names", "Progress",
    "add_hierarchy_args", "add_decoder_param_args", "check_applicable", "json_document", "json_safe",
    "int_in", "finite_float", "set_threads", "add_calibration_args", "calibration_split", "fit_calibration",
    "calibration_report",
]

# ---------------------------------------------------------------------------- defaults (one place)
DEFAULT_HIERARCHY = "tieredimagenet-h"
# Every metric, one entry each; hf_beta is expanded over --betas.
DEFAULT_METRICS = ["accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao",
                   "hf_beta", "hamming", "jaccard"]
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
MAX_SEED = 2 ** 63 - 1
MAX_DPI = 1200
MAX_FIGURE_PIXELS = 60_000_000  # ~240 MB of RGBA while drawing

C_HELP = (f"tree_distance_c: cost c >= 0 per level of the prediction's depth (default: {DEFAULT_C}). Its optimal "
          "rule predicts the deepest node with p(n) > (1+c)/2, so any c >= 1 makes that threshold >= 1 and the "
          "root the answer for every sample")

SCHEMA_VERSION = 1


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


# ---------------------------------------------------------------------------- shared options
def add_hierarchy_args(p, default: str | None = DEFAULT_HIERARCHY) -> None:
    p.add_argument("--hierarchy", default=default, metavar="NAME|FILE",
                   help=f"bundled tree ({', '.join(list_hierarchies())}), a JSON tree file (parents/ids, as written "
                        "by Hierarchy.to_json), or a parent,child edge list (CSV/TSV); '-' reads standard input"
                        + (f" (default: {default})" if default else ""))
    p.add_argument("--leaf-order", metavar="FILE",
                   help="for an edge list: the leaves' names in the model's column order, one per line ('-': "
                        "standard input). Default: the names sorted, by numeric value when every leaf name is a "
                        "number (2 before 10)")


def add_metric_params(p, *, multi: bool) -> None:
    if multi:
        p.add_argument("--betas", "--beta", dest="betas", type=positive_float, nargs="+", default=None,
                       metavar="BETA", help="hf_beta: its betas > 0, one metric column each (default: "
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


def add_run_args(p, *, batch: bool = True, threads: bool = True, device: bool = True, progress: bool = True) -> None:
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
    if progress:
        p.add_argument("--no-progress", action="store_true",
                       help="no progress bar (it is shown on a terminal only, on standard error)")


# ---------------------------------------------------------------------------- hierarchies
def load_any_hierarchy(spec: str, leaf_order: str | None = None) -> Hierarchy:
    """A bundled name, a ``.json`` file (parents/ids), a CSV/TSV edge list (parent, child), or ``-``
    (standard input: JSON when it starts with ``{``, else an edge list)."""
    import io

    if spec != STDIN and not os.path.exists(spec):
        try:
            tree = load_hierarchy(spec)
        except ValueError:
            raise CLIError(f"--hierarchy {spec!r} is neither a bundled tree ({', '.join(list_hierarchies())}) "
                           "nor an existing file") from None
        if leaf_order is not None:
            raise CLIError("--leaf-order applies to edge-list files; a bundled tree has its own column order")
        return tree
    if spec != STDIN and os.path.isdir(spec):
        raise CLIError(f"--hierarchy: {spec!r} is a folder, not a file")
    order = None
    if leaf_order is not None:
        text = read_input_text(leaf_order, "--leaf-order")
        order = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not order:
            raise CLIError(f"--leaf-order: {describe(leaf_order)} lists no leaf")
    text = read_input_text(spec, "--hierarchy")
    name = "<stdin>" if spec == STDIN else repr(spec)
    # JSON by extension or content; anything else is an edge list.
    is_json = spec.lower().endswith(".json") or text.lstrip().startswith("{")
    if is_json and order is not None:
        raise CLIError("--leaf-order applies to edge-list files; a JSON tree has its own column order")
    src = io.StringIO(text)
    src.name = "<stdin>" if spec == STDIN else spec
    try:
        return Hierarchy.from_json(src) if is_json else Hierarchy.from_edges(src, leaf_order=order)
    except (ValueError, KeyError, TypeError) as exc:
        msg = one_line(exc)
        raise CLIError(f"--hierarchy: {msg}" if name in msg else f"--hierarchy {name}: {msg}") from None


def hierarchy_description(spec: str, h: Hierarchy) -> str:
    where = "standard input" if spec == STDIN else os.path.basename(spec)
    return f"{where} ({h.num_nodes} nodes, {h.num_leaves} leaves, depth {h.max_depth})"


# ---------------------------------------------------------------------------- arrays
def load_probs(path: str, h: Hierarchy, what: str = "--probs") -> torch.Tensor:
    """(B, L) float from a file; integer tables become float64."""
    x = load_array(path, what)
    src = describe(path)
    if x.dtype == torch.bool or x.is_complex() or not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise CLIError(f"{what}: expected a float (B, {h.num_leaves}) array, but {src} has dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float64)
    if x.dim() == 1 and x.numel() == h.num_leaves:
        x = x[None]
    if x.dim() != 2 or x.shape[1] != h.num_leaves:
        raise CLIError(f"{what}: expected shape (B, {h.num_leaves}) (one column per leaf of the hierarchy), "
                       f"but {src} has shape {tuple(x.shape)}")
    return x


def load_targets(path: str, h: Hierarchy, batch: int, what: str = "--targets") -> torch.Tensor:
    """(B,) int64 leaf ids from a file, checked against the tree and the number of rows."""
    y = load_array(path, what)
    src = describe(path)
    if y.dim() == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.dim() != 1:
        raise CLIError(f"{what}: expected a (B,) vector of leaf ids, but {src} has shape {tuple(y.shape)}")
    if y.dtype == torch.bool or y.is_complex():
        raise CLIError(f"{what}: expected integer leaf ids, but {src} has dtype {y.dtype}")
    if y.is_floating_point():  # text files come back as floats
        yd = y.double()
        if not bool(torch.isfinite(yd).all()) or not bool((yd == yd.round()).all()):
            raise CLIError(f"{what}: expected integer leaf ids in {src}, but found non-integer values")
        # Range first: a float beyond int64 would not survive the conversion.
        if yd.numel() and (float(yd.min()) < 0 or float(yd.max()) >= h.num_leaves):
            bad = float(yd.min()) if float(yd.min()) < 0 else float(yd.max())
            raise CLIError(f"{what}: leaf ids must be in 0..{h.num_leaves - 1}, but {src} contains {bad:g}")
    y = y.to(torch.long)
    if y.shape[0] != batch:
        raise CLIError(f"{what}: {src} has {y.shape[0]} targets but the probabilities have {batch} rows")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= h.num_leaves):
        bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
        raise CLIError(f"{what}: leaf ids must be in 0..{h.num_leaves - 1}, but {src} contains {bad}")
    return y


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise CLIError(f"--device: {one_line(exc)}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise CLIError(f"--device {name}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise CLIError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type != "cpu":
        raise CLIError(f"--device {name}: expected cpu, cuda or cuda:N")
    return dev


class set_threads:
    """``with set_threads(n):`` torch intra-op threads for the block, restored after."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.before = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.before)


# ---------------------------------------------------------------------------- metrics and decoders
def default_info_threshold(h: Hierarchy) -> float:
    """Half of a leaf's information, ½·log L, rounded: nodes with at most about √L leaves qualify."""
    return round(0.5 * math.log(max(h.num_leaves, 1)), 2)


def split_names(values, flag: str | None = None) -> list[str]:
    """``--metrics a,b c`` -> ``[a, b, c]``, duplicates removed (first kept).  An option given with
    no name at all (``--metrics ,``) is an error when ``flag`` is given."""
    names = [x.strip() for v in (values or []) for x in v.split(",") if x.strip()]
    if values is not None and not names and flag:
        raise CLIError(f"{flag}: no name given (got {' '.join(values)!r})")
    return list(dict.fromkeys(names))


def build_metrics(h: Hierarchy, names, betas, c) -> list:
    """Metric objects for ``names`` (aliases allowed), ``hf_beta`` expanded over ``betas``;
    the same metric twice (by alias or parameter) is kept once."""
    from ..metrics import get_metric, list_metrics

    known = list(list_metrics())
    out = {}
    for name in names:
        try:
            if name in ("hf_beta", "hf"):
                made = [get_metric("hf_beta", h, beta=b) for b in dict.fromkeys(betas)]
            elif name == "tree_distance_c":
                made = [get_metric(name, h, c=c)]
            else:
                made = [get_metric(name, h)]
        except ValueError as exc:
            if name not in known and "Unknown metric" in str(exc):
                raise CLIError(f"unknown metric {name!r}; available: {', '.join(known)}") from None
            raise CLIError(one_line(exc)) from None
        for m in made:
            out.setdefault(m.key, m)
    if not out:
        raise CLIError("no metric selected")
    return list(out.values())


def heuristic_names() -> list[str]:
    from ..decoders import list_decoders

    return [n for n in list_decoders() if n != "optimal"]


def heuristic_selection(values, flag: str) -> list[str]:
    """Heuristic names from ``--decoders`` values (``all`` = every heuristic; default: all)."""
    if values is None:
        return heuristic_names()
    names = split_names(values, flag)
    if "all" in names:
        names = list(dict.fromkeys([n for n in names if n != "all"] + heuristic_names()))
    known = heuristic_names()
    for name in names:
        if name == "optimal":
            raise CLIError(f"{flag}: 'optimal' is not a heuristic; each metric's optimal decoder is always included")
        if name not in known:
            raise CLIError(f"unknown decoder {name!r}; available: {', '.join(known)}")
    return names


def build_heuristics(h: Hierarchy, names, tau: float | None, lam: float | None, threshold: float | None) -> list:
    from ..decoders import get_decoder

    params = {"confidence_threshold": {"tau": DEFAULT_TAU if tau is None else tau},
              "darts": {"lam": DEFAULT_LAM if lam is None else lam},
              "information_threshold": {"threshold": default_info_threshold(h) if threshold is None else threshold}}
    known = heuristic_names()
    out = []
    for name in names:
        if name not in known:
            raise CLIError(f"unknown decoder {name!r}; available: {', '.join(known)}")
        try:
            out.append(get_decoder(name, h, **params.get(name, {})))
        except ValueError as exc:
            raise CLIError(f"decoder {name!r}: {one_line(exc)}") from None
    return out


# (args attribute, flag, "metric"/"decoder", the one it belongs to)
_PARAM_OWNERS = [
    ("beta", "--beta", "metric", "hf_beta"), ("betas", "--betas", "metric", "hf_beta"),
    ("c", "--c", "metric", "tree_distance_c"),
    ("tau", "--tau", "decoder", "confidence_threshold"), ("lam", "--lam", "decoder", "darts"),
    ("info_threshold", "--info-threshold", "decoder", "information_threshold"),
]


def check_applicable(args, metrics=(), decoders=(), *, metric_flag="--metrics", decoder_flag="--decoders") -> None:
    """A metric or decoder parameter given on the command line for one that is not selected is an error."""
    selected = {"metric": [m.name for m in metrics], "decoder": [d.name for d in decoders]}
    for attr, flag, kind, owner in _PARAM_OWNERS:
        if getattr(args, attr, None) is None or owner in selected[kind]:
            continue
        chosen = ", ".join(dict.fromkeys(selected[kind])) or "none"
        which = metric_flag if kind == "metric" else decoder_flag
        raise CLIError(f"{flag} applies to the {kind} {owner}, which is not selected ({which}: {chosen})")


# ---------------------------------------------------------------------------- calibration
def add_calibration_args(p, *, decode: bool) -> None:
    what = ("fit the temperature on a held-out split of the rows (--calibration-split, needs --targets), then "
            "decode every row with logits / T" if decode else
            "fit the temperature on a held-out split of the rows (--calibration-split) and score the other rows "
            "only")
    where = "printed on standard error" if decode else "shown above the table and in --json"
    p.add_argument("--calibrate", action="store_true",
                   help=f"temperature scaling of the logits (needs --from-logits): {what}; T and the NLL before/after "
                        f"are {where}")
    p.add_argument("--calibration-split", type=finite_float(0.0, lo_open=True, hi=1.0, hi_open=not decode),
                   default=None, metavar="FRACTION",
                   help=f"--calibrate: the fraction of the rows, drawn at random (--seed), used to fit T "
                        f"(default: {DEFAULT_CALIBRATION_SPLIT})")


def calibration_split(num_rows: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit rows, other rows)``, each sorted (B,) int64: ``round(fraction * num_rows)`` rows drawn
    at random with ``seed`` (the same rows for the same arguments, on every machine), and the rest."""
    k = int(round(fraction * num_rows))
    perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(int(seed)))
    return perm[:k].sort().values, perm[k:].sort().values


def fit_calibration(logits: torch.Tensor, targets: torch.Tensor, fit_rows: torch.Tensor,
                    other_rows: torch.Tensor) -> tuple["TemperatureScaler", dict]:
    """Temperature scaling fitted on ``fit_rows``; the NLL before/after on both parts."""
    from ..integrations.temperature import TemperatureScaler

    t0 = time.perf_counter()
    fit_z, fit_y = logits[fit_rows], targets[fit_rows]
    identity = TemperatureScaler()
    scaler = TemperatureScaler().fit(fit_z, fit_y)
    info = {"temperature": scaler.temperature, "fit_rows": int(fit_rows.numel()),
            "other_rows": int(other_rows.numel()),
            "nll_fit_before": identity.negative_log_likelihood(fit_z, fit_y),
            "nll_fit_after": scaler.negative_log_likelihood(fit_z, fit_y),
            "nll_other_before": None, "nll_other_after": None}
    if other_rows.numel():
        z, y = logits[other_rows], targets[other_rows]
        info["nll_other_before"] = identity.negative_log_likelihood(z, y)
        info["nll_other_after"] = scaler.negative_log_likelihood(z, y)
    info["seconds"] = round(time.perf_counter() - t0, 3)
    return scaler, info


def calibration_report(info: dict) -> str:
    text = (f"T = {info['temperature']:.4g} fitted on {info['fit_rows']} rows; NLL {info['nll_fit_before']:.4f} -> "
            f"{info['nll_fit_after']:.4f} on them")
    if info["nll_other_before"] is not None:
        text += (f", {info['nll_other_before']:.4f} -> {info['nll_other_after']:.4f} on the {info['other_rows']} "
                 "held-out rows")
    return text


# ---------------------------------------------------------------------------- JSON outputs
def json_safe(obj):
    """JSON-ready copy: non-finite floats become null (JSON has no NaN), tensors and numpy values lists/numbers."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, torch.Tensor):
        return json_safe(obj.tolist())
    if isinstance(obj, np.generic):
        return json_safe(obj.item())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


def versions() -> dict:
    from .. import __version__

    return {"hdecode_torch": __version__, "torch": torch.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def json_document(command: str, metadata: dict, results: dict) -> dict:
    """``{"schema_version", "hdecode_torch_version", "command", "metadata": {...}, "results": {...}}``:
    what was run (setting, timings, versions) apart from the values it produced."""
    from .. import __version__

    return json_safe({"schema_version": SCHEMA_VERSION, "hdecode_torch_version": __version__, "command": command,
                      "metadata": {**metadata, "versions": versions()}, "results": results})


# ---------------------------------------------------------------------------- progress
def _stderr_is_tty() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()


class Progress:
    """A progress bar on standard error, from the start of the run: tqdm when installed, else a plain
    counter.  Silent unless standard error is a terminal, so that logs and pipes stay clean.

    ``stage(desc, total)`` starts the next phase (drawing data, decoding, ...).
    """

    def __init__(self, desc: str, total: int | None = None, enabled: bool = True, unit: str = "sample"):
        self.enabled = enabled and _stderr_is_tty()
        self.desc, self.total, self.done, self.unit = desc, total, 0, unit
        self._bar = None
        self._last = 0.0
        if not self.enabled:
            return
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr, mininterval=0.2,
                             dynamic_ncols=True, bar_format=self._format(total))
        except ImportError:
            self._draw(force=True)

    @staticmethod
    def _format(total):
        # A phase of unknown length (loading, drawing data) shows its name and the time spent.
        return None if total else "{desc}{elapsed}"

    def stage(self, desc: str, total: int | None = None, unit: str | None = None) -> None:
        self.desc, self.total, self.done = desc, total, 0
        self.unit = unit or self.unit
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.bar_format = self._format(total)
            self._bar.unit = self.unit
            self._bar.set_description(desc, refresh=False)
            self._bar.reset(total=total)
        else:
            self._draw(force=True)

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
        else:
            self._draw()

    def write(self, text: str) -> None:
        """A line on standard error that does not garble the bar."""
        if self._bar is not None and self.enabled:
            self._bar.write(text, file=sys.stderr)
        else:
            if self.enabled:
                sys.stderr.write("\r" + " " * 70 + "\r")
            print(text, file=sys.stderr)
            if self.enabled:
                self._draw(force=True)

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 0.5:
            return
        self._last = now
        count = f"{self.done}/{self.total} {self.unit}s ({100 * self.done / max(self.total, 1):.0f}%)" \
            if self.total else "..."
        sys.stderr.write(f"\r{self.desc}: {count}".ljust(70)[:100])
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\r" + " " * 70 + "\r")
            sys.stderr.flush()
        self.enabled = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
