"""Node probabilities p(n) = Σ_{l ∈ L(n)} p(l), the first step of every decoder, as a public function."""

from __future__ import annotations

import torch

from ..hierarchy import Hierarchy
from .posterior import Posterior

__all__ = ["node_probabilities"]


def node_probabilities(h, leaf_probs, *, from_logits: bool | str = False, normalize: bool = False,
                       validate: bool = True) -> torch.Tensor:
    """Probability of every node: ``p(n) = Σ_{l ∈ L(n)} p(l)``.

    Args:
        h: the :class:`~hdecode_torch.Hierarchy` (moved to the probabilities' device if needed).
        leaf_probs: (B, L) or (L,) float probabilities (logits with ``from_logits=True``).
    Returns:
        (B, N) (or (N,)) in the compute dtype: float32, or float64 when given float64.  A
        transposed view of a node-major buffer on the CPU plan; call ``.contiguous()`` if a
        row-major copy is needed.  O(B·N) work; no N×L matrix.
    """
    if not isinstance(h, Hierarchy):
        raise TypeError(f"Expected `h` to be a Hierarchy, but got {type(h).__name__}")
    post = Posterior(h, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate)
    out = post.node.t()
    return out[0] if post.unbatched else out
