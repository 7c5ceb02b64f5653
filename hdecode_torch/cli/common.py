"""Helpers of the subcommands that need torch: trees, arrays, metrics and decoders, calibration, JSON.

The options themselves, their defaults and the names the help texts list are in :mod:`.options`
(without torch), re-exported here.
"""

from __future__ import annotations

import math
import os
import platform
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..core.topk import TopK
from ..hierarchy import Hierarchy, list_hierarchies, load_hierarchy
from .io import STDIN, CLIError, describe, load_array, one_line, read_input_text
from .names import check_applicable_names, param_owners
from .options import (  # noqa: F401 - re-exported for the subcommands
    DEFAULT_BATCH_SIZE, DEFAULT_BETA, DEFAULT_BETAS, DEFAULT_C, DEFAULT_CALIBRATION_SPLIT, DEFAULT_DPI,
    DEFAULT_HIERARCHY, DEFAULT_LAM, DEFAULT_METRICS, DEFAULT_SEED, DEFAULT_TAU, DEFAULT_THREADS, MAX_FIGURE_PIXELS,
    finite_float, int_in,
)
from .progress import Progress  # noqa: F401 - re-exported

if TYPE_CHECKING:
    from ..integrations.temperature import TemperatureScaler

__all__ = [
    "CLIError", "load_any_hierarchy", "hierarchy_description", "load_array", "load_probs", "load_targets",
    "resolve_device", "DEFAULT_METRICS", "DEFAULT_BETA", "DEFAULT_BETAS", "DEFAULT_C", "DEFAULT_TAU", "DEFAULT_LAM",
    "DEFAULT_BATCH_SIZE", "DEFAULT_THREADS", "DEFAULT_DPI", "DEFAULT_SEED", "DEFAULT_CALIBRATION_SPLIT",
    "default_info_threshold", "build_metrics", "build_heuristics", "heuristic_names", "split_names", "one_spec",
    "import_modules", "Progress",
    "check_applicable", "json_document", "json_safe", "int_in", "finite_float", "set_threads", "calibration_split",
    "fit_calibration", "calibration_report", "calibration_label", "calibration_check", "node_ece", "held_out_split",
    "fit_risk_control",
    "guarantee_text",
]

SCHEMA_VERSION = 1


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
def load_probs(path: str, h: Hierarchy, what: str = "--probs", top_k: bool = False):
    """(B, L) float from a file; integer tables become float64.  A text table's first row that is the
    column numbers is a header, or an error where it could be a sample (see ``io.load_array``).
    ``top_k``: a file holding ``values`` and ``indices`` (``.npz``, or a dict in a ``.pt``) gives a
    :class:`~hdecode_torch.TopK` of them (its checks against the tree are the decoder's)."""
    x = load_array(path, what, index_header=True, top_k=top_k)
    src = describe(path)
    if isinstance(x, tuple):
        values, indices = x
        if values.dim() == 1:
            values, indices = values[None], indices[None]
        try:
            return TopK(values, indices)
        except (TypeError, ValueError) as exc:
            raise CLIError(f"{what}: {src}: {one_line(exc)}") from None
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
        text = path == STDIN or os.path.splitext(path)[1].lower() in (".csv", ".tsv", ".txt")
        hint = ("; is its first line a header of numbers? Remove it (a header of names is skipped)"
                if text and y.shape[0] == batch + 1 else "")
        raise CLIError(f"{what}: {src} has {y.shape[0]} targets but the probabilities have {batch} rows{hint}")
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
    """Half of a leaf's information, ½·log L, rounded: nodes with at most about √L leaves qualify
    (``information_threshold``'s declared command-line default)."""
    from ..decoders.heuristics import half_log_leaves

    return half_log_leaves(h)


def flag_values(param, args, h: Hierarchy) -> list:
    """The values the command line gives a declared parameter that a spec leaves out: its option's
    (``args``: the parsed arguments, ``None`` for none), else the option's declared default; under a
    command that scores several metrics (``args`` has the plural, ``--betas``), each of the values given
    there, else the declared sweep."""
    flag = param.flag
    if flag.sweep and hasattr(args, flag.dest + "s"):
        given = getattr(args, flag.dest + "s")
        return list(dict.fromkeys(given)) if given is not None else list(flag.sweep)
    given = getattr(args, flag.dest, None)
    return [flag.default_for(param, h) if given is None else given]


def _with_flags(cls, params: dict, args, h: Hierarchy) -> list[dict]:
    """The parameter settings of ``cls`` the command line builds: one per combination of the values
    :func:`flag_values` gives its optioned parameters that the spec (``params``) leaves out."""
    settings = [{}]
    for p in cls.PARAMS:
        if p.flag is not None and p.name not in params:
            settings = [{**s, p.name: v} for s in settings for v in flag_values(p, args, h)]
    return settings


def split_names(values, flag: str | None = None) -> list[str]:
    """``--metrics a,b c`` -> ``[a, b, c]``, commas inside a spec's brackets kept
    (``hf_beta[beta=0.5],darts[lam=1]``), duplicates removed (first kept).  An option given with no
    name at all (``--metrics ,``) is an error when ``flag`` is given."""
    from ..core.spec import split_specs

    names = [x for v in (values or []) for x in split_specs(v)]
    if values is not None and not names and flag:
        raise CLIError(f"{flag}: no name given (got {' '.join(values)!r})")
    return list(dict.fromkeys(names))


def one_spec(text: str, flag: str) -> str:
    """The one metric or decoder spec of ``flag`` (``--metric`` / ``--decoder``)."""
    from ..core.spec import split_specs

    specs = split_specs(text)
    if len(specs) != 1:
        raise CLIError(f"{flag} takes one name or spec such as 'hf_beta[beta=0.5]', got {text!r} "
                       "(hdecode compare scores several)")
    return specs[0]


def import_modules(names) -> None:
    """``--import MODULE``: import each module, which may register metrics and decoders of its own.

    A module name is looked up as ``python -m`` would: in the current folder first, then on the
    Python path (the ``hdecode`` console script alone would not see the current folder).  A path
    ending in ``.py`` is run as that file, as module ``<file name without .py>``, with its folder on
    the path for its own imports.
    """
    import importlib
    import importlib.util
    import sys

    for name in names or ():
        try:
            if name.endswith(".py"):
                path = os.path.abspath(name)
                folder, module = os.path.dirname(path), os.path.basename(path)[:-3]
                loaded = sys.modules.get(module)
                if loaded is not None and os.path.abspath(getattr(loaded, "__file__", "") or "") == path:
                    continue  # imported already (its options were read before the run): not registered twice
                if folder not in sys.path:
                    sys.path.insert(0, folder)
                spec = importlib.util.spec_from_file_location(module, path)
                loaded = importlib.util.module_from_spec(spec)
                sys.modules[module] = loaded
                try:
                    spec.loader.exec_module(loaded)
                except BaseException:
                    del sys.modules[module]
                    raise
            else:
                cwd = os.getcwd()
                if cwd not in sys.path and "" not in sys.path:
                    sys.path.insert(0, cwd)
                importlib.import_module(name)
        except Exception as exc:  # a user's module: any failure is reported as the CLI's error
            hint = ""
            if isinstance(exc, ModuleNotFoundError) and exc.name == name.split(".")[0]:
                hint = " (looked in the current folder and on the Python path; a file can be given as PATH.py)"
            raise CLIError(f"--import {name}: {type(exc).__name__}: {one_line(exc)}{hint}") from None


def parse_imported_flags(args, extras: list[str]) -> None:
    """``--import`` modules may declare options of their own (a ``Flag`` on a parameter): import them now
    and read ``extras``, what the command's parser did not know, with those options onto ``args``; what
    is left is an error, as for any unknown option."""
    import argparse

    from .options import DECODER_FLAGS, METRIC_FLAGS, add_decoder_param_args, add_metric_params

    import_modules(args.imports)
    known = {flag["option"] for _, flag in METRIC_FLAGS + DECODER_FLAGS}
    metric_flags, decoder_flags = ([(o, f) for o, f in flags if f["option"] not in known] for flags in registered_flags())
    parser = argparse.ArgumentParser(prog="hdecode", add_help=False, allow_abbrev=False, exit_on_error=False)
    if getattr(args, "_metric_params", None) is not None:  # the command takes the metrics' options
        add_metric_params(parser, multi=args._metric_params, flags=metric_flags)
    if getattr(args, "_decoder_params", False):
        add_decoder_param_args(parser, flags=decoder_flags)
    try:
        given, rest = parser.parse_known_args(extras)
    except argparse.ArgumentError as exc:
        raise CLIError(str(exc)) from None
    if rest:
        raise CLIError(f"unrecognized arguments: {' '.join(rest)}")
    vars(args).update(vars(given))


def build_metrics(h: Hierarchy, specs, args=None) -> list:
    """Metric objects for metric specs (names, aliases, ``name[param=value]``); a parameter with a
    command-line option that the spec leaves out takes the option's value in ``args`` (the parsed
    arguments) or its declared default, and a metric is built at each value of a swept one
    (:func:`flag_values`: ``hf_beta`` over ``--betas``); the same metric twice (by alias or parameter)
    is kept once."""
    from ..core.spec import parse_spec
    from ..metrics import get_metric, metric_class

    out = {}
    for spec in specs:
        try:
            name, params = parse_spec(spec, "metric")
            made = [get_metric(spec, h, **extra) for extra in _with_flags(metric_class(name), params, args, h)]
        except (ValueError, TypeError) as exc:
            raise CLIError(_spec_error("metric", spec, exc)) from None
        for m in made:
            out.setdefault(m.key, m)
    if not out:
        raise CLIError("no metric selected")
    return list(out.values())


def _spec_error(kind: str, spec: str, exc: Exception) -> str:
    """One line for a bad metric or decoder spec: an unknown name says so itself (with a suggestion)."""
    text = one_line(exc)
    if text.startswith(f"Unknown {kind} "):
        return "u" + text[1:]
    return f"{kind} {spec!r}: {text}"


def heuristic_names() -> list[str]:
    from ..decoders import list_decoders

    return [n for n in list_decoders() if n != "optimal"]


def heuristic_selection(values, flag: str) -> list[str]:
    """Heuristic decoder specs from ``--decoders`` values (``all`` = every heuristic; default: all)."""
    if values is None:
        return heuristic_names()
    specs = split_names(values, flag)
    if "all" in specs:
        specs = list(dict.fromkeys([n for n in specs if n != "all"] + heuristic_names()))
    for spec in specs:
        if spec == "optimal" or spec.startswith("optimal:") or spec.rstrip().endswith("/optimal"):
            raise CLIError(f"{flag}: 'optimal' is not a heuristic; each metric's optimal decoder is always included")
    return specs


def build_heuristics(h: Hierarchy, specs, args=None) -> list:
    """Decoder objects for heuristic specs; the options of their declared parameters in ``args`` (the
    parsed arguments: ``--tau``, ``--lam``, ``--info-threshold``, ...), or the options' declared
    defaults, give the parameters a spec leaves out."""
    from ..core.spec import parse_spec
    from ..decoders import decoder_class, get_decoder

    out = []
    for spec in specs:
        try:
            name, params = parse_spec(spec, "decoder")
            extra = _with_flags(decoder_class(name), params, args, h)[0]  # a decoder's options take one value
            out.append(get_decoder(spec, h, **extra))
        except (ValueError, TypeError) as exc:
            raise CLIError(_spec_error("decoder", spec, exc)) from None
    return out


def check_applicable(args, metrics=(), decoders=(), *, metric_flag="--metrics", decoder_flag="--decoders") -> None:
    """A metric or decoder parameter given on the command line for one that is not selected is an error
    (the options of every registered class, those of ``--import`` modules included)."""
    check_applicable_names(args, [m.name for m in metrics], [d.name for d in decoders], metric_flag=metric_flag,
                           decoder_flag=decoder_flag, owners=param_owners(*registered_flags()))


def registered_flags() -> tuple[list, list]:
    """``(metric flags, decoder flags)``, each ``(owner, flag facts)``, of every registered class now (the
    catalogue's and those of modules imported with ``--import``)."""
    from ..decoders.registry import DECODERS
    from ..metrics.registry import METRICS

    return tuple([(owner, flag) for owner, facts in registry.declarations().items() for flag in facts["flags"]]
                 for registry in (METRICS, DECODERS))


# ---------------------------------------------------------------------------- calibration
def calibration_split(num_rows: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fit rows, other rows)``, each sorted (B,) int64: ``round(fraction * num_rows)`` rows drawn
    at random with ``seed`` (the same rows for the same arguments, on every machine), and the rest."""
    k = int(round(fraction * num_rows))
    perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(int(seed)))
    return perm[:k].sort().values, perm[k:].sort().values


def fit_calibration(h: Hierarchy, logits: torch.Tensor, targets: torch.Tensor, fit_rows: torch.Tensor,
                    other_rows: torch.Tensor, kind: str = "temperature"):
    """``(scaler, info)``: the calibration ``kind`` fitted on ``fit_rows`` of ``logits`` (B, L) and ``targets``
    (B,), and what it did: its parameters, the NLL before/after on the fit rows and on ``other_rows``, and the
    node ECE per depth before/after on ``other_rows`` (the fit rows when there are none).

    ``kind``: ``"temperature"`` (hd.TemperatureScaler), ``"hierarchical"`` (hd.HierarchicalScaler, its default
    family) or ``"auto"`` (hierarchical when the fit rows' node probabilities are miscalibrated beyond sampling
    noise at some depth, else no scaling: ``scaler`` is then None)."""
    from ..integrations.hierarchical_scaler import HierarchicalScaler
    from ..integrations.temperature import TemperatureScaler

    t0 = time.perf_counter()
    fit_z, fit_y = logits[fit_rows], targets[fit_rows]
    info = {"kind": kind, "fit_rows": int(fit_rows.numel()), "other_rows": int(other_rows.numel())}
    if kind == "auto":
        check = calibration_check(h, fit_z, fit_y)
        info["fit_rows_check"] = check
        kind = "hierarchical" if check["miscalibrated_depths"] else "none"
        info["applied"] = kind
    if kind == "temperature":
        scaler = TemperatureScaler().fit(fit_z, fit_y)
        info["temperature"] = scaler.temperature
    elif kind == "hierarchical":
        scaler = HierarchicalScaler(h).fit(fit_z, fit_y)
        info.update(temperature=scaler.temperature, family=scaler.family, num_parameters=scaler.num_parameters,
                    temperatures=scaler.temperatures, shifts=scaler.shifts)
    else:
        scaler = None
    identity = TemperatureScaler()
    after = identity if scaler is None else scaler

    def nll(s, z, y) -> float:
        return s.loss(z, y) if isinstance(s, HierarchicalScaler) else s.negative_log_likelihood(z, y)

    info.update(nll_fit_before=identity.negative_log_likelihood(fit_z, fit_y), nll_fit_after=nll(after, fit_z, fit_y),
                nll_other_before=None, nll_other_after=None)
    scored_z, scored_y = fit_z, fit_y
    if other_rows.numel():
        scored_z, scored_y = logits[other_rows], targets[other_rows]
        info["nll_other_before"] = identity.negative_log_likelihood(scored_z, scored_y)
        info["nll_other_after"] = nll(after, scored_z, scored_y)
    with torch.no_grad():
        calibrated = scored_z if scaler is None else scaler(scored_z.to(torch.float64))
    after_check = calibration_check(h, calibrated, scored_y)
    info["node_ece"] = {"rows": "held-out" if other_rows.numel() else "fit", "before": node_ece(h, scored_z, scored_y),
                        "after": after_check["ece"], "noise_floor": after_check["noise_floor"],
                        "miscalibrated_depths": after_check["miscalibrated_depths"]}
    info["seconds"] = round(time.perf_counter() - t0, 3)
    return scaler, info


def node_ece(h: Hierarchy, logits: torch.Tensor, targets: torch.Tensor) -> list[float]:
    """The node ECE of each depth 0..D of ``softmax(logits)`` (B, L) against ``targets`` (B,)."""
    from ..functional import node_calibration_error

    return node_calibration_error(logits, targets, h, from_logits=True).tolist()


def calibration_check(h: Hierarchy, scores: torch.Tensor, targets: torch.Tensor, from_logits=True,
                      normalize: bool = False) -> dict:
    """``hd.functional.node_calibration_check`` of ``scores`` (B, L) as a JSON-ready dict: the node ECE and
    its noise floor per depth 0..D, and the depths miscalibrated beyond sampling noise."""
    from ..functional import node_calibration_check
    from .evaluation import rows_probabilities

    rows = torch.arange(scores.shape[0])
    probs = rows_probabilities(h, scores, rows, from_logits=from_logits, normalize=normalize)
    check = node_calibration_check(probs, targets.to(probs.device), h)
    return {"ece": check.ece.tolist(), "noise_floor": check.noise_floor.tolist(),
            "miscalibrated_depths": check.miscalibrated.nonzero().flatten().tolist(), "rows": int(scores.shape[0])}


def calibration_label(info: dict) -> str:
    """A few words on what the calibration ``info`` applied: ``logits / T, T = 1.93``, ``a hierarchical scaler
    (25 parameters)``, or ``no calibration (auto: calibrated within noise)``."""
    kind = info.get("applied", info["kind"])
    if kind == "temperature":
        return f"logits / T, T = {info['temperature']:.4g}"
    if kind == "hierarchical":
        return f"a hierarchical scaler ({info['num_parameters']} parameters)"
    return "no calibration (auto: calibrated within noise)"


def calibration_report(info: dict) -> str:
    """One paragraph: what was fitted on how many rows, and the NLL before/after."""
    kind = info.get("applied", info["kind"])
    if kind == "none":
        text = (f"auto: the node probabilities of the {info['fit_rows']} fit rows are calibrated within sampling "
                "noise at every depth: no scaling applied")
    else:
        what = f"T = {info['temperature']:.4g}"
        if kind == "hierarchical":
            what = (f"hierarchical scaler ({info['family']}, {info['num_parameters']} parameters: {what}, then "
                    "the conditionals re-tempered per depth)")
        if info["kind"] == "auto":
            depths = ", ".join(str(d) for d in info["fit_rows_check"]["miscalibrated_depths"])
            what = f"auto: miscalibrated at depth {depths} of the fit rows, so a {what}"
        text = (f"{what} fitted on {info['fit_rows']} rows; NLL {info['nll_fit_before']:.4f} -> "
                f"{info['nll_fit_after']:.4f} on them")
        if info["nll_other_before"] is not None:
            text += (f", {info['nll_other_before']:.4f} -> {info['nll_other_after']:.4f} on the {info['other_rows']} "
                     "held-out rows")
    return text


# ---------------------------------------------------------------------------- risk control
def held_out_split(num_rows: int, fraction: float, seed: int, fit_what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``calibration_split``, refusing a split that leaves no row on either side."""
    fit_rows, other_rows = calibration_split(num_rows, fraction, seed)
    if fit_rows.numel() == 0 or other_rows.numel() == 0:
        raise CLIError(f"--calibration-split {fraction:g} of {num_rows} rows leaves no row to "
                       f"{fit_what if fit_rows.numel() == 0 else 'score'}")
    return fit_rows, other_rows


def fit_risk_control(h: Hierarchy, probs: torch.Tensor, targets: torch.Tensor, alpha: float, delta: float | None,
                     where: str):
    """``(rc, info)``: ``hd.RiskControl(h, alpha, delta)`` fitted on checked probabilities (n, L), or on a
    :class:`~hdecode_torch.TopK` of (n, k) lists (the path of their completed distribution), and their
    targets (n,); info: λ, n, the calibration rows' miss rate, the guarantee in words, seconds.  Too few
    rows for the level is an error that says how many are needed (``where``: how the rows were chosen)."""
    from ..decoders.risk_control import MAX_CALIBRATION_ROWS, RiskControl

    t0 = time.perf_counter()
    rc = RiskControl(h, alpha=alpha, delta=delta)
    level = f"--alpha {alpha:g}" + ("" if delta is None else f" --delta {delta:g}")
    try:
        need = rc.min_calibration_rows()
    except ValueError:  # the level needs more rows than any calibration set holds
        raise CLIError(f"{level}: needs more than 2^40 = {MAX_CALIBRATION_ROWS:,} calibration rows (with fewer, not "
                       "even the root can be certified at this level); use a larger --alpha") from None
    n = int((probs.values if isinstance(probs, TopK) else probs).shape[0])
    if n < need:
        raise CLIError(f"{level}: too few calibration rows: at least {need} are needed (with fewer, not even the "
                       f"root can be certified at this level), but {where} holds {n}; give more rows, a larger "
                       "--calibration-split or a larger --alpha")
    rc.fit(probs, targets)
    return rc, {"alpha": alpha, "delta": delta, "lambda": rc.lam, "calibration_rows": n,
                "calibration_miss_rate": rc.calibration_risk, "guarantee": guarantee_text(alpha, delta),
                "seconds": round(time.perf_counter() - t0, 3)}


def guarantee_text(alpha: float, delta: float | None) -> str:
    """What the fitted decoder promises, and on which assumption."""
    if delta is None:
        return (f"conformal risk control: on new rows exchangeable with the calibration rows (e.g. i.i.d. from the "
                f"same distribution), the expected miss rate is at most {alpha:g}")
    return (f"upper confidence bound: with probability at least {1 - delta:g} over the calibration rows (i.i.d. "
            f"like the new rows), the miss rate on new rows is at most {alpha:g}")


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
