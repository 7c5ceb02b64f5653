"""What every hierarchical metric offers: values, expected values, Bayes-optimal decoding."""

from __future__ import annotations

import torch

from ..kernels.ancestry import ancestor_closure, ancestor_mask, argbest
from ..kernels.chunking import chunk_ranges
from ..kernels.validation import check_node_ids, check_node_sets, check_targets
from .posterior import Posterior

__all__ = ["BaseMetric", "NodeMetric", "SetMetric"]


class BaseMetric:
    """A metric comparing a prediction with a target leaf (SPEC §2).

    - ``m(pred, target) -> (B,)`` float64 per-sample values;
    - ``m.expected(leaf_probs, pred) -> (B,)`` ``Σ_l p(l) m(pred, l)``, in the compute dtype;
    - ``m.decode(leaf_probs)`` the Bayes-optimal prediction (SPEC §3 formats);
    - ``m.higher_is_better``, ``m.kind`` (``"leaf"``, ``"node"`` or ``"set"``), ``m.name``, ``m.params``.
    """

    name: str = ""
    kind: str = "node"
    higher_is_better: bool = False
    description: str = ""

    def __init__(self, hierarchy, *, validate: bool = True):
        from ..hierarchy import Hierarchy

        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        self.hierarchy = hierarchy
        self.validate = validate

    @property
    def params(self) -> dict:
        return {}

    @property
    def key(self) -> str:
        """``name[param=value,...]``, the label used in tables and JSON."""
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v:g}' for k, v in self.params.items())}]"

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({self.hierarchy!r}{args})"

    # Bytes of temporaries per sample of `_expected_table`; used to chunk batches.
    def _bytes_per_sample(self, h) -> int:
        return 8 * h.num_nodes * 4

    def _posterior(self, leaf_probs, validate) -> Posterior:
        return Posterior.of(self.hierarchy, leaf_probs, validate=self.validate if validate is None else validate)

    def _chunks(self, post: Posterior, chunk_size=None):
        return chunk_ranges(post.batch_size, self._bytes_per_sample(post.h), chunk_size)

    def _target(self, target, batch, device, validate):
        return check_targets(target, self.hierarchy.num_leaves, batch, validate=validate, device=device)


class NodeMetric(BaseMetric):
    """A metric of a single predicted node (leaf metrics are node metrics too)."""

    kind = "node"

    def __call__(self, pred, target, *, validate: bool | None = None) -> torch.Tensor:
        """pred: (B,) int64 node ids; target: (B,) int64 leaf ids.  Returns (B,) float64."""
        validate = self.validate if validate is None else validate
        h = self.hierarchy
        if isinstance(pred, torch.Tensor) and pred.dtype == torch.bool:
            raise TypeError(f"`{self.name}` scores single nodes: expected `pred` to be int64 node ids, but got a bool set")
        pred = check_node_ids(pred, h.num_nodes, validate=validate)
        h = h.to(pred.device)
        target = self._target(target, pred.shape[0] if pred.dim() else None, pred.device, validate)
        pred, target = torch.broadcast_tensors(pred, target)
        return self._values(h, pred, target)

    def expected(self, leaf_probs, pred, *, validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Expected value ``Σ_l p(l) m(pred, l)``.

        leaf_probs: (B, L) or (L,) float (or a :class:`Posterior`); pred: (B,) or () int64 node ids.
        Returns (B,) (or ()) in the compute dtype (float32; float64 kept).
        """
        validate = self.validate if validate is None else validate
        post = self._posterior(leaf_probs, validate)
        pred = check_node_ids(pred, self.hierarchy.num_nodes, validate=validate, device=post.device)
        if pred.dim() != (0 if post.unbatched else 1) or (pred.dim() == 1 and pred.shape[0] != post.batch_size):
            raise ValueError(f"Expected `pred` to have shape {(post.batch_size,) if not post.unbatched else ()}, "
                             f"but got {tuple(pred.shape)}")
        flat = pred.reshape(-1)
        out = torch.cat([self.expected_table(post.chunk(a, b)).gather(0, flat[None, a:b])[0]
                         for a, b in self._chunks(post, chunk_size)])
        return out[0] if post.unbatched else out

    def decode(self, leaf_probs, *, validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Bayes-optimal prediction: the node (leaf, for leaf metrics) of best expected value.

        leaf_probs: (B, L) or (L,) float (or a :class:`Posterior`).  Returns (B,) (or ()) int64
        node ids.  Large batches are decoded in chunks bounded by the memory budget.  Exact
        ties go to the deepest node, then the smallest id (leaf metrics: the smallest id).
        """
        post = self._posterior(leaf_probs, validate)
        parts = [self._decode(post.chunk(a, b)) for a, b in self._chunks(post, chunk_size)]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out[0] if post.unbatched else out

    def _decode(self, post: Posterior) -> torch.Tensor:
        """Default: exhaustive over the structural table of every node (leaves for leaf metrics)."""
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

    # --- to implement
    def _values(self, h, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def expected_table(self, post: Posterior) -> torch.Tensor:
        """(N, B) expected value of predicting each node, computed structurally (no N×L matrix)."""
        raise NotImplementedError


class SetMetric(BaseMetric):
    """A metric of a predicted node set, scored through its ancestor closure."""

    kind = "set"
    higher_is_better = True

    def _as_closed_sets(self, h, pred, validate) -> torch.Tensor:
        if isinstance(pred, torch.Tensor) and pred.dtype == torch.bool:
            sets = check_node_sets(pred, h.num_nodes)
            h = h.to(sets.device)
            batched = sets.dim() == 2
            sets = ancestor_closure(h, sets if batched else sets[None])
            return sets if batched else sets[0]
        nodes = check_node_ids(pred, h.num_nodes, validate=validate)
        h = h.to(nodes.device)
        if nodes.dim() == 0:
            return ancestor_mask(h, nodes[None])[0]
        return ancestor_mask(h, nodes)

    def __call__(self, pred, target, *, validate: bool | None = None) -> torch.Tensor:
        """pred: (B, N) bool node sets or (B,) int64 node ids; target: (B,) int64.  Returns (B,) float64."""
        validate = self.validate if validate is None else validate
        sets = self._as_closed_sets(self.hierarchy, pred, validate)
        h = self.hierarchy.to(sets.device)
        unbatched = sets.dim() == 1
        sets2 = sets[None] if unbatched else sets
        target = self._target(target, sets2.shape[0] if not unbatched else None, sets.device, validate)
        t = target.reshape(-1).expand(sets2.shape[0]) if target.dim() == 0 else target
        if t.shape[0] != sets2.shape[0]:
            raise ValueError(f"Expected `target` to have {sets2.shape[0]} entries, but got {t.shape[0]}")
        size = sets2.sum(1).to(torch.float64)
        padded = torch.cat([sets2, sets2.new_zeros(sets2.shape[0], 1)], 1)
        inter = padded.gather(1, h.ancestors[t]).sum(1).to(torch.float64)
        ydepth = h.depth[t].to(torch.float64)
        out = self._from_counts(inter, size, ydepth + 1)
        return out[0] if unbatched and target.dim() == 0 else out

    def expected(self, leaf_probs, pred, *, validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Expected value; leaf_probs (B, L) float; pred (B, N) bool sets or (B,) int64 nodes.  Returns (B,)."""
        validate = self.validate if validate is None else validate
        post = self._posterior(leaf_probs, validate)
        sets = self._as_closed_sets(self.hierarchy, pred, validate).to(post.device)
        sets2 = sets[None] if sets.dim() == 1 else sets
        if sets2.shape[0] != post.batch_size:
            raise ValueError(f"Expected `pred` to have {post.batch_size} rows, but got {sets2.shape[0]}")
        out = torch.cat([self._expected_sets(post.chunk(a, b), sets2[a:b]) for a, b in self._chunks(post, chunk_size)])
        return out[0] if post.unbatched else out

    def decode(self, leaf_probs, *, validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Bayes-optimal node set.  leaf_probs: (B, L) or (L,) float (or a Posterior).

        Returns (B, N) (or (N,)) bool, ancestor-closed, containing the root.
        """
        post = self._posterior(leaf_probs, validate)
        parts = [self._decode(post.chunk(a, b)) for a, b in self._chunks(post, chunk_size)]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out[0] if post.unbatched else out

    def _decode(self, post: Posterior) -> torch.Tensor:
        raise NotImplementedError(
            f"No Bayes-optimal decoder for `{self.name}`: SPEC §4.1 defines exact rules for hf_beta and hamming only")

    def _from_counts(self, inter, size, ysize):
        raise NotImplementedError

    def _expected_sets(self, post: Posterior, sets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
