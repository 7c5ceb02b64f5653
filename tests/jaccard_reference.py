"""Slow exact Jaccard decoding for one distribution: a plain tree knapsack over ALL nodes (NumPy).

No candidate pruning and no torch: an independent yardstick for the library's Jaccard decoder on
trees too large to enumerate (the bundled ones).  For every set size k it solves

    V(k) = max_{S closed, root ∈ S, |S| = k} Σ_{n ∈ S} g_k(n),
    g_k(n) = Σ_{y ∈ L(n)} p(y) (k + d(y) + 1) / ((k + d(y) − d(n)) (k + d(y) − d(n) + 1)),

by the textbook subtree knapsack (children merged by max-plus convolution, a node's table capped
at k − d(n) entries since its d(n) ancestors are in the set too).  It stops at the first k past
the deepest leaf's path length where G(k) = Σ_y p(y) min(k, d(y)+1) / max(k, d(y)+1), an upper
bound on E[J] of every set of size k that only decreases from there on, is below the best V found.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SlowJaccard"]


class SlowJaccard:
    """Per-tree tables (plain Python lists) for :meth:`solve`."""

    def __init__(self, parents):
        par = np.asarray(parents, dtype=np.int64)
        n = par.size
        self.n = n
        self.root = int(np.flatnonzero(par < 0)[0])
        self.children = [[] for _ in range(n)]
        for i in range(n):
            if par[i] >= 0:
                self.children[int(par[i])].append(i)
        depth = np.zeros(n, dtype=np.int64)
        order = [self.root]
        for v in order:  # BFS
            for c in self.children[v]:
                depth[c] = depth[v] + 1
                order.append(c)
        self.depth = depth
        self.bfs = order
        self.num_leaves = sum(1 for c in self.children if not c)
        self.leaf_depth = depth[: self.num_leaves]
        self.parent = par

    def masses(self, p_leaf):
        """(N, D+1) mass of the leaves under n at each absolute depth."""
        dmax = int(self.depth.max())
        q = np.zeros((self.n, dmax + 1))
        q[np.arange(self.num_leaves), self.leaf_depth] = p_leaf
        for v in reversed(self.bfs):
            if self.parent[v] >= 0:
                q[self.parent[v]] += q[v]
        return q

    def solve(self, p_leaf):
        """(best value, best set as a bool (N,) mask, best k) for one distribution (L,)."""
        p_leaf = np.asarray(p_leaf, dtype=np.float64)
        q = self.masses(p_leaf)
        dmax = q.shape[1] - 1
        ld = np.arange(dmax + 1, dtype=np.float64)
        qroot = q[self.root]
        best = (-1.0, None, 0)
        k = 1
        while k <= self.n:
            if k > dmax + 1:
                cover = (qroot * np.minimum(k, ld + 1) / np.maximum(k, ld + 1)).sum()
                if cover < best[0]:
                    break
            val, nodes = self._knapsack(q, k)
            if val > best[0]:
                best = (val, nodes, k)
            k += 1
        mask = np.zeros(self.n, dtype=bool)
        mask[best[1]] = True
        return best[0], mask, best[2]

    def _knapsack(self, q, k):
        dmax = q.shape[1] - 1
        ld = np.arange(dmax + 1, dtype=np.float64)
        tables, merges = {}, {}
        for v in reversed(self.bfs):
            d = int(self.depth[v])
            cap = k - d  # nodes of v's subtree in a size-k set
            if cap < 1:
                continue
            rel = ld - d
            ok = rel >= 0
            w = np.zeros(dmax + 1)
            w[ok] = (k + ld[ok] + 1) / ((k + rel[ok]) * (k + rel[ok] + 1))
            val = np.array([float(q[v] @ w)])  # val[j - 1]: best with j nodes of v's subtree, v taken
            steps = []
            for c in self.children[v]:
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
        val = tables[self.root]
        if val.size < k:
            return -np.inf, []
        nodes, stack = [], [(self.root, k)]
        while stack:
            v, j = stack.pop()
            nodes.append(v)
            for c, arg in reversed(merges[v]):
                t = int(arg[j - 1])
                if t:
                    stack.append((c, t))
                    j -= t
        return float(val[k - 1]), nodes
