"""PyTorch ecosystem integrations: a decoding ``nn.Module``, torchmetrics metrics, a Lightning callback.

Thin layers over :func:`~hdecode_torch.get_metric`, :func:`~hdecode_torch.get_decoder` and
:class:`~hdecode_torch.Posterior`.  ``HierarchicalMetric`` (torchmetrics) and
``HierarchicalMetricsCallback`` (PyTorch Lightning) import their framework on first
access, so ``import hdecode_torch`` does not pay for them.
"""

from .module import DecodingHead, clear_posterior_cache, shared_posterior

# The Lightning names stay out of __all__: a star import must not need Lightning.
__all__ = ["DecodingHead", "HierarchicalMetric", "NodeCalibrationError", "shared_posterior",
           "clear_posterior_cache"]

_LAZY = {"HierarchicalMetric": "torchmetrics", "NodeCalibrationError": "torchmetrics",
         "HierarchicalMetricsCallback": "lightning", "callback_class": "lightning"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
