"""``hdecode::row_sum_min``: per-row float64 sum and minimum in one pass, the input check's reduction."""

from __future__ import annotations

import torch

from .._checks import check_float_tensor
from .._registry import register

__all__ = ["row_sum_min", "row_sum_min_torch", "SCHEMA"]

SCHEMA = "row_sum_min(Tensor x) -> Tensor"


def row_sum_min(x: torch.Tensor) -> torch.Tensor:
    """Per-row float64 sum and minimum in one pass (``hdecode::row_sum_min``), the input check's reduction.

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides.
    Returns:
        (B, 2) float64: ``[:, 0]`` the sum, ``[:, 1]`` the minimum.  A row holding NaN gives NaN in
        both; +inf gives a +inf sum; an empty row gives ``[0, +inf]``.  O(B·M), any M.
    Raises:
        ValueError / TypeError naming ``x`` for a wrong shape or dtype.
    """
    return torch.ops.hdecode.row_sum_min(x)


def check(x) -> None:
    """Shape and dtype of ``x``."""
    check_float_tensor(x, "x")


def row_sum_min_torch(x: torch.Tensor) -> torch.Tensor:
    """The torch implementation of :func:`row_sum_min` (every device): two reductions over ``x``."""
    check(x)
    total = x.sum(dim=1, dtype=torch.float64)
    if x.shape[1] == 0:
        low = torch.full_like(total, float("inf"))
    else:
        low = x.amin(dim=1).to(torch.float64)  # amin propagates NaN; the cast is exact
    return torch.stack([total, low], dim=1)


def _fake(x):
    check(x)
    return x.new_empty((x.shape[0], 2), dtype=torch.float64)


register("row_sum_min", SCHEMA, row_sum_min_torch, _fake, check, __name__ + ".triton")
