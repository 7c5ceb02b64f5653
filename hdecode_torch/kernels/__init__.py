"""Pure tensor kernels any metric or decoder can use: tree sums, ancestry and LCA, choosing a node per
sample, descents, candidate lists and their scores, per-leaf-depth masses, node probabilities."""

from .ancestry import ancestor_closure, ancestor_mask, lca, lca_depth, path_counts
from .probabilities import node_probabilities
from .segment import get_backend, scatter_available, set_backend
from .selection import argbest, argbest_pairs, deepest_above, deepest_where, most_informative_where
from .tree_sums import leaf_to_node_sum, path_sum, subtree_sum

__all__ = [
    "node_probabilities", "leaf_to_node_sum", "path_sum", "subtree_sum", "lca", "lca_depth", "path_counts",
    "ancestor_closure", "ancestor_mask", "argbest", "argbest_pairs", "deepest_above", "deepest_where",
    "most_informative_where", "get_backend", "set_backend", "scatter_available",
]
