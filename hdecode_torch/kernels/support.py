"""Node masses and exact decisions of a completed top-k distribution, on its support: never B × L or B × N.

A row lists k distinct leaves with masses v(l); the rest, the missing mass m, is spread over the L − k
unlisted leaves in proportion to weights w(l) (w = 1: the uniform completion; w = π, a class prior).
The completed distribution q is

    q(l) = v(l) (l listed),    q(l) = r·w(l) (l unlisted),    r = m / U,  U = Σ_{l unlisted} w(l)

(r = 0 where U = 0: nothing is unlisted, or the prior gives the unlisted leaves no mass and m = 0).
Its node masses, with W(n) = Σ_{l ∈ L(n)} w(l) a tree table (the leaf counts for w = 1), S(n) and C(n)
the sums of v and of w over the listed leaves under n:

    p̃(n) = S(n) + r·(W(n) − C(n)).

The leaves of n are one run of depth-first positions, ``leaf_start[n] .. leaf_start[n] + leaf_count[n] − 1``:
with each row's listed leaves sorted by position, S(n) and C(n) are differences of prefix sums, at two
binary searches for any node (:func:`node_mass`, O(log k)), or at the ends of runs for the support
(:func:`support_table`, O(1) per entry).

The **support** of a row is the set of ancestors of its listed leaves (k·(D+1) entries at most, D the
depth of the tree).  A node off the support has S = C = 0, so p̃(n) = r·W(n): the completion alone,
the same function of the tree for every node of an off-support subtree.  Every decision here reads
the support, and then, per support node a, one off-support child chosen in closed form: among the
children of a in a fixed order (a tree table), the first that holds no listed leaf.  A node has at most
k children on the support, so that child is the first rank missing from the ranks of a's support
children (:func:`first_free_rank`: a sort of the support, O(B·k·D·log(B·k·D))).

Every function takes tensors (and the hierarchy's cached tree tables), computes in float64 and
returns tensors; shapes are given per function.  No fused kernel: the plans differ only in whether
entries are selected or masked (:class:`Listed`'s ``compact``), never in a result.  Cost: O(B·k·D) time
and memory for the support tables, O(B·k·D·log(B·k·D)) for the sort that finds off-support children (LCA
height), plus O(N) tree tables built once per hierarchy and kind of weights (once per call for a prior,
with an O(L log L) sort of the prior for accuracy).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .selection import argbest_pairs, tie_rank

__all__ = ["Listed", "Support", "leaf_ranks", "subtree_weights", "listed_sums", "unlisted_support", "node_mass",
           "support_table", "support_entry_of", "walk_up", "child_order", "first_free_rank", "max_children",
           "cheapest_descent", "deepest_leaf", "num_children", "support_deepest_above", "support_best_leaf",
           "support_least_lca_height", "support_top_down", "LCACandidates", "lca_height_candidates", "least_lca_height_of"]


class Listed(NamedTuple):
    """A batch's listed leaves sorted by depth-first position, as :func:`node_mass` reads them.

    keys: (B, k) int64 the listed leaves' depth-first positions, ascending in each row;
    leaves: (B, k) int64 the listed leaves in that order;
    vsum, wsum: (B, k+1) float64 prefix sums of v and of w in that order (0 first);
    rate: (B,) float64 r = m / U, the completion's mass per unit of weight (0 where U = 0);
    compact: whether the kernels select the entries they need (``nonzero``: a host read each, which a CPU
    does not wait for) or keep every entry and mask the others (no host read: the GPU plan's choice).  The
    decisions are the same either way.
    """

    keys: torch.Tensor
    leaves: torch.Tensor
    vsum: torch.Tensor
    wsum: torch.Tensor
    rate: torch.Tensor
    compact: bool = True


def _at(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``table[idx]`` for a 1-D table and an int64 index of any shape, by ``index_select``: on the CPU
    advanced indexing costs several times as much per entry, and these lookups are most of a top-k decode."""
    return table.index_select(0, idx.reshape(-1)).view(idx.shape)


def _where(mask: torch.Tensor) -> torch.Tensor:
    """(M,) int64 the positions of a 1-D bool mask: one nonzero, then index_select per table (``t[mask]``
    is as slow per entry as advanced indexing)."""
    return mask.nonzero().squeeze(1)


def leaf_ranks(h) -> torch.Tensor:
    """(L,) int64 the depth-first position of each leaf (the inverse of ``h.dfs_leaves``), cached."""
    def build():
        out = torch.empty_like(h.dfs_leaves)
        out[h.dfs_leaves] = torch.arange(h.num_leaves, device=h.device)
        return out
    return h.cached("topk_leaf_ranks", build)


def subtree_weights(h, prior: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) float64 W(n) = Σ_{l ∈ L(n)} w(l): the leaf counts (``prior=None``, cached) or the sums of a
    (L,) prior over each subtree (prefix sums in depth-first order, O(N), not cached)."""
    if prior is None:
        return h.cached("topk_leaf_count_f64", lambda: h.leaf_count.to(torch.float64))
    csum = torch.zeros(h.num_leaves + 1, dtype=torch.float64, device=h.device)
    csum[1:] = prior.to(torch.float64).index_select(0, h.dfs_leaves).cumsum(0)
    return csum.index_select(0, h.leaf_start + h.leaf_count) - csum.index_select(0, h.leaf_start)


def listed_sums(h, values: torch.Tensor, indices: torch.Tensor, missing: torch.Tensor,
                prior: torch.Tensor | None = None, compact: bool = True) -> Listed:
    """The :class:`Listed` of a batch.

    values: (B, k) float masses, indices: (B, k) int64 distinct leaf ids per row, missing: (B,) float64
    m, prior: None (uniform completion) or (L,) float weights, compact: see :class:`Listed`.  O(B·k·log k).
    """
    bsz, k = indices.shape
    pos, order = _at(leaf_ranks(h), indices).sort(dim=1)
    v = values.to(torch.float64).gather(1, order)
    w = torch.ones_like(v) if prior is None else prior.to(torch.float64)[indices.gather(1, order)]
    zero = torch.zeros(bsz, 1, dtype=torch.float64, device=v.device)
    vsum = torch.cat([zero, v.cumsum(1)], 1)
    wsum = torch.cat([zero, w.cumsum(1)], 1)
    if prior is None:
        unlisted = float(h.num_leaves) - wsum[:, -1]
        some = unlisted > 0
    else:
        unlisted = subtree_weights(h, prior)[h.root] - wsum[:, -1]
        # The prior's total minus the listed weights rounds to a tiny non-zero where no unlisted leaf has
        # weight: whether one does is counted exactly (the input check refuses m > 0 without one).
        some = unlisted_support(prior, indices) > 0
    rate = torch.where(some, missing / unlisted.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    return Listed(pos.contiguous(), indices.gather(1, order), vsum, wsum, rate, compact)


def unlisted_support(prior: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """(B,) int64 the number of unlisted leaves of positive weight: prior (L,) float, indices (B, k) int64."""
    positive = prior > 0
    return positive.sum() - positive[indices].sum(1)


def node_mass(h, listed: Listed, weights: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """p̃(n) of nodes row by row: nodes (B, ...) int64 (row b's nodes in ``nodes[b]``), weights (N,) float64 W.

    Returns float64 of ``nodes``' shape: S(n) + r·(W(n) − C(n)), O(log k) each (two binary searches in the
    row's k positions).
    """
    shape = nodes.shape
    flat = nodes.reshape(shape[0], -1)
    start = _at(h.leaf_start, flat)
    lo = torch.searchsorted(listed.keys, start)
    hi = torch.searchsorted(listed.keys, start + _at(h.leaf_count, flat))
    s = listed.vsum.gather(1, hi) - listed.vsum.gather(1, lo)
    # W(n) − C(n) is a count (exact) or a prior's sums: rounding may leave −1e-17 where nothing is unlisted.
    free = (_at(weights, flat) - (listed.wsum.gather(1, hi) - listed.wsum.gather(1, lo))).clamp_min(0)
    return (s + listed.rate[:, None] * free).view(shape)


class Support(NamedTuple):
    """The support of a batch, one entry per (row, support node), with its node masses.

    Entries are ordered by depth, then row, then the depth-first rank of the node's first listed leaf.
    rows, nodes, depth: (M,) int64 (M ≤ B·k·(D+1)); lo: (M,) int64 the rank in the row's sorted list of the
    node's first listed leaf; p: (M,) float64 p̃ of the node; key: (M,) int64 ascending,
    ``(depth·B + row)·k + lo``; entry: ((D+1)·B·k,) int64, at ``(d·B + row)·k + j`` the entry of the
    ancestor at depth d of the row's j-th listed leaf, for d up to that leaf's depth
    (:func:`support_entry_of`; None unless asked for).
    """

    rows: torch.Tensor
    nodes: torch.Tensor
    depth: torch.Tensor
    lo: torch.Tensor
    p: torch.Tensor
    key: torch.Tensor
    entry: torch.Tensor | None


def support_table(h, listed: Listed, weights: torch.Tensor, with_entry: bool = False) -> Support:
    """The :class:`Support` of a batch: each support node once per row, with its p̃.

    Along the row's listed leaves sorted by depth-first position, the ancestors at depth d of the leaves
    under a node of depth d are one run (a node's leaves are contiguous in depth-first order), so the
    ancestor table (D+1, B, k) (the leaf itself below its depth) is marked where a run starts, and the
    run's ends give S and C as prefix-sum differences.  The masses are computed for the first entry of each
    run at the node's own depth only: a node shared by several listed leaves once, not once per leaf (the
    leaf copies below their depth are runs of one entry, dropped).  ``with_entry``: also the table
    position → entry map (one cumulative sum over the table).  O(B·k·D): D gathers, two comparisons and two
    nonzeros over the table (not ``listed.compact``: one nonzero, the one host read, then the map and a
    scatter place the runs' ends), then O(1) per support node.
    """
    leaves = listed.leaves
    bsz, k = leaves.shape
    d = h.max_depth
    dev = leaves.device
    leaf_depth = _at(h.depth, leaves)
    # row s: the ancestor at depth s (the leaf itself below its depth), filled from the deepest row up, one
    # parent lookup per level: no (D+1, B, k) index arithmetic
    anc = torch.empty((d + 1, bsz, k), dtype=leaves.dtype, device=dev)
    anc[d] = leaves
    for s in range(d, 0, -1):
        torch.where(leaf_depth >= s, _at(h.parent_or_root, anc[s]), anc[s], out=anc[s - 1])
    levels = torch.arange(d + 1, device=dev)
    own = (levels[:, None, None] <= leaf_depth[None]).reshape(-1)  # not a leaf's copy
    new = torch.ones_like(anc, dtype=torch.bool)
    torch.ne(anc[..., 1:], anc[..., :-1], out=new[..., 1:])
    new = new.reshape(-1)
    # a run ends where the next starts, or at the end of its (depth, row) segment; a copy is a run of one
    # entry, so dropping copies from both ends leaves the own runs' starts and ends paired, in order
    last = torch.ones_like(new)
    last[:-1] = new[1:]
    last.view(-1, k)[:, -1] = True
    first_own = new & own
    key = first_own.nonzero().squeeze(1)  # ascending: by depth, row, then rank
    # every table position's run's entry (that of the last own run before it for a copy: never read); an int32
    # running count where it fits, several times faster than int64's on the CPU
    entry = None
    if with_entry or not listed.compact:
        small = first_own.numel() < 2**31
        entry = first_own.cumsum(0, dtype=torch.int32 if small else torch.int64).to(torch.int64) - 1
    if listed.compact:
        last_at = (last & own).nonzero().squeeze(1)  # a run's last position: its end is one past it
    else:
        # the same, written at the run's entry: no second nonzero, whose size would be a second host read; the
        # other positions write to a spare slot past the end
        m = key.shape[0]
        last_at = torch.empty(m + 1, dtype=torch.int64, device=dev).scatter_(
            0, torch.where(last & own, entry, m), torch.arange(new.shape[0], device=dev))[:m]
    seg = key // k
    seg_start = seg * k
    lo, hi_last = key - seg_start, last_at - seg_start
    dep = seg // bsz
    rows = seg - dep * bsz
    if not with_entry:
        entry = None
    nodes = _at(anc.reshape(-1), key)
    base = rows * (k + 1)
    at_last, at_lo = base + hi_last, base + lo
    vsum, wsum = listed.vsum.reshape(-1), listed.wsum.reshape(-1)
    # the prefix sums one past the run's last entry: read through views shifted by one, not an index + 1
    s = _at(vsum[1:], at_last) - _at(vsum, at_lo)
    free = (_at(weights, nodes) - (_at(wsum[1:], at_last) - _at(wsum, at_lo))).clamp_min(0)
    p = s + _at(listed.rate, rows) * free
    return Support(rows, nodes, dep, lo, p, key, entry)


def support_entry_of(support: Support, key: torch.Tensor) -> torch.Tensor:
    """(Q,) int64 the entry holding ``(d·B + row)·k + j`` (Q,) int64: the ancestor at depth d ≤ depth of
    the row's j-th listed leaf."""
    return _at(support.entry, key)


def walk_up(h, nodes: torch.Tensor, steps: int, dim: int = -1) -> torch.Tensor:
    """int64 of ``nodes``' shape with a new dimension of steps+1 at ``dim`` (last by default): index s is the
    ancestor s levels above each node (the root repeated above it).

    nodes: int64 of any shape.  ``steps`` gathers (a loop over depth).
    """
    out = [nodes]
    for _ in range(steps):
        out.append(_at(h.parent_or_root, out[-1]))
    return torch.stack(out, dim)


def child_order(h, key: torch.Tensor, name: str | None, tie: torch.Tensor | None = None):
    """The children of every node sorted by ``key`` ascending (ties: larger ``tie``, then smaller id), cached as
    ``name`` unless None.

    key: (N,) float64 per child; tie: None or (N,) int64 per child.  Returns ``(children, rank)``: (N−1,) int64
    in the CSR layout of ``h.children_ptr`` (the children of a at ``children_ptr[a] ..``), and (N,) int64 each
    node's position among its parent's children in that order (0 for the root).
    """
    def build():
        kids = h.children
        if tie is not None:  # stable sorts from the last key to the first: CSR ids are ascending within a parent
            kids = kids[torch.sort(-tie[kids], stable=True).indices]
        by_key = torch.sort(key[kids], stable=True).indices  # CSR ids are ascending within a parent
        by_key = by_key[torch.sort(h.parent[kids[by_key]], stable=True).indices]
        ordered = kids[by_key]
        rank = torch.zeros(h.num_nodes, dtype=torch.long, device=h.device)
        slot = torch.arange(ordered.shape[0], device=h.device)
        rank[ordered] = slot - h.children_ptr[h.parent[ordered]]
        return ordered, rank
    return build() if name is None else h.cached(name, build)


def first_free_rank(group: torch.Tensor, rank: torch.Tensor, query: torch.Tensor, span: int | None = None,
                    groups: int | None = None, compact: bool = True) -> torch.Tensor:
    """Per query group, the smallest rank j ≥ 0 not among the pairs (group, j).

    group, rank: (M,) int64 pairs (duplicates allowed, ranks ≥ 0; a group of −1 holds pairs that are never
    asked about); query: (Q,) int64 groups ≥ 0.  span, groups: None or host ints, every rank < ``span`` and
    every group < ``groups`` (None: the maxima are read).  compact: the distinct pairs are selected (their
    number is a host read); otherwise every pair is kept, and given ``span`` and ``groups`` nothing is read
    from the device.  Returns (Q,) int64 (0 for a group with no pair).  O((M + Q)·log M): a sort, a few
    passes over the pairs, a binary search.
    """
    if group.numel() == 0:
        return torch.zeros_like(query)
    span = int(rank.max()) + 1 if span is None else span
    groups = int(group.max()) + 1 if groups is None else groups
    if groups >= (2**62) // span:  # the pair keys would overflow: number the groups first
        ids, group = torch.unique(group, return_inverse=True)
        query_at = torch.searchsorted(ids, query).clamp_max(ids.shape[0] - 1)
        query = torch.where(ids[query_at] == query, query_at, -1)
    if compact:
        pairs = torch.unique_consecutive(torch.sort(group * span + rank).values)  # by group, then rank
        g, r = pairs.div(span, rounding_mode="floor"), pairs.remainder(span)
        gid, counts = torch.unique_consecutive(g, return_counts=True)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.repeat_interleave(torch.arange(gid.shape[0], device=g.device), counts)
        j = torch.arange(pairs.shape[0], device=pairs.device) - _at(starts, slot)
        # Ranks in a group are distinct and ascending: the first j with r ≠ j is the first gap.
        free = counts.scatter_reduce(0, slot, torch.where(r != j, j, _at(counts, slot)), "amin", include_self=True)
        at = torch.searchsorted(gid, query).clamp_max(gid.shape[0] - 1)
        return torch.where(_at(gid, at) == query, _at(free, at), 0)
    # no compaction: duplicates stay, one segment per group
    keys = torch.sort(group * span + rank).values  # by group, then rank
    g, r = keys.div(span, rounding_mode="floor"), keys.remainder(span)
    m = keys.shape[0]
    new = torch.ones(m, dtype=torch.bool, device=keys.device)
    torch.ne(keys[1:], keys[:-1], out=new[1:])
    opens = torch.ones_like(new)
    torch.ne(g[1:], g[:-1], out=opens[1:])
    seg = opens.cumsum(0) - 1  # each pair's group, numbered 0.. in order
    distinct = new.cumsum(0)
    first = torch.where(opens, torch.arange(m, device=keys.device), 0).cummax(0).values
    j = distinct - _at(distinct, first)  # the pair's rank among its group's distinct pairs (a copy: the same)
    counts = torch.zeros(m, dtype=torch.int64, device=keys.device).scatter_add_(0, seg, new.to(torch.int64))
    free = counts.scatter_reduce(0, seg, torch.where(r != j, j, _at(counts, seg)), "amin", include_self=True)
    at = torch.searchsorted(g, query).clamp_max(m - 1)
    return torch.where(_at(g, at) == query, _at(free, _at(seg, at)), 0)


def cheapest_descent(h, weights: torch.Tensor, name: str | None):
    """The off-support part of the expected LCA height, minimised over the leaves of each subtree.

    For a path x = n_0, n_1, ..., n_j = l from a node down to a leaf,
    T(x, l) = Σ_{i<j} height(n_i)·(W(n_i) − W(n_{i+1})).  Returns ``(T, leaf)``: (N,) float64
    min_l T(x, l) over the leaves l under x, and (N,) int64 a minimising leaf (ties: the deeper leaf,
    then the smaller id).  Bottom-up by levels, O(N); cached as ``name`` unless None.
    """
    def build():
        n = h.num_nodes
        rank = tie_rank(h)
        height = h.height.to(torch.float64)
        best = torch.where(h.is_leaf, 0.0, float("inf")).to(torch.float64)
        leaf_rank = torch.where(h.is_leaf, rank, -1)
        for level in reversed(h.levels[1:]):
            par = h.parent[level]
            val = height[par] * (weights[par] - weights[level]) + best[level]
            best.scatter_reduce_(0, par, val, "amin", include_self=True)
            tied = torch.where(val == best[par], leaf_rank[level], -1)
            leaf_rank.scatter_reduce_(0, par, tied, "amax", include_self=True)
        return best, n - 1 - leaf_rank % n
    return build() if name is None else h.cached(name, build)


def deepest_leaf(h):
    """``(rank, leaf)``: (N,) int64 per node the :func:`tie_rank` of its deepest leaf (the smallest id among
    equally deep ones), and that leaf.  Bottom-up by levels, O(N), cached."""
    def build():
        n = h.num_nodes
        best = torch.where(h.is_leaf, tie_rank(h), -1)
        for level in reversed(h.levels[1:]):
            best.scatter_reduce_(0, h.parent[level], best[level], "amax", include_self=True)
        return best, n - 1 - best % n
    return h.cached("topk_deepest_leaf", build)


def num_children(h) -> torch.Tensor:
    """(N,) int64 ``h.num_children``, cached: the property takes a difference over the tree at every read, O(N),
    and the walks here read it once per level."""
    return h.cached("topk_num_children", lambda: h.num_children)


def max_children(h) -> int:
    """The largest number of children of a node (0 for a single leaf), a host int, cached: every child rank is
    below it, so rank keys are sized without a host read per call."""
    return h.cached("topk_max_children", lambda: int(num_children(h).max()))


def _off_support_child(h, rows, nodes, children, rank, at, batch_size: int | None = None, alt=None,
                       compact: bool = True):
    """(M,) int64 per (row, support node at ``at``) the first child, in the order (children, rank), that
    holds no listed leaf of the row; -1 where every child does (or the node is a leaf).

    rows, nodes: (M,) int64 the support (any duplicates; the root stands for no entry); at: (Q,) int64
    positions in it to answer; batch_size: None or a host int above every row (then nothing is read);
    alt: None or ``(children, rank, use)``, a second order and (B,) bool the rows that search in it (one sort
    for two orders); compact: see :class:`Listed`."""
    n = h.num_nodes
    a, query_rows = _at(nodes, at), _at(rows, at)
    if compact:
        child = _where(nodes != h.root)
        rows, nodes = _at(rows, child), _at(nodes, child)
        group = rows * n + _at(h.parent, nodes)
    else:
        # the root is nobody's child: its entries go to group −1, never asked about (no selection, no host read)
        group = torch.where(nodes != h.root, rows * n + _at(h.parent_or_root, nodes), -1)
    child_rank = _at(rank, nodes)
    if alt is not None:
        child_rank = torch.where(_at(alt[2], rows), _at(alt[1], nodes), child_rank)
    j = first_free_rank(group, child_rank, query_rows * n + a, max(max_children(h), 1),
                        None if batch_size is None else batch_size * n, compact)
    ok = j < _at(num_children(h), a)
    slot = (_at(h.children_ptr, a) + j).clamp_max(children.shape[0] - 1)
    found = _at(children, slot)
    if alt is not None:
        found = torch.where(_at(alt[2], query_rows), _at(alt[0], slot), found)
    return torch.where(ok, found, -1)


def support_deepest_above(h, listed: Listed, weights: torch.Tensor, indices: torch.Tensor,
                          threshold: float | torch.Tensor, heavy_name: str | None) -> torch.Tensor:
    """(B,) int64 the deepest node with p̃(n) > threshold (≥ 1/2), the root if none.

    indices: (B, k) int64 listed leaves; threshold: a float or (B,) float64 per row, at least half the
    row's p̃(root) (what the argument below needs).  Why the candidates contain the answer: the nodes with
    p̃ > 1/2 form one root path (two disjoint subtrees cannot both hold more than half the mass).  Let a
    be its deepest support node.  A deeper node of the path is off the support, under an off-support
    child x of a, where p̃ = r·W: among those children only the one of largest W can pass (they share
    r), and below it, in a subtree with no listed leaf, the path steps to the child of largest W while
    r·W > threshold.  So: a from the support table, x the first off-support child of a in decreasing
    W, then down the heaviest children while r·W > threshold (jumps of 2^j children, log D of them).  O(B·k·D)
    (the sort is of a's support children only).
    """
    bsz, k = indices.shape
    d = h.max_depth
    sup = support_table(h, listed, weights)
    above = sup.p > (_at(threshold, sup.rows) if isinstance(threshold, torch.Tensor) else threshold)
    key = torch.where(above, _at(tie_rank(h), sup.nodes), -1)
    top = torch.full((bsz,), -1, dtype=torch.long, device=indices.device).scatter_reduce(0, sup.rows, key, "amax")
    n = h.num_nodes
    a = torch.where(top >= 0, n - 1 - top % n, h.root)
    # the children of a by decreasing W (ties: smaller id), and the heaviest child of every node
    children, rank = child_order(h, -weights, None if heavy_name is None else heavy_name + "_order")

    def heaviest():
        if not children.numel():
            return torch.full_like(h.parent, -1)
        at = h.children_ptr[:-1].clamp_max(children.shape[0] - 1)
        return torch.where(h.num_children > 0, _at(children, at), -1)
    # a tree table (O(N)): cached with the order, not rebuilt per call
    first = heaviest() if heavy_name is None else h.cached(heavy_name + "_first", heaviest)
    # only a's support children matter: the other entries are dropped before the sort
    under = _where(_at(h.parent, sup.nodes) == _at(a, sup.rows))
    taken_rows, taken = _at(sup.rows, under), _at(sup.nodes, under)
    at = torch.arange(taken.shape[0], taken.shape[0] + bsz, device=a.device)
    x = _off_support_child(h, torch.cat([taken_rows, torch.arange(bsz, device=a.device)]), torch.cat([taken, a]),
                           children, rank, at, bsz, compact=listed.compact)
    rate = listed.rate

    def passes(nodes):
        return (nodes >= 0) & (rate * _at(weights, nodes.clamp_min(0)) > threshold)

    # W never grows from a node to its child (sums of non-negative weights, rounded monotonically), so along
    # the heaviest-child chain below x the nodes that pass are a prefix: its end is found by jumps of 2^j
    # heaviest children, j = log2(D) .. 0, not by D single steps
    def lifts():
        up = [first]
        for _ in range(max(d, 1).bit_length() - 1):
            up.append(torch.where(up[-1] >= 0, _at(up[-1], up[-1].clamp_min(0)), -1))
        return torch.stack(up)
    up = lifts() if heavy_name is None else h.cached(heavy_name + "_lifts", lifts)
    on = passes(x)
    cur = torch.where(on, x, a)
    for j in range(up.shape[0] - 1, -1, -1):
        jump = _at(up[j], cur)
        cur = torch.where(on & passes(jump), jump, cur)
    return cur


def support_best_leaf(h, listed: Listed, values: torch.Tensor, indices: torch.Tensor,
                      weights_leaf: torch.Tensor | None) -> torch.Tensor:
    """(B,) int64 the leaf of largest q(l), the smallest id among ties (the dense ``argmax``).

    Candidates: the best listed leaf, and the best unlisted one: q = r·w(l) there, so the unlisted
    leaf of largest w (smallest id among ties): the first leaf of that order not listed in the row, the
    first rank missing from the listed leaves' ranks.  weights_leaf: None (uniform: the order is by id)
    or (L,) float64 prior.  O(B·k·log k) (+ O(L log L) to order a prior).
    """
    bsz, k = indices.shape
    nl = h.num_leaves
    v = values.to(torch.float64)
    vbest, at = v.max(1)  # first maximum; smallest id among listed ties below
    ties = torch.where(v == vbest[:, None], indices, nl)
    best_listed = ties.min(1).values
    if k == nl:
        return best_listed
    # the first rank missing from a row's k distinct ranks: the first j where the sorted ranks differ from j
    def first_free(ranks):
        gap = ranks.sort(1).values != torch.arange(k, device=ranks.device)
        return torch.where(gap.any(1), gap.to(torch.uint8).argmax(1), k)
    if weights_leaf is None:
        unlisted = first_free(indices)
        wu = torch.ones_like(vbest)
    else:
        order = torch.sort(-weights_leaf, stable=True).indices
        rank = torch.empty_like(order)
        rank[order] = torch.arange(nl, device=v.device)
        unlisted = order[first_free(rank[indices])]
        wu = weights_leaf[unlisted]
    qu = listed.rate * wu
    take = (qu > vbest) | ((qu == vbest) & (unlisted < best_listed))
    return torch.where(take, unlisted, best_listed)


def support_least_lca_height(h, listed: Listed, weights: torch.Tensor, indices: torch.Tensor,
                             cache_name: str | None) -> torch.Tensor:
    """(B,) int64 the leaf of least expected LCA height under q (ties: the deeper leaf, then the smaller id, as
    the dense decoder).

    With a_0 = root, ..., a_j = l the root path of a leaf, E(l) = Σ_{i<j} height(a_i)·(p̃(a_i) − p̃(a_{i+1})).
    A listed leaf's path lies on the support: E from the support table.  An unlisted leaf l leaves the
    support at its deepest support ancestor a, into an off-support child x, where p̃ = r·W all the way
    down, so with P(a) the path sum down to a,

        E(l) = P(a) + height(a)·(p̃(a) − r·W(x)) + r·T(x, l),

    T as in :func:`cheapest_descent`.  For fixed a and r > 0 the best x and l minimise
    r·(min_l T(x, l) − height(a)·W(x)), the first off-support child of a in increasing
    g(x) = min_l T(x, l) − height(parent(x))·W(x) (a tree table), children of equal g ordered by the tie
    rule's preference for their minimiser (so the dense rule's leaf among equal expected heights).  For
    r = 0 every leaf under every off-support child reaches the same E: the deepest (then smallest-id) leaf
    under them, the first off-support child in the order of its subtree's deepest leaf (:func:`deepest_leaf`).
    So the candidates are the listed leaves and, per support node, that leaf: one of them is the dense
    decoder's.
    O(B·k·D·log(B·k·D)) plus the O(N) tables.
    """
    return least_lca_height_of(h, lca_height_candidates(h, listed, weights, cache_name), indices.shape[0])


def least_lca_height_of(h, candidates: "LCACandidates", batch_size: int) -> torch.Tensor:
    """(B,) int64 the best of :func:`lca_height_candidates` per row, with the decoder's ties."""
    return argbest_pairs(h, candidates.values, candidates.sample, candidates.leaves, batch_size,
                         higher_is_better=False)


class LCACandidates(NamedTuple):
    """The LCA height decoder's candidates, (M,) each: ``values`` float64 expected LCA heights, ``sample``,
    ``leaves``, ``anchors`` and ``first`` int64: the row, the leaf, the node it is reached from (the leaf
    itself for a listed leaf, the support node a for the others) and the rank in ``listed.leaves`` of the
    first listed leaf under the anchor.  The B·k listed leaves come first, in the order of ``listed.leaves``
    (row-major)."""

    values: torch.Tensor
    sample: torch.Tensor
    leaves: torch.Tensor
    anchors: torch.Tensor
    first: torch.Tensor


def lca_height_candidates(h, listed: Listed, weights: torch.Tensor, cache_name: str | None) -> LCACandidates:
    """The candidates of :func:`support_least_lca_height` (:class:`LCACandidates`): the listed leaves, then per
    support node a with an off-support child the best leaf under those children."""
    bsz, k = listed.leaves.shape
    sup = support_table(h, listed, weights, with_entry=True)
    height = h.cached("topk_height_f64", lambda: h.height.to(torch.float64))
    # P by levels from the root down, P(n) = P(parent) + height(parent)·(p̃(parent) − p̃(n)): the entries of a
    # depth are one slice, each one's parent the entry at the depth above holding its first listed leaf
    path = torch.zeros_like(sup.p)
    bounds = torch.searchsorted(sup.key, torch.arange(h.max_depth + 2, device=sup.key.device) * (bsz * k)).tolist()
    for d in range(1, h.max_depth + 1):
        a, b = bounds[d], bounds[d + 1]
        if a == b:
            break
        par = support_entry_of(sup, sup.key[a:b] - bsz * k)
        path[a:b] = _at(path, par) + _at(height, _at(sup.nodes, par)) * (_at(sup.p, par) - sup.p[a:b])
    t_min, t_leaf = cheapest_descent(h, weights, None if cache_name is None else cache_name + "_descent")

    def order():  # a tree table (O(N)): built once per cache name
        # children of equal g reach equal expected heights: the one whose minimiser the dense rule prefers first
        return child_order(h, t_min - _at(height, h.parent_or_root) * weights, None, tie=_at(tie_rank(h), t_leaf))
    children, rank = order() if cache_name is None else h.cached(cache_name + "_order", order)
    every = torch.arange(sup.rows.shape[0], device=sup.p.device)
    x = _off_support_child(h, sup.rows, sup.nodes, children, rank, every, bsz, compact=listed.compact)
    x_leaf = _at(t_leaf, x.clamp_min(0))
    if bool((listed.rate == 0).any()):
        # r = 0: every leaf under every off-support child of a reaches the same P(a) + height(a)·p̃(a), so the
        # dense rule's pick is the deepest (then smallest-id) of them all, not a minimiser of T
        deep_rank, deep_leaf = deepest_leaf(h)
        by_deep = h.cached("topk_child_order_deepest_leaf", lambda: child_order(
            h, torch.zeros(h.num_nodes, dtype=torch.float64, device=h.device), None, tie=deep_rank))
        x0 = _off_support_child(h, sup.rows, sup.nodes, *by_deep, every, bsz, compact=listed.compact)
        zero = _at(listed.rate == 0, sup.rows)
        x = torch.where(zero, x0, x)
        x_leaf = torch.where(zero, _at(deep_leaf, x.clamp_min(0)), x_leaf)
    xs = x.clamp_min(0)
    r = _at(listed.rate, sup.rows)
    off = path + _at(height, sup.nodes) * (sup.p - r * _at(weights, xs)) + r * _at(t_min, xs)
    ok = _where(x >= 0)
    # a listed leaf's own entry: at its depth, the first of its one-leaf run
    dev = listed.leaves.device
    j = torch.arange(k, device=dev)
    leaf_key = (_at(h.depth, listed.leaves) * bsz + torch.arange(bsz, device=dev)[:, None]) * k + j
    at_leaf = support_entry_of(sup, leaf_key.reshape(-1))
    values = torch.cat([_at(path, at_leaf), _at(off, ok)])
    sample = torch.cat([_at(sup.rows, at_leaf), _at(sup.rows, ok)])
    leaves = torch.cat([listed.leaves.reshape(-1), _at(x_leaf, ok)])
    anchors = torch.cat([listed.leaves.reshape(-1), _at(sup.nodes, ok)])
    return LCACandidates(values, sample, leaves, anchors, torch.cat([j.expand(bsz, k).reshape(-1), _at(sup.lo, ok)]))


def support_top_down(h, listed: Listed, weights: torch.Tensor, indices: torch.Tensor,
                     order_name: str | None, lam: float | None = None, trace: list | None = None) -> torch.Tensor:
    """(B,) int64 the leaf the greedy descent reaches: from the root, step to the child of largest p̃ (ties:
    the smallest id) until a leaf; with ``lam`` (≥ 0), only while that child's p̃ > ``lam`` (the node where
    the descent stops).  ``trace``: a list that receives, per level, ``(real, node, p)`` (B,) each: whether
    the node had children, the node stepped to (itself at a leaf) and its p̃ (0 at a leaf), as
    :func:`~hdecode_torch.kernels.top_down_path.best_child` returns them on the dense table.

    indices: (B, k) int64 listed leaves.  At a support node the children are its support children (p̃ from
    the support table) and the off-support ones, where p̃ = r·W: among those only the first in decreasing W
    (ties: smaller id) can win, or, where r = 0 (every one at 0), the one of smallest id.  Once off the
    support, p̃ = r·W all the way down: the heaviest child (the smallest id where r = 0).  One step per
    level, each O(B·k·log(B·k)) (the off-support child is the first rank missing among the node's support
    children), so O(B·k·D·log(B·k)) in all; ``order_name`` caches the O(N) child orders (None: built here).
    """
    bsz, k = indices.shape
    dev = indices.device
    n = h.num_nodes
    sup = support_table(h, listed, weights)
    by_weight = child_order(h, -weights, None if order_name is None else order_name + "_order")
    by_id = h.cached("topk_child_order_by_id", lambda: child_order(h, torch.zeros(n, dtype=torch.float64,
                                                                                  device=h.device), None))
    has_kids = num_children(h) > 0

    def first_child(children):  # each node's first child in an order, -1 for a leaf
        if not children.numel():
            return torch.full_like(h.parent, -1)
        return torch.where(has_kids, _at(children, h.children_ptr[:-1].clamp_max(children.shape[0] - 1)), -1)
    heaviest = first_child(by_weight[0]) if order_name is None else h.cached(order_name + "_first",
                                                                            lambda: first_child(by_weight[0]))
    smallest = h.cached("topk_first_child_by_id", lambda: first_child(by_id[0]))
    rate = listed.rate
    spread = rate > 0
    bounds = torch.searchsorted(sup.key, torch.arange(h.max_depth + 2, device=dev) * (bsz * k)).tolist()
    rows = torch.arange(bsz, device=dev)
    cur = torch.full((bsz,), h.root, dtype=torch.long, device=dev)
    on = torch.ones(bsz, dtype=torch.bool, device=dev)
    walking = on.clone()
    for d in range(h.max_depth):
        # off the support: the heaviest child (the smallest id where nothing is spread)
        down = torch.where(spread, _at(heaviest, cur), _at(smallest, cur))
        # on it: the support children of cur, the best of them and the best off-support child
        a, b = bounds[d + 1], bounds[d + 2]
        nodes, srows = sup.nodes[a:b], sup.rows[a:b]
        mine = (_at(h.parent, nodes) == _at(cur, srows)) & _at(on, srows)
        p = sup.p[a:b]
        if listed.compact:  # the level's entries under cur selected (otherwise masked: a selection is a host read)
            keep = _where(mine)
            nodes, srows, p, mine = _at(nodes, keep), _at(srows, keep), _at(p, keep), _at(mine, keep)
        best = torch.full((bsz,), -1.0, dtype=torch.float64, device=dev).scatter_reduce(
            0, srows, torch.where(mine, p, -1.0), "amax")
        tied = torch.where(mine & (p == _at(best, srows)), nodes, n)
        best_node = torch.full((bsz,), n, dtype=torch.long, device=dev).scatter_reduce(0, srows, tied, "amin")
        at = torch.arange(nodes.shape[0], nodes.shape[0] + bsz, device=dev)
        # an entry not under cur stands as the root, which no off-support child search reads
        both_rows, both_nodes = torch.cat([srows, rows]), torch.cat([torch.where(mine, nodes, h.root), cur])
        x = _off_support_child(h, both_rows, both_nodes, *by_weight, at, bsz, alt=(*by_id, ~spread),
                               compact=listed.compact)
        px = torch.where(x >= 0, rate * _at(weights, x.clamp_min(0)), -1.0)
        take_x = (x >= 0) & ((px > best) | ((px == best) & (x < best_node)))
        step = torch.where(take_x, x, best_node)
        step = torch.where(step < n, step, cur)  # a leaf stays
        nxt = torch.where(on, step, torch.where(down >= 0, down, cur))
        if lam is not None or trace is not None:
            p_off = torch.where(down >= 0, rate * _at(weights, down.clamp_min(0)), -1.0)
            p_next = torch.where(on, torch.where(take_x, px, best), p_off)
        if lam is not None:
            walking = walking & (p_next > lam)
            nxt = torch.where(walking, nxt, cur)
        if trace is not None:
            real = _at(has_kids, cur)
            trace.append((real, nxt, torch.where(real, p_next, 0.0)))
        cur = nxt
        on = on & ~take_x
    return cur
