"""Tree distance and its depth-penalised form as functions: ``tree_distance``,
``expected_tree_distance``, ``decode_tree_distance`` and the same for ``tree_distance_c``.

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
from ..metrics.tree_distance import TreeDistance, TreeDistanceC
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = [
    "tree_distance", "expected_tree_distance", "decode_tree_distance", "tree_distance_c",
    "expected_tree_distance_c", "decode_tree_distance_c",
]


def tree_distance(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *,
                  decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False,
                  reduction: str = "none", dtype: torch.dtype | None = None,
                  validate: bool | None = None) -> torch.Tensor:
    """The length d(pred) + d(target) − 2 d(LCA(pred, target)) of the tree path between prediction
    and target (mistake severity).  Lower is better.

    Per-sample values, or their mean or sum: ``get_metric("tree_distance", hierarchy)(preds, target)``
    (:class:`~hdecode_torch.metrics.tree_distance.TreeDistance`).

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
        >>> F.tree_distance(torch.tensor([4, 2]), torch.tensor([0, 2]), h)
        tensor([1., 0.])
    """
    component = TreeDistance(as_hierarchy(hierarchy))
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_tree_distance(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                           from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                           chunk_size: int | None = None) -> torch.Tensor:
    """Expected tree_distance Σ_l p(l) tree_distance(n, l) of each prediction n under its row's distribution p:
    d(n) + E[d(y)] − 2 Σ_{a ∈ A(n), a ≠ root} p(a): one root-path sum, O(B·N).

    Equals ``get_metric("tree_distance", hierarchy).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.tree_distance.TreeDistance`).

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
        >>> F.expected_tree_distance(probs, torch.tensor([4, 0]), h)
        tensor([1.4000, 0.8000])
    """
    component = TreeDistance(as_hierarchy(hierarchy))
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_tree_distance(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *,
                         from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                         chunk_size: int | None = None, within: torch.Tensor | int | None = None,
                         certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for tree_distance (of best expected value under each row's distribution).
    The deepest node with p(n) > 1/2, the root if none (Ramaswamy et al. 2015).  O(B·N).

    Equals ``get_metric("tree_distance", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.tree_distance.TreeDistance`).

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
        >>> F.decode_tree_distance(probs, h)
        tensor([4, 0])
    """
    component = TreeDistance(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)


def tree_distance_c(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *, c: float = 0.5,
                    decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False,
                    reduction: str = "none", dtype: torch.dtype | None = None,
                    validate: bool | None = None) -> torch.Tensor:
    """Tree distance plus c·d(pred) (Cao et al. 2024): the path length d(pred) + d(target) −
    2 d(LCA(pred, target)), and c per level of the prediction's depth.  Lower is better.

    Per-sample values, or their mean or sum: ``get_metric("tree_distance_c", hierarchy, c=c)(preds, target)``
    (:class:`~hdecode_torch.metrics.tree_distance.TreeDistanceC`).

    Args:
        preds: decoded predictions, scored as they are: (B,) int64 node ids; or (B, L) float scores
            (probabilities, logits with ``from_logits``, or a Posterior), decoded by ``decoder`` first.
        target: (B,) int64 leaf ids in 0..L-1.
        hierarchy: the Hierarchy.
        c: cost per level of the prediction's depth, >= 0 (default 0.5).
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
        >>> F.tree_distance_c(torch.tensor([4, 2]), torch.tensor([0, 2]), h, c=0.2)
        tensor([1.2000, 0.2000])
    """
    component = TreeDistanceC(as_hierarchy(hierarchy), c=c)
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_tree_distance_c(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                             c: float = 0.5, from_logits: bool | str = False, normalize: bool = False,
                             validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
    """Expected tree_distance_c Σ_l p(l) tree_distance_c(n, l) of each prediction n under its row's distribution p:
    d(n) + E[d(y)] − 2 Σ_{a ∈ A(n), a ≠ root} p(a) + c·d(n): one root-path sum, O(B·N).

    Equals ``get_metric("tree_distance_c", hierarchy, c=c).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.tree_distance.TreeDistanceC`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        preds: (B,) or () int64 node ids.
        hierarchy: the Hierarchy.
        c: cost per level of the prediction's depth, >= 0 (default 0.5).
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.

    Returns:
        (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
        dtype), on their device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.expected_tree_distance_c(probs, torch.tensor([4, 0]), h, c=0.2)
        tensor([1.6000, 1.2000])
    """
    component = TreeDistanceC(as_hierarchy(hierarchy), c=c)
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_tree_distance_c(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, c: float = 0.5,
                           from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                           chunk_size: int | None = None, within: torch.Tensor | int | None = None,
                           certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for tree_distance_c (of best expected value under each row's distribution).
    The deepest node with p(n) > (1 + c)/2, the root if none (Cao et al. 2024).  O(B·N).

    Equals ``get_metric("tree_distance_c", hierarchy, c=c).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.tree_distance.TreeDistanceC`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        c: cost per level of the prediction's depth, >= 0 (default 0.5).
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
        >>> probs = torch.tensor([[0.25, 0.25, 0.3, 0.2], [0.7, 0.1, 0.1, 0.1]])  # p(4) = 0.5, then 0.8
        >>> F.decode_tree_distance_c(probs, h, c=0.2)  # the deepest node with p(n) > (1 + c)/2 = 0.6
        tensor([5, 0])
    """
    component = TreeDistanceC(as_hierarchy(hierarchy), c=c)
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)
