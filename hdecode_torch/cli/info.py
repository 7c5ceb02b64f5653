"""``hdecode info``: statistics of a hierarchy."""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np

from .common import DEFAULT_HIERARCHY, CLIError, add_hierarchy_args, json_document, load_any_hierarchy
from .io import require_stdout


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="statistics of a hierarchy (sizes, depths, branching, single-child chains)",
                       allow_abbrev=False,
                       description="Print statistics of a bundled hierarchy or of a JSON/CSV/edge-list file.",
                       epilog="examples:\n  hdecode info --hierarchy inat19\n"
                              "  hdecode info --hierarchy tree.csv --json",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=run, _parser=p)
    add_hierarchy_args(p, default=None)
    p.add_argument("tree", nargs="?", default=None, metavar="TREE",
                   help=f"deprecated spelling of --hierarchy TREE (default: {DEFAULT_HIERARCHY})")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead of text (schema_version 1: the statistics under results)")


def single_child_chains(h) -> dict:
    """Maximal runs of single-child nodes (each node of a run is the only child of the previous one).

    Every node on such a run has the same leaf set as its child, hence the same p(n): decoders
    must break these ties (deepest first, then smallest id), so their length is worth knowing.
    """
    parent = h.parent.cpu().numpy()
    unary = (h.num_children == 1).cpu().numpy()
    run = np.zeros(h.num_nodes, dtype=np.int64)  # length of the unary run ending at each node
    for level in h.levels:  # one vectorized step per depth; run is 0 on non-unary nodes
        nodes = level.cpu().numpy()
        par = parent[nodes]
        run[nodes] = unary[nodes] * (np.where(par >= 0, run[np.maximum(par, 0)], 0) + 1)
    # A run ends at a unary node whose only child is not unary.
    child_of_unary = np.zeros(h.num_nodes, dtype=bool)
    has_parent = parent >= 0
    child_of_unary[np.flatnonzero(has_parent)] = unary[parent[has_parent]]
    ends = unary.copy()
    ends[parent[has_parent & unary & child_of_unary]] = False
    lengths = run[ends]
    return {"single_child_chains": int(lengths.size),
            "longest_single_child_chain": int(lengths.max()) if lengths.size else 0}


def run(args: argparse.Namespace) -> int:
    require_stdout("info prints to it")
    spec = args.hierarchy
    if args.tree is not None:
        if spec is not None:
            raise CLIError(f"give the tree once: --hierarchy {spec} or the (deprecated) positional {args.tree}")
        warnings.warn(f"the positional TREE is deprecated: use --hierarchy {args.tree}", FutureWarning, stacklevel=2)
        spec = args.tree
    spec = DEFAULT_HIERARCHY if spec is None else spec
    h = load_any_hierarchy(spec, args.leaf_order)
    stats = h.statistics()
    stats.update(single_child_chains(h))
    if args.json:
        doc = json_document("info", {"setting": {"hierarchy": spec}}, stats)
        print(json.dumps(doc, indent=2, allow_nan=False))
        return 0
    print(f"hierarchy: {spec}")
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        if isinstance(v, float):
            v = f"{v:.3f}"
        elif isinstance(v, dict):
            v = ", ".join(f"{d}:{c}" for d, c in v.items())
        print(f"  {k:<{width}}  {v}")
    return 0
