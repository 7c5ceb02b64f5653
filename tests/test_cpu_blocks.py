"""The CPU plan's cache-sized blocks of rows, and the float comparison tables of the closed forms.

Components whose decoding is a few passes over (N, B) tables declare ``cpu_block_bytes``: on the CPU
plan a large batch is decoded in blocks of rows whose temporaries fit it (and the memory budget),
instead of tables of the whole batch.  Rows are independent, so the blocks must give the whole batch's
bits; the GPU plan and an explicit ``chunk_size`` keep their own chunks.  ``kernels.selection.above``
writes ``p > t`` as 0/1 floats (a bool table is several times slower to write on a CPU): the same
comparison and the same first-allowed node as the bool table.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.core.chunking import CPU_BLOCK_BYTES
from hdecode_torch.core.plan import resolve_plan
from hdecode_torch.kernels.selection import above, deepest_above, deepest_where, most_informative_where

from testing import FLOAT_DTYPES

PARAMS = {"information_threshold": {"threshold": 1.0}, "tree_distance_c": {"c": 0.3}}


def _component(name, h):
    params = PARAMS.get(name, {})
    if name in hd.list_metrics():
        return hd.get_metric(name, h, **params)
    return hd.get_decoder(name, h, **params)


def _blocked_names(tree="tieredimagenet-h"):
    names = sorted(set(hd.list_metrics()) | (set(hd.list_decoders()) - {"optimal"}))
    h = hd.load_hierarchy(tree)
    with hd.plan_for("cpu"):
        post = hd.Posterior(h, torch.full((2, h.num_leaves), 1 / h.num_leaves))
    return [n for n in names if _component(n, h)._cpu_block_bytes(post)]


def _probs(h, batch, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, h.num_leaves, generator=g, dtype=torch.float64) * 3
    return logits.softmax(-1).to(dtype)


def _dense(x):
    return x.to_dense() if x.is_sparse else x


def test_the_closed_forms_declare_blocks():
    got = _blocked_names()
    assert {"tree_distance", "tree_distance_c", "lca_height", "zhao", "majority",
            "confidence_threshold", "darts", "crm", "hie"} <= set(got), got
    assert not {"jaccard", "hamming", "argmax_leaf", "top_down", "wu_palmer"} & set(got)  # tieredImageNet-H's Wu-Palmer:
    assert "wu_palmer" in _blocked_names("inat19")  # the candidates there, the structural sums on iNat19


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("tree,name", [("tieredimagenet-h", n) for n in _blocked_names()] + [("inat19", "wu_palmer")])
def test_blocks_give_the_whole_batch_bits(tree, name, dtype):
    h = hd.load_hierarchy(tree)
    m = _component(name, h)
    probs = _probs(h, 37, dtype)
    with hd.plan_for("cpu"):  # blocks are the CPU plan's (the suite also runs under the GPU plan)
        whole = _dense(m.decode(probs, chunk_size=37))  # one chunk: the tables of the whole batch
        m.cpu_block_bytes = 5 * m._bytes_per_sample(h, resolve_plan(h, probs.device))
        post = hd.Posterior(h, probs)
        assert len(m._chunks(post)) == 8  # blocks of 5 rows
        assert torch.equal(_dense(m.decode(probs)), whole)


def test_blocks_only_on_the_cpu_plan_and_only_without_a_chunk_size():
    h = hd.load_hierarchy("inat19")
    m = hd.get_metric("tree_distance", h)
    assert m.cpu_block_bytes == CPU_BLOCK_BYTES
    per_row = m._bytes_per_sample(h, None)
    rows = CPU_BLOCK_BYTES // per_row
    probs = _probs(h, 3 * rows + 1, torch.float32)
    with hd.plan_for("cpu"):
        post = hd.Posterior(h, probs)
        assert m._chunks(post) == [(0, rows), (rows, 2 * rows), (2 * rows, 3 * rows), (3 * rows, 3 * rows + 1)]
        assert m._chunks(post, chunk_size=3 * rows + 1) == [(0, 3 * rows + 1)]
        hd.set_memory_budget(per_row * 7)  # a budget below the block still bounds it
        try:
            assert m._chunks(hd.Posterior(h, probs))[0] == (0, 7)  # a Posterior holds its plan
        finally:
            hd.set_memory_budget(None)
    with hd.plan_for("cuda"):
        assert m._chunks(hd.Posterior(h, probs)) == [(0, 3 * rows + 1)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_above_is_the_comparison(dtype):
    h = hd.load_hierarchy("tieredimagenet-h")
    t = torch.tensor(0.3, dtype=dtype)
    near = [torch.nextafter(t, torch.tensor(0.0, dtype=dtype)), t, torch.nextafter(t, torch.tensor(1.0, dtype=dtype))]
    values = torch.tensor([0.0, -0.0, 1.0, 0.5, float("nan"), float("inf"), 0.7], dtype=dtype)
    p = torch.cat([torch.stack(near), values]).repeat(h.num_nodes // 10 + 1)[: h.num_nodes]
    p = p[:, None].repeat(1, 40)
    for threshold in (0.3, 0.5, 0.65, 0.0, 1.0):
        got = above(h, p, threshold)
        assert got.dtype == dtype and got.shape == p.shape
        assert torch.equal(got.bool(), p > threshold), threshold


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_first_allowed_reads_float_tables_as_bool_ones(dtype):
    for tree in ("tieredimagenet-h", "inat19"):
        h = hd.load_hierarchy(tree)
        p = hd.node_probabilities(h, _probs(h, 64, dtype, seed=1)).T  # (N, B) node-major
        for threshold in (0.05, 0.2, 0.5, 0.65):
            fl = above(h, p, threshold)
            assert torch.equal(deepest_where(h, fl), deepest_where(h, p > threshold))
            assert torch.equal(most_informative_where(h, fl), most_informative_where(h, p > threshold))
        assert torch.equal(deepest_above(h, p, 0.5), deepest_where(h, p > 0.5))


def test_above_keeps_bool_where_float32_keys_would_round():
    h = hd.Hierarchy.from_parents(np.r_[np.full(4, 4), -1])
    p = torch.rand(h.num_nodes, 32)
    assert above(h, p[:, :31], 0.5).dtype == torch.bool  # a few columns: the bool table
    assert above(h, p, 0.5).dtype == torch.float32
    big = type("Big", (), {"num_nodes": 2**24})()
    assert above(big, p, 0.5).dtype == torch.bool
    assert above(big, p.double(), 0.5).dtype == torch.float64
    assert above(h, p.half(), 0.5).dtype == torch.bool
