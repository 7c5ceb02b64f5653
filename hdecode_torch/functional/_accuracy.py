"""Top-1 accuracy as functions: ``accuracy``, ``expected_accuracy``, ``decode_accuracy``.

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
from ..metrics.accuracy import Accuracy
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = ["accuracy", "expected_accuracy", "decode_accuracy"]


def accuracy(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *,
             decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False, reduction: str = "none",
             dtype: torch.dtype | None = None, validate: bool | None = None) -> torch.Tensor:
    """1 if the prediction is the target leaf, else 0 (top-1 accuracy): a node that is not a
    leaf is always wrong.  Higher is better.

    Per-sample values, or their mean or sum: ``get_metric("accuracy", hierarchy)(preds, target)``
    (:class:`~hdecode_torch.metrics.accuracy.Accuracy`).

    Args:
        preds: decoded predictions, scored as they are: (B,) int64 node ids; or (B, L) float scores
            (probabilities, logits with ``from_logits``, or a Posterior), decoded by ``decoder`` first.
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
        >>> F.accuracy(torch.tensor([4, 2]), torch.tensor([0, 2]), h)
        tensor([0., 1.])
    """
    component = Accuracy(as_hierarchy(hierarchy))
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_accuracy(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                      from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                      chunk_size: int | None = None) -> torch.Tensor:
    """Expected accuracy Σ_l p(l) accuracy(n, l) of each prediction n under its row's distribution p:
    E = p(n) for a leaf n, 0 for an internal node.

    Equals ``get_metric("accuracy", hierarchy).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.accuracy.Accuracy`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        preds: (B,) or () int64 node ids.
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
        >>> F.expected_accuracy(probs, torch.tensor([4, 0]), h)
        tensor([0.0000, 0.7000])
    """
    component = Accuracy(as_hierarchy(hierarchy))
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_accuracy(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                    normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                    within: torch.Tensor | int | None = None,
                    certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for accuracy (of best expected value under each row's distribution).
    The most probable leaf (ties: the smallest id, as ``probs.argmax(-1)``).  O(B·L).

    Equals ``get_metric("accuracy", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.accuracy.Accuracy`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.
        certify: with a top-k input, also each row's certificate: ``(pred, certified, regret_bound)``,
            as for :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (unbatched for a (L,) input), on the probabilities' device; with
        ``certify=True`` (a top-k input), ``(pred, certified, regret_bound)``: the ids, (B,) bool and
        (B,) float64, as ``decode(topk, certify=True)`` of the metric.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_accuracy(probs, h)
        tensor([0, 0])
    """
    component = Accuracy(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)
