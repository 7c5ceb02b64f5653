"""Wu-Palmer similarity as functions: ``wu_palmer``, ``expected_wu_palmer``, ``decode_wu_palmer``.

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
from ..metrics.wu_palmer import WuPalmer
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = ["wu_palmer", "expected_wu_palmer", "decode_wu_palmer"]


def wu_palmer(preds: torch.Tensor, target: torch.Tensor, hierarchy: Hierarchy, *, strategy: str = "auto",
              decoder: str | tuple | Decoder = "optimal", from_logits: bool | str = False, reduction: str = "none",
              dtype: torch.dtype | None = None, validate: bool | None = None) -> torch.Tensor:
    """Wu-Palmer similarity 2 d(LCA(pred, target)) / (d(pred) + d(target)) (Wu and Palmer 1994),
    d the depth (the root's is 0).  Higher is better.

    Per-sample values, or their mean or sum: ``get_metric("wu_palmer", hierarchy, strategy=strategy)(preds, target)``
    (:class:`~hdecode_torch.metrics.wu_palmer.WuPalmer`).

    Args:
        preds: decoded predictions, scored as they are: (B,) int64 node ids; or (B, L) float scores
            (probabilities, logits with ``from_logits``, or a Posterior), decoded by ``decoder`` first.
        target: (B,) int64 leaf ids in 0..L-1.
        hierarchy: the Hierarchy.
        strategy: how the exact decoder searches: auto, structural, dense or candidates (default 'auto', one of
            'auto', 'structural', 'dense', 'candidates').
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
        >>> F.wu_palmer(torch.tensor([4, 2]), torch.tensor([0, 2]), h)
        tensor([0.6667, 1.0000])
    """
    component = WuPalmer(as_hierarchy(hierarchy), strategy=strategy)
    return score(component, preds, target, decoder=decoder, from_logits=from_logits, reduction=reduction,
                 dtype=dtype, validate=validate)


def expected_wu_palmer(leaf_probs: torch.Tensor | Posterior, preds: torch.Tensor, hierarchy: Hierarchy, *,
                       strategy: str = "auto", from_logits: bool | str = False, normalize: bool = False,
                       validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
    """Expected wu_palmer Σ_l p(l) wu_palmer(n, l) of each prediction n under its row's distribution p:
    Σ_e 2/(d(n) + e) Σ_{a ∈ A(n), a ≠ root} Q_e(a), Q_e(a) the mass of a's leaves at depth e:
    one root-path sum per distinct leaf depth.

    Equals ``get_metric("wu_palmer", hierarchy, strategy=strategy).expected(leaf_probs, preds)``
    (:class:`~hdecode_torch.metrics.wu_palmer.WuPalmer`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior), or a top-k list (``probs.topk(k)``
            or :class:`~hdecode_torch.TopK`): the expected value under its completed distribution, from each
            prediction's root path (O(B·D·(log k + E)), E the number of distinct leaf depths).
        preds: (B,) or () int64 node ids.
        hierarchy: the Hierarchy.
        strategy: how the exact decoder searches: auto, structural, dense or candidates (default 'auto', one of
            'auto', 'structural', 'dense', 'candidates').
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.

    Returns:
        (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
        dtype), on their device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.expected_wu_palmer(probs, torch.tensor([4, 0]), h)
        tensor([0.4000, 0.7500])
    """
    component = WuPalmer(as_hierarchy(hierarchy), strategy=strategy)
    return expect(component, leaf_probs, preds, from_logits=from_logits, normalize=normalize,
                  validate=validate, chunk_size=chunk_size)


def decode_wu_palmer(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, strategy: str = "auto",
                     from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                     chunk_size: int | None = None, within: torch.Tensor | int | None = None,
                     certify: bool = False) -> torch.Tensor:
    """The Bayes-optimal prediction for wu_palmer (of best expected value under each row's distribution).
    The node of best expected similarity (ties: the deepest, then the smallest id), searched as
    ``strategy`` says (``"auto"``: chosen per plan and tree).

    Equals ``get_metric("wu_palmer", hierarchy, strategy=strategy).decode(leaf_probs)``
    (:class:`~hdecode_torch.metrics.wu_palmer.WuPalmer`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior), or a top-k list (``probs.topk(k)``
            or :class:`~hdecode_torch.TopK`): the exact decision for its completed distribution, computed on
            the list's support in O(B·k·D·(E + log(B·k·D))) plus the subtrees searched off it (no (B, L) table;
            :mod:`hdecode_torch.kernels.support_similarity`).
        hierarchy: the Hierarchy.
        strategy: how the exact decoder searches: auto, structural, dense or candidates (default 'auto', one of
            'auto', 'structural', 'dense', 'candidates').
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.
        certify: with a top-k input, also each row's certificate: ``(pred, certified, regret_bound)``,
            as for :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (unbatched for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_wu_palmer(probs, h)
        tensor([0, 0])
    """
    component = WuPalmer(as_hierarchy(hierarchy), strategy=strategy)
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within, certify=certify)
