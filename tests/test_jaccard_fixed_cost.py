"""Jaccard's one-row path on the CPU plan (``metrics/jaccard.py``, ``_ONE_ROW``): at B = 1 the candidate tables,
the screen's order, the pairs and the choice of the best pair skip the per-sample scatters and reductions a batch
needs.  Checked against the same call with that path off (the batch code at B = 1): every intermediate result of
:func:`jaccard_trace` bit for bit (raw bits of the float tables), on random trees with single-child chains and both
bundled trees, float32 and float64, contiguous and strided rows, native kernels on and off; the decisions of each
row alone against its row in a batch; the operators a one-row call runs (fewer on the CPU plan, the GPU plan's
unchanged).
"""

from __future__ import annotations

import contextlib
import sys

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.kernels import native

from harness import batch, bundled, model_like, random_trees
from testing import Operators

J = sys.modules["hdecode_torch.metrics.jaccard"]
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


@contextlib.contextmanager
def one_row(on):
    saved, J._ONE_ROW = J._ONE_ROW, on
    try:
        yield
    finally:
        J._ONE_ROW = saved


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if a.is_floating_point():
        assert torch.equal(a.view(BITS[a.dtype]), b.view(BITS[b.dtype])), what
    else:
        assert torch.equal(a, b), what


def _trace_both(h, row):
    """The trace of one row's call with the one-row path on and off, every field equal in raw bits."""
    with hd.plan_for("cpu"):
        post = hd.Posterior(h, row)
        with one_row(True):
            got = J.jaccard_trace(post)
            dec = J.jaccard_decode(hd.Posterior(h, row))
        with one_row(False):
            ref = J.jaccard_trace(hd.Posterior(h, row))
            dec_ref = J.jaccard_decode(hd.Posterior(h, row))
    for f in ("lb0", "lb", "wide", "candidates", "allowed", "pairs", "values", "upper", "sets"):
        _same(getattr(got, f), getattr(ref, f), f)
    _same(dec, dec_ref, "decode")
    _same(dec, got.sets, "decode against trace")
    return dec


def _rows(rng, h, dtype, count):
    kinds = ("peaked", "diffuse", "confused")
    model = np.concatenate([model_like(rng, h, 2, k) for k in kinds])
    other = batch(rng, count, h.num_leaves)
    return torch.as_tensor(np.concatenate([model, other]), dtype=dtype)


@pytest.mark.parametrize("on", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_row_bits_random_trees(dtype, on):
    """Random trees (single-child chains included): the one-row path's trace is the batch code's, bit for bit."""
    rng = np.random.default_rng(11)
    with native.use_native(on):
        for h, _ in random_trees(3, 12):
            for row in _rows(rng, h, dtype, 6):
                _trace_both(h, row[None])


@pytest.mark.parametrize("name", ["tieredimagenet-h", "inat19"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_row_bits_bundled(name, dtype):
    """Both bundled trees, model-like rows, native kernels on and off: bits of every intermediate result equal;
    a strided row (a column slice of a wider table) gives the same decision; each row alone decides as in a
    batch of four (the batch code's decisions)."""
    h, _ = bundled(name)
    rng = np.random.default_rng(7)
    rows = _rows(rng, h, dtype, 1)[:4]
    for on in (True, False):
        with native.use_native(on):
            alone = torch.cat([_trace_both(h, r[None]) for r in rows])
            with hd.plan_for("cpu"):
                together = J.jaccard_decode(hd.Posterior(h, rows))
                wide = torch.zeros(1, 2 * h.num_leaves, dtype=dtype)
                wide[0, ::2] = rows[0]
                strided = J.jaccard_decode(hd.Posterior(h, wide[:, ::2]))
            _same(alone, together, "alone against in a batch")
            _same(strided, alone[:1], "strided row")


def test_one_row_decisions_exhaustive():
    """Decisions of the one-row path against enumerating every closed set (the exact optimum, ties by size
    then preorder) on tiny random trees, float64 rows, through the public metric."""
    from itertools import combinations
    rng = np.random.default_rng(2)
    checked = 0
    for h, _ in random_trees(5, 30, num_nodes_max=10):
        n = h.num_nodes
        par = np.asarray(h.parents_list)
        anc = np.zeros((h.num_leaves, n), dtype=np.int64)  # (L, N) the leaves' root paths
        for y in range(h.num_leaves):
            v = y
            while v >= 0:
                anc[y, v] = 1
                v = par[v]
        subsets = []
        others = [v for v in range(n) if v != h.root]
        for k in range(0, n):
            for rest in combinations(others, k):
                s = np.zeros(n, dtype=bool)
                s[h.root] = True
                s[list(rest)] = True
                if all(s[par[v]] for v in rest):
                    subsets.append(s)
        S = np.stack(subsets)  # (K, N)
        inter = anc @ S.T.astype(np.int64)  # (L, K)
        union = anc.sum(1)[:, None] + S.sum(1)[None, :] - inter
        for row in _rows(rng, h, torch.float64, 4):
            got = _trace_both(h, row[None])[0].numpy()
            val = row.numpy() @ (inter / union)  # (K,)
            best = val.max()
            assert val[(S == got).all(1)][0] >= best - 1e-12
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("name", ["tieredimagenet-h", "inat19"])
def test_one_row_operators(name):
    """A one-row call on the CPU plan runs fewer operators than the batch code at B = 1 (the torch path: a
    dispatch mode makes the native kernels stand aside), and the GPU plan's count does not change."""
    h, _ = bundled(name)
    row = torch.as_tensor(model_like(np.random.default_rng(1), h, 1, "peaked"), dtype=torch.float32)
    m = hd.get_metric("jaccard", h)
    counts = {}
    for plan in ("cpu", "cuda"):
        for on in (True, False):
            with hd.plan_for(plan), one_row(on):
                m.decode(row)
                with Operators() as seen:
                    m.decode(row)
            counts[plan, on] = len(seen.ops)
    assert counts["cpu", True] <= counts["cpu", False] - 25, counts
    assert counts["cuda", True] == counts["cuda", False], counts
