"""Hierarchical F_β as functions: ``hf_beta``, ``expected_hf_beta``, ``decode_hf_beta``.

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
from ..metrics.hf_beta import HFBeta
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = ["hf_beta", "expected_hf_beta", "decode_hf_beta"]


def hf_beta(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *, beta: float = 1.0,
            decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False, reduction: str = "none",
            dtype: torch.dtype | None = None, validate: bool | None = None) -> torch.Tensor:
    """Hierarchical F_β (Kiritchenko et al. 2006): (1+β²)|h⁺ ∩ y⁺| / (|h⁺| + β²|y⁺|), h⁺ the
    prediction's ancestor closure, y⁺ the target's root path (the root counts).  Higher is better.

    Per-sample values, or their mean or sum: ``get_metric("hf_beta", hierarchy, beta=beta)(preds, target)``
    (:class:`~hdecode_torch.metrics.hf_beta.HFBeta`).

    Args:
        preds: decoded predictions, scored as they are: (B, N) bool node sets closed under ancestors, or
            (B,) int64 node ids (their root paths); or (B, L) float scores (probabilities, logits with
            ``from_logits``, or a Posterior), decoded by ``decoder`` first.
        target: (B,) int64 leaf ids in 0..L-1.
        hierarchy: the Hierarchy.
        beta: weight of recall over precision, > 0 (default 1.0).
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
        >>> F.hf_beta(torch.tensor([4, 2]), torch.tensor([0, 2]), h, beta=0.5)
        tensor([0.9091, 1.0000])
    """
    component = HFBeta(as_hierarchy(hierarchy), beta=beta)
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_hf_beta(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                     beta: float = 1.0, from_logits: bool | str = False, normalize: bool = False,
                     validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
    """Expected hf_beta Σ_l p(l) hf_beta(S, l) of each prediction S (closed under ancestors) under p:
    Σ_{n ∈ S} Δ_k(n) for a closed set S of size k, Δ_k(n) = Σ_{l ∈ L(n)} p(l) (1+β²) / (k + β²(d(l)+1)).

    Equals ``get_metric("hf_beta", hierarchy, beta=beta).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.hf_beta.HFBeta`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior), or a top-k list (``probs.topk(k)``
            or a TopK): the value under its completed distribution, O(nnz·E) for sparse sets.
        preds: (B, N) or (N,) bool node sets closed under ancestors (dense or sparse COO), or (B,) or () int64
            node ids.
        hierarchy: the Hierarchy.
        beta: weight of recall over precision, > 0 (default 1.0).
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.

    Returns:
        (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
        dtype), on their device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.expected_hf_beta(probs, torch.tensor([4, 0]), h, beta=0.5)
        tensor([0.7455, 0.8381])
    """
    component = HFBeta(as_hierarchy(hierarchy), beta=beta)
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_hf_beta(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, beta: float = 1.0,
                   from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                   chunk_size: int | None = None, within: torch.Tensor | int | None = None,
                   certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for hf_beta (of best expected value under each row's distribution).
    The best ancestor-closed set over every set size k (Plaud et al. 2025, §4.2), with provably
    safe pruning.

    A top-k list (``probs.topk(k)`` or a :class:`~hdecode_torch.TopK`) is decoded exactly for its completed
    distribution without a (B, L) or (B, N) table (:func:`~hdecode_torch.metrics.hf_beta.hf_beta_decode_topk`):
    the sets come back as a coalesced sparse COO bool (B, N) tensor; k = L gives the dense answer.

    Equals ``get_metric("hf_beta", hierarchy, beta=beta).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.hf_beta.HFBeta`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior), or a top-k list of them.
        hierarchy: the Hierarchy.
        beta: weight of recall over precision, > 0 (default 1.0).
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.
        certify: with a top-k input, also each row's certificate: ``(pred, certified, regret_bound)``,
            as for :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B, N) bool ancestor-closed node sets holding the root (unbatched for a (L,) input), on the
        probabilities' device; sparse COO for a top-k input.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_hf_beta(probs, h, beta=0.5)
        tensor([[False, False, False, False, False,  True],
                [ True, False, False, False,  True,  True]])
    """
    component = HFBeta(as_hierarchy(hierarchy), beta=beta)
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)
