"""``hdecode compare --alpha``, ``hdecode plot risk`` and ``hdecode decode --alpha``: the λ they report is
hd.RiskControl's on the same held-out rows, and the miss rates, depths and curves they report equal direct
computations on the other rows; decode's nodes are the fitted decoder's on every row, bit for bit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.cli.main import main
from hdecode_torch.decoders.risk_control import ThresholdDescent
from hdecode_torch.synthetic import synthetic_outputs
from hdecode_torch.cli.common import guarantee_text
from test_cli import one_thread, run_cli, run_cli_on_cpu, tiered  # noqa: F401  (fixtures: one thread, the tree)

HEURISTICS = ["argmax_leaf", "top_down", "confidence_threshold[tau=0.8]", "majority", "plurality", "darts[lam=1]",
              "expected_information", "information_threshold[threshold=3.21]", "hie", "crm"]


def split(num_rows: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The documented split: round(fraction·n) rows of a seeded permutation, and the rest, each sorted."""
    k = int(round(fraction * num_rows))
    perm = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed))
    return perm[:k].sort().values, perm[k:].sort().values


def miss_and_depth(h, answers: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) float64 misses and depths from the ancestors-by-depth table: a node misses when it is not on the
    target's root path, a node set when one of its nodes is not; a set's depth counts its nodes below the root."""
    path = h.ancestors[targets]  # (B, D + 1), padded with num_nodes
    if answers.dtype == torch.bool:
        on_path = torch.zeros(answers.shape[0], h.num_nodes + 1, dtype=torch.bool)  # a column for the padding
        on_path[torch.arange(answers.shape[0])[:, None], path] = True
        return (answers & ~on_path[:, :-1]).any(1).double(), (answers.sum(1) - 1).double()
    return (~(path == answers[:, None]).any(1)).double(), h.depth[answers].double()


# --------------------------------------------------------------------------- compare --alpha
@pytest.fixture(scope="module")
def compare_alpha(tmp_path_factory):
    path = tmp_path_factory.mktemp("risk") / "out.json"
    argv = ["compare", "--alpha", "0.1", "--num-samples", "2000", "--noise", "1.0", "--seed", "3", "--metrics",
            "tree_distance,hf_beta", "--betas", "1", "--json", str(path), "--no-progress"]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return json.loads(path.read_text()), out.getvalue()


def test_compare_alpha_fits_risk_control_on_the_held_out_rows(compare_alpha, tiered):
    doc, _ = compare_alpha
    probs, y = synthetic_outputs(tiered, 2000, 1.0, seed=3)
    fit, other = split(2000, 0.5, 3)
    rc = hd.RiskControl(tiered, alpha=0.1).fit(probs[fit], y[fit])
    risk = doc["results"]["risk_control"]
    assert risk["decoder"] == "risk_control[alpha=0.1]" == rc.key
    assert risk["lambda"] == rc.lam and risk["calibration_rows"] == 1000 and risk["scored_rows"] == 1000
    assert risk["calibration_miss_rate"] == rc.calibration_risk
    assert risk["alpha"] == 0.1 and risk["delta"] is None and "exchangeable" in risk["guarantee"]
    setting, timings = doc["metadata"]["setting"], doc["metadata"]["timings"]
    assert (setting["alpha"], setting["delta"], setting["calibration_split"], setting["scored_rows"]) == (
        0.1, None, 0.5, 1000)
    assert timings["risk_control_s"] >= 0
    # The metric tables score the same 1000 rows: the optimal tree-distance decoder's mean equals a direct one.
    td = hd.get_metric("tree_distance", tiered)
    direct = td(td.decode(probs[other]), y[other], dtype=torch.float64).mean()
    assert doc["results"]["metrics"]["tree_distance"]["optimal"] == pytest.approx(float(direct), abs=1e-12)


def test_compare_alpha_miss_rates_and_depths_equal_direct_ones(compare_alpha, tiered):
    doc, _ = compare_alpha
    probs, y = synthetic_outputs(tiered, 2000, 1.0, seed=3)
    fit, other = split(2000, 0.5, 3)
    p, t = probs[other], y[other]
    rc = hd.RiskControl(tiered, alpha=0.1).fit(probs[fit], y[fit])
    hf = hd.get_metric("hf_beta", tiered, beta=1.0)
    answers = {rc.key: rc.decode(p), "tree_distance/optimal": hd.get_metric("tree_distance", tiered).decode(p),
               "hf_beta[beta=1]/optimal": hf.decode(p)}  # a node set
    for key in HEURISTICS:  # setting["decoders"]: {key: {"name": ..., **params}}
        params = dict(doc["metadata"]["setting"]["decoders"][key])
        answers[key] = hd.get_decoder(params.pop("name"), tiered, **params).decode(p)
    risk = doc["results"]["risk_control"]
    assert list(risk["miss_rate"]) == list(answers)  # risk control first, then optimal, then the heuristics
    for name, a in answers.items():
        miss, depth = miss_and_depth(tiered, a, t)
        assert risk["miss_rate"][name] == pytest.approx(float(miss.mean()), abs=1e-12), name
        assert risk["mean_depth"][name] == pytest.approx(float(depth.mean()), abs=1e-12), name
        assert risk["miss_rate_stderr"][name] == pytest.approx(float(miss.std() / math.sqrt(1000)), rel=1e-9), name
        assert risk["mean_depth_stderr"][name] == pytest.approx(float(depth.std() / math.sqrt(1000)), rel=1e-9)
    # The library's own loss at the fitted λ, another path to the same number.
    assert risk["miss_rate"][rc.key] == pytest.approx(float(rc.loss_steps(p, t).losses(rc.lam).mean()), abs=1e-12)
    # majority is the optimal tree-distance decoder: the same answers, the same miss rate.
    assert risk["miss_rate"]["majority"] == risk["miss_rate"]["tree_distance/optimal"]


def test_compare_alpha_prints_the_json_values(compare_alpha):
    doc, out = compare_alpha
    risk = doc["results"]["risk_control"]
    words = " ".join(out.split())  # the line is wrapped to the terminal's width
    assert (f"risk: risk_control[alpha=0.1]: λ = {risk['lambda']:.4g} fitted on 1000 held-out rows (their miss rate "
            f"{risk['calibration_miss_rate']:.4f}); conformal risk control:") in words, out
    rows = {}
    for line in out[out.index("decoder  "):].splitlines()[2:]:
        if not line.strip():
            break
        name, miss, depth = line.split()
        rows[name] = (miss, depth)
    assert list(rows) == list(risk["miss_rate"])
    for name, (miss, depth) in rows.items():
        for cell, key in ((miss, "miss_rate"), (depth, "mean_depth")):
            mean, se = cell.split("±")
            decimals = len(mean.split(".")[1])
            assert float(mean) == pytest.approx(risk[key][name], abs=0.51 * 10 ** -decimals), (name, cell)
            assert float(se) == pytest.approx(risk[key + "_stderr"][name], abs=0.51 * 10 ** -decimals), (name, cell)


def test_compare_alpha_delta_with_its_own_split(tmp_path, tiered, capsys):
    path = tmp_path / "d.json"
    code, _, err = run_cli(["compare", "--alpha", "0.05", "--delta", "0.1", "--calibration-split", "0.6", "--seed",
                            "7", "--num-samples", "1500", "--metrics", "accuracy", "--decoders", "majority",
                            "--json", path, "--no-progress"], capsys)
    assert code == 0, err
    risk = json.loads(path.read_text())["results"]["risk_control"]
    probs, y = synthetic_outputs(tiered, 1500, 0.75, seed=7)
    fit, other = split(1500, 0.6, 7)
    rc = hd.RiskControl(tiered, alpha=0.05, delta=0.1).fit(probs[fit], y[fit])
    assert risk["decoder"] == "risk_control[alpha=0.05,delta=0.1]" and risk["lambda"] == rc.lam
    assert (risk["calibration_rows"], risk["scored_rows"]) == (900, 600) and risk["delta"] == 0.1
    assert "with probability at least 0.9" in risk["guarantee"]
    miss, _ = miss_and_depth(tiered, rc.decode(probs[other]), y[other])
    assert risk["miss_rate"][rc.key] == pytest.approx(float(miss.mean()), abs=1e-12)
    assert list(risk["miss_rate"]) == [rc.key, "accuracy/optimal", "majority"]


@pytest.mark.parametrize("kind", ["temperature", "hierarchical"])
def test_compare_calibrate_and_alpha_fit_t_and_lambda_on_half_each(tmp_path, tiered, capsys, kind):
    probs, y = synthetic_outputs(tiered, 1200, 0.75, seed=11)
    logits = (2.0 * probs.double().clamp_min(1e-12).log()).float()  # over-confident: T > 1
    np.save(tmp_path / "z.npy", logits.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    path = tmp_path / "c.json"
    code, _, err = run_cli(["compare", "--probs", tmp_path / "z.npy", "--targets", tmp_path / "y.npy",
                            "--from-logits", "--calibrate", kind, "--alpha", "0.1", "--seed", "5", "--metrics",
                            "accuracy", "--decoders", "majority", "--json", path, "--no-progress"], capsys)
    assert code == 0, err
    res = json.loads(path.read_text())["results"]
    held, other = split(1200, 0.5, 5)
    t_pick, lam_pick = split(held.numel(), 0.5, 5)
    t_rows, lam_rows = held[t_pick], held[lam_pick]
    scaler = (hd.TemperatureScaler() if kind == "temperature" else hd.HierarchicalScaler(tiered)).fit(logits[t_rows],
                                                                                                      y[t_rows])
    assert res["calibration"]["temperature"] == scaler.temperature and res["calibration"]["fit_rows"] == 300
    with torch.no_grad():
        scaled = scaler(logits.double())
    rc = hd.RiskControl(tiered, alpha=0.1).fit(scaled[lam_rows], y[lam_rows], from_logits=True)
    risk = res["risk_control"]
    assert risk["lambda"] == rc.lam and risk["calibration_rows"] == 300 and risk["scored_rows"] == 600
    answers = rc.decode(torch.softmax(scaled[other], 1))
    miss, depth = miss_and_depth(tiered, answers, y[other])
    assert risk["miss_rate"][rc.key] == pytest.approx(float(miss.mean()), abs=1e-12)
    assert risk["mean_depth"][rc.key] == pytest.approx(float(depth.mean()), abs=1e-12)


# --------------------------------------------------------------------------- plot risk
def test_plot_risk_json_is_the_library_curve(tmp_path, tiered, capsys):
    pytest.importorskip("matplotlib")
    out, js = tmp_path / "risk.png", tmp_path / "risk.json"
    code, stdout, err = run_cli(["plot", "risk", "--num-samples", "1600", "--seed", "2", "--points", "11",
                                 "--calibration-split", "0.25", "--output", out, "--json", js, "--no-progress"],
                                capsys)
    assert code == 0, err
    assert stdout.strip() == f"wrote {out} and {js}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    doc = json.loads(js.read_text())
    assert doc["command"] == "plot risk" and doc["schema_version"] == 1
    setting = doc["metadata"]["setting"]
    assert (setting["alpha"], setting["delta"], setting["calibration_split"], setting["points"]) == (
        0.1, None, 0.25, 11)
    res = doc["results"]
    probs, y = synthetic_outputs(tiered, 1600, 0.75, seed=2)
    fit, other = split(1600, 0.25, 2)
    rc = hd.RiskControl(tiered, alpha=0.1).fit(probs[fit], y[fit])
    assert res["fit"]["lambda"] == rc.lam == res["at_fitted"]["lambda"]
    assert res["fit"]["calibration_rows"] == 400 and res["scored_rows"] == 1200
    assert res["lambda"] == sorted({i / 10 for i in range(11)} | {rc.lam})
    assert rc.lam in res["lambda"] and len(res["lambda"]) == 12
    # Another path to each point: the rows' losses at every λ, and the depth of ThresholdDescent's answers.
    lam = torch.tensor(res["lambda"], dtype=torch.float64)
    miss = rc.loss_steps(probs[other], y[other]).losses(lam).mean(1)
    assert res["miss_rate"] == pytest.approx(miss.tolist(), abs=1e-12)
    depth = [float(tiered.depth[ThresholdDescent(tiered, lam=g).decode(probs[other])].double().mean())
             for g in res["lambda"]]
    assert res["mean_depth"] == pytest.approx(depth, abs=1e-12)
    # Nested: both fall as λ grows (float32 rows can sum to just over 1, so λ = 1 need not be the root).
    assert res["miss_rate"] == sorted(res["miss_rate"], reverse=True) and res["miss_rate"][0] > 0.4
    assert res["mean_depth"] == sorted(res["mean_depth"], reverse=True)
    at = res["at_fitted"]
    i = res["lambda"].index(rc.lam)
    assert (at["miss_rate"], at["mean_depth"]) == (res["miss_rate"][i], res["mean_depth"][i])
    assert at["miss_rate_stderr"] == pytest.approx(math.sqrt(at["miss_rate"] * (1 - at["miss_rate"]) / 1199))


def test_plot_risk_from_files_with_delta(tmp_path, tiered, capsys):
    pytest.importorskip("matplotlib")
    probs, y = synthetic_outputs(tiered, 900, 1.0, seed=8, dtype=torch.float64)
    np.save(tmp_path / "p.npy", probs.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    js = tmp_path / "r.json"
    code, _, err = run_cli(["plot", "risk", "--probs", tmp_path / "p.npy", "--targets", tmp_path / "y.npy",
                            "--alpha", "0.2", "--delta", "0.05", "--points", "3", "--output", tmp_path / "r.png",
                            "--json", js, "--no-progress", "--device", "cpu"], capsys)  # the library's device
    assert code == 0, err
    res = json.loads(js.read_text())["results"]
    fit, other = split(900, 0.5, 0)
    rc = hd.RiskControl(tiered, alpha=0.2, delta=0.05).fit(probs[fit], y[fit])
    assert res["fit"]["decoder"] == "risk_control[alpha=0.2,delta=0.05]" and res["fit"]["lambda"] == rc.lam
    assert res["lambda"] == sorted({0.0, 0.5, 1.0, rc.lam})
    miss = rc.loss_steps(probs[other], y[other]).losses(torch.tensor(res["lambda"], dtype=torch.float64)).mean(1)
    assert res["miss_rate"] == pytest.approx(miss.tolist(), abs=1e-12)


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("argv, message", [
    (["compare", "--delta", "0.1"], "--delta applies to --alpha"),
    (["compare", "--calibration-split", "0.3"], "--calibration-split applies to --calibrate and --alpha"),
    (["compare", "--alpha", "0.1", "--num-samples", "10"],
     "--alpha 0.1: too few calibration rows: at least 9 are needed (with fewer, not even the root can be certified "
     "at this level), but --calibration-split 0.5 of 10 rows holds 5"),
    (["compare", "--alpha", "0.05", "--delta", "0.1", "--num-samples", "80"],
     "--alpha 0.05 --delta 0.1: too few calibration rows: at least 45 are needed"),
    (["compare", "--alpha", "0.1", "--num-samples", "30", "--calibration-split", "0.99"],
     "--calibration-split 0.99 of 30 rows leaves no row to score"),
    (["compare", "--alpha", "0.1", "--num-samples", "2", "--calibration-split", "0.01"],
     "--calibration-split 0.01 of 2 rows leaves no row to fit λ on"),
    (["compare", "--alpha", "1"], "argument --alpha: expected a finite number > 0 and < 1, got 1"),
    # 2eafccb: an OverflowError ("internal error"), and a hang without --delta
    (["compare", "--alpha", "1e-40", "--delta", "0.1"],
     "--alpha 1e-40 --delta 0.1: needs more than 2^40 = 1,099,511,627,776 calibration rows (with fewer, not even the "
     "root can be certified at this level); use a larger --alpha"),
    (["compare", "--alpha", "1e-40"], "--alpha 1e-40: needs more than 2^40 = 1,099,511,627,776 calibration rows"),
    (["plot", "risk", "--alpha", "1e-13", "-o", "{d}/r.png"], "--alpha 1e-13: needs more than 2^40"),
    (["compare", "--alpha", "0.1", "--delta", "0"], "argument --delta: expected a finite number > 0 and < 1, got 0"),
    (["compare", "--probs", "{d}/p.npy", "--targets", "{d}/y.npy", "--seed", "1"],
     "--seed applies to synthetic outputs or to the --calibrate / --alpha split"),
    (["compare", "--probs", "{d}/z.npy", "--targets", "{d}/y.npy", "--from-logits", "--calibrate", "--alpha", "0.1",
      "--calibration-split", "0.05"],
     "--calibrate with --alpha fits the calibration and λ on half each of the --calibration-split 0.05 of 20 rows, "
     "but it holds "
     "1 row"),
    (["compare", "--probs", "{d}/z.npy", "--targets", "{d}/y.npy", "--from-logits", "--calibrate", "--alpha", "0.1"],
     "too few calibration rows: at least 9 are needed (with fewer, not even the root can be certified at this "
     "level), but half of --calibration-split 0.5 of 20 rows holds 5"),
    (["plot", "risk", "--num-samples", "10", "-o", "{d}/r.png"],
     "--alpha 0.1: too few calibration rows: at least 9 are needed"),
    (["plot", "risk", "--num-samples", "5", "--calibration-split", "0.01", "-o", "{d}/r.png"],
     "--calibration-split 0.01 of 5 rows leaves no row to fit λ on"),
    (["plot", "risk", "--targets", "{d}/y.npy", "-o", "{d}/r.png"], "--targets needs --probs"),
    (["plot", "risk", "--probs", "{d}/p.npy", "-o", "{d}/r.png"], "--probs needs --targets"),
    (["plot", "risk", "--probs", "{d}/p.npy", "--targets", "{d}/y.npy", "--num-samples", "9", "-o", "{d}/r.png"],
     "--num-samples applies to synthetic outputs, not to --probs"),
    (["plot", "risk", "--from-logits", "-o", "{d}/r.png"], "--from-logits applies to --probs"),
    (["plot", "risk", "--points", "1", "-o", "{d}/r.png"], "--points"),
])
def test_risk_errors(tmp_path, capsys, argv, message):
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(608), size=20)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "z.npy", np.log(p))
    np.save(tmp_path / "y.npy", np.arange(20))
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    code, _, err = run_cli([*argv, "--no-progress"], capsys)
    assert code == 2
    command = "hdecode plot risk" if argv[0] == "plot" else "hdecode compare"
    assert [ln for ln in err.splitlines() if "error:" in ln][0].startswith(f"{command}: error:"), err
    assert message in " ".join(err.split()), err
    assert not (tmp_path / "r.png").exists()


# --------------------------------------------------------------------------- decode --alpha, --risk-lambda
def read_nodes(path, ext: str, stdout: str) -> torch.Tensor:
    """(B,) int64 node ids from an output of ``hdecode decode`` (``ext``: its format, None for stdout)."""
    if ext is None:
        return torch.tensor([int(ln) for ln in stdout.splitlines()])
    if ext == ".npy":
        return torch.from_numpy(np.load(path))
    if ext == ".npz":
        return torch.from_numpy(np.load(path)["pred"])
    if ext == ".pt":
        return torch.load(path)
    if ext == ".csv":
        lines = path.read_text().splitlines()
        assert lines[0] == "node"
        return torch.tensor([int(v) for v in lines[1:]])
    return torch.tensor([json.loads(ln)["node"] for ln in path.read_text().splitlines()])


def printed_lambda(err: str) -> float:
    line = [ln for ln in err.splitlines() if "risk control:" in ln]
    assert len(line) == 1, err
    return float(line[0].split("λ = ")[1].split(" ")[0])


@pytest.fixture(scope="module")
def decode_rows(tiered, tmp_path_factory):
    d = tmp_path_factory.mktemp("decode_alpha")
    probs, y = synthetic_outputs(tiered, 600, 1.0, seed=7)
    np.save(d / "p.npy", probs.numpy())
    np.save(d / "y.npy", y.numpy())
    return d, probs, y


@pytest.mark.parametrize("ext", [".npy", ".npz", ".pt", ".csv", ".jsonl", None])
def test_decode_alpha_is_the_library_fit_on_the_split_bit_for_bit(decode_rows, tiered, capsys, ext):
    d, probs, y = decode_rows
    out = d / f"o{ext}"
    code, stdout, err = run_cli_on_cpu(["decode", "--probs", d / "p.npy", "--targets", d / "y.npy", "--alpha", "0.1",
                                        "--batch-size", 128, "--no-progress",
                                        *([] if ext is None else ["--output", out])], capsys)
    assert code == 0, err
    fit, _ = split(600, 0.5, 0)
    rc = hd.RiskControl(tiered, alpha=0.1).fit(probs[fit], y[fit])
    expected = rc.decode(probs)  # every row, in the order of --probs
    assert torch.equal(read_nodes(out, ext, stdout), expected)
    assert printed_lambda(err) == rc.lam
    text = " ".join(err.split())
    assert f"fitted on 300 rows (their miss rate {rc.calibration_risk:.4f})" in text
    assert guarantee_text(0.1, None) in text
    assert "the fit rows are those calibration rows, and the promise is for new rows, not for the fit rows " \
           "themselves" in text


def test_decode_alpha_delta_split_seed_and_the_printed_lambda_decodes_the_same(decode_rows, tiered, capsys):
    d, probs, y = decode_rows
    code, stdout, err = run_cli_on_cpu(["decode", "--probs", d / "p.npy", "--targets", d / "y.npy", "--alpha", "0.2",
                                        "--delta", "0.1", "--calibration-split", "0.7", "--seed", "4",
                                        "--no-progress"], capsys)
    assert code == 0, err
    fit, _ = split(600, 0.7, 4)
    rc = hd.RiskControl(tiered, alpha=0.2, delta=0.1).fit(probs[fit], y[fit])
    assert torch.equal(read_nodes(None, None, stdout), rc.decode(probs))
    lam = printed_lambda(err)
    assert lam == rc.lam and f"fitted on {fit.numel()} rows" in err
    assert guarantee_text(0.2, 0.1) in " ".join(err.split())
    # --risk-lambda: the fitted decoder, from its printed λ, on rows without targets
    code, again, err = run_cli_on_cpu(["decode", "--probs", d / "p.npy", "--risk-lambda", repr(lam),
                                       "--no-progress"], capsys)
    assert code == 0, err
    assert again == stdout
    code, out, err = run_cli_on_cpu(["decode", "--probs", d / "p.npy", "--risk-lambda", "0.6", "--no-progress"],
                                    capsys)
    assert code == 0, err
    assert torch.equal(read_nodes(None, None, out), ThresholdDescent(tiered, lam=0.6).decode(probs))


@pytest.mark.parametrize("kind", ["temperature", "hierarchical"])
def test_decode_calibrate_and_alpha_fit_t_and_lambda_on_half_each(tmp_path, tiered, capsys, kind):
    probs, y = synthetic_outputs(tiered, 1200, 0.75, seed=11)
    logits = (2.0 * probs.double().clamp_min(1e-12).log()).float()  # over-confident: T > 1
    np.save(tmp_path / "z.npy", logits.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    code, stdout, err = run_cli_on_cpu(["decode", "--probs", tmp_path / "z.npy", "--targets", tmp_path / "y.npy",
                                        "--from-logits", "--calibrate", kind, "--alpha", "0.1", "--seed", "5",
                                        "--no-progress"], capsys)
    assert code == 0, err
    held, _ = split(1200, 0.5, 5)
    t_pick, lam_pick = split(held.numel(), 0.5, 5)
    t_rows, lam_rows = held[t_pick], held[lam_pick]
    scaler = (hd.TemperatureScaler() if kind == "temperature" else hd.HierarchicalScaler(tiered)).fit(logits[t_rows],
                                                                                                      y[t_rows])
    with torch.no_grad():
        scaled = scaler(logits.double()).float()  # decode's calibrated logits keep the input's dtype
    rc = hd.RiskControl(tiered, alpha=0.1).fit(scaled[lam_rows], y[lam_rows], from_logits=True)
    assert printed_lambda(err) == rc.lam and "fitted on 300 rows" in err
    assert torch.equal(read_nodes(None, None, stdout), rc.decode(hd.Posterior(tiered, scaled, from_logits=True)))


@pytest.mark.parametrize("argv, message", [
    (["--alpha", "0.1"], "--alpha fits risk control's λ on labelled rows: add --targets FILE"),
    (["--alpha", "1", "--targets", "{d}/y.npy"], "argument --alpha: expected a finite number > 0 and < 1, got 1"),
    (["--alpha", "0", "--targets", "{d}/y.npy"], "argument --alpha: expected a finite number > 0 and < 1, got 0"),
    (["--alpha", "0.1", "--targets", "{d}/y.npy", "--metric", "zhao"],
     "argument --metric/--metrics: not allowed with argument --alpha"),
    (["--decoder", "majority", "--alpha", "0.1", "--targets", "{d}/y.npy"],
     "argument --alpha: not allowed with argument --decoder/--decoders"),
    (["--alpha", "0.1", "--targets", "{d}/y.npy", "--risk-lambda", "0.5"],
     "argument --risk-lambda: not allowed with argument --alpha"),
    (["--alpha", "0.01", "--targets", "{d}/y.npy"],
     "--alpha 0.01: too few calibration rows: at least 99 are needed (with fewer, not even the root can be "
     "certified at this level), but --calibration-split 0.5 of 20 rows holds 10"),
    (["--alpha", "0.1", "--targets", "{d}/y.npy", "--calibration-split", "0.01"],
     "--calibration-split 0.01 of 20 rows selects no row to fit λ on"),
    (["--alpha", "0.1", "--targets", "{d}/y.npy", "--from-logits", "--calibrate", "--calibration-split", "0.05"],
     "--calibrate with --alpha fits the calibration and λ on half each of the --calibration-split 0.05 of 20 rows, "
     "but it holds 1 row"),
    (["--metric", "zhao", "--delta", "0.1"], "--delta applies to --alpha"),
    (["--risk-lambda", "0.5", "--targets", "{d}/y.npy"], "--targets applies to --calibrate and --alpha"),
    (["--risk-lambda", "-0.5"], "argument --risk-lambda"),
    (["--alpha", "0.1", "--targets", "{d}/y.npy", "--certify"], "--certify: certificates are of a --metric's "
     "optimal decisions, not of risk control (--alpha)"),
    ([], "give one of --metric, --decoder, --alpha (risk control fitted on the rows) or --risk-lambda"),
])
def test_decode_risk_errors(tmp_path, capsys, argv, message):
    p = np.random.default_rng(0).dirichlet(np.ones(608), size=20)
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "y.npy", np.arange(20))
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    code, _, err = run_cli(["decode", "--probs", tmp_path / "p.npy", *argv, "-o", tmp_path / "o.npy",
                            "--no-progress"], capsys)
    assert code == 2
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and errors[0].startswith("hdecode decode: error:"), err
    assert message in errors[0], err
    assert not (tmp_path / "o.npy").exists()
