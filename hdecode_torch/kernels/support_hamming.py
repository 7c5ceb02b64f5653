"""Hamming loss on a completed top-k distribution, on its support: never B × L or B × N.

The Hamming loss's node weight is W(n) = Σ_{l ∈ L(n)} q(l)/(d(l)+1): the completed masses q of
:mod:`hdecode_torch.kernels.support` (q(l) = v(l) listed, r·w(l) unlisted), each leaf scaled by
s(l) = 1/(d(l)+1).  It is a node mass of the same form with the scaled leaf masses,

    W(n) = S'(n) + r·(W'(n) − C'(n)),

S'(n) and C'(n) the sums of v·s and of w·s over the listed leaves under n, W'(n) = Σ_{l ∈ L(n)} w(l)·s(l)
a tree table, and r the completion's rate, unchanged (it spreads m over Σ_{unlisted} w, not w·s).  So the
support kernels read it through a :class:`~hdecode_torch.kernels.support.Listed` whose prefix sums are of
v·s and w·s and whose rate is the completion's (:func:`inverse_depth_listed`), with W' as the weights
(:func:`inverse_depth_weights`).

The optimal set is {n : W(n) > W(root)/2}.  W is additive over disjoint subtrees and non-negative, so two
disjoint nodes cannot both pass and the set is one root path: the ancestor closure of its deepest node,
which :func:`~hdecode_torch.kernels.support.support_deepest_above` finds with the per-row threshold
W(root)/2 (off the support W = r·W', the same closed-form descent by largest W').

The certificate (:func:`hamming_certificate`) bounds D(n) = 2W(n) − W(root) over every completion the list
is consistent with (:func:`gap_bounds`): the decision's deepest node must keep D ≥ 0 and its children D ≤ 0.

Every function computes in float64.  Cost: O(B·k·log k) for the scaled list, O(B·k·D) for the decision,
O(nnz·log(B·k)) for sums over sparse sets, plus O(N) tree tables (cached for the uniform completion,
built per call for a prior).
"""

from __future__ import annotations

import torch

from .support import Listed, _at, leaf_ranks, support_deepest_above

__all__ = ["inverse_depth", "inverse_depth_weights", "inverse_depth_listed", "root_mass", "flat_node_mass",
           "support_hamming_path"]


def inverse_depth(h) -> torch.Tensor:
    """(L,) float64 s(l) = 1/(d(l)+1), cached."""
    return h.cached("topk_inverse_leaf_depth", lambda: 1.0 / (h.leaf_depth.to(torch.float64) + 1))


def _subtree_sums(h, leaf_weights: torch.Tensor) -> torch.Tensor:
    """(N,) float64 Σ_{l ∈ L(n)} leaf_weights(l), bottom-up by levels: each node sums its own subtree only
    (prefix-sum differences over the whole tree would carry the rounding of the whole tree's total)."""
    acc = torch.zeros(h.num_nodes, dtype=torch.float64, device=h.device)
    acc[: h.num_leaves] = leaf_weights
    for level in reversed(h.levels[1:]):
        acc.index_add_(0, _at(h.parent, level), _at(acc, level))
    return acc


def inverse_depth_weights(h, prior: torch.Tensor | None) -> torch.Tensor:
    """(N,) float64 W'(n) = Σ_{l ∈ L(n)} w(l)/(d(l)+1): w = 1 (``prior=None``, cached) or a (L,) float64
    prior (O(N), not cached)."""
    if prior is None:
        return h.cached("topk_inverse_depth_weights", lambda: _subtree_sums(h, inverse_depth(h)))
    return _subtree_sums(h, prior.to(torch.float64) * inverse_depth(h))


def inverse_depth_listed(h, listed: Listed, values: torch.Tensor, indices: torch.Tensor,
                         prior: torch.Tensor | None) -> Listed:
    """The :class:`Listed` of the scaled masses: ``listed``'s keys, leaves and rate, prefix sums of v·s and
    w·s in the same order.

    values: (B, k) float64, indices: (B, k) int64 (the rows of ``listed``), prior: None or (L,) float64.
    O(B·k·log k) (the depth-first positions are distinct: the sort gives ``listed``'s order).
    """
    bsz = indices.shape[0]
    order = _at(leaf_ranks(h), indices).sort(dim=1).indices
    s = _at(inverse_depth(h), listed.leaves)
    v = values.to(torch.float64).gather(1, order) * s
    w = s if prior is None else _at(prior.to(torch.float64), listed.leaves) * s
    zero = torch.zeros(bsz, 1, dtype=torch.float64, device=v.device)
    return Listed(listed.keys, listed.leaves, torch.cat([zero, v.cumsum(1)], 1), torch.cat([zero, w.cumsum(1)], 1),
                  listed.rate, listed.compact)


def root_mass(h, listed: Listed, weights: torch.Tensor) -> torch.Tensor:
    """(B,) float64 the node mass of the root, S(root) + r·(W(root) − C(root)), computed as the support
    table computes it (the same rounding: the root passes W(root)/2 whenever W(root) > 0)."""
    free = (weights[h.root] - (listed.wsum[:, -1] - listed.wsum[:, 0])).clamp_min(0)
    return listed.vsum[:, -1] - listed.vsum[:, 0] + listed.rate * free


def _flat_runs(h, listed: Listed, rows: torch.Tensor, nodes: torch.Tensor):
    """(base, lo, hi) (M,) int64 of (row, node) pairs: the row's prefix-sum offset and the ranks of the node's
    first and past-last listed leaves.  The rows' sorted positions are one ascending array once row b's are
    offset by b·L: two binary searches in it per pair, O(M·log(B·k)) time and O(M + B·k) memory (no (M, k)
    table of the rows' lists)."""
    bsz, k = listed.keys.shape
    nl = h.num_leaves
    offset = torch.arange(bsz, device=rows.device)[:, None] * nl
    keys = (listed.keys + offset).reshape(-1)
    start = _at(h.leaf_start, nodes) + rows * nl
    lo = torch.searchsorted(keys, start) - rows * k
    hi = torch.searchsorted(keys, start + _at(h.leaf_count, nodes)) - rows * k
    return rows * (k + 1), lo, hi


def flat_node_mass(h, listed: Listed, weights: torch.Tensor, rows: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """(M,) float64 node masses S(n) + r·(W(n) − C(n)) of (row, node) pairs, rows and nodes (M,) int64;
    O(M·log(B·k)) (:func:`_flat_runs`)."""
    base, lo, hi = _flat_runs(h, listed, rows, nodes)
    vsum, wsum = listed.vsum.reshape(-1), listed.wsum.reshape(-1)
    s = _at(vsum, base + hi) - _at(vsum, base + lo)
    free = (_at(weights, nodes) - (_at(wsum, base + hi) - _at(wsum, base + lo))).clamp_min(0)
    return s + _at(listed.rate, rows) * free


def support_hamming_path(h, listed: Listed, weights: torch.Tensor, indices: torch.Tensor,
                         heavy_name: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(deepest, some)``: (B,) int64 the deepest node with W(n) > W(root)/2 and (B,) bool whether any node
    passes (W(root) > 0).

    listed, weights: the scaled list and W' (:func:`inverse_depth_listed`, :func:`inverse_depth_weights`);
    indices: (B, k) int64 listed leaves; ``heavy_name`` caches the children's order by W' (None: built here).
    O(B·k·D).
    """
    root = root_mass(h, listed, weights)
    deepest = support_deepest_above(h, listed, weights, indices, 0.5 * root, heavy_name)
    return deepest, root > 0



# ------------------------------------------------------------------------------------------ certificate
def outside_leaf_depths(h) -> tuple[torch.Tensor, torch.Tensor]:
    """((N,) int64, (N,) int64) the least and the greatest depth of a leaf outside each node's subtree (D+1 and
    −1 where every leaf is under the node), cached.  A node's outside is its parent's outside and its siblings'
    subtrees: per parent the best and second-best child, then top-down by levels, O(N)."""
    def build():
        n = h.num_nodes
        dev = h.device
        kids = (h.parent >= 0).nonzero().squeeze(1)
        par = _at(h.parent, kids)
        out = []
        for vals, red, fill, pick in ((h.min_leaf_depth, "amin", h.max_depth + 1, torch.minimum),
                                      (h.max_leaf_depth, "amax", -1, torch.maximum)):
            v = _at(vals.to(torch.int64), kids)

            def reduce(index, src):
                return torch.full((n,), fill, dtype=torch.int64, device=dev).scatter_reduce(0, index, src, red)
            best = reduce(par, v)
            first = torch.full((n,), n, dtype=torch.int64, device=dev).scatter_reduce(
                0, par, torch.where(v == _at(best, par), kids, n), "amin")
            others = kids != _at(first, par)
            second = reduce(par[others], v[others])
            sib = torch.full((n,), fill, dtype=torch.int64, device=dev)
            sib[kids] = torch.where(others, _at(best, par), _at(second, par))
            res = torch.full((n,), fill, dtype=torch.int64, device=dev)
            for level in h.levels[1:]:
                res[level] = pick(_at(res, _at(h.parent, level)), _at(sib, level))
            out.append(res)
        return tuple(out)
    return h.cached("topk_hamming_outside_depths", build)


def _inverse(depth: torch.Tensor) -> torch.Tensor:
    return 1.0 / (depth.to(torch.float64) + 1)


def gap_bounds(h, listed: Listed, poly, rows: torch.Tensor, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) (M,) float64: bounds of D(n) = 2W(n) − W(root) over the completions of the polytope ``poly``
    (:class:`~hdecode_torch.kernels.certificate.Polytope`), for (row, node) pairs (M,) int64; ``listed`` the
    scaled list (:func:`inverse_depth_listed`).  O(M·log(B·k)).

    D(n) = 2S'(n) − S'(root) + Σ_{u inside n} q_u s(u) − Σ_{u outside} q_u s(u) over the unlisted leaves u.
    The mass t placed inside n lies in [max(0, m − c·b), min(m, c·a)] (a, b the unlisted leaves inside and
    outside, each at most c), and s lies in [1/(d_max+1), 1/(d_min+1)] for the leaf depths inside n (resp.
    outside it, :func:`outside_leaf_depths`), so D ≥ 2S' − S'(root) + t·s_in,min − (m − t)·s_out,max, increasing
    in t: lo at the least t; hi likewise at the greatest t with the other ends of the depth ranges.
    """
    base, lo, hi = _flat_runs(h, listed, rows, nodes)
    vsum = listed.vsum.reshape(-1)
    inside = _at(vsum, base + hi) - _at(vsum, base + lo)
    core = 2 * inside - _at(listed.vsum[:, -1], rows)
    a = (_at(h.leaf_count, nodes) - (hi - lo)).to(torch.float64)
    m, c = _at(poly.missing, rows), _at(poly.cap, rows)
    b = _at(poly.unlisted, rows) - a
    t_hi = torch.minimum(m, c * a)
    t_lo = torch.minimum((m - c * b).clamp_min(0), t_hi)
    out_lo, out_hi = outside_leaf_depths(h)
    has_out = _at(out_hi, nodes) >= 0
    s_out_max = torch.where(has_out, _inverse(_at(out_lo, nodes)), 0.0)
    s_out_min = torch.where(has_out, _inverse(_at(out_hi, nodes).clamp_min(0)), 0.0)
    lo_d = core + t_lo * _inverse(_at(h.max_leaf_depth, nodes)) - (m - t_lo) * s_out_max
    hi_d = core + t_hi * _inverse(_at(h.min_leaf_depth, nodes)) - (m - t_hi) * s_out_min
    return lo_d, hi_d


def hamming_certificate(h, listed: Listed, weights: torch.Tensor, poly, sets: torch.Tensor):
    """``(certified (B,) bool, regret_bound (B,) float64)`` of closed sets A(n*) (coalesced sparse COO bool
    (B, N): a root path per row, or empty) under every completion of ``poly``.

    The expected loss of a closed set S is 1 − Σ_{n ∈ S} D(n), D(n) = 2W(n) − W(root); the optimum under a
    completion q is {n : D_q(n) > 0}, a root path.  So A(n*) is optimal under q iff D_q(n*) ≥ 0 and
    D_q(x) ≤ 0 for every child x of n* (a descendant has a smaller W, a node off the path a disjoint
    subtree: it and n* cannot both pass), and, each condition being on one node, certified iff
    lo(n*) ≥ 0 and hi(x) ≤ 0 for every child x (:func:`gap_bounds`; conservative where the bounds are not
    tight).  The regret of A(n*) against the optimum T under q is Σ_{T∖S} D − Σ_{S∖T} D: the second sum is
    at most Σ_{a ∈ A(n*)} max(0, −lo(a)); T∖S is a chain below a child x of some z ∈ A(n*), off n*'s path,
    of at most height(z) nodes each with D ≤ D(x) ≤ hi(x), so

        regret ≤ Σ_{a ∈ A(n*)} max(0, −lo(a)) + max_z height(z)·max(0, P(z)),

    P(z) the largest hi over those children: the support children from the support table, and for the
    children holding no listed leaf one bound (S' = 0, at most the largest child's leaves, the shallowest
    leaf under z, the deepest leaf of the tree outside).  An empty set (W(root) = 0 under q0) is certified iff
    hi(root) ≤ 0, its regret at most (height(root) + 1)·max(0, hi(root)).  O(B·k·D) (the support table) plus
    O(nnz·log(B·k)).
    """
    from .support import support_table

    bsz = poly.missing.shape[0]
    n, d = h.num_nodes, h.max_depth
    dev = poly.missing.device
    rows_e, nodes_e = sets.indices()
    depth_e = _at(h.depth, nodes_e)
    top = torch.full((bsz,), -1, dtype=torch.int64, device=dev).scatter_reduce(0, rows_e, depth_e * n + nodes_e,
                                                                                "amax")
    some = top >= 0
    deep = torch.where(some, top % n, h.root)
    lo_e, _ = gap_bounds(h, listed, poly, rows_e, nodes_e)
    loss_in = torch.zeros(bsz, dtype=torch.float64, device=dev).index_add_(0, rows_e, (-lo_e).clamp_min(0))
    at_deep = torch.full((bsz,), float("inf"), dtype=torch.float64, device=dev).scatter_reduce(
        0, rows_e, torch.where(nodes_e == _at(deep, rows_e), lo_e, float("inf")), "amin")
    # P(z), z the path node at each depth: the support children off the path
    sup = support_table(h, listed, weights)
    par = _at(h.parent_or_root, sup.nodes)
    dn = _at(deep, sup.rows)

    def on_path(x):  # x an ancestor of the row's n* or n* itself (leaf runs nest; depth tells chains apart)
        s, e = _at(h.leaf_start, x), _at(h.leaf_start, x) + _at(h.leaf_count, x)
        ds = _at(h.leaf_start, dn)
        return (_at(h.depth, x) <= _at(h.depth, dn)) & (s <= ds) & (ds + _at(h.leaf_count, dn) <= e)
    child = (sup.nodes != h.root) & on_path(par)
    slot = sup.rows * (d + 1) + (sup.depth - 1).clamp_min(0)
    pick = child.nonzero().squeeze(1)
    counts = torch.zeros(bsz * (d + 1), dtype=torch.int64, device=dev).index_add_(
        0, _at(slot, pick), torch.ones_like(pick))
    off = (child & ~on_path(sup.nodes)).nonzero().squeeze(1)
    _, hi_s = gap_bounds(h, listed, poly, _at(sup.rows, off), _at(sup.nodes, off))
    best = torch.full((bsz * (d + 1),), float("-inf"), dtype=torch.float64, device=dev).scatter_reduce(
        0, _at(slot, off), hi_s, "amax")
    # the children of z with no listed leaf: one bound, where z has more children than support children
    def largest_child():
        kids = (h.parent >= 0).nonzero().squeeze(1)
        return torch.zeros(n, dtype=torch.int64, device=dev).scatter_reduce(
            0, _at(h.parent, kids), _at(h.leaf_count, kids), "amax")
    widest = h.cached("topk_hamming_largest_child", largest_child)
    m, c = _at(poly.missing, rows_e), _at(poly.cap, rows_e)
    t_hi = torch.minimum(m, c * _at(widest, nodes_e).to(torch.float64))
    s_floor = 1.0 / (int(h.max_leaf_depth.max()) + 1)
    hi_free = (-_at(listed.vsum[:, -1], rows_e) + t_hi * _inverse(_at(h.min_leaf_depth, nodes_e))
               - (m - t_hi) * s_floor)
    slot_e = rows_e * (d + 1) + depth_e
    free = _at(h.num_children, nodes_e) > _at(counts, slot_e)
    p_e = torch.maximum(_at(best, slot_e), torch.where(free, hi_free, float("-inf")))
    beyond = torch.zeros(bsz, dtype=torch.float64, device=dev).scatter_reduce(
        0, rows_e, _at(h.height, nodes_e).to(torch.float64) * p_e.clamp_min(0), "amax")
    p_deep = torch.full((bsz,), float("-inf"), dtype=torch.float64, device=dev).scatter_reduce(
        0, rows_e, torch.where(nodes_e == _at(deep, rows_e), p_e, float("-inf")), "amax")
    certified = some & (at_deep >= 0) & (p_deep <= 0)
    bound = torch.where(certified, 0.0, loss_in + beyond)
    # rows with the empty set: the optimum under q is a chain from the root, each D at most hi(root)
    root = torch.full((bsz,), h.root, dtype=torch.int64, device=dev)
    _, hi_root = gap_bounds(h, listed, poly, torch.arange(bsz, device=dev), root)
    empty_ok = hi_root <= 0
    certified = torch.where(some, certified, empty_ok)
    bound = torch.where(some, bound, torch.where(empty_ok, 0.0, (h.max_depth + 1) * hi_root.clamp_min(0)))
    return certified, bound
