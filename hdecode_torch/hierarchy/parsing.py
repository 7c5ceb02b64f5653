"""Reading trees from files: edge lists (a path or an open text file of parent,child lines), JSON text,
and node ids as JSON values.  Every error names the file (and the line of an edge list)."""

from __future__ import annotations

import csv
import json
import os
from typing import Any

import numpy as np

__all__ = ["read_edge_file", "read_json_file", "to_json_id", "from_json_id", "source_name", "os_error"]


def source_name(source) -> str:
    """How a path or an open file is named in error messages."""
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        return repr(name) if isinstance(name, str) and not name.startswith("<") else (name or "<file object>")
    return repr(os.fspath(source))


def os_error(exc: OSError, prefix: str) -> OSError:
    """The same OSError subclass, with a one-line message that names the file and the problem."""
    return type(exc)(f"{prefix}: {exc.strerror or exc}")


def read_edge_file(source, delimiter: str | None) -> tuple[list[tuple[str, str]], tuple[str, list[int]]]:
    """``(pairs, (file name, line numbers))`` from an edge-list file (a path or an open text file)."""
    name = source_name(source)
    try:
        if hasattr(source, "read"):
            text = source.read()
            if isinstance(text, bytes):
                text = text.decode("utf-8-sig")
        else:
            with open(source, encoding="utf-8-sig", newline="") as f:
                text = f.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"Cannot read edge list {name}: not UTF-8 text (byte {exc.start}); an edge list is a "
                         "text file of parent,child lines") from None
    except OSError as exc:
        raise os_error(exc, f"Cannot read edge list {name}") from None
    text = text.lstrip("\ufeff")
    nul = text.find("\x00")
    if nul >= 0:  # valid UTF-8, but no text file holds NUL: a binary file, not a line of one odd name
        raise ValueError(f"Cannot read edge list {name}: not a text file (character {nul} is a NUL byte); an edge "
                         "list is a text file of parent,child lines")
    lines = [(k + 1, ln) for k, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise ValueError(f"Expected (parent, child) lines in {name}, but it is empty")
    if delimiter is None:
        first = lines[0][1]
        delimiter = "," if "," in first else ("\t" if "\t" in first else None)
    how = {",": "comma-separated", "\t": "tab-separated", None: "whitespace-separated"}.get(delimiter,
                                                                                         f"{delimiter!r}-separated")
    rows = []
    for k, ln in lines:
        fields = ln.split() if delimiter is None else next(csv.reader([ln], delimiter=delimiter))
        # Whitespace around a name is padding ("a, b" or aligned columns), never part of the name.
        fields = [f.strip() for f in fields]
        at = f"{name}, line {k}"
        if len(fields) != 2:
            hint = (" (names with spaces need a comma- or tab-separated file)"
                    if delimiter is None and len(fields) > 2 else "")
            raise ValueError(f"{at}: expected 2 fields (parent, child), but the {how} line {ln.strip()!r} has "
                             f"{len(fields)}{hint}")
        for role, f in zip(("parent", "child"), fields):
            if not f:
                raise ValueError(f"{at}: empty {role} name in {ln.strip()!r}")
            bad = next((ch for ch in f if not ch.isprintable()), None)
            if bad is not None:
                # A tab inside a name (a mixed delimiter?) or an invisible character makes two names that
                # look the same differ: ambiguous, so rejected rather than guessed.
                raise ValueError(f"{at}: the {role} name {f!r} contains the invisible character {bad!r} "
                                 f"(U+{ord(bad):04X}); remove it or fix the delimiter")
        rows.append((k, fields))
    if [c.lower() for c in rows[0][1]] == ["parent", "child"]:
        rows = rows[1:]
    return [(r[0], r[1]) for _, r in rows], (name, [k for k, _ in rows])


def read_json_file(path) -> tuple[Any, str]:
    """``(data, name)``: the JSON value in a file (a path or an open text file) and how error messages name
    the file.  A missing or unreadable file raises the ``OSError`` subclass, an empty, truncated or invalid
    file a ``ValueError`` naming the file."""
    name = source_name(path)
    try:
        if hasattr(path, "read"):
            text = path.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        if isinstance(text, bytes):
            text = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"Cannot read hierarchy JSON {name}: not UTF-8 text (byte {exc.start}); "
                         "is it a JSON file?") from None
    except OSError as exc:
        raise os_error(exc, f"Cannot read hierarchy JSON {name}") from None
    if not text.strip():
        raise ValueError(f"Cannot read hierarchy JSON {name}: the file is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        truncated = not text[exc.pos:].strip() or exc.pos >= len(text.rstrip())
        raise ValueError(f"Cannot read hierarchy JSON {name}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno}{'; the file looks truncated' if truncated else ''})") from None
    except RecursionError:
        raise ValueError(f"Cannot read hierarchy JSON {name}: nested too deeply") from None
    return data, name


JSON_SCALARS = (str, int, float, bool, type(None))


def to_json_id(x):
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, JSON_SCALARS):
        return x
    if isinstance(x, tuple):
        return [to_json_id(v) for v in x]
    raise TypeError(f"Cannot write node id {x!r} ({type(x).__name__}) to JSON: ids must be str, int, float, bool, "
                    "None or tuples of these; convert the ids to strings first")


def from_json_id(x):
    return tuple(from_json_id(v) for v in x) if isinstance(x, list) else x
