"""HierarchicalMetricsCallback in real Trainer runs: checkpoint monitors and file-name templates, test and
predict stages, the step contract checked at the sanity check, progress bar, resume with history."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import hdecode_torch as hd

pl = pytest.importorskip("pytorch_lightning")
from hdecode_torch.integrations import HierarchicalMetricsCallback  # noqa: E402
from hdecode_torch.integrations.lightning import default_name  # noqa: E402

H = hd.load_hierarchy("tieredimagenet-h")
L = H.num_leaves
METRICS = [("hf_beta", {"beta": 0.5}), ("tree_distance", {})]
DECODERS = ["optimal", ("darts", {"lam": 0.5})]


def _data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.utils.data.TensorDataset(torch.randn(n, 8, generator=g), torch.randint(0, L, (n,), generator=g))


class _Module(pl.LightningModule):
    def __init__(self, loss_only=False):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(8, L)
        with torch.no_grad():
            self.net.weight.mul_(8)  # varied, peaked outputs
        self.loss_only = loss_only
        self.train_steps = 0

    def training_step(self, batch, batch_idx):
        self.train_steps += 1
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def _eval_step(self, batch):
        x, y = batch
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, y)
        return loss if self.loss_only else {"loss": loss, "logits": logits, "target": y}

    def validation_step(self, batch, batch_idx):
        return self._eval_step(batch)

    def test_step(self, batch, batch_idx):
        return self._eval_step(batch)

    def predict_step(self, batch, batch_idx):
        return self._eval_step(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _trainer(tmp_path, callbacks, max_epochs=2, checkpointing=False, **kw):
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, callbacks=callbacks,
                      default_root_dir=tmp_path, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=checkpointing, num_sanity_val_steps=1,
                      **kw)


def _loader(ds):
    return torch.utils.data.DataLoader(ds, batch_size=16)


def _direct(module, ds, prefix):
    x, y = ds.tensors
    with torch.no_grad():
        probs = torch.softmax(module.net(x), 1)
    out = {}
    for name, params in METRICS:
        m = hd.get_metric(name, H, **params)
        out[default_name(prefix, m.key, "optimal")] = float(m(m.decode(probs), y).mean())
        darts = hd.get_decoder("darts", H, lam=0.5)
        out[default_name(prefix, m.key, darts.key)] = float(m(darts.decode(probs), y).mean())
    return out


def test_fit_with_model_checkpoint_monitor_and_filename_template(tmp_path):
    cb = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=DECODERS)
    key = "val_hf_beta0p5_optimal"
    assert cb.names["validate"][("hf_beta[beta=0.5]", "optimal")] == key
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor=key, mode="max", save_top_k=1,
                                        filename="{epoch}-{" + key + ":.4f}", auto_insert_metric_name=False)
    module = _Module()
    trainer = _trainer(tmp_path, [cb, ckpt], checkpointing=True)
    trainer.fit(module, _loader(_data(48, 1)), _loader(_data(32, 2)))
    assert len(cb.history) == 2
    best = max(e[("hf_beta[beta=0.5]", "optimal")] for e in cb.history)
    assert float(ckpt.best_model_score) == pytest.approx(best, rel=1e-6)
    match = re.fullmatch(r"(\d)-(\d\.\d{4})\.ckpt", ckpt.best_model_path.split("/")[-1])
    assert match and float(match.group(2)) == pytest.approx(best, abs=5e-5)
    want = _direct(module, _data(32, 2), "val")
    for name, value in want.items():
        assert float(trainer.callback_metrics[name]) == pytest.approx(value, rel=1e-6), name
    assert all(re.fullmatch(r"[A-Za-z0-9_\-]+", n) for n in cb.names["validate"].values())


def test_trainer_test_and_predict_stages(tmp_path):
    cb = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=DECODERS, predict=True)
    module = _Module()
    trainer = _trainer(tmp_path, [cb])
    test = _data(40, 3)
    (logged,) = trainer.test(module, _loader(test), verbose=False)
    want = _direct(module, test, "test")
    assert set(logged) == set(want) == set(cb.names["test"].values())
    for name, value in want.items():
        assert logged[name] == pytest.approx(value, rel=1e-6), name
    assert cb.history == [] and cb.results == {}  # the test stage does not touch validation's record
    assert cb.test_results[("tree_distance", "optimal")] == pytest.approx(want["test_tree_distance_optimal"])
    trainer.predict(module, _loader(test))
    for pair, name in cb.names["test"].items():
        assert cb.predict_results[pair] == pytest.approx(want[name], rel=1e-12)
    skip_test = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=DECODERS, test_prefix=None)
    (logged,) = _trainer(tmp_path, [skip_test]).test(module, _loader(test), verbose=False)
    assert not any(k.startswith("test_") for k in logged) and skip_test.test_results == {}


def test_validation_step_returning_only_the_loss_fails_at_the_sanity_check(tmp_path):
    cb = HierarchicalMetricsCallback(H, metrics=["accuracy"])
    module = _Module(loss_only=True)
    with pytest.raises(ValueError, match="validation_step.*'logits'.*got a Tensor"):
        _trainer(tmp_path, [cb]).fit(module, _loader(_data(32, 1)), _loader(_data(16, 2)))
    assert module.train_steps == 0  # before any training

    class WrongWidth(_Module):
        def validation_step(self, batch, batch_idx):
            return {"logits": self.net(batch[0])[:, :10], "target": batch[1]}

    cb = HierarchicalMetricsCallback(H, metrics=["accuracy"])
    with pytest.raises(ValueError, match=f"shape \\(B, {L}\\)"):
        _trainer(tmp_path, [cb]).fit(WrongWidth(), _loader(_data(32, 1)), _loader(_data(16, 2)))


def test_resume_from_checkpoint_keeps_history(tmp_path):
    train, val = _data(32, 1), _data(16, 2)
    first = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=["optimal"])
    ckpt = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _trainer(tmp_path, [first, ckpt], max_epochs=1, checkpointing=True).fit(_Module(), _loader(train), _loader(val))
    assert len(first.history) == 1
    saved = torch.load(ckpt.last_model_path, weights_only=True)  # plain types: loadable without pickled objects
    assert first.state_key in saved["callbacks"]
    resumed = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=["optimal"])
    ckpt2 = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    _trainer(tmp_path, [resumed, ckpt2], max_epochs=2, checkpointing=True).fit(
        _Module(), _loader(train), _loader(val), ckpt_path=ckpt.last_model_path)
    assert len(resumed.history) == 2
    assert resumed.history[0] == first.history[0]
    assert resumed.results == resumed.history[1]
    other = HierarchicalMetricsCallback(H, metrics=["accuracy"], decoders=["optimal"])
    assert other.state_key != first.state_key  # two callbacks of this class keep separate states


def test_prog_bar_and_name_fn(tmp_path):
    cb = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=DECODERS,
                                     prog_bar=["val_tree_distance_optimal", ("hf_beta[beta=0.5]", "darts[lam=0.5]")])
    old_style = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=["optimal"], prefix="ev",
                                            name_fn=lambda p, m, d: f"{p}/{m}/{d}")
    trainer = _trainer(tmp_path, [cb, old_style], max_epochs=1)
    trainer.validate(_Module(), _loader(_data(16, 2)), verbose=False)
    assert set(trainer.progress_bar_metrics) == {"val_tree_distance_optimal", "val_hf_beta0p5_darts0p5"}
    assert "ev/hf_beta[beta=0.5]/optimal" in trainer.callback_metrics
    assert float(trainer.callback_metrics["ev/tree_distance/optimal"]) == float(
        trainer.callback_metrics["val_tree_distance_optimal"])
    with pytest.raises(ValueError, match="prog_bar"):
        HierarchicalMetricsCallback(H, metrics=METRICS, prog_bar=["val_nope"])
    with pytest.raises(TypeError, match="prog_bar"):
        HierarchicalMetricsCallback(H, metrics=METRICS, prog_bar="val_tree_distance_optimal")
    with pytest.raises(ValueError, match="name_fn"):
        HierarchicalMetricsCallback(H, metrics=METRICS, decoders=DECODERS, name_fn=lambda p, m, d: p)
    with pytest.raises(TypeError, match="name_fn"):
        HierarchicalMetricsCallback(H, metrics=METRICS, name_fn=lambda p, m, d: None)


def test_default_names():
    assert default_name("val", "hf_beta[beta=0.5]", "optimal") == "val_hf_beta0p5_optimal"
    assert default_name("test", "tree_distance_c[c=2]", "confidence_threshold[tau=0.75]") == \
        "test_tree_distance_c2_confidence_threshold0p75"
    assert default_name("", "wu_palmer", "top_down") == "wu_palmer_top_down"
