"""Benchmark workloads: the bundled trees, synthetic large trees, and model-like probabilities."""

from __future__ import annotations

import time

import numpy as np

__all__ = ["SYNTHETIC", "random_tree", "load_tree", "model_like_probs", "TREE_ALIASES"]

# name -> generator parameters.  Depth and branching are drawn per level, leaves stop at
# several depths (unbalanced) and a few nodes have a single child (as in iNat19).
SYNTHETIC = {
    "synthetic-100k": dict(num_leaves=100_000, depth=12, seed=1),  # ~100k leaves, ~135k nodes, depth 12
    "synthetic-1m": dict(num_leaves=720_000, depth=16, seed=2),  # ~720k leaves, ~986k nodes, depth 16
    "synthetic-tiny": dict(num_leaves=300, depth=6, seed=3),  # ~280 leaves, ~450 nodes: the smoke test
}
TREE_ALIASES = {"tiered": "tieredimagenet-h", "inat": "inat19", "100k": "synthetic-100k", "1m": "synthetic-1m"}


def random_tree(num_leaves: int, depth: int, seed: int = 0, stop_prob: float = 0.15, min_stop_depth: int = 3,
                unary_prob: float = 0.02) -> np.ndarray:
    """A random parent array (root = node 0, ids in BFS order, not canonical) with about ``num_leaves`` leaves.

    Level by level, every frontier node below ``min_stop_depth`` may stop (become a leaf) with
    probability ``stop_prob``; the others get ``1 + Poisson(b_d - 1)`` children, with the mean
    branching ``b_d`` re-chosen at each level so that the leaves still missing are reached at
    ``depth``; a further ``unary_prob`` of the nodes get exactly one child.  Every node at
    ``depth`` is a leaf.
    """
    rng = np.random.default_rng(seed)
    parents = [np.array([-1], dtype=np.int64)]
    frontier = np.array([0], dtype=np.int64)
    next_id = 1
    leaves = 0
    for d in range(depth):
        if d >= min_stop_depth:
            stop = rng.random(frontier.size) < stop_prob
            leaves += int(stop.sum())
            frontier = frontier[~stop]
        remaining = max(num_leaves - leaves, frontier.size)
        b = max(1.0, (remaining / frontier.size) ** (1.0 / (depth - d)))
        k = 1 + rng.poisson(max(b - 1.0, 0.0) * (1 + unary_prob), frontier.size)
        k[rng.random(frontier.size) < unary_prob] = 1
        if d == 0:
            k[:] = max(2, int(k[0]))
        total = int(k.sum())
        parents.append(np.repeat(frontier, k))
        frontier = np.arange(next_id, next_id + total, dtype=np.int64)
        next_id += total
    return np.concatenate(parents)


def load_tree(name: str):
    """(Hierarchy, build seconds, parents source) for a bundled or synthetic tree name."""
    import hdecode_torch as hd

    name = TREE_ALIASES.get(name, name)
    if name in SYNTHETIC:
        par = random_tree(**SYNTHETIC[name])
        t0 = time.perf_counter()
        h = hd.Hierarchy.from_parents(par)
        return h, time.perf_counter() - t0
    t0 = time.perf_counter()
    h = hd.load_hierarchy(name)
    return h, time.perf_counter() - t0


def model_like_probs(ancestors: np.ndarray, depth: np.ndarray, num_leaves: int, batch: int, seed: int = 0) -> np.ndarray:
    """(B, L) float32 probabilities shaped like a trained classifier's outputs.

    Per row: Gaussian logits with a random temperature, a boost on a random "true" leaf and a
    smaller boost on the leaves of one of its ancestors (confusion among cousins), scaled by
    log L so that large trees get comparably peaked rows.  Rows range from confident (one
    leaf > 0.9) to diffuse (mass spread over a subtree), which exercises every decoder path.
    """
    rng = np.random.default_rng(seed)
    L = num_leaves
    logL = np.log(max(L, 2))
    out = np.empty((batch, L), dtype=np.float32)
    leaf_anc = ancestors[:L]
    for i in range(batch):
        logits = rng.standard_normal(L) * rng.uniform(0.5, 2.0)
        y = int(rng.integers(L))
        dy = int(depth[y])
        if dy >= 2:
            j = int(rng.integers(1, dy))
            under = leaf_anc[:, j] == ancestors[y, j]
            logits[under] += rng.uniform(0.0, 0.7) * logL
        logits[y] += rng.uniform(0.2, 1.2) * logL
        logits -= logits.max()
        e = np.exp(logits)
        out[i] = e / e.sum()
    return out


def label_matches(pattern: str, key: str) -> bool:
    """Whether ``pattern`` (a substring; ``opt:<metric>`` as earlier versions wrote it, a metric's optimal
    decoder) selects the row labelled ``key``."""
    if pattern.startswith("opt:"):
        return key.endswith("/optimal") and pattern[len("opt:"):] in key
    return pattern in key
