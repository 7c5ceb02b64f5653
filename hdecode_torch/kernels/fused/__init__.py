"""Fused row kernels: gathered float64 prefix sums, a fused ranked-threshold decision, a row check,
the exact hF_β solver over packed candidates and a fused root-path-score decoder.

Five torch ops in the ``hdecode`` namespace, batch-major (rows are samples; every scan runs along
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

Two decoders are built on it.  ``path_score_best`` chains two range sums: node probabilities p(n),
``v(a) = alpha[a]·p(parent(a)) + beta[a]·p(a)``, the root-path sum ``S(n)`` of v through the Euler
tour, and ``score(n) = gamma[n]·S(n) + delta[n]·p(n)``, then picks the best allowed node: the
structural decoders of Zhao's similarity and of the LCA height (Karthik et al.'s CRM).
``hf_beta_best_k`` is the exact per-sample hF_β solver over packed candidates (Plaud et al. 2025,
§4.2): for every set size k the sum V(k) of the k largest ``Δ_k(c) = Σ_e q[c, e] / (r·k + (1−r)(d_e+1))``,
and the smallest k maximising it.

Only ``gathered_prefix`` has an autograd formula: the others serve decoding and checks, not training.

Ops (schemas as registered)::

    hdecode::gathered_prefix(Tensor x, Tensor src, Tensor? weight, Tensor hi, Tensor? lo,
                             ScalarType out_dtype) -> Tensor
    hdecode::best_ranked_above(Tensor x, Tensor src, Tensor hi, Tensor? lo, Tensor rank,
                               float threshold, int fallback) -> Tensor
    hdecode::row_sum_min(Tensor x) -> Tensor
    hdecode::hf_beta_best_k(Tensor q, Tensor count, Tensor depths, float r) -> (Tensor, Tensor)
    hdecode::path_score_best(Tensor x, Tensor src, Tensor hi, Tensor lo, Tensor parent, Tensor alpha,
                             Tensor beta, Tensor euler_src, Tensor sign, Tensor at, Tensor gamma,
                             Tensor delta, Tensor allowed, Tensor rank, bool higher_is_better) -> Tensor
"""

from __future__ import annotations

import torch

from ._ops import SCHEMAS, set_triton_enabled, triton_available, triton_enabled
from .reference import trust_indices

__all__ = ["gathered_prefix", "best_ranked_above", "row_sum_min", "hf_beta_best_k", "path_score_best",
           "triton_available", "triton_enabled", "set_triton_enabled", "SCHEMAS", "trust_indices"]


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


def hf_beta_best_k(q: torch.Tensor, count: torch.Tensor, depths: torch.Tensor,
                   r: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact hF_β solver of each row's packed candidates (``hdecode::hf_beta_best_k``).

    With ``w_e(k) = 1/(r·k + (1−r)(depths[e]+1))`` (computed in q's dtype), ``Δ_k(c) = Σ_e q[b, c, e]·w_e(k)``
    and ``V(k)`` the sum of the k largest ``Δ_k`` over the row's ``count[b]`` real candidates, returns
    the smallest k in ``1..count[b]`` maximising V(k), and Δ at that k of every column.  For
    ancestor-closed candidate sets and masses ``q`` of each candidate per leaf depth, V(k) is the best
    expected hF_β of a set of size k (r = 1/(1+β²)); Plaud et al. 2025, §4.2.

    Args:
        q: (B, C, E) float32/float64, any strides: the masses of each row's candidates per leaf depth,
            real candidates in the first ``count[b]`` columns (the others are ignored).
        count: (B,) int64 in [0, C].
        depths: (E,) float64 the leaf depth of each column of q.
        r: float in (0, 1].
    Returns:
        ``(best_k, delta)``: (B,) int64 (1 for a row of count 0) and (B, C) q.dtype (padding columns
        finite, to be masked by the caller).  Deterministic.  The torch kernel sorts a (B, C, C) table
        of every Δ_k (O(B·C²·(E + log C)) work, no host read); the Triton kernel ranks candidates by
        pairwise comparison in registers (O(B·(C²·E + C³)), reads q once).
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device, ``r`` or count.
    """
    return torch.ops.hdecode.hf_beta_best_k(q, count, depths, float(r))


def path_score_best(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, parent: torch.Tensor,
                    alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor, sign: torch.Tensor,
                    at: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor, allowed: torch.Tensor,
                    rank: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """Node probabilities, a root-path sum and the best allowed node per row, fused
    (``hdecode::path_score_best``).

    In float64, for every node n (``C``, ``E`` exclusive prefix sums, as in :func:`gathered_prefix`)::

        p(n) = C[hi[n]] − C[lo[n]],              C over x[b, src[j]]       (node probabilities)
        v(n) = alpha[n]·p(parent[n]) + beta[n]·p(n)
        S(n) = E[at[n]],                          E over sign[t]·v(euler_src[t])  (root-path sum)
        score(n) = gamma[n]·S(n) + delta[n]·p(n)

    Returns the allowed node of best score, among exact ties the one of largest ``rank`` (then the
    smallest id).  With the leaf ranges and Euler tour of ``tree_ranges(h, "leaves")`` /
    ``tree_ranges(h, "path")`` this is the structural decoder of Zhao's similarity (alpha = 0,
    beta = I(n) − I(parent(n)), gamma = 2/(I(n) + log L), delta = 0, higher is better) and of the
    LCA height (alpha = height(parent(n)), beta = −alpha, gamma = 1, delta = height(n), lower is
    better, leaves allowed).

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides (leaf probabilities).
        src: (J,) int64 in [0, M); hi, lo: (N,) int64 in [0, J].
        parent: (N,) int64 in [0, N) (the root is its own parent).
        alpha, beta, gamma, delta: (N,) float64.
        euler_src: (T,) int64 in [0, N); sign: (T,) float64; at: (N,) int64 in [0, T].
        allowed: (N,) bool; rank: (N,) int64 (distinct values make the answer unique).
        higher_is_better: bool.
    Returns:
        (B,) int64 node ids.  A NaN score, or an infinitely bad one (−inf when higher is better,
        +inf when lower), is never chosen; -1 for a row with no node left (e.g. none allowed; a NaN
        input reaches the root's p and with it every root-path sum of its row).  Only these B
        integers are written.  O(B·(J + T + N)).
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device or index.
    """
    return torch.ops.hdecode.path_score_best(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta,
                                             allowed, rank, bool(higher_is_better))
