"""Pure tensor kernels any metric or decoder can use: tree sums, ancestry and LCA, choosing a node per
sample, descents, candidate lists and their scores, per-leaf-depth masses, and the fused ``hdecode::`` ops.

A kernel is a function of the hierarchy's tables and tensors; it reads no global setting and no
device plan: the caller passes the layout (``layout="levels"`` or ``"prefix"``) and the backend."""

from .ancestry import ancestor_closure, ancestor_mask, is_ancestor, lca, lca_depth, path_counts
from .segment import scatter_available
from .selection import argbest, argbest_pairs, deepest_above, deepest_where, most_informative_where
from .tree_sums import leaf_to_node_sum, path_sum, subtree_sum

__all__ = [
    "leaf_to_node_sum", "path_sum", "subtree_sum", "lca", "lca_depth", "path_counts", "is_ancestor",
    "ancestor_closure", "ancestor_mask", "argbest", "argbest_pairs", "deepest_above", "deepest_where",
    "most_informative_where", "scatter_available",
]
