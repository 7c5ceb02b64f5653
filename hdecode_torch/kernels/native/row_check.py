"""Native CPU kernel of the probability rows' input check, ``hdecode::row_check`` (source: ``row_check.c`` beside
this file): per row a float64 sum and a minimum in one pass, no float64 copy of the rows, no temporaries.

Why: on the CPU the torch implementation is two reductions over the whole table (a float64 sum, then a minimum),
each a pass over memory, and at batch that pass costs about as much as a closed-form decision; at one row it is
two operators and two host reads.  The float64 sum is taken in a fixed order of its own (partial sums of every
fourth entry), so a row's verdict never depends on the batch; it agrees with torch's float64 sum to a few ulps of
the row's absolute sum, the agreement the op documents between its implementations.
"""

from __future__ import annotations

import ctypes

import torch

from . import applies, function

__all__ = ["row_check", "row_stats"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_I64, _PTR, _F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_ARGS = [_I64, _I64, _PTR, _I64, _I64, _F64, _F64, _PTR]
_STATS_ARGS = [_I64, _I64, _PTR, _I64, _I64, _PTR]


def row_check(x: torch.Tensor, lo: float, hi: float) -> torch.Tensor | None:
    """(B,) bool: row b of ``x`` passes iff no entry is below 0 and its float64 sum s (NaN if any entry is NaN)
    satisfies ``lo <= s <= hi``; None where the kernel does not apply (then the torch implementation runs).

    x: (B, M) float32/float64 CPU tensor, any strides; lo, hi: float bounds (not NaN, checked by the op).
    O(B·M), one read of every entry.
    """
    suffix = _SUFFIX.get(x.dtype)
    if suffix is None or x.dim() != 2 or not applies(x):
        return None
    rows, cols = x.shape
    out = torch.empty(rows, dtype=torch.bool)
    if rows:
        if lo > hi:
            return out.fill_(False)
        function(f"hd_row_check_{suffix}", None, _ARGS)(rows, cols, x.data_ptr(), x.stride(0), x.stride(1),
                                                        lo, hi, out.data_ptr())
    return out


def row_stats(x: torch.Tensor) -> torch.Tensor | None:
    """(3,) float64 ``(smallest row sum, largest row sum, min(0, smallest entry))`` of ``x``, each row's sum the
    float64 sum of :func:`row_check` (both sums NaN if any row's is: a NaN entry, or infinite entries of both
    signs); None where the kernel does not apply.  The statistics of the input check, judged on the host:
    every row sums to within tol of 1 iff both extremes do.

    x: (B, M) float32/float64 CPU tensor, B >= 1, any strides.  O(B·M), one read of every entry.
    """
    suffix = _SUFFIX.get(x.dtype)
    if suffix is None or x.dim() != 2 or not x.shape[0] or not applies(x):
        return None
    out = torch.empty(3, dtype=torch.float64)
    function(f"hd_row_stats_{suffix}", None, _STATS_ARGS)(x.shape[0], x.shape[1], x.data_ptr(), x.stride(0),
                                                           x.stride(1), out.data_ptr())
    return out
