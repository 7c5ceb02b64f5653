"""``DecodingPredictionWriter``: ``Trainer.predict`` decodes on every device and writes one shard per rank;
:func:`~hdecode_torch.merge_shards` puts the shards back in the dataset's order.

Works with the Lightning package :mod:`hdecode_torch.integrations.lightning` works with
(``pytorch_lightning``, else ``lightning.pytorch``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..hierarchy import Hierarchy
from .batch import BatchDecoder
from .lightning import _pl
from .shards import shard_name, write_atomically

__all__ = ["DecodingPredictionWriter"]


def _numpy(value) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


class DecodingPredictionWriter(_pl.callbacks.BasePredictionWriter):
    """Decodes each predicted batch on the device that produced it and writes one ``.npz`` shard per
    rank (and dataloader) when the prediction epoch ends.

    ``predict_step`` returns the (B, L) scores, or a dict holding them under ``"logits"`` or ``"probs"``
    next to other per-row columns (tensors or arrays of first dimension B, such as ids), which are
    kept.  Each batch goes through a :class:`~hdecode_torch.BatchDecoder` built on the module's device
    when prediction starts; the predictions (and the row's dataset index, from the sampler Lightning
    gives prediction writers) stay in host memory until the epoch ends, then the shard is written to a
    temporary file in ``output_dir`` and renamed over its name (``os.replace``), so a reader never
    sees a half-written shard.  :func:`~hdecode_torch.merge_shards` reads them back as one table.

    Args:
        output_dir: the directory of the shards (created if missing).
        hierarchy, decoders, calibrator, validate: as for :class:`~hdecode_torch.BatchDecoder`.
        from_logits: what the scores hold; required when ``predict_step`` returns a bare tensor,
            otherwise as for :class:`~hdecode_torch.BatchDecoder` (the dict's key tells).
        keep_scores: also write the (B, L) scores (large: L floats a row).
        prefix: the shards' file-name prefix (:func:`shard_name`).
    """

    def __init__(self, output_dir: str | os.PathLike, hierarchy: Hierarchy, decoders: Sequence = ("optimal:accuracy",),
                 from_logits: bool | str | None = None, calibrator: nn.Module | None = None, validate: bool = True,
                 keep_scores: bool = False, prefix: str = "predictions"):
        super().__init__(write_interval="batch")
        if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]+", prefix):
            raise ValueError(f"Expected `prefix` to be a file-name prefix (letters, digits, '_', '.', '-'), "
                             f"but got {prefix!r}")
        self.output_dir = os.fspath(output_dir)
        self.prefix = prefix
        # Checks every argument now, on the CPU; the device copy is built when prediction starts.
        self._decoder = BatchDecoder(hierarchy, decoders, from_logits=from_logits, calibrator=calibrator,
                                     device="cpu", validate=validate, keep_scores=keep_scores)
        self.columns = list(self._decoder.columns)
        self._rows: dict[int, list[dict]] = {}

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage == "predict":
            state = self._decoder.__getstate__()
            state["device"] = pl_module.device
            self._decoder = BatchDecoder(**state)

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        self._rows = {}

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx,
                           dataloader_idx=0) -> None:
        if isinstance(prediction, torch.Tensor):
            kind = self._decoder.from_logits
            if kind is None:
                raise ValueError("Expected `predict_step` to return a dict with 'logits' or 'probs', or "
                                 "`from_logits` to say what its tensor holds, but got a bare tensor and "
                                 "from_logits=None")
            prediction = {"logits" if kind is True or self._decoder.calibrator is not None else "probs": prediction}
        if not isinstance(prediction, Mapping):
            raise TypeError(f"Expected `predict_step` to return a tensor or a dict, but got "
                            f"{type(prediction).__name__}")
        out = self._decoder(dict(prediction))
        rows = {k: _numpy(v) for k, v in out.items()}
        if batch_indices is not None:
            rows["index"] = np.asarray(batch_indices, dtype=np.int64)
        self._rows.setdefault(dataloader_idx, []).append(rows)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        for dataloader_idx, parts in self._rows.items():
            names = list(parts[0])
            if any(list(p) != names for p in parts):
                raise ValueError("Expected every predicted batch to have the same columns, but they differ: "
                                 f"{sorted({tuple(p) for p in parts})}")
            table = {k: np.concatenate([p[k] for p in parts]) for k in names}
            path = os.path.join(self.output_dir, shard_name(self.prefix, dataloader_idx, trainer.global_rank,
                                                            trainer.world_size))
            write_atomically(path, table)
        self._rows = {}
