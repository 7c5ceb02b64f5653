"""What every decoder offers: ``decode(leaf_probs) -> predictions`` for a whole batch."""

from __future__ import annotations

import torch

from .._component import HierarchyComponent
from ..metrics.posterior import Posterior

__all__ = ["Decoder"]


class Decoder(HierarchyComponent):
    """A batched decision rule from leaf probabilities to node ids.

    Subclasses implement :meth:`_decode` on a :class:`Posterior` (checked probabilities with
    lazily computed node sums) and return (B,) int64 node ids.  ``decode`` accepts (B, L) or
    (L,) float probabilities (or a Posterior, to share node sums between decoders) and
    returns (B,) (or ()) int64 node ids on the probabilities' device.
    """

    def decode(self, leaf_probs, *, validate: bool | None = None) -> torch.Tensor:
        """leaf_probs: (B, L) or (L,) float, or a Posterior.  Returns (B,) or () int64 node ids."""
        post = Posterior.of(self.hierarchy, leaf_probs, validate=self.validate if validate is None else validate)
        out = self._decode(post)
        return out[0] if post.unbatched else out

    __call__ = decode

    def _decode(self, post: Posterior) -> torch.Tensor:
        raise NotImplementedError
