"""Native CPU kernels of hF_β's candidate listing and per-leaf-depth masses (source: ``hf_beta.c`` beside this file).

Both do comparisons, copies and one float64 subtraction an entry, rounded once: the torch path's pairs, values
and masses bit for bit (:func:`~hdecode_torch.kernels.candidates.candidate_pairs` of the mask ``p >= bound``
with the root kept, and :func:`~hdecode_torch.kernels.depth_ranges.depth_masses`).  Each returns None where it
does not apply (native kernels off or unavailable, a tensor that must be seen by torch operators, a dtype or
layout they do not take); the caller then runs the torch path.  Why: at one row the torch path is some twenty
small operators, each costing more than its work; at batch it writes an (N, B) mask, reorders and transposes it.
"""

from __future__ import annotations

import ctypes

import torch

from . import applies, function
from .budget import fits, hf_beta_rows_scratch

__all__ = ["kept_pairs", "pair_masses", "decide_rows"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_PAIRS_ARGS = [_I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR, _PTR]
_MASSES_ARGS = [_I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _PTR, _PTR]


def kept_pairs(p: torch.Tensor, bound: torch.Tensor, order: torch.Tensor, root: int):
    """The (sample, node) pairs with ``p[node, sample] >= bound[node]`` or ``node == root``, or None where the
    kernel does not apply.

    p: (N, B) float32/float64 CPU node-major values, any strides; bound: (N,) or (N, 1) in p's dtype; order:
    (N,) int64 the node ids in (depth, id) order (a tree's cached table, not checked); root: the root's id.
    Returns ``(sample, node, value)``, (M,) int64, int64 and p's dtype: sample-major, each sample's nodes in
    ``order``, the values p at the pairs.  Two passes over p (count, then fill), O(N·B), no (N, B) temporary.
    """
    suffix = _SUFFIX.get(p.dtype)
    if (suffix is None or p.dim() != 2 or bound.dtype != p.dtype or bound.numel() != p.shape[0]
            or order.dtype != torch.long or order.numel() != p.shape[0] or not applies(p)):
        return None
    n, bsz = p.shape
    bound, order = bound.reshape(-1).contiguous(), order.contiguous()
    offsets = torch.empty(bsz + 1, dtype=torch.long)
    f = function(f"hd_hf_beta_pairs_{suffix}", _I64, _PAIRS_ARGS)
    head = (n, bsz, p.data_ptr(), p.stride(0), p.stride(1), bound.data_ptr(), order.data_ptr(), root)
    m = f(*head, 0, offsets.data_ptr(), None, None, None)
    sample, node = torch.empty(m, dtype=torch.long), torch.empty(m, dtype=torch.long)
    value = torch.empty(m, dtype=p.dtype)
    if m:
        f(*head, 1, offsets.data_ptr(), sample.data_ptr(), node.data_ptr(), value.data_ptr())
    return sample, node, value


def pair_masses(prefix: torch.Tensor, ends: torch.Tensor | None, rows: torch.Tensor | None, ids: torch.Tensor,
                dtype: torch.dtype):
    """The masses ``prefix[hi, row] − prefix[lo, row]`` in float64, rounded once to ``dtype``, or None where the
    kernel does not apply.

    prefix: (L + 1, B) float64 prefix sums, any strides; ends: the (N + 1, 2E) int32 ``[hi | lo]`` table of
    :class:`~hdecode_torch.kernels.depth_ranges.DepthRanges` (None: not built, the kernel does not apply);
    rows, ids: (M,) int64 samples and node ids (``N``: padding, zero masses), in range (the callers build them);
    or ``rows`` None and ``ids`` (B, C): row b's C nodes.  Returns (M, E), or (B, C, E) for packed ids.
    O(M·E), no temporary.
    """
    suffix = _SUFFIX.get(dtype)
    if (suffix is None or ends is None or ends.dtype != torch.int32 or prefix.dtype != torch.float64
            or prefix.dim() != 2 or (rows is not None and rows.dtype != torch.long) or ids.dtype != torch.long
            or (rows is None and ids.dim() != 2) or not applies(prefix)):
        return None
    e = ends.shape[1] // 2
    m = ids.numel()
    out = torch.empty(*ids.shape, e, dtype=dtype) if rows is None else torch.empty(m, e, dtype=dtype)
    if m:
        ends, ids = ends.contiguous(), ids.reshape(-1).contiguous()
        per_row = 1
        if rows is None:
            per_row = out.shape[1]
        else:
            rows = rows.reshape(-1).contiguous()
        function(f"hd_hf_beta_masses_{suffix}", None, _MASSES_ARGS)(
            m, e, prefix.data_ptr(), prefix.stride(0), prefix.stride(1), ends.data_ptr(),
            None if rows is None else rows.data_ptr(), per_row, ids.data_ptr(), out.data_ptr())
    return out


_ROWS_ARGS = [_I64, _I64, _PTR, _PTR, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, ctypes.c_double, ctypes.c_double,
              ctypes.c_double, _I64, _I64, _PTR]


def decide_rows(sample: torch.Tensor, node: torch.Tensor, value: torch.Tensor, q: torch.Tensor, tau: torch.Tensor,
                root: int, depths: torch.Tensor, a: torch.Tensor, r: float, slack: float, wide: float, bsz: int,
                num_nodes: int, max_c: int, budget: int | None = None):
    """(B, N) bool hF_β decisions of every row from its listed pairs, or None where a row's second stage keeps more
    than ``max_c`` candidates or where the kernel's scratch is over ``budget`` bytes (default
    :func:`~hdecode_torch.get_memory_budget`; then the caller runs the torch path).

    sample, node, value: (M,) the pairs :func:`kept_pairs` lists (sample-major, (depth, id) order, every row's
    root among them); q: (M, E) their masses per leaf depth in value's dtype; tau: (N,) τ(n); depths, a: (E,) the
    leaf depths and (1 − r)(d_e + 1), all in value's dtype; r = 1/(1+β²); slack, wide: the two stages' rounding
    slacks.  The stages of :func:`~hdecode_torch.metrics.hf_beta.hf_beta_decode` per row (the fixed bound's pairs
    filtered by τ, a prefix set's value LB, the pairs above τ·LB), then every set size k of the second stage solved
    exactly (the k largest Δ_k, in float64 sums): O(M·E + C²·(E + log C)) a row for C candidates.  Scratch,
    shared by the rows: 64·N + 16·E + 8·E·(min(max_c, N) + 2) bytes (:func:`~.budget.hf_beta_rows_scratch`).
    """
    if not fits(hf_beta_rows_scratch(num_nodes, q.shape[1], max_c), budget):
        return None
    suffix = _SUFFIX[value.dtype]
    out = torch.zeros(bsz, num_nodes, dtype=torch.bool)
    if bsz == 0:
        return out
    q, tau, depths, a = q.contiguous(), tau.contiguous(), depths.contiguous(), a.contiguous()
    status = function(f"hd_hf_beta_rows_{suffix}", _I64, _ROWS_ARGS)(
        sample.numel(), q.shape[1], sample.data_ptr(), node.data_ptr(), value.data_ptr(), q.data_ptr(),
        tau.data_ptr(), root, depths.data_ptr(), a.data_ptr(), r, slack, wide, max_c, num_nodes, out.data_ptr())
    if status < 0:
        raise MemoryError("the native hF_beta decoder could not allocate its row buffers")
    return out if status == 0 else None
