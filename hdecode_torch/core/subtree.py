"""Decoding within a known subtree: ``decode(leaf_probs, within=nodes)``.

When part of the answer is already known ("this is a bird"), row i's answer must lie under the node
``within[i]``.  The row is decoded *exactly as if that node's subtree were the whole tree*:

- its leaf probabilities are restricted to the leaves under ``w = within[i]`` and renormalised,
  ``p'(l) = p(l) / p(w)`` (the posterior given that the target lies under w);
- the decoder is the same component with the same parameters, rebuilt on the subtree compiled as a
  :class:`~hdecode_torch.Hierarchy` of its own: depths, information ``log(L'/|L(n)|)``, leaf counts and
  set sizes are the subtree's (w is its root, at depth 0), so every metric's optimal decoder is
  Bayes-optimal for that metric measured on the subtree;
- the answer comes back in the ids of the whole tree: a node id, or for set decoders an
  ancestor-closed (B, N) node set that also holds w's ancestors (certain once the target is known to
  lie under w), so that it remains a valid set prediction of the whole tree.

The subtree keeps the relative order of the ids (leaves ascending, then internal nodes ascending), so
every tie broken by "the smallest id" falls the same way on the subtree as on the whole tree.

``within[i]`` = the root means no restriction (the plain decoder on those rows); a leaf has one
possible answer, itself (a one-node tree: every decoder answers it).  A row with zero probability
under its ``within`` node has no posterior to renormalise: an error naming the row.  A decoder whose
parameters do not suit the subtree (``information_threshold`` above the subtree's largest
information log L') raises the error its constructor raises on that subtree, naming the node.

Cost: one loop over the *distinct* ``within`` nodes of the batch (not over rows), each group of rows
decoded by one batched call on its subtree; the subtrees are compiled once per tree and device and
kept in a bounded cache on the hierarchy (:func:`subtree`).  Two host reads besides the decoders'
own: the distinct nodes with their counts, and the zero-mass check.
"""

from __future__ import annotations

import numbers
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch

from ..hierarchy import Hierarchy
from .index_checks import as_node_ids

__all__ = ["Subtree", "subtree", "as_within", "split_within", "decode_within", "SUBTREE_CACHE_ENTRIES",
           "SUBTREE_CACHE_NODES"]

#: The subtree cache of a hierarchy keeps at most this many subtrees ...
SUBTREE_CACHE_ENTRIES = 256
#: ... holding at most this many times the tree's node count in all (the least recently used go first).
SUBTREE_CACHE_NODES = 4


@dataclass(frozen=True, eq=False)
class Subtree:
    """The subtree under one node of a tree, compiled on its own, with its id maps.

    Attributes:
        hierarchy: the subtree as a :class:`~hdecode_torch.Hierarchy` (canonical ids: its L' leaves
            ``0..L'-1``, then its internal nodes; its root is ``root``), with the parent tree's names
            and labels, on the parent's device.
        root: the subtree's root, an id of the parent tree.
        nodes: (N',) int64 the parent tree's id of each subtree node (``nodes[k]`` is subtree node k),
            ascending; ``nodes[:L']`` are the leaves under ``root``, ascending.
        path: (d + 1,) int64 the parent tree's root path of ``root``, from the root down to it (d its depth).
    """

    hierarchy: Hierarchy | None
    root: int
    nodes: torch.Tensor
    path: torch.Tensor

    @property
    def num_leaves(self) -> int:
        return self.hierarchy.num_leaves if self.hierarchy is not None else 1

    @property
    def leaves(self) -> torch.Tensor:
        """(L',) int64 the parent tree's ids of the subtree's leaves, ascending (its columns, in order)."""
        return self.nodes[: self.num_leaves]


def _build(h: Hierarchy, node: int) -> Subtree:
    """O(N' log N') on the host (the tree's compiled arrays), then the tensors moved to ``h.device``."""
    t = h._tree
    start, size = int(t.pos[node]), int(t.size[node])
    order = np.empty(h.num_nodes, dtype=np.int64)
    order[t.pos] = np.arange(h.num_nodes)
    nodes = np.sort(order[start:start + size])  # leaves first: they are 0..L-1 in the parent tree too
    path = [node]
    while t.parent[path[-1]] >= 0:
        path.append(int(t.parent[path[-1]]))
    path = torch.as_tensor(path[::-1], dtype=torch.long, device=h.device)
    ids = torch.as_tensor(nodes, dtype=torch.long, device=h.device)
    if size == 1:  # a leaf: a one-node tree, which Hierarchy refuses; its one answer needs no decoder
        return Subtree(None, node, ids, path)
    parent = np.searchsorted(nodes, np.maximum(t.parent[nodes], 0))
    parent[nodes == node] = -1
    names, labels = h.names, h.labels
    sub = Hierarchy(parent, [names[i] for i in nodes], None if labels is None else [labels[i] for i in nodes],
                    device=h.device)
    return Subtree(sub, node, ids, path)


def subtree(h: Hierarchy, node: int) -> Subtree:
    """The subtree of ``h`` under ``node`` (an int node id), compiled once and cached on ``h``.

    The cache is per hierarchy and device, least recently used first out, bounded by
    ``SUBTREE_CACHE_ENTRIES`` subtrees and ``SUBTREE_CACHE_NODES`` × N nodes in all.  A leaf gives a
    Subtree without a hierarchy (``hierarchy=None``): one node, its one possible answer.
    """
    node = int(node)
    if not 0 <= node < h.num_nodes:
        raise ValueError(f"Expected a node id in 0..{h.num_nodes - 1}, but got {node}")
    cache: OrderedDict = h.cached("subtree.cache", OrderedDict)
    if node in cache:
        cache.move_to_end(node)
        return cache[node]
    sub = cache[node] = _build(h, node)
    total = sum(s.nodes.numel() for s in cache.values())
    while len(cache) > 1 and (len(cache) > SUBTREE_CACHE_ENTRIES or total > SUBTREE_CACHE_NODES * h.num_nodes):
        _, old = cache.popitem(last=False)
        total -= old.nodes.numel()
    return sub


# --------------------------------------------------------------------------- decoding
def as_within(within, post) -> torch.Tensor:
    """(B,) int64 node ids on the probabilities' device: one per row, or one for every row."""
    if isinstance(within, (numbers.Integral, np.integer)) and not isinstance(within, (bool, np.bool_)):
        within = torch.tensor(int(within))
    w = as_node_ids(within, post.h.num_nodes, name="within", device=post.device)
    b = post.batch_size
    if post.unbatched and w.dim() != 0:
        raise ValueError(f"Expected `within` to be a single node id for a single (L,) row, but got shape "
                         f"{tuple(w.shape)}")
    if w.dim() == 0:
        return w.expand(b)
    if w.shape[0] != b:
        raise ValueError(f"Expected `within` to have shape ({b},), one node id per row, but got {tuple(w.shape)}")
    return w


def _row_of(w: torch.Tensor, node: int) -> int:
    return int((w == node).nonzero()[0, 0])


def _rebuilt(component, sub: Subtree):
    try:
        with warnings.catch_warnings():
            # The component warned about its parameters when it was built; the same parameters on the
            # subtree would only repeat it, once per call and node.
            warnings.simplefilter("ignore")
            return component.on_subtree(sub)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"Cannot decode within node {sub.root} ({sub.num_leaves} leaves under it) with "
                        f"{component.key}: {exc}") from None


def _answers(sub: Subtree, pred: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """The subtree's predictions in the whole tree's ids: (b,) node ids, or (b, N) bool sets with the
    ancestors of the subtree's root."""
    if pred.dtype != torch.bool:
        return sub.nodes[pred]
    out = pred.new_zeros((pred.shape[0], num_nodes))
    out[:, sub.nodes] = pred
    out[:, sub.path] = True
    return out


def split_within(post, within) -> tuple[torch.Tensor, list[tuple[Subtree | None, torch.Tensor, torch.Tensor]]]:
    """The batch's rows grouped by their ``within`` node, each group restricted to its subtree.

    post: the batch's :class:`~hdecode_torch.Posterior` on the whole tree (its input check is read
    here, before anything else); within: (B,) int node ids, or one id for every row.  Returns
    ``(w, groups)``: w (B,) int64 the node of each row; one ``(sub, rows, probs)`` per distinct node,
    ascending: its :class:`Subtree` (None for the root), the (b,) int64 rows under it in increasing
    order, and their (b, L') probabilities on the subtree's leaves, renormalised (the root's rows:
    (b, L) as they are).  Raises a ``ValueError`` naming the first row whose node is out of range or
    holds no probability.  Two host reads.
    """
    h, probs = post.h, post.probs
    w = as_within(within, post)
    post.settle()  # a bad input explains a failure better than anything below
    values, counts = torch.unique(w, return_counts=True)
    nodes, counts = values.tolist(), counts.tolist()  # one host read
    for node in nodes[:1] + nodes[-1:]:  # sorted: out of range only at the ends
        if not 0 <= node < h.num_nodes:
            raise ValueError(f"Expected `within` in 0..{h.num_nodes - 1} (node ids), but got {node} at row "
                             f"{_row_of(w, node)}")
    groups, masses = [], []
    for node, rows in zip(nodes, torch.argsort(w, stable=True).split(counts)):
        if node == h.root:
            groups.append((None, rows, probs.index_select(0, rows)))
            continue
        sub = subtree(h, node)
        x = probs.index_select(0, rows).index_select(1, sub.leaves)
        mass = x.sum(1, keepdim=True)
        masses.append(mass[:, 0])
        groups.append((sub, rows, x / mass))
    if masses:
        zero = torch.cat(masses) <= 0
        if bool(zero.any()):  # one host read
            row = int(torch.cat([rows for sub, rows, _ in groups if sub is not None])[zero].min())
            raise ValueError(f"Expected the leaf probabilities of row {row} to have positive mass under its "
                             f"`within` node {int(w[row])}, but they sum to 0 there: nothing to renormalise")
    return w, groups


def decode_within(component, post, within, chunk_size=None) -> torch.Tensor:
    """``component.decode(post, within=within)``: each row decoded on the subtree of its ``within`` node.

    post: the batch's :class:`~hdecode_torch.Posterior` on the whole tree; within: (B,) int64 node ids
    (or one id for every row; ``()`` for a single row).  Returns what ``component.decode`` returns for
    a (B, L) batch, in the whole tree's ids (module docstring): (B,) int64 node ids or (B, N) bool node
    sets, batched even for a single row.
    """
    b, n = post.batch_size, post.h.num_nodes
    w, groups = split_within(post, within)
    if len(groups) <= 1 and (not groups or groups[0][0] is None):  # no restriction: the batch as it is
        return component.decode(post.chunk(0, b), validate=False, chunk_size=chunk_size)
    out = None
    for sub, rows, x in groups:
        if sub is None:
            got = component.decode(x, validate=False, chunk_size=chunk_size)
        elif sub.hierarchy is None:  # a leaf: its one answer
            one = torch.ones(rows.numel(), 1, dtype=torch.bool, device=w.device)
            got = _answers(sub, one if component.kind == "set" else torch.zeros_like(rows), n)
        else:
            got = _answers(sub, _rebuilt(component, sub).decode(x, validate=False, chunk_size=chunk_size), n)
        if out is None:
            out = got.new_empty((b,) + tuple(got.shape[1:]))
        out[rows] = got
    return out
