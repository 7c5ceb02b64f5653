"""A metric and a heuristic declared once, in one outside module, are found everywhere: the registries,
``hd.functional``, ``hdecode compare --import`` (with the metric's own option), the benchmarks and the
test harness.  And the command line's torch-free catalogue is the classes' declarations."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import harness
import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Everything the toy metric and the toy heuristic are, in one module: the classes with their declarations,
# the metric's NumPy oracle and both per-sample baselines (hooks named on the classes).
TOY = '''
import numpy as np
import torch

import hdecode_torch as hd
from hdecode_torch.core.params import Flag, Param


def oracle(info, pred, y, penalty=2.0):
    """|d(pred) - d(y)| + penalty where pred is not on y's root path, from the definitions."""
    return abs(float(info.depth[pred]) - float(info.depth[y])) + penalty * (pred not in info.ancestor_set(y))


def metric_baseline(bl, pl, penalty=2.0):
    """The exact decoder, one sample at a time: the expected value of every node, the least (deepest, then
    smallest id, among equals)."""
    t = bl.t
    anc = t.ancestors[: t.num_leaves]
    on_path = (anc[None, :, :] == np.arange(t.num_nodes)[:, None, None]).any(2)
    cost = np.abs(t.depth[:, None] - t.leaf_depth[None, :]) + penalty * ~on_path
    risk = cost @ pl
    best = np.flatnonzero(risk == risk.min())
    return int(best[np.lexsort((best, -t.depth[best]))][0])


def heuristic_baseline(bl, pl, rank=2):
    return int(np.argsort(-pl, kind="stable")[rank - 1])


@hd.register_metric
class ToyDepthGap(hd.metrics.NodeMetric):
    name, description, higher_is_better = "toy_depth_gap", "|d(h) - d(y)| + penalty off the path", False
    aliases = ("toy_gap",)
    algorithms = {"cpu": "the dense (N, L) matrix of values", "gpu": "the dense (N, L) matrix of values"}
    oracle = "toy_decl:oracle"
    baseline = "toy_decl:metric_baseline"
    PARAMS = (Param("penalty", float, 2.0, grid=(2.0, 0.5), flag=Flag("--penalty", 3.0, "toy penalty off the path")),)

    def _values(self, h, pred, target):
        off = ~hd.kernels.is_ancestor(h, pred, target)
        return (h.depth[pred] - h.depth[target]).abs().double() + self.penalty * off.double()


@hd.register_decoder
class ToyRankedLeaf(hd.decoders.Decoder):
    name, description = "toy_ranked_leaf", "the rank-th most probable leaf"
    kind = "leaf"
    exact_on_dyadic = False
    algorithms = {"cpu": "a top-k of the leaves", "gpu": "a top-k of the leaves"}
    baseline = "toy_decl:heuristic_baseline"
    PARAMS = (Param("rank", int, 2, grid=(2, 1)),)

    def _decode_default(self, post):
        return post.probs.topk(self.rank, dim=1).indices[:, self.rank - 1]
'''


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy module, written to a file and imported (registering both); unregistered afterwards."""
    folder = tmp_path_factory.mktemp("toy")
    path = folder / "toy_decl.py"
    path.write_text(TOY)
    spec = importlib.util.spec_from_file_location("toy_decl", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["toy_decl"] = module
    sys.path.insert(0, str(folder))
    try:
        spec.loader.exec_module(module)
        yield module, path
    finally:
        for registry, name in ((hd.metrics.METRICS, "toy_depth_gap"), (hd.decoders.DECODERS, "toy_ranked_leaf")):
            if name in registry:
                registry.unregister(name)
        sys.modules.pop("toy_decl", None)
        sys.path.remove(str(folder))


def test_registries_read_the_declarations(toy):
    assert "toy_depth_gap" in hd.list_metrics() and "toy_ranked_leaf" in hd.list_decoders()
    assert hd.metrics.metric_class("toy_gap").name == "toy_depth_gap"  # the declared alias
    facts = hd.metrics.METRICS.declarations()["toy_depth_gap"]
    assert facts["aliases"] == ["toy_gap"] and facts["higher_is_better"] is False
    assert facts["flags"] == [{"param": "penalty", "option": "--penalty", "default": 3.0, "default_text": "3",
                               "help": "toy penalty off the path", "sweep": [], "lower": None, "lower_open": False}]


def test_functional_has_them(toy):
    h = hd.load_hierarchy("inat19")
    probs = torch.softmax(torch.randn(6, h.num_leaves, generator=torch.Generator().manual_seed(0)), 1)
    metric = hd.get_metric("toy_depth_gap", h, penalty=0.5)
    assert torch.equal(hd.functional.decode_toy_depth_gap(probs, h, penalty=0.5), metric.decode(probs))
    pred, target = metric.decode(probs), probs.argmax(1)
    assert torch.equal(hd.functional.toy_depth_gap(pred, target, h, penalty=0.5), metric(pred, target))
    assert torch.equal(hd.functional.decode_toy_ranked_leaf(probs, h, rank=2), probs.topk(2, dim=1).indices[:, 1])


def test_harness_lists_them_with_their_grids(toy):
    cases = {tuple(c.values)[0]: [] for c in harness.metric_cases()}
    for c in harness.metric_cases():
        cases[c.values[0]].append(c.values[1])
    assert cases["toy_depth_gap"] == [{"penalty": 2.0}, {"penalty": 0.5}]
    assert ("toy_ranked_leaf", {"rank": 2}) in harness.heuristic_pairs() and harness.returns_leaves("toy_ranked_leaf")
    assert not harness.exact_on_dyadic("toy_ranked_leaf")
    # The hooks: the oracle agrees with the library's values, the baselines with its decoders.
    info = ref.TreeInfo(ref.full_tree(2, 3))
    h = hd.Hierarchy.from_parents(info.parents)
    oracle = harness.oracle("toy_depth_gap")
    m = hd.get_metric("toy_depth_gap", h, penalty=0.5)
    nodes, leaves = np.meshgrid(np.arange(info.N), np.arange(info.L), indexing="ij")
    got = m(torch.from_numpy(nodes.ravel()), torch.from_numpy(leaves.ravel()), dtype=torch.float64).numpy()
    want = [oracle(info, int(n), int(y), penalty=0.5) for n, y in zip(nodes.ravel(), leaves.ravel())]
    np.testing.assert_array_equal(got, want)
    p = ref.random_distribution(np.random.default_rng(1), info.L, "dirichlet")
    assert harness.baseline("toy_depth_gap", "metric")(harness.benchmark_baselines(info), p, penalty=0.5) == int(m.decode(p))
    d = hd.get_decoder("toy_ranked_leaf", h)
    assert harness.baseline("toy_ranked_leaf")(harness.benchmark_baselines(info), p) == int(d.decode(torch.from_numpy(p)))


def test_benchmarks_list_check_and_time_them(toy, tmp_path):
    run = pytest.importorskip("benchmarks.run")
    keys = [s.key for s in run.discover_specs()]
    assert "toy_depth_gap[penalty=3]/optimal" in keys and "toy_ranked_leaf" in keys  # the command line's setting
    out = tmp_path / "bench.json"
    code = run.main(["--quick", "--device", "cpu", "--trees", "synthetic-tiny", "--batch-sizes", "16",
                     "--baseline-samples", "8", "--python-baseline-samples", "0", "--repeats", "1", "--min-time", "0",
                     "--no-backend-compare", "--no-memory", "--threads", "1", "--decoders", "toy_", "--json", str(out)])
    data = json.loads(out.read_text())
    assert code == 0
    assert {c["decoder"]: c["status"] for c in data["checks"]} == {"toy_depth_gap[penalty=3]/optimal": "pass",
                                                                  "toy_ranked_leaf": "pass"}
    assert {r["decoder"] for r in data["rows"]} == {"toy_depth_gap[penalty=3]/optimal", "toy_ranked_leaf"}


def test_compare_runs_them_with_the_declared_option(toy, tmp_path):
    _, path = toy
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-m", "hdecode_torch", "compare", "--hierarchy", "inat19", "--import", str(path),
            "--num-samples", "200", "--no-progress"]
    run = subprocess.run(base + ["--metrics", "toy_depth_gap,accuracy", "--decoders", "toy_ranked_leaf,argmax_leaf",
                                 "--penalty", "0.5", "--json", str(out)],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    metrics = json.loads(out.read_text())["results"]["metrics"]
    assert set(metrics) == {"toy_depth_gap[penalty=0.5]", "accuracy"}  # the column, at the option's value
    assert "toy_ranked_leaf[rank=2]" in metrics["accuracy"]  # the row
    assert "toy_depth_gap[penalty=0.5]" in run.stdout and "toy_ranked_leaf[rank=2]" in run.stdout
    default = subprocess.run(base + ["--metrics", "toy_depth_gap", "--decoders", "argmax_leaf", "--json", str(out)],
                             capture_output=True, text=True, env=env, timeout=300)
    assert default.returncode == 0, default.stderr
    assert set(json.loads(out.read_text())["results"]["metrics"]) == {"toy_depth_gap[penalty=3]"}
    unselected = subprocess.run(base + ["--metrics", "accuracy", "--penalty", "1"], capture_output=True, text=True,
                                env=env, timeout=300)
    assert unselected.returncode == 2
    assert "--penalty applies to the metric toy_depth_gap, which is not selected" in unselected.stderr


def test_the_command_lines_catalogue_is_the_declarations():
    """The torch-free copy the command line reads before torch loads is what the classes declare (else:
    `python -m hdecode_torch.cli.catalogue` rewrites it)."""
    from hdecode_torch.cli import catalogue

    built = catalogue.build()  # the library's own classes (a toy registered meanwhile left out)
    library = {kind: {n: f for n, f in facts.items() if not n.startswith("toy_")} for kind, facts in built.items()}
    assert library == catalogue.CATALOGUE, "run `python -m hdecode_torch.cli.catalogue` to rewrite it"
    with open(catalogue.PATH, encoding="utf-8") as f:
        assert f.read() == catalogue.render(catalogue.CATALOGUE)
    # What the command line derives from it.
    from hdecode_torch.cli import names, options

    assert list(options.METRIC_NAMES) == [n for n in library["metrics"] if library["metrics"][n]["listed"]]
    assert options.DEFAULT_TAU == 0.8 and options.DEFAULT_BETAS == (0.5, 1.0, 2.0)
    assert ("betas", "--betas", "metric", "hf_beta") in names.PARAM_OWNERS


def test_every_built_in_class_declares_its_facts():
    """What the harness, the benchmarks and the command line read is declared on each built-in class: the
    algorithm on each plan, the hooks (which resolve), grid values its own checks accept, options that
    name a declared parameter."""
    from hdecode_torch.cli.catalogue import CATALOGUE

    h = hd.load_hierarchy("inat19")
    for name in harness.metric_names(decodable=True):
        cls = hd.metrics.metric_class(name)
        assert set(cls.algorithms) == {"cpu", "gpu"}, name
        assert callable(harness.oracle(name)) and callable(harness.baseline(name, "metric")), name
        for params in harness.metric_grid(name):
            with harness.expect_warnings(name, params):
                hd.get_metric(name, h, **params)
    for name in harness.heuristic_names():
        cls = hd.decoders.decoder_class(name)
        assert set(cls.algorithms) == {"cpu", "gpu"} and cls.kind in ("leaf", "node"), name
        assert callable(harness.baseline(name)), name
        for params in harness.decoder_grid(name):
            hd.get_decoder(name, h, **params)
    flagged = {(owner, f["param"]) for kind in ("metrics", "decoders")
               for owner, facts in CATALOGUE[kind].items() for f in facts["flags"]}
    assert flagged == {("hf_beta", "beta"), ("tree_distance_c", "c"), ("confidence_threshold", "tau"),
                       ("darts", "lam"), ("information_threshold", "threshold")}
