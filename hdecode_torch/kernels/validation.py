"""Input checks shared by every public entry point (SPEC §6).

Each check is one fused reduction and a single host sync, and every public function
takes ``validate=False`` to skip it on trusted hot paths.  Messages name the argument,
what was expected, what was found, and the fix.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch

__all__ = [
    "ROW_SUM_TOLERANCE",
    "row_sum_tolerance",
    "compute_dtype",
    "as_tensor",
    "prepare_leaf_probs",
    "check_targets",
    "check_node_ids",
    "check_node_sets",
    "check_positive",
    "check_nonnegative",
    "check_unit_interval",
]

#: |row sum - 1| allowed per dtype of the *input*.  Half-precision storage alone loses
#: ~5e-4 (float16) / ~4e-3 (bfloat16) relative per entry, so rows of 1,000 classes
#: that summed to 1 before the cast do not sum to 1 within 1e-6 after it.
ROW_SUM_TOLERANCE = {
    torch.float64: 1e-6,
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 1e-2,
}


def row_sum_tolerance(dtype: torch.dtype) -> float:
    """The documented row-sum tolerance for probabilities stored in ``dtype``."""
    return ROW_SUM_TOLERANCE.get(dtype, 1e-4)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (float32, float16, bfloat16) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_tensor(x, name: str) -> torch.Tensor:
    """Accept tensors, numpy arrays and nested lists; anything else is a TypeError."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (np.ndarray, list, tuple)):
        try:
            return torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"Expected `{name}` to be a tensor or array of numbers: {exc}") from None
    raise TypeError(f"Expected `{name}` to be a torch.Tensor, but got {type(x).__name__}")


def prepare_leaf_probs(
    leaf_probs,
    num_leaves: int,
    *,
    name: str = "leaf_probs",
    normalize: bool = False,
    from_logits: bool = False,
    validate: bool = True,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, bool]:
    """Check and convert leaf probabilities to a ``(B, L)`` tensor in the compute dtype.

    leaf_probs: (B, L) or (L,) float.  Returns ``(probs, unbatched)`` where ``probs`` is
    (B, L) float32 (float64 kept) and ``unbatched`` tells whether the input was 1-D.
    ``from_logits`` applies a softmax; ``normalize`` divides each row by its sum.
    """
    x = as_tensor(leaf_probs, name)
    if not x.is_floating_point():
        raise TypeError(
            f"Expected `{name}` to be a floating-point tensor, but got dtype {x.dtype}"
            + (" (class indices? decoders take probabilities)" if not x.dtype.is_complex else "")
        )
    if x.dim() not in (1, 2):
        raise ValueError(f"Expected `{name}` to have shape (B, {num_leaves}) or ({num_leaves},), but got {tuple(x.shape)}")
    unbatched = x.dim() == 1
    if unbatched:
        x = x.unsqueeze(0)
    if x.shape[1] != num_leaves:
        raise ValueError(
            f"Expected `{name}` to have {num_leaves} columns (one per leaf of the hierarchy), but got shape "
            f"{tuple(x.shape)}"
        )
    if device is not None and x.device != device:
        x = x.to(device)
    in_dtype = x.dtype
    x = x.to(compute_dtype(in_dtype))
    if from_logits:
        if validate and x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError(f"Expected `{name}` (logits) to be finite, but it contains NaN or infinite values")
        return torch.softmax(x, dim=1), unbatched
    if not validate and not normalize:
        return x, unbatched
    if x.numel() == 0:
        return x, unbatched
    sums = x.sum(dim=1)
    tol = row_sum_tolerance(in_dtype)
    finite = torch.isfinite(x).all()
    nonneg = (x >= 0).all()
    rows_ok = ((sums - 1).abs() <= tol).all() if not normalize else (sums > 0).all()
    flags = torch.stack([finite, nonneg, rows_ok]).tolist()  # the one host sync
    if not all(flags):
        _raise_probs_error(x, sums, flags, name, tol, normalize)
    if normalize:
        x = x / sums[:, None]
    return x, unbatched


def _raise_probs_error(x, sums, flags, name, tol, normalize):
    finite, nonneg, rows_ok = flags
    if not finite:
        row = int((~torch.isfinite(x)).any(1).nonzero()[0])
        raise ValueError(f"Expected `{name}` to be finite, but row {row} contains NaN or infinite values")
    if not nonneg:
        row = int((x < 0).any(1).nonzero()[0])
        hint = " These look like logits: pass from_logits=True (or apply softmax)."
        raise ValueError(
            f"Expected `{name}` to be probabilities (>= 0), but row {row} has a negative entry "
            f"({float(x[row].min()):.4g}).{hint}"
        )
    if normalize:
        row = int((sums <= 0).nonzero()[0])
        raise ValueError(f"Cannot normalize `{name}`: row {row} sums to {float(sums[row]):.4g}")
    bad = ((sums - 1).abs() > tol).nonzero()
    row = int(bad[0])
    raise ValueError(
        f"Expected each row of `{name}` to sum to 1 (tolerance {tol:g} for {x.dtype} input), but row {row} sums "
        f"to {float(sums[row]):.6g} ({bad.numel()} bad row(s)). Pass normalize=True to renormalize, or "
        "from_logits=True if these are logits"
    )


def check_targets(target, num_leaves: int, batch: int | None = None, *, name: str = "target",
                  validate: bool = True, device: torch.device | None = None) -> torch.Tensor:
    """target: (B,) or () integer class indices in ``0..L-1``.  Returns int64 (B,) (or ())."""
    t = as_tensor(target, name)
    if t.is_floating_point() or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"Expected `{name}` to hold integer class indices, but got dtype {t.dtype}")
    if t.dim() > 1:
        raise ValueError(f"Expected `{name}` to have shape (B,), but got {tuple(t.shape)}")
    if batch is not None and t.dim() == 1 and t.shape[0] != batch:
        raise ValueError(f"Expected `{name}` to have {batch} entries (one per sample), but got {t.shape[0]}")
    t = t.to(device=device if device is not None else t.device, dtype=torch.long)
    if validate and t.numel():
        lo, hi = torch.aminmax(t)
        lo, hi = int(lo), int(hi)
        if lo < 0 or hi >= num_leaves:
            bad = lo if lo < 0 else hi
            raise ValueError(f"Expected `{name}` in 0..{num_leaves - 1} (leaf ids), but got {bad}")
    return t


def check_node_ids(pred, num_nodes: int, *, name: str = "pred", validate: bool = True,
                   device: torch.device | None = None) -> torch.Tensor:
    """pred: (B,) or () integer node ids in ``0..N-1``.  Returns int64."""
    t = as_tensor(pred, name)
    if t.is_floating_point() or t.dtype == torch.bool:
        raise TypeError(f"Expected `{name}` to hold integer node ids, but got dtype {t.dtype}")
    t = t.to(device=device if device is not None else t.device, dtype=torch.long)
    if validate and t.numel():
        lo, hi = torch.aminmax(t)
        lo, hi = int(lo), int(hi)
        if lo < 0 or hi >= num_nodes:
            raise ValueError(f"Expected `{name}` in 0..{num_nodes - 1} (node ids), but got {lo if lo < 0 else hi}")
    return t


def check_node_sets(pred, num_nodes: int, *, name: str = "pred", device: torch.device | None = None) -> torch.Tensor:
    """pred: (B, N) or (N,) bool node sets.  Returns bool on ``device``."""
    t = as_tensor(pred, name)
    if t.dtype != torch.bool:
        raise TypeError(f"Expected `{name}` as a node set to be a bool tensor, but got dtype {t.dtype}")
    if t.shape[-1] != num_nodes or t.dim() not in (1, 2):
        raise ValueError(f"Expected `{name}` to have shape (B, {num_nodes}), but got {tuple(t.shape)}")
    return t.to(device) if device is not None else t


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a real number, but got {type(value).__name__}")
    value = float(value)
    if value != value:
        raise ValueError(f"Expected `{name}` to be a number, but got nan")
    return value


def check_positive(value, name: str) -> float:
    v = _number(value, name)
    if not (v > 0) or v == float("inf"):
        raise ValueError(f"Expected `{name}` to be a float > 0, but got {value}")
    return v


def check_nonnegative(value, name: str) -> float:
    v = _number(value, name)
    if not (v >= 0) or v == float("inf"):
        raise ValueError(f"Expected `{name}` to be a float >= 0, but got {value}")
    return v


def check_unit_interval(value, name: str) -> float:
    """A value in [0, 1)."""
    v = _number(value, name)
    if not (0 <= v < 1):
        raise ValueError(f"Expected `{name}` to be a float in [0, 1), but got {value}")
    return v
