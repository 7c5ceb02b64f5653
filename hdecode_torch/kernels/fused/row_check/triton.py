"""Triton kernel of ``hdecode::row_check``: one program per row, the row read in blocks of :data:`ROW_BLOCK`."""

from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

from .. import _triton as T
from . import check

__all__ = ["ROW_BLOCK", "launch"]

#: Columns per loop step.
ROW_BLOCK = 1024


# The bounds' bits are never specialized: Triton makes an integer argument equal to 1 a compile-time
# constant, and the bits of the smallest subnormal (a lower bound of "positive") are 1.
@triton.jit(do_not_specialize=["lo_bits", "hi_bits"])
def _row_check_kernel(X, stride_xb, stride_xm, OUT, lo_bits, hi_bits, M, BLOCK: tl.constexpr):
    # The bounds arrive as the bits of their float64 values: some Triton versions pass a Python float
    # as float32 whatever the annotation, which moves a bound such as 1 - 1e-4 by up to 3e-9.
    lo = lo_bits.to(tl.int64).to(tl.float64, bitcast=True)
    hi = hi_bits.to(tl.int64).to(tl.float64, bitcast=True)
    row = tl.program_id(0).to(tl.int64)
    xrow = X + row * stride_xb
    acc = tl.zeros((BLOCK,), tl.float64)
    bad = tl.zeros((BLOCK,), tl.int32)
    m0 = tl.full((), 0, tl.int32)
    while m0 < M:
        m = m0 + tl.arange(0, BLOCK)
        live = m < M
        v = tl.load(xrow + m.to(tl.int64) * stride_xm, mask=live, other=0.0).to(tl.float64)
        acc += v
        # `not v >= 0` holds for negatives and NaN alike: no minimum, which a GPU computes dropping NaN
        bad = tl.maximum(bad, tl.where(v >= 0, 0, 1))
        m0 += BLOCK
    s = tl.sum(acc, axis=0)
    tl.store(OUT + row, (tl.max(bad, axis=0) == 0) & (s >= lo) & (s <= hi))


def launch(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """The Triton kernel of :func:`~hdecode_torch.kernels.fused.row_check` (same arguments and result)."""
    check(x, lo, hi)
    b, m = x.shape
    out = torch.empty((b,), dtype=torch.bool, device=x.device)
    if b == 0:
        return out
    with T.launch_context(x):
        _row_check_kernel[(b,)](x, x.stride(0), x.stride(1), out, _bits(lo), _bits(hi), m,
                                BLOCK=min(ROW_BLOCK, T.padded(m)), num_warps=4, enable_fp_fusion=False)
    return out


def _bits(value: float) -> int:
    """The IEEE-754 bits of ``float(value)`` as a signed 64-bit integer (the kernel bitcasts them back)."""
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]
