"""The native CPU kernel of ``hdecode::wu_palmer_best`` (``node_scores.c``, ``hd_wu_palmer_best_*``): the torch
implementation's arithmetic (float64 sums, scores in the compute dtype), operation by operation, one pass per leaf
depth over each group of rows, no (B, N) table."""

from __future__ import annotations

import ctypes

import torch

from ... import native
from ...native.budget import fits, wu_palmer_best_scratch
from .._checks import check_tables_once, derived
from ..gathered_prefix import _endpoints
from . import _order, check

__all__ = ["wu_palmer_best_native"]

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = [_I64, _PTR, _I64, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _PTR,
             _I64]
#: x's dtype -> (the kernel's suffix, the compute dtype t of the torch implementation)
_VARIANTS = {torch.float32: ("f32", torch.float32), torch.float64: ("f64", torch.float64)}


def _tables(x, args, t):
    """The tables of the torch implementation as the kernel reads them (contiguous, with their addresses; cached
    per set of tables, row length and compute dtype): the range ends of ``[0 | C | g]``, the weights
    ``t(2) / (t(depth) + t(e))`` (E, N) computed as the torch implementation computes them, the preference order."""
    src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank = args

    def build():
        j = src.shape[0]
        hi2, lo2 = _endpoints(hi, lo, j)
        weight = torch.tensor(2.0, dtype=t) / (depth.to(t)[None, :] + leaf_depths.to(t)[:, None])  # (E, N)
        held = [a.contiguous() for a in (src, hi2, lo2, euler_src, sign, at, weight, _order(rank))]
        return dict(held=held, ptr=[a.data_ptr() for a in held], j=j, n=depth.shape[0], e=leaf_depths.shape[0],
                    t=euler_src.shape[0])
    return derived(("wu_palmer_best_native", x.shape[1], t), args, build)


def wu_palmer_best_native(x: torch.Tensor, src, hi, lo, depth, leaf_depths, euler_src, sign, at,
                          rank) -> torch.Tensor | None:
    """``wu_palmer_best``'s (B,) int64 answer by the native kernel, or None where it does not apply (then the
    caller runs the torch implementation, which also raises on bad arguments): x a plain (B, M) float32/float64
    CPU tensor, any strides, under :func:`hdecode_torch.kernels.native.applies`.  The same node as the torch
    implementation, row by row.  O(B·(J + E·(N + T))); buffers of 8·(2J + T + 2) float64 and 16·N compute
    values (:func:`~hdecode_torch.kernels.native.budget.wu_palmer_best_scratch`); None where that is over the memory
    budget."""
    variant = _VARIANTS.get(x.dtype) if isinstance(x, torch.Tensor) else None
    if variant is None or x.dim() != 2 or not native.applies(x):
        return None
    args = (src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank)
    suffix, t = variant
    try:  # the torch implementation's checks (shapes, dtypes, devices, every index in range), once per set of tables
        check_tables_once("wu_palmer_best", x, args, lambda: check(x, *args))
        o = _tables(x, args, t)
    except (AttributeError, TypeError, ValueError):  # the torch implementation raises the argument's error
        return None
    if not fits(wu_palmer_best_scratch(o["j"], o["n"], o["t"], t.itemsize)):  # over the budget: the torch path
        return None
    b = x.shape[0]
    pred = torch.empty(b, dtype=torch.int64)
    if b == 0 or o["n"] == 0:
        return pred.fill_(-1)
    src_p, hi_p, lo_p, eul, sg, at_p, wt, order = o["ptr"]
    status = native.function(f"hd_wu_palmer_best_{suffix}", ctypes.c_int, _ARGTYPES)(
        b, x.data_ptr(), x.stride(0), x.stride(1), o["j"], src_p, o["n"], o["e"], hi_p, lo_p, o["t"], eul, sg, at_p,
        wt, order, pred.data_ptr(), 1)
    if status:
        raise MemoryError("wu_palmer_best's native kernel could not allocate its buffers")
    return pred
