"""Every row's top-down path, with float64 node probabilities read from one prefix sum per row.

The *top-down path* of a row starts at the root and steps to the most probable child (the smallest id
among equally probable ones) until a leaf: ``t_0 = root, t_1, ..., t_K``.  Its thresholds are
``q_k = min(p(t_1), ..., p(t_k))``.

**Node probabilities.**  The leaves are laid out in *the leaf order*: depth-first, the children of a
node visited by increasing smallest leaf id.  Every node's leaves are one run ``[lo(n), hi(n))`` of it,
and ``p(n) = P[hi(n)] − P[lo(n)]`` with P the float64 prefix sums of the row's leaf probabilities in
that order.  When the leaf ids already follow a depth-first listing of the tree (any order of
children), the leaf order is the identity and the rows are summed without being reordered.  Every
kernel here reads p(n) that way, so a row's thresholds are the same bits whichever kernel, batch or
chunk computes them: a threshold fitted on some rows and the decoding of others compare equal values.

Two kernels walk the path:

- :func:`best_child`, one step for every row (a loop over depth): a (B, K_d) window of the current
  nodes' children, K_d the widest node at depth d.  O(B·(L + Σ_d K_d)) for a whole descent.
- :func:`miss_critical_values`, for a row whose target leaf y is known: the largest λ at which
  descending "while the most probable child has p > λ" leaves y's branch.  The path can only leave
  y's branch at a child of one of y's ancestors, so the row's window is fixed by y: the children of
  every ancestor, read in one gather, with no step depending on the previous one.  O(B·(L + E)) for
  E the most bounds of such children along a leaf's ancestors.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .descent import widest_by_depth

__all__ = ["leaf_layout", "leaf_prefix", "prefix_width", "child_slots", "best_child", "descend", "miss_chains",
           "miss_critical_values", "MISS_CHAIN_MAX_ENTRIES"]

#: :func:`leaf_prefix` scans each row in segments of this many entries (``python -m benchmarks.risk_control``
#: times the fit by segment length with ``--segments``).
PREFIX_SEGMENT = 16
#: :func:`miss_chains` builds its (L, E) and (L, D) tables only up to this many entries in all (2E + D per
#: leaf); beyond it (very wide nodes on the way to many leaves) it returns None and callers walk the path.
MISS_CHAIN_MAX_ENTRIES = 2**24


def leaf_layout(h) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(order, bounds)``, cached: ``order`` (L,) int64 the leaf ids in the leaf order, or None when it is
    the identity; ``bounds`` (N, 2) int64 ``[lo(n), hi(n))``, node n's leaves in that order.

    Built in O(N log N) with a loop over depth.
    """
    def build():
        t = h._tree
        n, num_leaves = h.num_nodes, h.num_leaves
        levels = [lvl.cpu().numpy() for lvl in h.levels]
        smallest = np.arange(n, dtype=np.int64)  # leaves are 0..L-1; inner nodes get their smallest leaf below
        smallest[num_leaves:] = num_leaves
        for lvl in reversed(levels[1:]):
            np.minimum.at(smallest, t.parent[lvl], smallest[lvl])
        # a node starts where its parent starts, after the leaves of the siblings with smaller leaves
        kids = np.flatnonzero(t.parent >= 0)
        ranked = kids[np.lexsort((smallest[kids], t.parent[kids]))]
        count = t.leaf_count[ranked]
        before = np.cumsum(count) - count
        first = np.r_[True, t.parent[ranked][1:] != t.parent[ranked][:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(ranked.size), 0))
        offset = np.zeros(n, dtype=np.int64)
        offset[ranked] = before - before[group_start]
        lo = np.zeros(n, dtype=np.int64)
        for lvl in levels[1:]:
            lo[lvl] = lo[t.parent[lvl]] + offset[lvl]
        bounds = np.stack([lo, lo + t.leaf_count], 1)
        order = np.empty(num_leaves, dtype=np.int64)
        order[lo[:num_leaves]] = np.arange(num_leaves)
        identity = bool((order == np.arange(num_leaves)).all())
        dev = h.device
        return (None if identity else torch.as_tensor(order, device=dev)), torch.as_tensor(bounds, device=dev)
    return h.cached("top_down_path.leaf_layout", build)


def prefix_width(h) -> int:
    """The number of columns of :func:`leaf_prefix`'s buffer: L + 1 rounded up to whole segments."""
    return -(-(h.num_leaves + 1) // PREFIX_SEGMENT) * PREFIX_SEGMENT


def leaf_prefix(h, probs: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """probs: (B, L) float -> (B, L + 1) float64 prefix sums of the leaves in the leaf order: column j holds
    the sum of the first j leaves.

    Summed as independent scans of ``PREFIX_SEGMENT`` entries, then one scan of their totals added to
    each segment: a row's single scan is a chain of dependent additions, which short independent chains
    let the CPU overlap.  Each row is summed the same way whatever its batch, and the sums never
    decrease along a row (every rounding is monotone).  ``out``: a contiguous (B, :func:`prefix_width`)
    float64 buffer to work in; the result is a view of it.  O(B·L), a fixed number of operators.
    """
    if out is None:
        out = probs.new_empty((probs.shape[0], prefix_width(h)), dtype=torch.float64)
    segments, before = _scan_segments(h, probs, out)
    segments[:, 1:] += before[:, :, None]
    return out[:, :h.num_leaves + 1]


def _scan_segments(h, probs: torch.Tensor, out: torch.Tensor):
    """:func:`leaf_prefix` but the last addition: ``(segments, before)``, the (B, S, PREFIX_SEGMENT) view of
    ``out`` holding each segment's own prefix sums (the first one's being final) and (B, S − 1) float64
    the sum of everything before segments 1..S − 1.  Column j's prefix sum is
    ``segments[j // M, j % M] + before[j // M − 1]`` from the second segment on."""
    order, _ = leaf_layout(h)
    rows, n, width = probs.shape[0], h.num_leaves, out.shape[1]
    out[:, 0] = 0.0
    out[:, 1:n + 1] = probs if order is None else probs.index_select(1, order)
    out[:, n + 1:] = 0.0
    segments = out.view(rows, width // PREFIX_SEGMENT, PREFIX_SEGMENT)
    segments.cumsum_(2)
    return segments, segments[:, :-1, -1].cumsum(1)


def child_slots(h):
    """``(span, pos, child, offsets)``, cached: the children windows of :func:`best_child`.

    Node n owns the slots ``span[n, 0] .. span[n, 1]``: one per child in increasing id order, then an
    end slot.  A slot's ``child`` is the child (n itself at the end slot) and ``pos`` (2N − 1, 2) its
    ``[lo, hi)`` in the leaf order (an empty run at the end slot, p = 0).  ``offsets[d]`` is
    ``arange(max(K_d, 1))``, the window of a node at depth d.
    """
    def build():
        n, dev = h.num_nodes, h.device
        _, bounds = leaf_layout(h)
        ptr, kids = h.children_ptr, h.children
        start = ptr[:-1] + torch.arange(n, device=dev)
        end = start + (ptr[1:] - ptr[:-1])
        par = h.parent[kids]
        slot = start[par] + torch.arange(kids.numel(), device=dev) - ptr[par]
        pos = torch.empty(2 * n - 1, 2, dtype=torch.long, device=dev)
        child = torch.empty(2 * n - 1, dtype=torch.long, device=dev)
        pos[slot], child[slot] = bounds[kids], kids
        pos[end], child[end] = bounds[:, :1].expand(-1, 2), torch.arange(n, device=dev)
        offsets = [torch.arange(max(k, 1), device=dev) for k in widest_by_depth(h)]
        return torch.stack([start, end], 1), pos, child, offsets
    return h.cached("top_down_path.child_slots", build)


def best_child(slots, prefix: torch.Tensor, cur: torch.Tensor, depth: int):
    """One step down every row's top-down path, from ``cur`` (B,) int64 (nodes at ``depth``, or leaves).

    slots: :func:`child_slots`; prefix: (B, L + 1) float64 :func:`leaf_prefix`.  Returns ``(real, child,
    p)``: (B,) bool, the node has children; (B,) int64, its most probable child (the smallest id among
    equally probable ones), the node itself without children; (B,) float64, that child's probability,
    0 without children.  Reads a (B, K_d) window of slots and gathers 2·B·K_d prefix sums.
    """
    span, pos, child, offsets = slots
    first, last = span.index_select(0, cur).unbind(1)
    at = torch.minimum(first[:, None] + offsets[depth], last[:, None])  # padding: the end slot, p = 0
    b, k = at.shape
    runs = prefix.gather(1, pos.index_select(0, at.reshape(-1)).view(b, 2 * k)).view(b, k, 2)
    best, j = (runs[..., 1] - runs[..., 0]).max(1)  # the first maximum: the smallest child id
    return last > first, child.take(first + j), best


def descend(h, probs: torch.Tensor, lam: float) -> torch.Tensor:
    """From the root, step to the most probable child while its p > ``lam``: (B,) int64 node ids.

    probs: (B, L) float checked probabilities; lam ≥ 0.  O(B·(L + Σ_d K_d)), a loop over depth.
    """
    prefix, slots = leaf_prefix(h, probs), child_slots(h)
    cur = torch.full((probs.shape[0],), h.root, dtype=torch.long, device=probs.device)
    walking = torch.ones_like(cur, dtype=torch.bool)
    for depth in range(h.max_depth):
        _, child, p = best_child(slots, prefix, cur, depth)
        walking &= p > lam  # p = 0 without children: a leaf stops, as λ ≥ 0
        cur = torch.where(walking, child, cur)
    return cur


def miss_chains(h):
    """The window of :func:`miss_critical_values`, cached: ``(runs, bar, on, rank)``, or None when the tables
    would exceed ``MISS_CHAIN_MAX_ENTRIES`` entries (or a tree of one node, whose paths cannot leave a branch).

    Row y of each table walks y's ancestors a_0 = root, ..., a_{d(y)−1}.  ``runs`` (L, E) int64: for each
    ancestor, the K + 1 bounds in the leaf order of its K children's runs, children in the leaf order
    (so that consecutive bounds enclose one child); E positions in all, the last one repeated as
    padding.  Entry i, between positions i and i + 1, is a child of one ancestor, *junk* between two
    ancestors' bounds, or padding.  ``bar`` (L, E − 1) int64: which bound a child of a_k must reach to
    be preferred to y's ancestor a_{k+1}: k (p ≥ p(a_{k+1}): a smaller id wins ties), D + k
    (p > p(a_{k+1}): a larger id) or 2D (never: a_{k+1} itself, junk and padding).  ``on`` (L, D) int64:
    the entry of a_{k+1} for k < d(y) (0 beyond).  ``rank`` (L, E − 1): D − k for a child of a_k, 0 on
    junk and padding, in the smallest integer type that holds D.  Built in O(L·E), a loop over depth.
    """
    def build():
        t = h._tree
        num_leaves, d_max = h.num_leaves, h.max_depth
        degree = t.children_ptr[1:] - t.children_ptr[:-1]
        # E first, in O(N): the (L, D + 1) tables below are what the size check is there to avoid
        bounds_above = np.zeros(h.num_nodes, dtype=np.int64)  # Σ (K + 1) over a node's proper ancestors
        for lvl in h.levels[1:]:
            lvl = lvl.cpu().numpy()
            bounds_above[lvl] = bounds_above[t.parent[lvl]] + degree[t.parent[lvl]] + 1
        if num_leaves * (2 * int(bounds_above[:num_leaves].max()) + d_max) > MISS_CHAIN_MAX_ENTRIES:
            return None
        lo, hi = (b.cpu().numpy() for b in leaf_layout(h)[1].unbind(1))
        kids = t.children[np.lexsort((lo[t.children], t.parent[t.children]))]  # each node's children in leaf order
        # y's ancestors by depth, y itself at d(y) (−1 beyond)
        anc = np.full((num_leaves, d_max + 1), -1, dtype=np.int64)
        node = np.arange(num_leaves)
        for _ in range(d_max + 1):
            live = node >= 0
            anc[np.flatnonzero(live), t.depth[node[live]]] = node[live]
            node = np.where(live, t.parent[np.maximum(node, 0)], -1)
        owner = anc[:, :-1]  # a_k, whose children's bounds come at depth k (−1 once k ≥ d(y))
        count = np.where(owner >= 0, degree[np.maximum(owner, 0)] + 1, 0)  # K + 1 bounds
        width = int(count.sum(1).max())
        if width == 0:
            return None
        rows, ks = np.nonzero(count)
        reps = count[rows, ks]
        row_of, k_of = np.repeat(rows, reps), np.repeat(ks, reps)
        a = owner[row_of, k_of]
        j = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)  # bound j of a's K + 1
        col = np.repeat((np.cumsum(count, 1) - count)[rows, ks], reps) + j
        is_kid = j < degree[a]
        kid = kids[np.minimum(t.children_ptr[a] + j, max(kids.size - 1, 0))]
        # each row's last position (its last ancestor's end) repeated as padding; flat indices: 2-D fancy
        # indexing is several times slower on the millions of entries of a large tree
        runs = np.repeat(hi[owner[np.arange(num_leaves), (count > 0).sum(1) - 1]], width).reshape(num_leaves, width)
        runs.reshape(-1)[row_of * width + col] = np.where(is_kid, lo[kid], hi[a])
        r, c, k, kid = row_of[is_kid], col[is_kid], k_of[is_kid], kid[is_kid]
        flat = r * (width - 1) + c
        on_path = anc[r, k + 1]
        bar = np.full((num_leaves, width - 1), 2 * d_max, dtype=np.int64)
        bar.reshape(-1)[flat] = np.where(kid < on_path, k, np.where(kid > on_path, d_max + k, 2 * d_max))
        rank = np.zeros((num_leaves, width - 1), dtype=_rank_dtype(d_max))
        rank.reshape(-1)[flat] = d_max - k
        on = np.zeros((num_leaves, d_max), dtype=np.int64)
        mine = kid == on_path
        on.reshape(-1)[r[mine] * d_max + k[mine]] = c[mine]
        return tuple(torch.as_tensor(np.ascontiguousarray(a), device=h.device) for a in (runs, bar, on, rank))
    return h.cached("top_down_path.miss_chains", build)


def _rank_dtype(d_max: int):
    for dtype in (np.uint8, np.int16, np.int32):
        if d_max <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def miss_critical_values(h, chains, probs: torch.Tensor, targets: torch.Tensor, prefix_rows: int | None = None):
    """Each row's critical value s: descending "while the most probable child has p > λ" ends outside the
    target's branch (the target is not under the answer) iff λ < s.

    chains: :func:`miss_chains` (not None); probs: (B, L) float checked probabilities; targets: (B,) int64
    leaf ids; ``prefix_rows``: the prefix sums are built and read that many rows at a time (all at once
    by default), so that each block is still in the cache when it is read.  Returns ``(s, leaves)``:
    (B,) float64, and (B,) bool whether the path leaves the target's branch at all (s = 0 when it does
    not: the path ends at the target, never missed).

    With a_0 .. a_{d(y)} the target's ancestors, the path follows them while a_{k+1} is the most
    probable child of a_k; at the first depth m where it is not, the path steps to the best child
    t_{m+1} ≠ a_{m+1} and s = q_{m+1} = min(p(a_1), ..., p(a_m), p(t_{m+1})) = p(t_{m+1}): a child's
    run lies inside its parent's and P is non-decreasing, so even in floating point a child's p is at
    most its parent's.  The same p(n) and tie rule as :func:`best_child`, so s equals the threshold a
    walk finds there, bit for bit.  O(B·(L + E)), a fixed number of operators besides about ten per
    block of the prefix sums.
    """
    runs_table, bar_table, on_table, rank_table = chains
    batch, width = probs.shape[0], runs_table.shape[1]
    runs = runs_table.index_select(0, targets)
    step = max(1, prefix_rows or batch)
    bounds = probs.new_empty((batch, width), dtype=torch.float64)
    block = probs.new_empty((min(step, batch), prefix_width(h)), dtype=torch.float64)
    # the segments' offsets are added at the E gathered positions only, not at all L + 1
    offsets = probs.new_zeros((min(step, batch), block.shape[1] // PREFIX_SEGMENT), dtype=torch.float64)
    shift = PREFIX_SEGMENT.bit_length() - 1
    # a shift where it can: an integer division is several times slower
    segment_of = runs >> shift if PREFIX_SEGMENT == 1 << shift else runs // PREFIX_SEGMENT
    for a in range(0, batch, step):  # blocks of rows: the prefix sums are read while still in the cache
        rows = slice(a, a + step)
        size = bounds[rows].shape[0]
        _, offsets[:size, 1:] = _scan_segments(h, probs[rows], block[:size])
        torch.gather(block[:size], 1, runs[rows], out=bounds[rows])
        bounds[rows] += offsets[:size].gather(1, segment_of[rows])
    p = bounds.diff(dim=1)  # (B, E − 1) the children of the target's ancestors
    on = p.gather(1, on_table.index_select(0, targets))  # (B, D) p(a_{k+1})
    inf = on.new_full((batch, 1), math.inf)
    bar = torch.cat([on, torch.nextafter(on, inf), inf], 1).gather(1, bar_table.index_select(0, targets))
    rank = rank_table.index_select(0, targets)  # D − k, 0 on junk and padding
    first = ((p >= bar) * rank).amax(1, keepdim=True)  # D − m, m the first depth the path leaves (0: none)
    best = torch.where(rank == first, p, -1.0).amax(1)  # p(t_{m+1})
    leaves = first[:, 0] > 0
    return torch.where(leaves, best, 0.0), leaves
