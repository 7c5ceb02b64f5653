"""Synthetic model outputs that are calibrated by construction.

Comparing decoders on real model outputs mixes two effects: how good the decision rule
is, and how well the model's probabilities match the truth.  Here the labels are drawn
*from* the probabilities (``y ~ p``), so ``p`` is exactly the posterior of ``y`` given the
sample and each Bayes-optimal decoder must win in expectation.  That isolates the effect
of the decision rule, and makes a self-check of the whole pipeline possible.

The probability vectors come from a tree-structured logit model.  For each sample:

- a centre leaf ``c`` is drawn uniformly;
- every node ``n`` gets a Gaussian offset ``g_n ~ N(0, 1)``; a leaf's offset is the sum of
  the offsets along its root path, so whole subtrees move up or down together (mass
  spread over sibling and cousin subtrees, as in real classifiers, rather than
  independent per-leaf noise);
- ``logit(l) = (-dist(c, l) + Σ_{a ∈ A(l)} g_a) / noise`` with ``dist`` the tree distance.

``noise`` is a temperature: small values give near one-hot outputs, large values push
the outputs towards the centre of the simplex (the "blur" axis of the paper, where the
task is more underdetermined).  For a fixed seed, the same centres and offsets are drawn
whatever ``noise`` is, so the entropy of every row grows with ``noise``.
"""

from __future__ import annotations

import numbers
import warnings

import torch

from .kernels.ancestry import ancestor_mask
from .kernels.conditionals import conditional_log_probs, leaf_rows, node_log_probs, recompose
from .kernels.tree_sums import path_sum

__all__ = ["synthetic_outputs", "synthetic_miscalibrated", "tree_gaussian_features", "DEFAULT_NOISE", "DISTORTIONS"]

#: The miscalibrations :func:`synthetic_miscalibrated` knows.
DISTORTIONS = ("none", "global", "depth", "sharp_leaves", "flat_leaves")

#: Default temperature: on tieredImageNet-H the argmax leaf is right about half the time,
#: like a mid-range ImageNet model, and decoders disagree often enough to be told apart.
DEFAULT_NOISE = 0.75


def synthetic_outputs(hierarchy, num_samples: int, noise: float = DEFAULT_NOISE, seed: int = 0,
                      device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Calibrated synthetic classifier outputs on ``hierarchy``.

    Args:
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        num_samples: B >= 0.
        noise: temperature > 0 of the tree-structured logit model (module docstring);
            larger is more underdetermined.
        seed: seeds a private generator (the global RNG is untouched).
        device: where the outputs go (default: the hierarchy's device).  The numbers are
            drawn on the CPU, so one seed gives the same data on every device.
        dtype: float32 (default) or float64 probabilities.
    Returns:
        ``(probs, targets)``: (B, L) probabilities (rows sum to 1) and (B,) int64 leaf
        ids drawn from them, ``targets[i] ~ Categorical(probs[i])``.
    """
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral) or num_samples < 0:
        raise ValueError(f"Expected `num_samples` to be an int >= 0, but got {num_samples!r}")
    if isinstance(noise, bool) or not isinstance(noise, numbers.Real) or not (0 < float(noise) < float("inf")):
        raise ValueError(f"Expected `noise` to be a finite float > 0, but got {noise!r}")
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"Expected `dtype` to be torch.float32 or torch.float64, but got {dtype}")
    device = torch.device(device) if device is not None else hierarchy.device
    h = hierarchy.to("cpu")
    B, L = int(num_samples), h.num_leaves
    gen = torch.Generator().manual_seed(int(seed))
    # Draw order is fixed (centres, offsets, then labels) so that a seed pins the centres and
    # offsets independently of `noise`.
    centre = torch.randint(L, (B,), generator=gen)
    offsets = torch.randn(h.num_nodes, B, generator=gen, dtype=torch.float64)
    uniforms = torch.rand(B, 1, generator=gen, dtype=torch.float64)

    # |A(l) ∩ A(c)| = d(LCA(c, l)) + 1 and the path sums of the offsets are both one sparse
    # product with the (L, N) leaf-ancestor incidence: no L x L distance matrix, no loop.
    # (The root's offset shifts every logit of a row equally, so it drops out of the softmax.)
    with warnings.catch_warnings():
        # torch (2.11 at least) says "Sparse invariant checks are implicitly disabled" from these sparse
        # ops, through `hdecode compare` too; the incidence is built valid (coalesced, in range).
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        incidence = h.leaf_ancestor_incidence(torch.float64)
        shared = torch.sparse.mm(incidence, ancestor_mask(h, centre).t().to(torch.float64))
        offset_sums = torch.sparse.mm(incidence, offsets)
    depth = h.depth.to(torch.float64)
    dist = depth[centre][None, :] + depth[:L, None] - 2.0 * (shared - 1.0)
    score = offset_sums - dist
    probs = torch.softmax(score.t() / float(noise), dim=1)
    # Inverse-CDF sampling with one uniform per row: vectorized, and exactly y ~ probs.
    cdf = probs.cumsum(1)
    targets = torch.searchsorted(cdf, uniforms * cdf[:, -1:], right=True).squeeze(1).clamp_(max=L - 1)
    return probs.to(device=device, dtype=dtype), targets.to(device)


def synthetic_miscalibrated(hierarchy, num_samples: int, distortion: str = "depth", strength: float = 2.0,
                            noise: float = DEFAULT_NOISE, seed: int = 0, device: torch.device | str | None = None,
                            dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A model with a known miscalibration: labels drawn from a true ``p*``, the model reporting a distorted ``q``.

    ``p*`` and the labels are :func:`synthetic_outputs`'s (same ``noise`` and ``seed``).  The model's
    log-probabilities ``log q`` re-temper the conditionals ``p*(c | parent(c))`` with a power ``s_c`` per
    child node and recompose the leaves (:mod:`hdecode_torch.kernels.conditionals`), with ``k = strength``:

    - ``"none"``: ``q = p*`` (a calibrated model);
    - ``"global"``: ``q ∝ p*^k`` on the leaves (one temperature 1/k: over-confident for k > 1, under-
      confident for k < 1);
    - ``"depth"``: ``s_c = k^u`` with ``u`` going linearly from −1 for the children of the root to +1 at
      the deepest level D (``u = 0`` when D = 1): flatter conditionals near the root, sharper ones deep
      down for k > 1 (the reverse for k < 1);
    - ``"sharp_leaves"``: ``s_c = k`` for a leaf, ``1/k`` for an internal node: confident about the leaf
      given its parent, not about the branch (k > 1);
    - ``"flat_leaves"``: the reverse, ``s_c = 1/k`` for a leaf and ``k`` for an internal node.

    Args:
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        num_samples: B >= 0.
        distortion: one of ``DISTORTIONS``.
        strength: k, a finite float > 0 (1 is no distortion).
        noise, seed, device: as for :func:`synthetic_outputs`.
        dtype: float32 (default) or float64 for ``logits`` and ``true_probs`` (computed in float64).
    Returns:
        ``(logits, targets, true_probs)``: (B, L) the model's logits (``log q``, rows log-softmax-
        normalised), (B,) int64 leaf ids drawn from ``p*``, and (B, L) ``p*`` itself (the oracle).
        O(B·N).
    """
    if distortion not in DISTORTIONS:
        raise ValueError(f"Expected `distortion` to be one of {DISTORTIONS}, but got {distortion!r}")
    if isinstance(strength, bool) or not isinstance(strength, numbers.Real) \
            or not (0 < float(strength) < float("inf")):
        raise ValueError(f"Expected `strength` to be a finite float > 0, but got {strength!r}")
    probs, targets = synthetic_outputs(hierarchy, num_samples, noise, seed, device="cpu", dtype=torch.float64)
    device = torch.device(device) if device is not None else hierarchy.device
    h = hierarchy.to("cpu")
    k = float(strength)
    logp = probs.log()
    if distortion == "none":
        logits = logp
    elif distortion == "global":
        logits = torch.log_softmax(k * logp, dim=1)
    else:
        is_leaf = torch.arange(h.num_nodes) < h.num_leaves
        if distortion == "depth":
            top = max(h.max_depth - 1, 1)
            u = torch.where(h.depth >= 1, 2.0 * (h.depth - 1).double() / top - 1.0, 0.0) if h.max_depth > 1 \
                else torch.zeros(h.num_nodes, dtype=torch.float64)
            power = k ** u
        else:
            sharp = is_leaf if distortion == "sharp_leaves" else ~is_leaf
            power = torch.where(sharp, k, 1.0 / k).double()
        levels = recompose(h, conditional_log_probs(h, node_log_probs(h, logp.t())), power)
        logits = torch.log_softmax(leaf_rows(h, levels).t(), dim=1)
    return logits.to(device=device, dtype=dtype), targets.to(device), probs.to(device=device, dtype=dtype)


def tree_gaussian_features(h, num_samples: int, dim: int = 32, noise: float = 1.0, seed: int = 0,
                       offset_scale: float = 1.0):
    """Synthetic features whose class means follow the tree.

    Each node's mean is its parent's mean plus a random offset (scale ``offset_scale``),
    so classes that share more ancestors lie closer.  Samples are their leaf's mean plus
    ``noise`` * N(0, I): larger noise, more confusion between nearby classes.
    Returns x (num_samples, dim) float32 and y (num_samples,) int64 leaf ids.
    """
    g = torch.Generator().manual_seed(seed)
    offsets = torch.randn(h.num_nodes, dim, generator=g) * offset_scale
    offsets[h.root] = 0
    means = path_sum(h, offsets)  # each node's mean: the offsets summed along its root path
    y = torch.randint(0, h.num_leaves, (num_samples,), generator=g)
    x = means[y] + noise * torch.randn(num_samples, dim, generator=g)
    return x, y
