"""Ancestors and lowest common ancestors, without an N × L matrix and without tables that grow with N × D.

``m`` lies under ``n`` iff ``pos[n] <= pos[m] < pos[n] + size[n]`` (depth-first preorder positions
and subtree sizes), so ancestor tests and ancestor masks cost O(1) per pair whatever the depth.
LCAs use the ancestors-by-depth table where it fits (O(D) per pair, one gather) and binary lifting
otherwise (O(log D) per pair, a (⌈log₂ D⌉, N) table).
"""

from __future__ import annotations

import torch

__all__ = ["is_ancestor", "lca_depth", "lca", "leaf_lca", "ancestor_closure", "ancestor_mask", "path_counts",
           "top_ancestor", "jump_table"]


def is_ancestor(h, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Whether ``a`` is an ancestor of ``b`` or ``b`` itself.  a, b: broadcastable int64.  Returns bool."""
    pa = h.pos[a]
    pb = h.pos[b]
    return (pa <= pb) & (pb < pa + h.size[a])


def jump_table(h) -> torch.Tensor:
    """(K, N) int64 ``table[k, n]``, the ancestor 2^k levels above n (the root when there is none), K ≥ 1."""
    def build():
        rows = [h.parent_or_root]
        while (1 << len(rows)) <= h.max_depth:
            rows.append(rows[-1][rows[-1]])
        return torch.stack(rows)
    return h.cached("jump_table", build)


def lca(h, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """LCA(a, b) node ids, int64, broadcast shape of ``a`` and ``b``."""
    a, b = torch.broadcast_tensors(a, b)
    if h.ancestor_table_fits:
        d = lca_depth(h, a, b)
        return h.ancestors[a].gather(-1, d.unsqueeze(-1)).squeeze(-1)
    # Climb from a, 2^k levels at a time, as long as the landing node is not above b.
    table = jump_table(h)
    cur = a.clone()
    for k in range(table.shape[0] - 1, -1, -1):
        up = table[k][cur]
        cur = torch.where(is_ancestor(h, up, b), cur, up)
    return torch.where(is_ancestor(h, cur, b), cur, h.parent_or_root[cur])


def lca_depth(h, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Depth of LCA(a, b).  a, b: broadcastable int64 node ids.  Returns int64, their broadcast shape.

    With the ancestors-by-depth table: root paths agree on a prefix, so the LCA depth is the length
    of that prefix minus one.
    """
    if not h.ancestor_table_fits:
        return h.depth[lca(h, a, b)]
    anc_a = h.ancestors[a]
    anc_b = h.ancestors[b]
    same = (anc_a == anc_b) & (anc_a < h.num_nodes)
    return same.sum(-1) - 1


def leaf_lca(h, budget: int) -> torch.Tensor:
    """(N, L) int32 ``LCA(n, l)`` of every node n and leaf l, one step per tree level.

    A node's row is its parent's row, except on its own leaves, which meet it at n itself: O(N·L)
    work and the table's own memory, whatever the depth (gathering root paths would cost O(N·L·D)).
    ``budget``: bytes of temporaries per step (9 bytes per entry of the rows a step fills), which
    bounds how many rows of a level are filled at once.
    """
    n_leaves = h.num_leaves
    out = torch.empty(h.num_nodes, n_leaves, dtype=torch.int32, device=h.device)
    out[h.root] = h.root
    leaf_pos = h.pos[:n_leaves]
    step = max(1, budget // (9 * n_leaves))
    for level in h.levels[1:]:
        for nodes in level.split(step):
            inside = (h.pos[nodes, None] <= leaf_pos) & (leaf_pos < (h.pos + h.size)[nodes, None])
            out[nodes] = torch.where(inside, nodes[:, None].to(torch.int32), out[h.parent[nodes]])
    return out


def ancestor_mask(h, nodes: torch.Tensor) -> torch.Tensor:
    """nodes: (B,) int64 -> (B, N) bool with True on A(node) (the node and its ancestors).  O(B·N)."""
    p = h.pos[nodes][:, None]
    return (h.pos[None, :] <= p) & (p < (h.pos + h.size)[None, :])


def ancestor_closure(h, sets: torch.Tensor) -> torch.Tensor:
    """sets: (B, N) bool -> (B, N) bool, ``∪_{n ∈ set} A(n)`` (the root is added when the set is non-empty)."""
    from .tree_sums import subtree_sum

    counts = subtree_sum(h, sets.t().to(torch.int32))
    return (counts > 0).t()


def path_counts(h, sets: torch.Tensor, leaves: torch.Tensor) -> torch.Tensor:
    """|sets[b] ∩ A(leaves[b])|: how many nodes of each set lie on its leaf's root path.

    sets: (B, N) bool; leaves: (B,) int64.  Returns (B,) int64.
    """
    return (sets & ancestor_mask(h, leaves)).sum(1)


def top_ancestor(h) -> torch.Tensor:
    """(N,) int64 a_n, the child of the root above n (the root for the root), cached."""
    def build():
        root_children = h.children[h.children_ptr[h.root]:h.children_ptr[h.root + 1]]
        starts = h.pos[root_children]  # ascending: the root's children in preorder
        idx = torch.searchsorted(starts, h.pos, right=True) - 1
        out = root_children[idx.clamp(min=0)]
        return torch.where(h.depth > 0, out, torch.full_like(out, h.root))
    return h.cached("top_ancestor", build)
