"""Hamming loss of node sets as functions: ``hamming``, ``expected_hamming``, ``decode_hamming``.

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
from ..metrics.hamming import Hamming
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = ["hamming", "expected_hamming", "decode_hamming"]


def hamming(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *,
            decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False, reduction: str = "none",
            dtype: torch.dtype | None = None, validate: bool | None = None) -> torch.Tensor:
    """Hamming loss |h⁺ Δ y⁺| / |y⁺| of ancestor-closed node sets: h⁺ the prediction's ancestor
    closure, y⁺ the target's root path.  Lower is better.

    Per-sample values, or their mean or sum: ``get_metric("hamming", hierarchy)(preds, target)``
    (:class:`~hdecode_torch.metrics.hamming.Hamming`).

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
        >>> F.hamming(torch.tensor([4, 2]), torch.tensor([0, 2]), h)
        tensor([0.3333, 0.0000])
    """
    component = Hamming(as_hierarchy(hierarchy))
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_hamming(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                     from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                     chunk_size: int | None = None) -> torch.Tensor:
    """Expected hamming Σ_l p(l) hamming(S, l) of each prediction S (closed under ancestors) under p:
    |S|·W(root) + 1 − 2 Σ_{n ∈ S} W(n), W(n) = Σ_{l ∈ L(n)} p(l)/(d(l)+1).

    Equals ``get_metric("hamming", hierarchy).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.hamming.Hamming`).

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
        >>> F.expected_hamming(probs, torch.tensor([4, 0]), h)
        tensor([0.6000, 0.3667])
    """
    component = Hamming(as_hierarchy(hierarchy))
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_hamming(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                   normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                   within: torch.Tensor | int | None = None,
                   certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for hamming (of best expected value under each row's distribution).
    The set of the nodes with W(n) > W(root)/2 (ancestor-closed, as W decreases down the tree).
    O(B·N); from a top-k list, O(B·k·D) on its support.

    Equals ``get_metric("hamming", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.hamming.Hamming`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior), or a top-k list
            (``probs.topk(k)`` or :class:`~hdecode_torch.TopK`: the decision of its completed distribution).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.
        certify: with a top-k input, also each row's certificate: ``(pred, certified, regret_bound)``,
            as for :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B, N) bool ancestor-closed node sets holding the root (unbatched for a (L,) input), on the
        probabilities' device; from a top-k list a coalesced sparse COO bool (B, N) tensor (never the
        (B, N) mask), with ``certify`` the tuple ``(sets, certified (B,) bool, regret_bound (B,) float64)``.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_hamming(probs, h)
        tensor([[False, False, False, False, False,  True],
                [ True, False, False, False,  True,  True]])
    """
    component = Hamming(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)
