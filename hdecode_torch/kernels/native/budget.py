"""The native kernels' scratch memory, in bytes, as functions of their inputs, and the check against the memory
budget (:func:`~hdecode_torch.get_memory_budget`).

The kernels allocate their buffers in C (``malloc``/``calloc``), where the torch profiler and allocator statistics
do not see them; each formula below is read off the kernel's allocations (source files beside this one) and is
exact up to the allocator's own rounding.  A wrapper runs its kernel only where :func:`fits` says its scratch is
within the budget, else it returns None and the caller runs the torch path, which chunks its work by the budget and
gives the same decisions (the kernels compute the torch path's arithmetic; tests compare them).  Why: with
``set_memory_budget`` a caller bounds what one decoder call allocates; a buffer that scales with the tree (8 rows of
N values) would otherwise pass that bound unseen on large trees.

Notation: N nodes, L leaves, J entries of a table of sources (``2J + 1`` prefix slots), T the Euler tour's length,
E leaf depths, C candidates of a row, A a knapsack pair's allowed candidates, k its nodes left to choose.
"""

from __future__ import annotations

__all__ = ["LANES", "fits", "node_sums_scratch", "depth_prefix_scratch", "gathered_prefix_scratch", "path_argbest_scratch",
           "path_score_best_scratch", "wu_palmer_best_scratch", "hf_beta_rows_scratch", "jaccard_pair_scratch", "jaccard_scratch_bound"]

#: Rows a native node kernel carries together (``HD_LANES`` in ``hdecode_native.h``).
LANES = 8

#: The memory budget the scratch is held to, in bytes: ``core.plan`` keeps it equal to
#: :func:`~hdecode_torch.get_memory_budget` (``set_memory_budget`` sets both), as the kernels sit below ``core``
#: and do not import it.
_LIMIT = [512 * 2**20]


def set_limit(num_bytes: int) -> None:
    """Hold the native kernels' scratch to ``num_bytes`` (called by ``set_memory_budget``)."""
    _LIMIT[0] = int(num_bytes)


def fits(num_bytes: int, budget: int | None = None) -> bool:
    """Whether ``num_bytes`` of scratch is within ``budget`` (default: the memory budget in force, so that
    ``set_memory_budget`` takes effect at once).  O(1)."""
    return num_bytes <= (_LIMIT[0] if budget is None else budget)


def node_sums_scratch(num_nodes: int, acc_size: int) -> int:
    """Bytes of ``hd_node_sums`` / ``hd_deepest_above`` / ``hd_above_root_share`` (``hdecode_native.c``): one
    accumulator table of ``LANES`` rows, ``8 · N · acc_size`` (acc_size: bytes of the accumulation dtype)."""
    return LANES * num_nodes * acc_size


def depth_prefix_scratch(num_leaves: int) -> int:
    """Bytes of ``hd_depth_prefix`` (``hdecode_native.c``): the prefix sums of 4 rows at a time, ``4 · L`` float64
    (L taken as at least 1)."""
    return 4 * max(num_leaves, 1) * 8


def path_argbest_scratch(num_nodes: int, in_size: int, acc_size: int) -> int:
    """Bytes of ``hd_path_argbest`` (``node_scores.c``): the accumulators ``8 · N · acc_size`` and two tables of
    node values ``2 · 8 · N · in_size`` (in_size: bytes of the values' dtype)."""
    return LANES * num_nodes * (acc_size + 2 * in_size)


def gathered_prefix_scratch(num_src: int) -> int:
    """Bytes of ``hd_gathered_prefix`` (``range_sums.c``): the table ``[0 | C | g]`` of 8 rows, ``8 · (2J + 1)``
    float64."""
    return LANES * (2 * num_src + 1) * 8


def path_score_best_scratch(num_src: int, num_nodes: int, tour_len: int) -> int:
    """Bytes of ``hd_path_score_best`` (``node_scores.c``): ``8 · (2J + 1 + 2N + T + 1)`` float64."""
    return LANES * (2 * num_src + 1 + 2 * num_nodes + tour_len + 1) * 8


def wu_palmer_best_scratch(num_src: int, num_nodes: int, tour_len: int, value_size: int) -> int:
    """Bytes of ``hd_wu_palmer_best`` (``node_scores.c``): ``8 · (2J + 1 + T + 1)`` float64 and ``2 · 8 · N``
    values of ``value_size`` bytes."""
    return LANES * ((2 * num_src + 1 + tour_len + 1) * 8 + 2 * num_nodes * value_size)


def hf_beta_rows_scratch(num_nodes: int, num_depths: int, max_c: int) -> int:
    """Bytes of ``hd_hf_beta_rows`` (``hf_beta.c``), shared by all rows: per node an int64 candidate, two
    (float64, int64) rankings and three float64 (prefix values, bounds, Δ_k): ``64 · N``; per leaf depth the
    weights of one k and their running sums, ``16 · E``, and the weight table of k = 0..min(max_c, N) with its
    offsets, ``8 · E · (min(max_c, N) + 2)`` (each count taken as at least 1, as the kernel does)."""
    n, e = max(num_nodes, 1), max(num_depths, 1)
    return 64 * n + 16 * e + 8 * e * (min(max_c, num_nodes) + 2)


def jaccard_pair_scratch(allowed: int, k: int, num_candidates: int, value_size: int) -> int:
    """Bytes of ``hd_jaccard_knapsack`` (``jaccard.c``) for a pair with A = ``allowed`` candidates and k nodes left
    (A > k; else no table): the F table and its decisions over A + 1 positions of w = min(k + 1, A − k + 1) states,
    ``(A + 1) · w · (value_size + 1)``, plus the per-call buffers ``C · value_size + 32 · (C + 1)``.  A call's peak
    is the largest over its pairs (the tables are grown, never held twice)."""
    extra = max(num_candidates, 1) * value_size + 32 * (num_candidates + 1)
    if allowed <= k:
        return extra
    width = min(k + 1, allowed - k + 1)
    return (allowed + 1) * width * (value_size + 1) + extra


def jaccard_scratch_bound(num_candidates: int, value_size: int) -> int:
    """An upper bound on :func:`jaccard_pair_scratch` over every pair of rows with C candidates: A ≤ C and
    w = min(k + 1, A − k + 1) ≤ ⌊(A + 2) / 2⌋, so ``(C + 1) · ⌊(C + 2) / 2⌋ · (value_size + 1)`` plus the
    per-call buffers.  O(1): the wrappers check it before reading any pair."""
    c = num_candidates
    return (c + 1) * ((c + 2) // 2) * (value_size + 1) + max(c, 1) * value_size + 32 * (c + 1)
