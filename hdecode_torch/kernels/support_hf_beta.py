"""hF_β on a completed top-k distribution: candidate nodes and their per-leaf-depth masses, never B × L or B × N.

The completed distribution (:mod:`hdecode_torch.kernels.support`) gives leaf l the mass q(l) = v(l) if
listed, r·w(l) otherwise.  hF_β's decoder needs, for a few nodes n per row, the masses per leaf depth

    Q_e(n) = Σ_{l ∈ L(n), d(l) = depths[e]} q(l) = S_e(n) + r·(W_e(n) − C_e(n)),

W_e(n) the weight of n's leaves at depth e (a tree quantity: the ends of n's run in the (depth,
depth-first position) order of :mod:`hdecode_torch.kernels.depth_ranges`, and prefix sums of a prior in
that order), S_e and C_e the sums of v and of w over the row's listed leaves under n at depth e.  Sorting
each row's listed leaves by the same key, (depth group)·L + depth-first position, makes those leaves one
run of the sorted list too: two binary searches per (node, depth) in the batch's B·k sorted keys
(:func:`depth_masses_topk`, O(E·log(B·k)) per node, E the number of distinct leaf depths).

Which nodes are candidates.  The decoder keeps the nodes whose mass p̃(n) reaches a tree bound b(n)
(the safe pruning bound of hF_β).  On the support (the ancestors of the listed leaves) p̃ comes from the
support table.  Off it p̃(n) = r·W(n), so the off-support nodes that pass are among the nodes with
W(n)/b(n) ≥ 1/r: a prefix of the nodes sorted by W/b descending (a tree table), whose length per row
is read by one binary search (:func:`heavy_nodes`).  At most 1/min b nodes of one depth can pass
(disjoint subtrees share a mass of at most 1), so a row's candidates number at most (D+1)/min b,
independent of L.  O(B·k·D) for the support, O(B·C·E·log(B·k)) for the masses of C candidates a row.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .depth_ranges import depth_range_ends, depth_ranges
from .support import Listed, leaf_ranks

__all__ = ["DepthListed", "leaf_depth_groups", "depth_listed", "depth_masses_topk", "heavy_order", "heavy_nodes"]


def _at(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return table.index_select(0, idx.reshape(-1)).view(idx.shape)


def leaf_depth_groups(h) -> torch.Tensor:
    """(L,) int64 each leaf's index in ``depth_ranges(h).depths`` (its depth group), cached."""
    return h.cached("topk_leaf_depth_group", lambda: torch.searchsorted(
        depth_ranges(h).depths, h.leaf_depth.to(torch.int64)))


class DepthListed(NamedTuple):
    """A batch's listed leaves sorted by (depth group, depth-first position), as :func:`depth_masses_topk`
    reads them.

    keys: (B·k,) int64 ascending, ``(row·E + group)·L + position``; vsum, wsum: (B, k+1) float64 each row's
    prefix sums of v and of w in that order (0 first); rate: (B,) float64 r; prior_sum: None (uniform
    weights) or (L + 1,) float64 prefix sums of the prior in ``depth_ranges`` leaf order.
    """

    keys: torch.Tensor
    vsum: torch.Tensor
    wsum: torch.Tensor
    rate: torch.Tensor
    prior_sum: torch.Tensor | None


def depth_listed(h, values: torch.Tensor, indices: torch.Tensor, listed: Listed,
                 prior: torch.Tensor | None) -> DepthListed:
    """The :class:`DepthListed` of a batch: values (B, k) float64, indices (B, k) int64, ``listed`` its
    :class:`~hdecode_torch.kernels.support.Listed` (for the rate), prior None or (L,) float64.  O(B·k·log k)
    (+ O(L) for a prior)."""
    bsz, k = indices.shape
    nl = h.num_leaves
    e = depth_ranges(h).depths.numel()
    key = _at(leaf_depth_groups(h), indices) * nl + _at(leaf_ranks(h), indices)
    key, order = key.sort(dim=1)
    v = values.to(torch.float64).gather(1, order)
    w = torch.ones_like(v) if prior is None else _at(prior, indices.gather(1, order))
    zero = torch.zeros(bsz, 1, dtype=torch.float64, device=v.device)
    vsum = torch.cat([zero, v.cumsum(1)], 1)
    wsum = torch.cat([zero, w.cumsum(1)], 1)
    flat = (key + torch.arange(bsz, device=key.device)[:, None] * (e * nl)).reshape(-1)
    prior_sum = None
    if prior is not None:
        prior_sum = torch.zeros(nl + 1, dtype=torch.float64, device=prior.device)
        prior_sum[1:] = prior.index_select(0, depth_ranges(h).leaf_order).cumsum(0)
    return DepthListed(flat, vsum, wsum, listed.rate, prior_sum)


#: Bytes of temporaries per (entry, leaf depth) of :func:`depth_masses_topk`: the (M', 2E) run ends, the (M', 2, E)
#: queries, ranks and flat positions (int64), the gathered sums of v and w and their differences (float64).
MASS_BYTES = 160


def depth_masses_topk(h, dl: DepthListed, rows: torch.Tensor, nodes: torch.Tensor,
                      budget: int | None = None) -> torch.Tensor:
    """(M, E) float64 Q_e(n) of the completed distribution for (row, node) pairs rows, nodes (M,) int64.

    S_e + r·(W_e − C_e) (module docstring); W_e − C_e is a difference of counts (exact) or of a prior's
    sums, where rounding may leave −1e-17 with nothing unlisted: clipped at 0 as in ``node_mass``.
    O(M·E·log(B·k)) time; the entries in blocks whose temporaries (``MASS_BYTES`` per entry and depth) fit
    ``budget`` bytes (None: one block), each entry computed alone, so the blocks give the same bits:
    O(M·E) memory for the result, O(min(M·E, budget)) beside it.
    """
    m, e = nodes.numel(), depth_ranges(h).depths.numel()
    step = m if budget is None else max(1, budget // (MASS_BYTES * e))
    if step >= m:
        return _depth_masses_block(h, dl, rows, nodes)
    out = torch.empty(m, e, dtype=torch.float64, device=nodes.device)
    for a in range(0, m, step):
        out[a:a + step] = _depth_masses_block(h, dl, rows[a:a + step], nodes[a:a + step])
    return out


def _depth_masses_block(h, dl: DepthListed, rows: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    nl = h.num_leaves
    ends = depth_range_ends(h, nodes)  # (M, 2E) [hi | lo] in depth_ranges leaf order
    e = ends.shape[1] // 2
    k = dl.vsum.shape[1] - 1
    start = _at(h.leaf_start, nodes)
    base = (rows * e)[:, None] * nl + torch.arange(e, device=rows.device) * nl + start[:, None]  # (M, E)
    query = torch.stack([base + _at(h.leaf_count, nodes)[:, None], base], 1)  # (M, 2, E): hi, lo
    local = torch.searchsorted(dl.keys, query) - (rows * k)[:, None, None]  # ranks within the row, 0..k
    flat = (rows * (k + 1))[:, None, None] + local
    s = _at(dl.vsum.reshape(-1), flat)
    c = _at(dl.wsum.reshape(-1), flat)
    s, c = s[:, 0] - s[:, 1], c[:, 0] - c[:, 1]
    if dl.prior_sum is None:
        weight = (ends[:, :e] - ends[:, e:]).to(torch.float64)
    else:
        weight = _at(dl.prior_sum, ends[:, :e]) - _at(dl.prior_sum, ends[:, e:])
    return s + _at(dl.rate, rows)[:, None] * (weight - c).clamp_min(0)


def heavy_order(h, weights: torch.Tensor, bound: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-root nodes sorted by W(n)/b(n) descending: ``(key, nodes)``, (N−1,) float64 ascending −W/b
    and (N−1,) int64 (ties: smaller id).  weights: (N,) float64 W; bound: (N,) float64 b > 0.  O(N log N)."""
    ratio = weights / bound
    nodes = torch.arange(h.num_nodes, device=weights.device)
    nodes = nodes[nodes != h.root]
    key, order = torch.sort(-ratio.index_select(0, nodes), stable=True)
    return key, nodes.index_select(0, order)


def heavy_nodes(order: tuple[torch.Tensor, torch.Tensor], rate: torch.Tensor,
                slack: float = 1e-9) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, every non-root node with r·W(n) ≥ b(n), and a few more: ``(rows, nodes)``, (M,) int64 pairs,
    row-major.  order: :func:`heavy_order`; rate: (B,) float64 r.  The prefix W/b ≥ (1 − slack)/r of the
    order, so rounding in W/b can only add nodes (the caller compares r·W with b itself).  O(B·log N + M)."""
    key, nodes = order
    thresh = -(1 - slack) / rate  # r = 0: -inf, no node
    count = torch.searchsorted(key, thresh, right=True)  # keys ≤ thresh: W/b ≥ (1 − slack)/r
    rows = torch.repeat_interleave(torch.arange(rate.shape[0], device=rate.device), count)
    first = torch.cumsum(count, 0) - count
    pos = torch.arange(rows.shape[0], device=rate.device) - _at(first, rows)
    return rows, _at(nodes, pos)
