"""The float64 range sums the range-sum ops' torch implementations share (``gathered_prefix``'s
``range_sums`` and the decision ops' node sums): the table ``[0 | C | g]`` with ``g = x[:, src]`` (times
a weight) in float64 and C its exclusive prefix (a sequential scan: the same bits on every call), and each
range ``[lo, hi)`` one difference of two of its entries, a range of one entry ``g[lo] − 0`` exactly.
"""

from __future__ import annotations

import torch

__all__ = ["table_endpoints", "prefix_table", "node_sums", "ONE_GATHER_BYTES"]


def table_endpoints(hi: torch.Tensor, lo: torch.Tensor, j: int) -> torch.Tensor:
    """(2K,) int64 ``[hi' | lo']``: the entries of ``[0 | C | g]`` (J = ``j`` gathered values) whose
    difference ``hi' − lo'`` is the sum over ``[lo, hi)``; a one-entry range reads ``g[lo]`` and the leading
    0.  hi, lo: (K,) int64.  Side by side so that one gather can read both ends."""
    one = hi - lo == 1
    return torch.cat([torch.where(one, lo + (j + 1), hi), torch.where(one, 0, lo)])


def prefix_table(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None = None,
                 apart: bool = True) -> torch.Tensor:
    """(B, 2J + 1) float64 ``[0 | C | g]`` of x (B, M) and the leaves ``src`` (J,) (``weight`` (J,) float64
    times each gathered value), or (B, J + 1) ``[0 | C]`` when not ``apart`` (for ranges that all start at
    0: no one-entry range to read apart).  O(B·J)."""
    b, j = x.shape[0], src.shape[0]
    table = x.new_empty((b, 2 * j + 1 if apart else j + 1), dtype=torch.float64)
    # select, narrow: Python's indexing costs a few µs a call, which at one row is an operator's cost
    table.select(1, 0).zero_()
    g = table.narrow(1, j + 1 if apart else 1, j)
    if x.dtype == torch.float64:
        torch.index_select(x, 1, src, out=g)
    else:
        g.copy_(x.index_select(1, src))
    if weight is not None:
        g.mul_(weight)
    if apart:
        torch.cumsum(g, dim=1, out=table.narrow(1, 1, j))
    else:
        g.cumsum_(dim=1)
    return table


#: Largest (B, 2K) float64 gather of both ends :func:`node_sums` makes on a CPU, glibc's largest mmap threshold
#: (32 MiB): below, one gather and the difference in place take 2-23% less time than two (B, K) gathers; above,
#: the one gather's result is now and then fresh pages, whose faults double its time (benchmarks/README.md,
#: "At batch").
ONE_GATHER_BYTES = 1 << 25


def node_sums(x: torch.Tensor, src: torch.Tensor, ends: torch.Tensor, weight: torch.Tensor | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) float64 range sums of x (B, M) over the leaves ``src`` (J,) (times ``weight`` (J,) float64 if
    given), from the (2K,) endpoints of :func:`table_endpoints` (unchecked), in ``out`` if given (float32 or
    float64: each float64 difference rounded once).  O(B·(J + K)); holds the (B, 2J + 1) float64 table.  The
    same differences, hence the same bits, at every B."""
    b, k = x.shape[0], ends.shape[0] // 2
    table = prefix_table(x, src, weight)
    # gather with stride-0 indices: faster on the CPU than index_select along dim 1, and no (B, K) index table
    if x.device.type != "cpu" or 16 * b * k <= ONE_GATHER_BYTES:  # both ends in one gather: two operators fewer
        both = torch.gather(table, 1, ends.expand(b, -1))
        hi, lo = both.narrow(1, 0, k), both.narrow(1, k, k)  # at B > 1, a strided result: no third (B, K)
    else:
        hi = torch.gather(table, 1, ends.narrow(0, 0, k).expand(b, -1))
        lo = torch.gather(table, 1, ends.narrow(0, k, k).expand(b, -1))
    return hi.sub_(lo) if out is None else torch.sub(hi, lo, out=out)
