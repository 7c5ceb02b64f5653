"""Helpers shared by the subcommands (loading trees and arrays)."""

from __future__ import annotations

import os

from ..hierarchy import Hierarchy, list_hierarchies, load_hierarchy


def load_any_hierarchy(spec: str) -> Hierarchy:
    """A bundled name, a ``.json`` file (parents/ids), or a CSV/TSV edge list (parent, child)."""
    if spec.lower() in list_hierarchies() or not os.path.exists(spec):
        if not os.path.exists(spec):
            try:
                return load_hierarchy(spec)
            except ValueError:
                raise SystemExit(f"error: {spec!r} is neither a bundled hierarchy ({', '.join(list_hierarchies())}) "
                                 "nor an existing file") from None
    if spec.endswith(".json"):
        return Hierarchy.from_json(spec)
    return Hierarchy.from_edges(spec)
