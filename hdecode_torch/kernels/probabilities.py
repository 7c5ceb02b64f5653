"""Node probabilities p(n) = Σ_{l ∈ L(n)} p(l), the first step of every decoder."""

from __future__ import annotations

import torch

from .tree_sums import leaf_to_node_sum
from ..core.validation import prepare_leaf_probs

__all__ = ["node_probabilities", "node_probabilities_nm"]


def node_probabilities_nm(h, probs: torch.Tensor) -> torch.Tensor:
    """Node-major kernel: probs (B, L) float (already checked) -> (N, B), same dtype."""
    return leaf_to_node_sum(h, probs.t())


def node_probabilities(h, leaf_probs, *, from_logits: bool = False, normalize: bool = False,
                       validate: bool = True) -> torch.Tensor:
    """Probability of every node: ``p(n) = Σ_{l ∈ L(n)} p(l)``.

    Args:
        h: the :class:`~hdecode_torch.Hierarchy` (moved to the probabilities' device if needed).
        leaf_probs: (B, L) or (L,) float probabilities (logits with ``from_logits=True``).
    Returns:
        (B, N) (or (N,)) in the compute dtype: float32, or float64 when given float64.
        The result is a transposed view of a node-major buffer; call ``.contiguous()`` if
        a row-major copy is needed.
    """
    from ..hierarchy import Hierarchy

    if not isinstance(h, Hierarchy):
        raise TypeError(f"Expected `h` to be a Hierarchy, but got {type(h).__name__}")
    probs, unbatched = prepare_leaf_probs(leaf_probs, h.num_leaves, from_logits=from_logits,
                                          normalize=normalize, validate=validate)
    h = h.to(probs.device)
    out = node_probabilities_nm(h, probs).t()
    return out[0] if unbatched else out
