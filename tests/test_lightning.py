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


# --------------------------------------------------------------------------- what the callback costs
ALL_METRICS = ["accuracy", "tree_distance", "wu_palmer", "zhao", ("hf_beta", {"beta": 0.5}), "hamming", "jaccard"]
ALL_DECODERS = ["optimal", "argmax_leaf", "top_down", "majority", "plurality", ("darts", {"lam": 0.0}), "hie"]


class _Fixed(pl.LightningModule):
    """Returns fixed scores per batch (``scores[batch_idx]``), so a test can corrupt one batch."""

    def __init__(self, scores, targets):
        super().__init__()
        self.scores, self.targets = scores, targets
        self.steps = 0

    def validation_step(self, batch, batch_idx):
        self.steps += 1
        return {"logits": self.scores[batch_idx], "target": self.targets[batch_idx]}


def _batches(n_batches, size, seed, scale=4.0):
    g = torch.Generator().manual_seed(seed)
    scores = [torch.randn(size, L, generator=g) * scale for _ in range(n_batches)]
    targets = [torch.randint(0, L, (size,), generator=g) for _ in range(n_batches)]
    return scores, targets


def _validate(cb, module, n_batches, **kw):
    loader = torch.utils.data.DataLoader(range(n_batches), batch_size=1)  # batch_idx picks the fixed batch
    trainer = pl.Trainer(accelerator="cpu", devices=1, callbacks=[cb], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, **kw)
    trainer.validate(module, loader, verbose=False)
    return {k: v for k, v in trainer.callback_metrics.items()}


def _per_batch_means(scores, targets, metrics, decoders, from_logits=True):
    """Each pair decoded and scored batch by batch through the public API, one pair at a time, reduced as
    HierarchicalMetric reduces: the per-sample values concatenated, summed in sorted order."""
    out = {}
    for spec in metrics:
        name, params = (spec, {}) if isinstance(spec, str) else spec
        m = hd.get_metric(name, H, **params)
        for dec in decoders:
            if dec == "optimal":
                decoder, label = hd.get_decoder("optimal", H, metric=m), "optimal"
            else:
                dname, dp = (dec, {}) if isinstance(dec, str) else dec
                decoder = hd.get_decoder(dname, H, **dp)
                label = decoder.key
            values = []
            for s, y in zip(scores, targets):
                probs = hd.Posterior(H, s, from_logits=from_logits).probs
                values.append(m(decoder.decode(probs), y, dtype=torch.float64))
            v = torch.cat(values)
            # in the scores' compute dtype, summed in float64
            out[default_name("val", m.key, label)] = (torch.sort(v).values.sum() / v.numel()).to(probs.dtype)
    return out


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
def test_callback_logs_bitwise_what_per_batch_decoding_gives(plan):
    """Decoding every batch of the epoch as one block, each decoder once, changes no logged bit."""
    scores, targets = _batches(5, 24, seed=5)
    with hd.plan_for(plan):
        want = _per_batch_means(scores, targets, ALL_METRICS, ALL_DECODERS)
        cb = HierarchicalMetricsCallback(H, metrics=ALL_METRICS, decoders=ALL_DECODERS)
        logged = _validate(cb, _Fixed(scores, targets), 5)
        try:  # a budget of ~50 rows: three blocks, decoders chunking inside them
            hd.set_memory_budget(50 * (L * 8 + H.num_nodes * 4 + 10))
            small = _validate(HierarchicalMetricsCallback(H, metrics=ALL_METRICS, decoders=ALL_DECODERS),
                              _Fixed(scores, targets), 5)
        finally:
            hd.set_memory_budget(None)
    assert len(want) == 49 and set(want) <= set(logged)
    for name, value in want.items():
        assert logged[name].dtype == torch.float32 and torch.equal(logged[name], value), name
        assert torch.equal(small[name], value), name


class _Refilled(pl.LightningModule):
    """Returns the same two buffers at every step, refilled with ``scores[batch_idx]`` and ``targets[batch_idx]``
    by ``refill`` (as a loader or a model reusing its output buffers does)."""

    def __init__(self, scores, targets, refill):
        super().__init__()
        self.scores, self.targets, self.refill = scores, targets, refill
        self.buf, self.y = torch.empty_like(scores[0]), torch.empty_like(targets[0])

    def validation_step(self, batch, batch_idx):
        self.refill(self.buf, self.scores[batch_idx])
        self.refill(self.y, self.targets[batch_idx])
        return {"logits": self.buf, "target": self.y}


@pytest.mark.parametrize("pattern", ["copy", "no_grad", "inference_mode", "numpy_view", "data"])
def test_callback_sees_every_refill_of_reused_output_buffers(pattern):
    from test_torchmetrics import REFILLS

    metrics, decoders = ["tree_distance", "wu_palmer"], ["majority", "optimal"]
    scores, targets = _batches(3, 8, seed=9)
    want = _per_batch_means(scores, targets, metrics, decoders)
    # A standalone metric updated with the same buffers inside the steps must not share the callback's batches.
    alone = hd.HierarchicalMetric(H, "zhao", decoder="majority", from_logits=True)

    class _AlsoAlone(_Refilled):
        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            alone.update(self.buf, self.y)
            return out

    logged = _validate(HierarchicalMetricsCallback(H, metrics=metrics, decoders=decoders),
                       _AlsoAlone(scores, targets, REFILLS[pattern]), 3)
    for name, value in want.items():
        assert torch.equal(logged[name], value), name
    zhao = hd.get_metric("zhao", H)
    v = torch.cat([zhao(hd.get_decoder("majority", H).decode(torch.softmax(s, 1)), y, dtype=torch.float64)
                   for s, y in zip(scores, targets)])
    assert torch.equal(alone.compute(), (torch.sort(v).values.sum() / v.numel()).float())


def test_callback_batch_hooks_only_copy_and_each_decoder_runs_once_per_epoch(monkeypatch):
    from benchmarks.plan_cost import Cost
    from hdecode_torch.core.component import HierarchyComponent

    h = hd.Hierarchy.from_parents(H.parent.tolist())  # its own tree tables (see below)
    metrics, decoders = ["accuracy", "tree_distance", "wu_palmer", "zhao"], ["optimal", "majority", "top_down"]
    scores, targets = _batches(6, 32, seed=6)
    with hd.plan_for("cuda"):
        # Tree tables built outside inference mode, as a GPU run builds them: the CPU reference of the fused
        # operators re-reads index tables made under inference mode, which a GPU checks asynchronously.
        probs = torch.softmax(scores[0], 1)
        for spec in metrics:
            m = hd.get_metric(spec, h)
            for d in decoders:
                m((m if d == "optimal" else hd.get_decoder(d, h)).decode(probs), targets[0])
        cb = HierarchicalMetricsCallback(h, metrics=metrics, decoders=decoders)
        costs = {"batch": [], "end": []}

        def counted(hook, key):
            def run(*args, **kwargs):
                with Cost() as c:
                    hook(*args, **kwargs)
                costs[key].append((c.ops, c.reads))
            return run

        monkeypatch.setattr(cb, "on_validation_batch_end", counted(cb.on_validation_batch_end, "batch"))
        monkeypatch.setattr(cb, "on_validation_epoch_end", counted(cb.on_validation_epoch_end, "end"))
        decodes = []
        original = HierarchyComponent.decode
        monkeypatch.setattr(HierarchyComponent, "decode", lambda self, *a, **k: decodes.append(self) or original(
            self, *a, **k))
        _validate(cb, _Fixed(scores, targets), 6)
        decoded = len(decodes)
        # What decoding and scoring each pair once on all rows costs, pair by pair (no sharing).
        rows, y = torch.cat(scores), torch.cat(targets)
        unshared = 0
        for spec in metrics:
            m = hd.get_metric(spec, h)
            for d in decoders:
                with Cost() as c:
                    post = hd.Posterior(h, rows, from_logits=True, validate=False)
                    m((m if d == "optimal" else hd.get_decoder(d, h)).decode(post), y, validate=False)
                unshared += c.ops
    assert costs["batch"] == [(2, 0)] * 6  # two copies into the buffer, no host read
    (end_ops, end_reads), = costs["end"]
    assert end_reads == 2  # the block's check and the values; these decoders read nothing on a GPU
    assert decoded == len(metrics) + len(decoders) - 1  # each optimal decoder and each heuristic once
    # The epoch's end (check, decoding, scoring, reducing and logging 12 values) costs less than the
    # unavoidable part done pair by pair.
    assert end_ops < unshared, (end_ops, unshared)


def test_callback_names_the_bad_batch_at_the_epoch_end():
    scores, targets = _batches(4, 8, seed=7)
    bad = [s.clone() for s in scores]
    bad[2][3, 5] = float("nan")
    module = _Fixed(bad, targets)
    with pytest.raises(ValueError, match=r"validation batch 2: Expected `scores` \(logits\) to be free of NaN, "
                                         r"but row 3 contains NaN"):
        _validate(HierarchicalMetricsCallback(H, metrics=["accuracy"]), module, 4)
    assert module.steps == 4  # raised once the epoch's values were due, not at the batch
    wrong = [t.clone() for t in targets]
    wrong[1][6] = L + 2
    with pytest.raises(ValueError, match=rf"validation batch 1: Expected `target` in 0\.\.{L - 1} \(leaf ids\), "
                                         rf"but got {L + 2} at position 6"):
        _validate(HierarchicalMetricsCallback(H, metrics=["accuracy"]), _Fixed(scores, wrong), 4)
    probs = [torch.softmax(s, 1) for s in scores]
    probs[3] = probs[3] * 1.5
    with pytest.raises(ValueError, match=r"validation batch 3: Expected each row of `scores` to sum to 1"):
        _validate(HierarchicalMetricsCallback(H, metrics=["accuracy"], from_logits=False), _Fixed(probs, targets), 4)
    # validate=False skips the check (and its host read): out-of-range values are then undefined, NaN rows decode
    quiet = HierarchicalMetricsCallback(H, metrics=["accuracy"], decoders=["argmax_leaf"], validate=False)
    assert "val_accuracy_argmax_leaf" in _validate(quiet, _Fixed(bad, targets), 4)


def test_callback_auto_decides_per_batch_and_warns_about_probabilities_as_logits():
    scores, targets = _batches(4, 12, seed=8)
    mixed = [torch.softmax(s, 1) if i % 2 else s for i, s in enumerate(scores)]  # probabilities, logits, ...
    pairs = [("wu_palmer", {}), ("hf_beta", {"beta": 2.0})]
    want = _per_batch_means(mixed, targets, pairs, ["optimal", "plurality"], from_logits="auto")
    cb = HierarchicalMetricsCallback(H, metrics=pairs, decoders=["optimal", "plurality"], from_logits="auto")
    logged = _validate(cb, _Fixed(mixed, targets), 4)
    for name, value in want.items():
        assert torch.equal(logged[name], value), name
    as_logits = HierarchicalMetricsCallback(H, metrics=["accuracy"])
    with pytest.warns(UserWarning, match="`scores` looks like probabilities"):
        _validate(as_logits, _Fixed([torch.softmax(s, 1) for s in scores], targets), 4)


def test_printed_table_marks_which_way_is_better():
    cb = HierarchicalMetricsCallback(H, metrics=METRICS, decoders=DECODERS)
    table = cb.format_table({("hf_beta[beta=0.5]", "optimal"): 0.8, ("hf_beta[beta=0.5]", "darts[lam=0.5]"): 0.7,
                             ("tree_distance", "optimal"): 2.0, ("tree_distance", "darts[lam=0.5]"): 2.5})
    lines = table.splitlines()
    assert lines[1].startswith("hf_beta[beta=0.5] ↑") and "0.8000*" in lines[1]
    assert lines[2].startswith("tree_distance ↓") and "2.0000*" in lines[2]
    assert lines[-1].startswith("↑ higher is better, ↓ lower is better")


def test_callback_scores_a_hierarchical_scalers_output_through_extract():
    """The callback takes no calibrator of its own: ``extract`` applies one (a HierarchicalScaler, as a
    TemperatureScaler would be), and the logged values are those of the calibrated log-probabilities."""
    from hdecode_torch.synthetic import synthetic_miscalibrated

    z, y, _ = synthetic_miscalibrated(H, 96, "sharp_leaves", 2.0, seed=13)
    scaler = hd.HierarchicalScaler(H).fit(z, y)
    scores, targets = list(z.split(32)), list(y.split(32))

    def calibrated(outputs, batch):
        with torch.no_grad():
            return scaler(outputs["logits"]), outputs["target"]

    metrics, decoders = [("hf_beta", {"beta": 1.0}), ("wu_palmer", {})], ["optimal"]
    cb = HierarchicalMetricsCallback(H, metrics=metrics, decoders=decoders, extract=calibrated, from_logits=True)
    logged = _validate(cb, _Fixed(scores, targets), 3)
    with torch.no_grad():
        want = _per_batch_means([scaler(s) for s in scores], targets, metrics, decoders)
    raw = _per_batch_means(scores, targets, metrics, decoders)
    for name, value in want.items():
        assert torch.equal(logged[name], value), name
    assert any(not torch.equal(want[n], raw[n]) for n in want)  # the calibration is what was scored
