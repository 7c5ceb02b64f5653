"""The CPU plan's Jaccard pieces made cheaper (``metrics/jaccard.py``): each gives the same integers or the
same float64 sums as the formula it replaced, so the decoded sets are the same bit for bit.

- the depth-first prefix sums scanned along batch-major rows, a block of rows at a time;
- the candidates' next-subtree columns and parents found by one search of the flat sorted keys;
- the node screen made a block of nodes at a time; the masses in small chunks;
- the most probable leaf from NumPy's ``argmax``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from harness import bundled, model_like
from hdecode_torch.metrics import jaccard as J


def _rows(h, B, seed, dtype):
    rng = np.random.default_rng(seed)
    parts = [model_like(rng, h, B, kind) for kind in ("peaked", "diffuse", "confused")]
    P = np.concatenate(parts)[: 3 * B]
    P[0] = 0.0
    P[0, rng.integers(h.num_leaves)] = 1.0  # a one-hot row: ties between every size along its path
    return torch.as_tensor(P).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_depth_prefix_is_the_posteriors_bit_for_bit(tree, dtype, monkeypatch):
    h, _ = bundled(tree)
    x = _rows(h, 40, 1, dtype)
    with hd.plan_for("cpu"):
        want = hd.Posterior(h, x).depth_prefix()
        for block in (J._PREFIX_BLOCK, 7 * h.num_leaves, 1):  # one block, blocks of 7 rows, of one row
            monkeypatch.setattr(J, "_PREFIX_BLOCK", block)
            got = J._depth_prefix(hd.Posterior(h, x))
            assert got.shape == want.shape and got.dtype == torch.float64
            assert torch.equal(got, want), block


def test_argmax_rows_is_the_first_largest_column():
    x = torch.tensor([[0.25, 0.5, 0.5, 0.0], [1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float32)
    assert J._argmax_rows(x).tolist() == [1, 0, 0]
    rng = np.random.default_rng(3)
    y = torch.as_tensor(rng.integers(0, 4, size=(200, 37)).astype(np.float64))  # many ties
    got = J._argmax_rows(y)
    assert got.dtype == torch.int64
    assert torch.equal(got, y.argmax(1))


def _cands(h, T, rng, B):
    """A _Cands of random ancestor-closed candidate sets (root always in), sample-major and in preorder."""
    info = ref.TreeInfo(np.asarray(h.parents_list))
    pre = T.pre[:-1].numpy()
    rows, nodes = [], []
    for b in range(B):
        keep = rng.random(info.N) < rng.uniform(0.05, 0.6)
        keep[info.root] = True
        for n in np.argsort(pre):  # preorder: a node is kept only with its parent
            par = info.parents[n]
            if par >= 0 and not keep[par]:
                keep[n] = False
        ids = np.flatnonzero(keep)
        ids = ids[np.argsort(pre[ids])]
        rows += [b] * len(ids)
        nodes += list(ids)
    sample, node = torch.tensor(rows), torch.tensor(nodes)
    count = torch.bincount(sample, minlength=B)
    q = torch.rand(len(nodes), T.depths.numel(), dtype=torch.float64)
    return J._Cands(T, B, sample, node, q, torch.float64, count, int(count.max()))


@pytest.mark.parametrize("flat", [True, False])
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "random"])
def test_candidates_next_columns_and_parents_are_the_row_searches(tree, flat, monkeypatch):
    monkeypatch.setattr(J, "_FLAT_SEARCH", 1 if flat else 1 << 40)  # the flat keys' search, or the rows'
    if tree == "random":
        par = ref.random_tree(np.random.default_rng(5), num_nodes_max=60, min_leaves=1, unary_prob=0.3,
                              deep_bias=0.6)
        h = hd.Hierarchy.from_parents(par)
    else:
        h, _ = bundled(tree)
    T = J._tables(h)
    c = _cands(h, T, np.random.default_rng(7), 23)
    assert (c.key is not None) == flat
    # the formulas they replace: a sorted search along each (B, C) row of preorder positions
    pre = T.pre[c.ids]
    assert torch.equal(c.nxt, torch.searchsorted(pre, T.end[c.ids]))
    ppos = torch.searchsorted(pre, T.pre[T.parent[c.ids]])
    assert torch.equal(c.parent_entry(T), c.start[c.sample] + ppos[c.sample, c.slot])
    # and what they mean: the parent's entry holds the parent (the root: itself), nxt the first non-descendant
    par = T.parent[c.node]
    assert torch.equal(c.node[c.parent_entry(T)], par)
    sub = c.subset(T, (torch.rand(c.sample.numel()) < 0.5) | (c.slot == 0), torch.float64)
    assert torch.equal(sub.nxt, torch.searchsorted(T.pre[sub.ids], T.end[sub.ids]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_screen_in_blocks_lists_the_same_pairs(dtype, monkeypatch):
    h, _ = bundled("tieredimagenet-h")
    T = J._tables(h)
    x = _rows(h, 30, 2, dtype)
    with hd.plan_for("cpu"):
        p = hd.Posterior(h, x).node
    thr = torch.rand(x.shape[0], dtype=torch.float64) * 0.8
    thr[1] = float("inf")  # only the root
    whole = J._screen(h, T, p, thr, False)
    for block in (7 * x.shape[0], x.shape[0], 1):
        monkeypatch.setattr(J, "_SCREEN_BLOCK", block)
        got = J._screen(h, T, p, thr, False)
        for a, b in zip(got[:3], whole[:3]):
            assert torch.equal(a, b), block
        assert got[3] == whole[3]
    # the batch-major listing of the same table
    bm = J._screen(h, T, p.t().contiguous().t(), thr, True)
    assert all(torch.equal(a, b) for a, b in zip(bm[:3], whole[:3]))
    assert int(whole[2][1]) == 1  # the row whose threshold is above every node keeps its root alone


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_small_blocks_decode_the_same_sets(tree, dtype, monkeypatch):
    h, _ = bundled(tree)
    x = _rows(h, 60, 4, dtype)
    m = hd.get_metric("jaccard", h)
    with hd.plan_for("cpu"):
        want = m.decode(x)
        monkeypatch.setattr(J, "_PREFIX_BLOCK", 5 * h.num_leaves)
        monkeypatch.setattr(J, "_SCREEN_BLOCK", 3 * x.shape[0])
        monkeypatch.setattr(J, "_MASS_CHUNK", 64 * 64 * h.num_leaf_depths)
        got = m.decode(x)
    assert torch.equal(got, want)
