"""The test harness: which devices, dtypes, metrics and decoders every test runs over.

Metric and decoder names come from the library's registries (``hd.list_metrics()``,
``hd.list_decoders()``), so registering a new metric or decoder puts it under every registry-driven
test; the only thing a test file declares is the parameter grid below.  Each registered name must
have a reference implementation in ``reference.py`` (checked by ``test_registry_is_covered``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOAT_DTYPES = [torch.float32, torch.float64]
ALL_FLOAT_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]

devices = pytest.mark.parametrize("device", DEVICES)
dtypes = pytest.mark.parametrize("dtype", FLOAT_DTYPES)

#: Parameter grids (the first entry of each is the one used where a single case is enough).
METRIC_PARAMS = {"tree_distance_c": [{"c": 0.5}, {"c": 0.0}, {"c": 2.0}],
                 "hf_beta": [{"beta": 1.0}, {"beta": 0.5}, {"beta": 2.0}]}
DECODER_PARAMS = {"confidence_threshold": [{"tau": 0.3}, {"tau": 0.0}, {"tau": 0.75}],
                  "darts": [{"lam": 0.5}, {"lam": 0.0}, {"lam": 3.0}],
                  "information_threshold": [{"threshold": 0.0}, {"threshold": 0.5}, {"threshold": 1.2}]}


def case_id(name, params):
    return name + "".join(f"-{k}{v}" for k, v in params.items())


def _cases(names, grid, full):
    out = []
    for name in names:
        params = grid.get(name, [{}])
        for p in (params if full else params[:1]):
            out.append(pytest.param(name, p, id=case_id(name, p)))
    return out


def metric_names(decodable: bool = False) -> list[str]:
    """Every registered metric (those with an exact decoder when ``decodable``)."""
    return [n for n in hd.list_metrics() if not decodable or hd.has_optimal_decoder(n)]


def heuristic_names() -> list[str]:
    return [n for n in hd.list_decoders() if n != "optimal"]


def metric_cases(decodable: bool = False, full: bool = True):
    """pytest params (name, params) of every registered metric over its parameter grid."""
    return _cases(metric_names(decodable), METRIC_PARAMS, full)


def heuristic_cases(full: bool = True):
    """pytest params (name, params) of every registered heuristic decoder over its parameter grid."""
    return _cases(heuristic_names(), DECODER_PARAMS, full)


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
    """(N, L) cost (value for lower-is-better metrics, 1 − value otherwise), vectorized in numpy from
    the reference's ancestor lists — an independent check of the library's structural formulas."""
    key = (tuple(np.asarray(info.parents).tolist()), name, tuple(sorted(params.items())))
    if key in _DENSE:
        return _DENSE[key]
    n, l = info.N, info.L
    dmax = int(max(info.depth))
    anc = np.full((n, dmax + 1), -1)
    for v in range(n):
        path = info.ancestors(v)[::-1]
        anc[v, : len(path)] = path
    same = (anc[:, None, :] == anc[None, :l, :]) & (anc[:, None, :] >= 0)  # (N, L, D+1)
    lcad = same.sum(-1) - 1
    lca_node = anc[np.arange(n)[:, None], lcad]
    d = np.asarray(info.depth, dtype=float)
    dn, dl = d[:, None], d[None, :l]
    if name == "accuracy":
        c = 1.0 - (np.arange(n)[:, None] == np.arange(l)[None, :])
    elif name == "lca_height":
        c = np.asarray(info.height, dtype=float)[lca_node]
    elif name in ("tree_distance", "tree_distance_c"):
        c = dn + dl - 2 * lcad + params.get("c", 0.0) * dn
    elif name == "wu_palmer":
        c = 1 - 2 * lcad / (dn + dl)
    elif name == "zhao":
        info_c = np.asarray(info.info)
        c = 1 - 2 * info_c[lca_node] / (info_c[:, None] + info_c[None, :l])
    else:
        raise ValueError(name)
    _DENSE[key] = c
    return c
