"""The true entries of a bool table: ``nonzero``'s integers, listed by NumPy where that is faster.

NumPy's ``flatnonzero`` counts a bool table's true entries a machine word at a time, ATen's CPU ``nonzero``
entry by entry: on the sparse (N, B) candidate masks of a batch (a few true entries a column) NumPy lists
them several times faster.  Both give the row-major positions in ascending order, so every caller receives
the same integers either way.  NumPy is used only on plain CPU tensors that nothing traces, counts or
differentiates (:func:`~hdecode_torch.kernels.fused._registry.direct`): a trace or an operator count still
sees the ``nonzero`` a GPU would run.
"""

from __future__ import annotations

import numpy as np
import torch

from .fused._registry import direct

__all__ = ["true_positions", "true_pairs", "listed_by_numpy", "NUMPY_MIN_ENTRIES"]

#: Entries from which a table's true entries are listed by NumPy (smaller ones keep the one ATen operator,
#: which costs less than the conversions there).
NUMPY_MIN_ENTRIES = 1 << 12


def listed_by_numpy(mask: torch.Tensor) -> bool:
    """Whether :func:`true_positions` and :func:`true_pairs` list ``mask``'s true entries with NumPy: at least
    ``NUMPY_MIN_ENTRIES`` entries, a plain CPU tensor that nothing traces, counts or differentiates."""
    return mask.numel() >= NUMPY_MIN_ENTRIES and direct(mask)


def true_positions(mask: torch.Tensor) -> torch.Tensor:
    """(K,) int64 the row-major positions of the true entries of ``mask`` (bool, any shape), ascending:
    ``mask.reshape(-1).nonzero().squeeze(1)``.  O(numel)."""
    if mask.dtype != torch.bool:
        raise TypeError(f"Expected `mask` to be a bool tensor, but got {mask.dtype}")
    if not listed_by_numpy(mask):
        return mask.reshape(-1).nonzero().squeeze(1)
    return torch.from_numpy(np.flatnonzero(mask.contiguous().numpy()).astype(np.int64, copy=False))


def true_pairs(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, col)``, (K,) int64 each, the true entries of the 2-D bool ``mask`` in row-major order:
    ``mask.nonzero().unbind(1)``.  O(numel)."""
    if mask.dtype != torch.bool or mask.dim() != 2:
        raise TypeError(f"Expected `mask` to be a 2-D bool tensor, but got {mask.dim()}-D {mask.dtype}")
    if not listed_by_numpy(mask):
        return mask.nonzero().unbind(1)
    row, col = np.divmod(np.flatnonzero(mask.contiguous().numpy()).astype(np.int64, copy=False), mask.shape[1])
    return torch.from_numpy(row), torch.from_numpy(col)
