"""The ``hdecode`` command line: every subcommand through ``main([...])``, small sizes."""

from __future__ import annotations

import csv
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.cli.common import default_info_threshold
from hdecode_torch.cli.compare import render_table
from hdecode_torch.cli.evaluation import evaluate
from hdecode_torch.cli.main import main
from hdecode_torch.cli.plot import agreement_mask, simplex_grid, three_leaf_tree
from hdecode_torch.synthetic import synthetic_outputs

ALL_METRIC_KEYS = ["accuracy", "lca_height", "tree_distance", "tree_distance_c[c=0.5]", "wu_palmer", "zhao",
                   "hf_beta[beta=0.5]", "hf_beta[beta=1]", "hf_beta[beta=2]", "hamming", "jaccard"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The CLI runs single-threaded by default (--threads 1); direct library calls here do the same,
    # so that a busy 2-core machine does not slow them down by oversubscription.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiered():
    return hd.load_hierarchy("tieredimagenet-h")


@pytest.fixture(scope="module")
def compare_json(tmp_path_factory):
    """One small default-settings run shared by the structure and optimality tests."""
    path = tmp_path_factory.mktemp("compare") / "out.json"
    assert main(["compare", "--num-samples", "3000", "--noise", "1.0", "--seed", "4", "--json", str(path),
                 "--no-progress"]) == 0
    with open(path) as f:
        return json.load(f)


def small_tree_csv(tmp_path) -> str:
    """An edge list with a single-child chain and leaves at different depths; sorted leaf names a..e."""
    path = tmp_path / "tree.csv"
    path.write_text("parent,child\nroot,x\nroot,y\nroot,e\nx,a\nx,b\ny,z\nz,c\nz,d\n")
    return str(path)


def png_size(path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG file"
    return struct.unpack(">II", head[16:24])


# --------------------------------------------------------------------------- help and info
@pytest.mark.parametrize("argv", [[], ["compare"], ["decode"], ["plot"], ["plot", "agreement"], ["plot", "gain"],
                                  ["info"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: hdecode" in out


def test_no_command_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2


def test_info(tmp_path, capsys):
    assert main(["info"]) == 0
    assert "num_leaves" in capsys.readouterr().out
    assert main(["info", small_tree_csv(tmp_path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["num_leaves"] == 5 and stats["num_single_child_nodes"] == 1
    assert stats["single_child_chains"] == 1 and stats["longest_single_child_chain"] == 1
    assert main(["info", "inat19", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["num_single_child_nodes"] == 77 and stats["longest_single_child_chain"] >= 1


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "hdecode_torch", "info", "--json"], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout)["num_nodes"] == 843


# --------------------------------------------------------------------------- compare
def test_compare_json_structure(compare_json):
    assert set(compare_json) >= {"metrics", "setting", "stderr", "paired_stderr", "best"}
    assert list(compare_json["metrics"]) == ALL_METRIC_KEYS
    decoders = ["optimal", "argmax_leaf", "top_down", "confidence_threshold[tau=0.8]", "majority", "plurality",
                "darts[lam=1]", "expected_information", "information_threshold[threshold=3.21]", "hie", "crm"]
    for key, row in compare_json["metrics"].items():
        assert isinstance(row["higher_is_better"], bool)
        assert [k for k in row if k != "higher_is_better"] == decoders
        assert set(compare_json["stderr"][key]) == set(decoders)
        for dec in decoders:
            if key == "jaccard" and dec == "optimal":
                assert row[dec] is None and compare_json["stderr"][key][dec] is None
            else:
                assert math.isfinite(row[dec]) and compare_json["stderr"][key][dec] >= 0
    assert compare_json["metrics"]["accuracy"]["higher_is_better"] is True
    assert compare_json["metrics"]["tree_distance"]["higher_is_better"] is False
    s = compare_json["setting"]
    assert s["source"] == "synthetic" and s["noise"] == 1.0 and s["seed"] == 4 and s["num_samples"] == 3000
    assert s["hierarchy"] == "tieredimagenet-h" and s["num_leaves"] == 608


def test_compare_optimal_is_best_up_to_noise(compare_json):
    """Calibrated outputs: each metric's optimal decoder beats every heuristic, up to 3 paired standard errors."""
    for key, row in compare_json["metrics"].items():
        if row["optimal"] is None:
            continue
        assert compare_json["paired_stderr"][key]["reference"] == "optimal"
        sign = 1.0 if row["higher_is_better"] else -1.0
        for dec, value in row.items():
            if dec in ("higher_is_better", "optimal"):
                continue
            se = compare_json["paired_stderr"][key][dec]
            assert sign * (row["optimal"] - value) >= -3 * se - 1e-12, (key, dec, row["optimal"], value, se)
    # Known identities: crm is the optimal lca_height decoder, majority the optimal tree_distance decoder.
    assert compare_json["metrics"]["lca_height"]["crm"] == compare_json["metrics"]["lca_height"]["optimal"]
    assert compare_json["metrics"]["tree_distance"]["majority"] == compare_json["metrics"]["tree_distance"]["optimal"]
    assert compare_json["metrics"]["accuracy"]["argmax_leaf"] == compare_json["metrics"]["accuracy"]["optimal"]


def test_compare_json_matches_library(compare_json, tiered):
    probs, y = synthetic_outputs(tiered, 3000, 1.0, seed=4)
    td = hd.get_metric("tree_distance", tiered)
    direct = td(td.decode(probs), y)
    assert compare_json["metrics"]["tree_distance"]["optimal"] == pytest.approx(float(direct.mean()), abs=1e-9)
    assert compare_json["stderr"]["tree_distance"]["optimal"] == pytest.approx(
        float(direct.std() / math.sqrt(len(direct))), rel=1e-6)
    hf = hd.get_metric("hf_beta", tiered, beta=0.5)
    darts = hd.get_decoder("darts", tiered, lam=1.0)
    value = float(hf(darts.decode(probs), y).mean())  # a node scored as its ancestor set
    assert compare_json["metrics"]["hf_beta[beta=0.5]"]["darts[lam=1]"] == pytest.approx(value, abs=1e-9)
    ham = hd.get_metric("hamming", tiered)
    assert compare_json["metrics"]["hamming"]["optimal"] == pytest.approx(float(ham(ham.decode(probs), y).mean()),
                                                                          abs=1e-9)


def test_compare_prints_one_table(capsys):
    assert main(["compare", "--num-samples", "500", "--metrics", "tree_distance,hf_beta", "--betas", "1",
                 "--decoders", "argmax_leaf", "majority", "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = [ln for ln in lines if ln.startswith("decoder ")]
    assert len(header) == 1 and "tree_dist" in header[0] and "hF1" in header[0]
    rows = {ln.split()[0]: ln for ln in lines if ln.split() and ln.split()[0] in ("optimal", "argmax_leaf", "majority")}
    assert set(rows) == {"optimal", "argmax_leaf", "majority"}
    assert "±" in rows["optimal"] and "*" in rows["optimal"]
    assert "gain of optimal" in out


def test_compare_files_match_library(tmp_path, capsys):
    tree = small_tree_csv(tmp_path)
    h = hd.Hierarchy.from_edges(tree)
    probs, y = synthetic_outputs(h, 400, 0.8, seed=1, dtype=torch.float64)
    logits = probs.log() + 3.0  # softmax(logits) == probs
    np.save(tmp_path / "logits.npy", logits.numpy())
    torch.save(probs, tmp_path / "probs.pt")
    np.savetxt(tmp_path / "y.txt", y.numpy(), fmt="%d")
    with open(tmp_path / "probs.csv", "w") as f:
        f.write(",".join(f"p{i}" for i in range(h.num_leaves)) + "\n")
        np.savetxt(f, probs.numpy(), delimiter=",", fmt="%.17g")
    results = []
    for extra in (["--probs", str(tmp_path / "logits.npy"), "--from-logits"],
                  ["--probs", str(tmp_path / "probs.pt")], ["--probs", str(tmp_path / "probs.csv")]):
        out = tmp_path / f"r{len(results)}.json"
        assert main(["compare", "--hierarchy", tree, "--targets", str(tmp_path / "y.txt"), "--json", str(out),
                     "--no-progress", "--batch-size", "128", *extra]) == 0
        results.append(json.loads(out.read_text()))
    wp = hd.get_metric("wu_palmer", h)
    direct = float(wp(wp.decode(probs), y).mean())
    thr = default_info_threshold(h)
    it = hd.get_decoder("information_threshold", h, threshold=thr)
    direct_it = float(wp(it.decode(probs), y).mean())
    for r in results:
        assert r["setting"]["source"] == "files" and r["setting"]["num_samples"] == 400
        assert r["metrics"]["wu_palmer"]["optimal"] == pytest.approx(direct, abs=1e-6)
        assert r["metrics"]["wu_palmer"][f"information_threshold[threshold={thr:g}]"] == pytest.approx(direct_it, abs=1e-6)
    capsys.readouterr()


def test_render_table_wraps_to_width(compare_json, tiered):
    probs, y = synthetic_outputs(tiered, 300, 1.0, seed=0)
    metrics = [hd.get_metric("wu_palmer", tiered), hd.get_metric("jaccard", tiered),
               hd.get_metric("hf_beta", tiered, beta=2.0)]
    decoders = [hd.get_decoder("argmax_leaf", tiered), hd.get_decoder("plurality", tiered)]
    ev = evaluate(tiered, probs, y, metrics, decoders, batch_size=100)
    wide = render_table(ev)
    narrow = render_table(ev, width=60)
    assert "n/a" in wide  # jaccard has no optimal decoder
    assert max(len(ln) for ln in narrow.splitlines()) <= 60
    assert narrow.count("decoder ") == 3 and wide.count("decoder ") == 1
    colored = render_table(ev, color=True)
    assert "\033[1m" in colored


def test_evaluate_batching_is_exact(tiered):
    probs, y = synthetic_outputs(tiered, 500, 1.0, seed=3, dtype=torch.float64)
    metrics = [hd.get_metric("zhao", tiered), hd.get_metric("hamming", tiered)]
    decoders = [hd.get_decoder("top_down", tiered), hd.get_decoder("hie", tiered)]
    a = evaluate(tiered, probs, y, metrics, decoders, batch_size=500)
    b = evaluate(tiered, probs, y, metrics, decoders, batch_size=77)
    assert torch.allclose(a.mean, b.mean, atol=1e-12)
    assert torch.allclose(a.stderr, b.stderr, atol=1e-12)
    assert torch.allclose(a.paired_stderr, b.paired_stderr, atol=1e-12)
    z = hd.get_metric("zhao", tiered)
    diff = z(z.decode(probs), y) - z(decoders[0].decode(probs), y)
    assert float(a.paired_stderr[0, 0, 1]) == pytest.approx(float(diff.std() / math.sqrt(500)), rel=1e-9)


@pytest.mark.parametrize("argv, message", [
    (["--probs", "{d}/p.npy"], "--targets"),
    (["--targets", "{d}/y.npy"], "--probs"),
    (["--probs", "{d}/missing.npy", "--targets", "{d}/y.npy"], "no such file"),
    (["--probs", "{d}/bad_shape.npy", "--targets", "{d}/y.npy"], "shape"),
    (["--probs", "{d}/p.npy", "--targets", "{d}/y_short.npy"], "targets"),
    (["--probs", "{d}/p.npy", "--targets", "{d}/y_range.npy"], "0..607"),
    (["--probs", "{d}/p.npy", "--targets", "{d}/y_float.npy"], "integer"),
    (["--probs", "{d}/not_normalized.npy", "--targets", "{d}/y.npy"], "normalize"),
    (["--probs", "{d}/p.xyz", "--targets", "{d}/y.npy"], "unknown format"),
    (["--probs", "{d}/p.npy", "--targets", "{d}/y.npy", "--noise", "2"], "synthetic"),
    (["--metrics", "nope"], "unknown metric"),
    (["--decoders", "nope"], "unknown decoder"),
    (["--hierarchy", "no_such_tree"], "neither a bundled tree"),
    (["--noise", "-1"], "--noise"),
    (["--tau", "1.5"], "tau"),
])
def test_compare_errors(tmp_path, capsys, argv, message):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(608), size=10)
    np.save(tmp_path / "p.npy", p)
    (tmp_path / "p.xyz").write_text("1")
    np.save(tmp_path / "bad_shape.npy", p[:, :100])
    np.save(tmp_path / "not_normalized.npy", p * 2)
    np.save(tmp_path / "y.npy", np.arange(10))
    np.save(tmp_path / "y_short.npy", np.arange(9))
    np.save(tmp_path / "y_range.npy", np.arange(10) + 600)
    np.save(tmp_path / "y_float.npy", np.arange(10) + 0.5)
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(["compare", "--num-samples", "20", "--no-progress", *argv] if "--probs" not in argv and
                "--targets" not in argv and "--noise" not in argv else ["compare", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hdecode compare: error:") and message in err, err


# --------------------------------------------------------------------------- decode
def _write_probs(path, probs: torch.Tensor) -> None:
    ext = os.path.splitext(path)[1]
    if ext == ".npy":
        np.save(path, probs.numpy())
    elif ext == ".pt":
        torch.save(probs, path)
    else:
        np.savetxt(path, probs.numpy(), delimiter=",", fmt="%.17g")


def _read_pred(path, h, is_set: bool):
    ext = os.path.splitext(path)[1]
    if ext == ".npy":
        return torch.from_numpy(np.load(path))
    if ext == ".pt":
        return torch.load(path, weights_only=True)
    if ext == ".csv":
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == (["nodes"] if is_set else ["node"])
        items = [r[0] for r in rows[1:]]
        if not is_set:
            return torch.tensor([int(x) for x in items])
        lists = [[int(v) for v in x.split(";")] for x in items]
    else:
        recs = [json.loads(ln) for ln in open(path)]
        if not is_set:
            return torch.tensor([r["node"] for r in recs])
        lists = [r["nodes"] for r in recs]
    out = torch.zeros(len(lists), h.num_nodes, dtype=torch.bool)
    for i, ids in enumerate(lists):
        out[i, ids] = True
        # listed root first, by depth
        assert [int(h.depth[n]) for n in ids] == sorted(int(h.depth[n]) for n in ids)
    return out


DECODE_CASES = [
    (["--metric", "wu_palmer"], lambda h: hd.get_metric("wu_palmer", h).decode, False),
    (["--metric", "hf_beta", "--beta", "2"], lambda h: hd.get_metric("hf_beta", h, beta=2.0).decode, True),
    (["--decoder", "darts", "--lam", "0.5"], lambda h: hd.get_decoder("darts", h, lam=0.5).decode, False),
]
ROUND_TRIPS = [(".npy", o) for o in (".npy", ".pt", ".csv", ".jsonl")] + [(".pt", ".npy"), (".csv", ".jsonl")]


@pytest.mark.parametrize("in_ext, out_ext", ROUND_TRIPS)
@pytest.mark.parametrize("args, library, is_set", DECODE_CASES, ids=["wu_palmer", "hf_beta2", "darts"])
def test_decode_round_trip(tmp_path, tiered, in_ext, out_ext, args, library, is_set):
    probs, _ = synthetic_outputs(tiered, 37, 1.2, seed=9, dtype=torch.float64)
    src = str(tmp_path / f"probs{in_ext}")
    dst = str(tmp_path / f"pred{out_ext}")
    _write_probs(src, probs)
    assert main(["decode", "--probs", src, *args, "--output", dst, "--batch-size", "10"]) == 0
    got = _read_pred(dst, tiered, is_set)
    want = library(tiered)(probs)
    assert got.dtype == want.dtype and torch.equal(got, want)


def test_decode_from_logits_and_custom_tree(tmp_path, capsys):
    tree = small_tree_csv(tmp_path)
    h = hd.Hierarchy.from_edges(tree)
    logits = torch.randn(6, h.num_leaves, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    np.save(tmp_path / "logits.npy", logits.numpy())
    assert main(["decode", "--hierarchy", tree, "--probs", str(tmp_path / "logits.npy"), "--from-logits",
                 "--metric", "zhao"]) == 0
    lines = capsys.readouterr().out.split()
    assert [int(x) for x in lines] == hd.get_metric("zhao", h).decode(torch.softmax(logits, 1)).tolist()
    assert main(["decode", "--hierarchy", tree, "--probs", str(tmp_path / "logits.npy"), "--from-logits",
                 "--metric", "zhao", "--names"]) == 0
    names = capsys.readouterr().out.split()
    assert names == [h.label(n) for n in hd.get_metric("zhao", h).decode(torch.softmax(logits, 1)).tolist()]


def test_decode_names_outputs(tmp_path, tiered, capsys):
    probs, _ = synthetic_outputs(tiered, 5, 1.0, seed=0)
    np.save(tmp_path / "p.npy", probs.numpy())
    assert main(["decode", "--probs", str(tmp_path / "p.npy"), "--metric", "hamming", "--names",
                 "--output", str(tmp_path / "s.jsonl")]) == 0
    recs = [json.loads(ln) for ln in open(tmp_path / "s.jsonl")]
    want = hd.get_metric("hamming", tiered).decode(probs)
    for rec, row in zip(recs, want):
        assert sorted(rec["nodes"]) == row.nonzero().flatten().tolist()
        assert rec["names"] == [tiered.label(n) for n in rec["nodes"]]
        assert rec["names"][0] == tiered.label(tiered.root)
    assert main(["decode", "--probs", str(tmp_path / "p.npy"), "--decoder", "plurality", "--names",
                 "--output", str(tmp_path / "n.csv")]) == 0
    with open(tmp_path / "n.csv", newline="") as f:
        rows = list(csv.reader(f))
    pred = hd.get_decoder("plurality", tiered).decode(probs)
    assert rows == [["name"]] + [[tiered.label(n)] for n in pred.tolist()]


@pytest.mark.parametrize("argv, message", [
    (["--metric", "jaccard"], "No Bayes-optimal decoder"),
    (["--metric", "nope"], "unknown metric"),
    (["--decoder", "nope"], "unknown decoder"),
    (["--decoder", "information_threshold", "--info-threshold", "100"], "threshold"),
    (["--metric", "hf_beta", "--beta", "0"], "beta"),
    (["--metric", "zhao", "--output", "{d}/x.npy", "--names"], "--names"),
    (["--metric", "zhao", "--output", "{d}/x.txt"], "unknown format"),
    (["--metric", "zhao", "--hierarchy", "inat19"], "shape"),
])
def test_decode_errors(tmp_path, capsys, argv, message):
    np.save(tmp_path / "p.npy", np.full((3, 608), 1 / 608))
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(["decode", "--probs", str(tmp_path / "p.npy"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hdecode decode: error:") and message in err, err


def test_decode_requires_metric_or_decoder(tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["decode", "--probs", "x.npy"])
    assert exc.value.code == 2


# --------------------------------------------------------------------------- plot
def test_simplex_grid():
    points, tris = simplex_grid(10)
    assert points.shape == (66, 3) and tris.shape == (100, 3)
    assert torch.allclose(points.sum(1), torch.ones(66, dtype=torch.float64))
    assert int(tris.min()) == 0 and int(tris.max()) == 65


def test_agreement_mask_identities():
    h = three_leaf_tree()
    grid, _ = simplex_grid(40)
    assert agreement_mask(h, hd.get_metric("tree_distance", h), hd.get_decoder("majority", h), grid).all()
    assert agreement_mask(h, hd.get_metric("lca_height", h), hd.get_decoder("crm", h), grid).all()
    hf1 = agreement_mask(h, hd.get_metric("hf_beta", h, beta=1.0), hd.get_decoder("majority", h), grid)
    assert 0.05 < float(hf1.double().mean()) < 0.95  # the paper's Fig. 2: they disagree on part of the simplex


def test_plot_agreement(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "agreement.png"
    assert main(["plot", "agreement", "--metric", "hf_beta", "--beta", "1", "--heuristic", "majority",
                 "--resolution", "40", "--output", str(out)]) == 0
    w, h = png_size(out)
    assert w > 300 and h > 300 and out.stat().st_size > 10_000
    out2 = tmp_path / "all.png"
    assert main(["plot", "agreement", "--metric", "wu_palmer", "--heuristic", "all", "--resolution", "20",
                 "--output", str(out2)]) == 0
    assert png_size(out2)[0] > w


def test_plot_gain(tmp_path):
    pytest.importorskip("matplotlib")
    out, js = tmp_path / "gain.png", tmp_path / "gain.json"
    assert main(["plot", "gain", "--metrics", "tree_distance,wu_palmer", "--decoders", "argmax_leaf,majority",
                 "--noise", "0.5", "2", "--seeds", "2", "--num-samples", "300", "--output", str(out),
                 "--json", str(js), "--no-progress"]) == 0
    w, h = png_size(out)
    assert w > 400 and h > 200 and out.stat().st_size > 10_000
    data = json.loads(js.read_text())
    assert data["noise"] == [0.5, 2.0] and set(data["gain_percent"]) == {"tree_distance", "wu_palmer"}
    td = data["gain_percent"]["tree_distance"]
    assert td["majority"]["mean"] == [0.0, 0.0]  # majority is the optimal tree-distance decoder
    assert td["argmax_leaf"]["mean"][1] > td["argmax_leaf"]["mean"][0] > 0  # the gain grows with noise
    assert len(td["argmax_leaf"]["ci95_halfwidth"]) == 2


@pytest.mark.parametrize("argv, message", [
    (["agreement", "--metric", "jaccard", "--output", "{d}/a.png"], "No Bayes-optimal decoder"),
    (["agreement", "--heuristic", "nope", "--output", "{d}/a.png"], "unknown decoder"),
    (["agreement", "--resolution", "1", "--output", "{d}/a.png"], "--resolution"),
    (["gain", "--metrics", "jaccard", "--output", "{d}/g.png"], "jaccard"),
    (["gain", "--seeds", "0", "--output", "{d}/g.png"], "--seeds"),
    (["gain", "--noise", "0", "--output", "{d}/g.png"], "--noise"),
])
def test_plot_errors(tmp_path, capsys, argv, message):
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    assert main(["plot", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hdecode plot: error:") and message in err, err


def test_plot_without_matplotlib(tmp_path, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    assert main(["plot", "agreement", "--output", str(tmp_path / "a.png")]) == 2
    assert "pip install 'hdecode_torch[plot]'" in capsys.readouterr().err
