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
                  listed.rate)


def root_mass(h, listed: Listed, weights: torch.Tensor) -> torch.Tensor:
    """(B,) float64 the node mass of the root, S(root) + r·(W(root) − C(root)), computed as the support
    table computes it (the same rounding: the root passes W(root)/2 whenever W(root) > 0)."""
    free = (weights[h.root] - (listed.wsum[:, -1] - listed.wsum[:, 0])).clamp_min(0)
    return listed.vsum[:, -1] - listed.vsum[:, 0] + listed.rate * free


def flat_node_mass(h, listed: Listed, weights: torch.Tensor, rows: torch.Tensor, nodes: torch.Tensor) -> torch.Tensor:
    """(M,) float64 node masses S(n) + r·(W(n) − C(n)) of (row, node) pairs, rows and nodes (M,) int64.

    The rows' sorted positions are one ascending array once row b's are offset by b·L: two binary searches
    in it per pair, O(M·log(B·k)) time and O(M + B·k) memory (no (M, k) table of the rows' lists).
    """
    bsz, k = listed.keys.shape
    nl = h.num_leaves
    offset = torch.arange(bsz, device=rows.device)[:, None] * nl
    keys = (listed.keys + offset).reshape(-1)
    start = _at(h.leaf_start, nodes) + rows * nl
    lo = torch.searchsorted(keys, start) - rows * k
    hi = torch.searchsorted(keys, start + _at(h.leaf_count, nodes)) - rows * k
    base = rows * (k + 1)
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

