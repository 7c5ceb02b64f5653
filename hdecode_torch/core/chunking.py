"""Bounding memory: split a batch so that per-chunk temporaries stay under a budget.

The budget is per call: on the CPU plan ``get_memory_budget()`` (512 MiB unless set); on the CUDA
plan the same once ``set_memory_budget`` was called, else 4 GiB, or a quarter of the free memory
of the tensors' GPU when that is more (a GPU pays per launch, so fewer, larger chunks).
"""

from __future__ import annotations

__all__ = ["get_memory_budget", "set_memory_budget", "chunk_ranges", "budget_for"]

DEFAULT_BUDGET = 512 * 2**20
CUDA_DEFAULT_BUDGET = 4 * 2**30
_BUDGET = DEFAULT_BUDGET
_SET = False


def get_memory_budget() -> int:
    """Bytes a single decoder call may use for batch-proportional temporaries (default 512 MiB)."""
    return _BUDGET


def set_memory_budget(num_bytes: int | None) -> None:
    """Set the per-call temporary-memory budget used to choose chunk sizes (on every device);
    ``None`` restores the defaults."""
    global _BUDGET, _SET
    if num_bytes is None:
        _BUDGET, _SET = DEFAULT_BUDGET, False
        return
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes <= 0:
        raise ValueError(f"Expected `num_bytes` to be a positive int, but got {num_bytes!r}")
    _BUDGET = num_bytes
    _SET = True


def budget_for(device) -> int:
    """The budget of one call whose tensors are on ``device``, under the current plan."""
    from .plan import planned_device_type

    if _SET or planned_device_type(device) != "cuda":
        return _BUDGET
    budget = CUDA_DEFAULT_BUDGET
    if getattr(device, "type", None) == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        budget = max(budget, free // 4)
    return budget


def chunk_ranges(batch: int, bytes_per_sample: int, chunk_size: int | None = None,
                 budget: int | None = None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(batch)`` with at most ``budget / bytes_per_sample`` each.

    ``budget`` defaults to ``get_memory_budget()``; an explicit ``chunk_size`` overrides both.  A batch
    of 0 gives ``[(0, 0)]`` so callers still produce correctly shaped empty outputs.
    """
    if chunk_size is None:
        chunk_size = max(1, (_BUDGET if budget is None else budget) // max(1, bytes_per_sample))
    elif isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"Expected `chunk_size` to be a positive int, but got {chunk_size!r}")
    if batch == 0:
        return [(0, 0)]
    return [(s, min(batch, s + chunk_size)) for s in range(0, batch, chunk_size)]
