"""Node sets held sparsely: the (B, N) set predictions of a top-k decode, without a B × N table.

A set metric's decision on a dense (B, L) input is a (B, N) bool tensor.  On a top-k input the point is
never to build anything B × N (at N = 10⁶ and B = 1,024 a bool table alone is 1 GB), so its decision is the
same (B, N) set as a **sparse COO bool tensor**: ``torch.sparse_coo_tensor`` of shape (B, N) ((N,) for one
row), coalesced (entries sorted by row, then node id; no duplicates), every stored value True.
``sets.to_dense()`` is the dense decision; ``sets.indices()`` is (2, nnz) int64 (row, node) pairs.
Set metrics score such tensors directly (``metric(sets, target)``, ``metric.expected(top, sets)``) in
O(nnz·D) time and memory, D the depth of the tree.
"""

from __future__ import annotations

import warnings

import torch

from ..kernels.support import leaf_ranks, walk_up

__all__ = ["sparse_node_sets", "is_sparse_sets", "check_sparse_sets", "sparse_closure", "sparse_path_counts",
           "as_sparse_sets", "batched_sparse", "unbatched_sparse"]


def sparse_node_sets(rows: torch.Tensor, nodes: torch.Tensor, batch_size: int, num_nodes: int) -> torch.Tensor:
    """The coalesced sparse COO bool (B, N) set holding the (row, node) pairs given.

    rows, nodes: (M,) int64 (any order, duplicates allowed).  Returns a sparse COO bool tensor of shape
    (batch_size, num_nodes), coalesced, every value True.  O(M log M) (one sort of the pairs).
    """
    key = torch.unique(rows.to(torch.int64) * num_nodes + nodes.to(torch.int64))
    idx = torch.stack([key // num_nodes, key % num_nodes])
    return _coalesced_bool(idx, (batch_size, num_nodes))


def _coalesced_bool(idx: torch.Tensor, size: tuple[int, ...]) -> torch.Tensor:
    """The sparse COO bool tensor of ``size`` with True at the (ndim, nnz) sorted, distinct indices ``idx``."""
    values = torch.ones(idx.shape[1], dtype=torch.bool, device=idx.device)
    with warnings.catch_warnings():
        # Some torch releases (2.11 among them) warn on every construction that the global invariant checks are
        # "implicitly disabled", even with check_invariants=False given: these indices are sorted and distinct
        # by construction, and checking them would cost a host read.
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        return torch.sparse_coo_tensor(idx, values, size, is_coalesced=True, check_invariants=False)


def unbatched_sparse(sets: torch.Tensor) -> torch.Tensor:
    """The coalesced sparse (N,) set of a (1, N) batch."""
    return _coalesced_bool(sets.indices()[1:], tuple(sets.shape[1:]))


def is_sparse_sets(t) -> bool:
    """Whether ``t`` is a sparse COO tensor (a set prediction held sparsely)."""
    return isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo


def check_sparse_sets(t: torch.Tensor, num_nodes: int, *, name: str = "pred",
                      device: torch.device | None = None) -> torch.Tensor:
    """A sparse COO bool (B, N) or (N,) set, checked and coalesced, with its zeros (False values) dropped.

    Returns a coalesced sparse COO bool tensor of the same shape on ``device`` whose stored values are all
    True.  Raises naming ``name`` for another dtype or shape.
    """
    if t.dtype != torch.bool:
        raise TypeError(f"Expected `{name}` as a sparse node set to be a bool tensor, but got dtype {t.dtype}")
    if t.dim() not in (1, 2) or t.shape[-1] != num_nodes or t.sparse_dim() != t.dim():
        raise ValueError(f"Expected `{name}` to be a sparse COO tensor of shape (B, {num_nodes}) or ({num_nodes},) "
                         f"with every dimension sparse, but got shape {tuple(t.shape)} with "
                         f"{t.sparse_dim()} sparse dimension(s)")
    if device is not None:
        t = t.to(device)
    t = t.coalesce()
    idx, keep = t.indices(), t.values()
    if not bool(keep.all()):
        idx = idx[:, keep]
    if t.dim() == 1:
        return unbatched_sparse(sparse_node_sets(torch.zeros_like(idx[0]), idx[0], 1, num_nodes))
    return sparse_node_sets(idx[0], idx[1], t.shape[0], num_nodes)


def batched_sparse(sets: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """A coalesced sparse (N,) set as the (1, N) batch of it; a (B, N) batch unchanged."""
    if sets.dim() == 2:
        return sets
    idx = sets.indices()
    return sparse_node_sets(torch.zeros_like(idx[0]), idx[0], 1, num_nodes)


def as_sparse_sets(h, pred: torch.Tensor) -> torch.Tensor:
    """Batched (B, N) coalesced sparse sets of ``pred``: (B, N) bool dense or sparse sets, or (B,) int64
    node ids (the sets A(n)); already converted and range-checked.  Not closed: see :func:`sparse_closure`."""
    n = h.num_nodes
    if is_sparse_sets(pred):
        return batched_sparse(pred, n)
    if pred.dtype == torch.bool:
        rows, nodes = pred.nonzero(as_tuple=True)
        return sparse_node_sets(rows, nodes, pred.shape[0], n)
    return sparse_node_sets(torch.arange(pred.shape[0], device=pred.device), pred, pred.shape[0], n)


def sparse_closure(h, sets: torch.Tensor) -> torch.Tensor:
    """The ancestor closure S⁺ = ∪_{n ∈ S} A(n) of coalesced sparse (B, N) sets: the same layout.

    O(nnz·D log(nnz·D)): each entry's root path (:func:`~hdecode_torch.kernels.support.walk_up`), then one
    sort of the pairs.
    """
    idx = sets.indices()
    if idx.shape[1] == 0:
        return sets
    paths = walk_up(h, idx[1], h.max_depth)  # (nnz, D+1), the root repeated past the top
    rows = idx[0][:, None].expand_as(paths)
    return sparse_node_sets(rows.reshape(-1), paths.reshape(-1), sets.shape[0], h.num_nodes)


def sparse_path_counts(h, sets: torch.Tensor, leaves: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """|S ∩ A(y)| and |S| per row of coalesced sparse (B, N) sets, for (B,) int64 leaf ids y.

    Returns two (B,) int64.  An entry n is an ancestor of y iff y's depth-first position lies in n's run of
    leaves.  O(nnz).
    """
    idx = sets.indices()
    b = sets.shape[0]
    rows, nodes = idx[0], idx[1]
    pos = leaf_ranks(h)[leaves][rows]
    start = h.leaf_start[nodes]
    hit = (start <= pos) & (pos < start + h.leaf_count[nodes])
    size = torch.zeros(b, dtype=torch.int64, device=idx.device).index_add_(0, rows, torch.ones_like(rows))
    inter = torch.zeros(b, dtype=torch.int64, device=idx.device).index_add_(0, rows, hit.to(torch.int64))
    return inter, size
