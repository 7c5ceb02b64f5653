"""Smoke test of the benchmark harness: correctness checks against the per-sample baselines + a tiny timing run."""

from __future__ import annotations

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

run = pytest.importorskip("benchmarks.run")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "out.json"
    argv = ["--quick", "--device", "cpu", "--trees", "synthetic-tiny,tieredimagenet-h", "--batch-sizes", "24",
            "--baseline-samples", "12", "--python-baseline-samples", "2", "--repeats", "1", "--min-time", "0",
            "--no-backend-compare", "--threads", "1", "--json", str(path)]
    code = run.main(argv)
    with open(path) as f:
        data = json.load(f)
    return code, data


def test_exit_code_and_checks(result):
    code, data = result
    fails = [c for c in data["checks"] if c["status"] == "FAIL"]
    assert not fails, fails
    assert code == 0 and data["all_checks_passed"] is True


def test_every_decoder_checked_and_timed(result):
    _, data = result
    import hdecode_torch as hd

    keys = {r["decoder"] for r in data["rows"]}
    assert "node_probabilities" in keys
    for name in hd.list_decoders():
        if name != "optimal":
            assert any(k.split("[")[0] == name for k in keys), name
    for beta in ("0.5", "1", "2"):
        assert f"hf_beta[beta={beta}]/optimal" in keys
    for name in ("accuracy", "lca_height", "tree_distance", "wu_palmer", "zhao", "hamming"):
        assert f"{name}/optimal" in keys
    checked = {(c["tree"], c["decoder"]) for c in data["checks"] if c["kind"] == "correctness" and c["status"] == "pass"}
    for tree in ("synthetic-tiny", "tieredimagenet-h"):
        for k in keys:
            assert (tree, k) in checked, (tree, k)


def test_json_structure(result):
    _, data = result
    meta = data["meta"]
    for k in ("date", "torch", "cpu_model", "devices", "torch_threads", "backend"):
        assert k in meta
    assert data["bandwidth"]["cpu"]["measured_copy_Bps"] > 0
    assert set(data["trees"]) == {"synthetic-tiny", "tieredimagenet-h"}
    assert data["trees"]["tieredimagenet-h"]["num_nodes"] == 843
    for r in data["rows"]:
        assert r["batch"] == 24 and r["device"] == "cpu"
        assert r["us_per_sample"] > 0 and r["samples_per_s"] > 0 and r["floor_ratio"] > 0
        assert r["tensor_peak_bytes"] >= 0 and r["rss_peak_bytes"] > 0
        if r["kind"] != "heuristic" or "baseline_us_per_sample" in r:
            assert r["baseline_us_per_sample"] > 0 and r["speedup"] > 0
    targets = {(t["tree"], t["decoder"]) for t in data["targets"]}
    assert ("tieredimagenet-h", "wu_palmer/optimal") in targets


def test_compile_and_graph_variants_run_and_agree(tmp_path):
    """benchmarks.compile_graphs on CPU: eager and torch.compile give the eager predictions (CUDA graphs
    are only tried on CUDA)."""
    from benchmarks import compile_graphs

    path = tmp_path / "cg.json"
    code = compile_graphs.main(["--device", "cpu", "--trees", "synthetic-tiny", "--batch", "16",
                                "--decoders", "opt:accuracy,top_down", "--repeats", "1", "--min-time", "0",
                                "--threads", "1", "--json", str(path)])
    rows = json.loads(path.read_text())["rows"]
    assert code == 0
    assert [(r["decoder"], r["variant"]) for r in rows] == [
        ("accuracy/optimal", "eager"), ("accuracy/optimal", "compile"), ("top_down", "eager"), ("top_down", "compile")]
    assert all(r["same"] and r["us_per_sample"] > 0 for r in rows)


def test_plan_rules_times_both_tree_sums_and_restores_the_rule(tmp_path):
    """benchmarks.plan_rules: both kinds of tree sums give the same predictions on a deepened tree, each is
    timed, and the CPU plan's depth limit is left as it was."""
    from benchmarks import plan_rules
    from hdecode_torch.core import plan

    before = plan.MAX_LEVELS
    path = tmp_path / "rules.json"
    assert plan_rules.main(["--extra", "0,5", "--batch", "8", "--repeats", "1", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert plan.MAX_LEVELS == before
    assert [(r["extra"], r["levels"]) for r in rows] == [(0, 13), (5, 18)]  # tieredImageNet-H: depth 12
    assert all(r[f"{m}_{n}_ms"] > 0 for r in rows for m in ("levels", "prefix")
               for n in ("node_probabilities", "lca_height", "zhao"))


def test_calibration_benchmark_runs_and_prints_its_table(tmp_path, capsys):
    calibration = pytest.importorskip("benchmarks.calibration")
    path = tmp_path / "calibration.json"
    assert calibration.main(["--tree", "inat19", "--distortions", "depth:3", "--rows", "400", "--json",
                             str(path)]) == 0
    out = capsys.readouterr().out
    assert "| depth_leaf |" in out and "| oracle |" in out
    with open(path) as f:
        methods = json.load(f)["results"][0]["methods"]
    assert set(methods) == {"raw", "temperature", "depth", "depth_leaf", "oracle"}
    # the oracle's row is the gap itself
    assert methods["oracle"]["hF_1"]["recovered"] == pytest.approx(1.0)
    assert methods["depth_leaf"]["nll"] < methods["temperature"]["nll"]


def test_latency_checks_and_times_the_per_sample_baselines_at_one_row(monkeypatch):
    """benchmarks.latency's B = 1 yardstick: every decoder with a per-sample baseline is checked against it
    (expected score of the library's answer) and timed on both node-sum traversals; a wrong baseline stops it."""
    latency = pytest.importorskip("benchmarks.latency")
    from benchmarks import baselines
    from benchmarks.workloads import load_tree

    h, _ = load_tree("synthetic-tiny")
    out = latency.baseline_latency(h, 0.0)
    labels = {label for label, _, _ in latency.DECODERS}
    for key in ("np", "py"):
        assert set(out[key]) == labels  # accuracy's baseline is the argmax
        assert all(v > 0 for v in out[key].values())

    def wrong(self, pl):  # the root: a worse expected distance than the deepest node above 1/2 on most rows
        return int(self.t.root)

    monkeypatch.setattr(baselines.Baselines, "tree_distance", wrong)
    with pytest.raises(SystemExit, match="tree_distance"):
        latency.baseline_latency(h, 0.0)
