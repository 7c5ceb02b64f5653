"""Registration of the ``hdecode::`` ops and their dispatch.

Registered with ``torch.library.Library`` + ``define``/``impl``/``register_fake`` rather than
``torch.library.custom_op`` or ``triton_op``:

- ``custom_op`` wraps every device kernel in ``torch._disable_dynamo``, which imports
  ``torch._dynamo`` (seconds) on the first call of the op even when nothing is compiled;
- ``triton_op`` needs the Triton kernels (hence ``import triton``) when the op is defined, and has no
  path for machines without Triton.

Both ``torch.compile`` and ``torch.export`` see the ops as opaque nodes through their fake kernels.

Dispatch: the plain-torch kernel (:mod:`.reference`) is registered for every backend
(CompositeExplicitAutograd); CUDA has its own kernel that imports :mod:`.triton_kernels` on first
use and launches it when Triton imports, is enabled (:func:`set_triton_enabled`) and the row fits
one program; otherwise it runs the torch kernel on the GPU.  "Fits": J <= ``triton_kernels.MAX_J``
(and the J prefix sums fit the block's shared memory) for the range-sum ops; C <=
``triton_kernels.MAX_C`` candidates for ``hf_beta_best_k``; J, N <= ``triton_kernels.MAX_N`` and
an Euler tour of at most 2·MAX_N entries (and its prefix sums fit shared memory) for
``path_score_best``.  ``row_sum_min`` always fits.
"""

from __future__ import annotations

import warnings

import torch

from .reference import (best_ranked_above_torch, check_best_ranked_above_args, check_gathered_prefix_args,
                        check_hf_beta_best_k_args, check_hf_beta_best_k_values, check_index_values,
                        check_path_score_best_args, check_path_score_best_values, check_row_sum_min_args,
                        gathered_prefix_torch, hf_beta_best_k_torch, path_score_best_torch, row_sum_min_torch)

__all__ = ["SCHEMAS", "triton_available", "set_triton_enabled", "triton_enabled"]

SCHEMAS = {
    "gathered_prefix": "gathered_prefix(Tensor x, Tensor src, Tensor? weight, Tensor hi, Tensor? lo, "
                       "ScalarType out_dtype) -> Tensor",
    "best_ranked_above": "best_ranked_above(Tensor x, Tensor src, Tensor hi, Tensor? lo, Tensor rank, "
                         "float threshold, int fallback) -> Tensor",
    "row_sum_min": "row_sum_min(Tensor x) -> Tensor",
    "hf_beta_best_k": "hf_beta_best_k(Tensor q, Tensor count, Tensor depths, float r) -> (Tensor, Tensor)",
    "path_score_best": "path_score_best(Tensor x, Tensor src, Tensor hi, Tensor lo, Tensor parent, Tensor alpha, "
                       "Tensor beta, Tensor euler_src, Tensor sign, Tensor at, Tensor gamma, Tensor delta, "
                       "Tensor allowed, Tensor rank, bool higher_is_better) -> Tensor",
}

_state = {"enabled": True, "tried": False, "module": None, "error": None}


def _triton_module():
    """The :mod:`.triton_kernels` module, imported on first use; None when Triton cannot be imported."""
    if not _state["tried"]:
        _state["tried"] = True
        try:
            from . import triton_kernels
            _state["module"] = triton_kernels
        except ImportError as err:  # Triton not installed: the torch kernels serve every device
            _state["error"] = err
        except Exception as err:  # installed but broken: say so once rather than hide it
            _state["error"] = err
            warnings.warn(f"hdecode fused ops: Triton failed to import ({type(err).__name__}: {err}); "
                          "CUDA calls use the torch kernels", RuntimeWarning, stacklevel=3)
    return _state["module"]


def triton_available() -> bool:
    """Whether the Triton kernels can be imported (imports Triton on the first call)."""
    return _triton_module() is not None


def triton_enabled() -> bool:
    """Whether CUDA calls may use the Triton kernels (see :func:`set_triton_enabled`)."""
    return _state["enabled"]


def set_triton_enabled(enabled: bool) -> None:
    """Allow (default) or forbid the Triton kernels on CUDA; forbidden, CUDA runs the torch kernels."""
    if not isinstance(enabled, bool):
        raise TypeError(f"Expected `enabled` to be a bool, but got {type(enabled).__name__}")
    _state["enabled"] = enabled


def _triton_for(x: torch.Tensor, num_gathered: int):
    """The Triton module when it should serve rows of ``num_gathered`` entries of ``x``, else None."""
    tk = _triton()
    if tk is None or not tk.fits(num_gathered, x.device):
        return None
    return tk


def _triton():
    """The Triton module when Triton is enabled and importable, else None."""
    return _triton_module() if _state["enabled"] else None


# -- device kernels ---------------------------------------------------------------------------------

def _gathered_prefix_cuda(x, src, weight, hi, lo, out_dtype):
    tk = _triton_for(x, src.shape[0])
    if tk is None:
        return gathered_prefix_torch(x, src, weight, hi, lo, out_dtype)
    check_gathered_prefix_args(x, src, weight, hi, lo, out_dtype)
    check_index_values(x, src, hi, lo)
    return tk.gathered_prefix_triton(x, src, weight, hi, lo, out_dtype)


def _best_ranked_above_cuda(x, src, hi, lo, rank, threshold, fallback):
    tk = _triton_for(x, src.shape[0])
    if tk is None:
        return best_ranked_above_torch(x, src, hi, lo, rank, threshold, fallback)
    check_best_ranked_above_args(x, src, hi, lo, rank)
    check_index_values(x, src, hi, lo)
    return tk.best_ranked_above_triton(x, src, hi, lo, rank, threshold, fallback)


def _row_sum_min_cuda(x):
    tk = _triton_for(x, 0)
    if tk is None:
        return row_sum_min_torch(x)
    return tk.row_sum_min_triton(x)


def _hf_beta_best_k_cuda(q, count, depths, r):
    tk = _triton()
    if tk is None or not tk.fits_best_k(q.shape[1], q.device):
        return hf_beta_best_k_torch(q, count, depths, r)
    check_hf_beta_best_k_args(q, count, depths, r)
    check_hf_beta_best_k_values(q, count)
    return tk.hf_beta_best_k_triton(q, count, depths, r)


def _path_score_best_cuda(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank,
                          higher_is_better):
    args = (x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    tk = _triton()
    if tk is None or not tk.fits_path_score(src.shape[0], hi.shape[0], euler_src.shape[0], x.device):
        return path_score_best_torch(*args, higher_is_better)
    check_path_score_best_args(*args)
    check_path_score_best_values(x, src, hi, lo, parent, euler_src, at)
    return tk.path_score_best_triton(*args, higher_is_better)


# -- fake kernels (shapes only, for torch.compile / torch.export) ----------------------------------

def _gathered_prefix_fake(x, src, weight, hi, lo, out_dtype):
    check_gathered_prefix_args(x, src, weight, hi, lo, out_dtype)
    return x.new_empty((x.shape[0], hi.shape[0]), dtype=out_dtype)


def _best_ranked_above_fake(x, src, hi, lo, rank, threshold, fallback):
    check_best_ranked_above_args(x, src, hi, lo, rank)
    return x.new_empty((x.shape[0],), dtype=torch.int64)


def _row_sum_min_fake(x):
    check_row_sum_min_args(x)
    return x.new_empty((x.shape[0], 2), dtype=torch.float64)


def _hf_beta_best_k_fake(q, count, depths, r):
    check_hf_beta_best_k_args(q, count, depths, r)
    return q.new_empty((q.shape[0],), dtype=torch.int64), q.new_empty((q.shape[0], q.shape[1]))


def _path_score_best_fake(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank,
                          higher_is_better):
    check_path_score_best_args(x, src, hi, lo, parent, alpha, beta, euler_src, sign, at, gamma, delta, allowed, rank)
    return x.new_empty((x.shape[0],), dtype=torch.int64)


_KERNELS = {
    "gathered_prefix": (gathered_prefix_torch, _gathered_prefix_cuda, _gathered_prefix_fake),
    "best_ranked_above": (best_ranked_above_torch, _best_ranked_above_cuda, _best_ranked_above_fake),
    "row_sum_min": (row_sum_min_torch, _row_sum_min_cuda, _row_sum_min_fake),
    "hf_beta_best_k": (hf_beta_best_k_torch, _hf_beta_best_k_cuda, _hf_beta_best_k_fake),
    "path_score_best": (path_score_best_torch, _path_score_best_cuda, _path_score_best_fake),
}

_LIB = torch.library.Library("hdecode", "FRAGMENT")


def _register_fake(name: str, fn) -> None:
    qualname = f"hdecode::{name}"
    register = getattr(torch.library, "register_fake", None) or getattr(torch.library, "impl_abstract", None)
    if register is not None:
        register(qualname, fn, lib=_LIB)
    else:  # torch < 2.2: a Meta kernel is what fake tensors fall back to
        _LIB.impl(name, fn, "Meta")


for _name, (_default, _cuda, _fake) in _KERNELS.items():
    _LIB.define(SCHEMAS[_name])
    _LIB.impl(_name, _default, "CompositeExplicitAutograd")
    _LIB.impl(_name, _cuda, "CUDA")
    _register_fake(_name, _fake)


# -- autograd: range sums are linear in x ------------------------------------------------------------
# ∂out[b, k] / ∂(w_j x[b, src_j]) = [j < hi_k] − [j < lo_k]: the gradient of position j is the sum of
# the output gradients of the ranges that cover it, a suffix sum of the gradients dropped at each hi
# (and removed at each lo).  The decision and check ops have no gradient (their outputs are indices
# and flags).

def _gathered_prefix_setup(ctx, inputs, output):
    x, src, weight, hi, lo, _ = inputs
    ctx.save_for_backward(src, weight, hi, lo)
    ctx.x_shape, ctx.x_dtype = tuple(x.shape), x.dtype


def _gathered_prefix_backward(ctx, grad):
    src, weight, hi, lo = ctx.saved_tensors
    b, m = ctx.x_shape
    g = grad.to(torch.float64)
    drop = g.new_zeros((b, src.shape[0] + 1))
    drop.index_add_(1, hi, g)
    if lo is not None:
        drop.index_add_(1, lo, -g)
    covered = drop.flip(1).cumsum(1).flip(1)[:, 1:]  # Σ_{i > j} drop[i], for every position j
    if weight is not None:
        covered = covered * weight
    gx = g.new_zeros((b, m)).index_add_(1, src, covered).to(ctx.x_dtype)
    return gx, None, None, None, None, None


torch.library.register_autograd("hdecode::gathered_prefix", _gathered_prefix_backward,
                                setup_context=_gathered_prefix_setup, lib=_LIB)
