"""Building a tree from what users have: parent arrays, ``{parent: [children]}`` dicts, (parent, child)
pairs or edge-list files, networkx graphs, label paths and JSON, each validated and renumbered canonically;
errors name the user's nodes (and the file line they come from)."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING

import numpy as np

from .parsing import from_json_id, read_edge_file, read_json_file
from .structure import _as_parent_array, canonical_order

if TYPE_CHECKING:
    from .hierarchy import Hierarchy

__all__ = ["TreeConstructors", "as_list", "check_unique_ids", "leaf_positions", "sort_or_keep"]


# A decimal number written as text: edge-list files give every id as a string, and "10" < "2" as strings.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def sort_or_keep(items: list) -> list:
    """Sorted original ids: by numeric value when every id is a string holding a decimal number
    (``"2" < "10"``; equal values such as ``"1"`` and ``"01"`` by their text), else as the ids
    compare; first-seen order when they cannot be compared."""
    if items and all(isinstance(x, str) and _NUMBER.fullmatch(x) for x in items):
        return sorted(items, key=lambda x: (Decimal(x), x))
    try:
        return sorted(items)
    except TypeError:
        return list(items)


class TreeConstructors:
    """The constructors of :class:`~hdecode_torch.hierarchy.Hierarchy` (its base class: ``Hierarchy.from_...``
    are these classmethods).  Each validates its input and renumbers the nodes canonically: leaves
    ``0..L-1`` in the model's column order, internal nodes ``L..N-1``."""

    @classmethod
    def from_parents(cls, parents, names: Sequence[Hashable] | None = None, labels: Sequence[str] | None = None,
                     leaf_order: Sequence[Hashable] | None = None) -> "Hierarchy":
        """Build from ``parents[i]`` = parent of node ``i`` (``-1`` for the root).

        If the leaves are already ``0..L-1`` (and no ``leaf_order`` is given) the ids are
        kept.  Otherwise nodes are renumbered: leaves in ``leaf_order`` (original ids;
        default ascending), then internal nodes in ascending original index.
        ``names`` are the original ids (default ``0..N-1``).
        """
        is_leaf, _ = canonical_order(parents)
        par = _as_parent_array(parents)
        n = par.shape[0]
        if names is not None:
            names = as_list(names, "names")
            if len(names) != n:
                raise ValueError(f"Expected `names` to have one entry per node ({n}), but got {len(names)}")
            check_unique_ids(names)
        if labels is not None:
            labels = as_list(labels, "labels")
            if len(labels) != n:
                raise ValueError(f"Expected `labels` to have one entry per node ({n}), but got {len(labels)}")
        num_leaves = int(is_leaf.sum())
        names_list = list(range(n)) if names is None else list(names)
        if leaf_order is None and is_leaf[:num_leaves].all():
            return cls(par, names_list, labels)
        if leaf_order is None:
            leaves = np.flatnonzero(is_leaf)
        else:
            pos = {nm: i for i, nm in enumerate(names_list)}
            leaves = leaf_positions(leaf_order, pos, is_leaf)
        order = np.concatenate([leaves, np.flatnonzero(~is_leaf)])
        new_of_old = np.empty(n, dtype=np.int64)
        new_of_old[order] = np.arange(n)
        old_par = par[order]
        new_par = np.where(old_par >= 0, new_of_old[np.maximum(old_par, 0)], -1)
        new_names = [names_list[i] for i in order]
        new_labels = None if labels is None else [labels[i] for i in order]
        return cls(new_par, new_names, new_labels)

    @classmethod
    def from_dict(cls, children_of: Mapping[Hashable, Iterable[Hashable]], leaf_order: Sequence[Hashable] | None = None,
                  labels: Mapping[Hashable, str] | None = None) -> "Hierarchy":
        """Build from ``{parent: [children, ...]}`` with ids of any hashable type.

        ``leaf_order``: the leaves' ids in model column order (default: sorted ids).
        Internal nodes get ids ``L..N-1`` in sorted order (first-seen order if the ids
        cannot be compared).
        """
        if not isinstance(children_of, Mapping):
            raise TypeError(f"Expected `children_of` to be a mapping {{parent: [children]}}, but got {type(children_of).__name__}")
        pairs = []
        for p, cs in children_of.items():
            if isinstance(cs, (str, bytes)) or not isinstance(cs, Iterable):
                raise TypeError(f"Expected the children of {p!r} to be a list of ids, but got {cs!r}")
            pairs.extend((p, c) for c in cs)
        return cls._from_pairs(pairs, leaf_order, labels, extra_nodes=list(children_of.keys()))

    @classmethod
    def from_edges(cls, pairs: Iterable[tuple[Hashable, Hashable]] | str | os.PathLike | io.TextIOBase,
                   leaf_order: Sequence[Hashable] | None = None, labels: Mapping[Hashable, str] | None = None,
                   delimiter: str | None = None) -> "Hierarchy":
        """Build from ``(parent, child)`` pairs, or from an edge-list file (a path or an open text file).

        File format: one ``parent,child`` pair per line, comma-, tab- or whitespace-separated
        (sniffed from the first line unless ``delimiter`` is given; whitespace-separated names
        cannot contain spaces).  An optional first line ``parent,child`` is a header; blank
        lines and lines starting with ``#`` are skipped; whitespace around each name is
        removed.  A line with other than two fields, an empty name, or a name holding a tab
        or an invisible character is an error naming the line.

        Leaf (column) order: ``leaf_order`` if given, else the leaves' ids sorted — by numeric
        value when every leaf id is a number written as text (a file's ``0..11`` give columns
        ``0, 1, 2, ..., 11``, not ``0, 1, 10, 11, 2, ...``).
        """
        where = None
        if isinstance(pairs, (str, os.PathLike)) or hasattr(pairs, "read"):
            pairs, where = read_edge_file(pairs, delimiter)
        if isinstance(pairs, (bytes, Mapping)) or not isinstance(pairs, Iterable):
            raise TypeError(f"Expected `pairs` to be an iterable of (parent, child) pairs or a file path, but got "
                            f"{type(pairs).__name__}")
        pair_list = []
        for i, e in enumerate(pairs):
            if isinstance(e, (str, bytes)) or not hasattr(e, "__len__") or len(e) != 2:
                raise ValueError(f"Expected `pairs` to hold (parent, child) pairs, but item {i} is {e!r}")
            pair_list.append((e[0], e[1]))
        return cls._from_pairs(pair_list, leaf_order, labels, where=where)

    @classmethod
    def from_networkx(cls, graph, leaf_order: Sequence[Hashable] | None = None, label_attr: str | None = "label") -> "Hierarchy":
        """Build from a ``networkx.DiGraph`` whose edges point from parent to child."""
        if not hasattr(graph, "edges") or not hasattr(graph, "is_directed"):
            raise TypeError(f"Expected `graph` to be a networkx DiGraph, but got {type(graph).__name__}")
        if not graph.is_directed():
            raise ValueError("Expected `graph` to be directed (parent -> child edges), but it is undirected")
        labels = None
        if label_attr is not None:
            found = {n: d[label_attr] for n, d in graph.nodes(data=True) if label_attr in d}
            labels = found or None
        return cls._from_pairs(list(graph.edges()), leaf_order, labels, extra_nodes=list(graph.nodes()))

    @classmethod
    def from_paths(cls, paths: Sequence[str], sep: str = "/") -> "Hierarchy":
        """Build from one label path per class, in model column order, e.g. ``"animal/dog/beagle"``.

        Whitespace around each component is padding, never part of the name (as in the files of
        :meth:`from_edges`): ``"animal / dog"`` and ``"animal/dog "`` are the path ``"animal/dog"``,
        so ``["a/b", "a /c"]`` gives one node ``"a"`` with two children.  Node ids are the path
        prefixes of the stripped components joined with ``sep``.  If the paths do not share a first
        component, an implicit root with id ``""`` is added.  An empty component (after stripping),
        a component holding an invisible character (a tab, a zero-width space: names that look the
        same would differ), two paths that are equal after stripping, and a class path that is a
        prefix of another class path (use :meth:`with_stop_leaves` on a tree with internal labels)
        are errors naming the path.
        """
        if isinstance(paths, (str, bytes)):
            raise TypeError("Expected `paths` to be a sequence of strings, one per class, but got a single string")
        paths = list(paths)
        if not paths:
            raise ValueError("Expected a non-empty tree, but `paths` is empty")
        if not isinstance(sep, str) or not sep:
            raise TypeError(f"Expected `sep` to be a non-empty string, but got {sep!r}")
        split = []
        for i, p in enumerate(paths):
            if not isinstance(p, str):
                raise TypeError(f"Expected `paths` to hold strings, but paths[{i}] is {type(p).__name__}")
            parts = [x.strip() for x in p.split(sep)]
            # one separator at either end is allowed ("/animal/dog/")
            parts = parts[1:] if len(parts) > 1 and not parts[0] else parts
            parts = parts[:-1] if len(parts) > 1 and not parts[-1] else parts
            if any(x == "" for x in parts):
                raise ValueError(f"Expected non-empty path components, but paths[{i}] = {p!r}")
            bad = next((ch for x in parts for ch in x if not ch.isprintable()), None)
            if bad is not None:
                raise ValueError(f"paths[{i}] = {p!r} contains the invisible character {bad!r} (U+{ord(bad):04X}) "
                                 "inside a component: remove it")
            split.append(parts)
        first: dict[tuple, int] = {}
        for i, parts in enumerate(split):
            j = first.setdefault(tuple(parts), i)
            if j != i:
                same = "" if paths[i] == paths[j] else " (equal once the whitespace around components is removed)"
                raise ValueError(f"Expected one path per class, but {sep.join(parts)!r} appears twice: paths[{j}] = "
                                 f"{paths[j]!r} and paths[{i}] = {paths[i]!r}{same}")
        firsts = {s[0] for s in split}
        implicit = len(firsts) > 1 or any(len(s) == 1 for s in split)
        pairs, leaves = [], []
        for parts in split:
            prefix = [sep.join(parts[: i + 1]) for i in range(len(parts))]
            chain = ([""] if implicit else []) + prefix
            pairs.extend(zip(chain[:-1], chain[1:]))
            leaves.append(prefix[-1])
        pairs = list(dict.fromkeys(pairs))
        leafset = set(leaves)
        internal_classes = {p for p, _ in pairs if p in leafset}
        if internal_classes:
            raise ValueError(
                f"Class path {sorted(internal_classes)[0]!r} is a prefix of another class path: classes must be "
                "leaves. Build the tree without it, then use Hierarchy.with_stop_leaves()"
            )
        return cls._from_pairs(pairs, leaves, None)

    @classmethod
    def from_json(cls, path: str | os.PathLike | io.TextIOBase) -> "Hierarchy":
        """Load ``{"parents": [...], "ids": [...], "labels": [...]}`` (``ids``/``labels`` optional)
        from a path or an open text file, as written by :meth:`to_json`.

        A missing or unreadable file raises the ``OSError`` subclass (``FileNotFoundError``, ...),
        an empty, truncated or invalid file a ``ValueError``; every message names the file.
        """
        data, name = read_json_file(path)
        try:
            return cls.from_json_dict(data)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"Invalid hierarchy JSON {name}: {exc}") from None

    @classmethod
    def from_json_dict(cls, data: Mapping) -> "Hierarchy":
        """Inverse of :meth:`to_json_dict`: JSON arrays in ``ids`` become tuples (ids must be hashable).

        ``num_nodes``/``num_leaves``, when present, must match the tree (a check against edited
        or cut files).
        """
        if not isinstance(data, Mapping) or "parents" not in data:
            got = type(data).__name__ if not isinstance(data, Mapping) else f"keys {sorted(map(str, data))[:6]}"
            raise ValueError(f"Expected a JSON object with a `parents` field, but got {got}")
        ids = data.get("ids")
        if ids is not None:
            ids = [from_json_id(x) for x in as_list(ids, "ids")]
        h = cls.from_parents(data["parents"], names=ids, labels=data.get("labels"))
        for key in ("num_nodes", "num_leaves"):
            if key in data and data[key] != getattr(h, key):
                raise ValueError(f"The JSON says {key} = {data[key]!r}, but its `parents` describe a tree with "
                                 f"{getattr(h, key)}")
        return h

    @classmethod
    def _from_pairs(cls, pairs: list, leaf_order, labels, extra_nodes: Iterable[Hashable] = (),
                    where: tuple[str, list[int]] | None = None) -> "Hierarchy":
        """``where = (file name, line numbers)``: the line pair ``i`` comes from, for error messages."""
        nodes: dict[Hashable, int] = {}
        for p, c in pairs:
            for x in (p, c):
                try:
                    nodes.setdefault(x, len(nodes))
                except TypeError:
                    raise TypeError(f"Node ids must be hashable, but got {x!r}") from None
        for x in extra_nodes:
            nodes.setdefault(x, len(nodes))
        if not nodes:
            raise ValueError("Expected a non-empty tree, but got no nodes")
        ids = list(nodes)
        n = len(ids)
        par = np.full(n, -1, dtype=np.int64)
        first: dict[int, int] = {}  # child -> index of the pair that gave its parent
        for i, (p, c) in enumerate(pairs):
            ci = nodes[c]
            if nodes[p] == ci:
                at = f" ({where[0]}, line {where[1][i]})" if where else ""
                raise ValueError(f"The tree has a cycle: node {c!r} is its own parent{at}")
            if ci in first and pairs[first[ci]][0] != p:
                at = f" ({where[0]}, lines {where[1][first[ci]]} and {where[1][i]})" if where else ""
                raise ValueError(f"Node {c!r} has two parents ({pairs[first[ci]][0]!r} and {p!r}){at}: a hierarchy "
                                 "must be a tree")
            first.setdefault(ci, i)
            par[ci] = nodes[p]
        try:
            is_leaf, _ = canonical_order(par)
        except ValueError:
            # The structural check speaks of internal indices; name the user's nodes instead.
            lines = {ci: f"{where[0]}, line {where[1][i]}" for ci, i in first.items()} if where else None
            explain_bad_tree(par, ids, lines)
            raise
        leaf_ids = [ids[i] for i in np.flatnonzero(is_leaf)]
        internal_ids = [ids[i] for i in np.flatnonzero(~is_leaf)]
        if leaf_order is None:
            leaf_order = sort_or_keep(leaf_ids)
        else:
            leaf_order = list(leaf_order)
            leaf_positions(leaf_order, nodes, is_leaf)
        order_ids = list(leaf_order) + sort_or_keep(internal_ids)
        order = np.array([nodes[x] for x in order_ids], dtype=np.int64)
        new_of_old = np.empty(n, dtype=np.int64)
        new_of_old[order] = np.arange(n)
        old_par = par[order]
        new_par = np.where(old_par >= 0, new_of_old[np.maximum(old_par, 0)], -1)
        lab = None
        if labels:
            lab = [str(labels.get(x, x)) for x in order_ids]
        return cls(new_par, order_ids, lab)


def leaf_positions(leaf_order, pos: Mapping, is_leaf: np.ndarray) -> np.ndarray:
    leaf_order = list(leaf_order)
    out = np.empty(len(leaf_order), dtype=np.int64)
    for i, x in enumerate(leaf_order):
        try:
            j = pos[x]
        except (KeyError, TypeError):
            raise ValueError(f"Unknown id {x!r} in `leaf_order` (item {i}): it is not a node of the tree") from None
        if not is_leaf[j]:
            raise ValueError(f"`leaf_order` item {i} ({x!r}) is an internal node, not a leaf")
        out[i] = j
    if len(set(out.tolist())) != len(out):
        raise ValueError("Expected each leaf once in `leaf_order`, but some appear twice")
    if len(out) != int(is_leaf.sum()):
        raise ValueError(
            f"Expected `leaf_order` to list all {int(is_leaf.sum())} leaves, but it has {len(out)}"
        )
    return out


def explain_bad_tree(par: np.ndarray, ids: list, where: dict | None) -> None:
    """Raise a ValueError naming the nodes (original ids) behind a failed structural check; return if none found.

    ``where[i]``: where node ``i``'s parent was given (``"tree.csv, line 4"``), if known.

    Runs only on the error path, so plain Python walks are fine here.
    """
    def loc(i):
        return f" ({where[i]})" if where and i in where else ""

    n = par.shape[0]
    self_loop = np.flatnonzero(par == np.arange(n))
    if self_loop.size:
        i = int(self_loop[0])
        raise ValueError(f"The tree has a cycle: node {ids[i]!r} is its own parent{loc(i)}")
    roots = np.flatnonzero(par == -1).tolist()
    if len(roots) > 1:
        shown = ", ".join(repr(ids[i]) for i in roots[:5]) + (", ..." if len(roots) > 5 else "")
        raise ValueError(f"Expected exactly one root (a node that is nobody's child), but found {len(roots)}: "
                         f"{shown}. Add a common root above them")
    reached = np.zeros(n, dtype=bool)
    if roots:
        children: dict[int, list[int]] = {}
        for c, p in enumerate(par.tolist()):
            if p >= 0:
                children.setdefault(p, []).append(c)
        stack = [roots[0]]
        reached[roots[0]] = True
        while stack:
            for c in children.get(stack.pop(), ()):
                if not reached[c]:
                    reached[c] = True
                    stack.append(c)
    if reached.all():
        return
    # Every node outside the root's subtree climbs into a cycle: follow parents until one repeats.
    node, seen = int(np.flatnonzero(~reached)[0]), {}
    while node not in seen:
        seen[node] = len(seen)
        node = int(par[node])
    cycle = [x for x, k in seen.items() if k >= seen[node]]  # child -> parent order (dicts keep insertion order)
    shown = [repr(ids[x]) for x in cycle[:10]] + (["..."] if len(cycle) > 10 else []) + [repr(ids[cycle[0]])]
    none = "" if roots else " and no root (expected exactly one root, a node that is nobody's child)"
    raise ValueError(f"The tree has a cycle{none}: {' -> '.join(shown)} (each arrow points from a node to its "
                     f"parent){loc(cycle[0])}")


def as_list(values, name: str) -> list:
    """A list from any sized iterable (a string is not accepted: it would be split into characters)."""
    if values is None or isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"Expected `{name}` to be a sequence with one entry per node, but got {type(values).__name__}")
    return list(values)


def check_unique_ids(names: list) -> None:
    try:
        distinct = len(set(names))
    except TypeError:
        bad = next(x for x in names if not isinstance(x, Hashable) or _unhashable(x))
        raise TypeError(f"Expected hashable node ids in `names`, but got {bad!r} ({type(bad).__name__})") from None
    if distinct != len(names):
        seen: set = set()
        dup = next(x for x in names if x in seen or seen.add(x))
        raise ValueError(f"Expected distinct node ids in `names`, but {dup!r} appears more than once")


def _unhashable(x) -> bool:
    try:
        hash(x)
    except TypeError:
        return True
    return False
