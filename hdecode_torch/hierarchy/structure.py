"""Validation and compilation of a canonical parent array (numpy, vectorized).

Everything here works on a *canonical* parent array: leaves are ``0..L-1`` and
internal nodes ``L..N-1``.  The public constructors in :mod:`.hierarchy` turn any
input format into that form first.  Work is vectorized per tree level so that a
1M-node tree compiles in seconds: the only Python loops run over depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CompiledTree", "compile_parents", "canonical_order"]


@dataclass(frozen=True)
class CompiledTree:
    """Numpy arrays describing a validated canonical tree (see :class:`Hierarchy`)."""

    parent: np.ndarray  # (N,) int64, -1 at the root
    depth: np.ndarray  # (N,) int64
    levels: list  # levels[d]: (n_d,) int64 node ids at depth d, sorted
    ancestors: np.ndarray  # (N, D+1) int64, ancestors[n, d] = ancestor at depth d, N past depth(n)
    leaf_count: np.ndarray  # (N,) int64, |L(n)|
    min_leaf_depth: np.ndarray  # (N,) int64
    max_leaf_depth: np.ndarray  # (N,) int64
    children_ptr: np.ndarray  # (N+1,) int64 CSR over children sorted by (parent, id)
    children: np.ndarray  # (N-1,) int64

    @property
    def num_nodes(self) -> int:
        return int(self.parent.shape[0])


def _as_parent_array(parents) -> np.ndarray:
    if parents is None or isinstance(parents, (str, bytes, dict)) or not hasattr(parents, "__len__") and not hasattr(parents, "__array__"):
        raise TypeError(f"Expected `parents` to be a sequence of integer node ids, but got {type(parents).__name__}")
    try:
        arr = np.asarray(parents.cpu() if hasattr(parents, "cpu") else parents)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(f"Expected `parents` to be a flat sequence of ints, but got {type(parents).__name__}: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"Expected `parents` to be one-dimensional, but got shape {tuple(arr.shape)}")
    if arr.size == 0:
        raise ValueError("Expected a non-empty tree, but `parents` is empty")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == object or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"Expected `parents` to hold integer node ids, but got dtype {arr.dtype}")
    if arr.dtype == object:
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in arr.tolist()):
            raise TypeError("Expected `parents` to hold integer node ids, but got non-integer entries")
        big = [x for x in arr.tolist() if not (-1 <= x < arr.size)]
        if big:
            i = next(i for i, x in enumerate(arr.tolist()) if not (-1 <= x < arr.size))
            raise ValueError(f"Expected every entry of `parents` in -1..{arr.size - 1}, but parents[{i}] = {big[0]}")
        arr = arr.astype(np.int64)
    elif np.issubdtype(arr.dtype, np.floating):
        finite = np.isfinite(arr)
        if not finite.all() or not np.array_equal(np.floor(arr), arr):
            i = int(np.flatnonzero(~finite | (np.floor(np.where(finite, arr, 0)) != np.where(finite, arr, 0)))[0])
            raise TypeError(f"Expected `parents` to hold integer node ids, but parents[{i}] = {arr[i]!r}")
        if (np.abs(arr) > 2.0 ** 62).any():
            i = int(np.flatnonzero(np.abs(arr) > 2.0 ** 62)[0])
            raise ValueError(f"Expected every entry of `parents` in -1..{arr.size - 1}, but parents[{i}] = {arr[i]!r}")
        arr = arr.astype(np.int64)
    elif arr.dtype == np.uint64 and (arr > np.iinfo(np.int64).max).any():
        i = int(np.flatnonzero(arr > np.iinfo(np.int64).max)[0])
        raise ValueError(f"Expected every entry of `parents` in -1..{arr.size - 1}, but parents[{i}] = {int(arr[i])}")
    return arr.astype(np.int64, copy=False)


def check_parents(parents) -> tuple[np.ndarray, int]:
    """Validate a parent array over ids ``0..N-1``; return it (int64) and the root id.

    Raises ``ValueError`` for an empty tree, out-of-range parents, zero or several
    roots, and cycles (nodes not reachable from the root).
    """
    par = _as_parent_array(parents)
    n = par.shape[0]
    bad = (par < -1) | (par >= n)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"Expected every entry of `parents` in -1..{n - 1}, but parents[{i}] = {int(par[i])}"
        )
    roots = np.flatnonzero(par == -1)
    if roots.size == 0:
        raise ValueError("Expected exactly one root (parents[i] == -1), but found none: the tree has a cycle")
    if roots.size > 1:
        raise ValueError(
            f"Expected exactly one root (parents[i] == -1), but found {roots.size}: "
            f"nodes {roots[:5].tolist()}{'...' if roots.size > 5 else ''}. Add a common root above them"
        )
    selfloop = np.flatnonzero(par == np.arange(n))
    if selfloop.size:
        raise ValueError(f"The tree has a cycle: node {int(selfloop[0])} is its own parent")
    if n == 1:
        raise ValueError("Expected a tree with at least one leaf below the root, but got a single node")
    return par, int(roots[0])


def _levels(par: np.ndarray, root: int) -> tuple[np.ndarray, list, np.ndarray, np.ndarray]:
    """Breadth-first levels; returns depth, levels, children CSR.  Detects cycles."""
    n = par.shape[0]
    nonroot = np.flatnonzero(par >= 0)
    order = nonroot[np.argsort(par[nonroot], kind="stable")]  # children grouped by parent, ids ascending
    counts = np.bincount(par[nonroot], minlength=n)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    depth = np.full(n, -1, dtype=np.int64)
    depth[root] = 0
    levels = [np.array([root], dtype=np.int64)]
    frontier = levels[0]
    reached = 1
    while True:
        c = counts[frontier]
        total = int(c.sum())
        if total == 0:
            break
        starts = np.repeat(ptr[frontier], c)
        offs = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(c) - c, c)
        nxt = np.sort(order[starts + offs])
        depth[nxt] = len(levels)
        levels.append(nxt)
        reached += total
        frontier = nxt
    if reached != n:
        stuck = np.flatnonzero(depth < 0)
        raise ValueError(
            f"The tree has a cycle: {stuck.size} node(s) are not reachable from the root "
            f"(e.g. node {int(stuck[0])})"
        )
    return depth, levels, ptr, order


def canonical_order(parents) -> tuple[np.ndarray, int]:
    """Validate ``parents`` and return ``(is_leaf, root)`` (used to relabel)."""
    par, root = check_parents(parents)
    _levels(par, root)  # cycle detection
    is_leaf = np.bincount(par[par >= 0], minlength=par.shape[0]) == 0
    return is_leaf, root


def compile_parents(parents) -> CompiledTree:
    """Validate a canonical parent array and compute every per-node table.

    Raises ``ValueError`` if the leaves (childless nodes) are not exactly ``0..L-1``.
    """
    par, root = check_parents(parents)
    n = par.shape[0]
    depth, levels, ptr, children = _levels(par, root)
    is_leaf = (ptr[1:] - ptr[:-1]) == 0
    num_leaves = int(is_leaf.sum())
    if not is_leaf[:num_leaves].all():
        raise ValueError(
            "Expected canonical ids (leaves 0..L-1, internal nodes L..N-1); use Hierarchy.from_parents, "
            "which relabels, instead of compile_parents"
        )
    max_depth = len(levels) - 1
    anc = np.full((n, max_depth + 1), n, dtype=np.int64)
    anc[root, 0] = root
    for d in range(1, max_depth + 1):
        lvl = levels[d]
        anc[lvl, :d] = anc[par[lvl], :d]
        anc[lvl, d] = lvl
    leaf_anc = anc[:num_leaves]
    valid = leaf_anc < n
    rows = np.broadcast_to(np.arange(num_leaves)[:, None], leaf_anc.shape)[valid]
    cols = leaf_anc[valid]
    leaf_count = np.bincount(cols, minlength=n).astype(np.int64)
    ld = depth[rows]
    min_ld = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    max_ld = np.full(n, -1, dtype=np.int64)
    np.minimum.at(min_ld, cols, ld)
    np.maximum.at(max_ld, cols, ld)
    return CompiledTree(
        parent=par,
        depth=depth,
        levels=levels,
        ancestors=anc,
        leaf_count=leaf_count,
        min_leaf_depth=min_ld,
        max_leaf_depth=max_ld,
        children_ptr=ptr,
        children=children,
    )
