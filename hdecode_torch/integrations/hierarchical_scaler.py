"""Hierarchical calibration: a temperature, then re-tempered conditionals p(child | parent) by depth.

Bayes-optimal decoders trust p(n) at *every* node.  One temperature (Guo et al., ICML 2017) moves the
confidence of the leaves and of the internal nodes together; a model can be over-confident about its
leaves and under-confident about their ancestors, or the reverse, and no single temperature fixes both.
A leaf distribution is one conditional distribution per internal node (log p(c | n) = log p(c) − log p(n)),
so calibrating each depth's conditionals with a power of its own and recomposing the leaves by path
sums lets every depth's confidence move on its own, and keeps a distribution over the leaves.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..hierarchy import Hierarchy
from ..kernels.conditionals import (conditional_log_probs, leaf_rows, node_log_probs, path_log_likelihood,
                                    path_sibling_groups, recompose)
from .temperature import TemperatureScaler, _check_inputs

__all__ = ["HierarchicalScaler", "FAMILIES", "LOSSES"]

#: The parametric families, by name: see :class:`HierarchicalScaler`.
FAMILIES = ("temperature", "depth", "depth_leaf", "depth_affine")
LOSSES = ("nll", "hierarchical")


class HierarchicalScaler(nn.Module):
    """``logits -> calibrated leaf log-probabilities``: a temperature, then re-tempered conditionals.

    With ``z`` the logits (B, L), ``T`` the temperature and ``p = softmax(z / T)``, every conditional
    ``p(c | n) = p(c) / p(n)`` of a child ``c`` of an internal node ``n`` is re-tempered and
    renormalised among its siblings, and the leaves are recomposed along their root paths:

        log q(c | n) = s_c · log p(c | n) + b_c − logsumexp_{c' ∈ children(n)} (s_c' · log p(c' | n) + b_c'),
        log q(l)     = Σ_{a ∈ A(l), a ≠ root} log q(a | parent(a)),

    with ``s_c = 1 / T_k`` for the class ``k`` of ``c`` and the family deciding the classes and ``b``:

    - ``"temperature"``: ``T`` alone (``s = 1, b = 0``): 1 parameter, the same as
      :class:`TemperatureScaler`.
    - ``"depth"``: one temperature ``T_d`` per depth d = 1..D of the child: 1 + D parameters.
    - ``"depth_leaf"`` (default): one temperature per depth *and* per kind of child (leaf or internal
      node), so the leaves' confidence and their ancestors' move independently even where leaves sit
      at several depths: 1 + 2D parameters (classes that hold no node stay at 1 and do nothing).
    - ``"depth_affine"``: a temperature per depth and a shift ``b_c = β_d · log |L(c)|`` towards (β > 0)
      or away from the children with more leaves: 1 + 2D parameters.

    ``T_k = 1, β = 0`` is the identity after the temperature; an only child keeps ``q(c | n) = 1``.  The
    output is log-softmax-normalised, so ``DecodingHead(..., from_logits=True)`` and every
    ``from_logits=True`` entry point take it.  The default was chosen by measuring held-out NLL and the
    decoders' realised scores on synthetic models with known miscalibrations (see the benchmarks).

    Fit it with :meth:`fit` on held-out logits, then put it before a decoding head::

        scaler = hd.HierarchicalScaler(h).fit(val_logits, val_labels)
        model = nn.Sequential(backbone, scaler, hd.DecodingHead(h, "wu_palmer", from_logits=True))

    Args:
        hierarchy: the class tree; its leaves ``0..L-1`` are the logits' columns.
        family: one of ``"temperature"``, ``"depth"``, ``"depth_leaf"``, ``"depth_affine"``.
        temperature: the initial global T > 0 (default 1).

    Parameters (state_dict): ``log_temperature`` (), ``log_temperatures`` (K,) and, for
    ``"depth_affine"``, ``shift`` (D,).  Readable: :attr:`temperature`, :attr:`temperatures`,
    :attr:`shifts`.  Forward costs O(B·N) time and memory for N nodes (one vectorized step per
    depth); it is differentiable in the parameters and the logits.
    """

    def __init__(self, hierarchy: Hierarchy, family: str = "depth_leaf", temperature: float = 1.0):
        super().__init__()
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        if family not in FAMILIES:
            raise ValueError(f"Expected `family` to be one of {FAMILIES}, but got {family!r}")
        self.family = family
        self._hierarchy = hierarchy.to("cpu")
        self.log_temperature = TemperatureScaler(temperature).log_temperature  # checks `temperature`
        h, depth = self._hierarchy, max(self._hierarchy.max_depth, 1)
        below_root = (h.depth - 1).clamp(min=0)
        if family == "depth_leaf":
            classes, k = 2 * below_root + (torch.arange(h.num_nodes) < h.num_leaves).long(), 2 * depth
        else:
            classes, k = below_root, (depth if family != "temperature" else 0)
        self.register_buffer("node_class", classes, persistent=False)
        self.register_buffer("log_leaf_count", h.leaf_count.double().log(), persistent=False)
        self.log_temperatures = nn.Parameter(torch.zeros(k, dtype=torch.float64))
        if family == "depth_affine":
            self.shift = nn.Parameter(torch.zeros(depth, dtype=torch.float64))
        else:
            self.shift = None

    # ------------------------------------------------------------------ readable parameters
    @property
    def hierarchy(self) -> Hierarchy:
        """The tree, on the device of the module's buffers."""
        return self._hierarchy.to(self.node_class.device)

    @property
    def temperature(self) -> float:
        """The global T, as a Python float."""
        return float(self.log_temperature.detach().double().exp())

    @property
    def temperatures(self) -> list[float]:
        """The temperatures of the conditionals, as Python floats: one per depth 1..D (``"depth"``,
        ``"depth_affine"``), or per depth and kind of child, ``[T_1,internal, T_1,leaf, T_2,internal, …]``
        (``"depth_leaf"``); empty for ``"temperature"``."""
        return [math.exp(v) for v in self.log_temperatures.detach().double().tolist()]

    @property
    def shifts(self) -> list[float]:
        """``β_d`` per depth 1..D for ``"depth_affine"`` (empty otherwise)."""
        return [] if self.shift is None else self.shift.detach().double().tolist()

    @property
    def num_parameters(self) -> int:
        """How many numbers the family fits."""
        return 1 + self.log_temperatures.numel() + (0 if self.shift is None else self.shift.numel())

    # ------------------------------------------------------------------ forward
    def _node_params(self, dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(N,) powers ``s_c`` and (N,) shifts ``b_c`` (None when the family has none)."""
        if self.log_temperatures.numel() == 0:
            return torch.ones(self.node_class.shape, dtype=dtype, device=self.node_class.device), None
        scale = torch.exp(-self.log_temperatures).to(dtype).index_select(0, self.node_class)
        if self.shift is None:
            return scale, None
        return scale, self.shift.to(dtype).index_select(0, self.node_class) * self.log_leaf_count.to(dtype)

    def _tempered(self, logits: torch.Tensor) -> torch.Tensor:
        """log softmax(logits / T), (B, L)."""
        t = self.log_temperature.exp().to(device=logits.device, dtype=logits.dtype)
        finite = torch.isfinite(logits)
        # A masked class (-inf) stays -inf, without the NaN gradient (-inf) * 0 would give T.
        return torch.log_softmax(torch.where(finite, torch.where(finite, logits, 0.0) / t, float("-inf")), dim=1)

    def _conditionals(self, h, logits: torch.Tensor) -> list[torch.Tensor]:
        return conditional_log_probs(h, node_log_probs(h, self._tempered(logits).t()))

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: (B, L) float (float32 or float64; ``-inf`` for a masked class) -> (B, L) calibrated
        log-probabilities, same dtype, each row's ``exp`` summing to 1."""
        if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating-point tensor, but got "
                            f"{getattr(logits, 'dtype', type(logits).__name__)}")
        h = self.hierarchy
        if logits.dim() != 2 or logits.shape[1] != h.num_leaves:
            raise ValueError(f"Expected `logits` to have shape (B, {h.num_leaves}), but got {tuple(logits.shape)}")
        if self.log_temperatures.numel() == 0:
            return self._tempered(logits)
        h = h.to(logits.device)
        scale, shift = self._node_params(logits.dtype)
        levels = recompose(h, self._conditionals(h, logits), scale.to(logits.device),
                           None if shift is None else shift.to(logits.device))
        # The recomposed rows sum to 1 up to rounding; one log-softmax makes that exact to the dtype.
        return torch.log_softmax(leaf_rows(h, levels).t(), dim=1)

    # ------------------------------------------------------------------ fitting
    def loss(self, logits: torch.Tensor, targets: torch.Tensor, loss: str = "nll") -> float:
        """The mean held-out loss of ``targets`` under the calibrated probabilities, in float64.

        ``"nll"``: ``−log q(y)``; ``"hierarchical"``: ``−Σ_{a ∈ A(y), a ≠ root} log q(a)``, a proper
        score of the node probabilities (the log-likelihood of the target's ancestor at every depth).
        logits: (B, L) float; targets: (B,) int leaf ids.  O(B·N).
        """
        _check_loss(loss)
        z, y = _check_inputs(logits, targets)
        with torch.no_grad():
            h = self.hierarchy.to(z.device)
            conds = self._conditionals(h, z)
            scale, shift = self._node_params(torch.float64)
            return float(_loss(_groups(h, conds, y, loss), scale.to(z.device),
                               None if shift is None else shift.to(z.device), y.shape[0]))

    def fit(self, logits: torch.Tensor, targets: torch.Tensor, loss: str = "nll", max_iter: int = 100,
            prior_scale: float | None = 1.0) -> "HierarchicalScaler":
        """Fit the parameters on held-out ``logits`` and ``targets``; returns ``self``.

        logits: (B, L) float (``-inf`` allowed for a masked class, not at a target); targets: (B,) int
        leaf ids in ``0..L-1``.  Two steps, both deterministic, full-batch L-BFGS (strong-Wolfe line
        search, float64, at most ``max_iter`` iterations each):

        1. the global T by :meth:`TemperatureScaler.fit` (the NLL of the leaves; its checks and warnings);
        2. with T fixed to that value, and again with T = 1, keeping whichever reaches the lower objective:
           the conditionals' temperatures (and shifts) from the identity, minimising the
           mean ``loss`` over the B rows, ``"nll"`` (``−log q(y)``) or ``"hierarchical"``
           (``−Σ_{a ∈ A(y), a ≠ root} log q(a)``, the log-likelihood of the target's ancestor at every
           depth), plus ``Σ_k θ_k² / (2 σ² B)`` for every fitted ``θ = log T_k`` (and ``β_d``), σ =
           ``prior_scale``: the maximum a posteriori estimate under a N(0, σ²) prior.  The prior keeps a
           depth whose conditionals rank every target first (separable: the likelihood alone pushes
           its T to 0, seen on a few hundred rows at the top of tieredImageNet-H) finite, and weighs
           less the more rows there are; ``None`` fits the likelihood alone.

        Step 2 starts at the identity, so the fitted loss plus penalty is never above the temperature's.  The
        conditionals are computed once per T (O(B·N)); the loss depends only on the sibling groups along each
        target's root path, so each L-BFGS evaluation costs O(E) for E = Σ over rows of the fan-outs
        along the target's path (about B·D·mean fan-out, far below B·N).  Works under
        ``torch.no_grad()`` and ``torch.inference_mode()``.
        """
        _check_loss(loss)
        if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
            raise ValueError(f"Expected `max_iter` to be an int >= 1, but got {max_iter!r}")
        if prior_scale is not None and (isinstance(prior_scale, bool) or not isinstance(prior_scale, numbers.Real)
                                        or not 0 < float(prior_scale) < math.inf):
            raise ValueError(f"Expected `prior_scale` to be a finite float > 0 or None, but got {prior_scale!r}")
        z, y = _check_inputs(logits, targets)
        if z.shape[1] != self._hierarchy.num_leaves:
            raise ValueError(f"Expected `logits` to have shape (B, {self._hierarchy.num_leaves}), but got "
                             f"{tuple(z.shape)}")
        fitted = float(TemperatureScaler(self.temperature).fit(z, y, max_iter=max_iter).log_temperature.detach())
        best = (0.0, fitted, [])
        if self.num_parameters > 1:
            penalty = 0.0 if prior_scale is None else 0.5 / (float(prior_scale) ** 2 * y.shape[0])
            # T = 1 too: a global temperature is not a tempering of the conditionals, and where the logits'
            # miscalibration is one of the conditionals alone, T = 1 lets the family undo it exactly.
            starts = [fitted] if fitted == 0.0 else [fitted, 0.0]
            fits = [self._fit_conditionals(z, y, log_t, loss, max_iter, penalty) for log_t in starts]
            best = min(((value, log_t, found) for (value, found), log_t in zip(fits, starts)), key=lambda f: f[0])
        with torch.inference_mode() if self.log_temperature.is_inference() else torch.no_grad():
            self.log_temperature.copy_(torch.tensor(best[1], dtype=torch.float64))
            for param, value in zip([self.log_temperatures, self.shift], best[2]):
                param.copy_(value.to(param.device))
        return self

    def _fit_conditionals(self, z, y, log_t: float, loss: str, max_iter: int, penalty: float):
        """``(objective, [log_temperatures, shift])`` fitted by L-BFGS from the identity after the global
        temperature ``exp(log_t)``; z: (B, L) float64 checked logits, y: (B,) int64."""
        with torch.inference_mode(False), torch.no_grad():
            h = self.hierarchy.to(z.device)
            z = torch.where(torch.isfinite(z), z / math.exp(log_t), z)
            groups = _groups(h, conditional_log_probs(h, node_log_probs(h, torch.log_softmax(z, 1).t())), y, loss)
        with torch.inference_mode(False):
            params = [torch.zeros(self.log_temperatures.shape, dtype=torch.float64, device=z.device,
                                  requires_grad=True)]
            if self.shift is not None:
                params.append(torch.zeros(self.shift.shape, dtype=torch.float64, device=z.device, requires_grad=True))
            # Clones: buffers made under inference_mode are inference tensors, which autograd cannot save.
            node_class = self.node_class.to(z.device).clone()
            log_count = self.log_leaf_count.to(z.device).clone()
            opt = torch.optim.LBFGS(params, lr=1.0, max_iter=int(max_iter), tolerance_grad=1e-9,
                                    tolerance_change=1e-12, history_size=10, line_search_fn="strong_wolfe")

            def objective():
                scale = torch.exp(-params[0]).index_select(0, node_class)
                shift = params[1].index_select(0, node_class) * log_count if len(params) > 1 else None
                value = _loss(groups, scale, shift, y.shape[0])
                return value + penalty * sum(p.square().sum() for p in params) if penalty else value

            def closure():
                opt.zero_grad()
                value = objective()
                value.backward()
                return value

            with torch.enable_grad():
                opt.step(closure)
            with torch.no_grad():
                value = float(objective())
            found = [p.detach() for p in params]
        if not (math.isfinite(value) and all(bool(torch.isfinite(p).all()) for p in found)):
            raise ValueError("Hierarchical calibration diverged: the loss has no finite minimiser on these logits; "
                             "check the logits and targets (or pass a `prior_scale`)")
        return value, found

    def extra_repr(self) -> str:
        temps = ", ".join(f"{t:.3g}" for t in self.temperatures)
        text = f"family={self.family!r}, temperature={self.temperature:.4g}, temperatures=[{temps}]"
        if self.shift is not None:
            text += ", shifts=[" + ", ".join(f"{b:.3g}" for b in self.shifts) + "]"
        return text


def _check_loss(loss) -> None:
    if loss not in LOSSES:
        raise ValueError(f"Expected `loss` to be one of {LOSSES}, but got {loss!r}")


def _groups(h, conds, y, kind: str):
    return path_sibling_groups(h, conds, y, "leaf" if kind == "nll" else "ancestors")


def _loss(groups, scale, shift, batch: int) -> torch.Tensor:
    """Mean loss over ``batch`` rows: minus the weighted path log-likelihood of the sibling groups."""
    return -path_log_likelihood(groups, scale, shift) / batch
