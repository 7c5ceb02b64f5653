"""Bounding memory: split a batch so that per-chunk temporaries stay under the plan's budget."""

from __future__ import annotations

__all__ = ["chunk_ranges", "CPU_BLOCK_BYTES"]

#: Temporaries of one block of rows on the CPU for the components that decode in cache-sized blocks
#: (``HierarchyComponent.cpu_block_bytes``): about what a server core's share of the last-level cache holds.
CPU_BLOCK_BYTES = 16 * 2**20


def chunk_ranges(batch: int, bytes_per_sample: int, budget: int, chunk_size: int | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(batch)`` with at most ``budget / bytes_per_sample`` each.

    An explicit ``chunk_size`` overrides the budget.  A batch of 0 gives ``[(0, 0)]`` so callers
    still produce correctly shaped empty outputs.
    """
    if chunk_size is None:
        chunk_size = max(1, budget // max(1, bytes_per_sample))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"Expected `chunk_size` to be a positive int, but got {chunk_size!r}")
    if batch == 0:
        return [(0, 0)]
    if chunk_size >= batch:
        return [(0, batch)]
    return [(s, min(batch, s + chunk_size)) for s in range(0, batch, chunk_size)]
