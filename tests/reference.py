"""Slow, obviously-correct NumPy reference ("oracle") for the hdecode_torch test suite.

The metrics, node probabilities, closed sets, exhaustive optima, heuristics and closed forms
(tree distance, Hamming, the hF_beta bounds) here are written straight from the definitions in
``/work/shared/SPEC.md``, with plain Python loops where a loop is clearer; :func:`dense_cost`
writes the node metrics' definitions in NumPy arrays for the bundled trees, where the loops of
:func:`cost_matrix` are too slow.  ``test_reference_selfcheck.py`` checks them against each other:
every heuristic's answer lies in its :func:`heuristic_candidates` (among the exact ties where its
keys are exact), every closed form among the brute-force optima, the dense costs equal
:func:`cost_matrix`.  This module imports neither ``torch``, ``hdecode_torch`` nor the
benchmarks: it is the independent yardstick the library is compared against.  Jaccard has one
exhaustive oracle, :class:`JaccardEnumeration` (every closed set against every leaf, the values of
:func:`jaccard`), and :class:`SlowJaccard`, the exact decoder (a plain knapsack over every node)
for trees too large to enumerate, checked against it.

Conventions (SPEC §1)
---------------------
* A tree is a ``parents`` int array of length N, ``parents[root] == -1``.
* Canonical numbering: leaves (nodes without children) are ``0..L-1``, internal nodes
  ``L..N-1``; the root may be any internal id.  (A 1-node tree has its root as leaf 0.)
* ``depth(root) == 0``; ``A(n)`` = ancestors of n *including n*; ``L(n)`` leaves under n;
  ``p(n) = sum_{l in L(n)} p(l)``; ``I(n) = log(L / |L(n)|)``;
  ``height(n) = max_{l in L(n)} d(l) - d(n)``.

Predictions
-----------
* leaf / node metrics and heuristics: a node id (python ``int``);
* set metrics: a boolean mask of length N, or any iterable of node ids (set, frozenset,
  list); a plain ``int`` node ``n`` means the set ``A(n)``.  The ancestor closure
  ``h+ = U_{n in h} A(n)`` is always applied.  Brute-force set optima are returned as
  ``frozenset`` of node ids (use :func:`set_to_mask` for a mask).

Degenerate 0/0 conventions (documented choice; the library must agree)
---------------------------------------------------------------------
* ``wu_palmer(h, y)``: d(h)+d(y) = 0 only when h = y = root = the single leaf of a
  1-node tree; value := 1.
* ``zhao(h, y)``: I(h)+I(y) = 0 only when L = 1 (every node covers the single leaf,
  every I is 0); value := 1 (every prediction contains the only class).
  With L >= 2, I(y) = log L > 0 so no special case arises.
* ``hf_beta``/``jaccard``/``hamming`` of an *empty* prediction set (never produced by a
  decoder, closed sets contain the root): hF = 0, jaccard = 0, hamming = |y+|/|y+| = 1.

Tie rules of the exact (``tol=0``) heuristics, SPEC §4.2
-------------------------------------------------------
Every "argmax of a key" heuristic breaks exact ties on the key by
(1) the deeper node (larger d(n)), then (2) the smallest node id.  Concretely:

* ``argmax_leaf``: argmax_l p(l); ties -> smallest leaf id.
* ``top_down``: from the root, repeatedly step to the child with the largest p(child)
  (ties -> smallest child id) until a leaf is reached (steps even into p = 0 children).
* ``confidence_threshold(tau)``: among nodes with p(n) > tau (strict), the max I(n)
  (compared exactly through the integer leaf counts |L(n)|); ties -> deeper, then
  smallest id.  If no node qualifies (only if sum p < 1): root.  tau outside [0, 1)
  -> ``ValueError``.
* ``majority`` = ``confidence_threshold(0.5)``.
* ``plurality``: nodes n with p(n) > p(z) strictly for every z not in A(n) (z ranges over
  descendants of n *and* nodes off the root-n path; the root is NOT vacuously accepted:
  it needs p(root) > p(z) for all z != root, which fails e.g. when a child holds all
  the mass).  With sum p = 1 (exact arithmetic) the deepest node n* with p(n*) = 1
  always qualifies (its strict descendants have p < 1, nodes off its path have p = 0),
  so the set is never empty; if it is empty through rounding, the root is returned.
  Among qualifying nodes: max I(n), ties -> deeper, then smallest id.
* ``darts(lam)``: argmax (I(n) + lam) * p(n) (float compare); ties -> deeper, then
  smallest id.  ``expected_information`` = ``darts(0)``.
* ``information_threshold(threshold)``: among nodes with I(n) >= threshold (non-strict),
  the max p(n); ties -> deeper, then smallest id.  No qualifying node (threshold >
  log L) -> ``ValueError``.
* ``hie``: argmax over leaves l of p(parent(l)) * p(l); ties -> smallest leaf id
  (for the 1-node tree, whose leaf is the root, p(parent) := p(l)).
* ``crm``: the leaf minimising expected lca_height (the lca_height decoder); ties ->
  deeper, then smallest id.

On a unary chain the nodes share their leaf set, hence p, I and every key: the
deeper-wins rule then picks the lowest node of the chain, as SPEC §4.2 requires.

Because a library may add probabilities in another order, exact decisions can flip on
near-ties.  :func:`heuristic_candidates` returns every node a correct implementation
could return under perturbations of size ``tol`` *and any secondary tie rule*, keeping
only the SPEC-mandated rule (on a unary chain the deeper node wins).  Brute-force
optima (:func:`optimal`) return the value and *all* optimal predictions within a
relative tolerance; :func:`is_optimal` checks one prediction by its expected score.
"""

from __future__ import annotations

import itertools
import math
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Set, Tuple

import numpy as np


__all__ = [
    # trees
    "random_tree", "chain_tree", "star_tree", "full_tree", "canonicalize", "is_canonical",
    "TreeInfo",
    # probabilities
    "node_probs", "random_distribution", "random_distributions", "DISTRIBUTION_KINDS",
    # metrics
    "METRICS", "metric_kind", "higher_is_better", "metric_value",
    "accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao",
    "hf_beta", "hamming", "jaccard", "cost_matrix", "expected",
    # sets
    "closure", "is_closed", "closed_sets", "closed_sets_frozen", "count_closed_sets",
    "set_to_mask", "mask_to_set",
    # optimal decoding
    "candidate_values", "optimal", "is_optimal", "tree_distance_closed_form",
    "hamming_closed_form", "hf_beta_safe_bound", "hf_beta_value_bound", "dense_cost",
    # heuristics
    "HEURISTICS", "heuristic", "heuristic_candidates",
    # Jaccard: the exhaustive oracle, and the exact decoder for large trees
    "JaccardEnumeration", "SlowJaccard",
]


# ---------------------------------------------------------------------------
# Trees
# ---------------------------------------------------------------------------

def _children_lists(parents: np.ndarray) -> List[List[int]]:
    """Children of each node as sorted python lists (no validation)."""
    n = len(parents)
    ch: List[List[int]] = [[] for _ in range(n)]
    for i in range(n):
        p = int(parents[i])
        if p >= 0:
            ch[p].append(i)
    for c in ch:
        c.sort()
    return ch


def _validate_parents(parents) -> np.ndarray:
    """Return ``parents`` as an int64 array after checking it is a rooted tree.

    Checks: 1-D, non-empty, entries in [-1, N-1], exactly one root (-1), no self loop,
    and every node reaches the root by walking up (no cycle).  Raises ``ValueError``.
    """
    arr = np.asarray(parents)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError("parents must be a non-empty 1-D array")
    if not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise ValueError("parents must hold integers")
    arr = arr.astype(np.int64)
    n = arr.size
    if np.any(arr < -1) or np.any(arr >= n):
        raise ValueError("parents entries must lie in [-1, N-1]")
    roots = [i for i in range(n) if arr[i] == -1]
    if len(roots) != 1:
        raise ValueError(f"tree must have exactly one root, found {len(roots)}")
    for i in range(n):
        if arr[i] == i:
            raise ValueError(f"node {i} is its own parent")
        cur, steps = i, 0
        while arr[cur] != -1:
            cur = int(arr[cur])
            steps += 1
            if steps > n:
                raise ValueError("parents contains a cycle")
    return arr


def is_canonical(parents) -> bool:
    """True iff the leaves (nodes without children) are exactly ``0..L-1``."""
    arr = _validate_parents(parents)
    ch = _children_lists(arr)
    leaves = [i for i in range(len(arr)) if not ch[i]]
    return leaves == list(range(len(leaves)))


def canonicalize(parents, rng: Optional[np.random.Generator] = None, return_perm: bool = False):
    """Renumber a tree so that leaves are ``0..L-1`` and internal nodes ``L..N-1``.

    Without ``rng`` the relabelling is stable (leaves keep their relative order, so do
    internal nodes); with ``rng`` both groups are shuffled independently (so the root
    lands on a random internal id).  Returns the new parents array, and with
    ``return_perm=True`` also ``new_id`` (``new_id[old] = new``).
    """
    arr = _validate_parents(parents)
    n = len(arr)
    ch = _children_lists(arr)
    leaves = [i for i in range(n) if not ch[i]]
    internal = [i for i in range(n) if ch[i]]
    if rng is not None:
        leaves = [leaves[k] for k in rng.permutation(len(leaves))]
        internal = [internal[k] for k in rng.permutation(len(internal))]
    new_id = np.empty(n, dtype=np.int64)
    for k, old in enumerate(leaves + internal):
        new_id[old] = k
    out = np.empty(n, dtype=np.int64)
    for old in range(n):
        out[new_id[old]] = -1 if arr[old] == -1 else new_id[arr[old]]
    return (out, new_id) if return_perm else out


def chain_tree(n: int) -> np.ndarray:
    """A path of ``n >= 1`` nodes: leaf 0 at the bottom, node i's parent is i+1, root n-1.

    ``chain_tree(2)`` is the 1-leaf tree (root with a single leaf child);
    ``chain_tree(1)`` is the single-node tree (root = leaf 0).
    """
    if n < 1:
        raise ValueError("chain_tree needs n >= 1")
    return np.array([i + 1 for i in range(n - 1)] + [-1], dtype=np.int64)


def star_tree(num_leaves: int) -> np.ndarray:
    """Root ``num_leaves`` with leaf children ``0..num_leaves-1`` (num_leaves >= 1)."""
    if num_leaves < 1:
        raise ValueError("star_tree needs at least one leaf")
    return np.array([num_leaves] * num_leaves + [-1], dtype=np.int64)


def full_tree(branching: int, depth: int) -> np.ndarray:
    """Complete ``branching``-ary tree of the given leaf depth (>= 1), canonical ids."""
    if branching < 1 or depth < 1:
        raise ValueError("full_tree needs branching >= 1 and depth >= 1")
    parents = [-1]
    frontier = [0]
    for _ in range(depth):
        nxt = []
        for v in frontier:
            for _ in range(branching):
                parents.append(v)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return canonicalize(np.array(parents, dtype=np.int64))


def random_tree(
    rng: np.random.Generator,
    num_nodes_max: int = 12,
    unary_prob: float = 0.2,
    *,
    num_nodes_min: Optional[int] = None,
    min_leaves: int = 2,
    max_leaves: Optional[int] = None,
    deep_bias: float = 0.3,
    widen: float = 0.5,
    forbid_unary: bool = False,
    shuffle: bool = True,
    max_tries: int = 1000,
) -> np.ndarray:
    """Random rooted tree, returned in canonical numbering.

    Growth process (starting from a lone root) until the drawn node count
    ``N ~ U{num_nodes_min .. num_nodes_max}`` is reached:

    * with probability ``unary_prob`` (once there is an edge) subdivide a random edge
      ``parent(v) -> v`` by a new node: this creates a unary (single-child) node;
    * otherwise attach a new leaf: with probability ``deep_bias`` under the most
      recently attached leaf (grows deep branches, so leaf depths differ); else, with
      probability ``widen``, under a random internal node (adds siblings), else under a
      uniformly random existing node (random recursive tree: unbalanced).

    Trees with fewer than ``min_leaves`` leaves (or more than ``max_leaves``), or with a
    unary node when ``forbid_unary``, are rejected and redrawn.  ``min_leaves=1`` allows
    1-leaf trees (a chain from the root to a single leaf, e.g. root -> leaf).
    With ``shuffle`` the leaf ids and the internal ids are randomly permuted within
    their canonical ranges (the root can be any internal id).
    """
    if min_leaves < 1:
        raise ValueError("min_leaves must be >= 1")
    lo = min_leaves + 1 if num_nodes_min is None else max(num_nodes_min, min_leaves + 1)
    if num_nodes_max < lo:
        raise ValueError(f"num_nodes_max={num_nodes_max} too small for {min_leaves} leaves")
    for _ in range(max_tries):
        target = int(rng.integers(lo, num_nodes_max + 1))
        parents = [-1]
        last = 0
        while len(parents) < target:
            new = len(parents)
            if len(parents) >= 2 and rng.random() < unary_prob:
                v = int(rng.integers(1, len(parents)))  # a non-root node
                parents.append(parents[v])
                parents[v] = new
            else:
                u = rng.random()
                if u < deep_bias:
                    host = last
                elif u < deep_bias + (1.0 - deep_bias) * widen:
                    internal = sorted(set(parents) - {-1})
                    host = internal[int(rng.integers(len(internal)))] if internal else 0
                else:
                    host = int(rng.integers(0, len(parents)))
                parents.append(host)
                last = new
        arr = np.array(parents, dtype=np.int64)
        ch = _children_lists(arr)
        num_leaves = sum(1 for c in ch if not c)
        if num_leaves < min_leaves:
            continue
        if max_leaves is not None and num_leaves > max_leaves:
            continue
        if forbid_unary and any(len(c) == 1 for c in ch):
            continue
        return canonicalize(arr, rng if shuffle else None)
    raise RuntimeError("random_tree: could not satisfy the constraints; relax them")


class TreeInfo:
    """All per-node quantities of a canonical tree, computed by plain loops.

    Attributes (python lists or numpy arrays of length N unless stated):

    * ``parents`` (int64 array), ``N``, ``L``, ``root``;
    * ``children[n]``: sorted list of children;
    * ``depth[n]`` (int array), root at 0; ``max_depth``: deepest leaf depth D;
    * ``leaves``: ``list(range(L))``; ``is_leaf[n]``;
    * ``leaf_count[n]`` = |L(n)| (int array);
    * ``info[n]`` = I(n) = log(L / |L(n)|) (float array);
    * ``dmin[n]`` / ``dmax[n]``: min / max *absolute* depth of the leaves under n;
    * ``height[n]`` = dmax[n] - depth[n].

    Methods: :meth:`ancestors`, :meth:`ancestor_set`, :meth:`leaves_under`,
    :meth:`is_ancestor`, :meth:`lca`, :meth:`descendants`.
    """

    def __init__(self, parents):
        arr = _validate_parents(parents)
        self.parents = arr
        self.N = int(arr.size)
        self.children = _children_lists(arr)
        self.is_leaf = np.array([not c for c in self.children], dtype=bool)
        self.L = int(self.is_leaf.sum())
        if list(np.nonzero(self.is_leaf)[0]) != list(range(self.L)):
            raise ValueError("tree is not canonical: leaves must be 0..L-1 (use canonicalize)")
        self.leaves = list(range(self.L))
        self.root = int([i for i in range(self.N) if arr[i] == -1][0])

        self._anc: List[List[int]] = []
        for n in range(self.N):
            path = [n]
            while self.parents[path[-1]] != -1:
                path.append(int(self.parents[path[-1]]))
            self._anc.append(path)
        self.depth = np.array([len(a) - 1 for a in self._anc], dtype=np.int64)

        self._leaves_under: List[List[int]] = [[] for _ in range(self.N)]
        for leaf in self.leaves:
            for a in self._anc[leaf]:
                self._leaves_under[a].append(leaf)
        for lst in self._leaves_under:
            lst.sort()

        self.leaf_count = np.array([len(x) for x in self._leaves_under], dtype=np.int64)
        self.info = np.array([math.log(self.L / c) for c in self.leaf_count], dtype=np.float64)
        self.dmin = np.array([min(self.depth[l] for l in x) for x in self._leaves_under], dtype=np.int64)
        self.dmax = np.array([max(self.depth[l] for l in x) for x in self._leaves_under], dtype=np.int64)
        self.height = self.dmax - self.depth
        self.max_depth = int(max(self.depth[l] for l in self.leaves))

    # -- structure -----------------------------------------------------------------
    def ancestors(self, n: int) -> List[int]:
        """A(n) as a list ``[n, parent(n), ..., root]`` (includes n)."""
        return list(self._anc[int(n)])

    def ancestor_set(self, n: int) -> FrozenSet[int]:
        """A(n) as a frozenset."""
        return frozenset(self._anc[int(n)])

    def leaves_under(self, n: int) -> List[int]:
        """L(n): sorted list of leaves having n as an ancestor (n itself if a leaf)."""
        return list(self._leaves_under[int(n)])

    def is_ancestor(self, a: int, n: int) -> bool:
        """True iff a is in A(n) (a node is its own ancestor)."""
        return int(a) in self._anc[int(n)]

    def descendants(self, n: int) -> List[int]:
        """All nodes m with n in A(m), including n, sorted."""
        return sorted(m for m in range(self.N) if self.is_ancestor(n, m))

    def lca(self, a: int, b: int) -> int:
        """Lowest common ancestor, by walking the deeper node up, then both together."""
        a, b = int(a), int(b)
        while self.depth[a] > self.depth[b]:
            a = int(self.parents[a])
        while self.depth[b] > self.depth[a]:
            b = int(self.parents[b])
        while a != b:
            a = int(self.parents[a])
            b = int(self.parents[b])
        return a

    def __repr__(self) -> str:
        return f"TreeInfo(N={self.N}, L={self.L}, root={self.root}, parents={self.parents.tolist()})"


def _as_info(tree) -> TreeInfo:
    return tree if isinstance(tree, TreeInfo) else TreeInfo(tree)


# ---------------------------------------------------------------------------
# Probabilities
# ---------------------------------------------------------------------------

def _check_p(info: TreeInfo, p_leaf) -> np.ndarray:
    p = np.asarray(p_leaf, dtype=np.float64)
    if p.shape != (info.L,):
        raise ValueError(f"p_leaf must have shape ({info.L},), got {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise ValueError("p_leaf must be finite and non-negative")
    return p


def node_probs(info: TreeInfo, p_leaf) -> np.ndarray:
    """p(n) = sum of p(l) over l in L(n), for every node (exactly rounded ``math.fsum``)."""
    info = _as_info(info)
    p = _check_p(info, p_leaf)
    return np.array([math.fsum(p[l] for l in info.leaves_under(n)) for n in range(info.N)],
                    dtype=np.float64)


DISTRIBUTION_KINDS = ("dirichlet", "peaked", "uniform", "onehot", "sparse", "dyadic")


def random_distribution(rng: np.random.Generator, L: int, kind: str = "dirichlet") -> np.ndarray:
    """A random probability vector over L leaves (float64, sums to 1 up to rounding).

    kinds:
    * ``"dirichlet"``: symmetric Dirichlet, concentration 10**U(-1.5, 1) (flat to spiky);
    * ``"peaked"``: softmax of N(0,1) logits scaled by U(2, 8) (one or few dominant leaves);
    * ``"uniform"``: 1/L everywhere (maximal ties);
    * ``"onehot"``: all mass on one random leaf;
    * ``"sparse"``: Dirichlet on a random support of size 1..max(1, L//2), exact zeros elsewhere;
    * ``"dyadic"``: multinomial counts of 16 draws / 16: exact binary fractions, so all node
      sums are exact in float32/float64 and exact ties (e.g. p(n) = 1/2) really occur;
    * ``"random"``: one of the above at random.
    """
    if L < 1:
        raise ValueError("L must be >= 1")
    if kind == "random":
        kind = DISTRIBUTION_KINDS[int(rng.integers(len(DISTRIBUTION_KINDS)))]
    if kind == "dirichlet":
        alpha = 10.0 ** rng.uniform(-1.5, 1.0)
        p = rng.dirichlet(np.full(L, alpha))
        if not np.all(np.isfinite(p)) or p.sum() <= 0:  # extreme underflow guard
            p = np.zeros(L)
            p[int(rng.integers(L))] = 1.0
    elif kind == "peaked":
        z = rng.normal(size=L) * rng.uniform(2.0, 8.0)
        z = z - z.max()
        p = np.exp(z)
    elif kind == "uniform":
        p = np.full(L, 1.0 / L)
    elif kind == "onehot":
        p = np.zeros(L)
        p[int(rng.integers(L))] = 1.0
    elif kind == "sparse":
        k = int(rng.integers(1, max(1, L // 2) + 1))
        support = rng.choice(L, size=k, replace=False)
        p = np.zeros(L)
        p[support] = rng.dirichlet(np.ones(k))
    elif kind == "dyadic":
        p = rng.multinomial(16, np.full(L, 1.0 / L)).astype(np.float64) / 16.0
    else:
        raise ValueError(f"unknown distribution kind {kind!r}; choose from {DISTRIBUTION_KINDS + ('random',)}")
    p = np.asarray(p, dtype=np.float64)
    if kind not in ("uniform", "onehot", "dyadic"):
        p = p / p.sum()
    return p


def random_distributions(rng: np.random.Generator, B: int, L: int, kind: str = "dirichlet") -> np.ndarray:
    """(B, L) stack of :func:`random_distribution` rows (``kind="random"`` mixes kinds per row)."""
    return np.stack([random_distribution(rng, L, kind) for _ in range(B)])


# ---------------------------------------------------------------------------
# Sets
# ---------------------------------------------------------------------------

def closure(info: TreeInfo, pred) -> FrozenSet[int]:
    """Ancestor closure h+ = U_{n in h} A(n) of a prediction given as an int node
    (-> A(node)), a boolean mask of length N, or an iterable of node ids."""
    info = _as_info(info)
    if isinstance(pred, (int, np.integer)):
        return info.ancestor_set(int(pred))
    arr = np.asarray(pred) if not isinstance(pred, (set, frozenset)) else None
    if arr is not None and arr.dtype == bool:
        if arr.shape != (info.N,):
            raise ValueError(f"mask must have shape ({info.N},)")
        nodes = [int(i) for i in np.nonzero(arr)[0]]
    else:
        nodes = [int(x) for x in pred]
    out: Set[int] = set()
    for n in nodes:
        if not 0 <= n < info.N:
            raise ValueError(f"node id {n} out of range")
        out.update(info.ancestors(n))
    return frozenset(out)


def is_closed(info: TreeInfo, nodes: Iterable[int]) -> bool:
    """True iff the node set is ancestor-closed (every parent of a member is a member)."""
    info = _as_info(info)
    s = set(int(x) for x in nodes)
    return all(info.parents[n] == -1 or int(info.parents[n]) in s for n in s)


def set_to_mask(info: TreeInfo, nodes: Iterable[int]) -> np.ndarray:
    """Boolean mask of length N of a node set (no closure applied)."""
    info = _as_info(info)
    m = np.zeros(info.N, dtype=bool)
    for n in nodes:
        m[int(n)] = True
    return m


def mask_to_set(mask) -> FrozenSet[int]:
    """frozenset of the True positions of a boolean mask."""
    return frozenset(int(i) for i in np.nonzero(np.asarray(mask, dtype=bool))[0])


def closed_sets_frozen(info: TreeInfo) -> Iterator[FrozenSet[int]]:
    """Yield EVERY ancestor-closed node set containing the root, as frozensets.

    Recursion: a closed set of the subtree at n that contains n is {n} united with, for
    each child c independently, either nothing or a closed set of c's subtree containing c.
    """
    info = _as_info(info)

    def rec(n: int) -> List[FrozenSet[int]]:
        options = []
        for c in info.children[n]:
            options.append([frozenset()] + rec(c))
        out = []
        for combo in itertools.product(*options):
            s = {n}
            for part in combo:
                s |= part
            out.append(frozenset(s))
        return out

    yield from rec(info.root)


def closed_sets(info: TreeInfo) -> Iterator[np.ndarray]:
    """Yield every ancestor-closed node set containing the root, as a boolean mask (N,)."""
    info = _as_info(info)
    for s in closed_sets_frozen(info):
        yield set_to_mask(info, s)


def count_closed_sets(info: TreeInfo) -> int:
    """Number of closed sets containing the root: f(n) = prod_{c child of n} (1 + f(c))."""
    info = _as_info(info)

    def f(n: int) -> int:
        r = 1
        for c in info.children[n]:
            r *= 1 + f(c)
        return r

    return f(info.root)


# ---------------------------------------------------------------------------
# Metrics (one prediction, one target leaf y)
# ---------------------------------------------------------------------------

def _node_of(info: TreeInfo, pred) -> int:
    """A node id from a node prediction; a set/mask is accepted iff its closure is A(n)."""
    if isinstance(pred, (int, np.integer)):
        n = int(pred)
        if not 0 <= n < info.N:
            raise ValueError(f"node id {n} out of range")
        return n
    s = closure(info, pred)
    if not s:
        raise ValueError("empty set is not a node prediction")
    deepest = max(s, key=lambda m: (info.depth[m], -m))
    if info.ancestor_set(deepest) != s:
        raise ValueError("set prediction is not a root-to-node path; node metrics need a single node")
    return deepest


def _leaf(info: TreeInfo, y) -> int:
    y = int(y)
    if not 0 <= y < info.L:
        raise ValueError(f"target {y} is not a leaf id in 0..{info.L - 1}")
    return y


def accuracy(info: TreeInfo, h, y) -> float:
    """1 if h == y else 0 (an internal node is never correct)."""
    return 1.0 if _node_of(info, h) == _leaf(info, y) else 0.0


def lca_height(info: TreeInfo, h, y) -> float:
    """height(LCA(h, y)) = (max leaf depth under the LCA) - d(LCA); 0 when h == y."""
    a = info.lca(_node_of(info, h), _leaf(info, y))
    return float(info.height[a])


def tree_distance(info: TreeInfo, h, y) -> float:
    """Path length d(h) + d(y) - 2 d(LCA(h, y))."""
    h, y = _node_of(info, h), _leaf(info, y)
    a = info.lca(h, y)
    return float(info.depth[h] + info.depth[y] - 2 * info.depth[a])


def tree_distance_c(info: TreeInfo, h, y, c: float = 0.0) -> float:
    """tree_distance(h, y) + c * d(h)."""
    if c < 0:
        raise ValueError("c must be >= 0")
    h = _node_of(info, h)
    return tree_distance(info, h, y) + c * float(info.depth[h])


def wu_palmer(info: TreeInfo, h, y) -> float:
    """2 d(LCA) / (d(h) + d(y)); 0/0 (single-node tree) := 1."""
    h, y = _node_of(info, h), _leaf(info, y)
    den = info.depth[h] + info.depth[y]
    if den == 0:
        return 1.0
    return 2.0 * float(info.depth[info.lca(h, y)]) / float(den)


def zhao(info: TreeInfo, h, y) -> float:
    """2 I(LCA) / (I(h) + I(y)); 0/0 (only when L = 1) := 1."""
    h, y = _node_of(info, h), _leaf(info, y)
    den = info.info[h] + info.info[y]
    if den == 0:
        return 1.0
    return 2.0 * float(info.info[info.lca(h, y)]) / float(den)


def _set_counts(info: TreeInfo, h, y) -> Tuple[int, int, int]:
    hs = closure(info, h)
    ys = info.ancestor_set(_leaf(info, y))
    return len(hs & ys), len(hs), len(ys)


def hf_beta(info: TreeInfo, h, y, beta: float = 1.0) -> float:
    """hF_beta from hP = |h+ n y+|/|h+| and hR = |h+ n y+|/|y+|:
    (1 + b^2) / (b^2 / hR + 1 / hP); 0 when the intersection is empty."""
    if not beta > 0:
        raise ValueError("beta must be > 0")
    inter, nh, ny = _set_counts(info, h, y)
    if inter == 0:
        return 0.0
    hp = inter / nh
    hr = inter / ny
    b2 = beta * beta
    return (1.0 + b2) / (b2 / hr + 1.0 / hp)


def hamming(info: TreeInfo, h, y) -> float:
    """|h+ symmetric-difference y+| / |y+|."""
    hs = closure(info, h)
    ys = info.ancestor_set(_leaf(info, y))
    return len(hs ^ ys) / len(ys)


def jaccard(info: TreeInfo, h, y) -> float:
    """|h+ n y+| / |h+ u y+|."""
    hs = closure(info, h)
    ys = info.ancestor_set(_leaf(info, y))
    return len(hs & ys) / len(hs | ys)


#: name -> (prediction kind, higher_is_better, function(info, h, y, **params))
METRICS: Dict[str, Tuple[str, bool, object]] = {
    "accuracy": ("leaf", True, accuracy),
    "lca_height": ("leaf", False, lca_height),
    "tree_distance": ("node", False, tree_distance),
    "mistake_severity": ("node", False, tree_distance),
    "tree_distance_c": ("node", False, tree_distance_c),
    "wu_palmer": ("node", True, wu_palmer),
    "zhao": ("node", True, zhao),
    "hf_beta": ("set", True, hf_beta),
    "hamming": ("set", False, hamming),
    "jaccard": ("set", True, jaccard),
}


def _is_cost(metric) -> bool:
    return isinstance(metric, np.ndarray) and metric.ndim == 2


def metric_kind(metric) -> str:
    """'leaf', 'node' or 'set' (a cost matrix is 'node')."""
    if _is_cost(metric):
        return "node"
    return METRICS[metric][0]


def higher_is_better(metric) -> bool:
    """Direction of a metric name (a cost matrix: lower is better)."""
    if _is_cost(metric):
        return False
    return METRICS[metric][1]


def metric_value(info: TreeInfo, metric, pred, y, **params) -> float:
    """Value of a metric (name, or an (N, L) cost matrix) for one prediction and leaf y."""
    info = _as_info(info)
    if _is_cost(metric):
        if metric.shape != (info.N, info.L):
            raise ValueError(f"cost matrix must have shape ({info.N}, {info.L})")
        return float(metric[_node_of(info, pred), _leaf(info, y)])
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}")
    return float(METRICS[metric][2](info, pred, y, **params))


def cost_matrix(info: TreeInfo, metric: str, **params) -> np.ndarray:
    """(N, L) costs of predicting node h (as a set metric: the set A(h)) for leaf y:
    the value for lower-is-better metrics, 1 - value for higher-is-better ones."""
    info = _as_info(info)
    hib = higher_is_better(metric)
    C = np.empty((info.N, info.L), dtype=np.float64)
    for h in range(info.N):
        for y in info.leaves:
            v = metric_value(info, metric, h, y, **params)
            C[h, y] = 1.0 - v if hib else v
    return C


def expected(info: TreeInfo, metric, p_leaf, pred, **params) -> float:
    """Expected value sum_l p(l) m(pred, l) (math.fsum), metric = name or cost matrix."""
    info = _as_info(info)
    p = _check_p(info, p_leaf)
    return math.fsum(p[l] * metric_value(info, metric, pred, l, **params) for l in info.leaves)


# ---------------------------------------------------------------------------
# Brute-force Bayes-optimal decoding
# ---------------------------------------------------------------------------

def _candidates(info: TreeInfo, metric, candidates: Optional[str]):
    kind = candidates or metric_kind(metric)
    if kind == "leaf":
        return list(info.leaves)
    if kind == "node":
        return list(range(info.N))
    if kind == "set":
        return list(closed_sets_frozen(info))
    raise ValueError("candidates must be None, 'leaf', 'node' or 'set'")


def candidate_values(info: TreeInfo, metric, p_leaf, candidates: Optional[str] = None, **params):
    """dict prediction -> expected score over the candidate space of the metric
    (leaves for leaf metrics, nodes for node metrics / cost matrices, every closed set
    containing the root (frozensets) for set metrics); ``candidates`` overrides it."""
    info = _as_info(info)
    return {c: expected(info, metric, p_leaf, c, **params) for c in _candidates(info, metric, candidates)}


def optimal(info: TreeInfo, metric, p_leaf, rtol: float = 1e-12, candidates: Optional[str] = None,
            **params):
    """Exhaustive Bayes-optimal decoding.

    Returns ``(best_value, optimal_preds)`` where best_value is the best expected score
    (max for higher-is-better metrics, min otherwise) and optimal_preds the python set of
    all candidates whose expected score is within ``rtol * max(1, |best|)`` of it (ints
    for leaf/node metrics, frozensets for set metrics).
    """
    vals = candidate_values(info, metric, p_leaf, candidates, **params)
    hib = higher_is_better(metric)
    best = max(vals.values()) if hib else min(vals.values())
    tol = rtol * max(1.0, abs(best))
    opt = {c for c, v in vals.items() if abs(v - best) <= tol}
    return best, opt


def is_optimal(info: TreeInfo, metric, p_leaf, pred, rtol: float = 1e-9, atol: float = 1e-12,
               **params) -> bool:
    """True iff ``pred`` achieves the brute-force optimal expected score within
    ``atol + rtol * |best|`` (leaf metrics also require pred to be a leaf)."""
    info = _as_info(info)
    if metric_kind(metric) == "leaf":
        if not (isinstance(pred, (int, np.integer)) and 0 <= int(pred) < info.L):
            return False
    best, _ = optimal(info, metric, p_leaf, **params)
    v = expected(info, metric, p_leaf, pred, **params)
    return abs(v - best) <= atol + rtol * abs(best)


def tree_distance_closed_form(info: TreeInfo, p_leaf, c: float = 0.0) -> int:
    """Theorem (Ramaswamy et al.; Cao et al.): the deepest node with p(n) > (1+c)/2,
    or the root if none.  (Nodes above a threshold >= 1/2 form a root path, so the
    deepest one is unique.)  :func:`optimal` cross-checks it."""
    info = _as_info(info)
    pn = node_probs(info, p_leaf)
    above = [n for n in range(info.N) if pn[n] > (1 + c) / 2]
    return max(above, key=lambda n: info.depth[n]) if above else info.root


def hamming_closed_form(info: TreeInfo, p_leaf) -> FrozenSet[int]:
    """SPEC §4.1: include n iff W(n) > W/2 where W(n) = sum_{l in L(n)} p(l)/(d(l)+1),
    W = W(root).  :func:`optimal` cross-checks it."""
    info = _as_info(info)
    p = _check_p(info, p_leaf)
    w = [math.fsum(p[l] / (info.depth[l] + 1) for l in info.leaves_under(n)) for n in range(info.N)]
    return frozenset(n for n in range(info.N) if w[n] > w[info.root] / 2)


def hf_beta_safe_bound(info: TreeInfo, n: int, beta: float) -> float:
    """SPEC §4.3 necessary condition: n in h* => p(n) >= this value,
    (d_min(n) + 1) / ((D + 1) (1 + beta^2 (D + 1)))."""
    info = _as_info(info)
    big_d = info.max_depth + 1.0
    return (info.dmin[n] + 1.0) / (big_d * (1 + beta * beta * big_d))


def hf_beta_value_bound(info: TreeInfo, n: int, beta: float, value: float) -> float:
    """A non-root n of an optimal hF_beta set of expected score ``value`` has p(n) >= this,
    value (1 + beta^2 (d_min(n) + 1)) / ((1 + beta^2)(1 + beta^2 (D + 1)))."""
    info = _as_info(info)
    b2 = beta * beta
    return value * (1 + b2 * (info.dmin[n] + 1.0)) / ((1 + b2) * (1 + b2 * (info.max_depth + 1.0)))


# ---------------------------------------------------------------------------
# Dense costs of the node metrics, for trees too large for cost_matrix's loops
# ---------------------------------------------------------------------------

def _depth_ancestors(info: TreeInfo) -> np.ndarray:
    """(N, D+1) the ancestor of n at each depth, -1 below d(n) (cached on the TreeInfo)."""
    if getattr(info, "_depth_anc", None) is None:
        anc = np.full((info.N, info.max_depth + 1), -1, dtype=np.int64)
        for n in range(info.N):
            path = info.ancestors(n)[::-1]  # root first: path[d] is the ancestor at depth d
            anc[n, : len(path)] = path
        info._depth_anc = anc
    return info._depth_anc


def dense_cost(info: TreeInfo, metric: str, **params) -> np.ndarray:
    """(N, L) float64 cost of predicting node n for leaf y (the value for lower-is-better metrics,
    1 - value otherwise) of a node metric: :func:`cost_matrix`'s definitions in NumPy arrays.

    Root paths agree down to the LCA and differ below it, so d(LCA(n, y)) is the number of depths
    at which the two paths hold the same node, minus one.  O(N·L·D) time, blocks of 64 nodes.
    """
    info = _as_info(info)
    anc = _depth_ancestors(info)
    leaf_anc = anc[: info.L]
    depth = info.depth.astype(np.float64)
    out = np.empty((info.N, info.L))
    for a in range(0, info.N, 64):
        nodes = np.arange(a, min(a + 64, info.N))
        same = (anc[nodes][:, None, :] == leaf_anc[None, :, :]) & (leaf_anc[None, :, :] >= 0)
        lca_depth = same.sum(2) - 1  # (n, y)
        lca = leaf_anc[np.arange(info.L)[None, :], lca_depth]
        dn, dy = depth[nodes][:, None], depth[None, : info.L]
        if metric == "accuracy":
            value = (nodes[:, None] == np.arange(info.L)[None, :]).astype(np.float64)
        elif metric in ("tree_distance", "mistake_severity", "tree_distance_c"):
            c = params.get("c", 0.0) if metric == "tree_distance_c" else 0.0
            value = dn + dy - 2 * lca_depth + c * dn
        elif metric == "lca_height":
            value = info.height[lca].astype(np.float64)
        elif metric == "wu_palmer":  # 0/0 (the single-node tree) := 1, as wu_palmer
            value = np.where(dn + dy > 0, 2.0 * lca_depth / np.maximum(dn + dy, 1), 1.0)
        elif metric == "zhao":  # 0/0 (L = 1) := 1, as zhao
            den = info.info[nodes][:, None] + info.info[None, : info.L]
            value = np.where(den > 0, 2 * info.info[lca] / np.where(den > 0, den, 1.0), 1.0)
        else:
            raise ValueError(f"{metric!r} is not a node metric")
        out[nodes] = 1.0 - value if higher_is_better(metric) else value
    return out


# ---------------------------------------------------------------------------
# Heuristic decoders (SPEC §4.2), from their definitions
# ---------------------------------------------------------------------------

#: The heuristics :func:`heuristic` runs and :func:`heuristic_candidates` formulates.
HEURISTICS = ("argmax_leaf", "top_down", "confidence_threshold", "majority", "plurality", "darts",
              "expected_information", "information_threshold", "hie", "crm")


def _deeper_then_smaller(info: TreeInfo, nodes) -> int:
    """SPEC §4.2's tie rule among nodes whose key ties exactly: the deeper node, then the smallest id."""
    return min(nodes, key=lambda n: (-info.depth[n], n))


def _argmax_key(info: TreeInfo, key, allowed) -> int:
    """argmax of ``key`` over the ``allowed`` nodes, exact ties by :func:`_deeper_then_smaller`."""
    best = max(key[n] for n in allowed)
    return _deeper_then_smaller(info, [n for n in allowed if key[n] == best])


def heuristic(name: str, info: TreeInfo, p_leaf, **params) -> int:
    """Run a heuristic by name, e.g. ``heuristic("darts", info, p, lam=0.3)``, as its rule in this
    module's docstring states, on the exactly rounded node probabilities of :func:`node_probs`
    (:func:`heuristic_candidates`, written independently, always contains the answer)."""
    if name not in HEURISTICS:
        raise ValueError(f"unknown heuristic {name!r}")
    info = _as_info(info)
    p = _check_p(info, p_leaf)
    pn = node_probs(info, p)
    nodes = range(info.N)
    if name == "argmax_leaf":
        return min(info.leaves, key=lambda l: (-p[l], l))
    if name == "top_down":
        n = info.root
        while info.children[n]:
            n = min(info.children[n], key=lambda c: (-pn[c], c))
        return n
    if name in ("confidence_threshold", "majority"):
        tau = 0.5 if name == "majority" else params.get("tau", 0.5)
        if not 0 <= tau < 1:
            raise ValueError(f"tau must lie in [0, 1), got {tau}")
        above = [n for n in nodes if pn[n] > tau]
        if not above:
            return info.root
        return _argmax_key(info, -info.leaf_count, above)  # I(n) compared through |L(n)|
    if name == "plurality":
        wins = [n for n in nodes
                if all(pn[n] > pn[z] for z in nodes if not info.is_ancestor(z, n))]
        return _argmax_key(info, -info.leaf_count, wins) if wins else info.root
    if name in ("darts", "expected_information"):
        lam = 0.0 if name == "expected_information" else params.get("lam", 0.0)
        return _argmax_key(info, (info.info + lam) * pn, nodes)
    if name == "information_threshold":
        threshold = params.get("threshold", 0.0)
        allowed = [n for n in nodes if info.info[n] >= threshold]
        if not allowed:
            raise ValueError(f"threshold {threshold} exceeds log(L) = {max(info.info)}")
        return _argmax_key(info, pn, allowed)
    if name == "hie":
        def score(l):
            parent = int(info.parents[l])
            return pn[parent if parent >= 0 else l] * p[l]
        return min(info.leaves, key=lambda l: (-score(l), l))
    # crm: the optimal lca_height leaf, ties to the deeper leaf, then the smallest id
    risk = _leaf_lca_height(info) @ p
    return _argmax_key(info, -risk, info.leaves)


def _leaf_lca_height(info: TreeInfo) -> np.ndarray:
    """(L, L) height(LCA(l, y)) of every pair of leaves (cached on the TreeInfo)."""
    if getattr(info, "_leaf_lca", None) is None:
        info._leaf_lca = dense_cost(info, "lca_height")[: info.L]
    return info._leaf_lca


def _plurality_margin(info: TreeInfo, pn, n: int) -> float:
    """p(n) - max_{z not in A(n)} p(z) (+inf if every node is in A(n))."""
    anc = info.ancestor_set(n)
    others = [pn[z] for z in range(info.N) if z not in anc]
    return float(pn[n] - max(others)) if others else math.inf


def _hie_score(info: TreeInfo, p, pn, l: int) -> float:
    par = int(info.parents[l])
    return float(pn[par if par >= 0 else l] * p[l])


def _tolerant_argmax(info: TreeInfo, margin: Dict[int, float], key: Dict[int, float], tol: float,
                     fallback: Optional[int], strict: bool = True) -> Set[int]:
    """Nodes that can be the argmax of ``key`` over {n: margin(n) > 0} (>= 0 if not
    strict) when margins and keys are perturbed by up to ``tol``, whatever the tie rule."""
    if strict:
        sure = [n for n in margin if margin[n] > tol]
        maybe = [n for n in margin if margin[n] > -tol]
    else:
        sure = [n for n in margin if margin[n] >= tol]
        maybe = [n for n in margin if margin[n] >= -tol]
    if sure:
        best = max(key[n] for n in sure)
        return {n for n in maybe if key[n] >= best - 2 * tol}
    out = set(maybe)
    if fallback is not None:
        out.add(fallback)
    return out


def _drop_unary_ancestors(info: TreeInfo, cands: Set[int]) -> Set[int]:
    """SPEC rule: on a unary chain (same leaf set) the deeper node wins, so drop a
    candidate when a strict descendant with the same leaf set is also a candidate."""
    out = set()
    for n in cands:
        shadowed = any(m != n and info.is_ancestor(n, m) and info.leaf_count[m] == info.leaf_count[n]
                       for m in cands)
        if not shadowed:
            out.add(n)
    return out


def heuristic_candidates(name: str, info: TreeInfo, p_leaf, tol: float = 1e-9, **params) -> Set[int]:
    """Every node an implementation of heuristic ``name`` may legitimately return.

    Accounts for (a) floating-point differences up to ``tol`` in p(n), I(n) and keys
    (a threshold test within ``tol`` of its boundary may go either way; keys within
    ~``tol`` of the best count as ties) and (b) any secondary tie rule, except the
    SPEC-mandated one: on a unary chain the deeper node wins.  Always contains
    :func:`heuristic`'s own answer.  With ``tol=0`` it is the set of exact ties.
    """
    info = _as_info(info)
    p = _check_p(info, p_leaf)
    pn = node_probs(info, p)
    allnodes = list(range(info.N))
    if name == "argmax_leaf":
        cands = _tolerant_argmax(info, {l: 1.0 for l in info.leaves}, {l: p[l] for l in info.leaves}, tol, None)
    elif name == "hie":
        cands = _tolerant_argmax(info, {l: 1.0 for l in info.leaves},
                                 {l: _hie_score(info, p, pn, l) for l in info.leaves}, tol, None)
    elif name == "crm":
        vals = candidate_values(info, "lca_height", p)
        cands = _tolerant_argmax(info, {l: 1.0 for l in info.leaves}, {l: -vals[l] for l in info.leaves},
                                 tol * max(1.0, info.max_depth), None)
    elif name == "top_down":
        cands = set()
        frontier = {info.root}
        while frontier:
            nxt = set()
            for n in frontier:
                if not info.children[n]:
                    cands.add(n)
                    continue
                best = max(pn[c] for c in info.children[n])
                nxt |= {c for c in info.children[n] if pn[c] >= best - 2 * tol}
            frontier = nxt
    elif name in ("confidence_threshold", "majority"):
        tau = 0.5 if name == "majority" else params.get("tau", 0.5)
        cands = _tolerant_argmax(info, {n: pn[n] - tau for n in allnodes},
                                 {n: -float(info.leaf_count[n]) for n in allnodes}, tol, info.root)
    elif name == "plurality":
        cands = _tolerant_argmax(info, {n: _plurality_margin(info, pn, n) for n in allnodes},
                                 {n: -float(info.leaf_count[n]) for n in allnodes}, tol, info.root)
    elif name in ("darts", "expected_information"):
        lam = 0.0 if name == "expected_information" else params.get("lam", 0.0)
        scale = max(1.0, abs(lam) + math.log(max(info.L, 1)) + 1.0)
        cands = _tolerant_argmax(info, {n: 1.0 for n in allnodes},
                                 {n: (info.info[n] + lam) * pn[n] for n in allnodes}, tol * scale, None)
    elif name == "information_threshold":
        thr = params.get("threshold", 0.0)
        cands = _tolerant_argmax(info, {n: info.info[n] - thr for n in allnodes},
                                 {n: pn[n] for n in allnodes}, tol, None, strict=False)
    else:
        raise ValueError(f"unknown heuristic {name!r}")
    cands = _drop_unary_ancestors(info, cands)
    # The exact answer is always acceptable.
    try:
        cands.add(heuristic(name, info, p, **params))
    except ValueError:
        pass
    return cands


# ---------------------------------------------------------------------------
# Jaccard: the exhaustive oracle
# ---------------------------------------------------------------------------

class JaccardEnumeration:
    """Every closed set of a small tree and its Jaccard index against every leaf: the exhaustive
    Jaccard oracle (:func:`optimal` enumerates the same sets one distribution at a time).

    ``sets`` is (S, N) bool in :func:`closed_sets` order, ``k`` (S,) their sizes, ``J`` (S, L) the
    values of :func:`jaccard`.  O(S·L·N) once per tree; S grows as 2^(number of leaves) at worst.
    """

    def __init__(self, tree):
        self.info = info = _as_info(tree)
        frozen = list(closed_sets_frozen(info))
        self.sets = np.array([set_to_mask(info, s) for s in frozen]).reshape(len(frozen), info.N)
        self.k = self.sets.sum(1)
        self.J = np.array([[jaccard(info, s, y) for y in info.leaves] for s in frozen]).reshape(len(frozen), info.L)

    def values(self, P):
        """(S, B) expected Jaccard of every set under every row of P (B, L)."""
        return self.J @ np.asarray(P, dtype=np.float64).T

    def value_of(self, mask, p):
        """The expected Jaccard of the closed set ``mask`` (N,) under p (L,)."""
        row = np.flatnonzero((self.sets == np.asarray(mask)[None, :]).all(1))
        assert row.size == 1, "not a closed set containing the root"
        return float(self.J[row[0]] @ p)


# ---------------------------------------------------------------------------
# Exact Jaccard decoding on trees too large to enumerate
# ---------------------------------------------------------------------------

class SlowJaccard:
    """Exact Jaccard decoding for one distribution: a plain tree knapsack over ALL nodes.

    No candidate pruning: an independent yardstick for the library's Jaccard decoder on trees
    too large to enumerate (the bundled ones).  For every set size k it solves

        V(k) = max_{S closed, root ∈ S, |S| = k} Σ_{n ∈ S} g_k(n),
        g_k(n) = Σ_{y ∈ L(n)} p(y) (k + d(y) + 1) / ((k + d(y) − d(n)) (k + d(y) − d(n) + 1)),

    by the textbook subtree knapsack (children merged by max-plus convolution, a node's table
    capped at k − d(n) entries since its d(n) ancestors are in the set too).  It stops at the first
    k past the deepest leaf's path length where G(k) = Σ_y p(y) min(k, d(y)+1) / max(k, d(y)+1), an
    upper bound on E[J] of every set of size k that only decreases from there on, is below the best
    V found.
    """

    def __init__(self, tree):
        self.info = info = _as_info(tree)
        self.bfs = [info.root]
        for v in self.bfs:
            self.bfs.extend(info.children[v])

    def masses(self, p_leaf) -> np.ndarray:
        """(N, D+1) mass of the leaves under n at each absolute depth."""
        info = self.info
        q = np.zeros((info.N, info.max_depth + 1))
        q[np.arange(info.L), info.depth[: info.L]] = p_leaf
        for v in reversed(self.bfs):
            if info.parents[v] >= 0:
                q[info.parents[v]] += q[v]
        return q

    def solve(self, p_leaf):
        """(best value, best set as a bool (N,) mask, best k) for one distribution (L,)."""
        p_leaf = np.asarray(p_leaf, dtype=np.float64)
        q = self.masses(p_leaf)
        dmax = q.shape[1] - 1
        ld = np.arange(dmax + 1, dtype=np.float64)
        best = (-1.0, None, 0)
        for k in range(1, self.info.N + 1):
            if k > dmax + 1 and (q[self.info.root] * np.minimum(k, ld + 1) / np.maximum(k, ld + 1)).sum() < best[0]:
                break
            val, nodes = self._knapsack(q, k)
            if val > best[0]:
                best = (val, nodes, k)
        mask = np.zeros(self.info.N, dtype=bool)
        mask[best[1]] = True
        return best[0], mask, best[2]

    def _knapsack(self, q, k):
        info = self.info
        dmax = q.shape[1] - 1
        ld = np.arange(dmax + 1, dtype=np.float64)
        tables, merges = {}, {}
        for v in reversed(self.bfs):
            d = int(info.depth[v])
            cap = k - d  # nodes of v's subtree in a size-k set
            if cap < 1:
                continue
            rel = ld - d
            ok = rel >= 0
            w = np.zeros(dmax + 1)
            w[ok] = (k + ld[ok] + 1) / ((k + rel[ok]) * (k + rel[ok] + 1))
            val = np.array([float(q[v] @ w)])  # val[j - 1]: best with j nodes of v's subtree, v taken
            steps = []
            for c in info.children[v]:
                if c not in tables:
                    continue
                cv = np.concatenate([[0.0], tables.pop(c)])  # child part of size t = 0..
                size = min(cap, val.size + cv.size - 1)
                nv = np.full(size, -np.inf)
                arg = np.zeros(size, dtype=np.int64)
                for t in range(min(cv.size, size)):
                    m = min(val.size, size - t)
                    s = val[:m] + cv[t]
                    better = s > nv[t:t + m]
                    nv[t:t + m][better] = s[better]
                    arg[t:t + m][better] = t
                val = nv
                steps.append((c, arg))
            tables[v] = val
            merges[v] = steps
        val = tables[info.root]
        if val.size < k:
            return -np.inf, []
        nodes, stack = [], [(info.root, k)]
        while stack:
            v, j = stack.pop()
            nodes.append(v)
            for c, arg in reversed(merges[v]):
                t = int(arg[j - 1])
                if t:
                    stack.append((c, t))
                    j -= t
        return float(val[k - 1]), nodes
