"""``hdecode::gathered_prefix``: range sums of a gathered, weighted prefix accumulated in float64.

Also its torch range sums (:func:`range_sums`, on the node sums the decision ops share:
:mod:`hdecode_torch.kernels.fused._node_sums`).
"""

from __future__ import annotations

import torch

from .._checks import OUT_DTYPES, check_index_values, check_ranges, check_tables_once, derived
from .._node_sums import node_sums, prefix_table, table_endpoints
from .._registry import call, register

__all__ = ["gathered_prefix", "gathered_prefix_torch", "range_sums", "SCHEMA"]

SCHEMA = ("gathered_prefix(Tensor x, Tensor src, Tensor? weight, Tensor hi, Tensor? lo, "
          "ScalarType out_dtype) -> Tensor")


def gathered_prefix(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                    lo: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Range sums of a gathered, weighted prefix accumulated in float64 (``hdecode::gathered_prefix``).

    ``C_b[0] = 0``, ``C_b[j+1] = C_b[j] + weight[j]·x[b, src[j]]`` in float64 whatever the input
    dtype; ``out[b, k] = C_b[hi[k]] - C_b[lo[k]]`` cast to ``out_dtype``, except that a range of
    exactly one entry (``hi[k] = lo[k] + 1``) is that entry, ``weight[lo[k]]·x[b, src[lo[k]]]``,
    exactly (a difference of two running sums would round it).

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides.
        src: (J,) int64 in [0, M), on x's device.
        weight: (J,) float64, or None for all ones.
        hi: (K,) int64 in [0, J].
        lo: (K,) int64 in [0, J], or None for all zeros.
        out_dtype: torch.float32 or torch.float64.
    Returns:
        (B, K) ``out_dtype``.  Deterministic (same bits on every call).  O(B·(J + K)), any J and K.
        The torch implementation holds a (B, 2J + 1) float64 table at once (on a CPU, blocks of rows
        of about 1 MiB): callers bound B.
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device or index.
    """
    return call("gathered_prefix", x, src, weight, hi, lo, out_dtype)


def check_args(x, src, weight, hi, lo, out_dtype) -> None:
    """Shapes, dtypes and devices of the arguments (no value is read)."""
    check_ranges(x, src, weight, hi, lo)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"Expected `out_dtype` to be torch.float32 or torch.float64, but got {out_dtype}")


def check(x, src, weight, hi, lo, out_dtype) -> None:
    """:func:`check_args` and every index in range (the tables' part once per set of tables)."""
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"Expected `out_dtype` to be torch.float32 or torch.float64, but got {out_dtype}")

    def tables():
        check_ranges(x, src, weight, hi, lo)
        check_index_values(x, src, hi, lo)
    check_tables_once("gathered_prefix", x, (src, weight, hi, lo), tables)


def _endpoints(hi: torch.Tensor, lo: torch.Tensor, j: int):
    """(hi', lo') of :func:`_both_ends`, apart (cached per set of ranges), for an op that gathers each end
    on its own (``wu_palmer_best``)."""
    return derived(("endpoints", j), (hi, lo), lambda: _both_ends(hi, lo, j).chunk(2))


def _both_ends(hi: torch.Tensor, lo: torch.Tensor, j: int) -> torch.Tensor:
    """(2K,) :func:`~hdecode_torch.kernels.fused._node_sums.table_endpoints` of the ranges (cached per set of
    ranges): at one row, a derivation per call costs as much as the sums."""
    return derived(("both_ends", j), (hi, lo), lambda: table_endpoints(hi, lo, j))


def range_sums(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
               lo: torch.Tensor | None, out: torch.Tensor | None = None) -> torch.Tensor:
    """(B, K) float64 range sums of :func:`gathered_prefix` (in ``out`` if given, float32 or float64: the
    float64 sums cast); arguments unchecked.

    All rows at once, :func:`~hdecode_torch.kernels.fused._node_sums.node_sums`: every range, one-entry
    ranges included, one difference of two entries of a float64 table of the gathered values and their
    exclusive prefix.  Sequential scans: the same bits on every call.
    """
    if lo is not None:
        return node_sums(x, src, _both_ends(hi, lo, src.shape[0]), weight, out)
    # every range from 0: C[hi] alone, from the prefix without the gathered values beside it
    b = x.shape[0]
    table = prefix_table(x, src, weight, apart=False)
    if out is not None and out.dtype != torch.float64:
        return out.copy_(torch.gather(table, 1, hi.expand(b, -1)))  # the float64 sum rounded once
    return torch.gather(table, 1, hi.expand(b, -1), out=out)


#: Bytes of the float64 table of :func:`range_sums` per block of rows on a CPU.  A table of a whole
#: large batch is fresh memory on every call, and its first touch (page faults) cost more than the
#: sums themselves (benchmarks/README.md, "At batch"); blocks this size are reused from the heap.
CPU_BLOCK_BYTES = 1 << 20


def gathered_prefix_torch(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                          lo: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """The torch implementation of :func:`gathered_prefix` (every device): all rows at once, except
    on a CPU, where blocks of rows whose table is about ``CPU_BLOCK_BYTES`` (rows are independent: the
    same bits).  On plain CPU tensors where the native kernels apply, :func:`call` runs the native kernel
    instead (:func:`~.native.gathered_prefix_native`: the same bits)."""
    check(x, src, weight, hi, lo, out_dtype)
    b, k = x.shape[0], hi.shape[0]
    out = x.new_empty((b, k), dtype=out_dtype)
    if b == 0 or k == 0:
        return out
    rows = b
    if x.device.type == "cpu":
        rows = max(1, CPU_BLOCK_BYTES // (8 * (2 * src.shape[0] + 1)))
    if rows >= b:  # one block: no slicing operators
        range_sums(x, src, weight, hi, lo, out=out)
        return out
    for a in range(0, b, rows):  # blocks of rows on a CPU
        range_sums(x[a:a + rows], src, weight, hi, lo, out=out[a:a + rows])
    return out


def _fake(x, src, weight, hi, lo, out_dtype):
    check_args(x, src, weight, hi, lo, out_dtype)
    return x.new_empty((x.shape[0], hi.shape[0]), dtype=out_dtype)


# -- autograd: range sums are linear in x ------------------------------------------------------------
# ∂out[b, k] / ∂(w_j x[b, src_j]) = [j < hi_k] − [j < lo_k] (a one-entry range is the same linear
# map): the gradient of position j is the sum of the output gradients of the ranges that cover it,
# a suffix sum of the gradients dropped at each hi (and removed at each lo).

def _setup_context(ctx, inputs, output):
    x, src, weight, hi, lo, _ = inputs
    ctx.save_for_backward(src, weight, hi, lo)
    ctx.x_shape, ctx.x_dtype = tuple(x.shape), x.dtype


def _backward(ctx, grad):
    src, weight, hi, lo = ctx.saved_tensors
    b, m = ctx.x_shape
    g = grad.to(torch.float64)
    drop = g.new_zeros((b, src.shape[0] + 1))
    drop.index_add_(1, hi, g)
    if lo is not None:
        drop.index_add_(1, lo, -g)
    covered = drop.flip(1).cumsum(1).flip(1)[:, 1:]  # Σ_{i > j} drop[i], for every position j
    if weight is not None:
        covered = covered * weight
    gx = g.new_zeros((b, m)).index_add_(1, src, covered).to(ctx.x_dtype)
    return gx, None, None, None, None, None


from .native import gathered_prefix_native  # noqa: E402  (it imports check, defined above)

register("gathered_prefix", SCHEMA, gathered_prefix_torch, _fake, check, __name__ + ".triton",
         autograd=(_backward, _setup_context), native=gathered_prefix_native)
