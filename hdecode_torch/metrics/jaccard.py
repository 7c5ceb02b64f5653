"""Jaccard index of ancestor-closed node sets, |h⁺ ∩ y⁺| / |h⁺ ∪ y⁺|, and its exact decoder.

Notation.  A prediction is an ancestor-closed node set S holding the root, k = |S|.  A leaf y
has depth d(y) and root path y⁺ = A(y), |y⁺| = d(y) + 1; D is the deepest leaf's depth, d_min(n)
the depth of the shallowest leaf under n, L(n) the leaves under n, p(n) = Σ_{y ∈ L(n)} p(y), and
Q_e(n) the mass of the leaves of L(n) at the e-th distinct leaf depth d_e (E of them).

Expected value of a given closed set: Σ_y p(y) c(y) / (k + d(y) + 1 − c(y)), c(y) = |S ∩ A(y)|
counted down the root path (one root-path sum).

The decoder: a tree knapsack per set size, with provably safe pruning (the decomposition by set
size is that of the hF_β decoder of Plaud et al. 2025, §4.2; the gains, bounds and knapsack below
are derived here).

1. Decomposition.  S ∩ A(y) is a prefix root..a of y's root path (S is closed); with
c_y = |S ∩ A(y)|, J(S, y) = c_y / (k + d(y) + 1 − c_y) = f_y(c_y), f_y(c) = c / (K_y − c),
K_y = k + d(y) + 1.  Telescoping f_y(c_y) = Σ_{c = 1..c_y} (f_y(c) − f_y(c − 1)) over the nodes a
of that prefix (c = d(a) + 1) and summing over y: for every closed S of size k,

    E[J(S)] = Σ_{a ∈ S} g_k(a),   g_k(a) = Σ_{y ∈ L(a)} p(y) (f_y(d(a) + 1) − f_y(d(a))).

f(c) − f(c−1) = K / ((K − c)(K − c + 1)); with x = K − c = m + d(y), m = k − d(a):

    g_k(a) = Σ_e Q_e(a) [1/(m + d_e) + d(a) / ((m + d_e)(m + d_e + 1))],

positive terms only (no cancellation); a ∈ S forces d(a) ≤ k − 1, i.e. m ≥ 1.  g_k is not
monotone down the tree (a single child has its parent's leaves and larger weights), so, unlike
hF_β, the k best nodes need not form a closed set: V(k) = max_{|S| = k} Σ_S g_k is a tree
knapsack, and the optimum is U* = max_k V(k).

2. Node bound.  Let S* be optimal, |S*| = k ≥ 2, n ∈ S* not the root, m a deepest node of S*
under n (m has no child in S*; p(m) ≤ p(n)), U = E[J(S*)].  S' = S* − {m} is closed, so
E[J(S*)] − E[J(S')] ≥ 0.  A leaf y ∈ L(m) has c_y = d(m) + 1 and the same union
u_y = k + d(y) − d(m) ≥ a := k + d_min(m) − d(m) in both sets: it gains 1/u_y ≤ 1/a, in all
≤ p(m)/a.  A leaf y ∉ L(m) keeps c_y ≥ 1 and its union shrinks by one: it loses
J(S*, y)/(u_y − 1) ≥ J(S*, y)/(k + D − 1).  As J(S*, y) = (d(m)+1)/u_y ≤ (d(m)+1)/a on L(m),
the losses total ≥ (U − p(m)(d(m)+1)/a)/(k + D − 1), hence

    p(m)/a ≥ (U − p(m)(d(m)+1)/a)/(k + D − 1)   ⇒   p(m) ≥ U (k + d_min(m) − d(m)) / (k + D + d(m)).

The right side grows with d_min(m) ≥ max(d(m), d_min(n)) and then falls with d(m) ≤ k − 1, so

    p(n) ≥ τ_k(n)·U,   τ_k(n) = max(k, d_min(n) + 1) / (2k + D − 1),

and over k (falling up to k = d_min(n) + 1, rising after since D ≥ 1)

    p(n) ≥ τ(n)·U,   τ(n) = (d_min(n) + 1) / (2 d_min(n) + D + 1).

Equality is reached (a 4-leaf star with uniform p: {root} and {root, leaf} both score 1/2 and the
leaf has p = 1/4 = τ·U).  Any achieved value LB ≤ U* may replace U, and the bounds hold for every
optimal set, ties included.  τ and τ_k do not decrease down the tree and p does not increase, so
{n : p(n) ≥ τ(n)·LB} ∪ {root} is closed.

3. Bounds on V(k).  (a) J grows with c_y ≤ min(k, d(y)+1), so
V(k) ≤ G(k) = Σ_e Q_e(root) min(k, d_e+1) / max(k, d_e+1).  (b) If k is the size of an optimal
set, that set lies in A_k = {p(n) ≥ τ_k(n)·LB} ∪ {root} (§2), so U* = V(k) ≤ the sum of the k
largest g_k over A_k ≤ λk + Σ_{n ∈ A_k} (g_k(n) − λ)⁺ for every λ (the top-k sum in Lagrangian
form, exact at λ = the k-th largest; no sort needed).  A size whose bound is below LB is not the
size of any optimal set and its knapsack is skipped: all sizes are screened at once.

4. Lower bounds.  LB₀: the best root path A(a), a on the path of the most probable leaf y (all
of them when D < 32, else those of sizes d(a) + 1 ∈ k̂ − 3..k̂ + 3 and d(y) + 1, with
k̂ = round(E[d(y)] + 1)).  LB: the best closed prefix of one order of the candidates
p(n) ≥ τ(n)·LB₀, at the sizes k̂ − 3..k̂ + 3.  The order is by the smallest gain at k̂ along each
root path: that key never grows from a parent to a child, and ties keep preorder (parent
first), so every prefix is closed.  Both are exact values of closed sets, hence ≤ U*.  The GPU plan
screens its candidates with LB₀ and raises LB inside ``hdecode::jaccard_sets`` the same way, on its
packed candidates (a superset of the CPU plan's, the sizes k̂ − 3..k̂ + 3 clamped to the row's own
count), before the per-size node bounds and the size screen: an LB at least the CPU plan's wherever
both orders take the same first k̂ + 3 candidates, and a bound either way (a tighter LB only removes
nodes and sizes that no optimal set has, §2-3).

5. Knapsack.  The candidates v_0 = root, v_1, ... of a sample in depth-first preorder (children
by increasing id); nxt(i) is the first position after v_i's subtree.  For j = 0..k − 1,

    F(i, j) = max(g(v_i) + F(i + 1, j − 1),  F(nxt(i), j)),   F(C, 0) = 0,  F(C, j > 0) = −∞,
    V(k) = g(root) + F(1, k − 1).

Skipping v_i skips its subtree, so a position is reached only with all its ancestors taken: the
choices are exactly the closed sets of the candidates.  Nodes outside A_k have g = −∞: never
taken, nor anything under them, so each pair keeps only its A_r ≤ C allowed candidates with no
disallowed ancestor, which changes no value of finite F nor any decision on the way to one.  At
position i with j left, i − 1 − (k − 1 − j) of the positions before were skipped, and at most
A_r − k can be: the states are stored either by j (k + 1 of them) or by that count (A_r − k + 1;
taking keeps it, skipping v_i's subtree adds nxt(i) − i), whichever is fewer.  This is
O(A_r·min(k, A_r − k + 1)) per pair (sample, size), where merging children's tables by max-plus
convolution costs O(C·k²); all pairs run at once, one step per position, over the pairs that still
have a candidate there.  A pair with fewer than k allowed candidates has no set of its size: such a
size is never optimal (§2), its value is −∞.

6. Ties.  Between sizes, the smallest size wins among those whose values tie: the smallest size
whose value is within float64 rounding of the best wins (float32 inputs: values within float32
rounding of the best are computed again in float64, their sets' Σ g_k from the float64 masses, and
compared within the rounding of that computation alone; the GPU plan computes every value in float64
and compares them within its rounding alone too, whatever the dtype: the masses' own error is no
rounding between two sizes' values, and counted on float32 node sums, 2·(Σ fan-in + 2)·u₃₂, it would
let a smaller size win by up to 7.5e-6 relative on iNat19; the CPU plan's float64 path counts it,
1.4e-14 relative there, so on float64 rows of a tree with one leaf depth the two plans could split
values that close differently).  Within a size, a node
is taken whenever taking it is at least as good as not: of the sets of maximal value the
knapsack returns the first in preorder, the one holding the first node (depth-first, children by
increasing id) at which two of them differ; ancestors thus come before descendants and siblings
go by smaller id (a node under an earlier sibling wins over a later sibling).  Symmetric ties
are computed bit-identically and follow this rule exactly; values equal in exact arithmetic but
computed differently are decided by their rounded values (all of them optimal up to rounding).

7. Rounding.  Every pruning test carries a slack that may only keep more: an LB is lowered by
its relative rounding bound (E + k + 16)·u and the error of its masses; the node test on p allows
p's own summation error, (Σ over the ancestors of (fan-in − 1))·u relative and 4·L·ε₆₄ absolute
(the GPU plan sums in float64 by prefix sums); the masses Q_e(n) are differences of float64 prefix
sums (``Posterior.depth_prefix``), or p itself with one leaf depth.  A CPU sums them one after another,
so a difference keeps only the roundings inside its own range: a node's E masses err by at most
(|L(n)| + 1)·u₆₄ together; a GPU's scan gives no such cancellation, 2·L·u₆₄ each (:func:`mass_error`);
the size screen allows the rounding of up to C gains of total ≤ (D + 1)/k.  float32 inputs
compute gains, bounds and knapsacks in float32, float64 stays float64; the pruning tests and the
tie decisions are float64.

8. Cost.  O(B·N) for the node screen (plus the Posterior's O(B·(N + L)) node and prefix sums),
O(M·E·K) for the gains of the M (sample, candidate) entries (C per sample; C ≤ 1 + Σ_{d=1..D}
(2d + D + 1)/((d + 1)·LB) as the candidates of one level are disjoint subtrees, LB ≥ 1/(D + 1);
far fewer on model outputs), O(Σ_r A_r·min(k_r, A_r − k_r + 1)) for the knapsacks of the R pairs
(sample, size) left (a few per sample; on deep caterpillars the bounds often allow exactly k_r nodes,
a band of one state).  Python loops: over the candidate positions of the knapsack and of the
walk back (C steps each, all pairs at once; on plain CPU tensors one compiled pass a pair instead,
``kernels/native/jaccard.c``, the same values and sets) and ⌈log₂ D⌉ pointer-doubling steps; none over
samples, nodes or tree levels.  Memory: one (N, B) mask and threshold, (M, K) gains and the
pairs' banded knapsack tables; no N×L and no N×B×K tensor.  The gain tables grow as C² per sample, so trees
with long single-child chains (C ~ D) cost O(B·D²).  On a caterpillar of depth D (a chain, one leaf
hanging at each level: N = 2D + 1, E = D) a sample may keep C ~ N candidates: its masses are O(C·E) =
O(D²) memory, its gains O(C·K·E) = O(D³) time, and each of its R (sample, size) pairs left a banded
knapsack (§5); the pairs are gathered in groups of half the budget and solved in chunks of the
other half; the (entries, sizes, depths) weights of the lower bounds and the run ends of the masses
are built in chunks of at most a quarter of the budget and 32 MiB (a chunk holds at least one pair
or two entries), G(k)'s (K, E) table before the gains, and the gains in fixed blocks of 256 entries
× 256 sizes, so one sample's (C, E) masses and (C, K) gains (with the gains' fixed blocks) are the
floor beyond the budget.  Host reads: four on the GPU plan (the candidates' count and width after
each of the two node screens; the pairs (sample, size) with the knapsack's per-position row
counts; the pairs' allowed counts, once per group of pairs).  The CPU plan, where a read costs
nothing, lists the first screen's pairs with ``nonzero`` (one more read) and, for float32 inputs,
the pairs re-scored in float64 (§6; one more, where the GPU plan re-scores every pair): six.

9. Top-k inputs.  The masses enter only through the per-leaf-depth masses Q_e(n) of the candidates, so a
completed top-k distribution is decoded from the ancestors of its listed leaves and the nodes the
completion alone makes heavy enough for §2's bound, never B × L or B × N (:func:`jaccard_decode_topk`,
exactness argument there; :func:`jaccard_expected_topk` for the value of a set).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..kernels import native
from ..kernels.candidates import pack_rows
from ..kernels.depth_ranges import depth_masses, depth_masses_packed, depth_ranges
from ..kernels.fused import jaccard_sets, trust_indices
from ..kernels.fused._registry import direct
from ..kernels.fused.jaccard_sets import PAD_DEPTH as _PAD_DEPTH
from ..kernels.fused.jaccard_sets import GAIN_CELLS, GAIN_ROWS, gains, knapsack_sets, row_slacks, size_bound
from ..kernels.true_entries import true_pairs
from ..kernels.fused.jaccard_sets import DEPTH_TABLE_CELLS, depth_table, size_tables
from ..core.node_sets import sparse_node_sets
from ..core.plan import resolve_plan
from ..kernels.support import support_best_leaf, support_table
from ..kernels.support_jaccard import completion_prefix, depth_listed, depth_masses_topk, heavy_nodes, heavy_order
from .base import SetMetric

__all__ = ["Jaccard", "jaccard_from_counts", "jaccard_expected", "jaccard_decode", "jaccard_decode_packed",
           "jaccard_trace", "JaccardTrace", "jaccard_decode_topk", "jaccard_expected_topk",
           "jaccard_value_bound", "jaccard_size_bound"]


def jaccard_from_counts(inter, size, ysize):
    """J from |h⁺∩y⁺|, |h⁺| and |y⁺| (float64 tensors)."""
    return inter / (size + ysize - inter)


def jaccard_expected(post, sets: torch.Tensor) -> torch.Tensor:
    """(B,) expected Jaccard index of closed sets (B, N) bool."""
    h = post.h
    counts = post.path_sum(sets.t().to(post.dtype))[: h.num_leaves]  # (L, B)
    k = sets.sum(1).to(post.dtype)
    ysize = (h.leaf_depth.to(post.dtype) + 1)[:, None]
    return (post.probs.t() * counts / (k[None, :] + ysize - counts)).sum(0)


# --------------------------------------------------------------------------- tree-only tables


@dataclass(frozen=True)
class _Tables:
    """Tree-only tables (cached on the hierarchy); row N, where present, is padding.

    pre: (N + 1,) int64 preorder position (children by increasing id), N at padding.
    end: (N + 1,) int64 pre + subtree size, N + 1 at padding.
    order: (N,) int64 the nodes in preorder.
    parent: (N + 1,) int64 parent (the root its own), N at padding.
    tau: (N,) float64 τ(n) (0 at the root); tau_min its smallest value below the root.
    dmin1: (N + 1,) float64 d_min(n) + 1.  depth: (N + 1,) int64 (padding: above every size).
    depths: (E,) float64 leaf depths.  dp_key, dp_node: (N,) int64 the nodes sorted by
    (depth, preorder position), key depth·N + pre.
    sum_fan: Σ (fan-in − 1) over the strict ancestors of a leaf, its largest value, plus one.
    """

    pre: torch.Tensor
    end: torch.Tensor
    order: torch.Tensor
    parent: torch.Tensor
    tau: torch.Tensor
    tau_min: float
    dmin1: torch.Tensor
    depth: torch.Tensor
    depths: torch.Tensor
    dp_key: torch.Tensor
    dp_node: torch.Tensor
    max_depth: int
    sum_fan: int


def _tables(h) -> _Tables:
    """The :class:`_Tables` of ``h`` (built once per hierarchy and device, O(N log N), no loop over levels)."""
    def build():
        n = h.num_nodes
        parent = h.parent.cpu().numpy()
        fan = np.diff(h.children_ptr.cpu().numpy())
        depth = h.depth.cpu().numpy()
        pre, size = h.pos.cpu().numpy(), h.size.cpu().numpy()
        order = np.argsort(pre)
        # Σ (fan-in − 1) over the strict ancestors: how many roundings a leaf's probability goes
        # through on its way into any p(n), whatever the order of the sums.  Each node adds its
        # fan-in − 1 to the preorder positions of its strict descendants, one prefix sum in all.
        diff = np.zeros(n + 1, dtype=np.int64)
        np.add.at(diff, pre + 1, fan - 1)
        np.add.at(diff, pre + size, -(fan - 1))
        extra = np.cumsum(diff)[:n][pre]
        dmin = h.min_leaf_depth.cpu().numpy().astype(np.float64)
        tau = (dmin + 1) / (2 * dmin + h.max_depth + 1)
        tau[h.root] = 0.0
        par = np.where(parent >= 0, parent, h.root)
        key = depth * n + pre
        by_dp = np.argsort(key)
        dev = h.device

        def T(a, dtype):
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype).to(dev)
        return _Tables(
            pre=T(np.r_[pre, n], torch.int64), end=T(np.r_[pre + size, n + 1], torch.int64),
            order=T(order, torch.int64), parent=T(np.r_[par, n], torch.int64),
            tau=T(tau, torch.float64), tau_min=float(np.delete(tau, h.root).min()),
            dmin1=T(np.r_[dmin + 1, 0.0], torch.float64), depth=T(np.r_[depth, _PAD_DEPTH], torch.int64),
            depths=depth_ranges(h).depths.to(torch.float64), dp_key=T(key[by_dp], torch.int64),
            dp_node=T(by_dp, torch.int64), max_depth=int(h.max_depth),
            sum_fan=int(extra[: h.num_leaves].max()) + 1)
    return h.cached("jaccard_tables", build)


def jaccard_value_bound(h) -> torch.Tensor:
    """(N,) float64 τ(n) = (d_min(n)+1) / (2 d_min(n) + D + 1): a non-root node n of an optimal
    Jaccard set S has p(n) ≥ τ(n)·E[J(S)] (module docstring, §2); 0 at the root."""
    return _tables(h).tau


def jaccard_size_bound(h, k: int) -> torch.Tensor:
    """(N,) float64 τ_k(n) = max(k, d_min(n)+1) / (2k + D − 1): a non-root node n of an optimal
    Jaccard set S of size k ≥ 2 has p(n) ≥ τ_k(n)·E[J(S)] (module docstring, §2)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise ValueError(f"Expected `k` to be an int >= 2, but got {k!r}")
    t = _tables(h)
    return torch.clamp(t.dmin1[:-1], min=float(k)) / (2 * int(k) + t.max_depth - 1)


# --------------------------------------------------------------------------- batch pieces
#: Largest temporaries of one chunk of masses or lower-bound weights on the CPU plan: they sit on top
#: of their (rows, E) results, and on a CPU beyond a few MiB a larger chunk buys no speed (the gathers
#: and the batched products are memory-bound); the knapsacks alone take the whole budget.
_CHUNK_MAX = 32 << 20


def _chunk_bytes(post) -> int:
    return _chunk_budget(post.plan)


def _chunk_budget(plan) -> int:
    # A quarter of the budget: a chunk's temporaries sit beside one sample's tables.  On the GPU plan
    # no smaller cap: every chunk is one more round of kernel launches (tieredImageNet-H at B = 40,737
    # took 49 rounds of the masses' gathers under the CPU's cap).
    quarter = plan.budget // 4
    return quarter if plan.gpu else min(quarter, _CHUNK_MAX)


def _depth_prefix(post) -> torch.Tensor:
    """(L + 1, B) float64 :meth:`~hdecode_torch.Posterior.depth_prefix`, on the CPU plan scanned along the
    batch-major probabilities (a transposed view): the same sequential sums, but a CPU's ``cumsum`` down a
    node-major table walks B columns in strides, and the masses then gather each sample's prefix sums from
    one row.  Made a block of rows at a time in place, so that the (B, L + 1) result is the only large
    allocation (whole-batch temporaries beside it were fresh pages at every call, whose faults cost more
    than the sums).  On plain CPU tensors one native pass over each row instead (the same additions)."""
    h, probs = post.h, post.probs
    if post.plan.batch_major or probs.numel() < _PREFIX_BLOCK:  # small batches: fewer operators
        return post.depth_prefix()
    order = depth_ranges(h).leaf_order
    out = native.depth_prefix((probs.detach() if probs.requires_grad else probs).t(), order, batch_major=True)
    if out is not None:
        return out
    bsz = probs.shape[0]
    out = torch.empty(bsz, h.num_leaves + 1, dtype=torch.float64, device=probs.device)
    out[:, 0] = 0
    cpu = probs.device.type == "cpu"
    src, at = (_numpy(probs.detach() if probs.requires_grad else probs), _numpy(order)) if cpu else (probs, order)
    step = max(1, _PREFIX_BLOCK // max(h.num_leaves, 1))
    for a in range(0, bsz, step):
        part, rows = out[a:a + step, 1:], src[a:a + step]
        # NumPy's take along rows is a few times faster than index_select's on a CPU
        part.copy_(torch.from_numpy(np.take(rows, at, axis=1)) if cpu else rows.index_select(1, at))
        part.cumsum_(1)
    return out.t()


#: Entries of the probabilities reordered and summed at a time by :func:`_depth_prefix` (a block of rows
#: that stays in cache between the copy and the sums).
_PREFIX_BLOCK = 1 << 17


#: NumPy views of CPU tensors taken directly, not through the Tensor attribute a host-read counter wraps
#: (a CPU tensor's read costs nothing, and the CPU plan's reads are counted where it lists them).
_numpy = torch.Tensor.numpy


#: One-row calls (B = 1) build the candidate tables, the screen's order, the pairs and the choice of the best
#: pair without the per-sample scatters and reductions a batch needs: the same integers and the same float
#: operations on the same values, in fewer operators (tests turn it off to compare the two bit for bit).
_ONE_ROW = True

#: (B, C) cells of a candidate table from which :class:`_Cands` finds positions by one search of its flat
#: keys rather than a search along each row.
_FLAT_SEARCH = 1 << 12
#: Entries of the (nodes, B) screen of :func:`_screen` made at a time on the CPU plan.
_SCREEN_BLOCK = 1 << 20
#: Bytes of the masses' temporaries at a time (the ends, their positions and the gathered sums): their
#: differences are elementwise, the same values in any chunks, and larger chunks were fresh pages per call.
_MASS_CHUNK = 1 << 22


def mass_error(h, num_e: int, device: torch.device) -> float:
    """A bound on Σ_e |Q̂_e(n) − Q_e(n)|, the absolute error of one node's E masses taken from the float64
    prefix sums P̂ of the leaves in (depth, depth-first) order (module docstring, §7).

    Q̂_e(n) = P̂[hi] − P̂[lo] over the leaves of L(n) at depth d_e.  A CPU sums one after another
    (``cumsum``, the native kernel), P̂[j] = P̂[j − 1] + x_j + δ_j with |δ_j| ≤ u·P̂[j], so the difference
    keeps only the roundings inside its own range: over the E ranges of n, at most
    u·(|L(n)| + 1)·max_j P̂[j] ≤ 4·L·ε₆₄ (with a margin for row sums up to 2).  A GPU's scan adds in a
    tree whose roundings do not cancel in a difference: each prefix may err by L·u·max P̂, so
    4·E·L·ε₆₄ over the E masses.  The tie rule between sizes (§6) counts this bound once for each of a row's
    candidates, so a loose bound there is no safety margin: counted E-fold on a CPU, it let smaller, worse sizes
    win on deep trees with hundreds of leaf depths.
    """
    sequential = device.type == "cpu"
    return 4 * (1 if sequential else num_e) * h.num_leaves * torch.finfo(torch.float64).eps


class _Masses:
    """Per-leaf-depth masses Q_e(n) of any (sample, node) pairs.

    From the Posterior's float64 prefix sums of the leaves in (depth, depth-first) order (any
    Q_e(n) is a difference of two entries), or, with one leaf depth, p(n) itself.  ``rel`` and
    ``abs`` bound their relative and absolute errors (module docstring, §7).
    """

    def __init__(self, post, T, u):
        h = post.h
        self.h, self.budget = h, min(_chunk_bytes(post), _MASS_CHUNK)
        e = T.depths.numel()
        self.abs = mass_error(h, e, post.probs.device)
        if e == 1:
            self.prefix, self.rel, self.p = None, (T.sum_fan + 2) * u, post.node
        else:
            self.prefix, self.rel = _depth_prefix(post), 0.0

    def __call__(self, rows, ids):
        """(M, E) float64 masses of nodes ``ids`` (N: padding, zero) in samples ``rows`` (M,)."""
        if self.prefix is not None:
            return depth_masses(self.h, self.prefix, rows, ids, self.budget)
        n = self.h.num_nodes
        got = self.p[ids.clamp(max=n - 1), rows]  # either layout of the (N, B) table
        return torch.where(ids < n, got, 0).double()[:, None]


class _Cands:
    """Flat per-sample candidate lists: entries sample-major, in preorder within a sample.

    Per entry (M,): sample, node, slot (column), depth, pv (p(n) in float64 from the masses), q
    (M, E) masses.  Per sample (B, C), C the largest count: ``ids`` (N at padding), ``entry``
    (M at padding), ``nxt`` (first column after the entry's subtree; C at padding).
    """

    def __init__(self, T, bsz, sample, node, q64, dt, count, c):
        m = sample.numel()
        dev = sample.device
        self.c = c
        n = T.pre.numel() - 1
        if bsz == 1 and _ONE_ROW:
            # One row: its entries are its slots (c = m, no padding), so the tables are views of the
            # entries: the same integers as the scatters below, in 4 operators fewer than 11.
            slot = torch.arange(m, device=dev)
            start = slot[:1] - slot[:1]  # (1,) zero
            ids, entry = node.view(1, m), slot.view(1, m)
        else:
            start = torch.cumsum(count, 0) - count
            slot = torch.arange(m, device=dev) - start[sample]
            ids = torch.full((bsz, c), n, dtype=torch.long, device=dev)
            ids[sample, slot] = node
            entry = torch.full((bsz, c), m, dtype=torch.long, device=dev)
            entry[sample, slot] = torch.arange(m, device=dev)
        self.sample, self.node, self.slot, self.count, self.start = sample, node, slot, count, start
        self.depth = T.depth[node]
        self.q64, self.q = q64, q64.to(dt)
        self.pv = q64.sum(1)
        self.ids, self.entry = ids, entry
        self.T, self._nxt = T, None
        # The entries' keys sample·N + preorder position ascend (sample-major, preorder within a
        # sample), so on large batches a position within a sample's row is one search of the flat (M,)
        # keys less the row's start, the same integers as a search along each (B, C) row of preorder
        # positions (a batched search, several times slower there); small ones keep the row search,
        # fewer operators.
        if bsz * c >= _FLAT_SEARCH:
            self.key, self.pre = sample * n + T.pre[node], None
        else:
            self.key, self.pre = None, T.pre[ids]

    def _row_position(self, pre):
        """(M,) the number of entries of each entry's sample whose preorder position is below ``pre`` (M,)."""
        return torch.searchsorted(self.key, self.sample * (self.T.pre.numel() - 1) + pre) - self.start[self.sample]

    @property
    def nxt(self):
        """(B, C) int64 the column after each entry's subtree (C at padding), made when first read."""
        if self._nxt is None:
            if self.key is None:  # padding: T.end[N] = N + 1, above every position, so C
                self._nxt = torch.searchsorted(self.pre, self.T.end[self.ids])
            else:
                bsz = self.count.numel()
                nxt = torch.full((bsz, self.c), self.c, dtype=torch.long, device=self.sample.device)
                nxt[self.sample, self.slot] = self._row_position(self.T.end[self.node])
                self._nxt = nxt
        return self._nxt

    def parent_entry(self, T):
        """(M,) the entry of each entry's parent (the root entry: itself)."""
        if self.key is None:
            ppos = torch.searchsorted(self.pre, T.pre[T.parent[self.ids]])
            if self.count.numel() == 1 and _ONE_ROW:  # one row: its start is 0 and its slots are its entries
                return ppos[0]
            return self.start[self.sample] + ppos[self.sample, self.slot]
        return self.per_entry(self.start) + self._row_position(T.pre[T.parent[self.node]])

    def subset(self, T, keep, dt):
        """The entries where ``keep`` (M,) holds (one host read: their number and the width)."""
        bsz = self.count.numel()
        if bsz == 1 and _ONE_ROW:  # one row: its count is the number kept
            count = keep.sum().view(1)
        else:
            count = torch.zeros(bsz, dtype=torch.long, device=keep.device).index_add_(0, self.sample, keep.long())
        if count.device.type == "cpu":  # a NumPy view: no operators for the read
            got = _numpy(count)
            total, c = int(got.sum()), int(got.max())
        else:
            total, c = torch.stack([count.sum(), count.max()]).tolist()
        idx = torch.nonzero_static(keep, size=total)[:, 0]
        return _Cands(T, bsz, self.sample[idx], self.node[idx], self.q64[idx], dt, count, c)

    def per_entry(self, x):
        """(M, ...) a per-sample table ``x`` (B, ...) read at each entry's sample (one row: a broadcast view of
        its only row, the same values without a gather)."""
        if self.count.numel() == 1 and _ONE_ROW:
            return x.expand(self.sample.numel(), *x.shape[1:])
        return x[self.sample]

    def to_table(self, values, fill):
        """(B, C) table of per-entry ``values`` (M,), ``fill`` at padding (one row: a view of ``values``)."""
        if self.count.numel() == 1 and _ONE_ROW:  # no padding: entry is 0..M − 1
            return values.view(1, -1)
        return torch.cat([values, values.new_full((1,), fill)])[self.entry]


#: Entries from which :func:`_argmax_rows` takes NumPy's (below it ``argmax``'s smaller fixed cost wins).
_NUMPY_ARGMAX = 1 << 14


def _argmax_rows(probs) -> torch.Tensor:
    """(B,) int64 the first column of each row's largest value: NumPy's on plain CPU tensors (several
    times faster than ``argmax`` along the rows of a (B, L) table there; nothing tracing or counting
    operators), the same index."""
    if probs.numel() < _NUMPY_ARGMAX or not direct(probs):
        return probs.argmax(1)
    return torch.from_numpy(np.argmax(_numpy(probs.detach()), axis=1).astype(np.int64, copy=False))


def _dmin1_index(h, T) -> torch.Tensor:
    """(N + 1,) int64 d_min(n) + 1, the row of a node in the size screen's τ_k table (cached)."""
    return h.cached("jaccard_dmin1_index", lambda: T.dmin1.long())


def _tau_as(h, T, dt) -> torch.Tensor:
    """(N,) τ(n) in ``dt`` (cached: a tree-only table, converted once rather than per call)."""
    return h.cached(("jaccard_tau", dt), lambda: T.tau.to(dt))


def _screen(h, T, p, thr, batch_major):
    """The (sample, node) pairs with p(n) ≥ τ(n)·thr[b] or n the root, sample-major, in preorder
    within a sample, and the per-sample counts and their maximum.  p: (N, B); thr: (B,) float64.

    GPU plan: one host read (the pair count and the largest count), then a listing of that size.
    CPU plan: ``nonzero`` and the largest count (two reads, free on a CPU), as a reduction over
    the nodes of a node-major mask is several times slower than listing it.
    """
    dt = p.dtype
    tau = _tau_as(h, T, dt)
    if batch_major:  # p is a view of a (B, N) table: screen and list in that layout
        keep = p.t() >= thr.to(dt)[:, None] * tau[None, :]
        keep[:, h.root] = True
        count = keep.sum(1)
        total, c = torch.stack([count.sum(), count.max()]).tolist()
        sample, node = torch.nonzero_static(keep, size=total).unbind(1)
    else:
        # A block of nodes at a time on large batches: the (nodes, B) product and mask stay small enough
        # for reused heap memory (whole, they were fresh pages at every call); listed node-major as one
        # ``nonzero`` would.
        thr_dt = thr.to(dt)[None, :]
        step = max(1, _SCREEN_BLOCK // max(p.shape[1], 1))
        if step >= p.shape[0]:
            keep = p >= tau[:, None] * thr_dt
            keep[h.root] = True
            node, sample = true_pairs(keep)
        else:
            nodes, samples = [], []
            for a in range(0, p.shape[0], step):
                keep = p[a:a + step] >= tau[a:a + step, None] * thr_dt
                if a <= h.root < a + step:
                    keep[h.root - a] = True
                at, s = true_pairs(keep)
                nodes.append(at.add_(a))
                samples.append(s)
            node, sample = torch.cat(nodes), torch.cat(samples)
        if p.shape[1] == 1 and _ONE_ROW:  # one row: its count is its number of pairs, its keys their positions
            c = node.numel()
            node = node.index_select(0, torch.sort(T.pre.index_select(0, node)).indices)
            return sample, node, sample.new_full((1,), c), c
        count = torch.bincount(sample, minlength=p.shape[1])
        c = int(count.max())
    # Sample-major, then preorder: the keys are distinct.
    order = torch.sort(sample * h.num_nodes + T.pre[node]).indices
    return sample[order], node[order], count, c


def _gains_at(T, q, depth, ks, kmax, budget=1 << 29):
    """(M, J) g_k(n) at per-entry sizes ks (M, J) int64 in 1..kmax; -inf where k ≤ d(n).

    The weights w[d, k, e] come from a (D' + 1, K, E) table of every (depth, size) when it is no larger
    than the weights of the (entry, size) pairs or small enough to be cached with the tree's leaf depths
    (2^16 cells: one row's call then reads it rather than making its pairs' weights), from those pairs
    otherwise (deep trees, where the table would not fit): O(min(D'·K, M·J)·E) memory, the same float64
    values either way.  The
    (entries, J, E) weights of the products are made for as many entries at a time as ``budget``
    bytes hold (at least two: a batch of one is a different product, rounded differently).
    """
    dt, dev = q.dtype, q.device
    dcap = min(T.max_depth, kmax)
    rows, j, e = q.shape[0], ks.shape[1], q.shape[1]
    table = None
    if (dcap + 1) * kmax <= ks.numel() or (dcap + 1) * kmax * e <= DEPTH_TABLE_CELLS:
        def build():
            dd = torch.arange(dcap + 1, device=dev, dtype=torch.float64)[:, None, None]
            m = torch.arange(1, kmax + 1, device=dev, dtype=torch.float64)[None, :, None] - dd  # (D'+1, K, 1)
            x = m + T.depths
            return torch.where(m >= 1, (x + 1 + dd) / (x * (x + 1)), 0).to(dt).view(-1, e)  # w[d, k − 1, e]
        table = depth_table("gains_at", T.depths, (dcap, kmax, dt), build)  # tree- and width-only: cached
    # Two (rows, J, E) float64 buffers, made once and refilled for every chunk: fresh temporaries
    # per chunk leave the allocator's heap fragmented (a 4,001-node caterpillar at a 64 MiB budget: +216 MiB).
    step = max(2, budget // (16 * max(j * e, 1)))
    bounds = list(range(0, max(rows, 1), step)) + [rows]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]  # no last chunk of one row
    g = torch.empty(rows, j, dtype=dt, device=dev)
    most = max(b - a for a, b in zip(bounds[:-1], bounds[1:])) * j * e
    bufs = None if table is not None else (torch.empty(most, dtype=torch.float64, device=dev),
                                           torch.empty(most, dtype=torch.float64, device=dev))
    for a, b in zip(bounds[:-1], bounds[1:]):
        dep, kk = depth[a:b], ks[a:b]
        if table is not None:
            at = (dep.clamp(max=dcap)[:, None] * kmax + kk - 1).view(-1)
            w = table.index_select(0, at).view(kk.shape + (e,))
        else:
            shape = kk.shape + (e,)
            dd = dep.clamp(max=kmax).to(torch.float64)[:, None, None]  # (M, 1, 1)
            m = kk.to(torch.float64)[:, :, None] - dd  # (M, J, 1)
            x = torch.add(m, T.depths, out=bufs[0][: shape.numel()].view(shape))
            # (x + 1 + dd) / (x (x + 1)), the same roundings in the same order as out of place.
            w = torch.add(x, 1, out=bufs[1][: shape.numel()].view(shape))
            x.mul_(w)
            w.add_(dd).div_(x).masked_fill_(m < 1, 0)
            w = w.to(dt)  # (M, J, E)
        torch.bmm(w, q[a:b, :, None], out=g[a:b, :, None])
    return g.masked_fill_(ks <= depth[:, None], float("-inf"))


#: Trees up to this depth + 1 score the root paths at every size (a (B, D+1, D+1) table).
_FULL_CHAIN = 32


def _root_paths(h, T, leaf):
    """(B, D + 1) int64 the ancestor of each leaf (B,) at every depth, N below the leaf.

    The ancestor at depth t is the last node of depth t at or before the leaf in preorder (the
    subtrees of one level are disjoint preorder ranges): one sorted search, no walk up the tree.
    """
    dp1 = T.max_depth + 1
    levels = torch.arange(dp1, device=leaf.device)
    idx = torch.searchsorted(T.dp_key, levels[None, :] * h.num_nodes + T.pre[leaf][:, None], right=True) - 1
    anc = T.dp_node[idx.clamp(min=0)]
    return torch.where(levels[None, :] <= T.depth[leaf][:, None], anc, h.num_nodes)


def _chain_lower_bound(h, T, masses, top_leaf, k_ref, dt, budget):
    """(B,) the best E[J(A(a))] over the nodes a on the root path of the most probable leaf y.

    Every size d(a) + 1 when D < 32 (O(B·D²) gains from one GEMM); on deeper trees only
    d(a) + 1 ∈ k_ref − 3..k_ref + 3 and d(y) + 1 (O(B·D·E)).
    """
    bsz, dev = k_ref.shape[0], k_ref.device
    dp1 = T.max_depth + 1
    chain = _root_paths(h, T, top_leaf)  # (B, D + 1)
    flat = chain.reshape(-1)
    rows = torch.arange(bsz, device=dev)[:, None].expand(bsz, dp1).reshape(-1)
    q = masses(rows, flat).to(dt)
    if dp1 <= _FULL_CHAIN:
        g = gains(q, T.depth[flat], T.depths, dp1).view(bsz, dp1, dp1)  # [b, node at depth i, size k]
        ks = torch.arange(1, dp1 + 1, device=dev).expand(bsz, dp1)
    else:
        leaf_size = T.depth[top_leaf] + 1
        ks = torch.cat([k_ref[:, None] + torch.arange(-3, 4, device=dev), leaf_size[:, None]], 1)
        ks = ks.clamp(min=1, max=dp1)  # (B, W)
        g = _gains_at(T, q, T.depth[flat], ks.repeat_interleave(dp1, 0), dp1, budget).view(bsz, dp1, -1)
    # A(a) with d(a) = k − 1 is the first k chain nodes; a size past the leaf's depth is -inf.
    g = g.masked_fill(torch.arange(dp1, device=dev)[None, :, None] >= ks[:, None, :], 0)
    return g.sum(1).nan_to_num(nan=float("-inf")).max(1).values


def _prefix_lower_bound(T, cands, g, ks, col):
    """(B,) the best value of the closed prefix sets of one ancestors-first order.

    g: (M, J) gains at the sizes ks (B, J); the order is by the smallest gain of column ``col``
    along each root path (never above an ancestor's), ties in preorder.
    """
    bsz, j = ks.shape
    key = g[:, col]
    # The smallest key along each root path by pointer doubling: after s steps an entry has seen
    # its 2^s − 1 nearest ancestors; candidates lie at most min(D, C − 1) levels deep.
    jump = cands.parent_entry(T)
    for _ in range(min(T.max_depth, cands.c - 1).bit_length()):
        key = torch.minimum(key, key[jump])
        jump = jump[jump]
    order = torch.sort(cands.to_table(key, float("-inf")), dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(cands.c, device=g.device).expand(bsz, -1))
    at_rank = rank[0] if cands.count.numel() == 1 and _ONE_ROW else rank[cands.sample, cands.slot]
    inside = at_rank[:, None] < cands.per_entry(ks)
    vals = torch.zeros(bsz, j, dtype=g.dtype, device=g.device).index_add_(0, cands.sample, g.masked_fill(~inside, 0))
    vals = vals.masked_fill(ks > cands.count[:, None], float("-inf")).nan_to_num(nan=float("-inf"))
    return vals.max(1).values


def _values64(T, cands, b, k, members):
    """(R,) float64 Σ_{n ∈ S} g_k(n) of the sets ``members`` (R, C) of sizes k (R,) of samples b."""
    ent = cands.entry[b]  # (R, C), M at padding
    q = torch.cat([cands.q64, cands.q64.new_zeros(1, cands.q64.shape[1])])[ent]  # (R, C, E)
    d = torch.cat([cands.depth, cands.depth.new_zeros(1)])[ent].double()[:, :, None]
    x = (k.double()[:, None, None] - d) + T.depths  # m + d_e, ≥ 1 for members
    g = (q * (x + 1 + d) / (x * (x + 1))).sum(2)
    return g.masked_fill(~members, 0).sum(1)


@dataclass(frozen=True)
class JaccardTrace:
    """Intermediate results of one :func:`jaccard_trace` call (for tests and diagnostics).

    lb0, lb: (B,) float64 safe lower bounds on the optimum (root path; closed prefixes).
    wide, candidates: (B, N) bool the nodes kept by p(n) ≥ τ(n)·lb0 and p(n) ≥ τ(n)·lb.
    allowed: (B, N, K) bool the nodes kept for each size k = 1..K.
    pairs: (R, 2) int64 (sample, k) solved by the knapsack; values: (R,) their best values.
    upper: (B, K) the bounds on V(k); sets: (B, N) bool the decoded sets.
    """

    lb0: torch.Tensor
    lb: torch.Tensor
    wide: torch.Tensor
    candidates: torch.Tensor
    allowed: torch.Tensor
    pairs: torch.Tensor
    values: torch.Tensor
    upper: torch.Tensor
    sets: torch.Tensor


def jaccard_decode(post) -> torch.Tensor:
    """Bayes-optimal ancestor-closed sets for the expected Jaccard index of a
    :class:`~hdecode_torch.Posterior`'s batch.

    Returns (B, N) bool, ancestor-closed, root included.  Ties: the smallest set size, then the
    first optimal set in depth-first preorder (module docstring, §6).  Work O(B·N + M·E·K + R·C·k)
    for M candidate entries of at most C per sample, sizes K ≤ C and R pairs (sample, size) left by
    the bounds; four host reads on the GPU plan, up to six on the CPU plan (module docstring, §8).
    """
    return _solve(post, trace=False)


def jaccard_trace(post) -> JaccardTrace:
    """:func:`jaccard_decode` with its intermediate results (a :class:`JaccardTrace`), for a
    non-empty batch."""
    if post.batch_size == 0:
        raise ValueError("Expected a non-empty batch for jaccard_trace, but got 0 samples")
    return _solve(post, trace=True)


def _solve(post, trace):
    h, p = post.h, post.node
    n, bsz = p.shape
    dev, dt = p.device, p.dtype
    if bsz == 0:
        return torch.zeros(0, n, dtype=torch.bool, device=dev)
    T = _tables(h)
    batch_major = post.plan.batch_major
    big_d, num_e = T.max_depth, T.depths.numel()
    u = torch.finfo(dt).eps / 2
    u64 = torch.finfo(torch.float64).eps / 2
    masses = _Masses(post, T, u)

    def safe(value, k):
        """A value certainly at most the exact one of the set whose computed value is ``value``."""
        return value.double() * (1 - (num_e + k + 16) * u - masses.rel) - 2 * k * masses.abs

    def at_least(pv, threshold):
        """pv ≥ threshold, allowing for the error of the masses pv = Σ_e Q_e(n)."""
        return pv >= threshold * (1 - masses.rel) - masses.abs

    # (i) LB₀ from a root path; (ii) every node that may be in an optimal set.
    k_ref = (post.expected_leaf_depth() + 1).round().long()  # a typical label set size
    top_leaf = _argmax_rows(post.probs)
    lb0 = safe(_chain_lower_bound(h, T, masses, top_leaf, k_ref, dt, _chunk_bytes(post)), big_d + 1)
    # A row without mass (not a distribution) scores 0 with every set: keep only its root.
    lb0 = torch.where(p[h.root] > 0, lb0, float("inf"))
    # p's own summation error, (Σ (fan-in − 1) over the ancestors)·u relative (three more
    # roundings for the product) and 4·L·ε₆₄ absolute, folded into the threshold through τ ≥ τ_min.
    thr = lb0 * (1 - (T.sum_fan + 8) * u) - 4 * h.num_leaves * 2 * u64 / T.tau_min
    sample, node, count, c = _screen(h, T, p, thr, batch_major)
    wide = _Cands(T, bsz, sample, node, masses(sample, node), dt, count, c)
    # (iii) LB from the closed prefixes of the wide candidates, at sizes around E[d(y)] + 1.
    ks = (k_ref[:, None] + torch.arange(-3, 4, device=dev)).clamp(min=1, max=wide.c)
    g = _gains_at(T, wide.q, wide.depth, wide.per_entry(ks), wide.c, _chunk_bytes(post))
    lb = torch.maximum(lb0, safe(_prefix_lower_bound(T, wide, g, ks, 3), wide.c))
    # (iv) the candidates, their gains and the allowed nodes of each size.
    cands = wide.subset(T, at_least(wide.pv, T.tau[wide.node] * wide.per_entry(lb)) | (wide.slot == 0), dt)
    if not trace:  # one sample's (C, E) masses: only the candidates' are needed from here
        wide = None
    kmax, m = cands.c, cands.sample.numel()
    # G(k) from the root's masses, before the (M, K) gains exist: its (K, E) table is as large.
    cover = size_bound(cands.q64[cands.start], T.depths, kmax)
    # The (M, K) gains with a padding entry M, the only (M, K) table: everything else about the
    # entries is made a block at a time (elementwise, or sums in entry order: the same values).
    gpad = gains(cands.q, cands.depth, T.depths, kmax, out=torch.empty(m + 1, kmax, dtype=dt, device=dev))
    gpad[m] = float("-inf")
    g = gpad[:m]
    # τ_k(n) = max(k, d_min(n) + 1)/(2k + D − 1), read from the cached (D + 2, K) table of every d_min(n) + 1
    # (the same quotients of the same integers as made per entry).
    kf, tau_tab, span = size_tables(kmax, big_d, dev)
    tau_tab = tau_tab.view(-1, kmax)
    scale = lb * (1 - masses.rel)
    level = _dmin1_index(h, T).index_select(0, cands.node)
    allowed_all = torch.empty(m, kmax, dtype=torch.bool, device=dev) if trace else None
    blk = max(GAIN_ROWS, GAIN_CELLS // kmax)
    scale_e = cands.per_entry(scale)
    for a in range(0, m, blk):
        pv, sc, slot, lev, ga = (cands.pv, scale_e, cands.slot, level, g) if m <= blk else (
            t[a:a + blk] for t in (cands.pv, scale_e, cands.slot, level, g))  # one block: no views
        allowed = (pv + masses.abs)[:, None] >= tau_tab[lev] * sc[:, None]
        allowed |= (slot == 0)[:, None]
        ga.masked_fill_(~allowed, float("-inf"))
        if trace:
            allowed_all[a:a + blk] = allowed
    # (v) the sizes that pass G(k) and the Lagrangian top-k bound, λ_k the gain at k of the
    # candidate ranked k-th by its gain at the typical size k̂.
    col = cands.per_entry(k_ref.clamp(min=1, max=kmax) - 1)
    order = torch.sort(cands.to_table(g.gather(1, col[:, None])[:, 0], float("-inf")), dim=1, descending=True).indices
    kth = cands.entry.gather(1, order)  # (B, C = K) the entry ranked k-th
    lam = gpad.view(-1)[kth * kmax + span].clamp(min=0).nan_to_num(nan=0.0)
    ub = torch.zeros(bsz, kmax, dtype=dt, device=dev)
    lam_e = cands.per_entry(lam)
    for a in range(0, m, blk):
        smp, ga, la = (cands.sample, g, lam_e) if m <= blk else (
            cands.sample[a:a + blk], g[a:a + blk], lam_e[a:a + blk])
        ub.index_add_(0, smp, (ga - la).clamp_(min=0))
    ub += lam * kf.to(dt)
    ub = torch.minimum(ub, cover.to(dt))
    if dt == torch.float64:  # the (M, E) masses are read again only to re-score float32 values
        cands.q64 = cands.q = None
    # A size is kept unless its bound is below LB beyond rounding.  The Lagrangian sum adds up to
    # C rounded gains of every allowed node, and Σ_n g_k(n) = (E[d(y)] + 1)/k ≤ (D + 1)/k over the
    # whole tree: that bounds its absolute error.  Each sample's own slacks, from its own count
    # (row_slacks), so that neither the screen nor the tie rule below reads another sample.
    slack_v, slack_abs = row_slacks(cands.count, num_e, u, masses.rel, masses.abs)  # (B,) each
    spread = slack_v[:, None] * (big_d + 1) / kf + slack_abs[:, None]  # (B, K)
    want = ub.double() * (1 + slack_v)[:, None] + spread >= lb[:, None]
    # The pairs, samples with more candidates first: at knapsack position i only the pairs of
    # samples with more than i candidates work, a prefix.  One host read: the pair count and,
    # for each i, the size of that prefix.
    if bsz == 1 and _ONE_ROW:  # one row: its pairs are its sizes kept, in increasing order as listed below
        kidx = want[0].nonzero()[:, 0]
        b = torch.zeros_like(kidx)
    else:
        by_count = torch.sort(cands.count, descending=True, stable=True).indices
        per = torch.zeros(kmax + 1, dtype=torch.long, device=dev).index_add_(0, cands.count, want.sum(1))
        sizes = torch.cat([per.flip(0).cumsum(0).flip(0), per.new_zeros(1)]).tolist()  # [i]: count ≥ i
        b, kidx = torch.nonzero_static(want[by_count], size=sizes[0]).unbind(1)
        b = by_count[b]
    # (vi) the knapsack of every pair and its set.
    val, members = knapsack_sets(gpad, cands.entry, cands.nxt, b, kidx, post.plan.budget)  # (R,), (R, C)
    # (vii) the best pair of each sample.  Its value in the compute dtype decides, except between
    # sizes within rounding of each other: those pairs are compared on the float64 values of their
    # sets (from the float64 masses), so that only float64 rounding can split a tie between sizes,
    # and the smallest of the tied sizes wins.
    # One row with pairs: its per-sample reductions are reductions over all pairs (the initial values below
    # bound every pair's: the same results) and its (1,) per-sample values broadcast over the pairs (the same
    # operations on the same operands as read at each pair).
    one = bsz == 1 and _ONE_ROW and b.numel() > 0

    def reduce(init, values, how):
        """(B,) per-sample amax / amin of the pairs' ``values`` (R,), ``init`` where a sample has none."""
        if one:
            return (values.max() if how == "amax" else values.min()).view(1)
        return torch.full((bsz,), init, dtype=values.dtype, device=dev).scatter_reduce(0, b, values, how)

    def at(x):
        """A per-sample (B,) table read at each pair (one row: broadcast)."""
        return x if one else x[b]
    best = reduce(float("-inf"), val, "amax")
    near = val.double() >= at(best.double() * (1 - slack_v) - slack_abs)
    if dt == torch.float64:  # the values are float64 already
        eligible = near
    else:
        if one:
            contested = near & (near.sum() >= 2)
        else:
            contested = near & (torch.zeros(bsz, dtype=torch.long, device=dev).index_add_(0, b, near.long()) >= 2)[b]
        ci = None if post.plan.gpu else contested.nonzero()[:, 0]  # a host read costs nothing on a CPU
        if ci is not None and not ci.numel():  # no pair contested (often so for one row): eligible = near
            eligible = near
        else:
            if ci is None:  # every pair re-scored: no host read
                val64 = _values64(T, cands, b, kidx + 1, members).masked_fill(~contested, float("-inf"))
            else:  # the few contested pairs, listed
                val64 = torch.full((b.numel(),), float("-inf"), dtype=torch.float64, device=dev)
                val64[ci] = _values64(T, cands, b[ci], kidx[ci] + 1, members[ci])
            best64 = reduce(float("-inf"), val64, "amax")
            rel64, abs64 = row_slacks(cands.count, num_e, u64, 0.0, masses.abs)
            tol64 = rel64 * best64.abs() + abs64
            eligible = torch.where(contested, val64 >= at(best64) - at(tol64), near)
    kbest = reduce(kmax, torch.where(eligible, kidx, kmax), "amin")
    first = eligible & (kidx == at(kbest))
    pick = reduce(b.numel(), torch.where(first, torch.arange(b.numel(), device=dev), b.numel()), "amin")
    members = torch.cat([members, members.new_zeros(1, kmax)])  # row R: no pair (a row without mass)
    chosen = torch.where(members[pick], cands.ids, torch.full_like(cands.ids, n))
    out = torch.zeros(bsz, n + 1, dtype=torch.bool, device=dev)
    out.scatter_(1, chosen, True)
    out[:, h.root] = True
    out = out[:, :n]
    if not trace:
        return out

    def mask(c, values):
        m = torch.zeros(bsz, n + 1, *values.shape[1:], dtype=values.dtype, device=dev)
        m[c.sample, c.node] = values
        return m[:, :n]
    return JaccardTrace(lb0=lb0, lb=lb, wide=mask(wide, torch.ones_like(wide.sample, dtype=torch.bool)),
                        candidates=mask(cands, torch.ones_like(cands.sample, dtype=torch.bool)),
                        allowed=mask(cands, allowed_all), pairs=torch.stack([b, kidx + 1], 1), values=val,
                        upper=ub, sets=out)


# --------------------------------------------------------------------------- the GPU plan: packed, fixed cost
#: Trees whose (D + 1)² · E chain-gain table has at most this many entries score every root-path
#: prefix of the most probable leaf for the first lower bound; deeper ones use {root}.
_CHAIN_TABLE_MAX = 1 << 22


def _chain_weights(h, T):
    """(D + 1, E, D + 1) float64 W[i, e, k − 1]: the gain of the chain node at depth i per unit of its
    depth-e mass in a set of size k, 0 where i ≥ k (cached): E[J(A(a))] = Σ_{i,e} Q_e(a_i) W[i, e, k − 1]
    with k = d(a) + 1."""
    def build():
        dp1 = T.max_depth + 1
        i = torch.arange(dp1, device=T.depths.device, dtype=torch.float64)[:, None, None]
        k = torch.arange(1, dp1 + 1, device=T.depths.device, dtype=torch.float64)[None, None, :]
        x = (k - i) + T.depths[None, :, None]  # m + d_e, m = k − i
        w = 1 / x + i / (x * (x + 1))
        return torch.where(k > i, w, 0.0)
    return h.cached("jaccard_chain_weights", build)


def jaccard_decode_packed(post) -> torch.Tensor:
    """Bayes-optimal Jaccard sets with a fixed number of operators and three host reads (the GPU
    plan's decoder; same sets as :func:`jaccard_decode` up to float32 rounding, ties as §6).

    The steps of the module docstring on packed per-sample tables: (i) LB₀ from every root-path
    prefix of the most probable leaf (one product with a tree-only table; {root} on trees too deep
    for it), no host read; (ii) the candidates p(n) ≥ τ(n)·LB₀, packed in preorder by one top-C
    selection (the first host read: C, with the input check's flags); (iii) their masses from the
    depth-first prefix sums; (iv)–(vii) in the op: LB raised to the best closed prefix of the candidates
(as the CPU plan's step (iii)), per-size node bounds, gains, the size screen, the knapsack of
    the (sample, size) pairs left (the second host read: their number; the third: their allowed
    candidates' counts, one more per group of pairs beyond the first) and the choice of the best
    size, all in float64.  Returns (B, N) bool.  The gains go in blocks of about 2^18
    (sample, candidate, size) cells and 256 sizes, the node bounds of 2^20 cells: a fixed count while
    one block holds them (B·C² ≤ 2^18, C ≤ 256), more operators beyond.
    """
    h, p = post.h, post.node
    n, bsz = p.shape
    dev = p.device
    if bsz == 0:
        return torch.zeros(0, n, dtype=torch.bool, device=dev)
    T = _tables(h)
    u64 = torch.finfo(torch.float64).eps / 2
    num_e = T.depths.numel()
    mass_abs = mass_error(h, num_e, dev)
    u = torch.finfo(p.dtype).eps / 2
    mass_rel = 0.0 if num_e > 1 else (T.sum_fan + 2) * u  # one leaf depth: the masses are p, summed in p's dtype
    # Masses from the float64 depth-first prefix sums, or with one leaf depth p(n) itself (as on the CPU
    # plan: a node with one leaf holds its value exactly, so symmetric nodes get equal masses).
    if num_e > 1:
        prefix = post.depth_prefix().t()  # (B, L + 1) float64
        masses = lambda ids: _masses_packed(h, prefix, ids, _chunk_bytes(post))  # noqa: E731
    else:
        # Gathered from the batch-major (B, N) node sums, no padded copy of them (the packed candidates are
        # nodes, the root paths' past their leaf masked below); only the gathered entries made float64 (exact).
        p_rows = p.t()
        masses = lambda ids: p_rows.gather(1, ids).double()[:, :, None]  # noqa: E731
    # (i) LB₀, a value certainly at most that of an achieved set: the root-path prefixes A(a) of the
    # most probable leaf, every size on shallow trees, the sizes around E[d(y)] + 1 and the leaf's own
    # on deep ones; {root} where even the ancestors-by-depth table is too large.
    k_ref = (post.expected_leaf_depth() + 1).round().long()
    k = T.max_depth + 1
    if not h.ancestor_table_fits:
        values, k = post.probs.double() @ (1 / (h.leaf_depth.double() + 1)), 1  # E[J({root})]
    else:
        top = _argmax_rows(post.probs)
        if num_e > 1:
            chain = _root_paths(h, T, top)  # (B, D + 1), N past the leaf; no (N, D + 1) table
            q = masses(chain)  # (B, D + 1, E)
        else:  # p(n) at the ancestors, 0 past the leaf
            chain, inside = _root_paths_within(h, T, top)
            q = torch.where(inside, p_rows.gather(1, chain), 0).double()[:, :, None]
        if k ** 2 * num_e <= _CHAIN_TABLE_MAX:
            # Past the leaf the masses are 0 and the other gains only fall with k: never the maximum.
            values = torch.tensordot(q, _chain_weights(h, T), dims=([1, 2], [0, 1])).amax(1)
        else:
            ks = torch.cat([k_ref[:, None] + torch.arange(-3, 4, device=dev), (T.depth[top] + 1)[:, None]], 1)
            ks = ks.clamp(min=1, max=k)  # (B, W)
            if num_e == 1:  # padding N past the leaf, as _root_paths gives: no gain there
                chain = torch.where(inside, chain, h.num_nodes)
            g = _gains_at(T, q.view(-1, num_e), T.depth[chain.view(-1)], ks.repeat_interleave(k, 0), k,
                          _chunk_bytes(post))
            inside = torch.arange(k, device=dev)[None, :, None] < ks[:, None, :]  # A(a) is the first k chain nodes
            values = g.view(bsz, k, -1).masked_fill(~inside, 0).sum(1).nan_to_num(nan=float("-inf")).amax(1)
            del g
        del q, chain  # the (B, D + 1, E) root-path masses: not needed beside the candidates' own
    lb0 = values * (1 - (num_e + k + 16) * u64 - mass_rel) - 2 * k * mass_abs
    # A row without mass scores 0 with every set: 2 (above any value) keeps only its root.
    lb0 = torch.where(p[h.root] > 0, lb0, 2.0)
    # (ii) p's own summation error, as in the CPU path, folded into the threshold.
    thr = lb0 * (1 - (T.sum_fan + 8) * u) - 4 * h.num_leaves * 2 * u64 / T.tau_min
    keep = p.t() >= torch.outer(thr.to(p.dtype), _tau_as(h, T, p.dtype))  # (B, N); τ(root) = 0: always kept
    # counted in int32 (exact below 2^31 nodes): a bool sum to int64 converts the whole (B, N) mask first
    count = keep.sum(1, dtype=torch.int32).long()
    (width,) = post.read(count.max())
    ids = pack_rows(keep, _preorder_rank(h, T), width, pad=h.root)  # (B, C), root first, preorder; padding ignored
    trust_indices(count, width)
    members = jaccard_sets(masses(ids), ids, count, lb0, k_ref, T.pre, T.end, T.depth, T.dmin1,
                           T.depths, T.max_depth, mass_rel, mass_abs, post.plan.budget)
    chosen = torch.where(members, ids, n)
    out = torch.zeros(bsz, n + 1, dtype=torch.bool, device=dev)
    out.scatter_(1, chosen, True)
    out[:, h.root] = True
    return out[:, :n]


def _root_paths_within(h, T, leaf):
    """``(anc, inside)``, (B, D + 1) each: :func:`_root_paths` as the ancestors of each leaf (B,) at every
    depth (past the leaf: any node) and whether the depth is within the leaf's."""
    levels = torch.arange(T.max_depth + 1, device=leaf.device)
    idx = torch.searchsorted(T.dp_key, levels[None, :] * h.num_nodes + T.pre[leaf][:, None], right=True) - 1
    return T.dp_node[idx.clamp(min=0)], levels[None, :] <= T.depth[leaf][:, None]


def _preorder_rank(h, T) -> torch.Tensor:
    """(N,) int32 N − 1 − preorder position: packs candidates in preorder (cached)."""
    return h.cached("jaccard_preorder_rank", lambda: (h.num_nodes - 1 - T.pre[:-1]).to(torch.int32))


def _masses_packed(h, prefix: torch.Tensor, ids: torch.Tensor, budget: int) -> torch.Tensor:
    """(B, C, E) float64 per-leaf-depth masses of the nodes ``ids`` (B, C) (``N``: 0), from the
    batch-major depth-first prefix sums ``prefix`` (B, L + 1), temporaries within ``budget`` (none on plain CPU
    tensors, where one native pass reads them)."""
    return depth_masses_packed(h, prefix, ids, budget)


# --------------------------------------------------------------------------- top-k inputs
def _topk_masses(ct):
    """``(masses(rows, nodes) -> (M, E) float64, mass_rel, mass_abs)`` of a completed top-k batch ``ct``:
    Q_e(n) = S_e(n) + r·(W_e(n) − C_e(n)) (:mod:`~hdecode_torch.kernels.support_jaccard`) and the bounds on
    an entry's rounding error.  S_e and C_e are differences of prefix sums of ≤ k listed terms (absolute
    error ≤ 2(k + 1)·u₆₄ for masses summing to 1); W_e − C_e is exact for the uniform completion (counts),
    and r·(W_e − C_e) one more rounding (relative u₆₄); a prior's prefix sums over L + k terms add
    (L + k)·u₆₄·r·Σπ at most."""
    h = ct.h
    dl = depth_listed(h, ct.values, ct.indices, ct.listed.rate, ct.prior)
    wprefix = completion_prefix(h, ct.prior)
    # A quarter of the budget, as the dense decoder's masses: the temporaries sit beside a row's tables.
    budget = _chunk_budget(resolve_plan(h, ct.values.device))
    eps = torch.finfo(torch.float64).eps
    mass_abs = 4 * eps * (ct.k + 2)
    if ct.prior is not None and ct.batch_size:
        mass_abs += 4 * eps * (h.num_leaves + ct.k) * float(ct.listed.rate.max()) * float(ct.weights[h.root])
    return (lambda rows, nodes: depth_masses_topk(h, dl, wprefix, rows, nodes, budget)), 4 * eps, mass_abs


def jaccard_expected_topk(ct, sets: torch.Tensor) -> torch.Tensor:
    """(B,) float64 expected Jaccard index of closed sets under a completed top-k distribution.

    ct: a :class:`~hdecode_torch.core.topk.CompletedTopK`; sets: coalesced sparse COO bool (B, N), ancestor-
    closed.  E[J(S)] = Σ_{a ∈ S} g_{|S|}(a) (module docstring, §1), each g from a's per-leaf-depth masses
    under the completion: O(nnz·E·log(B·k)) time, O(nnz·E) memory, nothing B × L or B × N.
    """
    h = ct.h
    idx = sets.indices()
    rows, nodes = idx[0], idx[1]
    bsz = sets.shape[0]
    size = torch.zeros(bsz, dtype=torch.float64, device=rows.device).index_add_(
        0, rows, torch.ones_like(rows, dtype=torch.float64))
    masses, _, _ = _topk_masses(ct)
    q = masses(rows, nodes)  # (nnz, E)
    d = h.depth.index_select(0, nodes).to(torch.float64)[:, None]
    x = (size.index_select(0, rows)[:, None] - d) + _tables(h).depths  # m + d_e, m = |S| − d(a) ≥ 1
    g = (q * (x + 1 + d) / (x * (x + 1))).sum(1)
    return torch.zeros(bsz, dtype=torch.float64, device=rows.device).index_add_(0, rows, g)


def _closed_candidates(h, T, rows, nodes, budget: int = 1 << 25):
    """The (row, node) pairs with every ancestor of their nodes, each once, by row then preorder (a guard
    against rounding between tests that are closed in exact arithmetic).  O(M·D log(M·D)) time; the (M', D + 1)
    root paths in blocks of entries whose int64 keys and their sort (some 64 bytes an entry) fit ``budget``
    (a caterpillar's thousands of candidates by thousands of levels), each block's pairs made unique before
    they are joined: the same sorted pairs."""
    n = h.num_nodes
    step = max(1, budget // (64 * (T.max_depth + 1)))
    levels = torch.arange(T.max_depth + 1, device=nodes.device)
    keys = []
    for a in range(0, max(rows.numel(), 1), step):
        nb = nodes[a:a + step]
        # the ancestor at depth t is the last node of depth t at or before n in preorder (as in _root_paths), n
        # itself below its depth: one sorted search, no walk of D parent lookups per block
        at = torch.searchsorted(T.dp_key, levels[None, :] * n + T.pre.index_select(0, nb)[:, None], right=True) - 1
        up = torch.where(levels[None, :] <= T.depth.index_select(0, nb)[:, None],
                         T.dp_node.index_select(0, at.clamp(min=0).view(-1)).view(at.shape), nb[:, None])
        pre = T.pre.index_select(0, up.reshape(-1)).view(up.shape)
        keys.append(torch.unique((rows[a:a + step, None] * n + pre).reshape(-1)))
    key = keys[0] if len(keys) == 1 else torch.unique(torch.cat(keys))
    rows = key // n
    return rows, T.order.index_select(0, key - rows * n)


def _topk_tau_order(ct, T, limit):
    """:func:`~hdecode_torch.kernels.support_jaccard.heavy_order` for τ: the whole order, cached, for the
    uniform completion; with a prior, the nodes at or above the batch's smallest ``limit`` (B,), per call."""
    if ct.prior is None:
        return heavy_order(ct.h, ct.weights, T.tau, "jaccard_topk_heavy")
    return heavy_order(ct.h, ct.weights, T.tau, None, float(limit.min()))


def jaccard_decode_topk(ct) -> torch.Tensor:
    """Bayes-optimal ancestor-closed Jaccard sets of a completed top-k distribution, on the support.

    ct: a :class:`~hdecode_torch.core.topk.CompletedTopK` (B rows of k listed leaves, completion q).
    Returns a coalesced sparse COO bool (B, N) tensor: each row's set, root included.

    Exactness.  The decoder of the module docstring needs, per row, a lower bound LB ≤ U* (the value of
    an achieved set) and every node with p(n) ≥ τ(n)·LB, τ(n) = (d_min(n) + 1)/(2 d_min(n) + D + 1) (§2: a
    non-root node of an optimal set S has p(n) ≥ τ(n)·E[J(S)], so every optimal set is among them, a closed
    set), with their per-leaf-depth masses; :func:`~hdecode_torch.kernels.fused.jaccard_sets` then solves the
    knapsacks on those candidates alone.  Under the completion:

    - LB₀ is the best value of the root-path prefixes A(a) of the most probable leaf of q (listed, or the
      unlisted leaf of largest weight), from their masses, lowered by its rounding bound (§7);
    - on the support (the ancestors of the listed leaves, k·(D+1) per row at most) p̃(n) is read from the
      support table and compared with τ(n)·LB₀;
    - off the support p̃(n) = r·W(n), so the nodes passing are those with W(n)/τ(n) ≥ LB₀/r: a prefix of one
      tree-wide order by decreasing W/τ, each prefix closed, of at most Σ_d (2d + D + 1)·m / ((d + 1)·LB₀)
      nodes (the nodes of one depth are disjoint and share the missing mass m), whatever L; none where r = 0.

    Then, as the dense decoder's step (iii) (§4), LB = max(LB₀, the best closed prefix of those candidates at
    the sizes k̂ − 3..k̂ + 3), an achieved value again (rows whose most probable leaf is an unlisted one have a
    weak LB₀), and the candidates p̃(n) ≥ τ(n)·LB, a subset.  Every test allows the masses' rounding (it may
    only keep more), and the candidates are closed under ancestors each time, so they hold every optimal
    set, as the dense decoder's do, and the knapsacks return an optimal set of the completed distribution:
    its expected score is the dense decoder's on :meth:`~hdecode_torch.core.topk.TopK.completed` (its set
    may differ between sets of equal value).  All in float64, on both plans.

    Cost: O(B·k·D) for the support, O(C·D·log(C·D)) to close the C candidates, O(C·E·log(B·k)) for their
    masses, the knapsacks of :func:`~hdecode_torch.kernels.fused.jaccard_sets` on the packed (B, max C)
    candidates (rows in chunks of the memory budget; the masses and the closure's (C, D + 1) root paths in blocks
    of a quarter of it, so one row's (D + 1, E) and (C, E) masses are the floor beyond the budget, as for the dense
    decoder); tree tables once, O(N log N) (with a prior, per call:
    an O(N) pass and the sort of the nodes it keeps, and the best leaf's O(L log L) order).  A few host
    reads (the heavy nodes' count, the candidates' widths, one per chunk of rows).
    """
    h = ct.h
    bsz = ct.batch_size
    n = h.num_nodes
    dev = ct.values.device
    if bsz == 0:
        return sparse_node_sets(torch.zeros(0, dtype=torch.long, device=dev),
                                torch.zeros(0, dtype=torch.long, device=dev), 0, n)
    T = _tables(h)
    num_e = T.depths.numel()
    u64 = torch.finfo(torch.float64).eps / 2
    masses, mass_rel, mass_abs = _topk_masses(ct)
    budget = resolve_plan(h, dev).budget
    # (i) LB₀: the root-path prefixes of the most probable leaf of q.
    k_ref = (ct.expected_leaf_depth() + 1).round().long()
    top = support_best_leaf(h, ct.listed, ct.values, ct.indices, ct.prior)
    chain = _root_paths(h, T, top)  # (B, D + 1), N past the leaf
    kk = T.max_depth + 1
    rows = torch.arange(bsz, device=dev)
    q = masses(rows.repeat_interleave(kk), chain.reshape(-1)).view(bsz, kk, num_e)
    if kk ** 2 * num_e <= _CHAIN_TABLE_MAX:
        # Past the leaf the masses are 0 and the other gains only fall with k: never the maximum.
        values = torch.tensordot(q, _chain_weights(h, T), dims=([1, 2], [0, 1])).amax(1)
    else:
        ks = torch.cat([k_ref[:, None] + torch.arange(-3, 4, device=dev), (T.depth[top] + 1)[:, None]], 1)
        ks = ks.clamp(min=1, max=kk)
        g = _gains_at(T, q.view(-1, num_e), T.depth[chain.view(-1)], ks.repeat_interleave(kk, 0), kk, budget // 4)
        inside = torch.arange(kk, device=dev)[None, :, None] < ks[:, None, :]
        values = g.view(bsz, kk, -1).masked_fill(~inside, 0).sum(1).nan_to_num(nan=float("-inf")).amax(1)
    lb0 = values * (1 - (num_e + kk + 16) * u64 - mass_rel) - 2 * kk * mass_abs
    # A row without mass scores 0 with every set: 2 (above any value) keeps only its root.
    lb0 = torch.where(q[:, 0].sum(1) > 0, lb0, 2.0)
    del q, chain
    # (ii) the candidates p̃(n) ≥ τ(n)·LB₀, allowing the masses' rounding: on the support from its table ...
    thr = lb0 * (1 - 16 * u64 - mass_rel)
    slack = (num_e + 2) * mass_abs
    sup = support_table(h, ct.listed, ct.weights)
    tau = T.tau
    on = (sup.p + slack >= tau.index_select(0, sup.nodes) * thr.index_select(0, sup.rows)).nonzero().squeeze(1)
    # ... and off it, W(n)/τ(n) ≥ thr/r: a prefix of the heavy order (none where r = 0).
    rate = ct.listed.rate
    limit = torch.where(rate > 0, (thr - slack / T.tau_min) * (1 - 8 * u64) / rate.clamp_min(1e-300),
                        float("inf"))
    hrows, hnodes, _ = heavy_nodes(_topk_tau_order(ct, T, limit), limit)
    cand_rows = torch.cat([sup.rows.index_select(0, on), hrows])
    cand_nodes = torch.cat([sup.nodes.index_select(0, on), hnodes])
    cand_rows, cand_nodes = _closed_candidates(h, T, cand_rows, cand_nodes, budget // 4)
    qc = masses(cand_rows, cand_nodes)  # (M, E)
    count = torch.zeros(bsz, dtype=torch.long, device=dev).index_add_(0, cand_rows, torch.ones_like(cand_rows))
    # (iii) LB from the closed prefixes of the candidates at sizes around E[d(y)] + 1 (the dense decoder's
    # step: on rows whose most probable leaf is an unlisted one its root path is a weak bound), and the
    # candidates it leaves.
    wide = _Cands(T, bsz, cand_rows, cand_nodes, qc, torch.float64, count, int(count.max()))
    ks = (k_ref[:, None] + torch.arange(-3, 4, device=dev)).clamp(min=1, max=wide.c)
    g = _gains_at(T, wide.q, wide.depth, ks[wide.sample], wide.c, budget // 4)
    prefix = _prefix_lower_bound(T, wide, g, ks, 3).double()
    del g
    lb = torch.maximum(lb0, prefix * (1 - (num_e + wide.c + 16) * u64 - mass_rel) - 2 * wide.c * mass_abs)
    keep = (wide.pv + slack >= T.tau.index_select(0, cand_nodes) * (lb * (1 - 16 * u64 - mass_rel))[cand_rows])
    keep = keep.nonzero().squeeze(1)
    cand_rows, cand_nodes = _closed_candidates(h, T, cand_rows.index_select(0, keep), cand_nodes.index_select(0, keep),
                                               budget // 4)
    qc = masses(cand_rows, cand_nodes)
    del wide
    count = torch.zeros(bsz, dtype=torch.long, device=dev).index_add_(0, cand_rows, torch.ones_like(cand_rows))
    start = torch.cumsum(count, 0) - count
    slot = torch.arange(cand_rows.shape[0], device=dev) - start.index_select(0, cand_rows)
    # (iii) the knapsacks on the packed candidates, rows in chunks whose (rows, C, C) gains fit the budget.
    width_all = int(count.max())
    step = max(1, budget // (48 * width_all * (width_all + num_e)))
    out_rows, out_nodes = [rows], [torch.full((bsz,), h.root, dtype=torch.long, device=dev)]
    for a in range(0, bsz, step):
        b = min(bsz, a + step)
        width = int(count[a:b].max())
        sel = (cand_rows >= a) & (cand_rows < b)
        at = sel.nonzero().squeeze(1)
        r, s = cand_rows.index_select(0, at) - a, slot.index_select(0, at)
        ids = torch.full((b - a, width), n, dtype=torch.long, device=dev)
        ids[r, s] = cand_nodes.index_select(0, at)
        qp = torch.zeros(b - a, width, num_e, dtype=torch.float64, device=dev)
        qp[r, s] = qc.index_select(0, at)
        if b == bsz:  # the last group's packed copy is all that is read from here: not beside the knapsacks
            qc = None
        trust_indices(count[a:b], width)
        members = jaccard_sets(qp, ids, count[a:b], lb[a:b], k_ref[a:b], T.pre, T.end, T.depth, T.dmin1,
                               T.depths, T.max_depth, mass_rel, mass_abs, budget)
        mr, mc = members.nonzero().unbind(1)
        out_rows.append(mr + a)
        out_nodes.append(ids[mr, mc])
    return sparse_node_sets(torch.cat(out_rows), torch.cat(out_nodes), bsz, n)


class Jaccard(SetMetric):
    """Jaccard index |h⁺ ∩ y⁺| / |h⁺ ∪ y⁺|; its exact decoder is :func:`jaccard_decode`."""

    name = "jaccard"
    higher_is_better = True
    description = "Jaccard index |h+ & y+| / |h+ | y+| of ancestor-closed sets"
    data_dependent_sizes = "its candidate sets and the (sample, set size) pairs left to solve depend on the data"
    algorithms = {"cpu": "tree knapsack per set size on the pruned candidates",
                  "gpu": "tree knapsack per set size on the packed candidates, the fused hdecode::jaccard_sets"}
    oracle, baseline = "reference:jaccard", "benchmarks.baselines:Baselines.jaccard"

    def _decode_default(self, post):
        return jaccard_decode(post)

    def _decode_gpu(self, post):
        return jaccard_decode_packed(post)

    def _from_counts(self, inter, size, ysize):
        return jaccard_from_counts(inter, size, ysize)

    def _bytes_per_sample(self, h, plan):
        # (N, B) node sums, threshold product and masks, float64 prefix sums (L, B), and the
        # candidates' gain and knapsack tables, C·K per sample (C, K ≲ D + 1 on model outputs)
        return 8 * (2 * h.num_nodes + h.num_leaves) + 2 * h.num_nodes + 64 * (h.max_depth + 1) * (
            h.num_leaf_depths + h.max_depth + 1)

    def _expected_sets(self, post, sets):
        return jaccard_expected(post, sets)

    accepts_topk = True

    def _decode_topk(self, ct):
        return jaccard_decode_topk(ct)

    def _expected_topk(self, ct, sets):
        return jaccard_expected_topk(ct, sets)
