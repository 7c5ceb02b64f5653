"""Temperature scaling: one learnable temperature that calibrates a classifier's logits.

Bayes-optimal decoding is optimal *under the model's probabilities*: an over-confident model
(probabilities too peaked) makes every optimal decoder commit to deep, specific nodes too often.
Temperature scaling (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017) divides
the logits by a scalar T > 0 fitted on held-out labelled data by minimising the negative
log-likelihood

    NLL(T) = mean_i [ logsumexp_l(z_il / T) - z_iy_i / T ],

which is convex in 1/T (a log-sum-exp of linear functions minus a linear function).  T > 1
softens over-confident logits, T < 1 sharpens under-confident ones; the argmax never changes.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch import nn

from ..core.row_checks import row_sum_tolerance

__all__ = ["TemperatureScaler"]


class TemperatureScaler(nn.Module):
    """``logits -> logits / T`` with a learnable temperature ``T = exp(log_temperature)``.

    Parametrised by ``log T`` so that T stays positive under any optimiser.  Fit it on held-out
    logits with :meth:`fit`, then put it in front of a decoding head::

        scaler = hd.TemperatureScaler().fit(val_logits, val_labels)
        model = nn.Sequential(backbone, scaler, hd.DecodingHead(h, "wu_palmer", from_logits=True))

    Args:
        temperature: the initial T > 0 (default 1: the identity).
    """

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) \
                or not (0 < float(temperature) < math.inf):
            raise ValueError(f"Expected `temperature` to be a finite float > 0, but got {temperature!r}")
        self.log_temperature = nn.Parameter(torch.tensor(math.log(float(temperature))))

    @property
    def temperature(self) -> float:
        """The current T, as a Python float."""
        return float(self.log_temperature.detach().double().exp())

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        """logits: (..., L) float -> logits / T, same shape and dtype (differentiable in T)."""
        if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
            raise TypeError(f"Expected `logits` to be a floating-point tensor, but got "
                            f"{getattr(logits, 'dtype', type(logits).__name__)}")
        return logits / self.log_temperature.exp().to(device=logits.device, dtype=logits.dtype)

    def negative_log_likelihood(self, logits: torch.Tensor, targets: torch.Tensor) -> float:
        """Mean NLL of ``targets`` under ``softmax(logits / T)``, computed in float64.

        logits: (B, L) float; targets: (B,) int leaf ids.  O(B·L).
        """
        z, y = _check_inputs(logits, targets)
        with torch.no_grad():
            return float(_nll(z, y, self.log_temperature.detach().to(device=z.device, dtype=torch.float64)))

    def fit(self, logits: torch.Tensor, targets: torch.Tensor, max_iter: int = 100) -> "TemperatureScaler":
        """Set T to the minimiser of the NLL of ``targets`` under ``softmax(logits / T)``; returns ``self``.

        logits: (B, L) float held-out logits (``-inf`` allowed for masked classes, not at a
        target); targets: (B,) int in ``0..L-1``.  Probabilities (every row non-negative, summing
        to 1) are refused: a softmax of them is not a model of the labels at any T (pass their log).
        Runs L-BFGS with a strong-Wolfe line search in float64 on ``log T'``, the temperature of the
        logits divided by their root-mean-square spread within rows ``s``, starting from T' = the
        current T, for at most ``max_iter`` iterations; then T = s·T'.  The fit is thus the same at
        every scale (logits of spread 1e-8 or 1e8 are fitted as well as logits of spread 1):
        deterministic for given inputs, O(max_iter · B · L).  Works under ``torch.no_grad()`` and ``torch.inference_mode()``;
        the logits are not part of any autograd graph afterwards.

        Warnings: logits constant within every row (no T changes the probabilities; T is left as
        it was); logits that rank every target strictly first (the NLL has no minimiser, it falls
        towards 0 as T -> 0: the fit stops where the NLL no longer changes); T' above 1e3 (the
        logits say almost nothing about the targets); T below 1e-3 or above 1e3 (logits on a scale
        no calibrated model has: T rescales them, but check where they come from).
        """
        if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral) or max_iter < 1:
            raise ValueError(f"Expected `max_iter` to be an int >= 1, but got {max_iter!r}")
        z, y = _check_inputs(logits, targets)
        with torch.inference_mode(False):  # autograd works inside the caller's inference_mode too
            z = z.clone()  # a normal tensor (an inference tensor cannot be saved for backward)
            finite = torch.isfinite(z)
            spread = _rms_spread(z, finite)
            if spread == 0.0:
                warnings.warn("Temperature scaling: the logits are constant within every row, so softmax(logits / T) "
                              f"is uniform at every T: nothing to fit, T stays {self.temperature:.4g}", stacklevel=2)
                return self
            z = torch.where(finite, z / spread, z)
            log_t = self.log_temperature.detach().to(device=z.device, dtype=torch.float64).clone().requires_grad_(True)
            opt = torch.optim.LBFGS([log_t], lr=1.0, max_iter=int(max_iter), tolerance_grad=1e-10,
                                    tolerance_change=1e-14, history_size=10, line_search_fn="strong_wolfe")

            def closure():
                opt.zero_grad()
                loss = _nll(z, y, log_t)
                loss.backward()
                return loss

            with torch.enable_grad():
                opt.step(closure)
            scaled = float(log_t.detach())
            separable = z.shape[1] > 1 and bool((z.gather(1, y[:, None]).squeeze(1)
                                                 > z.scatter(1, y[:, None], float("-inf")).amax(1)).all())
        if not math.isfinite(scaled):
            raise ValueError("Temperature scaling diverged: the NLL has no finite minimiser on these logits "
                             f"(log T = {scaled}); check the logits and targets")
        value = scaled + math.log(spread)
        # A parameter made under inference_mode is an inference tensor: updated in place only in that mode.
        with torch.inference_mode() if self.log_temperature.is_inference() else torch.no_grad():
            self.log_temperature.copy_(torch.tensor(value, dtype=torch.float64))
        t, t_unit = math.exp(value), math.exp(scaled)
        if separable:
            warnings.warn(f"Temperature scaling: the logits rank every target first, so the NLL has no minimum (it "
                          f"falls towards 0 as T -> 0); T = {t:.3g} is where the optimiser stopped. Fit on data the "
                          "model gets wrong sometimes", stacklevel=2)
        elif t_unit > 1e3:
            warnings.warn(f"Temperature scaling: fitted T = {t:.3g}: the logits say almost nothing about the "
                          "targets, the calibrated probabilities are nearly uniform", stacklevel=2)
        elif not 1e-3 <= t <= 1e3:
            size = "small" if t < 1 else "large"
            warnings.warn(f"Temperature scaling: fitted T = {t:.3g}: the logits (spread {spread:.3g} within rows) are "
                          f"{max(t, 1 / t):.3g} times too {size} for calibrated ones; T rescales them, but check that "
                          "they are the model's logits", stacklevel=2)
        return self

    def extra_repr(self) -> str:
        return f"temperature={self.temperature:.4g}"


def _rms_spread(z: torch.Tensor, finite: torch.Tensor) -> float:
    """Root-mean-square deviation of the finite logits from their row's mean: the logits' scale, which
    softmax(z / T) depends on through z / T only (0 when every row is constant)."""
    count = finite.sum(1, keepdim=True).clamp(min=1)
    mean = torch.where(finite, z, 0.0).sum(1, keepdim=True) / count
    dev = torch.where(finite, z - mean, 0.0)
    return float((dev.square().sum() / finite.sum()).sqrt())


def _nll(z: torch.Tensor, y: torch.Tensor, log_t: torch.Tensor) -> torch.Tensor:
    """Mean NLL at T = exp(log_t); masked (-inf) logits stay -inf without NaN gradients."""
    finite = torch.isfinite(z)
    scaled = torch.where(finite, torch.where(finite, z, 0.0) * torch.exp(-log_t), float("-inf"))
    return (torch.logsumexp(scaled, dim=1) - scaled.gather(1, y[:, None]).squeeze(1)).mean()


def _check_inputs(logits, targets) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) float64 logits and (B,) int64 targets, validated."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"Expected `logits` to be a torch.Tensor, but got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise TypeError(f"Expected `logits` to be a floating-point tensor, but got dtype {logits.dtype}")
    if logits.dim() != 2 or logits.shape[0] == 0 or logits.shape[1] == 0:
        raise ValueError(f"Expected `logits` to have shape (B, L) with B, L >= 1, but got {tuple(logits.shape)}")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"Expected `targets` to be a torch.Tensor, but got {type(targets).__name__}")
    if targets.is_floating_point() or targets.is_complex() or targets.dtype == torch.bool:
        raise TypeError(f"Expected `targets` to hold integer class ids, but got dtype {targets.dtype}")
    if targets.shape != (logits.shape[0],):
        raise ValueError(f"Expected `targets` to have shape ({logits.shape[0]},) (one per row of `logits`), but got "
                         f"{tuple(targets.shape)}")
    z = logits.detach().to(torch.float64)
    y = targets.detach().to(device=z.device, dtype=torch.long)
    L = z.shape[1]
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= L:
        raise ValueError(f"Expected `targets` in 0..{L - 1}, but got {lo if lo < 0 else hi}")
    if bool(torch.isnan(z).any()) or bool(torch.isposinf(z).any()):
        row = int((torch.isnan(z) | torch.isposinf(z)).any(1).nonzero()[0])
        raise ValueError(f"Expected `logits` to be finite (or -inf for a masked class), but row {row} holds NaN or "
                         "+inf")
    if L > 1 and bool((z >= 0).all()) and bool(((z.sum(1) - 1).abs() <= row_sum_tolerance(logits.dtype, L)).all()):
        raise ValueError("Expected `logits` to hold logits, but every row is non-negative and sums to 1: these are "
                         "probabilities, and softmax(probabilities / T) models the labels at no T. Pass the model's "
                         "logits, or the log of the probabilities (probs.log())")
    target_logit = z.gather(1, y[:, None]).squeeze(1)
    if not bool(torch.isfinite(target_logit).all()):
        row = int((~torch.isfinite(target_logit)).nonzero()[0])
        raise ValueError(f"Expected a finite logit at each target, but row {row} has -inf at its target "
                         f"{int(y[row])} (probability 0: infinite NLL at every T)")
    return z, y
