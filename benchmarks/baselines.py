"""Per-sample NumPy baselines: the decoders run one distribution at a time, as the paper's reference code does.

The one NumPy copy of every decoder: the benchmark times the library against it and checks their
predictions agree (``benchmarks/run.py``), and the tests use it as the exact answer of every
heuristic and closed form (``tests/reference.py``), after checking it against the definitions and
exhaustive enumeration (``tests/test_reference_selfcheck.py``).

Nothing here imports ``torch`` or the library's computations: the baselines work from a plain
``parents`` array so that they are an independent yardstick for the library.  What they take from
it are the metrics' declared facts (direction, kind, which baseline decodes each), read from the
torch-free catalogue of the command line (``hdecode_torch/cli/catalogue.py``, written from the classes).

How each baseline runs (``Baselines.decoder(key)`` returns ``fn(leaf_probs_1d) -> prediction``):

* every node-level rule starts with the node probabilities of *that one sample*, by a
  bottom-up traversal of the tree (:meth:`Baselines.node_probs`).  The traversal is
  vectorized per tree level (one ``np.add.reduceat`` per depth), which is the fastest
  reasonable per-sample NumPy.  ``Baselines(parents, traversal="python")`` (or
  ``.with_traversal("python")``) runs the same algorithms with the node sums done as the
  paper's Algorithm "ProbaNodes" (a Python loop over the nodes), which is what a literal
  port of the reference code costs;
* ``tree_distance`` / ``tree_distance_c``: the deepest node with p(n) > 1/2 (> (1+c)/2);
* ``wu_palmer`` / ``zhao``: the paper's general algorithm — the Lemma 4.3 candidate filter,
  in its Prop. E.6 form (thresholds scaled by p(a_n)) since both costs are equal under the
  root, followed by a brute force over the candidates with a precomputed dense (N, L) cost
  matrix (``C[cands] @ p``).  The thresholds are the paper's q_min / q_max written without
  the division (``M·p < m̲·(s − p)``) so that degenerate nodes (single-child chains, where
  the node and its parent have equal costs) are handled without 0/0;
* ``lca_height`` (and ``crm``): brute force over the leaves with a precomputed (L, L)
  LCA-height matrix (Karthik et al.); exact ties: the deeper leaf, then the smallest id;
* ``hf_beta``: the paper's decomposition by |h⁺| = k with the library's pruning: the bound
  (d_min(n)+1)/((D+1)(1+β²(D+1))) (provably safe, unlike the paper's Lemma 4.4), then the value bound
  p(n) ≥ τ(n)·LB of ``metrics/hf_beta.py`` (LB: the best set among the nodes with p ≥ τ), then a
  loop over k = 1..|Q| computing Δ_k on the candidates and taking the top k (stable sort in
  (depth, id) order, so ancestors come first among ties and the set stays closed);
* ``hamming``: the closed form W(n) > W(root)/2;
* ``jaccard``: the same algorithm and provably safe pruning as ``metrics/jaccard.py`` (see its
  docstring for the proofs), written the direct way: per-leaf-depth masses of every node by one
  bottom-up traversal; LB₀ from the root paths along the most probable leaf; the wide candidates
  p(n) ≥ τ(n)·LB₀ and LB from their closed prefixes (an ancestors-first order by the smallest gain at
  k̂ = round(E[d(y)] + 1) along each root path) at sizes k̂ ± 3; the candidates p(n) ≥ τ(n)·LB; then for
  each size k the allowed nodes p(n) ≥ τ_k(n)·LB, the bounds G(k) and the exact top-k sum of the allowed
  gains (a sort), and, for every k they cannot exclude, the preorder knapsack
  F(i, j) = max(g_k(v_i) + F(i+1, j−1), F(nxt(i), j)) (a Python loop over the candidates, NumPy vectors
  over j).  Ties: the smallest size within 4e-12 of the best, then a node is taken whenever that is at
  least as good.  float64 throughout, thresholds lowered by a relative 1e-12;
* the heuristics straight from their definitions, vectorized over the nodes of the one sample.  Exact
  ties on a rule's key go to the deeper node, then the smallest id (on a unary chain, whose nodes
  share p and I, the lowest node wins); ``argmax_leaf`` and ``hie``: the smallest leaf id;
  ``top_down``: the smallest child id at every step; ``confidence_threshold`` (tau in [0, 1), else
  ``ValueError``) and ``plurality`` fall back to the root when no node qualifies;
  ``information_threshold`` raises ``ValueError`` when no node has I(n) >= threshold (> log L).

:func:`expected_score` evaluates any prediction against one distribution in O(L·D) from the
ancestors table (no N×L matrix), in float64: it is what the benchmark's correctness check
compares.  :func:`node_values` / :func:`dense_cost` give the node metrics' values / costs for blocks of
nodes (the dense matrices of the Wu-Palmer, Zhao and LCA-height baselines).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from hdecode_torch.cli.catalogue import CATALOGUE  # plain data, no torch

__all__ = ["TreeTables", "Baselines", "node_values", "dense_cost", "expected_score", "hf_beta_safe_bound",
           "hf_beta_value_bound", "HIGHER_IS_BETTER", "SET_METRICS", "NODE_METRICS"]

_LISTED = {name: facts for name, facts in CATALOGUE["metrics"].items() if facts["listed"]}
#: Each listed metric's direction, as its class declares it.
HIGHER_IS_BETTER = {name: facts["higher_is_better"] for name, facts in _LISTED.items()}
SET_METRICS = tuple(name for name, facts in _LISTED.items() if facts["kind"] == "set")
_JACCARD_SLACK = 1e-12  # relative; float64 rounding of the values and thresholds is far below it


class TreeTables:
    """Plain NumPy tables of a canonical tree (leaves 0..L-1), built once per tree."""

    def __init__(self, parents):
        par = np.asarray(parents, dtype=np.int64)
        n = par.shape[0]
        self.parent = par
        self.num_nodes = n
        nonroot = np.flatnonzero(par >= 0)
        nchild = np.bincount(par[nonroot], minlength=n)
        is_leaf = nchild == 0
        self.num_leaves = L = int(is_leaf.sum())
        if not is_leaf[:L].all():
            raise ValueError("expected canonical ids: leaves 0..L-1")
        self.root = int(np.flatnonzero(par < 0)[0])
        # children CSR, ascending ids
        order = nonroot[np.argsort(par[nonroot], kind="stable")]
        self.children_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(nchild, out=self.children_ptr[1:])
        self.children = order
        # depth and levels by BFS
        depth = np.full(n, -1, dtype=np.int64)
        depth[self.root] = 0
        levels = [np.array([self.root])]
        while True:
            fr = levels[-1]
            c = nchild[fr]
            if c.sum() == 0:
                break
            nxt = np.sort(_children_of(fr, self.children_ptr, order, c))
            depth[nxt] = len(levels)
            levels.append(nxt)
        self.depth = depth
        self.levels = levels
        self.max_depth = len(levels) - 1
        # bottom-up plan: per level, children grouped by parent for np.add.reduceat
        self.up_plan = []
        for d in range(self.max_depth, 0, -1):
            lvl = levels[d]
            srt = lvl[np.argsort(par[lvl], kind="stable")]
            ps = par[srt]
            starts = np.flatnonzero(np.r_[True, ps[1:] != ps[:-1]])
            self.up_plan.append((srt, ps[starts], starts))
        # ancestors by depth (sentinel n below a node's depth)
        D = self.max_depth
        anc = np.full((n, D + 1), n, dtype=np.int64)
        anc[self.root, 0] = self.root
        for d in range(1, D + 1):
            lvl = levels[d]
            anc[lvl, :d] = anc[par[lvl], :d]
            anc[lvl, d] = lvl
        self.ancestors = anc
        leaf_anc = anc[:L]
        valid = leaf_anc < n
        cols = leaf_anc[valid]
        rows = np.broadcast_to(np.arange(L)[:, None], leaf_anc.shape)[valid]
        self.leaf_count = np.bincount(cols, minlength=n).astype(np.int64)
        ld = depth[rows]
        self.min_leaf_depth = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        self.max_leaf_depth = np.full(n, -1, dtype=np.int64)
        np.minimum.at(self.min_leaf_depth, cols, ld)
        np.maximum.at(self.max_leaf_depth, cols, ld)
        self.height = self.max_leaf_depth - depth
        self.information = np.log(L / self.leaf_count.astype(np.float64))
        self.leaf_depth = depth[:L]
        # a_n: the child of the root above n (n itself at depth <= 1)
        self.top = anc[:, 1].copy() if D >= 1 else np.arange(n)
        self.top[depth == 0] = self.root
        # preference orders used by tie rules: deeper first, then smaller id
        self.deep_first = np.lexsort((np.arange(n), -depth))
        # "most informative": fewer leaves, then deeper, then smaller id
        self.informative_first = np.lexsort((np.arange(n), -depth, self.leaf_count))
        # (depth, id) order: ancestors before descendants
        self.depth_order = np.lexsort((np.arange(n), depth))

    # -------------------------------------------------------------- per-sample sums
    def node_sums(self, leaf_values: np.ndarray) -> np.ndarray:
        """Bottom-up: out[n] = Σ_{l ∈ L(n)} leaf_values[l]; leaf_values (L,) or (L, E)."""
        out = np.zeros((self.num_nodes,) + leaf_values.shape[1:], dtype=np.float64)
        out[: self.num_leaves] = leaf_values
        for srt, uparents, starts in self.up_plan:
            out[uparents] = np.add.reduceat(out[srt], starts, axis=0)
        return out

    def node_sums_python(self, leaf_values: np.ndarray) -> np.ndarray:
        """The paper's ProbaNodes recursion, unrolled: a Python loop over the nodes, deepest level first."""
        par = self._parent_list()
        if leaf_values.ndim == 1:
            out = leaf_values.tolist() + [0.0] * (self.num_nodes - self.num_leaves)
            for node in self._bottom_up_list():
                out[par[node]] += out[node]
            return np.asarray(out)
        out = np.zeros((self.num_nodes,) + leaf_values.shape[1:], dtype=np.float64)
        out[: self.num_leaves] = leaf_values
        for node in self._bottom_up_list():
            out[par[node]] += out[node]
        return out

    def _parent_list(self):
        if not hasattr(self, "_plist"):
            self._plist = self.parent.tolist()
        return self._plist

    def _bottom_up_list(self):
        if not hasattr(self, "_bul"):
            self._bul = np.concatenate(self.levels[:0:-1]).tolist() if self.max_depth else []
        return self._bul

    def lca_depths(self, nodes) -> np.ndarray:
        """(len(nodes), L) depth of LCA(n, l) for every node n of ``nodes`` and every leaf l, O(len(nodes)·L·D)."""
        anc = self.ancestors[np.asarray(nodes, dtype=np.int64)]
        leaf_anc = self.ancestors[: self.num_leaves]
        return ((leaf_anc[None] == anc[:, None]) & (leaf_anc[None] < self.num_nodes)).sum(2) - 1


def _jaccard_knapsack(g, nxt, k):
    """Best closed set of exactly k of the candidates (in preorder, gains g, nxt the first position after
    each subtree): (value, positions)."""
    c = g.size
    f = np.full((c + 1, k + 1), -np.inf)
    f[:, 0] = 0.0
    take = np.zeros((c, k + 1), dtype=bool)
    for i in range(c - 1, 0, -1):
        with_i = g[i] + f[i + 1, :-1]
        without = f[nxt[i], 1:]
        take[i, 1:] = with_i >= without
        f[i, 1:] = np.where(take[i, 1:], with_i, without)
    members, i, j = [0], 1, k - 1
    while j > 0 and i < c:
        if take[i, j]:
            members.append(i)
            i, j = i + 1, j - 1
        else:
            i = nxt[i]
    return g[0] + f[1, k - 1], np.array(members)


def _children_of(frontier, ptr, order, counts):
    total = int(counts.sum())
    starts = np.repeat(ptr[frontier], counts)
    offs = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
    return order[starts + offs]


# ------------------------------------------------------------------ metric values
NODE_METRICS = tuple(name for name, facts in _LISTED.items() if facts["kind"] != "set")


def node_values(t: TreeTables, metric: str, nodes, **params) -> np.ndarray:
    """(len(nodes), L) float64 value m(n, y) of a node metric for every node n of ``nodes`` and leaf y.

    Straight from the definitions, with the 0/0 conventions of the library: Wu-Palmer of the
    single-node tree and Zhao with L = 1 are 1.  ``tree_distance_c`` takes ``c`` (default 0).
    """
    nodes = np.asarray(nodes, dtype=np.int64)
    L = t.num_leaves
    if metric == "accuracy":
        return (nodes[:, None] == np.arange(L)[None, :]).astype(np.float64)
    lcad = t.lca_depths(nodes)
    dn, dl = t.depth[nodes][:, None], t.leaf_depth[None, :]
    if metric in ("tree_distance", "tree_distance_c"):
        c = params.get("c", 0.0) if metric == "tree_distance_c" else 0.0
        return (dn + dl - 2 * lcad + c * dn).astype(np.float64)
    if metric == "wu_palmer":
        den = dn + dl
        return np.where(den > 0, 2.0 * lcad / np.maximum(den, 1), 1.0)
    lca = np.take_along_axis(np.broadcast_to(t.ancestors[:L][None], lcad.shape + (t.max_depth + 1,)),
                             lcad[..., None], 2)[..., 0]
    if metric == "lca_height":
        return t.height[lca].astype(np.float64)
    if metric == "zhao":
        den = t.information[nodes][:, None] + t.information[None, :L]
        return np.where(den > 0, 2 * t.information[lca] / np.maximum(den, 1e-300), 1.0)
    raise ValueError(f"{metric!r} is not one of the node metrics {NODE_METRICS}")


def dense_cost(t: TreeTables, metric: str, nodes=None, **params) -> np.ndarray:
    """(len(nodes), L) cost (lower is better; all N nodes by default) of a node metric: its value, or
    1 - value where higher is better, built like the paper's matrices."""
    nodes = np.arange(t.num_nodes) if nodes is None else np.asarray(nodes, dtype=np.int64)
    out = np.empty((nodes.size, t.num_leaves), dtype=np.float64)
    for a in range(0, nodes.size, 256):  # blocks of nodes keep the (block, L, D+1) comparison small
        v = node_values(t, metric, nodes[a:a + 256], **params)
        out[a:a + 256] = 1.0 - v if HIGHER_IS_BETTER[metric] else v
    return out


def expected_score(t: TreeTables, metric: str, pred, p: np.ndarray, **params) -> float:
    """Σ_l p(l) m(pred, l) in float64, O(L·D) (no N×L matrix).  pred: a node id, or a bool (N,) set for
    set metrics (a node id there means its root path)."""
    p = np.asarray(p, dtype=np.float64)
    L, n = t.num_leaves, t.num_nodes
    if metric in SET_METRICS:
        s = np.asarray(pred, dtype=bool)
        if s.ndim == 0 or s.shape != (n,):
            s = np.zeros(n, dtype=bool)
            s[t.ancestors[int(pred)][t.ancestors[int(pred)] < n]] = True
        padded = np.r_[s, False]
        inter = padded[t.ancestors[:L]].sum(1).astype(np.float64)
        k = float(s.sum())
        ysize = t.leaf_depth + 1.0
        if metric == "hf_beta":
            b2 = params.get("beta", 1.0) ** 2
            return float((p * (1 + b2) * inter / (k + b2 * ysize)).sum())
        if metric == "jaccard":
            return float((p * inter / (k + ysize - inter)).sum())
        return float((p * (k + ysize - 2 * inter) / ysize).sum())
    return float((p * node_values(t, metric, [int(pred)], **params)[0]).sum())


def hf_beta_safe_bound(t: TreeTables, beta: float) -> np.ndarray:
    """(N,) necessary condition of hF_β: n ∈ h* ⇒ p(n) ≥ (d_min(n) + 1) / ((D + 1)(1 + β²(D + 1)))."""
    return (t.min_leaf_depth + 1.0) / ((t.max_depth + 1.0) * (1 + beta * beta * (t.max_depth + 1.0)))


def hf_beta_value_bound(t: TreeTables, beta: float) -> np.ndarray:
    """(N,) τ(n): a non-root n of an optimal hF_β set of expected score U has p(n) ≥ τ(n)·U,
    τ(n) = (1 + β²(d_min(n) + 1)) / ((1 + β²)(1 + β²(D + 1)))."""
    b2 = beta * beta
    return (1 + b2 * (t.min_leaf_depth + 1.0)) / ((1 + b2) * (1 + b2 * (t.max_depth + 1.0)))


def pruning_thresholds(t: TreeTables, cost: np.ndarray):
    """Lemma 4.3 / Prop. E.6 statistics (m, M, m̲, M̲) of a dense cost, and whether the root form applies."""
    n, L = cost.shape
    par = np.maximum(t.parent, 0)
    delta = cost - cost[par]  # δ(n, l) = C(n, l) − C(π(n), l)
    leaf_anc = t.ancestors[:L]
    inside = leaf_anc.T[t.depth] == np.arange(n)[:, None]  # (N, L) l ∈ L(n)
    same_top = leaf_anc[:, 1][None, :] == t.top[:, None] if t.max_depth >= 1 else np.ones((n, L), bool)
    nonroot = t.depth > 0
    root_form = bool((np.isclose(delta, 0, atol=1e-12) | same_top | ~nonroot[:, None]).all())
    outside = ~inside & (same_top if root_form else True)
    with np.errstate(invalid="ignore"):
        m_in = np.where(inside, -delta, np.inf).min(1)
        M_in = np.where(inside, -delta, -np.inf).max(1)
        m_out = np.where(outside, delta, np.inf).min(1)
        M_out = np.where(outside, delta, -np.inf).max(1)
    has_out = outside.any(1)
    m_out[~has_out] = 0.0
    M_out[~has_out] = 0.0
    for a in (m_in, M_in, m_out, M_out):
        a[~nonroot] = 0.0
    return m_in, M_in, m_out, M_out, root_form


class Baselines:
    """Per-sample decoders on one tree.  Tree-only tables (cost matrices, thresholds) are built lazily, once."""

    def __init__(self, parents, traversal: str = "level"):
        if traversal not in ("level", "python"):
            raise ValueError(f"traversal must be 'level' or 'python', got {traversal!r}")
        self.t = parents if isinstance(parents, TreeTables) else TreeTables(parents)
        self.traversal = traversal
        self._sums = self.t.node_sums if traversal == "level" else self.t.node_sums_python
        self._cache: dict = {}

    def with_traversal(self, traversal: str) -> "Baselines":
        """The same baselines (sharing tree tables and dense matrices) with another node-sum traversal."""
        new = Baselines(self.t, traversal)
        new._cache = self._cache
        return new

    def _get(self, key, build):
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    # ------------------------------------------------------------ feasibility
    def dense_bytes(self, key: str) -> int:
        """Bytes of the dense tree table a baseline needs (0 if none)."""
        t = self.t
        name = key.split("[")[0]
        if name in ("wu_palmer", "zhao"):
            return 8 * t.num_nodes * t.num_leaves * 3  # cost + δ + masks while building thresholds
        if name in ("lca_height", "crm"):
            return 8 * t.num_leaves * t.num_leaves
        return 0

    # ------------------------------------------------------------ building blocks
    def node_probs(self, pl: np.ndarray) -> np.ndarray:
        return self._sums(pl)

    def node_probs_python(self, pl: np.ndarray) -> np.ndarray:
        return self.t.node_sums_python(pl)

    # ------------------------------------------------------------ optimal decoders
    def accuracy(self, pl):
        return int(np.argmax(pl))

    def lca_height(self, pl):
        H = self._get("lca_height", lambda: dense_cost(self.t, "lca_height", np.arange(self.t.num_leaves)))
        risk = H @ pl
        best = risk.min()
        ties = np.flatnonzero(risk == best)
        return int(ties[np.argmax(self.t.depth[ties])]) if ties.size > 1 else int(ties[0])

    def _deepest_above(self, pl, thr):
        p = self.node_probs(pl)
        idx = np.flatnonzero(p > thr)
        if idx.size == 0:
            return self.t.root
        return int(idx[np.argmax(self.t.depth[idx] * self.t.num_nodes - idx)])

    def tree_distance(self, pl):
        return self._deepest_above(pl, 0.5)

    def tree_distance_c(self, pl, c=1.0):
        return self._deepest_above(pl, (1 + c) / 2)

    def _pruned(self, metric):
        def build():
            cost = dense_cost(self.t, metric)
            m_in, M_in, m_out, M_out, root_form = pruning_thresholds(self.t, cost)
            return cost, m_in, M_in, m_out, M_out, root_form
        return self._get(("pruned", metric), build)

    def _candidates_then_brute_force(self, pl, metric):
        cost, m_in, M_in, m_out, M_out, root_form = self._pruned(metric)
        t = self.t
        p = self.node_probs(pl)
        s = p[t.top] if root_form else 1.0
        rest = np.maximum(s - p, 0.0)
        drop_self = M_in * p < m_out * rest  # p(n) < q_min(n) · s(n)
        drop_parent = m_in * p > M_out * rest  # p(n) > q_max(n) · s(n)
        drop_self[t.root] = False
        drop_parent[t.root] = False
        cand = ~drop_self
        cand[t.parent[drop_parent]] = False
        ids = np.flatnonzero(cand)
        risk = cost[ids] @ pl
        best = risk.min()
        ties = ids[risk == best]
        return int(ties[np.argmax(t.depth[ties] * t.num_nodes - ties)]) if ties.size > 1 else int(ties[0])

    def wu_palmer(self, pl):
        return self._candidates_then_brute_force(pl, "wu_palmer")

    def zhao(self, pl):
        return self._candidates_then_brute_force(pl, "zhao")

    def hf_beta(self, pl, beta=1.0):
        t = self.t
        depths = self._get("leaf_depths", lambda: np.unique(t.leaf_depth))
        group = self._get("leaf_group", lambda: np.searchsorted(depths, t.leaf_depth))
        b2 = beta * beta
        bound = self._get(("hf_bound", beta), lambda: hf_beta_safe_bound(t, beta))
        leaf = np.zeros((t.num_leaves, depths.size))
        leaf[np.arange(t.num_leaves), group] = pl
        q = self._sums(leaf)  # (N, E) mass of the leaves under n at each leaf depth
        p = q.sum(1)
        tau = self._get(("hf_tau", beta), lambda: hf_beta_value_bound(t, beta))
        keep = p >= bound * (1 - 1e-12)
        keep[t.root] = True
        e1 = depths + 1.0

        def best(mask):
            cands = t.depth_order[mask[t.depth_order]]  # (depth, id) order: ancestors first
            qc = q[cands]
            best_val, best_set = -1.0, cands[:1]
            for k in range(1, cands.size + 1):
                delta = qc @ ((1 + b2) / (k + b2 * e1))
                top = np.argsort(-delta, kind="stable")[:k]
                val = delta[top].sum()
                if val > best_val:
                    best_val, best_set = val, cands[top]
            return best_val, best_set

        lower, _ = best(keep & ((p >= tau) | (np.arange(t.num_nodes) == t.root)))
        second = keep & (p >= tau * lower * (1 - 1e-9))
        second[t.root] = True
        out = np.zeros(t.num_nodes, dtype=bool)
        out[best(second)[1]] = True
        return out

    def hamming(self, pl):
        t = self.t
        w_leaf = self._get("inv_depth", lambda: 1.0 / (t.leaf_depth + 1.0))
        w = self._sums(pl * w_leaf)
        return w > 0.5 * w[t.root]

    def _jaccard_tables(self):
        def build():
            t = self.t
            n = t.num_nodes
            size = np.ones(n, dtype=np.int64)
            for lvl in t.levels[:0:-1]:
                np.add.at(size, t.parent[lvl], size[lvl])
            before = np.concatenate([[0], np.cumsum(size[t.children])])  # over the CSR children array
            slot = np.empty(n, dtype=np.int64)
            slot[t.children] = np.arange(t.children.size)
            pre = np.zeros(n, dtype=np.int64)  # depth-first preorder, children by increasing id
            for lvl in t.levels[1:]:
                par = t.parent[lvl]
                pre[lvl] = pre[par] + 1 + before[slot[lvl]] - before[t.children_ptr[par]]
            depths = np.unique(t.leaf_depth)
            dmin = t.min_leaf_depth.astype(np.float64)
            tau = (dmin + 1) / (2 * dmin + t.max_depth + 1)
            tau[t.root] = 0.0
            return dict(pre=pre, end=pre + size, depths=depths.astype(np.float64),
                        group=np.searchsorted(depths, t.leaf_depth), tau=tau, dmin1=dmin + 1)
        return self._get("jaccard_tables", build)

    def jaccard(self, pl):
        t = self.t
        tb = self._jaccard_tables()
        pl = np.asarray(pl, dtype=np.float64)
        leaf = np.zeros((t.num_leaves, tb["depths"].size))
        leaf[np.arange(t.num_leaves), tb["group"]] = pl
        q = self._sums(leaf)  # (N, E) mass of the leaves under n at each leaf depth
        p = q.sum(1)
        depth, big_d, de = t.depth, t.max_depth, tb["depths"]
        slack = 1 - _JACCARD_SLACK

        def gains(nodes, k):
            """g_k of ``nodes`` (-inf where d(n) >= k)."""
            x = (k - depth[nodes])[:, None] + de[None, :]
            with np.errstate(divide="ignore", invalid="ignore"):
                w = np.where(x >= 1, (x + 1 + depth[nodes][:, None]) / (x * (x + 1)), 0.0)
            return np.where(depth[nodes] < k, (q[nodes] * w).sum(1), -np.inf)

        k_ref = int(np.rint(t.leaf_depth @ pl + 1))
        window = np.arange(-3, 4)
        # LB₀: the root paths along the most probable leaf's path
        y = int(np.argmax(pl))
        chain = t.ancestors[y][: depth[y] + 1]
        if big_d < 32:
            sizes = set(range(1, int(depth[y]) + 2))
        else:
            sizes = set(np.clip(k_ref + window, 1, depth[y] + 1).tolist()) | {int(depth[y]) + 1}
        lb0 = max(gains(chain[:k], k).sum() for k in sizes) * slack
        # the wide candidates, in preorder, and LB from their closed prefixes
        keep = p >= tb["tau"] * lb0
        keep[t.root] = True
        nodes = np.flatnonzero(keep)
        nodes = nodes[np.argsort(tb["pre"][nodes])]
        pos = np.full(t.num_nodes, -1)
        pos[nodes] = np.arange(nodes.size)
        key = gains(nodes, min(max(k_ref, 1), nodes.size))
        for i in range(1, nodes.size):  # a parent comes first in preorder
            key[i] = min(key[i], key[pos[t.parent[nodes[i]]]])
        order = np.argsort(-key, kind="stable")
        lb = max([lb0] + [gains(nodes[order[:k]], k).sum() * slack
                          for k in set(np.clip(k_ref + window, 1, nodes.size).tolist())])
        # the candidates; for each size the allowed nodes, the bounds and the knapsack
        cand = nodes[p[nodes] >= tb["tau"][nodes] * lb]
        nxt = np.searchsorted(tb["pre"][cand], tb["end"][cand])
        solved = []  # (k, value, positions)
        for k in range(1, cand.size + 1):
            cover = (q[t.root] * np.minimum(k, de + 1) / np.maximum(k, de + 1)).sum()
            if cover < lb * slack:
                continue
            g = gains(cand, k)
            allowed = p[cand] >= np.maximum(k, tb["dmin1"][cand]) / (2 * k + big_d - 1) * lb
            allowed[0] = True
            g[~allowed] = -np.inf
            if np.sort(g)[::-1][:k].sum() < lb * slack:
                continue
            solved.append((k,) + _jaccard_knapsack(g, nxt, k))
        top = max(v for _, v, _ in solved)
        members = next(s for s in solved if s[1] >= top - 4 * _JACCARD_SLACK * abs(top))[2]  # the smallest k
        out = np.zeros(t.num_nodes, dtype=bool)
        out[cand[members]] = True
        return out

    # ------------------------------------------------------------ heuristics
    def argmax_leaf(self, pl):
        return int(np.argmax(pl))

    def top_down(self, pl):
        t = self.t
        p = self.node_probs(pl)
        cur = t.root
        ptr, ch = t.children_ptr, t.children
        while ptr[cur + 1] > ptr[cur]:
            kids = ch[ptr[cur]:ptr[cur + 1]]
            cur = int(kids[np.argmax(p[kids])])
        return cur

    def confidence_threshold(self, pl, tau=0.5):
        if not 0 <= tau < 1:
            raise ValueError(f"tau must lie in [0, 1), got {tau}")
        p = self.node_probs(pl)
        order = self.t.informative_first
        ok = p[order] > tau
        return int(order[np.argmax(ok)]) if ok.any() else self.t.root

    def majority(self, pl):
        return self.confidence_threshold(pl, 0.5)

    def plurality(self, pl):
        # n qualifies iff every z ≠ n with p(z) >= p(n) is an ancestor of n; ancestors always have
        # p >= p(n), so iff #{z ≠ n : p(z) >= p(n)} == d(n).
        t = self.t
        p = self.node_probs(pl)
        srt = np.sort(p)
        count_ge = t.num_nodes - np.searchsorted(srt, p, side="left") - 1
        ok = (count_ge == t.depth)[t.informative_first]
        return int(t.informative_first[np.argmax(ok)]) if ok.any() else t.root

    def _argmax_deep(self, key):
        order = self.t.deep_first
        k = key[order]
        return int(order[np.argmax(k == k.max())])

    def darts(self, pl, lam=0.0):
        p = self.node_probs(pl)
        return self._argmax_deep((self.t.information + lam) * p)

    def expected_information(self, pl):
        return self.darts(pl, 0.0)

    def information_threshold(self, pl, threshold=0.0):
        allowed = self.t.information >= threshold
        if not allowed.any():
            raise ValueError(f"threshold {threshold} exceeds log(L) = {self.t.information.max()}")
        p = self.node_probs(pl)
        return self._argmax_deep(np.where(allowed, p, -np.inf))

    def hie(self, pl):
        t = self.t
        p = self.node_probs(pl)
        lp = t.parent[: t.num_leaves]
        lp = np.where(lp >= 0, lp, np.arange(t.num_leaves))
        return int(np.argmax(p[lp] * pl))

    def crm(self, pl):
        return self.lca_height(pl)

    # ------------------------------------------------------------ lookup
    def decoder(self, name: str, **params) -> Callable[[np.ndarray], object]:
        """The per-sample function for decoder ``name`` (metric names for optimal decoders): the method
        its class declares as its ``baseline`` (``"benchmarks.baselines:Baselines.<method>"``)."""
        facts = CATALOGUE["metrics"].get(name) or CATALOGUE["decoders"].get(name) or {}
        hook = facts.get("baseline") or ""
        prefix = "benchmarks.baselines:Baselines."
        if not hook.startswith(prefix):
            raise ValueError(f"{name!r} declares no baseline here (its `baseline`: {hook or None!r})")
        fn = getattr(self, hook[len(prefix):])
        if params:
            return lambda pl: fn(pl, **params)
        return fn
