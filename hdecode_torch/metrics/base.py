"""What every hierarchical metric offers: per-sample values, expected values, Bayes-optimal decoding.

A metric module (``metrics/<name>.py``) holds the metric's mathematics as plain functions and a small
declarative class that names it, says what it scores (``kind``), which way is better, its parameters
(``PARAMS``) and its decoding per plan.  The classes here turn those into the public API: argument
checks, devices, the shared :class:`~hdecode_torch.Posterior`, chunking and unbatching.

A metric of one's own: subclass :class:`NodeMetric` and give ``_values`` (the value of (node, leaf)
pairs); its expected values and its exact decoder then come from the dense (N, L) matrix of values
(O(B·N·L), for small trees), unless it also gives ``expected_table`` (structural, no N×L matrix).  Or
subclass :class:`SetMetric`.  ``hd.register_metric`` makes it available by name everywhere.
"""

from __future__ import annotations

import torch

from ..core.component import HierarchyComponent
from ..core.posterior import Posterior
from ..core.topk import CompletedTopK, TopK, no_top_k_decoder
from ..core.conversion import as_tensor
from ..core.index_checks import RangeCheck, as_node_ids, as_targets, check_node_sets, check_ranges
from ..core.node_sets import (as_sparse_sets, batched_sparse, check_sparse_sets, is_sparse_sets, sparse_closure,
                              sparse_node_sets, sparse_path_counts, unbatched_sparse)
from ..kernels.ancestry import ancestor_closure, ancestor_mask, lca_depth, path_counts
from ..kernels.selection import argbest

__all__ = ["BaseMetric", "NodeMetric", "SetMetric", "value_dtype"]


def value_dtype(dtype) -> torch.dtype:
    """The dtype of a metric's values: ``dtype`` if given (a floating ``torch.dtype``), else torch's default
    dtype (float32 unless changed with ``torch.set_default_dtype``), as for a tensor made from Python numbers."""
    if dtype is None:
        return torch.get_default_dtype()
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"Expected `dtype` to be a floating torch.dtype (e.g. torch.float64) or None, but got "
                        f"{dtype!r}")
    return dtype


class BaseMetric(HierarchyComponent):
    """A metric comparing a prediction with a target leaf.

    - ``m(pred, target) -> (B,)`` per-sample values, computed in float64 and returned in torch's default
      dtype (float32) or ``dtype=``;
    - ``m.expected(leaf_probs, pred) -> (B,)`` ``Σ_l p(l) m(pred, l)``, in the probabilities' compute dtype
      (float64 kept, float32 for every other floating dtype);
    - ``m.decode(leaf_probs)`` the Bayes-optimal prediction: (B,) int64 node ids for leaf and node
      metrics, (B, N) bool ancestor-closed sets for set metrics;
    - ``m.higher_is_better``, ``m.kind`` (``"leaf"``, ``"node"`` or ``"set"``), ``m.name``, ``m.params``,
      ``m.has_decoder`` (whether ``decode`` exists: every built-in metric has one).

    Devices: ``expected`` and ``decode`` run on the probabilities' device (the hierarchy and ``pred``
    are moved there); ``m(pred, target)`` runs on ``pred``'s device (``target`` is moved there).  Every
    input check of one call is fused into a single host sync; ``validate=False`` skips them all
    (out-of-range ids then give undefined results).
    """

    higher_is_better: bool = False
    component_kind = "metric"
    #: Whether the metric has an exact Bayes-optimal decoder (``decode``): set per class, from whether it
    #: declares its decoding.
    has_decoder: bool = False
    #: Why the decoder cannot run inside a graph (torch.export, ONNX, CUDA graphs): a size inside it
    #: depends on the data.  ``None``: every size is fixed by the batch and the tree.
    data_dependent_sizes: str | None = None

    def fixed_size(self, plan, h=None) -> "BaseMetric":
        """This metric, or an exact equivalent whose decoding under ``plan`` on ``h`` (default: its own
        tree) has no size that depends on the data, for graphs (torch.export, ONNX, CUDA graphs).

        Here: itself.  Metrics whose decoder prunes candidates (as many entries as pairs survive) return
        a copy that scores every node instead.  Not called for ``data_dependent_sizes`` metrics.
        """
        return self

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "has_decoder" not in cls.__dict__:  # a class may say so itself
            cls.has_decoder = cls._decode_default is not HierarchyComponent._decode_default

    def _posterior_with(self, leaf_probs, pred, convert, validate, from_logits=False, normalize=False):
        """``(posterior, pred)`` with ``pred`` converted by ``convert(pred, device) -> (tensor, RangeCheck|None)``
        onto the probabilities' device, its range check fused into the probabilities' check (one host sync)."""
        if isinstance(leaf_probs, Posterior):
            post = self._posterior(leaf_probs, validate, from_logits, normalize)
            pred, check = convert(pred, post.device)
            check_ranges([check], validate)
            return post, pred
        x = as_tensor(leaf_probs, "leaf_probs")
        pred, check = convert(pred, x.device)
        post = self._posterior(x, validate, from_logits, normalize, extra_checks=[check], defer_check=False)
        return post, pred

    def decode(self, leaf_probs, *, from_logits: bool | str = False, normalize: bool = False,
               validate: bool | None = None, chunk_size: int | None = None, within=None, certify: bool = False):
        """The Bayes-optimal prediction for this metric.

        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`);
        ``from_logits`` (False, True or "auto") and ``normalize`` as in
        :meth:`HierarchyComponent.decode <hdecode_torch.core.component.HierarchyComponent.decode>`.
        Returns (B,) int64 node ids (leaf and node metrics) or (B, N) bool ancestor-closed node sets
        containing the root (set metrics); a 1-D input gives an unbatched output.  Large batches are
        decoded in chunks bounded by the memory budget.  ``within``: (B,) int64 node ids the answers
        must lie under, each row decoded optimally for this metric on that node's subtree.

        ``certify=True`` (top-k inputs only): returns ``(pred, certified, regret_bound)``, (B,) bool whether
        pred is optimal under every completion the list is consistent with (each unlisted leaf at most the
        row's smallest listed value, their total the missing mass) and (B,) float64 an upper bound on the
        expected-score regret over those completions (0 where certified); derivation in
        :mod:`hdecode_torch.kernels.certificate`.
        """
        if not self.has_decoder:
            raise NotImplementedError(
                f"`{self.name}` has no Bayes-optimal decoder; score a heuristic decoder's predictions with it")
        topk = TopK.of(leaf_probs)
        if topk is not None:
            return self._decode_top_k(topk, from_logits, normalize, validate, chunk_size, within, certify)
        if certify:
            raise ValueError("Expected a top-k input (`probs.topk(k)` or hd.TopK) with `certify=True`, but got dense "
                             "probabilities: their decision is exact, there is no unknown completion to certify")
        return super().decode(leaf_probs, from_logits=from_logits, normalize=normalize, validate=validate,
                              chunk_size=chunk_size, within=within)

    # ------------------------------------------------------------------ top-k inputs
    #: Whether ``decode``/``expected`` accept a top-k list; metrics that do give ``_decode_topk(ct)``
    #: and ``_expected_topk(ct, pred)`` on a :class:`~hdecode_torch.core.topk.CompletedTopK`.
    accepts_topk: bool = False

    def _complete_top_k(self, topk: TopK, from_logits, normalize, validate, within=None) -> CompletedTopK:
        """The checked :class:`CompletedTopK` of a top-k input, or the error saying why it cannot be decoded."""
        if not self.accepts_topk:
            raise no_top_k_decoder(f"`{self.name}`")
        if from_logits is not False or normalize:
            raise ValueError("`leaf_probs` is a top-k list of probabilities: from_logits and normalize do not apply "
                             "(take the top-k of the softmax)")
        if within is not None:
            raise ValueError("`within` is not supported with a top-k input: pass the dense (B, L) probabilities")
        return CompletedTopK(self.hierarchy, topk, self._validate(validate))

    def _decode_top_k(self, topk, from_logits, normalize, validate, chunk_size, within, certify=False):
        """decode() of a top-k list: the completed distribution's decision, on the support (k = L: the dense
        table, so the dense answer bit for bit); with ``certify``, its certificate per chunk of rows."""
        ct = self._complete_top_k(topk, from_logits, normalize, validate, within)
        chunks = ct.chunks(chunk_size)
        if ct.k == ct.h.num_leaves:
            out = self.decode(topk.completed(ct.h.num_leaves), validate=False, chunk_size=chunk_size)
            if self.kind == "set":  # a top-k input's sets are sparse, whatever k
                out = out.to_sparse().coalesce()
            if not certify:
                return out
            if self.kind == "set":  # sparse sets have no slices: each chunk's rows selected
                sets = batched_sparse(out, ct.h.num_nodes)
                parts = [self._certify_topk(ct.chunk(a, b), sets.index_select(0, torch.arange(a, b, device=sets.device))
                                            .coalesce()) for a, b in chunks]
                certified, bound = (torch.cat(t) for t in zip(*parts))
                return (out, certified[0], bound[0]) if ct.unbatched else (out, certified, bound)
            out = out.reshape(-1)
            parts = [(out[a:b], *self._certify_topk(ct.chunk(a, b), out[a:b])) for a, b in chunks]
        elif not certify:
            out = torch.cat([self._decode_topk(ct.chunk(a, b)) for a, b in chunks])
            if out.layout == torch.sparse_coo:
                out = out.coalesce()
            if ct.unbatched:
                return unbatched_sparse(out) if out.layout == torch.sparse_coo else out[0]
            return out
        else:
            parts = [self._decode_certified_topk(ct.chunk(a, b)) for a, b in chunks]
        out, certified, bound = (torch.cat(t) for t in zip(*parts))
        if out.layout == torch.sparse_coo:
            out = out.coalesce()
            return (unbatched_sparse(out), certified[0], bound[0]) if ct.unbatched else (out, certified, bound)
        return (out[0], certified[0], bound[0]) if ct.unbatched else (out, certified, bound)

    def _decode_certified_topk(self, ct: CompletedTopK):
        """``(pred, certified, regret_bound)`` of a top-k chunk (a metric may share work between the two)."""
        pred = self._decode_topk(ct)
        return (pred, *self._certify_topk(ct, pred))

    def _certify_topk(self, ct: CompletedTopK, pred: torch.Tensor):
        """``(certified (B,) bool, regret_bound (B,) float64)`` of the top-k decision pred: (B,) int64 node ids,
        or a set metric's coalesced sparse COO bool (B, N) sets."""
        raise ValueError(f"`{self.name}` gives no certificate of a top-k decision (`certify=True`)")

    def _decode_topk(self, ct: CompletedTopK) -> torch.Tensor:
        raise NotImplementedError

    def _expected_topk(self, ct: CompletedTopK, pred: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class NodeMetric(BaseMetric):
    """A metric of a single predicted node (leaf metrics are node metrics too).

    Subclasses give ``_values(h, pred, target)`` (float64 values of broadcast int64 ids) and, where
    they can, ``expected_table(post)`` ((N, B) expected value of predicting each node, computed
    structurally; by default the product of the dense (N, L) matrix of values with the probabilities,
    O(B·N·L)); the default decoder takes the best row of that table (ties: the deepest node, then the
    smallest id; leaf metrics: the smallest leaf id).
    """

    kind = "node"

    def _node_ids(self, pred, device=None):
        t = as_tensor(pred, "pred")
        if t.dtype == torch.bool:
            raise TypeError(f"`{self.name}` scores single nodes: expected `pred` to be int64 node ids, but got a bool "
                            "set (use a set metric such as hf_beta for node sets)")
        n = self.hierarchy.num_nodes
        t = as_node_ids(t, n, device=device)
        return t, RangeCheck(t, n, "pred", "node ids")

    def __call__(self, pred, target, *, validate: bool | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """pred: (B,) or () int64 node ids; target: (B,) or () int64 leaf ids (broadcast against each other).

        Returns (B,) (or ()) on ``pred``'s device, computed in float64 and returned in ``dtype`` (default:
        torch's default dtype, float32 unless changed).
        """
        validate = self._validate(validate)
        dtype = value_dtype(dtype)
        pred, pred_check = self._node_ids(pred)
        h = self.hierarchy.to(pred.device)
        target = as_targets(target, h.num_leaves, pred.shape[0] if pred.dim() else None, device=pred.device)
        check_ranges([pred_check, RangeCheck(target, h.num_leaves, "target", "leaf ids")], validate)
        pred, target = torch.broadcast_tensors(pred, target)
        return self._values(h, pred, target).to(dtype)

    def expected(self, leaf_probs, pred, *, from_logits: bool | str = False, normalize: bool = False,
                 validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Expected value ``Σ_l p(l) m(pred, l)``.

        leaf_probs: (B, L) or (L,) float (or a :class:`~hdecode_torch.Posterior`), with ``from_logits``
        and ``normalize`` as in ``decode``; pred: (B,) or () int64 node ids (moved to the probabilities'
        device).  Returns (B,) (or ()) in the compute dtype (float64 kept, float32 for every other
        floating dtype).
        """
        validate = self._validate(validate)
        topk = TopK.of(leaf_probs)
        if topk is not None:
            return self._expected_top_k(topk, pred, from_logits, normalize, validate)
        post, pred = self._posterior_with(leaf_probs, pred, self._node_ids, validate, from_logits, normalize)
        if pred.dim() != (0 if post.unbatched else 1) or (pred.dim() == 1 and pred.shape[0] != post.batch_size):
            raise ValueError(f"Expected `pred` to have shape {(post.batch_size,) if not post.unbatched else ()} "
                             f"(one node id per sample), but got {tuple(pred.shape)}")
        flat = pred.reshape(-1)
        chunks = self._chunks(post, chunk_size, self._expected_bytes_per_sample(post.h, post.plan))
        out = torch.cat([self.expected_table(post.chunk(a, b)).gather(0, flat[None, a:b])[0]
                         for a, b in chunks]).to(post.dtype)  # a user's table may differ
        return out[0] if post.unbatched else out

    def _expected_top_k(self, topk, pred, from_logits, normalize, validate):
        """expected() on a top-k list: Σ_l q(l) m(pred, l) for the completed q, in the values' compute dtype."""
        ct = self._complete_top_k(topk, from_logits, normalize, validate)
        pred, check = self._node_ids(pred, ct.values.device)
        if pred.dim() != (0 if ct.unbatched else 1) or (pred.dim() == 1 and pred.shape[0] != ct.batch_size):
            raise ValueError(f"Expected `pred` to have shape {(ct.batch_size,) if not ct.unbatched else ()} "
                             f"(one node id per sample), but got {tuple(pred.shape)}")
        check_ranges([check], validate)
        if ct.k == ct.h.num_leaves:
            return self.expected(topk.completed(ct.h.num_leaves), pred, validate=False)
        out = self._expected_topk(ct, pred.reshape(-1)).to(ct.dtype)
        return out[0] if ct.unbatched else out

    def _expected_bytes_per_sample(self, h, plan) -> int:
        """Bytes of temporaries per sample of :meth:`expected_table` under ``plan`` (what ``expected``
        chunks by; a decode may search differently)."""
        return self._bytes_per_sample(h, plan)

    def _decode_default(self, post: Posterior) -> torch.Tensor:
        table = self.expected_table(post)
        if self.kind == "leaf":
            return argbest(post.h, table[: post.h.num_leaves], self.higher_is_better, prefer_deep=False)
        return argbest(post.h, table, self.higher_is_better)

    def dense_matrix(self) -> torch.Tensor:
        """(N, L) float64 value of every (node, leaf) pair — O(N·L) memory, for small trees and tests."""
        h = self.hierarchy
        nodes = torch.arange(h.num_nodes, device=h.device)
        leaves = torch.arange(h.num_leaves, device=h.device)
        return self._values(h, nodes[:, None].expand(-1, h.num_leaves), leaves[None, :].expand(h.num_nodes, -1))

    def _values(self, h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """(N, B) expected value of predicting each node: ``dense_matrix() @ probs.T`` here (the dense
        matrix is cached on the probabilities' copy of the hierarchy, built on the metric's); the built-in
        metrics compute it structurally (no N×L matrix)."""
        h = post.h
        # Keyed by the class itself: two classes may share a name (a qualname omits the module).
        matrix = h.cached((type(self), "values", tuple(sorted(self.params.items())), post.dtype),
                          lambda: self.dense_matrix().to(device=post.device, dtype=post.dtype))
        return matrix @ post.probs.t()


class SetMetric(BaseMetric):
    """A metric of a predicted node set, scored through its ancestor closure h⁺.

    Subclasses give ``_from_counts(inter, size, ysize)`` (the value from |h⁺ ∩ y⁺|, |h⁺| and |y⁺|, all
    float64) and ``_expected_sets(post, sets)`` ((B,) expected values of closed (B, N) bool sets).
    """

    kind = "set"
    higher_is_better = True

    def _sets_or_ids(self, pred, device=None):
        """pred as (B, N)/(N,) bool sets (dense or sparse COO) or (B,)/() int64 node ids on ``device``, and its
        range check."""
        n = self.hierarchy.num_nodes
        if is_sparse_sets(pred):
            return check_sparse_sets(pred, n, device=device), None
        t = as_tensor(pred, "pred")
        if t.dtype == torch.bool:
            return check_node_sets(t, n, device=device), None
        t = as_node_ids(t, n, device=device)
        return t, RangeCheck(t, n, "pred", "node ids")

    def _closed(self, t: torch.Tensor) -> torch.Tensor:
        """Ancestor closure of converted sets, or the sets A(n) of node ids (same batch shape)."""
        h = self.hierarchy.to(t.device)
        if t.dtype == torch.bool:
            batched = t.dim() == 2
            sets = ancestor_closure(h, t if batched else t[None])
            return sets if batched else sets[0]
        if t.dim() == 0:
            return ancestor_mask(h, t[None])[0]
        return ancestor_mask(h, t)

    def __call__(self, pred, target, *, validate: bool | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """pred: (B, N) or (N,) bool node sets, or (B,) or () int64 node ids; target: (B,) or () int64.

        A single prediction is broadcast against a batch of targets and vice versa.  Returns (B,) (or ())
        on ``pred``'s device, computed in float64 and returned in ``dtype`` (default: torch's default
        dtype, float32 unless changed).
        """
        validate = self._validate(validate)
        dtype = value_dtype(dtype)
        t, check = self._sets_or_ids(pred)
        h = self.hierarchy.to(t.device)
        unbatched = t.dim() == (1 if t.dtype == torch.bool else 0)
        batch = None if unbatched else t.shape[0]
        target = as_targets(target, h.num_leaves, batch, device=t.device)
        check_ranges([check, RangeCheck(target, h.num_leaves, "target", "leaf ids")], validate)
        if is_sparse_sets(t):
            return self._sparse_values(h, t, target, unbatched).to(dtype)
        if t.dtype != torch.bool:
            # a node n is the set A(n): |A(n)| = d(n) + 1 and |A(n) ∩ A(y)| = d(LCA(n, y)) + 1, the counts of its
            # (B, N) mask without building it (O(B·D) instead of O(B·N): a top-k run scores heuristics' nodes)
            node, tgt = torch.broadcast_tensors(t, target)
            size = h.depth[node].to(torch.float64) + 1
            inter = lca_depth(h, node, tgt).to(torch.float64) + 1
            return self._from_counts(inter, size, h.depth[tgt].to(torch.float64) + 1).to(dtype)
        sets = self._closed(t)
        sets2 = sets[None] if unbatched else sets
        if unbatched and target.dim() == 1:
            sets2 = sets2.expand(target.shape[0], -1)
        tgt = target.reshape(-1).expand(sets2.shape[0]) if target.dim() == 0 else target
        size = sets2.sum(1).to(torch.float64)
        inter = path_counts(h, sets2, tgt).to(torch.float64)
        ydepth = h.depth[tgt].to(torch.float64)
        out = self._from_counts(inter, size, ydepth + 1).to(dtype)
        return out[0] if unbatched and target.dim() == 0 else out

    def _sparse_values(self, h, sets, target, unbatched):
        """Values of sparse COO sets (checked, coalesced) against (B,) or () targets, in float64."""
        sets2 = batched_sparse(sets, h.num_nodes)
        if unbatched and target.dim() == 1:
            idx = sets2.indices()
            b = target.shape[0]
            rows = torch.arange(b, device=idx.device).repeat_interleave(idx.shape[1])
            sets2 = sparse_node_sets(rows, idx[1].repeat(b), b, h.num_nodes)
        elif not unbatched and target.dim() == 0:
            target = target.expand(sets2.shape[0])
        tgt = target.reshape(-1)
        inter, size = sparse_path_counts(h, sparse_closure(h, sets2), tgt)
        out = self._from_counts(inter.to(torch.float64), size.to(torch.float64),
                                h.depth[tgt].to(torch.float64) + 1)
        return out[0] if unbatched and target.dim() == 0 else out

    def expected(self, leaf_probs, pred, *, from_logits: bool | str = False, normalize: bool = False,
                 validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Expected value; leaf_probs (B, L) or (L,) float (or a Posterior; ``from_logits`` and
        ``normalize`` as in ``decode``), or a top-k list (``probs.topk(k)`` or a TopK: the value under its
        completion, for the metrics whose decoder takes one); pred (B, N) bool sets, dense or sparse COO, or
        (B,) int64 nodes ((N,) or () for a single distribution).  Returns (B,) (or ()) in the compute dtype
        (float64 kept, float32 for every other floating dtype)."""
        validate = self._validate(validate)
        topk = TopK.of(leaf_probs)
        if topk is not None:
            return self._expected_top_k(topk, pred, from_logits, normalize, validate)
        if is_sparse_sets(pred):  # a dense input's table is B × N already
            pred = check_sparse_sets(pred, self.hierarchy.num_nodes).to_dense()
        post, t = self._posterior_with(leaf_probs, pred, self._sets_or_ids, validate, from_logits, normalize)
        unbatched = t.dim() == (1 if t.dtype == torch.bool else 0)
        if unbatched != post.unbatched or (not unbatched and t.shape[0] != post.batch_size):
            want = (f"({self.hierarchy.num_nodes},) or ()" if post.unbatched
                    else f"({post.batch_size}, {self.hierarchy.num_nodes}) or ({post.batch_size},)")
            raise ValueError(f"Expected `pred` to have shape {want} (one prediction per sample), but got "
                             f"{tuple(t.shape)}")
        sets = self._closed(t)
        sets2 = sets[None] if sets.dim() == 1 else sets
        out = torch.cat([self._expected_sets(post.chunk(a, b), sets2[a:b])
                         for a, b in self._chunks(post, chunk_size)]).to(post.dtype)  # a user's values may differ
        return out[0] if post.unbatched else out

    def _expected_top_k(self, topk, pred, from_logits, normalize, validate):
        """expected() on a top-k list: Σ_l q(l) m(pred, l) for the completed q, in the values' compute dtype;
        the metric's ``_expected_topk(ct, sets)`` reads closed coalesced sparse (B, N) sets."""
        ct = self._complete_top_k(topk, from_logits, normalize, validate)
        t, check = self._sets_or_ids(pred, ct.values.device)
        unbatched = t.dim() == (1 if t.dtype == torch.bool else 0)
        if unbatched != ct.unbatched or (not unbatched and t.shape[0] != ct.batch_size):
            want = (f"({self.hierarchy.num_nodes},) or ()" if ct.unbatched
                    else f"({ct.batch_size}, {self.hierarchy.num_nodes}) or ({ct.batch_size},)")
            raise ValueError(f"Expected `pred` to have shape {want} (one prediction per sample), but got "
                             f"{tuple(t.shape)}")
        if check is not None:
            check_ranges([check], validate)
        if ct.k == ct.h.num_leaves:
            dense = t.to_dense() if is_sparse_sets(t) else t
            return self.expected(topk.completed(ct.h.num_leaves), dense, validate=False)
        if unbatched and not is_sparse_sets(t):
            t = t[None]
        sets = sparse_closure(ct.h, as_sparse_sets(ct.h, t))
        out = self._expected_topk(ct, sets).to(ct.dtype)
        return out[0] if ct.unbatched else out

    def _from_counts(self, inter, size, ysize):
        raise NotImplementedError

    def _expected_sets(self, post: Posterior, sets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} declares no expected value of a set")
