"""Top-k inputs through the entry points: ``DecodingHead``, ``HierarchicalMetric`` and ``hdecode decode``
give the decision of the metric's top-k decode (the completed distribution's, equal by expected score to
the dense decoder on the completed table, and the dense answer bit for bit at k = L), and clear errors for
metrics without a top-k decoder and logits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from harness import bundled, model_like
from test_cli import run_cli_on_cpu
from testing import (ValuesOnlyMetric, assert_callback_scores_top_k, assert_top_k_under_gloo_equals_one_process,
                     top_k_module, validation_trainer)

CASES = [("accuracy", {}), ("lca_height", {}), ("tree_distance", {}), ("tree_distance_c", {"c": 0.5})]


def _probs(h, seed=0, dtype=torch.float64):
    rng = np.random.default_rng(seed)
    rows = np.concatenate([model_like(rng, h, 8, kind) for kind in ("peaked", "diffuse", "confused", "shallow")])
    return torch.tensor(rows, dtype=dtype)


def _same_expected(m, topk, pred, dense_pred):
    full = topk.completed(m.hierarchy.num_leaves, torch.float64)
    torch.testing.assert_close(m.expected(full, pred), m.expected(full, dense_pred), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name,params", CASES)
def test_decoding_head_decodes_top_k_lists(name, params):
    h, _ = bundled("inat19")
    probs = _probs(h)
    head = hd.DecodingHead(h, name, **params)
    m = hd.get_metric(name, h, **params)
    for k in (1, 10, 100):
        t = probs.topk(k)
        topk = hd.TopK(t.values, t.indices)
        pred = head(t)
        assert pred.dtype == torch.long and pred.shape == (probs.shape[0],)
        assert torch.equal(pred, m.decode(topk))
        assert torch.equal(head(topk), pred)
        _same_expected(m, topk, pred, head(topk.completed(h.num_leaves)))
    assert torch.equal(head(probs.topk(h.num_leaves)), head(probs))  # k = L: the dense answer bit for bit
    assert torch.equal(hd.DecodingHead(h, name, from_logits="auto", **params)(probs.topk(10)),
                       head(probs.topk(10)))
    assert head(probs[0].topk(10)).shape == ()  # one unbatched row


def test_decoding_head_refuses_what_it_cannot_decode_from_a_top_k_list():
    h, _ = bundled("inat19")
    t = _probs(h).topk(10)
    with pytest.raises(ValueError, match=r"from_logits=True.*top-k of the probabilities"):
        hd.DecodingHead(h, "tree_distance", from_logits=True)(t)
    with pytest.raises(ValueError, match=r"`values_only` does not decode top-k inputs"):
        hd.DecodingHead(h, ValuesOnlyMetric(h))(t)  # its decoder reads the dense (N, L) matrix of values
    with pytest.raises(ValueError, match=r"`values` to be non-negative"):
        hd.DecodingHead(h, "tree_distance")(torch.log(_probs(h)).topk(10))


@pytest.mark.parametrize("name,params", CASES)
def test_hierarchical_metric_updates_with_top_k_lists(name, params):
    h, _ = bundled("inat19")
    probs = _probs(h, seed=1)
    target = torch.randint(0, h.num_leaves, (probs.shape[0],), generator=torch.Generator().manual_seed(0))
    m = hd.get_metric(name, h, **params)
    for k in (10, h.num_leaves):
        t = probs.topk(k)
        ours = hd.HierarchicalMetric(h, name, **params)
        ours.update(t, target)
        ours.update(hd.TopK(t.values[:5], t.indices[:5]), target[:5])
        pred = m.decode(hd.TopK(t.values, t.indices))
        values = torch.cat([m(pred, target, dtype=torch.float64), m(pred[:5], target[:5], dtype=torch.float64)])
        assert ours.compute().dtype == torch.float64
        torch.testing.assert_close(ours.compute(), values.mean(), rtol=1e-12, atol=0)
        if k == h.num_leaves:  # the dense path's value bit for bit
            dense = hd.HierarchicalMetric(h, name, **params)
            dense.update(probs, target)
            dense.update(probs[:5], target[:5])
            assert torch.equal(ours.compute(), dense.compute())


def test_hierarchical_metric_refuses_what_it_cannot_decode_from_a_top_k_list():
    h, _ = bundled("inat19")
    t, target = _probs(h).topk(10), torch.zeros(32, dtype=torch.long)
    with pytest.raises(ValueError, match=r"`values_only` does not decode top-k inputs"):
        hd.HierarchicalMetric(h, ValuesOnlyMetric(h)).update(t, target)
    with pytest.raises(ValueError, match=r"from_logits=True"):
        hd.HierarchicalMetric(h, "lca_height", from_logits=True).update(t, target)
    with pytest.raises(ValueError, match=r"`target`"):
        hd.HierarchicalMetric(h, "lca_height").update(t, torch.full((32,), h.num_leaves))


@pytest.mark.parametrize("fmt", ["npz", "pt"])
def test_cli_decodes_a_top_k_file(tmp_path, capsys, fmt):
    h, _ = bundled("inat19")
    probs = _probs(h, seed=2, dtype=torch.float32)
    for k in (10, h.num_leaves):
        t = probs.topk(k)
        path = tmp_path / f"topk{k}.{fmt}"
        if fmt == "npz":
            np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
        else:
            torch.save({"values": t.values, "indices": t.indices}, path)
        for name, params in CASES:
            out = tmp_path / "pred.npy"
            extra = ["--c", params["c"]] if params else []
            code, _, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", path, "--metric", name, *extra,
                                 "--batch-size", 10, "-o", out], capsys)
            assert code == 0, err
            m = hd.get_metric(name, h, **params)
            want = m.decode(hd.TopK(t.values, t.indices))
            assert torch.equal(torch.from_numpy(np.load(out)), want), (name, k)
            if k == h.num_leaves:
                assert torch.equal(want, m.decode(probs))


def test_cli_refuses_what_it_cannot_decode_from_a_top_k_file(tmp_path, capsys):
    h, _ = bundled("inat19")
    t = _probs(h).topk(10)
    path = tmp_path / "topk.npz"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    base = ["decode", "--hierarchy", "inat19", "--probs", path]
    for extra, match in [(["--metric", "tree_distance", "--from-logits"], "--from-logits: --probs holds a top-k list"),
                         (["--metric", "tree_distance", "--normalize"], "--normalize: --probs holds a top-k list")]:
        code, _, err = run_cli_on_cpu(base + extra, capsys)
        assert code == 2 and match in err, err
    bad = tmp_path / "bad.npz"
    np.savez(bad, values=t.values.numpy())
    code, _, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", bad, "--metric", "tree_distance"], capsys)
    assert code == 2 and "expected a top-k list: the arrays 'values' (B, k) and 'indices' (B, k)" in err, err
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, values=t.values.numpy(), indices=t.indices.numpy() + h.num_leaves)
    code, _, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", wrong, "--metric", "tree_distance"], capsys)
    assert code != 0 and "`indices` to be leaf ids" in err, err


# --------------------------------------------------------------------------- certify=True at every entry point
def _certified(h, name, params, t):
    return hd.get_metric(name, h, **params).decode(hd.TopK(t.values, t.indices), certify=True)


def _same_triple(got, want):
    assert len(got) == 3 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert got[0].dtype == torch.long and got[1].dtype == torch.bool and got[2].dtype == torch.float64


@pytest.mark.parametrize("name,params", CASES)
def test_every_entry_point_certifies_as_the_metric_does(name, params):
    h, _ = bundled("inat19")
    probs = _probs(h, seed=3)
    head = hd.DecodingHead(h, name, certify=True, **params)
    for k in (1, 5, 50):
        t = probs.topk(k)
        want = _certified(h, name, params, t)
        assert 0 < int(want[1].sum()) < probs.shape[0] or k == 1 or name == "accuracy"
        _same_triple(getattr(hd.functional, f"decode_{name}")(t, h, certify=True, **params), want)
        _same_triple(hd.functional.decode(name, t, h, certify=True, **params), want)
        _same_triple(hd.functional.decode(name, hd.TopK(t.values, t.indices), h, certify=True, **params), want)
        _same_triple(head(t), want)
        assert torch.equal(getattr(hd.functional, f"decode_{name}")(t, h, **params), want[0])  # without: the ids
    one = head(probs[0].topk(10))
    assert [x.shape for x in one] == [(), (), ()]


def test_certify_is_refused_where_there_is_nothing_to_certify():
    h, _ = bundled("inat19")
    probs = _probs(h)
    t = probs.topk(10)
    F = hd.functional
    for call in (lambda: F.decode_tree_distance(probs, h, certify=True),
                 lambda: F.decode("lca_height", probs, h, certify=True),
                 lambda: hd.DecodingHead(h, "tree_distance", certify=True)(probs)):
        with pytest.raises(ValueError, match=r"`certify=True`.*dense"):
            call()
    for call in (lambda: F.decode_wu_palmer(t, h, certify=True), lambda: F.decode("hf_beta", t, h, certify=True),
                 lambda: F.decode_zhao(probs, h, certify=True), lambda: hd.DecodingHead(h, "jaccard", certify=True)):
        with pytest.raises(ValueError, match=r"Expected `certify` to be False for `(wu_palmer|hf_beta|zhao|jaccard)`, "
                                             r"which gives no certificate.*accuracy, lca_height, tree_distance, "
                                             r"tree_distance_c, hamming do"):
            call()
    with pytest.raises(ValueError, match=r"`certify` to be False for the decoder `darts`"):
        hd.DecodingHead(h, "tree_distance", decoder=("darts", {"lam": 0.5}), certify=True)
    with pytest.raises(ValueError, match=r"`certify` to be False with from_logits=True"):
        hd.DecodingHead(h, "tree_distance", from_logits=True, certify=True)
    with pytest.raises(ValueError, match=r"`certify` to be False with `cuda_graph=True`"):
        hd.DecodingHead(h, "tree_distance", cuda_graph=True, certify=True)
    with pytest.raises(ValueError, match=r"`certify=True` cannot be exported"):
        hd.DecodingHead(h, "tree_distance", certify=True).export(probs)
    with pytest.raises(TypeError, match=r"`certify` to be a bool"):
        F.decode_accuracy(t, h, certify=1)
    with pytest.raises(ValueError, match=r"from_logits and normalize do not apply"):
        F.decode_accuracy(t, h, from_logits=True, certify=True)


def _read_certificate(path, fmt):
    import csv
    import json

    if fmt == "npz":
        z = np.load(path)
        return torch.from_numpy(z["pred"]), torch.from_numpy(z["certified"]), torch.from_numpy(z["regret_bound"])
    if fmt == "pt":
        d = torch.load(path)
        return d["pred"], d["certified"], d["regret_bound"]
    if fmt == "csv":
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["node", "certified", "regret_bound"]
        rows = rows[1:]
    elif fmt == "jsonl":
        recs = [json.loads(line) for line in open(path)]
        rows = [[r["node"], r["certified"], r["regret_bound"]] for r in recs]
    else:  # the lines of stdout
        rows = [line.split("\t") for line in path.splitlines()]
    cert = [c if isinstance(c, bool) else {"true": True, "false": False}[c] for _, c, _ in rows]
    return (torch.tensor([int(n) for n, _, _ in rows]), torch.tensor(cert, dtype=torch.bool),
            torch.tensor([float(b) for _, _, b in rows], dtype=torch.float64))


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "npz", "pt", "stdout"])
def test_cli_writes_the_certificate_next_to_each_decision(tmp_path, capsys, fmt):
    h, _ = bundled("inat19")
    probs = _probs(h, seed=4)
    t = probs.topk(20)
    path = tmp_path / "topk.npz"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    for name, params in CASES:
        out = tmp_path / f"pred.{fmt}"
        extra = ["--c", params["c"]] if params else []
        where = [] if fmt == "stdout" else ["-o", out]
        code, stdout, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", path, "--metric", name, *extra,
                                  "--batch-size", 7, "--certify", *where], capsys)
        assert code == 0, err
        want = _certified(h, name, params, t)
        got = _read_certificate(stdout if fmt == "stdout" else out, fmt)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (name, fmt)
        n, done = probs.shape[0], int(want[1].sum())
        summary = (f"{name}{'[c=0.5]' if params else ''}/optimal: {done} of {n} rows certified ({done / n:.1%}); "
                   f"mean regret bound {float(want[2].mean()):.4g}")
        assert summary in err, err


def test_cli_refuses_certify_where_there_is_nothing_to_certify(tmp_path, capsys):
    h, _ = bundled("inat19")
    probs = _probs(h)
    t = probs.topk(10)
    path, dense = tmp_path / "topk.npz", tmp_path / "dense.npy"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    np.save(dense, probs.numpy())
    base = ["decode", "--hierarchy", "inat19", "--certify"]
    for extra, match in [
            (["--probs", dense, "--metric", "tree_distance"], "--certify: --probs holds dense (B, L) probabilities"),
            (["--probs", path, "--decoder", "darts"], "--certify: certificates are of a --metric's optimal decisions"),
            (["--probs", path, "--metric", "tree_distance", "-o", tmp_path / "p.npy"],
             "--certify: a .npy file holds one array")]:
        code, _, err = run_cli_on_cpu(base + extra, capsys)
        assert code == 2 and match in err, err
    assert not (tmp_path / "p.npy").exists()


# --------------------------------------------------------------------------- hdecode compare on top-k lists
def _compare_json(tmp_path, capsys, probs_path, targets_path, *extra, name="c.json"):
    import json

    out = tmp_path / name
    code, stdout, err = run_cli_on_cpu(["compare", "--hierarchy", "inat19", "--probs", probs_path, "--targets", targets_path,
                              "--batch-size", 64, "--json", out, *extra], capsys)
    assert code == 0, err
    return json.loads(out.read_text())["results"], stdout


def test_cli_compare_runs_what_decodes_top_k_lists_and_names_the_rest(tmp_path, capsys):
    h, _ = bundled("inat19")
    probs = _probs(h, seed=5)
    g = torch.Generator().manual_seed(1)
    y = torch.multinomial(probs, 1, generator=g)[:, 0]
    np.save(tmp_path / "y.npy", y.numpy())
    dense_path = tmp_path / "dense.npy"
    np.save(dense_path, probs.numpy())
    dense, _ = _compare_json(tmp_path, capsys, dense_path, tmp_path / "y.npy", name="dense.json")
    for k in (10, h.num_leaves):
        t = probs.topk(k)
        path = tmp_path / f"topk{k}.npz"
        np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
        res, stdout = _compare_json(tmp_path, capsys, path, tmp_path / "y.npy")
        topk = hd.TopK(t.values, t.indices)
        na = res["not_applicable"]
        assert ("not applicable:" in stdout) == bool(na)  # every built-in metric and heuristic decodes lists now
        heuristics = [key for key in dense["metrics"]["accuracy"] if key not in ("higher_is_better", "optimal")]
        for key in dense["metrics"]:
            m = hd.get_metric(key, h)
            if m.accepts_topk:
                assert key not in na
                want = m(m.decode(topk), y, dtype=torch.float64).mean().item()
                assert res["metrics"][key]["optimal"] == pytest.approx(want, rel=1e-12, abs=1e-12), key
                if k == h.num_leaves:  # the dense run's value bit for bit
                    assert res["metrics"][key]["optimal"] == dense["metrics"][key]["optimal"], key
            else:
                assert key in na or (f"{key}/optimal" in na and res["metrics"][key]["optimal"] is None), key
        for key in heuristics:
            d = hd.get_decoder(key, h)
            try:
                pred = d.decode(topk)
            except ValueError:  # a heuristic without a top-k rule: left out, named
                assert key in na and key not in res["metrics"]["accuracy"], key
                continue
            assert key not in na
            m = hd.get_metric("tree_distance", h)
            assert res["metrics"]["tree_distance"][key] == pytest.approx(
                m(pred, y, dtype=torch.float64).mean().item(), rel=1e-12, abs=1e-12)
        if not any(key in res["metrics"]["accuracy"] for key in heuristics):  # no heuristic ran: their rows go
            refusing = {key for key in dense["metrics"] if not hd.get_metric(key, h).accepts_topk}
            assert refusing <= set(na) and not refusing & set(res["metrics"])


def test_cli_compare_refuses_what_needs_every_leaf_on_top_k_lists(tmp_path, capsys):
    h, _ = bundled("inat19")
    probs = _probs(h)
    t = probs.topk(10)
    path = tmp_path / "topk.npz"
    np.savez(path, values=t.values.numpy(), indices=t.indices.numpy())
    np.save(tmp_path / "y.npy", np.zeros(probs.shape[0], dtype=np.int64))
    base = ["compare", "--hierarchy", "inat19", "--probs", path, "--targets", tmp_path / "y.npy"]
    for extra, match in [(["--from-logits"], "--from-logits: --probs holds top-k lists"),
                         (["--normalize"], "--normalize: --probs holds top-k lists")]:
        code, _, err = run_cli_on_cpu(base + extra, capsys)
        assert code == 2 and match in err, err


# --------------------------------------------------------------------------- the Lightning callback
def test_lightning_callback_scores_top_k_lists(tmp_path):
    pytest.importorskip("pytorch_lightning")
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    h, _ = bundled("inat19")
    x, y, loader = assert_callback_scores_top_k(h, [name for name, _ in CASES[:3]] + [CASES[3]], CASES)
    with torch.no_grad():
        probs = top_k_module(h, h.num_leaves).probs(x)
    logits_cb = HierarchicalMetricsCallback(h, metrics=["accuracy"], output_key="logits")
    with pytest.raises(ValueError, match=r"top-k list: the missing mass of a top-k of logits is unknown"):
        logits_cb._check_contract(probs.topk(5), y, "validate")
    bad = HierarchicalMetricsCallback(h, metrics=["accuracy"], output_key="probs")
    with pytest.raises(ValueError, match=r"HierarchicalMetricsCallback, validation batch 0: .*`indices`"):
        validation_trainer([bad], num_sanity_val_steps=0).validate(top_k_module(h, 5, index_offset=h.num_leaves),
                                                                   loader, verbose=False)


# --------------------------------------------------------------------------- HierarchicalMetric under DDP
def test_hierarchical_metric_on_top_k_lists_under_gloo_equals_one_process(tmp_path):
    h, _ = bundled("inat19")
    target = torch.randint(0, h.num_leaves, (32,), generator=torch.Generator().manual_seed(2))
    assert_top_k_under_gloo_equals_one_process(tmp_path, "inat19", _probs(h, seed=6), target, CASES)


def test_cli_decode_writes_npz_without_certify(tmp_path, capsys):
    """.npz, the format that holds a certificate next to the decisions, also takes plain decisions (array 'pred')."""
    h, _ = bundled("inat19")
    probs = _probs(h)
    dense, lists = tmp_path / "dense.npy", tmp_path / "topk.npz"
    np.save(dense, probs.numpy())
    t = probs.topk(10)
    np.savez(lists, values=t.values.numpy(), indices=t.indices.numpy())
    m = hd.get_metric("tree_distance", h)
    for src, want in ((dense, m.decode(probs)), (lists, m.decode(t))):
        out = tmp_path / "pred.npz"
        code, _, err = run_cli_on_cpu(["decode", "--hierarchy", "inat19", "--probs", src, "--metric", "tree_distance",
                             "-o", out], capsys)
        assert code == 0, err
        z = np.load(out)
        assert list(z.files) == ["pred"] and torch.equal(torch.from_numpy(z["pred"]), want)
