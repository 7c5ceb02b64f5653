"""Plain-torch implementations of the fused ops, and the argument checks every implementation shares.

These are the reference semantics (see :mod:`hdecode_torch.kernels.fused`): the CPU kernels of the
``hdecode::`` ops, and the CUDA fallback when Triton is missing or a row does not fit one Triton
program.  Everything is accumulated in float64 by sequential scans along the last dimension, so the
same input gives the same bits on every call.
"""

from __future__ import annotations

import weakref

import torch

__all__ = [
    "gathered_prefix_torch", "best_ranked_above_torch", "row_sum_min_torch",
    "check_gathered_prefix_args", "check_best_ranked_above_args", "check_row_sum_min_args",
    "check_index_values", "check_bounds", "trust_indices",
    "hf_beta_best_k_torch", "hf_beta_weights", "check_hf_beta_best_k_args", "check_hf_beta_best_k_values",
    "path_score_best_torch", "check_path_score_best_args", "check_path_score_best_values",
]

FLOAT_INPUTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
OUT_DTYPES = (torch.float32, torch.float64)

#: Bytes of float64 temporaries (prefix sums and range sums) the torch path allocates at once; rows
#: are processed in chunks that fit.  Rows are independent, so the result does not depend on it.
CHUNK_BYTES = 1 << 23


def _check_float_tensor(x, name: str, shape: str = "(B, M)", dtypes=FLOAT_INPUTS,
                        dtype_names: str = "float16, bfloat16, float32 or float64") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a Tensor, but got {type(x).__name__}")
    dims = shape.count(",") + 1
    if x.dim() != dims:
        raise ValueError(f"Expected `{name}` to be a {dims}-D {shape} tensor, but got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise TypeError(f"Expected `{name}` to be {dtype_names}, but got {x.dtype}")


def _check_vector(t, name: str, dtype: torch.dtype, device: torch.device, size: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"Expected `{name}` to be a Tensor, but got {type(t).__name__}")
    if t.dim() != 1:
        raise ValueError(f"Expected `{name}` to be 1-D, but got shape {tuple(t.shape)}")
    if t.dtype != dtype:
        raise TypeError(f"Expected `{name}` to be {dtype}, but got {t.dtype}")
    if t.device != device:
        raise ValueError(f"Expected `{name}` on the device of `x` ({device}), but got {t.device}")
    if size is not None and t.shape[0] != size:
        raise ValueError(f"Expected `{name}` to have {size} entries, but got {t.shape[0]}")


def _check_ranges(x, src, weight, hi, lo) -> None:
    _check_float_tensor(x, "x")
    _check_vector(src, "src", torch.int64, x.device)
    if weight is not None:
        _check_vector(weight, "weight", torch.float64, x.device, src.shape[0])
    _check_vector(hi, "hi", torch.int64, x.device)
    if lo is not None:
        _check_vector(lo, "lo", torch.int64, x.device, hi.shape[0])


def check_gathered_prefix_args(x, src, weight, hi, lo, out_dtype) -> None:
    """Shapes, dtypes and devices of :func:`gathered_prefix_torch`'s arguments (no value is read)."""
    _check_ranges(x, src, weight, hi, lo)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"Expected `out_dtype` to be torch.float32 or torch.float64, but got {out_dtype}")


def check_best_ranked_above_args(x, src, hi, lo, rank) -> None:
    """Shapes, dtypes and devices of :func:`best_ranked_above_torch`'s arguments (no value is read)."""
    _check_ranges(x, src, None, hi, lo)
    _check_vector(rank, "rank", torch.int64, x.device, hi.shape[0])


def check_row_sum_min_args(x) -> None:
    """Shape and dtype of :func:`row_sum_min_torch`'s argument."""
    _check_float_tensor(x, "x")


#: Index tensors already checked against a bound, by id: (weak reference, version counter, bound).
#: The library passes the same cached tree tables on every call, so each is read once, not per call
#: (a read is a host sync); an in-place change bumps the version and triggers a new check.
_VERIFIED: dict[int, tuple] = {}


def _already_verified(t: torch.Tensor, top: int) -> bool:
    entry = _VERIFIED.get(id(t))
    try:
        return entry is not None and entry[0]() is t and entry[1] == t._version and entry[2] == top
    except RuntimeError:  # inference tensors have no version counter: always check them
        return False


def trust_indices(t: torch.Tensor, top: int) -> torch.Tensor:
    """Mark an index tensor built correct by construction (``0 <= t <= top``) as checked; returns it.

    For tables the library derives from a validated tree: their first use then needs no host read.
    """
    _remember(t, top)
    return t


def _remember(t: torch.Tensor, top: int) -> None:
    try:
        version = t._version
    except RuntimeError:
        return
    key = id(t)
    _VERIFIED[key] = (weakref.ref(t, lambda _, key=key: _VERIFIED.pop(key, None)), version, top)


def check_index_values(x, src, hi, lo) -> None:
    """Every index in range: ``0 <= src < M``, ``0 <= hi, lo <= J``.

    An index tensor that passed against the same bound and was not modified since is not read
    again.  On CPU a violation raises ValueError.  On CUDA the check is queued with ``torch._assert_async``
    (a device-side assert, like an out-of-range ``index_select`` on CUDA): no host sync, so the ops
    stay asynchronous and CUDA-graph capturable, and the failed assert stops the stream before the
    Triton kernel queued after it can read out of bounds.
    """
    m, j = x.shape[1], src.shape[0]
    checks = [(src, m - 1, "src", "M - 1 = x.shape[1] - 1"), (hi, j, "hi", "J = len(src)")]
    if lo is not None:
        checks.append((lo, j, "lo", "J = len(src)"))
    check_bounds(checks)


def check_bounds(checks, remember: bool = True, trusted_ok: bool = False) -> None:
    """``0 <= t <= top`` for every ``(t, top, name, what)`` of ``checks`` (see :func:`check_index_values`).

    ``remember=False`` for data tensors (e.g. per-batch counts) that are checked on every call, unless
    ``trusted_ok`` and their producer marked them with :func:`trust_indices`.
    """
    for t, top, name, what in checks:
        if t.numel() == 0:
            continue
        if t.device.type == "meta" or ((remember or trusted_ok) and _already_verified(t, top)):
            continue
        if t.device.type == "cuda":
            lo_v, hi_v = torch.aminmax(t)
            torch._assert_async((lo_v >= 0) & (hi_v <= top), f"`{name}` out of range [0, {what}]")
            continue
        lo_v, hi_v = (int(v) for v in torch.aminmax(t))
        if lo_v < 0 or hi_v > top:
            bad = lo_v if lo_v < 0 else hi_v
            raise ValueError(f"Expected every entry of `{name}` in [0, {what}] = [0, {top}], but got {bad}")
        if remember:
            _remember(t, top)


def _row_chunk(b: int, per_row: int) -> int:
    return max(1, min(b, CHUNK_BYTES // max(1, 8 * per_row)))


class _RangeSums:
    """Float64 range sums ``C[hi] - C[lo]`` of row chunks; the (rows, K) index matrices are built once."""

    def __init__(self, src, weight, hi, lo, rows: int):
        self.src, self.weight, self.rows = src, weight, rows
        self.src_rows = None
        # the prefix table is read by torch.gather with materialized indices: on the CPU, index_select
        # along dim 1 and stride-0 expanded indices both took over twice as long
        self.hi = hi.expand(rows, -1).contiguous()
        self.lo = None if lo is None else lo.expand(rows, -1).contiguous()

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float64:
            return x.index_select(1, self.src).to(torch.float64)
        # float64 columns: gather with materialized indices (index_select along dim 1 took about 3x as
        # long on the CPU; for float32 it is the faster of the two)
        if self.src_rows is None:
            self.src_rows = self.src.expand(self.rows, -1).contiguous()
        return torch.gather(x, 1, self.src_rows[: x.shape[0]])

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x: (b, M) rows, b <= rows.  Returns (b, K) float64 ``C[hi] - C[lo]`` (in ``out`` if given)."""
        b = x.shape[0]
        g = self._gather(x)
        if self.weight is not None:
            g.mul_(self.weight)
        c = g.new_empty((b, g.shape[1] + 1))
        c[:, 0] = 0  # only the first column needs zeros: the scan writes the others
        torch.cumsum(g, dim=1, out=c[:, 1:])
        v = torch.gather(c, 1, self.hi[:b], out=out)
        if self.lo is not None:
            v.sub_(torch.gather(c, 1, self.lo[:b]))
        return v


def gathered_prefix_torch(x: torch.Tensor, src: torch.Tensor, weight: torch.Tensor | None, hi: torch.Tensor,
                          lo: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """Range sums of a gathered, weighted float64 prefix; the torch kernel of ``hdecode::gathered_prefix``.

    x: (B, M) float, any strides; src: (J,) int64 in [0, M); weight: (J,) float64 or None (ones);
    hi: (K,) int64 in [0, J]; lo: (K,) int64 in [0, J] or None (zeros); out_dtype float32/float64.
    Returns (B, K) ``out_dtype``: ``out[b, k] = C_b[hi[k]] - C_b[lo[k]]`` with
    ``C_b[j] = Σ_{i<j} weight[i]·x[b, src[i]]`` accumulated left to right in float64.
    O(B·(J + K)) work, rows in chunks of about ``CHUNK_BYTES`` of temporaries.
    """
    check_gathered_prefix_args(x, src, weight, hi, lo, out_dtype)
    check_index_values(x, src, hi, lo)
    b, k = x.shape[0], hi.shape[0]
    out = x.new_empty((b, k), dtype=out_dtype)
    if b == 0 or k == 0:
        return out
    step = _row_chunk(b, 3 * src.shape[0] + 1 + 4 * k)
    sums = _RangeSums(src, weight, hi, lo, step)
    for r in range(0, b, step):
        if out_dtype == torch.float64:
            sums(x[r:r + step], out=out[r:r + step])
        else:
            out[r:r + step] = sums(x[r:r + step])
    return out


def best_ranked_above_torch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                            rank: torch.Tensor, threshold: float, fallback: int) -> torch.Tensor:
    """Per row, the range of largest rank whose float64 sum exceeds ``threshold``; the torch kernel of
    ``hdecode::best_ranked_above``.

    x, src, hi, lo as in :func:`gathered_prefix_torch` (no weight); rank: (K,) int64.
    Returns (B,) int64: ``argmax_{k : v[b,k] > threshold} rank[k]`` with ``v`` the float64 range
    sums, the smallest such k if ranks tie, ``fallback`` where no k passes.  O(B·(J + K)).
    """
    check_best_ranked_above_args(x, src, hi, lo, rank)
    check_index_values(x, src, hi, lo)
    b, k = x.shape[0], hi.shape[0]
    out = torch.full((b,), int(fallback), dtype=torch.int64, device=x.device)
    if b == 0 or k == 0:
        return out
    # distinct dense ranks 0..K-1 that keep the order of `rank` and, among equal ranks, put the
    # smallest k highest: the first maximum of where(v > threshold, dense, -1) is then the answer
    order = torch.argsort(rank.flip(0), stable=True)
    dense = torch.empty_like(rank)
    dense[k - 1 - order] = torch.arange(k, device=rank.device)
    step = _row_chunk(b, 3 * src.shape[0] + 1 + 5 * k)
    sums = _RangeSums(src, None, hi, lo, step)
    for r in range(0, b, step):
        key = torch.where(sums(x[r:r + step]) > threshold, dense, -1)
        best = key.argmax(dim=1, keepdim=True)
        out[r:r + step] = torch.where(key.gather(1, best) >= 0, best, out[r:r + step, None]).squeeze(1)
    return out


def row_sum_min_torch(x: torch.Tensor) -> torch.Tensor:
    """Per-row float64 sum and minimum; the torch kernel of ``hdecode::row_sum_min``.

    x: (B, M) float.  Returns (B, 2) float64 ``[Σ_m x[b, m], min_m x[b, m]]``; a row holding NaN
    gives NaN in both, an empty row gives ``[0, +inf]``.  O(B·M): two reductions over ``x``.
    """
    check_row_sum_min_args(x)
    total = x.sum(dim=1, dtype=torch.float64)
    if x.shape[1] == 0:
        low = torch.full_like(total, float("inf"))
    else:
        low = x.amin(dim=1).to(torch.float64)  # amin propagates NaN; the cast is exact
    return torch.stack([total, low], dim=1)


# -- hdecode::hf_beta_best_k ------------------------------------------------------------------------

#: Bytes of the (B, k, C) table of Δ_k built at once by :func:`hf_beta_best_k_torch` (larger batches
#: loop over blocks of k).  The same block as the metric's own exact solver, so that the two give
#: the same bits.
EXACT_BLOCK_BYTES = 2**30

_SOLVER_DTYPES = (torch.float32, torch.float64)


def check_hf_beta_best_k_args(q, count, depths, r) -> None:
    """Shapes, dtypes and devices of :func:`hf_beta_best_k_torch`'s arguments, and ``0 < r <= 1``
    (no tensor value is read)."""
    _check_float_tensor(q, "q", "(B, C, E)", _SOLVER_DTYPES, "float32 or float64")
    _check_vector(count, "count", torch.int64, q.device, q.shape[0])
    _check_vector(depths, "depths", torch.float64, q.device, q.shape[2])
    if not isinstance(r, float) or not 0.0 < r <= 1.0:
        raise ValueError(f"Expected `r` to be a float in (0, 1] (r = 1/(1+beta^2)), but got {r!r}")


def check_hf_beta_best_k_values(q, count) -> None:
    """Every ``count`` in [0, C]: read unless the caller built it in range and said so (``trust_indices``)."""
    check_bounds([(count, q.shape[1], "count", "C = q.shape[1]")], remember=False, trusted_ok=True)


def hf_beta_weights(k: torch.Tensor, depths: torch.Tensor, r: float, dtype: torch.dtype) -> torch.Tensor:
    """(*k.shape, E) ``w_e(k) = 1/(r·k + (1−r)(depths_e+1))`` computed in ``dtype``.

    The operation order of the hF_β solver's own weights, so that both round alike.
    """
    a = (1 - r) * (depths.to(dtype) + 1)
    return 1 / (r * k.to(dtype)[..., None] + a)


def hf_beta_best_k_torch(q: torch.Tensor, count: torch.Tensor, depths: torch.Tensor, r: float):
    """The exact hF_β solver over packed candidates; the torch kernel of ``hdecode::hf_beta_best_k``.

    q: (B, C, E) float32/float64 per-leaf-depth masses of each row's candidates, the first
    ``count[b]`` columns real (padding columns are ignored); count: (B,) int64 in [0, C];
    depths: (E,) float64 the leaf depths; r = 1/(1+β²) in (0, 1].  With ``w_e(k)`` from
    :func:`hf_beta_weights` (in q's dtype), ``Δ_k(c) = Σ_e q[b, c, e]·w_e(k)`` and ``V(k)`` the sum of
    the k largest Δ_k over the real candidates, returns ``(best_k, delta)``: (B,) int64 the
    smallest k in 1..count maximising V(k) (1 where count = 0) and (B, C) q.dtype
    ``Δ_{best_k}(c)`` of every column (padding columns finite).

    Every Δ_k of every candidate for every k, sorted and summed: O(B·C²·(E + log C)) work and a
    (B, C, C) table (in blocks of about ``EXACT_BLOCK_BYTES``), no host read.  Deterministic.
    """
    check_hf_beta_best_k_args(q, count, depths, r)
    check_hf_beta_best_k_values(q, count)
    bsz, c, _ = q.shape
    if c == 0:
        return torch.ones(bsz, dtype=torch.int64, device=q.device), q.new_empty((bsz, 0))
    ks = torch.arange(1, c + 1, device=q.device)
    w = hf_beta_weights(ks, depths, r, q.dtype)  # (C, E)
    # -inf: padding never enters the k largest of a row of count >= k
    pad = (ks[None, :] > count[:, None])[:, None, :]
    block = max(1, EXACT_BLOCK_BYTES // max(1, 8 * bsz * c))
    values = []
    for start in range(0, c, block):  # one block unless the batch is very large
        dk = torch.einsum("bce,ke->bkc", q, w[start:start + block]).masked_fill(pad, float("-inf"))
        top = torch.sort(dk, dim=2, descending=True).values.cumsum(2)  # (B, k, C) sums of the j best
        kk = ks[start:start + block]
        values.append(top.gather(2, (kk - 1)[None, :, None].expand(bsz, -1, 1))[:, :, 0])
    v = torch.cat(values, 1) if len(values) > 1 else values[0]
    v = torch.where(ks[None, :] <= count[:, None], v, torch.full_like(v, -1.0))
    best_k = v.argmax(1) + 1  # first maximum: the smallest k
    delta = (q * hf_beta_weights(best_k, depths, r, q.dtype)[:, None, :]).sum(2)
    return best_k, delta


# -- hdecode::path_score_best ---------------------------------------------------------------------

def check_path_score_best_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed,
                               rank) -> None:
    """Shapes, dtypes and devices of :func:`path_score_best_torch`'s arguments (no value is read)."""
    _check_ranges(x, src, None, hi, lo)
    if lo is None:
        raise TypeError("Expected `lo` to be a Tensor, but got None")
    n, dev = hi.shape[0], x.device
    _check_vector(parent, "parent", torch.int64, dev, n)
    for t, name in [(alpha, "alpha"), (beta, "beta"), (gamma, "gamma"), (delta, "delta")]:
        _check_vector(t, name, torch.float64, dev, n)
    _check_vector(euler_src, "euler_src", torch.int64, dev)
    _check_vector(sign, "sign", torch.float64, dev, euler_src.shape[0])
    _check_vector(at, "at", torch.int64, dev, n)
    _check_vector(allowed, "allowed", torch.bool, dev, n)
    _check_vector(rank, "rank", torch.int64, dev, n)


def check_path_score_best_values(x, src, hi, lo, parent, euler_src, at) -> None:
    """Every index in range (each index tensor read once, like :func:`check_index_values`)."""
    n = hi.shape[0]
    check_index_values(x, src, hi, lo)
    check_bounds([(parent, n - 1, "parent", "N - 1 = len(hi) - 1"), (euler_src, n - 1, "euler_src", "N - 1 = len(hi) - 1"),
                  (at, euler_src.shape[0], "at", "len(euler_src)")])


def path_score_best_torch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor,
                          parent: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor,
                          sign: torch.Tensor, at: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor,
                          allowed: torch.Tensor, rank: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """Node sums, a root-path sum and the best node per row; the torch kernel of ``hdecode::path_score_best``.

    x: (B, M) float, any strides; src: (J,) int64 in [0, M); hi, lo: (N,) int64 in [0, J];
    parent: (N,) int64 in [0, N) (the root its own parent); alpha, beta, gamma, delta: (N,) float64;
    euler_src: (T,) int64 in [0, N); sign: (T,) float64; at: (N,) int64 in [0, T]; allowed: (N,) bool;
    rank: (N,) int64.  In float64, with ``C`` the exclusive prefix sums::

        p(n) = C[hi[n]] − C[lo[n]],               C[j+1] = C[j] + x[b, src[j]]
        v(n) = alpha[n]·p(parent[n]) + beta[n]·p(n)
        S(n) = E[at[n]],                           E[t+1] = E[t] + sign[t]·v(euler_src[t])
        score(n) = gamma[n]·S(n) + delta[n]·p(n)

    Returns (B,) int64: the allowed n of largest score (``higher_is_better``) or smallest, among exact
    ties the largest ``rank[n]``, then the smallest n.  A NaN score, or an infinitely bad one (−inf
    when higher is better, +inf when lower), is never chosen; -1 where no node is left.
    O(B·(J + T + N)), rows in chunks of about ``CHUNK_BYTES`` of temporaries.

    The nodes are processed in preference order (rank descending, then id) so that the first best
    column of a row is the answer: one max, no tie pass.  Reordering the columns changes no value.
    """
    check_path_score_best_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed,
                               rank)
    check_path_score_best_values(x, src, hi, lo, parent, euler_src, at)
    b, n = x.shape[0], hi.shape[0]
    out = torch.full((b,), -1, dtype=torch.int64, device=x.device)
    if b == 0 or n == 0:
        return out
    order = torch.sort(rank, descending=True, stable=True).indices  # stable: smaller ids first among ties
    pos = torch.empty_like(order)
    pos[order] = torch.arange(n, device=order.device)
    alpha, beta, gamma, delta = (t.index_select(0, order) for t in (alpha, beta, gamma, delta))
    excluded = ~allowed.index_select(0, order)
    step = _row_chunk(b, 3 * src.shape[0] + 3 * euler_src.shape[0] + 12 * n)
    node_sums = _RangeSums(src, None, hi.index_select(0, order), lo.index_select(0, order), step)
    path_sums = _RangeSums(pos.index_select(0, euler_src), sign, at.index_select(0, order), None, step)
    parent_pos = pos.index_select(0, parent.index_select(0, order)).expand(step, -1).contiguous()
    worst = float("-inf") if higher_is_better else float("inf")
    for r in range(0, b, step):
        p = node_sums(x[r:r + step])
        v = alpha * torch.gather(p, 1, parent_pos[: p.shape[0]]) + beta * p
        score = gamma * path_sums(v) + delta * p
        score.nan_to_num_(nan=worst, posinf=float("inf"), neginf=float("-inf")).masked_fill_(excluded, worst)
        best, first = score.max(1) if higher_is_better else score.min(1)  # the first best column
        out[r:r + step] = torch.where(best != worst, order.index_select(0, first), -1)
    return out
    step = _row_chunk(b, 2 * src.shape[0] + 2 * euler_src.shape[0] + 12 * n)
    node_sums = _RangeSums(src, None, hi, lo, step)
    path_sums = _RangeSums(euler_src, sign, at, None, step)
    for r in range(0, b, step):
        p = node_sums(x[r:r + step])
        v = alpha * p.index_select(1, parent) + beta * p
        score = gamma * path_sums(v) + delta * p
        out[r:r + step] = _best_allowed(score, allowed, rank, higher_is_better)
    return out
