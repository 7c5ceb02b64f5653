"""Is a model calibrated where the decoders read it?  Node ECE per depth against its sampling noise.

An ECE is never 0 on finite data: even a perfectly calibrated model shows some, more with fewer rows
and more nodes.  The check therefore compares each depth's node ECE (see
:func:`~hdecode_torch.functional.node_calibration_error`) with what the same probabilities would show
if they *were* calibrated: labels are drawn from the model's own probabilities, ``y*_i ~ p_i``, R times
("consistency resampling", Bröcker & Smith, Weather and Forecasting 2007), and the ECE of each depth
is recomputed against them.  The noise floor of a depth is the largest of those R values; a depth is
flagged when its observed ECE exceeds it.  For a calibrated model, a given depth is flagged with
probability at most 1/(R + 1) (its ECE and the R resampled ones are then exchangeable), so with the
default R = 200 a tree of 12 levels raises a false alarm at some depth at most 6% of the time.

Only the hits depend on the labels: the bins, counts and confidence sums of the observed ECE serve
every resample, and a resample's hits are the bins of its label's D + 1 ancestors, so R resamples cost
O(B·R·D) on top of one pass over the node probabilities.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch

from ..core.plan import get_memory_budget
from ..core.posterior import Posterior
from ._calibration import _check_bins, _node_calibration_compute, _node_calibration_update
from ._pieces import checked_scores

__all__ = ["NodeCalibrationCheck", "node_calibration_check", "DEFAULT_RESAMPLES"]

DEFAULT_RESAMPLES = 200


class NodeCalibrationCheck(NamedTuple):
    """What :func:`node_calibration_check` found, per depth 0..D.

    ece: (D+1,) float64, the observed node ECE; noise_floor: (D+1,) float64, the largest ECE of the
    resamples (what calibrated probabilities show from sampling noise alone); miscalibrated: (D+1,) bool,
    ``ece > noise_floor`` (never at the root, depth 0).
    """

    ece: torch.Tensor
    noise_floor: torch.Tensor
    miscalibrated: torch.Tensor


def node_calibration_check(probs, target, hierarchy, n_bins: int = 15, resamples: int = DEFAULT_RESAMPLES,
                           seed: int = 0, from_logits: bool | str = False,
                           validate: bool = True) -> NodeCalibrationCheck:
    """Per depth, whether the node probabilities are miscalibrated beyond sampling noise (module docstring).

    Args:
        probs: (B, L) float probabilities (or logits with ``from_logits=True``, or ``"auto"``), or a
            :class:`~hdecode_torch.Posterior`; B >= 1.
        target: (B,) int64 leaf ids in ``0..L-1``.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        n_bins: equal-width bins of [0, 1] (default 15), as for ``node_calibration_error``.
        resamples: R >= 1 label sets drawn from the probabilities (default 200).
        seed: seeds the draws (a private generator on the probabilities' device; the global RNG is untouched).
        from_logits: what ``probs`` holds, as for :func:`decode`.
        validate: check the input (one host read).

    Returns:
        :class:`NodeCalibrationCheck` ``(ece, noise_floor, miscalibrated)``, each (D+1,), on the
        probabilities' device.  O(B·N·log n_bins + B·R·D) time; memory bounded by the memory budget.
    """
    n_bins = _check_bins(n_bins)
    if isinstance(resamples, bool) or not isinstance(resamples, numbers.Integral) or resamples < 1:
        raise ValueError(f"Expected `resamples` to be an int >= 1, but got {resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"Expected `seed` to be an int >= 0, but got {seed!r}")
    post, y = checked_scores(hierarchy, probs, target, from_logits=from_logits, validate=validate, name="probs")
    if post.unbatched or post.batch_size == 0:
        raise ValueError("Expected `probs` to have shape (B, L) with B >= 1 rows: the check compares rows' "
                         f"probabilities with their labels, but got {tuple(post.probs.shape)}")
    counts, conf, hits = _node_calibration_update(post, y, post.h, n_bins, validate=False)
    ece = _node_calibration_compute(counts, conf, hits)
    resampled = _resampled_hits(post, n_bins, int(resamples), int(seed))  # (R, D+1, n_bins)
    floor = ((conf - resampled).abs().sum(2) / counts.sum(1)).amax(0)
    flagged = ece > floor
    flagged[0] = False
    return NodeCalibrationCheck(ece, floor, flagged)


def _resampled_hits(post: Posterior, n_bins: int, resamples: int, seed: int) -> torch.Tensor:
    """(R, D+1, n_bins) float64: for R label sets ``y* ~ p`` (one draw per row each), the number of
    (row, node) pairs of each depth and bin whose node holds the drawn label."""
    h, p = post.h, post.probs
    dev, levels = p.device, h.max_depth + 1
    edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64, device=dev)
    size = resamples * levels * n_bins
    hits = torch.zeros(size, dtype=torch.float64, device=dev)
    offset = (torch.arange(resamples, device=dev) * (levels * n_bins)).unsqueeze(0)  # (1, R)
    gen = torch.Generator(device=dev).manual_seed(seed)
    # Per row: its node probabilities and bins (float64 + int64), the draws and one step's keys.
    per_row = 16 * h.num_nodes + 40 * resamples
    chunk = max(1, get_memory_budget() // per_row)
    for lo in range(0, p.shape[0], chunk):
        rows = p[lo:lo + chunk]
        node_p = Posterior(h, rows, validate=False).node.to(torch.float64).t().contiguous()  # (b, N)
        bins = (torch.bucketize(node_p, edges, right=True) - 1).clamp_(0, n_bins - 1)
        cur = torch.multinomial(rows.to(torch.float64), resamples, replacement=True, generator=gen)  # (b, R)
        for _ in range(levels):  # up the tree from the drawn leaves: one step per depth
            live = cur >= 0
            node = cur.clamp(min=0)
            key = offset + h.depth[node] * n_bins + bins.gather(1, node)
            hits += torch.bincount(key[live], minlength=size).to(torch.float64)
            cur = torch.where(live, h.parent[node], cur)
    return hits.reshape(resamples, levels, n_bins)
