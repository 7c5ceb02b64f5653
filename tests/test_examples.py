"""Each example runs at a small size and its printed/returned values check out against direct computation."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import hdecode_torch as hd

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(name, *args, timeout=120):
    """Run an example as a user does: its own process, Python's default warning filters (what a user
    sees), and no warning may be printed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, str(EXAMPLES / f"{name}.py"), "--threads", "1", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not re.search(r"Warning\b", proc.stderr + proc.stdout), proc.stderr[-3000:]
    return proc.stdout, proc.stderr


@pytest.mark.plan_independent
def test_decoding_head_example(tmp_path):
    out = tmp_path / "head.json"
    stdout, _ = _run("decoding_head", "--samples", 1500, "--test-samples", 200, "--epochs", 2, "--show", 3,
                     "--json", out)
    res = json.loads(out.read_text())
    assert set(res["results"]) == {"accuracy", "tree_distance", "wu_palmer", "zhao", "hf_beta[beta=0.5]", "hamming"}
    for key, r in res["results"].items():
        # The head's predictions are Bayes-optimal under the model's posterior: never worse in expectation.
        sign = 1 if r["higher_is_better"] else -1
        assert sign * (r["expected_optimal"] - r["expected_argmax_leaf"]) >= -1e-6, key
        assert len(res["shown"][key]) == 3
    acc = res["results"]["accuracy"]
    assert acc["test_optimal"] == acc["test_argmax_leaf"] == pytest.approx(res["test_top1"])
    td = res["results"]["tree_distance"]
    assert td["expected_optimal"] < td["expected_argmax_leaf"]  # an uncertain model: internal nodes pay off
    assert "least confident" in stdout and "hf_beta[beta=0.5]" in stdout
    # Training says what it does as it goes: one line per epoch, with its loss, before the results.
    epochs = [ln for ln in stdout.splitlines() if ln.strip().startswith("epoch ")]
    assert [ln.split(":")[0].strip() for ln in epochs] == ["epoch 1/2", "epoch 2/2"]
    losses = [float(ln.split("training loss ")[1].split()[0]) for ln in epochs]
    assert losses[1] < losses[0]
    assert stdout.index("epoch 2/2") < stdout.index("decoding the 200 test samples") < stdout.index("least confident")
    # The printed table is the JSON's values, rounded.
    for key, r in res["results"].items():
        row = next(ln.split() for ln in stdout.splitlines() if ln.split()[:1] == [key])
        assert row[1] == ("+" if r["higher_is_better"] else "-")
        assert [float(x) for x in row[2:]] == [round(r[k], 4) for k in ("test_optimal", "test_argmax_leaf",
                                                                         "expected_optimal", "expected_argmax_leaf")]


@pytest.mark.plan_independent
def test_batch_inference_example(tmp_path):
    preds, timings = tmp_path / "preds.npz", tmp_path / "t.json"
    stdout, stderr = _run("batch_inference", "--samples", 2500, "--chunk-size", 1000, "--device", "cpu",
                          "--metrics", "tree_distance", "wu_palmer", "hf_beta[beta=0.5]", "--output", preds, "--json",
                          timings)
    info = json.loads(timings.read_text())
    assert info["rows"] == 2500 and info["device"] == "cpu" and info["rows_per_second"] > 0
    assert set(info["timing"]) == {"copy+check", "node sums", "tree_distance", "wu_palmer", "hf_beta[beta=0.5]"}
    assert "rows/s" in stdout
    # Progress on standard error, stage by stage and chunk by chunk (the default run was silent for 54 s).
    lines = stderr.splitlines()
    assert lines[0] == "drawing 2,500 synthetic rows of 608 leaves" and lines[1].startswith("warm-up on one row")
    assert [ln.split(":")[0] for ln in lines[2:]] == ["chunk 1/3 done", "chunk 2/3 done", "chunk 3/3 done"]
    assert lines[-1].startswith("chunk 3/3 done: 2,500 of 2,500 rows in ")
    # Chunked predictions equal one whole-array decode of the same synthetic probabilities.
    h = hd.load_hierarchy("tieredimagenet-h")
    probs = torch.from_numpy(_load("batch_inference").synthetic_probabilities(h.num_leaves, 2500, 0.25, 0))
    saved = np.load(preds)
    assert np.array_equal(saved["tree_distance"], hd.get_metric("tree_distance", h).decode(probs).numpy())
    assert np.array_equal(saved["wu_palmer"], hd.get_metric("wu_palmer", h).decode(probs).numpy())
    sets = np.unpackbits(saved["hf_beta(beta=0.5)"], axis=1, count=h.num_nodes).astype(bool)
    assert np.array_equal(sets, hd.get_metric("hf_beta", h, beta=0.5).decode(probs).numpy())


def test_batch_inference_in_process_chunking_is_invisible():
    mod = _load("batch_inference")
    a = mod.main(["--samples", "700", "--chunk-size", "128", "--device", "cpu", "--metrics", "zhao", "hamming"])
    b = mod.main(["--samples", "700", "--chunk-size", "700", "--device", "cpu", "--metrics", "zhao", "hamming"])
    for key in ("zhao", "hamming"):
        assert np.array_equal(a["predictions"][key], b["predictions"][key])


def test_lightning_example():
    pytest.importorskip("pytorch_lightning")
    from hdecode_torch.integrations.lightning import default_name

    mod = _load("lightning_synthetic")
    out = mod.main(["--epochs", "1", "--samples", "1200", "--val-samples", "300", "--quiet", "--seed", "1"])
    assert len(out["history"]) == 1
    logged = out["logged"]
    assert len(logged) == 7 * 7  # every metric has an optimal decoder
    assert logged == out["history"][-1]
    # tree_distance's optimal rule *is* majority (deepest node with p > 1/2); accuracy's is argmax.
    assert logged["val_tree_distance_optimal"] == logged["val_tree_distance_majority"]
    assert logged["val_accuracy_optimal"] == logged["val_accuracy_argmax_leaf"]
    # The logged values are the direct computation on the trained model's validation outputs.
    h = hd.load_hierarchy("tieredimagenet-h")
    x, y = out["val"].tensors
    model = out["model"].eval()
    with torch.no_grad():
        probs = torch.softmax(model(x), 1)
    checks = [("wu_palmer", {}, None, "optimal"), ("hf_beta", {"beta": 0.5}, None, "optimal"),
              ("zhao", {}, "plurality", "plurality"), ("jaccard", {}, "hie", "hie"), ("jaccard", {}, None, "optimal"),
              ("hamming", {}, ("darts", {"lam": 0.0}), "darts[lam=0]")]
    for metric, params, decoder, label in checks:
        m = hd.get_metric(metric, h, **params)
        if decoder is None:
            pred = m.decode(probs)
        else:
            name, dp = (decoder, {}) if isinstance(decoder, str) else decoder
            pred = hd.get_decoder(name, h, **dp).decode(probs)
        name = default_name("val", m.key, label)
        # the callback logs the float64 mean cast to the scores' dtype (float32)
        want = float(m(pred, y, dtype=torch.float64).mean())
        assert logged[name] == pytest.approx(want, rel=torch.finfo(torch.float32).eps), (metric, label)


@pytest.mark.plan_independent
def test_lightning_example_as_run(tmp_path):
    """Run as a user runs it: no warning printed, and the printed table is the logged values."""
    pytest.importorskip("pytorch_lightning")
    from hdecode_torch.integrations.lightning import default_name

    stdout, _ = _run("lightning_synthetic", "--epochs", 1, "--samples", 600, "--val-samples", 200, "--seed", 1,
                     "--json", tmp_path / "out.json", timeout=300)
    logged = json.loads((tmp_path / "out.json").read_text())["logged"]
    lines = stdout.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.startswith("metric "))
    decoders = lines[top].split()[1:]
    rows = [ln.split() for ln in lines[top + 1:top + 8]]
    assert [r[0] for r in rows] == ["accuracy", "tree_distance", "wu_palmer", "zhao", "hf_beta[beta=0.5]", "hamming",
                                    "jaccard"]
    for metric, _arrow, *cells in rows:
        assert len(cells) == len(decoders) == 7
        for decoder, cell in zip(decoders, cells):
            assert float(cell.rstrip("*")) == round(logged[default_name("val", metric, decoder)], 4), (metric, decoder)
    assert logged["val_tree_distance_optimal"] == logged["val_tree_distance_majority"]


@pytest.mark.plan_independent
@pytest.mark.slow
def test_distributed_decoding_example(tmp_path):
    pytest.importorskip("ray.data")
    out, preds = tmp_path / "dd.json", tmp_path / "preds.npz"
    stdout, _ = _run("distributed_decoding", "--rows", 3000, "--chunk", 500, "--json", out,
                     "--output", preds, timeout=300)
    res = json.loads(out.read_text())
    assert res["rows"] == 3000 and res["identical"] is True
    assert sum(w["rows"] for w in res["workers"].values()) == 3000
    assert all(w["rows_per_s"] > 0 for w in res["workers"].values())
    assert "rows/s decoding" in stdout and "predictions identical both ways: True" in stdout
    # The Ray predictions are the library's decode of the rows the example makes.
    example = _load("distributed_decoding")
    h = hd.load_hierarchy("tieredimagenet-h")
    z = torch.from_numpy(np.concatenate([example.make_chunk(k, 500, 3000, h.num_leaves, 0)["logits"]
                                         for k in range(6)]))
    with np.load(preds) as got:
        np.testing.assert_array_equal(got["id"], np.arange(3000))
        for col, spec in (("wu_palmer_optimal", "optimal:wu_palmer"),
                          ("tree_distance_optimal", "optimal:tree_distance"), ("majority", "majority")):
            np.testing.assert_array_equal(got[col], hd.get_decoder(spec, h).decode(z, from_logits=True).numpy(),
                                          err_msg=col)
