"""HierarchicalMetric as a torchmetrics citizen: names in MetricCollection lists, plot(), pickling."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.integrations import HierarchicalMetric

H = hd.load_hierarchy("tieredimagenet-h")
L = H.num_leaves


def _batch(seed, n=16):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, L, generator=g) * 3, 1), torch.randint(0, L, (n,), generator=g)


def test_metric_collection_list_form_names_each_pair():
    from torchmetrics import MetricCollection

    members = [HierarchicalMetric(H, "hf_beta", beta=0.5), HierarchicalMetric(H, "hf_beta", beta=2.0),
               HierarchicalMetric(H, "tree_distance"), HierarchicalMetric(H, "tree_distance", decoder=("darts", {"lam": 0.5})),
               HierarchicalMetric(H, "jaccard", decoder="majority")]
    coll = MetricCollection(members)
    names = ["hf_beta0p5_optimal", "hf_beta2_optimal", "tree_distance_optimal", "tree_distance_darts0p5",
             "jaccard_majority"]
    assert [m.name for m in members] == names and sorted(coll.keys()) == sorted(names)
    probs, y = _batch(0)
    coll.update(probs, y)
    out = coll.compute()
    for m, name in zip(members, names):
        metric = hd.get_metric(m.metric.name, H, **m.metric.params)
        assert torch.allclose(out[name], metric(m.decoder.decode(probs), y).double().mean(), rtol=1e-12), name
    assert isinstance(members[0], HierarchicalMetric) and type(members[0]).__name__ == "hf_beta0p5_optimal"
    assert type(HierarchicalMetric(H, "hf_beta", beta=0.5)) is type(members[0])  # one class per name
    with pytest.raises(ValueError, match="two metrics both named"):
        MetricCollection([HierarchicalMetric(H, "zhao"), HierarchicalMetric(H, "zhao")])


def test_user_subclass_keeps_its_class():
    class Mine(HierarchicalMetric):
        pass

    assert type(Mine(H, "zhao")) is Mine


def test_plot_returns_a_figure_on_the_metric_range():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    bounds = {"accuracy": (0.0, 1.0), "wu_palmer": (0.0, 1.0), "hf_beta": (0.0, 1.0), "tree_distance": (0.0, None),
              "hamming": (0.0, None)}
    for name, (lo, hi) in bounds.items():
        m = HierarchicalMetric(H, name)
        assert (m.plot_lower_bound, m.plot_upper_bound) == (lo, hi), name
    m = HierarchicalMetric(H, "wu_palmer")
    values = []
    for seed in range(3):
        values.append(m(*_batch(seed)))
    fig, ax = m.plot(values)
    assert isinstance(fig, matplotlib.figure.Figure) and ax.get_ylabel() == "wu_palmer_optimal"
    assert len(ax.lines[0].get_ydata()) == 3
    lo, hi = ax.get_ylim()
    assert lo <= 0.0 and hi >= 1.0  # the axis spans the metric's range
    fig, ax = m.plot()  # compute()
    assert float(ax.lines[0].get_ydata()[0]) == pytest.approx(float(m.compute()))
    cost = torch.rand(H.num_nodes, L, generator=torch.Generator().manual_seed(0)) * 3 + 1
    cm = HierarchicalMetric(H, hd.CostMatrixMetric(H, cost), decoder="majority")
    assert cm.plot_lower_bound == pytest.approx(float(cost.min())) and cm.plot_upper_bound == pytest.approx(float(cost.max()))


def test_pickle_is_small_and_round_trips():
    m = HierarchicalMetric(H, "hf_beta", beta=0.5)
    assert len(pickle.dumps(m)) < 200_000  # the tree, not its cached tables
    probs, y = _batch(1)
    m.update(probs, y)
    hd.get_metric("wu_palmer", H).decode(probs)  # fill the tree's caches: they stay out of the pickle
    with hd.plan_for("cuda"):
        hd.get_metric("wu_palmer", H).decode(probs)
    data = pickle.dumps(m)
    assert len(data) < 200_000
    back = pickle.loads(data)
    assert type(back) is type(m) and back.name == "hf_beta0p5_optimal"
    assert torch.equal(back.compute(), m.compute())
    probs2, y2 = _batch(2)
    back.update(probs2, y2)
    m.update(probs2, y2)
    assert torch.equal(back.compute(), m.compute())  # the rebuilt tree decodes the same
    buf = io.BytesIO()
    torch.save(m, buf)
    assert len(buf.getvalue()) < 250_000
    assert torch.equal(copy.deepcopy(m).compute(), m.compute())


def test_docstring_states_the_input_convention():
    for cls in (HierarchicalMetric, hd.DecodingHead):
        doc = cls.__doc__
        assert "``False`` (default)" in doc and "``True``" in doc and '``"auto"``' in doc, cls


def test_errors_name_the_argument():
    m = HierarchicalMetric(H, "tree_distance")
    probs, y = _batch(3, 4)
    with pytest.raises(ValueError, match="`scores`.*sum to 1"):
        m.update(probs * 2, y)
    with pytest.raises(ValueError, match="`target`"):
        m.update(probs, y + L)
    with pytest.raises(ValueError, match="`from_logits`"):
        HierarchicalMetric(H, "tree_distance", from_logits="yes")
    with pytest.raises(ValueError, match="`scores`"):
        hd.DecodingHead(H, "tree_distance")(probs * 2)


# --------------------------------------------------------------------------- one batch, shared by a collection
def _count_decodes(monkeypatch):
    from hdecode_torch.core.component import HierarchyComponent

    calls = []
    original = HierarchyComponent.decode
    monkeypatch.setattr(HierarchyComponent, "decode", lambda self, *a, **k: calls.append(self.key) or original(
        self, *a, **k))
    return calls


def _direct(m, probs, y):
    metric = hd.get_metric(m.metric.name, H, **m.metric.params)
    return metric(m.decoder.decode(probs), y)


@pytest.mark.parametrize("mode", ["grad", "inference"])
@pytest.mark.parametrize("compute_groups", [True, False])
def test_collection_checks_once_and_decodes_each_decoder_once(monkeypatch, mode, compute_groups):
    from torchmetrics import MetricCollection

    from benchmarks.plan_cost import Cost

    members = [HierarchicalMetric(H, "tree_distance", decoder="majority"),
               HierarchicalMetric(H, "wu_palmer", decoder="majority"),
               HierarchicalMetric(H, "hamming", decoder="majority"),
               HierarchicalMetric(H, "zhao", decoder=("darts", {"lam": 0.5})),
               HierarchicalMetric(H, "jaccard", decoder=("darts", {"lam": 0.5})),
               HierarchicalMetric(H, "accuracy", decoder=("darts", {"lam": 0.5000001})),  # not the same decoder
               HierarchicalMetric(H, "tree_distance"), HierarchicalMetric(H, "accuracy")]
    coll = MetricCollection(members, compute_groups=compute_groups)
    calls = _count_decodes(monkeypatch)
    batches = [_batch(seed, 12) for seed in (20, 21, 22)]
    reads = []
    with torch.inference_mode(mode == "inference"):
        for probs, y in batches:
            probs, y = probs.clone(), y.clone()  # inference tensors in inference mode: no version counter
            before = len(calls)
            with Cost() as c:
                coll.update(probs, y)
            reads.append(c.reads)
            assert sorted(calls[before:]) == ["accuracy", "darts[lam=0.5]", "darts[lam=0.5]", "majority",
                                              "tree_distance"]
    # After the first batch (which builds the tree's tables): the scores' and targets' check, fused, for the
    # whole collection; these decoders read nothing.
    assert reads[1:] == [1, 1]
    out = coll.compute()
    for m in members:
        want = torch.cat([_direct(m, p, y) for p, y in batches])
        assert torch.equal(out[m.name], torch.sort(want).values.sum() / want.numel()), m.name


def test_a_buffer_refilled_in_place_is_a_new_batch():
    """Under inference mode tensors have no version counter: a collection updated twice with one buffer,
    refilled in between, must not reuse the first batch's predictions."""
    from torchmetrics import MetricCollection

    members = [HierarchicalMetric(H, "tree_distance", decoder="plurality"), HierarchicalMetric(H, "hf_beta", beta=2.0)]
    coll = MetricCollection(members)
    batches = [_batch(seed, 10) for seed in (30, 31)]
    with torch.inference_mode():
        probs, y = torch.empty(10, L), torch.empty(10, dtype=torch.long)
        for p, t in batches:
            probs.copy_(p)
            y.copy_(t)
            coll.update(probs, y)
    out = coll.compute()
    for m in members:
        want = torch.cat([_direct(m, p, t) for p, t in batches])
        assert torch.equal(out[m.name], torch.sort(want).values.sum() / want.numel()), m.name


def test_decoder_identity_follows_exact_parameters():
    from hdecode_torch.integrations.torchmetrics import decoder_identity

    same = [hd.get_decoder("darts", H, lam=0.5), hd.get_decoder("darts", H, lam=0.5, validate=False)]
    assert decoder_identity(same[0]) == decoder_identity(same[1])
    assert decoder_identity(hd.get_decoder("darts", H, lam=0.5000001)) != decoder_identity(same[0])
    opt = [hd.get_decoder("optimal", H, metric="wu_palmer") for _ in range(2)]
    assert decoder_identity(opt[0]) != decoder_identity(opt[1])  # optimal decoders: by object

    class Mine(type(same[0])):
        pass

    mine = Mine(H, lam=0.5)
    assert decoder_identity(mine) != decoder_identity(same[0]) and decoder_identity(mine) == decoder_identity(mine)
