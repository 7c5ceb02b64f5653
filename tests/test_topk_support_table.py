"""The shared support table of a top-k batch (:func:`hdecode_torch.kernels.support.support_table`) against its
definition, entry by entry: each ancestor of a row's listed leaves once, ordered by depth, row, then the rank of
its first listed leaf, with that rank, its p̃ equal bit for bit to :func:`node_mass`'s, and the table position →
entry map pointing at the ancestor of each listed leaf at each depth down to the leaf's own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from harness import bundled, random_trees
from hdecode_torch.core.topk import CompletedTopK, TopK
from hdecode_torch.kernels.support import node_mass, support_table


def _lists(rng, h, B, k, prior):
    L = h.num_leaves
    idx = np.stack([rng.permutation(L)[:k] for _ in range(B)])
    vals = np.stack([rng.dirichlet(np.ones(k)) for _ in range(B)])
    if k < L:
        vals *= rng.choice([1.0, 0.6, 0.0], size=B)[:, None]
    p = None
    if prior:
        p = rng.dirichlet(np.ones(L))
        p[rng.random(L) < 0.3] = 0
        p[rng.integers(L)] += 0.1
        if k < L:
            # every row keeps an unlisted leaf of positive weight where it has missing mass
            p += 1e-3
    return TopK(torch.from_numpy(vals), torch.from_numpy(idx), prior=None if p is None else torch.from_numpy(p))


def _check(h, ct):
    listed = ct.listed
    B, k = listed.leaves.shape
    sup = support_table(h, listed, ct.weights, with_entry=True)
    depth, parent = h.depth.tolist(), h.parent.tolist()
    leaves = listed.leaves.tolist()
    want = []  # (depth, row, first rank, node), the definition's order
    for b in range(B):
        first = {}
        for j, leaf in enumerate(leaves[b]):
            n = leaf
            while True:
                first.setdefault(n, j)
                if n == h.root:
                    break
                n = parent[n]
        want += [(depth[n], b, j, n) for n, j in first.items()]
    want.sort()
    got = list(zip(sup.depth.tolist(), sup.rows.tolist(), sup.lo.tolist(), sup.nodes.tolist()))
    assert got == want
    assert sup.key.tolist() == [(d * B + b) * k + j for d, b, j, _ in want]
    # p̃ bit for bit as node_mass computes it by binary searches
    mass = torch.full((B, len(want)), h.root, dtype=torch.long)
    per_row = [0] * B
    slot = []
    for _, b, _, n in got:
        mass[b, per_row[b]] = n
        slot.append((b, per_row[b]))
        per_row[b] += 1
    ref = node_mass(h, listed, ct.weights, mass)
    assert torch.equal(sup.p, torch.stack([ref[b, s] for b, s in slot]))
    # the entry map: the ancestor at depth d of the row's j-th listed leaf, for d up to that leaf's depth
    entry = sup.entry.tolist()
    nodes = sup.nodes.tolist()
    for b in range(B):
        for j, leaf in enumerate(leaves[b]):
            path = [leaf]
            while path[-1] != h.root:
                path.append(parent[path[-1]])
            for d, n in enumerate(reversed(path)):
                assert nodes[entry[(d * B + b) * k + j]] == n


@pytest.mark.parametrize("prior", [False, True])
def test_support_table_on_small_random_trees(prior):
    rng = np.random.default_rng(35)
    for h, _ in random_trees(7, 12):
        L = h.num_leaves
        for k in sorted({1, max(1, L // 3), L}):
            ct = CompletedTopK(h, _lists(rng, h, 5, k, prior))
            _check(h, ct)


@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_support_table_on_bundled_trees(tree):
    h, _ = bundled(tree)
    rng = np.random.default_rng(7)
    for k in (1, 10, 40):
        _check(h, CompletedTopK(h, _lists(rng, h, 6, k, False)))
