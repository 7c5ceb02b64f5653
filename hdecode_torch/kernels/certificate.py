"""Certificates of top-k decisions: optimal under every completion consistent with the list, or a regret bound.

A row lists k leaves with masses v(l); its unlisted leaves U (|U| = L − k) hold the missing mass m.  The
decision is exact for one completion q0 (uniform, or a prior's); the truth may be any completion the list
is consistent with, the **polytope**

    Q = { q ∈ R^U : 0 ≤ q_u ≤ c, Σ_u q_u = m },    c = max(v_k, m / |U|),

v_k the row's smallest listed value: no unlisted leaf outweighs a listed one.  (c = v_k whenever the list
is some distribution's top k, for then m ≤ v_k·|U|; a list that is not, e.g. thresholded and rescaled,
whose m cannot fit under v_k, gets the smallest cap that holds it, under which q0 uniform is in Q.  A row
with no unlisted leaf has m = 0 here, as in its completion: Q is the point q0.)  The same Q is used with
a prior: the certificate is about the truth, whatever completion was used to decide.

A row is **certified** when no q ∈ Q makes another prediction strictly better than the decision d (ties
allowed); its **regret bound** is an upper bound on max_{q ∈ Q} [E_q ℓ(d) − min_{d'} E_q ℓ(d')] (ℓ the
loss: the metric, or 1 − accuracy), 0 for a certified row.

**Node mass intervals.**  p(n) = S(n) + Σ_{u ∈ U ∩ L(n)} q_u, S the listed mass under n.  With
a(n) = |U ∩ L(n)| (the leaf count minus the listed leaves below, a prefix-sum difference) and
b(n) = |U| − a(n), the inner sum ranges over [max(0, m − c·b), min(m, c·a)] on Q, both ends attained
(fill the unlisted leaves outside n, resp. inside n, to c first), so

    p_min(n) = S(n) + max(0, m − c·b(n)),    p_max(n) = S(n) + min(m, c·a(n)).

**Threshold rules (tree distance, exact).**  f(n) = E ℓ(n) changes by 2(t − p(child)) from a node to
its child, t = (1 + c)/2 ≥ 1/2, and p does not grow down a path.  So f along a root path falls while
p > t, is flat where p = t and rises after: d is optimal under q iff (d is the root or p_q(d) ≥ t) and
p_q(x) ≤ t for every child x of d (a node off d's path with p > t would be disjoint from d with
p(d) + p(x) > 2t ≥ 1).  For all q ∈ Q at once, since each condition is on one node:

    certified  ⇔  (d = root or p_min(d) ≥ t)  and  max over children x of p_max(x) ≤ t.

A child with listed leaves is reached from them (≤ k per row); among the children with none,
p_max = min(m, c·|L(x)|) is largest for the one with the most leaves: the first child of d, in the
children sorted by decreasing leaf count, that holds no listed leaf (a tree table and a sort; these are
the path intervals below at d itself).

**Accuracy (exact).**  E_q s(l) = q(l).  For d listed, the worst completion raises one unlisted leaf to
min(m, c): regret = max(0, max_l v(l) − v(d), min(m, c) − v(d)).  For d unlisted, against a listed leaf
max v − q_min(d) with q_min(d) = max(0, m − c(|U| − 1)), against an unlisted one (|U| ≥ 2)
min(m, c) − max(0, m − min(m, c) − c(|U| − 2)) (raising the rival never helps d).  Certified iff the
regret is 0.  A list that is some distribution's top k is always certified: v(d) = max v ≥ v_k = c.

**A generic bound (LCA height, and the tree distance's regret).**  For q ∈ Q and any d', with
Δ_u = ℓ(d, u) − ℓ(d', u) and q, q0 equal on the listed leaves,

    E_q[ℓ(d) − ℓ(d')] = −M(d') + Σ_u (q − q0)_u Δ_u ≤ −M(d') + T·(max_U Δ − min_U Δ),

M(d') = E_{q0}[ℓ(d') − ℓ(d)] ≥ 0 the margin (d is optimal under q0), because Σ_u (q − q0)_u = 0, and
T = max_{q ∈ Q} Σ_u (q_u − q0_u)_+.  T is convex in q, so its maximum is at a vertex of Q (⌊m/c⌋ leaves
at c, one at the remainder, the rest 0); for q0 uniform (m/|U| each) every vertex gives the same value,
⌊m/c⌋·(c − m/|U|) + (m − c⌊m/c⌋ − m/|U|)_+.  For a prior, T ≤ m (Σ_u (q − q0)_+ ≤ Σ_u q_u).  With
z = LCA(d, d'): for u outside L(z), ℓ(d, u) = ℓ(d', u) (both metrics depend on u through LCA(·, u),
the same for d and d'), so Δ_u = 0 there and only u under z matter.
- LCA height: ℓ(·, u) ∈ [0, height(z)] under z, so the range is at most 2·height(z).  The decoder's
  candidates (the listed leaves, and per support node a the best leaf under its off-support children,
  :func:`~hdecode_torch.kernels.support.lca_height_candidates`) hold every leaf's best rival: a leaf
  under the off-support children of a is no better than a's candidate and has LCA(d, ·) = LCA(d, a)
  when d is listed (d is then not under them).  So for d listed

      regret ≤ max(0, max over candidates e ≠ d of [2·T·height(LCA(d, anchor(e))) − M(e)]),

  anchor(e) the leaf itself (listed) or its support node a, and d is certified when that is 0.  For d
  unlisted: the bound 2·T·height(root), not certified unless T = 0 (an unlisted sibling leaf of d can
  take d's mass).
- Tree distance: Δ_u = (1 + c)(d(d) − d(d')) − 2(d(LCA(d, u)) − d(LCA(d', u))) spans at most
  2·dist(d, d') ≤ 2·(depth(d) + D), so regret ≤ 2·T·(depth(d) + D), D the tree's depth (0 if certified).

**The path bound (tree distance, LCA height).**  Both expected losses are sums over the root path, a
over A(n) without the root: tree distance E ℓ(n) = E ℓ(root) + 2Σ_a (t − p(a)); LCA height (summing
its split sums by parts) E ℓ(l) = height(root) − Σ_a (height(parent(a)) − height(a))·p(a).  Let d' be
the optimum under some q ∈ Q and z = LCA(d, d').  The regret is (the terms of d's path below z) + (the
terms of d''s path below z).  The first is bounded by p ≥ p_min on d's path.  The second runs down a
chain from x, a child of z off d's path, and p ≤ p(x) ≤ p_max(x) along it; the chain has at most
height(z) nodes, and its LCA-height gains sum to height(z) (they telescope), so with P(z) the largest
p_max over the children of z off d's path (those reached by listed leaves: one per listed leaf l, at
z = LCA(d, l); of the others, the one with the most leaves)

    tree distance:  regret ≤ max_z [2Σ_{a on d's path below z} (t − p_min(a)) + 2·height(z)·(P(z) − t)_+],
    LCA height:     regret ≤ max_z [height(z)·P(z) − Σ_{a on d's path below z} (height(parent(a)) −
                    height(a))·p_min(a)],

each clamped at 0 (z = d included for the tree distance: d' below d).  The bound returned is the smaller
of the generic and the path bound; the LCA height's row is also certified when the path bound is 0.

Every function takes tensors and the hierarchy's cached tree tables, computes in float64 and returns
tensors.  Cost per row: O(k·log k) for the polytope and accuracy; O((k + D)·D) for the tree distance (the
walks to d's children and off its path, a (k, D+1) comparison for the LCAs) plus a sort of B·(k + D)
entries; the same plus O(1) per candidate of the LCA height's decoder (whose candidates it shares when it
decodes).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .support import LCACandidates, Listed, _at, _off_support_child, child_order, walk_up

__all__ = ["Polytope", "PathIntervals", "completion_polytope", "listed_under", "mass_interval", "path_intervals",
           "certify_best_leaf",
           "certify_deepest_above", "certify_least_lca_height", "tree_distance_regret_bound"]


class Polytope(NamedTuple):
    """The completions a row's list is consistent with, per row (all (B,) float64).

    missing: m (0 where no leaf is unlisted); cap: c = max(v_k, m/|U|); unlisted: |U| = L − k;
    shift: T, the most mass any completion in Q moves away from the decision's completion q0.
    """

    missing: torch.Tensor
    cap: torch.Tensor
    unlisted: torch.Tensor
    shift: torch.Tensor


def completion_polytope(num_leaves: int, values: torch.Tensor, missing: torch.Tensor, uniform: bool) -> Polytope:
    """The :class:`Polytope` of a batch: values (B, k) float64, missing (B,) float64 m, ``uniform``: whether
    q0 is the uniform completion (else a prior's: T ≤ m).  O(B·k)."""
    k = values.shape[1]
    u = torch.full_like(missing, float(num_leaves - k))
    some = u > 0
    m = torch.where(some, missing, 0.0)
    vk = values.min(1).values
    cap = torch.where(some, torch.maximum(vk, m / u.clamp_min(1)), vk)
    if uniform:
        q0 = m / u.clamp_min(1)
        full = torch.where(cap > 0, torch.floor(m / cap.clamp_min(torch.finfo(torch.float64).tiny)), 0.0)
        full = torch.minimum(full, u)
        rest = (m - full * cap).clamp_min(0)
        shift = (full * (cap - q0)).clamp_min(0) + (rest - q0).clamp_min(0)
    else:
        shift = m
    return Polytope(m, cap, u, shift)


def listed_under(h, listed: Listed, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, count) of nodes (B, J) int64, row by row: the listed mass (float64) and the number of listed leaves
    (int64) under each node.  Two binary searches in the row's sorted positions, O(log k) each."""
    start = _at(h.leaf_start, nodes)
    lo = torch.searchsorted(listed.keys, start)
    hi = torch.searchsorted(listed.keys, start + _at(h.leaf_count, nodes))
    return listed.vsum.gather(1, hi) - listed.vsum.gather(1, lo), hi - lo


def mass_interval(h, listed: Listed, poly: Polytope, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p_min, p_max) (B, J) float64 of nodes (B, J) int64 over the polytope (see the module docstring)."""
    s, count = listed_under(h, listed, nodes)
    inside = (_at(h.leaf_count, nodes) - count).to(torch.float64)
    outside = poly.unlisted[:, None] - inside
    m, c = poly.missing[:, None], poly.cap[:, None]
    return s + (m - c * outside).clamp_min(0), s + torch.minimum(m, c * inside)


def certify_best_leaf(poly: Polytope, values: torch.Tensor, indices: torch.Tensor, pred: torch.Tensor):
    """Accuracy's exact certificate of leaves pred (B,) int64: ``(certified (B,) bool, regret (B,) float64)``,
    the most probability any completion in Q gives another leaf over pred.  values, indices: (B, k) float64
    and int64, the list.  O(B·k)."""
    mine = indices == pred[:, None]
    # pred's own value, not a prefix-sum difference: a tie with the top must give a regret of exactly 0
    s = torch.where(mine, values, float("-inf")).max(1).values
    count = mine.sum(1)
    m, c, u = poly.missing, poly.cap, poly.unlisted
    vmax = values.max(1).values
    top_unlisted = torch.where(u > 0, torch.minimum(m, c), float("-inf"))
    on_listed = torch.maximum(vmax - s, top_unlisted - s)
    q_min = (m - c * (u - 1)).clamp_min(0)
    rival = torch.where(u > 1, top_unlisted - (m - torch.minimum(m, c) - c * (u - 2)).clamp_min(0), float("-inf"))
    on_unlisted = torch.maximum(vmax - q_min, rival)
    regret = torch.where(count > 0, on_listed, on_unlisted).clamp_min(0)
    return regret <= 0, regret


class PathIntervals(NamedTuple):
    """Node mass intervals along the decision's root path, per row, column s for the node s levels above it.

    up: (B, D+1) int64 the path (the root repeated above it); valid: (B, D+1) bool s ≤ depth(pred);
    p_min: (B, D+1) float64 p_min(up_s); side: (B, D+1) float64 the largest p_max over the children of up_s
    that are off the path (−inf where none); meet: (B, k) int64 LCA(pred, l) of each listed leaf, in the
    order of ``listed.leaves``.
    """

    up: torch.Tensor
    valid: torch.Tensor
    p_min: torch.Tensor
    side: torch.Tensor
    meet: torch.Tensor


def path_intervals(h, listed: Listed, poly: Polytope, pred: torch.Tensor) -> PathIntervals:
    """The :class:`PathIntervals` of the decisions pred (B,) int64.  A listed leaf l ≠ pred leaves the path at
    z = LCA(pred, l), into the child of z towards l (a walk up of D steps); per path node, the child with the
    most leaves among those that hold no listed leaf and are off the path (a sort, as for the decoders'
    off-support children).  O(B·(k + D)·D) plus the sort of B·(k + D) entries."""
    bsz, k = listed.leaves.shape
    d = h.max_depth
    dev = pred.device
    depth = h.depth
    up = walk_up(h, pred, d)
    steps = torch.arange(d + 1, device=dev)
    valid = steps[None, :] <= _at(depth, pred)[:, None]
    p_min, _ = mass_interval(h, listed, poly, up)
    leaves = listed.leaves
    # LCA(pred, l): the path's nodes that hold l are the ones from some level up (nested ranges of depth-first
    # leaf positions), so the level is the count of those that do not; no ancestor table, whatever N
    start = _at(h.leaf_start, up)
    keys = listed.keys[:, :, None]
    holds = (start[:, None, :] <= keys) & (keys < (start + _at(h.leaf_count, up))[:, None, :])
    col = (~holds).sum(2)
    z = up.gather(1, col)
    below = _at(depth, z) + 1
    cur = leaves
    for _ in range(d):
        cur = torch.where(_at(depth, cur) > below, _at(h.parent_or_root, cur), cur)
    kids = torch.where(leaves != pred[:, None], cur, -1)
    _, kid_max = mass_interval(h, listed, poly, kids.clamp_min(0))
    side = torch.full((bsz, d + 1), float("-inf"), dtype=torch.float64, device=dev)
    side = side.scatter_reduce(1, col, torch.where(kids >= 0, kid_max, float("-inf")), "amax")
    counts = h.cached("topk_leaf_count_f64", lambda: h.leaf_count.to(torch.float64))
    children, rank = child_order(h, -counts, "topk_heaviest_order")
    rows = torch.arange(bsz, device=dev)
    path_kids = torch.where(valid[:, 1:], up[:, :-1], h.root)  # each path node's child on the path
    queries = torch.where(valid, up, h.root)
    nodes = torch.cat([torch.where(kids >= 0, kids, h.root).reshape(-1), path_kids.reshape(-1), queries.reshape(-1)])
    at = torch.arange(bsz * (k + d), bsz * (k + 2 * d + 1), device=dev)
    off = _off_support_child(h, torch.cat([rows.repeat_interleave(k), rows.repeat_interleave(d),
                                           rows.repeat_interleave(d + 1)]), nodes, children, rank, at, bsz,
                             compact=listed.compact).view(bsz, d + 1)
    off_max = torch.minimum(poly.missing[:, None], poly.cap[:, None] * _at(counts, off.clamp_min(0)))
    side = torch.maximum(side, torch.where(valid & (off >= 0), off_max, float("-inf")))
    return PathIntervals(up, valid, p_min, side, z)


def certify_deepest_above(path: "PathIntervals", pred: torch.Tensor, root: int, threshold: float) -> torch.Tensor:
    """The tree distance's exact certificate: (B,) bool, whether pred (B,) int64 is optimal for every q ∈ Q
    under the rule "the deepest node with p(n) > threshold" (threshold ≥ 1/2; see the module docstring), from
    its :func:`path_intervals` (column 0: pred itself and all its children)."""
    return ((pred == root) | (path.p_min[:, 0] >= threshold)) & (path.side[:, 0] <= threshold)


def _exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.zeros_like(x[:, :1]), x[:, :-1].cumsum(1)], 1)


def tree_distance_regret_bound(h, path: "PathIntervals", poly: Polytope, pred: torch.Tensor, threshold: float,
                               certified: torch.Tensor) -> torch.Tensor:
    """(B,) float64 the tree distance's regret bound of pred (B,) int64, 0 where certified: the smaller of
    2·T·(depth(pred) + D) (the generic bound) and the path bound of the module docstring."""
    generic = poly.shift * 2 * (_at(h.depth, pred) + h.max_depth).to(torch.float64)
    height = h.cached("topk_height_f64", lambda: h.height.to(torch.float64))
    below = 2 * _at(height, path.up) * (path.side - threshold).clamp_min(0)
    terms = 2 * _exclusive_cumsum(threshold - path.p_min) + below
    bound = torch.where(path.valid, terms, float("-inf")).max(1).values.clamp_min(0)
    return torch.where(certified, 0.0, torch.minimum(generic, bound))


def certify_least_lca_height(h, listed: Listed, poly: Polytope, pred: torch.Tensor, candidates: LCACandidates):
    """The LCA height's certificate of leaves pred (B,) int64, the best of the decoder's ``candidates``
    (:func:`~hdecode_torch.kernels.support.lca_height_candidates`): ``(certified (B,) bool, regret bound (B,)
    float64)``, the smaller of the generic bound over the candidates and the path bound (see the module
    docstring)."""
    bsz, k = listed.leaves.shape
    values, sample, leaves, anchors, first = candidates
    mine = listed.leaves == pred[:, None]
    is_listed = mine.any(1)
    own = torch.where(mine, values[: bsz * k].view(bsz, k), float("inf")).min(1).values
    rival = leaves != _at(pred, sample)
    margin = values - _at(own, sample)
    height = h.cached("topk_height_f64", lambda: h.height.to(torch.float64))
    path = path_intervals(h, listed, poly, pred)
    # LCA(d, a) for a support node a over the listed leaf l: a if a is an ancestor of d, else LCA(d, l); both
    # lie on l's root path, so it is the higher of a and LCA(d, l) (no LCA per candidate)
    meet = _at(path.meet.reshape(-1), sample * k + first)
    top = torch.maximum(_at(height, anchors), _at(height, meet))
    term = torch.where(rival, 2 * _at(poly.shift, sample) * top - margin, float("-inf"))
    worst = torch.full((bsz,), float("-inf"), dtype=torch.float64, device=pred.device)
    worst = worst.scatter_reduce(0, sample, term, "amax").clamp_min(0)
    unlisted = torch.where(poly.shift > 0, 2 * poly.shift * height[h.root], 0.0)
    gain = _at(height, _at(h.parent_or_root, path.up)) - _at(height, path.up)
    # no off-path child: no rival leaf leaves the path there (and 0·(−inf) would be NaN at a leaf)
    rival = torch.where(path.side > float("-inf"), _at(height, path.up) * path.side, float("-inf"))
    terms = rival - _exclusive_cumsum(gain * path.p_min)
    along = torch.where(path.valid, terms, float("-inf")).max(1).values.clamp_min(0)
    bound = torch.minimum(torch.where(is_listed, worst, unlisted), along)
    return bound <= 0, bound
