"""Triton kernels of the fused ops: one program per row, the whole row in registers.

Imported lazily (on the first CUDA call of an ``hdecode::`` op, or explicitly): importing this
module imports Triton.  The launchers take CUDA tensors, or CPU tensors when the environment has
``TRITON_INTERPRET=1`` before this module is imported (Triton's interpreter, used by the tests).

Design (why one program per row): the prefix sum of a row of J gathered values is computed in
registers with ``tl.cumsum`` (float64), every range sum is read from it with ``tl.gather``, and only
the K outputs (or one int64 decision) are written.  The input is read once; no (B, J) prefix table
ever reaches memory.  A program holds the J prefix sums in registers, so J is capped at
:data:`MAX_J`; the K ranges are processed in tiles of at most :data:`MAX_BLOCK_K`, so K is not capped.

Numerics: products ``weight[j]·x[src[j]]`` are rounded before they are summed (FMA contraction is
disabled), and the scan is a fixed tree, so the result is deterministic; it equals the torch
reference (a sequential scan) to a few float64 ulps of the row's running sum, not bit for bit.
Index arrays are read unchecked: the ``hdecode::`` ops check them before launching.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

from .reference import check_best_ranked_above_args, check_gathered_prefix_args, check_row_sum_min_args

__all__ = ["MAX_J", "MAX_BLOCK_K", "fits", "interpreted",
           "gathered_prefix_triton", "best_ranked_above_triton", "row_sum_min_triton"]

#: Largest J (gathered entries per row) handled by one program: its float64 prefix sums live in
#: registers (16384 values over 512 threads = 32 doubles a thread).  Larger rows use the torch path.
MAX_J = 16384
#: Ranges handled per loop step of a program.
MAX_BLOCK_K = 2048
#: Columns per loop step of ``row_sum_min``.
ROW_BLOCK = 1024

_INT64_MIN = tl.constexpr(-9223372036854775807 - 1)


@triton.jit
def _weighted_prefix(xrow, stride_xm, SRC, W, J, HAS_W: tl.constexpr, JP: tl.constexpr):
    # c[j] = Σ_{i<=j} w[i]·x[src[i]] (inclusive), float64; padding lanes add 0
    j = tl.arange(0, JP)
    live = j < J
    s = tl.load(SRC + j, mask=live, other=0)
    v = tl.load(xrow + s * stride_xm, mask=live, other=0.0).to(tl.float64)
    if HAS_W:
        v = v * tl.load(W + j, mask=live, other=0.0)
    return tl.cumsum(v, axis=0)


@triton.jit
def _range_sum(c, HI, LO, k, K, HAS_LO: tl.constexpr):
    # C[hi] - C[lo] with the exclusive prefix C[i] = c[i-1], C[0] = 0
    live = k < K
    hi = tl.load(HI + k, mask=live, other=0)
    v = tl.where(hi > 0, tl.gather(c, tl.maximum(hi - 1, 0), axis=0), 0.0)
    if HAS_LO:
        lo = tl.load(LO + k, mask=live, other=0)
        v = v - tl.where(lo > 0, tl.gather(c, tl.maximum(lo - 1, 0), axis=0), 0.0)
    return v


@triton.jit
def _gathered_prefix_kernel(X, stride_xb, stride_xm, SRC, W, HI, LO, OUT, J, K,
                            HAS_W: tl.constexpr, HAS_LO: tl.constexpr, JP: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = _weighted_prefix(X + row * stride_xb, stride_xm, SRC, W, J, HAS_W, JP)
    out_row = OUT + row * K
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        v = _range_sum(c, HI, LO, k, K, HAS_LO)
        tl.store(out_row + k, v.to(OUT.dtype.element_ty), mask=k < K)


@triton.jit
def _best_ranked_above_kernel(X, stride_xb, stride_xm, SRC, HI, LO, RANK, OUT, threshold: tl.float64,
                              fallback: tl.int64, J, K, HAS_LO: tl.constexpr, JP: tl.constexpr,
                              BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = _weighted_prefix(X + row * stride_xb, stride_xm, SRC, SRC, J, False, JP)
    best_rank = tl.full((), _INT64_MIN, tl.int64)
    best_k = tl.full((), -1, tl.int64)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        live = k < K
        ok = (_range_sum(c, HI, LO, k, K, HAS_LO) > threshold) & live
        r = tl.load(RANK + k, mask=live, other=0)
        tile_rank = tl.max(tl.where(ok, r, _INT64_MIN), axis=0)
        # smallest k of the tile's best rank; K when nothing in the tile passes
        tile_k = tl.min(tl.where(ok & (r == tile_rank), k, K), axis=0).to(tl.int64)
        # tiles come in increasing k: a later tile wins only with a strictly larger rank
        take = (tile_k < K) & ((best_k < 0) | (tile_rank > best_rank))
        best_rank = tl.where(take, tile_rank, best_rank)
        best_k = tl.where(take, tile_k, best_k)
    tl.store(OUT + row, tl.where(best_k >= 0, best_k, fallback))


@triton.jit
def _row_sum_min_kernel(X, stride_xb, stride_xm, OUT, M, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    acc = tl.zeros((BLOCK,), tl.float64)
    low = tl.full((BLOCK,), float("inf"), tl.float64)
    nan = tl.zeros((BLOCK,), tl.int32)
    for m0 in range(0, M, BLOCK):
        m = m0 + tl.arange(0, BLOCK)
        live = m < M
        v = tl.load(xrow + m * stride_xm, mask=live, other=0.0).to(tl.float64)
        acc += v
        low = tl.minimum(low, tl.where(live, v, float("inf")))
        # GPU min drops NaN: track it on its own so that it reaches both outputs
        nan = tl.maximum(nan, (v != v).to(tl.int32))
    has_nan = tl.max(nan, axis=0) > 0
    total = tl.where(has_nan, float("nan"), tl.sum(acc, axis=0))
    smallest = tl.where(has_nan, float("nan"), tl.min(low, axis=0))
    tl.store(OUT + row * 2, total)
    tl.store(OUT + row * 2 + 1, smallest)


def interpreted() -> bool:
    """True when the kernels were built for Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return type(_gathered_prefix_kernel).__name__ == "InterpretedFunction"


_SHARED_MEMORY: dict[int, int] = {}


def _shared_memory(device: torch.device) -> int:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED_MEMORY:
        props = torch.cuda.get_device_properties(index)
        _SHARED_MEMORY[index] = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
    return _SHARED_MEMORY[index]


def fits(num_gathered: int, device: torch.device | None = None) -> bool:
    """Whether rows of ``num_gathered`` (= J) entries fit one program.

    J <= :data:`MAX_J`, and on a CUDA ``device`` the J float64 prefix sums fit the shared memory a
    block may use (``tl.gather`` stages them there: 128 KiB at J = 16384, more than GPUs before
    sm_80 offer).
    """
    if num_gathered > MAX_J:
        return False
    if device is None or device.type != "cuda":
        return True
    return 8 * max(16, triton.next_power_of_2(num_gathered)) + 4096 <= _shared_memory(device)


def _launch_context(x: torch.Tensor):
    if x.device.type == "cuda":
        return torch.cuda.device(x.device)
    if not interpreted():
        raise RuntimeError(f"The Triton kernels take CUDA tensors (got {x.device}); CPU tensors need "
                           "TRITON_INTERPRET=1 in the environment before this module is imported")
    return contextlib.nullcontext()


def _row_config(x: torch.Tensor, j: int, k: int) -> tuple[int, int, int]:
    if not fits(j, x.device):
        raise ValueError(f"Expected at most MAX_J = {MAX_J} gathered entries per row, but got J = {j}; "
                         "use the torch path (the hdecode:: ops switch to it automatically)")
    jp = max(16, triton.next_power_of_2(j))
    block_k = min(MAX_BLOCK_K, max(16, triton.next_power_of_2(k)))
    num_warps = 4 if jp <= 1024 else 8 if jp <= 4096 else 16
    return jp, block_k, num_warps


def gathered_prefix_triton(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                           lo: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Triton kernel of ``hdecode::gathered_prefix`` (same arguments and result; see
    :func:`hdecode_torch.kernels.fused.gathered_prefix`).  Indices are not range-checked here.

    x: (B, M) float, any strides (read in place); J = len(src) <= :data:`MAX_J`.  Returns (B, K).
    """
    check_gathered_prefix_args(x, src, weight, hi, lo, out_dtype)
    b, j, k = x.shape[0], src.shape[0], hi.shape[0]
    jp, block_k, num_warps = _row_config(x, j, k)
    out = torch.empty((b, k), dtype=out_dtype, device=x.device)
    if b == 0 or k == 0:
        return out
    with _launch_context(x):
        _gathered_prefix_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, weight, hi, lo, out, j, k,
            HAS_W=weight is not None, HAS_LO=lo is not None, JP=jp, BLOCK_K=block_k,
            num_warps=num_warps, enable_fp_fusion=False)
    return out


def best_ranked_above_triton(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                             rank: torch.Tensor, threshold: float, fallback: int) -> torch.Tensor:
    """Triton kernel of ``hdecode::best_ranked_above`` (same arguments and result; see
    :func:`hdecode_torch.kernels.fused.best_ranked_above`).  Indices are not range-checked here.

    Returns (B,) int64; only these B integers are written.
    """
    check_best_ranked_above_args(x, src, hi, lo, rank)
    b, j, k = x.shape[0], src.shape[0], hi.shape[0]
    jp, block_k, num_warps = _row_config(x, j, k)
    out = torch.empty((b,), dtype=torch.int64, device=x.device)
    if b == 0:
        return out
    with _launch_context(x):
        _best_ranked_above_kernel[(b,)](
            x, x.stride(0), x.stride(1), src, hi, lo, rank, out, float(threshold), int(fallback), j, k,
            HAS_LO=lo is not None, JP=jp, BLOCK_K=block_k, num_warps=num_warps, enable_fp_fusion=False)
    return out


def row_sum_min_triton(x: torch.Tensor) -> torch.Tensor:
    """Triton kernel of ``hdecode::row_sum_min`` (see :func:`hdecode_torch.kernels.fused.row_sum_min`).

    x: (B, M) float, any strides, any M (the row is read in blocks).  Returns (B, 2) float64.
    """
    check_row_sum_min_args(x)
    b, m = x.shape
    out = torch.empty((b, 2), dtype=torch.float64, device=x.device)
    if b == 0:
        return out
    block = min(ROW_BLOCK, max(16, triton.next_power_of_2(m)))
    with _launch_context(x):
        _row_sum_min_kernel[(b,)](x, x.stride(0), x.stride(1), out, m, BLOCK=block, num_warps=4,
                                  enable_fp_fusion=False)
    return out
