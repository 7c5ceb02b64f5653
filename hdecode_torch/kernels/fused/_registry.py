"""Registration of an ``hdecode::`` op from its parts, and the CUDA dispatch every op shares.

Registered with ``torch.library.Library`` + ``define``/``impl``/``register_fake`` rather than
``torch.library.custom_op`` or ``triton_op``:

- ``custom_op`` wraps every device kernel in ``torch._disable_dynamo``, which imports
  ``torch._dynamo`` (seconds) on the first call of the op even when nothing is compiled;
- ``triton_op`` needs the Triton kernels (hence ``import triton``) when the op is defined, and has no
  path for machines without Triton.

Both ``torch.compile`` and ``torch.export`` see the ops as opaque nodes through their fake kernels.

Calls: :func:`call` runs an op.  On plain CPU tensors, outside any trace, dispatch mode or autograd
recording, it calls the op's native CPU kernel where it has one that takes the arguments (the same results
as the torch implementation, see :mod:`hdecode_torch.kernels.native`), else the torch implementation directly,
which is what the dispatcher would run: the
dispatcher's way there (schema parsing, the autograd wrapper, Python re-entry) costs as much on a CPU
as a small batch's work (benchmarks/README.md, "The fixed cost of a call").  Everywhere else (CUDA,
``torch.compile``, ``torch.export``, operator counting under a ``TorchDispatchMode``) the op is
dispatched as registered, so traces and counts still see one ``hdecode::`` op.

Dispatch: an op's torch implementation is registered for every backend (CompositeExplicitAutograd).
CUDA has its own kernel: it imports the op's Triton module on first use and, when Triton imports
and is allowed (:func:`set_triton_enabled`), checks the arguments and index values and calls the
module's ``launch``; otherwise it runs the torch implementation on the GPU.  Every launcher takes
any size, so which kernel runs never depends on the shapes.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["SCHEMAS", "OPS", "Op", "register", "call", "direct", "triton_available", "set_triton_enabled"]

#: name -> schema of every registered op (as passed to ``torch.library``, without the namespace).
SCHEMAS: dict[str, str] = {}

_LIB = torch.library.Library("hdecode", "FRAGMENT")

_state = {"enabled": True}
#: module name -> the imported Triton module, or None when it cannot be imported.
_MODULES: dict[str, object] = {}


@dataclass(frozen=True)
class Op:
    """The parts of one registered op (``cuda`` is the dispatch registered for the CUDA backend)."""

    name: str
    schema: str
    torch_impl: Callable
    cuda: Callable
    fake: Callable
    native: Callable | None = None


#: name -> :class:`Op`.
OPS: dict[str, Op] = {}


def _import(module: str):
    """``module`` imported on first use; None when it (or Triton) cannot be imported."""
    if module not in _MODULES:
        try:
            _MODULES[module] = importlib.import_module(module)
        except ImportError:  # Triton not installed: the torch implementations serve every device
            _MODULES[module] = None
        except Exception as err:  # installed but broken: say so once rather than hide it
            _MODULES[module] = None
            warnings.warn(f"hdecode fused ops: {module} failed to import ({type(err).__name__}: {err}); "
                          "CUDA calls use the torch implementations", RuntimeWarning, stacklevel=3)
    return _MODULES[module]


def triton_available() -> bool:
    """Whether the Triton kernels can be imported (imports Triton on the first call)."""
    return _import(__name__.rpartition(".")[0] + "._triton") is not None


def set_triton_enabled(enabled: bool) -> None:
    """Allow (default) or forbid the Triton kernels on CUDA; forbidden, CUDA runs the torch implementations."""
    if not isinstance(enabled, bool):
        raise TypeError(f"Expected `enabled` to be a bool, but got {type(enabled).__name__}")
    _state["enabled"] = enabled


def call(name: str, x: torch.Tensor, *args):
    """``torch.ops.hdecode.<name>(x, *args)``, or its torch implementation called directly when the
    dispatcher would run just that (see the module docstring): ``x`` a plain CPU tensor that needs no
    gradient, nothing tracing and no dispatch mode active.  The other tensor arguments are the tree's
    index tables, on ``x``'s device (the implementation checks them)."""
    if direct(x):
        op = OPS[name]
        if op.native is not None:
            out = op.native(x, *args)
            if out is not None:
                return out
        return op.torch_impl(x, *args)
    return getattr(torch.ops.hdecode, name)(x, *args)


def direct(x: torch.Tensor) -> bool:
    """Whether :func:`call` runs an op on ``x`` by its torch implementation directly: a plain CPU tensor
    that needs no gradient, nothing tracing and no dispatch mode active (so no operator count either)."""
    # is_cpu and torch._C._is_tracing: a fifth of a microsecond each, where x.device.type and
    # torch.jit.is_tracing() take 1 and 0.3 (a call at one row costs tens)
    return (type(x) is torch.Tensor and x.is_cpu and not (x.requires_grad and torch.is_grad_enabled())
            and not torch.compiler.is_compiling() and not torch._C._is_tracing()
            and _get_current_dispatch_mode() is None and not torch._C._is_torch_function_mode_enabled()
            and not _functorch_wrapped(x))


def _functorch_wrapped(x: torch.Tensor) -> bool:
    """Whether ``x`` is a vmap/grad transform's wrapper (its ops must go through the dispatcher)."""
    return torch._C._functorch.is_functorch_wrapped_tensor(x)


def register(name: str, schema: str, torch_impl: Callable, fake: Callable, check: Callable, triton_module: str | None,
             autograd: tuple[Callable, Callable] | None = None, native: Callable | None = None) -> Op:
    """Define ``hdecode::<name>`` and register its kernels.

    Args:
        name: the op's name; ``schema`` starts with it (``"name(Tensor x, ...) -> Tensor"``).
        torch_impl: the implementation for every backend; it checks its own arguments.
        fake: shapes only (for ``torch.compile`` / ``torch.export``); checks shapes, reads no value.
        check: the argument and index-value checks run before a Triton launch.
        triton_module: the importable name of the module holding ``launch`` (same arguments as the
            op); imported on the first CUDA call.  None: the torch implementation serves every device.
        autograd: ``(backward, setup_context)`` for ``torch.library.register_autograd``, if any.
        native: the op's native CPU kernel, if any: same arguments, the torch implementation's results, or
            None where it does not apply (then :func:`call` runs the torch implementation).  Only
            :func:`call`'s direct path runs it: the dispatcher (traces, operator counts) sees the torch one.
    """
    def cuda(*args):
        module = _import(triton_module) if _state["enabled"] and triton_module is not None else None
        if module is None:
            return torch_impl(*args)
        # The kernels read index vectors with unit stride (2-D inputs pass their strides): a strided view
        # such as one row of a transposed table would be read as the wrong entries.
        args = tuple(a.contiguous() if isinstance(a, torch.Tensor) and a.dim() == 1 else a for a in args)
        check(*args)
        return module.launch(*args)

    _LIB.define(schema)
    _LIB.impl(name, torch_impl, "CompositeExplicitAutograd")
    _LIB.impl(name, cuda, "CUDA")
    torch.library.register_fake(f"hdecode::{name}", fake, lib=_LIB)
    if autograd is not None:
        backward, setup_context = autograd
        torch.library.register_autograd(f"hdecode::{name}", backward, setup_context=setup_context, lib=_LIB)
    SCHEMAS[name] = schema
    OPS[name] = Op(name, schema, torch_impl, cuda, fake, native)
    return OPS[name]
