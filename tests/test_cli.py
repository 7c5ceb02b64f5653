"""The ``hdecode`` command line: every subcommand through ``main([...])``, small sizes."""

from __future__ import annotations

import csv
import json
import math
import os
import re
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
        doc = json.load(f)
    # The values under "results", what was run under "metadata"; tests read both from one dict.
    return {**doc["results"], "setting": doc["metadata"]["setting"], "doc": doc}


def small_tree_csv(tmp_path) -> str:
    """An edge list with a single-child chain and leaves at different depths; sorted leaf names a..e."""
    path = tmp_path / "tree.csv"
    path.write_text("parent,child\nroot,x\nroot,y\nroot,e\nx,a\nx,b\ny,z\nz,c\nz,d\n")
    return str(path)


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """``main(argv)`` -> (exit status, stdout, stderr); argparse's own errors exit through SystemExit."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_on_cpu(argv, capsys) -> tuple[int, str, str]:
    """``run_cli`` with ``--device cpu`` added to the commands that decode (decode, compare) when none is given:
    for tests that compare the command's output bit for bit with the library's on CPU tensors (the command's
    own default picks CUDA where present)."""
    argv = [str(a) for a in argv]
    if argv[0] in ("decode", "compare") and "--device" not in argv:
        argv += ["--device", "cpu"]
    return run_cli(argv, capsys)


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
    assert main(["info", "--hierarchy", small_tree_csv(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["hdecode_torch_version"] == hd.__version__
    stats = doc["results"]
    assert stats["num_leaves"] == 5 and stats["num_single_child_nodes"] == 1
    assert stats["single_child_chains"] == 1 and stats["longest_single_child_chain"] == 1
    assert main(["info", "--hierarchy", "inat19", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["results"]
    assert stats["num_single_child_nodes"] == 77 and stats["longest_single_child_chain"] >= 1


def test_info_prints_the_leaves_in_column_order(tmp_path, capsys, tiered):
    """Column j of --probs is the j-th leaf listed: sorted names for an edge list, --leaf-order's order
    when given (text and --json); a bundled tree lists its first and last leaves, --json all of them."""
    tree = small_tree_csv(tmp_path)
    code, out, _ = run_cli(["info", "--hierarchy", tree], capsys)
    lines = out.splitlines()
    at = [i for i, ln in enumerate(lines) if ln.startswith("leaves in column order")]
    assert code == 0 and len(at) == 1 and lines[at[0] + 1].split() == ["0", "a", "1", "b", "2", "c", "3", "d", "4", "e"]
    (tmp_path / "order.txt").write_text("e\nd\nc\nb\na\n")
    code, out, _ = run_cli(["info", "--hierarchy", tree, "--leaf-order", tmp_path / "order.txt", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["results"]["leaf_order"] == ["e", "d", "c", "b", "a"]
    assert doc["metadata"]["setting"]["leaf_order"] == str(tmp_path / "order.txt")
    # ... and it is the order decode reads the columns in: all the mass on column 0 is leaf e.
    np.save(tmp_path / "p.npy", np.eye(5)[:1])
    code, out, _ = run_cli(["decode", "--hierarchy", tree, "--leaf-order", tmp_path / "order.txt", "--probs",
                            tmp_path / "p.npy", "--metric", "accuracy", "--names"], capsys)
    assert code == 0 and out.split() == ["e"]
    code, out, _ = run_cli(["info", "--hierarchy", "tieredimagenet-h", "--json"], capsys)
    res = json.loads(out)["results"]
    assert res["leaf_order"] == [tiered.name(j) for j in range(608)]
    assert res["leaf_labels"][0] == tiered.label(0) == "tench" and res["leaf_order"][0] == "n01440764"
    code, out, _ = run_cli(["info"], capsys)
    assert "0 n01440764 (tench)" in out and "... 508 more (--json lists every leaf)" in out
    assert f"607 {tiered.name(607)}" in out


def test_info_positional_tree_is_gone(capsys):
    code, _, err = run_cli(["info", "inat19"], capsys)
    assert code == 2 and "unrecognized arguments: inat19" in err


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "hdecode_torch", "info", "--json"], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout)["results"]["num_nodes"] == 843


# --------------------------------------------------------------------------- compare
def test_compare_json_structure(compare_json):
    assert set(compare_json) >= {"metrics", "setting", "stderr", "paired_stderr", "best"}
    doc = compare_json["doc"]
    assert doc["schema_version"] == 1 and doc["hdecode_torch_version"] == hd.__version__
    assert doc["command"] == "compare" and set(doc) == {"schema_version", "hdecode_torch_version", "command",
                                                        "metadata", "results"}
    assert set(doc["metadata"]) == {"setting", "timings", "versions"}
    assert doc["metadata"]["versions"]["torch"] == torch.__version__
    assert doc["metadata"]["timings"]["total_s"] >= doc["metadata"]["timings"]["evaluation_s"] > 0
    assert list(compare_json["metrics"]) == ALL_METRIC_KEYS
    decoders = ["optimal", "argmax_leaf", "top_down", "confidence_threshold[tau=0.8]", "majority", "plurality",
                "darts[lam=1]", "expected_information", "information_threshold[threshold=3.21]", "hie", "crm"]
    for key, row in compare_json["metrics"].items():
        assert isinstance(row["higher_is_better"], bool)
        assert [k for k in row if k != "higher_is_better"] == decoders
        assert set(compare_json["stderr"][key]) == set(decoders)
        for dec in decoders:  # every metric has an optimal decoder, jaccard included
            assert math.isfinite(row[dec]) and compare_json["stderr"][key][dec] >= 0
    assert compare_json["metrics"]["accuracy"]["higher_is_better"] is True
    assert compare_json["metrics"]["tree_distance"]["higher_is_better"] is False
    s = compare_json["setting"]
    assert s["source"] == "synthetic" and s["noise"] == 1.0 and s["seed"] == 4 and s["num_samples"] == 3000
    assert s["hierarchy"] == "tieredimagenet-h" and s["num_leaves"] == 608


def test_compare_optimal_is_best_up_to_noise(compare_json):
    """Calibrated outputs: each metric's optimal decoder beats every heuristic, up to 3 paired standard errors."""
    for key, row in compare_json["metrics"].items():
        assert row["optimal"] is not None, key
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
    direct = td(td.decode(probs), y, dtype=torch.float64)  # the CLI's precision
    assert compare_json["metrics"]["tree_distance"]["optimal"] == pytest.approx(float(direct.mean()), abs=1e-9)
    assert compare_json["stderr"]["tree_distance"]["optimal"] == pytest.approx(
        float(direct.std() / math.sqrt(len(direct))), rel=1e-6)
    hf = hd.get_metric("hf_beta", tiered, beta=0.5)
    darts = hd.get_decoder("darts", tiered, lam=1.0)
    value = float(hf(darts.decode(probs), y, dtype=torch.float64).mean())  # a node scored as its ancestor set
    assert compare_json["metrics"]["hf_beta[beta=0.5]"]["darts[lam=1]"] == pytest.approx(value, abs=1e-9)
    ham = hd.get_metric("hamming", tiered)
    value = float(ham(ham.decode(probs), y, dtype=torch.float64).mean())
    assert compare_json["metrics"]["hamming"]["optimal"] == pytest.approx(value, abs=1e-9)


def table_blocks(text: str, corner: str) -> list[tuple[list[str], dict[str, list[str]]]]:
    """The blocks of a printed table: (column names, {row label: cells}).  Column names are read back
    from their right-aligned header lines (a long name is broken over several); in a row, the label
    and the cells are separated by two spaces or more."""
    lines = text.splitlines()
    blocks = []
    for i, ln in enumerate(lines):
        if not ln.startswith(corner + " "):
            continue
        top = i
        while top > 0 and lines[top - 1].strip():
            top -= 1
        ends = [m.end() for m in re.finditer(r"\S+(?: \S+)*", ln)][1:]  # right edges, after the corner
        starts = [len(corner)] + ends[:-1]
        names = ["".join(h[a:b].strip() for h in lines[top:i + 1]) for a, b in zip(starts, ends)]
        rows = {}
        for row in lines[i + 2:]:
            if not row.strip():
                break
            if row.startswith("-"):  # the rule above a footer row
                continue
            label, *cells = re.split(r"\s{2,}", row.strip())
            rows[label] = cells
        blocks.append((names, rows))
    return blocks


def test_compare_prints_one_table(capsys):
    assert main(["compare", "--num-samples", "500", "--metrics", "tree_distance,hf_beta", "--betas", "1",
                 "--decoders", "argmax_leaf", "majority", "--no-progress"]) == 0
    out = capsys.readouterr().out
    ((names, rows),) = table_blocks(out, "metric")
    assert names == ["optimal", "gain", "argmax_leaf", "majority"]
    assert list(rows) == ["tree_distance ↓", "hf_beta[beta=1] ↑"]
    td = rows["tree_distance ↓"]
    assert "±" in td[0] and td[0].endswith("*") and td[3].endswith("*")  # majority is tree distance's rule
    assert td[1] == "+0.00%"
    assert "gain: relative improvement of optimal" in " ".join(out.split())


def test_compare_table_names_are_the_json_keys_and_fit_100_columns(tmp_path, capsys):
    """Piped to a file, the default table is at most 100 characters wide, in blocks of similar size
    (none left with a single decoder), and names its rows and columns as --json does."""
    js = tmp_path / "r.json"
    assert main(["compare", "--num-samples", "300", "--json", str(js), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert max(len(ln) for ln in out.splitlines()) <= 100
    blocks = table_blocks(out, "metric")
    assert len(blocks) == 3 and min(len(names) for names, _ in blocks) >= 3
    results = json.loads(js.read_text())["results"]
    decoders = [k for k in results["metrics"]["jaccard"] if k != "higher_is_better"]
    assert [n for names, _ in blocks for n in names] == decoders[:1] + ["gain"] + decoders[1:]
    for _, rows in blocks:
        assert [label.rsplit(" ", 1)[0] for label in rows] == ALL_METRIC_KEYS
        for label in rows:
            key, arrow = label.rsplit(" ", 1)
            assert arrow == ("↑" if results["metrics"][key]["higher_is_better"] else "↓")
    # The values are the JSON's, at the printed precision.
    printed = blocks[0][1]["wu_palmer ↑"][0].split("±")[0]
    digits = len(printed.split(".")[1])
    assert float(printed) == pytest.approx(results["metrics"]["wu_palmer"]["optimal"], abs=0.51 * 10 ** -digits)
    # --transpose: a row per decoder, a column per metric, the same names; --width wraps it.
    assert main(["compare", "--num-samples", "300", "--no-progress", "--transpose", "--width", "120"]) == 0
    out = capsys.readouterr().out
    assert max(len(ln) for ln in out.splitlines()) <= 120
    blocks = table_blocks(out, "decoder")
    assert [n.rsplit(" ", 1)[0] for names, _ in blocks for n in names] == ALL_METRIC_KEYS
    assert all(list(rows) == decoders + ["gain of optimal vs best heuristic"] for _, rows in blocks)


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
        doc = json.loads(out.read_text())
        results.append({**doc["results"], "setting": doc["metadata"]["setting"]})
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
    for transpose, corner in ((False, "metric"), (True, "decoder")):
        wide = render_table(ev, transpose=transpose)
        narrow = render_table(ev, width=60, transpose=transpose)
        assert "n/a" not in wide  # jaccard's optimal decoder fills its cell
        assert max(len(ln) for ln in narrow.splitlines()) <= 60
        assert len(table_blocks(narrow, corner)) >= 2 and len(table_blocks(wide, corner)) == 1
    colored = render_table(ev, color=True)
    assert "\033[1m" in colored


def test_table_blocks_are_balanced():
    """Wrapped, the columns fill as few blocks as possible, of similar widths: 5 columns that need
    two blocks are split 3 + 2, not 4 + 1 (the last block holding only jaccard)."""
    from hdecode_torch.cli.compare import _blocks, _header_lines

    assert _blocks([20] * 5, 80) == [[0, 1, 2], [3, 4]]
    assert _blocks([16] * 11, 64) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
    assert _blocks([10, 200, 10], 50) == [[0], [1], [2]]  # a column wider than the room stands alone
    assert _blocks([10, 10], 100) == [[0, 1]]
    for name in ("information_threshold[threshold=3.21]", "confidence_threshold[tau=0.8]", "tree_distance ↓"):
        lines = _header_lines(name, 14)
        assert "".join(lines) == name and max(len(x) for x in lines) <= max(16, *(len(p) for p in
                                                                                    re.split(r"(?<=_)|(?=\[)", name)))


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
    diff = z(z.decode(probs), y, dtype=torch.float64) - z(decoders[0].decode(probs), y, dtype=torch.float64)
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
    (["--noise", "-1"], "argument --noise: expected a finite number > 0, got -1"),
    (["--tau", "1.5"], "--tau"),
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
    code, _, err = run_cli(["compare", "--num-samples", "20", "--no-progress", *argv] if "--probs" not in argv and
                           "--targets" not in argv and "--noise" not in argv else ["compare", "--no-progress", *argv],
                           capsys)
    assert code == 2
    assert [ln for ln in err.splitlines() if "error:" in ln][0].startswith("hdecode compare: error:")
    assert message in err, err


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


def test_decode_jaccard_sets(tmp_path, tiered):
    probs, _ = synthetic_outputs(tiered, 23, 1.2, seed=5, dtype=torch.float64)
    src, dst = str(tmp_path / "probs.npy"), str(tmp_path / "sets.jsonl")
    _write_probs(src, probs)
    assert main(["decode", "--probs", src, "--metric", "jaccard", "--output", dst, "--batch-size", "10"]) == 0
    got = _read_pred(dst, tiered, True)
    assert torch.equal(got, hd.get_metric("jaccard", tiered).decode(probs))
    assert bool(got[:, tiered.root].all()) and int(got.sum(1).min()) >= 2  # more than the root on these outputs


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
    code, _, err = run_cli(["decode", "--probs", str(tmp_path / "p.npy"), *argv], capsys)
    assert code == 2
    assert [ln for ln in err.splitlines() if "error:" in ln][0].startswith("hdecode decode: error:")
    assert message in err, err


def test_decode_requires_metric_or_decoder(tmp_path, capsys):
    code, _, err = run_cli(["decode", "--probs", "x.npy"], capsys)
    assert code == 2
    assert "hdecode decode: error: what to decode: give one of --metric, --decoder, --alpha" in err


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
    jac = agreement_mask(h, hd.get_metric("jaccard", h), hd.get_decoder("majority", h), grid)
    assert 0.05 < float(jac.double().mean()) < 0.95


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
    out3 = tmp_path / "jaccard.png"
    assert main(["plot", "agreement", "--metric", "jaccard", "--heuristic", "majority", "--resolution", "20",
                 "--output", str(out3)]) == 0
    assert png_size(out3) == (w, h)


def test_plot_gain(tmp_path):
    pytest.importorskip("matplotlib")
    out, js = tmp_path / "gain.png", tmp_path / "gain.json"
    assert main(["plot", "gain", "--metrics", "tree_distance,wu_palmer", "--decoders", "argmax_leaf,majority",
                 "--noise", "0.5", "2", "--num-seeds", "2", "--num-samples", "300", "--output", str(out),
                 "--json", str(js), "--no-progress"]) == 0
    w, h = png_size(out)
    assert w > 400 and h > 200 and out.stat().st_size > 10_000
    doc = json.loads(js.read_text())
    assert doc["schema_version"] == 1 and doc["metadata"]["setting"]["num_seeds"] == 2
    data = doc["results"]
    assert data["noise"] == [0.5, 2.0] and set(data["gain_percent"]) == {"tree_distance", "wu_palmer"}
    td = data["gain_percent"]["tree_distance"]
    assert td["majority"]["mean"] == [0.0, 0.0]  # majority is the optimal tree-distance decoder
    assert td["argmax_leaf"]["mean"][1] > td["argmax_leaf"]["mean"][0] > 0  # the gain grows with noise
    assert len(td["argmax_leaf"]["ci95_halfwidth"]) == 2


@pytest.mark.parametrize("argv, message", [
    (["agreement", "--heuristic", "nope", "--output", "{d}/a.png"], "unknown decoder"),
    (["agreement", "--resolution", "1", "--output", "{d}/a.png"], "--resolution"),
    (["gain", "--num-seeds", "0", "--output", "{d}/g.png"], "--num-seeds"),
    (["gain", "--noise", "0", "--output", "{d}/g.png"], "--noise"),
])
def test_plot_errors(tmp_path, capsys, argv, message):
    argv = [a.replace("{d}", str(tmp_path)) for a in argv]
    code, _, err = run_cli(["plot", *argv], capsys)
    assert code == 2
    assert [ln for ln in err.splitlines() if "error:" in ln][0].startswith(f"hdecode plot {argv[0]}: error:")
    assert message in err, err


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


# =========================================================================== reliability (round 2)
def _tiny(tmp_path, rows: int = 8, seed: int = 0):
    """The 5-leaf edge-list tree, calibrated probabilities and labels as .npy files."""
    tree = small_tree_csv(tmp_path)
    h = hd.Hierarchy.from_edges(tree)
    probs, y = synthetic_outputs(h, rows, 1.0, seed=seed, dtype=torch.float64)
    np.save(tmp_path / "p.npy", probs.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    return tree, h, probs, y


def _error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_csv_first_row_with_a_bad_cell_is_an_error_not_a_header(tmp_path, capsys):
    tree, h, probs, _ = _tiny(tmp_path, rows=3)
    rows = [",".join(f"{v:.17g}" for v in r) for r in probs.tolist()]
    (tmp_path / "bad.csv").write_text("NA," + rows[0].split(",", 1)[1] + "\n" + "\n".join(rows[1:]) + "\n")
    code, out, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "bad.csv", "--metric", "zhao"],
                             capsys)
    assert code == 2 and out == ""
    assert "bad.csv', line 1, column 1: 'NA' is not a number" in _error_line(err)
    # A real header (no number in it) is skipped; a bad cell further down names its line.
    (tmp_path / "hdr.csv").write_text("a,b,c,d,e\n" + "\n".join(rows) + "\n")
    assert run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "hdr.csv", "--metric", "zhao"],
                   capsys)[0] == 0
    (tmp_path / "bad3.csv").write_text("a,b,c,d,e\n" + rows[0] + "\n\n" + rows[1].replace(",", ",x", 1) + "\n")
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "bad3.csv", "--metric", "zhao"],
                           capsys)
    assert code == 2 and "line 4, column 2: 'x" in _error_line(err)


def test_edge_list_numeric_leaves_are_columns_in_numeric_order(tmp_path, capsys):
    tree = tmp_path / "num.csv"
    tree.write_text("".join(f"r,{i}\n" for i in range(12)))
    probs = torch.zeros(1, 12, dtype=torch.float64)
    probs[0, 10] = 1.0  # column 10 is the leaf named "10"
    np.save(tmp_path / "p.npy", probs.numpy())
    code, out, _ = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--metric", "accuracy",
                            "--names"], capsys)
    assert code == 0 and out.split() == ["10"]
    assert "by numeric value" in " ".join(run_cli(["decode", "--help"], capsys)[1].split())


def test_plot_gain_json_writes_null_for_nan(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import hdecode_torch.cli.plot as plot_mod

    monkeypatch.setattr(plot_mod, "relative_gain", lambda *a: math.nan)  # a heuristic scoring 0: gain undefined
    js = tmp_path / "g.json"
    assert main(["plot", "gain", "--metrics", "tree_distance", "--decoders", "majority", "--noise", "1",
                 "--num-seeds", "1", "--num-samples", "50", "--output", str(tmp_path / "g.png"), "--json", str(js),
                 "--no-progress"]) == 0
    text = js.read_text()
    assert "NaN" not in text
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert doc["results"]["gain_percent"]["tree_distance"]["majority"]["mean"] == [None]


def test_plot_agreement_reports_the_path_it_wrote(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, out, _ = run_cli(["plot", "agreement", "--resolution", "10", "--output", tmp_path / "noext"], capsys)
    assert code == 0 and out.strip() == f"wrote {tmp_path / 'noext.png'}"
    assert png_size(tmp_path / "noext.png")[0] > 100 and not (tmp_path / "noext").exists()


def test_tree_distance_c_help_explains_large_c(capsys):
    for argv in (["compare", "--help"], ["decode", "--help"]):
        text = " ".join(run_cli(argv, capsys)[1].split())
        assert "(1+c)/2" in text and "c >= 1" in text and "root" in text


@pytest.mark.parametrize("where, message", [
    ("{d}/missing/out.npy", "the folder '{d}/missing' does not exist"),
    ("{d}", "is a folder"),
    ("/proc/hdecode_out.npy", "cannot write in the folder"),
    ("{d}/p.npy", "is the input file --probs"),
    ("{d}/link.npy", "is the input file --probs"),
    ("{d}/./sub/../p.npy", "is the input file --probs"),
])
def test_decode_checks_the_output_before_any_work(tmp_path, capsys, monkeypatch, where, message):
    import hdecode_torch.cli.decode as decode_mod

    tree, *_ = _tiny(tmp_path)
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "p.npy", tmp_path / "link.npy")
    before = (tmp_path / "p.npy").read_bytes()
    monkeypatch.setattr(decode_mod, "load_probs", lambda *a, **k: pytest.fail("work started before the check"))
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--metric", "zhao",
                            "--output", where.replace("{d}", str(tmp_path))], capsys)
    assert code == 2 and message.replace("{d}", str(tmp_path)) in _error_line(err)
    assert (tmp_path / "p.npy").read_bytes() == before


def test_compare_json_onto_the_targets_is_refused(tmp_path, capsys):
    tree, *_ = _tiny(tmp_path)
    before = (tmp_path / "y.npy").read_bytes()
    os.symlink(tmp_path / "y.npy", tmp_path / "y_link.json")
    for out in (tmp_path / "y.npy", tmp_path / "y_link.json"):
        code, _, err = run_cli(["compare", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--targets",
                                tmp_path / "y.npy", "--json", out, "--no-progress"], capsys)
        assert code == 2 and "is the input file --targets" in _error_line(err)
    assert (tmp_path / "y.npy").read_bytes() == before


def test_plot_gain_checks_the_json_path_before_writing_the_image(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, _, err = run_cli(["plot", "gain", "--metrics", "tree_distance", "--decoders", "majority", "--noise", "1",
                            "--num-seeds", "1", "--num-samples", "20", "--output", tmp_path / "g.png",
                            "--json", tmp_path / "nope" / "g.json", "--no-progress"], capsys)
    assert code == 2 and "--json" in _error_line(err)
    assert not (tmp_path / "g.png").exists()


@pytest.mark.parametrize("ext", [".npy", ".pt", ".csv", ".jsonl"])
@pytest.mark.parametrize("failure", ["disk full", "ctrl-c"])
def test_failed_write_keeps_the_old_file(tmp_path, capsys, monkeypatch, ext, failure):
    """A write that fails half-way (full disk) or is interrupted leaves the old file and no temporary."""
    import hdecode_torch.cli.io as cli_io

    tree, *_ = _tiny(tmp_path)
    out = tmp_path / f"pred{ext}"
    out.write_bytes(b"old predictions")

    class Failing:
        """Writes half of the first chunk it is given, then fails."""

        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(data[: max(1, len(data) // 2)]))
            raise OSError(28, "No space left on device") if failure == "disk full" else KeyboardInterrupt()

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(cli_io, "_PlainWrites", Failing)
    real_wrapper = cli_io.io.TextIOWrapper
    monkeypatch.setattr(cli_io.io, "TextIOWrapper",
                        lambda raw, **kw: real_wrapper(Failing(raw), write_through=True, **kw))
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--metric", "hf_beta",
                            "--output", out, "--no-progress"], capsys)
    if failure == "disk full":
        assert code == 1 and "cannot write" in _error_line(err) and "No space left on device" in err
    else:
        assert code == 130 and err.strip() == "hdecode decode: interrupted" and "Traceback" not in err
    assert out.read_bytes() == b"old predictions"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.npy", f"pred{ext}", "tree.csv", "y.npy"]


@pytest.mark.parametrize("argv", [
    ["compare", "--num-samples", "50", "--metrics", "zhao", "--decoders", "majority"],
    ["decode", "--metric", "zhao"],
    ["plot", "agreement", "--resolution", "10"],
])
def test_ctrl_c_exits_130_quietly(tmp_path, capsys, monkeypatch, argv):
    import hdecode_torch.cli.compare as compare_mod
    import hdecode_torch.cli.decode as decode_mod
    import hdecode_torch.cli.plot as plot_mod

    if argv[0] == "plot":
        pytest.importorskip("matplotlib")
        argv = argv + ["--output", str(tmp_path / "a.png")]
    if argv[0] == "decode":
        tree, *_ = _tiny(tmp_path)
        argv = argv + ["--hierarchy", tree, "--probs", str(tmp_path / "p.npy"), "--output", str(tmp_path / "o.npy")]

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(compare_mod, "evaluate", interrupt)
    monkeypatch.setattr(decode_mod, "chunk_posterior", interrupt)
    monkeypatch.setattr(plot_mod, "agreement_mask", interrupt)
    code, out, err = run_cli(argv, capsys)
    assert code == 130 and err.strip().endswith("interrupted") and "Traceback" not in err
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".png", ".tmp") or p.name == "o.npy"]


def test_bounded_numbers_name_their_flag(capsys):
    code, _, err = run_cli(["compare", "--seed", "99999999999999999999"], capsys)
    assert code == 2 and "argument --seed: expected an integer in 0..2^63-1" in _error_line(err)
    code, _, err = run_cli(["plot", "agreement", "--dpi", "100000", "--output", "x.png"], capsys)
    assert code == 2 and "argument --dpi: expected an integer in 10..1200" in _error_line(err)
    code, _, err = run_cli(["compare", "--noise", "nan"], capsys)
    assert code == 2 and "argument --noise: expected a finite number > 0, got nan" in _error_line(err)


def test_figure_size_is_bounded_before_drawing(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    code, _, err = run_cli(["plot", "agreement", "--decoders", "all", "--dpi", "1200", "--resolution", "10",
                            "--output", tmp_path / "a.png"], capsys)
    assert code == 2 and "--dpi 1200: the figure would be" in _error_line(err) and "--dpi 6" in err
    assert not (tmp_path / "a.png").exists()


class _NotATensor:
    pass


def test_pt_inputs(tmp_path, capsys):
    tree, h, probs, _ = _tiny(tmp_path)
    want = hd.get_metric("zhao", h).decode(probs).tolist()
    torch.save(probs.numpy(), tmp_path / "np.pt")  # a numpy array saved with torch.save loads, safely
    code, out, _ = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "np.pt", "--metric", "zhao"], capsys)
    assert code == 0 and [int(x) for x in out.split()] == want
    (tmp_path / "empty.pt").write_bytes(b"")
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "empty.pt", "--metric", "zhao"],
                           capsys)
    assert code == 2 and "'" + str(tmp_path / "empty.pt") + "' is empty (0 bytes)" in _error_line(err)
    torch.save(_NotATensor(), tmp_path / "obj.pt")
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "obj.pt", "--metric", "zhao"], capsys)
    line = _error_line(err)
    assert code == 2 and "not safe to load" in line and "_NotATensor" in line and "\x1b" not in err
    assert len(err.strip().splitlines()) == 1
    (tmp_path / "cut.pt").write_bytes((tmp_path / "np.pt").read_bytes()[:100])
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "cut.pt", "--metric", "zhao"], capsys)
    assert code == 2 and "as a .pt file (truncated" in _error_line(err)


def test_hierarchy_file_errors_name_the_file(tmp_path, capsys):
    (tmp_path / "t.json").write_text('{"parents": [2, 2,')
    code, _, err = run_cli(["info", "--hierarchy", tmp_path / "t.json"], capsys)
    assert code == 2 and "t.json': not valid JSON" in _error_line(err) and "truncated" in err
    (tmp_path / "t.csv").write_text("r,a\nr,b,c\n")
    code, _, err = run_cli(["info", "--hierarchy", tmp_path / "t.csv"], capsys)
    assert code == 2 and "t.csv', line 2: expected 2 fields" in _error_line(err)


def test_library_hints_name_cli_flags(tmp_path, capsys):
    tree, h, probs, y = _tiny(tmp_path)
    np.save(tmp_path / "logits.npy", (probs.log() * 2 - 1).numpy())
    np.save(tmp_path / "scaled.npy", (probs * 3).numpy())
    for f, flag in (("logits.npy", "--from-logits"), ("scaled.npy", "--normalize")):
        code, _, err = run_cli(["compare", "--hierarchy", tree, "--probs", tmp_path / f, "--targets",
                                tmp_path / "y.npy", "--no-progress"], capsys)
        line = _error_line(err)
        assert code == 2 and flag in line and "=True" not in line and "`probs`" not in line, line


def test_row_numbers_in_errors_count_from_the_first_row(tmp_path, capsys):
    tree, h, probs, _ = _tiny(tmp_path, rows=10)
    probs[7, 0] = float("nan")
    np.save(tmp_path / "nan.npy", probs.numpy())
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "nan.npy", "--metric", "zhao",
                            "--batch-size", "3"], capsys)
    assert code == 2 and "row 7 contains NaN" in _error_line(err)


def test_library_warnings_are_one_line(tmp_path, capsys):
    tree, h, _, y = _tiny(tmp_path, rows=6)
    logits = torch.zeros(6, h.num_leaves, dtype=torch.float64)
    logits[torch.arange(6), y] = 4.0  # every target ranked first: no temperature minimum, a warning
    np.save(tmp_path / "z.npy", logits.numpy())
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "z.npy", "--from-logits",
                            "--calibrate", "--targets", tmp_path / "y.npy", "--metric", "zhao",
                            "--output", tmp_path / "o.npy"], capsys)
    assert code == 0
    warn = [ln for ln in err.splitlines() if "warning:" in ln]
    assert len(warn) == 1 and warn[0].startswith("hdecode decode: warning: Temperature scaling: the logits rank")


# =========================================================================== a tidy command line
def test_version(capsys):
    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"hdecode {hd.__version__}"


def _stdin(monkeypatch, data: bytes) -> None:
    import io as _io

    monkeypatch.setattr(sys, "stdin", _io.TextIOWrapper(_io.BytesIO(data)))


@pytest.mark.parametrize("fmt", ["npy", "pt", "csv", "tsv"])
def test_probs_from_standard_input(tmp_path, capsys, monkeypatch, fmt):
    import io as _io

    tree, h, probs, _ = _tiny(tmp_path)
    buf = _io.BytesIO()
    if fmt == "npy":
        np.save(buf, probs.numpy())
    elif fmt == "pt":
        torch.save(probs, buf)
    else:
        np.savetxt(buf, probs.numpy(), delimiter="," if fmt == "csv" else "\t", fmt="%.17g")
    _stdin(monkeypatch, buf.getvalue())
    code, out, err = run_cli(["decode", "--hierarchy", tree, "--probs", "-", "--metric", "wu_palmer"], capsys)
    assert code == 0, err
    assert [int(x) for x in out.split()] == hd.get_metric("wu_palmer", h).decode(probs).tolist()


def test_targets_and_hierarchy_from_standard_input(tmp_path, capsys, monkeypatch):
    tree, h, probs, y = _tiny(tmp_path, rows=30)
    _stdin(monkeypatch, "\n".join(map(str, y.tolist())).encode())
    out = tmp_path / "r.json"
    assert run_cli(["compare", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--targets", "-",
                    "--metrics", "zhao", "--decoders", "majority", "--json", out, "--no-progress"], capsys)[0] == 0
    zhao = hd.get_metric("zhao", h)
    assert json.loads(out.read_text())["results"]["metrics"]["zhao"]["optimal"] == pytest.approx(
        float(zhao(zhao.decode(probs), y, dtype=torch.float64).mean()), abs=1e-9)
    _stdin(monkeypatch, open(tree, "rb").read())
    code, text, _ = run_cli(["info", "--hierarchy", "-", "--json"], capsys)
    assert code == 0 and json.loads(text)["results"]["num_leaves"] == 5
    code, _, err = run_cli(["compare", "--hierarchy", "-", "--probs", "-", "--targets", tmp_path / "y.npy"], capsys)
    assert code == 2 and "only one input can be read from standard input" in _error_line(err)


def test_aliases_select_the_same_thing(tmp_path, capsys):
    tree, h, *_ = _tiny(tmp_path, rows=40)
    docs = []
    for argv in (["--metrics", "hf_beta", "--betas", "2", "--decoders", "darts", "--lam", "0.5"],
                 ["--metric", "hf_beta", "--beta", "2", "--decoder", "darts", "--lam", "0.5"],
                 ["--metric", "hf_beta,hf", "--beta", "2", "2", "--decoder", "darts", "darts", "--lam", "0.5"]):
        out = tmp_path / f"a{len(docs)}.json"
        assert run_cli(["compare", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--targets",
                        tmp_path / "y.npy", "--json", out, "--no-progress", *argv], capsys)[0] == 0
        docs.append(json.loads(out.read_text())["results"])
    assert list(docs[0]["metrics"]) == ["hf_beta[beta=2]"]  # duplicates removed
    assert docs[0]["metrics"] == docs[1]["metrics"] == docs[2]["metrics"]
    assert list(docs[0]["metrics"]["hf_beta[beta=2]"]) == ["higher_is_better", "optimal", "darts[lam=0.5]"]
    # decode takes the plural spellings for its one metric / decoder too
    a = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--metrics", "zhao"], capsys)[1]
    b = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--metric", "zhao"], capsys)[1]
    assert a == b and a


def test_one_default_per_option(capsys):
    from hdecode_torch.cli import common
    from hdecode_torch.cli.main import build_parser

    parser = build_parser()
    base = {"compare": [], "decode": ["--probs", "x.npy", "--metric", "zhao"],
            "plot gain": ["--output", "g.png"], "plot agreement": ["--output", "a.png"]}
    seen = {}
    for cmd, extra in base.items():
        args = parser.parse_args(cmd.split() + extra)
        for opt in ("batch_size", "threads", "dpi", "device", "tau", "lam", "c", "beta", "betas", "info_threshold"):
            if hasattr(args, opt):
                seen.setdefault(opt, set()).add(repr(getattr(args, opt)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}
    assert seen["batch_size"] == {repr(common.DEFAULT_BATCH_SIZE)} and seen["tau"] == {"None"}
    # Unset parameters fall back to the same values everywhere: decode's confidence_threshold is compare's.
    h = hd.load_hierarchy("inat19")
    probs, _ = synthetic_outputs(h, 5, 1.0, seed=0)
    for name, params in (("confidence_threshold", {"tau": 0.8}), ("darts", {"lam": 1.0})):
        assert common.build_heuristics(h, [name])[0].params == params


def test_inapplicable_options_are_errors(tmp_path, capsys):
    tree, *_ = _tiny(tmp_path)
    p = ["--hierarchy", tree, "--probs", tmp_path / "p.npy"]
    cases = [
        (["decode", *p, "--metric", "wu_palmer", "--beta", "0.5"], "--beta applies to the metric hf_beta"),
        (["decode", *p, "--metric", "wu_palmer", "--tau", "0.7"], "--tau applies to the decoder confidence_threshold"),
        (["decode", *p, "--decoder", "majority", "--lam", "2"], "--lam applies to the decoder darts"),
        (["decode", *p, "--metric", "zhao", "--c", "1"], "--c applies to the metric tree_distance_c"),
        (["decode", *p, "--metric", "zhao", "--seed", "1"], "--seed applies to --calibrate"),
        (["compare", "--metrics", "zhao", "--betas", "1"], "--betas applies to the metric hf_beta"),
        (["compare", "--decoders", "majority", "--info-threshold", "1"], "--info-threshold applies to the decoder"),
        (["compare", "--metrics", ","], "--metrics: no name given"),
        (["compare", "--decoders", "optimal"], "'optimal' is not a heuristic"),
        (["compare", "--decoders", "majority,wu_palmer/optimal"], "'optimal' is not a heuristic"),  # a label
        (["compare", "--decoders", "optimal:wu_palmer"], "'optimal' is not a heuristic"),
        (["compare", "--calibrate"], "--calibrate applies to --probs"),
        (["plot", "agreement", "--metric", "zhao", "--beta", "2", "--output", tmp_path / "a.png"], "--beta applies"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and message in _error_line(err), (argv, err)


def test_unknown_options_show_the_subcommand_usage(capsys):
    code, _, err = run_cli(["decode", "--probs", "x.npy", "--metric", "zhao", "--bogus"], capsys)
    assert code == 2 and err.startswith("usage: hdecode decode") and "unrecognized arguments: --bogus" in err
    code, _, err = run_cli(["plot", "gain", "--output", "g.png", "--bogus"], capsys)
    assert code == 2 and err.startswith("usage: hdecode plot gain")
    # No abbreviations: `--num-sample` is not silently `--num-samples`, `--seed` never `--seeds`.
    code, _, err = run_cli(["compare", "--num-sample", "10"], capsys)
    assert code == 2 and "unrecognized arguments: --num-sample 10" in err


def test_plot_gain_seeds_is_a_deprecated_alias(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    args = ["plot", "gain", "--metrics", "tree_distance", "--decoders", "majority", "--noise", "1",
            "--num-samples", "20", "--output", tmp_path / "g.png", "--json", tmp_path / "g.json", "--no-progress"]
    code, _, err = run_cli(args + ["--seeds", "2"], capsys)
    assert code == 0 and "hdecode plot gain: warning: --seeds is deprecated: use --num-seeds" in err
    setting = json.loads((tmp_path / "g.json").read_text())["metadata"]["setting"]
    assert setting["num_seeds"] == 2 and setting["first_seed"] == 0
    code, _, err = run_cli(args + ["--seeds", "2", "--num-seeds", "2"], capsys)
    assert code == 2 and "old name of --num-seeds" in err


def test_progress_starts_before_the_data(capsys, monkeypatch):
    """On a terminal the bar is up before the synthetic data are drawn (the slow first step)."""
    pytest.importorskip("tqdm")
    import hdecode_torch.cli.compare as compare_mod
    import hdecode_torch.cli.progress as progress_mod

    monkeypatch.setattr(progress_mod, "_stderr_is_tty", lambda: True)
    shown = []
    real = compare_mod.synthetic_outputs

    def draw(*a, **k):
        shown.append(capsys.readouterr().err)
        return real(*a, **k)

    monkeypatch.setattr(compare_mod, "synthetic_outputs", draw)
    assert main(["compare", "--num-samples", "200", "--metrics", "zhao", "--decoders", "majority"]) == 0
    assert "compare: drawing 200 synthetic samples" in shown[0]
    assert "compare: decoding and scoring" in capsys.readouterr().err
    code, _, err = run_cli(["compare", "--num-samples", "200", "--metrics", "zhao", "--decoders", "majority",
                            "--no-progress"], capsys)
    assert code == 0 and err == ""


# =========================================================================== calibration
def test_compare_calibrate_helps_an_over_confident_model(tmp_path, capsys):
    """logits = 3 x true log-probabilities: uncalibrated, the optimal decoders lose to heuristics; with
    --calibrate (T fitted on half the rows), they score better or the same on the other half."""
    from hdecode_torch.cli.common import calibration_split

    h = hd.load_hierarchy("inat19")
    probs, y = synthetic_outputs(h, 2000, 1.0, seed=1, dtype=torch.float64)
    z = 3.0 * probs.log()
    np.save(tmp_path / "z.npy", z.numpy())
    np.save(tmp_path / "y.npy", y.numpy())
    _, held = calibration_split(2000, 0.5, 0)
    np.save(tmp_path / "z_held.npy", z[held].numpy())
    np.save(tmp_path / "y_held.npy", y[held].numpy())
    common = ["--hierarchy", "inat19", "--from-logits", "--metrics", "tree_distance,wu_palmer,hf_beta,hamming",
              "--betas", "1", "--decoders", "argmax_leaf,majority", "--no-progress"]
    code, out, _ = run_cli(["compare", "--probs", tmp_path / "z.npy", "--targets", tmp_path / "y.npy",
                            "--calibrate", "--json", tmp_path / "cal.json", *common], capsys)
    assert code == 0 and "calibration: T = 3." in out and "held-out rows" in out
    assert run_cli(["compare", "--probs", tmp_path / "z_held.npy", "--targets", tmp_path / "y_held.npy",
                    "--json", tmp_path / "raw.json", *common], capsys)[0] == 0
    cal = json.loads((tmp_path / "cal.json").read_text())
    raw = json.loads((tmp_path / "raw.json").read_text())["results"]
    info = cal["results"]["calibration"]
    assert 2.7 < info["temperature"] < 3.3 and info["fit_rows"] == info["other_rows"] == 1000
    assert info["nll_other_after"] < info["nll_other_before"] - 0.5
    assert cal["metadata"]["setting"]["scored_rows"] == 1000 and cal["metadata"]["timings"]["calibration_s"] > 0
    for key, row in cal["results"]["metrics"].items():
        sign = 1 if row["higher_is_better"] else -1
        assert sign * (row["optimal"] - raw["metrics"][key]["optimal"]) >= 0, key
    # Over-confident, the optimal tree-distance decoder picks nodes too deep: calibration fixes a real loss.
    assert raw["metrics"]["tree_distance"]["optimal"] - cal["results"]["metrics"]["tree_distance"]["optimal"] > 0.1


def test_decode_calibrate(tmp_path, capsys):
    tree, h, probs, y = _tiny(tmp_path, rows=200, seed=2)
    z = 2.0 * probs.log()
    np.save(tmp_path / "z.npy", z.numpy())
    code, out, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "z.npy", "--from-logits",
                              "--calibrate", "--targets", tmp_path / "y.npy", "--calibration-split", "0.5",
                              "--seed", "3", "--metric", "wu_palmer"], capsys)
    assert code == 0
    line = [ln for ln in err.splitlines() if "calibration" in ln][0]
    assert line.startswith("hdecode decode: calibration: T = ") and "held-out rows" in line
    from hdecode_torch.cli.common import calibration_split

    fit, _ = calibration_split(200, 0.5, 3)
    scaler = hd.TemperatureScaler().fit(z[fit], y[fit])
    assert f"T = {scaler.temperature:.4g}" in line
    want = hd.get_metric("wu_palmer", h).decode(torch.softmax(z / scaler.temperature, 1))
    assert [int(x) for x in out.split()] == want.tolist()  # every row decoded, in input order
    for argv, message in ((["--calibrate", "--targets", tmp_path / "y.npy"], "add --from-logits"),
                          (["--calibrate", "--from-logits"], "add --targets"),
                          (["--calibration-split", "0.3"], "--calibration-split applies to --calibrate"),
                          (["--targets", tmp_path / "y.npy"], "--targets applies to --calibrate")):
        code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "z.npy", "--metric", "zhao",
                                *argv], capsys)
        assert code == 2 and message in _error_line(err), err
    code, _, err = run_cli(["compare", "--hierarchy", tree, "--probs", tmp_path / "z.npy", "--targets",
                            tmp_path / "y.npy", "--from-logits", "--calibrate", "--calibration-split", "1"], capsys)
    assert code == 2 and "argument --calibration-split: expected a finite number > 0 and < 1" in err


def test_help_texts_have_no_doubled_percent(capsys):
    for argv in (["plot", "gain", "--help"], ["plot", "--help"], ["compare", "--help"]):
        out = run_cli(argv, capsys)[1]
        assert "%%" not in out
    assert "95% confidence" in " ".join(run_cli(["plot", "gain", "--help"], capsys)[1].split())


@pytest.mark.parametrize("kind", ["compare --json", "plot agreement"])
def test_failed_json_and_image_writes_keep_the_old_file(tmp_path, capsys, monkeypatch, kind):
    import hdecode_torch.cli.io as cli_io

    if kind == "plot agreement":
        pytest.importorskip("matplotlib")
        out = tmp_path / "a.png"
        argv = ["plot", "agreement", "--resolution", "8", "--output", out]
    else:
        out = tmp_path / "r.json"
        argv = ["compare", "--num-samples", "30", "--metrics", "zhao", "--decoders", "majority", "--json", out,
                "--no-progress"]
    out.write_bytes(b"old")

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(bytes(data[:10]) if isinstance(data, (bytes, bytearray, memoryview)) else b"x")
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(cli_io, "_PlainWrites", Full)
    real_wrapper = cli_io.io.TextIOWrapper
    monkeypatch.setattr(cli_io.io, "TextIOWrapper", lambda raw, **kw: real_wrapper(Full(raw), write_through=True, **kw))
    code, _, err = run_cli(argv, capsys)
    assert code == 1 and "No space left on device" in _error_line(err)
    assert out.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == [out.name]


# =========================================================================== start-up (issue 26)
_STARTUP = r"""
import contextlib, io, sys
from hdecode_torch.cli.main import main

out = []
for argv in [["--help"], ["--version"], ["compare", "--help"], ["decode", "--help"], ["plot", "gain", "--help"],
             ["info", "--help"], ["compare", "--bogus"], ["decode", "--probs", "p.npy"],
             ["compare", "--targets", "y.npy"], ["decode", "--probs", "p.npy", "--metric", "zhao", "--seed", "1"],
             ["compare", "--probs", "p.npy", "--targets", "y.npy", "--calibrate", "--from-logits", "auto"]]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out.append((" ".join(argv), code, "torch" in sys.modules, err.getvalue().strip().splitlines()[-1:]))
for row in out:
    print(row)
"""


def test_help_version_and_bad_command_lines_answer_before_torch_loads():
    """`hdecode --help`, `--version`, and an error in the options alone (argparse's or a combination)
    are answered without importing torch (~2 s): in one process, torch is still not loaded after all."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", _STARTUP], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [eval(ln) for ln in proc.stdout.splitlines()]  # noqa: S307 - our own repr of tuples
    assert [r[1] for r in rows] == [0] * 6 + [2] * 5
    assert not any(r[2] for r in rows), rows
    assert "--targets needs --probs" in rows[8][3][0] and "--seed applies to --calibrate" in rows[9][3][0]
    assert "not --from-logits auto" in rows[10][3][0]


def test_static_name_tables_are_the_library_registries():
    """The help texts list names from static tables (no torch); they must be the registries."""
    from hdecode_torch import synthetic
    from hdecode_torch.cli import options

    assert list(options.METRIC_NAMES) == list(hd.list_metrics())
    assert list(options.HEURISTIC_NAMES) == [n for n in hd.list_decoders() if n != "optimal"]
    assert list(options.HIERARCHY_NAMES) == list(hd.list_hierarchies())
    assert options.SYNTHETIC_NOISE == synthetic.DEFAULT_NOISE


# =========================================================================== --from-logits auto (issue 24)
def test_from_logits_auto_and_warnings_in_cli_terms(tmp_path, capsys):
    tree, h, probs, y = _tiny(tmp_path, rows=20)
    z = 2.0 * probs.log() - 1.0
    np.save(tmp_path / "z.npy", z.numpy())
    zhao = hd.get_metric("zhao", h)
    cases = [("p.npy", ["--from-logits", "auto"], zhao.decode(probs)), ("z.npy", ["--from-logits", "auto"],
             zhao.decode(torch.softmax(z, 1))), ("p.npy", ["--from-logits", "false"], zhao.decode(probs)),
             ("z.npy", ["--from-logits", "true"], zhao.decode(torch.softmax(z, 1)))]
    for name, flags, want in cases:
        code, out, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / name, *flags, "--metric",
                                  "zhao", "--no-progress"], capsys)
        assert code == 0 and err == "" and [int(x) for x in out.split()] == want.tolist(), (name, flags, err)
    js = tmp_path / "r.json"
    assert run_cli(["compare", "--hierarchy", tree, "--probs", tmp_path / "z.npy", "--targets", tmp_path / "y.npy",
                    "--from-logits", "auto", "--metrics", "zhao", "--decoders", "majority", "--json", js,
                    "--no-progress"], capsys)[0] == 0
    doc = json.loads(js.read_text())
    assert doc["metadata"]["setting"]["from_logits"] == "auto"
    assert doc["results"]["metrics"]["zhao"]["optimal"] == pytest.approx(
        float(zhao(zhao.decode(torch.softmax(z, 1)), y, dtype=torch.float64).mean()), abs=1e-9)
    # Probabilities passed as logits: the warning names the command line's options, not API keywords.
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--from-logits",
                            "--metric", "zhao", "--no-progress"], capsys)
    warn = [ln for ln in err.splitlines() if "warning:" in ln]
    assert code == 0 and len(warn) == 1, err
    assert "leave out --from-logits for probabilities (or --from-logits auto)" in warn[0] and "from_logits" not in warn[0]
    code, _, err = run_cli(["decode", "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--from-logits", "maybe",
                            "--metric", "zhao"], capsys)
    assert code == 2 and "argument --from-logits: expected auto, true or false, got 'maybe'" in err


@pytest.mark.parametrize("api, cli", [
    ("pass from_logits=False for probabilities (or from_logits='auto')",
     "leave out --from-logits for probabilities (or --from-logits auto)"),
    ('use from_logits="auto" or normalize=True', "use --from-logits auto or --normalize"),
    ("with from_logits=False, `probs` must sum to 1", "with no --from-logits, --probs must sum to 1"),
    ("or from_logits=True for logits", "or --from-logits for logits"),
])
def test_cli_wording(api, cli):
    from hdecode_torch.cli.main import cli_wording

    assert cli_wording(api) == cli


def test_calibrate_refuses_probabilities(tmp_path, capsys):
    """`--calibrate` on probabilities (given --from-logits) fitted a meaningless T in silence."""
    tree, h, probs, y = _tiny(tmp_path, rows=40)
    for cmd in (["compare", "--targets", tmp_path / "y.npy"], ["decode", "--metric", "zhao", "--targets",
                                                                 tmp_path / "y.npy"]):
        code, _, err = run_cli([*cmd, "--hierarchy", tree, "--probs", tmp_path / "p.npy", "--from-logits",
                                "--calibrate", "--no-progress"], capsys)
        line = _error_line(err)
        assert code == 2 and "Expected --probs to hold logits, but every row is non-negative and sums to 1" in line


def test_compare_shows_no_sparse_invariant_warning(capsys, monkeypatch):
    """torch 2.11 says "Sparse invariant checks are implicitly disabled" from the synthetic outputs'
    sparse products (seen in `hdecode compare --device cuda`): silenced where they are made."""
    real = torch.sparse.mm

    def mm(*args, **kwargs):
        import warnings

        warnings.warn("Sparse invariant checks are implicitly disabled. Memory errors (e.g. SEGFAULT) will occur",
                      UserWarning)  # what torch 2.11's C++ check raises through Python's warnings
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.sparse, "mm", mm)
    code, _, err = run_cli(["compare", "--num-samples", "50", "--metrics", "zhao", "--decoders", "majority",
                            "--no-progress"], capsys)
    assert code == 0 and err == ""


_FIRST_LINE = r"""
import sys
import hdecode_torch.cli.progress as progress

progress._stderr_is_tty = lambda: True
torch_loaded = []
start = progress.Progress._start_drawing


def record(self):
    torch_loaded.append("torch" in sys.modules)
    start(self)


progress.Progress._start_drawing = record
from hdecode_torch.cli.main import main

code = main(["info", "--hierarchy", "inat19", "--json"])
print(code, torch_loaded, "torch" in sys.modules, file=sys.__stdout__)
"""


def test_a_run_shows_its_progress_line_before_torch_loads():
    """The first progress line of a run is drawn before torch is imported (~2 s of silence before)."""
    pytest.importorskip("tqdm")
    proc = subprocess.run([sys.executable, "-c", _FIRST_LINE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "0 [False] True"
    assert "info: loading" in proc.stderr


@pytest.mark.parametrize("tqdm_installed", [True, False])
def test_the_progress_line_keeps_time_while_a_stage_runs(capsys, monkeypatch, tqdm_installed):
    """A stage of unknown length (loading, drawing data) is redrawn with its time running, not frozen."""
    import builtins
    import time

    import hdecode_torch.cli.progress as progress_mod

    if tqdm_installed:
        pytest.importorskip("tqdm")
    else:
        real_import = builtins.__import__
        monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                            if name == "tqdm" else real_import(name, *a, **k))
    monkeypatch.setattr(progress_mod, "_stderr_is_tty", lambda: True)
    monkeypatch.setattr(progress_mod, "TICK_S", 0.05)
    bar = progress_mod.Progress("x: loading")
    time.sleep(0.5)
    bar.close()
    err = capsys.readouterr().err
    assert err.count("x: loading") >= 4, err  # the first draw and the ticker's redraws
    assert not bar._ticker.is_alive()


def test_ctrl_c_while_the_progress_line_starts_takes_it_down(capsys, monkeypatch):
    """Ctrl-C can land anywhere in Progress() (it is drawn as torch starts loading): the interrupt goes
    through, the line is cleared, nothing else is raised."""
    import hdecode_torch.cli.progress as progress_mod

    real_start = progress_mod.threading.Thread.start

    def interrupted(self):
        if self.name != "hdecode-progress":  # tqdm's own monitor thread starts normally
            return real_start(self)
        raise KeyboardInterrupt  # as if Ctrl-C landed while the redrawing thread was being started

    monkeypatch.setattr(progress_mod, "_stderr_is_tty", lambda: True)
    monkeypatch.setattr(progress_mod.threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        progress_mod.Progress("x: loading")
    err = capsys.readouterr().err
    assert "x: loading" in err and err.endswith("\r"), repr(err)  # drawn, then overwritten by blanks
