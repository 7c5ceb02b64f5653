"""``hdecode::best_ranked_above``: per row, the range of largest rank whose float64 sum exceeds a threshold."""

from __future__ import annotations

import torch

from .._checks import check_float_tensor, check_index_values, check_ranges, check_vector, check_tables_once, derived
from .._node_sums import node_sums, table_endpoints
from .._registry import call, register

__all__ = ["best_ranked_above", "best_ranked_above_torch", "SCHEMA"]

SCHEMA = ("best_ranked_above(Tensor x, Tensor src, Tensor hi, Tensor? lo, Tensor rank, float threshold, "
          "int fallback) -> Tensor")


def best_ranked_above(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                      rank: torch.Tensor, threshold: float, fallback: int) -> torch.Tensor:
    """Per row, the range of largest rank whose float64 sum exceeds a threshold (``hdecode::best_ranked_above``).

    With ``v[b, k]`` the float64 range sums of :func:`~hdecode_torch.kernels.fused.gathered_prefix`
    (no weight; a one-entry range is that entry, so the sums are gathered_prefix's bit for bit),
    returns ``argmax_{k : v[b, k] > threshold} rank[k]``, the smallest such k if ranks tie, and
    ``fallback`` where no k passes.  Comparisons are made on the float64 sums.  With node ranges and
    ``rank = depth·N + (N - 1 - id)`` this is the deepest node with p(n) > threshold, smallest id
    among equal depths: the tree-distance decoder at threshold 1/2, or (1 + c)/2 with a depth
    penalty c; another rank gives e.g. the most informative node above τ.

    Args:
        x, src, hi, lo: as in :func:`~hdecode_torch.kernels.fused.gathered_prefix`.
        rank: (K,) int64 (distinct values make the answer unique).
        threshold: float.
        fallback: int returned where no range passes.
    Returns:
        (B,) int64; only these B integers are written.  O(B·(J + K)), any J and K.  The torch
        implementation holds (B, 2J + 1) and (B, K) float64 tables at once: callers bound B.
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype, device or index.
    """
    return call("best_ranked_above", x, src, hi, lo, rank, float(threshold), int(fallback))


def check_args(x, src, hi, lo, rank, threshold=None, fallback=None) -> None:
    """Shapes, dtypes and devices of the arguments (no value is read)."""
    check_ranges(x, src, None, hi, lo)
    check_vector(rank, "rank", torch.int64, x.device, hi.shape[0])


def check(x, src, hi, lo, rank, threshold=None, fallback=None) -> None:
    """:func:`check_args` and every index in range (the tables' part once per set of tables)."""
    def tables():
        check_args(x, src, hi, lo, rank)
        check_index_values(x, src, hi, lo)
    check_tables_once("best_ranked_above", x, (src, hi, lo, rank), tables)


def _prepared(x, src, hi, lo, rank, fallback: int) -> dict:
    """The tables of the torch implementation, derived once per set of tables, ``fallback``, device
    and row length of ``x`` (against which the tables' indices are checked): at one row, each lookup
    or check costs as much as an operator.

    ``ends``: the endpoints of :func:`~hdecode_torch.kernels.fused._node_sums.table_endpoints`;
    ``dense``: distinct ranks 1..K in the order of ``rank``, the smallest k highest among equal ranks
    (so the largest of ``where(v > threshold, dense, 0)`` names the answer, 0 none); ``answer``: (K + 1,)
    the range of each dense rank, ``fallback`` at 0: ``answer[best]``."""
    def build():
        check(x, src, hi, lo, rank)
        k = rank.shape[0]
        order = torch.argsort(rank.flip(0), stable=True)
        dense = torch.empty_like(rank)
        dense[k - 1 - order] = torch.arange(1, k + 1, device=rank.device)
        answer = torch.empty(k + 1, dtype=torch.int64, device=rank.device)
        answer[0] = fallback
        answer[dense] = torch.arange(k, device=rank.device)
        ends = table_endpoints(hi, torch.zeros_like(hi) if lo is None else lo, src.shape[0])
        return dict(ends=ends, dense=dense, answer=answer)
    tables = (src, hi, rank) if lo is None else (src, hi, lo, rank)
    return derived(("best_ranked_above", fallback, x.device, x.shape[1]), tables, build)


def best_ranked_above_torch(x: torch.Tensor, src: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor | None,
                            rank: torch.Tensor, threshold: float, fallback: int) -> torch.Tensor:
    """The torch implementation of :func:`best_ranked_above` (every device): all rows at once."""
    check_float_tensor(x, "x")
    try:
        o = _prepared(x, src, hi, lo, rank, int(fallback))
    except AttributeError:  # a table that is not a tensor
        check(x, src, hi, lo, rank)
        raise
    b, k = x.shape[0], hi.shape[0]
    if b == 0 or k == 0:
        return torch.full((b,), int(fallback), dtype=torch.int64, device=x.device)
    key = torch.where(node_sums(x, src, o["ends"]) > threshold, o["dense"], 0)
    return o["answer"].index_select(0, key.amax(dim=1))


def _fake(x, src, hi, lo, rank, threshold, fallback):
    check_args(x, src, hi, lo, rank)
    return x.new_empty((x.shape[0],), dtype=torch.int64)


register("best_ranked_above", SCHEMA, best_ranked_above_torch, _fake, check, __name__ + ".triton")
