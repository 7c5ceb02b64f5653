"""The native CPU kernel of ``hdecode::gathered_prefix`` (``range_sums.c``, ``hd_gathered_prefix_*``): the torch
implementation's float64 table and differences, operation by operation, one pass over each group of rows."""

from __future__ import annotations

import ctypes

import torch

from ... import native
from ...native.budget import fits, gathered_prefix_scratch
from .._checks import derived
from .._node_sums import table_endpoints
from . import check  # defined before the package imports this module

__all__ = ["gathered_prefix_native"]

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = [_I64, _PTR, _I64, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64]
_VARIANTS = {torch.float32: "f32", torch.float64: "f64"}


def _ends(hi: torch.Tensor, lo: torch.Tensor | None, j: int) -> torch.Tensor:
    """(2K,) contiguous int64 entries of ``[0 | C | g]`` whose difference is each range (cached per set of ranges):
    the torch implementation's endpoints where ``lo`` is given; ``C[hi]`` and the leading 0 where every range
    starts at 0 (the torch implementation reads ``C[hi]`` alone: the same value)."""
    if lo is not None:
        return derived(("native_ends", j), (hi, lo), lambda: table_endpoints(hi, lo, j).contiguous())
    return derived(("native_ends", j), (hi,), lambda: torch.cat([hi, torch.zeros_like(hi)]).contiguous())


def gathered_prefix_native(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                           lo: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor | None:
    """``gathered_prefix``'s (B, K) result by the native kernel, or None where it does not apply (then the caller
    runs the torch implementation): x a plain (B, M) float32/float64 CPU tensor, any strides, under
    :func:`hdecode_torch.kernels.native.applies`; the arguments checked first as the torch implementation checks
    them (the same errors).  The same bits as the torch implementation, row by
    row.  O(B·(J + K)); a buffer of 8·(2J + 1) float64
    (:func:`~hdecode_torch.kernels.native.budget.gathered_prefix_scratch`); None where that is over the memory
    budget."""
    variant = _VARIANTS.get(x.dtype) if isinstance(x, torch.Tensor) else None
    if variant is None or x.dim() != 2 or not native.applies(x):
        return None
    check(x, src, weight, hi, lo, out_dtype)
    j = src.shape[0]
    if not fits(gathered_prefix_scratch(j)):
        return None
    b, k = x.shape[0], hi.shape[0]
    out = torch.empty((b, k), dtype=out_dtype)
    if b == 0 or k == 0:
        return out
    ends = _ends(hi, lo, j)
    src = src.contiguous()
    weight = None if weight is None else weight.contiguous()
    status = native.function(f"hd_gathered_prefix_{variant}", ctypes.c_int, _ARGTYPES)(
        b, x.data_ptr(), x.stride(0), x.stride(1), j, src.data_ptr(), None if weight is None else weight.data_ptr(),
        k, ends.data_ptr(), out.data_ptr(), out.stride(0), out.stride(1), 1 if out_dtype == torch.float32 else 0)
    if status:
        raise MemoryError("gathered_prefix's native kernel could not allocate its buffers")
    return out
