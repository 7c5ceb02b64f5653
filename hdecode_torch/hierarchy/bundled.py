"""The class trees shipped with the package (``data/*.json``)."""

from __future__ import annotations

import json
import os
from importlib import resources

from .hierarchy import Hierarchy

__all__ = ["load_hierarchy", "list_hierarchies"]

_ALIASES = {"tiered": "tieredimagenet-h", "tieredimagenet": "tieredimagenet-h", "tiered-imagenet-h": "tieredimagenet-h",
            "inat": "inat19", "inaturalist19": "inat19"}


def list_hierarchies() -> list[str]:
    """Names accepted by :func:`load_hierarchy`."""
    files = resources.files(__package__).joinpath("data").iterdir()
    return sorted(f.name[: -len(".json")] for f in files if f.name.endswith(".json"))


def load_hierarchy(name: str) -> Hierarchy:
    """Load a bundled tree: ``"tieredimagenet-h"`` (843 nodes, 608 leaves) or ``"inat19"`` (1190 nodes, 1010 leaves).

    Compiled ids equal the file's ids (leaves first, in the model's column order).  Files are
    read by :meth:`Hierarchy.from_json` (JSON) and :meth:`Hierarchy.from_edges` (edge lists).
    """
    if not isinstance(name, str):
        raise TypeError(f"Expected `name` to be a string, but got {type(name).__name__}")
    key = _ALIASES.get(name.lower(), name.lower())
    available = list_hierarchies()
    if key not in available:
        hint = ""
        if os.sep in name or (os.altsep and os.altsep in name) or os.path.splitext(name)[1] or os.path.exists(name):
            # A path given to the bundled loader: point at the file constructors.
            hint = (". To load a file, use Hierarchy.from_json(path) for a JSON tree or Hierarchy.from_edges(path) "
                    "for a parent,child edge list")
        raise ValueError(f"Unknown bundled hierarchy {name!r}; available: {', '.join(available)}{hint}")
    text = resources.files(__package__).joinpath("data", f"{key}.json").read_text()
    return Hierarchy.from_json_dict(json.loads(text))
