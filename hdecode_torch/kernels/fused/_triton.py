"""What the Triton kernels of the fused ops share: tiled float64 prefix scans, range sums read from
them, and the launch plumbing.  Importing this module imports Triton; the ops import it on their
first CUDA call.  The launchers take CUDA tensors, or CPU tensors when the environment has
``TRITON_INTERPRET=1`` before Triton is imported (Triton's interpreter, used by the tests).

A row's prefix is held one of two ways, chosen per call by :func:`row_layout`:

- in registers, the whole row in one tile (``tl.cumsum``), read back with ``tl.gather``: rows of
  at most :data:`MAX_REGISTER_ROW` entries whose float64 prefix fits the shared memory a block may
  use (``tl.gather`` stages it there; the Triton of every supported torch has it);
- in a float64 scratch row in global memory, written tile by tile (:data:`SCAN_BLOCK` entries,
  each tile's scan started from the running sum of the tiles before it) and read back with loads
  after a block barrier: any length.

Numerics: products ``weight[j]·x[src[j]]`` are rounded before they are summed (FMA contraction is
disabled), a tile is scanned by ``tl.cumsum`` after the running sum was added to its first entry,
so the result is deterministic; on a GPU (a tree scan) it equals the torch implementation (a
sequential scan) to a few float64 ulps of the row's running sum; under the interpreter (a
sequential scan) bit for bit.  A range of exactly one entry is that entry, read directly.

Loops whose trip count is only known at run time are ``while`` loops: Triton's interpreter turns
the bound of a ``for ... in range(...)`` into a Python int through ``__index__``, which Triton 3.6
does with ``int()`` on a one-element array, an error under NumPy 2.4.  Index arrays are read
unchecked: the ops check them before launching.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["MAX_REGISTER_ROW", "SCAN_BLOCK", "interpreted", "launch_context", "row_layout", "row_buffers",
           "shared_memory", "padded", "num_warps", "prefix_tile", "prefix_to_memory", "row_prefix", "prefix_at",
           "range_sums"]

#: Longest row whose prefix a program holds in registers (16384 float64 over 512 threads = 32 a
#: thread); longer rows go through a scratch row in global memory.
MAX_REGISTER_ROW = 16384
#: Entries scanned per tile of a scratch-row scan.
SCAN_BLOCK = 4096


@triton.jit
def prefix_tile(xrow, stride_xm, SRC, W, j0, J, carry, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    """Inclusive float64 prefix of the tile ``[j0, j0 + BLOCK)`` of ``W[j]·xrow[SRC[j]]``, started from
    ``carry`` (the sum of the entries before the tile; padding adds 0).  Returns (prefix, its last entry)."""
    lanes = tl.arange(0, BLOCK)
    j = j0 + lanes
    live = j < J
    s = tl.load(SRC + j, mask=live, other=0)
    v = tl.load(xrow + s * stride_xm, mask=live, other=0.0).to(tl.float64)
    if HAS_W:
        v = v * tl.load(W + j, mask=live, other=0.0)
    # the running sum enters through the first entry, so that a sequential scan adds left to right
    v = tl.where(lanes == 0, v + carry, v)
    c = tl.cumsum(v, axis=0)
    return c, tl.sum(tl.where(lanes == BLOCK - 1, c, 0.0), axis=0)


@triton.jit
def prefix_to_memory(xrow, stride_xm, SRC, W, J, P, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
    """Write the inclusive float64 prefix of ``W[j]·xrow[SRC[j]]``, j < J, to ``P[0:J]``, tile by tile.

    The caller puts a ``tl.debug_barrier()`` between this and any read of ``P`` (other threads wrote it)."""
    carry = tl.full((), 0.0, tl.float64)
    j0 = tl.full((), 0, tl.int32)
    while j0 < J:
        c, carry = prefix_tile(xrow, stride_xm, SRC, W, j0, J, carry, HAS_W, BLOCK)
        j = j0 + tl.arange(0, BLOCK)
        tl.store(P + j, c, mask=j < J)
        j0 += BLOCK


@triton.jit
def row_prefix(xrow, stride_xm, SRC, W, J, P, HAS_W: tl.constexpr, IN_REGS: tl.constexpr, BLOCK: tl.constexpr):
    """The row prologue of a program: the inclusive float64 prefix of ``W[j]·xrow[SRC[j]]``, j < J, in the
    layout :func:`row_layout` chose.  ``IN_REGS``: returned, one tile of ``BLOCK`` >= J entries; else written to
    the scratch row ``P[0:J]`` in tiles of ``BLOCK``, followed by a block barrier, and 0.0 returned (a placeholder:
    the prefix is read from ``P``).  What :func:`prefix_at` and :func:`range_sums` take as ``(c, P)``."""
    if IN_REGS:
        c, _ = prefix_tile(xrow, stride_xm, SRC, W, 0, J, 0.0, HAS_W, BLOCK)
    else:
        c = 0.0
        prefix_to_memory(xrow, stride_xm, SRC, W, J, P, HAS_W, BLOCK)
        tl.debug_barrier()
    return c


@triton.jit
def prefix_at(c, P, i, live, IN_REGS: tl.constexpr):
    """Exclusive prefix ``C[i]`` (``C[0] = 0``) from the inclusive prefix: ``c`` in registers, or ``P`` in memory."""
    if IN_REGS:
        return tl.where(i > 0, tl.gather(c, tl.maximum(i - 1, 0), axis=0), 0.0)
    else:
        return tl.load(P + i - 1, mask=live & (i > 0), other=0.0)


@triton.jit
def range_sums(c, P, xrow, stride_xm, SRC, W, HI, LO, k, K, HAS_W: tl.constexpr, HAS_LO: tl.constexpr,
               IN_REGS: tl.constexpr):
    """float64 ``C[HI[k]] − C[LO[k]]`` for the ranges ``k`` (< K), a range of one entry read directly."""
    live = k < K
    hi = tl.load(HI + k, mask=live, other=0)
    v = prefix_at(c, P, hi, live, IN_REGS)
    if HAS_LO:
        lo = tl.load(LO + k, mask=live, other=0)
        v = v - prefix_at(c, P, lo, live, IN_REGS)
        # one entry: its value, exact, not a difference of two rounded running sums
        one = live & (hi - lo == 1)
        s = tl.load(SRC + lo, mask=one, other=0)
        d = tl.load(xrow + s * stride_xm, mask=one, other=0.0).to(tl.float64)
        if HAS_W:
            d = d * tl.load(W + lo, mask=one, other=0.0)
        v = tl.where(one, d, v)
    return v


def interpreted() -> bool:
    """True when the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``)."""
    return type(prefix_tile).__name__ == "InterpretedFunction"


_SHARED_MEMORY: dict[int, int] = {}


def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory a block may use on a CUDA ``device`` (read once per device)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SHARED_MEMORY:
        props = torch.cuda.get_device_properties(index)
        _SHARED_MEMORY[index] = int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))
    return _SHARED_MEMORY[index]


def padded(n: int) -> int:
    """The power of two >= n (at least 16) a block of n entries is padded to."""
    return max(16, triton.next_power_of_2(max(n, 1)))


def num_warps(width: int) -> int:
    """Warps of a program whose widest tile has ``width`` entries."""
    return 4 if width <= 1024 else 8 if width <= 4096 else 16


def row_layout(width: int, device: torch.device) -> bool:
    """Whether rows whose widest table has ``width`` entries are held in registers (True) or in a
    scratch row (False): at most :data:`MAX_REGISTER_ROW` entries and on CUDA the padded float64 table within the block's shared memory."""
    if width > MAX_REGISTER_ROW:
        return False
    return device.type != "cuda" or 8 * padded(width) + 4096 <= shared_memory(device)


def row_buffers(x: torch.Tensor, width: int, scratch_per_row: int, dummy: torch.Tensor):
    """``(in_regs, block, scratch)`` of a launch over the rows of ``x`` whose widest table has ``width``
    entries: the layout (:func:`row_layout`), the tile width (the padded row, or :data:`SCAN_BLOCK`),
    and a (B, ``scratch_per_row``) float64 scratch buffer (``dummy`` when the rows fit registers)."""
    if row_layout(width, x.device):
        return True, padded(width), dummy
    return False, SCAN_BLOCK, torch.empty((x.shape[0], scratch_per_row), dtype=torch.float64, device=x.device)


def launch_context(x: torch.Tensor):
    """The device context of a launch on ``x``'s device; CPU tensors only under the interpreter."""
    if x.device.type == "cuda":
        return torch.cuda.device(x.device)
    if not interpreted():
        raise RuntimeError(f"The Triton kernels take CUDA tensors (got {x.device}); CPU tensors need "
                           "TRITON_INTERPRET=1 in the environment before Triton is imported")
    return contextlib.nullcontext()
