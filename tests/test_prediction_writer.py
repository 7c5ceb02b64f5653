"""DecodingPredictionWriter: Trainer.predict on 2 CPU processes (strategy="ddp", gloo) writes one shard
per rank; merged, they equal a single-process run and a direct decode of the same scores.  merge_shards
refuses incomplete or mixed runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.integrations.shards import merge_shards, shard_name, write_atomically

pytest.importorskip("pytorch_lightning")

N = 93  # not a multiple of the world size: the ranks get unequal shares (or a padded copy of a row)
SPECS = ["wu_palmer", "optimal:hf_beta[beta=0.5]", "majority"]
COLUMNS = ["wu_palmer_optimal", "hf_beta0p5_optimal", "majority"]
TESTS = os.path.dirname(os.path.abspath(__file__))

# Run as a script: strategy="ddp" starts the other rank by running this script again.
SCRIPT = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {TESTS!r})
    import torch
    import pytorch_lightning as pl
    import hdecode_torch as hd
    from test_ddp import DIM, _net, _tree

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _net(_tree().num_leaves)

        def predict_step(self, batch, batch_idx):
            x, ids = batch
            return {{"logits": self.net(x), "id": ids}}

    out, devices = sys.argv[1], int(sys.argv[2])
    x = torch.randn({N}, DIM, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, torch.arange({N}) * 3)
    writer = hd.DecodingPredictionWriter(out, _tree(), {SPECS!r}, keep_scores=True)
    trainer = pl.Trainer(accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
                         callbacks=[writer], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.predict(Module(), torch.utils.data.DataLoader(data, batch_size=16), return_predictions=False)
""")


def _predict(tmp_path, devices):
    script = tmp_path / "predict.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"shards{devices}"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(hd.__file__)),
                                                      os.environ.get("PYTHONPATH")) if p))
    proc = subprocess.run([sys.executable, str(script), str(out), str(devices)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.mark.slow
def test_two_ddp_processes_equal_one_and_a_direct_decode(tmp_path):
    h = hd.load_hierarchy("tieredimagenet-h")
    two = _predict(tmp_path, 2)
    assert sorted(os.listdir(two)) == [shard_name("predictions", 0, r, 2) for r in range(2)]  # no temporary left
    sizes = []
    for r in range(2):
        with np.load(two / shard_name("predictions", 0, r, 2)) as f:
            sizes.append(len(f["index"]))
    assert min(sizes) > 0 and sum(sizes) >= N  # each rank decoded its share
    merged = merge_shards(two)
    one = merge_shards(_predict(tmp_path, 1))
    assert set(merged) == set(one) == {"index", "id", "logits", *COLUMNS}
    np.testing.assert_array_equal(merged["index"], np.arange(N))
    np.testing.assert_array_equal(merged["id"], np.arange(N) * 3)
    np.testing.assert_allclose(merged["logits"], one["logits"], rtol=1e-5, atol=1e-5)
    for col in COLUMNS:
        np.testing.assert_array_equal(merged[col], one[col], err_msg=col)
    # The decoded columns are the library's decode of the scores each rank produced.
    z = torch.from_numpy(merged["logits"])
    for spec, col in zip(["optimal:wu_palmer", *SPECS[1:]], COLUMNS):
        np.testing.assert_array_equal(merged[col], hd.get_decoder(spec, h).decode(z, from_logits=True).numpy(),
                                      err_msg=col)
    assert len(np.unique(merged["wu_palmer_optimal"])) > 10


def _shard(path, rank, world, index, pred, prefix="predictions"):
    write_atomically(str(path / shard_name(prefix, 0, rank, world)),
                     {"index": np.asarray(index, dtype=np.int64), "majority": np.asarray(pred, dtype=np.int64)})


def test_merge_orders_rows_and_keeps_a_padded_row_once(tmp_path):
    _shard(tmp_path, 0, 2, [0, 2, 4], [10, 12, 14])
    _shard(tmp_path, 1, 2, [1, 3, 0], [11, 13, 10])  # row 0 again: a sampler's padding
    table = merge_shards(tmp_path)
    np.testing.assert_array_equal(table["index"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(table["majority"], [10, 11, 12, 13, 14])
    assert not [e for e in os.listdir(tmp_path) if e.endswith(".tmp")]


def test_merge_refuses_incomplete_mixed_or_disagreeing_shards(tmp_path):
    with pytest.raises(FileNotFoundError, match="No shard"):
        merge_shards(tmp_path)
    _shard(tmp_path, 0, 3, [0], [10])
    _shard(tmp_path, 2, 3, [2], [12])
    with pytest.raises(ValueError, match=r"ranks \[1\] are missing"):
        merge_shards(tmp_path)
    _shard(tmp_path, 0, 2, [0], [10])
    with pytest.raises(ValueError, match=r"runs on \[2, 3\] processes"):
        merge_shards(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    _shard(other, 0, 2, [0, 1], [10, 11])
    _shard(other, 1, 2, [1], [99])
    with pytest.raises(ValueError, match=r"Row\(s\) \[1\] were decoded on two ranks with different `majority`"):
        merge_shards(other)


def test_writer_refuses_a_bare_tensor_without_from_logits(tmp_path):
    h = hd.load_hierarchy("tieredimagenet-h")
    writer = hd.DecodingPredictionWriter(tmp_path, h, ["majority"])
    with pytest.raises(ValueError, match="a bare tensor and from_logits=None"):
        writer.write_on_batch_end(None, None, torch.zeros(2, h.num_leaves), [0, 1], None, 0, 0)
    writer = hd.DecodingPredictionWriter(tmp_path, h, ["majority"], from_logits=False)
    p = torch.full((2, h.num_leaves), 1.0 / h.num_leaves)
    writer.write_on_batch_end(None, None, p, [5, 6], None, 0, 0)
    (rows,) = writer._rows[0]
    np.testing.assert_array_equal(rows["index"], [5, 6])
    np.testing.assert_array_equal(rows["majority"], hd.get_decoder("majority", h).decode(p).numpy())
    with pytest.raises(ValueError, match="`prefix` to be a file-name prefix"):
        hd.DecodingPredictionWriter(tmp_path, h, ["majority"], prefix="a/b")
