"""Candidates: which nodes may be optimal, as lists of (sample, node) pairs, and their scores.

Pruning for node metrics given as a cost matrix (Plaud et al. 2025, Lemma 4.3 and Prop. E.6).

For a non-root node n with parent π(n) and δ(n, l) = C(n, l) − C(π(n), l):

- ``m_in``/``M_in``: min/max over l ∈ L(n) of −δ (how much n beats its parent on its own leaves);
- ``m_out``/``M_out``: min/max of δ over the leaves outside n that matter — all other
  leaves, or, when the cost is equal for n and π(n) on every leaf whose LCA with n is the
  root (Prop. E.6), only the leaves of L(a_n) \\ L(n), a_n the child of the root above n.

With s(n) = 1 (or p(a_n)) the risk difference obeys
R(π(n)) − R(n) ≥ m_in·p(n) − M_out·(s − p(n))  and  ≤ M_in·p(n) − m_out·(s − p(n)),
so π(n) is strictly worse than n when the first bound is > 0 and n is strictly worse than
π(n) when the second is < 0.  These are the paper's thresholds q_max/q_min written without
division, which keeps them valid for every sign.  Pruning only drops strictly worse nodes,
so the argmin over the survivors, with any tie rule, is the argmin over all nodes.
The statistics depend on the tree and the cost only: computed once, vectorized.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from .ancestry import top_ancestor
from .fused._checks import derived
from .native import hf_beta as native_hf_beta
from .true_entries import listed_by_numpy, true_pairs

__all__ = ["PruningStatistics", "pruning_statistics", "candidate_mask", "sampled_products", "sampled_rows",
           "candidate_pairs", "bounded_pairs", "pack_candidates", "pack_rows", "depth_rank", "depth_order"]


@dataclass(frozen=True)
class PruningStatistics:
    reasonable: bool  # hierarchically reasonable (eq. 2 and eq. 1 or its root form)
    root_form: bool  # costs equal under the root: use p(a_n) (Prop. E.6)
    m_in: torch.Tensor  # (N,) float64
    M_in: torch.Tensor
    m_out: torch.Tensor
    M_out: torch.Tensor
    top: torch.Tensor  # (N,) int64 a_n (the root for the root)
    # per dtype, candidate_mask's slack-adjusted factors: tree-only, so built once rather than in every call
    # (at one row their twenty small operators were a fifth of the call's)
    _factors: dict = field(default_factory=dict, compare=False, repr=False)

    def slack_factors(self, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """``(up(M_in), down(m_out), down(m_in), up(M_out))``, each (N, 1) in ``dtype``, with
        ``up(t) = t + ε|t|``, ``down(t) = t − ε|t|`` and ε = 16 eps(``dtype``), computed in float64 and
        rounded once (cached per dtype)."""
        if dtype not in self._factors:
            eps = 16 * torch.finfo(dtype).eps
            up = lambda t: (t + eps * t.abs()).to(dtype)[:, None]  # noqa: E731
            down = lambda t: (t - eps * t.abs()).to(dtype)[:, None]  # noqa: E731
            self._factors[dtype] = (up(self.M_in), down(self.m_out), down(self.m_in), up(self.M_out))
        return self._factors[dtype]

    def paired_factors(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(F, T, G, U)``, each (N, 2) in ``dtype`` (cached per dtype): :meth:`slack_factors` paired so that one
        comparison ``F·p + T < G·r + U`` makes both of :func:`candidate_mask`'s tests, column 0 "n surely
        worse than its parent" and column 1 "n surely better" negated (F = [up(M_in), −down(m_in)], T =
        [ε², 0], G = [down(m_out), −up(M_out)], U = [0, −ε²]).  Negation is exact and rounding symmetric,
        so −(a·p) and −(b·r + ε²) are the bits of the negated terms, and +0 changes no comparison."""
        key = ("paired", dtype)
        if key not in self._factors:
            up_in, down_out, down_in, up_out = self.slack_factors(dtype)
            eps = 16 * torch.finfo(dtype).eps
            zero = torch.zeros_like(up_in)
            self._factors[key] = (torch.cat([up_in, -down_in], 1), torch.cat([zero + eps * eps, zero], 1),
                                  torch.cat([down_out, -up_out], 1), torch.cat([zero, zero - eps * eps], 1))
        return self._factors[key]

    def to(self, device):
        f = lambda t: t.to(device)  # noqa: E731
        return PruningStatistics(self.reasonable, self.root_form, f(self.m_in), f(self.M_in), f(self.m_out),
                                 f(self.M_out), f(self.top))


def pruning_statistics(h, cost: torch.Tensor, rtol: float = 1e-12) -> PruningStatistics:
    """Lemma 4.3 / Prop. E.6 statistics of a dense (N, L) cost (lower is better), float64."""
    cost = cost.to(torch.float64)
    n_nodes, n_leaves = cost.shape
    dev = cost.device
    depth = h.depth.to(dev)
    parent = h.parent.to(dev)
    pos, size = h.pos.to(dev), h.size.to(dev)
    inside = (pos[:, None] <= pos[None, :n_leaves]) & (pos[None, :n_leaves] < (pos + size)[:, None])  # l ∈ L(n)
    a_n = top_ancestor(h).to(dev)
    same_top = a_n[:n_leaves][None, :] == a_n[:, None]  # (N, L): LCA(n, l) ≠ root
    delta = cost - cost[parent.clamp(min=0)]
    nonroot = depth > 0
    scale = rtol * cost.abs().max().clamp(min=1.0)
    root_equal = bool(((delta.abs() <= scale) | same_top | ~nonroot[:, None]).all())
    outside = ~inside & (same_top if root_equal else torch.ones_like(inside))
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=dev)
    gain = -delta
    m_in = torch.where(inside, gain, inf).amin(1)
    M_in = torch.where(inside, gain, -inf).amax(1)
    m_out = torch.where(outside, delta, inf).amin(1)
    M_out = torch.where(outside, delta, -inf).amax(1)
    has_out = outside.any(1)
    m_out = torch.where(has_out, m_out, torch.zeros_like(m_out))
    M_out = torch.where(has_out, M_out, torch.zeros_like(M_out))
    ok_in = bool(((m_in > 0) | ~nonroot).all())
    ok_out = bool(((m_out > 0) | ~has_out | ~nonroot).all())
    zero = torch.zeros_like(m_in)
    fix = lambda t: torch.where(nonroot, t, zero)  # noqa: E731  (the root has no parent: no statistics)
    return PruningStatistics(ok_in and ok_out, root_equal, fix(m_in), fix(M_in), fix(m_out), fix(M_out), a_n)


#: Entries of the (rows, B) temporaries :func:`candidate_mask` computes at a time on a CPU: blocks of
#: whole node rows small enough to stay in the cache between the pass that makes them and the one that
#: reads them (eight (N, B) passes of main memory otherwise).
CANDIDATE_BLOCK_ENTRIES = 1 << 17


def candidate_mask(h, p: torch.Tensor, stats: PruningStatistics) -> torch.Tensor:
    """Nodes that may be optimal.  p: (N, B) node-major node probabilities.  Returns (N, B) bool.

    Comparisons carry a slack of a few ulps of the compared terms, so rounding in p can
    only keep extra candidates, never drop the optimum.  O(N·B) work; on a CPU the elementwise terms
    are formed a block of node rows at a time (the same operations on each entry, so the same bits).
    """
    dt = p.dtype
    n, b = p.shape
    if b == 1 and stats.root_form and not torch.compiler.is_compiling() and p.device.type == "cpu":
        return _candidate_mask_one_row(h, p, stats)
    # a < b − ε(|a| + |b| + ε) with a = M_in p, b = m_out r (p, r ≥ 0) is
    # (M_in + ε|M_in|) p + ε² < (m_out − ε|m_out|) r: the slack folds into per-node factors (N,).
    eps = 16 * torch.finfo(dt).eps
    tiny = eps * eps
    up_in, down_out, down_in, up_out = stats.slack_factors(dt)
    drop = torch.empty(n, b, dtype=torch.bool, device=p.device)
    beats = torch.empty(n, b, dtype=torch.bool, device=p.device)
    cpu = p.device.type == "cpu"
    rows = max(1, CANDIDATE_BLOCK_ENTRIES // max(1, b)) if cpu else n
    # Several blocks: three (rows, B) buffers that every block reuses, so that they stay in the cache (fresh
    # temporaries per operator cost 15-20% more at B = 4,000 on tieredImageNet-H); one block: fresh ones
    # (out=None), three operators fewer.
    bufs = [None] * 3 if rows >= n else [torch.empty(rows, b, dtype=dt, device=p.device) for _ in range(3)]
    for a in range(0, n, rows):  # a loop over blocks of nodes (one block off the CPU)
        e = min(n, a + rows)
        part = _whole if e - a == n else (lambda t, a=a, e=e: t[a:e])  # one block: no slicing operators
        pa = part(p)
        rest, lhs, rhs = (t if t is None or t.shape[0] == e - a else t[:e - a] for t in bufs)
        if stats.root_form:
            rest = torch.index_select(p, 0, part(stats.top), out=rest)
        else:
            rest = torch.ones_like(pa) if rest is None else rest.fill_(1)
        rest.sub_(pa).clamp_(min=0)
        # n surely worse than its parent: M_in p < m_out (s − p).  The root's statistics are 0, so
        # neither test ever fires there.
        torch.lt(torch.mul(part(up_in), pa, out=lhs).add_(tiny), torch.mul(part(down_out), rest, out=rhs),
                 out=part(drop))
        # n surely better than its parent: m_in p > M_out (s − p); then the parent is dropped.
        torch.gt(torch.mul(part(down_in), pa, out=lhs), torch.mul(part(up_out), rest, out=rhs).add_(tiny),
                 out=part(beats))
    child, par = _nonroot_pairs(h)
    # A boolean accumulation is an OR; on a CPU it runs as one pass, index_add_ row by row.  Not under
    # torch.compile: torch 2.15's inductor emits C++ for it that does not compile (a VecMask plus a bool vector).
    if cpu and not torch.compiler.is_compiling():
        drop.index_put_((par,), beats.index_select(0, child), accumulate=True)
    else:
        drop |= torch.zeros_like(p).index_add_(0, par, beats.index_select(0, child).to(dt)) > 0
    return drop.logical_not_()


def _candidate_mask_one_row(h, p: torch.Tensor, stats: PruningStatistics) -> torch.Tensor:
    """:func:`candidate_mask` of one sample (root form): both tests as one (N, 2) comparison of paired factors
    (:meth:`PruningStatistics.paired_factors`), the same products, sums and comparisons entry by entry,
    so the same mask in three operators fewer (one sample's cost is per operator)."""
    f, t, g, u = stats.paired_factors(p.dtype)
    rest = torch.index_select(p, 0, stats.top).sub_(p).clamp_(min=0)
    tests = torch.lt(torch.mul(f, p).add_(t), torch.mul(g, rest).add_(u))  # (N, 2): drop, beats
    drop = tests.select(1, 0)
    child, par = _nonroot_pairs(h)
    drop.index_put_((par,), tests.select(1, 1).index_select(0, child), accumulate=True)
    return drop.logical_not_()[:, None]


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t


def _nonroot_pairs(h) -> tuple[torch.Tensor, torch.Tensor]:
    """(every non-root node, its parent), cached on the hierarchy."""
    def build():
        child = torch.nonzero(h.parent >= 0)[:, 0]
        return child, h.parent[child]
    return h.cached("nonroot_pairs", build)


def sampled_products(cost: torch.Tensor, probs: torch.Tensor, node: torch.Tensor, sample: torch.Tensor) -> torch.Tensor:
    """``cost[node[i]] · probs[sample[i]]`` for every candidate pair i, without the (N, B) product.

    cost: (N, L) float; probs: (B, L) same dtype; node, sample: (M,) int64, sorted by node (as
    ``nonzero`` of an (N, B) mask gives them).  Returns (M,).  A sampled dense-dense product
    (``torch.sparse.sampled_addmm``) on the CSR pattern of the pairs: M·L multiply-adds instead of
    N·B·L.  Runs eagerly under ``torch.compile`` (Dynamo cannot trace sparse CSR tensors).
    """
    if torch.compiler.is_compiling():
        return _eager_sampled_products()(cost, probs, node, sample)
    return _sampled_products(cost, probs, node, sample)


_EAGER = {}


def _eager_sampled_products():
    # torch.compiler.disable imports Dynamo, which costs more than importing torch: wrap only when
    # compiling (Dynamo is loaded then anyway).
    if "f" not in _EAGER:
        _EAGER["f"] = torch.compiler.disable(_sampled_products)
    return _EAGER["f"]


def _sampled_products(cost, probs, node, sample):
    n, b = cost.shape[0], probs.shape[0]
    if node.numel() == 0:
        return cost.new_zeros(0)
    crow = torch.zeros(n + 1, dtype=torch.long, device=cost.device)
    torch.cumsum(torch.bincount(node, minlength=n), 0, out=crow[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta": this use is tested
        pattern = torch.sparse_csr_tensor(crow, sample, cost.new_zeros(node.numel()), size=(n, b),
                                          check_invariants=False)
        # probs.t() as a view: reading it column by column is faster than a contiguous copy.
        out = torch.sparse.sampled_addmm(pattern, cost, probs.t(), beta=0.0)
    return out.values().clone()  # a plain tensor, not a view of a sparse one (which Dynamo cannot wrap)


def sampled_rows(cost: torch.Tensor, probs: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """``cost[node[i]] · probs[0]`` for every i, the bits of :func:`sampled_products` for one sample with its
    nodes in any order.

    cost: (N, L) float; probs: (1, L) same dtype; node: (M,) int64, M ≥ 1.  Returns (M,).  The sampled
    product of the candidates' rows on an (M, 1) pattern with one entry per row: its CPU kernel reduces
    each entry as the same vectorized dot of a cost row and the probabilities, whatever the row's place
    in the pattern, so the values are those of the (N, 1) pattern of the node ids, without its counts
    (``bincount``, ``cumsum``) or their order.
    """
    if torch.compiler.is_compiling():
        return _eager_sampled_rows()(cost, probs, node)
    return _sampled_rows(cost, probs, node)


def _eager_sampled_rows():
    if "rows" not in _EAGER:
        _EAGER["rows"] = torch.compiler.disable(_sampled_rows)
    return _EAGER["rows"]


def _sampled_rows(cost, probs, node):
    m = node.numel()
    crow = torch.arange(m + 1, device=node.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta": this use is tested
        pattern = torch.sparse_csr_tensor(crow, torch.zeros_like(node), cost.new_zeros(m), size=(m, 1),
                                          check_invariants=False)
        out = torch.sparse.sampled_addmm(pattern, cost.index_select(0, node), probs.t(), beta=0.0)
    return out.values().clone()


def depth_order(h) -> torch.Tensor:
    """(N,) int64 the nodes sorted by (depth, id), cached."""
    return h.cached("depth_order", lambda: torch.sort(
        h.depth * h.num_nodes + torch.arange(h.num_nodes, device=h.depth.device)).indices)


def pack_rows(keep: torch.Tensor, rank: torch.Tensor, width: int, pad: int | None = None) -> torch.Tensor:
    """Each row's kept nodes, left-packed in the order of ``rank``.

    keep: (B, N) bool; rank: (N,) int32, distinct and non-negative (larger first); width: at least
    the largest number of kept nodes in a row (read by the caller); pad: None, or a value the caller
    lets stand in the columns past a row's count.  Returns (B, width) int64 node ids, the kept ones
    first; the columns past a row's count hold other nodes (``pad`` where given, on plain CPU tensors),
    to be ignored.  One top-``width`` selection that reads a (B, N) key once and writes only
    (B, width); no host read.  With ``pad`` on plain CPU tensors (nothing tracing or counting
    operators) NumPy lists the kept entries instead and sorts them by (row, rank), O(B·N + M log M)
    for M kept entries: a CPU's ``topk`` selects row by row at several times that cost.
    """
    if pad is not None and listed_by_numpy(keep):
        return _pack_rows_numpy(keep, rank, width, pad)
    key = torch.where(keep, rank, -1)
    return torch.topk(key, width, dim=1, largest=True, sorted=True).indices


def _pack_rows_numpy(keep: torch.Tensor, rank: torch.Tensor, width: int, pad: int) -> torch.Tensor:
    """:func:`pack_rows` of a plain CPU mask with ``pad`` in the padding columns: the same kept columns."""
    bsz, n = keep.shape
    order, position = derived(("pack_order",), (rank,), lambda: _pack_order(rank))
    sample, node = (t.numpy() for t in true_pairs(keep))
    # one sort of (row, position in pack order) keys: rows stay apart, each row's nodes come in rank order
    sample, slot = np.divmod(np.sort(sample * n + position[node]), n)
    count = np.bincount(sample, minlength=bsz)
    out = np.full((bsz, width), pad, dtype=np.int64)
    out[sample, np.arange(sample.size) - (np.cumsum(count) - count)[sample]] = order[slot]
    return torch.from_numpy(out)


def _pack_order(rank: torch.Tensor):
    """``(order, position)``: the nodes by decreasing ``rank`` and each node's place in that order (NumPy int64)."""
    order = np.argsort(-rank.numpy().astype(np.int64))  # distinct ranks: no ties to break
    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    return order, position


def depth_rank(h) -> torch.Tensor:
    """(N,) int32 N − 1 − (position in (depth, id) order): :func:`pack_rows` packs shallower nodes
    first, then smaller ids (cached)."""
    return _pack_rank(h)


def _pack_rank(h) -> torch.Tensor:
    """(N,) int32 N − 1 − (position in (depth, id) order): larger for shallower nodes, then smaller ids."""
    def build():
        rank = torch.empty(h.num_nodes, dtype=torch.int32, device=h.device)
        rank[depth_order(h)] = torch.arange(h.num_nodes - 1, -1, -1, dtype=torch.int32, device=h.device)
        return rank
    return h.cached("pack_rank", build)


def candidate_pairs(h, keep: torch.Tensor, p: torch.Tensor):
    """The kept (sample, node) pairs, sample-major, nodes in (depth, id) order within a sample.

    keep: (N, B) bool; p: (N, B) float.  Returns ``(sample, node, value)``, each (M,): int64,
    int64 and p at the pair.  One host sync (M, through ``nonzero``).  A batch on a CPU is listed by NumPy:
    the true entries of the node-major mask in (depth, id) order, then a stable sort of them by sample (a
    radix sort of 16-bit keys, O(M)) in place of the (B, N) transposition of the mask, which a CPU writes one
    byte at a time (the same pairs in the same order).
    """
    order = depth_order(h)
    n, bsz = keep.shape
    if bsz == 1:  # one sample: its kept nodes in depth order, no (sample, rank) pairs to split
        node = order.masked_select(keep.reshape(-1).index_select(0, order))
        return torch.zeros_like(node), node, p.reshape(-1).index_select(0, node)
    by_depth = keep.index_select(0, order)
    if keep.device.type == "cpu" and bsz <= _RADIX_MAX_SAMPLES:
        listed = by_depth.numpy()
        if np.count_nonzero(listed) * _RADIX_MAX_SHARE > listed.size:  # many pairs: their sort costs more
            sample, rank = np.divmod(np.flatnonzero(by_depth.t().contiguous().numpy()), n)  # sample-major already
        else:
            rank, sample = np.divmod(np.flatnonzero(listed), bsz)
            by_sample = np.argsort(sample.astype(np.int16), kind="stable")
            sample, rank = sample[by_sample], rank[by_sample]
        sample, rank = torch.from_numpy(sample), torch.from_numpy(rank)
    else:
        # nonzero walks its input in logical order: a batch-major copy of the mask is read in sequence, where
        # the transposed view was read in strides of B (a quarter less time at B = 4,000 on a CPU).
        sample, rank = by_depth.t().contiguous().nonzero().unbind(1)  # (sample, rank in depth order)
    node = order.index_select(0, rank)
    return sample, node, p.reshape(-1).index_select(0, node * bsz + sample)


#: Largest batch whose sample indices :func:`candidate_pairs` sorts as 16-bit keys (NumPy's radix sort).
_RADIX_MAX_SAMPLES = (1 << 15) - 1
#: :func:`candidate_pairs` transposes the mask instead where more than one entry in this many is kept: the
#: sort's O(M) passes then cost about what the transposition does (measured on tieredImageNet-H at B = 4,000).
_RADIX_MAX_SHARE = 20


def bounded_pairs(h, p: torch.Tensor, bound: torch.Tensor):
    """:func:`candidate_pairs` of the mask ``p >= bound`` with the root kept: ``(sample, node, value)``.

    p: (N, B) float node-major values; bound: (N, 1) in p's dtype.  On plain CPU tensors one native pass lists
    the pairs without the (N, B) mask (:func:`~hdecode_torch.kernels.native.hf_beta.kept_pairs`, the same
    pairs and values); else the mask and :func:`candidate_pairs`.  O(N·B).
    """
    got = native_hf_beta.kept_pairs(p, bound, depth_order(h), h.root)
    if got is not None:
        return got
    keep = p >= bound
    keep[h.root] = True
    return candidate_pairs(h, keep, p)


def pack_candidates(h, sample: torch.Tensor, node: torch.Tensor, bsz: int):
    """Sample-major pairs to a left-packed (B, C) table of node ids (padding N), C the largest count.

    One host sync (C).  Returns ``(ids, count, slot)``: (B, C) int64, (B,) int64 and each pair's
    column (M,) int64.
    """
    count = torch.bincount(sample, minlength=bsz)
    c = int(count.max()) if sample.numel() else 0
    slot = torch.arange(sample.numel(), device=sample.device) - (torch.cumsum(count, 0) - count)[sample]
    ids = torch.full((bsz, c), h.num_nodes, dtype=torch.long, device=sample.device)
    ids[sample, slot] = node
    return ids, count, slot
