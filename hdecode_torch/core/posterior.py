"""The sufficient statistics of a batch of leaf distributions, computed once and shared.

A :class:`Posterior` holds checked leaf probabilities and computes, lazily and only once, every
batch statistic that metrics and decoders need (node probabilities, sums of leaf-weighted
probabilities, per-leaf-depth masses and their prefix sums, root-path masses, E[d(y)]).  Kernels
take a Posterior and never recompute what it holds; several metrics evaluated on the same batch
(e.g. a ``MetricCollection``) share one.

A Posterior also resolves the call's :class:`~hdecode_torch.core.plan.Plan` once, from the
probabilities' device: metrics and decoders read ``post.plan`` and sum over the tree through
:meth:`Posterior.leaf_sum`, :meth:`Posterior.path_sum` and :meth:`Posterior.subtree_sum`, which
pass the plan's layout to the kernels.

Every table is node-major in its interface, ``(N, B)`` or ``(N, E, B)``, with the batch last.  How
it is stored follows the plan: node-major with per-level sums, a transposed view of a batch-major
table with prefix sums (scans along the contiguous dimension).
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch

from ..hierarchy import Hierarchy
from ..kernels.depth_ranges import depth_prefix_sums, depth_range_ends, depth_ranges
from ..kernels.fused import trust_indices
from ..kernels.tree_sums import (
    accumulation_dtype, blocked_gathered_prefix, leaf_to_node_sum, node_major, path_sum, subtree_sum, subtree_sum_,
)
from .plan import Plan, resolve_plan
from .conversion import as_tensor
from .validation import prepare_leaf_probs

__all__ = ["Posterior"]


class Posterior:
    """Leaf probabilities of a batch and the node sums derived from them.

    Attributes:
        h: the hierarchy, on the probabilities' device.
        probs: (B, L) float32/float64 checked probabilities.
        unbatched: whether the user passed a single (L,) distribution.
        plan: the :class:`~hdecode_torch.core.plan.Plan` of every computation on this batch.
    """

    def __init__(self, h, leaf_probs, *, from_logits: bool | str = False, normalize: bool = False,
                 validate: bool = True, name: str = "leaf_probs", extra_checks=(), defer_check: bool = False):
        if not isinstance(h, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(h).__name__}")
        if isinstance(leaf_probs, Posterior):
            raise TypeError(f"`{name}` is already a Posterior: pass it directly to decode/expected, or use Posterior.of")
        x = as_tensor(leaf_probs, name)
        plan = resolve_plan(h, x.device)
        probs, unbatched, check = prepare_leaf_probs(x, h.num_leaves, name=name, from_logits=from_logits,
                                                     normalize=normalize, validate=validate,
                                                     extra_checks=extra_checks, fused_check=plan.gpu,
                                                     defer=defer_check)
        self.h = h.to(probs.device)
        self.probs = probs
        self.unbatched = unbatched
        self.plan: Plan = plan
        self._check = check
        self._memo: dict[Hashable, torch.Tensor] = {}

    @classmethod
    def of(cls, h, leaf_probs, **kwargs) -> "Posterior":
        """``leaf_probs`` if it already is a Posterior of ``h`` (or of an identical tree), else a new one.

        A Posterior built on another tree is a ``ValueError``: its node sums would be
        meaningless for ``h``.
        """
        if isinstance(leaf_probs, Posterior):
            if not leaf_probs.h.same_tree(h):
                raise ValueError(f"Expected a Posterior of {h!r}, but got one of a different tree {leaf_probs.h!r}: "
                                 "build it with Posterior(hierarchy, leaf_probs) for this hierarchy")
            return leaf_probs
        return cls(h, leaf_probs, **kwargs)

    def chunk(self, start: int, stop: int) -> "Posterior":
        """The samples ``start:stop`` as a Posterior (no re-validation).

        Statistics already computed for the whole batch are sliced, not recomputed (every table keeps
        the batch as its last dimension), so a Posterior shared by several decoders is summed once
        whatever chunk sizes the decoders use.  A chunk is always batched: callers unbatch once, at
        the end.
        """
        if start == 0 and stop == self.batch_size and not self.unbatched:
            return self
        new = object.__new__(Posterior)
        new.h, new.probs, new.unbatched, new.plan = self.h, self.probs[start:stop], False, self.plan
        new._check = self._check  # settled once, by whichever chunk reads first
        new._memo = {k: v[..., start:stop] for k, v in self._memo.items()}
        return new

    # ------------------------------------------------------------------ host reads
    def read(self, *values: torch.Tensor) -> list:
        """The host values of 0-d non-negative integer tensors ``values``, read together with this batch's
        input check if it is still pending (built with ``defer_check=True``): one host read for both.
        Raises the check's error, if any, before returning."""
        check = self._check
        pending = check is not None and not check.done
        both = values[0] if len(values) == 1 else torch.stack([v.reshape(()) for v in values])
        if pending:
            # The values are counts (>= 0): -1 stands for "some flag is false", whose flags are then read
            # on their own (a second read, on the error path only).
            both = torch.where(check.fine(), both, -1)
        got = both.reshape(-1).tolist()  # the one host read
        if pending:
            if min(got) < 0:
                check.settle()  # raises
            check.done = True
        return got

    def check_flag(self) -> torch.Tensor:
        """0-d bool on the device: true when this batch's pending input check has nothing to raise or warn
        (true when there is no pending check).  No host read."""
        if self._check is None or self._check.done:
            return torch.ones((), dtype=torch.bool, device=self.device)
        return self._check.fine()

    def settle(self) -> None:
        """Read this batch's input check now if it is still pending (one host read), raising its error."""
        if self._check is not None:
            self._check.settle()

    @property
    def batch_size(self) -> int:
        return self.probs.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.probs.dtype

    @property
    def device(self) -> torch.device:
        return self.probs.device

    def _get(self, key, build):
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    # ------------------------------------------------------------------ tree sums in the plan's layout
    def leaf_sum(self, leaf_values: torch.Tensor) -> torch.Tensor:
        """(N, *) ``Σ_{l ∈ L(n)} leaf_values[l]`` of leaf-major (L, *) values."""
        return leaf_to_node_sum(self.h, leaf_values, self.plan.tree_sums, self.plan.backend, self.plan.budget)

    def path_sum(self, values: torch.Tensor, include_root: bool = True, overwrite: bool = False) -> torch.Tensor:
        """(N, *) ``Σ_{a ∈ A(n)} values[a]`` of node-major (N, *) values (the root left out when
        ``include_root=False``); ``overwrite=True``: ``values`` is a temporary that may be summed in place."""
        return path_sum(self.h, values, include_root, self.plan.tree_sums, self.plan.backend, self.plan.budget,
                        overwrite)

    def subtree_sum(self, values: torch.Tensor) -> torch.Tensor:
        """(N, *) ``Σ_{m in the subtree of n} values[m]`` of node-major (N, *) values."""
        return subtree_sum(self.h, values, self.plan.tree_sums, self.plan.backend, self.plan.budget)

    # ------------------------------------------------------------------ batch statistics
    @property
    def node(self) -> torch.Tensor:
        """(N, B) node probabilities p(n)."""
        return self._get("node", lambda: self.leaf_sum(self.probs.t()))

    @property
    def positive_leaf_count(self) -> torch.Tensor:
        """(N, B) float64 the number of leaves of positive probability under each node: exact integers,
        the same on every plan and device (unlike the rounding of the computed p(n))."""
        return self._get("positive_leaf_count", lambda: self.leaf_sum((self.probs > 0).t().to(torch.float64)))

    def weighted_node(self, key: Hashable, leaf_weights: torch.Tensor) -> torch.Tensor:
        """(N, B) ``Σ_{l ∈ L(n)} p(l) w(l)`` for a fixed per-leaf weight ``leaf_weights`` (L,) or (L, 1), each
        product ``p(l) w(l)`` rounded to the probabilities' dtype (weights in it already cost no conversion)."""
        def build():
            w = self._in_dtype(leaf_weights)
            return self.leaf_sum(self.probs.t() * (w[:, None] if w.dim() == 1 else w))
        return self._get(("weighted", key), build)

    def node_rule(self, rule: Callable[[torch.Tensor], torch.Tensor],
                  fused: Callable[[torch.Tensor | None, torch.dtype], torch.Tensor | None],
                  key: Hashable | None = None, leaf_weights: torch.Tensor | None = None) -> torch.Tensor:
        """``rule(t)`` of a node table t, (N, B): :attr:`node`, or with ``key`` the leaf-weighted sums
        :meth:`weighted_node(key, leaf_weights) <weighted_node>`.  On the per-level plan, while t is not summed
        yet, ``fused(w, acc)`` first: one pass over :attr:`probs` that sums t as the torch path would and applies
        the same rule in it (no (N, B) table), given ``w`` the weights in the probabilities' dtype (None without
        ``key``) and ``acc`` the accumulation dtype; it returns None where it does not apply (a
        :mod:`~hdecode_torch.kernels.native` kernel: on plain CPU tensors outside traces), and the rule then
        reads t.  Both must give the same answer, bit for bit.  Returns what they return (the decoders': (B,) int64
        node ids, (N, B) bool sets).  O(B·N) for the sums, plus the rule's own cost."""
        memo = "node" if key is None else ("weighted", key)
        if memo not in self._memo and self.plan.tree_sums == "levels" and self.plan.backend == "torch":
            out = fused(None if key is None else self._in_dtype(leaf_weights), accumulation_dtype(self.h, self.dtype))
            if out is not None:
                return out
        return rule(self.node if key is None else self.weighted_node(key, leaf_weights))

    def _in_dtype(self, leaf_weights: torch.Tensor) -> torch.Tensor:
        """``leaf_weights`` in the probabilities' dtype (the same tensor when it already is)."""
        return leaf_weights if leaf_weights.dtype == self.dtype else leaf_weights.to(self.dtype)

    def leaf_depth_values(self) -> torch.Tensor:
        """(E,) int64 the distinct leaf depths, ascending."""
        return self.h.cached("leaf_depth_values", lambda: torch.unique(self.h.leaf_depth))

    def by_leaf_depth(self) -> torch.Tensor:
        """(N, E, B) per-leaf-depth masses ``Q[n, e] = Σ_{l ∈ L(n), d(l) = depths[e]} p(l)``.

        On the batch-major plan it is a ``permute(2, 1, 0)`` view of a contiguous (B, E, N) table.
        """
        def build():
            h = self.h
            if self.plan.batch_major:
                src, hi, lo = _depth_mass_ranges(h)
                q = blocked_gathered_prefix(self.probs, src, None, hi, lo, self.dtype, self.plan.budget)  # (B, E·N)
                return q.view(self.batch_size, h.num_leaf_depths, h.num_nodes).permute(2, 1, 0)
            depths = self.leaf_depth_values()
            group = h.cached("leaf_depth_group", lambda: torch.searchsorted(depths, h.leaf_depth))
            e = depths.numel()
            acc = accumulation_dtype(h, self.dtype)
            out = torch.zeros(h.num_nodes, e, self.batch_size, dtype=acc, device=self.device)
            rows = torch.arange(h.num_leaves, device=group.device) * e + group  # row (leaf, its depth group)
            # index_copy_ reads a transposed view element by element: transposed first (in blocks, SIMD)
            out.view(h.num_nodes * e, self.batch_size).index_copy_(0, rows, node_major(self.probs.t(), acc))
            return subtree_sum_(h, out, self.plan.backend).to(self.dtype)
        return self._get("by_leaf_depth", build)

    def depth_prefix(self) -> torch.Tensor:
        """(L + 1, B) float64 prefix sums of the leaf probabilities in (depth, depth-first) order:
        any node's per-leaf-depth mass is a difference of two entries (``kernels.depth_ranges``)."""
        def build():
            h = self.h
            if self.plan.batch_major:
                src, positions = h.cached("depth_prefix_positions", lambda: (
                    trust_indices(depth_ranges(h).leaf_order, h.num_leaves - 1),
                    trust_indices(torch.arange(h.num_leaves + 1, device=h.device), h.num_leaves)))
                return blocked_gathered_prefix(self.probs, src, None, positions, None, torch.float64,
                                               self.plan.budget).t()  # (B, L+1)ᵀ
            return depth_prefix_sums(h, self.node[: h.num_leaves])
        return self._get("depth_prefix", build)

    def ancestor_mass(self) -> torch.Tensor:
        """(N, B) ``Σ_{a ∈ A(n), a ≠ root} p(a)``, which equals E[d(LCA(n, y))]: the mass under each
        ancestor below the root counts once for every level the target shares with n."""
        return self._get("ancestor_mass", lambda: self.path_sum(self.node, include_root=False))

    def expected_leaf_depth(self) -> torch.Tensor:
        """(B,) E[d(y)]."""
        # the depths in the probabilities' dtype, a tree-only table: converted once per tree, not per call
        depth = self.h.cached(("leaf_depth_as", self.dtype), lambda: self.h.leaf_depth.to(self.dtype))
        return self._get("e_depth", lambda: self.probs @ depth)


def _depth_mass_ranges(h):
    """(src, hi, lo) of the per-leaf-depth masses as E·N ranges, e-major.

    Cached on the hierarchy only when the tree keeps an ends table (few leaf depths, O(N)); else
    built per call, the size of one sample's (N, E) output, so that no O(N·E) table outlives it.
    """
    def build():
        r = depth_ranges(h)
        n, j, e = h.num_nodes, h.num_leaves, h.num_leaf_depths
        ends = depth_range_ends(h, torch.arange(n, device=h.device)).t()  # (2E, N)
        # contiguous: with one leaf depth, ``ends[:e]`` of the transposed table is a strided view
        return (trust_indices(r.leaf_order, j - 1), trust_indices(ends[:e].reshape(-1).contiguous(), j),
                trust_indices(ends[e:].reshape(-1).contiguous(), j))
    if depth_ranges(h).ends is None:
        return build()
    return h.cached("depth_mass_ranges", build)
