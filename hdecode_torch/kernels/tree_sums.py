"""Sums over subtrees and over root paths: the two tree reductions every metric is made of.

Pure functions of (hierarchy tables, tensor) -> tensor.  Each runs one vectorized
step per tree level (a loop over depth, never over nodes or samples), so the work is
O(N * prod(rest)) with no N x L matrix.

Layout: **node-major**, ``(N, *)`` — the node dimension first and the batch after it.
Each level step then moves whole contiguous rows (one row per node), which on CPU is
about 4x faster than scattering along the last dimension of a ``(B, N)`` tensor
(measured on tieredImageNet-H, B = 4000: 3.9 ms vs 16.8 ms).
"""

from __future__ import annotations

import torch

from .segment import index_add_rows

__all__ = ["subtree_sum", "subtree_sum_", "accumulation_dtype", "leaf_to_node_sum", "path_sum", "level_pairs"]


def level_pairs(h) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(nodes_d, parent(nodes_d)) for d = D..1]``, cached on the hierarchy."""
    def build():
        return [(lvl, h.parent[lvl]) for lvl in reversed(h.levels[1:])]
    return h.cached("level_pairs", build)


def subtree_sum(h, values: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` over every node's subtree, the node included.

    values: (N, *) float, node-major.  Returns a new (N, *) tensor, same dtype:
    ``out[n] = Σ_{m ∈ D(n)} values[m]``.
    """
    return subtree_sum_(h, values.clone())


def subtree_sum_(h, values: torch.Tensor) -> torch.Tensor:
    """In-place :func:`subtree_sum` (overwrites and returns ``values``)."""
    for nodes, parents in level_pairs(h):
        index_add_rows(values, parents, values.index_select(0, nodes))
    return values


#: Largest number of children summed into one node in float32.  index_add_ accumulates a
#: node's children one after the other, so the rounding error grows with the fan-in: on a
#: 100k-leaf star p(root) came out 1 + 1e-3.  Trees with a wider node sum in float64.
FLOAT32_MAX_FAN_IN = 1024


def leaf_to_node_sum(h, leaf_values: torch.Tensor) -> torch.Tensor:
    """Push leaf values up the tree: ``out[n] = Σ_{l ∈ L(n)} leaf_values[l]``.

    leaf_values: (L, *) float, leaf-major.  Returns (N, *), same dtype.  With
    probabilities this is p(n) for every node.  float32 input on a tree with a node of more
    than ``FLOAT32_MAX_FAN_IN`` children is accumulated in float64.
    """
    dtype = leaf_values.dtype
    acc = accumulation_dtype(h, dtype)
    out = torch.empty((h.num_nodes,) + tuple(leaf_values.shape[1:]), dtype=acc, device=leaf_values.device)
    out[: h.num_leaves] = leaf_values
    out[h.num_leaves:] = 0
    return subtree_sum_(h, out).to(dtype)


def accumulation_dtype(h, dtype: torch.dtype) -> torch.dtype:
    """The dtype to sum ``dtype`` values over ``h``'s subtrees in (see ``FLOAT32_MAX_FAN_IN``)."""
    wide = h.cached("max_fan_in", lambda: int(h.num_children.max())) > FLOAT32_MAX_FAN_IN
    return torch.float64 if (wide and dtype == torch.float32) else dtype


def path_sum(h, values: torch.Tensor, include_root: bool = True) -> torch.Tensor:
    """Sum of ``values`` along every root path: ``out[n] = Σ_{a ∈ A(n)} values[a]``.

    values: (N, *) float or int.  With ``include_root=False`` the root's row is left out
    of every sum.  Returns a new (N, *) tensor.
    """
    out = values.clone()
    if not include_root:
        out[h.root] = 0
    for nodes, parents in reversed(level_pairs(h)):
        # nodes of one level are distinct and their parents are already final: one add per level
        index_add_rows(out, nodes, out.index_select(0, parents))
    return out
