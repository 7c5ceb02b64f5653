"""Wu-Palmer and Zhao on a completed top-k distribution: the best node and expected values, on the support.

Notation of :mod:`.support`: a row lists leaves y with masses v(y); the unlisted leaf l gets r·w(l); W(n) is
the weight under n, S, C the listed v and w under n, p̃(n) = S(n) + r·(W(n) − C(n)).  Write
δ(y) = v(y) − r·w(y) for a listed leaf, so that q(l) = r·w(l) + [l listed]·δ(l): every expected similarity is
r times the similarity's value under the tree's own weights w (a tree table, T below) plus a correction
that only the listed leaves carry, and that correction reads the support alone.

**Wu-Palmer** E[WP(n, y)] = Σ_e 2/(d(n) + e) Σ_{b ∈ A(n), b ≠ root} Q_e(b) (Q_e(b): the mass under b at leaf
depth e).  With W_e(b) the weight under b at leaf depth e and Δ_e(b) = Σ_{listed y ∈ L(b), d(y) = e} δ(y):

    E[WP(n)] = r·Ω(n) + Σ_e 2·Λ_e(a)/(d(n) + e),   Ω(n) = Σ_e 2/(d(n) + e) Σ_{b ∈ A(n) \\ root} W_e(b),
    Λ_e(a) = Σ_{b ∈ A(a) \\ root} Δ_e(b),

a the deepest support node on n's root path (Δ = 0 off the support, so the ancestors below a add nothing).

**Zhao** E[Zhao(n, y)] = 2/(I(n) + λ) · Σ_{b ∈ A(n)} ΔI(b)·p̃(b), λ = log L, ΔI(b) = I(b) − I(parent(b)) (0 at
the root).  p̃(b) − r·W(b) = S(b) − r·C(b) is 0 off the support, so

    E[Zhao(n)] = r·Ψ(n) + 2·c(a)/(λ + I(n)),   Ψ(n) = 2 G(n)/(λ + I(n)),  G(n) = Σ_{b ∈ A(n)} ΔI(b)·W(b),
    c(a) = Σ_{b ∈ A(a)} ΔI(b)·(p̃(b) − r·W(b)).

In both, score(n) = r·T(n) + κ_a(n): T (Ω or Ψ) a tree table, κ_a the anchor's correction, which depends on
n only through d(n) (Wu-Palmer) or I(n) (Zhao).  Λ and c are root-path sums over the support table, one
level at a time (O(B·k·D·E), E the number of distinct leaf depths).

**The best node** (:func:`similarity_best`).  Every node is on the support (scored exactly: the lower bound
S_lb of the row's best is the best of them) or off it, below an off-support child x of its anchor a.  For
every n in the subtree of an off-support node f whose anchor is a,

    score(n) ≤ U(f) = r·T̂(f) + κ̂_a(f),   T̂(f) = max_{n ∈ L*(f)} T(n) (subtree maximum, a tree table),

with κ̂_a(f) a bound of κ_a over that subtree: for Wu-Palmer, the terms Λ_e > 0 at the smallest depth
d(f) and those < 0 at the largest depth of the tree (2Λ_e/(d + e) falls with d when Λ_e > 0 and rises when
Λ_e < 0); for Zhao, 2c/(λ + I(parent(f))) for c ≥ 0 (I grows down the tree) and c/λ for c < 0 (I ≤ λ).
U never grows from a node to its child (T̂ does not, and κ̂'s bound tightens with depth), so the off-support
nodes with U ≥ S_lb − ε are closed upwards within their off-support subtree: they are found by a descent from
the support, one level at a time, taking of each node's children those with r·T̂ ≥ S_lb − ε − κ̂ (the children
share κ̂: a binary search in the children sorted by T̂, a tree table); S_lb starts at the best support node
and rises with every node scored (a probe per support node, the best node under its first off-support
child, tried first, added candidates, 939 against 539 a row at k = 100 on the 100k tree's model-like rows,
and a sort of the support, and reached no fewer nodes).  Exactness: a
node never reached lies
under an off-support f with U(f) < S_lb − ε ≤ S* − ε, so its score is below the best score S* by more than ε:
it is neither optimal nor tied with an optimum.  All reached nodes are scored exactly and the best taken with
the dense decoder's ties (the deepest, then the smallest id: :func:`~.selection.argbest_pairs`), the scores
compared on a grid of 2^-40 of the row's best so that values equal but for rounding tie (the node then
chosen is within 9.1e-13 of the best, relatively); ε (1e-10) only absorbs the rounding of U and S_lb (it
adds candidates, never drops one).

How many: every reached f has r·T̂(f) + κ̂ ≥ S_lb − ε: the subtrees whose completion-only value reaches what
the support already achieves.  That number depends on the row (the listed masses, m, the tree's shape) but
not on L for the rows a model gives (a few heavy subtrees per level); a row whose unlisted leaves all tie
exactly with its best node (e.g. a flat tree under a uniform completion whose listed masses sit at or below
r: every unlisted leaf scores r) reaches each of those leaves.  Cost: O(B·k·D·(E + log(B·k·D))) for the support tables and
O(B·C·(D + E)) for C reached nodes per row, plus the O(N·E) tree tables (cached for the uniform completion,
rebuilt per call with a prior).  Source: the expected-value forms of Plaud et al. 2025 (Wu-Palmer: per leaf
depth along root paths; Zhao: information telescoped along root paths) restricted to a top-k support as in
:mod:`.support`; the bound is a subtree maximum of the completion's own values.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from .depth_ranges import depth_range_ends, depth_ranges
from .selection import argbest_pairs
from .support import Listed, child_order, max_children, num_children, support_entry_of, support_table, walk_up

__all__ = ["SimilarityTables", "wu_palmer_tables", "zhao_tables", "similarity_best", "expected_wu_palmer",
           "expected_zhao", "SLACK", "TIE_BITS"]

#: The absolute margin below the row's best support score at which a subtree is still searched: far above
#: the rounding of scores in [0, 1] (about 1e-15), so rounding can only add candidates.
SLACK = 1e-10
#: Scores are compared on a grid of 2^-TIE_BITS of the row's best (9.1e-13 relative), far above their
#: rounding (about 1e-16) and below SLACK: values equal but for rounding tie, and the tie rule picks among them.
TIE_BITS = 40


def _at(table: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    # On the CPU index_select beats advanced indexing several times over for a 1-D table; for rows of a few
    # entries (the (M, E) tables here) both lose to the embedding lookup (measured: 2.3 ms against 9 and 50 ms
    # for 236k rows of 10)
    if table.dim() > 1:
        return torch.nn.functional.embedding(idx, table)
    return table.index_select(0, idx.reshape(-1)).view(idx.shape)


class SimilarityTables(NamedTuple):
    """Tree tables of one metric and one kind of weights, (N,) each: ``value`` float64 T(n) (the expected
    similarity per unit of r, Ω or Ψ), ``best`` float64 T̂(n) = its maximum over the subtree of n, ``children``
    and ``rank`` int64 the children of every node by decreasing T̂ (:func:`~.support.child_order`)."""

    value: torch.Tensor
    best: torch.Tensor
    children: torch.Tensor
    rank: torch.Tensor


def _finish(h, value: torch.Tensor) -> SimilarityTables:
    best = value.clone()
    for level in reversed(h.levels[1:]):  # a loop over depth, bottom-up
        best.scatter_reduce_(0, h.parent[level], best[level], "amax")
    children, rank = child_order(h, -best, None)
    return SimilarityTables(value, best, children, rank)


def leaf_depth_weights(h, prior: torch.Tensor | None) -> torch.Tensor:
    """(N, E) float64 W_e(n): the weight (1 a leaf, or the prior) of the leaves under n at each leaf depth."""
    ends = depth_range_ends(h, torch.arange(h.num_nodes, device=h.device))
    e = ends.shape[1] // 2
    hi, lo = ends[:, :e], ends[:, e:]
    if prior is None:
        return (hi - lo).to(torch.float64)
    pre = torch.zeros(h.num_leaves + 1, dtype=torch.float64, device=h.device)
    pre[1:] = prior.to(torch.float64).index_select(0, depth_ranges(h).leaf_order).cumsum(0)
    return _at(pre, hi) - _at(pre, lo)


def wu_palmer_tables(h, prior: torch.Tensor | None, name: str | None) -> SimilarityTables:
    """:class:`SimilarityTables` of Ω(n) = Σ_e 2/(d(n) + e) Σ_{b ∈ A(n) \\ root} W_e(b); O(N·E), cached as
    ``name`` unless None."""
    def build():
        path = leaf_depth_weights(h, prior)
        path[h.root] = 0  # the root shares no level
        for level in h.levels[2:]:  # root-path sums, a loop over depth
            path[level] += path[h.parent[level]]
        e = depth_ranges(h).depths.to(torch.float64)
        # d(n) + e >= 1: every leaf sits below the root (L >= 2 on every top-k path)
        return _finish(h, (path * (2.0 / (h.depth.to(torch.float64)[:, None] + e))).sum(1))
    return build() if name is None else h.cached(name, build)


def information_gain(h) -> torch.Tensor:
    """(N,) float64 ΔI(n) = I(n) − I(parent(n)), 0 at the root (cached)."""
    def build():
        gain = h.information - h.information[h.parent_or_root]
        gain[h.root] = 0
        return gain
    return h.cached("topk_info_gain", build)


def zhao_tables(h, weights: torch.Tensor, name: str | None) -> SimilarityTables:
    """:class:`SimilarityTables` of Ψ(n) = 2 G(n)/(λ + I(n)), G(n) = Σ_{b ∈ A(n)} ΔI(b)·W(b); weights (N,)
    float64 W; O(N), cached as ``name`` unless None."""
    def build():
        g = information_gain(h) * weights
        for level in h.levels[1:]:  # root-path sums, a loop over depth
            g[level] += g[h.parent[level]]
        return _finish(h, 2 * g / (h.information + math.log(h.num_leaves)))
    return build() if name is None else h.cached(name, build)


def _runs(h, listed: Listed, rows: torch.Tensor, nodes: torch.Tensor, lower: bool = True):
    """(lo, hi) int64 of nodes' shape: the ranks in the row's sorted list of the first listed leaf under each
    node and one past its last (lo = hi off the support); rows, nodes: int64 of one shape.  ``lower=False``:
    hi alone."""
    bsz, k = listed.keys.shape
    span = h.num_leaves + 1
    offset = torch.arange(bsz, device=rows.device) * span
    keys = (listed.keys + offset[:, None]).reshape(-1)  # ascending: by row, then position
    start = _at(h.leaf_start, nodes) + rows * span
    hi = torch.searchsorted(keys, (start + _at(h.leaf_count, nodes)).reshape(-1)).view(nodes.shape) - rows * k
    if not lower:
        return hi
    return torch.searchsorted(keys, start.reshape(-1)).view(nodes.shape) - rows * k, hi


def _delta_prefix(h, listed: Listed) -> torch.Tensor:
    """(B·(k+1), E) float64: per row, prefix sums over its sorted listed leaves of δ(y) = v(y) − r·w(y) put in
    the column of y's leaf depth (row b's prefix j at b·(k+1) + j)."""
    bsz, k = listed.leaves.shape
    depths = depth_ranges(h).depths
    col = torch.searchsorted(depths, _at(h.depth, listed.leaves))
    delta = listed.vsum.diff(dim=1) - listed.rate[:, None] * listed.wsum.diff(dim=1)
    out = torch.zeros(bsz, k + 1, depths.numel(), dtype=torch.float64, device=delta.device)
    out[:, 1:].scatter_(2, col[:, :, None], delta[:, :, None])
    return out.cumsum_(1).view(bsz * (k + 1), -1)


def _wp_terms(h, depth: torch.Tensor) -> torch.Tensor:
    """(*, E) float64 2/(d + e) at the given depths (int64 of any shape), from a cached (D+1, E) table."""
    def build():
        e = depth_ranges(h).depths.to(torch.float64)
        d = torch.arange(h.max_depth + 1, device=h.device, dtype=torch.float64)
        return 2.0 / (d[:, None] + e)  # e >= 1: every leaf sits below the root (L >= 2 on every top-k path)
    return _at(h.cached("topk_wu_palmer_terms", build), depth)


def similarity_best(h, listed: Listed, weights: torch.Tensor, metric: str, tables: SimilarityTables) -> torch.Tensor:
    """(B,) int64 the node of largest expected ``metric`` ("wu_palmer" or "zhao") under the completed rows
    (ties: the deepest, then the smallest id); see the module docstring for the candidates and why they hold
    the answer.  weights: (N,) float64 W; tables: the metric's tree tables."""
    bsz, k = listed.leaves.shape
    sup = support_table(h, listed, weights, with_entry=True)
    rate = listed.rate
    r_sup = _at(rate, sup.rows)
    wp = metric == "wu_palmer"
    lam = math.log(h.num_leaves)
    # per support entry, its own term, then the root-path sums (Λ (M, E) or c (M,)) by levels (the root's own
    # term is 0 for Zhao, ΔI(root) = 0, and left out for Wu-Palmer, which counts the levels below the root)
    if wp:
        hi = _runs(h, listed, sup.rows, sup.nodes, lower=False)
        pre = _delta_prefix(h, listed)
        base = sup.rows * (k + 1)
        acc = _at(pre, base + hi) - _at(pre, base + sup.lo)
    else:
        acc = _at(information_gain(h), sup.nodes) * (sup.p - r_sup * _at(weights, sup.nodes))
    bounds = torch.searchsorted(sup.key, torch.arange(h.max_depth + 2, device=sup.key.device) * (bsz * k)).tolist()
    own_corr = own_bound = None
    if wp:
        acc[: bounds[1]] = 0
        # the support nodes' own corrections and the bound over their children's subtrees, a depth at a time:
        # the entries of a depth are one slice, whose weights 2/(d + e) are one row (a product, no (M, E) gather)
        terms = _wp_terms(h, torch.arange(h.max_depth + 1, device=h.device))
        own_corr = torch.zeros(acc.shape[0], dtype=torch.float64, device=acc.device)
        own_bound = torch.zeros_like(own_corr)
    for d in range(1, h.max_depth + 1):  # a loop over depth: a node's sum is its parent's plus its own term
        a, b = bounds[d], bounds[d + 1]
        if a == b:
            break
        par = support_entry_of(sup, sup.key[a:b] - bsz * k)
        acc[a:b] += _at(acc, par)
        if wp:
            own_corr[a:b] = acc[a:b] @ terms[d]
            own_bound[a:b] = acc[a:b].clamp_min(0) @ terms[min(d + 1, h.max_depth)] + acc[a:b].clamp_max(0) @ terms[-1]

    def correction(entry, nodes):  # entry None: the support entries themselves
        if wp and entry is None:
            return own_corr
        a = acc if entry is None else _at(acc, entry)
        if wp:
            return (a * _wp_terms(h, _at(h.depth, nodes))).sum(-1)
        return 2 * a / (_at(h.information, nodes) + lam)

    def bound(entry, parents, own=False):
        # κ̂ over the subtrees of the children of ``parents`` (anchored at ``entry``; ``own``: the entries'
        # own nodes)
        if wp and own:
            return _at(own_bound, entry)
        if wp:
            lam_e = _at(acc, entry)
            near = _wp_terms(h, (_at(h.depth, parents) + 1).clamp_max(h.max_depth))  # a node at D has no child
            far = _wp_terms(h, torch.full_like(parents, h.max_depth))
            return (lam_e.clamp_min(0) * near + lam_e.clamp_max(0) * far).sum(-1)
        c = _at(acc, entry)
        return 2 * c.clamp_min(0) / (_at(h.information, parents) + lam) + c.clamp_max(0) / lam

    values = [r_sup * _at(tables.value, sup.nodes) + correction(None, sup.nodes)]
    rows_out, nodes_out = [sup.rows], [sup.nodes]
    floor = torch.full((bsz,), float("-inf"), dtype=torch.float64, device=rate.device)
    floor = floor.scatter_reduce(0, sup.rows, values[0], "amax")
    ptr, kids, best = h.children_ptr, tables.children, tables.best
    # h.num_children is computed on each access (an O(N) difference): cached once per tree, with its maximum
    num_kids = num_children(h)
    max_kids = max_children(h)
    # the descent starts at the support nodes with children
    has = (_at(num_kids, sup.nodes) > 0).nonzero().squeeze(1)
    parents, prow, pentry = _at(sup.nodes, has), _at(sup.rows, has), has
    first = True
    while parents.numel():  # a loop over depth: one level of the descent per pass
        need = _at(floor, prow) - SLACK - bound(pentry, parents, own=first)
        r = _at(rate, prow)
        tau = torch.where(r > 0, need / r.clamp_min(torch.finfo(torch.float64).tiny),
                          torch.where(need <= 0, float("-inf"), float("inf")))
        # the number of children with T̂ >= tau: a binary search in the children by decreasing T̂
        start = _at(ptr, parents)
        lo = torch.zeros_like(parents)
        hi = _at(num_kids, parents)
        for _ in range(max_kids.bit_length()):  # a loop over the bits of the largest child count
            mid = (lo + hi) // 2
            open_ = lo < hi
            ok = open_ & (_at(best, _at(kids, (start + mid).clamp_max(max(kids.shape[0] - 1, 0)))) >= tau)
            lo = torch.where(ok, mid + 1, lo)
            hi = torch.where(open_ & ~ok, mid, hi)
        count = lo
        total = int(count.sum())
        if total == 0:
            break
        owner = torch.repeat_interleave(torch.arange(parents.shape[0], device=parents.device), count, output_size=total)
        slot = torch.arange(total, device=parents.device) - _at(torch.cumsum(count, 0) - count, owner)
        child = _at(kids, _at(start, owner) + slot)
        crow, centry = _at(prow, owner), _at(pentry, owner)
        if first:  # the children of support nodes: those on the support (a listed leaf below) are scored already
            lo, hi = _runs(h, listed, crow, child)
            off = (lo == hi).nonzero().squeeze(1)
            child, crow, centry = _at(child, off), _at(crow, off), _at(centry, off)
            first = False
        values.append(_at(rate, crow) * _at(tables.value, child) + correction(centry, child))
        rows_out.append(crow)
        nodes_out.append(child)
        floor = floor.scatter_reduce(0, crow, values[-1], "amax")  # a better node found raises the floor
        parents, prow, pentry = child, crow, centry
    # Scores equal in exact arithmetic (symmetric subtrees, equal masses) come out of these sums and of the
    # dense decoder's with different roundings: on a grid of 2^-TIE_BITS of the row's best score they tie, and
    # the dense decoder's tie rule decides, as it does for exactly equal values.  A node so chosen is within
    # 2^-TIE_BITS (9.1e-13) of the best score, relatively.
    rows_all = torch.cat(rows_out)
    scale = torch.where(floor > 0, 2.0**TIE_BITS / floor, 2.0**TIE_BITS)  # floor: each row's best score now
    score = torch.round(torch.cat(values) * _at(scale, rows_all))
    return argbest_pairs(h, score, rows_all, torch.cat(nodes_out), bsz, higher_is_better=True)


def expected_wu_palmer(h, listed: Listed, tables: SimilarityTables, pred: torch.Tensor) -> torch.Tensor:
    """(B,) float64 E[WP(pred, y)] under the completed rows: r·Ω(pred) + Σ_e 2Λ_e/(d(pred) + e), Λ summed over
    pred's root path (the runs of its ancestors in the row's list, empty off the support).  pred: (B,) int64.
    O(B·D·(log k + E))."""
    bsz, k = listed.leaves.shape
    path = walk_up(h, pred, h.max_depth)  # (B, D+1), the root repeated above it
    rows = torch.arange(bsz, device=pred.device)[:, None].expand_as(path)
    lo, hi = _runs(h, listed, rows, path)
    pre = _delta_prefix(h, listed)
    base = rows * (k + 1)
    below_root = (path != h.root).to(torch.float64)[..., None]
    lam = ((_at(pre, base + hi) - _at(pre, base + lo)) * below_root).sum(1)  # (B, E)
    corr = (lam * _wp_terms(h, _at(h.depth, pred))).sum(1)
    return listed.rate * _at(tables.value, pred) + corr


def expected_zhao(h, node_mass, pred: torch.Tensor) -> torch.Tensor:
    """(B,) float64 E[Zhao(pred, y)] = 2/(I(pred) + λ)·Σ_{b ∈ A(pred)} ΔI(b)·p̃(b); ``node_mass``: (B, J) int64
    nodes → (B, J) float64 p̃ (:meth:`CompletedTopK.node_mass`).  pred: (B,) int64.  O(B·D·log k)."""
    path = walk_up(h, pred, h.max_depth)  # the root repeated above pred: ΔI(root) = 0
    s = (_at(information_gain(h), path) * node_mass(path)).sum(1)
    return 2 * s / (_at(h.information, pred) + math.log(h.num_leaves))
