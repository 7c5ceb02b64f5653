"""Exact decoding strategies shared by the node metrics whose decoder is a search over nodes
(Wu-Palmer, Zhao): every node's expected value from root-path sums, a dense (N, L) product, or a
pruned candidate list.

- ``"structural"``: the expected value of every node from root-path sums (no N×L tensor);
- ``"candidates"``: the pruning of Plaud et al. 2025 (Lemma 4.3 in its Prop. E.6 form: both
  metrics are equal for a node and its parent on leaves whose LCA with it is the root) as a
  batched candidate mask, then the expected value of the candidates only.  While the dense (N, L)
  matrix is small, with the matrix's exact pruning statistics and sampled products ``cost[n] · p``
  on the candidate pairs; on larger trees with thresholds from per-node bounds of the cost
  structure (safe: a looser bound only keeps more candidates) and sums over each candidate's
  ancestors (no N×L tensor);
- ``"dense"``: one (N, L) @ (L, B) product with the dense matrix (small trees);
- ``"auto"``: the strategy the measured rule of the metric picks for this tree.

Every tree-only table (the dense matrix, its pruning statistics, the per-node bounds) is cached on
the hierarchy, per device, so a new metric object decodes as fast as a reused one.
"""

from __future__ import annotations

import copy

import torch

from ..core.chunking import CPU_BLOCK_BYTES, chunk_ranges
from ..core.params import Param
from ..core.plan import get_memory_budget
from ..kernels import native
from ..kernels.ancestry import leaf_lca
from ..kernels.path_argbest import path_argbest
from ..kernels.candidates import (PruningStatistics, candidate_mask, pruning_statistics, sampled_products,
                                 sampled_rows)
from ..kernels.selection import argbest, argbest_pairs, preference_order
from ..kernels.tree_sums import level_pairs
from ..kernels.true_entries import true_pairs
from .base import NodeMetric

__all__ = ["StrategyNodeMetric", "dense_fits", "native_decides", "warm_torch_path", "DENSE_MAX_ENTRIES",
           "preference_layout", "ordered_path_sum_", "one_row_path_sums", "internal_path_sums_one_row",
           "ONE_ROW_MAX_TERMS", "ONE_ROW_MAX_ANCESTORS"]

#: The dense (N, L) matrix is used while it has at most this many entries (16 MB in float64).
DENSE_MAX_ENTRIES = 2_000_000


#: Columns of every product of the dense strategy (the batch is cut into blocks of this width, the last
#: one padded with zeros).
DENSE_BLOCK = 64


def _blocked_product(rows: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """(K, B) ``rows @ probs.T``, as products of one fixed shape (K, L) @ (L, DENSE_BLOCK).

    A matrix product rounds a column differently with the number of columns (gemv for one, blocked
    kernels beyond), so values that tie in exact arithmetic would be ordered by the batch size; with
    one shape, a column's value depends on that column only.  In a traced graph (``torch.export``,
    ONNX), whose batch size is symbolic, it is one product of the whole batch: there exact ties can
    still depend on the batch size.
    """
    if torch.compiler.is_compiling():
        return rows @ probs.t()
    b = probs.shape[0]
    padded = torch.nn.functional.pad(probs, (0, 0, 0, (-b) % DENSE_BLOCK))
    blocks = padded.reshape(-1, DENSE_BLOCK, probs.shape[1]).transpose(1, 2)  # (blocks, L, DENSE_BLOCK)
    out = torch.matmul(rows, blocks)  # one product per block, all of one shape
    return out.permute(1, 0, 2).reshape(rows.shape[0], -1)[:, :b]


def preference_layout(h) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, slice | None, torch.Tensor]]]:
    """``(order, position, levels)`` (cached on ``h``): ``order`` (N,) int64 the nodes from most to least
    preferred among ties (:func:`~hdecode_torch.kernels.selection.preference_order`), ``position`` (N,)
    int64 each node's row in that order, and per level, root side first, the rows of its nodes and of
    their parents in that order (the per-level pairs of the tree sums, renumbered: ``(rows, span,
    parent_rows)``, ``span`` the rows as a slice where they are consecutive, as they are in this order)."""
    def build():
        order = preference_order(h, h.num_nodes)
        position = torch.empty_like(order)
        position[order] = torch.arange(h.num_nodes, device=order.device)
        levels = []
        for nodes, parents in reversed(level_pairs(h)):
            rows, by_row = torch.sort(position[nodes])
            start, stop = int(rows[0]), int(rows[-1]) + 1
            # deeper nodes come first in the order, so a level is a run of rows: a slice as well
            span = slice(start, stop) if stop - start == rows.numel() else None
            levels.append((rows, span, position[parents][by_row]))
        return order, position, levels
    return h.cached("preference_layout", build)


def ordered_path_sum_(h, table: torch.Tensor, include_root: bool = True) -> torch.Tensor:
    """In place, ``table[position[n]] = Σ_{a ∈ A(n)} table[position[a]]`` for a (N, *) table whose rows are
    the nodes in :func:`preference_layout` order (the root's row left out of every sum with
    ``include_root=False``, and set to 0).  Returns ``table``.

    The per-level sums of ``kernels.tree_sums.path_sum`` (its ``"levels"`` layout and torch backend) on
    renumbered rows: the same additions of the same values, so the same bits, O(N·B) in D steps.
    """
    _, position, levels = preference_layout(h)
    if not include_root:
        table[position[h.root]] = 0
    # one column: a 1-D view, whose index_add_ skips the 2-D kernels' per-row bookkeeping (the same adds)
    one = table.numel() == table.shape[0]
    rows = table.view(table.shape[0]) if one and table.dim() > 1 else table
    for nodes, span, parents in levels:
        # an add into a slice of rows (each entry once, as index_add_ adds it) is the faster kernel on many
        # columns; on one, index_add_ saves the slice's operator
        if span is None or one:
            rows.index_add_(0, nodes, rows.index_select(0, parents))
        else:
            rows[span].add_(rows.index_select(0, parents))
    return table


#: Most root-path terms of internal nodes (Σ (d(n) + 1) over them) of a tree whose one-row root-path sums
#: :func:`internal_path_sums_one_row` adds in one operator, and most entries of the ancestors-by-depth table
#: it reads them from; beyond, the per-level sums, which read each node once.
ONE_ROW_MAX_TERMS = 2**16
ONE_ROW_MAX_ANCESTORS = 2**22


def one_row_path_sums(post) -> bool:
    """Whether ``post`` is one row on a CPU that the CPU plan sums per level (``"levels"``, torch backend,
    not traced), on a tree of depth ≥ 1 within ``ONE_ROW_MAX_TERMS`` and ``ONE_ROW_MAX_ANCESTORS``: where
    :func:`internal_path_sums_one_row` gives the per-level root-path sums' bits."""
    h = post.h
    return (post.batch_size == 1 and post.device.type == "cpu" and post.plan.tree_sums == "levels"
            and post.plan.backend == "torch" and h.max_depth >= 1 and not torch.compiler.is_compiling()
            and h.num_nodes * (h.max_depth + 1) <= ONE_ROW_MAX_ANCESTORS
            and h.cached("internal_path_terms", lambda: int(h.depth[h.num_leaves:].sum()) + h.num_nodes
                         - h.num_leaves) <= ONE_ROW_MAX_TERMS)


def _internal_path_terms(h) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` (M,) int64 (cached): for every depth d, root side first, and every internal node n at
    depth ≥ d, its ancestor at depth d and n."""
    def build():
        anc = h.ancestors.to(h.device)[h.num_leaves:].t()  # (D + 1, N − L), N past a node's depth
        depth, col = (anc < h.num_nodes).nonzero().unbind(1)  # depth-major: each node's terms root first
        return anc[depth, col], col + h.num_leaves
    return h.cached("internal_path_terms_one_row", build)


def internal_path_sums_one_row(h, v: torch.Tensor) -> torch.Tensor:
    """(N,) ``S(n) = Σ_{a ∈ A(n)} v[a]`` of one row's node values v (N,) at the internal nodes, bit for bit
    the per-level root-path sums (``kernels.tree_sums.path_sum``, :func:`ordered_path_sum_`); the leaves'
    entries (ids < L) are 0 (−0.0), theirs to complete: S(l) = v[l] + S(parent(l)).

    The per-level sums set S(root) = v[root], then S(n) = v[n] + S(parent(n)) level after level: along n's
    root path, root first, each partial sum plus the next term, rounded in v's dtype.  One ``index_add_``
    of every internal node's root-path terms, depth-major, makes those additions in that order (it adds
    the entries of one call in index order) onto −0.0, which adds nothing to the first term (+0.0 would
    turn a −0.0 into +0.0).  Three operators instead of two a tree level, O(Σ_{n internal} (d(n) + 1)).
    """
    src, dst = _internal_path_terms(h)
    return torch.full_like(v, -0.0).index_add_(0, dst, v.index_select(0, src))


def native_decides(post) -> bool:
    """Whether ``post``'s leaf probabilities are a plain (B, L) float32/float64 CPU batch that the native kernels
    take (:func:`hdecode_torch.kernels.native.applies`): then the CPU plan's structural node decoders decide in
    one native pass a row (:func:`~hdecode_torch.kernels.path_argbest.path_argbest`)."""
    probs = post.probs
    return probs.dtype in (torch.float32, torch.float64) and probs.dim() == 2 and native.applies(probs)


def warm_torch_path(component, post, key) -> None:
    """Decode uniform rows of ``post``'s dtype (one row, then 32: both layouts) once per tree and ``key`` with the
    native kernels turned off, so that the tree tables the torch path reads exist once the native kernels have
    decided instead: a later call that must see torch operators (a trace, a dispatch mode counting them) finds
    them built, as it would after a torch call, and never builds them inside the trace or the count."""
    h = post.h

    def build():
        with native.use_native(False):
            for rows in (1, 32):
                component.decode(torch.full((rows, h.num_leaves), 1 / h.num_leaves, dtype=post.dtype), validate=False)
        return True
    h.cached(("native_warm_torch_path", type(component), key, post.plan.gpu, post.dtype), build)


def dense_fits(h, max_entries: int | None = None) -> bool:
    """Whether the dense (N, L) matrix of ``h`` is small enough to use."""
    return h.num_nodes * h.num_leaves <= (DENSE_MAX_ENTRIES if max_entries is None else max_entries)


class StrategyNodeMetric(NodeMetric):
    """A node metric with the ``strategy`` parameter (``"auto"``, ``"structural"``, ``"dense"``, ``"candidates"``).

    Subclasses give the structural ``expected_table``, ``pruning_bounds(h)`` (safe per-node pruning
    statistics of the cost 1 − similarity), ``pair_values(post, node, sample)`` (expected values of
    (sample, node) pairs from root paths only) and ``candidates_are_faster(h, small)`` (the measured
    ``auto`` rule).
    """

    STRATEGIES = ("auto", "structural", "dense", "candidates")
    PARAMS = (Param("strategy", str, "auto", choices=STRATEGIES, in_key=False,
                    doc="how the exact decoder searches: auto, structural, dense or candidates"),)
    #: Overridable per instance (tests set 0 to take the path of trees too large for the dense matrix).
    DENSE_MAX_ENTRIES = DENSE_MAX_ENTRIES
    cpu_block_bytes = CPU_BLOCK_BYTES  # the structural strategy's (see _cpu_block_bytes)

    def resolved_strategy(self, plan, h=None) -> str:
        """The strategy ``decode`` runs under ``plan`` on ``h`` (default: this metric's hierarchy).

        CPU plan: the metric's measured rule (``candidates_are_faster``).  GPU plan: the dense
        product while the matrix fits (one GEMM), the structural sums otherwise.
        """
        if self.strategy != "auto":
            return self.strategy
        h = self.hierarchy if h is None else h
        if plan.gpu:
            return "dense" if self._dense_fits(h) else "structural"
        return "candidates" if self.candidates_are_faster(h, self._dense_fits(h)) else "structural"

    def _cpu_block_bytes(self, post) -> int | None:
        # the structural sums are passes over (N, B) tables (and (N, E, B) ones), which cache-sized blocks
        # speed up (the native pass gives the same decisions in any block); the candidates' and the dense
        # product's work is per pair or per row
        return self.cpu_block_bytes if self.resolved_strategy(post.plan, post.h) == "structural" else None

    def _native_route(self, post) -> bool:
        """Whether :meth:`_decode_default` decides ``post`` in one native pass a row (:meth:`native_args`): the
        CPU plan's structural strategy on its per-level sums, a batch :func:`native_decides` takes."""
        return (not post.plan.gpu and post.plan.tree_sums == "levels" and post.plan.backend == "torch"
                and self.resolved_strategy(post.plan, post.h) == "structural" and self.native_args(post) is not None
                and native_decides(post))

    def native_args(self, post) -> tuple | None:
        """The arguments of :func:`~hdecode_torch.kernels.path_argbest.path_argbest` after ``(h, probs)`` that
        decide as :meth:`ordered_table`'s first best row (the same table, bit for bit), or None where the metric
        has no such form (cached tree tables)."""
        return None

    def _dense_fits(self, h) -> bool:
        return dense_fits(h, self.DENSE_MAX_ENTRIES)

    def fixed_size(self, plan, h=None) -> "StrategyNodeMetric":
        """This metric, or for the pruned candidates (``"candidates"``, or ``"auto"`` where ``plan`` picks
        them) a copy scoring every node: the dense product while the (N, L) matrix fits, O(B·N·L), else the
        structural root-path sums.  Both decide exactly as the candidates do."""
        h = self.hierarchy if h is None else h
        if self.resolved_strategy(plan, h) != "candidates":
            return self
        fixed = copy.copy(self)
        fixed.strategy = "dense" if self._dense_fits(h) else "structural"
        return fixed

    def candidates_are_faster(self, h, small: bool) -> bool:
        """Whether pruned candidates (scored with the dense matrix when ``small``, else along their root
        paths) beat the structural risks on ``h``."""
        return False

    def _bytes_per_sample(self, h, plan):
        strategy = self.resolved_strategy(plan, h)
        if strategy == "candidates":  # node sums, mask, float64 prefix sums
            return 4 * h.num_nodes * 12 + 8 * (h.num_leaves + 1)
        if strategy == "dense":  # the (N, B) product and its reordered copy
            return 8 * h.num_nodes * 3
        return self.structural_bytes_per_sample(h, plan)

    def _expected_bytes_per_sample(self, h, plan):
        return self.structural_bytes_per_sample(h, plan)  # expected values are always the structural table

    def structural_bytes_per_sample(self, h, plan) -> int:
        """Bytes per sample of the structural table's temporaries under ``plan``: node sums and a root-path
        sum, which on the depth-first layout gathers a float64 prefix twice as wide as the nodes."""
        return 8 * h.num_nodes * (6 if plan.batch_major else 4) + 16 * h.num_leaves

    # ------------------------------------------------------------------ tree-only tables (cached on h)
    def similarity_matrix(self, h, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """(N, L) the metric's value of every (node, leaf) pair in ``dtype``, cached on ``h``."""
        if not dense_fits(h, 50 * DENSE_MAX_ENTRIES):
            raise ValueError(f"The dense strategy needs an N×L matrix ({h.num_nodes}×{h.num_leaves}); "
                             "use strategy='structural' or 'candidates' on a tree this large")

        def build():
            if dtype != torch.float64:
                return self.similarity_matrix(h, torch.float64).to(dtype)
            # Every pair's LCA from one table filled level by level (O(N·L), no root paths gathered),
            # then the values a block of rows at a time, the blocks' temporaries within the budget.
            budget = get_memory_budget()
            meet = leaf_lca(h, budget)
            out = torch.empty(h.num_nodes, h.num_leaves, dtype=torch.float64, device=h.device)
            nodes = torch.arange(h.num_nodes, device=h.device)
            leaves = torch.arange(h.num_leaves, device=h.device)[None, :]
            for a, b in chunk_ranges(h.num_nodes, self.LCA_VALUE_BYTES * h.num_leaves, budget):
                out[a:b] = self._lca_values(h, nodes[a:b, None], leaves, meet[a:b].long())
            return out
        return h.cached((type(self), "matrix", dtype), build)

    def distinct_rows(self, h, dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, row_of_node)``: the distinct rows (K, L) of :meth:`similarity_matrix` and each node's
        row (N,) int64, cached on ``h``.

        Nodes with equal rows (Zhao's unary chains: the same leaf set, hence the same information) tie
        in exact arithmetic, but a matrix product rounds two equal rows differently in ways that change
        with the batch size (blocked kernels); one product per distinct row gives them the same value,
        so the tie rule decides, in any batch.
        """
        def build():
            rows, inverse = torch.unique(self.similarity_matrix(h, dtype), dim=0, return_inverse=True)
            return rows.contiguous(), inverse
        return h.cached((type(self), "distinct_rows", dtype), build)

    def dense_pruning(self, h) -> PruningStatistics:
        """Exact Lemma 4.3 / Prop. E.6 statistics of the dense cost (−similarity), cached on ``h``."""
        return h.cached((type(self), "dense_pruning"), lambda: pruning_statistics(h, -self.similarity_matrix(h)))

    def pruning(self, h) -> PruningStatistics:
        """Safe per-node pruning statistics from the cost structure (no N×L matrix), cached on ``h``."""
        return h.cached((type(self), "pruning"), lambda: self.pruning_bounds(h))

    def dense_matrix(self) -> torch.Tensor:
        h = self.hierarchy
        return self.similarity_matrix(h).clone()

    # ------------------------------------------------------------------ decoding
    def _decode_default(self, post):
        if self._native_route(post):
            pred = path_argbest(post.h, post.probs, *self.native_args(post))
            if pred is not None:
                warm_torch_path(self, post, self.strategy)
                return pred
        strategy = self.resolved_strategy(post.plan, post.h)
        h = post.h
        if strategy == "structural":
            if post.plan.tree_sums == "levels" and post.plan.backend == "torch" and not torch.compiler.is_compiling():
                table = self.ordered_table(post)
                if table is not None:
                    # argbest's choice, the table's rows already in its preference order: the first best
                    # row of a column is the tie winner (no reordered copy of the table)
                    order = preference_layout(h)[0]
                    return order.index_select(0, table.argmax(0) if self.higher_is_better else table.argmin(0))
            return super()._decode_default(post)
        if strategy == "dense":
            rows, row_of_node = self.distinct_rows(h, post.dtype)
            table = _blocked_product(rows, post.probs).index_select(0, row_of_node)
            return argbest(h, table, self.higher_is_better)
        if self._dense_fits(h):
            # The dense matrix fits: exact statistics, and the candidates' values are sampled products.
            if post.batch_size == 1 and post.device.type == "cpu" and not torch.compiler.is_compiling():
                return self._decode_candidates_one_row(post)
            node, sample = true_pairs(candidate_mask(h, post.node, self.dense_pruning(h)))
            values = sampled_products(self.similarity_matrix(h, post.dtype), post.probs, node, sample)
        else:
            node, sample = true_pairs(candidate_mask(h, post.node, self.pruning(h)))
            # root paths cost O(D) per pair: blocks of pairs, their temporaries within the budget
            blocks = chunk_ranges(node.numel(), self.pair_bytes(h), post.plan.budget)
            if len(blocks) == 1:
                values = self.pair_values(post, node, sample)
            else:
                values = torch.cat([self.pair_values(post, node[a:b], sample[a:b]) for a, b in blocks])
        return argbest_pairs(h, values, sample, node, post.batch_size, self.higher_is_better)

    def _decode_candidates_one_row(self, post) -> torch.Tensor:
        """The dense-statistics candidates of one sample on a CPU, deciding as :func:`argbest_pairs` does:
        the candidates listed in preference order (:func:`preference_order`), each one's sampled product
        (:func:`sampled_rows`: the same bits as :func:`sampled_products`'), and the first best of the list,
        the root where that is NaN (as the scatter's maximum propagates it).  Four operators fewer than
        the batch path's pairs and scatters (one sample's cost is per operator)."""
        h = post.h
        keep = candidate_mask(h, post.node, self.dense_pruning(h)).reshape(-1)
        order = preference_order(h, h.num_nodes)
        node = order.masked_select(keep.index_select(0, order))
        if node.numel() == 0:  # every node dropped (not for a distribution): no best, the root
            return torch.full((1,), h.root, dtype=torch.long, device=node.device)
        values = sampled_rows(self.similarity_matrix(h, post.dtype), post.probs, node)
        first = values.argmax(0, keepdim=True) if self.higher_is_better else values.argmin(0, keepdim=True)
        best = values.index_select(0, first)
        return torch.where(best == best, node.index_select(0, first), h.root)

    def ordered_table(self, post) -> torch.Tensor | None:
        """(N, B) :meth:`expected_table`'s values, bit for bit, its rows the nodes in
        :func:`preference_layout` order, built with :func:`ordered_path_sum_` (the CPU plan's per-level
        sums); None where the metric has no such form (the structural decoder then reorders the table)."""
        return None

    def pruning_bounds(self, h) -> PruningStatistics:
        raise NotImplementedError

    #: Bytes per (node, leaf) entry of the temporaries of ``_lca_values`` and its int64 LCA ids (Zhao's,
    #: the larger: nine float64 or int64 tables).
    LCA_VALUE_BYTES = 80

    def _lca_values(self, h, pred: torch.Tensor, target: torch.Tensor, meet: torch.Tensor) -> torch.Tensor:
        """float64 values of (node, leaf) pairs whose LCA ``meet`` is known; pred, target, meet:
        broadcastable int64.  The same bits as ``_values(h, pred, target)``."""
        raise NotImplementedError

    def pair_values(self, post, node: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
        """(M,) expected value of node ``node[i]`` for sample ``sample[i]``, from its root path only."""
        raise NotImplementedError

    def pair_bytes(self, h) -> int:
        """Bytes of :meth:`pair_values`'s temporaries per pair (its root path of D nodes)."""
        return 64 * (h.max_depth + 1)
