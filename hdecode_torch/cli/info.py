"""``hdecode info``: statistics of a hierarchy, and its leaves in the model's column order."""

from __future__ import annotations

import argparse
import json

import numpy as np

from .common import DEFAULT_HIERARCHY, Progress, json_document, load_any_hierarchy

#: At most this many leaves are listed in the text output (all of them in --json).
MAX_LEAVES_SHOWN = 100


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


def leaf_order(h) -> list:
    """The leaves in the model's column order: entry j is the name of leaf j, the class of column j."""
    return [h.name(j) for j in range(h.num_leaves)]


def _leaf_lines(h, width: int = 100) -> list[str]:
    """``j name`` (with the label where the tree has one) for the leaves, in columns filling ``width``;
    on a tree of more than MAX_LEAVES_SHOWN leaves, the first and the last ten only."""
    def entry(j):
        name, label = str(h.name(j)), h.label(j)
        return f"{j} {name}" + (f" ({label})" if label != name else "")

    def rows(ids):
        cells = [entry(j) for j in ids]
        cell_w = max(len(c) for c in cells) + 2
        per_line = max(1, (width - 2) // cell_w)
        return ["  " + "".join(c.ljust(cell_w) for c in cells[k:k + per_line]).rstrip()
                for k in range(0, len(cells), per_line)]

    L = h.num_leaves
    if L <= MAX_LEAVES_SHOWN:
        return rows(range(L))
    head, tail = MAX_LEAVES_SHOWN - 10, 10
    return rows(range(head)) + [f"  ... {L - head - tail} more (--json lists every leaf)"] + rows(range(L - tail, L))


def run(args: argparse.Namespace, progress: Progress) -> int:
    """The command line was checked by ``commands.check_info``."""
    spec = DEFAULT_HIERARCHY if args.hierarchy is None else args.hierarchy
    progress.stage("info: loading the hierarchy")
    h = load_any_hierarchy(spec, args.leaf_order)
    stats = h.statistics()
    stats.update(single_child_chains(h))
    progress.close()
    if args.json:
        results = {**stats, "leaf_order": leaf_order(h)}
        if h.labels is not None:
            results["leaf_labels"] = [h.label(j) for j in range(h.num_leaves)]
        doc = json_document("info", {"setting": {"hierarchy": spec, "leaf_order": args.leaf_order}}, results)
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
    print(f"leaves in column order (column j of --probs is leaf j; {h.num_leaves} leaves):")
    for line in _leaf_lines(h):
        print(line)
    return 0
