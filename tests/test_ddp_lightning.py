"""The Lightning callback under DDP (ddp_spawn, 2 CPU processes, gloo) logs what one process logs.

Same data and untrained model in both runs; the set size divides by the world size, so
DistributedSampler neither pads nor repeats samples.
"""

from __future__ import annotations

import csv
import os

import pytest
import torch

import hdecode_torch as hd
from test_ddp import WORLD, _data, _net, _tree, assert_same_mean

pl = pytest.importorskip("pytorch_lightning")


class _Module(pl.LightningModule):
    def __init__(self, budget=None):
        super().__init__()
        self.net = _net(_tree().num_leaves)
        self.budget = budget

    def setup(self, stage):  # in every process: the callback buffers rows up to the memory budget
        hd.set_memory_budget(self.budget)

    def teardown(self, stage):
        hd.set_memory_budget(None)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"logits": self.net(x), "target": y}


def _validate(tmp_path, devices, strategy, budget=None):
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    cb = HierarchicalMetricsCallback(_tree(), metrics=[("accuracy", {}), ("tree_distance", {}), ("wu_palmer", {}),
                                                       ("hf_beta", {"beta": 0.5})],
                                     decoders=["optimal", "majority", ("darts", {"lam": 0.5})])
    x, y = _data()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    # A fixed version: ddp_spawn creates the logger in a child.
    logger = pl.loggers.CSVLogger(tmp_path, name=f"{strategy}{budget}", version=0)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=logger, callbacks=[cb],
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.validate(_Module(budget), loader, verbose=False)
    values = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    return values, logger


def _csv_values(logger):
    rows = list(csv.DictReader(open(os.path.join(logger.log_dir, "metrics.csv"))))
    return {k: float(v) for r in rows for k, v in r.items() if k.startswith("val_") and v}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_callback_ddp_spawn_equals_single_process(tmp_path):
    one, one_log = _validate(tmp_path, 1, "auto")
    two, two_log = _validate(tmp_path, WORLD, "ddp_spawn")
    # A budget of ~20 rows: each process decodes its 48 rows in three blocks.
    h = _tree()
    blocks, _ = _validate(tmp_path, WORLD, "ddp_spawn", budget=20 * (h.num_leaves * 8 + h.num_nodes * 4 + 10))
    assert len(one) == 12 and set(one) == set(two) == set(blocks)
    for k in one:
        assert_same_mean(k, two[k], one[k])
        assert_same_mean(k, blocks[k], one[k])
    csv_one, csv_two = _csv_values(one_log), _csv_values(two_log)
    assert set(csv_one) == set(one) == set(csv_two)
    for k in one:
        assert csv_one[k] == float(one[k]) and csv_two[k] == float(two[k])
    # And the single-process values are the direct computation.
    x, y = _data()
    with torch.no_grad():
        probs = torch.softmax(_net(h.num_leaves)(x), 1)
    wp = hd.get_metric("wu_palmer", h)
    # The callback logs the float64 mean cast to the scores' dtype (float32).
    want = float(wp(wp.decode(probs), y, dtype=torch.float64).mean())
    assert float(one["val_wu_palmer_optimal"]) == pytest.approx(want, rel=torch.finfo(torch.float32).eps)
    td = hd.get_metric("tree_distance", h)
    darts = hd.get_decoder("darts", h, lam=0.5)
    want = td(darts.decode(probs), y, dtype=torch.float64).mean().float()  # integer sums: exact, then one rounding
    assert float(one["val_tree_distance_darts0p5"]) == float(want)
