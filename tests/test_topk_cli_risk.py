"""``hdecode compare --alpha``, ``hdecode plot risk`` and ``hdecode decode --alpha`` on top-k lists: λ is
hd.RiskControl's fitted on the calibration rows' lists (their completed distribution), the miss rates, depths and
curves those of the other rows' top-k decisions, decode's nodes the fitted decoder's on every row's list; with k = L
each run prints and writes what the dense run does, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.cli.evaluation import answer_coverage
from hdecode_torch.synthetic import synthetic_outputs
from test_cli import one_thread, run_cli, run_cli_on_cpu, tiered  # noqa: F401  (fixtures: one thread, the tree)
from test_cli_risk import miss_and_depth, printed_lambda, read_nodes, split

ROWS = 400
METRICS = "tree_distance,hf_beta,jaccard"  # a node metric and two set metrics (sparse decisions on lists)
DECODERS = "majority,confidence_threshold[tau=0.8]"


@pytest.fixture(scope="module")
def outputs(tiered, tmp_path_factory):
    """Float32 rows as a model writes them, their targets, and the files: dense, top-L (.pt), top-10 (.npz)."""
    d = tmp_path_factory.mktemp("topk_risk")
    probs, y = synthetic_outputs(tiered, ROWS, 1.0, seed=4)
    np.save(d / "p.npy", probs.numpy())
    np.save(d / "y.npy", y.numpy())
    full = probs.topk(tiered.num_leaves)
    torch.save({"values": full.values, "indices": full.indices}, d / "full.pt")
    t = probs.topk(10)
    np.savez(d / "t10.npz", values=t.values.numpy(), indices=t.indices.numpy())
    return d, probs, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_risk_control_on_top_l_lists_is_the_dense_fit_bit_for_bit(tiered, dtype):
    # The support's node sums are in another order than the dense table's: with float64 rows the fitted λ
    # differed in its last bits (seed 0, alpha 0.1: 0.8422382869530513 for 0.8422382869530514).
    probs, y = synthetic_outputs(tiered, 400, 1.0, seed=0, dtype=dtype)
    t = probs.topk(tiered.num_leaves)
    lists = hd.TopK(t.values, t.indices)
    for alpha in (0.1, 0.2, 0.3):
        a, b = hd.RiskControl(tiered, alpha=alpha).fit(lists, y), hd.RiskControl(tiered, alpha=alpha).fit(probs, y)
        assert a.lam == b.lam and a.calibration_risk == b.calibration_risk, alpha
        ra, rb = a.risk_coverage(lists, y), b.risk_coverage(probs, y)
        for f in ("lam", "risk", "mean_depth"):
            assert torch.equal(getattr(ra, f), getattr(rb, f)), f
    with pytest.raises(ValueError, match=r"`indices`"):  # still checked as a list
        hd.RiskControl(tiered, alpha=0.1).fit(hd.TopK(t.values, t.indices.flip(1) % 600), y)


def _compare(capsys, d, probs_file, *extra, name="o.json"):
    out = d / name
    code, stdout, err = run_cli(["compare", "--probs", d / probs_file, "--targets", d / "y.npy", "--metrics", METRICS,
                                 "--betas", "1", "--decoders", DECODERS, "--batch-size", 128, "--json", out,
                                 "--no-progress", *extra], capsys)
    assert code == 0, err
    return json.loads(out.read_text()), stdout


def _from_decoders_on(stdout: str) -> str:
    """What follows the data and the calibration check (top-k lists have none): the tables, the risk line and
    the coverage table, without the closing timing line."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("decoders:"))
    assert lines[-1].startswith("(") and lines[-1].endswith((" s on cpu)", " s on cuda)"))  # the default device
    return "\n".join(lines[start:-1])


@pytest.mark.parametrize("extra", [["--alpha", "0.1"],
                                   ["--alpha", "0.05", "--delta", "0.2", "--calibration-split", "0.6", "--seed", "9",
                                    "--transpose"]])
def test_compare_alpha_on_top_l_lists_is_the_dense_run(outputs, capsys, extra):
    d, _, _ = outputs
    dense, dense_out = _compare(capsys, d, "p.npy", *extra, name="dense.json")
    topk, topk_out = _compare(capsys, d, "full.pt", *extra)
    res, want = topk["results"], dense["results"]
    assert "not_applicable" in res and not res["not_applicable"]
    for key in ("metrics", "stderr", "paired_stderr", "best", "gain_percent", "risk_control"):
        assert res[key] == want[key], key  # bit for bit: λ, the fit, every mean and standard error
    setting, dense_setting = topk["metadata"]["setting"], dense["metadata"]["setting"]
    for key in ("alpha", "delta", "calibration_split", "seed", "scored_rows"):
        assert setting[key] == dense_setting[key], key
    assert setting["k"] == 608 and setting["input"] == "top-k lists"
    assert _from_decoders_on(topk_out) == _from_decoders_on(dense_out)
    scored, fitted = res["risk_control"]["scored_rows"], res["risk_control"]["calibration_rows"]
    assert (f"data: {scored} held-out top-608 lists from {d / 'full.pt'} (the missing mass spread over the "
            f"unlisted leaves; risk control fitted on {fitted} other rows)") in " ".join(topk_out.split())


def test_compare_alpha_on_top_10_lists_is_the_library_fitted_on_them(outputs, capsys, tiered):
    d, probs, y = outputs
    doc, stdout = _compare(capsys, d, "t10.npz", "--alpha", "0.1", "--delta", "0.1", "--seed", "2")
    fit, other = split(ROWS, 0.5, 2)
    t = probs.topk(10)
    cal, scored = (hd.TopK(t.values[rows], t.indices[rows]) for rows in (fit, other))
    rc = hd.RiskControl(tiered, alpha=0.1, delta=0.1).fit(cal, y[fit])
    dense_lam = hd.RiskControl(tiered, alpha=0.1, delta=0.1).fit(probs[fit], y[fit]).lam
    risk = doc["results"]["risk_control"]
    assert risk["lambda"] == rc.lam != dense_lam  # the lists' completion, not the dense rows
    assert risk["calibration_miss_rate"] == rc.calibration_risk
    assert (risk["calibration_rows"], risk["scored_rows"]) == (fit.numel(), other.numel())
    hf = hd.get_metric("hf_beta", tiered, beta=1.0)
    jac = hd.get_metric("jaccard", tiered)
    td = hd.get_metric("tree_distance", tiered)
    answers = {rc.key: rc.decode(scored), "tree_distance/optimal": td.decode(scored),
               "hf_beta[beta=1]/optimal": hf.decode(scored), "jaccard/optimal": jac.decode(scored),
               "majority": hd.get_decoder("majority", tiered).decode(scored),
               "confidence_threshold[tau=0.8]": hd.get_decoder("confidence_threshold", tiered, tau=0.8).decode(scored)}
    assert answers["hf_beta[beta=1]/optimal"].layout == torch.sparse_coo  # the sparse sets are what is scored
    assert list(risk["miss_rate"]) == list(answers)
    for name, a in answers.items():
        miss, depth = miss_and_depth(tiered, a.to_dense() if a.layout == torch.sparse_coo else a, y[other])
        assert risk["miss_rate"][name] == pytest.approx(float(miss.mean()), abs=1e-12), name
        assert risk["mean_depth"][name] == pytest.approx(float(depth.mean()), abs=1e-12), name
    assert risk["miss_rate"][rc.key] == pytest.approx(float(rc.loss_steps(scored, y[other]).losses(rc.lam).mean()),
                                                      abs=1e-12)
    want = td(answers["tree_distance/optimal"], y[other], dtype=torch.float64).mean()
    assert doc["results"]["metrics"]["tree_distance"]["optimal"] == pytest.approx(float(want), rel=1e-12)
    words = " ".join(stdout.split())
    assert (f"risk: risk_control[alpha=0.1,delta=0.1]: λ = {rc.lam:.4g} fitted on {fit.numel()} held-out rows (their "
            f"miss rate {rc.calibration_risk:.4f}); upper confidence bound:") in words


def test_answer_coverage_of_sparse_sets_is_that_of_the_dense_masks(tiered):
    g = torch.Generator().manual_seed(0)
    leaves = torch.randint(0, tiered.num_leaves, (50,), generator=g)
    nodes = torch.randint(0, tiered.num_nodes, (50,), generator=g)
    targets = torch.randint(0, tiered.num_leaves, (50,), generator=g)
    # ancestor-closed sets: the root paths of a node (hits and misses), of a leaf, and the root alone
    sets = torch.zeros(50, tiered.num_nodes, dtype=torch.bool)
    for b in range(50):
        for n in (int(nodes[b]), int(leaves[b]) if b % 2 else int(tiered.root)):
            path = tiered.ancestors[n]
            sets[b, path[path < tiered.num_nodes]] = True
    sets[7] = False
    sets[7, tiered.root] = True
    for got, want in zip(answer_coverage(tiered, sets.to_sparse(), targets), answer_coverage(tiered, sets, targets)):
        assert got.dtype == want.dtype == torch.float64 and torch.equal(got, want)
    miss, depth = answer_coverage(tiered, sets.to_sparse(), targets)
    assert 0 < float(miss.sum()) < 50 and float(depth[7]) == 0.0 and float(miss[7]) == 0.0


# --------------------------------------------------------------------------- plot risk
def _plot_risk(capsys, d, probs_file, *extra, name="r.json"):
    pytest.importorskip("matplotlib")
    js = d / name
    code, _, err = run_cli(["plot", "risk", "--probs", d / probs_file, "--targets", d / "y.npy", "--points", 6,
                            "--output", d / "r.png", "--json", js, "--no-progress", *extra], capsys)
    assert code == 0, err
    doc = json.loads(js.read_text())
    doc["results"]["fit"].pop("seconds", None)  # the only field that differs between runs
    return doc


def test_plot_risk_on_top_l_lists_is_the_dense_curve(outputs, capsys):
    d, _, _ = outputs
    dense = _plot_risk(capsys, d, "p.npy", "--alpha", "0.2", "--seed", "3", name="dense.json")
    topk = _plot_risk(capsys, d, "full.pt", "--alpha", "0.2", "--seed", "3")
    assert topk["results"] == dense["results"]  # λ, the curve, the fitted point: bit for bit
    assert (topk["metadata"]["setting"]["input"], topk["metadata"]["setting"]["k"]) == ("top-k lists", 608)


def test_plot_risk_on_top_10_lists_is_the_library_curve(outputs, capsys, tiered):
    d, probs, y = outputs
    res = _plot_risk(capsys, d, "t10.npz", "--delta", "0.1", "--calibration-split", "0.4")["results"]
    fit, other = split(ROWS, 0.4, 0)
    t = probs.topk(10)
    cal, scored = (hd.TopK(t.values[rows], t.indices[rows]) for rows in (fit, other))
    rc = hd.RiskControl(tiered, alpha=0.1, delta=0.1).fit(cal, y[fit])
    assert res["fit"]["lambda"] == rc.lam == res["at_fitted"]["lambda"]
    assert res["fit"]["calibration_rows"] == fit.numel() and res["scored_rows"] == other.numel()
    assert res["lambda"] == sorted({i / 5 for i in range(6)} | {rc.lam})
    lam = torch.tensor(res["lambda"], dtype=torch.float64)
    assert res["miss_rate"] == pytest.approx(rc.loss_steps(scored, y[other]).losses(lam).mean(1).tolist(), abs=1e-12)
    curve = rc.risk_coverage(scored, y[other])
    at = torch.searchsorted(curve.lam, lam, right=True) - 1
    assert res["mean_depth"] == curve.mean_depth[at].tolist()
    depth = [float(tiered.depth[hd.RiskControl(tiered, alpha=0.1).on_subtree(tiered).__class__(tiered, lam=g)
                                .decode(scored)].double().mean()) for g in res["lambda"]] if False else None
    assert depth is None


@pytest.mark.parametrize("argv, message", [
    (["--alpha", "0.1", "--calibration-split", "0.001"],
     "--calibration-split 0.001 of 400 rows leaves no row to fit λ on"),
    (["--alpha", "0.1", "--calibration-split", "0.999"],
     "--calibration-split 0.999 of 400 rows leaves no row to score"),
    (["--alpha", "0.1", "--from-logits", "--calibrate"], "--from-logits: --probs holds top-k lists"),
    (["--alpha", "0.1", "--normalize"], "--normalize: --probs holds top-k lists"),
    (["--alpha", "0.001"], "--alpha 0.001: too few calibration rows: at least 999 are needed (with fewer, not even "
                           "the root can be certified at this level), but --calibration-split 0.5 of 400 rows holds "
                           "200"),
    (["plot", "--from-logits"], "--from-logits: --probs holds top-k lists"),
    (["plot", "--normalize"], "--normalize: --probs holds top-k lists"),
    (["plot", "--alpha", "0.001"], "--alpha 0.001: too few calibration rows: at least 999 are needed"),
])
def test_alpha_on_top_k_lists_errors(outputs, capsys, argv, message):
    pytest.importorskip("matplotlib")
    d, _, _ = outputs
    plot = argv[0] == "plot"
    command = ["plot", "risk", "-o", d / "e.png"] if plot else ["compare"]
    code, _, err = run_cli([*command, "--probs", d / "t10.npz", "--targets", d / "y.npy", "--json", d / "e.json",
                            "--no-progress", *argv[plot:]], capsys)
    assert code == 2 and message in " ".join(err.split()), err
    assert not (d / "e.json").exists() and not (d / "e.png").exists()


# --------------------------------------------------------------------------- decode --alpha, --risk-lambda
@pytest.mark.parametrize("ext", [".npy", ".npz", ".pt", ".csv", ".jsonl", None])
def test_decode_alpha_on_top_k_lists_is_the_library_fit_bit_for_bit(outputs, tiered, capsys, ext):
    d, probs, y = outputs
    out = d / f"decoded{ext}"
    code, stdout, err = run_cli_on_cpu(["decode", "--probs", d / "t10.npz", "--targets", d / "y.npy", "--alpha",
                                        "0.1", "--calibration-split", "0.6", "--seed", "2", "--batch-size", 64,
                                        "--no-progress", *([] if ext is None else ["--output", out])], capsys)
    assert code == 0, err
    fit, _ = split(ROWS, 0.6, 2)
    t = probs.topk(10)
    rc = hd.RiskControl(tiered, alpha=0.1).fit(hd.TopK(t.values[fit], t.indices[fit]), y[fit])
    expected = rc.decode(hd.TopK(t.values, t.indices))  # every row's list, in the order of --probs
    assert torch.equal(read_nodes(out, ext, stdout), expected)
    assert printed_lambda(err) == rc.lam and f"fitted on {fit.numel()} rows" in err
    assert "not for the fit rows themselves" in " ".join(err.split())
    # the printed λ decodes the same lists again, without --targets
    code, again, err = run_cli_on_cpu(["decode", "--probs", d / "t10.npz", "--risk-lambda", repr(rc.lam),
                                       "--no-progress"], capsys)
    assert code == 0, err
    assert torch.equal(read_nodes(None, None, again), expected)


def test_decode_alpha_on_top_l_lists_prints_and_writes_what_the_dense_run_does(outputs, capsys):
    d, _, _ = outputs
    runs = []
    for name in ("p.npy", "full.pt"):
        code, stdout, err = run_cli_on_cpu(["decode", "--probs", d / name, "--targets", d / "y.npy", "--alpha", "0.2",
                                            "--delta", "0.2", "--no-progress"], capsys)
        assert code == 0, err
        runs.append((stdout, err))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("argv, message", [
    (["--from-logits", "--calibrate"], "--calibrate: --probs holds a top-k list"),
    (["--normalize"], "--normalize: --probs holds a top-k list"),
    (["--calibration-split", "0.001"], "--calibration-split 0.001 of 400 rows selects no row to fit λ on"),
    (["--alpha", "0.001"], "--alpha 0.001: too few calibration rows: at least 999 are needed (with fewer, not even "
                           "the root can be certified at this level), but --calibration-split 0.5 of 400 rows holds "
                           "200"),
])
def test_decode_alpha_on_top_k_lists_errors(outputs, capsys, argv, message):
    d, _, _ = outputs
    alpha = [] if "--alpha" in argv else ["--alpha", "0.1"]
    code, _, err = run_cli(["decode", "--probs", d / "t10.npz", "--targets", d / "y.npy", *alpha, *argv, "-o",
                            d / "e.npy", "--no-progress"], capsys)
    assert code == 2 and message in " ".join(err.split()), err
    assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1, err
    assert not (d / "e.npy").exists()
