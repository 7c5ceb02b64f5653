"""Where user input becomes tensors: conversion of tensors, arrays and lists, the dtype a computation runs
in, and warnings attributed to the user's code."""

from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["as_tensor", "compute_dtype", "warn_user"]


def as_tensor(x, name: str) -> torch.Tensor:
    """Accept dense tensors, numpy arrays and nested lists; anything else is a TypeError."""
    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise TypeError(f"Expected `{name}` to be a dense tensor, but got layout {x.layout}: pass `{name}.to_dense()`")
        if x.device.type == "meta":
            raise ValueError(f"Expected `{name}` to hold data, but it is a meta tensor (shape {tuple(x.shape)})")
        return x
    if isinstance(x, (np.ndarray, list, tuple)):
        try:
            arr = np.asarray(x)
            if arr.dtype == object:
                raise TypeError(f"mixed or non-numeric entries (numpy dtype {arr.dtype})")
            return torch.as_tensor(arr)
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise TypeError(f"Expected `{name}` to be a tensor or array of numbers: {exc}") from None
    raise TypeError(f"Expected `{name}` to be a torch.Tensor, but got {type(x).__name__}")


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (float32, float16, bfloat16) computes in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def warn_user(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first caller outside this package, however deep the call."""
    import os
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
