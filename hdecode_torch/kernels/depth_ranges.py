"""Per-leaf-depth masses of *some* nodes, without an (N, E, B) table.

Order the leaves by (depth, position in a depth-first traversal).  Then the leaves under a
node n that sit at depth e form one contiguous run of that order, so with one prefix sum
of each row of probabilities (in that order) every mass

    Q_e(n) = Σ_{l ∈ L(n), d(l) = depths[e]} p(l)

is a difference of two prefix sums.  Decoders that need Q only on a few candidate nodes
per sample (hF_β) pay O(B·L) for the prefix sums and O(E) per candidate, instead of
O(N·E·B) for the full table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["DepthRanges", "depth_ranges", "depth_prefix_sums", "depth_masses"]


@dataclass(frozen=True)
class DepthRanges:
    """Tree-only tables (cached on the hierarchy by :func:`depth_ranges`).

    leaf_order: (L,) int64 leaf ids sorted by (depth, depth-first position).
    lo, hi: (N + 1, E) int32; the leaves of L(n) at depth ``depths[e]`` are positions
        ``lo[n, e] <= j < hi[n, e]`` of ``leaf_order``.  Row N is a padding row (empty runs).
    depths: (E,) int64 the distinct leaf depths, ascending.
    """

    leaf_order: torch.Tensor
    lo: torch.Tensor
    hi: torch.Tensor
    depths: torch.Tensor


def depth_ranges(h) -> DepthRanges:
    """The :class:`DepthRanges` of ``h`` (built once per hierarchy and device, O(N·E log L))."""
    def build():
        leaf_count = h.leaf_count.cpu().numpy().astype(np.int64)
        num_leaves = h.num_leaves
        start = h.leaf_start.cpu().numpy()  # depth-first start of every subtree, in leaf units
        depths = np.unique(h.leaf_depth.cpu().numpy())
        group = np.searchsorted(depths, h.leaf_depth.cpu().numpy())
        key = group * num_leaves + start[:num_leaves]
        leaf_order = np.argsort(key, kind="stable")
        sorted_key = key[leaf_order]
        base = np.arange(depths.size, dtype=np.int64)[None, :] * num_leaves
        lo = np.searchsorted(sorted_key, base + start[:, None])
        hi = np.searchsorted(sorted_key, base + (start + leaf_count)[:, None])
        pad = np.zeros((1, depths.size), dtype=np.int64)
        dev = h.device

        def T(a, dtype):
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype).to(dev)
        return DepthRanges(leaf_order=T(leaf_order, torch.int64), lo=T(np.vstack([lo, pad]), torch.int32),
                           hi=T(np.vstack([hi, pad]), torch.int32), depths=T(depths, torch.int64))
    return h.cached("depth_ranges", build)


def depth_prefix_sums(h, leaf_values: torch.Tensor) -> torch.Tensor:
    """(L + 1, B) float64 prefix sums of ``leaf_values`` (L, B), leaf-major, in :func:`depth_ranges`
    order (row 0 is zero).

    Leaf-major, like the node tables (``p[:L]`` of node probabilities ``p`` is exactly the leaf
    probabilities), so the reordering moves whole rows.  float64 so that the differences taken by
    :func:`depth_masses` keep the precision of the masses themselves.
    """
    order = depth_ranges(h).leaf_order
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


def depth_masses(h, prefix: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(M, E) float64 per-leaf-depth masses ``Q_e(ids[i])`` of sample ``rows[i]``.

    prefix: (L + 1, B) float64 from :func:`depth_prefix_sums`; rows, ids: (M,) int64 sample
    indices and node ids (``N`` is padding: its masses are 0).
    """
    ranges = depth_ranges(h)
    m, e = ids.numel(), ranges.depths.numel()
    # One flat index_select for both ends (advanced indexing with a 2-D index is slower on a CPU),
    # on the table's own storage whichever way it is laid out.
    ends = torch.stack([ranges.hi.index_select(0, ids), ranges.lo.index_select(0, ids)]).long()
    flat, s0, s1 = _flat(prefix)
    got = flat.index_select(0, (ends * s0 + rows[:, None] * s1).view(-1)).view(2, m, e)
    return got[0] - got[1]
