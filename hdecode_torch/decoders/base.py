"""What every decoder offers: ``decode(leaf_probs) -> predictions`` for a whole batch."""

from __future__ import annotations

from ..core.component import HierarchyComponent

__all__ = ["Decoder"]


class Decoder(HierarchyComponent):
    """A batched decision rule from leaf probabilities to node ids.

    Subclasses declare ``name``, ``description``, ``kind`` (``"leaf"`` for a rule that always returns a
    leaf, else ``"node"``), ``PARAMS`` and the facts the tests and benchmarks read (``exact_on_dyadic``,
    ``baseline``, ``algorithms``) and implement ``_decode_default`` (and,
    where the GPU plan decodes differently, ``_decode_gpu``) on a :class:`~hdecode_torch.Posterior`
    (checked probabilities with lazily computed node sums), returning (B,) int64 node ids.  ``decode`` accepts (B, L) or
    (L,) float probabilities (or a Posterior, to share node sums between decoders), decodes large
    batches in chunks bounded by the memory budget, and returns (B,) (or ()) int64 node ids on the
    probabilities' device.
    """

    component_kind = "decoder"
    #: Whether its rule's keys are exact on dyadic inputs (sums and products of k/16, no logarithms), where
    #: the tests then require exactly the reference's node, ties included.
    exact_on_dyadic: bool = False

    def __call__(self, leaf_probs, **kwargs):
        return self.decode(leaf_probs, **kwargs)
