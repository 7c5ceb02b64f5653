"""hdecode's calibration: compare --calibrate hierarchical|auto, the calibration check of user outputs, plot
reliability, decode --calibrate hierarchical; each output equal to the library computed directly."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import functional as F
from hdecode_torch.cli.common import calibration_split
from hdecode_torch.cli.options import DISTORTIONS
from hdecode_torch.synthetic import synthetic_miscalibrated

from test_cli import _error_line, png_size, run_cli

ROWS = 1600
COMMON = ["--metrics", "tree_distance,wu_palmer", "--decoders", "argmax_leaf", "--no-progress",
          "--device", "cpu"]  # the device of the library calls they are compared with


@pytest.fixture(scope="module")
def tiered():
    return hd.load_hierarchy("tieredimagenet-h")


@pytest.fixture(scope="module")
def files(tiered, tmp_path_factory):
    """A model flatter near the root and sharper deep down than the truth: its logits, the labels, p*."""
    d = tmp_path_factory.mktemp("calibration")
    z, y, true = synthetic_miscalibrated(tiered, ROWS, distortion="depth", strength=2.5, seed=11, dtype=torch.float64)
    np.save(d / "z.npy", z.numpy())
    np.save(d / "y.npy", y.numpy())
    np.save(d / "p.npy", true.numpy())
    return d, z, y, true


def test_distortion_names_are_the_library_s():
    assert DISTORTIONS == hd.synthetic.DISTORTIONS


def test_compare_calibrate_hierarchical_reports_what_the_library_computes(tiered, files, capsys):
    d, z, y, _ = files
    code, out, err = run_cli(["compare", "--probs", d / "z.npy", "--targets", d / "y.npy", "--from-logits",
                              "--calibrate", "hierarchical", "--json", d / "h.json", *COMMON], capsys)
    assert code == 0, err
    assert "hierarchical scaler (depth_leaf, 25 parameters" in out and "node ECE (held-out rows)" in out
    doc = json.loads((d / "h.json").read_text())
    info = doc["results"]["calibration"]
    assert doc["metadata"]["setting"]["calibrate"] == "hierarchical"
    fit, held = calibration_split(ROWS, 0.5, 0)
    scaler = hd.HierarchicalScaler(tiered).fit(z[fit], y[fit])
    assert info["temperature"] == scaler.temperature and info["temperatures"] == scaler.temperatures
    assert info["num_parameters"] == scaler.num_parameters == 25
    assert info["nll_other_after"] == scaler.loss(z[held], y[held])
    ece = info["node_ece"]
    assert ece["rows"] == "held-out"
    assert ece["before"] == F.node_calibration_error(z[held], y[held], tiered, from_logits=True).tolist()
    with torch.no_grad():
        after = F.node_calibration_check(scaler(z[held]), y[held], tiered, from_logits=True)
    assert ece["after"] == after.ece.tolist() and ece["noise_floor"] == after.noise_floor.tolist()
    # The distortion is strongest near the root: the scaler removes most of it there.
    assert all(ece["after"][k] < 0.5 * ece["before"][k] for k in (1, 2, 3))
    assert info["nll_other_after"] < info["nll_other_before"]


def test_compare_checks_the_calibration_of_user_outputs(tiered, files, capsys):
    d, z, y, true = files
    code, out, err = run_cli(["compare", "--probs", d / "z.npy", "--targets", d / "y.npy", "--from-logits",
                              "--json", d / "c.json", *COMMON], capsys)
    assert code == 0, err
    check = json.loads((d / "c.json").read_text())["results"]["calibration_check"]
    direct = F.node_calibration_check(z, y, tiered, from_logits=True)
    assert check["ece"] == direct.ece.tolist() and check["noise_floor"] == direct.noise_floor.tolist()
    assert check["miscalibrated_depths"] == direct.miscalibrated.nonzero().flatten().tolist()
    assert {1, 2, 3} <= set(check["miscalibrated_depths"])
    text = " ".join(out.split())
    assert "miscalibrated beyond sampling noise at depth 1, 2, 3" in text
    assert "rerun with --calibrate hierarchical" in text and "node ECE (scored rows)" in out
    # The truth itself is calibrated: nothing flagged, and the table says so.
    code, out, err = run_cli(["compare", "--probs", d / "p.npy", "--targets", d / "y.npy", "--json", d / "t.json",
                              *COMMON], capsys)
    assert code == 0, err
    assert "look calibrated" in " ".join(out.split())
    assert json.loads((d / "t.json").read_text())["results"]["calibration_check"]["miscalibrated_depths"] == []
    # Probabilities, not logits: the advice says how to pass logits.
    bad = torch.softmax(z, 1).numpy()
    np.save(d / "q.npy", bad)
    code, out, _ = run_cli(["compare", "--probs", d / "q.npy", "--targets", d / "y.npy", *COMMON], capsys)
    assert code == 0 and "pass the logits (or the log of the probabilities) with --from-logits" in " ".join(out.split())


def test_compare_calibrate_auto(tiered, files, capsys):
    d, z, y, true = files
    code, out, err = run_cli(["compare", "--probs", d / "z.npy", "--targets", d / "y.npy", "--from-logits",
                              "--calibrate", "auto", "--json", d / "a.json", *COMMON], capsys)
    assert code == 0, err
    info = json.loads((d / "a.json").read_text())["results"]["calibration"]
    assert info["kind"] == "auto" and info["applied"] == "hierarchical" and "auto: miscalibrated at depth" in out
    fit, _ = calibration_split(ROWS, 0.5, 0)
    direct = F.node_calibration_check(z[fit], y[fit], tiered, from_logits=True)
    assert info["fit_rows_check"]["miscalibrated_depths"] == direct.miscalibrated.nonzero().flatten().tolist()
    np.save(d / "logp.npy", true.log().numpy())  # calibrated logits: nothing to fix
    code, out, err = run_cli(["compare", "--probs", d / "logp.npy", "--targets", d / "y.npy", "--from-logits",
                              "--calibrate", "auto", "--json", d / "n.json", *COMMON], capsys)
    assert code == 0, err
    info = json.loads((d / "n.json").read_text())["results"]["calibration"]
    assert info["applied"] == "none" and "no scaling applied" in " ".join(out.split())
    assert info["node_ece"]["before"] == info["node_ece"]["after"]


def test_decode_calibrate_hierarchical_decodes_the_scaler_s_output(tiered, files, capsys):
    d, z, y, _ = files
    code, _, err = run_cli(["decode", "--probs", d / "z.npy", "--from-logits", "--calibrate", "hierarchical",
                            "--targets", d / "y.npy", "--metric", "wu_palmer", "--output", d / "pred.npy",
                            "--no-progress"], capsys)
    assert code == 0, err
    assert "calibration: hierarchical scaler" in err
    fit, _ = calibration_split(ROWS, 0.5, 0)
    scaler = hd.HierarchicalScaler(tiered).fit(z[fit], y[fit])
    with torch.no_grad():
        want = hd.get_metric("wu_palmer", tiered).decode(scaler(z), from_logits=True)
    assert np.array_equal(np.load(d / "pred.npy"), want.numpy())


def test_plot_reliability(tiered, files, tmp_path, capsys):
    d, z, y, _ = files
    code, out, err = run_cli(["plot", "reliability", "--probs", d / "z.npy", "--targets", d / "y.npy",
                              "--from-logits", "--calibrate", "hierarchical", "--output", tmp_path / "r.png",
                              "--json", tmp_path / "r.json", "--dpi", "40", "--no-progress", "--device", "cpu"], capsys)
    assert code == 0, err
    assert png_size(tmp_path / "r.png")[0] > 100
    res = json.loads((tmp_path / "r.json").read_text())["results"]
    assert res["depths"] == list(range(1, tiered.max_depth + 1))
    fit, held = calibration_split(ROWS, 0.5, 0)
    rel = F.node_reliability(z[held], y[held], tiered, from_logits=True)
    assert res["raw"]["counts"] == rel.counts.tolist()
    assert res["raw"]["ece"] == F.node_calibration_error(z[held], y[held], tiered, from_logits=True).tolist()
    freq = [[None if v != v else v for v in row] for row in rel.frequency.tolist()]  # NaN: null in JSON
    assert res["raw"]["frequency"] == freq
    scaler = hd.HierarchicalScaler(tiered).fit(z[fit], y[fit])
    with torch.no_grad():
        cal = F.node_calibration_error(scaler(z[held]), y[held], tiered, from_logits=True)
    assert res["calibrated"]["ece"] == cal.tolist()
    # Synthetic default: a model with a known miscalibration, drawn raw only.
    code, out, err = run_cli(["plot", "reliability", "--num-samples", "300", "--output", tmp_path / "s.png",
                              "--json", tmp_path / "s.json", "--dpi", "40", "--no-progress"], capsys)
    assert code == 0, err
    res = json.loads((tmp_path / "s.json").read_text())
    assert res["metadata"]["setting"]["distortion"] == "depth" and "calibrated" not in res["results"]
    assert sum(res["results"]["raw"]["counts"][1]) == 300 * int((tiered.depth == 1).sum())


@pytest.mark.parametrize("argv, message", [
    (["--distortion", "global"], "--distortion applies to synthetic outputs, not to --probs"),
    (["--calibrate"], "--calibrate scales logits: add --from-logits"),
    (["--from-logits", "--calibration-split", "0.3"], "--calibration-split applies to --calibrate"),
])
def test_plot_reliability_errors(files, tmp_path, capsys, argv, message):
    d = files[0]
    code, _, err = run_cli(["plot", "reliability", "--probs", d / "z.npy", "--targets", d / "y.npy", *argv,
                            "--output", tmp_path / "x.png", "--no-progress"], capsys)
    assert code == 2 and message in _error_line(err)
