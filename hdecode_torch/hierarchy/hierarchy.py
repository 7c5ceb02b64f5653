"""The compiled class tree every kernel, metric and decoder works on."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import sys
import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Callable

import numpy as np
import torch

from .structure import CompiledTree, _as_parent_array, canonical_order, compile_parents

__all__ = ["Hierarchy"]


# A decimal number written as text: edge-list files give every id as a string, and "10" < "2" as strings.
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def _sort_or_keep(items: list) -> list:
    """Sorted original ids: by numeric value when every id is a string holding a decimal number
    (``"2" < "10"``; equal values such as ``"1"`` and ``"01"`` by their text), else as the ids
    compare; first-seen order when they cannot be compared."""
    if items and all(isinstance(x, str) and _NUMBER.fullmatch(x) for x in items):
        return sorted(items, key=lambda x: (Decimal(x), x))
    try:
        return sorted(items)
    except TypeError:
        return list(items)


class Hierarchy:
    """A validated class tree compiled into tensors.

    Canonical ids: leaves are ``0..L-1`` in the model's column order and
    internal nodes ``L..N-1``, so a class index *is* a leaf's node id.  Build one with
    :meth:`from_parents`, :meth:`from_dict`, :meth:`from_edges`, :meth:`from_networkx`,
    :meth:`from_paths`, :meth:`from_json` or :func:`~hdecode_torch.load_hierarchy`.

    Tensor attributes (all on :attr:`device`, ``N`` nodes, ``L`` leaves, ``D`` the
    deepest leaf's depth), built in O(N log N) time and O(N) memory whatever the depth:

    - ``parent``: (N,) int64, -1 at the root; ``parent_or_root`` the same with the root as its own parent
    - ``depth``: (N,) int64, 0 at the root
    - ``leaf_count``: (N,) int64, number of leaves under each node
    - ``information``: (N,) float64, ``I(n) = log(L / leaf_count[n])``
    - ``min_leaf_depth`` / ``max_leaf_depth``: (N,) int64, shallowest / deepest leaf below
    - ``height``: (N,) int64, ``max_leaf_depth - depth``
    - ``children_ptr`` (N+1,) / ``children`` (N-1,): int64 CSR of children, ascending ids
    - ``pos`` / ``size``: (N,) int64 position in the depth-first preorder (children in ascending id
      order) and number of nodes in the subtree: m lies under n iff
      ``pos[n] <= pos[m] < pos[n] + size[n]``
    - ``leaf_start``: (N,) int64, the leaves of n are positions ``leaf_start[n] ..
      leaf_start[n] + leaf_count[n] - 1`` of the leaves in depth-first order (``dfs_leaves``, (L,))

    Built on first use, cached per device: ``levels`` (list of (n_d,) int64 tensors, the nodes at
    each depth) and ``ancestors`` ((N, D+1) int64, ``ancestors[n, d]`` the ancestor of ``n`` at depth
    ``d``, the sentinel ``N`` below ``n``'s depth), which grows with N × D and is refused when it
    would exceed ``ANCESTOR_TABLE_MAX_ENTRIES`` (check :attr:`ancestor_table_fits`).
    """

    #: Largest ancestors-by-depth table built (entries; 1 GiB of int64).
    ANCESTOR_TABLE_MAX_ENTRIES = 2**27

    def __init__(self, parents, names: Sequence[Hashable] | None = None, labels: Sequence[str] | None = None,
                 *, device: torch.device | str | None = None, _compiled: CompiledTree | None = None):
        tree = _compiled if _compiled is not None else compile_parents(parents)
        n = tree.num_nodes
        if names is None:
            names = list(range(n))
        names = _as_list(names, "names")
        if len(names) != n:
            raise ValueError(f"Expected `names` to have one entry per node ({n}), but got {len(names)}")
        _check_unique_ids(names)
        if labels is not None:
            labels = [str(x) for x in _as_list(labels, "labels")]
            if len(labels) != n:
                raise ValueError(f"Expected `labels` to have one entry per node ({n}), but got {len(labels)}")
        self._tree = tree
        self._names = names
        self._labels = labels
        self._index: dict | None = None
        self.num_nodes: int = n
        self.num_leaves: int = int((tree.children_ptr[1:] == tree.children_ptr[:-1]).sum())
        self.root: int = int(np.flatnonzero(tree.parent == -1)[0])
        self.max_depth: int = tree.max_depth
        #: number of distinct leaf depths E (the width of per-leaf-depth tables)
        self.num_leaf_depths: int = int(np.unique(tree.depth[: self.num_leaves]).size)
        self._device = torch.device(device) if device is not None else torch.device("cpu")
        self._build_tensors()

    # ------------------------------------------------------------------ tensors
    def _build_tensors(self) -> None:
        t, dev = self._tree, self._device

        def T(a):
            a = np.ascontiguousarray(a)
            # A tree unpickled from shared memory (Ray's object store) holds read-only arrays: torch would warn
            # that writing through the tensor is undefined; the tables are never written, a copy is O(N).
            return torch.as_tensor(a if a.flags.writeable else a.copy()).to(dev)

        self.parent = T(t.parent)
        #: (N,) int64 the parent, with the root as its own parent (for gathers with no -1)
        self.parent_or_root = torch.where(self.parent >= 0, self.parent, self.root)
        self.depth = T(t.depth)
        self.leaf_count = T(t.leaf_count)
        self.information = T(np.log(self.num_leaves / t.leaf_count.astype(np.float64)))
        self.min_leaf_depth = T(t.min_leaf_depth)
        self.max_leaf_depth = T(t.max_leaf_depth)
        self.height = self.max_leaf_depth - self.depth
        self.children_ptr = T(t.children_ptr)
        self.children = T(t.children)
        self.pos = T(t.pos)
        self.size = T(t.size)
        self.leaf_start = T(t.leaf_start)
        self._cache: dict[Any, Any] = {}

    @property
    def levels(self) -> list[torch.Tensor]:
        """The nodes at each depth 0..D, ascending ids (built on first use: D + 1 tensors)."""
        def build():
            t = self._tree
            order = np.argsort(t.depth, kind="stable")
            bounds = np.cumsum(np.bincount(t.depth, minlength=self.max_depth + 1))[:-1]
            return [torch.as_tensor(lvl).to(self._device) for lvl in np.split(order, bounds)]
        return self.cached("levels", build)

    @property
    def ancestor_table_fits(self) -> bool:
        """Whether :attr:`ancestors` ((N, D+1) int64) is within ``ANCESTOR_TABLE_MAX_ENTRIES``."""
        return self.num_nodes * (self.max_depth + 1) <= self.ANCESTOR_TABLE_MAX_ENTRIES

    @property
    def ancestors(self) -> torch.Tensor:
        """(N, D+1) int64 ancestors by depth (sentinel ``N`` below each node's depth), built on first use."""
        def build():
            n, d_max = self.num_nodes, self.max_depth
            if not self.ancestor_table_fits:
                raise ValueError(
                    f"The ancestors-by-depth table of this tree would hold {n} x {d_max + 1} entries "
                    f"({8 * n * (d_max + 1) / 2**30:.1f} GiB): the tree is too deep for it (the decoders do not "
                    "need it; raise Hierarchy.ANCESTOR_TABLE_MAX_ENTRIES to build it anyway)")
            t = self._tree
            anc = np.full((n, d_max + 1), n, dtype=np.int64)
            anc[self.root, 0] = self.root
            levels = np.split(np.argsort(t.depth, kind="stable"),
                              np.cumsum(np.bincount(t.depth, minlength=d_max + 1))[:-1])
            for d in range(1, d_max + 1):
                lvl = levels[d]
                anc[lvl, :d] = anc[t.parent[lvl], :d]
                anc[lvl, d] = lvl
            return torch.as_tensor(anc).to(self._device)
        return self.cached("ancestors", build)

    @property
    def dfs_leaves(self) -> torch.Tensor:
        """(L,) int64 the leaves in depth-first order (so the leaves of n are one contiguous run)."""
        def build():
            order = torch.empty_like(self.pos)
            order[self.pos] = torch.arange(self.num_nodes, device=self._device)
            return order[order < self.num_leaves]
        return self.cached("dfs_leaves", build)

    @property
    def device(self) -> torch.device:
        return self._device

    def to(self, device: torch.device | str) -> "Hierarchy":
        """Return this hierarchy with its tensors on ``device`` (``self`` if already there)."""
        device = _as_device(device)
        if device == self._device:
            return self
        copies = self.__dict__.setdefault("_copies", {self._device: self})
        if device not in copies:  # one compiled copy per device, shared by all copies
            new = object.__new__(Hierarchy)
            new.__dict__.update(self.__dict__)
            new._device = device
            new._build_tensors()
            copies[device] = new
        return copies[device]

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """Memoize a tree-only derived structure (per hierarchy and device)."""
        try:
            return self._cache[key]
        except KeyError:
            if "torch._dynamo" in sys.modules:
                # Tree tables are built once, eagerly, with real tensors: never inside a traced graph.
                # Under torch.compile a miss can also happen in the eager part after a graph break,
                # where is_compiling() is False but Dynamo still compiles every new frame, so whenever
                # Dynamo is loaded the build runs with it disabled (a miss is rare; without Dynamo
                # loaded nothing can trace, and importing it would cost seconds).
                make = build  # may be a class (a cache's container): disable wraps functions only
                build = torch.compiler.disable(lambda: make())
            value = self._cache[key] = build()
            return value

    def same_tree(self, other) -> bool:
        """Whether ``other`` is a Hierarchy with the same canonical structure (``parents``), on any device."""
        if other is self or getattr(other, "_tree", None) is self._tree:
            return True
        return (isinstance(other, Hierarchy) and other.num_nodes == self.num_nodes
                and other.num_leaves == self.num_leaves and np.array_equal(other._tree.parent, self._tree.parent))

    def __getstate__(self):
        state = dict(self.__dict__)
        for k in ("parent", "parent_or_root", "depth", "leaf_count", "information", "min_leaf_depth",
                  "max_leaf_depth", "height", "children_ptr", "children", "pos", "size", "leaf_start", "_cache",
                  "_index", "_copies"):
            state.pop(k, None)
        state["_device"] = str(self._device)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        device = torch.device(state["_device"])
        if device.type == "cuda" and not torch.cuda.is_available():
            # Pickled on a GPU machine, loaded on one without CUDA: the tree itself is device-free.
            warnings.warn(f"Hierarchy was pickled on {device}, but CUDA is not available: loading it on the CPU",
                          stacklevel=2)
            device = torch.device("cpu")
        self._device = device
        self._index = None
        self._build_tensors()

    # ----------------------------------------------------------------- derived
    @property
    def leaf_depth(self) -> torch.Tensor:
        """(L,) int64 depth of each leaf."""
        return self.depth[: self.num_leaves]

    @property
    def names(self) -> list:
        """Original id of every node, in canonical order."""
        return list(self._names)

    @property
    def labels(self) -> list[str] | None:
        """Human-readable labels if the source had them, else ``None``."""
        return None if self._labels is None else list(self._labels)

    def name(self, node: int) -> Hashable:
        """Original id of ``node`` (a canonical id in 0..N-1; a negative id is an error, not an index
        from the end)."""
        return self._names[self._node_id(node)]

    def label(self, node: int) -> str:
        """Readable label of ``node`` (its label, else its original id); ``node`` as in :meth:`name`."""
        node = self._node_id(node)
        return self._labels[node] if self._labels is not None else str(self._names[node])

    def _node_id(self, node, name: str = "node") -> int:
        """``node`` as a canonical id: an integer (Python, numpy or a 0-d integer tensor) in 0..N-1."""
        if isinstance(node, torch.Tensor) and node.dim() == 0 and not (
                node.is_floating_point() or node.is_complex() or node.dtype == torch.bool):
            node = node.item()
        if isinstance(node, (bool, np.bool_)) or not isinstance(node, (int, np.integer)):
            raise TypeError(f"Expected `{name}` to be an integer node id, but got {node!r} ({type(node).__name__})")
        if not 0 <= node < self.num_nodes:
            raise ValueError(f"Expected `{name}` to be a node id in 0..{self.num_nodes - 1}, but got {node}")
        return int(node)

    def index(self, original_id: Hashable) -> int:
        """Canonical id of the node whose original id is ``original_id``."""
        if self._index is None:
            self._index = {nm: i for i, nm in enumerate(self._names)}
        try:
            return self._index[original_id]
        except KeyError:
            raise KeyError(f"Unknown node id {original_id!r}") from None
        except TypeError:
            raise TypeError(f"Node ids must be hashable, but got {type(original_id).__name__}") from None

    @property
    def is_leaf(self) -> torch.Tensor:
        """(N,) bool."""
        return torch.arange(self.num_nodes, device=self._device) < self.num_leaves

    @property
    def num_children(self) -> torch.Tensor:
        """(N,) int64."""
        return self.children_ptr[1:] - self.children_ptr[:-1]

    def leaf_ancestor_incidence(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Sparse (L, N) matrix with a 1 where the column is an ancestor of (or is) the row leaf."""
        def build():
            anc = self.ancestors[: self.num_leaves]
            valid = anc < self.num_nodes
            rows = torch.arange(self.num_leaves, device=self._device)[:, None].expand_as(anc)[valid]
            idx = torch.stack([rows, anc[valid]])
            vals = torch.ones(idx.shape[1], dtype=dtype, device=self._device)
            return torch.sparse_coo_tensor(idx, vals, (self.num_leaves, self.num_nodes), check_invariants=False).coalesce()
        return self.cached(("leaf_ancestor_incidence", dtype), build)

    @property
    def parents_list(self) -> list[int]:
        return self._tree.parent.tolist()

    def statistics(self) -> dict:
        """Sizes, depths, branching and single-child chains, as plain Python numbers."""
        t = self._tree
        nchild = t.children_ptr[1:] - t.children_ptr[:-1]
        internal = nchild > 0
        leaf_depth = t.depth[: self.num_leaves]
        unary = np.flatnonzero(nchild == 1)
        return {
            "num_nodes": self.num_nodes,
            "num_leaves": self.num_leaves,
            "num_internal": int(internal.sum()),
            "max_depth": self.max_depth,
            "min_leaf_depth": int(leaf_depth.min()),
            "mean_leaf_depth": float(leaf_depth.mean()),
            "max_branching": int(nchild.max()),
            "mean_branching": float(nchild[internal].mean()),
            "num_single_child_nodes": int(unary.size),
            "leaves_per_depth": {int(d): int(c) for d, c in zip(*np.unique(leaf_depth, return_counts=True))},
        }

    def __repr__(self) -> str:
        return (f"Hierarchy(num_nodes={self.num_nodes}, num_leaves={self.num_leaves}, "
                f"max_depth={self.max_depth}, device={self._device})")

    def __len__(self) -> int:
        return self.num_nodes

    # ------------------------------------------------------------ constructors
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
            names = _as_list(names, "names")
            if len(names) != n:
                raise ValueError(f"Expected `names` to have one entry per node ({n}), but got {len(names)}")
            _check_unique_ids(names)
        if labels is not None:
            labels = _as_list(labels, "labels")
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
            leaves = _leaf_positions(leaf_order, pos, is_leaf)
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
            pairs, where = _read_edge_file(pairs, delimiter)
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
        name = _source_name(path)
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
            raise _os_error(exc, f"Cannot read hierarchy JSON {name}") from None
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
            ids = [_from_json_id(x) for x in _as_list(ids, "ids")]
        h = cls.from_parents(data["parents"], names=ids, labels=data.get("labels"))
        for key in ("num_nodes", "num_leaves"):
            if key in data and data[key] != getattr(h, key):
                raise ValueError(f"The JSON says {key} = {data[key]!r}, but its `parents` describe a tree with "
                                 f"{getattr(h, key)}")
        return h

    def to_json_dict(self) -> dict:
        """``{"num_nodes", "num_leaves", "parents", "ids"[, "labels"]}``, JSON-serializable.

        Original ids are written as they are when they are JSON scalars (str, int, float, bool,
        None; numpy scalars become Python ones) and tuples of them as JSON arrays, which
        :meth:`from_json` reads back as tuples, so ``with_stop_leaves`` ids ``(name, "<stop>")``
        round-trip.  Any other id type is a ``TypeError``: convert the ids to strings first.
        """
        out = {"num_nodes": self.num_nodes, "num_leaves": self.num_leaves, "parents": self.parents_list,
               "ids": [_to_json_id(x) for x in self._names]}
        if self._labels is not None:
            out["labels"] = self.labels
        return out

    def to_json(self, path: str | os.PathLike) -> None:
        """Write ``parents`` (canonical), ``ids`` (original ids) and ``labels``; read back with :meth:`from_json`."""
        data = self.to_json_dict()  # raises before the file is touched
        with open(path, "w") as f:
            json.dump(data, f)

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
            _explain_bad_tree(par, ids, lines)
            raise
        leaf_ids = [ids[i] for i in np.flatnonzero(is_leaf)]
        internal_ids = [ids[i] for i in np.flatnonzero(~is_leaf)]
        if leaf_order is None:
            leaf_order = _sort_or_keep(leaf_ids)
        else:
            leaf_order = list(leaf_order)
            _leaf_positions(leaf_order, nodes, is_leaf)
        order_ids = list(leaf_order) + _sort_or_keep(internal_ids)
        order = np.array([nodes[x] for x in order_ids], dtype=np.int64)
        new_of_old = np.empty(n, dtype=np.int64)
        new_of_old[order] = np.arange(n)
        old_par = par[order]
        new_par = np.where(old_par >= 0, new_of_old[np.maximum(old_par, 0)], -1)
        lab = None
        if labels:
            lab = [str(labels.get(x, x)) for x in order_ids]
        return cls(new_par, order_ids, lab)

    def with_stop_leaves(self, nodes: Iterable[int] | None = None, suffix: str = "<stop>") -> "Hierarchy":
        """A new tree with a "stop" leaf under each given internal node (default: all).

        For datasets whose labels can be internal nodes (paper §3, remark): the label
        "internal node n" becomes the new leaf ``(name(n), suffix)``.  The new leaves come
        after the existing ones in column order.
        """
        if nodes is None:
            nodes = range(self.num_leaves, self.num_nodes)
        try:
            nodes = sorted({int(x) for x in nodes})
        except (TypeError, ValueError):
            raise TypeError(f"Expected `nodes` to be internal node ids (ints), but got {nodes!r}") from None
        for x in nodes:
            if not (self.num_leaves <= x < self.num_nodes):
                raise ValueError(f"Expected internal node ids in {self.num_leaves}..{self.num_nodes - 1}, but got {x}")
        pairs = [(self._names[int(p)], self._names[c]) for c, p in enumerate(self._tree.parent) if p >= 0]
        stops = [(self._names[x], suffix) for x in nodes]
        pairs += [(self._names[x], s) for x, s in zip(nodes, stops)]
        order = list(self._names[: self.num_leaves]) + stops
        labels = None
        if self._labels is not None:
            labels = dict(zip(self._names, self._labels))
            labels.update({s: f"{self._labels[x]} ({suffix})" for x, s in zip(nodes, stops)})
        return Hierarchy._from_pairs(pairs, order, labels)


def _leaf_positions(leaf_order, pos: Mapping, is_leaf: np.ndarray) -> np.ndarray:
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


def _source_name(source) -> str:
    """How a path or an open file is named in error messages."""
    if hasattr(source, "read"):
        name = getattr(source, "name", None)
        return repr(name) if isinstance(name, str) and not name.startswith("<") else (name or "<file object>")
    return repr(os.fspath(source))


def _os_error(exc: OSError, prefix: str) -> OSError:
    """The same OSError subclass, with a one-line message that names the file and the problem."""
    return type(exc)(f"{prefix}: {exc.strerror or exc}")


def _read_edge_file(source, delimiter: str | None) -> tuple[list[tuple[str, str]], tuple[str, list[int]]]:
    """``(pairs, (file name, line numbers))`` from an edge-list file (a path or an open text file)."""
    name = _source_name(source)
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
        raise _os_error(exc, f"Cannot read edge list {name}") from None
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


def _explain_bad_tree(par: np.ndarray, ids: list, where: dict | None) -> None:
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


def _as_list(values, name: str) -> list:
    """A list from any sized iterable (a string is not accepted: it would be split into characters)."""
    if values is None or isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"Expected `{name}` to be a sequence with one entry per node, but got {type(values).__name__}")
    return list(values)


def _check_unique_ids(names: list) -> None:
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


def _as_device(device) -> torch.device:
    if isinstance(device, torch.device):
        dev = device
    elif isinstance(device, (str, int)) and not isinstance(device, bool):
        try:
            dev = torch.device(device)
        except RuntimeError as exc:
            raise ValueError(f"Expected `device` to be a torch device such as 'cpu' or 'cuda:0', but got {device!r}: "
                             f"{exc}") from None
    else:
        raise TypeError(f"Expected `device` to be a torch.device or a string, but got {type(device).__name__}")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"Cannot move the hierarchy to {dev}: CUDA is not available")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"Cannot move the hierarchy to {dev}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


_JSON_SCALARS = (str, int, float, bool, type(None))


def _to_json_id(x):
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, _JSON_SCALARS):
        return x
    if isinstance(x, tuple):
        return [_to_json_id(v) for v in x]
    raise TypeError(f"Cannot write node id {x!r} ({type(x).__name__}) to JSON: ids must be str, int, float, bool, "
                    "None or tuples of these; convert the ids to strings first")


def _from_json_id(x):
    return tuple(_from_json_id(v) for v in x) if isinstance(x, list) else x
