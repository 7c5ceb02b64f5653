"""What every decoder offers: ``decode(leaf_probs) -> predictions`` for a whole batch."""

from __future__ import annotations

import torch

from ..core.component import HierarchyComponent, _chunk_size
from ..core.topk import CompletedTopK, TopK, no_top_k_decoder

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

    A decoder whose rule is computed exactly on the support of a top-k list (``accepts_topk``) also
    decodes a :class:`~hdecode_torch.TopK` (or ``probs.topk(k)``): the node the rule picks on the completed
    (B, L) distribution (:meth:`TopK.completed <hdecode_torch.TopK.completed>`), in O(B·k·D) time and
    memory, never the (B, L) table (k = L: the dense table, so the dense answer bit for bit).  Such a
    decoder gives ``_decode_topk(ct)`` on a :class:`~hdecode_torch.core.topk.CompletedTopK`, (B,) int64.
    """

    component_kind = "decoder"
    #: Whether its rule's keys are exact on dyadic inputs (sums and products of k/16, no logarithms), where
    #: the tests then require exactly the reference's node, ties included.
    exact_on_dyadic: bool = False
    #: Whether ``decode`` accepts a top-k list (see the class docstring).
    accepts_topk: bool = False

    def __call__(self, leaf_probs, **kwargs):
        return self.decode(leaf_probs, **kwargs)

    def decode(self, leaf_probs, *, from_logits: bool | str = False, normalize: bool = False,
               validate: bool | None = None, chunk_size: int | None = None, within=None) -> torch.Tensor:
        """Decode a batch: as :meth:`HierarchyComponent.decode <hdecode_torch.core.component.HierarchyComponent.decode>`
        for (B, L) or (L,) probabilities (or a Posterior).  A top-k list (:class:`~hdecode_torch.TopK` or
        ``probs.topk(k)``) is decoded on its support where the decoder accepts one (``accepts_topk``): the
        rule's node on the completed distribution, (B,) (or ()) int64; ``from_logits``, ``normalize`` and
        ``within`` do not apply to it.
        """
        topk = TopK.of(leaf_probs)
        if topk is None:
            return super().decode(leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                                  chunk_size=chunk_size, within=within)
        if not self.accepts_topk:
            raise no_top_k_decoder(f"the {self.component_kind} `{self.name}`")
        if from_logits is not False or normalize:
            raise ValueError("`leaf_probs` is a top-k list of probabilities: from_logits and normalize do not apply "
                             "(take the top-k of the softmax)")
        if within is not None:
            raise ValueError("`within` is not supported with a top-k input: pass the dense (B, L) probabilities")
        ct = CompletedTopK(self.hierarchy, topk, self._validate(validate))
        if ct.k == ct.h.num_leaves:
            return super().decode(topk.completed(ct.h.num_leaves), validate=False, chunk_size=chunk_size)
        out = torch.cat([self._decode_topk(ct.chunk(a, b)) for a, b in ct.chunks(_chunk_size(chunk_size))])
        return out[0] if ct.unbatched else out

    def _decode_topk(self, ct: CompletedTopK) -> torch.Tensor:
        raise NotImplementedError

