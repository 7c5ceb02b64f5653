"""The CPU plan's structural node decoders as one native pass a row (``native/node_scores.c``,
``hd_path_argbest_*``): per-level node sums, a value per node, root-path sums, a score and the best candidate in
preference order, the torch path's arithmetic operation by operation (so its tables' bits and its decision), no
(N, B) table.  Used by Zhao's similarity, Wu-Palmer's (leaves at one depth) and the LCA height on plain float
CPU batches; where the kernels do not apply the caller runs the torch path."""

from __future__ import annotations

import ctypes

import torch

from . import native
from .native.budget import fits, path_argbest_scratch
from .tree_sums import accumulation_dtype

__all__ = ["path_argbest", "MODES", "SCALES"]

#: how v(n) is made from the node sums p: ``"scaled"`` p(n)·coef(n); ``"split"`` (p(up(n)) − p(n))·coef(n)
MODES = {"scaled": 0, "split": 1}
#: how the score is made from the root-path sums S: S / scale, S · scale, or S itself
SCALES = {"divide": 0, "multiply": 1, None: 2}

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_ARGTYPES = [_I64, _I64, _I64, _PTR, _I64, _I64, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I64,
             _PTR, _I64, _PTR, _I64, _PTR, _I64]
#: (values' dtype, accumulation dtype) -> the kernel's suffix
_VARIANTS = {(torch.float32, torch.float32): "f32", (torch.float64, torch.float64): "f64",
             (torch.float32, torch.float64): "f32w"}
#: the kernels' suffix -> bytes of their accumulation dtype
_ACC_SIZE = {"f32": 4, "f64": 8, "f32w": 8}


def _down(h):
    """(N − 1,) int64 the nodes below the root, parents first (by depth, then id: the per-level sums' order), and
    (N,) int64 each node's parent, the root its own (CPU, cached)."""
    def build():
        depth = h.depth.cpu()
        order = torch.sort(depth, stable=True).indices
        return order[depth.index_select(0, order) > 0].contiguous(), h.parent_or_root.cpu().contiguous()
    return h.cached("native_path_down", build)


def path_argbest(h, probs: torch.Tensor, mode: str, coef: torch.Tensor, zero_root: bool, scale_mode: str | None,
                 scale: torch.Tensor | None, candidates: torch.Tensor, higher_is_better: bool) -> torch.Tensor | None:
    """(B,) int64 the best candidate per row, or None where the kernel does not apply (then the caller runs the
    torch path).

    probs: (B, L) float32/float64 CPU leaf probabilities, any strides.  coef, scale: (N,) in probs' dtype (CPU,
    contiguous: the caller's cached tree tables).  candidates: (K,) int64 CPU, contiguous, in preference order.
    In probs' dtype, p the per-level node sums (accumulated as :func:`~.tree_sums.accumulation_dtype` says, rounded
    once), ``v = p·coef`` (``mode="scaled"``) or ``(p(parent) − p)·coef`` (``"split"``), S the per-level root-path
    sums of v (the root's term 0 with ``zero_root``), the score ``S / scale``, ``S · scale`` or S; the first
    candidate of largest (``higher_is_better``) or least score, a NaN first wherever one occurs (torch's argmax /
    argmin).  O(N) a row, 8 rows at a time; buffers of 8·N accumulation values and 16·N values
    (:func:`~hdecode_torch.kernels.native.budget.path_argbest_scratch`); None where that is over the memory budget.
    """
    variant = _VARIANTS.get((probs.dtype, accumulation_dtype(h, probs.dtype)))
    if variant is None or probs.dim() != 2 or not native.applies(probs):
        return None
    if not fits(path_argbest_scratch(h.num_nodes, probs.element_size(), _ACC_SIZE[variant])):
        return None  # over the memory budget: the torch path
    rows = probs.shape[0]
    pred = torch.empty(rows, dtype=torch.int64)
    if rows == 0:
        return pred
    parent, start, child = native.tree_children(h)
    down, up = _down(h)
    status = native.function(f"hd_path_argbest_{variant}", ctypes.c_int, _ARGTYPES)(
        rows, h.num_leaves, h.num_nodes, probs.data_ptr(), probs.stride(1), probs.stride(0), parent.numel(),
        parent.data_ptr(), start.data_ptr(), child.data_ptr(), MODES[mode], up.data_ptr(), coef.data_ptr(), h.root,
        1 if zero_root else 0, down.numel(), down.data_ptr(), SCALES[scale_mode],
        None if scale is None else scale.data_ptr(), candidates.numel(), candidates.data_ptr(),
        1 if higher_is_better else 0, pred.data_ptr(), 1)
    if status:
        raise MemoryError(f"the native node decoder could not allocate {24 * h.num_nodes} values")
    return pred
