"""HierarchicalMetric as a torchmetrics citizen: names in MetricCollection lists, plot(), pickling, decoded
predictions in update, the dtype of compute()."""

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
        want = _direct(m, probs, y)
        assert _same(out[name], (torch.sort(want).values.sum() / want.numel()).float()), name
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
    with pytest.raises(ValueError, match="`preds`.*sum to 1"):
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
    """(B,) float64 values of ``m``'s pair computed directly through the public API."""
    metric = hd.get_metric(m.metric.name, H, **m.metric.params)
    return metric(m.decoder.decode(probs), y, dtype=torch.float64)


def _same(a, b):
    return a.dtype == b.dtype and torch.equal(a, b)


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
    # whole collection, and one comparison with the first member's copy of the batch per other member; these
    # decoders read nothing.
    assert reads[1:] == [len(members)] * 2
    out = coll.compute()
    for m in members:
        want = torch.cat([_direct(m, p, y) for p, y in batches])
        assert _same(out[m.name], (torch.sort(want).values.sum() / want.numel()).float()), m.name


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
        assert _same(out[m.name], (torch.sort(want).values.sum() / want.numel()).float()), m.name


# Ways a data loader or a user refills one buffer with the next batch.  Only the first two bump the
# tensor's in-place version counter; inference tensors have none.
def _fill_copy(buf, new):
    buf.copy_(new)


def _fill_no_grad(buf, new):
    with torch.no_grad():
        buf.copy_(new)


def _fill_inference(buf, new):
    with torch.inference_mode():
        buf.copy_(new)


def _fill_numpy_view(buf, new):
    buf.numpy()[...] = new.numpy()


def _fill_data(buf, new):
    buf.data.copy_(new)


REFILLS = {"copy": _fill_copy, "no_grad": _fill_no_grad, "inference_mode": _fill_inference,
           "numpy_view": _fill_numpy_view, "data": _fill_data}


def _buffers(pattern, like):
    """Reused buffers shaped like ``like``: inference tensors for the inference_mode pattern; pinned where
    an accelerator allows it, as a loader with ``pin_memory=True`` gives them."""
    with torch.inference_mode(pattern == "inference_mode"):
        return [torch.empty_like(x, pin_memory=torch.cuda.is_available()) for x in like]


def _pooled(values):
    v = torch.cat(values)
    return (torch.sort(v).values.sum() / v.numel()).float()


def test_issue_reproducer_metric_updated_after_a_refill_scores_the_new_batch():
    h = hd.load_hierarchy("tieredimagenet-h")
    P, y = hd.synthetic.synthetic_outputs(h, 200, seed=2)
    A = HierarchicalMetric(h, "tree_distance", decoder="majority")
    B = HierarchicalMetric(h, "wu_palmer", decoder="majority")
    with torch.inference_mode():
        buf, yb = P[:100].clone(), y[:100].clone()
        A.update(buf, yb)
        buf.copy_(P[100:])
        yb.copy_(y[100:])
        B.update(buf, yb)
    assert _same(B.compute(), _pooled([_direct(B, P[100:], y[100:])]))
    assert abs(float(B.compute()) - 0.861) < 5e-4  # 0.318 when the first batch's predictions were reused


@pytest.mark.parametrize("pattern", sorted(REFILLS))
def test_a_refilled_buffer_is_never_taken_for_the_batch_it_held(monkeypatch, pattern):
    """A metric updated after the buffer was refilled, however it was written, scores the new values; one
    updated with the same values shares the decoding."""
    refill = REFILLS[pattern]
    a = HierarchicalMetric(H, "tree_distance", decoder="majority")
    b = HierarchicalMetric(H, "wu_palmer", decoder="majority")
    c = HierarchicalMetric(H, "hamming", decoder="majority")
    batches = [_batch(seed, 10) for seed in (40, 41, 42)]
    probs, y = _buffers(pattern, batches[0])
    calls = _count_decodes(monkeypatch)
    for (p, t), metrics in zip(batches, [(a,), (b, c), (a,)]):
        refill(probs, p)
        refill(y, t)
        for m in metrics:
            m.update(probs, y)
    assert calls == ["majority"] * 3  # c shared b's batch; each refill was decoded anew
    for m, seen in [(a, [0, 2]), (b, [1]), (c, [1])]:
        assert _same(m.compute(), _pooled([_direct(m, *batches[i]) for i in seen])), m.name


@pytest.mark.parametrize("pattern", sorted(REFILLS))
def test_a_collection_and_a_metric_after_it_see_each_refill(pattern):
    from torchmetrics import MetricCollection

    refill = REFILLS[pattern]
    coll = MetricCollection([HierarchicalMetric(H, "tree_distance", decoder="plurality"),
                             HierarchicalMetric(H, "hf_beta", beta=2.0)])
    alone = HierarchicalMetric(H, "zhao", decoder="plurality")
    batches = [_batch(seed, 10) for seed in (43, 44, 45)]
    probs, y = _buffers(pattern, batches[0])
    for i, (p, t) in enumerate(batches):
        refill(probs, p)
        refill(y, t)
        if i != 1:
            coll.update(probs, y)
        alone.update(probs, y)
    out = coll.compute()
    for m in coll.values():
        assert _same(out[m.name], _pooled([_direct(m, p, t) for p, t in (batches[0], batches[2])])), m.name
    assert _same(alone.compute(), _pooled([_direct(alone, p, t) for p, t in batches]))


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


# --------------------------------------------------------------------------- decoded predictions in update
def _mean(values, dtype):
    """What compute() returns for these float64 values: their sorted sum over their number, cast."""
    values = torch.cat(values) if isinstance(values, list) else values
    return (torch.sort(values).values.sum() / values.numel()).to(dtype)


@pytest.mark.parametrize("metric,params,kind", [("wu_palmer", {}, "ids"), ("accuracy", {}, "ids"),
                                                ("hf_beta", {"beta": 0.5}, "ids"), ("hf_beta", {"beta": 0.5}, "sets"),
                                                ("jaccard", {}, "sets"), ("tree_distance", {}, "int32")])
def test_update_scores_decoded_predictions_without_decoding(monkeypatch, metric, params, kind):
    """Integer node ids and bool node sets are predictions already: scored as they are, whatever the decoder."""
    direct = hd.get_metric(metric, H, **params)
    m = HierarchicalMetric(H, metric, decoder="darts", **params)
    g = torch.Generator().manual_seed(5)
    batches = []
    for n in (7, 12):
        y = torch.randint(0, L, (n,), generator=g)
        if kind == "sets":
            pred = torch.rand(n, H.num_nodes, generator=g) < 0.02
        else:
            pred = torch.randint(0, H.num_nodes, (n,), generator=g)
            pred = pred.int() if kind == "int32" else pred
        batches.append((pred, y))
    calls = _count_decodes(monkeypatch)
    for pred, y in batches:
        m.update(pred, y)
    assert calls == []  # no decoding
    want = _mean([direct(p, y, dtype=torch.float64) for p, y in batches], torch.get_default_dtype())
    assert _same(m.compute(), want)
    assert _same(m(*batches[0]), _mean(direct(*batches[0], dtype=torch.float64), torch.float32))  # forward


def test_a_collection_shares_decoded_predictions():
    """Members updated with the same decoded predictions: one check for the collection (one host read, and
    one per other member comparing the batch with the first member's copy), the values of each metric object
    computed once, each member's value that of its metric."""
    from torchmetrics import MetricCollection

    from benchmarks.plan_cost import Cost

    members = [HierarchicalMetric(H, "tree_distance"), HierarchicalMetric(H, "tree_distance", decoder="majority"),
               HierarchicalMetric(H, "wu_palmer", decoder="plurality"), HierarchicalMetric(H, "hamming")]
    coll = MetricCollection(members, compute_groups=False)
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randint(0, H.num_nodes, (9,), generator=g), torch.randint(0, L, (9,), generator=g))
               for _ in range(3)]
    reads = []
    for pred, y in batches:
        with Cost() as c:
            coll.update(pred, y)
        reads.append(c.reads)
    assert reads[1:] == [len(members)] * 2
    out = coll.compute()
    for m in members:
        metric = hd.get_metric(m.metric.name, H)
        want = _mean([metric(p, y, dtype=torch.float64) for p, y in batches], torch.float32)
        assert _same(out[m.name], want), m.name


def test_scores_and_decoded_predictions_add_up():
    m = HierarchicalMetric(H, "zhao", decoder="majority")
    probs, y = _batch(7, 10)
    pred = hd.get_decoder("majority", H).decode(probs)
    m.update(probs, y)
    m.update(pred, y)  # the same predictions, decoded by the caller
    zhao = hd.get_metric("zhao", H)
    one = zhao(pred, y, dtype=torch.float64)
    assert _same(m.compute(), _mean([one, one], torch.float32))


def test_decoded_predictions_errors_name_the_argument():
    m = HierarchicalMetric(H, "wu_palmer")
    y = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match=r"Expected `preds` in 0\.\.\d+ \(node ids\), but got"):
        m.update(torch.tensor([0, H.num_nodes, 1]), y)
    with pytest.raises(ValueError, match="`target`"):
        m.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1, L]))
    with pytest.raises(ValueError, match="Expected `target` to have 3 entries"):
        m.update(torch.tensor([0, 1, 2]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"Expected `preds` to have shape \(B,\) or \(\) \(node ids\)"):
        m.update(torch.zeros(3, 2, dtype=torch.long), y)
    with pytest.raises(TypeError, match="scores single nodes.*bool set"):
        m.update(torch.zeros(3, H.num_nodes, dtype=torch.bool), y)
    with pytest.raises(ValueError, match=rf"Expected `preds` to have shape \(B, {H.num_nodes}\)"):
        HierarchicalMetric(H, "hf_beta").update(torch.zeros(3, 5, dtype=torch.bool), y)
    with pytest.raises(TypeError, match="float scores, int64 node ids or bool node sets"):
        m.update(torch.zeros(3, dtype=torch.complex64), y)
    assert m.values == []  # nothing was kept from the failed updates


# --------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("exact", [True, False])
def test_compute_returns_the_scores_dtype_from_float64_sums(exact):
    probs, y = _batch(8, 24)
    td = hd.get_metric("wu_palmer", H)
    for dtype, want_dtype in ((torch.float32, torch.float32), (torch.float64, torch.float64),
                              (torch.float16, torch.float32), (torch.bfloat16, torch.float32)):
        x = probs.to(dtype)
        if dtype in (torch.float16, torch.bfloat16):
            x = x / x.float().sum(1, keepdim=True).to(dtype)  # rows that sum to 1 in half precision
        values = td(td.decode(x), y, dtype=torch.float64)
        m = HierarchicalMetric(H, "wu_palmer", exact=exact)
        with pytest.warns(UserWarning, match="called before the ``update``"):  # torchmetrics says so
            before = m.compute()
        assert torch.isnan(before) and before.dtype == torch.get_default_dtype()  # before any update
        for a, b in ((0, 5), (5, 6), (6, 24)):  # any split: the same bits
            m.update(x[a:b], y[a:b])
        got = m.compute()
        assert got.dtype == want_dtype, dtype
        if exact:
            assert _same(got, _mean(values, want_dtype)), dtype
        else:
            # a float64 sum in update order: equal up to float64 rounding before the cast
            rtol = max(torch.finfo(want_dtype).eps, 1e-12)
            assert torch.allclose(got.double(), values.mean(), rtol=rtol, atol=0), dtype
        m.reset()
        with pytest.warns(UserWarning, match="called before the ``update``"):
            assert m.compute().dtype == torch.get_default_dtype()


def test_update_together_hands_its_batch_to_the_members_without_the_thread_cache(monkeypatch):
    """update_together (the Lightning callback's path) checks and decodes once for its members and gives each
    the batch itself: the thread's shared batch is neither read nor replaced, and a member with other options
    checks its own."""
    import hdecode_torch.integrations.torchmetrics as tm

    probs, y = _batch(30, 12)
    members = [HierarchicalMetric(H, "tree_distance", decoder="majority"), HierarchicalMetric(H, "wu_palmer",
               decoder="majority"), HierarchicalMetric(H, "accuracy")]
    other = HierarchicalMetric(H, "tree_distance", decoder="majority", from_logits="auto")
    tm.release_shared_batch()
    calls = _count_decodes(monkeypatch)
    tm.update_together(members + [other], probs, y)
    assert sorted(calls) == ["accuracy", "majority", "majority"]  # one per decoder, and `other`'s own
    assert tm._local.batch.key[1] == "auto" and tm._local.batch.users == {id(other)}  # only `other` used the cache
    assert not hasattr(tm._local, "scope") and all(m._given_batch is None for m in members)
    for m in members + [other]:
        assert _same(m.values[0], _direct(m, probs, y)), m.name
    tm.release_shared_batch()
