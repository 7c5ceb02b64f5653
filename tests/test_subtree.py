"""Decoding within a known subtree: ``decode(leaf_probs, within=nodes)``.

The reference builds each row's subtree explicitly from the plain-Python tree (its nodes sorted, parents
renumbered, ``Hierarchy.from_parents``), gets the decoder of the same name and parameters on it from the
registry, decodes the row's probabilities restricted to the subtree's leaves and renormalised, and maps
the answer back to the whole tree's ids (sets: with the ancestors of the subtree's root).  Every
registered decoder (each metric's optimal decoder over its parameter grid, every heuristic) must give
exactly that, on small random trees and on both bundled trees; the root means no restriction; a batch
with mixed nodes equals its rows decoded one by one.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from harness import DEVICES, FLOAT_DTYPES, batch, bundled, heuristic_cases, metric_cases, random_trees
from hdecode_torch.core import subtree as subtree_module
from hdecode_torch.core.subtree import Subtree, subtree
from hdecode_torch.synthetic import synthetic_outputs



def cases(full: bool = True):
    """(kind, name, params) of each metric's optimal decoder and every heuristic, over their parameter grids."""
    return ([pytest.param("metric", *c.values, id="opt-" + c.id, marks=c.marks)
             for c in metric_cases(decodable=True, full=full)]
            + [pytest.param("decoder", *c.values, id=c.id, marks=c.marks) for c in heuristic_cases(full=full)])


CASES = cases()


def component(kind: str, name: str, params: dict, h):
    return hd.get_metric(name, h, **params) if kind == "metric" else hd.get_decoder(name, h, **params)


# --------------------------------------------------------------------------- the explicit reference
def explicit_subtree(info: ref.TreeInfo, node: int) -> tuple[hd.Hierarchy, list[int], list[int]]:
    """(the subtree under ``node`` as a Hierarchy, the whole tree's id of each of its nodes, its leaves), by
    plain loops: the nodes under ``node`` in ascending id order (leaves first, as in the whole tree)."""
    nodes = info.descendants(node)
    where = {n: k for k, n in enumerate(nodes)}
    parents = [-1 if n == node else where[int(info.parents[n])] for n in nodes]
    leaves = [n for n in nodes if info.is_leaf[n]]
    assert nodes[:len(leaves)] == leaves
    return hd.Hierarchy.from_parents(parents), nodes, leaves


def reference_within(kind, name, params, info, h, probs: torch.Tensor, within: list[int]):
    """The answer of every row, row group by row group (one group per distinct node), decoded on the explicit
    subtree; None for a node whose decoder cannot be built on the subtree (with the construction's error)."""
    rows_of = {}
    for i, w in enumerate(within):
        rows_of.setdefault(w, []).append(i)
    is_set = component(kind, name, params, h).kind == "set"
    out = torch.zeros((len(within), h.num_nodes), dtype=torch.bool) if is_set else torch.zeros(len(within),
                                                                                              dtype=torch.long)
    for w, rows in rows_of.items():
        if w == info.root:
            out[rows] = component(kind, name, params, h).decode(probs[rows])
            continue
        if info.is_leaf[w]:
            pred = [w] * len(rows)
            sets = [[w]] * len(rows)
        else:
            sub, nodes, leaves = explicit_subtree(info, w)
            x = probs[rows][:, leaves]
            x = x / x.sum(1, keepdim=True)
            got = component(kind, name, params, sub).decode(x)
            if is_set:
                sets = [[nodes[k] for k in np.flatnonzero(r.numpy())] for r in got]
            else:
                pred = [nodes[int(k)] for k in got]
        if is_set:
            for i, s in zip(rows, sets):
                out[i, s + info.ancestors(w)] = True
        else:
            out[rows] = torch.tensor(pred)
    return out


def buildable(kind, name, params, info, node) -> bool:
    """Whether the decoder can be built on the subtree under ``node`` (information_threshold needs its
    threshold at most log L' of the subtree)."""
    if name == "information_threshold":
        return params["threshold"] <= math.log(len(info.leaves_under(node))) or info.is_leaf[node]
    return True


def within_nodes(rng, info: ref.TreeInfo, probs: torch.Tensor) -> list[int]:
    """A node per row with positive mass under it: an ancestor, at a random depth, of a leaf drawn from the row
    (a leaf itself or the root sometimes)."""
    out = []
    for row in probs.double().numpy():
        leaf = int(rng.choice(info.L, p=row / row.sum()))
        path = info.ancestors(leaf)  # leaf, ..., root
        out.append(int(path[rng.integers(0, len(path))]))
    return out


# --------------------------------------------------------------------------- every decoder, small random trees
@pytest.mark.parametrize("kind,name,params", CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_within_equals_decoding_the_explicit_subtree_on_random_trees(kind, name, params, dtype):
    rng = np.random.default_rng(sum(map(ord, name + str(params) + str(dtype))))
    for h, info in random_trees(int(rng.integers(1 << 30)), 6, num_nodes_max=16, unary_prob=0.25):
        if not buildable(kind, name, params, info, info.root):
            continue  # not on the whole tree either (test_heuristics.py checks the error)
        probs = torch.as_tensor(batch(rng, 24, info.L), dtype=dtype)
        within = within_nodes(rng, info, probs)
        bad = [w for w in set(within) if not buildable(kind, name, params, info, w)]
        dec = component(kind, name, params, h)
        for w in bad:
            rows = [i for i, v in enumerate(within) if v == w]
            with pytest.raises(ValueError, match=rf"Cannot decode within node {w} .*`threshold` to be at most"):
                dec.decode(probs[rows], within=torch.tensor([w] * len(rows)))
        keep = [i for i, w in enumerate(within) if w not in bad]
        probs, within = probs[keep], [within[i] for i in keep]
        got = dec.decode(probs, within=torch.tensor(within, dtype=torch.long))
        want = reference_within(kind, name, params, info, h, probs, within)
        assert torch.equal(got, want), (name, params, info.parents.tolist(), within)
        # mixed nodes in one batch = each row on its own (a single (L,) row and a () node)
        for i in range(0, len(within), 5):
            assert torch.equal(dec.decode(probs[i], within=within[i]), got[i])


# --------------------------------------------------------------------------- every decoder, bundled trees
@pytest.mark.parametrize("kind,name,params", cases(full=False))
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_within_equals_decoding_the_explicit_subtree_on_bundled_trees(tree, kind, name, params):
    h, info = bundled(tree)
    rng = np.random.default_rng(len(name) + len(tree))
    probs, _ = synthetic_outputs(h, 40, noise=1.0, seed=int(rng.integers(1000)), dtype=torch.float64)
    within = within_nodes(rng, info, probs)
    keep = [i for i, w in enumerate(within) if buildable(kind, name, params, info, w)]
    probs, within = probs[keep], [within[i] for i in keep]
    assert len(set(within)) > 10 and info.root in within
    got = component(kind, name, params, h).decode(probs, within=torch.tensor(within))
    assert torch.equal(got, reference_within(kind, name, params, info, h, probs, within)), (name, params)


# --------------------------------------------------------------------------- the root, devices, plans, chunks
@pytest.mark.parametrize("kind,name,params", CASES)
def test_the_root_means_no_restriction(kind, name, params):
    h, _ = bundled("inat19")
    probs, _ = synthetic_outputs(h, 50, seed=3)
    dec = component(kind, name, params, h)
    want = dec.decode(probs)
    assert torch.equal(dec.decode(probs, within=torch.full((50,), h.root)), want)
    assert torch.equal(dec.decode(probs, within=h.root), want)
    assert torch.equal(dec.decode(probs[7], within=h.root), want[7])


@pytest.mark.parametrize("device", DEVICES)
def test_plans_devices_chunks_and_posteriors_agree(device):
    h, info = bundled("tieredimagenet-h")
    probs, _ = synthetic_outputs(h, 300, seed=5)
    within = torch.tensor(within_nodes(np.random.default_rng(0), info, probs))
    for name in ("hf_beta", "wu_palmer", "jaccard", "tree_distance"):
        m = hd.get_metric(name, h)
        want = m.decode(probs, within=within)
        for plan in ("cpu", "cuda"):
            with hd.plan_for(plan):
                got = m.decode(probs.to(device), within=within.to(device), chunk_size=37)
                assert torch.equal(got.cpu(), want), (name, plan)
                post = hd.Posterior(h, probs.to(device))
                assert torch.equal(m.decode(post, within=within.to(device)).cpu(), want), (name, plan)
    opt = hd.get_decoder("optimal", h, metric="zhao")
    assert torch.equal(opt.decode(probs, within=within), hd.get_metric("zhao", h).decode(probs, within=within))


# --------------------------------------------------------------------------- the subtree itself
def test_subtree_ids_maps_and_cache():
    h, info = bundled("inat19")
    node = int(h.parent[h.parent[5]])
    s = subtree(h, node)
    sub, nodes, leaves = explicit_subtree(info, node)
    assert s.root == node and s.nodes.tolist() == nodes and s.leaves.tolist() == leaves
    assert s.hierarchy.parents_list == sub.parents_list and s.hierarchy.num_leaves == len(leaves)
    assert s.path.tolist() == info.ancestors(node)[::-1]
    assert s.hierarchy.names == [h.names[n] for n in nodes]
    assert int(s.hierarchy.depth.max()) == max(info.depth[n] for n in nodes) - info.depth[node]
    assert subtree(h, node) is s  # compiled once
    leaf = subtree(h, 3)
    assert isinstance(leaf, Subtree) and leaf.hierarchy is None and leaf.nodes.tolist() == [3]
    with pytest.raises(ValueError, match=r"node id in 0..\d+, but got -1"):
        subtree(h, -1)


def test_the_subtree_cache_is_bounded(monkeypatch):
    fresh = hd.Hierarchy.from_parents(hd.load_hierarchy("tieredimagenet-h").parents_list)
    monkeypatch.setattr(subtree_module, "SUBTREE_CACHE_ENTRIES", 5)
    internal = list(range(fresh.num_leaves, fresh.num_nodes))
    for n in internal[:40]:
        subtree(fresh, n)
    cache = fresh.cached("subtree.cache", dict)
    assert list(cache) == internal[35:40]  # the most recently used
    subtree(fresh, internal[35])
    subtree(fresh, internal[40])
    assert list(cache) == internal[37:40] + [internal[35], internal[40]]
    # bounded in nodes too: the root's subtree is the whole tree, four of them fill the budget
    monkeypatch.setattr(subtree_module, "SUBTREE_CACHE_NODES", 1)
    subtree(fresh, fresh.root)
    assert list(cache) == [fresh.root]


# --------------------------------------------------------------------------- errors
def test_errors_name_the_argument_and_the_row():
    h, info = bundled("tieredimagenet-h")
    probs, _ = synthetic_outputs(h, 6, seed=1, dtype=torch.float64)
    m = hd.get_metric("wu_palmer", h)
    leaf = int(probs[4].argmin())
    zero = probs.clone()
    zero[4, leaf] = 0.0
    zero[4] /= zero[4].sum()
    within = torch.full((6,), h.root)
    within[4] = leaf
    with pytest.raises(ValueError, match=rf"row 4 to have positive mass under its `within` node {leaf}"):
        m.decode(zero, within=within)
    parent = int(h.parent[leaf])
    only = torch.zeros(1, h.num_leaves, dtype=torch.float64)
    only[0, [n for n in range(h.num_leaves) if n not in info.leaves_under(parent)][0]] = 1.0
    with pytest.raises(ValueError, match=rf"row 0 to have positive mass under its `within` node {parent}"):
        m.decode(only, within=parent)
    with pytest.raises(ValueError, match=r"`within` in 0..842 \(node ids\), but got 843 at row 2"):
        m.decode(probs, within=torch.tensor([0, 1, 843, 3, 4, 5]))
    with pytest.raises(ValueError, match=r"`within` in 0..842 \(node ids\), but got -1 at row 5"):
        m.decode(probs, within=torch.tensor([0, 1, 2, 3, 4, -1]))
    with pytest.raises(TypeError, match=r"`within` to hold integer node ids, but got dtype torch.float32"):
        m.decode(probs, within=torch.zeros(6))
    with pytest.raises(ValueError, match=r"`within` to have shape \(6,\), one node id per row, but got \(5,\)"):
        m.decode(probs, within=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`within` to be a single node id for a single \(L,\) row"):
        m.decode(probs[0], within=torch.zeros(1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`leaf_probs`"):  # the input's own check comes first
        m.decode(probs * 2, within=torch.tensor([843] * 6))
