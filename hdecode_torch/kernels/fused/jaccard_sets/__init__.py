"""``hdecode::jaccard_sets``: the best Jaccard set of each row's packed candidates (the exact solver).

For an ancestor-closed set S of size k the expected Jaccard index is additive over its nodes,
E[J(S)] = Σ_{a ∈ S} g_k(a) with g_k(a) = Σ_e Q_e(a) [1/(m + d_e) + d(a)/((m + d_e)(m + d_e + 1))],
m = k − d(a) ≥ 1 (Q_e(a) the mass of a's leaves at the e-th leaf depth d_e), so the best set of each
size is a maximum-weight rooted subtree of k nodes, a tree knapsack, and the optimum is the best size
(the proofs, bounds and tie rules are in ``hdecode_torch.metrics.jaccard``).  This op runs that
solver on packed candidate tables: the nodes allowed at each size by the proved bound
p(n) ≥ τ_k(n)·lb, the sizes whose upper bound reaches lb, the knapsack of every (row, size) pair
left, and the smallest size whose value is within float64 rounding of the best.  All in float64.
"""

from __future__ import annotations

import numpy as np
import torch

from .._checks import check_bounds, check_float_tensor, check_vector
from .._registry import register

__all__ = ["jaccard_sets", "jaccard_sets_torch", "gains", "gain_weights", "knapsack", "knapsack_sets", "walk", "SCHEMA"]

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
        lb: (B,) float64, certainly at most each row's optimum.
        k_ref: (B,) int64 a typical set size (orders the size screen; any value is correct).
        pre, end: (N + 1,) int64 each node's preorder position and the position after its subtree.
        depth: (N + 1,) int64 node depths; dmin1: (N + 1,) float64 the depth of the shallowest leaf
            under each node, plus one.
        depths: (E,) float64 the leaf depth of each column of q; max_depth: D, the deepest leaf.
        mass_rel, mass_abs: the relative and absolute errors of an entry of q (a difference of float64
            prefix sums: 0 and a few ulps of 1; node probabilities: their summation's relative error).
        budget: bytes for the knapsack tables at a time (the (row, size) pairs are solved in chunks).
    Returns:
        (B, C) bool: the columns of each row's best set (all False for a row whose bound rules every
        size out, i.e. a row without mass).  O(B·C·K·E) for the gains, O(R·C·K) for the knapsacks of
        the R (row, size) pairs the bounds leave.  The torch implementation: one host read (R and the
        per-position counts).  The Triton kernel (CUDA): one launch and no host read whatever B, each
        program solving whole rows with its tables in (2C + 2)·C float64 of scratch, as many programs as
        ``budget`` holds; its gains sum the leaf depths in order where the torch implementation's
        matrix product sums them in its BLAS's order, so values equal in exact arithmetic may round
        apart (the knapsack, the size choice and the tie rule are the same operations).
    Raises:
        ValueError / TypeError naming the argument for a wrong shape, dtype or device.
    """
    return torch.ops.hdecode.jaccard_sets(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths,
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


def gain_weights(depths: torch.Tensor, kmax: int, dtype: torch.dtype, m0: int = 0,
                 m1: int | None = None) -> torch.Tensor:
    """(2(m1 − m0), E): 1/x and 1/(x(x+1)) for x = m + d_e, m = m0 + 1..m1 (m1 = kmax by default)."""
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
    for a in range(0, rows, block):
        b = min(rows, a + block)
        qa, sa, ta = q[a:b], s[: b - a], t[: b - a]
        for i, m0 in enumerate(range(0, kmax, GAIN_SIZES)):
            m1 = min(kmax, m0 + GAIN_SIZES)
            w = weights[i] if weights is not None else gain_weights(depths, kmax, dt, m0, m1)
            part = qa @ w.t()  # (rows, 2(m1 − m0))
            sa[:, m0:m1] = part[:, : m1 - m0]
            sa[:, kmax + m0:kmax + m1] = part[:, m1 - m0:]
        d = d_all[a:b]
        # t[r, K + m − 1] = S1 + d·S2 at m, and -inf in the first K columns (m < 1): row r reads the
        # window t[r, K − d(r) : 2K − d(r)], one strided row copy instead of K index computations.
        torch.addcmul(sa[:, :kmax], d.to(dt)[:, None], sa[:, kmax:], out=ta[:, kmax:])
        g[a:b] = ta.unfold(1, kmax, 1)[torch.arange(b - a, device=dev), kmax - d]
    return g


def knapsack(gp, nx, kidx, jmax, active, space=None):
    """Preorder knapsack of R pairs: gains gp (R, C) (-inf: not allowed), nxt columns nx (R, C).

    active[i]: the pairs with a candidate at position i are rows 0..active[i] − 1.  Returns
    (V (R,) the best value with kidx + 1 nodes, dec (C, R, jmax + 1) bool: take position i
    with j nodes left to choose from positions ≥ i).  ``space``: optional flat (float, bool)
    buffers to hold the tables, reused across chunks (fresh pages cost more than the fill).
    """
    r, c = gp.shape
    dev, dt = gp.device, gp.dtype
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
    if dev.type == "cpu":  # the same float64 additions and comparisons, at NumPy's cost per call
        _knapsack_steps_numpy(_numpy(hist), _numpy(dec), _numpy(skip_rows), _numpy(gcols), active)
        return gp[:, 0] + hist[1][rows, kidx], dec
    for i in range(c - 1, 0, -1):
        a = active[i]  # the rows past it keep F(i, ·) = F(C, ·)
        take = hist[i + 1, :a, :-1] + gcols[i, :a, None]  # j ≥ 1 nodes with v_i among them
        skip = flat.index_select(0, skip_rows[i, :a])[:, 1:]
        torch.ge(take, skip, out=dec[i, :a, 1:])
        torch.where(dec[i, :a, 1:], take, skip, out=hist[i, :a, 1:])
    return gp[:, 0] + hist[1][rows, kidx], dec


def _knapsack_steps_numpy(hist, dec, skip_rows, gcols, active) -> None:
    """The position loop of :func:`knapsack` on NumPy views of its CPU tables (in place)."""
    c1, r, w = hist.shape
    flat = hist.reshape(c1 * r, w)
    for i in range(c1 - 2, 0, -1):
        a = active[i]
        take = hist[i + 1, :a, :-1] + gcols[i, :a, None]
        skip = flat[skip_rows[i, :a], 1:]
        np.greater_equal(take, skip, out=dec[i, :a, 1:])
        np.copyto(hist[i, :a, 1:], np.where(dec[i, :a, 1:], take, skip))


def knapsack_sets(gp, nx, kidx, jmax: int, active, budget: int):
    """:func:`knapsack` and :func:`walk` of R pairs in chunks of pairs whose tables fit ``budget`` bytes.

    gp, nx: (R, C); kidx: (R,) int64 below ``jmax``; active: the per-position prefix sizes of
    :func:`knapsack` (pairs with more candidates first).  Returns (V (R,), members (R, C) bool).
    Memory per pair: its (C + 1) × (j + 1) value table and decisions, j = ``jmax`` when all pairs fit
    at once, else the largest kidx of its chunk (F(i, j) reads only F(·, j' ≤ j), so a narrower table
    gives the same values bit for bit).  No host read when all fit; one (kidx) otherwise.
    """
    r, c = gp.shape
    cell = (c + 1) * (gp.element_size() + 1)
    if r * (jmax + 1) * cell <= budget:
        val, dec = knapsack(gp, nx, kidx, jmax, active)
        return val, walk(dec, nx, kidx)
    # Chunks of consecutive pairs (their order keeps the active prefixes), each as wide as its largest
    # size: pairs of one sample come by increasing size, so a chunk rarely pays for more than it needs.
    sizes = kidx.tolist()
    chunks = []
    a = 0
    while a < r:
        b, width = a + 1, sizes[a]
        while b < r and (b + 1 - a) * (max(width, sizes[b]) + 1) * cell <= budget:
            width = max(width, sizes[b])
            b += 1
        chunks.append((a, b, width))
        a = b
    most = max((b - a) * (width + 1) for a, b, width in chunks)
    space = (torch.empty((c + 1) * most, dtype=gp.dtype, device=gp.device),
             torch.empty(c * most, dtype=torch.bool, device=gp.device))
    vals, members = [], []
    for a, b, width in chunks:
        part = [min(max(n - a, 0), b - a) for n in active]
        val, dec = knapsack(gp[a:b], nx[a:b], kidx[a:b], width, part, space)
        vals.append(val)
        members.append(walk(dec, nx[a:b], kidx[a:b]))
    return torch.cat(vals), torch.cat(members)


def walk(dec, nx, kidx):
    """(R, C) bool the set of each pair, by following its decisions forward from the root."""
    r, c = nx.shape
    dev = nx.device
    # Per pair: the entry of dec[i] for its row and the nodes j left to take (j = 0 is never
    # taken: dec[:, :, 0] is False), and the position it has reached.
    at = torch.arange(r, device=dev) * dec.shape[2] + kidx
    pos = torch.ones(r, dtype=torch.long, device=dev)
    members = torch.zeros(c, r, dtype=torch.bool, device=dev)
    members[0] = True
    flat = dec.view(c, -1)
    nxt = nx.t().contiguous()  # (C, R)
    if dev.type == "cpu":  # the same steps at NumPy's cost per call
        _walk_steps_numpy(_numpy(flat), _numpy(nxt), _numpy(at), _numpy(pos), _numpy(members))
        return members.t()
    for i in range(1, c):
        # A pair at position i takes v_i as decided, else skips v_i's subtree.
        here = pos == i
        t = torch.logical_and(flat[i].index_select(0, at), here, out=members[i])
        at.add_(t, alpha=-1)
        pos = torch.where(here, torch.where(t, i + 1, nxt[i]), pos)
    return members.t()




#: Batches of CPU tensors of at least this many (row, candidate, size) cells B·C² are solved in groups
#: of rows by candidate count (at most 16, 32, 64, ... columns, each group's tables that wide), where
#: the widest row would otherwise set every row's width; smaller ones in one go.  Not on a GPU, where
#: the groups' sizes would be one more host read (and the Triton kernel solves each row alone).
GROUP_CELLS = 1 << 16


def _walk_steps_numpy(flat, nxt, at, pos, members) -> None:
    """The position loop of :func:`walk` on NumPy views of its CPU tensors (in place)."""
    for i in range(1, flat.shape[0]):
        here = pos == i
        t = np.logical_and(flat[i][at], here, out=members[i])
        at -= t
        pos[:] = np.where(here, np.where(t, i + 1, nxt[i]), pos)


def jaccard_sets_torch(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget):
    """The torch implementation of :func:`jaccard_sets` (every device).

    Large batches of CPU tensors are solved in groups of rows of at most 16, 32, 64, ... candidates,
    each group on its first columns; the rounding slacks stay those of the whole table's width C, so
    that a row's choice between sizes is the same formula in any group.  On CPU tensors the knapsack
    and its walk step NumPy views of their tables (the same float64 operations).
    """
    check_args(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    bsz, c, _ = q.shape
    tables = (pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget)
    if q.device.type != "cpu" or bsz * c * c < GROUP_CELLS or c <= 16:
        return _solve(q, ids, count, lb, k_ref, *tables, c)
    groups = (c - 1).bit_length() - 3  # 16·2^(groups − 1) ≥ c
    group = ((count - 1).clamp(min=0) >> 4).add(1).log2().ceil().long().clamp(max=groups - 1)
    order = torch.sort(group, stable=True).indices
    # one host read, as the ungrouped call makes: the groups' own reads of CPU tensors go uncounted
    sizes = torch.zeros(groups, dtype=torch.long, device=q.device).index_add_(0, group, torch.ones_like(group)).tolist()
    out = torch.zeros(bsz, c, dtype=torch.bool, device=q.device)
    a = 0
    for g, n in enumerate(sizes):
        if n:
            rows, w = order[a:a + n], min(c, 16 << g)
            out[rows, :w] = _solve(q[rows, :w], ids[rows, :w], count[rows], lb[rows], k_ref[rows], *tables, c,
                                   _tolist)
            a += n
    return out


def _solve(q, ids, count, lb, k_ref, pre, end, depth, dmin1, depths, max_depth, mass_rel, mass_abs, budget, kslack,
           tolist=None):
    """:func:`jaccard_sets_torch` of rows whose counts fit q's width, rounding slacks of width ``kslack``;
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
    # The nodes allowed at each size: τ_k(n) = max(k, d_min(n) + 1)/(2k + D − 1), made for 2^20
    # (row, column, size) cells at a time (elementwise: the same values), g masked in place.
    kf = torch.arange(1, kmax + 1, device=dev, dtype=torch.float64)
    dmin = dmin1[safe_ids].clamp(max=max_depth + 1)  # (B, C)
    scale = (lb * (1 - mass_rel))[:, None, None]
    step = max(1, (1 << 20) // (bsz * kmax))
    for a in range(0, c, step):
        e = slice(a, a + step)
        tau_k = torch.maximum(kf, dmin[:, e, None]) / (2 * kf + max_depth - 1)  # (B, C', K)
        allowed = ((pv[:, e] + mass_abs)[:, :, None] >= tau_k * scale) | (cols[e] == 0)[None, :, None]
        g[:, e].masked_fill_(~(allowed & real[:, e, None]), float("-inf"))
    # The sizes whose bound reaches lb: min(the Lagrangian top-k bound, G(k)), λ_k the gain at k of the
    # candidate ranked k-th by its gain at the typical size.
    col = (k_ref.clamp(min=1, max=kmax) - 1)
    order = torch.sort(g.gather(2, col[:, None, None].expand(bsz, c, 1))[:, :, 0], dim=1, descending=True).indices
    lam = g.view(bsz, -1).gather(1, order * kmax + torch.arange(kmax, device=dev))  # g[b, order[b, k], k]
    lam = lam.clamp(min=0).nan_to_num(nan=0.0)
    ub = (g - lam[:, None, :]).clamp(min=0).sum(1) + lam * kf
    cover = torch.minimum(kf[:, None], depths + 1) / torch.maximum(kf[:, None], depths + 1)
    ub = torch.minimum(ub, q[:, 0, :] @ cover.t())  # the root's masses
    slack_v = 2 * ((num_e + kslack + 16) * u64 + mass_rel)
    spread = slack_v * (max_depth + 1) / kf + 4 * kslack * mass_abs
    want = (ub * (1 + slack_v) + spread >= lb[:, None]) & (kf[None, :] <= count[:, None])
    # The pairs, rows with more candidates first (a prefix of them works at each position); on large
    # tables by width class (sizes k ≤ 8, 16, 32, ...: each class's knapsack tables as wide as its
    # sizes, F(i, j) reads only j' ≤ j so the values are the same bits), rows with more candidates
    # first within a class.  One host read: per class, the pairs with at least i candidates, for
    # each position i.
    # 8·2^(classes − 1) ≥ kmax
    classes = 1 if bsz * kmax * kmax < GROUP_CELLS else max(1, (kmax - 1).bit_length() - 2)
    by_count = torch.sort(count, descending=True, stable=True).indices
    if classes == 1:
        per = torch.zeros(kmax + 1, dtype=torch.long, device=dev).index_add_(0, count, want.sum(1))[None]
    else:
        size_class = ((torch.arange(kmax, device=dev) >> 3) + 1).log2().ceil().long().clamp(max=classes - 1)
        per = torch.zeros(classes * (kmax + 1), dtype=torch.long, device=dev).index_add_(
            0, (size_class[None, :] * (kmax + 1) + count[:, None]).view(-1), want.view(-1).long()).view(classes, -1)
    sizes = torch.cat([per.flip(1).cumsum(1).flip(1), per.new_zeros(classes, 1)], 1)  # [c][i]: count ≥ i
    sizes = sizes.tolist() if tolist is None else tolist(sizes)
    b, kidx = torch.nonzero_static(want[by_count], size=sum(row[0] for row in sizes)).unbind(1)
    if classes > 1:
        by_class = torch.sort(size_class[kidx], stable=True).indices
        b, kidx = b[by_class], kidx[by_class]
    b = by_count[b]
    nx = nxt[b]
    gp = g[b, :, kidx]
    if classes == 1:
        val, members = knapsack_sets(gp, nx, kidx, kmax, sizes[0][1:], budget)  # (R,), (R, C)
    else:
        vals, sets, a = [], [], 0
        for cls, row in enumerate(sizes):
            if row[0]:
                part = slice(a, a + row[0])
                width = min(kmax, (8 << cls) - 1)
                val, members = knapsack_sets(gp[part], nx[part], kidx[part], width, row[1:], budget)
                vals.append(val)
                sets.append(members)
                a += row[0]
        val, members = torch.cat(vals), torch.cat(sets)
    # The smallest size within float64 rounding of the best value, its first set.
    best = torch.full((bsz,), float("-inf"), dtype=torch.float64, device=dev).scatter_reduce(0, b, val, "amax")
    eligible = val >= best[b] * (1 - slack_v) - 4 * kslack * mass_abs
    kbest = torch.full((bsz,), kmax, dtype=torch.long, device=dev).scatter_reduce(
        0, b, torch.where(eligible, kidx, kmax), "amin")
    first = eligible & (kidx == kbest[b])
    r = b.numel()
    pick = torch.full((bsz,), r, dtype=torch.long, device=dev).scatter_reduce(
        0, b, torch.where(first, torch.arange(r, device=dev), r), "amin")
    return torch.cat([members, members.new_zeros(1, c)])[pick]  # row R: no pair


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
