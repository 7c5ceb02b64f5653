"""Conditional probabilities p(child | parent) of a leaf distribution, re-tempered and recomposed.

A distribution over the leaves is the same thing as one conditional distribution per internal node:
``log p(c | n) = log p(c) − log p(n)`` with ``log p(n) = logsumexp_{l ∈ L(n)} log p(l)``, and
``log p(l) = Σ_{a ∈ A(l), a ≠ root} log p(a | parent(a))``.  Re-tempering every conditional with a
power ``s_c`` and a log-odds shift ``b_c`` of its own (per child node c), renormalised among
siblings, and recomposing by path sums gives a new leaf distribution

    log q(c | n) = s_c · log p(c | n) + b_c − logsumexp_{c' ∈ children(n)} (s_c' · log p(c' | n) + b_c'),
    log q(l)     = Σ_{a ∈ A(l), a ≠ root} log q(a | parent(a)),

which :class:`~hdecode_torch.HierarchicalScaler` fits and :func:`~hdecode_torch.synthetic.synthetic_miscalibrated`
uses to distort a calibrated model.  ``s = 1, b = 0`` is the identity; an only child keeps
``q(c | n) = 1`` whatever ``s_c, b_c``.

Everything is computed in log space with segment log-sum-exps (never ``exp`` of a log-probability
then ``log``), one vectorized step per tree level (a loop over depth, never over nodes or samples),
O(N·B) work and memory for B rows; every step is differentiable.  The tables are node-major per level,
``(n_d, B)``.  The same steps run on both device plans: the GPU plan's depth-first prefix sums add
probabilities, and would lose a subtree whose mass is below e^-745 of the row's largest (float64),
where a log-sum-exp keeps it.

A masked class (log-probability −inf) stays −inf, and a subtree of masked classes has
``log p(n) = −inf``; no NaN appears in the values or the gradients.
"""

from __future__ import annotations

import torch

__all__ = ["segment_logsumexp", "level_layout", "node_log_probs", "conditional_log_probs", "recompose",
           "leaf_ancestor_slots", "leaf_rows", "level_slot", "path_sibling_groups", "path_log_likelihood"]


def segment_logsumexp(x: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """``out[s] = logsumexp_{k : index[k] = s} x[k]`` along dim 0.

    x: (K, B) float; index: (K,) int64 in ``0..size-1``.  Returns (size, B), same dtype: ``−inf`` for a
    segment without entries or whose entries are all ``−inf``, with zero (not NaN) gradients there.
    O(K·B).
    """
    rows = (size,) + tuple(x.shape[1:])
    expanded = index.view(-1, *([1] * (x.dim() - 1))).expand_as(x)
    # The shift only keeps exp in range; the result's gradient does not depend on it, so it is detached.
    top = torch.full(rows, float("-inf"), dtype=x.dtype, device=x.device)
    top = top.scatter_reduce(0, expanded, x.detach(), reduce="amax", include_self=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    total = torch.zeros(rows, dtype=x.dtype, device=x.device).index_add(0, index, torch.exp(x - top[index]))
    some = total > 0
    # log(0) is −inf, but its gradient would be inf·0 = NaN: take the log of 1 there instead.
    return torch.where(some, torch.log(torch.where(some, total, 1.0)) + top, float("-inf"))


def level_layout(h):
    """The per-level tables the kernels index with, cached on the hierarchy.

    Returns ``(nodes, num_leaves, parent_slot, leaf_order)``, lists over depth d = 0..D:

    - ``nodes[d]``: (n_d,) int64, the nodes at depth d, leaves first (ascending ids within each part);
    - ``num_leaves[d]``: how many of them are leaves;
    - ``parent_slot[d]``: (n_d,) int64, for d ≥ 1 the position of each node's parent among the
      *internal* nodes of level d − 1 (``nodes[d-1][num_leaves[d-1]:]``); None at d = 0;
    - ``leaf_order``: (L,) int64, such that the leaf rows of every level, concatenated in depth order,
      indexed by ``leaf_order`` are the leaves ``0..L-1``.
    """
    def build():
        L, dev = h.num_leaves, h.device
        slot = torch.empty(h.num_nodes, dtype=torch.long, device=dev)
        nodes, counts, parent_slot, leaves = [], [], [], []
        for d, lvl in enumerate(h.levels):
            leaf = lvl < L
            ordered = torch.cat([lvl[leaf], lvl[~leaf]])
            n_leaf = int(leaf.sum())
            slot[ordered] = torch.arange(ordered.shape[0], device=dev)
            parent_slot.append(None if d == 0 else slot[h.parent[ordered]] - counts[d - 1])
            nodes.append(ordered)
            counts.append(n_leaf)
            leaves.append(ordered[:n_leaf])
        leaf_order = torch.argsort(torch.cat(leaves))
        return nodes, counts, parent_slot, leaf_order
    return h.cached("conditionals.level_layout", build)


def node_log_probs(h, leaf_logp: torch.Tensor) -> list[torch.Tensor]:
    """``log p(n)`` of every node, per level.

    leaf_logp: (L, B) float leaf log-probabilities, leaf-major (rows need not be normalised: the
    root gets their log-sum-exp).  Returns a list over depth of (n_d, B) tables in the order of
    :func:`level_layout`'s ``nodes[d]``.  One segment log-sum-exp per level, bottom-up.  O(N·B).
    """
    nodes, counts, parent_slot, _ = level_layout(h)
    depth = len(nodes) - 1
    out: list[torch.Tensor] = [None] * (depth + 1)  # type: ignore[list-item]
    below = None
    for d in range(depth, -1, -1):
        leaf_rows = leaf_logp.index_select(0, nodes[d][: counts[d]])
        if below is None:  # the deepest level holds leaves only
            out[d] = leaf_rows
        else:
            internal = segment_logsumexp(below, parent_slot[d + 1], nodes[d].shape[0] - counts[d])
            out[d] = torch.cat([leaf_rows, internal])
        below = out[d]
    return out


def conditional_log_probs(h, node_logp: list[torch.Tensor]) -> list[torch.Tensor]:
    """``log p(c | parent(c))`` per level from :func:`node_log_probs`'s tables.

    Returns a list over depth of (n_d, B) tables; entry 0 (the root, which has no parent) is its
    ``log p(root)``.  A child of a parent of probability 0 gets ``−inf``.  O(N·B).
    """
    _, counts, parent_slot, _ = level_layout(h)
    out = [node_logp[0]]
    for d in range(1, len(node_logp)):
        parent = node_logp[d - 1][counts[d - 1]:].index_select(0, parent_slot[d])
        # A parent of log-probability −inf has children of −inf: subtract 0 there, not −inf − (−inf).
        out.append(node_logp[d] - torch.where(torch.isfinite(parent), parent, 0.0))
    return out


def level_slot(h) -> torch.Tensor:
    """(N,) int64: each node's position in its level, ``level_layout(h)[0][depth[n]]``.  Cached."""
    def build():
        slot = torch.empty(h.num_nodes, dtype=torch.long, device=h.device)
        for lvl in level_layout(h)[0]:
            slot[lvl] = torch.arange(lvl.shape[0], device=h.device)
        return slot
    return h.cached("conditionals.level_slot", build)


def leaf_ancestor_slots(h) -> list[torch.Tensor]:
    """For each depth d, (L,) int64: the position in ``level_layout(h)[0][d]`` of each leaf's ancestor at
    depth d (the leaf itself at its own depth), −1 below the leaf's depth.  Cached; O(L·D)."""
    def build():
        nodes, _, _, _ = level_layout(h)
        slot = level_slot(h)
        cur = torch.arange(h.num_leaves, device=h.device)
        out = [None] * len(nodes)
        for d in range(len(nodes) - 1, -1, -1):
            here = h.depth[cur] == d
            out[d] = torch.where(here, slot[cur], -1)
            cur = torch.where(here, h.parent_or_root[cur], cur)
        return out
    return h.cached("conditionals.leaf_ancestor_slots", build)


def recompose(h, conditionals: list[torch.Tensor], scale: torch.Tensor, bias: torch.Tensor | None = None,
              ) -> list[torch.Tensor]:
    """Re-temper the conditionals (module docstring) and recompose ``log q(n)`` for every node, per level.

    conditionals: :func:`conditional_log_probs`'s tables; scale: (N,) float > 0, the power ``s_c`` of
    each child's conditional; bias: (N,) float or None (0), its log-odds shift ``b_c`` (the root's
    entries are unused).  Returns a list over depth of (n_d, B) tables of ``log q(n)``, root 0, in the
    conditionals' dtype.  Differentiable in ``conditionals``, ``scale`` and ``bias``.  O(N·B).
    """
    nodes, counts, parent_slot, _ = level_layout(h)
    dtype = conditionals[0].dtype
    scale = scale.to(dtype)
    bias = bias.to(dtype) if bias is not None else None
    first = conditionals[0]
    out = [torch.zeros_like(first)]
    for d in range(1, len(conditionals)):
        c = conditionals[d]
        finite = torch.isfinite(c)
        s = scale.index_select(0, nodes[d]).unsqueeze(1)
        t = s * torch.where(finite, c, 0.0)
        if bias is not None:
            t = t + bias.index_select(0, nodes[d]).unsqueeze(1)
        # A masked child (−inf) stays masked, with zero gradients for its power and shift.
        t = torch.where(finite, t, float("-inf"))
        norm = segment_logsumexp(t, parent_slot[d], nodes[d - 1].shape[0] - counts[d - 1])
        norm = torch.where(torch.isfinite(norm), norm, 0.0).index_select(0, parent_slot[d])
        above = out[d - 1][counts[d - 1]:].index_select(0, parent_slot[d])
        out.append(above + (t - norm))
    return out


def leaf_rows(h, levels: list[torch.Tensor]) -> torch.Tensor:
    """The leaves' rows of per-level tables, as one (L, B) leaf-major table in leaf order."""
    _, counts, _, leaf_order = level_layout(h)
    return torch.cat([lvl[:k] for lvl, k in zip(levels, counts)]).index_select(0, leaf_order)


def path_sibling_groups(h, conditionals: list[torch.Tensor], targets: torch.Tensor, weighting: str = "leaf"):
    """The sibling groups the likelihood of ``targets`` depends on, flattened: for each row and each
    ancestor ``a`` of its target below the root, the children of ``parent(a)`` (groups of one child
    are left out: their conditional is 1 whatever the tempering).

    conditionals: :func:`conditional_log_probs`'s tables, (n_d, B) each; targets: (B,) int64 leaf ids;
    weighting: ``"leaf"`` (every group weighs 1: the sum of the groups' chosen conditionals is
    ``log q(y)``) or ``"ancestors"`` (a group at depth d weighs ``d(y) − d + 1``: the sum is
    ``Σ_{a ∈ A(y), a ≠ root} log q(a)``).

    Returns ``(node, value, group, chosen, weight)``: (E,) int64 child ids, (E,) their conditionals
    ``log p(c | parent)`` (detached), (E,) int64 group ids (groups contiguous), (G,) int64 the entry of
    the target's ancestor in each group, (G,) float weights.  E = Σ over rows of the fan-outs along the
    target's path: far fewer than B·N entries, so a fit evaluates its loss on these alone.
    """
    nodes, _, _, _ = level_layout(h)
    slots, slot = leaf_ancestor_slots(h), level_slot(h)
    fan = h.num_children
    depth_y = h.depth[targets]
    parts = []
    groups = entries = 0  # running totals: the ids of this depth's groups and entries follow them
    for d in range(1, len(nodes)):
        anc_slot = slots[d][targets]
        rows = (anc_slot >= 0).nonzero().squeeze(1)
        anc = nodes[d][anc_slot[rows]]
        parent = h.parent[anc]
        keep = fan[parent] > 1
        rows, anc, parent = rows[keep], anc[keep], parent[keep]
        count = fan[parent]
        g = rows.shape[0]
        owner = torch.repeat_interleave(torch.arange(g, device=targets.device), count)
        start = torch.cumsum(count, 0) - count
        child = h.children[h.children_ptr[parent][owner] + torch.arange(owner.shape[0], device=targets.device)
                           - start[owner]]
        value = conditionals[d].detach()[slot[child], rows[owner]]
        chosen = (child == anc[owner]).nonzero().squeeze(1)
        weight = torch.ones(g, dtype=value.dtype, device=value.device) if weighting == "leaf" \
            else (depth_y[rows] - d + 1).to(value.dtype)
        parts.append((child, value, owner + groups, chosen + entries, weight))
        groups += g
        entries += child.shape[0]
    if not parts:  # a tree of one node
        empty = torch.zeros(0, dtype=torch.long, device=targets.device)
        values = torch.zeros(0, dtype=conditionals[0].dtype, device=targets.device)
        return empty, values, empty, empty, values
    return tuple(torch.cat(column) for column in zip(*parts))


def path_log_likelihood(groups, scale: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``Σ_g weight_g · log q(chosen_g | parent)`` over :func:`path_sibling_groups`'s groups, with the
    conditionals re-tempered by ``scale`` (N,) and ``bias`` (N,) or None as in :func:`recompose`.
    A 0-d tensor, differentiable in ``scale`` and ``bias``.  O(E)."""
    node, value, group, chosen, weight = groups
    finite = torch.isfinite(value)
    t = scale.to(value.dtype).index_select(0, node) * torch.where(finite, value, 0.0)
    if bias is not None:
        t = t + bias.to(value.dtype).index_select(0, node)
    t = torch.where(finite, t, float("-inf"))
    norm = segment_logsumexp(t.unsqueeze(1), group, weight.shape[0]).squeeze(1)
    return (weight * (t.index_select(0, chosen) - norm)).sum()
