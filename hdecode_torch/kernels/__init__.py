"""Pure tensor kernels: tree sums, ancestry/LCA, node probabilities, input checks, chunking."""

from .ancestry import ancestor_closure, ancestor_mask, argbest, lca, lca_depth
from .chunking import get_memory_budget, set_memory_budget
from .probabilities import node_probabilities
from .segment import get_backend, scatter_available, set_backend
from .tree_sums import leaf_to_node_sum, path_sum, subtree_sum

__all__ = [
    "node_probabilities", "leaf_to_node_sum", "path_sum", "subtree_sum", "lca", "lca_depth",
    "ancestor_closure", "ancestor_mask", "argbest", "get_memory_budget", "set_memory_budget",
    "get_backend", "set_backend", "scatter_available",
]
