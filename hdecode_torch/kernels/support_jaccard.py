"""Per-leaf-depth masses and Jaccard candidates of a completed top-k distribution: never B × L or B × N.

The completed distribution (:mod:`hdecode_torch.kernels.support`) is q(l) = v(l) on a row's k listed
leaves and q(l) = r·w(l) on the others.  The expected Jaccard index of a closed set reads q only through
the per-leaf-depth masses Q_e(n) of its nodes (the mass of n's leaves at the e-th distinct leaf depth).
Order the leaves by (depth, depth-first position) (:func:`~hdecode_torch.kernels.depth_ranges.depth_ranges`):
n's leaves at depth e are one run [lo, hi) of that order, so with W_e(n) the completion's weight of that
run (its length for w = 1, a difference of the prior's prefix sums otherwise) and S_e(n), C_e(n) the sums
of v and of w over the row's listed leaves inside it,

    Q_e(n) = S_e(n) + r·(W_e(n) − C_e(n)).

With each row's listed leaves sorted in that order and prefix sums of v and w along them, S_e and C_e
are differences at two binary searches: O(E·log k) per (row, node) (:func:`depth_masses_topk`), from
O(N) tree tables and O(B·k) per-row tables.

Off the support (the ancestors of the row's listed leaves) every mass is the completion's alone,
p̃(n) = r·W(n).  A node passes a test p̃(n) ≥ τ(n)·t with τ a tree table non-decreasing down the tree
exactly when W(n)/τ(n) ≥ t/r, a key that never grows from a parent to a child; sorted by decreasing key
(ties: preorder, a parent first) the nodes passing it are a prefix of one tree-wide order
(:func:`heavy_order`), each of its prefixes ancestor-closed.  At most (D+1)·m / (min τ · t) nodes pass
(those of one depth are disjoint subtrees sharing the missing mass m), whatever L.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .depth_ranges import depth_range_ends, depth_ranges

__all__ = ["DepthListed", "depth_listed", "completion_prefix", "depth_masses_topk", "heavy_order", "heavy_nodes"]


class DepthListed(NamedTuple):
    """A batch's listed leaves sorted by (depth, depth-first position), as :func:`depth_masses_topk` reads them.

    keys: (B·k,) int64 ``row·L + position`` in :func:`~hdecode_torch.kernels.depth_ranges.depth_ranges`
    order, ascending (rows in turn, positions ascending within a row);
    vsum, wsum: (B·(k+1),) float64 each row's prefix sums of v and of w in that order (0 first), rows in turn;
    rate: (B,) float64 r.
    """

    keys: torch.Tensor
    vsum: torch.Tensor
    wsum: torch.Tensor
    rate: torch.Tensor


def _order_rank(h) -> torch.Tensor:
    """(L,) int64 each leaf's position in the (depth, depth-first) order, cached."""
    def build():
        order = depth_ranges(h).leaf_order
        out = torch.empty_like(order)
        out[order] = torch.arange(order.shape[0], device=order.device)
        return out
    return h.cached("topk_depth_order_rank", build)


def _prefix(x: torch.Tensor) -> torch.Tensor:
    """(B, k + 1) float64 prefix sums of the rows of x (B, k), 0 first."""
    zero = torch.zeros(x.shape[0], 1, dtype=torch.float64, device=x.device)
    return torch.cat([zero, x.cumsum(1)], 1)


def depth_listed(h, values: torch.Tensor, indices: torch.Tensor, rate: torch.Tensor,
                 prior: torch.Tensor | None) -> DepthListed:
    """The :class:`DepthListed` of a batch: values (B, k) float64, indices (B, k) int64 leaf ids, rate (B,)
    float64 r, prior None or (L,) float64.  O(B·k·log k)."""
    bsz, k = indices.shape
    pos = _order_rank(h).index_select(0, indices.reshape(-1)).view(bsz, k)
    pos, order = pos.sort(1)
    v = values.to(torch.float64).gather(1, order)
    w = torch.ones_like(v) if prior is None else prior.to(torch.float64).index_select(
        0, indices.gather(1, order).reshape(-1)).view(bsz, k)
    rows = torch.arange(bsz, device=pos.device)[:, None]
    keys = (rows * h.num_leaves + pos).reshape(-1)
    return DepthListed(keys, _prefix(v).reshape(-1), _prefix(w).reshape(-1), rate)


def completion_prefix(h, prior: torch.Tensor | None) -> torch.Tensor | None:
    """(L + 1,) float64 prefix sums of the prior in (depth, depth-first) order, or None for the uniform
    completion (W_e is then a run's length, exact).  O(L)."""
    if prior is None:
        return None
    out = torch.zeros(h.num_leaves + 1, dtype=torch.float64, device=prior.device)
    out[1:] = prior.to(torch.float64).index_select(0, depth_ranges(h).leaf_order).cumsum(0)
    return out


#: Bytes of temporaries per (entry, leaf depth) of :func:`depth_masses_topk`: the (M', 2E) run ends and search
#: positions (int64), the gathered sums of v and w, the weights and the free mass (float64).
MASS_BYTES = 96


def depth_masses_topk(h, dl: DepthListed, wprefix: torch.Tensor | None, rows: torch.Tensor,
                      nodes: torch.Tensor, budget: int = 1 << 25, chunk: int | None = None) -> torch.Tensor:
    """(M, E) float64 Q_e(n) = S_e(n) + r·(W_e(n) − C_e(n)) of nodes (M,) int64 (``N``: padding, zero masses)
    in rows (M,) int64.

    Per entry: the run ends of n at every leaf depth (a tree table), two binary searches of each in the
    row's sorted listed leaves, four prefix-sum differences: O(M·E·log(B·k)) time; the entries in blocks
    whose temporaries (``MASS_BYTES`` per entry and depth) fit ``budget`` bytes, or of ``chunk`` entries, each
    entry computed alone (the blocks give the same bits).
    """
    m, e = nodes.numel(), depth_ranges(h).depths.numel()
    if chunk is None:
        chunk = max(1, budget // (MASS_BYTES * e))
    out = torch.empty(m, e, dtype=torch.float64, device=nodes.device)
    nl = h.num_leaves
    for a in range(0, m, chunk):
        r, n = rows[a:a + chunk], nodes[a:a + chunk]
        ends = depth_range_ends(h, n)  # (M', 2E): hi | lo, positions in the order
        at = torch.searchsorted(dl.keys, ends + r[:, None] * nl)  # in row r's block [r·k, r·k + k]
        at += r[:, None]  # row r's prefix sums start at r·(k + 1)
        s = dl.vsum.index_select(0, at.view(-1)).view(at.shape)
        c = dl.wsum.index_select(0, at.view(-1)).view(at.shape)
        if wprefix is None:
            w = (ends[:, :e] - ends[:, e:]).to(torch.float64)
        else:
            wp = wprefix.index_select(0, ends.view(-1)).view(ends.shape)
            w = wp[:, :e] - wp[:, e:]
        # W_e − C_e is a count (exact) or a prior's sums, which may round below 0 where nothing is unlisted
        free = (w - (c[:, :e] - c[:, e:])).clamp_min(0)
        out[a:a + chunk] = (s[:, :e] - s[:, e:]) + dl.rate.index_select(0, r)[:, None] * free
    return out


def heavy_order(h, weights: torch.Tensor, tau: torch.Tensor, name: str | None, floor: float | None = None):
    """The non-root nodes by decreasing W(n)/τ(n) (ties: preorder), for :func:`heavy_nodes`.

    weights: (N,) float64 W; tau: (N,) float64 τ, positive below the root and non-decreasing down the tree;
    floor: None (every node) or only the nodes whose key is at least ``floor`` (the smallest limit of a
    batch: an O(N) pass, then a sort of those alone).  Returns ``(nodes, neg_key)``: int64 and float64
    −W/τ ascending.  W never grows and τ never falls from a parent to a child, and a correctly rounded
    quotient is monotone in each argument, so the key never grows either: every prefix is ancestor-closed.
    O(N log N) (O(N) plus the sort of the nodes kept, with ``floor``), cached as ``name`` unless None.
    """
    def build():
        below = torch.ones(h.num_nodes, dtype=torch.bool, device=weights.device)
        below[h.root] = False
        key = weights / torch.where(below, tau, 1.0)
        if floor is not None:
            below &= key >= floor
        ids = below.nonzero().squeeze(1)
        pre = h.pos.index_select(0, ids)
        by_pre = torch.sort(pre).indices
        ids = ids.index_select(0, by_pre)
        neg = -key.index_select(0, ids)
        by_key = torch.sort(neg, stable=True).indices  # stable: preorder among ties
        return ids.index_select(0, by_key), neg.index_select(0, by_key)
    return build() if name is None else h.cached(name, build)


def heavy_nodes(order: tuple[torch.Tensor, torch.Tensor], limit: torch.Tensor):
    """The (row, node) pairs with W(n)/τ(n) ≥ limit[row]: each row's prefix of :func:`heavy_order`.

    limit: (B,) float64 (+inf: none).  Returns (rows, nodes), (M,) int64 each, and the (B,) counts; one host
    read (M).  O(B·log N + M)."""
    nodes, neg_key = order
    count = torch.searchsorted(neg_key, -limit, right=True)  # keys ≥ limit: −key ≤ −limit
    total = int(count.sum())
    rows = torch.repeat_interleave(torch.arange(limit.shape[0], device=limit.device), count, output_size=total)
    start = torch.cumsum(count, 0) - count
    at = torch.arange(total, device=limit.device) - start.index_select(0, rows)
    return rows, nodes.index_select(0, at), count
