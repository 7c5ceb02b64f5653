"""``hdecode::wu_palmer_best``: Wu-Palmer's structural decoder in one op, one leaf depth at a time."""

from __future__ import annotations

import torch

from .._checks import check_bounds, check_float_tensor, check_index_values, check_ranges, check_vector, derived
from .._registry import call, register
from .._node_sums import prefix_table
from ..gathered_prefix import _endpoints

__all__ = ["wu_palmer_best", "wu_palmer_best_torch", "SCHEMA"]

SCHEMA = ("wu_palmer_best(Tensor x, Tensor src, Tensor hi, Tensor lo, Tensor depth, Tensor leaf_depths, "
          "Tensor euler_src, Tensor sign, Tensor at, Tensor rank) -> Tensor")


def wu_palmer_best(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, depth: torch.Tensor,
                   leaf_depths: torch.Tensor, euler_src: torch.Tensor, sign: torch.Tensor, at: torch.Tensor,
                   rank: torch.Tensor) -> torch.Tensor:
    """The node of largest ``Σ_e 2 S_e(n) / (d(n) + e)`` per row (``hdecode::wu_palmer_best``).

    For each of the E leaf depths ``e = leaf_depths[i]``, in that order, with N = ``len(depth)``
    nodes, ``C`` the exclusive float64 prefix of ``x[b, src[j]]`` and ``t`` the compute dtype
    (float64 for a float64 ``x``, float32 otherwise)::

        Q_e(n) = t(C[hi[i·N + n]] − C[lo[i·N + n]])     (a one-entry range: that entry, exactly)
        S_e(n) = t(E[at[n]]),   E the float64 prefix of sign[k]·Q_e(euler_src[k])   (root-path sum)
        score(n) = Σ_e S_e(n) · w_e(n),   w_e(n) = t(2) / (t(depth[n]) + t(e)),   summed in t in order of e

    which is Wu-Palmer's expected similarity ``E[2 d(LCA(n, y)) / (d(n) + d(y))]`` when ``src`` orders
    the leaves by (depth, depth-first position), ``[lo, hi)`` are each node's leaves at each depth in
    that order and the Euler tour leaves the root out (``kernels.tree_sums.tree_ranges(h,
    "path_below_root")``): the values, rounded step by step as the unfused (N, E, B) table was.

    Returns the node of largest score per row, among exact ties the one of largest ``rank`` (then the
    smallest id); a NaN score is never chosen, -1 for a row where every score is NaN or −inf.  O(B·E·(N
    + T) + B·J) time; the torch implementation holds about (B, 2J + 7N) float64 at once, whatever E
    (callers bound B), and runs a fixed number of operators per leaf depth whatever B.

    Args:
        x: (B, M) float16/bfloat16/float32/float64, any strides (leaf probabilities).
        src: (J,) int64 in [0, M).
        hi, lo: (E·N,) int64 in [0, J], leaf depth major.
        depth: (N,) float64; leaf_depths: (E,) float64.
        euler_src: (T,) int64 in [0, N); sign: (T,) float64; at: (N,) int64 in [0, T].
        rank: (N,) int64 (distinct values make the answer unique).
    Returns:
        (B,) int64 node ids.
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device or index.
    """
    return call("wu_palmer_best", x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank)


def check_args(x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank) -> None:
    """Shapes, dtypes and devices of the arguments (no value is read)."""
    check_float_tensor(x, "x")
    dev = x.device
    check_vector(depth, "depth", torch.float64, dev)
    check_vector(leaf_depths, "leaf_depths", torch.float64, dev)
    n, e = depth.shape[0], leaf_depths.shape[0]
    check_vector(hi, "hi", torch.int64, dev, n * e)
    check_vector(lo, "lo", torch.int64, dev, n * e)
    check_ranges(x, src, None, hi, lo)
    check_vector(euler_src, "euler_src", torch.int64, dev)
    check_vector(sign, "sign", torch.float64, dev, euler_src.shape[0])
    check_vector(at, "at", torch.int64, dev, n)
    check_vector(rank, "rank", torch.int64, dev, n)


def check(x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank) -> None:
    """:func:`check_args` and every index in range (each index tensor read once)."""
    check_args(x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank)
    n = depth.shape[0]
    check_index_values(x, src, hi, lo)
    check_bounds([(euler_src, max(n - 1, 0), "euler_src", "N - 1 = len(depth) - 1"),
                  (at, euler_src.shape[0], "at", "len(euler_src)")])


def _order(rank):
    """The nodes in preference order (rank descending, then id): the first best column is the answer."""
    return derived("wu_palmer_order", (rank,), lambda: torch.sort(rank, descending=True, stable=True).indices)


def wu_palmer_best_torch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, depth: torch.Tensor,
                         leaf_depths: torch.Tensor, euler_src: torch.Tensor, sign: torch.Tensor, at: torch.Tensor,
                         rank: torch.Tensor) -> torch.Tensor:
    """The torch implementation of :func:`wu_palmer_best` (every device): all rows at once, a loop over
    the leaf depths."""
    check(x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank)
    b, n, j = x.shape[0], depth.shape[0], src.shape[0]
    if b == 0 or n == 0:
        return torch.full((b,), -1, dtype=torch.int64, device=x.device)
    t = torch.float64 if x.dtype == torch.float64 else torch.float32
    # the gathered entries and their exclusive prefix side by side, as gathered_prefix's table: every
    # mass, one-entry runs included, is one difference of two gathered entries
    table = prefix_table(x, src)
    hi2, lo2 = _endpoints(hi, lo, j)
    weight = torch.tensor(2.0, dtype=t, device=x.device) / (depth.to(t)[None, :] + leaf_depths.to(t)[:, None])  # (E, N)
    # the Euler tour's table, reused for every leaf depth: entries t(Q_e)·sign, scanned in place
    tour = x.new_empty((b, euler_src.shape[0] + 1), dtype=torch.float64)
    tour[:, 0] = 0
    steps = tour[:, 1:]
    at = at.expand(b, -1)
    score = None
    for i in range(leaf_depths.shape[0]):  # a loop over the leaf depths
        span = slice(i * n, (i + 1) * n)
        q = torch.gather(table, 1, hi2[span].expand(b, -1))
        q = q.sub_(torch.gather(table, 1, lo2[span].expand(b, -1))).to(t)
        if t == torch.float64:
            torch.index_select(q, 1, euler_src, out=steps)
        else:
            steps.copy_(q.index_select(1, euler_src))
        del q  # the masses are in the tour now: (B, N) less at the peak
        steps.mul_(sign).cumsum_(dim=1)
        s = torch.gather(tour, 1, at).to(t).mul_(weight[i])
        score = s if score is None else score.add_(s)
    order = _order(rank)
    score = score.index_select(1, order).nan_to_num_(nan=float("-inf"), posinf=float("inf"))
    best, first = score.max(1)
    return torch.where(best != float("-inf"), order.index_select(0, first), -1)


def _fake(x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank):
    check_args(x, src, hi, lo, depth, leaf_depths, euler_src, sign, at, rank)
    return x.new_empty((x.shape[0],), dtype=torch.int64)


from .native import wu_palmer_best_native  # noqa: E402  (it reads check and _order, defined above)

register("wu_palmer_best", SCHEMA, wu_palmer_best_torch, _fake, check, None, native=wu_palmer_best_native)
