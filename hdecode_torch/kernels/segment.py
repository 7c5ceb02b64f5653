"""Row scatter-add, the one reduction the tree kernels need, with an optional torch-scatter backend.

The pure-torch path (``index_add_``) is the default and the one the tests pin down;
``backend="scatter"`` routes through ``torch_scatter.scatter`` when it is installed
(``pip install 'hdecode_torch[scatter]'``); tests check both agree.
"""

from __future__ import annotations

import torch

__all__ = ["index_add_rows", "scatter_available"]

try:  # optional dependency
    import torch_scatter as _ts  # type: ignore
except Exception:  # pragma: no cover - depends on the environment
    _ts = None


def scatter_available() -> bool:
    """Whether torch-scatter is importable."""
    return _ts is not None


def index_add_rows(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor, backend: str = "torch") -> torch.Tensor:
    """In place ``out[index[j]] += src[j]`` (rows); duplicate indices accumulate.

    out: (N, *); index: (K,) int64; src: (K, *) same dtype as ``out``; backend: ``"torch"``
    (``index_add_``) or ``"scatter"`` (torch-scatter, which must be installed).
    """
    if backend == "scatter" and out.is_floating_point():
        _ts.scatter(src, index, dim=0, out=out, reduce="sum")
        return out
    return out.index_add_(0, index, src)
