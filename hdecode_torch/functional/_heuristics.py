"""The heuristic decoders of the literature as functions: ``decode_<decoder>(leaf_probs, hierarchy, ...)``.

One module for the ten, as their classes share ``decoders/heuristics.py``: each function builds the
decoder with its parameters and makes the one call every decoding function makes (``decode_by``,
``_pieces.py``), as :func:`~hdecode_torch.functional.decode_with` does.
"""

# Annotations are evaluated (no ``from __future__ import annotations``): the signatures hold the types
# themselves, for help(), IDEs and tests/test_functional.py, which compares them with the classes' PARAMS.
import torch

from ..core.posterior import Posterior
from ..decoders.heuristics import (
    ArgmaxLeaf, TopDown, ConfidenceThreshold, Majority, Plurality, Darts, ExpectedInformation,
    InformationThreshold, HiE, CRM,
)
from ..hierarchy import Hierarchy
from ._pieces import as_hierarchy, decode_by

__all__ = [
    "decode_argmax_leaf", "decode_top_down", "decode_confidence_threshold", "decode_majority", "decode_plurality",
    "decode_darts", "decode_expected_information", "decode_information_threshold", "decode_hie", "decode_crm",
]


def decode_argmax_leaf(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                       normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                       within: torch.Tensor | int | None = None) -> torch.Tensor:
    """The most probable leaf (flat top-1); ties: the smallest leaf id, as ``probs.argmax(-1)``.

    Equals ``get_decoder("argmax_leaf", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.ArgmaxLeaf`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_argmax_leaf(probs, h)
        tensor([0, 0])
    """
    component = ArgmaxLeaf(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_top_down(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                    normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                    within: torch.Tensor | int | None = None) -> torch.Tensor:
    """Greedy descent: from the root, step to the most probable child until a leaf; ties: the
    smallest child id.  Always a leaf.

    Equals ``get_decoder("top_down", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.TopDown`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_top_down(probs, h)
        tensor([0, 0])
    """
    component = TopDown(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_confidence_threshold(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, tau: float = 0.5,
                                from_logits: bool | str = False, normalize: bool = False,
                                validate: bool | None = None, chunk_size: int | None = None,
                                within: torch.Tensor | int | None = None) -> torch.Tensor:
    """The most informative node (max I(n), I(n) = log(L/|L(n)|)) with p(n) > tau; ties: the
    deeper node, then the smallest id.

    Equals ``get_decoder("confidence_threshold", hierarchy, tau=tau).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.ConfidenceThreshold`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        tau: probability threshold in [0, 1) (default 0.5).
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_confidence_threshold(probs, h, tau=0.6)
        tensor([5, 0])
    """
    component = ConfidenceThreshold(as_hierarchy(hierarchy), tau=tau)
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_majority(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                    normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                    within: torch.Tensor | int | None = None) -> torch.Tensor:
    """The deepest node with p(n) > 1/2 (``confidence_threshold`` with tau = 1/2); also the
    Bayes-optimal decoder of the tree distance.

    Equals ``get_decoder("majority", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.Majority`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_majority(probs, h)
        tensor([4, 0])
    """
    component = Majority(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_plurality(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
                     normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
                     within: torch.Tensor | int | None = None) -> torch.Tensor:
    """The most informative node n with p(n) > p(z) for every node z off n's root path and below
    n; ties: the deeper node, then the smallest id.

    Equals ``get_decoder("plurality", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.Plurality`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_plurality(probs, h)
        tensor([4, 0])
    """
    component = Plurality(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_darts(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, lam: float = 0.0,
                 from_logits: bool | str = False, normalize: bool = False, validate: bool | None = None,
                 chunk_size: int | None = None, within: torch.Tensor | int | None = None) -> torch.Tensor:
    """DARTS (Deng et al. 2012): argmax_n (I(n) + lam) p(n), I(n) = log(L/|L(n)|); ties: the deeper
    node, then the smallest id.  :func:`~hdecode_torch.calibrate_darts` chooses lam.

    Equals ``get_decoder("darts", hierarchy, lam=lam).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.Darts`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        lam: weight of probability over information, >= 0 (default 0.0).
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_darts(probs, h, lam=1.0)
        tensor([4, 0])
    """
    component = Darts(as_hierarchy(hierarchy), lam=lam)
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_expected_information(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *,
                                from_logits: bool | str = False, normalize: bool = False,
                                validate: bool | None = None, chunk_size: int | None = None,
                                within: torch.Tensor | int | None = None) -> torch.Tensor:
    """argmax_n I(n) p(n), I(n) = log(L/|L(n)|) (DARTS with lam = 0); ties: the deeper node, then
    the smallest id.

    Equals ``get_decoder("expected_information", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.ExpectedInformation`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_expected_information(probs, h)
        tensor([0, 0])
    """
    component = ExpectedInformation(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_information_threshold(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, threshold: float,
                                 from_logits: bool | str = False, normalize: bool = False,
                                 validate: bool | None = None, chunk_size: int | None = None,
                                 within: torch.Tensor | int | None = None) -> torch.Tensor:
    """The most probable node with I(n) = log(L/|L(n)|) >= threshold; ties: the deeper node, then
    the smallest id.  A threshold above log L (no node qualifies) is a ``ValueError``.

    Equals ``get_decoder("information_threshold", hierarchy, threshold=threshold).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.InformationThreshold`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        threshold: least information I(n) = log(L/|L(n)|), >= 0 (required).
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_information_threshold(probs, h, threshold=0.5)
        tensor([4, 4])
    """
    component = InformationThreshold(as_hierarchy(hierarchy), threshold=threshold)
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_hie(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
               normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
               within: torch.Tensor | int | None = None) -> torch.Tensor:
    """HiE (Jain et al. 2023): the leaf maximising p(parent(l)) · p(l); ties: the smallest leaf id.

    Equals ``get_decoder("hie", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.HiE`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_hie(probs, h)
        tensor([2, 0])
    """
    component = HiE(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)


def decode_crm(leaf_probs: torch.Tensor | Posterior, hierarchy: Hierarchy, *, from_logits: bool | str = False,
               normalize: bool = False, validate: bool | None = None, chunk_size: int | None = None,
               within: torch.Tensor | int | None = None) -> torch.Tensor:
    """CRM (Karthik et al. 2021): the leaf of least expected LCA height (the Bayes-optimal decoder of
    ``lca_height``); ties: the deeper leaf, then the smallest id.

    Equals ``get_decoder("crm", hierarchy).decode(leaf_probs)``
    (:class:`~hdecode_torch.decoders.heuristics.CRM`).

    Args:
        leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).
        hierarchy: the Hierarchy.
        from_logits, normalize, validate, chunk_size: as for :func:`~hdecode_torch.functional.expected`.
        within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
            :func:`~hdecode_torch.functional.decode`.

    Returns:
        (B,) int64 node ids (() for a (L,) input), on the probabilities' device.

    Example:
        >>> import torch
        >>> from hdecode_torch import Hierarchy, functional as F
        >>> h = Hierarchy.from_parents([4, 4, 5, 5, 5, -1])  # leaves 0-3 (0, 1 under node 4), root 5
        >>> probs = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.7, 0.1, 0.1, 0.1]])
        >>> F.decode_crm(probs, h)
        tensor([0, 0])
    """
    component = CRM(as_hierarchy(hierarchy))
    return decode_by(component, leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                     chunk_size=chunk_size, within=within)
