"""Calibration where the decoders use it: the reliability of p(n) at every node, depth by depth.

A Bayes-optimal decoder reads p(n) = Σ_{l ∈ L(n)} p(l) at every node; it is right to trust it when,
among the (row, node) pairs of a depth with p(n) ≈ c, the target lies under n a fraction c of the
time.  For each depth d, the pairs (row i, node n at depth d) are binned by p_i(n) into ``n_bins``
equal-width bins of [0, 1] (bin j holds ``j/n_bins <= p < (j+1)/n_bins``, p = 1 in the last one, as
torchmetrics bins confidences); the expected calibration error of depth d is

    ECE_d = Σ_j |Σ_{(i,n) ∈ bin j} p_i(n) − Σ_{(i,n) ∈ bin j} 1[y_i ∈ L(n)]| / (B · n_d),

with n_d the number of nodes at depth d (Naeini et al., AAAI 2015, over nodes instead of top-1
predictions).  Depth 0 is the root, p = 1 and always hit: ECE 0 up to rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.plan import get_memory_budget
from ..core.posterior import Posterior
from ..kernels.ancestry import is_ancestor
from ._pieces import checked_scores

__all__ = ["NodeReliability", "node_calibration_error", "node_reliability"]

#: Bytes per (row, node) entry of one chunk: the float64 probability, its bin and key, the hit.
_BYTES_PER_ENTRY = 48


class NodeReliability(NamedTuple):
    """Reliability diagrams of the node probabilities, one per depth.

    counts: (D+1, n_bins) int64, the (row, node) pairs in each bin; confidence: (D+1, n_bins) float64,
    their mean p(n); frequency: (D+1, n_bins) float64, the fraction of them whose node holds the target.
    Empty bins hold NaN in ``confidence`` and ``frequency``.
    """

    counts: torch.Tensor
    confidence: torch.Tensor
    frequency: torch.Tensor


def _check_bins(n_bins) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"Expected `n_bins` to be an int >= 1, but got {n_bins!r}")
    return n_bins


def _node_calibration_update(probs, target, hierarchy, n_bins: int = 15, from_logits: bool | str = False,
                             validate: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sufficient statistics of the node reliability: ``(counts, confidence_sum, hit_sum)``, each
    (D+1, n_bins) float64 on the probabilities' device, summed over the rows and the nodes of each depth.

    probs: (B, L) float probabilities (logits with ``from_logits=True``) or a Posterior; target: (B,)
    int64 leaf ids.  Rows go in chunks sized by :func:`~hdecode_torch.get_memory_budget` (about 48
    bytes per row and node); no (B, N, n_bins) tensor is built.  O(B·N·log n_bins).
    """
    n_bins = _check_bins(n_bins)
    post, y = checked_scores(hierarchy, probs, target, from_logits=from_logits, validate=validate, name="probs")
    h = post.h
    p = post.probs if not post.unbatched else post.probs.reshape(1, -1)
    y = y.reshape(-1)
    dev = p.device
    depth_key = (h.depth * n_bins).unsqueeze(1)
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64, device=dev)
    size = (h.max_depth + 1) * n_bins
    counts = torch.zeros(size, dtype=torch.float64, device=dev)
    conf = torch.zeros(size, dtype=torch.float64, device=dev)
    hits = torch.zeros(size, dtype=torch.float64, device=dev)
    nodes = torch.arange(h.num_nodes, device=dev).unsqueeze(1)
    chunk = max(1, get_memory_budget() // (_BYTES_PER_ENTRY * h.num_nodes))
    for lo in range(0, p.shape[0], chunk):
        rows = slice(lo, lo + chunk)
        node_p = Posterior(h, p[rows], validate=False).node.to(torch.float64).contiguous()  # (N, b)
        hit = is_ancestor(h, nodes, y[rows].unsqueeze(0))  # (N, b)
        key = (torch.bucketize(node_p, edges, right=True) - 1).clamp_(0, n_bins - 1).add_(depth_key).reshape(-1)
        counts += torch.bincount(key, minlength=size).to(torch.float64)
        conf += torch.bincount(key, weights=node_p.reshape(-1), minlength=size)
        hits += torch.bincount(key, weights=hit.reshape(-1).to(torch.float64), minlength=size)
    shape = (h.max_depth + 1, n_bins)
    return counts.reshape(shape), conf.reshape(shape), hits.reshape(shape)


def _node_calibration_compute(counts: torch.Tensor, confidence_sum: torch.Tensor,
                              hit_sum: torch.Tensor) -> torch.Tensor:
    """(D+1,) float64 ECE per depth from :func:`_node_calibration_update`'s statistics (NaN for a
    depth without pairs, e.g. no rows)."""
    return (confidence_sum - hit_sum).abs().sum(1) / counts.sum(1)


def node_calibration_error(probs, target, hierarchy, n_bins: int = 15, from_logits: bool | str = False,
                           validate: bool = True) -> torch.Tensor:
    """Expected calibration error of the node probabilities p(n), per depth (module docstring).

    Args:
        probs: (B, L) float probabilities (or logits with ``from_logits=True``, or ``"auto"``), or a
            :class:`~hdecode_torch.Posterior`.
        target: (B,) int64 leaf ids in ``0..L-1``.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        n_bins: equal-width bins of [0, 1] (default 15).
        from_logits: what ``probs`` holds, as for :func:`decode`.
        validate: check the input (one host read).

    Returns:
        (D+1,) float64 on the probabilities' device: ECE of depth 0 (the root, 0 up to rounding) to D
        (NaN when there are no rows).  O(B·N·log n_bins) time, memory bounded by the memory budget.
    """
    return _node_calibration_compute(*_node_calibration_update(probs, target, hierarchy, n_bins, from_logits,
                                                               validate))


def node_reliability(probs, target, hierarchy, n_bins: int = 15, from_logits: bool | str = False,
                     validate: bool = True) -> NodeReliability:
    """Reliability diagrams of the node probabilities, per depth: for each bin of p(n), how many (row,
    node) pairs fell in it, their mean p(n) and how often their node held the target.

    Args: as for :func:`node_calibration_error`.

    Returns:
        :class:`NodeReliability` ``(counts, confidence, frequency)``, each (D+1, n_bins): int64 counts,
        float64 mean confidence and hit frequency (NaN in empty bins).  ``Σ_j counts[d, j] ·
        |confidence[d, j] − frequency[d, j]| / Σ_j counts[d, j]`` is :func:`node_calibration_error`'s
        entry d.
    """
    counts, conf, hits = _node_calibration_update(probs, target, hierarchy, n_bins, from_logits, validate)
    some = counts > 0
    nan = torch.full_like(conf, float("nan"))
    return NodeReliability(counts.to(torch.int64), torch.where(some, conf / counts, nan),
                           torch.where(some, hits / counts, nan))
