"""Hierarchical F_β of ancestor-closed node sets, and its exact decoder.

With h⁺ the ancestor closure of the prediction and y⁺ = A(y) (the root counts),
hF_β = (1+β²)|h⁺∩y⁺| / (|h⁺| + β²|y⁺|) (Kiritchenko et al. 2006).

The decoder is the decomposition by set size k of Plaud et al. 2025 (§4.2), with provably safe pruning.

For an ancestor-closed set S of size k the expected hF_β is U(S) = Σ_{n ∈ S} Δ_k(n), with
Δ_k(n) = Σ_{l ∈ L(n)} p(l) (1+β²) / (k + β²(d(l)+1)).  Δ_k never increases from a parent to a
child, so the k nodes of largest Δ_k, ancestors first among ties, form a closed set: the best
one of size k, of value V(k).  The optimum is the best over k.

Which nodes can be dropped.  Write r = 1/(1+β²) and a(d) = (1−r)(d+1), so that
Δ_k(n) = Σ_{l ∈ L(n)} p(l) / (rk + a(d(l))).  Let S be optimal, |S| = k ≥ 2, and m a node of S
with no child in S.  S \\ {m} is closed, so U(S) ≥ U(S \\ {m}); expanding both sides,

    Σ_{l ∈ L(m)} p(l) / (r(k−1) + a(d(l))) ≥ r Σ_l p(l) c_l / ((rk + a(d(l))) (r(k−1) + a(d(l))))

with c_l = |S ∩ A(l)|.  The left side is at most p(m) / (r(k−1) + a(d_min(m))), the right side at
least r U(S) / (r(k−1) + a(D)), D the deepest leaf.  Every n ∈ S other than the root lies above
such an m, with p(n) ≥ p(m) and d_min(n) ≤ d_min(m); with k ≥ 2:

    n ∈ S, n ≠ root  ⇒  p(n) ≥ τ(n) U(S),   τ(n) = r (r + a(d_min(n))) / (r + a(D)).

U(S) is unknown, but any achieved value is a lower bound on it.  With U(S) ≥ U({root}) ≥
1/(r + a(D)) this already implies the bound (d_min(n)+1) / ((D+1)(1+β²(D+1))), the safe form of the
paper's Lemma 4.4 (which uses the deepest leaf below n and drops optimal nodes on trees whose leaves
sit at different depths); the decoder
does better in two stages: (1) the nodes with p(n) ≥ τ(n), the threshold of a perfect score, form
a small closed set whose best sub-solution has a value LB ≤ U(S*); (2) the nodes with
p(n) ≥ τ(n)·LB hold every optimal set, and are solved exactly.  Both sets are closed (p falls and
τ grows down the tree), so their top-k sets stay closed.

How each stage is solved.  Per sample, on its own candidates only ((B, C) tables, C the batch's
largest count), with the per-leaf-depth masses of the candidates read from prefix sums
(``depth_ranges``), never an (N, E, B) table.  Sorting the candidates once by Δ at a reference
k̂ (ancestors first among ties) gives closed prefix sets of every size k; their exact values
PV(k) ≤ V(k) are computed for all k at once from cumulative masses, and their best is the
stage's value.  In stage 1 that is all (any achieved value is a valid LB).  In stage 2 the
value is certified: a k can only beat it if an upper bound on V(k) does (Δ_k ≤ ρ(k) Δ_k̂ for the
largest ratio ρ(k) of the depth weights, and the coverage bound G(k)); for each such k, if the
length-k prefix is itself a top-k set of Δ_k (its smallest Δ_k is at least the largest outside
it), then V(k) = PV(k) is already counted.  Most such k show it from the order at k̂ alone (Δ_k/Δ_k̂
lies between the smallest and the largest weight ratio, so a wide enough gap after the k-th Δ_k̂
suffices); the others compute their Δ_k.  Only the remaining (sample, k) pairs, rare because
the order barely moves with k, are solved by a sort.  When all leaves share one depth the order
does not depend on k and every pair passes.  Host syncs: the two stages' C, whether stage 2 kept
stage 1's pairs (then its solve is stage 1's), the pairs to check.

Natively on plain CPU tensors (:func:`hf_beta_decode`, :mod:`hdecode_torch.kernels.native.hf_beta`): the pairs
above the fixed bound listed and their masses read in one pass each (the torch path's bits), then per row in C
the same two stages, the same prefix values and upper bounds, and the k left checked from their Δ_k, in float64
sums (ties within 2^-42 to the smallest k): the same optimal sets but for ties within the rounding of the
values' dtype, with no operator per stage (a row's cost was some seventy operators).

Top-k inputs (:func:`hf_beta_decode_topk`): the same stages and solver on the completed distribution,
their candidates and per-depth masses read from the listed leaves and tree tables
(:mod:`hdecode_torch.kernels.support_hf_beta`), never a B × L or B × N table; sparse sets out.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..core.node_sets import sparse_node_sets
from ..core.params import Flag, Param
from ..core.plan import resolve_plan
from ..core.scalar_checks import check_positive
from ..kernels import native
from ..kernels.candidates import bounded_pairs, depth_order, depth_rank, pack_candidates, pack_rows
from ..kernels.depth_ranges import depth_masses, depth_masses_packed, depth_ranges
from ..kernels.fused import hf_beta_best_k, trust_indices
from ..kernels.native import hf_beta as native_hf_beta
from ..kernels.support import support_table
from ..kernels.true_entries import true_pairs, true_positions
from ..kernels.support_hf_beta import depth_listed, depth_masses_topk, heavy_nodes, heavy_order
from .base import SetMetric

__all__ = ["HFBeta", "hf_beta_from_counts", "hf_beta_expected", "hf_beta_decode", "hf_beta_decode_exact", "hf_beta_bound",
           "hf_beta_value_bound", "hf_beta_decode_topk", "hf_beta_expected_topk"]


def _recall_share(beta: float) -> float:
    """r = 1/(1+β²): hF_β = |h⁺∩y⁺| / (r|h⁺| + (1−r)|y⁺|), finite for every β > 0."""
    return 1.0 / (1.0 + beta * beta)


def hf_beta_bound(h, beta: float) -> torch.Tensor:
    """(N,) float64 lower bound (d_min(n)+1) / ((D+1)(1+β²(D+1))) on p(n) for n in an optimal hF_β set."""
    def build():
        big_d = float(h.max_depth)
        r = _recall_share(beta)
        # (d_min+1) / ((D+1)(1+β²(D+1))), written with r = 1/(1+β²) so a huge β gives no inf/inf.
        return (h.min_leaf_depth.to(torch.float64) + 1) * r / ((big_d + 1) * (r + (1 - r) * (big_d + 1)))
    return h.cached(("hf_beta_bound", beta), build)


def hf_beta_value_bound(h, beta: float) -> torch.Tensor:
    """(N,) float64 τ(n): a non-root n of an optimal set S has p(n) ≥ τ(n)·U(S) (module docstring)."""
    def build():
        r = _recall_share(beta)
        a_min = (1 - r) * (h.min_leaf_depth.to(torch.float64) + 1)
        return r * (r + a_min) / (r + (1 - r) * (h.max_depth + 1))
    return h.cached(("hf_beta_value_bound", beta), build)


def hf_beta_decode(post, beta: float) -> torch.Tensor:
    """Optimal hF_β sets of a :class:`~hdecode_torch.Posterior`'s batch, by certified prefix sets.

    Returns (B, N) bool, ancestor-closed.  Ties: among sets of equal expected score the smallest k
    wins; within a k, nodes of equal Δ_k are taken shallowest first, then by smallest id.  Prefix
    sets certified per k, the few k left solved by a sort (fewest operations, where a host read
    costs nothing): host reads, one per stage (its candidate count), whether stage 2 kept stage 1's
    pairs where it kept as many, and the (sample, k) pairs to check.  One row takes shortcuts that give
    the same values with fewer operators (its pairs packed as listed, their masses read once).  On plain CPU
    tensors the native decoder (:func:`_decode_native`, module docstring) runs instead, no host read.
    """
    h, p = post.h, post.node
    dt = p.dtype
    bsz = p.shape[1]
    if bsz == 0:
        return torch.zeros(0, h.num_nodes, dtype=torch.bool, device=p.device)
    slack = _bound_slack(dt)
    # LB is a sum of up to C·E rounded terms: a wider slack keeps its rounding from ever dropping an
    # optimal node.
    wide = 1 - _VALUE_SLACK * torch.finfo(dt).eps
    got = _decode_native(post, beta, slack, wide)
    if got is not None:
        return got
    solver = _PrefixSolver(post, _recall_share(beta))
    # k̂ = E[d(y)] + 1, the size of a typical label set.
    k_ref = (post.expected_leaf_depth() + 1).round().long()
    # The pairs above the fixed bound are listed once; both stages filter that list.
    bounds = _prefix_bounds(h, beta, dt)
    sample, node, value = bounded_pairs(h, p, bounds.bound_slack)
    tau = bounds.tau.index_select(0, node)
    is_root = node == h.root
    # A pair's masses are its own values whatever pairs are read with them: a few listed pairs (one row)
    # have theirs read in one piece for both stages, many have each stage read its own (most listed
    # pairs are in neither stage at batch).  With one leaf depth a mass is p itself, listed already.
    every = value[:, None] if solver.prefix is None else None
    if every is None and value.numel() * h.num_leaf_depths <= _MASS_ONCE_ENTRIES:
        every = solver.masses(sample, node)
    # One row packs its pairs as they are (from_pairs) and has one bound: no sample index is read.
    rows = bsz > 1 or every is None
    at1 = true_positions((value >= tau * slack) | is_root)
    s1, n1 = sample.index_select(0, at1) if rows else None, node.index_select(0, at1)
    q1 = solver.masses(s1, n1) if every is None else every.index_select(0, at1)
    cands1 = solver.from_pairs(s1, n1, q1)
    solved1 = solver.solve(cands1, k_ref)
    lower, k_ref = solved1[:2]
    at2 = true_positions((value >= tau * (lower.index_select(0, sample) if bsz > 1 else lower) * wide) | is_root)
    if at2.shape == at1.shape and torch.equal(at2, at1):
        # Stage 2 kept stage 1's pairs (often, at one row): its solve would repeat stage 1's bit for bit
        # (the same candidates and masses, and k̂ already clamped to their count).
        ids, count, best_k, delta = solver.certified_sets(cands1, k_ref, solved=solved1)
    else:
        del cands1, solved1
        s2, n2 = sample.index_select(0, at2) if rows else None, node.index_select(0, at2)
        if every is None:
            q2 = _reused_masses(solver, sample.numel(), at1, q1, at2, s2, n2)
        else:
            q2 = every.index_select(0, at2)
        ids, count, best_k, delta = solver.certified_sets(solver.from_pairs(s2, n2, q2), k_ref)
    return _best_sets(h, ids, count, best_k, delta, full=bsz == 1)  # from_pairs packs one row without padding


#: Stage-2 candidates a row may keep for the native decoder (:func:`_decode_native`), which solves every set size
#: k of them (O(C²·(E + log C))); a row with more runs the torch path (deep caterpillars).
_NATIVE_MAX_CANDIDATES = 256


def _decode_native(post, beta: float, slack: float, wide: float) -> torch.Tensor | None:
    """:func:`hf_beta_decode` by the native kernels on plain CPU tensors, or None where they do not apply.

    The same pairs above the fixed bound and the same masses (bit for bit, :mod:`hdecode_torch.kernels.native.hf_beta`),
    the same two stages per row, then every set size k of the second stage's candidates solved exactly, in float64
    sums, where the torch path certifies prefix sets k by k: both give a row's optimal set under the same ties
    (smallest k, then shallowest nodes, then smallest ids), one pass a row with no operator per stage.
    """
    h, p = post.h, post.node
    dt = p.dtype
    if not native.applies(p):
        return None
    bounds = _prefix_bounds(h, beta, dt)
    listed = native_hf_beta.kept_pairs(p, bounds.bound_slack, depth_order(h), h.root)
    if listed is None:
        return None
    sample, node, value = listed
    e = h.num_leaf_depths
    if value.numel() * e * value.element_size() > post.plan.budget:
        return None
    r = _recall_share(beta)
    tables = _solver_tables(h, r, dt)
    # With one leaf depth a mass is p itself (the torch path's too).
    q = value[:, None] if e == 1 else depth_masses(h, _depth_prefix(post), sample, node, post.plan.budget, dt)
    return native_hf_beta.decide_rows(sample, node, value, q, bounds.tau, h.root, tables.depths, tables.a, r, slack,
                                      wide, p.shape[1], h.num_nodes, _NATIVE_MAX_CANDIDATES,
                                      budget=post.plan.budget)


#: (B, C, E) entries from which :meth:`_PrefixSolver._check` settles k from the order at k̂ before checking
#: pairs: below, one chunk of pairs checks every k in about as many operators (at one row on
#: tieredImageNet-H half the rows have some k left after settling, so both ran).
_SETTLE_MIN_ENTRIES = 1 << 12

#: Entries (pairs × leaf depths) up to which :func:`hf_beta_decode` reads the masses of every listed pair
#: once rather than each stage's own: a row's few dozen pairs, whose two reads cost two calls' operators.
_MASS_ONCE_ENTRIES = 1 << 12


def _reused_masses(solver, m: int, at1: torch.Tensor, q1: torch.Tensor, at2: torch.Tensor, s2: torch.Tensor,
                   n2: torch.Tensor) -> torch.Tensor:
    """(M2, E) the masses of stage 2's pairs ``at2`` (positions in the M listed pairs; samples ``s2``, nodes
    ``n2``), those of stage 1's pairs ``at1`` copied from its masses ``q1`` (M1, E), the others read.

    Stage 1's pairs are (all but rounding) a subset of stage 2's, and a pair's masses are its own values
    whatever pairs are read with it: the copy is what reading them again gives, without the (M1, 2E) gathers
    from the prefix sums.  (With one leaf depth a mass is one gather: nothing to save.)
    """
    where = torch.full((m,), -1, dtype=torch.long, device=at1.device)
    where.index_copy_(0, at1, torch.arange(at1.numel(), device=at1.device))
    src = where.index_select(0, at2)
    old, new = true_positions(src >= 0), true_positions(src < 0)
    q2 = q1.new_empty(at2.numel(), q1.shape[1])
    # whole rows: index_put with an index tensor writes entry by entry on a CPU
    q2.index_copy_(0, old, q1.index_select(0, src.index_select(0, old)))
    q2.index_copy_(0, new, solver.masses(s2.index_select(0, new), n2.index_select(0, new)))
    return q2


def _best_sets(h, ids: torch.Tensor, count: torch.Tensor, best_k: torch.Tensor, delta: torch.Tensor,
               full: bool = False, distinct: bool = False) -> torch.Tensor:
    """(B, N) bool: the best k* of the first ``count`` candidates ``ids`` (B, C) by Δ_{k*} ``delta``
    (B, C); a stable sort keeps the candidates' (depth, id) order among ties, so ancestors come first.
    ``full``: every count is C (no padding column to mask); ``distinct``: each row's ids are distinct
    nodes (< N), padding included, so every column's flag can be written in place."""
    bsz, c = ids.shape
    cols = torch.arange(c, device=ids.device)
    if not full:
        delta = delta.masked_fill(cols >= count[:, None], float("-inf"))
    rank = torch.sort(delta, dim=1, descending=True, stable=True).indices
    take = cols < best_k[:, None]
    if full or distinct:  # distinct nodes in every column: each one's flag written in place
        return torch.zeros(bsz, h.num_nodes, dtype=torch.bool, device=ids.device).scatter_(1, ids.gather(1, rank), take)
    chosen = torch.where(take, ids.gather(1, rank), h.num_nodes)
    out = torch.zeros(bsz, h.num_nodes + 1, dtype=torch.bool, device=ids.device)
    out.scatter_(1, chosen, True)
    return out[:, : h.num_nodes]


def hf_beta_decode_exact(post, beta: float) -> torch.Tensor:
    """Optimal hF_β sets of a batch with every set size solved exactly on packed candidates: a fixed
    number of operators whatever the tree and the batch, and one host read (the candidate count).

    1. A lower bound LB on the optimum without a host read: the best closed prefix set
       {a_0, ..., a_{k−1}} of the root path of each sample's most probable leaf (an achieved value).
       On trees whose ancestors-by-depth table is too large, the value of {root}.
    2. The candidates p(n) ≥ τ(n)·LB (module docstring; a closed set holding every optimal set),
       packed by a top-C selection in (depth, id) order: the host read is C.
    3. Their per-leaf-depth masses from the depth-first prefix sums, and the exact per-k solver
       (``hdecode::hf_beta_best_k``).  Returns (B, N) bool, ancestor-closed; ties as in
       :func:`hf_beta_decode`.  O(B·(N + L) + B·C²·E) work.
    On plain CPU tensors (nothing tracing or counting operators) the native decoder of :func:`hf_beta_decode`
    runs instead, as the fused ops run their native kernels there.
    """
    h, p = post.h, post.node
    dt = p.dtype
    bsz = p.shape[1]
    if bsz == 0:
        return torch.zeros(0, h.num_nodes, dtype=torch.bool, device=p.device)
    # The tree-only tables first, whichever path runs: built once, they would otherwise be built by the first
    # call that runs the torch path after native ones, and a count of that call's operators would include them.
    tables, rank = _exact_tables(h, beta, dt), depth_rank(h)
    # Plain CPU tensors (the plan run on a CPU, nothing tracing or counting operators): the native decoder, as the
    # fused ops run their native kernels there.
    got = _decode_native(post, beta, _bound_slack(dt), 1 - _VALUE_SLACK * torch.finfo(dt).eps)
    if got is not None:
        return got
    r = _recall_share(beta)
    prefix = post.depth_prefix().t()  # (B, L + 1) float64, batch-major
    wide = 1 - _VALUE_SLACK * torch.finfo(dt).eps
    if tables.chain_weights is not None:
        chain = h.ancestors.index_select(0, post.probs.argmax(1))  # (B, D + 1), N past the leaf
        lower = _chain_lower(h, prefix, chain, tables.chain_weights, post.plan.budget, dt)
    else:
        lower = post.probs @ tables.root_weights
    # τ(root) is 0 in the table: the root is always kept.
    keep = p.t() >= torch.outer(lower * wide, tables.tau)  # (B, N)
    count = keep.sum(1)
    (width,) = post.read(count.max())  # the host read, with the input check's flags
    ids = pack_rows(keep, rank, width)
    trust_indices(count, width)  # 0 <= count <= width by construction: the solver need not read it
    best_k, delta = hf_beta_best_k(_masses_bm(h, prefix, ids, post.plan.budget, dt), count, tables.depths, r)
    # pack_rows's columns are distinct nodes (a top-k's indices); one row's width is its count
    return _best_sets(h, ids, count, best_k, delta, full=bsz == 1, distinct=True)


class _ExactTables(NamedTuple):
    """Tree-only tables of :func:`hf_beta_decode_exact`, per β and dtype (cached on the hierarchy)."""

    tau: torch.Tensor  # (N,) τ(n), 0 at the root
    chain_weights: torch.Tensor | None  # (D + 1, E) w_e(k) for the chain prefixes of size k = 1..D+1
    root_weights: torch.Tensor  # (L,) 1/(r + a(d(l))), the value of {root} per unit of p(l)
    depths: torch.Tensor  # (E,) float64 leaf depths


def _exact_tables(h, beta: float, dt: torch.dtype) -> _ExactTables:
    def build():
        r = _recall_share(beta)
        tau = hf_beta_value_bound(h, beta).clone()
        tau[h.root] = 0
        depths = depth_ranges(h).depths.to(torch.float64)
        chain = None
        if h.ancestor_table_fits:
            k = torch.arange(1, h.max_depth + 2, device=h.device, dtype=torch.float64)[:, None]
            chain = (1 / (r * k + (1 - r) * (depths + 1))).to(dt)
        root = (1 / (r + (1 - r) * (h.leaf_depth.to(torch.float64) + 1))).to(dt)
        return _ExactTables(tau.to(dt), chain, root, depths)
    return h.cached(("hf_beta_exact_tables", beta, dt), build)


def _chain_lower(h, prefix: torch.Tensor, chain: torch.Tensor, weights: torch.Tensor, budget: int,
                 dt: torch.dtype) -> torch.Tensor:
    """(B,) the best value of the closed prefix sets {a_0, ..., a_{k−1}} of the root paths ``chain``
    (B, D + 1) (``N`` past the leaf), ``weights`` (D + 1, E) w_e(k) in ``dt``.

    Past the leaf the cumulated masses stop growing while the weights fall with k: those entries are
    below the leaf's own prefix and never the maximum, so they need no mask.  The (B, D + 1, E) tables
    in one piece when some 48 bytes an entry fit ``budget``, else in blocks of chain positions (deep
    trees), the running sums carried in float64: a CPU's float32 ``cumsum`` accumulates in float64
    too, so the blocks give the same bits.
    """
    bsz, n = chain.shape
    step = max(1, budget // (48 * bsz * weights.shape[1]))
    if step >= n:
        q = _masses_bm(h, prefix, chain, budget, dt)  # (B, D + 1, E)
        return (q.cumsum(1) * weights).sum(2).amax(1)
    best, carry = None, None
    for j0 in range(0, n, step):
        q = _masses_bm(h, prefix, chain[:, j0:j0 + step], budget, dt).to(torch.float64)
        if carry is not None:
            q[:, 0] += carry
        q = q.cumsum_(1)
        carry = q[:, -1].clone()
        got = (q.to(dt) * weights[j0:j0 + step]).sum(2).amax(1)
        best = got if best is None else torch.maximum(best, got)
    return best


def _masses_bm(h, prefix: torch.Tensor, ids: torch.Tensor, budget: int, dt: torch.dtype) -> torch.Tensor:
    """(B, C, E) per-leaf-depth masses in ``dt`` of the nodes ``ids`` (B, C) (``N``: zero masses), read
    from the batch-major depth-first prefix sums ``prefix`` (B, L + 1), temporaries within ``budget``."""
    return depth_masses_packed(h, prefix, ids, budget, dt)


#: Relative slack, in ulps, of comparisons between rounded set values (sums of up to C·E terms):
#: 1e-4 in float32, 2e-13 in float64; it may only keep more candidates or check more k.
_VALUE_SLACK = 1024

def _depth_prefix(post) -> torch.Tensor:
    """(L + 1, B) float64 :meth:`~hdecode_torch.Posterior.depth_prefix`, scanned along the batch-major
    probabilities on every plan: the same sequential sums, but a CPU's ``cumsum`` along rows of a
    node-major table walks B columns in strides and took a third of a large batch's decode.  On plain CPU
    tensors one native pass over each row (the same additions)."""
    if post.plan.batch_major:
        return post.depth_prefix()
    h, probs = post.h, post.probs
    out = native.depth_prefix(probs.t(), depth_ranges(h).leaf_order, batch_major=True)
    if out is not None:
        return out
    if probs.shape[0] * h.num_leaves <= _SMALL_PREFIX_ENTRIES:  # a few rows: four operators fewer, the same sums
        return torch.nn.functional.pad(probs.index_select(1, depth_ranges(h).leaf_order).to(torch.float64).cumsum(1),
                                       (1, 0)).t()
    out = torch.empty(probs.shape[0], h.num_leaves + 1, dtype=torch.float64, device=probs.device)
    out[:, 0] = 0
    # Converted while copied into place and summed there: no (B, L) float64 temporary beside the output.
    body = out[:, 1:]
    body.copy_(probs.index_select(1, depth_ranges(h).leaf_order))
    body.cumsum_(1)
    return out.t()


#: (B, L) entries up to which :func:`_depth_prefix` sums a converted copy and pads it (a (B, L) float64
#: temporary beside the output, a few rows' worth) rather than summing in place in the output.
_SMALL_PREFIX_ENTRIES = 1 << 16


class _Candidates(NamedTuple):
    """Packed candidates: ids (B, C) int64 (padding N), count (B,), masses q (B, C, E); ``full``: known to
    have no padding (every count is C), so that the masks of padding columns, all false, are skipped."""

    ids: torch.Tensor
    count: torch.Tensor
    q: torch.Tensor
    full: bool = False


def _bound_slack(dt: torch.dtype) -> float:
    return 1 - 64 * torch.finfo(dt).eps  # rounding may only add candidates


#: Rows k = 1..K of the cached weight table w_e(k) of :class:`_PrefixSolver`: K·E at most this many entries.
_WEIGHT_TABLE_ENTRIES = 1 << 16


class _PrefixBounds(NamedTuple):
    """The pruning bounds of :func:`hf_beta_decode` in one dtype (cached on the hierarchy per β)."""

    bound_slack: torch.Tensor  # (N, 1) the fixed bound on p(n), times the rounding slack
    tau: torch.Tensor  # (N,) τ(n)


def _prefix_bounds(h, beta: float, dt: torch.dtype) -> _PrefixBounds:
    return h.cached(("hf_beta_prefix_bounds", beta, dt), lambda: _PrefixBounds(
        hf_beta_bound(h, beta).to(dt)[:, None] * _bound_slack(dt), hf_beta_value_bound(h, beta).to(dt)))


class _SolverTables(NamedTuple):
    """Tree tables of :class:`_PrefixSolver` in one dtype, per r (cached on the hierarchy).  Row k of
    ``w_at`` is w(k): a table read at k needs no k − 1 (one operator fewer a read, at one row a fifth of
    the solver's are such)."""

    depths: torch.Tensor  # (E,) leaf depths
    a: torch.Tensor  # (E,) a(d) = (1 − r)(d + 1)
    w_at: torch.Tensor  # (K + 1, E) w_e(k) for k = 0..K (row 0 unused)
    w_ends: torch.Tensor  # (K + 1, 2) w_at's first and last columns (the shallowest and deepest leaf depth)
    cover_w: torch.Tensor  # (K, E) min(k, d_e + 1)·w_e(k) for k = 1..K, the coverage bound's weights


def _solver_tables(h, r: float, dt: torch.dtype) -> _SolverTables:
    def build():
        depths = depth_ranges(h).depths.to(dt)
        a = (1 - r) * (depths + 1)
        rows = min(h.num_nodes, max(1, _WEIGHT_TABLE_ENTRIES // depths.numel()))
        k = torch.arange(0, rows + 1, device=h.device)
        w_at = (r * k.to(dt)[..., None] + a).reciprocal_()  # _PrefixSolver.weights's operations
        # certified_sets's operations on k = 1..K, entry by entry: the same bits as per call
        cover = torch.minimum(k[1:].to(dt)[:, None], depths[None, :] + 1)
        return _SolverTables(depths, a, w_at, w_at[:, [0, depths.numel() - 1]].contiguous(), cover.mul_(w_at[1:]))
    return h.cached(("hf_beta_solver_tables", r, dt), build)


def _rows_in_order(q: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """(B, C, E) ``q`` with each sample's C rows taken in ``order`` (B, C) int64: ``q.gather(1, order``
    expanded over E``)``, the same values, as one ``index_select`` of whole E-entry rows of the flat
    (B·C, E) table (a CPU's gather with an expanded index reads one entry at a time)."""
    bsz, c, e = q.shape
    flat = q.reshape(bsz * c, e)
    if bsz == 1:
        return flat.index_select(0, order.view(c)).view(1, c, e)
    at = order + torch.arange(0, bsz * c, c, device=order.device)[:, None]
    return flat.index_select(0, at.view(-1)).view(bsz, c, e)


class _PrefixSolver:
    """Best prefix sets of candidate lists (module docstring), for one batch."""

    def __init__(self, post, r):
        h, p = post.h, post.node
        self.h, self.r, self.dt, self.p = h, r, p.dtype, p
        self.budget = post.plan.budget
        self.settle = not post.plan.gpu  # see _check
        self.gpu = post.plan.gpu  # see solve
        # With one leaf depth the masses are p itself.
        self.prefix = _depth_prefix(post) if h.num_leaf_depths > 1 else None
        self.tables = _solver_tables(h, r, self.dt)
        self.depths, self.a, self._w = self.tables.depths, self.tables.a, self.tables.w_at[1:]

    @classmethod
    def on_candidates(cls, h, r: float, dt: torch.dtype, budget: int, settle: bool = True,
                      gpu: bool = False) -> "_PrefixSolver":
        """A solver for candidates whose masses the caller packs itself (top-k inputs): :meth:`solve` and
        :meth:`certified_sets` only, not :meth:`from_pairs`.  ``settle``: see :meth:`_check`; ``gpu``: the
        GPU plan's (see :meth:`solve`)."""
        self = cls.__new__(cls)
        self.h, self.r, self.dt, self.p, self.budget, self.prefix = h, r, dt, None, budget, None
        self.settle, self.gpu = settle, gpu
        self.tables = _solver_tables(h, r, dt)
        self.depths, self.a, self._w = self.tables.depths, self.tables.a, self.tables.w_at[1:]
        return self

    def weights(self, k: torch.Tensor) -> torch.Tensor:
        """(*k.shape, E) w_e(k) = 1/(rk + a(d_e)) = (1+β²)/(k + β²(d_e+1))."""
        # In place: the bits of ``1 / x`` (which torch computes as ``x.reciprocal() * 1``) without a
        # second (C, E) table, as large as the masses on deep trees.
        return (self.r * k.to(self.dt)[..., None] + self.a).reciprocal_()

    def weights_upto(self, c: int) -> torch.Tensor:
        """(C, E) w_e(k) for k = 1..c: a slice of the cached table where it is long enough."""
        if c <= self._w.shape[0]:
            return self._w[:c]
        return self.weights(torch.arange(1, c + 1, device=self._w.device))

    def weights_at(self, k: torch.Tensor, c: int) -> torch.Tensor:
        """(B, E) w_e(k) of k (B,) in 1..c: rows of the cached table where it is long enough."""
        if c <= self._w.shape[0]:
            return self.tables.w_at.index_select(0, k)
        return self.weights(k)

    def masses(self, sample: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
        """(M, E) the per-leaf-depth masses in ``dt`` of (sample, node) pairs (M,), each pair's values
        independent of the others read with it."""
        if self.prefix is None:
            return self.p.reshape(-1).index_select(0, node * self.p.shape[1] + sample)[:, None]
        return depth_masses(self.h, self.prefix, sample, node, self.budget, self.dt)

    def from_pairs(self, sample: torch.Tensor, node: torch.Tensor, flat: torch.Tensor | None = None) -> "_Candidates":
        """The candidates of sample-major (sample, node) pairs (M,), packed, and their masses ``flat``
        (M, E) (default: :meth:`masses`, read for the M pairs only)."""
        h = self.h
        bsz = self.p.shape[1]
        if flat is None:
            flat = self.masses(sample, node)
        if bsz == 1:  # one row: its pairs are its packed candidates, in order (what the packing gives)
            return _Candidates(node[None], node.new_full((1,), node.numel()), flat[None], True)
        ids, count, slot = pack_candidates(h, sample, node, bsz)
        c, e = ids.shape[1], flat.shape[1]
        q = torch.zeros(bsz, c, e, dtype=self.dt, device=ids.device)
        # Whole E-entry rows of the flat (B·C, E) table: a CPU's index_put with two index tensors writes
        # entry by entry (the same values).
        q.view(bsz * c, e).index_copy_(0, sample * c + slot, flat)
        return _Candidates(ids, count, q)

    def solve(self, cands: "_Candidates", k_ref):
        """Best prefix set of each sample's candidates, ordered by Δ at ``k_ref`` (B,).

        Returns (value, k, q, q in that order, Δ_k̂ in that order, k̂, ids, count): value (B,) is
        achieved by a closed set of size k (B,), ties to the smallest k; q (B, C, E) the masses of
        the candidates ``ids`` (B, C).
        """
        ids, count, q = cands.ids, cands.count, cands.q
        c = ids.shape[1]
        k_ref = torch.minimum(k_ref.clamp(min=1), count)
        d_ref = (q * self.weights_at(k_ref, c)[:, None, :]).sum(2)
        if not cands.full:
            d_ref = d_ref.masked_fill(ids == self.h.num_nodes, float("-inf"))
        srt = torch.sort(d_ref, dim=1, descending=True, stable=True)
        # On the GPU plan one gather (its launches count); on a CPU whole rows (_rows_in_order), the same values
        qs = q.gather(1, srt.indices[:, :, None].expand_as(q)) if self.gpu else _rows_in_order(q, srt.indices)
        pv = qs.cumsum(1).mul_(self.weights_upto(c)).sum(2)  # (B, C) value of each prefix
        if not cands.full:
            pv.masked_fill_(torch.arange(1, c + 1, device=ids.device) > count[:, None], -1.0)
        value, k = pv.max(1)  # first max: the smallest k
        return value, k + 1, q, qs, srt.values, k_ref, ids, count, srt.indices

    def certified(self, cands: "_Candidates", k_ref):
        """The optimal k of each sample over its candidates (a superset of every optimal set), from the
        best prefix value certified k by k.  Returns (k* (B,), Δ_{k*} of the candidates (B, C))."""
        return self.certified_sets(cands, k_ref)[2:]

    def certified_sets(self, cands: "_Candidates", k_ref, solved: tuple | None = None):
        """:meth:`certified`, returning (ids, count, k*, Δ_{k*}); ``cands`` is not used after the call.
        ``solved``: :meth:`solve`'s result on ``cands`` at ``k_ref`` where the caller has it already."""
        value, best_k, q0, q, d_ref, k_ref, ids, count, order = self.solve(cands, k_ref) if solved is None else solved
        full = cands.full
        del cands, solved
        if self.depths.numel() > 1:  # with one leaf depth the order never moves: PV(k) = V(k)
            c = q.shape[1]
            w = self.weights_upto(c)  # (C, E)
            # G(k) = Σ_e w_e(k) min(k, d_e+1) Q_e(root) (see _check), from the candidates' own order.
            if c <= self._w.shape[0]:
                cover = self.tables.cover_w[:c]
            else:
                ks = torch.arange(1, c + 1, device=q.device)
                cover = torch.minimum(ks.to(self.dt)[:, None], self.depths[None, :] + 1).mul_(w)
            root_ub = q0[:, 0, :] @ cover.t()
            del cover
            # On deep trees the (B, C, E) masses in both orders are the largest tables: only the sorted ones
            # are held while they are checked, the candidates' order put back after by the sort's
            # permutation (the same values).
            drop = q0.numel() * q0.element_size() > self.budget // 8
            if drop:
                q0 = None
            value, best_k = self._check(value, best_k, w, root_ub, q, d_ref, k_ref, count, full)
            if drop:
                q0 = torch.empty_like(q).scatter_(1, order[:, :, None].expand_as(q), q)
        del q, order  # the sorted (B, C, E) masses: not held beside the product below
        return ids, count, best_k, (q0 * self.weights_at(best_k, q0.shape[1])[:, None, :]).sum(2)

    def _settled(self, ratio: torch.Tensor, d_ref: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """(B, C) bool: the k = column + 1 whose length-k prefix is shown a top-k set of Δ_k without Δ_k.

        ratio: (B, C, 2) w_e(k)/w_e(k̂) at the shallowest and the deepest leaf depth; d_ref: (B, C) Δ_k̂
        sorted in descending order (−inf past the count); q: (B, C, E) the masses in that order.  With
        non-negative masses Δ_k(n)/Δ_k̂(n) lies between the smallest and the largest ratio, so the prefix
        holds the k largest Δ_k where ρ_min(k) times its smallest Δ_k̂ (the k-th) exceeds ρ_max(k) times
        the next one.  The margin covers the rounding of Δ_k̂, of the Δ_k that :meth:`_check` computes
        (sums of E products, each within γ_E of its exact value) and of ρ: a k settled here is one whose
        test on the rounded Δ_k passes, so skipping that test changes no result.  O(B·C·E).
        """
        dt = self.dt
        bsz, c, e = q.shape
        tight = 4 * (e + 2) * torch.finfo(dt).eps
        after = torch.cat([d_ref[:, 1:], d_ref.new_full((bsz, 1), float("-inf"))], 1)
        settled = ratio.amin(2) * d_ref * (1 - tight) > ratio.amax(2) * after * (1 + tight) + torch.finfo(dt).tiny
        return settled & (q.amin((1, 2)) >= 0)[:, None]

    def _check(self, value, best_k, w, root_ub, q, d_ref, k_ref, count, full=False):
        """Certify (value, best_k) from :meth:`solve`, solving exactly the k it cannot exclude.  w: (C, E)
        the weights of k = 1..C; root_ub: (B, C) the coverage bound G(k); full: no padding columns."""
        dt, dev = self.dt, q.device
        bsz, c, e = q.shape
        ks = torch.arange(1, c + 1, device=dev)
        # Upper bounds on V(k).  Δ_k(n) ≤ ρ(k) Δ_k̂(n) with ρ(k) the largest ratio w_e(k)/w_e(k̂) over
        # the leaf depths: the ratio is monotone in d_e, so it peaks at the shallowest or the deepest.
        # So V(k) ≤ ρ(k)·(sum of the k largest Δ_k̂).  And V(k) ≤ G(k) = Σ_e w_e(k) min(k, d_e+1) Q_e(root):
        # a closed set of size k holds at most min(k, d+1) ancestors of a depth-d leaf.
        if c <= self._w.shape[0]:
            ends = self.tables.w_ends
            ratio = ends[1:c + 1][None] / ends.index_select(0, k_ref)[:, None]  # (B, C, 2)
        else:
            ends = [0, e - 1]
            ratio = w[None, :, ends] / self.weights_at(k_ref, c)[:, None, ends]
        rho = ratio.amax(2)  # (B, C)
        ub = torch.minimum(rho * d_ref.clamp(min=0).cumsum(1), root_ub)
        eps = _VALUE_SLACK * torch.finfo(dt).eps  # both sides are rounded sums over candidates
        # best_k itself is checked too: its prefix value may be below V(best_k), and another k in between.
        check = ub >= value[:, None] * (1 - eps)
        if not full:
            check &= ks <= count[:, None]
        # Not on the GPU plan: its ~7 operators are launches, which a few pairs do not repay; nor on a few
        # rows' small tables, where the pairs' check below is as many operators and settles as many k.
        if self.settle and bsz * c * e >= _SETTLE_MIN_ENTRIES:
            check &= ~self._settled(ratio, d_ref, q)
        b, kk = true_pairs(check)  # (P,) pairs (sample, k - 1)
        if not b.numel():
            return value, best_k
        # Is the length-k prefix a top-k set of Δ_k?  Its smallest Δ_k against the largest after it.  The
        # pairs' (C, E) tables in chunks that fit the budget; only the pairs that fail are kept.
        step = max(1, self.budget // (16 * c * e))
        kept = []
        for a in range(0, b.numel(), step):
            bb, kc = (b, kk) if step >= b.numel() else (b[a:a + step], kk[a:a + step])
            dk = torch.bmm(q.view(bsz, c * e).index_select(0, bb).view(-1, c, e), w.index_select(0, kc)[:, :, None])[:, :, 0]
            pad = None if full else ks > count.index_select(0, bb)[:, None]
            prefix = ks <= kc[:, None] + 1
            inside = dk.masked_fill(~prefix, float("inf")).amin(1)
            after = dk.masked_fill(prefix if full else prefix | pad, float("-inf")).amax(1)
            bad = (inside < after).nonzero()[:, 0]
            kept.append((bb[bad], kc[bad], dk[bad] if full else dk[bad].masked_fill(pad[bad], float("-inf"))))
        b, kk, dk = kept[0] if len(kept) == 1 else (torch.cat(parts) for parts in zip(*kept))
        if not b.numel():
            return value, best_k
        exact = torch.sort(dk, dim=1, descending=True).values.clamp(min=0).cumsum(1).gather(1, kk[:, None])[:, 0]
        top = torch.full_like(value, float("-inf")).scatter_reduce(0, b, exact, "amax")
        hit = exact == top[b]
        first_k = torch.full_like(best_k, c + 1).scatter_reduce(0, b[hit], kk[hit] + 1, "amin")
        better = (top > value) | ((top == value) & (first_k < best_k))
        return torch.where(better, top, value), torch.where(better, first_k, best_k)


# ------------------------------------------------------------------------------------------ top-k inputs
def _heavy_order(ct, beta: float):
    """:func:`~hdecode_torch.kernels.support_hf_beta.heavy_order` of the completion's weights against the
    fixed bound: a tree table, cached for the uniform completion (a prior's weights change per call)."""
    h = ct.h
    bound = _prefix_bounds(h, beta, torch.float64).bound_slack[:, 0]
    if ct.prior is not None:
        return heavy_order(h, ct.weights, bound)
    return h.cached(("hf_beta_topk_heavy", beta), lambda: heavy_order(h, ct.weights, bound))


def hf_beta_decode_topk(ct, beta: float) -> torch.Tensor:
    """Optimal hF_β sets of a completed top-k batch (:class:`~hdecode_torch.core.topk.CompletedTopK`), exact
    for the completed distribution q (listed leaves their values, unlisted ones r·w(l)) and never B × L or B × N.

    Returns a coalesced sparse COO bool (B, N) tensor of ancestor-closed sets holding the root.

    Why it is exact: it is :func:`hf_beta_decode` on q, with the same two pruning stages, the same solver
    and the same certificate per set size k (module docstring), fed the same candidates.  Those are the
    nodes with q̃(n) ≥ (d_min(n)+1)/((D+1)(1+β²(D+1))) (times the rounding slack), a closed set holding every
    optimal set: on the support (the ancestors of the listed leaves) q̃ comes from the support table, off
    it q̃(n) = r·W(n), and the nodes passing are a prefix of the nodes sorted by W/bound, read per row by a
    binary search (:mod:`hdecode_torch.kernels.support_hf_beta`).  At most 1/bound nodes of a depth pass
    (disjoint subtrees share a mass of at most 1), so about C ≤ (D+1)²(1+β²(D+1)) candidates a row (the
    rounding slack aside) whatever L.  Their masses per leaf depth, Q_e(n) = S_e(n) + r·(W_e(n) − C_e(n)),
    are read from the row's listed leaves sorted by (depth, depth-first position) and the tree's (depth,
    position) runs.  Every quantity is in float64 whatever the values' dtype.  Ties as in
    :func:`hf_beta_decode` (smallest k, then shallowest nodes, then smallest ids).  O(B·k·D) for the
    support, O(B·C·E·log(B·k)) for the masses, the solver's O(B·C·(E + log C)) (rarely a sort per k left
    unproven), plus O(N log N) per call with a prior (the W/bound order; cached for the uniform completion,
    as it is a tree table).  Memory: rows in groups whose (C, E) float64 tables (four a row, C the widest row's
    candidates) fit the plan's budget, each stage's masses read for its own candidates in blocks of the budget;
    one row's tables are the floor beyond it, as for the dense decoder (C ~ N on a caterpillar, E = D).  Host
    syncs: the support table's, the heavy prefixes' lengths, the widest row, the groups' offsets, each stage's
    candidate count, the (row, k) pairs to check.
    """
    h = ct.h
    bsz, n = ct.batch_size, h.num_nodes
    dt = torch.float64
    r = _recall_share(beta)
    bounds = _prefix_bounds(h, beta, dt)
    bound = bounds.bound_slack[:, 0]
    sup = support_table(h, ct.listed, ct.weights)
    on = ((sup.p >= bound.index_select(0, sup.nodes)) | (sup.nodes == h.root)).nonzero().squeeze(1)
    hr, hn = heavy_nodes(_heavy_order(ct, beta), ct.listed.rate)
    # a heavy node with a listed leaf under it is on the support, already counted
    nl = h.num_leaves
    keys = (ct.listed.keys + torch.arange(bsz, device=hr.device)[:, None] * nl).reshape(-1)
    first = hr * nl + h.leaf_start.index_select(0, hn)
    free = torch.searchsorted(keys, first) == torch.searchsorted(keys, first + h.leaf_count.index_select(0, hn))
    hp = ct.listed.rate.index_select(0, hr) * ct.weights.index_select(0, hn)
    off = (free & (hp >= bound.index_select(0, hn))).nonzero().squeeze(1)
    rows = torch.cat([sup.rows.index_select(0, on), hr.index_select(0, off)])
    nodes = torch.cat([sup.nodes.index_select(0, on), hn.index_select(0, off)])
    p = torch.cat([sup.p.index_select(0, on), hp.index_select(0, off)])
    # sample-major, (depth, id) within a sample: the root first, ancestors before descendants
    pos = h.cached("hf_beta_topk_depth_position", lambda: (n - 1) - depth_rank(h).to(torch.int64))
    order = torch.sort(rows * n + pos.index_select(0, nodes)).indices
    rows, nodes, p = rows.index_select(0, order), nodes.index_select(0, order), p.index_select(0, order)
    dl = depth_listed(h, ct.values, ct.indices, ct.listed, ct.prior)
    plan = resolve_plan(h, rows.device)
    budget = plan.budget
    solver = _PrefixSolver.on_candidates(h, r, dt, budget, settle=not plan.gpu, gpu=plan.gpu)
    num_e = depth_ranges(h).depths.numel()
    tau = bounds.tau.index_select(0, nodes)
    is_root = nodes == h.root
    k_ref = (ct.expected_leaf_depth() + 1).round().long()
    wide = 1 - _VALUE_SLACK * torch.finfo(dt).eps
    # Rows in groups whose (rows, C, E) tables fit the budget, C the widest row's candidates: each row is
    # decided alone (its own candidates, bounds and k), so a group's rows get the bits they get in the batch.
    if bsz == 0:
        return sparse_node_sets(rows, nodes, 0, n)
    count = torch.bincount(rows, minlength=bsz)
    width = int(count.max())
    step = max(1, budget // (_TOPK_TABLES * 8 * num_e * max(width, 1)))
    if step >= bsz:  # one group (the usual case): its offsets are known on the host
        bounds_at, offsets = [0, bsz], [0, rows.shape[0]]
    else:
        bounds_at = torch.arange(0, bsz, step).tolist() + [bsz]
        ends = torch.cat([count.new_zeros(1), count.cumsum(0)])
        offsets = ends.index_select(0, torch.tensor(bounds_at, device=ends.device)).tolist()
    out_rows, out_nodes = [], []
    for (a, b), (lo, hi) in zip(zip(bounds_at[:-1], bounds_at[1:]), zip(offsets[:-1], offsets[1:])):
        g_rows, g_nodes, g_p = rows[lo:hi], nodes[lo:hi], p[lo:hi]

        def packed(mask):
            at = mask.nonzero().squeeze(1)
            sample, node = g_rows.index_select(0, at), g_nodes.index_select(0, at)
            q = depth_masses_topk(h, dl, sample, node, budget)
            ids, count, slot = pack_candidates(h, sample - a, node, b - a)
            table = torch.zeros(b - a, ids.shape[1], num_e, dtype=dt, device=q.device)
            table[sample - a, slot] = q
            return _Candidates(ids, count, table)

        g_tau, g_root, g_k = tau[lo:hi], is_root[lo:hi], k_ref[a:b]
        lower, g_k = solver.solve(packed((g_p >= g_tau * _bound_slack(dt)) | g_root), g_k)[:2]
        ids, cnt, best_k, delta = solver.certified_sets(
            packed((g_p >= g_tau * lower.index_select(0, g_rows - a) * wide) | g_root), g_k)
        got_rows, got_nodes = _best_pairs(ids, cnt, best_k, delta)
        out_rows.append(got_rows + a)
        out_nodes.append(got_nodes)
    return sparse_node_sets(torch.cat(out_rows), torch.cat(out_nodes), bsz, n)


#: (C, E) float64 tables of one row's candidates that hold at once in the top-k solver (the packed masses
#: and, in ``solve``, their sorted copy, its running sums and the product of the reference order), charged
#: per row when :func:`hf_beta_decode_topk` groups rows.
_TOPK_TABLES = 4


def _best_pairs(ids: torch.Tensor, count: torch.Tensor, best_k: torch.Tensor,
                delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_best_sets` as (row, node) pairs, (M,) int64 each."""
    c = ids.shape[1]
    cols = torch.arange(c, device=ids.device)
    delta = delta.masked_fill(cols >= count[:, None], float("-inf"))
    rank = torch.sort(delta, dim=1, descending=True, stable=True).indices
    row, col = (cols < best_k[:, None]).nonzero(as_tuple=True)
    return row, ids.gather(1, rank)[row, col]


def hf_beta_expected_topk(ct, sets: torch.Tensor, beta: float) -> torch.Tensor:
    """(B,) float64 expected hF_β under a completed top-k batch of closed sets ``sets``, a coalesced sparse
    COO bool (B, N) tensor: Σ_{n ∈ S} Σ_e Q_e(n)·(1+β²)/(|S| + β²(d_e+1)) (the module docstring's U(S)),
    Q_e the completed masses per leaf depth.  O(nnz·E·log(B·k)) time, O(nnz·E) memory."""
    h = ct.h
    rows, nodes = sets.indices()
    q = depth_masses_topk(h, depth_listed(h, ct.values, ct.indices, ct.listed, ct.prior), rows, nodes,
                          resolve_plan(h, rows.device).budget)
    bsz = ct.batch_size
    size = torch.bincount(rows, minlength=bsz).to(torch.float64)
    r = _recall_share(beta)
    depths = depth_ranges(h).depths.to(torch.float64)
    w = 1 / (r * size[:, None] + (1 - r) * (depths + 1))  # (B, E)
    per = (q * w.index_select(0, rows)).sum(1)
    return torch.zeros(bsz, dtype=torch.float64, device=per.device).index_add_(0, rows, per)


def hf_beta_from_counts(inter, size, ysize, beta: float):
    """hF_β from |h⁺∩y⁺|, |h⁺| and |y⁺| (float64 tensors)."""
    r = _recall_share(beta)  # (1+β²)x/(a+β²b) = x/(ra+(1−r)b): finite for any β
    return inter / (r * size + (1 - r) * ysize)


def hf_beta_expected(post, sets: torch.Tensor, beta: float) -> torch.Tensor:
    """(B,) ``Σ_{n ∈ h⁺} Δ_k(n)`` of closed sets (B, N) bool, k = |h⁺|.

    Σ_{n∈h⁺} Δ_k(n) = Σ_l p(l) c(l) w(k, d(l)) with c(l) = |h⁺ ∩ A(l)|: one root-path sum of the
    sets, no (N, E, B) table.
    """
    h, dt = post.h, post.dtype
    counts = post.path_sum(sets.t().to(dt))[: h.num_leaves]  # (L, B)
    k = sets.sum(1).to(dt)  # (B,)
    r = _recall_share(beta)
    w = 1 / (r * k[None, :] + (1 - r) * (h.leaf_depth.to(dt)[:, None] + 1))  # (L, B)
    return (post.probs.t() * counts * w).sum(0)


#: β is squared: beyond this β² overflows float64.  (From β ≈ 1e8 on, hF_β already equals the
#: hierarchical recall to float64 precision.)
MAX_BETA = 1e150


def check_beta(beta, name: str = "beta") -> float:
    """β as a float in (0, 1e150] (β² must be finite)."""
    b = check_positive(beta, name)
    if b > MAX_BETA:
        raise ValueError(f"Expected `{name}` to be a float in (0, {MAX_BETA:g}] (beta squared must be finite), but got "
                         f"{beta}; any beta above 1e8 already gives the hierarchical recall to float precision")
    return b


class HFBeta(SetMetric):
    """Hierarchical F_β score of the predicted set's ancestor closure (β > 0)."""

    name = "hf_beta"
    higher_is_better = True
    description = "hierarchical F-beta of ancestor-closed node sets"
    data_dependent_sizes = "its candidate sets and the set sizes k left to solve depend on the data"
    aliases = ("hf",)
    algorithms = {"cpu": "closed prefix sets certified per set size k, rarely a sort",
                  "gpu": "every k solved exactly on the packed candidates, the fused hdecode::hf_beta_best_k"}
    oracle, baseline = "reference:hf_beta", "benchmarks.baselines:Baselines.hf_beta"
    PARAMS = (Param("beta", float, 1.0, check_beta, doc="weight of recall over precision, > 0", grid=(1.0, 0.5, 2.0),
                    flag=Flag("--beta", None, "beta > 0", sweep=(0.5, 1.0, 2.0), lower=0.0, lower_open=True)),)

    def _decode_default(self, post):
        return hf_beta_decode(post, self.beta)

    def _decode_gpu(self, post):
        return hf_beta_decode_exact(post, self.beta)

    def _from_counts(self, inter, size, ysize):
        return hf_beta_from_counts(inter, size, ysize, self.beta)

    def _bytes_per_sample(self, h, plan):
        # (N, B) node sums and masks, float64 prefix sums (L, B), (B, C, E) candidate tables
        return 8 * (2 * h.num_nodes + h.num_leaves) + 64 * h.num_leaf_depths * (h.max_depth + 1)

    def _expected_sets(self, post, sets):
        return hf_beta_expected(post, sets, self.beta)

    accepts_topk = True

    def _decode_topk(self, ct):
        return hf_beta_decode_topk(ct, self.beta)

    def _expected_topk(self, ct, sets):
        return hf_beta_expected_topk(ct, sets, self.beta)
