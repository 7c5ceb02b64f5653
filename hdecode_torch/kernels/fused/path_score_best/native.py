"""The native CPU kernel of ``hdecode::path_score_best`` (``node_scores.c``, ``hd_path_score_best_*``): the torch
implementation's float64 arithmetic, operation by operation, one pass over each group of rows, no (B, N) table."""

from __future__ import annotations

import ctypes

import torch

from ... import native
from ...native.budget import fits, path_score_best_scratch
from .. import _checks
from . import _prepared

__all__ = ["path_score_best_native"]

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = [_I64, _PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64,
             _PTR, _PTR, _PTR, _I64, _PTR, _I64]
_VARIANTS = {torch.float32: "f32", torch.float64: "f64"}


def _tables(x, args):
    """The prepared tables of the torch implementation (:func:`._prepared`, which checks the arguments once per
    set of tables and row length) as the kernel reads them: contiguous, and their addresses (cached with them)."""
    def build():
        o = _prepared(x, *args)
        keep = o["keep"]
        held = [t.contiguous() for t in (args[0], o["ends"], o["parent"], o["alpha"], o["beta"], o["euler_src"],
                                         o["sign"], o["at"], o["delta"], keep)]
        gamma = None if o["gamma"] is None else o["gamma"].contiguous()
        ptr = [t.data_ptr() for t in held]
        # the exclusive prefix E read at `at` (E[0] = 0): the inclusive one at `at - 1` is E at `at`
        return dict(held=(held, gamma), n=o["ends"].shape[0] // 2, j=args[0].shape[0], t=o["t"], k=keep.shape[0],
                    at_offset=1 if o["inclusive"] else 0, gamma=None if gamma is None else gamma.data_ptr(), ptr=ptr)
    return _checks.derived(("path_score_best_native", x.device, x.shape[1]), args, build)


def path_score_best_native(x: torch.Tensor, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta,
                           allowed, rank, higher_is_better) -> torch.Tensor | None:
    """``path_score_best``'s (B,) int64 answer by the native kernel, or None where it does not apply (then the
    caller runs the torch implementation, which also raises on bad arguments): x a plain (B, M) float32/float64
    CPU tensor, any strides, under :func:`hdecode_torch.kernels.native.applies`.  The same node as the torch
    implementation, row by row.  O(B·(J + T + N)); a buffer of 8·(2J + T + 2N + 2) float64
    (:func:`~hdecode_torch.kernels.native.budget.path_score_best_scratch`); None where that is over the memory
    budget."""
    variant = _VARIANTS.get(x.dtype) if isinstance(x, torch.Tensor) else None
    if variant is None or x.dim() != 2 or not native.applies(x):
        return None
    args = (src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    try:
        o = _tables(x, args)
    except (AttributeError, TypeError):  # a table that is not a tensor: the torch implementation raises its error
        return None
    if not fits(path_score_best_scratch(o["j"], o["n"], o["t"])):  # over the budget: the torch implementation
        return None
    b = x.shape[0]
    pred = torch.empty(b, dtype=torch.int64)
    if b == 0 or o["k"] == 0:
        return pred.fill_(-1)
    src_p, ends, par, al, be, eul, sg, at_p, de, keep = o["ptr"]
    status = native.function(f"hd_path_score_best_{variant}", ctypes.c_int, _ARGTYPES)(
        b, x.data_ptr(), x.stride(0), x.stride(1), o["j"], src_p, o["n"], ends, par, al, be, o["t"], eul, sg, at_p,
        o["at_offset"], o["k"], o["gamma"], de, keep, 1 if higher_is_better else 0, pred.data_ptr(), 1)
    if status:
        raise MemoryError("path_score_best's native kernel could not allocate its buffers")
    return pred
