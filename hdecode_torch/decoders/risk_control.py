"""Risk-controlled hierarchical decoding: stop higher in the tree, with a guarantee on how often the answer is wrong.

**The family.**  For one row, the *top-down path* ``t_0 = root, t_1, ..., t_K`` starts at the root and
steps to the most probable child until a leaf (ties: the child with the smallest id, as ``top_down``).
With ``q_0 = +inf`` and ``q_k = min_{1 <= j <= k} p(t_j)`` (which is ``p(t_k)``: a child holds at most
its parent's mass, and so do the node probabilities computed here, see below; the minimum states the
order rather than relying on it), the member at λ ≥ 0 is

    D_λ(x) = t_{k(λ)},   k(λ) = max{k : q_k > λ}:

descend from the root while the most probable child has p > λ.  λ = 0 gives the deepest node of the
path with positive mass, λ ≥ q_1 (any λ ≥ 1, up to rounding) the root.

*Nested.*  The path does not depend on λ, and λ ≤ λ' gives {k : q_k > λ'} ⊆ {k : q_k > λ}, so
k(λ') ≤ k(λ): D_λ' is D_λ or one of its ancestors.

*For λ ≥ 1/2 it is the deepest node with p(n) > λ* (the root if none), hence ``majority`` at λ = 1/2,
the Bayes-optimal ``tree_distance_c`` decoder at λ = (1 + c)/2 and ``confidence_threshold`` at τ = λ.
Proof: two nodes with p > 1/2 cannot lie in disjoint subtrees, so the nodes with p > λ form a root
path; each of them holds more than half the mass, so it is the strictly most probable child of its
parent (its siblings share less than 1/2), and the descent follows the path to its deepest node n*,
then stops, since every child of n* has p ≤ λ (a single child has p(n*) > λ and is deeper, so on
unary chains the deeper node wins, as everywhere in the library).  Below 1/2 the deepest node with
p(n) > λ can jump between branches as λ moves, so that rule is not nested and its miss rate is not
monotone in λ; D_λ is nested for every λ.

The comparison is strict, p > λ, as in ``majority``, ``tree_distance_c`` and ``confidence_threshold``:
then each row's loss is right-continuous in λ, and the fitted λ is one of the data's critical values
(the infimum of the conformal rule is attained), never "just above" one.  Node probabilities are
float64 differences of prefix sums of the leaf probabilities in one depth-first order
(:mod:`hdecode_torch.kernels.top_down_path`), the same bits in fitting and decoding, on every device
and plan; a child's leaves are a sub-run of its parent's and the prefix sums never decrease, so a
child's computed p never exceeds its parent's, rounding included.

**Losses.**  A loss ℓ(n, y) ∈ [0, B] of the answer n for the target leaf y is controlled when it is
*monotone along the family*: ℓ(root, y) = 0 and ℓ(parent(n), y) ≤ ℓ(n, y).  Then each row's loss

    L_i(λ) = ℓ(D_λ(x_i), y_i) = Σ_{k=1..K} [ℓ(t_k, y_i) − ℓ(t_{k−1}, y_i)] · 1{λ < q_k}

is a non-increasing, right-continuous step function of λ, zero for λ ≥ q_1.

- ``"miss"`` (B = 1): ℓ(n, y) = 1{y ∉ L(n)}, the target is not under the answer.  With m the depth of
  the deepest node of the path above y, t_{m+1} is the first step off y's branch, so the row is
  missed iff k(λ) ≥ m + 1, i.e. **iff λ < s_i = q_{m+1}**, the row's critical value.  A path that
  ends at y has none: the row is never missed.
- ``"miss"`` with ``budget=b``: ℓ(n, y) = 1{d(n) − d(LCA(n, y)) > b}, the answer goes more than b
  levels below its deepest common ancestor with y (b = 0 is the miss).  On the path that is
  k(λ) − m > b: missed iff λ < s_i = q_{m+b+1}.
- ``"overshoot"`` (B = the tree's depth D): ℓ(n, y) = d(n) − d(LCA(n, y)), how many levels the answer
  goes past the target's branch; unit jumps at q_{m+1}, ..., q_K.  (The tree distance itself adds
  d(y) − d(LCA(n, y)), which *falls* as the answer steps towards y: it is not monotone along the
  family and cannot be controlled this way; its part on the answer's side can.)
- a callable ``loss(nodes, leaves)`` on (M,) int64 tensors returning (M,) values in [0, B] as a tensor
  or a numpy array (give ``loss_bound=B``), or an (N, L) float tensor ``loss[n, y]`` (B defaults to
  its maximum), monotone along the family.  A table is checked on every node when the decoder is built; a callable on every
  (path node, target) pair of the calibration rows and on (root, every leaf).

**Fitting** on n calibration rows, with ``S(λ) = Σ_i L_i(λ)``:

- conformal risk control (``delta=None``, Angelopoulos et al., "Conformal Risk Control", 2022, ICLR
  2024, Thm. 1): λ̂ = min{λ ≥ 0 : (S(λ) + B) / (n + 1) ≤ α};
- upper confidence bound (``delta``: Bates et al., "Distribution-Free, Risk-Controlling Prediction
  Sets", JACM 2021; Angelopoulos et al., "Learn then Test", 2021): λ̂ = min{λ ≥ 0 : p(λ) ≤ δ} with
  p(λ) the p-value of "the risk at λ exceeds α": the exact binomial tail P(Bin(n, α) ≤ S(λ)) for 0/1
  losses, the Hoeffding–Bentkus bound min(exp(−n·h(r ∧ a, a)), e·P(Bin(n, a) ≤ ⌈n·r⌉)) with
  r = S(λ)/(nB), a = α/B, h(r, a) = r log(r/a) + (1−r) log((1−r)/(1−a)) for other bounded losses.
  One test suffices for the data-dependent λ̂ because p(λ) falls as λ grows (the argument of Bates
  et al., Thm. 1): the risk can only exceed α at λ̂ if it does at a fixed λ where the test passed.

S is a non-increasing step function that jumps only at the rows' thresholds, and both conditions are
monotone in S, so λ̂ is 0 or a threshold: one sort of the thresholds (for 0/1 losses, the n critical
values s_i), suffix sums of the jumps and one binary search give S at every candidate at once, and
λ̂ is the smallest candidate that passes.  O(nK log(nK)) for K thresholds per row (K = 1 for 0/1
losses, the tree's depth otherwise), no scan over λ, no loop over rows.

**The guarantee.**  With λ̂ fitted on n calibration rows (x_i, y_i), and (x, y) a new row:

- conformal (``delta=None``): if the n calibration rows and the new row are *exchangeable* (e.g.
  i.i.d. from one distribution), then E[ℓ(D_λ̂(x), y)] ≤ α; for the miss loss,
  P(y ∉ L(D_λ̂(x))) ≤ α.  The probability is over the calibration rows and the new row together:
  it is the miss rate averaged over calibration sets, and one calibration set can be above α.
- upper confidence bound (``delta``): if the calibration rows are *i.i.d. from the distribution of
  the new rows*, then with probability at least 1 − δ over the calibration rows, the risk
  E[ℓ(D_λ̂(x), y) | λ̂] ≤ α: the fitted decoder misses at most a fraction α of future rows.

Nothing is assumed about the model: its probabilities may be miscalibrated, they only decide how
deep the answers can be at the level α.  The model must not have been trained or tuned on the
calibration rows, and under a distribution shift between calibration and use the guarantee is void.
It needs n ≥ B/α − 1 rows (conformal) or n ≥ log δ / log(1 − α/B) (confidence bound), below which
even the root could not be certified (``min_calibration_rows``); a level that needs more than 2^40 rows
is refused.
"""

from __future__ import annotations

import copy
import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

from ..core.params import Param
from ..core.posterior import Posterior
from ..core.subtree import as_within, split_within
from ..core.topk import CompletedTopK, TopK
from ..core.index_checks import RangeCheck, as_targets
from ..core.scalar_checks import check_nonnegative
from ..kernels.support import support_top_down
from ..kernels.top_down_path import best_child, child_slots, descend, leaf_prefix, miss_chains, miss_critical_values
from .base import Decoder

__all__ = ["ThresholdDescent", "RiskControl", "LossSteps", "RiskCoverage"]


# --------------------------------------------------------------------------- the family
#: On the CPU plan a chunk's float64 prefix table (B_c, L + 1) is kept to about this many bytes: the walk
#: gathers from it once per tree level, and a chunk that stays in the cache is gathered from fastest
#: (benchmarks/README.md, "Risk control").
CPU_PREFIX_BYTES = 2**22
#: The miss loss's critical values build and read their prefix sums in blocks of about this many bytes
#: (``python -m benchmarks.risk_control --chunk-bytes``), in chunks of rows of ``CPU_CHAIN_ROWS_BYTES``
#: worth of prefix sums: the chunk's (B_c, E) tables stay small enough to be reused from the allocator.
CPU_CHAIN_BYTES = 2**21
CPU_CHAIN_ROWS_BYTES = 2**24


class ThresholdDescent(Decoder):
    """The nested family D_λ: from the root, step to the most probable child while its p > ``lam``.

    ``lam`` ≥ 0.  For ``lam`` ≥ 1/2 it is the deepest node with p(n) > ``lam``; a larger ``lam`` always
    gives the same node or an ancestor (see the module docstring for both proofs).  Ties between
    equally probable children: the smallest id.  O(B·(L + Σ_d K_d)) for K_d the widest node at depth d.

    A top-k list (:class:`~hdecode_torch.TopK`) is decoded on its support: the same path on the completed
    distribution, its p̃ in float64 (:func:`~hdecode_torch.kernels.support.support_top_down` with the stop at
    ``lam``), O(B·k·D·log(B·k)), equal to the dense node wherever the node sums are exact.
    :class:`RiskControl`'s ``fit``, ``loss_steps`` and ``risk_coverage`` take top-k lists too: a row's loss
    steps need only its path's masses and its target, read from the same support walk (no ``within``).
    """

    name = "threshold_descent"
    description = "from the root, step to the most probable child while its p > lam"

    PARAMS = (Param("lam", float, 0.5, check_nonnegative, doc="probability a child must exceed to be stepped into"),)

    def _bytes_per_sample(self, h, plan) -> int:
        return 16 * h.num_leaves + 64 * (max(h.max_depth, 1) + 1)

    def _chunks(self, post, chunk_size=None, cache_bytes=None):
        if chunk_size is None and not post.plan.gpu:
            # at least D rows: on a deep tree the walk's ten or so operators per level and chunk cost more
            # than reading a prefix table out of the cache saves (benchmarks/README.md, "Risk control")
            rows = min(post.plan.budget // self._bytes_per_sample(post.h, post.plan),
                       max((cache_bytes or CPU_PREFIX_BYTES) // (8 * (post.h.num_leaves + 1)), post.h.max_depth))
            chunk_size = max(1, rows)
        return super()._chunks(post, chunk_size)

    def _threshold(self) -> float:
        return self.lam

    def _decode_default(self, post) -> torch.Tensor:
        return descend(post.h, post.probs, self._threshold())

    accepts_topk = True

    def _decode_topk(self, ct) -> torch.Tensor:
        # the top-down path on the list's support, stopped where the next node's p̃ is at most λ
        return support_top_down(ct.h, ct.listed, ct.weights, ct.indices, "topk_heaviest" if ct.prior is None else None,
                                lam=self._threshold())


# --------------------------------------------------------------------------- per-row loss steps
@dataclass(frozen=True)
class LossSteps:
    """Each calibration row's loss as a step function of λ: the sufficient statistics of the fit.

    ``L_i(λ) = Σ_k jump[i, k] · 1{λ < at[i, k]}``.

    Attributes:
        at: (n, K) float64 ≥ 0 thresholds.  For 0/1 losses K = 1 and ``at[:, 0]`` is each row's critical
            value (with a zero jump for a row that is never missed).
        jump: (n, K) float64 ≥ 0 loss increments.
        bound: B, the loss's upper bound.
        binary: whether every loss is 0 or 1 (the confidence bound is then the exact binomial tail).
    """

    at: torch.Tensor
    jump: torch.Tensor
    bound: float
    binary: bool

    @property
    def num_rows(self) -> int:
        return self.at.shape[0]

    def rows(self, index) -> "LossSteps":
        """The rows ``index`` (an int64 tensor of row numbers, a slice or a bool mask)."""
        return LossSteps(self.at[index], self.jump[index], self.bound, self.binary)

    def losses(self, lam) -> torch.Tensor:
        """Per-row losses at ``lam``: a float -> (n,) float64; an (S,) tensor of λ -> (S, n) float64."""
        lam = torch.as_tensor(lam, dtype=torch.float64, device=self.at.device)
        return ((self.at > lam[..., None, None]) * self.jump).sum(-1)


def _sums_above(values: torch.Tensor, weights: torch.Tensor, points: torch.Tensor | None = None):
    """``(points, Σ_j weights[j]·1{values[j] > point})`` for every point: one sort, one binary search.

    values, weights: (M,) float64; points: (G,) float64, by default 0 followed by every value in
    ascending order (the left ends of the steps of the sum).  Returns two (G,) float64.  O((M + G) log M).
    """
    ordered, order = torch.sort(values)
    cum = torch.cat([weights.new_zeros(1), weights[order].cumsum(0)])
    if points is None:
        points = torch.cat([values.new_zeros(1), ordered])
    return points, cum[-1] - cum[torch.searchsorted(ordered, points, right=True)]


# --------------------------------------------------------------------------- the fit's conditions
def _binom_logcdf(n: int, a: float, device, upto: int | None = None) -> torch.Tensor:
    """(m + 1,) float64 log P(Bin(n, a) ≤ k) for k = 0..m, m = min(n, ``upto``) (n by default).

    Each term is computed on its own and summed in order, so the first m + 1 are the same bits whatever m.
    """
    k = torch.arange((n if upto is None else min(n, upto)) + 1, dtype=torch.float64, device=device)
    logpmf = (math.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
              + k * math.log(a) + (n - k) * math.log1p(-a))
    return torch.logcumsumexp(logpmf, 0)


def _certified(total: torch.Tensor, n: int, alpha: float, delta: float | None, bound: float,
               binary: bool, upto: int | None = None) -> torch.Tensor:
    """Which candidate λ pass the fit's condition, given S(λ) = ``total`` (G,) float64 on n rows.

    ``upto``: an upper bound of ⌈S / B⌉ when the caller knows one (0 for S = 0): the binomial CDF is
    then built on k = 0..upto only, O(upto) instead of O(n) memory, with the same result (its terms are
    the same bits, and the log-sum never decreases along k, rounding included).
    """
    if delta is None:
        return total + bound <= alpha * (n + 1)
    log_delta = math.log(delta)
    if binary:
        logcdf = _binom_logcdf(n, alpha, total.device, upto)
        # the CDF grows with k: the largest passing k (capped at upto, which no total exceeds)
        allowed = int((logcdf <= log_delta).sum()) - 1
        return total <= allowed
    a = alpha / bound
    r = (total / (n * bound)).clamp(0.0, 1.0)
    rr = torch.minimum(r, torch.full_like(r, a))
    h = torch.xlogy(rr, rr / a) + torch.xlogy(1 - rr, (1 - rr) / (1 - a))
    logcdf = _binom_logcdf(n, a, total.device, upto)
    k = torch.ceil(total / bound).clamp(0, n).long()
    log_p = torch.minimum(-n * h, 1.0 + logcdf[k])
    return log_p <= log_delta


#: The most calibration rows a level may need (:meth:`RiskControl.min_calibration_rows`): 2^40 ≈ 1.1·10^12,
#: more than any calibration set holds (8 TiB of float32 probabilities for two classes), and where the
#: confidence bound's binomial tail, whose float64 rounding grows like lgamma(n + 1) ≈ n log n, is still
#: right to about 1%.
MAX_CALIBRATION_ROWS = 2**40
#: :meth:`RiskControl.min_calibration_rows` walks this many rows one at a time before it gallops (see
#: :func:`_first_true_from`).
ROWS_WALK = 64


def _first_true_from(test, n: int, step: int, last: int | None = None) -> int:
    """The first of n, n + step, n + 2·step, ... where ``test`` is true (``last``, if given, must pass):
    what a walk one row at a time finds, in O(ROWS_WALK + log distance) calls.

    ``ROWS_WALK`` single steps, then steps doubling until one passes (never beyond ``last``), then a
    bisection between the last failure and the first pass.  The bisection finds the walk's answer when
    ``test`` does not flicker between the two: true of every condition of the fit but the exact binomial
    tail, which flickers only over the few rows around where it turns true (the rounding of
    lgamma(n + 1) ~ n log n), and those the single steps cover, since the closed form starts among them.
    """
    for _ in range(ROWS_WALK):
        if test(n):
            return n
        n += step
    gap = 1
    while not test(n):
        failed, gap = n, 2 * gap
        n += step * gap
        if last is not None and (n - last) * step > 0:
            n = last
    while abs(n - failed) > 1:  # test(failed) is false, test(n) true
        mid = (n + failed) // 2
        if test(mid):
            n = mid
        else:
            failed = mid
    return n


# --------------------------------------------------------------------------- losses
_BUILTIN_LOSSES = ("miss", "overshoot")


def _check_level(value, name: str, hi: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < float(value) < hi):
        raise ValueError(f"Expected `{name}` to be a float in (0, {hi:g}) ({what}), but got {value!r}")
    return float(value)


@dataclass(frozen=True)
class RiskCoverage:
    """The risk–coverage curve: how the loss and the depth of the answers move with λ.

    Attributes:
        lam: (G,) float64 ascending: 0 and every distinct threshold of the rows' top-down paths
            (where an answer can change), each a left end of a step.
        risk: (G,) float64 mean loss (the miss rate for ``"miss"``) for λ in [lam[g], lam[g + 1]).
        mean_depth: (G,) float64 mean depth of the answers on the same steps.
        fitted_lambda: the decoder's fitted λ, or None before ``fit``.
        alpha, delta: the decoder's levels.
    """

    lam: torch.Tensor
    risk: torch.Tensor
    mean_depth: torch.Tensor
    fitted_lambda: float | None
    alpha: float
    delta: float | None


class RiskControl(ThresholdDescent):
    """D_λ with λ fitted on held-out rows so that the loss (by default the miss rate) is at most ``alpha``.

    ``RiskControl(h, alpha=0.1).fit(val_probs, val_targets)`` chooses λ by conformal risk control:
    on new rows exchangeable with the calibration rows, the target lies under the answer with
    probability ≥ 0.9.  With ``delta=0.05`` the fit uses an upper confidence bound instead: with
    probability ≥ 0.95 over the calibration rows (i.i.d. like the new rows), the fitted decoder's
    miss rate is ≤ 0.1.  The family, the losses, the fit and the guarantee with its assumptions are in
    the module docstring.  ``decode`` then gives (B,) int64 node ids like any decoder, so the fitted
    object goes into ``DecodingHead(h, decoder=rc)`` or ``HierarchicalMetric(h, metric, decoder=rc)``.

    Args:
        hierarchy: the class tree.
        alpha: the level, in (0, B): the miss rate to allow (B = 1), or the mean loss for other losses.
        delta: None (conformal risk control, a guarantee in expectation) or the error probability in
            (0, 1) of the confidence bound.
        loss: ``"miss"``, ``"overshoot"``, an (N, L) float tensor or a callable ``loss(nodes, leaves)``
            (module docstring).
        budget: with ``"miss"``, the levels an answer may go past the target's branch (int ≥ 0).
        loss_bound: B for a custom loss (required for a callable; a table's maximum by default).
        validate: check the inputs of ``fit`` and ``decode``.

    After ``fit``: ``lam`` (the fitted λ), ``num_calibration`` (n) and ``calibration_risk`` (the mean
    loss of the calibration rows at λ).
    """

    name = "risk_control"
    description = "deepest top-down node whose loss (the miss rate by default) is certified at level alpha"
    PARAMS = ()  # alpha, delta, the loss: checked by the constructor (the loss may be a callable or a table)

    def __init__(self, hierarchy, alpha: float = 0.1, delta: float | None = None, loss="miss", *, budget: int = 0,
                 loss_bound: float | None = None, validate: bool = True):
        Decoder.__init__(self, hierarchy, validate=validate)
        self.loss, self.bound, self._table = self._resolve_loss(loss, loss_bound)
        self._kind = loss if isinstance(loss, str) else "custom"
        if self._kind != "miss":  # the label in tables and logs tells the losses apart
            self.name = f"risk_control_{self._kind}"
        if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 0:
            raise ValueError(f"Expected `budget` to be an int >= 0 (levels past the target's branch), but got "
                             f"{budget!r}")
        if budget and self._kind != "miss":
            raise ValueError(f"`budget` applies to loss='miss' only, but loss={self._loss_label()}")
        self.budget = int(budget)
        what = "the miss rate to allow" if self.binary else f"the mean loss to allow, B = {self.bound:g}"
        self.alpha = _check_level(alpha, "alpha", self.bound, what)
        self.delta = None if delta is None else _check_level(delta, "delta", 1.0, "the probability that the "
                                                             "confidence bound fails")
        self.lam = None
        self.num_calibration = None
        self.calibration_risk = None

    # ------------------------------------------------------------------ configuration
    @property
    def binary(self) -> bool:
        """Whether the loss only takes the values 0 and 1."""
        return self._kind == "miss"

    @property
    def params(self) -> dict:
        out = {"alpha": self.alpha}
        if self.delta is not None:
            out["delta"] = self.delta
        if self.budget:
            out["budget"] = self.budget
        return out

    def _loss_label(self) -> str:
        return repr(self.loss) if self._kind != "custom" else f"a {type(self.loss).__name__}"

    def _resolve_loss(self, loss, loss_bound):
        h = self.hierarchy
        if isinstance(loss, str):
            if loss not in _BUILTIN_LOSSES:
                raise ValueError(f"Expected `loss` to be one of {', '.join(map(repr, _BUILTIN_LOSSES))}, an (N, L) "
                                 f"tensor or a callable loss(nodes, leaves), but got {loss!r}")
            if loss_bound is not None:
                raise ValueError(f"`loss_bound` is for custom losses; loss={loss!r} has its own bound")
            return loss, (1.0 if loss == "miss" else float(max(h.max_depth, 1))), None
        if isinstance(loss, torch.Tensor):
            table = self._checked_table(loss)
            top = float(table.max())
            bound = top if loss_bound is None else self._checked_bound(loss_bound)
            if top > bound:
                raise ValueError(f"Expected `loss` values in [0, loss_bound={bound:g}], but its maximum is {top:g}")
            if bound <= 0:
                raise ValueError("Expected `loss` to be positive somewhere, but every entry is 0: nothing to control")
            return loss, bound, table
        if callable(loss):
            if loss_bound is None:
                raise ValueError("A callable `loss` needs `loss_bound`, an upper bound B of its values (the "
                                 "guarantee depends on it)")
            return loss, self._checked_bound(loss_bound), None
        raise TypeError(f"Expected `loss` to be a name, an (N, L) tensor or a callable, but got "
                        f"{type(loss).__name__}")

    @staticmethod
    def _checked_bound(value) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (0 < float(value) < math.inf):
            raise ValueError(f"Expected `loss_bound` to be a finite float > 0, but got {value!r}")
        return float(value)

    def _checked_table(self, table: torch.Tensor) -> torch.Tensor:
        h = self.hierarchy
        if not table.is_floating_point() or table.shape != (h.num_nodes, h.num_leaves):
            raise ValueError(f"Expected `loss` as a table to be a float tensor of shape ({h.num_nodes}, "
                             f"{h.num_leaves}) (node, leaf), but got {table.dtype} {tuple(table.shape)}")
        t = table.detach().to("cpu", torch.float64)
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError("Expected `loss` values to be finite and >= 0")
        if bool((t[h.root] != 0).any()):
            leaf = int((t[h.root] != 0).nonzero()[0])
            raise ValueError(f"Expected `loss` to be 0 at the root (an ancestor of every target), but "
                             f"loss[root={h.root}, {leaf}] = {float(t[h.root, leaf]):g}")
        parent = h.parent.to("cpu")
        nonroot = (parent >= 0).nonzero()[:, 0]
        drop = t[parent[nonroot]] > t[nonroot]
        if bool(drop.any()):
            i, leaf = (int(v) for v in drop.nonzero()[0])
            n = int(nonroot[i])
            raise ValueError(f"Expected `loss` to be non-decreasing down the tree (loss[parent(n), y] <= loss[n, y]), "
                             f"but loss[{int(parent[n])}, {leaf}] = {float(t[parent[n], leaf]):g} > "
                             f"loss[{n}, {leaf}] = {float(t[n, leaf]):g}")
        return t

    def min_calibration_rows(self) -> int:
        """The fewest calibration rows at which the fit can certify anything at this ``alpha`` (and ``delta``).

        Conformal: B/(n + 1) ≤ α; confidence bound: (1 − α/B)^n ≤ δ.  Below it, not even the root would pass.
        The fit's own condition at S = 0, searched from the closed form in O(log n) evaluations of O(1)
        each (milliseconds for any level).  A level that needs more than ``MAX_CALIBRATION_ROWS`` (2^40)
        rows raises ValueError: no calibration set holds that many.
        """
        a = self.alpha / self.bound
        if self.delta is None:
            estimate = self.bound / self.alpha - 1
        else:  # a = 0 (alpha/B underflows): (1 - a)^n = 1 > delta for every n
            estimate = math.log(self.delta) / math.log1p(-a) if a > 0 else math.inf
        if estimate > MAX_CALIBRATION_ROWS:
            level = f"alpha={self.alpha:g}" + ("" if self.delta is None else f" with delta={self.delta:g}")
            bound = "" if self.binary else f" (loss bound B = {self.bound:g})"
            about = f" (about {estimate:.3g})" if math.isfinite(estimate) else ""
            raise ValueError(f"Expected `alpha` to be certifiable on a calibration set that can exist, but {level}"
                             f"{bound} needs more than 2^40 = {MAX_CALIBRATION_ROWS:,} calibration rows{about}: use "
                             "a larger alpha")
        if self.delta is None:
            n = max(1, math.ceil(self.bound / self.alpha) - 1)
        else:
            n = max(1, math.ceil(math.log(self.delta) / math.log1p(-a)))
        zero = torch.zeros(1, dtype=torch.float64)

        def passes(rows: int) -> bool:  # the root, S = 0: the binomial CDF at k = 0 only, O(1)
            return bool(_certified(zero, rows, self.alpha, self.delta, self.bound, self.binary, upto=0))

        n = _first_true_from(passes, n, 1)  # the closed form rounded the wrong way
        return _first_true_from(lambda rows: rows == 1 or not passes(rows - 1), n, -1, last=1)

    # ------------------------------------------------------------------ fitting
    def _top_k_input(self, probs, from_logits, within) -> tuple[TopK | None, object]:
        """``(topk, probs)``: ``probs`` as a :class:`~hdecode_torch.TopK` if it is a top-k list of k < L
        (then ``from_logits`` and ``within`` must be off), else None and the dense input.  A list of every
        leaf (k = L) is checked as a list and walked as its completed (B, L) table, as ``decode`` does, so
        that λ and the curve are the dense input's bit for bit (the support's sums are in another order)."""
        topk = TopK.of(probs)
        if topk is not None:
            if from_logits is not False:
                raise ValueError("`probs` is a top-k list of probabilities: from_logits does not apply (take the "
                                 "top-k of the softmax)")
            if within is not None:
                raise ValueError("`within` is not supported with a top-k input: pass the dense (B, L) probabilities")
            # not differentiable, as the dense fit (λ is a selected candidate)
            topk = TopK(topk.values.detach(), topk.indices, topk.missing, topk.prior)
            L = self.hierarchy.num_leaves
            if topk.k == L and not topk.unbatched:
                CompletedTopK(self.hierarchy, topk, self.validate)  # the list's own checks
                return None, topk.completed(L)
        return topk, probs

    def _inputs(self, probs, targets, from_logits) -> tuple[Posterior, torch.Tensor]:
        h = self.hierarchy
        if isinstance(probs, Posterior):
            raise TypeError("Expected `probs` to be a (B, L) tensor of probabilities (or logits), not a Posterior")
        if isinstance(probs, torch.Tensor):
            # Fitting is not differentiable (λ is a selected candidate, not a function of the scores with a
            # gradient), and the walk writes into preallocated tables, which autograd refuses.
            probs = probs.detach()
        shape = getattr(probs, "shape", ())
        batch = int(shape[0]) if len(shape) == 2 else None
        y = as_targets(targets, h.num_leaves, batch, name="targets")
        if y.dim() != 1:
            raise ValueError(f"Expected `targets` to have shape (B,), one leaf id per row, but got {tuple(y.shape)}")
        post = Posterior(h, probs, from_logits=from_logits, validate=self.validate, name="probs",
                         extra_checks=[RangeCheck(y, h.num_leaves, "targets", "leaf ids")])
        if post.unbatched:
            raise ValueError("Expected `probs` to have shape (B, L) with one row per calibration example, but got "
                             "a single (L,) row")
        return post, y.to(post.device)

    def _walk(self, post, y, within=None, path: bool = True) -> tuple[LossSteps, torch.Tensor | None]:
        """The rows' :class:`LossSteps` and their path thresholds q (B, D), chunk by chunk; with ``within``,
        each row's path starts at its node, on its subtree (``_walk_within``).  ``path=False``: q is
        None, and a 0/1 loss keeps only each chunk's critical values, not its (B_c, D) tables (a deep
        tree's D is in the thousands)."""
        if self.binary and not path:
            if within is not None:
                return LossSteps(*self._walk_within(post, y, within, critical=True), self.bound, True), None
            at, jump = zip(*(self._critical(*self._walk_chunk(post.h, post.probs[a:b], y[a:b]))
                             for a, b in self._chunks(post)))
            return LossSteps(torch.cat(at), torch.cat(jump), self.bound, True), None
        if within is None:
            qs, vs = zip(*(self._walk_chunk(post.h, post.probs[a:b], y[a:b]) for a, b in self._chunks(post)))
            q, v = torch.cat(qs), torch.cat(vs)
        else:
            q, v = self._walk_within(post, y, within)
        if self._kind == "custom":
            self._check_path_losses(v, y, post.h)
        if self.binary:
            return LossSteps(*self._critical(q, v), self.bound, True), q
        return LossSteps(q, v.diff(dim=1), self.bound, False), q

    @staticmethod
    def _critical(q: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A 0/1 loss's (at, jump), each (B, 1) float64, from the walk's (q, v): one jump of 1 at most per
        row, so the sums are exact, the critical value (0 without a jump) and the jump itself."""
        jump = v.diff(dim=1)
        return (q * jump).sum(1, keepdim=True), jump.sum(1, keepdim=True)

    def _miss_steps(self, post, y) -> LossSteps | None:
        """The miss loss's :class:`LossSteps` straight from each row's critical value, without walking the
        path (:func:`~hdecode_torch.kernels.top_down_path.miss_critical_values`: the same values as
        ``_walk``'s, bit for bit); None for other losses, or when the tree's window table is too large."""
        if self._kind != "miss" or self.budget:
            return None
        chains = miss_chains(post.h)
        if chains is None:
            return None
        block = None if post.plan.gpu else max(1, CPU_CHAIN_BYTES // (8 * (post.h.num_leaves + 1)))
        at, jump = zip(*(miss_critical_values(post.h, chains, post.probs[a:b], y[a:b], block)
                         for a, b in self._chunks(post, cache_bytes=CPU_CHAIN_ROWS_BYTES)))
        return LossSteps(torch.cat(at)[:, None], torch.cat(jump).to(torch.float64)[:, None], self.bound, True)

    def _walk_within(self, post, y, within, critical: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """``_walk``'s (q, v) of rows decoded within their subtrees: each group of rows with one ``within``
        node walks down its subtree (probabilities renormalised there, the loss of the whole tree's ids),
        its (b, D_w) thresholds padded with zeros (no step) and its losses with the last one to the
        whole tree's D.  Every target must lie under its row's node.  ``critical`` (a 0/1 loss): each
        chunk's (at, jump) instead, (B, 1) each, without the (B, D) tables (:meth:`_critical`; the padding
        adds exact zeros)."""
        h = post.h
        w, groups = split_within(post, within)
        start, size = h.pos.index_select(0, w), h.size.index_select(0, w)
        outside = (h.pos.index_select(0, y) < start) | (h.pos.index_select(0, y) >= start + size)
        if bool(outside.any()):  # one host read
            i = int(outside.nonzero()[0, 0])
            raise ValueError(f"Expected every target to lie under its row's `within` node, but row {i}'s target "
                             f"{int(y[i])} is not under node {int(w[i])}")
        depth = h.max_depth
        width = (1, 1) if critical else (depth, depth + 1)
        q = torch.zeros(w.shape[0], width[0], dtype=torch.float64, device=w.device)
        v = torch.zeros(w.shape[0], width[1], dtype=torch.float64, device=w.device)
        for sub, rows, x in groups:
            if sub is None:
                sub_post = Posterior(h, x, validate=False)
                parts = ((rows[a:b], *self._walk_chunk(h, x[a:b], y[rows[a:b]])) for a, b in self._chunks(sub_post))
            elif sub.hierarchy is None:  # a leaf: no step, the loss of the leaf itself
                at = torch.full_like(rows, sub.root)
                loss = self._loss_at(at, y[rows]) if self._kind == "custom" else torch.zeros_like(at)
                parts = [(rows, q.new_zeros(rows.numel(), 0), loss.to(torch.float64)[:, None])]
            else:
                walker = self._on(sub)
                sub_post = Posterior(sub.hierarchy, x, validate=False)
                y_sub = torch.searchsorted(sub.leaves, y[rows])
                parts = ((rows[a:b], *walker._walk_chunk(sub.hierarchy, x[a:b], y_sub[a:b]))
                         for a, b in walker._chunks(sub_post))
            for part, qg, vg in parts:  # chunk by chunk: a group's (b, D) tables are never whole
                if critical:
                    q[part], v[part] = self._critical(qg, vg)
                else:
                    q[part, :qg.shape[1]] = qg
                    v[part] = torch.cat([vg, vg[:, -1:].expand(-1, depth + 1 - vg.shape[1])], 1)
        if self._kind == "custom":
            bad = v[:, 0] != 0
            if bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                raise ValueError(f"Expected `loss` to be 0 at each row's `within` node for its target (the answer "
                                 f"before any step), but loss({int(w[i])}, {int(y[i])}) = {float(v[i, 0]):g} on row {i}")
        return q, v

    def _on(self, sub) -> "RiskControl":
        """A copy of this decoder on the subtree ``sub``: the same loss (of the whole tree's ids), λ and level."""
        walker = copy.copy(self)
        walker.hierarchy = sub.hierarchy
        if self._kind == "custom":
            walker._loss_at = lambda nodes, leaves: self._loss_at(sub.nodes[nodes], sub.leaves[leaves])
        return walker

    def on_subtree(self, sub) -> ThresholdDescent:
        """The fitted member D_λ on the subtree ``sub`` (``decode(..., within=)``)."""
        return ThresholdDescent(sub.hierarchy, self._threshold(), validate=False)

    def _walk_chunk(self, h, probs, y) -> tuple[torch.Tensor, torch.Tensor]:
        """One walk down every row's top-down path t_0..t_D (t_k = t_K once the path has ended).

        Returns ``(q, v)``: q (B, D) float64, the thresholds q_1..q_D (0 once the path has ended, so
        that no λ ≥ 0 takes a step that does not exist); v (B, D + 1) float64, the loss of t_0..t_D.
        """
        c, dev = probs.shape[0], probs.device
        prefix, slots = leaf_prefix(h, probs), child_slots(h)

        def steps():
            cur = torch.full((c,), h.root, dtype=torch.long, device=dev)
            for depth in range(h.max_depth):
                real, cur, p = best_child(slots, prefix, cur, depth)  # a node without children stays
                yield real, cur, p

        return self._path_losses(h, y, steps(), c, dev)

    def _path_losses(self, h, y, steps, c: int, dev) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q, v)`` of ``_walk_chunk`` from a walk's ``steps``: for each depth 1..D, ``(real, cur, p)``, (c,)
        each: whether the row stepped to a child, the node it is at, and the child's mass (0 once the path has
        ended).  The dense walk and the top-k support walk share it, so their losses are the same sums.
        For the built-in losses ``on`` tells whether the path is still above y, and ``past`` counts the
        steps it took since it left y's branch, d(t_k) − d(LCA(t_k, y))."""
        lo, hi = h.leaf_start, h.leaf_start + h.leaf_count
        where = lo.index_select(0, y)  # y's position among the leaves in depth-first order
        cur = torch.full((c,), h.root, dtype=torch.long, device=dev)
        q = torch.full((c,), math.inf, dtype=torch.float64, device=dev)
        on = torch.ones(c, dtype=torch.bool, device=dev)
        past = torch.zeros(c, dtype=torch.long, device=dev)
        custom = self._kind == "custom"
        qs, values = [], [self._loss_at(cur, y) if custom else past]
        for real, cur, p in steps:
            q = torch.minimum(q, p)  # p = 0 once the path has ended
            qs.append(q)
            if custom:
                values.append(self._loss_at(cur, y))
                continue
            on &= (lo.index_select(0, cur) <= where) & (where < hi.index_select(0, cur))
            past = past + (real & ~on)
            values.append(past > self.budget if self._kind == "miss" else past)
        q = torch.stack(qs, 1) if qs else torch.zeros((c, 0), dtype=torch.float64, device=dev)
        return q, torch.stack(values, 1).to(torch.float64)

    def _walk_topk(self, topk: TopK, targets) -> tuple[LossSteps, torch.Tensor, torch.Tensor]:
        """``_walk`` of a top-k list: ``(steps, q, y)``, the path and its p̃ from the list's support (the same
        (q, v) as ``_walk_chunk`` on the completed table wherever its node sums are exact), O(B·k·D·log(B·k))."""
        if topk.unbatched:
            raise ValueError("Expected `probs` to be a (B, k) top-k list with one row per calibration example, but "
                             "got a single (k,) row")
        ct = CompletedTopK(self.hierarchy, topk, self.validate)
        h = ct.h
        y = as_targets(targets, h.num_leaves, ct.batch_size, name="targets").to(ct.values.device)
        if y.dim() != 1:
            raise ValueError(f"Expected `targets` to have shape (B,), one leaf id per row, but got {tuple(y.shape)}")
        trace = []
        support_top_down(h, ct.listed, ct.weights, ct.indices, "topk_heaviest" if ct.prior is None else None,
                         trace=trace)
        q, v = self._path_losses(h, y, trace, ct.batch_size, ct.values.device)  # the steps of the support walk
        if self._kind == "custom":
            self._check_path_losses(v, y, h)
        if self.binary:
            return LossSteps(*self._critical(q, v), self.bound, True), q, y
        return LossSteps(q, v.diff(dim=1), self.bound, False), q, y

    def _loss_at(self, nodes: torch.Tensor, leaves: torch.Tensor) -> torch.Tensor:
        if self._table is not None:
            if self._table.device != nodes.device:
                self._table = self._table.to(nodes.device)
            return self._table[nodes, leaves]
        out = self.loss(nodes, leaves)
        if isinstance(out, np.ndarray) and out.dtype.kind in "biuf":
            out = torch.from_numpy(out)  # a loss written with numpy: its values are as good as a tensor's
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"Expected `loss(nodes, leaves)` to return a torch.Tensor (or a numpy array of numbers) "
                            f"of shape {tuple(nodes.shape)}, but got {type(out).__module__}.{type(out).__qualname__}")
        if out.shape != nodes.shape:
            raise ValueError(f"Expected `loss(nodes, leaves)` to return a tensor of shape {tuple(nodes.shape)} (one "
                             f"value per pair), but got {tuple(out.shape)}")
        return out.to(device=nodes.device, dtype=torch.float64)

    def _check_path_losses(self, v: torch.Tensor, y: torch.Tensor, h) -> None:
        """A custom loss on the calibration paths: within [0, B], 0 at the root, non-decreasing down the path."""
        if self._table is not None:
            return  # checked on every node when the decoder was built
        bad = ~torch.isfinite(v) | (v < 0) | (v > self.bound)
        if bool(bad.any()):
            i, k = (int(t) for t in bad.nonzero()[0])
            raise ValueError(f"Expected `loss` values in [0, loss_bound={self.bound:g}], but got {float(v[i, k]):g} "
                             f"for target {int(y[i])} at depth {k} of row {i}'s top-down path")
        root_values = self._loss_at(torch.full((h.num_leaves,), h.root, dtype=torch.long, device=y.device),
                                    torch.arange(h.num_leaves, device=y.device))
        if bool((root_values != 0).any()):
            leaf = int((root_values != 0).nonzero()[0])
            raise ValueError(f"Expected `loss` to be 0 at the root (an ancestor of every target), but "
                             f"loss(root={h.root}, {leaf}) = {float(root_values[leaf]):g}")
        drop = v.diff(dim=1) < 0
        if bool(drop.any()):
            i, k = (int(t) for t in drop.nonzero()[0])
            raise ValueError(f"Expected `loss` to be non-decreasing down the tree, but on row {i}'s top-down path it "
                             f"falls from {float(v[i, k]):g} at depth {k} to {float(v[i, k + 1]):g} at depth {k + 1} "
                             f"(target {int(y[i])})")

    def loss_steps(self, probs, targets, from_logits: bool = False, *, within=None) -> LossSteps:
        """Each row's loss as a step function of λ (:class:`LossSteps`), for :meth:`fit_steps`.

        probs: (B, L) float probabilities (or logits with ``from_logits=True``), or a (B, k) top-k list of
        probabilities (:class:`~hdecode_torch.TopK`, ``probs.topk(k)``: the path of its completed distribution
        on the list's support, O(B·k·D·log(B·k)); k = L: its completed table, the dense steps bit for bit);
        targets: (B,) int
        leaf ids in 0..L-1.  One walk down every row's top-down path: O(B·(L + Σ_d K_d)); for the miss
        loss, one gather of the children of each target's ancestors instead, O(B·(L + W)) for W the most
        such children of a leaf.
        ``within``: (B,) int64 node ids, each row's path walked on its node's subtree (as
        ``decode(..., within=)`` decodes); every target must lie under its row's node.
        """
        topk, probs = self._top_k_input(probs, from_logits, within)
        if topk is not None:
            return self._walk_topk(topk, targets)[0]
        post, y = self._inputs(probs, targets, from_logits)
        steps = self._miss_steps(post, y) if within is None else None
        return steps if steps is not None else self._walk(post, y, within, path=False)[0]

    def fit(self, probs, targets, from_logits: bool = False, *, within=None) -> "RiskControl":
        """Fit λ on held-out rows (not used to train the model); returns ``self``.

        probs: (n, L) float probabilities, or logits with ``from_logits=True``, or an (n, k) top-k list (as in
        :meth:`loss_steps`); targets: (n,) int leaf
        ids in 0..L-1.  Needs n ≥ :meth:`min_calibration_rows`.  O(n·(L + Σ_d K_d) + nK log(nK)) (for the
        miss loss O(n·(L + E) + n log n), :meth:`loss_steps`), a few host reads (the input check, the
        fitted λ).  Not differentiable: ``probs`` is detached (λ is selected among the rows' critical values,
        it has no gradient), so the output of a model or a :class:`~hdecode_torch.TemperatureScaler` can be
        passed as it is; :meth:`loss_steps` and :meth:`risk_coverage` detach it too.

        ``within``: (n,) int64 node ids, a node each calibration row's answer is known to lie under (its
        target among them): λ is fitted for ``decode(probs, within=...)``, each row's family walked on
        its node's subtree with renormalised probabilities.  The family stays nested on every subtree,
        so the guarantee holds as stated for new rows whose (probabilities, node, target) are
        exchangeable with the calibration rows' — the nodes must be given the same way at both.  A
        custom loss must be 0 at each row's node for its target.
        """
        return self.fit_steps(self.loss_steps(probs, targets, from_logits, within=within))

    def fit_steps(self, steps: LossSteps) -> "RiskControl":
        """Fit λ from precomputed :class:`LossSteps` (e.g. some rows: ``steps.rows(index)``); returns ``self``."""
        if not isinstance(steps, LossSteps):
            raise TypeError(f"Expected `steps` to be LossSteps (from loss_steps), but got {type(steps).__name__}")
        if steps.bound != self.bound or steps.binary != self.binary:
            raise ValueError(f"Expected LossSteps of this decoder's loss (bound {self.bound:g}), but got bound "
                             f"{steps.bound:g}: compute them with this decoder's loss_steps")
        n = steps.num_rows
        need = self.min_calibration_rows()
        if n < need:
            how = ("conformal risk control needs (n + 1)·alpha ≥ B" if self.delta is None
                   else "the confidence bound needs (1 - alpha/B)^n ≤ delta")
            raise ValueError(f"Too few calibration rows: {how} (B = {self.bound:g}), i.e. at least {need} rows at "
                             f"alpha={self.alpha:g}" + ("" if self.delta is None else f", delta={self.delta:g}")
                             + f", but got {n}")
        candidates, total = _sums_above(steps.at.reshape(-1), steps.jump.reshape(-1))
        ok = _certified(total, n, self.alpha, self.delta, self.bound, self.binary)
        best = int(ok.to(torch.uint8).argmax())  # S falls as λ grows: the first passing candidate is the smallest
        self.lam = float(candidates[best])
        self.num_calibration = n
        self.calibration_risk = float(total[best]) / n
        return self

    def _threshold(self) -> float:
        if self.lam is None:
            raise RuntimeError("RiskControl is not fitted yet: call .fit(probs, targets) on held-out rows first")
        return self.lam

    # ------------------------------------------------------------------ the curve
    def risk_coverage(self, probs, targets, from_logits: bool = False, *, within=None) -> RiskCoverage:
        """The risk–coverage curve of ``probs`` / ``targets`` (:class:`RiskCoverage`): the mean loss and the
        mean depth of the answers for every λ, with the fitted λ (None before :meth:`fit`).

        probs: (B, L) float probabilities (or logits); targets: (B,) int leaf ids; ``within``: as in
        :meth:`fit` (the depths are still those of the whole tree).  Evaluate it on rows not used to
        fit, to see the fitted λ's miss rate next to the level.  O(BD log(BD)).
        """
        topk, probs = self._top_k_input(probs, from_logits, within)
        if topk is not None:
            steps, path, _ = self._walk_topk(topk, targets)
        else:
            post, y = self._inputs(probs, targets, from_logits)
            steps, path = self._walk(post, y, within)
        n = steps.num_rows
        q = path.reshape(-1)
        lam = torch.unique(torch.cat([q.new_zeros(1), q]))
        risk = _sums_above(steps.at.reshape(-1), steps.jump.reshape(-1), lam)[1] / n
        depth = _sums_above(q, torch.ones_like(q), lam)[1] / n
        if within is not None:  # each path starts at its row's node
            depth = depth + post.h.depth[as_within(within, post)].double().mean()
        return RiskCoverage(lam, risk, depth, self.lam, self.alpha, self.delta)
