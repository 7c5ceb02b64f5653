"""``hdecode::jaccard_sets``: the best Jaccard set of each row's packed candidates (the exact solver).

For an ancestor-closed set S of size k the expected Jaccard index is additive over its nodes,
E[J(S)] = Σ_{a ∈ S} g_k(a) with g_k(a) = Σ_e Q_e(a) [1/(m + d_e) + d(a)/((m + d_e)(m + d_e + 1))],
m = k − d(a) ≥ 1 (Q_e(a) the mass of a's leaves at the e-th leaf depth d_e), so the best set of each
size is a maximum-weight rooted subtree of k nodes, a tree knapsack, and the optimum is the best size
(the proofs, bounds and tie rules are in ``hdecode_torch.metrics.jaccard``).  This op runs that
solver on packed candidate tables: lb raised to the best closed prefix of the candidates at the
sizes around the typical one (:func:`closed_prefix_bound`), the nodes allowed at each size by the proved
bound p(n) ≥ τ_k(n)·lb, the sizes whose upper bound reaches lb, the knapsack of every (row, size) pair
left, and the smallest size whose value is within float64 rounding of the best.  All in float64.
"""

from __future__ import annotations

import ctypes

import numpy as np
import torch

from ... import native
from .._checks import check_bounds, check_float_tensor, check_vector, derived
from .._registry import call, register

__all__ = ["jaccard_sets", "jaccard_sets_torch", "row_slacks", "gains", "gain_weights", "size_bound", "knapsack", "knapsack_sets", "knapsack_band", "walk", "walk_band", "closed_prefix_bound", "group_widths", "SCHEMA"]

SCHEMA = ("jaccard_sets(Tensor q, Tensor ids, Tensor count, Tensor lb, Tensor k_ref, Tensor pre, Tensor end, "
          "Tensor depth, Tensor dmin1, Tensor depths, int max_depth, float mass_rel, float mass_abs, int budget) -> Tensor")

#: Depth given to padding columns: above every size k.
PAD_DEPTH = 1 << 20

# The CPU-only paths below read CPU tensors on the host (NumPy views, each row group's pairs): no device
# to wait for, and never run on a GPU, so they call these directly rather than the Tensor attributes
# a host-read counter (the GPU cost model) wraps; what it counts is then what a GPU call would read.
_numpy = torch.Tensor.numpy
_tolist = torch.Tensor.tolist


def jaccard_sets(q: torch.Tensor, ids: torch.Tensor, count: torch.Tensor, lb: torch.Tensor, k_ref: torch.Tensor,
                 pre: torch.Tensor, end: torch.Tensor, depth: torch.Tensor, dmin1: torch.Tensor,
                 depths: torch.Tensor, max_depth: int, mass_rel: float, mass_abs: float,
                 budget: int = 1 << 29) -> torch.Tensor:
    """The best Jaccard set of each row over its packed candidates (``hdecode::jaccard_sets``).

    Args:
        q: (B, C, E) float64 per-leaf-depth masses of the candidates ``ids``.
        ids: (B, C) int64 node ids in [0, N], the first ``count[b]`` of row b real, ancestor-closed and
            in preorder (root first); the other columns are ignored.
        count: (B,) int64 in [1, C] (or 0 for a row without candidates).
        lb: (B,) float64, certainly at most each row's optimum (raised inside to the best closed prefix of
            the row's candidates, :func:`closed_prefix_bound`, where that is higher).
        k_ref: (B,) int64 a typical set size (the sizes of that closed-prefix bound and the order of the size
            screen; any value is correct).
        pre, end: (N + 1,) int64 each node's preorder position and the position after its subtree.
        depth: (N + 1,) int64 node depths; dmin1: (N + 1,) float64 the depth of the shallowest leaf
            under each node, plus one.
        depths: (E,) float64 the leaf depth of each column of q; max_depth: D, the deepest leaf.
        mass_rel, mass_abs: the relative error of an entry of q (node probabilities: their summation's) and
            a bound on the absolute error of a row of q, one node's E masses together (differences of float64
            prefix sums: a few ulps of 1 times the number of leaves, and of leaf depths on a GPU).
        budget: bytes for the knapsack's gathered gains and tables at a time (the (row, size) pairs are
            solved in groups and chunks).
    Returns:
        (B, C) bool: the columns of each row's best set (all False for a row whose bound rules every
        size out, i.e. a row without mass).  O(B·C·K·E) for the gains, O(B·C²) for the closed-prefix bound, O(R·C·K) for the knapsacks of
        the R (row, size) pairs the bounds leave (on their allowed candidates: :func:`knapsack_sets`);
        the torch implementation: two host reads (R, then the pairs' allowed counts; one more per group of
        pairs beyond the first).
        The Triton kernel (CUDA): one launch and no host read whatever B, each program solving whole rows
        with its tables in (2C + 2)·C float64 of scratch, as many programs as ``budget`` holds; its gains sum
        the leaf depths in order where the torch implementation's matrix product sums them in its BLAS's
        order, so values equal in exact arithmetic may round apart (the knapsack, the size choice and the
        tie rule are the same operations).
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype or device.
    """
    # call(): on plain CPU tensors the torch implementation directly, not the dispatcher's way to it (its
    # schema parsing and Python re-entry, tens of µs a call); everywhere else the registered op
    return call("jaccard_sets", q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths,
                int(max_depth), float(mass_rel), float(mass_abs), int(budget))


def check_args(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget) -> None:
    """Shapes, dtypes and devices (no tensor value is read)."""
    check_float_tensor(q, "q", "(B, C, E)", (torch.float64,), "float64")
    b, c, e = q.shape
    dev = q.device
    if ids.shape != (b, c) or ids.dtype != torch.int64 or ids.device != dev:
        raise ValueError(f"Expected `ids` to be (B, C) = {(b, c)} int64 on {dev}, but got {tuple(ids.shape)} "
                         f"{ids.dtype} on {ids.device}")
    check_vector(count, "count", torch.int64, dev, b)
    check_vector(lb, "lb", torch.float64, dev, b)
    check_vector(k_ref, "k_ref", torch.int64, dev, b)
    n1 = pre.shape[0] if pre.dim() == 1 else -1
    for t, name, dtype in ((pre, "pre", torch.int64), (end, "end", torch.int64), (depth, "depth", torch.int64),
                           (dmin1, "dmin1", torch.float64)):
        check_vector(t, name, dtype, dev, n1)
    check_vector(depths, "depths", torch.float64, dev, e)


#: Largest table :func:`depth_table` keeps (cells): a deep tree's are made per call.
DEPTH_TABLE_CELLS = 1 << 16


def depth_table(kind: str, depths: torch.Tensor, args: tuple, build):
    """``build()``, a table of the leaf depths ``depths`` (a tree's) and ``args`` (a width's), made once rather
    than per call where at most ``DEPTH_TABLE_CELLS`` cells (a call of one row runs a few dozen small operators;
    these were about a dozen of them a call): :func:`derived`, ``kind`` naming the table."""
    return derived((kind, *args), (depths,), build, lambda table: table.numel() <= DEPTH_TABLE_CELLS)


def gain_weights(depths: torch.Tensor, kmax: int, dtype: torch.dtype, m0: int = 0,
                 m1: int | None = None) -> torch.Tensor:
    """(2(m1 − m0), E): 1/x and 1/(x(x+1)) for x = m + d_e, m = m0 + 1..m1 (m1 = kmax by default); cached
    per ``depths`` tensor (read it, never write it)."""
    return depth_table("gain_weights", depths, (kmax, dtype, m0, m1),
                        lambda: _gain_weights(depths, kmax, dtype, m0, m1))


def _gain_weights(depths, kmax, dtype, m0, m1):
    m = torch.arange(m0 + 1, (kmax if m1 is None else m1) + 1, device=depths.device, dtype=torch.float64)
    x = m[:, None] + depths[None, :]
    return torch.cat([1 / x, 1 / (x * (x + 1))]).to(dtype)


#: Blocks of :func:`gains`: at least GAIN_ROWS entries (rows of q), GAIN_CELLS / K when more, and
#: GAIN_SIZES sizes m per GEMM.  Not derived from the memory budget or the batch size, so that an
#: entry's gains are rounded the same whatever the budget (this BLAS rounds a product differently when
#: its shape changes); small K keeps one block, hence one GEMM, for a whole batch.
GAIN_ROWS, GAIN_SIZES, GAIN_CELLS = 256, 256, 1 << 18


def gains(q: torch.Tensor, depth: torch.Tensor, depths: torch.Tensor, kmax: int,
          out: torch.Tensor | None = None) -> torch.Tensor:
    """(M, K) g_k(n) for k = 1..kmax: masses q (M, E), node depths (M,); -inf where k ≤ d(n).

    Computed in blocks of max(``GAIN_ROWS``, ``GAIN_CELLS``/K) entries and ``GAIN_SIZES`` sizes (the
    (2K, E) weights never whole): O(M·K·E) time, O(M·K) for the result (``out``, (M', K) with M' ≥ M,
    when given: rows 0..M − 1 are written) and O(GAIN_CELLS + (GAIN_ROWS + GAIN_SIZES)·(E + K))
    temporaries.
    """
    rows, dt = q.shape[0], q.dtype
    dev = q.device
    block = max(GAIN_ROWS, GAIN_CELLS // max(kmax, 1))
    g = torch.empty(rows, kmax, dtype=dt, device=dev) if out is None else out
    d_all = depth.clamp(max=kmax)
    t = torch.empty(min(rows, block), 2 * kmax, dtype=dt, device=dev)
    t[:, :kmax] = float("-inf")
    s = torch.empty(min(rows, block), 2 * kmax, dtype=dt, device=dev)  # S1(m) | S2(m), m = 1..K
    weights = None
    # Kept for every block of entries when small, else remade per block (the same values).
    if rows > block and 2 * kmax * depths.numel() <= 1 << 20:
        weights = [gain_weights(depths, kmax, dt, m0, min(kmax, m0 + GAIN_SIZES))
                   for m0 in range(0, kmax, GAIN_SIZES)]
    span = _span(kmax, dev)
    for a in range(0, rows, block):
        b = min(rows, a + block)
        qa, sa, ta = (q, s, t) if b - a == s.shape[0] == q.shape[0] else (q[a:b], s[: b - a], t[: b - a])
        for i, m0 in enumerate(range(0, kmax, GAIN_SIZES)):
            m1 = min(kmax, m0 + GAIN_SIZES)
            w = weights[i] if weights is not None else gain_weights(depths, kmax, dt, m0, m1)
            if kmax <= GAIN_SIZES:  # one block of sizes: the product is S1 | S2 already (no copy)
                torch.mm(qa, w.t(), out=sa)
                continue
            part = qa @ w.t()  # (rows, 2(m1 − m0))
            sa[:, m0:m1] = part[:, : m1 - m0]
            sa[:, kmax + m0:kmax + m1] = part[:, m1 - m0:]
        d = d_all if qa is q else d_all[a:b]
        # t[r, K + m − 1] = S1 + d·S2 at m, and -inf in the first K columns (m < 1): row r reads the
        # window t[r, K − d(r) : 2K − d(r)], one gather (cheaper on a CPU than indexing its unfolded rows).
        torch.addcmul(sa[:, :kmax], d.to(dt)[:, None], sa[:, kmax:], out=ta[:, kmax:])
        torch.gather(ta, 1, (kmax - d)[:, None] + span, out=g if qa is q and g.shape[0] == rows else g[a:b])
    return g


def _span(kmax: int, dev: torch.device) -> torch.Tensor:
    """(K,) int64 0..K − 1, the gains' window offsets, made once per width rather than per call (read it,
    never write it)."""
    return derived(("span", kmax, dev), (), lambda: torch.arange(kmax, device=dev))


def size_bound(q_root: torch.Tensor, depths: torch.Tensor, kmax: int) -> torch.Tensor:
    """(B, K) G(k) = Σ_e Q_e(root) min(k, d_e + 1)/max(k, d_e + 1) for k = 1..kmax, an upper bound on
    the value of any set of size k, from the root's masses q_root (B, E) float64.

    One (K, E) float64 table (cached per ``depths`` tensor where small), its quotients made in place a
    block of 2^20 cells at a time (the same values as in one piece), and one product with it.
    """
    return q_root @ depth_table("size_bound", depths, (kmax,), lambda: _size_cover(depths, kmax)).t()


def _size_cover(depths, kmax):
    """(K, E) float64 min(k, d_e + 1)/max(k, d_e + 1)."""
    kf = torch.arange(1, kmax + 1, device=depths.device, dtype=torch.float64)[:, None]
    d1 = depths + 1
    cover = torch.minimum(kf, d1)
    step = max(1, (1 << 20) // max(d1.numel(), 1))
    for a in range(0, kmax, step):
        cover[a:a + step].div_(torch.maximum(kf[a:a + step], d1))
    return cover


def knapsack(gp, nx, kidx, jmax, active, space=None):
    """Preorder knapsack of R pairs: gains gp (R, C) (-inf: not allowed), nxt columns nx (R, C).

    active[i]: the pairs with a candidate at position i are rows 0..active[i] − 1.  Returns
    (V (R,) the best value with kidx + 1 nodes, dec (C, R, jmax + 1) bool: take position i
    with j nodes left to choose from positions ≥ i).  ``space``: optional flat (float, bool)
    buffers to hold the tables, reused across chunks (fresh pages cost more than the fill).
    """
    r, c = gp.shape
    dev, dt = gp.device, gp.dtype
    if dev.type == "cpu":  # the same float additions and comparisons, at NumPy's cost per call
        cells = (c + 1) * r * (jmax + 1)
        bufs = (np.empty(cells, dtype=_numpy(gp).dtype), np.empty(cells, dtype=bool)) if space is None else (
            _numpy(space[0]), _numpy(space[1]))
        v, dec = _knapsack_numpy(_numpy(gp), _numpy(nx), _numpy(kidx), jmax, active, bufs)
        return torch.from_numpy(v), torch.from_numpy(dec)
    shape = (c + 1, r, jmax + 1)
    if space is None:
        hist = torch.full(shape, float("-inf"), dtype=dt, device=dev)
        dec = torch.zeros(c, r, jmax + 1, dtype=torch.bool, device=dev)
    else:
        hist = space[0][: (c + 1) * r * (jmax + 1)].view(shape).fill_(float("-inf"))
        dec = space[1][: c * r * (jmax + 1)].view(c, r, jmax + 1).zero_()
    hist[:, :, 0] = 0  # choosing no node is always possible
    rows = torch.arange(r, device=dev)
    flat = hist.view((c + 1) * r, jmax + 1)
    # Row of F(nxt(i), ·) of every pair and position, laid out position-major for contiguous slices.
    skip_rows = (nx * r + rows[:, None]).t().contiguous()  # (C, R)
    gcols = gp.t().contiguous()  # (C, R)
    for i in range(c - 1, 0, -1):
        a = active[i]  # the rows past it keep F(i, ·) = F(C, ·)
        take = hist[i + 1, :a, :-1] + gcols[i, :a, None]  # j ≥ 1 nodes with v_i among them
        skip = flat.index_select(0, skip_rows[i, :a])[:, 1:]
        torch.ge(take, skip, out=dec[i, :a, 1:])
        torch.where(dec[i, :a, 1:], take, skip, out=hist[i, :a, 1:])
    return gp[:, 0] + hist[1][rows, kidx], dec


def _knapsack_numpy(gp, nx, kidx, jmax, active, bufs):
    """:func:`knapsack` on NumPy arrays (its CPU path): the same tables, float additions and comparisons,
    without an operator's fixed cost per step; ``bufs``: flat (float, bool) arrays holding the tables."""
    r, c = gp.shape
    w = jmax + 1
    hist = bufs[0][: (c + 1) * r * w].reshape(c + 1, r, w)
    hist.fill(float("-inf"))
    hist[:, :, 0] = 0  # choosing no node is always possible
    dec = bufs[1][: c * r * w].reshape(c, r, w)
    dec.fill(False)
    rows = np.arange(r)
    flat = hist.reshape((c + 1) * r, w)
    skip_rows = (nx * r + rows[:, None]).T.copy()  # (C, R) row of F(nxt(i), ·) of every pair and position
    gcols = gp.T
    for i in range(c - 1, 0, -1):
        a = active[i]  # the rows past it keep F(i, ·) = F(C, ·)
        take = hist[i + 1, :a, :-1] + gcols[i, :a, None]
        skip = flat[skip_rows[i, :a], 1:]
        np.greater_equal(take, skip, out=dec[i, :a, 1:])
        np.copyto(hist[i, :a, 1:], np.where(dec[i, :a, 1:], take, skip))
    return gp[:, 0] + hist[1][rows, kidx], dec


def knapsack_sets(gains, entry, nxt, b, kidx, budget: int):
    """The best set of R pairs (sample, size): :func:`knapsack` and :func:`walk` on each pair's allowed
    candidates, in groups of pairs and chunks whose tables fit ``budget`` bytes.

    gains: (X, K) float g_k of every candidate entry at k = 1..K (-inf or NaN: not allowed);
    entry: (B, C) int64 each sample's candidates as rows of ``gains``, in preorder, root first
    (padding: a row that is -inf); nxt: (B, C) int64 the position after each candidate's subtree;
    b, kidx: (R,) int64 each pair's sample and size − 1 (< K).  Returns (V (R,), members (R, C) bool).

    A candidate whose gain is -inf (or NaN) is never taken, nor anything under it: each pair keeps
    only its A_r allowed candidates with no disallowed ancestor (preorder and subtrees kept, so the
    knapsack over them reads the same values, adds them in the same order and takes the same
    decisions at every state of finite value).  Its table is then the cheaper of two layouts of the
    same states: by nodes j left to choose, (A_r + 1) × (k_r + 1) (:func:`knapsack`), or by candidates
    skipped so far, (A_r + 1) × (A_r − k_r + 1) (:func:`knapsack_band`: at most A_r − k_r of them can
    be skipped, a narrow band when the bounds leave few more allowed nodes than the size; on deep
    caterpillars often none).  A pair with fewer than k_r allowed candidates (no set of its size: never
    an optimal size) gets V = -inf and the root alone.  Per group: its (pairs, C) gains and
    positions (half the budget, at least one pair) and one host read (the allowed counts).  On plain CPU
    tensors where the native kernels apply, one compiled pass a pair instead (:func:`_knapsack_sets_native`:
    the same values and sets, bit for bit, no host read).
    """
    r, c = b.numel(), entry.shape[1]
    dev = entry.device
    val = gains.new_full((r,), float("-inf"))
    members = torch.zeros(r, c, dtype=torch.bool, device=dev)
    if r == 0 or c == 0:
        return val, members
    kk = gains.shape[1]
    if dev.type == "cpu":  # one compiled pass a pair where the native kernels apply: the same values and sets
        got = _knapsack_sets_native(gains, entry, nxt, b, kidx, val, members)
        if got is not None:
            return got
    step = max(1, budget // (2 * 128 * (c + 1)))  # ~13 (pair, position) temporaries of ≤ 8 bytes each
    if dev.type == "cpu":  # the same steps on NumPy views: a few dozen operators fewer per call
        flat, ent, nx, bn, kn = (_numpy(t) for t in (gains.view(-1), entry, nxt, b, kidx))
        vn, mn = _numpy(val), _numpy(members)
        for a in range(0, r, step):
            e = slice(a, a + step)
            vn[e], mn[e] = _solve_pairs_numpy(flat[ent[bn[e]] * kk + kn[e, None]], nx[bn[e]], kn[e], budget // 2)
        return val, members
    for a in range(0, r, step):
        e = slice(a, a + step)
        gp = gains.view(-1)[entry[b[e]] * kk + kidx[e, None]]  # (R', C)
        val[e], members[e] = _solve_pairs(gp, nxt[b[e]], kidx[e], budget // 2)
    return val, members


#: gains dtype -> the native knapsack's suffix (``hd_jaccard_knapsack_<suffix>`` in ``kernels/native/jaccard.c``)
_NATIVE_KNAPSACK = {torch.float32: "f32", torch.float64: "f64"}


def _knapsack_sets_native(gains, entry, nxt, b, kidx, val, members):
    """:func:`knapsack_sets` by the native kernel (``kernels/native/jaccard.c``), or None where it does not apply
    (the kernels off or unavailable, a tensor that must be seen by torch: :func:`~hdecode_torch.kernels.native.
    applies`); then the caller runs the NumPy path.  Fills ``val`` (R,) and ``members`` (R, C) and returns them.

    The same steps pair by pair: the allowed candidates kept (no disallowed ancestor), the knapsack's additions in
    the gains' dtype and its ``>=`` comparisons at the same states, the walk from (1, k): every value and set of the
    NumPy path, bit for bit, whatever its grouping into chunks and layouts (which change no state's value).  Scratch
    O(A·min(k + 1, A − k + 1)) for one pair at a time, so ``budget`` is not needed.  No host read (the NumPy path's
    one read of the allowed counts is of CPU values too; a host-read count runs under a dispatch mode, where this
    kernel stands aside).
    """
    suffix = _NATIVE_KNAPSACK.get(gains.dtype)
    if suffix is None or not native.applies(gains):
        return None
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn = native.function(f"hd_jaccard_knapsack_{suffix}", ctypes.c_int,
                         [i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr])
    g = gains if gains.is_contiguous() else gains.contiguous()
    ent, nx = entry.contiguous(), nxt.contiguous()
    bb, kx = b.contiguous(), kidx.contiguous()
    r, c = members.shape
    if fn(r, c, g.shape[1], g.data_ptr(), ent.data_ptr(), nx.data_ptr(), bb.data_ptr(), kx.data_ptr(),
          val.data_ptr(), members.data_ptr()):
        raise MemoryError(f"the native Jaccard knapsack could not allocate its tables ({c} candidates)")
    return val, members


def _solve_pairs_numpy(gp, nx, kidx, budget: int):
    """:func:`_solve_pairs` on NumPy arrays (the CPU path): the same integers, gains and tables, step for step."""
    r, c = gp.shape
    neg = float("-inf")
    bad = ~(gp > neg)
    bad[:, 0] = False
    # the disallowed candidates' subtrees by one difference array: +1 at each, −1 past its subtree
    cover = np.zeros((r, c + 1), dtype=np.int64)
    cover[:, :c] = bad
    ends = np.maximum(nx, np.arange(1, c + 1)) + (c + 1) * np.arange(r)[:, None]
    cover -= np.bincount(ends[bad], minlength=r * (c + 1)).reshape(r, c + 1)
    keep = np.cumsum(cover, 1)[:, :c] == 0
    rank = np.cumsum(keep, 1, dtype=np.int64)
    count = rank[:, -1]
    # pairs with more allowed candidates first, stable (the order of the torch path's stable sort)
    order = np.argsort(-np.where(count > kidx, count, 0), kind="stable")
    # read as the torch path reads them (Tensor.tolist), so that a host-read count of a call on CPU tensors
    # is what the call reads on a GPU
    counts, ks = torch.from_numpy(np.stack([count[order], kidx[order]])).tolist()
    live = sum(1 for x, y in zip(counts, ks) if x > y)
    val = np.full(r, neg, dtype=gp.dtype)
    members = np.zeros((r, c), dtype=bool)
    members[:, 0] = True
    if not live:
        return val, members
    sel = order[:live]
    width = counts[0]
    pr, ps = np.nonzero(keep[sel])
    dst = rank[sel][pr, ps] - 1
    cg = np.full((live, width), neg, dtype=gp.dtype)
    cg[pr, dst] = gp[sel][pr, ps]
    before = np.concatenate([np.zeros((r, 1), dtype=np.int64), rank], 1)[sel]
    cnx = np.full((live, width), width, dtype=np.int64)
    cnx[pr, dst] = np.take_along_axis(before, nx[sel], 1)[pr, ps]
    where = np.full((live, width), c, dtype=np.int64)
    where[pr, dst] = ps
    counts, ks = counts[:live], ks[:live]
    chunks = pair_chunks(counts, ks, gp.itemsize, budget)
    bufs = (np.empty(max(t[0] for _, _, t in chunks), dtype=gp.dtype),
            np.empty(max(t[1] for _, _, t in chunks), dtype=bool))
    vals = []
    got = np.zeros((live, c + 1), dtype=bool)
    for a, b, (_, _, banded) in chunks:
        top = counts[a]
        part, j = [], b - a
        for i in range(top):
            while j and counts[a + j - 1] <= i:
                j -= 1
            part.append(j)
        kr = np.asarray(ks[a:b], dtype=np.int64)
        g, x = cg[a:b, :top], np.minimum(cnx[a:b, :top], top)
        if banded:
            band = max(x - y for x, y in zip(counts[a:b], ks[a:b]))
            v, dec = _knapsack_band_numpy(g, x, kr, np.asarray(counts[a:b], dtype=np.int64), band, part, bufs)
            m = _walk_band_numpy(dec, x)
        else:
            v, dec = _knapsack_numpy(g, x, kr, max(ks[a:b]), part, bufs)
            m = _walk_numpy(dec, x, kr)
        vals.append(v)
        got[np.arange(a, b)[:, None], where[a:b, :top]] = m
    val[sel] = np.concatenate(vals)
    members[sel] = got[:, :c]
    return val, members


def _solve_pairs(gp, nx, kidx, budget: int):
    """:func:`knapsack_sets` of the pairs with gains gp (R, C) and nxt columns nx (R, C)."""
    r, c = gp.shape
    dev = gp.device
    neg = float("-inf")
    # Disallowed candidates and their subtrees, one difference array over preorder positions.
    bad = ~(gp > neg)
    bad[:, 0] = False  # the root is outside the table: V = g(root) + F(1, k − 1)
    cover = torch.zeros(r, c + 1, dtype=torch.int32, device=dev)
    cover[:, :c] = bad.to(torch.int32)
    # A padding column's nxt may point at itself: its range ends one past it at least.
    cover.scatter_add_(1, torch.maximum(nx, torch.arange(1, c + 1, device=dev)), -bad.to(torch.int32))
    keep = cover.cumsum_(1)[:, :c] == 0
    del cover, bad
    rank = keep.cumsum(1, dtype=torch.int64)  # (R, C): allowed positions up to and including each one
    count = rank[:, -1]
    feasible = count > kidx  # room for the root and kidx more
    order = torch.sort(torch.where(feasible, count, 0), descending=True, stable=True).indices
    counts, ks = torch.stack([count[order], kidx[order]]).tolist()
    live = sum(1 for x, y in zip(counts, ks) if x > y)
    val = gp.new_full((r,), neg)
    members = torch.zeros(r, c, dtype=torch.bool, device=dev)
    members[:, 0] = True
    if not live:
        return val, members
    # The kept candidates packed left, pairs with more of them first (a prefix works at each position).
    sel = order[:live]
    width = counts[0]
    src = torch.nonzero_static(keep[sel], size=sum(counts[:live]))  # (kept, 2): (pair, position)
    pr, ps = src.unbind(1)
    dst = rank[sel][pr, ps] - 1
    cg = gp.new_full((live, width), neg)
    cg[pr, dst] = gp[sel][pr, ps]
    before = torch.cat([rank.new_zeros(r, 1), rank], 1)[sel]  # allowed positions before each one
    cnx = torch.full((live, width), width, dtype=torch.int64, device=dev)
    cnx[pr, dst] = before.gather(1, nx[sel])[pr, ps]
    where = torch.full((live, width), c, dtype=torch.int64, device=dev)  # padding: a spare column c
    where[pr, dst] = ps
    del src, pr, ps, dst, rank, before, keep
    counts, ks = counts[:live], ks[:live]
    es = gp.element_size()

    chunks = pair_chunks(counts, ks, es, budget)
    space = (torch.empty(max(t[0] for _, _, t in chunks), dtype=gp.dtype, device=dev),
             torch.empty(max(t[1] for _, _, t in chunks), dtype=torch.bool, device=dev))
    vals = []
    got = torch.zeros(live, c + 1, dtype=torch.bool, device=dev)
    for a, b, (_, _, banded) in chunks:
        top = counts[a]
        part, j = [], b - a  # part[i]: the pairs with more than i candidates (counts descend)
        for i in range(top):
            while j and counts[a + j - 1] <= i:
                j -= 1
            part.append(j)
        kr = kidx.new_tensor(ks[a:b])
        g, x = cg[a:b, :top], cnx[a:b, :top].clamp(max=top)
        if banded:
            band = max(x - y for x, y in zip(counts[a:b], ks[a:b]))
            v, dec = knapsack_band(g, x, kr, kidx.new_tensor(counts[a:b]), band, part, space)
            m = walk_band(dec, x, kr)
        else:
            v, dec = knapsack(g, x, kr, max(ks[a:b]), part, space)
            m = walk(dec, x, kr)
        vals.append(v)
        got[a:b].scatter_(1, where[a:b, :top], m)
    val[sel] = torch.cat(vals)
    members[sel] = got[:, :c]
    return val, members


def _table_cost(top: int, kmax: int, band: int, n: int, es: int) -> tuple[int, int, bool]:
    """(floats, bools, banded) of the knapsack tables of n pairs with at most top candidates, kmax sizes and
    band skips, in the narrower of the two layouts (states by nodes left, or by candidates skipped)."""
    nodes = ((top + 1) * (kmax + 1) * n, top * (kmax + 1) * n, False)
    skips = ((top + 1) * 2 * band * n, top * band * n, True)
    return min(nodes, skips, key=lambda t: t[0] * es + t[1])


def pair_chunks(counts: list[int], ks: list[int], es: int, budget: int) -> list[tuple[int, int, tuple]]:
    """``[(a, b, (floats, bools, banded))]``: consecutive pairs a..b − 1 solved together while their tables
    take at most ``budget`` bytes (``es`` bytes a float), each chunk at least one pair.

    counts: the pairs' candidate counts, descending (the first of a chunk is its widest); ks: their sizes.
    A chunk's table size only grows with b (the running maxima of k and of the band, and the pair
    count), so its end is the first b whose size is over ``budget``: found on NumPy running maxima over
    windows from a that grow 4× until one holds it, O(pairs) in all and no Python step per pair (one
    per pair took 20-50 ms at B = 4,096; taking the maxima over a..b anew at each b, seconds).
    """
    live = len(counts)
    whole = _table_cost(counts[0], max(ks), max(c - k for c, k in zip(counts, ks)), live, es) if live else None
    if whole is not None and whole[0] * es + whole[1] <= budget:  # every pair in one chunk (one row's few pairs)
        return [(0, live, whole)]
    cnt, kk = np.asarray(counts, dtype=np.int64), np.asarray(ks, dtype=np.int64)
    bands = cnt - kk
    chunks, a, live = [], 0, len(counts)
    while a < live:
        top, w = int(cnt[a]), 64
        while True:
            e = min(live, a + w)
            kmax, band = np.maximum.accumulate(kk[a:e]), np.maximum.accumulate(bands[a:e])
            n = np.arange(1, e - a + 1, dtype=np.int64)
            # _table_cost's two layouts, in bytes, for the pairs a..a + j (n = j + 1 of them)
            nodes, skips = (kmax + 1) * n, band * n
            size = np.minimum((top + 1) * nodes * es + top * nodes, (top + 1) * 2 * skips * es + top * skips)
            over = np.flatnonzero(size[1:] > budget)  # pair a + j + 1 would take the chunk over budget
            if over.size or e == live:
                b = a + 1 + int(over[0]) if over.size else live
                break
            w *= 4
        chunks.append((a, b, _table_cost(top, int(kmax[b - a - 1]), int(band[b - a - 1]), b - a, es)))
        a = b
    return chunks


def knapsack_band(gp, nx, kidx, count, band: int, active, space):
    """:func:`knapsack` with states by candidates skipped: H[i, s] = F(i, j) with s = i − 1 − k + j,
    k = kidx, the candidates among positions 1..i − 1 left out.

    gp, nx: (R, C) the pairs' allowed candidates only; count: (R,) their numbers A_r (each
    > kidx); band ≥ max(A_r − kidx); active[i]: the pairs with a candidate at position i are
    0..active[i] − 1.  Taking v_i keeps s (F(i + 1, j − 1)), skipping its subtree adds nxt(i) − i
    (F(nxt(i), j)): the same two values as :func:`knapsack`'s, compared and chosen the same way, on
    at most A_r − k_r + 1 states per position instead of k_r + 1.  Returns (V (R,),
    dec (C, R, band) bool: take position i at state s).
    """
    r, c = gp.shape
    dev = gp.device
    w = band
    if dev.type == "cpu":  # the same float additions and comparisons, at NumPy's cost per call
        v, dec = _knapsack_band_numpy(_numpy(gp), _numpy(nx), _numpy(kidx), _numpy(count), w, active,
                                      (_numpy(space[0]), _numpy(space[1])))
        return torch.from_numpy(v), torch.from_numpy(dec)
    # Each row holds the band and as many -inf cells after it: the skip reads a window of w cells
    # from offset nxt(i) − i ≤ w of its row, past the band -inf (more skips than candidates).
    hist = space[0][: (c + 1) * r * 2 * w].view(c + 1, r, 2 * w).fill_(float("-inf"))
    dec = space[1][: c * r * w].view(c, r, w).zero_()
    rows = torch.arange(r, device=dev)
    # F(A_r, 0) = 0: no node left to choose once every candidate is passed (s = A_r − 1 − k).
    hist[count, rows, count - 1 - kidx] = 0
    windows = hist.view(-1).unfold(0, w, 1)
    base = nx * (r * 2 * w) + rows[:, None] * (2 * w)  # (R, C) start of row (nxt(i), pair)
    shift = (nx - torch.arange(c, device=dev)).clamp(max=w)
    start = (base + shift).t().contiguous()  # (C, R)
    gcols = gp.t().contiguous()
    for i in range(c - 1, 0, -1):
        a = active[i]
        take = hist[i + 1, :a, :w] + gcols[i, :a, None]
        skip = windows.index_select(0, start[i, :a])
        torch.ge(take, skip, out=dec[i, :a])
        torch.where(dec[i, :a], take, skip, out=hist[i, :a, :w])
    return gp[:, 0] + hist[1, :, 0], dec


def _knapsack_band_numpy(gp, nx, kidx, count, w, active, bufs):
    """:func:`knapsack_band` on NumPy arrays (its CPU path): the same tables, integers, float additions and
    comparisons, without an operator's fixed cost per step; ``bufs``: flat (float, bool) arrays."""
    r, c = gp.shape
    hist = bufs[0][: (c + 1) * r * 2 * w].reshape(c + 1, r, 2 * w)
    hist.fill(float("-inf"))
    dec = bufs[1][: c * r * w].reshape(c, r, w)
    dec.fill(False)
    rows = np.arange(r)
    hist[count, rows, count - 1 - kidx] = 0
    flat = hist.reshape(-1)
    # the windows of w cells from every offset of the flat table, as ``unfold`` makes them (a view)
    windows = np.lib.stride_tricks.as_strided(flat, (flat.size - w + 1, w), (flat.strides[0],) * 2, writeable=False)
    start = (nx * (r * 2 * w) + rows[:, None] * (2 * w) + np.minimum(nx - np.arange(c), w)).T.copy()  # (C, R)
    gcols = gp.T
    for i in range(c - 1, 0, -1):
        a = active[i]
        take = hist[i + 1, :a, :w] + gcols[i, :a, None]
        skip = windows[start[i, :a]]
        np.greater_equal(take, skip, out=dec[i, :a])
        np.copyto(hist[i, :a, :w], np.where(dec[i, :a], take, skip))
    return gp[:, 0] + hist[1, :, 0], dec


def walk_band(dec, nx, kidx):
    """:func:`walk` for :func:`knapsack_band`'s decisions: (R, C) bool the set of each pair."""
    c, r, w = dec.shape
    dev = nx.device
    if dev.type == "cpu":  # the same steps at NumPy's cost per call
        return torch.from_numpy(_walk_band_numpy(_numpy(dec), _numpy(nx)))
    s = torch.zeros(r, dtype=torch.long, device=dev)
    pos = torch.ones(r, dtype=torch.long, device=dev)
    members = torch.zeros(c, r, dtype=torch.bool, device=dev)
    members[0] = True
    rows = torch.arange(r, device=dev) * w
    flat = dec.view(c, -1)
    nxt = nx.t().contiguous()  # (C, R)
    for i in range(1, c):
        here = pos == i
        t = torch.logical_and(flat[i].index_select(0, rows + s.clamp(max=w - 1)), here, out=members[i])
        skip = here & ~t
        s = torch.where(skip, s + nxt[i] - i, s)
        pos = torch.where(here, torch.where(t, i + 1, nxt[i]), pos)
    return members.t()


def _walk_band_numpy(dec, nx):
    """:func:`walk_band` on NumPy arrays (its CPU path): (R, C) bool, the same integer steps."""
    c, r, w = dec.shape
    s = np.zeros(r, dtype=np.int64)
    pos = np.ones(r, dtype=np.int64)
    members = np.zeros((c, r), dtype=bool)
    members[0] = True
    rows = np.arange(r) * w
    flat = dec.reshape(c, -1)
    nxt = nx.T
    for i in range(1, c):
        here = pos == i
        t = np.logical_and(flat[i][rows + np.minimum(s, w - 1)], here, out=members[i])
        s = np.where(here & ~t, s + nxt[i] - i, s)
        pos = np.where(here, np.where(t, i + 1, nxt[i]), pos)
    return members.T


def walk(dec, nx, kidx):
    """(R, C) bool the set of each pair, by following its decisions forward from the root."""
    r, c = nx.shape
    dev = nx.device
    if dev.type == "cpu":  # the same steps at NumPy's cost per call
        return torch.from_numpy(_walk_numpy(_numpy(dec), _numpy(nx), _numpy(kidx)))
    # Per pair: the entry of dec[i] for its row and the nodes j left to take (j = 0 is never
    # taken: dec[:, :, 0] is False), and the position it has reached.
    at = torch.arange(r, device=dev) * dec.shape[2] + kidx
    pos = torch.ones(r, dtype=torch.long, device=dev)
    members = torch.zeros(c, r, dtype=torch.bool, device=dev)
    members[0] = True
    flat = dec.view(c, -1)
    nxt = nx.t().contiguous()  # (C, R)
    for i in range(1, c):
        # A pair at position i takes v_i as decided, else skips v_i's subtree.
        here = pos == i
        t = torch.logical_and(flat[i].index_select(0, at), here, out=members[i])
        at.add_(t, alpha=-1)
        pos = torch.where(here, torch.where(t, i + 1, nxt[i]), pos)
    return members.t()




#: Batches of CPU tensors of at least this many (row, candidate, size) cells B·C² are solved in groups
#: of rows by candidate count (at most 8, 12, 16, 24, 32, 48, ... columns, each group's tables that
#: wide), where the widest row would otherwise set every row's width; smaller ones in one go.  Not on a
#: GPU, where the groups' sizes would be one more host read (and the Triton kernel solves each row alone).
GROUP_CELLS = 1 << 16

#: A group of rows joins the next wider one when that costs fewer extra (row, candidate, size) cells
#: than this: about what one more group's fixed cost (its operators and host reads) buys on a CPU.
GROUP_MERGE_CELLS = 1 << 16


def group_widths(c: int) -> list[int]:
    """The widths of the row groups of a batch of width ``c``: 8, 12, 16, 24, 32, 48, ... below c, then c
    (two steps per doubling: a row's tables cost C² cells, so a row is at most 2.25× its own)."""
    widths, w = [], 8
    while w < c:
        widths.append(w)
        w = w * 3 // 2 if w & (w - 1) == 0 else w * 4 // 3
    return widths + [c]


#: The knapsack tables' budget on a CPU, below glibc's largest mmap threshold (32 MiB): tables that size
#: are reused heap memory from one chunk and call to the next, where larger ones are fresh pages each
#: time, whose faults cost more than filling and stepping them (the GPU plan on a CPU passes its 4 GiB).
CPU_BUDGET = 1 << 24


def _walk_numpy(dec, nx, kidx):
    """:func:`walk` on NumPy arrays (its CPU path): (R, C) bool, the same integer steps."""
    c, r, w = dec.shape
    at = np.arange(r) * w + kidx
    pos = np.ones(r, dtype=np.int64)
    members = np.zeros((c, r), dtype=bool)
    members[0] = True
    flat = dec.reshape(c, -1)
    nxt = nx.T
    for i in range(1, c):
        here = pos == i
        t = np.logical_and(flat[i][at], here, out=members[i])
        at -= t
        pos = np.where(here, np.where(t, i + 1, nxt[i]), pos)
    return members.T


def jaccard_sets_torch(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget):
    """The torch implementation of :func:`jaccard_sets` (every device).

    Large batches of CPU tensors are solved in groups of rows of at most 8, 12, 16, 24, ... candidates
    (:func:`group_widths`), each group on its first columns; the rounding slacks are each row's own
    (:func:`row_slacks`), so a row's choice between sizes is the same formula alone, in any group and in
    any batch.  On CPU tensors the knapsack and its walk step NumPy views of their tables (the same float64
    operations), and the tables take at most ``CPU_BUDGET`` bytes at a time whatever ``budget`` says (each pair's
    knapsack is its own: the same sets in any chunks).
    """
    check_args(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    bsz, c, _ = q.shape
    if q.device.type == "cpu":  # the same sets in any chunks (each pair's knapsack is its own)
        budget = min(budget, CPU_BUDGET)
    tables = (pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    if q.device.type != "cpu" or bsz * c * c < GROUP_CELLS or c <= 8:
        return _solve(q, ids, count, lb, k_ref, *tables)
    widths = group_widths(c)
    group = torch.searchsorted(count.new_tensor(widths), count)  # the narrowest width that holds the row
    order = torch.sort(group, stable=True).indices
    # one host read, as the ungrouped call makes: the groups' own reads of CPU tensors go uncounted
    sizes = torch.bincount(group, minlength=len(widths)).tolist()
    out = torch.zeros(bsz, c, dtype=torch.bool, device=q.device)
    a, n = 0, 0
    for g, w in enumerate(widths):
        n += sizes[g]
        if not n or (g + 1 < len(widths) and n * (widths[g + 1] ** 2 - w * w) < GROUP_MERGE_CELLS):
            continue  # none, or cheaper in the next group
        rows = order[a:a + n]
        out[rows, :w] = _solve(q[rows, :w], ids[rows, :w], count[rows], lb[rows], k_ref[rows], *tables, _tolist)
        a, n = a + n, 0
    return out


def row_slacks(count: torch.Tensor, num_e: int, u: float, mass_rel: float, mass_abs: float):
    """(B,) float64 each row's relative and absolute rounding slacks (rel, abs) from its own candidate
    count c_b (int64): rel = 2((E + c_b + 16)·u + mass_rel), abs = 4·c_b·mass_abs.

    A value V(k) = Σ of k ≤ c_b gains, each a sum over E leaf depths of nonnegative rounded products,
    has relative error at most (E + k + 16)·u plus its masses' mass_rel, and absolute at most
    2·k·mass_abs (the bound the lower bounds' ``safe`` lowering uses); two such values, twice that.
    Counted with the row's own c_b, never the batch's width, so that a row's decision between sizes
    does not depend on the rows beside it.  Every term is an integer made exact in float64 before
    the one rounding of each product, the same operations as the Triton kernel's.
    """
    c = count.to(torch.float64)
    # The factors 2 and 4 folded into the scalars: scaling by a power of two is exact, so these are the
    # same roundings of the same values as 2·((E + 16 + c)·u + mass_rel) and (4·c)·mass_abs, in fewer operators.
    rel = torch.add(c, num_e + 16).mul_(2 * u)
    if mass_rel:
        rel.add_(2 * mass_rel)
    return rel, c.mul_(4 * mass_abs)


def size_tables(kmax: int, max_depth: int, dev: torch.device):
    """``(kf, tau_k, span)``: the sizes 1..K (float64), τ_k = max(k, v)/(2k + D − 1) for v = 0..D + 1 (rows)
    and k = 1..K, flattened ((D + 2)·K float64), and 0..K − 1 (int64); tree- and width-only, made once rather
    than per call (a call of one row runs a few dozen small operators; these were five of them)."""
    def build():
        kf = torch.arange(1, kmax + 1, device=dev, dtype=torch.float64)
        levels = torch.arange(max_depth + 2, device=dev, dtype=torch.float64)
        tau_k = (torch.maximum(kf, levels[:, None]) / (2 * kf + max_depth - 1)).view(-1)
        return kf, tau_k, _span(kmax, dev)
    return derived(("size_tables", kmax, max_depth, dev), (), build)


def _solve(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget,
           tolist=None):
    """:func:`jaccard_sets_torch` of rows whose counts fit q's width, each with its own rounding slacks;
    ``tolist``, if given, makes its host read (the groups of CPU rows pass one no host-read counter sees)."""
    bsz, c, num_e = q.shape
    dev = q.device
    if c == 0 or bsz == 0:
        return torch.zeros(bsz, c, dtype=torch.bool, device=dev)
    u64 = torch.finfo(torch.float64).eps / 2
    cols = torch.arange(c, device=dev)
    real = cols[None, :] < count[:, None]
    safe_ids = torch.where(real, ids, pre.shape[0] - 1)  # the padding row of the tables
    node_depth = torch.where(real, depth[safe_ids], PAD_DEPTH)
    position = torch.where(real, pre[safe_ids], pre.shape[0])  # increasing along each row, padding last
    nxt = torch.searchsorted(position, torch.where(real, end[safe_ids], pre.shape[0]))
    pv = q.sum(2)
    kmax = c
    g = gains(q.reshape(-1, num_e), node_depth.view(-1), depths, kmax).view(bsz, c, kmax)
    # Each row's own slacks (row_slacks): no bound, screen or tie rule below reads another row.
    slack_v, slack_abs = row_slacks(count, num_e, u64, mass_rel, mass_abs)
    # A tighter lb first, the best closed prefix of the candidates at k̂ − 3..k̂ + 3 (before the node
    # bounds: from every candidate's gain), so that the node bounds and the size screen prune as much as
    # the CPU plan's own closed-prefix bound lets them.
    lb = torch.maximum(lb, closed_prefix_bound(g, node_depth, count, k_ref, slack_v, slack_abs,
                                                    max_depth))
    # The nodes allowed at each size: τ_k(n) = max(k, d_min(n) + 1)/(2k + D − 1).  d_min(n) + 1 takes
    # D + 1 values: τ_k is a (D + 2, K) table (the same quotients as made per cell) read per cell, for
    # 2^20 (row, column, size) cells at a time, and g masked in place.
    kf, tau_k, span = size_tables(kmax, max_depth, dev)
    level = dmin1[safe_ids].clamp(max=max_depth + 1).long()  # (B, C) d_min + 1 in 1..D + 1 (padding: 0)
    at_level = level.mul_(kmax)[:, :, None] + span  # each cell's entry of τ_k
    scale = (lb * (1 - mass_rel))[:, None, None]
    above = (pv + mass_abs)[:, :, None]
    step = max(1, (1 << 20) // (bsz * kmax))
    for a in range(0, c, step):
        e = slice(a, a + step)
        allowed = above[:, e] >= tau_k[at_level[:, e]] * scale  # (B, C', K)
        if a == 0:
            allowed[:, 0] = True
        g[:, e].masked_fill_(~allowed.logical_and_(real[:, e, None]), float("-inf"))
    # The sizes whose bound reaches lb: min(the Lagrangian top-k bound, G(k)), λ_k the gain at k of the
    # candidate ranked k-th by its gain at the typical size.
    col = (k_ref.clamp(min=1, max=kmax) - 1)
    order = torch.sort(g.gather(2, col[:, None, None].expand(bsz, c, 1))[:, :, 0], dim=1, descending=True).indices
    lam = g.view(bsz, -1).gather(1, order * kmax + torch.arange(kmax, device=dev))  # g[b, order[b, k], k]
    lam = lam.clamp(min=0).nan_to_num(nan=0.0)
    excess = torch.sub(g, lam[:, None, :]).clamp_(min=0)  # one (B, C, K) temporary
    ub = excess.sum(1) + lam * kf
    del excess
    ub = torch.minimum(ub, size_bound(q[:, 0, :], depths, kmax))  # the root's masses
    spread = slack_v[:, None] * (max_depth + 1) / kf + slack_abs[:, None]
    want = (ub * (1 + slack_v)[:, None] + spread >= lb[:, None]) & (kf[None, :] <= count[:, None])
    # The pairs, rows with more candidates first: one host read, their number.
    by_count = torch.sort(count, descending=True, stable=True).indices
    total = want.sum()
    total = total.tolist() if tolist is None else tolist(total)
    b, kidx = torch.nonzero_static(want[by_count], size=total).unbind(1)
    b = by_count[b]
    val, members = knapsack_sets(g.view(-1, kmax), torch.arange(bsz * c, device=dev).view(bsz, c), nxt, b, kidx,
                                 budget)  # (R,), (R, C)
    # The smallest size within float64 rounding of the best value, its first set.  That rounding is of the
    # values computed from q as given: the masses' own error (mass_rel) is no rounding between two sizes'
    # values, and counted here it let a smaller size win by up to 2·mass_rel, 7.5e-6 relative on float32
    # node sums of iNat19 (the CPU plan's float64 re-scoring of float32 rows leaves it out too).
    best = torch.full((bsz,), float("-inf"), dtype=torch.float64, device=dev).scatter_reduce(0, b, val, "amax")
    tie_v, tie_abs = row_slacks(count, num_e, u64, 0.0, mass_abs)
    eligible = val >= best[b] * (1 - tie_v)[b] - tie_abs[b]
    kbest = torch.full((bsz,), kmax, dtype=torch.long, device=dev).scatter_reduce(
        0, b, torch.where(eligible, kidx, kmax), "amin")
    first = eligible & (kidx == kbest[b])
    r = b.numel()
    pick = torch.full((bsz,), r, dtype=torch.long, device=dev).scatter_reduce(
        0, b, torch.where(first, torch.arange(r, device=dev), r), "amin")
    return torch.cat([members, members.new_zeros(1, c)])[pick]  # row R: no pair


#: The sizes k̂ + PREFIX_SIZES of :func:`closed_prefix_bound` (k̂ the row's typical size ``k_ref``).
PREFIX_SIZES = range(-3, 4)


def closed_prefix_bound(g, depth, count, k_ref, slack_v, slack_abs, max_depth):
    """(B,) float64 a value certainly at most each row's optimum: the best closed prefix of one order of its
    candidates, at the sizes k = k̂ − 3..k̂ + 3 clamped to [1, c_b] (k̂ = ``k_ref``, c_b = ``count``), lowered
    by its rounding bound.

    g: (B, C, K) float64 gains g_k of the candidates (columns ancestor-closed and in preorder, root first;
    -inf where k ≤ d); depth: (B, C) int64 their depths (padding: deeper than any); slack_v, slack_abs:
    :func:`row_slacks`; max_depth: D, the deepest leaf.

    The order: by the smallest gain at k̂ along each root path (larger first), ties by column.  That key
    never grows from a parent to a child and ties keep preorder (parent first), so every prefix of the
    order is ancestor-closed, and its first k columns are a closed set of size k whose value is the sum of
    their g_k, added in that order: an achieved value, hence at most the optimum.  That sum of k ≤ c_b
    gains has relative error at most (E + c_b + 16)·u + mass_rel and absolute 2·c_b·mass_abs, half the
    row's slacks.  -inf where no size has a finite value (a row without candidates).  The minima along the
    root paths by pointer doubling over the parents' columns (a parent is the last column before its child
    one level up, as the candidates are closed and in preorder: one sorted search of depth·C + column),
    O(B·C·log C) in all.
    """
    bsz, c, kmax = g.shape
    dev = g.device
    cols = torch.arange(c, device=dev)
    kr = torch.minimum(k_ref, count).clamp(min=1) - 1
    key = g.gather(2, kr[:, None, None].expand(bsz, c, 1))[:, :, 0]
    real = cols[None, :] < count[:, None]
    # the parent's column: the last column before i at depth d(i) − 1 (the root: itself, padding: any)
    by_depth, column = torch.sort(depth.clamp(max=c) * c + cols)  # distinct keys: column is the key's column
    up = torch.searchsorted(by_depth, (depth - 1).clamp(min=0, max=c) * c + cols).sub_(1).clamp_(min=0)
    jump = column.gather(1, up)
    low = key
    # after s steps a column has seen its 2^s − 1 nearest ancestors; candidates lie ≤ min(D, C − 1) deep
    for _ in range(max(min(int(max_depth), c - 1), 1).bit_length()):
        low = torch.minimum(low, low.gather(1, jump))
        jump = jump.gather(1, jump)
    # padding last
    order = torch.sort(low.masked_fill(~real, float("-inf")), dim=1, descending=True, stable=True).indices
    ks = k_ref[:, None] + torch.arange(PREFIX_SIZES.start, PREFIX_SIZES.stop, device=dev)
    ks = ks.minimum(count[:, None]).clamp(min=1)
    j = ks.shape[1]
    at = g.gather(2, (ks - 1)[:, None, :].expand(bsz, c, j))  # (B, C, 7) the gains at those sizes
    sums = at.gather(1, order[:, :, None].expand(bsz, c, j)).cumsum(1)  # in that order
    value = sums.gather(1, (ks - 1)[:, None, :])[:, 0].amax(1)
    value = torch.where(count > 0, value, float("-inf"))
    return value * (1 - slack_v / 2) - slack_abs / 2


def _fake(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget):
    check_args(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    return q.new_empty(ids.shape, dtype=torch.bool)


def check(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget) -> None:
    """:func:`check_args`, and the index values a kernel reads unchecked: every ``count`` in [0, C] (read
    unless its producer said so, ``trust_indices``) and the ``ids`` of real columns in [0, N]."""
    check_args(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    check_bounds([(count, q.shape[1], "count", "C = q.shape[1]")], remember=False, trusted_ok=True)
    check_bounds([(ids, pre.shape[0] - 1, "ids", "N")], remember=False, trusted_ok=True)


register("jaccard_sets", SCHEMA, jaccard_sets_torch, _fake, check, __name__ + ".triton")
