"""The float64 node sums the decision ops' torch implementations start from, with their index
tables prepared once per set of tables (unlike :func:`~hdecode_torch.kernels.fused.gathered_prefix.range_sums`,
which looks its endpoints up on every call: at one row, a lookup costs as much as an operator).

The same table and the same differences as ``range_sums``, hence its bits: ``[0 | C | g]`` with
``g = x[:, src]`` in float64 and C its exclusive prefix (a sequential scan), and each range
``[lo, hi)`` one difference of two of its entries, a range of one entry ``g[lo] − 0`` exactly.
"""

from __future__ import annotations

import torch

__all__ = ["table_endpoints", "node_sums"]


def table_endpoints(hi: torch.Tensor, lo: torch.Tensor, j: int) -> torch.Tensor:
    """(2K,) int64 ``[hi' | lo']``: the entries of ``[0 | C | g]`` (J = ``j`` gathered values) whose
    difference ``hi' − lo'`` is the sum over ``[lo, hi)``; a one-entry range reads ``g[lo]`` and the leading
    0.  hi, lo: (K,) int64.  Side by side so that one gather reads both ends."""
    one = hi - lo == 1
    return torch.cat([torch.where(one, lo + (j + 1), hi), torch.where(one, 0, lo)])


def node_sums(x: torch.Tensor, src: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """(B, K) float64 range sums of x (B, M) over the leaves ``src`` (J,), from the (2K,) endpoints of
    :func:`table_endpoints` (unchecked); at one row a view of the (1, 2K) gathered ends.  O(B·(J + K));
    holds the (B, 2J + 1) float64 table.  The same differences, hence the same bits, at every B."""
    b, j = x.shape[0], src.shape[0]
    table = x.new_empty((b, 2 * j + 1), dtype=torch.float64)
    table.select(1, 0).zero_()  # not table[:, 0] = 0: Python's indexing costs a few µs a call
    g = table.narrow(1, j + 1, j)
    if x.dtype == torch.float64:
        torch.index_select(x, 1, src, out=g)
    else:
        g.copy_(x.index_select(1, src))
    torch.cumsum(g, dim=1, out=table.narrow(1, 1, j))
    # gather with stride-0 indices: faster on the CPU than index_select along dim 1
    k = ends.shape[0] // 2
    if b == 1:
        # one row: both ends in one gather (one operator fewer, a few µs), the difference in place; on many
        # rows two contiguous (B, K) gathers are faster than a (B, 2K) one and its strided halves
        both = torch.gather(table, 1, ends.expand(b, -1))
        return both.narrow(1, 0, k).sub_(both.narrow(1, k, k))
    return torch.gather(table, 1, ends.narrow(0, 0, k).expand(b, -1)).sub_(
        torch.gather(table, 1, ends.narrow(0, k, k).expand(b, -1)))
