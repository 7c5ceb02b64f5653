"""PyTorch ecosystem integrations: a decoding ``nn.Module``, torchmetrics metrics, a Lightning callback,
a batch-dict decoder for data engines (Ray Data, Spark) and a Lightning prediction writer.

Thin layers over :func:`~hdecode_torch.get_metric`, :func:`~hdecode_torch.get_decoder` and
:class:`~hdecode_torch.Posterior`.  ``HierarchicalMetric`` (torchmetrics) and
``HierarchicalMetricsCallback`` (PyTorch Lightning) import their framework on first
access, so ``import hdecode_torch`` does not pay for them.
"""

from .module import DecodingHead

# The Lightning names stay out of __all__: a star import must not need Lightning.
__all__ = ["DecodingHead", "HierarchicalMetric", "NodeCalibrationError"]

_LAZY = {"HierarchicalMetric": "torchmetrics", "NodeCalibrationError": "torchmetrics",
         "HierarchicalMetricsCallback": "lightning", "callback_class": "lightning",
         "DecodingPredictionWriter": "prediction_writer"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
