"""``hdecode info``: statistics of a hierarchy."""

from __future__ import annotations

import argparse
import json

from .common import load_any_hierarchy


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="statistics of a hierarchy (sizes, depths, branching, single-child chains)",
                       description="Print statistics of a bundled hierarchy or of a JSON/CSV/edge-list file.")
    p.add_argument("hierarchy", nargs="?", default="tieredimagenet-h",
                   help="bundled name (tieredimagenet-h, inat19) or a file (default: tieredimagenet-h)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    h = load_any_hierarchy(args.hierarchy)
    stats = h.statistics()
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    print(f"hierarchy: {args.hierarchy}")
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        if isinstance(v, float):
            v = f"{v:.3f}"
        elif isinstance(v, dict):
            v = ", ".join(f"{d}:{c}" for d, c in v.items())
        print(f"  {k:<{width}}  {v}")
    return 0
