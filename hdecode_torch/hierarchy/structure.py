"""Validation and compilation of a canonical parent array (numpy, vectorized, O(N log N) whatever the depth).

Everything here works on a *canonical* parent array: leaves are ``0..L-1`` and internal nodes
``L..N-1``.  The public constructors in :mod:`.hierarchy` turn any input format into that form
first.  No step loops over tree levels or over nodes, so a chain of a million nodes compiles as
fast as a bushy tree of the same size:

- depths and the cycle check come from pointer jumping on the parent array (⌈log₂ N⌉ rounds);
- the depth-first preorder (children in ascending id order) and every subtree's size come from
  the Euler tour of the tree, ranked by pointer jumping (list ranking, ⌈log₂ 2N⌉ rounds): the tour
  enters a child right after its parent, or right after the previous sibling's subtree is left;
- a node's leaves are one contiguous run of the leaves in depth-first order; the shallowest and
  deepest leaf of every run come from a sparse table of range minima over the leaf depths.

Nothing here grows with N × depth: tables that do (ancestors by depth) are built on demand by
:class:`~hdecode_torch.Hierarchy`, only where they fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CompiledTree", "compile_parents", "canonical_order", "check_parents"]


@dataclass(frozen=True)
class CompiledTree:
    """Numpy arrays describing a validated canonical tree (see :class:`Hierarchy`)."""

    parent: np.ndarray  # (N,) int64, -1 at the root
    depth: np.ndarray  # (N,) int64
    children_ptr: np.ndarray  # (N+1,) int64 CSR over children sorted by (parent, id)
    children: np.ndarray  # (N-1,) int64
    pos: np.ndarray  # (N,) int64 position of each node in the depth-first preorder
    size: np.ndarray  # (N,) int64 number of nodes in each subtree (the node included)
    leaf_start: np.ndarray  # (N,) int64 leaves in depth-first order before the node's first leaf
    leaf_count: np.ndarray  # (N,) int64, |L(n)|
    min_leaf_depth: np.ndarray  # (N,) int64
    max_leaf_depth: np.ndarray  # (N,) int64

    @property
    def num_nodes(self) -> int:
        return int(self.parent.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())


def _as_parent_array(parents) -> np.ndarray:
    if parents is None or isinstance(parents, (str, bytes, dict)) or not hasattr(parents, "__len__") and not hasattr(parents, "__array__"):
        raise TypeError(f"Expected `parents` to be a sequence of integer node ids, but got {type(parents).__name__}")
    if isinstance(parents, (list, tuple)):
        # numpy turns a bool among ints into 0/1 (a JSON `true` would become node 1): refuse it first
        i = next((i for i, x in enumerate(parents) if isinstance(x, (bool, np.bool_))), None)
        if i is not None:
            raise TypeError(f"Expected `parents` to hold integer node ids, but parents[{i}] = {parents[i]!r}")
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
    """Validate the entries of a parent array over ids ``0..N-1``; return it (int64) and the root id.

    Raises ``ValueError`` for an empty tree, out-of-range parents, zero or several roots and
    self-loops.  Longer cycles are found by :func:`depths`.
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


def depths(par: np.ndarray, root: int) -> np.ndarray:
    """(N,) int64 depth of every node, by pointer jumping; ``ValueError`` if some node never reaches the root."""
    n = par.shape[0]
    jump = np.where(par >= 0, par, root)
    dist = (par >= 0).astype(np.int64)  # edges from n to jump(n)
    for _ in range(max(1, int(n).bit_length()) + 1):
        if (jump == root).all():
            break
        dist += dist[jump]
        jump = jump[jump]
    if not (jump == root).all():
        stuck = np.flatnonzero(jump != root)
        raise ValueError(
            f"The tree has a cycle: {stuck.size} node(s) are not reachable from the root (e.g. node {int(stuck[0])})"
        )
    return dist


def _children(par: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Children CSR, children of a node in ascending id order: (ptr (N+1,), children (N-1,))."""
    n = par.shape[0]
    nonroot = np.flatnonzero(par >= 0)
    children = nonroot[np.argsort(par[nonroot], kind="stable")]
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(par[nonroot], minlength=n), out=ptr[1:])
    return ptr, children


def _preorder(par: np.ndarray, root: int, ptr: np.ndarray, children: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pos, size): depth-first preorder position and subtree size of every node, by list ranking.

    Euler tour over edges: ``down(c) = c`` enters child c, ``up(c) = N + c`` leaves it; ``2N`` ends
    the tour.  After down(c) comes down(first child of c) or, at a leaf, up(c); after up(c) comes
    down(next sibling of c) or up(parent of c) (the end at the root).  Suffix sums of "is a down
    edge" along the tour, by pointer jumping, give each node the number of nodes entered from it
    on; preorder positions and subtree sizes follow.
    """
    n = par.shape[0]
    end = 2 * n
    nonroot = par >= 0
    has_child = ptr[1:] > ptr[:-1]
    first_child = np.where(has_child, children[np.minimum(ptr[:-1], max(children.size - 1, 0))], -1)
    slot = np.empty(n, dtype=np.int64)
    slot[children] = np.arange(children.size)
    slot[root] = 0
    par0 = np.where(nonroot, par, root)
    has_next = nonroot & (slot + 1 < ptr[par0 + 1])
    next_sibling = np.where(has_next, children[np.minimum(slot + 1, max(children.size - 1, 0))], -1)

    succ = np.full(end + 1, end, dtype=np.int64)
    ids = np.arange(n)
    succ[:n] = np.where(has_child, first_child, n + ids)  # after down(c)
    succ[n:end] = np.where(has_next, next_sibling, np.where(par0 == root, end, n + par0))  # after up(c)
    succ[root] = succ[n + root] = end  # the root has no edges of its own
    weight = np.zeros(end + 1, dtype=np.int64)
    weight[:n] = nonroot  # down edges count the nodes they enter
    for _ in range(int(end).bit_length() + 1):
        if (succ == end).all():
            break
        weight += weight[succ]
        succ = succ[succ]
    entered_from = weight[:n]  # down edges from down(c) to the end of the tour, down(c) included
    pos = np.where(nonroot, n - entered_from, 0)
    size = np.where(nonroot, entered_from - weight[n:end], n)
    return pos, size


def _range_min(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(values[lo[i]:hi[i]]) for non-empty ranges, from a sparse table (O(M log M) to build)."""
    table = [values]
    width = 1
    while 2 * width <= values.size:
        prev = table[-1]
        table.append(np.minimum(prev[:-width], prev[width:]))
        width *= 2
    length = hi - lo
    k = np.floor(np.log2(np.maximum(length, 1))).astype(np.int64)
    # log2 of an exact power of two can round down by one ulp: fix k so that 2**k <= length < 2**(k+1).
    k -= (1 << k) > length
    k += (1 << (k + 1)) <= length
    out = np.empty(lo.size, dtype=values.dtype)
    for j in np.unique(k):
        sel = np.flatnonzero(k == j)
        t = table[j]
        out[sel] = np.minimum(t[lo[sel]], t[hi[sel] - (1 << j)])
    return out


def canonical_order(parents) -> tuple[np.ndarray, int]:
    """Validate ``parents`` and return ``(is_leaf, root)`` (used to relabel)."""
    par, root = check_parents(parents)
    depths(par, root)  # cycle detection
    is_leaf = np.bincount(par[par >= 0], minlength=par.shape[0]) == 0
    return is_leaf, root


def compile_parents(parents) -> CompiledTree:
    """Validate a canonical parent array and compute every per-node table.

    Raises ``ValueError`` if the leaves (childless nodes) are not exactly ``0..L-1``.
    """
    par, root = check_parents(parents)
    n = par.shape[0]
    depth = depths(par, root)
    ptr, children = _children(par)
    is_leaf = (ptr[1:] - ptr[:-1]) == 0
    num_leaves = int(is_leaf.sum())
    if not is_leaf[:num_leaves].all():
        raise ValueError(
            "Expected canonical ids (leaves 0..L-1, internal nodes L..N-1); use Hierarchy.from_parents, "
            "which relabels, instead of compile_parents"
        )
    pos, size = _preorder(par, root, ptr, children)
    order = np.empty(n, dtype=np.int64)
    order[pos] = np.arange(n)
    leaves_before = np.concatenate([[0], np.cumsum(is_leaf[order])])  # leaves among the first i in preorder
    leaf_start = leaves_before[pos]
    leaf_count = leaves_before[pos + size] - leaf_start
    dfs_leaf_depth = depth[order[is_leaf[order]]]
    hi = leaf_start + leaf_count
    min_ld = _range_min(dfs_leaf_depth, leaf_start, hi)
    max_ld = -_range_min(-dfs_leaf_depth, leaf_start, hi)
    return CompiledTree(parent=par, depth=depth, children_ptr=ptr, children=children, pos=pos, size=size,
                        leaf_start=leaf_start, leaf_count=leaf_count, min_leaf_depth=min_ld, max_leaf_depth=max_ld)
