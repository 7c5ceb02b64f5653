"""Sums over subtrees and over root paths: the two tree reductions every metric is made of.

Pure functions of (hierarchy tables, tensor) -> tensor, node-major in their interface: ``(N, *)``,
the node dimension first.  Two layouts, chosen by the caller's ``layout`` argument (the library's
device plan passes its own; by default ``"levels"`` up to ``MAX_LEVELS`` levels, ``"prefix"`` beyond):

- ``"levels"``: one vectorized step per tree level (a loop over depth, never over nodes or
  samples), O(N·R) work for R columns.  Each step moves whole contiguous rows of a node-major
  table, which on a CPU is several times faster than scattering along the last dimension.
- ``"prefix"``: depth-first prefix sums along the contiguous dimension of the batch-major table
  (the transpose of the interface): a node's leaves, its subtree and its root path in the Euler
  tour are each one contiguous range of a fixed ordering, so every sum is a difference of two
  prefix sums (:func:`~hdecode_torch.kernels.fused.gathered_prefix`, accumulated in float64), a
  fixed number of operators whatever the depth.  Inputs that are transposed views of batch-major
  tables are read without a copy, and the results are transposed views of batch-major tables.

No implementation builds an N × L matrix.
"""

from __future__ import annotations

import torch

from . import native
from .segment import index_add_rows

__all__ = ["subtree_sum", "subtree_sum_", "accumulation_dtype", "leaf_to_node_sum", "path_sum", "level_pairs",
           "internal_level_pairs", "tree_ranges", "default_layout", "blocked_gathered_prefix", "prefix_bytes_per_row",
           "copy_transposed_", "node_major", "MAX_LEVELS", "LAYOUTS", "TRANSPOSE_MIN_COLUMNS", "TRANSPOSE_BLOCK_BYTES",
           "TRANSPOSE_MIN_BLOCK_ROWS"]

#: Trees of up to this many levels (depth + 1) are summed per level by default, by prefix sums beyond:
#: each level costs a fixed overhead, which the prefix sums' larger per-entry cost outweighs only on
#: trees with hundreds of levels (a chain of 10⁵ nodes would take 10⁵ steps).
MAX_LEVELS = 512
LAYOUTS = ("levels", "prefix")


def default_layout(h) -> str:
    """``"levels"`` for trees of at most ``MAX_LEVELS`` levels, ``"prefix"`` beyond."""
    return "levels" if h.max_depth + 1 <= MAX_LEVELS else "prefix"


def _layout(h, layout):
    if layout is None:
        return default_layout(h)
    if layout not in LAYOUTS:
        raise ValueError(f"Expected `layout` to be one of {LAYOUTS}, but got {layout!r}")
    return layout


def level_pairs(h) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(nodes_d, parent(nodes_d)) for d = D..1]``, cached on the hierarchy."""
    def build():
        return [(lvl, h.parent[lvl]) for lvl in reversed(h.levels[1:])]
    return h.cached("level_pairs", build)


def tree_ranges(h, kind: str):
    """Index arrays of the ``"prefix"`` sums (cached on the hierarchy): ``(src, weight, hi, lo)``.

    - ``"leaves"``: the leaves in depth-first order; node n's leaves are ``[lo[n], hi[n])``;
    - ``"subtree"``: the preorder; node n's subtree is ``[pos[n], pos[n] + size[n])``;
    - ``"path"`` / ``"path_below_root"``: the Euler tour, 2N entries, each node entered (weight +1)
      and left (weight −1, or 0 for the root when it is left out); the prefix up to a node's entry
      holds its ancestors and itself, everything else cancels (``lo`` is None).
    """
    def build():
        n, dev = h.num_nodes, h.device
        if kind == "leaves":
            lo = h.leaf_start
            return _trusted(h.dfs_leaves, None, lo + h.leaf_count, lo, h.num_leaves)
        if kind == "subtree":
            order = torch.empty_like(h.pos)
            order[h.pos] = torch.arange(n, device=dev)
            return _trusted(order, None, h.pos + h.size, h.pos, n)
        # Euler tour: n is entered at 2·pos(n) − depth(n) (every node before it in preorder was
        # entered, and all but its depth(n) ancestors were left), left 2·size(n) − 1 steps later.
        enter = 2 * h.pos - h.depth
        leave = enter + 2 * h.size - 1
        ids = torch.arange(n, device=dev)
        src = torch.empty(2 * n, dtype=torch.long, device=dev)
        weight = torch.empty(2 * n, dtype=torch.float64, device=dev)
        src[enter], src[leave] = ids, ids
        weight[enter], weight[leave] = 1.0, -1.0
        if kind == "path_below_root":
            weight[enter[h.root]] = weight[leave[h.root]] = 0.0
        return _trusted(src, weight, enter + 1, None, n)
    return h.cached(("tree_ranges", kind), build)


def _trusted(src, weight, hi, lo, width):
    """Index arrays derived from a validated tree: in range by construction (no check, no host read)."""
    from .fused import trust_indices

    trust_indices(src, width - 1)
    trust_indices(hi, src.shape[0])
    if lo is not None:
        trust_indices(lo, src.shape[0])
    return src, weight, hi, lo


def prefix_bytes_per_row(j: int, k: int) -> int:
    """Bytes of temporaries per row of ``gathered_prefix`` over J gathered entries and K ranges: its
    float64 table of both the prefix and the entries (2J + 1), the gathered input before conversion
    (J, at most float32 when converted) and the float64 ranges before a cast and their lower ends (2K)."""
    return 8 * (2 * j + 1) + 4 * j + 16 * k


def blocked_gathered_prefix(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                            lo: torch.Tensor | None, out_dtype: torch.dtype, budget: int | None) -> torch.Tensor:
    """``gathered_prefix`` (B, K) of x (B, M), in blocks of rows whose temporaries
    (:func:`prefix_bytes_per_row`) stay within ``budget`` bytes (None: all rows at once).

    Rows are independent: every block's rows are the bits of the whole call.  A block has at least
    one row.  In a traced graph (``torch.export``, ``torch.compile``), whose batch size is symbolic,
    all rows at once.
    """
    from .fused import gathered_prefix

    b, k = x.shape[0], hi.shape[0]
    if budget is None or torch.compiler.is_compiling():  # a traced graph's batch size is symbolic
        return gathered_prefix(x, src, weight, hi, lo, out_dtype)
    rows = max(1, budget // prefix_bytes_per_row(src.shape[0], k))
    if rows >= b:
        return gathered_prefix(x, src, weight, hi, lo, out_dtype)
    out = x.new_empty((b, k), dtype=out_dtype)
    for a in range(0, b, rows):
        out[a:a + rows] = gathered_prefix(x[a:a + rows], src, weight, hi, lo, out_dtype)
    return out


def _prefix_sums(h, values: torch.Tensor, kind: str, budget: int | None = None) -> torch.Tensor:
    """The "prefix" kernel: values (M, *) node- or leaf-major -> (N, *), its temporaries within
    ``budget`` bytes (None: unbounded).

    The node dimension moves last: a table stored with the nodes innermost (batch-major) is read
    as (R, M) rows without a copy, and the result is stored the same way.
    """
    src, weight, hi, lo = tree_ranges(h, kind)
    dtype = values.dtype
    flat = values.dim() == 2  # (M, B): its transpose is the (R, M) table, a view
    x = values.t() if flat else values.movedim(0, -1).reshape(-1, values.shape[0])  # (R, M)
    if not x.is_floating_point():
        x = x.to(torch.float64)  # integer counts are exact in float64
    out_dtype = dtype if dtype in (torch.float32, torch.float64) else torch.float64
    out = blocked_gathered_prefix(x, src, weight, hi, lo, out_dtype, budget)  # (R, N)
    out = out.t() if flat else out.reshape(tuple(values.shape[1:]) + (h.num_nodes,)).movedim(-1, 0)
    return out if out.dtype == dtype else out.to(dtype)


def subtree_sum(h, values: torch.Tensor, layout: str | None = None, backend: str = "torch",
                budget: int | None = None) -> torch.Tensor:
    """Sum of ``values`` over every node's subtree, the node included.

    values: (N, *) float or int, node-major.  Returns a new (N, *) tensor, same dtype:
    ``out[n] = Σ_{m ∈ D(n)} values[m]``.  ``layout``: ``"levels"`` or ``"prefix"`` (module
    docstring; default by depth); ``backend``: the per-level scatter-add (``"torch"`` or ``"scatter"``);
    ``budget``: bytes of temporaries of the prefix sums beyond the result, in blocks of columns (None:
    all at once; the per-level sums need none).
    """
    if _layout(h, layout) == "prefix":
        return _prefix_sums(h, values, "subtree", budget)
    return subtree_sum_(h, values.clone(), backend)


def internal_level_pairs(h) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """``(parent(leaves) − L, [(internal nodes_d, parent(internal nodes_d)) for d = D..1])``, levels
    without an internal node left out, cached on the hierarchy: the per-level sums with every leaf
    added at once, straight from the leaves' rows (a tree's root is never a leaf)."""
    def build():
        num_leaves = h.num_leaves
        leaf_parent = h.parent[:num_leaves] - num_leaves
        pairs = [(nodes[nodes >= num_leaves], parents[nodes >= num_leaves]) for nodes, parents in level_pairs(h)]
        return leaf_parent, [(nodes, parents) for nodes, parents in pairs if nodes.numel()]
    return h.cached("internal_level_pairs", build)


def subtree_sum_(h, values: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """In-place per-level :func:`subtree_sum` (overwrites and returns ``values``).

    Each node's sum is its own value plus its children's sums added one after the other in
    ascending id order (``index_add_`` adds the rows of one call in index order).  The leaves
    (ids 0..L−1) come before their internal siblings, so one call adds every leaf's row into its
    parent, straight from the leaves' rows (no gathered copy), and one call per level then adds the
    internal nodes: the additions, in the order and the bits of a call per level over all its nodes.
    A single sample (a 1-D table) keeps one call per level over all its nodes: there the gathers
    move a few entries, and the leaves' two views would cost more than they save.  So does a table
    that records a gradient: autograd cannot differentiate the leaves' rows read by an in-place add
    into their own table.
    """
    rows = _as_rows(values)
    # index_add_rows inlined: one call fewer per level
    if backend == "torch" and rows.dim() > 1 and not rows.requires_grad:
        leaf_parent, pairs = internal_level_pairs(h)
        rows[h.num_leaves:].index_add_(0, leaf_parent, rows[: h.num_leaves])
        for nodes, parents in pairs:
            rows.index_add_(0, parents, rows.index_select(0, nodes))
        return values
    if backend == "torch":  # one sample: the gathers are a few entries, the two views would cost more
        for nodes, parents in level_pairs(h):
            rows.index_add_(0, parents, rows.index_select(0, nodes))
        return values
    for nodes, parents in level_pairs(h):
        index_add_rows(rows, parents, rows.index_select(0, nodes), backend)
    return values


def _as_rows(values: torch.Tensor) -> torch.Tensor:
    """``values`` (N, *) as the table the per-level steps update: a 1-D view of its storage when each
    row holds one entry (a single sample), else ``values`` itself.

    Both are the same additions in the same order (``index_add_`` adds the selected rows one after
    the other, each entry on its own), so the bits are those of any batch; the 1-D kernels skip the
    per-row bookkeeping of the 2-D ones, which at one column is most of a level's cost
    (benchmarks/README.md, "The fixed cost of a call").
    """
    # Not in a traced graph: there the batch is symbolic, and comparing it with 1 made torch 2.8's ONNX
    # export specialize it to the example's size.
    if values.dim() > 1 and not torch.compiler.is_compiling() and values.numel() == values.shape[0]:
        return values.view(values.shape[0])
    return values


#: Largest number of children summed into one node in float32 by the per-level sums: index_add_
#: accumulates a node's children one after the other, so the rounding error grows with the fan-in
#: (on a 100k-leaf star p(root) came out 1 + 1e-3).  Trees with a wider node sum in float64.
FLOAT32_MAX_FAN_IN = 1024


def leaf_to_node_sum(h, leaf_values: torch.Tensor, layout: str | None = None, backend: str = "torch",
                     budget: int | None = None) -> torch.Tensor:
    """Push leaf values up the tree: ``out[n] = Σ_{l ∈ L(n)} leaf_values[l]``.

    leaf_values: (L, *) float, leaf-major.  Returns (N, *), same dtype.  With probabilities this
    is p(n) for every node.  The per-level sums accumulate float32 input in float32, except on a
    tree with a node of more than ``FLOAT32_MAX_FAN_IN`` children (then float64); the prefix sums
    always accumulate in float64.  ``layout``, ``backend``, ``budget``: as in :func:`subtree_sum`.  The
    per-level sums of float32/float64 CPU values run as one compiled pass a row where
    :mod:`~hdecode_torch.kernels.native` applies: the same additions, the same bits.
    """
    if _layout(h, layout) == "prefix":
        return _prefix_sums(h, leaf_values, "leaves", budget)
    dtype = leaf_values.dtype
    acc = accumulation_dtype(h, dtype)
    if backend == "torch":  # the same additions in one compiled pass a row, where the native kernels load
        out = native.leaf_to_node_sum(h, leaf_values, acc)
        if out is not None:
            return out
    # the leaves' rows, then zeros for the internal nodes (ids L..N-1): F.pad would be one copy, but torch
    # 2.8's exported pad refuses an empty batch
    out = torch.empty((h.num_nodes,) + tuple(leaf_values.shape[1:]), dtype=acc, device=leaf_values.device)
    if _fast_transpose(leaf_values, acc):
        _transpose_blocks(out[: h.num_leaves], leaf_values)
    else:  # copy_'s cases (one sample among them): assigned, one view fewer than copy_transposed_
        out[: h.num_leaves] = leaf_values
    out[h.num_leaves:] = 0
    out = subtree_sum_(h, out, backend)
    return out if acc == dtype else out.to(dtype)


#: Fewest columns from which :func:`copy_transposed_` transposes with the SIMD kernel: below it the
#: kernel's fixed cost outweighs what it saves on the copy.
TRANSPOSE_MIN_COLUMNS = 8
#: Bytes of the batch-major input :func:`copy_transposed_` transposes at a time: a decoder's block of
#: rows (``CPU_BLOCK_BYTES`` of temporaries) is one, and a larger table's temporary stays this size.
#: Smaller blocks cost more than they save: each is copied into strided rows of the output.
TRANSPOSE_BLOCK_BYTES = 2**22
#: Fewest rows of a block: a wider table (over 16k leaves in float32) is copied by ``copy_``, not in a
#: loop of many small blocks.
TRANSPOSE_MIN_BLOCK_ROWS = 64


_SIMD: bool | None = None


def _simd_transpose() -> bool:
    """Whether ``native_channel_shuffle`` transposes float32 with FBGEMM's SIMD kernel on this build and
    CPU (else it runs an element-by-element loop, slower than ``copy_``'s blocked transposition)."""
    global _SIMD
    if _SIMD is None:
        _SIMD = "fbgemm" in torch.backends.quantized.supported_engines
    return _SIMD


def copy_transposed_(out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``out.copy_(values)`` (in place, returns ``out``), where ``values`` is often the transposed view
    of a batch-major table, such as leaf probabilities (B, L) read leaf-major.

    out: (M, *) node-major; values: (M, *), any dtype and strides.  When ``values`` is float32 (M, B),
    B ≥ ``TRANSPOSE_MIN_COLUMNS``, the transpose of a contiguous (B, M) CPU table, the copy runs as
    ``native_channel_shuffle`` (whose channels-last kernel is FBGEMM's SIMD transposition) in blocks of
    ``TRANSPOSE_BLOCK_BYTES`` of input rows, faster than ``copy_``'s transposition of 60 × 60 tiles
    element by element (where the build has no FBGEMM, the shuffle's own loop is the slower one, and
    ``copy_`` runs).  Either way every entry is copied, bit for bit; O(M·B).
    """
    if not _fast_transpose(values, out.dtype):
        return out.copy_(values)
    return _transpose_blocks(out, values)


def node_major(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (M, B) in ``dtype``: a new node-major table (:func:`copy_transposed_`) where the SIMD
    transposition takes it, else ``values.to(dtype)`` (``values`` itself when in ``dtype`` already: a
    single sample's column costs no copy)."""
    if not _fast_transpose(values, dtype):
        return values.to(dtype)
    return _transpose_blocks(values.new_empty(values.shape, dtype=dtype), values)


def _transpose_blocks(out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    m, b = values.shape
    x = values.t()  # (B, M) contiguous
    rows = TRANSPOSE_BLOCK_BYTES // (4 * m)  # at least TRANSPOSE_MIN_BLOCK_ROWS
    for a in range(0, b, rows):
        block = x[a:a + rows]
        k = block.shape[0]
        # (1, k·M, 1, 1) channels-last: one pixel whose k groups of M channels become M groups of k
        shuffled = torch.native_channel_shuffle(block.as_strided((1, k * m, 1, 1), (k * m, 1, k * m, k * m)), k)
        out[:, a:a + k] = shuffled.view(m, k)
    return out


def _fast_transpose(values: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether :func:`copy_transposed_` copies ``values`` into a ``dtype`` table with the SIMD kernel."""
    # a traced graph's sizes are symbolic: no test on them
    if values.dim() != 2 or torch.compiler.is_compiling() or values.shape[1] < TRANSPOSE_MIN_COLUMNS:
        return False
    m = values.shape[0]
    return (m > 1 and TRANSPOSE_BLOCK_BYTES // (4 * m) >= TRANSPOSE_MIN_BLOCK_ROWS
            and values.dtype == dtype == torch.float32 and values.device.type == "cpu"
            and values.stride() == (1, m) and not values.requires_grad and _simd_transpose())


def accumulation_dtype(h, dtype: torch.dtype) -> torch.dtype:
    """The dtype the per-level sums accumulate ``dtype`` values in over ``h`` (see ``FLOAT32_MAX_FAN_IN``)."""
    wide = h.cached("max_fan_in", lambda: int(h.num_children.max())) > FLOAT32_MAX_FAN_IN
    return torch.float64 if (wide and dtype == torch.float32) else dtype


def path_sum(h, values: torch.Tensor, include_root: bool = True, layout: str | None = None,
             backend: str = "torch", budget: int | None = None, overwrite: bool = False) -> torch.Tensor:
    """Sum of ``values`` along every root path: ``out[n] = Σ_{a ∈ A(n)} values[a]``.

    values: (N, *) float or int.  With ``include_root=False`` the root's row is left out of every
    sum.  Returns a new (N, *) tensor, same dtype.  ``layout``, ``backend``, ``budget``: as in
    :func:`subtree_sum`.  ``overwrite=True``: ``values`` is a temporary of the caller's, which the
    per-level sums may overwrite and return (no copy).
    """
    if _layout(h, layout) == "prefix":
        return _prefix_sums(h, values, "path" if include_root else "path_below_root", budget)
    out = values if overwrite else values.clone()
    if not include_root:
        out[h.root] = 0
    rows = _as_rows(out)
    # nodes of one level are distinct and their parents are already final: one add per level
    if backend == "torch":  # index_add_rows inlined: one call fewer per level
        for nodes, parents in reversed(level_pairs(h)):
            rows.index_add_(0, nodes, rows.index_select(0, parents))
        return out
    for nodes, parents in reversed(level_pairs(h)):
        index_add_rows(rows, nodes, rows.index_select(0, parents), backend)
    return out
