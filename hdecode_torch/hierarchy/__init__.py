"""The compiled class tree: validation, canonical ids, tensors, bundled trees."""

from .bundled import list_hierarchies, load_hierarchy
from .hierarchy import Hierarchy

__all__ = ["Hierarchy", "load_hierarchy", "list_hierarchies"]
