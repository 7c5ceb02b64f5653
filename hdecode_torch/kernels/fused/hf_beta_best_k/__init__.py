"""``hdecode::hf_beta_best_k``: the exact hF_β solver of each row's packed candidates."""

from __future__ import annotations

import torch

from .._checks import check_bounds, check_float_tensor, check_vector
from .._registry import call, register

__all__ = ["hf_beta_best_k", "hf_beta_best_k_torch", "hf_beta_weights", "sort_block", "SORT_BLOCK_ENTRIES", "SCHEMA"]

SCHEMA = "hf_beta_best_k(Tensor q, Tensor count, Tensor depths, float r) -> (Tensor, Tensor)"

_SOLVER_DTYPES = (torch.float32, torch.float64)


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
        finite, to be masked by the caller).  Deterministic, any C.  The torch implementation computes a
        (B, C, C) table of every Δ_k at once and sorts it in blocks of k of at most
        ``SORT_BLOCK_ENTRIES`` entries per row (O(B·C²·(E + log C)) work, no host read, one block up to
        C = 512; callers bound B·C²); the Triton kernel ranks candidates by pairwise comparison in tiles of registers
        (O(B·(C²·E + C³)), reads q, no other memory).
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device, ``r`` or count.
    """
    return call("hf_beta_best_k", q, count, depths, float(r))


def check_args(q, count, depths, r) -> None:
    """Shapes, dtypes and devices of the arguments, and ``0 < r <= 1`` (no tensor value is read)."""
    check_float_tensor(q, "q", "(B, C, E)", _SOLVER_DTYPES, "float32 or float64")
    check_vector(count, "count", torch.int64, q.device, q.shape[0])
    check_vector(depths, "depths", torch.float64, q.device, q.shape[2])
    if not isinstance(r, float) or not 0.0 < r <= 1.0:
        raise ValueError(f"Expected `r` to be a float in (0, 1] (r = 1/(1+beta^2)), but got {r!r}")


def check(q, count, depths, r) -> None:
    """:func:`check_args`, and every ``count`` in [0, C]: read unless the caller built it in range
    and said so (``trust_indices``)."""
    check_args(q, count, depths, r)
    check_bounds([(count, q.shape[1], "count", "C = q.shape[1]")], remember=False, trusted_ok=True)


#: Entries of one block of the torch implementation's sorted (k, C) tables per row: one block up to
#: C = 512 candidates; beyond, the (B, C, C) sort values and indices would be several times the
#: (B, C, C) product itself (deep caterpillars pack thousands of candidates).
SORT_BLOCK_ENTRIES = 1 << 18


def sort_block(c: int) -> int:
    """Values of k whose Δ_k rows the torch implementation sorts at once, for C = ``c`` candidates."""
    return max(1, min(c, SORT_BLOCK_ENTRIES // max(c, 1)))


def hf_beta_weights(k: torch.Tensor, depths: torch.Tensor, r: float, dtype: torch.dtype) -> torch.Tensor:
    """(*k.shape, E) ``w_e(k) = 1/(r·k + (1−r)(depths_e+1))`` computed in ``dtype``.

    The operation order of the hF_β solver's own weights, so that both round alike.
    """
    a = (1 - r) * (depths.to(dtype) + 1)
    return (r * k.to(dtype)[..., None] + a).reciprocal_()  # the bits of 1 / x (x.reciprocal() * 1), one operator fewer


def hf_beta_best_k_torch(q: torch.Tensor, count: torch.Tensor, depths: torch.Tensor, r: float):
    """The torch implementation of :func:`hf_beta_best_k` (every device): every Δ_k of every candidate
    for every k, sorted and summed, all rows at once."""
    check(q, count, depths, r)
    bsz, c, _ = q.shape
    if c == 0:
        return torch.ones(bsz, dtype=torch.int64, device=q.device), q.new_empty((bsz, 0))
    ks = torch.arange(1, c + 1, device=q.device)
    # -inf: padding never enters the k largest of a row of count >= k
    pad = ks > count[:, None]
    # One product for every k: BLAS rounds a block of k differently from the whole (its kernels follow
    # the shape), so only the sorts, which hold the most memory, go by blocks of k.  The weights of every
    # k, computed once: Δ at the best k reads its row.
    w = hf_beta_weights(ks, depths, r, q.dtype)  # (C, E)
    dk = torch.einsum("bce,ke->bkc", q, w).masked_fill_(pad[:, None, :], float("-inf"))
    kb = sort_block(c)
    if kb >= c:
        top = torch.sort(dk, dim=2, descending=True).values.cumsum_(2)  # (B, k, C) sums of the j best
        v = top.diagonal(dim1=1, dim2=2)  # V(k): the k best of Δ_k
    else:
        v = q.new_empty((bsz, c))
        for k0 in range(0, c, kb):
            top = torch.sort(dk[:, k0:k0 + kb], dim=2, descending=True).values.cumsum_(2)
            v[:, k0:k0 + kb] = top.diagonal(offset=k0, dim1=1, dim2=2)  # the k best of Δ_k, k = k0+1, ...
        del top
    del dk
    at = v.masked_fill(pad, -1.0).argmax(1)  # first maximum: the smallest k
    delta = (q * w.index_select(0, at)[:, None, :]).sum(2)
    return at + 1, delta


def _fake(q, count, depths, r):
    check_args(q, count, depths, r)
    return q.new_empty((q.shape[0],), dtype=torch.int64), q.new_empty((q.shape[0], q.shape[1]))


register("hf_beta_best_k", SCHEMA, hf_beta_best_k_torch, _fake, check, __name__ + ".triton")
