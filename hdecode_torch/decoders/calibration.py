"""Choosing DARTS' λ on held-out data for a target hierarchical accuracy (Deng et al. 2012)."""

from __future__ import annotations

import numbers

import torch

from ..hierarchy import Hierarchy
from ..core.conversion import as_tensor
from ..core.index_checks import RangeCheck, as_targets
from ..core.posterior import Posterior
from .heuristics import darts_predict, hierarchically_correct

__all__ = ["calibrate_darts"]

# Beyond this λ, (I(n) + λ) rounds to λ even in float64 (I(n) ≤ log L is far below λ's ulp),
# so DARTS has reached its limit rule: the most probable node, deepest among ties.
_LAM_LIMIT = 1e18


def _real(value, name: str) -> float:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a real number, but got {type(value).__name__}")
    return float(value)  # nan fails the caller's range test


def calibrate_darts(hierarchy, leaf_probs, targets, target_accuracy: float, *, tol: float = 1e-4,
                    max_iter: int = 60, from_logits: bool = False, validate: bool = True) -> float:
    """The smallest λ whose DARTS predictions reach ``target_accuracy`` hierarchical accuracy.

    A prediction is hierarchically correct iff the target leaf lies under the predicted
    node.  λ = 0 is ``expected_information``; growing λ moves predictions towards more
    probable (coarser) nodes, up to the root, which is always correct.  As in Deng et al.
    2012, λ is found by bisection, after bracketing by doubling from 1: the result ``hi``
    reaches the target while ``lo`` (``hi - lo <= tol * max(1, hi)``, or after ``max_iter``
    halvings) does not.  The search assumes the accuracy grows with λ, which Deng et al.
    show for the expected accuracy under the model; on held-out data it holds up to noise.

    Args:
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        leaf_probs: (B, L) float held-out probabilities (logits with ``from_logits=True``).
        targets: (B,) int64 held-out leaf labels.
        target_accuracy: in [0, 1].
        tol: relative tolerance on λ (> 0).
        max_iter: maximal number of bisection steps (positive int).
    Returns:
        λ as a Python float (0.0 when λ = 0 already reaches the target).
    Raises:
        ValueError: ``target_accuracy`` outside [0, 1], an empty batch, or a target that no λ
        reaches (the limit λ → ∞ still predicts nodes that miss it: the model puts all its
        mass below a node that does not contain the label).
    """
    if not isinstance(hierarchy, Hierarchy):
        raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
    target_accuracy = _real(target_accuracy, "target_accuracy")
    if not (0.0 <= target_accuracy <= 1.0):
        raise ValueError(f"Expected `target_accuracy` to be a float in [0, 1], but got {target_accuracy}")
    tol = _real(tol, "tol")
    if not (0 < tol < 1):
        raise ValueError(f"Expected `tol` to be a float in (0, 1), but got {tol}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter <= 0:
        raise ValueError(f"Expected `max_iter` to be a positive int, but got {max_iter!r}")
    max_iter = int(max_iter)
    # One fused check (probabilities and target range), one host sync.
    x = as_tensor(leaf_probs, "leaf_probs").detach()
    y = as_targets(targets, hierarchy.num_leaves, name="targets", device=x.device)
    post = Posterior(hierarchy, x, from_logits=from_logits, validate=validate,
                     extra_checks=[RangeCheck(y, hierarchy.num_leaves, "targets", "leaf ids")])
    if post.unbatched:
        raise ValueError("Expected `leaf_probs` to be a (B, L) batch of held-out samples, but got a single (L,) row")
    if post.batch_size == 0:
        raise ValueError("Expected `leaf_probs` to hold at least one held-out sample, but got B = 0")
    if y.dim() != 1 or y.shape[0] != post.batch_size:
        raise ValueError(f"Expected `targets` to have shape ({post.batch_size},) (one label per sample), but got "
                         f"{tuple(y.shape)}")
    h, p = post.h, post.node

    def accuracy(lam: float) -> float:
        return float(hierarchically_correct(h, darts_predict(h, p, lam), y).double().mean())

    if accuracy(0.0) >= target_accuracy:
        return 0.0
    best_possible = accuracy(_LAM_LIMIT)
    if best_possible < target_accuracy:
        raise ValueError(
            f"`target_accuracy` {target_accuracy} is unreachable: even λ -> inf gives hierarchical accuracy "
            f"{best_possible:.6g} on these samples (the model puts all its mass under nodes that miss the label)"
        )
    lo, hi = 0.0, 1.0
    while hi < _LAM_LIMIT and accuracy(hi) < target_accuracy:
        lo, hi = hi, 2.0 * hi
    hi = min(hi, _LAM_LIMIT)
    for _ in range(max_iter):
        if hi - lo <= tol * max(1.0, hi):
            break
        mid = 0.5 * (lo + hi)
        if accuracy(mid) >= target_accuracy:
            hi = mid
        else:
            lo = mid
    return float(hi)
