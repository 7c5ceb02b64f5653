"""Bounding memory: split a batch so that per-chunk temporaries stay under a budget."""

from __future__ import annotations

__all__ = ["get_memory_budget", "set_memory_budget", "chunk_ranges"]

_BUDGET = 512 * 2**20


def get_memory_budget() -> int:
    """Bytes a single decoder call may use for batch-proportional temporaries (default 512 MiB)."""
    return _BUDGET


def set_memory_budget(num_bytes: int) -> None:
    """Set the per-call temporary-memory budget used to choose chunk sizes."""
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes <= 0:
        raise ValueError(f"Expected `num_bytes` to be a positive int, but got {num_bytes!r}")
    global _BUDGET
    _BUDGET = num_bytes


def chunk_ranges(batch: int, bytes_per_sample: int, chunk_size: int | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(batch)`` with at most ``budget / bytes_per_sample`` each.

    An explicit ``chunk_size`` overrides the budget.  A batch of 0 gives ``[(0, 0)]`` so
    callers still produce correctly shaped empty outputs.
    """
    if chunk_size is None:
        chunk_size = max(1, _BUDGET // max(1, bytes_per_sample))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"Expected `chunk_size` to be a positive int, but got {chunk_size!r}")
    if batch == 0:
        return [(0, 0)]
    return [(s, min(batch, s + chunk_size)) for s in range(0, batch, chunk_size)]
