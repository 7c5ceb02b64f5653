"""The test harness: which metrics and decoders every test runs over (the devices and dtypes: testing.py).

Metric and decoder names come from the library's registries (``hd.list_metrics()``,
``hd.list_decoders()``), and everything else from the classes' declarations: the parameter grids
(each ``Param``'s ``grid``), what a heuristic returns (``kind``), whether its keys are exact on dyadic
inputs (``exact_on_dyadic``) and where its NumPy oracle and baseline live (``oracle``, ``baseline``).
Registering a new metric or decoder puts it under every registry-driven test; nothing is declared
here.  Each registered name must have its references (checked by ``test_registry_is_covered``).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from hdecode_torch.core.params import grid_cases
from hdecode_torch.core.registry import resolve_hook

# The devices and dtypes live in testing.py; re-exported for the files that import them from here.
from testing import ALL_FLOAT_DTYPES, DEVICES, FLOAT_DTYPES, devices, dtypes  # noqa: F401

def metric_grid(name: str) -> list[dict]:
    """The parameter settings the tests run the metric ``name`` at (its ``PARAMS``' grids; the first is
    the one used where a single case is enough)."""
    return grid_cases(hd.metrics.metric_class(name).PARAMS)


def decoder_grid(name: str) -> list[dict]:
    """The parameter settings the tests run the decoder ``name`` at."""
    return grid_cases(hd.decoders.decoder_class(name).PARAMS)


def returns_leaves(name: str) -> bool:
    """Whether the heuristic ``name`` always returns a leaf (its declared ``kind``; else any node)."""
    return hd.decoders.decoder_class(name).kind == "leaf"


def exact_on_dyadic(name: str) -> bool:
    """Whether the heuristic's keys are exact on dyadic inputs (sums and products of k/16, no
    logarithms), where the library must return exactly the reference's node, ties included."""
    return bool(hd.decoders.decoder_class(name).exact_on_dyadic)


def oracle(name: str):
    """The metric's NumPy value function ``f(info, pred, y, **params)`` its class names (``oracle``)."""
    return resolve_hook(hd.metrics.metric_class(name).oracle)


_BASELINES = {}


def benchmark_baselines(info):
    """The benchmark's per-sample NumPy decoders (``benchmarks/baselines.py``, a second implementation
    checked against the oracle, not an oracle) on the tree of ``info``, built once per tree."""
    from benchmarks.baselines import Baselines

    key = tuple(np.asarray(info.parents).tolist())
    if key not in _BASELINES:
        _BASELINES[key] = Baselines(info.parents)
    return _BASELINES[key]


def baseline(name: str, kind: str = "decoder"):
    """The per-sample NumPy decoder ``f(baselines, leaf_probs, **params)`` the class of the metric or
    decoder ``name`` names (``baseline``)."""
    cls = hd.metrics.metric_class(name) if kind == "metric" else hd.decoders.decoder_class(name)
    return resolve_hook(cls.baseline)


#: tree_distance_c with c >= 1 puts the decision threshold (1 + c)/2 at or above 1, so the root is always
#: optimal, and the library warns; the cases that use such a c on purpose silence the warning with this
#: mark (``metric_cases`` attaches it to them), the tests of that behaviour expect it (``expect_warnings``).
ROOT_THRESHOLD_WARNING = r"tree_distance_c with c = \S+ >= 1\W+the decision threshold"  # no colon: a mark's separator
silence_root_threshold = pytest.mark.filterwarnings(f"ignore:{ROOT_THRESHOLD_WARNING}:UserWarning")


def root_threshold(name: str, params: dict) -> bool:
    """Whether these parameters make the metric ``name`` (or the "optimal" decoder of the metric
    ``params["metric"]``) warn that the root is always optimal."""
    if name == "optimal":
        name = params.get("metric")
    return name == "tree_distance_c" and params.get("c", 0.0) >= 1


def expect_warnings(name: str, params: dict):
    """A context that expects the library's warning where ``name`` with ``params`` calls for one."""
    if root_threshold(name, params):
        return pytest.warns(UserWarning, match=ROOT_THRESHOLD_WARNING)
    return contextlib.nullcontext()


def case_id(name, params):
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def param(name: str, params: dict):
    """The pytest param (name, params) of one case, silencing the warning its parameters ask for."""
    marks = [silence_root_threshold] if root_threshold(name, params) else []
    return pytest.param(name, params, id=case_id(name, params), marks=marks)


def _cases(names, grid, full):
    return [param(name, p) for name in names for p in (grid(name) if full else grid(name)[:1])]


def metric_names(decodable: bool = False) -> list[str]:
    """Every registered metric (those with an exact decoder when ``decodable``)."""
    return [n for n in hd.list_metrics() if not decodable or hd.has_optimal_decoder(n)]


def heuristic_names() -> list[str]:
    return [n for n in hd.list_decoders() if n != "optimal"]


def metric_cases(decodable: bool = False, full: bool = True):
    """pytest params (name, params) of every registered metric over its parameter grid."""
    return _cases(metric_names(decodable), metric_grid, full)


def heuristic_cases(full: bool = True):
    """pytest params (name, params) of every registered heuristic decoder over its parameter grid."""
    return _cases(heuristic_names(), decoder_grid, full)


def metric_pairs(decodable: bool = False, full: bool = True):
    """(name, params) tuples, for code that builds its own loops."""
    return [tuple(c.values) for c in metric_cases(decodable, full)]


def heuristic_pairs(full: bool = True):
    return [tuple(c.values) for c in heuristic_cases(full)]


def strategies(name: str) -> list[str | None]:
    """The explicit decoding strategies of a metric class (``[None]`` when it has none)."""
    cls = hd.metrics.metric_class(name)
    return [s for s in getattr(cls, "STRATEGIES", ()) if s != "auto"] or [None]


def tolerance(dtype) -> float:
    """Relative tolerance of an expected value computed in ``dtype`` (for optimality checks)."""
    return {torch.float64: 1e-9, torch.float32: 2e-5}.get(dtype, 2e-5)


def random_trees(seed: int, count: int, **kw):
    """Small random canonical trees (unbalanced, with single-child chains) as (Hierarchy, TreeInfo)."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        par = ref.random_tree(rng, **kw)
        yield hd.Hierarchy.from_parents(par), ref.TreeInfo(par)


def batch(rng, B, L, kinds=("dirichlet", "peaked", "uniform", "onehot", "sparse", "dyadic")):
    rows = [ref.random_distribution(rng, L, kinds[i % len(kinds)]) for i in range(B)]
    return np.stack(rows)


_BUNDLED = {}


def bundled(name):
    if name not in _BUNDLED:
        h = hd.load_hierarchy(name)
        _BUNDLED[name] = (h, ref.TreeInfo(np.asarray(h.parents_list)))
    return _BUNDLED[name]


def model_like(rng, h, B, kind):
    """Distributions a trained model produces: peaked, diffuse, confused between siblings/cousins,
    or with a large share of mass on one shallow leaf."""
    L = h.num_leaves
    if kind == "peaked":
        logits = rng.normal(size=(B, L)) * 2
        logits[np.arange(B), rng.integers(0, L, B)] += rng.uniform(4, 10, B)
    elif kind == "diffuse":
        logits = rng.normal(size=(B, L)) * 0.5
    elif kind == "confused":
        anc = h.ancestors.numpy()
        depth = h.depth.numpy()
        logits = rng.normal(size=(B, L))
        for b in range(B):
            y = rng.integers(0, L)
            d = rng.integers(1, max(2, depth[y]))
            a = anc[y, d]
            under = (anc[:L, d] == a)
            logits[b, under] += rng.uniform(2, 5)
    elif kind == "shallow":
        depth = h.depth.numpy()[:L]
        shallow = np.flatnonzero(depth <= np.sort(depth)[min(L - 1, 20)])
        logits = rng.normal(size=(B, L))
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        share = rng.uniform(0.35, 0.55, B)
        p *= (1 - share)[:, None]
        p[np.arange(B), rng.choice(shallow, B)] += share
        return p
    else:
        raise ValueError(kind)
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


_DENSE = {}


def dense_cost(info, name, **params):
    """(N, L) cost (value for lower-is-better metrics, 1 − value otherwise) of a node metric, by
    ``reference.dense_cost`` (checked against ``reference.cost_matrix`` in test_reference_selfcheck.py),
    cached per tree and parameters — an independent check of the library's structural formulas."""
    key = (tuple(np.asarray(info.parents).tolist()), name, tuple(sorted(params.items())))
    if key not in _DENSE:
        _DENSE[key] = ref.dense_cost(info, name, **params)
    return _DENSE[key]
