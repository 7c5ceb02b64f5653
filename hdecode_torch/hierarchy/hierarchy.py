"""The compiled class tree every kernel, metric and decoder works on: its tables on a device, the cache of
what is derived from them, original ids and labels, and its JSON form.  The constructors
(``Hierarchy.from_...``) are in ``constructors.py``, the reading of files in ``parsing.py`` and the
compilation of a parent array into index arrays in ``structure.py``."""

from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, Callable

import numpy as np
import torch

from .constructors import TreeConstructors, as_list, check_unique_ids
from .parsing import to_json_id
from .structure import CompiledTree, compile_parents

__all__ = ["Hierarchy"]


class Hierarchy(TreeConstructors):
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
        names = as_list(names, "names")
        if len(names) != n:
            raise ValueError(f"Expected `names` to have one entry per node ({n}), but got {len(names)}")
        check_unique_ids(names)
        if labels is not None:
            labels = [str(x) for x in as_list(labels, "labels")]
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
            with warnings.catch_warnings():  # some torch releases warn here even with check_invariants=False
                warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
                return torch.sparse_coo_tensor(idx, vals, (self.num_leaves, self.num_nodes),
                                               check_invariants=False).coalesce()
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

    def to_json_dict(self) -> dict:
        """``{"num_nodes", "num_leaves", "parents", "ids"[, "labels"]}``, JSON-serializable.

        Original ids are written as they are when they are JSON scalars (str, int, float, bool,
        None; numpy scalars become Python ones) and tuples of them as JSON arrays, which
        :meth:`from_json` reads back as tuples, so ``with_stop_leaves`` ids ``(name, "<stop>")``
        round-trip.  Any other id type is a ``TypeError``: convert the ids to strings first.
        """
        out = {"num_nodes": self.num_nodes, "num_leaves": self.num_leaves, "parents": self.parents_list,
               "ids": [to_json_id(x) for x in self._names]}
        if self._labels is not None:
            out["labels"] = self.labels
        return out

    def to_json(self, path: str | os.PathLike) -> None:
        """Write ``parents`` (canonical), ``ids`` (original ids) and ``labels``; read back with :meth:`from_json`."""
        data = self.to_json_dict()  # raises before the file is touched
        with open(path, "w") as f:
            json.dump(data, f)

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
