"""Device and dtype lists every test is parametrized over, and shared helpers."""

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

NODE_METRICS = ["accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao"]
SET_METRICS = ["hf_beta", "hamming", "jaccard"]
METRIC_PARAMS = {"tree_distance_c": [{"c": 0.0}, {"c": 0.5}, {"c": 2.0}], "hf_beta": [{"beta": 0.5}, {"beta": 1.0}, {"beta": 2.0}]}


def metric_cases():
    for name in NODE_METRICS + SET_METRICS:
        for params in METRIC_PARAMS.get(name, [{}]):
            yield pytest.param(name, params, id=name + "".join(f"-{k}{v}" for k, v in params.items()))


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
