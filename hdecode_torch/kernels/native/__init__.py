"""Native CPU kernels: the per-level node sums and the threshold rules on them, one compiled pass a row; the
float64 prefix sums of the leaves in a given order.

On the CPU plan the torch path sums a tree with one ``index_add_`` per level over (N, B) tables: each
operator passes over the whole table and pays a fixed cost, which on a row of tieredImageNet-H is about
what the whole decision should take.  These kernels read each row of leaf probabilities once, sum the tree
for a group of 8 rows in a buffer that stays in the cache (O(N) additions a row), and write the
node-major (N, B) table, or only the decisions of a threshold rule: the deepest node above a threshold
(tree distance) or the nodes whose leaf-weighted mass exceeds a share of the root's (Hamming).

Bits: the same additions in the same order and dtype as :func:`~hdecode_torch.kernels.tree_sums.leaf_to_node_sum`'s
per-level path (each node: 0, then its children's sums in ascending id order; float32 summed in float64 on
trees with a node of more than ``FLOAT32_MAX_FAN_IN`` children, then rounded), so every table and decision is
the torch path's, bit for bit.  Source: ``hdecode_native.c`` next to this file, plain C99.

Availability: the source is compiled on first use with the system C compiler (``$CC``, else ``cc``, else
``gcc``) into a per-user cache (``$HDECODE_CACHE_DIR``, else ``$XDG_CACHE_HOME/hdecode_torch``, else
``~/.cache/hdecode_torch``) and loaded with ctypes (``_build.py``).  Where that fails (no compiler, a
failed build, a machine other than x86-64 / AArch64) or ``HDECODE_NATIVE=0`` is set, the torch path runs,
silently: :func:`unavailable_reason` says why.  The kernels also stand aside wherever a torch operator
must be seen: a tensor that needs a gradient, a subclass (fake tensors of ``torch.export``), tracing or
compiling or exporting, an active dispatch or torch-function mode (operator counts), a vmap/grad wrapper.
:func:`use_native` turns them off (or back on) for a block, for tests and comparisons.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import torch

from .budget import depth_prefix_scratch, fits, node_sums_scratch  # imports nothing at load

__all__ = ["available", "unavailable_reason", "use_native", "enabled", "applies", "function", "tree_children",
           "leaf_to_node_sum", "deepest_above", "above_root_share", "depth_prefix"]

_LOCK = threading.Lock()
_STATE: dict = {"lib": None, "reason": None, "loaded": False, "on": True}
_KERNELS: dict = {}


def _library():
    """The loaded library, None where unavailable (built and loaded on the first call, once per process)."""
    if _STATE["loaded"]:
        return _STATE["lib"]
    with _LOCK:
        if not _STATE["loaded"]:
            if os.environ.get("HDECODE_NATIVE", "").strip() == "0":
                lib, reason = None, "turned off by HDECODE_NATIVE=0"
            else:
                from ._build import load

                lib, reason = load()
                if lib is not None:
                    _declare(lib)
            _STATE.update(lib=lib, reason=reason, loaded=True)
    return _STATE["lib"]


def _kernel(name: str, variant: str):
    """The library's ``hd_<name>_<variant>``, looked up once (a ctypes attribute lookup costs a microsecond)."""
    lib = _STATE["lib"]
    f = _KERNELS.get((lib, name, variant))
    if f is None:
        f = _KERNELS[lib, name, variant] = getattr(lib, f"hd_{name}_{variant}")
    return f


def function(symbol: str, restype, argtypes: list):
    """The library's C function ``symbol`` with its ctypes signature declared (once per library), for the kernel
    families whose sources sit beside ``hdecode_native.c`` (each declares its own functions where it calls them).
    Call only after :func:`applies` (or :func:`available`) said yes: the library is then loaded."""
    lib = _STATE["lib"]
    f = _KERNELS.get((lib, symbol))
    if f is None:
        f = getattr(lib, symbol)
        f.restype, f.argtypes = restype, argtypes
        _KERNELS[lib, symbol] = f
    return f


def _declare(lib) -> None:
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in ("f32", "f64", "f32w"):
        f = getattr(lib, f"hd_node_sums_{suffix}")
        f.restype = ctypes.c_int
        f.argtypes = [i64, i64, i64, ptr, i64, i64, ptr, i64, i64, i64, ptr, ptr, ptr]
        g = getattr(lib, f"hd_deepest_above_{suffix}")
        g.restype = ctypes.c_int
        g.argtypes = [i64, i64, i64, ptr, i64, i64, ptr, i64, ctypes.c_double, i64, ptr, ptr, ptr, ptr, ptr]
        s = getattr(lib, f"hd_above_root_share_{suffix}")
        s.restype = ctypes.c_int
        s.argtypes = [i64, i64, i64, ptr, i64, i64, ptr, ptr, i64, i64, ctypes.c_double, i64, i64, ptr, ptr, ptr]
    for suffix in ("f32", "f64"):
        f = getattr(lib, f"hd_depth_prefix_{suffix}")
        f.restype = None
        f.argtypes = [i64, i64, ptr, i64, i64, ptr, ptr, i64, i64]


def available() -> bool:
    """Whether the native kernels are built and loaded in this process (building them on the first call)."""
    return _library() is not None


def unavailable_reason() -> str | None:
    """Why the native kernels do not run in this process (None when they do)."""
    _library()
    return _STATE["reason"]


def enabled() -> bool:
    """Whether calls now use the native kernels where they apply: available and not turned off by
    :func:`use_native`."""
    return _STATE["on"] and _library() is not None


@contextlib.contextmanager
def use_native(flag: bool):
    """Within this block the native kernels run where they apply (``True``, the default outside any block)
    or never (``False``: the torch path, for comparisons).  Process-wide, not per thread; blocks nest."""
    if not isinstance(flag, bool):
        raise TypeError(f"Expected `flag` to be a bool, but got {type(flag).__name__}")
    before = _STATE["on"]
    _STATE["on"] = flag
    try:
        yield
    finally:
        _STATE["on"] = before


#: (leaf dtype, accumulation dtype) -> the kernels' suffix
_VARIANTS = {(torch.float32, torch.float32): "f32", (torch.float64, torch.float64): "f64",
             (torch.float32, torch.float64): "f32w"}


def applies(x: torch.Tensor) -> bool:
    """Whether the kernels take ``x``: turned on and loaded first (the answer where they are off or unavailable,
    in a fraction of a microsecond), then a plain CPU tensor with nothing that must see torch operators."""
    if not _STATE["on"] or (_STATE["lib"] is None and _STATE["loaded"]) or _library() is None:
        return False
    direct = _STATE.get("direct")
    if direct is None:  # imported on first use: kernels.fused imports the tree sums, which import this module
        from ..fused._registry import direct
        _STATE["direct"] = direct
    # Not while torch.export runs, even on real tensors (its own eager calls): what it records is torch's.
    return x.dim() in (1, 2) and direct(x) and not torch.compiler.is_exporting()


def tree_children(h):
    """The tree as the kernels read it (cached on the hierarchy, CPU tensors): ``(parent, start, child)`` int64,
    the internal nodes deepest first (a node's internal children before it) and ``parent[i]``'s children
    ``child[start[i]:start[i + 1]]`` in ascending id order: the order in which the per-level torch path adds
    them (the leaves, ids 0..L-1, in one call, then the internal nodes level by level, each level ascending)."""
    def build():
        num_leaves, n = h.num_leaves, h.num_nodes
        par, depth = h.parent.cpu(), h.depth.cpu()
        parent = num_leaves + torch.sort(depth[num_leaves:], descending=True, stable=True).indices
        rank = torch.full((n,), -1, dtype=torch.long)
        rank[parent] = torch.arange(parent.numel())
        ids = torch.arange(n)
        has_parent = par >= 0
        # grouped by the parent's place in the processing order, ascending ids within a group
        child = ids[has_parent][torch.argsort(rank[par[has_parent]] * n + ids[has_parent])]
        start = torch.zeros(parent.numel() + 1, dtype=torch.long)
        start[1:] = torch.cumsum(h.num_children.cpu()[parent], 0)
        return parent, start, child
    return h.cached("native_children", build)


def _deepest_keys(h):
    """``(key, node_of)`` of :func:`deepest_above` (cached on the hierarchy): ``key`` (N,) int32, larger for deeper
    nodes and, among equal depths, smaller ids (1..N); ``node_of`` (N + 1,) int64 the node of each key, the root
    at 0 (no node above the threshold)."""
    def build():
        n = h.num_nodes
        order = torch.sort(h.depth.cpu(), descending=True, stable=True).indices
        key = torch.empty(n, dtype=torch.int32)
        key[order] = torch.arange(n, 0, -1, dtype=torch.int32)
        node_of = torch.cat([torch.tensor([h.root], dtype=torch.long), order.flip(0)])
        return key, node_of
    return h.cached("native_deepest_keys", build)


def _torch_tables(h, dtype: torch.dtype, decide: bool) -> None:
    """Run the torch path once per tree and dtype (on zeros, one row and 32 rows: both of its layouts) so that
    the tree tables it reads exist once the native kernels have run instead: a later call that must see torch
    operators (a trace, a dispatch mode counting them) then finds them built, as it would after a torch call,
    and never builds them inside the trace or the count.  ``decide``: also the deepest-above selection's."""
    def build():
        from ..selection import deepest_above as torch_deepest_above
        from ..tree_sums import leaf_to_node_sum as torch_leaf_to_node_sum

        with use_native(False):
            for rows in (1, 32):
                nodes = torch_leaf_to_node_sum(h, torch.zeros(rows, h.num_leaves, dtype=dtype).t(), "levels")
                if decide:
                    torch_deepest_above(h, nodes, 0.5)
        return True
    h.cached(("native_torch_tables", dtype, decide), build)


def _rows(x: torch.Tensor):
    """``x`` (L, B) or (L,) as the kernels read it: (rows, stride between leaves, stride between rows)."""
    if x.dim() == 1:
        return 1, x.stride(0), 0
    return x.shape[1], x.stride(0), x.stride(1)


def leaf_to_node_sum(h, leaf_values: torch.Tensor, acc: torch.dtype) -> torch.Tensor | None:
    """The per-level ``leaf_to_node_sum`` by the native kernel, or None where it does not apply (then the caller
    runs the torch path).

    leaf_values: (L, B) or (L,) float32/float64 CPU values, any strides (the transposed view of batch-major
    (B, L) probabilities is read row by row); acc: the accumulation dtype (the values' own, or float64 for
    float32 values).  Returns a new contiguous (N, B) (or (N,)) table in the values' dtype, each node's sum
    accumulated in ``acc`` then rounded once.  O(N) additions a row; a buffer of 8·N ``acc`` values (None where
    that is over the memory budget).
    """
    variant = _VARIANTS.get((leaf_values.dtype, acc))
    if variant is None or not applies(leaf_values):
        return None
    if not _within_budget(h, acc):
        return None
    _torch_tables(h, leaf_values.dtype, False)
    rows, x_leaf, x_row = _rows(leaf_values)
    out = torch.empty((h.num_nodes,) + tuple(leaf_values.shape[1:]), dtype=leaf_values.dtype)
    if rows == 0:
        return out
    parent, start, child = tree_children(h)
    status = _kernel("node_sums", variant)(
        rows, h.num_leaves, h.num_nodes, leaf_values.data_ptr(), x_leaf, x_row, out.data_ptr(), rows, 1,
        parent.numel(), parent.data_ptr(), start.data_ptr(), child.data_ptr())
    if status:
        raise MemoryError(f"the native node sums could not allocate {8 * h.num_nodes} values")
    return out


def deepest_above(h, leaf_probs: torch.Tensor, threshold: float, acc: torch.dtype) -> torch.Tensor | None:
    """``kernels.selection.deepest_above(h, p, threshold)`` of the node sums p that :func:`leaf_to_node_sum`
    would give, fused with them (no (N, B) table), or None where the kernel does not apply.

    leaf_probs: (B, L) float32/float64 CPU values, any strides; acc: as in :func:`leaf_to_node_sum`.  Per row,
    the deepest node (smallest id among equal depths) whose sum, rounded to the values' dtype, exceeds
    ``threshold`` rounded to that dtype (torch's comparison with a Python float), the root if none.  Returns
    (B,) int64.  O(N) a row.
    """
    variant = _VARIANTS.get((leaf_probs.dtype, acc))
    if variant is None or leaf_probs.dim() != 2 or not applies(leaf_probs):
        return None
    if not _within_budget(h, acc):
        return None
    _torch_tables(h, leaf_probs.dtype, True)
    rows = leaf_probs.shape[0]
    pred = torch.empty(rows, dtype=torch.long)
    if rows == 0:
        return pred
    parent, start, child = tree_children(h)
    key, node_of = _deepest_keys(h)
    status = _kernel("deepest_above", variant)(
        rows, h.num_leaves, h.num_nodes, leaf_probs.data_ptr(), leaf_probs.stride(1), leaf_probs.stride(0),
        pred.data_ptr(), 1, float(threshold), parent.numel(), parent.data_ptr(), start.data_ptr(), child.data_ptr(),
        key.data_ptr(), node_of.data_ptr())
    if status:
        raise MemoryError(f"the native node sums could not allocate {8 * h.num_nodes} values")
    return pred


def above_root_share(h, leaf_probs: torch.Tensor, leaf_weights: torch.Tensor, share: float,
                     acc: torch.dtype) -> torch.Tensor | None:
    """``w > share * w[root]`` of the weighted node sums ``w = leaf_to_node_sum(h, leaf_probs.t() * leaf_weights)``
    (what :meth:`Posterior.weighted_node <hdecode_torch.Posterior.weighted_node>` sums), fused with them, or None
    where the kernel does not apply.

    leaf_probs: (B, L) float32/float64 CPU values, any strides; leaf_weights: (L,) or (L, 1) in their dtype; acc:
    as in :func:`leaf_to_node_sum`.  Each product ``p(l) w(l)`` rounded to the values' dtype, the sums rounded to
    it, ``share * w[root]`` and the comparison in it.  Returns (N, B) bool, node-major.  O(N) a row.
    """
    variant = _VARIANTS.get((leaf_probs.dtype, acc))
    if (variant is None or leaf_probs.dim() != 2 or leaf_weights.dtype != leaf_probs.dtype
            or leaf_weights.numel() != h.num_leaves or not applies(leaf_probs)):
        return None
    if not _within_budget(h, acc):
        return None
    _torch_tables(h, leaf_probs.dtype, False)
    rows = leaf_probs.shape[0]
    out = torch.empty((h.num_nodes, rows), dtype=torch.bool)
    if rows == 0:
        return out
    weights = leaf_weights.reshape(-1).contiguous()
    parent, start, child = tree_children(h)
    status = _kernel("above_root_share", variant)(
        rows, h.num_leaves, h.num_nodes, leaf_probs.data_ptr(), leaf_probs.stride(1), leaf_probs.stride(0),
        weights.data_ptr(), out.data_ptr(), rows, 1, float(share), h.root, parent.numel(), parent.data_ptr(),
        start.data_ptr(), child.data_ptr())
    if status:
        raise MemoryError(f"the native node sums could not allocate {8 * h.num_nodes} values")
    return out


def _within_budget(h, acc: torch.dtype) -> bool:
    """Whether the node kernels' accumulator table, 8·N values of ``acc``
    (:func:`~hdecode_torch.kernels.native.budget.node_sums_scratch`), is within the memory budget; where it is not,
    the wrappers return None and the caller runs the torch path."""
    return fits(node_sums_scratch(h.num_nodes, acc.itemsize))


#: leaf dtype -> the prefix kernel's suffix
_PREFIX_VARIANTS = {torch.float32: "f32", torch.float64: "f64"}


def depth_prefix(leaf_values: torch.Tensor, order: torch.Tensor, batch_major: bool) -> torch.Tensor | None:
    """Prefix sums in float64 of ``leaf_values`` taken in the leaf order ``order``, by the native kernel, or None
    where it does not apply (then the caller runs the torch path).

    leaf_values: (L, B) float32/float64 CPU values, any strides (the transposed view of batch-major (B, L)
    probabilities, or the leaf rows of a node table); order: (L,) int64 CPU, a permutation of 0..L-1 (not
    checked: the callers pass a tree's cached order).  Returns (L + 1, B) float64 with
    ``out[0, b] = 0`` and ``out[j + 1, b] = out[j, b] + leaf_values[order[j], b]``: torch's
    ``cumsum(index_select(leaf_values, 0, order).to(float64), 0)`` under a zero row, bit for bit.  Stored
    contiguous (leaf-major) or, with ``batch_major``, as the transposed view of a contiguous (B, L + 1) table.
    O(L) additions a row, one pass over the values, a buffer of 4·L float64 (None where that is over the memory
    budget).
    """
    variant = _PREFIX_VARIANTS.get(leaf_values.dtype)
    if (variant is None or leaf_values.dim() != 2 or order.dtype != torch.long or not order.is_cpu
            or order.dim() != 1 or order.numel() != leaf_values.shape[0] or not applies(leaf_values)):
        return None
    num_leaves, rows = leaf_values.shape
    if batch_major:
        out = torch.empty(rows, num_leaves + 1, dtype=torch.float64).t()
    else:
        out = torch.empty(num_leaves + 1, rows, dtype=torch.float64)
    if rows == 0:
        return out
    if not fits(depth_prefix_scratch(num_leaves)):  # over the memory budget: the torch path
        return None
    order = order.contiguous()
    _kernel("depth_prefix", variant)(
        rows, num_leaves, leaf_values.data_ptr(), leaf_values.stride(0), leaf_values.stride(1), order.data_ptr(),
        out.data_ptr(), out.stride(0), out.stride(1))
    return out
