"""Jaccard index of node sets as functions: ``jaccard``, ``expected_jaccard``, ``decode_jaccard``.

Each function builds the metric with its parameters and makes one call through the pieces every
function shares (``_pieces.py``): the values (``score``), the expected values (``expect``) and the
Bayes-optimal prediction (``decode_by``), as :class:`~hdecode_torch.HierarchicalMetric` and the
generic :func:`~hdecode_torch.functional.value` do.
"""

# Annotations are evaluated (no ``from __future__ import annotations``): the signatures hold the types
# themselves, for help(), IDEs and tests/test_functional.py, which compares them with the classes' PARAMS.
import torch

from ..core.posterior import Posterior
from ..decoders.base import Decoder
from ..hierarchy import Hierarchy
from ..metrics.jaccard import Jaccard
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = ["jaccard", "expected_jaccard", "decode_jaccard"]


def jaccard(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *,
            decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False, reduction: str = "none",
            dtype: torch.dtype | None = None, validate: bool | None = None) -> torch.Tensor:
    """Jaccard index |h⁺ ∩ y⁺| / |h⁺ ∪ y⁺| of ancestor-closed node sets: h⁺ the prediction's
    ancestor closure, y⁺ the target's root path.  Higher is better.

    Per-sample values, or their mean or sum: ``get_metric("jaccard", hierarchy)(preds, target)``
    (:class:`~hdecode_torch.metrics.jaccard.Jaccard`).

    Args:
        preds: decoded predictions, scored as they are: (B, N) bool node sets closed under ancestors, or
            (B,) int64 node ids (their root paths); or (B, L) float scores (probabilities, logits with
            ``from_logits``, or a Posterior), decoded by ``decoder`` first.
        target: (B,) int64 leaf ids in 0..L-1.
        hierarchy: the Hierarchy.
        decoder, from_logits, reduction, dtype, validate: as for :func:`~hdecode_torch.functional.value`
            (``decoder="optimal"``: this metric's Bayes-optimal decoder).

    Returns:
        (B,) values (``reduction="none"``) or their 0-d mean or sum, computed in float64 and cast to
        ``dtype``: by default the scores' compute dtype (float64 kept, float32 otherwise), torch's default
        dtype for decoded predictions.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> F.jaccard(torch.tensor([4, 2]), torch.tensor([0, 2]), h)
        tensor([0.6667, 1.0000])
    """
    component = Jaccard(as_hierarchy(hierarchy))
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_jaccard(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                     from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                     chunk_size: int | None = None) -> torch.Tensor:
    """Expected jaccard Σ_l p(l) jaccard(S, l) of each prediction S (closed under ancestors) under p:
    Σ_y p(y) c(y) / (|S| + d(y) + 1 − c(y)), c(y) = |S ∩ A(y)|: one root-path sum.

    Equals ``get_metric("jaccard", hierarchy).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.jaccard.Jaccard`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        preds: (B, N) or (N,) bool node sets closed under ancestors, or (B,) or () int64 node ids.
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.

    Returns:
        (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
        dtype), on their device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.expected_jaccard(probs, torch.tensor([4, 0]), h)
        tensor([0.5333, 0.8000])
    """
    component = Jaccard(as_hierarchy(hierarchy))
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_jaccard(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                   normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                   within: torch.Tensor | int | None = None,
                   certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for jaccard (of best expected value under each row's distribution).
    The best ancestor-closed set: a tree knapsack per set size, with provably safe pruning.

    Equals ``get_metric("jaccard", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.jaccard.Jaccard`).

    A top-k list (``probs.topk(k)`` or :class:`~hdecode_torch.TopK`) is decoded exactly for its completed
    distribution (the missing mass spread over the unlisted leaves, uniformly or by a prior), on the ancestors
    of the listed leaves and the nodes heavy enough under the completion alone to be in an optimal set, never
    B × L or B × N: the same expected score as the dense decoder on the completed table.

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior), or a top-k list of (B, k) or (k,)
            values and leaf ids.
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode` (dense inputs only).
        certify: jaccard gives no certificate of a top-k decision: True is refused.

    Returns:
        (B, N) bool ancestor-closed node sets holding the root (unbatched for a (L,) input), on the
        probabilities' device; for a top-k list, the same sets as a coalesced sparse COO bool (B, N) tensor
        ((N,) for one row; ``.to_dense()`` gives the table).

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_jaccard(probs, h)
        tensor([[ True, False, False, False,  True,  True],
                [ True, False, False, False,  True,  True]])
    """
    component = Jaccard(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)
