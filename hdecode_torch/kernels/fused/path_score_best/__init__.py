"""``hdecode::path_score_best``: node probabilities, a root-path sum and the best allowed node per row, fused."""

from __future__ import annotations

import torch

from .._checks import check_bounds, check_index_values, check_ranges, check_vector, check_tables_once, derived
from .._registry import call, register
from ..gathered_prefix import range_sums

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


def _preference_order(hi, lo, parent, alpha, beta, euler_src, at, gamma, delta, allowed, rank):
    """The node tables with the nodes in preference order (rank descending, then id): the first best
    column of a row is then the answer, one max and no tie pass.  Reordering changes no value."""
    def build():
        n = hi.shape[0]
        order = torch.sort(rank, descending=True, stable=True).indices  # stable: smaller ids first among ties
        pos = torch.empty_like(order)
        pos[order] = torch.arange(n, device=order.device)
        pick = lambda t: t.index_select(0, order)  # noqa: E731
        return dict(order=order, hi=pick(hi), lo=pick(lo), parent=pos.index_select(0, pick(parent)),
                    alpha=pick(alpha), beta=pick(beta), gamma=pick(gamma), delta=pick(delta),
                    excluded=~pick(allowed), euler_src=pos.index_select(0, euler_src), at=pick(at))
    return derived("preference_order", (hi, lo, parent, alpha, beta, euler_src, at, gamma, delta, allowed, rank),
                   build)


def path_score_best_torch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor,
                          parent: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, euler_src: torch.Tensor,
                          sign: torch.Tensor, at: torch.Tensor, gamma: torch.Tensor, delta: torch.Tensor,
                          allowed: torch.Tensor, rank: torch.Tensor, higher_is_better: bool) -> torch.Tensor:
    """The torch implementation of :func:`path_score_best` (every device): all rows at once."""
    check(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    b, n = x.shape[0], hi.shape[0]
    if b == 0 or n == 0:
        return torch.full((b,), -1, dtype=torch.int64, device=x.device)
    o = _preference_order(hi, lo, parent, alpha, beta, euler_src, at, gamma, delta, allowed, rank)
    p = range_sums(x, src, None, o["hi"], o["lo"])  # (B, N) node sums, nodes in preference order
    # in place where the order of operations allows it: (B, N) temporaries dominate the memory
    v = torch.gather(p, 1, o["parent"].expand(b, -1)).mul_(o["alpha"]).add_(p * o["beta"])
    score = range_sums(v, o["euler_src"], sign, o["at"], None).mul_(o["gamma"]).add_(p * o["delta"])
    worst = float("-inf") if higher_is_better else float("inf")
    score.nan_to_num_(nan=worst, posinf=float("inf"), neginf=float("-inf")).masked_fill_(o["excluded"], worst)
    best, first = score.max(1) if higher_is_better else score.min(1)  # the first best column
    return torch.where(best != worst, o["order"].index_select(0, first), -1)


def _fake(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank, higher_is_better):
    check_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    return x.new_empty((x.shape[0],), dtype=torch.int64)


register("path_score_best", SCHEMA, path_score_best_torch, _fake, check, __name__ + ".triton")
