"""Choosing one node per sample, with deterministic ties.

Every rule here picks, per column of a node-major table, one node by a preference order that
is fixed by the tree alone (cached on the hierarchy), so that CPU and GPU, any batch split and
any backend give the same answer:

- :func:`argbest`, :func:`argbest_pairs`: the best score; among exact ties the deepest node,
  then the smallest id;
- :func:`deepest_where`: the deepest allowed node (smallest id among equal depths);
- :func:`most_informative_where`: the allowed node with the fewest leaves (the largest
  information I(n) = log(L/|L(n)|), compared exactly through integer leaf counts), then the
  deepest, then the smallest id.

The order is applied by reading rows in it: ``argmax``/``argmin`` return the first best entry of a
column on every backend, so the first row in preference order is the tie winner and one pass
suffices.  No host sync.
"""

from __future__ import annotations

import torch

__all__ = ["argbest", "argbest_pairs", "above", "deepest_where", "deepest_above", "deepest_above_from_leaves", "most_informative_where", "informative_order",
           "tie_rank", "preference_order"]


def tie_rank(h) -> torch.Tensor:
    """(N,) int64 preference among tied nodes, distinct per node: deeper first, then smaller id (larger wins)."""
    n = h.num_nodes
    return h.cached("tie_rank", lambda: h.depth * n + (n - 1 - torch.arange(n, device=h.depth.device)))


def preference_order(h, k: int) -> torch.Tensor:
    """(k,) int64 the nodes 0..k-1 from most to least preferred among ties (deeper, then smaller id)."""
    return h.cached(("tie_order", k), lambda: torch.argsort(tie_rank(h)[:k], descending=True))


def argbest(h, values: torch.Tensor, higher_is_better: bool, mask: torch.Tensor | None = None,
            prefer_deep: bool = True) -> torch.Tensor:
    """Best entry per column of a node-major score table, with deterministic ties.

    values: (K, B) float scores, row ``k`` node ``k`` (K = N for all nodes, K = L for the leaves;
    entries of other nodes go to :func:`argbest_pairs`); mask: optional (K, B) bool of allowed
    entries.  Among exactly tied best scores the deepest node wins (unless ``prefer_deep=False``:
    then the first row), then the smallest id.  Returns (B,) int64 node ids.
    """
    fill = float("-inf") if higher_is_better else float("inf")
    v = values if mask is None else values.masked_fill(~mask, fill)
    if prefer_deep and v.shape[0]:
        order = preference_order(h, v.shape[0])
        v = v.index_select(0, order)
        return order.index_select(0, v.argmax(dim=0) if higher_is_better else v.argmin(dim=0))
    return v.argmax(dim=0) if higher_is_better else v.argmin(dim=0)


def argbest_pairs(h, values: torch.Tensor, sample: torch.Tensor, node: torch.Tensor, batch_size: int,
                  higher_is_better: bool) -> torch.Tensor:
    """Best node per sample over a list of (sample, node) candidates, with :func:`argbest`'s ties.

    values, sample, node: (M,) float, int64, int64 (every sample has at least one entry).  Returns
    (B,) int64.  Two scatter reductions: the best value per sample, then the most preferred node
    among the entries that reach it; one sample: two whole-list reductions, the same maxima without the
    scatters' (B,) starting tables (six operators fewer, a third of the call at one row).
    """
    n = h.num_nodes
    if batch_size == 1 and values.numel() and not torch.compiler.is_compiling():
        # NaN propagates through amax/amin as through the scatter's amax, so a NaN value gives the root here too
        best = values.amax() if higher_is_better else values.amin()  # = −amax(−values): negation is exact
        key = torch.where(values == best, tie_rank(h).index_select(0, node), -1)
        top = key.amax(0, keepdim=True)
        return torch.where(top >= 0, n - 1 - top % n, h.root)
    v = values if higher_is_better else -values
    best = torch.full((batch_size,), float("-inf"), dtype=v.dtype, device=v.device)
    best = best.scatter_reduce(0, sample, v, "amax")
    rank = tie_rank(h)[node]
    key = torch.where(v == best[sample], rank, torch.full_like(rank, -1))
    top = torch.full((batch_size,), -1, dtype=torch.long, device=v.device).scatter_reduce(0, sample, key, "amax")
    return torch.where(top >= 0, n - 1 - top % n, torch.full_like(top, h.root))


def _first_allowed(h, allowed: torch.Tensor, order: torch.Tensor, name: str) -> torch.Tensor:
    """Per column of ``allowed`` (N, B), the first allowed node in ``order`` (N,), the root if none.

    ``allowed``: bool, or 0/1 in a floating dtype (:func:`above`'s table).  Each node carries a key,
    larger the earlier it comes in the order (0 for "none"): the largest key among the allowed nodes
    names the answer, three operators whatever N and B (keys are distinct, so no tie is left to the
    reduction).  ``name``: the order's cache key.
    """
    def build():
        n = order.numel()
        key = torch.empty(n, dtype=torch.int32, device=order.device)
        key[order] = torch.arange(n, 0, -1, dtype=torch.int32, device=order.device)
        root = torch.full((1,), h.root, dtype=order.dtype, device=order.device)
        return key[:, None], torch.cat([root, order.flip(0)])  # node of key j >= 1: order[n - j]
    key, node_of = h.cached(("first_allowed", name), build)
    if allowed.dtype == torch.bool:
        return node_of.index_select(0, (allowed * key).amax(dim=0))
    # keys as exact floats of the table's dtype (callers check N < 2^24 for float32)
    keyf = h.cached(("first_allowed", name, allowed.dtype), lambda: key.to(allowed.dtype))
    best = (allowed * keyf).amax(dim=0)
    return node_of.index_select(0, best.to(torch.long))


def above(h, p: torch.Tensor, threshold: float) -> torch.Tensor:
    """``p > threshold`` as :func:`_first_allowed` reads it: 0/1 in p's floating dtype where its keys are
    exact in it (N < 2^24 in float32) and B ≥ 32, else bool; the same comparison either way (the
    threshold in p's dtype).  p: (N, B) float.

    A CPU writes a bool table several times slower than a float one of the same shape (one
    comparison per byte), which made the comparison the largest step of a closed-form decoder.
    """
    exact = p.dtype == torch.float64 or (p.dtype == torch.float32 and h.num_nodes < 2**24)
    # A few columns: the bool table is cheaper (one operator fewer); both give the same answers.  A
    # traced graph (symbolic batch): the plain comparison.
    if not exact or p.dim() != 2 or torch.compiler.is_compiling() or p.shape[1] < 32:
        return p > threshold
    return torch.gt(p, threshold, out=torch.empty_like(p, memory_format=torch.preserve_format))


def deepest_where(h, allowed: torch.Tensor) -> torch.Tensor:
    """allowed: (N, B) bool (or 0/1 floats, as from :func:`above`).  Per column, the deepest allowed node (smallest id among equal depths),
    the root where none is allowed.  Returns (B,) int64."""
    order = h.cached("deepest_first", lambda: torch.sort(h.depth, descending=True, stable=True).indices)
    return _first_allowed(h, allowed, order, "deepest_first")


def deepest_above(h, p: torch.Tensor, threshold: float) -> torch.Tensor:
    """The deepest node with p(n) > threshold, the root if none (e.g. threshold ≥ 1).

    p: (N, B) node-major node probabilities.  Returns (B,) int64.  The nodes with p > 1/2 form one
    root path, so for thresholds ≥ 1/2 there is no tie between nodes of equal depth; on a
    single-child chain the deeper node wins.
    """
    return deepest_where(h, above(h, p, threshold))


def deepest_above_from_leaves(h, leaf_probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """:func:`deepest_above` straight from leaf probabilities (B, L), fused with the node sums.

    One pass over the input and B integers written (``hdecode::best_ranked_above``: node sums as
    float64 differences of depth-first prefix sums, compared with ``threshold`` in float64).
    Returns (B,) int64.
    """
    from .fused import best_ranked_above
    from .tree_sums import tree_ranges

    src, _, hi, lo = tree_ranges(h, "leaves")
    return best_ranked_above(leaf_probs, src, hi, lo, tie_rank(h), threshold, h.root)


def informative_order(h) -> torch.Tensor:
    """(N,) int64 the nodes from most to least informative: fewer leaves first, then deeper, then
    smaller id (cached)."""
    def build():
        n, d1 = h.num_nodes, h.max_depth + 1
        ids = torch.arange(n, device=h.device)
        rank = (h.num_leaves - h.leaf_count) * (d1 * n) + h.depth * n + (n - 1 - ids)  # distinct
        return torch.argsort(rank, descending=True)
    return h.cached("informative_order", build)


def most_informative_where(h, allowed: torch.Tensor) -> torch.Tensor:
    """allowed: (N, B) bool (or 0/1 floats, as from :func:`above`).  Per column, the allowed node with the fewest leaves (largest I(n)), then
    the deepest, then the smallest id; the root where none is allowed.  Returns (B,) int64."""
    return _first_allowed(h, allowed, informative_order(h), "informative_order")
