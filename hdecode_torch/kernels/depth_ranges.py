"""Per-leaf-depth masses of *some* nodes, without an (N, E, B) table.

Order the leaves by (depth, position in a depth-first traversal).  Then the leaves under a
node n that sit at depth e form one contiguous run of that order, so with one prefix sum
of each row of probabilities (in that order) every mass

    Q_e(n) = Σ_{l ∈ L(n), d(l) = depths[e]} p(l)

is a difference of two prefix sums.  Decoders that need Q only on a few candidate nodes
per sample (hF_β) pay O(B·L) for the prefix sums and O(E) per candidate, instead of
O(N·E·B) for the full table.

The ends of the runs.  In that order leaf l has the key e(l)·L + s(l) (its depth group and
its depth-first position), so the run of n at group e is [lo, hi) with lo the number of keys
below e·L + s(n) and hi the number below e·L + s(n) + |L(n)|: a sorted search in the (L,)
keys, O(log L) per end.  When E is small (at most ``TABLE_MAX_DEPTHS``) every node's ends
are kept in an (N + 1, 2E) int32 table, a constant times N, and read by one gather; the
tree-only memory stays O(N) on every tree shape, where a table would be O(N·D) on deep ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import native
from .native import hf_beta as native_hf_beta

__all__ = ["DepthRanges", "depth_ranges", "depth_range_ends", "depth_prefix_sums", "depth_masses",
           "depth_masses_packed", "TABLE_MAX_DEPTHS"]

#: Largest number of distinct leaf depths E whose (N + 1, 2E) int32 table of run ends is built
#: (at most 16·N·8 bytes); trees with more search the sorted keys instead (same ends).
TABLE_MAX_DEPTHS = 16
#: Entries of the ends table up to which an int64 copy is cached beside it (32 MiB at most): the gathers
#: take int64 indices, and converting per call cost the GPU plan one more launch at every use.
INT64_ENDS_MAX_ENTRIES = 1 << 22
#: (pairs × leaf depths) from which :func:`depth_masses` forms int32 flat positions from the ends table: fewer
#: (a row's pairs) take the cached int64 ends, one conversion fewer.
INT32_MIN_ENTRIES = 1 << 12


@dataclass(frozen=True)
class DepthRanges:
    """Tree-only tables (cached on the hierarchy by :func:`depth_ranges`), O(N) memory.

    leaf_order: (L,) int64 leaf ids sorted by (depth, depth-first position).
    keys: (L,) int64 the sorted keys group·L + depth-first position of ``leaf_order``.
    start, stop: (N + 1,) int64 each node's first depth-first leaf position and one past its last;
        row N is padding (below every key: empty runs at position 0).
    depths: (E,) int64 the distinct leaf depths, ascending.
    ends: (N + 1, 2E) int32 or None: ``[hi | lo]``, the leaves of L(n) at depth ``depths[e]`` are
        positions ``lo[n, e] <= j < hi[n, e]`` of ``leaf_order``; built only when
        E <= ``TABLE_MAX_DEPTHS`` (:func:`depth_range_ends` computes them otherwise).
    """

    leaf_order: torch.Tensor
    keys: torch.Tensor
    start: torch.Tensor
    stop: torch.Tensor
    depths: torch.Tensor
    ends: torch.Tensor | None


def depth_ranges(h) -> DepthRanges:
    """The :class:`DepthRanges` of ``h`` (built once per hierarchy and device: O(L log L + N·E) time
    with the ends table, O(L log L) without; O(N) memory)."""
    def build():
        leaf_count = h.leaf_count.cpu().numpy().astype(np.int64)
        num_leaves = h.num_leaves
        start = h.leaf_start.cpu().numpy()  # depth-first start of every subtree, in leaf units
        depths = np.unique(h.leaf_depth.cpu().numpy())
        group = np.searchsorted(depths, h.leaf_depth.cpu().numpy())
        key = group * num_leaves + start[:num_leaves]
        leaf_order = np.argsort(key, kind="stable")
        sorted_key = key[leaf_order]
        # The padding row's ends fall below every key once any group's base is added: empty runs at 0.
        pad = -depths.size * num_leaves - 1
        first = np.r_[start, pad]
        stop = np.r_[start + leaf_count, pad]
        ends = None
        if depths.size <= TABLE_MAX_DEPTHS:
            base = np.arange(depths.size, dtype=np.int64)[None, :] * num_leaves
            ends = np.concatenate([np.searchsorted(sorted_key, base + stop[:, None]),
                                   np.searchsorted(sorted_key, base + first[:, None])], 1)
        dev = h.device

        def T(a, dtype):
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype).to(dev)
        return DepthRanges(leaf_order=T(leaf_order, torch.int64), keys=T(sorted_key, torch.int64),
                           start=T(first, torch.int64), stop=T(stop, torch.int64), depths=T(depths, torch.int64),
                           ends=None if ends is None else T(ends, torch.int32))
    return h.cached("depth_ranges", build)


def depth_range_ends(h, ids: torch.Tensor) -> torch.Tensor:
    """(*ids.shape, 2E) int64 ``[hi | lo]``: the run of the leaves of ``ids`` (any shape, int64 node
    ids, ``N`` for padding: an empty run) at each leaf depth, as positions of ``leaf_order``.

    One gather of the ends table when there is one, else a sorted search of the (L,) keys:
    O(|ids|·E) memory and O(|ids|·E·log L) time, nothing per node of the tree.
    """
    r = depth_ranges(h)
    e = r.depths.numel()
    if r.ends is not None:
        if r.ends.numel() <= INT64_ENDS_MAX_ENTRIES:  # gathers take int64: convert once, not per call
            ends = h.cached("depth_range_ends_int64", lambda: r.ends.long())
            return ends.index_select(0, ids.reshape(-1)).view(*ids.shape, 2 * e)
        return r.ends.index_select(0, ids.reshape(-1)).view(*ids.shape, 2 * e).long()
    flat = ids.reshape(-1)
    base = torch.arange(e, device=ids.device) * h.num_leaves
    # Both ends in one search: (|ids|, 2, E) queries, hi first as in the table.
    query = torch.stack([r.stop.index_select(0, flat), r.start.index_select(0, flat)], 1)[:, :, None] + base
    return torch.searchsorted(r.keys, query).view(*ids.shape, 2 * e)


def depth_prefix_sums(h, leaf_values: torch.Tensor) -> torch.Tensor:
    """(L + 1, B) float64 prefix sums of ``leaf_values`` (L, B), leaf-major, in :func:`depth_ranges`
    order (row 0 is zero).

    Leaf-major, like the node tables (``p[:L]`` of node probabilities ``p`` is exactly the leaf
    probabilities), so the reordering moves whole rows.  float64 so that the differences taken by
    :func:`depth_masses` keep the precision of the masses themselves.  On plain CPU tensors one native pass
    (:func:`~hdecode_torch.kernels.native.depth_prefix`: the same additions as ``cumsum``, the same bits).
    """
    order = depth_ranges(h).leaf_order
    out = native.depth_prefix(leaf_values, order, batch_major=False)
    if out is not None:
        return out
    out = torch.empty(h.num_leaves + 1, leaf_values.shape[1], dtype=torch.float64, device=leaf_values.device)
    out[0] = 0
    # Converting first and then summing in place beats cumsum(dtype=float64) on a CPU.
    torch.cumsum(leaf_values.index_select(0, order).to(torch.float64), dim=0, out=out[1:])
    return out


def _flat(table: torch.Tensor):
    """(flat view, row stride, column stride) of a 2-D table stored row- or column-major."""
    if table.is_contiguous():
        return table.reshape(-1), table.shape[1], 1
    if table.t().is_contiguous():
        return table.t().reshape(-1), 1, table.shape[0]
    table = table.contiguous()
    return table.reshape(-1), table.shape[1], 1


def depth_masses(h, prefix: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, budget: int = 1 << 26,
                 dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(M, E) per-leaf-depth masses ``Q_e(ids[i])`` of sample ``rows[i]``, computed in float64 and
    returned in ``dtype``.

    prefix: (L + 1, B) float64 from :func:`depth_prefix_sums`; rows, ids: (M,) int64 sample
    indices and node ids (``N`` is padding: its masses are 0).  Beyond the output, temporaries of at
    most about ``budget`` bytes (the entries in chunks: the ends, their flat positions and the
    gathered prefix sums take some 64·E bytes an entry at their peak).  On plain CPU tensors with the ends
    table built, one native pass (:func:`~hdecode_torch.kernels.native.hf_beta.pair_masses`, the same
    subtraction and rounding per entry, the same bits) and no temporary.
    """
    got = native_hf_beta.pair_masses(prefix, depth_ranges(h).ends, rows, ids, dtype)
    if got is not None:  # one native pass, no temporary: the same subtraction and rounding per entry
        return got
    m, e = ids.numel(), h.num_leaf_depths
    flat, s0, s1 = _flat(prefix)
    step = max(1, budget // (64 * e))
    if m <= step and m * e < INT32_MIN_ENTRIES:  # a row's few pairs: the fewest Python steps
        return _masses(h, flat, s0, s1, rows, ids).to(dtype)
    out = torch.empty(m, e, dtype=dtype, device=prefix.device)
    if m <= step:
        return _masses(h, flat, s0, s1, rows, ids, out)
    for a in range(0, m, step):
        _masses(h, flat, s0, s1, rows[a:a + step], ids[a:a + step], out[a:a + step])
    return out


def _masses(h, flat, s0, s1, rows, ids, out=None):
    """The (M, E) float64 masses, or written into ``out``: the float64 difference rounded once to ``out``'s
    dtype, as ``.to`` after it would, without the float64 (M, E) table between."""
    m, e = ids.numel(), h.num_leaf_depths
    # One flat index_select for both ends (advanced indexing with a 2-D index is slower on a CPU),
    # on the table's own storage whichever way it is laid out.
    table = depth_ranges(h).ends if m * e >= INT32_MIN_ENTRIES else None
    if table is not None and flat.numel() <= torch.iinfo(torch.int32).max:
        # int32 positions read straight from the ends table (index_select takes int32 indices): half the
        # bytes of the (M, 2E) positions written and read again, the same entries gathered.
        at = table.index_select(0, ids.reshape(-1))
        rows = rows.to(torch.int32)
    else:
        at = depth_range_ends(h, ids)  # (M, 2E), turned in place into flat positions
    if s0 != 1:
        at.mul_(s0)
    at.add_(rows[:, None] * s1)
    got = flat.index_select(0, at.view(-1)).view(m, 2, e)
    return got[:, 0] - got[:, 1] if out is None else torch.sub(got[:, 0], got[:, 1], out=out)


def depth_masses_packed(h, prefix: torch.Tensor, ids: torch.Tensor, budget: int = 1 << 26,
                        dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """(B, C, E) per-leaf-depth masses of the nodes ``ids`` (B, C) int64 (``N``: zero masses), read
    from batch-major prefix sums ``prefix`` (B, L + 1) (:func:`depth_prefix_sums` transposed), computed
    in float64 and returned in ``dtype``.

    One gather of both ends when the temporaries (some 64·E bytes an entry at their peak) fit ``budget`` bytes;
    else in chunks of samples, or of one sample's columns, that do (the same values), written into the
    ``dtype`` output (no float64 copy of it).  On plain CPU tensors with the ends table built, one native pass
    (:func:`~hdecode_torch.kernels.native.hf_beta.pair_masses`, the same bits) and no temporary.
    """
    got = native_hf_beta.pair_masses(prefix.t(), depth_ranges(h).ends, None, ids, dtype)
    if got is not None:  # one native pass, no temporary: the same subtraction and rounding per entry
        return got
    bsz, c = ids.shape
    e = h.num_leaf_depths
    step = max(1, budget // (64 * e))  # entries per chunk
    if bsz * c <= step:
        got = prefix.gather(1, depth_range_ends(h, ids).view(bsz, -1)).view(bsz, c, 2, e)
        return (got[:, :, 0] - got[:, :, 1]).to(dtype)
    out = torch.empty(bsz, c, e, dtype=dtype, device=prefix.device)
    rows = max(1, step // max(c, 1))
    cols = c if rows > 1 else step
    for b0 in range(0, bsz, rows):
        for c0 in range(0, c, cols):
            part = ids[b0:b0 + rows, c0:c0 + cols]
            nb, nc = part.shape
            got = prefix[b0:b0 + nb].gather(1, depth_range_ends(h, part).view(nb, -1)).view(nb, nc, 2, e)
            out[b0:b0 + nb, c0:c0 + nc] = got[:, :, 0] - got[:, :, 1]
    return out
