"""Sparse node sets (the set predictions of a top-k decode): construction, closure, and scoring by every set
metric equal to the dense (B, N) bool sets', on random trees and tieredImageNet-H."""

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch.core.node_sets import (as_sparse_sets, check_sparse_sets, sparse_closure, sparse_node_sets,
                                          sparse_path_counts, unbatched_sparse)
from hdecode_torch.kernels.ancestry import ancestor_closure

from harness import bundled, random_trees

SET_METRICS = ["hamming", "hf_beta", "jaccard"]


def _random_sets(rng, b, n, fill=0.1):
    return torch.from_numpy(rng.random((b, n)) < fill)


def test_sparse_node_sets_is_coalesced_and_deduplicated():
    s = sparse_node_sets(torch.tensor([1, 0, 1, 1]), torch.tensor([4, 2, 0, 4]), 3, 6)
    assert s.is_coalesced() and s.dtype == torch.bool and s.shape == (3, 6)
    assert s.indices().tolist() == [[0, 1, 1], [2, 0, 4]]
    dense = torch.zeros(3, 6, dtype=torch.bool)
    dense[0, 2] = dense[1, 0] = dense[1, 4] = True
    assert torch.equal(s.to_dense(), dense)


def test_empty_sparse_sets():
    s = sparse_node_sets(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, 5)
    assert s._nnz() == 0 and s.shape == (2, 5)
    h, _ = next(random_trees(0, 1))
    s = sparse_node_sets(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), 2, h.num_nodes)
    assert sparse_closure(h, s)._nnz() == 0
    inter, size = sparse_path_counts(h, s, torch.zeros(2, dtype=torch.int64))
    assert inter.tolist() == [0, 0] and size.tolist() == [0, 0]


def test_closure_and_counts_equal_the_dense_ones_on_random_trees():
    rng = np.random.default_rng(1)
    for h, info in random_trees(2, 20):
        dense = _random_sets(rng, 7, h.num_nodes, 0.2)
        s = as_sparse_sets(h, dense)
        closed = sparse_closure(h, s)
        assert closed.is_coalesced()
        assert torch.equal(closed.to_dense(), ancestor_closure(h, dense))
        y = torch.from_numpy(rng.integers(0, h.num_leaves, 7))
        inter, size = sparse_path_counts(h, closed, y)
        want = ancestor_closure(h, dense)
        assert size.tolist() == want.sum(1).tolist()
        anc = torch.from_numpy(np.asarray([[info.is_ancestor(n, int(l)) for n in range(h.num_nodes)] for l in y]))
        assert inter.tolist() == (want & anc).sum(1).tolist()


@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")  # torch 2.11 warns here
def test_check_sparse_sets_drops_false_values_and_names_the_argument():
    idx = torch.tensor([[0, 1], [2, 3]])
    s = torch.sparse_coo_tensor(idx, torch.tensor([True, False]), (2, 5), check_invariants=False)
    out = check_sparse_sets(s, 5)
    assert out.indices().tolist() == [[0], [2]]
    with pytest.raises(TypeError, match="`pred`.*bool"):
        check_sparse_sets(torch.sparse_coo_tensor(idx, torch.tensor([1.0, 2.0]), (2, 5), check_invariants=False), 5)
    with pytest.raises(ValueError, match=r"`pred`.*\(B, 6\)"):
        check_sparse_sets(s, 6)
    one = check_sparse_sets(torch.sparse_coo_tensor(idx[1:], torch.tensor([True, True]), (5,), check_invariants=False), 5)
    assert one.shape == (5,) and one.indices().tolist() == [[2, 3]]


@pytest.mark.parametrize("name", SET_METRICS)
def test_set_metrics_score_sparse_sets_as_dense_ones(name):
    h, _ = bundled("tiered")
    m = hd.get_metric(name, h)
    g = torch.Generator().manual_seed(3)
    p = torch.rand(6, h.num_leaves, generator=g, dtype=torch.float64).softmax(1)
    y = torch.randint(0, h.num_leaves, (6,), generator=g)
    dense = m.decode(p)
    sparse = dense.to_sparse()
    assert torch.equal(m(sparse, y), m(dense, y))
    assert torch.equal(m(sparse, y, dtype=torch.float64), m(dense, y, dtype=torch.float64))
    assert torch.equal(m.expected(p, sparse), m.expected(p, dense))
    one = unbatched_sparse(sparse_node_sets(torch.zeros(1, dtype=torch.int64), dense[2].nonzero()[:, 0][:1], 1,
                                            h.num_nodes))
    assert torch.equal(m(one, y), m(one.to_dense(), y))  # one set against a batch of targets
    assert torch.equal(m(one, y[0]), m(one.to_dense(), y[0]))
    # an unclosed sparse set is scored through its closure, as a dense one
    ids = torch.randint(0, h.num_nodes, (6,), generator=g)
    loose = sparse_node_sets(torch.arange(6), ids, 6, h.num_nodes)
    assert torch.equal(m(loose, y), m(ids, y))
    assert torch.equal(m(loose, y), m(loose.to_dense(), y))


@pytest.mark.parametrize("name", SET_METRICS)
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_set_metrics_score_node_ids_as_their_ancestor_masks(name, tree):
    # a node id is scored from d(n) and d(LCA(n, y)), never its (B, N) mask: the same bits as the mask's counts
    from hdecode_torch.kernels.ancestry import ancestor_mask

    h, _ = bundled(tree)
    m = hd.get_metric(name, h)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, h.num_nodes, (2000,), generator=g)
    y = torch.randint(0, h.num_leaves, (2000,), generator=g)
    for dtype in (torch.float32, torch.float64):
        assert torch.equal(m(ids, y, dtype=dtype), m(ancestor_mask(h, ids), y, dtype=dtype))
        assert torch.equal(m(ids[3], y, dtype=dtype), m(ancestor_mask(h, ids[3:4])[0], y, dtype=dtype))
        assert torch.equal(m(ids, y[0], dtype=dtype), m(ancestor_mask(h, ids), y[0], dtype=dtype))
        one = m(ids[0], y[0], dtype=dtype)
        assert one.shape == () and torch.equal(one, m(ancestor_mask(h, ids[:1])[0], y[0], dtype=dtype))
