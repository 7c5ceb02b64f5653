"""Helpers shared by the subcommands: loading trees and arrays, building metrics and decoders."""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np
import torch

from ..hierarchy import Hierarchy, list_hierarchies, load_hierarchy

__all__ = [
    "CLIError", "load_any_hierarchy", "hierarchy_description", "load_array", "load_probs", "load_targets",
    "resolve_device", "DEFAULT_METRICS", "DEFAULT_BETAS", "DEFAULT_C", "DEFAULT_TAU", "DEFAULT_LAM",
    "default_info_threshold", "build_metrics", "build_heuristics", "heuristic_names", "split_names", "Progress",
    "add_hierarchy_args", "add_decoder_param_args",
]

ARRAY_FORMATS = (".npy", ".pt", ".pth", ".csv", ".tsv", ".txt")

# SPEC §2, one entry per metric; hf_beta is expanded over --betas.
DEFAULT_METRICS = ["accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao",
                   "hf_beta", "hamming", "jaccard"]
DEFAULT_BETAS = (0.5, 1.0, 2.0)
# c = 1/2 moves the tree-distance threshold from p(n) > 1/2 to p(n) > 3/4: a visible change,
# while c >= 1 would only ever allow the root.
DEFAULT_C = 0.5
# tau = 1/2 is `majority`, already in the table; 0.8 is a distinct, more cautious rule.
DEFAULT_TAU = 0.8
DEFAULT_LAM = 1.0


class CLIError(Exception):
    """A user error: printed as ``hdecode <command>: error: ...`` with exit status 2."""


# --------------------------------------------------------------------------- hierarchies
def add_hierarchy_args(p, default: str | None = "tieredimagenet-h") -> None:
    p.add_argument("--hierarchy", default=default, metavar="NAME|FILE",
                   help=f"bundled tree ({', '.join(list_hierarchies())}) or a file: JSON (parents/ids) or a "
                        f"parent,child edge list (CSV/TSV)" + (f" (default: {default})" if default else ""))
    p.add_argument("--leaf-order", metavar="FILE",
                   help="for an edge list: the leaves' names in the model's column order, one per line "
                        "(default: sorted names)")


def load_any_hierarchy(spec: str, leaf_order: str | None = None) -> Hierarchy:
    """A bundled name, a ``.json`` file (parents/ids), or a CSV/TSV edge list (parent, child)."""
    if not os.path.exists(spec):
        try:
            tree = load_hierarchy(spec)
        except ValueError:
            raise CLIError(f"hierarchy {spec!r} is neither a bundled tree ({', '.join(list_hierarchies())}) "
                           "nor an existing file") from None
        if leaf_order:
            raise CLIError("--leaf-order applies to edge-list files; a bundled tree has its own column order")
        return tree
    order = None
    if leaf_order:
        try:
            with open(leaf_order) as f:
                order = [ln.strip() for ln in f if ln.strip()]
        except OSError as exc:
            raise CLIError(f"cannot read --leaf-order {leaf_order!r}: {exc.strerror}") from None
    try:
        if spec.lower().endswith(".json"):
            if order is not None:
                raise CLIError("--leaf-order applies to edge-list files; a JSON tree has its own column order")
            return Hierarchy.from_json(spec)
        return Hierarchy.from_edges(spec, leaf_order=order)
    except (ValueError, KeyError, TypeError) as exc:
        raise CLIError(f"cannot read hierarchy {spec!r}: {exc}") from None
    except OSError as exc:
        raise CLIError(f"cannot read hierarchy {spec!r}: {exc.strerror}") from None


def hierarchy_description(spec: str, h: Hierarchy) -> str:
    return f"{os.path.basename(spec)} ({h.num_nodes} nodes, {h.num_leaves} leaves, depth {h.max_depth})"


# --------------------------------------------------------------------------- arrays
def _read_text_table(path: str) -> np.ndarray:
    delimiter = "," if path.lower().endswith(".csv") else ("\t" if path.lower().endswith(".tsv") else None)
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise CLIError(f"{path!r} is empty")

    def fields(ln):
        return [c.strip() for c in (ln.split(delimiter) if delimiter else ln.split())]

    def numeric(row):
        try:
            [float(c) for c in row]
            return True
        except ValueError:
            return False

    rows = [fields(ln) for ln in lines]
    if not numeric(rows[0]):  # a header line
        rows = rows[1:]
    if not rows:
        raise CLIError(f"{path!r} has a header but no data")
    widths = {len(r) for r in rows}
    if len(widths) != 1:
        raise CLIError(f"{path!r}: rows have different numbers of columns ({sorted(widths)})")
    try:
        return np.array([[float(c) for c in r] for r in rows], dtype=np.float64)
    except ValueError as exc:
        raise CLIError(f"{path!r}: not a numeric table ({exc})") from None


def load_array(path: str, what: str) -> torch.Tensor:
    """A tensor from ``.npy``, ``.pt``/``.pth`` (a tensor or array), or ``.csv``/``.tsv``/``.txt`` text."""
    if not os.path.exists(path):
        raise CLIError(f"{what}: no such file {path!r}")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".npy":
            arr = np.load(path, allow_pickle=False)
            return torch.from_numpy(np.ascontiguousarray(arr))
        if ext in (".pt", ".pth"):
            obj = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(obj, np.ndarray):
                obj = torch.from_numpy(obj)
            if not isinstance(obj, torch.Tensor):
                raise CLIError(f"{what}: {path!r} holds a {type(obj).__name__}, expected a single tensor")
            return obj
        if ext in (".csv", ".tsv", ".txt"):
            return torch.from_numpy(_read_text_table(path))
    except CLIError:
        raise
    except Exception as exc:  # numpy/torch raise many types for corrupt files
        raise CLIError(f"{what}: cannot read {path!r}: {exc}") from None
    raise CLIError(f"{what}: unknown format {ext or '(no extension)'!r} of {path!r}; "
                   f"use one of {', '.join(ARRAY_FORMATS)}")


def load_probs(path: str, h: Hierarchy, what: str = "--probs") -> torch.Tensor:
    x = load_array(path, what)
    if x.dtype == torch.bool or not (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
        raise CLIError(f"{what}: expected a float (B, {h.num_leaves}) array, but {path!r} has dtype {x.dtype}")
    if not x.is_floating_point():
        x = x.to(torch.float64)
    if x.dim() == 1 and x.numel() == h.num_leaves:
        x = x[None]
    if x.dim() != 2 or x.shape[1] != h.num_leaves:
        raise CLIError(f"{what}: expected shape (B, {h.num_leaves}) (one column per leaf of the hierarchy), "
                       f"but {path!r} has shape {tuple(x.shape)}")
    return x


def load_targets(path: str, h: Hierarchy, batch: int, what: str = "--targets") -> torch.Tensor:
    y = load_array(path, what)
    if y.dim() == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.dim() != 1:
        raise CLIError(f"{what}: expected a (B,) vector of leaf ids, but {path!r} has shape {tuple(y.shape)}")
    if y.is_floating_point():  # text files come back as floats
        if not bool(torch.isfinite(y).all()) or not bool((y == y.round()).all()):
            raise CLIError(f"{what}: expected integer leaf ids in {path!r}, but found non-integer values")
    elif y.dtype == torch.bool:
        raise CLIError(f"{what}: expected integer leaf ids, but {path!r} holds booleans")
    y = y.to(torch.long)
    if y.shape[0] != batch:
        raise CLIError(f"{what}: {path!r} has {y.shape[0]} targets but the probabilities have {batch} rows")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= h.num_leaves):
        bad = int(y.min()) if int(y.min()) < 0 else int(y.max())
        raise CLIError(f"{what}: leaf ids must be in 0..{h.num_leaves - 1}, but {path!r} contains {bad}")
    return y


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as exc:
        raise CLIError(f"--device: {exc}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CLIError(f"--device {name}: CUDA is not available on this machine")
    return dev


# --------------------------------------------------------------------------- metrics and decoders
def default_info_threshold(h: Hierarchy) -> float:
    """Half of a leaf's information, ½·log L, rounded: nodes with at most about √L leaves qualify."""
    return round(0.5 * math.log(max(h.num_leaves, 1)), 2)


def add_decoder_param_args(p, *, tau=DEFAULT_TAU, lam=DEFAULT_LAM) -> None:
    p.add_argument("--tau", type=float, default=tau,
                   help=f"confidence_threshold: the most informative node with p(n) > tau (default: {tau})")
    p.add_argument("--lam", type=float, default=lam,
                   help=f"darts: argmax (I(n) + lam) p(n) (default: {lam})")
    p.add_argument("--info-threshold", type=float, default=None, metavar="T",
                   help="information_threshold: the most probable node with I(n) >= T (default: ½·log L "
                        "rounded, i.e. nodes with at most about √L leaves)")


def build_metrics(h: Hierarchy, names, betas, c) -> list:
    """Metric objects for ``names``, with ``hf_beta`` expanded over ``betas``."""
    from ..metrics import get_metric, list_metrics

    known = list(list_metrics())
    out = []
    for name in names:
        try:
            if name in ("hf_beta", "hf"):
                out.extend(get_metric("hf_beta", h, beta=b) for b in betas)
            elif name == "tree_distance_c":
                out.append(get_metric(name, h, c=c))
            else:
                out.append(get_metric(name, h))
        except ValueError as exc:
            if name not in known:
                raise CLIError(f"unknown metric {name!r}; available: {', '.join(known)}") from None
            raise CLIError(str(exc)) from None
    if not out:
        raise CLIError("no metric selected")
    return out


def heuristic_names() -> list[str]:
    from ..decoders import list_decoders

    return [n for n in list_decoders() if n != "optimal"]


def build_heuristics(h: Hierarchy, names, tau: float, lam: float, threshold: float | None) -> list:
    from ..decoders import get_decoder

    params = {"confidence_threshold": {"tau": tau}, "darts": {"lam": lam},
              "information_threshold": {"threshold": default_info_threshold(h) if threshold is None else threshold}}
    known = heuristic_names()
    out = []
    for name in names:
        if name not in known:
            raise CLIError(f"unknown decoder {name!r}; available: {', '.join(known)}")
        try:
            out.append(get_decoder(name, h, **params.get(name, {})))
        except ValueError as exc:
            raise CLIError(f"decoder {name!r}: {exc}") from None
    return out


def split_names(values) -> list[str]:
    """``--metrics a,b c`` -> ``[a, b, c]``."""
    return [x.strip() for v in (values or []) for x in v.split(",") if x.strip()]


# --------------------------------------------------------------------------- progress
class Progress:
    """tqdm when installed, else a plain counter on stderr.  Silent unless stderr is a terminal
    and the run lasts more than a second, so that short runs and logs stay clean."""

    def __init__(self, total: int, desc: str, enabled: bool = True):
        self.total, self.desc, self.done = total, desc, 0
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None
        self._start = self._last = time.monotonic()
        if self.enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="sample", unit_scale=total >= 10_000, leave=False,
                                 delay=1.0, file=sys.stderr)
            except ImportError:
                pass

    def update(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._start > 1.0 and now - self._last > 0.5:
            self._last = now
            sys.stderr.write(f"\r{self.desc}: {self.done}/{self.total} samples "
                             f"({100 * self.done / max(self.total, 1):.0f}%)")
            sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and time.monotonic() - self._start > 1.0:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()
