"""Checks of integer ids (class indices, node ids) and node sets: types and shapes at once, ranges as 0-d
flags on the device, read with the call's other checks (one host read)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .conversion import as_tensor

__all__ = ["RangeCheck", "range_flags", "raise_first_range_error", "check_ranges", "as_targets", "as_node_ids",
           "check_node_sets"]


class RangeCheck(NamedTuple):
    """``tensor`` (integer ids) must lie in ``0..hi-1``; ``what`` names the ids in messages."""

    tensor: torch.Tensor
    hi: int
    name: str
    what: str


def _range_flag(c: RangeCheck, device) -> torch.Tensor:
    t = c.tensor
    ok = ((t >= 0) & (t < c.hi)).all()
    return ok if ok.device == device else ok.to(device)


def _raise_range_error(c: RangeCheck) -> None:
    t = c.tensor.reshape(-1)
    out = (t < 0) | (t >= c.hi)
    bad = t[out]
    pos = int(out.nonzero()[0])
    raise ValueError(
        f"Expected `{c.name}` in 0..{c.hi - 1} ({c.what}), but got {int(bad[0])} at position {pos} "
        f"({bad.numel()} value(s) out of range)"
    )


def range_flags(checks, device) -> list[torch.Tensor]:
    """One 0-d bool tensor on ``device`` per :class:`RangeCheck` (no host sync)."""
    return [_range_flag(c, device) for c in checks]


def raise_first_range_error(checks, oks) -> None:
    for c, ok in zip(checks, oks):
        if not ok:
            _raise_range_error(c)


def check_ranges(checks, validate: bool = True) -> None:
    """Check every :class:`RangeCheck` with a single host sync (nothing when ``validate=False``)."""
    checks = [c for c in checks if c is not None]
    if not validate or not checks:
        return
    device = checks[0].tensor.device
    oks = torch.stack(range_flags(checks, device)).tolist()  # the one host sync
    if not all(oks):
        raise_first_range_error(checks, oks)


def _integer_ids(x, name: str, what: str) -> torch.Tensor:
    t = as_tensor(x, name)
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"Expected `{name}` to hold integer {what}, but got dtype {t.dtype}")
    return t


def as_targets(target, num_leaves: int, batch: int | None = None, *, name: str = "target",
               device: torch.device | None = None) -> torch.Tensor:
    """Type and shape checks of (B,) or () integer class indices (no host sync).  Returns int64."""
    t = _integer_ids(target, name, "class indices")
    if t.dim() > 1:
        raise ValueError(f"Expected `{name}` to have shape (B,) or (), but got {tuple(t.shape)}")
    if batch is not None and t.dim() == 1 and t.shape[0] != batch:
        raise ValueError(f"Expected `{name}` to have {batch} entries (one per sample), but got {t.shape[0]}")
    return t.to(device=device if device is not None else t.device, dtype=torch.long)


def as_node_ids(pred, num_nodes: int, *, name: str = "pred", device: torch.device | None = None) -> torch.Tensor:
    """Type and shape checks of (B,) or () integer node ids (no host sync).  Returns int64."""
    t = _integer_ids(pred, name, "node ids")
    if t.dim() > 1:
        raise ValueError(f"Expected `{name}` to have shape (B,) or () (node ids), but got {tuple(t.shape)}")
    return t.to(device=device if device is not None else t.device, dtype=torch.long)


def check_node_sets(pred, num_nodes: int, *, name: str = "pred", device: torch.device | None = None) -> torch.Tensor:
    """pred: (B, N) or (N,) bool node sets.  Returns bool on ``device``."""
    t = as_tensor(pred, name)
    if t.dtype != torch.bool:
        raise TypeError(f"Expected `{name}` as a node set to be a bool tensor, but got dtype {t.dtype}")
    if t.dim() not in (1, 2) or t.shape[-1] != num_nodes:
        raise ValueError(f"Expected `{name}` to have shape (B, {num_nodes}) or ({num_nodes},), but got {tuple(t.shape)}")
    return t.to(device) if device is not None else t
