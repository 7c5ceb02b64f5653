"""What a new user meets in the first hour: the console script finds their module, and mistakes in the
command line answer before torch loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hdecode_torch as hd
from hdecode_torch.cli.io import CLIError

ROOT = Path(hd.__file__).resolve().parents[1]  # the checkout under test
README = ROOT / "README.md"


def _env(**extra) -> dict:
    # The checkout under test first on the path (the console script of an editable install may point elsewhere).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", **extra)


def _console_script() -> str:
    script = Path(sys.executable).parent / ("hdecode.exe" if os.name == "nt" else "hdecode")
    if not script.exists():
        pytest.skip("no hdecode console script next to this Python (the package is not installed)")
    return str(script)


def _readme_metric_module() -> str:
    """The README's metric of one's own, as the module ``my_metrics.py`` its command line example imports."""
    block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
                 if "@hd.register_metric" in b)
    definition = block.split("\nhd.get_metric(")[0]
    assert "class DepthGap" in definition and "depth_gap" in definition
    return "import hdecode_torch as hd\n" + definition + "\n"


@pytest.mark.plan_independent
def test_console_script_imports_a_module_from_the_current_folder(tmp_path):
    """`hdecode compare --import my_metrics`, run where my_metrics.py is (the README's example), failed
    with ModuleNotFoundError: the console script's path holds its own folder, not the current one."""
    (tmp_path / "my_metrics.py").write_text(_readme_metric_module())
    (tmp_path / "sub").mkdir()
    cmd = [_console_script(), "compare", "--metrics", "depth_gap", "--decoders", "majority", "--num-samples", "300",
           "--no-progress", "--json"]
    for where, spec, json_name in ((tmp_path, "my_metrics", "a.json"), (tmp_path / "sub", "../my_metrics.py",
                                                                         "b.json")):
        proc = subprocess.run([*cmd, json_name, "--import", spec], cwd=where, capture_output=True, text=True,
                              timeout=300, env=_env())
        assert proc.returncode == 0, proc.stderr
        assert "depth_gap[penalty=2]" in proc.stdout and proc.stderr == ""
        doc = __import__("json").loads((where / json_name).read_text())
        optimal = doc["results"]["metrics"]["depth_gap[penalty=2]"]["optimal"]
        majority = doc["results"]["metrics"]["depth_gap[penalty=2]"]["majority"]
        assert 0 < optimal < majority  # a cost: the metric's exact decoder beats the heuristic on calibrated data
    proc = subprocess.run([_console_script(), "compare", "--import", "not_here", "--no-progress"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("hdecode compare: error: --import not_here: ModuleNotFoundError: No module named "
                                   "'not_here' (looked in the current folder and on the Python path; a file can be "
                                   "given as PATH.py)")


_BEFORE_TORCH = r"""
import contextlib, io, sys, time
from hdecode_torch.cli.main import main
for argv in CASES:
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(argv)
    print(repr((code, "torch" in sys.modules, err.getvalue().strip(), time.perf_counter() - t0)))
"""

_CASES = [
    (["compare", "--metric", "wu_palmar"],
     "hdecode compare: error: unknown metric 'wu_palmar' (did you mean 'wu_palmer'?); available: accuracy, hamming, "
     "hf_beta, jaccard, lca_height, tree_distance, tree_distance_c, wu_palmer, zhao"),
    (["decode", "--probs", "nope.npy", "--metric", "wu_palmer"], "hdecode decode: error: --probs: no such file "
                                                                 "'nope.npy'"),
    (["decode", "--probs", "nope.npy", "--metric", "zhao", "--beta", "2"],
     "hdecode decode: error: --beta applies to the metric hf_beta, which is not selected (--metric: zhao)"),
    (["compare", "--probs", "p.npy", "--targets", "y.npy", "--decoders", "dartz"],
     "hdecode compare: error: unknown decoder 'dartz' (did you mean 'darts'?); available: argmax_leaf, "
     "confidence_threshold, crm, darts, expected_information, hie, information_threshold, majority, optimal, "
     "plurality, top_down"),
    (["compare", "--metrics", "zhao,top1", "--betas", "2"],
     "hdecode compare: error: --betas applies to the metric hf_beta, which is not selected (--metrics: zhao, "
     "accuracy)"),
    (["compare", "--decoders", "majority", "--lam", "2"],
     "hdecode compare: error: --lam applies to the decoder darts, which is not selected (--decoders: majority)"),
    (["compare", "--hierarchy", "tierd"],
     "hdecode compare: error: --hierarchy 'tierd' is neither a bundled tree (inat19, tieredimagenet-h) nor an "
     "existing file"),
    (["compare", "--probs", "nope.npy", "--targets", "y.npy", "--metrics", "hf[beta=2]"],
     "hdecode compare: error: --probs: no such file 'nope.npy'"),
    (["plot", "agreement", "--metric", "wu_palmar", "-o", "x.png"],
     "hdecode plot agreement: error: unknown metric 'wu_palmar' (did you mean 'wu_palmer'?); available: accuracy, "
     "hamming, hf_beta, jaccard, lca_height, tree_distance, tree_distance_c, wu_palmer, zhao"),
    (["plot", "gain", "--decoders", "optimal", "-o", "x.png"],
     "hdecode plot gain: error: --decoders: 'optimal' is not a heuristic; each metric's optimal decoder is always "
     "included"),
    (["plot", "risk", "--probs", "nope.npy", "--targets", "y.npy", "-o", "x.png"],
     "hdecode plot risk: error: --probs: no such file 'nope.npy'"),
    (["plot", "reliability", "--probs", "nope.npy", "--targets", "y.npy", "-o", "x.png"],
     "hdecode plot reliability: error: --probs: no such file 'nope.npy'"),
    (["compare", "--import", "mine.py"], "hdecode compare: error: --import: no such file 'mine.py'"),
]


@pytest.mark.plan_independent
def test_name_and_file_errors_answer_before_torch_loads(tmp_path):
    """A misspelt metric, decoder or tree, a missing input file and a parameter of a metric that is not
    selected waited for torch to load (3-17 s on a busy machine); the README says they answer before."""
    (tmp_path / "p.npy").write_bytes(b"")  # --probs/--targets that exist: the name is the mistake
    (tmp_path / "y.npy").write_bytes(b"")
    script = f"CASES = {[argv for argv, _ in _CASES]!r}\n{_BEFORE_TORCH}"
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=_env(PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [eval(ln) for ln in proc.stdout.splitlines()]  # noqa: S307 - our own repr of tuples
    assert len(rows) == len(_CASES)
    for (argv, want), (code, torch_loaded, err, _) in zip(_CASES, rows):
        assert (code, err) == (2, want), argv
        assert not torch_loaded, argv
    assert not list(tmp_path.glob("x*"))


@pytest.mark.parametrize("spec, kind", [("wu_palmar", "metric"), ("hf_bta[beta=2]", "metric"), ("Zhao", "metric"),
                                        ("top_dwn", "decoder"), ("cmr", "decoder"), ("xyz", "decoder")])
def test_unknown_names_read_as_the_registries_say(spec, kind):
    """The message before torch is the one the registries give once it is loaded."""
    from argparse import Namespace

    from hdecode_torch.cli.common import build_heuristics, build_metrics
    from hdecode_torch.cli.names import check_before_torch

    h = hd.load_hierarchy("tieredimagenet-h")
    args = Namespace(hierarchy=None, imports=None)
    with pytest.raises(CLIError) as early:
        if kind == "metric":
            check_before_torch(args, metrics=[spec])
        else:
            check_before_torch(args, decoders=[spec])
    with pytest.raises(CLIError) as late:
        if kind == "metric":
            build_metrics(h, [spec])
        else:
            build_heuristics(h, [spec])
    assert str(early.value) == str(late.value)


def test_name_tables_without_torch_are_the_registries():
    """The tables the checks before torch read: every name, alias and parameter the registries hold."""
    from hdecode_torch.cli import names
    from hdecode_torch.decoders.registry import DECODERS
    from hdecode_torch.hierarchy import bundled
    from hdecode_torch.metrics.registry import METRICS

    assert names.METRIC_ALIASES == METRICS._aliases
    assert set(names.UNLISTED_METRICS) == METRICS._unlisted
    assert list(names.DECODER_NAMES) == list(hd.list_decoders()) and DECODERS._aliases == {}
    assert not DECODERS._unlisted
    assert names.HIERARCHY_ALIASES == bundled._ALIASES
    for attr, flag, kind, owner in names.PARAM_OWNERS:
        cls = (METRICS if kind == "metric" else DECODERS).get_class(owner)
        param = {"betas": "beta", "info_threshold": "threshold"}.get(attr, attr)
        assert param in [p.name for p in cls.PARAMS], (flag, owner)
    # Each parameter of a metric or decoder that has a flag of its own belongs to exactly one entry.
    owners = {(kind, owner) for _, _, kind, owner in names.PARAM_OWNERS}
    assert owners == {("metric", "hf_beta"), ("metric", "tree_distance_c"), ("decoder", "confidence_threshold"),
                      ("decoder", "darts"), ("decoder", "information_threshold")}


def test_with_import_names_wait_for_the_module(tmp_path):
    """With --import, a name unknown to the tables may be the module's own: checked after the import."""
    from argparse import Namespace

    from hdecode_torch.cli.names import check_before_torch

    check_before_torch(Namespace(hierarchy=None, imports=["my_metrics"]), metrics=["depth_gap"])
    with pytest.raises(CLIError, match="unknown metric 'depth_gap'"):
        check_before_torch(Namespace(hierarchy=None, imports=None), metrics=["depth_gap"])


def test_benchmarks_default_to_one_thread_and_say_so(tmp_path, capsys):
    """`python -m benchmarks.run --quick` printed nonsense medians on a busy machine unless --threads 1:
    one thread is the default, whatever torch's own, and the table headers print the count."""
    import json

    import torch

    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import run
    finally:
        sys.path.remove(str(ROOT))
    assert run.parse_args([]).threads == 1
    with pytest.raises(SystemExit):
        run.parse_args(["--help"])
    assert "torch.set_num_threads (default: 1, which the table header prints" in " ".join(capsys.readouterr().out.split())
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        path = tmp_path / "b.json"
        run.main(["--quick", "--device", "cpu", "--trees", "synthetic-tiny", "--batch-sizes", "8",
                  "--decoders", "majority", "--baseline-samples", "4", "--python-baseline-samples", "0",
                  "--repeats", "1", "--min-time", "0", "--no-backend-compare", "--no-memory", "--json", str(path)])
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr().out
    assert json.loads(path.read_text())["meta"]["torch_threads"] == 1
    assert " cores, 1 torch threads)" in out
    assert "torch threads=1" in out


def test_a_library_warning_in_a_test_is_an_error():
    """The suite turns the library's own warnings into errors (pyproject's filterwarnings): a test that
    triggers one must say so with pytest.warns."""
    import torch

    constant = torch.zeros(4, 3)
    with pytest.raises(UserWarning, match="constant within every row"):
        hd.TemperatureScaler().fit(constant, torch.tensor([0, 1, 2, 0]))
    with pytest.warns(UserWarning, match="constant within every row"):
        hd.TemperatureScaler().fit(constant, torch.tensor([0, 1, 2, 0]))
