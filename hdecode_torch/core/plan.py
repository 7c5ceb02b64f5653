"""Device-aware planning: every choice that depends on the device is made here, once per call.

A :class:`Plan` says how a call computes: which tree-sum layout (per-level or depth-first prefix
sums), which decoding strategies, how large the chunks, which scatter backend.  It is resolved
once, when a :class:`~hdecode_torch.Posterior` is built, and handed down: metrics and decoders read
``post.plan``, kernels take the layout as an argument.  Nothing outside this package resolves it.

The plan follows the tensors' device type, unless :func:`plan_for` says otherwise:
``with hd.plan_for("cuda"):`` makes every choice as for a GPU whatever device the tensors are on,
so the GPU plan runs, and is tested, on a CPU.

The rules (the measurements behind them are in benchmarks/README.md, "Device plans"):

- **Tree sums.**  ``"levels"``: one scatter-add per tree level over node-major (N, B) tables.  On a
  CPU it is the fastest way for the shallow trees classifiers use (a level moves whole contiguous
  rows), but its operator count grows with the depth D.  ``"prefix"``: depth-first prefix sums
  along the contiguous dimension of batch-major (B, ·) tables (a node's leaves, a node's subtree,
  a node's root path in the Euler tour are all one contiguous range), a fixed number of operators
  whatever the depth, accumulated in float64.  The CPU plan takes ``"levels"`` up to
  ``MAX_LEVELS`` levels and ``"prefix"`` beyond; the GPU plan always takes ``"prefix"``: a GPU pays
  per launch, and a scan along the outer dimension of an (L, B) table runs nearly sequentially
  when B is small.
- **Strategies of Wu-Palmer and Zhao.**  CPU: the measured rule of each metric.  GPU: the dense
  product while the (N, L) matrix fits (one GEMM), the structural root-path sums otherwise
  (candidates need a host read for their count).
- **hF_β.**  CPU: prefix sets certified per k (fewest operations).  GPU: every k solved exactly on
  the candidates (a fixed number of operators and at most two host reads).
- **Memory budget** for the temporaries of one chunk: ``get_memory_budget()`` on the CPU; on the
  GPU the same once ``set_memory_budget`` was called, else 4 GiB or a quarter of the device's
  memory, whichever is larger (a GPU pays per launch, so fewer, larger chunks).  The device's
  size is read once per device, never per call.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch

from ..kernels.native import budget as _native_budget
from ..kernels.segment import scatter_available
from ..kernels.tree_sums import MAX_LEVELS

__all__ = ["Plan", "plan_for", "resolve_plan", "plan_name", "get_memory_budget", "set_memory_budget",
           "set_backend", "get_backend", "MAX_LEVELS"]

_OVERRIDE: contextvars.ContextVar[str | None] = contextvars.ContextVar("hdecode_plan", default=None)

DEFAULT_BUDGET = 512 * 2**20
GPU_DEFAULT_BUDGET = 4 * 2**30
_SETTINGS = {"budget": DEFAULT_BUDGET, "budget_set": False, "backend": "torch"}
_native_budget.set_limit(DEFAULT_BUDGET)  # the native kernels' scratch follows the same budget
_DEVICE_MEMORY: dict = {}
_PLANS: dict = {}


@dataclass(frozen=True)
class Plan:
    """The choices of one call (see the module docstring for the rules).

    name: ``"cpu"`` or ``"gpu"``, the plan a metric declares its decoding for;
    tree_sums: ``"levels"`` or ``"prefix"``, the layout of the tree sums;
    budget: bytes of batch-proportional temporaries per chunk;
    backend: ``"torch"`` or ``"scatter"``, the row scatter-add of the per-level sums.
    """

    name: str
    tree_sums: str
    budget: int
    backend: str

    @property
    def gpu(self) -> bool:
        """Whether the choices are made for a GPU."""
        return self.name == "gpu"

    @property
    def batch_major(self) -> bool:
        """Whether batch tables are stored (B, ·), scans along the contiguous dimension."""
        return self.tree_sums == "prefix"


def _device_type(device) -> str:
    if isinstance(device, torch.Tensor):
        device = device.device
    if isinstance(device, str):
        device = torch.device(device)
    if not isinstance(device, torch.device):
        raise TypeError(f"Expected `device` to be a torch.device, a string such as 'cuda' or a tensor, but got "
                        f"{type(device).__name__}")
    return "gpu" if device.type == "cuda" else "cpu"


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


def plan_name(device) -> str:
    """``"gpu"`` or ``"cpu"``: the :func:`plan_for` override, else the plan of ``device``'s type."""
    override = _OVERRIDE.get()
    return override if override is not None else _device_type(device)


def resolve_plan(h, device) -> Plan:
    """The :class:`Plan` for hierarchy ``h`` and tensors on ``device`` (a torch.device)."""
    name = plan_name(device)
    budget = _SETTINGS["budget"] if (_SETTINGS["budget_set"] or name == "cpu") else _gpu_budget(device)
    levels = "levels" if h.max_depth + 1 <= MAX_LEVELS and name == "cpu" else "prefix"
    key = (name, levels, budget, _SETTINGS["backend"])
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = Plan(*key)
    return plan


def _gpu_budget(device) -> int:
    if not isinstance(device, torch.device) or device.type != "cuda":
        return GPU_DEFAULT_BUDGET
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_MEMORY:
        _DEVICE_MEMORY[index] = max(GPU_DEFAULT_BUDGET, torch.cuda.get_device_properties(index).total_memory // 4)
    return _DEVICE_MEMORY[index]


def get_memory_budget() -> int:
    """Bytes a single decoder call may use for batch-proportional temporaries (default 512 MiB on
    the CPU plan)."""
    return _SETTINGS["budget"]


def set_memory_budget(num_bytes: int | None) -> None:
    """Set the per-call temporary-memory budget used to choose chunk sizes (on every device);
    ``None`` restores the defaults."""
    if num_bytes is None:
        _SETTINGS.update(budget=DEFAULT_BUDGET, budget_set=False)
    elif isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes <= 0:
        raise ValueError(f"Expected `num_bytes` to be a positive int, but got {num_bytes!r}")
    else:
        _SETTINGS.update(budget=num_bytes, budget_set=True)
    _native_budget.set_limit(_SETTINGS["budget"])


def set_backend(name: str) -> None:
    """The row scatter-add of the per-level tree sums: ``"torch"`` (default, ``index_add_``) or
    ``"scatter"`` (``torch_scatter.scatter``; ``pip install 'hdecode_torch[scatter]'``).  Both give
    the same results."""
    if name not in ("torch", "scatter"):
        raise ValueError(f"Expected `name` to be 'torch' or 'scatter', but got {name!r}")
    if name == "scatter" and not scatter_available():
        raise ValueError("The 'scatter' backend needs torch-scatter: pip install 'hdecode_torch[scatter]'")
    _SETTINGS["backend"] = name


def get_backend() -> str:
    """The active scatter backend name (``"torch"`` or ``"scatter"``)."""
    return _SETTINGS["backend"]
