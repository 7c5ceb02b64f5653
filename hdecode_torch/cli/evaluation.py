"""Scoring every (metric, decoder) pair on one set of model outputs, with standard errors.

Heuristic predictions do not depend on the metric, so each heuristic decodes a chunk
once; each metric's optimal decoder decodes it once; one :class:`Posterior` per chunk
shares the node sums between all of them.  Per-sample values are reduced on the fly into
means and variances (Chan et al.'s pairwise update), including the variances of the
*paired* differences between decoders: all decoders see the same samples, so their
difference is measured far more precisely than each value on its own.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from ..core.posterior import Posterior
from ..core.spec import OPTIMAL, label
from ..core.topk import TopK
from ..kernels.ancestry import is_ancestor, path_counts
from ..metrics import has_optimal_decoder

__all__ = ["Evaluation", "Coverage", "evaluate", "has_optimal", "chunk_posterior", "topk_rows", "rows_probabilities",
           "answer_coverage", "OPTIMAL"]


class _Moments:
    """Running count, mean and sum of squared deviations of a batch of vectors, merged chunk by chunk."""

    def __init__(self):
        self.n = 0
        self.mean = None
        self.m2 = None

    def add(self, x: torch.Tensor) -> None:
        """x: (B, *) float64 samples along dim 0."""
        b = x.shape[0]
        if b == 0:
            return
        mean_b = x.mean(0)
        m2_b = ((x - mean_b) ** 2).sum(0)
        if self.n == 0:
            self.n, self.mean, self.m2 = b, mean_b, m2_b
            return
        n = self.n + b
        delta = mean_b - self.mean
        self.mean = self.mean + delta * (b / n)
        self.m2 = self.m2 + m2_b + delta ** 2 * (self.n * b / n)
        self.n = n

    def stderr(self) -> torch.Tensor:
        if self.n < 2:
            return torch.full_like(self.mean, math.nan)
        return (self.m2 / (self.n - 1) / self.n).sqrt()


@dataclass
class Coverage:
    """How often each decoder's answer misses the target, and how deep its answers are.

    ``decoders``: keys (the ``extra`` decoders first, then ``<metric key>/optimal`` per metric with an
    optimal decoder, then the heuristics); ``miss``/``miss_stderr``: (K,) float64 mean of 1{the target
    is not under the answer} and its standard error; ``depth``/``depth_stderr``: (K,) float64 mean
    depth of the answers (a node set: its nodes below the root).
    """

    decoders: list[str]
    miss: torch.Tensor
    miss_stderr: torch.Tensor
    depth: torch.Tensor
    depth_stderr: torch.Tensor


def answer_coverage(h, pred: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(miss, depth), both (B,) float64, of answers ``pred`` for ``targets`` (B,) int64 leaf ids.

    pred: (B,) int64 node ids (missed when the target is not under the node; its depth) or (B, N) bool
    ancestor-closed node sets (missed when a node of the set is not an ancestor of the target, which
    for the ancestor set of a node is the same; depth: the set's nodes below the root), dense or sparse
    COO (a set metric's top-k decision: read from its entries, O(nnz), never the (B, N) mask).
    """
    h = h.to(pred.device)  # the decoders answer on the probabilities' device (CUDA by default where present)
    if pred.dtype == torch.bool and pred.layout == torch.sparse_coo:
        rows, nodes = pred.coalesce().indices()
        size = torch.bincount(rows, minlength=pred.shape[0])
        on_path = torch.bincount(rows, weights=is_ancestor(h, nodes, targets[rows]).double(),
                                 minlength=pred.shape[0])
        return (on_path < size).double(), (size - 1).double()
    if pred.dtype == torch.bool:
        size = pred.sum(1)
        return (path_counts(h, pred, targets) < size).double(), (size - 1).double()
    return (~is_ancestor(h, pred, targets)).double(), h.depth[pred].double()


@dataclass
class Evaluation:
    """Means over samples of every (metric, decoder) pair.

    ``metrics``: metric objects (rows); ``decoders``: column keys, ``"optimal"`` first.
    ``mean``/``stderr``: (M, D) float64, NaN where a metric has no optimal decoder.
    ``paired_stderr[m, a, b]``: standard error of mean(value_a - value_b) on metric m.
    """

    metrics: list
    decoders: list[str]
    num_samples: int
    mean: torch.Tensor
    stderr: torch.Tensor
    paired_stderr: torch.Tensor
    available: torch.Tensor  # (M, D) bool
    coverage: Coverage | None = None

    def best(self, m: int) -> int:
        """Column of the best decoder for metric row ``m`` (first among exact ties)."""
        v = self.mean[m].clone()
        sign = 1.0 if self.metrics[m].higher_is_better else -1.0
        v = torch.where(self.available[m], sign * v, torch.full_like(v, -math.inf))
        return int(torch.argmax(v))

    def tied_with_best(self, m: int, z: float = 2.0) -> torch.Tensor:
        """(D,) bool: columns whose paired difference to the best is within ``z`` paired standard errors."""
        b = self.best(m)
        diff = (self.mean[m] - self.mean[m, b]).abs()
        tol = z * self.paired_stderr[m, :, b]
        return self.available[m] & ((diff <= tol) | (diff <= 1e-12))


def has_optimal(metric) -> bool:
    """Whether the metric has an exact Bayes-optimal decoder (declared by the metric's class)."""
    return has_optimal_decoder(metric)


_ROW = re.compile(r"\brow (\d+)")


def chunk_posterior(h, probs: torch.Tensor, start: int, stop: int, *, from_logits: bool, normalize: bool) -> Posterior:
    """The Posterior of rows ``start:stop``; an input error names the row of the whole input, not of the chunk."""
    try:
        return Posterior(h, probs[start:stop], from_logits=from_logits, normalize=normalize, name="probs")
    except ValueError as exc:
        if start == 0:
            raise
        raise ValueError(_ROW.sub(lambda m: f"row {int(m.group(1)) + start}", str(exc))) from None


def topk_rows(topk: TopK, start: int, stop: int) -> TopK:
    """Rows ``start:stop`` of a top-k list (its missing masses with them, the same prior)."""
    missing = None if topk.missing is None else topk.missing[start:stop]
    return TopK(topk.values[start:stop], topk.indices[start:stop], missing, topk.prior)


def rows_probabilities(h, probs: torch.Tensor, rows: torch.Tensor, *, from_logits: bool | str = False,
                       normalize: bool = False) -> torch.Tensor:
    """(b, L) checked probabilities of ``probs[rows]`` (rows: (b,) int64; softmax of logits, rows renormalised
    as asked); an input error names the row of the whole input."""
    try:
        return Posterior(h, probs[rows], from_logits=from_logits, normalize=normalize, name="probs").probs
    except ValueError as exc:
        raise ValueError(_ROW.sub(lambda m: f"row {int(rows[int(m.group(1))])}", str(exc))) from None


def evaluate(h, probs: torch.Tensor, targets: torch.Tensor, metrics: list, heuristics: list, *,
             batch_size: int = 4096, from_logits: bool = False, normalize: bool = False,
             progress=None, coverage: list | None = None) -> Evaluation:
    """Score ``optimal`` (per metric) and every heuristic on every metric.

    probs: (B, L) float on the compute device (logits with ``from_logits``), or a
    :class:`~hdecode_torch.TopK` of (B, k) lists (decoded as they are, by the metrics whose decoder takes
    one: the others' optimal column is unavailable, and every heuristic given must take one); targets:
    (B,) int64 on the same device.  Set metrics score a heuristic's node as its ancestor set.
    ``coverage``: decoders (e.g. a fitted RiskControl) whose answers are not scored on the metrics,
    only by their miss rate and depth (:class:`Coverage`), next to every other decoder's; None: no
    coverage.
    """
    topk = probs if isinstance(probs, TopK) else None
    optimal_ok = [has_optimal(m) and (topk is None or m.accepts_topk) for m in metrics]
    keys = [OPTIMAL] + [label(decoder=d) for d in heuristics]
    M, D = len(metrics), len(keys)
    single, paired, covered = _Moments(), _Moments(), _Moments()
    B = (probs.values if topk is not None else probs).shape[0]
    if B == 0:
        raise ValueError("no samples to evaluate")
    for start in range(0, B, batch_size):
        stop = min(start + batch_size, B)
        if topk is not None:
            post = topk_rows(topk, start, stop)
        else:
            post = chunk_posterior(h, probs, start, stop, from_logits=from_logits, normalize=normalize)
        y = targets[start:stop]
        preds = [d.decode(post) for d in heuristics]
        optimal = [m.decode(post) if ok else None for m, ok in zip(metrics, optimal_ok)]
        rows = []
        for m, opt in zip(metrics, optimal):
            # float64 values: the moments below are sums over every sample.
            value = (m(opt, y, dtype=torch.float64) if opt is not None
                     else torch.full((stop - start,), math.nan, dtype=torch.float64, device=y.device))
            rows.append(torch.stack([value] + [m(p, y, dtype=torch.float64) for p in preds], 1))
        values = torch.stack(rows, 1)  # (b, M, D) float64
        single.add(values)
        paired.add(values[:, :, :, None] - values[:, :, None, :])
        if coverage is not None:
            answers = [d.decode(post) for d in coverage] + [p for p in optimal if p is not None] + preds
            covered.add(torch.stack([torch.stack(answer_coverage(h, p, y), 1) for p in answers], 1))
        if progress is not None:
            progress.update(stop - start)
    available = torch.ones(M, D, dtype=torch.bool)
    available[:, 0] = torch.tensor(optimal_ok)
    cov = None
    if coverage is not None:  # (K, 2): miss, depth
        names = ([label(decoder=d) for d in coverage] + [label(m, OPTIMAL) for m, ok in zip(metrics, optimal_ok) if ok]
                 + keys[1:])
        mean, se = covered.mean.cpu(), covered.stderr().cpu()
        cov = Coverage(names, mean[:, 0], se[:, 0], mean[:, 1], se[:, 1])
    return Evaluation(metrics=metrics, decoders=keys, num_samples=B, mean=single.mean.cpu(),
                      stderr=single.stderr().cpu(), paired_stderr=paired.stderr().cpu(), available=available,
                      coverage=cov)
