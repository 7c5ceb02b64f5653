"""``hdecode::path_score_best``: node probabilities, a root-path sum and the best allowed node per row, fused."""

from __future__ import annotations

import torch

from .._checks import (check_bounds, check_float_tensor, check_index_values, check_ranges, check_vector,
                      check_tables_once, derived)
from .._node_sums import node_sums, table_endpoints
from .._registry import call, register

__all__ = ["path_score_best", "path_score_best_torch", "SCHEMA"]

SCHEMA = ("path_score_best(Tensor x, Tensor src, Tensor hi, Tensor lo, Tensor parent, Tensor alpha, "
          "Tensor beta, Tensor euler_src, Tensor sign, Tensor at, Tensor gamma, Tensor delta, "
          "Tensor allowed, Tensor rank, bool higher_is_better) -> Tensor")


def path_score_best(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor, parent: torch.Tensor,
                    alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor, sign: torch.Tensor,
                    at: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor, allowed: torch.Tensor,
                    rank: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """Node probabilities, a root-path sum and the best allowed node per row, fused
    (``hdecode::path_score_best``).

    In float64, for every node n (``C``, ``E`` exclusive prefix sums, as in
    :func:`~hdecode_torch.kernels.fused.gathered_prefix`; p(n) of a one-entry range is that entry,
    so p is gathered_prefix's bit for bit)::

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
        integers are written.  O(B·(J + T + N)), any J, N and T.  The torch implementation holds
        about (B, 2J + 2T + 6N) float64 at once: callers bound B.
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device or index.
    """
    return call("path_score_best", x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank,
                bool(higher_is_better))


def check_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank,
               higher_is_better=None) -> None:
    """Shapes, dtypes and devices of the arguments (no value is read)."""
    check_ranges(x, src, None, hi, lo)
    if lo is None:
        raise TypeError("Expected `lo` to be a Tensor, but got None")
    n, dev = hi.shape[0], x.device
    check_vector(parent, "parent", torch.int64, dev, n)
    for t, name in [(alpha, "alpha"), (beta, "beta"), (gamma, "gamma"), (delta, "delta")]:
        check_vector(t, name, torch.float64, dev, n)
    check_vector(euler_src, "euler_src", torch.int64, dev)
    check_vector(sign, "sign", torch.float64, dev, euler_src.shape[0])
    check_vector(at, "at", torch.int64, dev, n)
    check_vector(allowed, "allowed", torch.bool, dev, n)
    check_vector(rank, "rank", torch.int64, dev, n)


def check(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank,
          higher_is_better=None) -> None:
    """:func:`check_args` and every index in range (the tables' part once per set of tables)."""
    def tables():
        check_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
        n = hi.shape[0]
        check_index_values(x, src, hi, lo)
        check_bounds([(parent, n - 1, "parent", "N - 1 = len(hi) - 1"),
                      (euler_src, n - 1, "euler_src", "N - 1 = len(hi) - 1"),
                      (at, euler_src.shape[0], "at", "len(euler_src)")])
    check_tables_once("path_score_best", x, (src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta,
                                              allowed, rank), tables)


def _prepared(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank):
    """The index and coefficient tables of the torch implementation, derived once per set of tables
    (and per device and row length of ``x``, against which the tables' indices are checked), so that
    a call pays one lookup and its arithmetic: at one row, Python and per-operator costs are most of
    the call (benchmarks/README.md, "One row (B = 1)").

    Nodes are scored in preference order (rank descending, then id), the allowed ones only: the
    first best column of a row is the answer, one min/max and no tie pass.  p and v hold the allowed
    nodes first.  Reordering changes no value."""
    def build():
        check(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
        n = hi.shape[0]
        ends = table_endpoints(hi, lo, src.shape[0])
        k2 = hi.shape[0]  # both halves of the ends in preference order
        order = torch.sort(rank, descending=True, stable=True).indices  # stable: smaller ids first among ties
        ok = allowed.index_select(0, order)
        keep = order[ok]  # the allowed nodes in preference order, then the others
        perm = torch.cat([keep, order[~ok]])
        pos = torch.empty_like(perm)
        pos[perm] = torch.arange(n, device=perm.device)
        g = gamma.index_select(0, keep)
        at_kept = at.index_select(0, keep)
        # no allowed node reads E[0] = 0 (a root path holds its own node): the inclusive prefix, read one
        # entry earlier, is the same sums without the zero column's three operators
        inclusive = bool((at_kept >= 1).all())
        return dict(t=euler_src.shape[0], keep=keep, ends=ends.index_select(0, torch.cat([perm, perm + k2])),
                    parent=pos.index_select(0, parent.index_select(0, perm)), alpha=alpha.index_select(0, perm),
                    beta=beta.index_select(0, perm), euler_src=pos.index_select(0, euler_src), sign=sign,
                    at=at_kept - 1 if inclusive else at_kept, inclusive=inclusive,
                    gamma=None if bool((g == 1).all()) else g, delta=delta.index_select(0, keep),
                    none=torch.full((), -1, dtype=torch.int64, device=keep.device))
    return derived(("path_score_best", x.device, x.shape[1]),
                   (src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank), build)


def path_score_best_torch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor,
                          parent: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor,
                          sign: torch.Tensor, at: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor,
                          allowed: torch.Tensor, rank: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """The torch implementation of :func:`path_score_best` (every device): all rows at once."""
    check_float_tensor(x, "x")
    try:
        o = _prepared(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    except AttributeError:  # a table that is not a tensor
        check(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
        raise
    b, k, t = x.shape[0], o["keep"].shape[0], o["t"]
    if b == 0 or k == 0:
        return torch.full((b,), -1, dtype=torch.int64, device=x.device)
    # p(n) and v(n), the allowed nodes first (in preference order)
    p = node_sums(x, src, o["ends"])
    v = _columns(p, o["parent"]).mul_(o["alpha"]).add_(p * o["beta"])
    # the root-path sums S: exclusive prefix of the tour's terms sign·v(e), read at each allowed node's entry + 1
    # (E[k] = C[k − 1] for k ≥ 1, C the inclusive prefix: the same additions)
    if o["inclusive"]:
        tour = torch.index_select(v, 1, o["euler_src"]).mul_(o["sign"]).cumsum_(dim=1)
    else:
        tour = x.new_empty((b, t + 1), dtype=torch.float64)
        tour.select(1, 0).zero_()
        torch.index_select(v, 1, o["euler_src"], out=tour.narrow(1, 1, t)).mul_(o["sign"]).cumsum_(dim=1)
    score = _columns(tour, o["at"])
    if o["gamma"] is not None:  # × 1 is exact: skipped
        score.mul_(o["gamma"])
    score.add_(p.narrow(1, 0, k) * o["delta"])
    worst = float("-inf") if higher_is_better else float("inf")
    score.nan_to_num_(nan=worst, posinf=float("inf"), neginf=float("-inf"))
    best, first = score.max(1) if higher_is_better else score.min(1)  # the first best column
    return torch.where(best != worst, o["keep"].index_select(0, first), o["none"])


def _columns(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[:, index]`` of a (B, M) table: one ``index_select`` at one row (one operator, where the gather
    of an expanded index is two), a gather beyond (the CPU's ``index_select`` along the columns of many rows
    is the slower kernel).  The same entries either way."""
    if t.shape[0] == 1:
        return t.index_select(1, index)
    return torch.gather(t, 1, index.expand(t.shape[0], -1))


def _fake(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank, higher_is_better):
    check_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    return x.new_empty((x.shape[0],), dtype=torch.int64)


from .native import path_score_best_native  # noqa: E402  (it reads _prepared, defined above)

register("path_score_best", SCHEMA, path_score_best_torch, _fake, check, __name__ + ".triton",
         native=path_score_best_native)
