"""Fused row kernels: gathered float64 prefix sums, a fused ranked-threshold decision, a row check.

Three torch ops in the ``hdecode`` namespace, batch-major (rows are samples; every scan runs along
the last, contiguous dimension), each with a plain-torch kernel (CPU, and CUDA when Triton is
missing or a row is too long) and a Triton kernel on CUDA (one program per row: the row's prefix
sums stay in registers and only the results are written).  Importing this package registers the
ops; it does not import Triton, ``torch._dynamo`` or ``torch._inductor`` (Triton is imported on
the first CUDA call).  Everything is deterministic: no atomics, fixed summation orders.

The one primitive is a range sum over a gathered, weighted prefix.  For a row ``x_b`` (M values),
``src`` (J indices), ``weight`` (J) and ranges ``[lo[k], hi[k])``::

    C_b[0] = 0,  C_b[j+1] = C_b[j] + weight[j]·x_b[src[j]]      (float64)
    out[b, k] = C_b[hi[k]] - C_b[lo[k]]

With the right index arrays (built once per tree) this is, for a tree with N nodes and L leaves:

- node probabilities ``p(n) = Σ_{leaves l under n} p(l)``: ``src`` = the leaves in depth-first
  order, ``[lo[n], hi[n])`` = the leaves of n in that order (x = leaf probabilities, K = N);
- masses per (node, leaf depth): ``src`` = leaves sorted by (depth, depth-first position), one
  range per pair (K = N·E for E leaf depths);
- weighted sums ``Σ_{l under n} w(l)·p(l)``, e.g. ``w = 1/(d(l)+1)``, through ``weight``;
- subtree sums of node values: ``src`` = the preorder, ranges = subtrees (x = node values);
- root-path sums ``S(n) = Σ_{a ancestor of n, n included} v(a)`` through an Euler tour: ``src``
  = the 2N tour entries (each node on entry with weight +1 and on exit with weight -1),
  ``lo = None``, ``hi[n]`` = entry position of n + 1.

The cost is O(B·(J + K)) with one read of x (no (B, N) intermediate for the decision op).
The ops have no autograd formula: they serve decoding and checks, not training.

Ops (schemas as registered)::

    hdecode::gathered_prefix(Tensor x, Tensor src, Tensor? weight, Tensor hi, Tensor? lo,
                             ScalarType out_dtype) -> Tensor
    hdecode::best_ranked_above(Tensor x, Tensor src, Tensor hi, Tensor? lo, Tensor rank,
                               float threshold, int fallback) -> Tensor
    hdecode::row_sum_min(Tensor x) -> Tensor
"""

from __future__ import annotations

import torch

from ._ops import SCHEMAS, set_triton_enabled, triton_available, triton_enabled

__all__ = ["gathered_prefix", "best_ranked_above", "row_sum_min", "triton_available", "triton_enabled",
           "set_triton_enabled", "SCHEMAS"]


def gathered_prefix(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                    lo: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Range sums of a gathered, weighted prefix accumulated in float64 (``hdecode::gathered_prefix``).

    ``C_b[0] = 0``, ``C_b[j+1] = C_b[j] + weight[j]·x[b, src[j]]`` in float64 whatever the input
    dtype; ``out[b, k] = C_b[hi[k]] - C_b[lo[k]]`` cast to ``out_dtype``.

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides.
        src: (J,) int64 in [0, M), on x's device.
        weight: (J,) float64, or None for all ones.
        hi: (K,) int64 in [0, J].
        lo: (K,) int64 in [0, J], or None for all zeros.
        out_dtype: torch.float32 or torch.float64.
    Returns:
        (B, K) ``out_dtype``.  Deterministic (same bits on every call).  O(B·(J + K)).
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device or index.
    """
    return torch.ops.hdecode.gathered_prefix(x, src, weight, hi, lo, out_dtype)


def best_ranked_above(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                      rank: torch.Tensor, threshold: float, fallback: int) -> torch.Tensor:
    """Per row, the range of largest rank whose float64 sum exceeds a threshold (``hdecode::best_ranked_above``).

    With ``v[b, k]`` the float64 range sums of :func:`gathered_prefix` (no weight), returns
    ``argmax_{k : v[b, k] > threshold} rank[k]``, the smallest such k if ranks tie, and ``fallback``
    where no k passes.  Comparisons are made on the float64 sums.  With node ranges and
    ``rank = depth·N + (N - 1 - id)`` this is the deepest node with p(n) > threshold, smallest id
    among equal depths: the tree-distance decoder at threshold 1/2, or (1 + c)/2 with a depth
    penalty c; another rank gives e.g. the most informative node above τ.

    Args:
        x, src, hi, lo: as in :func:`gathered_prefix`.
        rank: (K,) int64 (distinct values make the answer unique).
        threshold: float.
        fallback: int returned where no range passes.
    Returns:
        (B,) int64; only these B integers are written.  O(B·(J + K)).
    """
    return torch.ops.hdecode.best_ranked_above(x, src, hi, lo, rank, float(threshold), int(fallback))


def row_sum_min(x: torch.Tensor) -> torch.Tensor:
    """Per-row float64 sum and minimum in one pass (``hdecode::row_sum_min``), the input check's reduction.

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides.
    Returns:
        (B, 2) float64: ``[:, 0]`` the sum, ``[:, 1]`` the minimum.  A row holding NaN gives NaN in
        both; +inf gives a +inf sum; an empty row gives ``[0, +inf]``.  O(B·M).
    """
    return torch.ops.hdecode.row_sum_min(x)
