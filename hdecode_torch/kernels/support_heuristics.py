"""The node-key heuristics (darts, expected information, information threshold, HiE) and plurality on a top-k
list's support.

With the notation of :mod:`hdecode_torch.kernels.support` (q the completed distribution, r its rate,
W(n) the subtree weights, p̃(n) = S(n) + r·(W(n) − C(n))), a node off the row's support has p̃(n) = r·W(n),
and its information I(n) = log(L/|L(n)|) is a tree table too.  So a rule that picks the node of largest
key f(n, p̃(n)), with f increasing in p̃, reads its support nodes from the support table, and off the
support it only needs the first node, in a fixed order of the tree by f(n, r·W(n)), that is not on the
row's support: for r > 0 that order is by the key K(n) (f(n, r·W) = r·K(n) for the keys here), for r = 0
every off-support node has p̃ = 0 and the order is the tie rule's alone.  The support has at most
k·(D+1) nodes per row, so that node is the first rank missing among the ranks of the row's support
nodes in the order (:func:`~hdecode_torch.kernels.support.first_free_rank`):

- ``darts(λ)``: f = (I(n) + λ)·p̃(n), K(n) = (I(n) + λ)·W(n); ``expected_information`` is λ = 0;
- ``information_threshold(t)``: f = p̃(n) over the nodes with I(n) ≥ t, K(n) = W(n);
- ``hie``: the leaf of largest p̃(parent(l))·q(l).  A listed leaf's key from its parent's p̃; an
  unlisted leaf under a support node a has key p̃(a)·r·w(l): the unlisted leaf child of a of largest w
  (the first free rank among a's children with the leaves first by decreasing w); an unlisted leaf
  under an off-support parent a has key r·W(a)·r·w(l): the first off-support node in the order of the
  parents of leaves by W(a)·max w, then by the smallest id of the leaf child reaching that maximum.

``plurality`` walks the strict top-down path instead (:func:`support_plurality`).

``confidence_threshold(τ)`` below 1/2 (:func:`support_most_informative_above`): the first node of the
informative order (fewer leaves, then deeper, then smaller id) with p̃(n) > τ.  The order is a tree table
but the test is not a key of it (off the support it is r·W(n) > τ, a different cut-off per row), so the
best off-support node is the first position of the order, outside the row's support, where r·W passes: the
support's ranks in the order cut it into at most k·(D+1) + 1 gaps, a range maximum of W (a sparse table)
says which gaps hold a passing node, and a binary search by jumps of 2^j finds the first one in the first
such gap.

Ties are the dense rules': the deeper node, then the smaller id (``argbest``) for the node rules, the
smaller leaf id for HiE.  The orders break equal K the same way, so the first free node is the one the
dense rule prefers among the off-support nodes of equal key.  Keys are computed in float64: the rule's node on the
completed distribution in float64 (the dense decoder's on ``TopK.completed(L, torch.float64)``; on a float32
table the dense keys are rounded to float32, which can tie keys that differ in float64).

Cost: the support table (O(B·k·D)) and one sort of the support's ranks (O(B·k·D·log(B·k·D))); the
orders are O(N log N) tree tables, cached per hierarchy for the uniform completion, built per call
with a prior (they depend on W).
"""

from __future__ import annotations

import torch

from .selection import argbest_pairs, informative_order, tie_rank
from .support import (Listed, _at, _off_support_child, _where, child_order, first_free_rank, node_mass, num_children,
                      support_table)

__all__ = ["node_order", "first_off_support", "support_best_key", "support_darts",
           "support_information_threshold", "support_most_informative_above", "support_hie", "support_plurality"]


def node_order(h, key: torch.Tensor | None, allowed: torch.Tensor | None = None,
               tie: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The allowed nodes by ``key`` descending, then ``tie`` descending (default :func:`tie_rank`: deeper, then
    smaller id).

    key: None (the tie order alone) or (N,) float64; allowed: None (all) or (N,) bool; tie: None or (N,) int64.
    Returns ``(nodes, rank)``: (M,) int64 the allowed nodes in that order, (N,) int64 each node's position in
    it (-1 where not allowed).  Two stable sorts, O(N log N).
    """
    ids = torch.arange(h.num_nodes, device=h.device) if allowed is None else _where(allowed)
    tie = tie_rank(h) if tie is None else tie
    nodes = ids[torch.sort(-tie[ids], stable=True).indices]
    if key is not None:
        nodes = nodes[torch.sort(-key[nodes], stable=True).indices]
    rank = torch.full((h.num_nodes,), -1, dtype=torch.long, device=h.device)
    rank[nodes] = torch.arange(nodes.shape[0], device=h.device)
    return nodes, rank


def first_off_support(rows: torch.Tensor, nodes: torch.Tensor, order: tuple[torch.Tensor, torch.Tensor],
                      batch_size: int, compact: bool = True) -> torch.Tensor:
    """(B,) int64 per row the first node of ``order`` (:func:`node_order`) not among the row's support nodes,
    -1 where the row's support holds every node of the order.

    rows, nodes: (M,) int64 the support entries (duplicates allowed).  O(M·log M).
    """
    ordered, rank = order
    size = ordered.shape[0]
    r = _at(rank, nodes)
    queries = torch.arange(batch_size, device=rows.device)
    if compact:
        keep = _where(r >= 0)
        j = first_free_rank(_at(rows, keep), _at(r, keep), queries, max(size, 1), batch_size)
    else:
        # a node outside the order goes to group −1, never asked about: no selection, whose size is a host read
        j = first_free_rank(torch.where(r >= 0, rows, -1), r.clamp_min(0), queries, max(size, 1), batch_size,
                            compact=False)
    if size == 0:
        return torch.full((batch_size,), -1, dtype=torch.long, device=rows.device)
    return torch.where(j < size, _at(ordered, j.clamp_max(size - 1)), -1)


def support_best_key(h, listed: Listed, weights: torch.Tensor, batch_size: int, key_of, order_pos, order_zero,
                     allowed: torch.Tensor | None = None) -> torch.Tensor:
    """(B,) int64 the node of largest ``key_of(nodes, p̃)`` on the completed distribution (ties: deeper, then
    smaller id), over the nodes ``allowed`` ((N,) bool, None: all).

    key_of: (nodes (M,) int64, p (M,) float64) -> (M,) keys, non-decreasing in p; order_pos, order_zero:
    :func:`node_order` of the allowed nodes by the off-support key for r > 0 and for r = 0 (see the module
    docstring).  Candidates: the allowed support nodes and one off-support node per row.
    """
    sup = support_table(h, listed, weights)
    rows, nodes, p = sup.rows, sup.nodes, sup.p
    # the off-support pick reads every support node (taken ranks), the candidates only the allowed ones
    rate = listed.rate
    off = torch.where(rate > 0, first_off_support(rows, nodes, order_pos, batch_size, listed.compact),
                      first_off_support(rows, nodes, order_zero, batch_size, listed.compact))
    if allowed is not None:
        ok = _where(_at(allowed, nodes))
        rows, nodes, p = _at(rows, ok), _at(nodes, ok), _at(p, ok)
    has = _where(off >= 0)
    off_nodes = _at(off, has)
    all_rows = torch.cat([rows, has])
    all_nodes = torch.cat([nodes, off_nodes])
    all_p = torch.cat([p, _at(rate, has) * _at(weights, off_nodes)])
    return argbest_pairs(h, key_of(all_nodes, all_p), all_rows, all_nodes, batch_size, higher_is_better=True)


def support_darts(h, listed: Listed, weights: torch.Tensor, lam: float, cache_name: str | None) -> torch.Tensor:
    """(B,) int64 argmax_n (I(n) + lam)·p̃(n) (ties: deeper, then smaller id), float64.  ``cache_name``: caches
    the order by (I + lam)·W (None: built here, with a prior)."""
    info = h.information

    def by_key():
        return node_order(h, (info + lam) * weights)
    order_pos = by_key() if cache_name is None else h.cached((cache_name, float(lam)), by_key)
    order_zero = h.cached("topk_node_order_by_tie", lambda: node_order(h, None))

    def key_of(nodes, p):
        return (_at(info, nodes) + lam) * p
    return support_best_key(h, listed, weights, listed.rate.shape[0], key_of, order_pos, order_zero)


def support_information_threshold(h, listed: Listed, weights: torch.Tensor, allowed: torch.Tensor,
                                  threshold: float, cache_name: str | None) -> torch.Tensor:
    """(B,) int64 the node of largest p̃ among ``allowed`` (N,) bool (I(n) ≥ ``threshold``), ties: deeper, then
    smaller id.  ``cache_name``: caches the order by W."""
    def by_weight():
        return node_order(h, weights, allowed)
    order_pos = by_weight() if cache_name is None else h.cached((cache_name, float(threshold)), by_weight)
    order_zero = h.cached(("topk_node_order_info_at_least", float(threshold)), lambda: node_order(h, None, allowed))

    def key_of(nodes, p):
        return p
    return support_best_key(h, listed, weights, listed.rate.shape[0], key_of, order_pos, order_zero, allowed)


def _range_max_table(h, weights: torch.Tensor):
    """The sparse table of W along the informative order: ((E, N+1) float64, at (j, i) the largest W of the
    order's positions i .. min(i + 2^j, N) − 1, 0 at i = N; (N+1,) int64 ⌊log2 x⌋ for x ≥ 1).  W ≥ 0 and τ ≥ 0,
    so the 0 past the end never passes, and r·0 is no NaN where r = 0.
    E = N.bit_length(): jumps of 2^j, j < E, cover any distance below 2^E > N.  O(N log N)."""
    n = h.num_nodes
    levels = max(n.bit_length(), 1)
    row = torch.zeros(n + 1, dtype=torch.float64, device=h.device)
    row[:n] = _at(weights, informative_order(h))
    table = [row]
    at = torch.arange(n + 1, device=h.device)
    for j in range(1, levels):
        table.append(torch.maximum(row, _at(row, (at + (1 << (j - 1))).clamp_max(n))))
        row = table[-1]
    log2 = torch.zeros(n + 1, dtype=torch.long, device=h.device)
    for j in range(1, levels):
        log2[1 << j:] += 1
    return torch.stack(table), log2


def support_most_informative_above(h, listed: Listed, weights: torch.Tensor, tau: float,
                                   cache_name: str | None) -> torch.Tensor:
    """(B,) int64 the most informative node with p̃(n) > ``tau`` (fewer leaves, then deeper, then smaller id),
    the root if none: the dense ``confidence_threshold`` for any τ (below 1/2 the passing nodes need not lie on
    one root path).

    Candidates: the passing support nodes, and the first position j of the informative order O with
    r·W(O[j]) > τ and O[j] off the row's support (module docstring).  Per row, the support's ranks in O,
    sorted, bound the gaps [s_{i−1} + 1, s_i) and [s_last + 1, N); the largest W over a gap is two sparse-table
    lookups (r·max W = max r·W: rounding is monotone); from the start of the first gap holding a passing
    node, jumps of 2^j positions while the block jumped over has no passing node end on the first that
    passes.  ``cache_name``: caches the O(N log N) table (None: built here, with a prior).
    O(B·k·D·log(B·k·D)) for the sort of the support's ranks, then O(B·log N).
    """
    bsz = listed.rate.shape[0]
    n = h.num_nodes
    dev = listed.rate.device
    order = informative_order(h)
    rank = h.cached("topk_informative_rank", lambda: torch.empty_like(order).scatter_(
        0, order, torch.arange(n, device=h.device)))
    table, log2 = (_range_max_table(h, weights) if cache_name is None
                   else h.cached(cache_name, lambda: _range_max_table(h, weights)))
    flat = table.reshape(-1)
    width = n + 1
    rate = listed.rate
    sup = support_table(h, listed, weights)
    r = _at(rank, sup.nodes)
    best = torch.where(sup.p > tau, n - 1 - r, -1)  # the earliest passing support node wins
    best = torch.full((bsz,), -1, dtype=torch.long, device=dev).scatter_reduce(0, sup.rows, best, "amax")
    # the gaps of each row's support ranks: the pairs are distinct (a node once per row), sorted by row, then rank
    keys = torch.sort(sup.rows * n + r).values
    rows, ranks = keys.div(n, rounding_mode="floor"), keys.remainder(n)
    same = torch.zeros_like(rows, dtype=torch.bool)
    torch.eq(rows[1:], rows[:-1], out=same[1:])
    prev = torch.zeros_like(ranks)
    prev[1:] = ranks[:-1] + 1
    last = torch.zeros(bsz, dtype=torch.long, device=dev).scatter_reduce(0, rows, ranks + 1, "amax")
    g_rows = torch.cat([rows, torch.arange(bsz, device=dev)])
    lo = torch.cat([torch.where(same, prev, 0), last])
    hi = torch.cat([ranks, torch.full_like(last, n)])
    size = (hi - lo).clamp_min(1)
    j = _at(log2, size)
    start = lo.clamp_max(n)
    top = torch.maximum(_at(flat, j * width + start), _at(flat, j * width + (hi - (1 << j)).clamp(0, n)))
    g_rate = _at(rate, g_rows)
    hit = (hi > lo) & (g_rate * top > tau)
    pos = torch.full((bsz,), n, dtype=torch.long, device=dev).scatter_reduce(
        0, g_rows, torch.where(hit, lo, n), "amin")
    # the first passing position from pos: skip each block of 2^j positions with no passing node
    for step in range(table.shape[0] - 1, -1, -1):
        block = _at(flat, step * width + pos.clamp_max(n))
        pos = torch.where(rate * block > tau, pos, pos + (1 << step))
    off = torch.where(pos < n, n - 1 - pos.clamp_max(n - 1), -1)
    best = torch.maximum(best, off)
    return torch.where(best >= 0, _at(order, (n - 1 - best).clamp(0, n - 1)), h.root)


def _hie_tables(h, weights_leaf: torch.Tensor, weights: torch.Tensor):
    """The tree tables of :func:`support_hie`: the children with the leaves first by decreasing w (then
    smaller id), the internal ones after; per node its best leaf child (largest w, smaller id; -1 if none);
    the parents of leaves by W(a)·w(best leaf child) descending, then by that leaf's id."""
    n, nl = h.num_nodes, h.num_leaves
    w = torch.full((n,), float("inf"), dtype=torch.float64, device=h.device)
    w[:nl] = -weights_leaf
    children = child_order(h, w, None)
    has_kids = h.num_children > 0
    first = _at(children[0], h.children_ptr[:-1].clamp_max(max(children[0].shape[0] - 1, 0))) \
        if children[0].numel() else torch.full_like(h.parent, -1)
    best = torch.where(has_kids & (first < nl) & (first >= 0), first, -1)
    parents = best >= 0
    key = torch.where(parents, weights * _at(weights_leaf, best.clamp_min(0)), 0.0)
    order = node_order(h, key, parents, tie=-best)
    return children, best, order


def support_hie(h, listed: Listed, weights: torch.Tensor, values: torch.Tensor, indices: torch.Tensor,
                weights_leaf: torch.Tensor | None, cache_name: str | None) -> torch.Tensor:
    """(B,) int64 the leaf of largest p̃(parent(l))·q(l), the smallest id among ties (the dense HiE), float64.

    values, indices: (B, k) the list; weights_leaf: None (uniform) or (L,) float64 prior.  Candidates: the
    listed leaves; per support node its unlisted leaf child of largest w; the best leaf under the first
    off-support parent of leaves (module docstring).  O(B·k·D·log(B·k·D)).
    """
    bsz, k = indices.shape
    dev = indices.device
    nl = h.num_leaves
    wl = torch.ones(nl, dtype=torch.float64, device=dev) if weights_leaf is None else weights_leaf

    def tables():
        return _hie_tables(h, wl, weights)
    children, best, order = tables() if cache_name is None else h.cached(cache_name, tables)
    sup = support_table(h, listed, weights)
    rate = listed.rate
    # listed leaves, in the list's order: p̃ of the parent (O(log k) each)
    p_par = node_mass(h, listed, weights, _at(h.parent_or_root, indices))
    cand_rows = [torch.arange(bsz, device=dev).repeat_interleave(k)]
    cand_leaves = [indices.reshape(-1)]
    cand_keys = [(p_par * values.to(torch.float64)).reshape(-1)]
    # unlisted leaf children of support nodes: the first free rank among each node's children
    every = torch.arange(sup.rows.shape[0], device=dev)
    x = _off_support_child(h, sup.rows, sup.nodes, children[0], children[1], every, bsz, compact=listed.compact)
    ok = _where((x >= 0) & (x < nl))
    xl = _at(x, ok)
    cand_rows.append(_at(sup.rows, ok))
    cand_leaves.append(xl)
    cand_keys.append(_at(sup.p, ok) * (_at(rate, _at(sup.rows, ok)) * _at(wl, xl)))
    # an unlisted leaf under an off-support parent
    a = first_off_support(sup.rows, sup.nodes, order, bsz, listed.compact)
    has = _where(a >= 0)
    pa = _at(a, has)
    ra = _at(rate, has)
    leaf = _at(best, pa)
    cand_rows.append(has)
    cand_leaves.append(leaf)
    cand_keys.append((ra * _at(weights, pa)) * (ra * _at(wl, leaf)))
    rows, leaves, keys = torch.cat(cand_rows), torch.cat(cand_leaves), torch.cat(cand_keys)
    top = torch.full((bsz,), float("-inf"), dtype=keys.dtype, device=dev).scatter_reduce(0, rows, keys, "amax")
    tied = torch.where(keys == _at(top, rows), leaves, nl)
    return torch.full((bsz,), nl, dtype=torch.long, device=dev).scatter_reduce(0, rows, tied, "amin")


def support_plurality(h, listed: Listed, weights: torch.Tensor, order_name: str | None) -> torch.Tensor:
    """(B,) int64 the most informative node n with p̃(n) > p̃(z) for every z ∉ A(n), the root if none (the
    dense ``plurality``: its walk down the strict top-down path, ties stop it).

    The walk needs, at each node of the path, its p̃, its most probable child and the runner-up's p̃.  At a
    support node the children are its support children (p̃ from the support table) and the off-support
    ones, p̃ = r·W: the best two of those are the first two free ranks among the children by decreasing W
    (ties: smaller id).  Off the support, p̃ = r·W all the way down: the heaviest and second heaviest
    children (tree tables).  Masses in float64.
    One step per level, each O(B·k·log(B·k)): O(B·k·D·log(B·k)) in all; ``order_name`` caches the O(N)
    child order (None: built here).
    """
    bsz = listed.rate.shape[0]
    k = listed.leaves.shape[1]
    dev = listed.rate.device
    n = h.num_nodes
    sup = support_table(h, listed, weights)
    children, crank = child_order(h, -weights, None if order_name is None else order_name + "_order")

    def heaviest_two():
        none = torch.full_like(h.parent, -1)
        if not children.numel():
            return none, none
        at = h.children_ptr[:-1]
        top = children.shape[0] - 1
        return (torch.where(h.num_children > 0, _at(children, at.clamp_max(top)), -1),
                torch.where(h.num_children > 1, _at(children, (at + 1).clamp_max(top)), -1))
    first, second = heaviest_two() if order_name is None else h.cached(order_name + "_two", heaviest_two)
    rate = listed.rate
    kids = num_children(h)
    dtype = torch.float64
    ninf = torch.tensor(float("-inf"), dtype=dtype, device=dev)

    def mass(x):  # p̃ = r·W of off-support nodes x (B,), -inf where x = -1
        return torch.where(x >= 0, rate * _at(weights, x.clamp_min(0)), ninf)
    bounds = torch.searchsorted(sup.key, torch.arange(h.max_depth + 2, device=dev) * (bsz * k)).tolist()
    rows = torch.arange(bsz, device=dev)
    cur = torch.full((bsz,), h.root, dtype=torch.long, device=dev)
    out = cur.clone()
    p_cur = node_mass(h, listed, weights, cur[:, None])[:, 0]
    off = torch.full((bsz,), float("-inf"), dtype=dtype, device=dev)
    on = torch.ones(bsz, dtype=torch.bool, device=dev)
    walking = torch.ones(bsz, dtype=torch.bool, device=dev)
    for d in range(h.max_depth + 1):
        f = _at(first, cur)
        best, runner_up, child = mass(f), mass(_at(second, cur)), f
        if d < h.max_depth:
            a, b = bounds[d + 1], bounds[d + 2]
            nodes, srows = sup.nodes[a:b], sup.rows[a:b]
            # the level's entries under cur: selected, or masked where a selection's size would be a host read
            # (an entry not under cur then stands as the root, which no off-support child search reads)
            mine = (_at(h.parent, nodes) == _at(cur, srows)) & _at(on, srows)
            p = sup.p[a:b]
            if listed.compact:
                keep = _where(mine)
                nodes, srows, p, mine = _at(nodes, keep), _at(srows, keep), _at(p, keep), _at(mine, keep)
            p = torch.where(mine, p, float("-inf"))
            best_s = torch.full((bsz,), float("-inf"), dtype=dtype, device=dev).scatter_reduce(0, srows, p, "amax")
            tied = torch.where(mine & (p == _at(best_s, srows)), nodes, n)
            best_node = torch.full((bsz,), n, dtype=torch.long, device=dev).scatter_reduce(0, srows, tied, "amin")
            rest = torch.where(nodes == _at(best_node, srows), float("-inf"), p)
            second_s = torch.full((bsz,), float("-inf"), dtype=dtype, device=dev).scatter_reduce(0, srows, rest, "amax")
            nodes = torch.where(mine, nodes, h.root)
            m = nodes.shape[0]
            x1 = _off_support_child(h, torch.cat([srows, rows]), torch.cat([nodes, cur]), children, crank,
                                    torch.arange(m, m + bsz, device=dev), bsz, compact=listed.compact)
            x1_or_root = torch.where(x1 >= 0, x1, h.root)
            x2 = _off_support_child(h, torch.cat([srows, rows, rows]), torch.cat([nodes, x1_or_root, cur]), children,
                                    crank, torch.arange(m + bsz, m + 2 * bsz, device=dev), bsz, compact=listed.compact)
            v1, v2 = mass(x1), mass(x2)
            take_x = v1 > best_s
            best = torch.where(on, torch.maximum(best_s, v1), best)
            runner_up = torch.where(on, torch.where(take_x, torch.maximum(best_s, v2), torch.maximum(second_s, v1)),
                                    runner_up)
            child = torch.where(on, torch.where(take_x, x1, best_node), child)
            on = on & ~(take_x & walking)
        out = torch.where(walking & (p_cur > torch.maximum(off, best)), cur, out)
        walking = walking & (_at(kids, cur) > 0) & (best > runner_up)
        off = torch.maximum(off, runner_up)
        cur = torch.where(walking, child, cur)
        p_cur = torch.where(walking, best, p_cur)
    return out
