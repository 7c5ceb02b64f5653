"""DecodingHead, HierarchicalMetric and the Lightning callback (SPEC §5), single process.

Every value is compared with a direct computation through get_metric / get_decoder.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import hdecode_torch as hd
import hdecode_torch.core.posterior as posterior_module
from hdecode_torch.integrations import DecodingHead, HierarchicalMetric
from harness import DEVICES, devices

H = hd.load_hierarchy("tieredimagenet-h")
L = H.num_leaves
F32_EPS = torch.finfo(torch.float32).eps  # the rounding of a float64 mean cast to the float32 scores' dtype


class NoDecoderJaccard(hd.metrics.Jaccard):
    """Jaccard declared without an exact decoder: every built-in metric has one, and the integrations'
    handling of a metric without one is still tested."""

    name = "jaccard_no_decoder"
    has_decoder = False


NO_DECODER = NoDecoderJaccard(H)

# (metric, metric params, decoder spec) covering leaf, node and set metrics, optimal and heuristic decoders.
PAIRS = [
    ("accuracy", {}, "optimal"),
    ("lca_height", {}, "optimal"),
    ("tree_distance", {}, "optimal"),
    ("tree_distance_c", {"c": 0.5}, "optimal"),
    ("wu_palmer", {}, "optimal"),
    ("zhao", {}, "optimal"),
    ("hf_beta", {"beta": 0.5}, "optimal"),
    ("hamming", {}, "optimal"),
    ("jaccard", {}, "optimal"),
    ("wu_palmer", {}, "majority"),
    ("hf_beta", {"beta": 1.0}, ("darts", {"lam": 0.5})),
    ("jaccard", {}, "plurality"),
    ("tree_distance", {}, "top_down"),
]
PAIR_IDS = [f"{m}-{d if isinstance(d, str) else d[0]}" for m, _, d in PAIRS]


def _model(seed=0, dim=16, num_leaves=L):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, num_leaves))
    with torch.no_grad():
        net[-1].weight.mul_(15)  # peaked, varied outputs (a fresh net is near uniform over 608 classes)
    return net


def _direct_decode(h, metric, params, decoder, probs):
    if decoder == "optimal":
        return hd.get_metric(metric, h, **params).decode(probs)
    name, dparams = (decoder, {}) if isinstance(decoder, str) else decoder
    return hd.get_decoder(name, h, **dparams).decode(probs)


def _scores(rng_seed, batch, scale=3.0, device="cpu"):
    g = torch.Generator().manual_seed(rng_seed)
    return (torch.randn(batch, L, generator=g) * scale).to(device)


# --------------------------------------------------------------------------- DecodingHead
@pytest.mark.parametrize("metric,params,decoder", PAIRS, ids=PAIR_IDS)
def test_head_equals_direct_decoding(metric, params, decoder):
    model = _model().eval()
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(1))
    pipeline = nn.Sequential(model, DecodingHead(H, metric, decoder=decoder, from_logits=True, **params))
    with torch.no_grad():
        out = pipeline(x)
        want = _direct_decode(H, metric, params, decoder, torch.softmax(model(x), dim=1))
    assert out.dtype == want.dtype and out.shape == want.shape
    assert torch.equal(out, want)
    head = pipeline[1]
    if decoder == "optimal" and hd.get_metric(metric, H, **params).kind == "set":
        assert head.returns_sets and out.shape == (24, H.num_nodes) and out.dtype == torch.bool
    else:
        assert not head.returns_sets and out.shape == (24,) and out.dtype == torch.int64


def test_head_probabilities_input_and_unbatched():
    probs = torch.softmax(_scores(2, 8), dim=1)
    head = DecodingHead(H, "wu_palmer", from_logits=False)
    want = hd.get_metric("wu_palmer", H).decode(probs)
    assert torch.equal(head(probs), want)
    assert head(probs[3]).shape == () and int(head(probs[3])) == int(want[3])


def test_head_rejects_bad_input_and_metrics_without_decoder():
    head = DecodingHead(H, "tree_distance", from_logits=True)
    bad = _scores(3, 4)
    bad[1, 5] = float("nan")
    with pytest.raises(ValueError, match="NaN|finite"):
        head(bad)
    with pytest.raises(ValueError, match="columns"):
        head(torch.randn(4, L + 1))
    with pytest.raises(ValueError, match="sum to 1"):
        DecodingHead(H, "tree_distance", from_logits=False)(bad.nan_to_num().abs())
    with pytest.raises(ValueError, match="`jaccard_no_decoder` has no Bayes-optimal decoder"):
        DecodingHead(H, NO_DECODER)
    with pytest.raises(ValueError, match="Unknown metric"):
        DecodingHead(H, "nope")
    with pytest.raises(ValueError, match="Unknown decoder"):
        DecodingHead(H, "accuracy", decoder="nope")
    with pytest.raises(TypeError, match="Hierarchy"):
        DecodingHead(H.parents_list, "accuracy")
    # a metric without a decoder works with a heuristic decoder
    x = _scores(4, 6)
    assert torch.equal(DecodingHead(H, NO_DECODER, decoder="majority", from_logits=True)(x),
                       hd.get_decoder("majority", H).decode(torch.softmax(x, 1)))


def test_head_buffers_and_state_dict_round_trip():
    head = DecodingHead(H, "hf_beta", beta=0.5, from_logits=True)
    state = head.state_dict()
    assert list(state) == ["parent"]
    assert torch.equal(state["parent"], H.parent)
    # A head built on another tree of the same size takes the loaded tree.
    rng = np.random.default_rng(0)
    other_parents = np.asarray(H.parents_list).copy()
    leaves = rng.permutation(L)[:2]
    internal = [n for n in range(L, H.num_nodes) if n != H.root]
    other_parents[leaves] = rng.choice(internal, 2)  # move two leaves: a different tree, same size
    other = hd.Hierarchy.from_parents(other_parents)
    if any(other.num_children[n] == 0 for n in range(L, H.num_nodes)):
        pytest.skip("moving leaves emptied an internal node")
    fresh = DecodingHead(other, "hf_beta", beta=0.5, from_logits=True)
    x = _scores(5, 10)
    fresh.load_state_dict(state)
    assert fresh.hierarchy.same_tree(H)
    assert torch.equal(fresh(x), head(x))
    assert fresh.metric.key == "hf_beta[beta=0.5]"


def test_head_takes_a_decoder_positionally_as_the_readme_writes_it():
    P, y = hd.synthetic.synthetic_outputs(H, 300, seed=3)
    rc = hd.RiskControl(H, alpha=0.1).fit(P[:200], y[:200])
    assert torch.equal(DecodingHead(H, rc)(P[200:]), DecodingHead(H, decoder=rc)(P[200:]))
    assert torch.equal(DecodingHead(H, rc)(P[200:]), rc.decode(P[200:]))
    majority = hd.get_decoder("majority", H)
    head = DecodingHead(H, majority, from_logits=True)
    assert head.decoder is majority and head.metric.key == "accuracy"
    assert torch.equal(head(P.log()), majority.decode(P))
    with pytest.raises(TypeError, match=r"Expected `metric` to be a metric, but got the decoder .* together with "
                                        r"decoder='plurality'"):
        DecodingHead(H, majority, decoder="plurality")


def test_head_saves_and_loads_a_fitted_risk_control_lambda():
    P, y = hd.synthetic.synthetic_outputs(H, 300, seed=4)
    rc = hd.RiskControl(H, alpha=0.1)
    head = DecodingHead(H, decoder=rc)
    assert list(head.state_dict()) == ["parent", "lam"] and head.state_dict()["lam"].isnan()
    rc.fit(P[:200], y[:200])  # fitted after the head was built: the state holds the λ of now
    buf = io.BytesIO()
    torch.save(head.state_dict(), buf)
    buf.seek(0)
    fresh = DecodingHead(H, decoder=hd.RiskControl(H, alpha=0.1))
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.decoder.lam == rc.lam  # exactly: a float64 buffer
    assert torch.equal(fresh(P[200:]), head(P[200:]))
    assert list(DecodingHead(H, decoder="majority").state_dict()) == ["parent"]


def test_head_torch_save_load(tmp_path):
    model = _model(3).eval()
    pipeline = nn.Sequential(model, DecodingHead(H, "zhao", from_logits=True))
    x = torch.randn(12, 16)
    with torch.no_grad():
        want = pipeline(x)
    path = tmp_path / "pipeline.pt"
    torch.save(pipeline, path)
    loaded = torch.load(path, weights_only=False)
    with torch.no_grad():
        assert torch.equal(loaded(x), want)
    buf = io.BytesIO()
    torch.save(pipeline.state_dict(), buf)
    buf.seek(0)
    again = nn.Sequential(_model(4).eval(), DecodingHead(H, "zhao", from_logits=True))
    again.load_state_dict(torch.load(buf, weights_only=True))
    with torch.no_grad():
        assert torch.equal(again(x), want)


def test_head_inference_mode_then_normal_use():
    tree = hd.Hierarchy.from_parents(H.parents_list)  # fresh: its caches get built under inference mode
    head = DecodingHead(tree, "hf_beta", beta=1.0, from_logits=True)
    x = _scores(6, 16)
    with torch.inference_mode():
        out = head(x)
    assert out.is_inference()
    # The caches built under inference mode must not break ordinary (autograd-enabled) use later.
    probs = torch.softmax(x, 1)
    assert torch.equal(hd.get_metric("hf_beta", tree, beta=1.0).decode(probs), out)
    assert torch.equal(head(x), out)
    td = hd.get_metric("tree_distance", tree)
    logits = x.clone().requires_grad_(True)
    p = torch.softmax(logits, 1)
    assert torch.equal(td.decode(p.detach()), DecodingHead(tree, "tree_distance", from_logits=True)(x))


@devices
def test_head_to_device(device):
    head = DecodingHead(H, "wu_palmer", from_logits=True).to(device)
    assert head.parent.device.type == device
    assert head.hierarchy.device.type == device
    x = _scores(7, 8, device=device)
    out = head(x)
    assert out.device.type == device
    assert torch.equal(out.cpu(), hd.get_metric("wu_palmer", H).decode(torch.softmax(x.cpu(), 1)))


@pytest.mark.skipif("cuda" not in DEVICES, reason="needs CUDA")
def test_head_device_mismatch_is_clear():
    head = DecodingHead(H, "wu_palmer", from_logits=True).to("cuda")
    with pytest.raises(ValueError, match="head's device"):
        head(_scores(8, 4))


# --------------------------------------------------------------------------- HierarchicalMetric
@pytest.mark.parametrize("metric,params,decoder", PAIRS, ids=PAIR_IDS)
def test_metric_equals_mean_of_direct_values(metric, params, decoder):
    m = HierarchicalMetric(H, metric, decoder=decoder, from_logits=True, **params)
    direct = get = hd.get_metric(metric, H, **params)
    values = []
    for seed, batch in [(10, 7), (11, 16), (12, 1)]:
        logits = _scores(seed, batch)
        target = torch.randint(0, L, (batch,), generator=torch.Generator().manual_seed(seed))
        m.update(logits, target)
        pred = _direct_decode(H, metric, params, decoder, torch.softmax(logits, 1))
        values.append(direct(pred, target, dtype=torch.float64))
    value = m.compute()
    want = torch.cat(values).mean()
    assert value.dtype == torch.float32  # the logits' dtype, summed in float64
    assert torch.allclose(value.double(), want, rtol=torch.finfo(torch.float32).eps, atol=0)
    assert m.higher_is_better == get.higher_is_better
    m.reset()
    assert m.values == []


def test_metric_forward_returns_batch_value_and_accumulates():
    m = HierarchicalMetric(H, "tree_distance", decoder="majority")
    td, maj = hd.get_metric("tree_distance", H), hd.get_decoder("majority", H)
    batches = [(torch.softmax(_scores(s, 9), 1), torch.arange(9) * (s + 1) % L) for s in range(3)]
    for p, y in batches:
        assert torch.allclose(m(p, y), td(maj.decode(p), y).mean())
    want = torch.cat([td(maj.decode(p), y) for p, y in batches]).mean()
    assert torch.allclose(m.compute(), want, rtol=1e-12)


def test_metric_errors():
    with pytest.raises(ValueError, match="`jaccard_no_decoder` has no Bayes-optimal decoder"):
        HierarchicalMetric(H, NO_DECODER)
    with pytest.raises(ValueError, match="Unexpected keyword|Bad parameters"):
        HierarchicalMetric(H, "accuracy", gamma=2)
    m = HierarchicalMetric(H, "accuracy")
    with pytest.raises(ValueError, match="target"):
        m.update(torch.softmax(_scores(1, 3), 1), torch.tensor([0, 1, L]))
    with pytest.raises(ValueError, match="logits|sum to 1|probabilities"):
        m.update(_scores(1, 3), torch.tensor([0, 1, 2]))


def test_metric_torchmetrics_kwargs_and_state():
    m = HierarchicalMetric(H, ("hf_beta", {"beta": 2.0}), decoder=("darts", {"lam": 1.0}), compute_on_cpu=True,
                           sync_on_compute=False)
    assert m.compute_on_cpu and not m.sync_on_compute
    assert m.key == "hf_beta[beta=2]/darts[lam=1]"
    assert m.higher_is_better is True
    assert HierarchicalMetric(H, "tree_distance").higher_is_better is False
    assert set(m._defaults) == {"values", "signature"}
    lean = HierarchicalMetric(H, "tree_distance", exact=False)
    assert set(lean._defaults) == {"total", "count", "signature"}
    assert lean.total.dtype == torch.float64 and lean.count.dtype == torch.float64


def _count_node_sums(monkeypatch):
    calls = {"n": 0}
    original = posterior_module.leaf_to_node_sum

    def counting(*args, **kwargs):
        calls["n"] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(posterior_module, "leaf_to_node_sum", counting)
    return calls


def test_collection_computes_node_probabilities_once_per_batch(monkeypatch):
    from torchmetrics import MetricCollection

    calls = _count_node_sums(monkeypatch)
    coll = MetricCollection({
        "td_majority": HierarchicalMetric(H, "tree_distance", decoder="majority"),
        "wp_plurality": HierarchicalMetric(H, "wu_palmer", decoder="plurality"),
        "hf_darts": HierarchicalMetric(H, "hf_beta", decoder=("darts", {"lam": 0.5}), beta=0.5),
        "jac_topdown": HierarchicalMetric(H, "jaccard", decoder="top_down"),
        "acc_cthr": HierarchicalMetric(H, "accuracy", decoder=("confidence_threshold", {"tau": 0.3})),
    }, compute_groups=False)
    for seed in range(3):
        p = torch.softmax(_scores(seed, 12), 1)
        y = torch.randint(0, L, (12,), generator=torch.Generator().manual_seed(seed))
        before = calls["n"]
        coll.update(p, y)
        # one p(n) table for all five (metric, decoder) pairs; on the GPU plan also one table of the
        # exact positive-leaf counts that settle the heuristics' ties, shared the same way
        gpu = hd.core.plan.resolve_plan(H, p.device).gpu
        assert calls["n"] - before == 1 + gpu
    out = coll.compute()
    assert set(out) == {"td_majority", "wp_plurality", "hf_darts", "jac_topdown", "acc_cthr"}


def test_collection_with_optimal_decoders_adds_no_recomputation(monkeypatch):
    """However the optimal decoders use the Posterior, the collection costs what one shared Posterior costs."""
    from torchmetrics import MetricCollection

    specs = [("tree_distance", {}, "optimal"), ("hf_beta", {"beta": 0.5}, "optimal"), ("hamming", {}, "optimal"),
             ("wu_palmer", {}, "majority"), ("zhao", {}, "plurality")]
    calls = _count_node_sums(monkeypatch)
    p = torch.softmax(_scores(9, 16), 1)
    y = torch.arange(16) * 37 % L
    post = hd.Posterior(H, p)
    for m, prm, d in specs:
        _direct_decode(H, m, prm, d, post)
    shared_cost = calls["n"]
    coll = MetricCollection({f"{m}/{d}": HierarchicalMetric(H, m, decoder=d, **prm) for m, prm, d in specs},
                            compute_groups=False)
    calls["n"] = 0
    coll.update(p, y)
    assert calls["n"] == shared_cost
    unshared = 0
    for m, prm, d in specs:
        calls["n"] = 0
        _direct_decode(H, m, prm, d, p)
        unshared += calls["n"]
    assert shared_cost < unshared


def test_collection_compute_groups_do_not_merge_different_pairs():
    """Two decoders that agree on the first batch must still be accumulated separately."""
    from torchmetrics import MetricCollection

    coll = MetricCollection({
        "argmax": HierarchicalMetric(H, "tree_distance", decoder="argmax_leaf"),
        "optimal": HierarchicalMetric(H, "tree_distance", decoder="optimal"),
    })  # compute_groups=True: torchmetrics' default
    onehot = torch.zeros(4, L, dtype=torch.float64)
    onehot[torch.arange(4), torch.tensor([0, 5, 9, 300])] = 1.0
    y = torch.tensor([0, 5, 9, 300])
    coll.update(onehot, y)  # both decoders predict the leaf: equal states after batch 1
    p = torch.softmax(_scores(13, 32, scale=1.0), 1).double()
    y2 = torch.randint(0, L, (32,), generator=torch.Generator().manual_seed(13))
    coll.update(p, y2)
    td = hd.get_metric("tree_distance", H)
    want_arg = torch.cat([td(onehot.argmax(1), y, dtype=p.dtype), td(p.argmax(1), y2, dtype=p.dtype)]).mean()
    want_opt = torch.cat([td(td.decode(onehot), y, dtype=p.dtype), td(td.decode(p), y2, dtype=p.dtype)]).mean()
    assert not torch.allclose(want_arg, want_opt)
    out = coll.compute()
    assert torch.allclose(out["argmax"], want_arg, rtol=1e-12)
    assert torch.allclose(out["optimal"], want_opt, rtol=1e-12)


def test_metric_updated_with_an_in_place_modified_batch_sees_the_new_values():
    p = torch.softmax(_scores(14, 5), 1)
    m = HierarchicalMetric(H, "accuracy", decoder="argmax_leaf")
    y = p.argmax(1)
    m.update(p, y)
    p2 = p.clone()
    m.update(p2, y)
    p2.copy_(torch.roll(p2, 1, dims=1))
    m.update(p2, y)
    acc = hd.get_metric("accuracy", H)
    want = torch.cat([acc(p.argmax(1), y), acc(p.argmax(1), y), acc(p2.argmax(1), y)]).mean()
    assert torch.allclose(m.compute(), want)


def test_metric_inference_tensors():
    m = HierarchicalMetric(H, "wu_palmer", decoder="optimal", from_logits=True)
    with torch.inference_mode():
        x = _scores(15, 6)
        y = torch.arange(6)
        m.update(x, y)
        m.update(x, y)  # second use of the same inference tensor: cache hit without a version counter
    wp = hd.get_metric("wu_palmer", H)
    want = wp(wp.decode(torch.softmax(x, 1)), y).mean()
    assert torch.allclose(m.compute(), want, rtol=1e-12)


@devices
def test_metric_on_device(device):
    m = HierarchicalMetric(H, "hf_beta", beta=0.5).to(device)
    p = torch.softmax(_scores(16, 8), 1)
    y = torch.arange(8) * 11
    m.update(p.to(device), y.to(device))
    assert m.values[0].device.type == device and m.values[0].dtype == torch.float64
    hf = hd.get_metric("hf_beta", H, beta=0.5)
    assert torch.allclose(m.compute().cpu(), hf(hf.decode(p), y).mean(), rtol=1e-12)


# --------------------------------------------------------------------------- Lightning callback
try:
    import pytorch_lightning as pl
    from hdecode_torch.integrations.lightning import default_name
except ImportError:  # the callback tests need it; the rest of this file does not
    pl = None
needs_lightning = pytest.mark.skipif(pl is None, reason="needs pytorch_lightning")


class _Data(torch.utils.data.Dataset):
    def __init__(self, n, dim=16, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = torch.randint(0, L, (n,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class _Module(pl.LightningModule if pl is not None else nn.Module):
    def __init__(self, output_key="logits"):
        super().__init__()
        self.net = _model(5)
        self.output_key = output_key

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        if self.output_key == "probs":
            return {"probs": torch.softmax(logits, 1)}  # targets read from the (x, y) batch
        return {"logits": logits, "target": y}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _trainer(tmp_path, callbacks, **kw):
    return pl.Trainer(accelerator="cpu", devices=1, max_epochs=2, callbacks=callbacks,
                      logger=pl.loggers.CSVLogger(tmp_path),
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      num_sanity_val_steps=2, **kw)


def _direct_values(net, data, metrics, decoders):
    with torch.no_grad():
        probs = torch.softmax(net(data.x), 1)
    out = {}
    for metric, params in metrics:
        m = hd.get_metric(metric, H, **params)
        for dec in decoders:
            if dec == "optimal":
                if not m.has_decoder:
                    continue
                pred, label = m.decode(probs), "optimal"
            else:
                name, dp = (dec, {}) if isinstance(dec, str) else dec
                d = hd.get_decoder(name, H, **dp)
                pred, label = d.decode(probs), d.key
            out[default_name("val", m.key, label)] = m(pred, data.y, dtype=torch.float64).mean()
    return out


@needs_lightning
def test_callback_logs_direct_values(tmp_path, capsys):
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    metrics = [("accuracy", {}), ("tree_distance", {}), ("hf_beta", {"beta": 0.5}), ("jaccard", {}),
               (NO_DECODER, {})]
    decoders = ["optimal", "majority", ("darts", {"lam": 0.5})]
    with pytest.warns(UserWarning, match="jaccard_no_decoder"):
        cb = HierarchicalMetricsCallback(H, metrics=metrics, decoders=decoders, print_table=True)
    train, val = _Data(64, seed=1), _Data(40, seed=2)
    module = _Module()
    trainer = _trainer(tmp_path, [cb])
    trainer.fit(module, torch.utils.data.DataLoader(train, batch_size=16),
                torch.utils.data.DataLoader(val, batch_size=16))
    assert len(cb.history) == 2  # one per epoch: the sanity check is not reported
    want = _direct_values(module.net, val, metrics, decoders)
    assert len(want) == 3 * 5 - 1
    logged = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    assert set(logged) == set(want) == set(cb.names["validate"].values())
    for k, v in want.items():
        assert torch.allclose(logged[k].double(), v, rtol=F32_EPS), k  # float64 mean, cast
    for pair, name in cb.names["validate"].items():
        assert cb.results[pair] == pytest.approx(float(want[name]), rel=F32_EPS)
    assert cb.names["validate"][("hf_beta[beta=0.5]", "darts[lam=0.5]")] == "val_hf_beta0p5_darts0p5"
    assert "val_jaccard_optimal" in logged and ("jaccard_no_decoder", "optimal") in cb.skipped
    assert len({round(float(v), 6) for v in logged.values()}) >= 8  # non-degenerate predictions
    # The logger received every pair at every epoch.
    import csv

    rows = list(csv.DictReader(open(trainer.logger.experiment.metrics_file_path)))
    epochs_logged = [r for r in rows if r.get("val_tree_distance_majority")]
    assert len(epochs_logged) == 2
    assert float(epochs_logged[-1]["val_accuracy_optimal"]) == pytest.approx(float(want["val_accuracy_optimal"]))
    printed = capsys.readouterr().out
    assert printed.count("[val] epoch") == 2 and "hf_beta[beta=0.5]" in printed and "darts[lam=0.5]" in printed


@needs_lightning
def test_callback_probs_key_extract_and_validate(tmp_path):
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    metrics, decoders = [("wu_palmer", {})], ["optimal", "top_down"]
    cb = HierarchicalMetricsCallback(H, metrics=["wu_palmer"], decoders=decoders, output_key="probs")
    assert cb.from_logits is False
    seen = []

    def extract(outputs, batch):
        seen.append(1)
        return outputs["probs"], batch[1]

    with pytest.raises(ValueError, match="from_logits"):
        HierarchicalMetricsCallback(H, metrics=["wu_palmer"], extract=extract)
    cb2 = HierarchicalMetricsCallback(H, metrics=["wu_palmer"], decoders=["optimal"], extract=extract, prefix="ev",
                                      from_logits=False)
    val = _Data(24, seed=3)
    module = _Module(output_key="probs")
    trainer = _trainer(tmp_path, [cb, cb2])
    trainer.validate(module, torch.utils.data.DataLoader(val, batch_size=10), verbose=False)
    want = _direct_values(module.net, val, metrics, decoders)
    for k, v in want.items():
        assert torch.allclose(trainer.callback_metrics[k].double(), v, rtol=F32_EPS)
    assert torch.allclose(trainer.callback_metrics["ev_wu_palmer_optimal"].double(), want["val_wu_palmer_optimal"])
    assert len(seen) == 3


@needs_lightning
def test_callback_errors(tmp_path):
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    with pytest.raises(ValueError, match="from_logits"):
        HierarchicalMetricsCallback(H, metrics=["accuracy"], output_key="out")
    with pytest.raises(TypeError, match="lists"):
        HierarchicalMetricsCallback(H, metrics="accuracy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="No \\(metric, decoder\\) pair"):
            HierarchicalMetricsCallback(H, metrics=[NO_DECODER], decoders=["optimal"])
    cb = HierarchicalMetricsCallback(H, metrics=["accuracy"], output_key="scores_missing", from_logits=True)
    trainer = _trainer(tmp_path, [cb])
    with pytest.raises(ValueError, match="scores_missing"):
        trainer.validate(_Module(), torch.utils.data.DataLoader(_Data(8), batch_size=4), verbose=False)


@needs_lightning
def test_package_exports():
    assert hd.DecodingHead is DecodingHead
    assert hd.HierarchicalMetric is HierarchicalMetric
    from hdecode_torch.integrations import HierarchicalMetricsCallback, callback_class

    assert hd.HierarchicalMetricsCallback is HierarchicalMetricsCallback
    assert issubclass(HierarchicalMetricsCallback, pl.Callback)
    assert callback_class("pytorch_lightning") is HierarchicalMetricsCallback


def test_compiled_pipeline_runs_the_head_eagerly():
    """torch.compile of backbone + head: the backbone is compiled, the head (excluded) stays exact.

    Compiled by inductor, the hF_β decoder returned wrong sets (torch 2.13 CPU); excluding the
    head from compilation keeps the pipeline's output identical to eager.
    """
    import torch._dynamo

    model = nn.Sequential(nn.Linear(8, L)).eval()
    pipeline = nn.Sequential(model, DecodingHead(H, "hf_beta", beta=0.5, from_logits=True))
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(3)) * 4
    with torch.no_grad():
        want = pipeline(x)
        torch._dynamo.reset()
        got = torch.compile(pipeline)(x)
        head_only = torch.compile(pipeline[1])(model(x))
    assert torch.equal(got, want)
    assert torch.equal(head_only, want)


def test_callback_with_the_unified_lightning_package(tmp_path):
    """The same callback logic under ``lightning.pytorch`` (the unified ``lightning`` package)."""
    L_pl = pytest.importorskip("lightning.pytorch")
    from hdecode_torch.integrations import callback_class

    cls = callback_class("lightning.pytorch")
    assert issubclass(cls, L_pl.Callback)

    class Module(L_pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = _model(5)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return {"logits": self.net(x), "target": y}

    metrics = [("tree_distance", {}), ("hf_beta", {"beta": 2.0})]
    decoders = ["optimal", "plurality"]
    cb = cls(H, metrics=metrics, decoders=decoders)
    val = _Data(24, seed=4)
    module = Module()
    trainer = L_pl.Trainer(accelerator="cpu", devices=1, callbacks=[cb], logger=False, enable_progress_bar=False,
                           enable_model_summary=False, enable_checkpointing=False)
    trainer.validate(module, torch.utils.data.DataLoader(val, batch_size=8), verbose=False)
    want = _direct_values(module.net, val, metrics, decoders)
    logged = {k: v for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    assert set(logged) == set(want)
    for k, v in want.items():
        assert torch.allclose(logged[k].double(), v, rtol=F32_EPS), k  # float64 mean, cast


# --------------------------------------------------------------------------- one label per decoder
#: (metric spec, decoder spec, the pair's label, its safe form, the decoder's own label)
LABELLED = [
    ("hf_beta[beta=0.5]", "optimal", "hf_beta[beta=0.5]/optimal", "hf_beta0p5_optimal", "hf_beta[beta=0.5]/optimal"),
    ("tree_distance", ("darts", {"lam": 0.5}), "tree_distance/darts[lam=0.5]", "tree_distance_darts0p5",
     "darts[lam=0.5]"),
    ("accuracy", "optimal:wu_palmer", "accuracy/wu_palmer/optimal", "accuracy_wu_palmer_optimal",
     "wu_palmer/optimal"),
]


@pytest.mark.parametrize("metric,decoder,pair,safe,alone", LABELLED, ids=[x[2] for x in LABELLED])
def test_every_output_names_a_pair_by_its_one_label(metric, decoder, pair, safe, alone):
    from hdecode_torch.core.spec import label
    from hdecode_torch.integrations.batch import column_name
    from hdecode_torch.integrations.lightning import default_name

    m = HierarchicalMetric(H, metric, decoder=decoder)
    head = DecodingHead(H, metric, decoder=decoder)
    assert label(m.metric, m.decoder) == pair == m.key
    assert label(m.metric, m.decoder, safe=True) == safe == m.name == type(m).__name__
    assert repr(head) == f"DecodingHead({pair}, from_logits=False, num_nodes={H.num_nodes})"
    assert f"({pair})" in repr(m)
    metric_key, decoder_part = pair.split("/", 1)
    assert default_name("val", metric_key, decoder_part) == f"val_{safe}"
    assert label(decoder=m.decoder) == alone
    assert column_name(m.decoder) == label(decoder=m.decoder, safe=True)
    assert all(c.isalnum() or c in "_-" for c in safe)
    # The label is a spec again: each part builds the same metric and decoder.
    again = hd.get_decoder(alone, H) if "/" in alone else hd.get_decoder(decoder_part, H)
    assert again.key == m.decoder.key
    assert hd.get_metric(metric_key, H).key == m.metric.key


@pytest.mark.parametrize("spec", ["optimal:hf_beta[beta=0.5]", "hf_beta[beta=0.5]/optimal", "optimal:hf[beta=0.5]",
                                  ("optimal", {"metric": "hf_beta[beta=0.5]"}), "hf_beta[ beta = 0.50 ]/optimal"])
def test_each_spelling_of_an_optimal_decoder_maps_to_its_label(spec):
    from hdecode_torch.core.spec import label

    dec = hd.get_decoder(spec, H)
    assert label(decoder=dec) == "hf_beta[beta=0.5]/optimal"
    by_metric = hd.get_decoder("optimal", H, metric=("hf_beta", {"beta": 0.5}))
    assert label(decoder=by_metric) == label(by_metric.metric, by_metric) == "hf_beta[beta=0.5]/optimal"
    assert label(hd.get_metric("hf_beta", H, beta=0.5), dec) == "hf_beta[beta=0.5]/optimal"  # its own metric


@pytest.mark.parametrize("spec", ["darts[lam=0.5]", ("darts", {"lam": 0.5}), "darts[lam=0.50]"])
def test_each_spelling_of_a_heuristic_maps_to_its_label(spec):
    from hdecode_torch.core.spec import label

    assert label(decoder=hd.get_decoder(spec, H)) == "darts[lam=0.5]"
    assert label(decoder=hd.get_decoder("darts", H, lam=0.5), safe=True) == "darts0p5"


def test_every_decoder_label_is_taken_back_as_a_spec():
    from hdecode_torch.core.spec import label

    from harness import heuristic_cases

    decoders = [hd.get_decoder(name, H, **params) for name, params in (c.values for c in heuristic_cases(full=False))]
    decoders += [hd.get_decoder("optimal", H, metric=name) for name in hd.list_metrics()
                 if hd.metrics.metric_class(name).has_decoder and name != "cost_matrix"]
    decoders += [hd.get_decoder("optimal", H, metric=("tree_distance_c", {"c": 0.25}))]
    for dec in decoders:
        again = hd.get_decoder(label(decoder=dec), H)
        assert type(again) is type(dec) and again.key == dec.key, label(decoder=dec)


def test_compare_json_and_table_use_the_labels(tmp_path, capsys):
    """``hdecode compare``: the decoders' keys and headers are their labels, the risk-control rows too."""
    import json

    from hdecode_torch.cli.main import main
    from hdecode_torch.core.spec import label

    path = tmp_path / "out.json"
    code = main(["compare", "--alpha", "0.2", "--num-samples", "300", "--seed", "1", "--metrics", "hf_beta,wu_palmer",
                 "--betas", "0.5", "--decoders", "darts,majority", "--lam", "0.5", "--json", str(path),
                 "--no-progress", "--width", "200"])
    out = capsys.readouterr().out
    assert code == 0
    results = json.loads(path.read_text())["results"]
    heuristics = [label(decoder=hd.get_decoder("darts", H, lam=0.5)), "majority"]
    assert list(results["metrics"]) == ["hf_beta[beta=0.5]", "wu_palmer"]
    for metric in results["metrics"].values():
        assert [k for k in metric if k != "higher_is_better"] == ["optimal", *heuristics]
    assert list(results["risk_control"]["miss_rate"]) == ["risk_control[alpha=0.2]", "hf_beta[beta=0.5]/optimal",
                                                          "wu_palmer/optimal", *heuristics]
    header = next(line for line in out.splitlines() if line.lstrip().startswith("metric"))
    assert header.split() == ["metric", "optimal", "gain", *heuristics]
    assert "hf_beta[beta=0.5]/optimal" in out and "optimal:" not in out


def test_benchmark_rows_are_labelled_as_the_library_labels_them():
    from benchmarks.run import discover_specs
    from hdecode_torch.core.spec import label

    keys = {s.key for s in discover_specs()}
    assert {"hf_beta[beta=0.5]/optimal", "wu_palmer/optimal", "tree_distance_c[c=0.5]/optimal"} <= keys
    assert not any(k.startswith("opt:") for k in keys)
    assert label(decoder=hd.get_decoder("hf_beta[beta=2]/optimal", H)) in keys
