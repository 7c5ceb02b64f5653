"""Top-k inputs: a classifier's k most probable leaves per row, and the distribution they stand for.

Very large heads are served as top-k lists (``probs.topk(k)``): k leaf ids and their probabilities per
row, the rest dropped.  :class:`TopK` holds such a list and states how the dropped mass is completed:
the missing mass m (by default 1 − Σ values) is spread over the L − k unlisted leaves uniformly, or in
proportion to a class prior π.  Decoding a TopK decodes that **completed** (B, L) distribution
exactly, without ever building it (:mod:`hdecode_torch.kernels.support`): the same decision, by
expected score, as the dense decoder on :meth:`TopK.completed`.  Whether that decision holds for every
completion the list is consistent with is its certificate (:meth:`CompletedTopK.polytope`,
:mod:`hdecode_torch.kernels.certificate`).

:class:`CompletedTopK` is a TopK bound to a hierarchy: its checks done, its listed leaves sorted for
the support kernels, in O(B·k·log k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.certificate import Polytope, completion_polytope
from ..kernels.support import listed_sums, node_mass, subtree_weights, unlisted_support, walk_up
from .chunking import chunk_ranges
from .plan import resolve_plan
from .conversion import as_tensor
from .row_checks import row_sum_tolerance

__all__ = ["TopK", "CompletedTopK", "TOPK_METRICS", "TOPK_DECODERS", "no_top_k_decoder"]

#: The metrics whose decode and expected accept a top-k input.
TOPK_METRICS = ("accuracy", "lca_height", "tree_distance", "tree_distance_c", "wu_palmer", "zhao", "hamming", "hf_beta",
                "jaccard", "cost_matrix")
#: The heuristic decoders that accept a top-k input (confidence_threshold at every tau).
TOPK_DECODERS = ("argmax_leaf", "top_down", "majority", "confidence_threshold", "crm", "plurality", "hie", "darts",
                 "expected_information", "information_threshold", "risk_control")


def no_top_k_decoder(what: str) -> ValueError:
    """The error of a component (``what``, e.g. "`hf_beta`") that cannot decode a top-k input."""
    return ValueError(f"{what} does not decode top-k inputs ({', '.join(TOPK_METRICS)} and the heuristics "
                      f"{', '.join(TOPK_DECODERS)} do): pass the dense (B, L) probabilities, e.g. "
                      "TopK(values, indices).completed(L) on a small tree")


def _floats(x, name):
    t = as_tensor(x, name)
    if not t.is_floating_point():
        raise TypeError(f"Expected `{name}` to be a floating-point tensor, but got dtype {t.dtype}")
    return t


@dataclass(frozen=True, eq=False)
class TopK:
    """A top-k list per row and its completion.

    values: (B, k) or (k,) float, the listed leaves' probabilities (non-negative, finite);
    indices: (B, k) or (k,) int leaf ids (class indices), distinct within a row, on the values' device;
    missing: None, a float or (B,) float: the mass of the unlisted leaves.  None: m = 1 − Σ values (a row
    summing above 1 within the row tolerance has m = 0).  Given: Σ values + m must be 1 within the row
    tolerance (a renormalised list is scaled by 1 − m first: nothing is renormalised here);
    prior: None (the missing mass spread uniformly over the unlisted leaves) or (L,) float non-negative
    weights: the unlisted leaf l gets m·π(l) / Σ_{unlisted} π.  A row with no unlisted leaf (k = L) or whose
    unlisted leaves all have weight 0 must have m = 0 within the row tolerance (that m is then left unspread).

    The result of ``probs.topk(k)`` (``torch.return_types.topk``) is accepted wherever a TopK is, as
    ``TopK(values, indices)``.  Construction checks types, shapes and every entry that needs no
    hierarchy (one host read); what needs L (ids below L, k ≤ L, row sums, the prior's length and its
    mass on each row's unlisted leaves) is checked when it is bound to a hierarchy (decode, expected).
    """

    values: torch.Tensor
    indices: torch.Tensor
    missing: torch.Tensor | float | None = None
    prior: torch.Tensor | None = None

    def __post_init__(self):
        values = _floats(self.values, "values")
        indices = as_tensor(self.indices, "indices")
        if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
            raise TypeError(f"Expected `indices` to hold integer leaf ids, but got dtype {indices.dtype}")
        if values.dim() not in (1, 2):
            raise ValueError(f"Expected `values` to have shape (B, k) or (k,), but got {tuple(values.shape)}")
        if indices.shape != values.shape:
            raise ValueError(f"Expected `indices` to have the shape of `values` {tuple(values.shape)}, but got "
                             f"{tuple(indices.shape)}")
        if values.shape[-1] == 0:
            raise ValueError("Expected `values` to list at least one leaf per row (k >= 1), but got k = 0")
        indices = indices.to(device=values.device, dtype=torch.long)
        missing = self.missing
        if missing is not None:
            if isinstance(missing, (int, float)) and not isinstance(missing, bool):
                missing = torch.tensor(float(missing), dtype=torch.float64, device=values.device)
            missing = _floats(missing, "missing").to(device=values.device, dtype=torch.float64)
            want = values.shape[:-1]
            if missing.dim() != 0 and tuple(missing.shape) != tuple(want):
                raise ValueError(f"Expected `missing` to be a float or have shape {tuple(want)} (one per row), but "
                                 f"got {tuple(missing.shape)}")
            missing = missing.expand(want)
        prior = self.prior
        if prior is not None:
            prior = _floats(prior, "prior").to(values.device)
            if prior.dim() != 1:
                raise ValueError(f"Expected `prior` to have shape (L,) (one weight per leaf), but got "
                                 f"{tuple(prior.shape)}")
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "missing", missing)
        object.__setattr__(self, "prior", prior)
        v2 = values.reshape(-1, values.shape[-1])
        s = indices.reshape(v2.shape).sort(1).values
        flags = [torch.isfinite(v2).all(), (v2 >= 0).all(), (s[:, 1:] != s[:, :-1]).all()]
        if missing is not None:
            flags += [torch.isfinite(missing).all() & (missing >= 0).all()]
        if prior is not None:
            flags += [torch.isfinite(prior).all() & (prior >= 0).all()]
        ok = torch.stack(flags).tolist()  # the one host read
        if not ok[0]:
            raise ValueError("Expected `values` to be finite, but got NaN or infinite entries")
        if not ok[1]:
            raise ValueError(f"Expected `values` to be non-negative probabilities, but got {v2.min().item():g} "
                             "(logits? take the top-k of the softmax)")
        if not ok[2]:
            row = int(((s[:, 1:] == s[:, :-1]).any(1)).nonzero()[0, 0])
            raise ValueError(f"Expected `indices` to be distinct within each row, but row {row} lists a leaf twice")
        if missing is not None and not ok[3]:
            flat = missing.reshape(-1)
            bad = flat[~(torch.isfinite(flat) & (flat >= 0))][0].item()
            raise ValueError(f"Expected `missing` to be finite and >= 0, but got {bad}")
        if prior is not None and not ok[-1]:
            raise ValueError("Expected `prior` to be finite and >= 0")

    @classmethod
    def of(cls, x) -> "TopK | None":
        """``x`` as a TopK if it is one or a ``torch.return_types.topk`` result, else None."""
        if isinstance(x, TopK):
            return x
        if isinstance(x, torch.return_types.topk):
            return cls(x.values, x.indices)
        return None

    @property
    def unbatched(self) -> bool:
        return self.values.dim() == 1

    @property
    def k(self) -> int:
        return self.values.shape[-1]

    def _rows(self):
        """(values (B, k), indices (B, k), missing (B,) float64 or None)."""
        v, i = self.values, self.indices
        m = self.missing
        if self.unbatched:
            v, i, m = v[None], i[None], (None if m is None else m.reshape(1))
        return v, i, m

    def missing_mass(self) -> torch.Tensor:
        """(B,) (or ()) float64 m: the given ``missing``, else 1 − Σ values (0 where the row sums above 1)."""
        v, _, m = self._rows()
        if m is None:
            m = (1 - v.to(torch.float64).sum(1)).clamp_min(0)  # above 1 by rounding: nothing missing
        return m[0] if self.unbatched else m

    def completed(self, num_leaves: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The completed distribution as a dense (B, L) table (or (L,)), O(B·L): for small trees and tests.

        ``dtype``: the table's (default: the values' dtype).  Listed leaves hold their values, the
        unlisted ones m / (L − k) each, or m·π(l) / Σ_{unlisted} π with a prior.
        """
        v, i, _ = self._rows()
        dtype = dtype or v.dtype
        bsz, k = v.shape
        m = self.missing_mass().reshape(-1)
        listed = torch.zeros(bsz, num_leaves, dtype=torch.bool, device=v.device)
        listed.scatter_(1, i, True)
        if self.prior is None:
            w = (~listed).to(torch.float64)
        else:
            w = torch.where(listed, 0.0, self.prior.to(torch.float64)[None, :])
        total = w.sum(1, keepdim=True)
        out = torch.where(total > 0, m[:, None] * w / total.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
        out = out.to(dtype).scatter(1, i, v.to(dtype))
        return out[0] if self.unbatched else out


class CompletedTopK:
    """A :class:`TopK` bound to a hierarchy: checked against it, its listed leaves sorted for the support
    kernels.

    Attributes: ``h`` (on the values' device), ``values`` (B, k) float64, ``indices`` (B, k) int64,
    ``missing`` (B,) float64, ``prior`` None or (L,) float64, ``weights`` (N,) float64 W(n), ``listed``
    (:class:`~hdecode_torch.kernels.support.Listed`), ``unbatched``, ``dtype`` (the values' compute dtype:
    float64 kept, float32 otherwise), ``compact`` (the CPU plan: the kernels select entries; the GPU plan:
    they mask them, with no host read per selection).  O(B·k·log k) (+ O(N) with a prior).
    """

    def __init__(self, h, topk: TopK, validate: bool = True):
        values, indices, _ = topk._rows()
        self.h = h.to(values.device)
        nl = self.h.num_leaves
        k = values.shape[1]
        self.unbatched = topk.unbatched
        self.dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
        self.in_dtype = values.dtype
        self.k = k
        if k > nl:
            raise ValueError(f"Expected `indices` to list at most L = {nl} leaves per row (the hierarchy's leaves), "
                             f"but got k = {k}")
        prior = topk.prior
        if prior is not None and prior.shape[0] != nl:
            raise ValueError(f"Expected `prior` to have {nl} entries (one per leaf of the hierarchy), but got "
                             f"{prior.shape[0]}")
        self.values = values.to(torch.float64)
        self.indices = indices
        self.missing = topk.missing_mass().reshape(-1)
        self.prior = None if prior is None else prior.to(torch.float64)
        self.weights = subtree_weights(self.h, self.prior)
        if validate:
            self._check(topk)
        # the GPU plan keeps the kernels' entries masked rather than selected: no host read per selection
        self.compact = resolve_plan(self.h, values.device).name == "cpu"
        self.listed = listed_sums(self.h, self.values, indices, self.missing, self.prior, self.compact)

    def _check(self, topk: TopK) -> None:
        nl = self.h.num_leaves
        tol = row_sum_tolerance(self.in_dtype, nl)
        sums = self.values.sum(1)
        flags = [((self.indices >= 0) & (self.indices < nl)).all(), (sums <= 1 + tol).all()]
        if topk.missing is not None:
            flags.append(((sums + self.missing - 1).abs() <= tol).all())
        if self.prior is None:
            flags.append(torch.tensor(self.k < nl, device=sums.device) | (self.missing <= tol).all())
        else:
            # a missing mass within the tolerance is rounding: with nowhere to go it stays unspread, the row then
            # summing to 1 within the tolerance, as a dense row may
            flags.append(((unlisted_support(self.prior, self.indices) > 0) | (self.missing <= tol)).all())
        ok = torch.stack(flags).tolist()  # the one host read
        if not ok[0]:
            bad = self.indices[(self.indices < 0) | (self.indices >= nl)][0].item()
            raise ValueError(f"Expected `indices` to be leaf ids in 0..{nl - 1}, but got {bad}")
        if not ok[1]:
            row = int((sums > 1 + tol).nonzero()[0, 0])
            raise ValueError(f"Expected the `values` of each row to sum to at most 1 (tolerance {tol:.1e}), but row "
                             f"{row} sums to {sums[row].item():.6g}")
        if topk.missing is not None and not ok[2]:
            row = int(((sums + self.missing - 1).abs() > tol).nonzero()[0, 0])
            raise ValueError(f"Expected `values` + `missing` to sum to 1 in each row (tolerance {tol:.1e}), but row "
                             f"{row} sums to {(sums[row] + self.missing[row]).item():.6g} (scale a renormalised "
                             "list by 1 - missing)")
        if self.prior is None and not ok[-1]:
            row = int((self.missing > tol).nonzero()[0, 0])
            raise ValueError(f"Expected the `values` of each row to sum to 1 when every leaf is listed (k = L = {nl}), "
                             f"but row {row} sums to {sums[row].item():.6g}: no unlisted leaf can hold the rest")
        if self.prior is not None and not ok[-1]:
            raise ValueError("Expected `prior` to give positive mass to the unlisted leaves of every row with "
                             "missing mass, but some row lists every leaf the prior weighs")

    @property
    def batch_size(self) -> int:
        return self.values.shape[0]

    def chunk(self, start: int, stop: int) -> "CompletedTopK":
        """The rows ``start:stop`` (no re-validation)."""
        if start == 0 and stop == self.batch_size:
            return self
        new = object.__new__(CompletedTopK)
        new.__dict__.update(self.__dict__)
        new.values, new.indices = self.values[start:stop], self.indices[start:stop]
        new.missing, new.unbatched = self.missing[start:stop], False
        new.listed = listed_sums(self.h, new.values, new.indices, new.missing, self.prior, self.compact)
        return new

    def node_mass(self, nodes: torch.Tensor) -> torch.Tensor:
        """(B, J) float64 p̃ of (B, J) int64 node ids, row by row (O(B·J·log k))."""
        return node_mass(self.h, self.listed, self.weights, nodes)

    def polytope(self) -> Polytope:
        """The completions the list is consistent with (each unlisted leaf at most c = max(v_k, m/|U|), their
        total m), for ``decode(..., certify=True)``: see :mod:`hdecode_torch.kernels.certificate`.  O(B·k)."""
        return completion_polytope(self.h.num_leaves, self.values, self.missing, self.prior is None)

    def root_paths(self, nodes: torch.Tensor) -> torch.Tensor:
        """(B, D+1) int64: column s is the ancestor s levels above each of the (B,) nodes (the root repeated)."""
        return walk_up(self.h, nodes, self.h.max_depth)

    def expected_leaf_depth(self) -> torch.Tensor:
        """(B,) float64 E_q[d(y)]: the listed leaves' depths by their values, r·Σ_{unlisted} w(l)·d(l)."""
        h = self.h
        depth = h.leaf_depth.to(torch.float64)
        if self.prior is None:
            total = h.cached("topk_depth_sum", lambda: depth.sum())
            w_listed = torch.ones_like(self.values)
        else:
            total = (self.prior * depth).sum()
            w_listed = self.prior[self.indices]
        d = depth[self.indices]
        listed = (self.values * d).sum(1)
        unlisted = (total - (w_listed * d).sum(1)).clamp_min(0)  # a prior's sums may round below 0
        return listed + self.listed.rate * unlisted

    def chunks(self, chunk_size: int | None = None) -> list[tuple[int, int]]:
        """Row ranges whose support tables fit the plan's memory budget (``chunk_size`` overrides it)."""
        budget = resolve_plan(self.h, self.values.device).budget
        return chunk_ranges(self.batch_size, self.bytes_per_row(), budget, chunk_size)

    def bytes_per_row(self) -> int:
        """Bytes of temporaries per row of a support decode: at most about 20 float64/int64 tables of k·(D+1)
        entries at once (ancestors, run ends, masses, path sums, the sort of the support: LCA height's peak)."""
        return 20 * 8 * self.k * (self.h.max_depth + 1) + 64

