"""Device-aware planning: every choice that depends on the device is made here, from measured rules.

A :class:`Plan` says how a call computes: which tree-sum kernels (per-level or depth-first prefix
sums), which decoding strategies, which fused kernels, how large the chunks.  The plan follows the
tensors' device type, unless :func:`plan_for` says otherwise: ``with hd.plan_for("cuda"):`` makes
every choice as for a GPU whatever device the tensors are on, so the GPU plan runs, and is tested,
on a CPU.

The rules (figures in benchmarks/README.md):

- **Tree sums.**  ``"levels"``: one scatter-add per tree level over node-major (N, B) tables.  On a
  CPU it is the fastest way for the shallow trees classifiers use (a level moves whole contiguous
  rows), but its operator count grows with the depth D.  ``"prefix"``: depth-first prefix sums
  along the contiguous dimension of batch-major (B, ·) tables (a node's leaves, a node's subtree,
  a node's root path in the Euler tour are all one contiguous range), a fixed number of operators
  whatever the depth, accumulated in float64.  The CPU plan takes ``"levels"`` up to
  ``CPU_MAX_LEVELS`` levels and ``"prefix"`` beyond (a chain of 10⁵ nodes would take 10⁵ steps);
  the CUDA plan always takes ``"prefix"``: a GPU pays per launch, and a scan along the outer
  dimension of an (L, B) table runs nearly sequentially when B is small.
- **Strategies of Wu-Palmer and Zhao.**  CPU: the measured rule of each metric.  CUDA: the dense
  product while the (N, L) matrix fits (one GEMM), the structural root-path sums otherwise
  (candidates need a host read for their count, and were slower on the GPU).
- **hF_β.**  CPU: prefix sets certified per k (fewest operations).  CUDA: every k solved exactly on
  the candidates (more arithmetic, but a fixed number of operators and at most two host reads).
- **Fused kernels** (``hdecode::`` custom ops, Triton on CUDA): used by the ``"prefix"`` tree sums.
- **Memory budget** for the temporaries of one chunk: ``get_memory_budget()`` on the CPU; on the
  CUDA plan the same once ``set_memory_budget`` was called, else 4 GiB or a quarter of the free
  device memory, whichever is larger (fewer, larger chunks: a GPU pays per launch).
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

__all__ = ["Plan", "plan_for", "current_plan", "planned_device_type", "CPU_MAX_LEVELS"]

#: The CPU plan sums per level up to this many levels (depth + 1), by prefix sums beyond: each level
#: costs a fixed overhead, which the prefix sums' larger per-entry cost outweighs only on trees with
#: hundreds of levels (benchmarks/README.md, "Device plans").
CPU_MAX_LEVELS = 512

_OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar("hdecode_plan", default=None)


@dataclass(frozen=True)
class Plan:
    """The choices of one call (see the module docstring for the rules)."""

    device_type: str  # the device the choices are made for ("cpu" or "cuda")
    tree_sums: str  # "levels" or "prefix"
    node_strategy: str  # "measured" (each metric's own rule) or "dense_or_structural"
    hf_beta: str  # "certified" or "exact"

    @property
    def batch_major(self) -> bool:
        """Whether batch tables are stored (B, ·) with scans along the contiguous dimension."""
        return self.tree_sums == "prefix"


def _device_type(device) -> str:
    if isinstance(device, torch.Tensor):
        device = device.device
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"Expected `device` to be a torch.device, a string such as 'cuda' or a tensor, but got "
                        f"{type(device).__name__}")
    return "cuda" if device.type == "cuda" else "cpu"


@contextlib.contextmanager
def plan_for(device):
    """Within this block, every device-dependent choice is made as for ``device`` ("cpu", "cuda", a
    torch.device or a tensor), whatever the device of the tensors decoded.

    Example: ``with hd.plan_for("cuda"): pred = metric.decode(cpu_probs)`` runs the GPU plan on the
    CPU (same answers; the operators a GPU would launch).  Blocks nest; the innermost wins.
    """
    token = _OVERRIDE.set(_device_type(device))
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


def planned_device_type(device) -> str:
    """The device type choices are made for: the :func:`plan_for` override, else ``device``'s type."""
    override = _OVERRIDE.get()
    return override if override is not None else _device_type(device)


def current_plan(h, device) -> Plan:
    """The :class:`Plan` for hierarchy ``h`` and tensors on ``device``."""
    kind = planned_device_type(device)
    if kind == "cuda":
        return Plan("cuda", "prefix", "dense_or_structural", "exact")
    return Plan("cpu", "levels" if h.max_depth + 1 <= CPU_MAX_LEVELS else "prefix", "measured", "certified")
