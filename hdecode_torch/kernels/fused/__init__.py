"""Fused row kernels: gathered float64 prefix sums, a fused ranked-threshold decision, a row check
(each row non-negative, free of NaN, its float64 sum within bounds: one flag per row),
the exact hF_β and Jaccard solvers over packed candidates, a fused root-path-score decoder and
Wu-Palmer's structural decoder.

Seven torch ops in the ``hdecode`` namespace, batch-major (rows are samples; every scan runs along
the last, contiguous dimension), each with a torch implementation (CPU, and CUDA when Triton is
missing or disabled) and, but for ``wu_palmer_best``, a Triton kernel on CUDA (one program per row,
``jaccard_sets`` a program per rows of a budget;
any row length: a long row is scanned in tiles carrying its running float64 sum).  Importing this package registers the ops;
it does not import Triton, ``torch._dynamo`` or ``torch._inductor`` (Triton is imported on the
first CUDA call).  Everything is deterministic: no atomics, fixed summation orders.  The torch
implementations process the rows they are given in one go; callers bound the batch by their
memory budget.

The one primitive is a range sum over a gathered, weighted prefix.  For a row ``x_b`` (M values),
``src`` (J indices), ``weight`` (J) and ranges ``[lo[k], hi[k])``::

    C_b[0] = 0,  C_b[j+1] = C_b[j] + weight[j]·x_b[src[j]]      (float64)
    out[b, k] = C_b[hi[k]] - C_b[lo[k]]          (a range of one entry: weight[lo]·x_b[src[lo]], exact)

With the right index arrays (built once per tree) this is, for a tree with N nodes and L leaves:

- node probabilities ``p(n) = Σ_{leaves l under n} p(l)``: ``src`` = the leaves in depth-first
  order, ``[lo[n], hi[n])`` = the leaves of n in that order (x = leaf probabilities, K = N); a
  node with a single leaf below it holds exactly that leaf's value;
- masses per (node, leaf depth): ``src`` = leaves sorted by (depth, depth-first position), one
  range per pair (K = N·E for E leaf depths);
- weighted sums ``Σ_{l under n} w(l)·p(l)``, e.g. ``w = 1/(d(l)+1)``, through ``weight``;
- subtree sums of node values: ``src`` = the preorder, ranges = subtrees (x = node values);
- root-path sums ``S(n) = Σ_{a ancestor of n, n included} v(a)`` through an Euler tour: ``src``
  = the 2N tour entries (each node on entry with weight +1 and on exit with weight -1),
  ``lo = None``, ``hi[n]`` = entry position of n + 1.

The cost is O(B·(J + K)) with one read of x (no (B, N) intermediate for the decision op).

Two decoders are built on it.  ``path_score_best`` chains two range sums: node probabilities p(n),
``v(a) = alpha[a]·p(parent(a)) + beta[a]·p(a)``, the root-path sum ``S(n)`` of v through the Euler
tour, and ``score(n) = gamma[n]·S(n) + delta[n]·p(n)``, then picks the best allowed node: the
structural decoders of Zhao's similarity and of the LCA height (Karthik et al.'s CRM).
``hf_beta_best_k`` is the exact per-sample hF_β solver over packed candidates (Plaud et al. 2025,
§4.2): for every set size k the sum V(k) of the k largest ``Δ_k(c) = Σ_e q[c, e] / (r·k + (1−r)(d_e+1))``,
and the smallest k maximising it.  ``jaccard_sets`` is the exact Jaccard solver over packed
candidates: per-size node bounds, gains, a size screen and the tree knapsack of the (sample, size)
pairs left (its torch implementation steps over candidate positions, all pairs at once; its
Triton kernel solves a row's whole problem in one program, knapsack tables in scratch memory).

Only ``gathered_prefix`` has an autograd formula: the others serve decoding and checks, not training.

Layout: one folder per op, ``<op>/__init__.py`` (schema, public wrapper, argument checks, torch
implementation, fake kernel, autograd if any, and the ``register`` call) and ``<op>/triton.py``
(the Triton kernel and its ``launch``, same arguments as the op; imported on the first CUDA call).
Shared: ``_registry.py`` (``register``: define, the torch implementation for every backend, the
CUDA dispatch, the fake kernel; ``SCHEMAS``; the Triton switch), ``_checks.py`` (argument and
index checks, :func:`trust_indices`, index tables derived once per tree) and ``_triton.py`` (the
tiled float64 prefix scans and range sums the kernels share).  A new op is a new folder imported
below; it is tested like the others: its torch implementation against a NumPy reference (wide
batches, edge shapes, errors), ``torch.compile(fullgraph=True)``, ``torch.export`` and
``torch.library.opcheck``, its Triton kernel under ``TRITON_INTERPRET=1`` against the torch
implementation (tests/triton_testing.py runs the interpreter in a subprocess) with rows longer than
one tile, and compiled ahead of time for sm_90.

Ops (schemas as registered)::

    hdecode::gathered_prefix(Tensor x, Tensor src, Tensor? weight, Tensor hi, Tensor? lo,
                             ScalarType out_dtype) -> Tensor
    hdecode::best_ranked_above(Tensor x, Tensor src, Tensor hi, Tensor? lo, Tensor rank,
                               float threshold, int fallback) -> Tensor
    hdecode::row_check(Tensor x, float lo, float hi) -> Tensor
    hdecode::hf_beta_best_k(Tensor q, Tensor count, Tensor depths, float r) -> (Tensor, Tensor)
    hdecode::path_score_best(Tensor x, Tensor src, Tensor hi, Tensor lo, Tensor parent, Tensor alpha,
                             Tensor beta, Tensor euler_src, Tensor sign, Tensor at, Tensor gamma,
                             Tensor delta, Tensor allowed, Tensor rank, bool higher_is_better) -> Tensor
    hdecode::jaccard_sets(Tensor q, Tensor ids, Tensor count, Tensor lb, Tensor k_ref, Tensor pre,
                          Tensor end, Tensor depth, Tensor dmin1, Tensor depths, int max_depth,
                          float mass_abs) -> Tensor
    hdecode::wu_palmer_best(Tensor x, Tensor src, Tensor hi, Tensor lo, Tensor depth, Tensor leaf_depths,
                            Tensor euler_src, Tensor sign, Tensor at, Tensor rank) -> Tensor

Each op's folder shares its name with the op's public function, which the package exports in its
place: ``from hdecode_torch.kernels.fused import gathered_prefix`` is the function, its parts are
``hdecode_torch.kernels.fused.gathered_prefix.<name>`` (``from ... import``).
"""

from __future__ import annotations

from ._checks import trust_indices
from ._registry import SCHEMAS, set_triton_enabled, triton_available
from .gathered_prefix import gathered_prefix
from .best_ranked_above import best_ranked_above
from .row_check import row_check
from .hf_beta_best_k import hf_beta_best_k
from .path_score_best import path_score_best
from .jaccard_sets import jaccard_sets
from .wu_palmer_best import wu_palmer_best

__all__ = ["gathered_prefix", "best_ranked_above", "row_check", "hf_beta_best_k", "path_score_best", "jaccard_sets",
           "wu_palmer_best",
           "trust_indices", "triton_available", "set_triton_enabled", "SCHEMAS"]
