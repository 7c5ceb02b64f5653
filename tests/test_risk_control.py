"""Risk-controlled decoding: the nested family, the fit against a brute-force scan, the guarantee in simulation.

- the family D_λ ("descend while the most probable child has p > λ") equals a plain-Python walk on
  random trees, is nested in λ (hypothesis), and equals the deepest node with p > λ (hence majority,
  tree_distance_c and confidence_threshold) for λ ≥ 1/2;
- each row's loss at any λ, read from its critical values / steps, equals the loss of the decoded node;
- the fitted λ equals a brute-force scan of every distinct node probability of the calibration rows,
  scored by decoding (small random trees and both bundled trees; conformal and confidence bound; miss,
  miss with a budget, overshoot and a custom loss).  Probabilities are multiples of 2^-bits so that
  every node sum is exact whatever the summation order;
- the guarantee holds in simulation on calibrated synthetic outputs of both bundled trees, and the
  same check fails for deliberately broken fits.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import hdecode_torch as hd
import reference as ref
from hdecode_torch.kernels import lca_depth
from hdecode_torch.synthetic import synthetic_outputs
from harness import devices

BUNDLED = ["tieredimagenet-h", "inat19"]


# --------------------------------------------------------------------------- data
def dyadic(probs: torch.Tensor, bits: int) -> torch.Tensor:
    """Rows rounded down to multiples of 2^-bits, the remainder added to each row's largest entry: float64
    rows that sum to exactly 1, whose node sums are exact in any order (and in float32 for bits ≤ 23)."""
    scale = float(2**bits)
    q = torch.floor(probs.double() * scale)
    q[torch.arange(q.shape[0]), q.argmax(1)] += scale - q.sum(1)
    return q / scale


def random_rows(rng: np.random.Generator, info: ref.TreeInfo, n: int, bits: int):
    """(probs (n, L) float64 dyadic, targets (n,) int64 drawn from them)."""
    kinds = ["dirichlet", "peaked", "sparse", "uniform"]
    p = np.stack([ref.random_distribution(rng, info.L, kinds[i % len(kinds)]) for i in range(n)])
    probs = dyadic(torch.as_tensor(p), bits)
    y = torch.as_tensor([rng.choice(info.L, p=row / row.sum()) for row in probs.numpy()], dtype=torch.long)
    return probs, y


def random_tree(seed: int, max_nodes: int = 16):
    rng = np.random.default_rng(seed)
    par = ref.random_tree(rng, num_nodes_max=max_nodes, unary_prob=0.25, min_leaves=2, deep_bias=0.4)
    return hd.Hierarchy.from_parents(par), ref.TreeInfo(par), rng


def bundled(name: str):
    h = hd.load_hierarchy(name)
    return h, ref.TreeInfo(h.parent.numpy())


# --------------------------------------------------------------------------- plain-Python references
def ref_path(info: ref.TreeInfo, node_p: np.ndarray) -> list[int]:
    """The top-down path t_0..t_K: from the root, the most probable child (smallest id on ties) until a leaf."""
    path = [info.root]
    while info.children[path[-1]]:
        kids = info.children[path[-1]]  # ascending ids
        path.append(max(kids, key=lambda c: (node_p[c], -c)))
    return path


def ref_decode(info: ref.TreeInfo, node_p: np.ndarray, lam: float) -> int:
    """Walk the top-down path while the next node has p > lam."""
    path = ref_path(info, node_p)
    k = 0
    while k + 1 < len(path) and node_p[path[k + 1]] > lam:
        k += 1
    return path[k]


def ref_loss(info: ref.TreeInfo, kind, node: int, y: int) -> float:
    over = int(info.depth[node] - info.depth[info.lca(node, y)])
    if kind == "miss":
        return float(over > 0)
    if kind == "budget1":
        return float(over > 1)
    if kind == "overshoot":
        return float(over)
    return min(over, 4) / 4


def custom_loss(h):
    """min(overshoot, 4) / 4: levels past the target's branch, capped and scaled to [0, 1] (dyadic values, so
    that sums are exact in any order)."""
    def loss(nodes, leaves):
        return (h.depth[nodes] - lca_depth(h, nodes, leaves)).clamp(max=4).double() / 4
    return loss


def imprecision(h):
    """1 − hierarchical precision of the answer, 1 − |A(n) ∩ A(y)| / |A(n)|: in [0, 1), 0 on y's root path,
    non-decreasing down the tree."""
    def loss(nodes, leaves):
        return 1.0 - (lca_depth(h, nodes, leaves) + 1).double() / (h.depth[nodes] + 1).double()
    return loss


def make(h, kind, **kw):
    if kind == "miss":
        return hd.RiskControl(h, **kw)
    if kind == "budget1":
        return hd.RiskControl(h, budget=1, **kw)
    if kind == "overshoot":
        return hd.RiskControl(h, loss="overshoot", **kw)
    return hd.RiskControl(h, loss=custom_loss(h), loss_bound=1.0, **kw)


def binom_cdf(k: int, n: int, a: float) -> float:
    return math.fsum(math.comb(n, i) * a**i * (1 - a) ** (n - i) for i in range(0, k + 1))


def passes(total: float, n: int, alpha: float, delta, bound: float, binary: bool) -> bool:
    """The fit's condition at one λ, from the papers' formulas (S = total loss of the n rows)."""
    if delta is None:  # Angelopoulos et al. 2022: (n/(n+1)) R̂ + B/(n+1) ≤ α, in exact arithmetic
        return Fraction(total) + Fraction(bound) <= Fraction(alpha) * (n + 1)
    if binary:
        return binom_cdf(round(total), n, alpha) <= delta
    r, a = total / (n * bound), alpha / bound  # Hoeffding–Bentkus p-value
    rr = min(r, a)
    kl = (rr * math.log(rr / a) if rr > 0 else 0.0) + (1 - rr) * math.log((1 - rr) / (1 - a))
    return min(math.exp(-n * kl), math.e * binom_cdf(math.ceil(total / bound), n, a)) <= delta


def brute_force_lambda(info, probs, y, kind, alpha, delta, bound):
    """The smallest λ among 0 and every distinct node probability of the rows whose condition holds,
    the loss at each λ scored from the decoded node; also S at every λ."""
    node_p = np.stack([ref.node_probs(info, row) for row in probs.numpy()])
    grid = np.unique(np.concatenate([[0.0], node_p.ravel()]))
    total = np.zeros(grid.size)
    for i, row_p in enumerate(node_p):
        path = ref_path(info, row_p)
        losses = np.array([ref_loss(info, kind, t, int(y[i])) for t in path])
        # the walk "while the next node has p > λ", at every λ of the grid at once
        depth = np.cumprod(row_p[path[1:]][None, :] > grid[:, None], axis=1).sum(1)
        total += losses[depth]
    binary = kind in ("miss", "budget1")
    ok = [passes(t, len(y), alpha, delta, bound, binary) for t in total]
    return float(grid[ok.index(True)]), grid, total


# --------------------------------------------------------------------------- the family
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("bits", [3, 20])
def test_descent_matches_the_plain_walk(seed, bits):
    h, info, rng = random_tree(seed)
    probs, _ = random_rows(rng, info, 24, bits)
    node_p = np.stack([ref.node_probs(info, row) for row in probs.numpy()])
    # λ on every node probability (exact ties with the comparison), between them, 0 and above 1
    lams = [0.0, 0.5, 1.0, 2.0] + list(rng.choice(node_p.ravel(), 6)) + list(rng.random(3))
    for lam in lams:
        got = hd.decoders.ThresholdDescent(h, float(lam)).decode(probs)
        want = [ref_decode(info, row, lam) for row in node_p]
        assert got.tolist() == want, (lam, info)
        assert torch.equal(hd.decoders.ThresholdDescent(h, float(lam)).decode(probs.float()), got)


@st.composite
def tree_rows_lams(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    h, info, rng = random_tree(seed, max_nodes=draw(st.integers(3, 18)))
    probs, _ = random_rows(rng, info, draw(st.integers(1, 8)), draw(st.sampled_from([2, 4, 20])))
    node_p = sorted(set(np.stack([ref.node_probs(info, r) for r in probs.numpy()]).ravel().tolist()))
    lams = draw(st.lists(st.one_of(st.sampled_from(node_p), st.floats(0, 1.2)), min_size=2, max_size=6))
    return h, info, probs, sorted(lams)


@given(tree_rows_lams())
def test_the_family_is_nested(data):
    h, info, probs, lams = data
    answers = [hd.decoders.ThresholdDescent(h, lam).decode(probs).tolist() for lam in lams]
    for smaller, larger in zip(answers, answers[1:]):
        for a, b in zip(smaller, larger):
            assert info.is_ancestor(b, a), (lams, info)  # a larger λ answers the same node or an ancestor


@pytest.mark.parametrize("tree", ["random", *BUNDLED])
def test_at_least_one_half_it_is_the_deepest_node_above(tree):
    if tree == "random":
        h, info, rng = random_tree(7, max_nodes=30)
        probs = random_rows(rng, info, 200, 20)[0]
    else:
        h, info = bundled(tree)
        probs = dyadic(synthetic_outputs(h, 300, noise=0.5, seed=4)[0], 20)
    node = hd.node_probabilities(h, probs)  # (B, N), exact (dyadic)
    rank = h.depth.double() * h.num_nodes - torch.arange(h.num_nodes).double()  # deeper, then smaller id
    for lam in [0.5, 0.6, 0.75, 0.9, 0.99]:
        deepest = torch.where(node > lam, rank, -math.inf).argmax(1)
        deepest = torch.where((node > lam).any(1), deepest, h.root)
        got = hd.decoders.ThresholdDescent(h, lam).decode(probs)
        assert torch.equal(got, deepest), lam
        assert torch.equal(got, hd.get_metric("tree_distance_c", h, c=2 * lam - 1).decode(probs)), lam
        assert torch.equal(got, hd.get_decoder("confidence_threshold", h, tau=lam).decode(probs)), lam
    assert torch.equal(hd.decoders.ThresholdDescent(h, 0.5).decode(probs), hd.get_decoder("majority", h).decode(probs))


def test_below_one_half_the_deepest_node_above_is_not_nested_but_the_family_is():
    # root(6) -> a(4) -> a1(0), a2(1); root -> b(5) -> b1(2), b2(3)
    h = hd.Hierarchy.from_parents([4, 4, 5, 5, 6, 6, -1])
    p = torch.tensor([[0.3, 0.25, 0.4, 0.05]], dtype=torch.float64)  # a = 0.55, b = 0.45
    node = hd.node_probabilities(h, p)[0]
    deepest = {lam: max((n for n in range(7) if node[n] > lam), key=lambda n: (int(h.depth[n]), -n))
               for lam in (0.2, 0.35)}
    assert deepest == {0.2: 0, 0.35: 2}  # b1 at 0.35 is not an ancestor of a1 at 0.2
    family = {lam: int(hd.decoders.ThresholdDescent(h, lam).decode(p)) for lam in (0.2, 0.35)}
    assert family == {0.2: 0, 0.35: 4}  # a1, then its parent a


# --------------------------------------------------------------------------- critical values
@pytest.mark.parametrize("kind", ["miss", "budget1", "overshoot", "custom"])
@pytest.mark.parametrize("tree", ["random", "tieredimagenet-h"])
def test_step_losses_equal_the_loss_of_the_decoded_node(kind, tree):
    if tree == "random":
        h, info, rng = random_tree(3, max_nodes=25)
        probs, y = random_rows(rng, info, 300, 6)
    else:
        h, info = bundled(tree)
        probs, y = synthetic_outputs(h, 300, seed=5, dtype=torch.float64)
    rc = make(h, kind, alpha=0.5)
    steps = rc.loss_steps(probs, y)
    if kind in ("miss", "budget1"):
        assert steps.at.shape == (300, 1) and steps.binary  # one critical value per row
    node = hd.node_probabilities(h, probs).reshape(-1)  # λ on node probabilities: exact ties with the comparison
    pick = torch.randperm(node.numel(), generator=torch.Generator().manual_seed(0))[:25]
    lams = torch.cat([torch.tensor([0.0, 0.5, 1.0], dtype=node.dtype), node[pick]])
    got = steps.losses(lams)  # (G, B)
    for g, lam in enumerate(lams.tolist()):
        pred = hd.decoders.ThresholdDescent(h, lam).decode(probs)
        want = [ref_loss(info, kind, int(n), int(t)) for n, t in zip(pred, y)] if tree == "random" else None
        if want is None:
            over = (h.depth[pred] - lca_depth(h, pred, y)).double()
            want = {"miss": over > 0, "budget1": over > 1, "overshoot": over,
                    "custom": custom_loss(h)(pred, y)}[kind].double().tolist()
        assert np.allclose(got[g].numpy(), want, rtol=0, atol=1e-12), (kind, lam)


def test_a_miss_happens_below_the_critical_value():
    h, info, rng = random_tree(11, max_nodes=20)
    probs, y = random_rows(rng, info, 200, 20)
    s = hd.RiskControl(h).loss_steps(probs, y)
    crit, has = s.at[:, 0], s.jump[:, 0] > 0
    for i in range(200):
        node_p = ref.node_probs(info, probs[i].numpy())
        path = ref_path(info, node_p)
        off = [k for k, t in enumerate(path) if not info.is_ancestor(t, int(y[i]))]
        assert bool(has[i]) == bool(off)  # a path that ends at y is never missed
        if off:
            assert float(crit[i]) == min(node_p[path[1:off[0] + 1]])  # q_{m+1}


# --------------------------------------------------------------------------- the fit
FIT_CASES = [("miss", 0.1, None), ("miss", 0.2, 0.1), ("miss", 0.3, 0.05), ("budget1", 0.1, None),
             ("budget1", 0.15, 0.2), ("overshoot", 0.6, None), ("overshoot", 1.0, 0.1), ("custom", 0.1, None),
             ("custom", 0.25, 0.1)]


@pytest.mark.parametrize("kind,alpha,delta", FIT_CASES)
@pytest.mark.parametrize("seed", range(4))
def test_fit_equals_brute_force_on_random_trees(kind, alpha, delta, seed):
    h, info, rng = random_tree(100 + seed, max_nodes=20)
    for bits in (3, 20):
        probs, y = random_rows(rng, info, 80, bits)
        rc = make(h, kind, alpha=alpha, delta=delta).fit(probs, y)
        want, grid, total = brute_force_lambda(info, probs, y, kind, alpha, delta, rc.bound)
        assert rc.lam == want, (kind, alpha, delta, bits, info)
        assert rc.calibration_risk == pytest.approx(total[np.searchsorted(grid, want)] / 80, abs=1e-12)


@pytest.mark.parametrize("kind,alpha,delta", [c for c in FIT_CASES if c[0] != "overshoot"] + [("overshoot", 2.0, None),
                                                                                            ("overshoot", 3.0, 0.2)])
@pytest.mark.parametrize("tree", BUNDLED)
def test_fit_equals_brute_force_on_bundled_trees(tree, kind, alpha, delta):
    h, info = bundled(tree)
    probs, y = synthetic_outputs(h, 60, seed=6)
    probs = dyadic(probs, 20)
    rc = make(h, kind, alpha=alpha, delta=delta).fit(probs, y)
    assert rc.lam == brute_force_lambda(info, probs, y, kind, alpha, delta, rc.bound)[0]


@devices
def test_fit_and_decode_agree_across_plans_and_devices(device):
    h = hd.load_hierarchy("tieredimagenet-h")
    probs, y = synthetic_outputs(h, 3000, seed=8)
    pt, _ = synthetic_outputs(h, 2000, seed=9)
    want = hd.RiskControl(h, alpha=0.1).fit(probs, y)
    for plan in ("cpu", "cuda"):
        with hd.plan_for(plan):
            rc = hd.RiskControl(h, alpha=0.1).fit(probs.to(device), y.to(device))
            assert rc.lam == want.lam and rc.calibration_risk == want.calibration_risk
            assert torch.equal(rc.decode(pt.to(device)).cpu(), want.decode(pt))
            assert torch.equal(rc.decode(pt.to(device), chunk_size=77).cpu(), want.decode(pt))


def test_fit_from_logits_and_from_steps():
    h = hd.load_hierarchy("inat19")
    logits = torch.randn(500, h.num_leaves, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
    y = torch.distributions.Categorical(logits=logits).sample()
    a = hd.RiskControl(h, alpha=0.1, delta=0.1).fit(logits, y, from_logits=True)
    b = hd.RiskControl(h, alpha=0.1, delta=0.1).fit(torch.softmax(logits, 1), y)
    assert a.lam == b.lam and a.calibration_risk == b.calibration_risk
    steps = a.loss_steps(logits, y, from_logits=True)
    idx = torch.arange(0, 500, 2)
    c = hd.RiskControl(h, alpha=0.1, delta=0.1).fit_steps(steps.rows(idx))
    assert c.lam == hd.RiskControl(h, alpha=0.1, delta=0.1).fit(logits[idx], y[idx], from_logits=True).lam


def test_fit_detaches_scores_that_require_grad():
    """Fitting is not differentiable: logits from a model or a TemperatureScaler, outside no_grad, fit the same
    λ as their detached values (the walk's preallocated tables made autograd refuse them)."""
    P, y = synthetic_outputs(H, 400, seed=2)
    logits = torch.log(P).requires_grad_()
    scaled = hd.TemperatureScaler(1.5)(torch.log(P))  # requires grad through the temperature
    for loss in ("miss", "overshoot"):
        for x in (logits, scaled, torch.softmax(scaled, 1)):
            kind = {"from_logits": bool((x.detach() < 0).any())}  # probabilities are >= 0
            assert x.requires_grad
            want = hd.RiskControl(H, alpha=0.2, loss=loss).fit(x.detach(), y, **kind)
            rc = hd.RiskControl(H, alpha=0.2, loss=loss).fit(x, y, **kind)
            assert rc.lam == want.lam and rc.calibration_risk == want.calibration_risk
            assert torch.equal(rc.decode(x, **kind), want.decode(x.detach(), **kind))
            assert torch.equal(rc.loss_steps(x, y, **kind).at, want.loss_steps(x.detach(), y, **kind).at)
            assert rc.risk_coverage(x, y, **kind).fitted_lambda == want.lam
    assert logits.grad is None


def test_min_calibration_rows_is_exact():
    h = hd.load_hierarchy("tieredimagenet-h")
    probs, y = synthetic_outputs(h, 200, seed=10)
    for kw, need in [({"alpha": 0.1}, 9), ({"alpha": 0.05}, 19), ({"alpha": 0.1, "delta": 0.1}, 22),
                     ({"alpha": 0.2, "delta": 0.05}, 14), ({"alpha": 0.5, "loss": "overshoot"}, 23)]:
        rc = hd.RiskControl(h, **kw)
        assert rc.min_calibration_rows() == need, kw
        rc.fit(probs[:need], y[:need])
        with pytest.raises(ValueError, match=f"at least {need} rows.*but got {need - 1}"):
            hd.RiskControl(h, **kw).fit(probs[:need - 1], y[:need - 1])


def _walked_min_rows(alpha, delta, bound, binary):
    """min_calibration_rows as 2eafccb computed it: one row at a time from the closed form, the binomial
    CDF built on all n + 1 values at every step (O(n) each)."""
    def logcdf(n, a):
        k = torch.arange(n + 1, dtype=torch.float64)
        logpmf = (math.lgamma(n + 1) - torch.lgamma(k + 1) - torch.lgamma(n - k + 1)
                  + k * math.log(a) + (n - k) * math.log1p(-a))
        return torch.logcumsumexp(logpmf, 0)

    def certified(n):
        total = torch.zeros(1, dtype=torch.float64)
        if delta is None:
            return bool(total + bound <= alpha * (n + 1))
        if binary:
            return bool(total <= int((logcdf(n, alpha) <= math.log(delta)).sum()) - 1)
        a = alpha / bound
        r = (total / (n * bound)).clamp(0.0, 1.0)
        rr = torch.minimum(r, torch.full_like(r, a))
        h = torch.xlogy(rr, rr / a) + torch.xlogy(1 - rr, (1 - rr) / (1 - a))
        k = torch.ceil(total / bound).clamp(0, n).long()
        return bool(torch.minimum(-n * h, 1.0 + logcdf(n, a)[k]) <= math.log(delta))

    n = (max(1, math.ceil(bound / alpha) - 1) if delta is None
         else max(1, math.ceil(math.log(delta) / math.log1p(-alpha / bound))))
    while not certified(n):
        n += 1
    while n > 1 and certified(n - 1):
        n -= 1
    return n


def test_min_calibration_rows_equals_the_row_by_row_walk():
    h = hd.load_hierarchy("tieredimagenet-h")  # overshoot: B = 12
    table = torch.zeros(h.num_nodes, h.num_leaves, dtype=torch.float64)
    table[:h.num_leaves] = 7.0 * (torch.arange(h.num_leaves)[:, None] != torch.arange(h.num_leaves))  # B = 7
    losses = [("miss", 1.0), ("overshoot", float(h.max_depth)), (table, 7.0)]
    for e in np.linspace(-4.5, -0.02, 23):
        for delta in [None, 1e-12, 0.01, 0.1, 0.5, 0.95]:
            for loss, bound in losses:
                alpha = float(10**e) * bound
                rc = hd.RiskControl(h, alpha=alpha, delta=delta, loss=loss)
                assert rc.bound == bound
                want = _walked_min_rows(alpha, delta, bound, rc.binary)
                assert rc.min_calibration_rows() == want, (alpha, delta, bound)


def test_min_calibration_rows_of_tiny_levels_answers_at_once():
    """2eafccb counted row by row from ~1/alpha (alpha = 1e-40 never returned; with delta it raised OverflowError,
    at 3e-8 it took 2.6 GB and 44 s): now milliseconds, or a refusal beyond 2^40 rows.  In a subprocess, so
    that a hang is a failure and memory is capped (1 GiB of address space beyond the imports)."""
    code = textwrap.dedent("""
        import resource, time
        import hdecode_torch as hd
        import torch
        # 1 GiB beyond the imports (a CUDA build of torch maps gigabytes of libraries)
        with open("/proc/self/status") as f:
            mapped = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (mapped + 2**30, mapped + 2**30))
        h = hd.Hierarchy.from_parents([2, 2, -1])
        t = time.perf_counter()
        print(hd.RiskControl(h, alpha=3e-8, delta=0.05).min_calibration_rows())
        print(hd.RiskControl(h, alpha=1e-11).min_calibration_rows())
        for kw in [dict(alpha=1e-40), dict(alpha=1e-40, delta=0.1), dict(alpha=5e-324, delta=0.5),
                   dict(alpha=1e-12, delta=0.05)]:
            try:
                hd.RiskControl(h, **kw).min_calibration_rows()
            except ValueError as exc:
                print(exc)
        print(f"{time.perf_counter() - t:.3f}")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["99857741", "100000000000"]  # 2eafccb's walk, measured (96 s); 1/alpha - 1
    refusals = lines[2:6]
    assert refusals[0] == ("Expected `alpha` to be certifiable on a calibration set that can exist, but alpha=1e-40 "
                           "needs more than 2^40 = 1,099,511,627,776 calibration rows (about 1e+40): use a larger "
                           "alpha")
    assert "alpha=1e-40 with delta=0.1 needs more than 2^40" in refusals[1]
    assert "alpha=4.94066e-324 with delta=0.5 needs more than 2^40 = 1,099,511,627,776 calibration rows: use" \
        in refusals[2]  # the estimate overflows: no number to print
    assert "alpha=1e-12 with delta=0.05 needs more than 2^40" in refusals[3] and "(about 3e+12)" in refusals[3]
    assert float(lines[6]) < 1.0


def test_fit_refuses_an_unreachable_level():
    h = hd.load_hierarchy("tieredimagenet-h")
    probs, y = synthetic_outputs(h, 20, seed=1)
    with pytest.raises(ValueError, match=r"but alpha=1e-13 \(loss bound B = 12\) needs more than 2\^40"):
        hd.RiskControl(h, alpha=1e-13, loss="overshoot").fit(probs, y)


_DEEP_FIT = """
import resource, sys, time, torch
import hdecode_torch as hd
depth, rows = int(sys.argv[1]), int(sys.argv[2])
# test_decoders.caterpillar(depth): a spine of `depth` internal nodes, one leaf under each, two under the last
h = hd.Hierarchy.from_parents([-1] + list(range(depth - 1)) + list(range(depth)) + [depth - 1])
g = torch.Generator().manual_seed(0)
probs = torch.softmax(3 * torch.randn(rows, h.num_leaves, generator=g, dtype=torch.float64), 1)
y = torch.multinomial(probs, 1, generator=g)[:, 0]
before, t = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
rc = hd.RiskControl(h, alpha=0.2).fit(probs, y)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(grown, time.perf_counter() - t, rc.lam, rc.calibration_risk)
"""


def test_fit_on_a_deep_caterpillar_stays_small():
    """A 16,001-node caterpillar (depth 8,000): 2eafccb built the miss loss's (L, D + 1) tables before finding
    them too large, 1.5 GiB and 26 s at 64 rows; now the size check comes first and the fit walks the paths.
    Peak memory measured in a subprocess (ru_maxrss) around the fit."""
    proc = subprocess.run([sys.executable, "-c", _DEEP_FIT, "8000", "64"], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    grown, seconds, lam, risk = (float(v) for v in proc.stdout.split())
    assert grown < 128, grown  # MiB; the rows' (64, 8,001) probabilities are 4 MiB
    assert 0 < lam < 1 and 64 * risk + 1 <= 0.2 * 65  # the conformal condition at the fitted λ


# --------------------------------------------------------------------------- the guarantee in simulation
SPLITS, N_CAL, N_TEST = 200, 2000, 10000
_POOLS: dict = {}


def pool(tree: str):
    """12,000 calibrated synthetic rows of ``tree`` (targets drawn from the probabilities), made once."""
    if tree not in _POOLS:
        _POOLS[tree] = synthetic_outputs(hd.load_hierarchy(tree), N_CAL + N_TEST, seed=2024)
    return _POOLS[tree]


def pool_steps(tree: str, rc) -> "hd.decoders.LossSteps":
    """The pool's LossSteps for ``rc``'s loss, computed once per tree and loss."""
    key = (tree, rc.loss, rc.budget)
    if key not in _POOLS:
        _POOLS[key] = rc.loss_steps(*pool(tree))
    return _POOLS[key]


def pool_paths(tree: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(pp, nodes), both (n, D + 1): p(t_0), ..., p(t_D) along each pool row's top-down path (0 past its end)
    and the path's nodes (the leaf repeated past its end).  A plain reference: node probabilities, each node's
    children padded with -1, one argmax per level."""
    key = (tree, "paths")
    if key not in _POOLS:
        h = hd.load_hierarchy(tree)
        info = ref.TreeInfo(h.parent.numpy())
        node = hd.node_probabilities(h, pool(tree)[0].double())
        width = max(len(c) for c in info.children)
        kids = torch.tensor([c + [-1] * (width - len(c)) for c in info.children])
        cur = torch.full((node.shape[0],), info.root)
        pp, nodes = [node[:, info.root]], [cur]
        for _ in range(info.max_depth):
            k = kids[cur]
            j = torch.where(k >= 0, node.gather(1, k.clamp(min=0)), -1.0).argmax(1)  # first max: smallest id
            nxt = k.gather(1, j[:, None])[:, 0]
            pp.append(torch.where(nxt >= 0, node.gather(1, nxt.clamp(min=0)[:, None])[:, 0], 0.0))
            cur = torch.where(nxt >= 0, nxt, cur)
            nodes.append(cur)
        _POOLS[key] = torch.stack(pp, 1), torch.stack(nodes, 1)
    return _POOLS[key]


def miss_steps(pp: torch.Tensor, m: torch.Tensor) -> "hd.decoders.LossSteps":
    """The miss loss's LossSteps of rows whose target leaves the top-down path after t_m: the critical value
    p(t_{m+1}), 0 (never missed) when the path ends at the target."""
    nxt = (m + 1).clamp(max=pp.shape[1] - 1)
    at = torch.where(m + 1 < pp.shape[1], pp.gather(1, nxt[:, None])[:, 0], 0.0)
    return hd.decoders.LossSteps(at[:, None], torch.ones_like(at)[:, None], 1.0, True)


def splits(num_rows, n_cal=N_CAL, count=SPLITS, seed=0):
    """``count`` random calibration/test splits of the pool, as (calibration rows, test rows) index pairs."""
    perms = torch.rand(count, num_rows, generator=torch.Generator().manual_seed(seed)).argsort(1)
    return [(p[:n_cal], p[n_cal:]) for p in perms]


def split_losses(steps, fit, **kw):
    """(S,) the test miss rate (mean loss) of each split, λ fitted by ``fit(LossSteps of the calibration rows)``,
    the test rows' losses read from their steps."""
    return torch.stack([steps.rows(test).losses(fit(steps.rows(cal))).mean()
                        for cal, test in splits(steps.num_rows, **kw)])


def fresh_label_misses(tree, fit, seed=1, **kw):
    """(S,) the miss rate of each split's fitted decoder, for the confidence bound: its guarantee is over
    calibration rows drawn afresh, and the permutations of one pool share the pool's labels (a pool whose
    labels happen to be easy makes every split's bound optimistic).  Calibrated outputs allow both: each
    split redraws its calibration labels from the probabilities (the target goes down the top-down path to
    depth m with probability p(t_m): m = #{k ≥ 1 : u < p(t_k)}, u uniform), and its miss rate is the mean of
    1 − p(answer) over all the pool's rows, each row's exact probability of a miss.  (Over the test rows
    only, a split whose calibration rows are easy would leave harder test rows: another artefact of one pool.)
    So the pool's rows play the population, and each split draws a calibration sample from it."""
    pp, _ = pool_paths(tree)
    g = torch.Generator().manual_seed(seed)
    out = []
    for cal, _ in splits(pp.shape[0], **kw):
        u = torch.rand(cal.numel(), generator=g, dtype=torch.float64)
        lam = fit(miss_steps(pp[cal], (u[:, None] < pp[cal, 1:]).sum(1)))
        depth = torch.cumprod(pp[:, 1:] > lam, 1).sum(1)  # walk while the next node has p > λ
        out.append(1 - pp.gather(1, depth[:, None])[:, 0].mean())
    return torch.stack(out)


def crc_holds(losses, alpha) -> bool:
    return float(losses.mean()) <= alpha + 3 * float(losses.std()) / math.sqrt(losses.numel())


def ucb_holds(losses, alpha, delta) -> bool:
    return float((losses > alpha).double().mean()) <= delta + 3 * math.sqrt(delta * (1 - delta) / losses.numel())


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
@pytest.mark.parametrize("tree", BUNDLED)
def test_conformal_guarantee_holds_in_simulation(tree, alpha):
    h = hd.load_hierarchy(tree)
    rc = hd.RiskControl(h, alpha=alpha)
    losses = split_losses(pool_steps(tree, rc), lambda s: rc.fit_steps(s).lam)
    assert crc_holds(losses, alpha), (float(losses.mean()), float(losses.std()))
    assert float(losses.mean()) >= alpha - 0.01  # and it is not vacuous: the miss rate comes close to α


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
@pytest.mark.parametrize("tree", BUNDLED)
def test_confidence_bound_guarantee_holds_in_simulation(tree, alpha):
    h = hd.load_hierarchy(tree)
    rc = hd.RiskControl(h, alpha=alpha, delta=0.1)
    # the reference critical values of the pool's own labels are the decoder's
    pp, nodes = pool_paths(tree)
    y = pool(tree)[1]
    above = (lca_depth(h, nodes[:, 1:], y[:, None]) == torch.arange(1, pp.shape[1])) & (pp[:, 1:] > 0)
    assert torch.allclose(miss_steps(pp, above.sum(1)).at, pool_steps(tree, rc).at, rtol=0, atol=1e-12)
    misses = fresh_label_misses(tree, lambda s: rc.fit_steps(s).lam)
    assert ucb_holds(misses, alpha, 0.1), float((misses > alpha).double().mean())
    assert float(misses.mean()) >= alpha - 0.02  # not vacuous


@pytest.mark.parametrize("delta", [None, 0.1])
def test_guarantee_holds_for_a_bounded_loss_in_simulation(delta):
    h = hd.load_hierarchy("tieredimagenet-h")
    rc = hd.RiskControl(h, alpha=0.2, delta=delta, loss="overshoot")  # mean levels past the target's branch
    losses = split_losses(pool_steps("tieredimagenet-h", rc), lambda s: rc.fit_steps(s).lam)
    assert crc_holds(losses, 0.2) if delta is None else ucb_holds(losses, 0.2, delta)


def uncorrected_fit(alpha):
    """A deliberately wrong conformal fit: the empirical miss rate ≤ α, without the finite-sample correction."""
    def fit(steps):
        at, jump = steps.at[:, 0], steps.jump[:, 0]
        grid = torch.cat([torch.zeros(1, dtype=torch.float64), at.sort().values])
        total = ((at[None, :] > grid[:, None]) * jump).sum(1)
        return float(grid[(total <= alpha * steps.num_rows).nonzero()[0, 0]])
    return fit


@pytest.mark.parametrize("tree", BUNDLED)
def test_the_simulation_catches_a_broken_guarantee(tree):
    h = hd.load_hierarchy(tree)
    rc = hd.RiskControl(h, alpha=0.1)
    steps = pool_steps(tree, rc)
    # Without the +1 of the finite-sample correction the mean miss rate is (⌊αn⌋ + 1)/(n + 1): 3/21 at n = 20.
    small = dict(n_cal=20)
    assert crc_holds(split_losses(steps, lambda s: rc.fit_steps(s).lam, **small), 0.1)
    assert not crc_holds(split_losses(steps, uncorrected_fit(0.1), **small), 0.1)
    # The conformal λ sold as a 1 − δ bound: about half the splits miss more than α.
    assert not ucb_holds(fresh_label_misses(tree, lambda s: rc.fit_steps(s).lam), 0.1, 0.1)


# --------------------------------------------------------------------------- the curve
def test_risk_coverage_curve():
    h, info, rng = random_tree(21, max_nodes=24)
    probs, y = random_rows(rng, info, 150, 6)
    rc = hd.RiskControl(h, alpha=0.2)
    unfitted = rc.risk_coverage(probs, y)
    assert unfitted.fitted_lambda is None
    rc.fit(probs, y)
    curve = rc.risk_coverage(probs, y)
    assert curve.fitted_lambda == rc.lam and curve.alpha == 0.2 and curve.delta is None
    assert curve.lam[0] == 0 and bool((curve.lam.diff() > 0).all())
    assert bool((curve.risk.diff() <= 0).all()) and bool((curve.mean_depth.diff() <= 0).all())
    for g in range(curve.lam.numel()):
        lam = float(curve.lam[g])
        pred = hd.decoders.ThresholdDescent(h, lam).decode(probs)
        miss = np.mean([not info.is_ancestor(int(n), int(t)) for n, t in zip(pred, y)])
        assert float(curve.risk[g]) == pytest.approx(miss, abs=1e-12)
        assert float(curve.mean_depth[g]) == pytest.approx(float(h.depth[pred].double().mean()), abs=1e-12)
        if lam == rc.lam:
            assert float(curve.risk[g]) == rc.calibration_risk
    # every node probability on the rows' paths where an answer changes is on the grid, and nothing else
    node_p = np.stack([ref.node_probs(info, r) for r in probs.numpy()])
    path_p = {float(row[t]) for row in node_p for t in ref_path(info, row)[1:]}
    assert set(curve.lam.tolist()) == path_p | {0.0}


# --------------------------------------------------------------------------- within a known subtree
def rows_within(rng, info: ref.TreeInfo, n: int, bits: int):
    """(probs (n, L) float64, targets (n,), within (n,)): each row puts exactly half its mass under its node (all
    of it under the root), so that the probabilities renormalised there are dyadic too and every node sum is exact
    in any order; the target is drawn from the renormalised row, under its node."""
    probs, y, within = np.zeros((n, info.L)), [], []
    nodes = [v for v in range(info.N) if v != info.root]
    for i in range(n):
        w = info.root if i % 4 == 0 else int(rng.choice(nodes))
        inside = info.leaves_under(w)
        outside = [leaf for leaf in range(info.L) if leaf not in inside]
        part = dyadic(torch.as_tensor(ref.random_distribution(rng, len(inside), "dirichlet"))[None], bits)[0].numpy()
        if outside:
            rest = dyadic(torch.as_tensor(ref.random_distribution(rng, len(outside), "peaked"))[None], bits)[0]
            probs[i, outside] = rest.numpy() / 2
            part = part / 2
        probs[i, inside] = part
        y.append(int(rng.choice(inside, p=probs[i, inside] / probs[i, inside].sum())))
        within.append(w)
    return torch.as_tensor(probs), torch.tensor(y), torch.tensor(within)


def test_decode_within_equals_the_family_on_the_explicit_subtree():
    from test_subtree import explicit_subtree

    for tree in ("random", "tieredimagenet-h"):
        if tree == "random":
            h, info, rng = random_tree(31, max_nodes=24)
            probs, y, within = rows_within(rng, info, 120, 12)
        else:
            h, info = bundled(tree)
            rng = np.random.default_rng(0)
            probs, y = synthetic_outputs(h, 300, seed=15, dtype=torch.float64)
            within = torch.tensor([rng.choice(info.ancestors(int(t))) for t in y])
        rc = hd.RiskControl(h, alpha=0.2).fit(*synthetic_outputs(h, 500, seed=16))
        got = rc.decode(probs, within=within)
        for w in within.unique().tolist():
            rows = (within == w).nonzero()[:, 0]
            if w == h.root:
                want = rc.decode(probs[rows])
            elif info.is_leaf[w]:
                want = torch.full((rows.numel(),), w)
            else:
                sub, nodes, leaves = explicit_subtree(info, w)
                x = probs[rows][:, leaves]
                pred = hd.decoders.ThresholdDescent(sub, rc.lam).decode(x / x.sum(1, keepdim=True))
                want = torch.tensor(nodes)[pred]
            assert torch.equal(got[rows], want), (tree, w)


def brute_force_within(info, probs, y, within, kind, alpha, delta, bound):
    """The smallest λ among 0 and every node probability of the rows' subtrees (renormalised: exact, the mass
    under each node being 1/2 or 1) whose condition holds, each row walked in plain Python from its node down
    the most probable children while the next one has p / p(node) > λ; also S at every λ."""
    node_p = np.stack([ref.node_probs(info, row) for row in probs.numpy()])
    scale = np.array([node_p[i, w] for i, w in enumerate(within.tolist())])
    grid = np.unique(np.concatenate([[0.0], (node_p / scale[:, None]).ravel()]))
    total = np.zeros(grid.size)
    for i, w in enumerate(within.tolist()):
        path = [w]
        while info.children[path[-1]]:
            path.append(max(info.children[path[-1]], key=lambda c: (node_p[i, c], -c)))
        losses = np.array([ref_loss(info, kind, t, int(y[i])) for t in path])
        depth = np.cumprod(node_p[i, path[1:]][None, :] / scale[i] > grid[:, None], axis=1).sum(1)
        total += losses[depth]
    binary = kind in ("miss", "budget1")
    ok = [passes(t, len(y), alpha, delta, bound, binary) for t in total]
    return float(grid[ok.index(True)]), grid, total


@pytest.mark.parametrize("kind,alpha,delta", [c for c in FIT_CASES if c[0] != "custom"] + [("custom", 0.1, None)])
def test_fit_within_equals_brute_force(kind, alpha, delta):
    h, info, rng = random_tree(208, max_nodes=20)
    probs, y, within = rows_within(rng, info, 80, 12)
    assert info.N >= 12 and len(within.unique()) > 8
    rc = make(h, kind, alpha=alpha, delta=delta).fit(probs, y, within=within)
    want, grid, total = brute_force_within(info, probs, y, within, kind, alpha, delta, rc.bound)
    assert rc.lam == want, (kind, alpha, delta, info)
    assert rc.calibration_risk == pytest.approx(total[np.searchsorted(grid, want)] / 80, abs=1e-12)
    # the fitted family within the rows' nodes is the family fitted on them: its calibration risk is its own
    pred = rc.decode(probs, within=within)
    assert np.mean([ref_loss(info, kind, int(n), int(t)) for n, t in zip(pred, y)]) == pytest.approx(
        rc.calibration_risk, abs=1e-12)


def test_risk_coverage_within():
    h, info, rng = random_tree(41, max_nodes=24)
    probs, y, within = rows_within(rng, info, 150, 12)
    rc = hd.RiskControl(h, alpha=0.2).fit(probs, y, within=within)
    curve = rc.risk_coverage(probs, y, within=within)
    assert curve.fitted_lambda == rc.lam and curve.lam[0] == 0
    for g in range(curve.lam.numel()):
        pred = hd.decoders.ThresholdDescent(h, float(curve.lam[g])).decode(probs, within=within)
        miss = np.mean([not info.is_ancestor(int(n), int(t)) for n, t in zip(pred, y)])
        assert float(curve.risk[g]) == pytest.approx(miss, abs=1e-12)
        assert float(curve.mean_depth[g]) == pytest.approx(float(h.depth[pred].double().mean()), abs=1e-12)


def test_within_errors():
    probs, y = synthetic_outputs(H, 40, seed=17)
    within = H.parent[y]
    within[7] = H.parent[(y[7] + 1) % H.num_leaves] if H.parent[(y[7] + 1) % H.num_leaves] != within[7] else 0
    with pytest.raises(ValueError, match=rf"row 7's target {int(y[7])} is not under node {int(within[7])}"):
        hd.RiskControl(H).fit(probs, y, within=within)
    depth = hd.RiskControl(H, loss=lambda n, l: H.depth[n].double() / H.max_depth, loss_bound=1.0)
    with pytest.raises(ValueError, match=r"`loss` to be 0 at each row's `within` node for its target"):
        depth.fit(probs, y, within=H.parent[y])
    with pytest.raises(RuntimeError, match="not fitted yet"):
        hd.RiskControl(H).decode(probs, within=H.parent[y])


# --------------------------------------------------------------------------- where users meet it
def test_inside_a_decoding_head_and_a_hierarchical_metric():
    h = hd.load_hierarchy("tieredimagenet-h")
    cal, y_cal = synthetic_outputs(h, 2000, seed=12)
    probs, y = synthetic_outputs(h, 500, seed=13)
    rc = hd.RiskControl(h, alpha=0.1).fit(cal, y_cal)
    want = rc.decode(probs)
    head = hd.DecodingHead(h, decoder=rc, from_logits=True)
    assert torch.equal(head(probs.log()), want)
    metric = hd.HierarchicalMetric(h, "tree_distance", decoder=rc)
    metric.update(probs, y)
    assert float(metric.compute()) == pytest.approx(float(hd.get_metric("tree_distance", h)(want, y).double().mean()))
    assert metric.key == "tree_distance/risk_control[alpha=0.1]"
    assert rc.key == "risk_control[alpha=0.1]" and repr(rc).endswith("alpha=0.1)")
    assert hd.RiskControl(h, alpha=0.5, delta=0.1, loss="overshoot").key == "risk_control_overshoot[alpha=0.5,delta=0.1]"
    assert hd.RiskControl(h, budget=2).key == "risk_control[alpha=0.1,budget=2]"
    assert want.dtype == torch.long and want.shape == (500,)
    assert int(rc.decode(probs[0])) == int(want[0])


# --------------------------------------------------------------------------- errors
H = hd.load_hierarchy("tieredimagenet-h")


@pytest.mark.parametrize("kw,match", [
    ({"alpha": 0}, r"`alpha` to be a float in \(0, 1\)"),
    ({"alpha": 1.0}, r"`alpha` to be a float in \(0, 1\)"),
    ({"alpha": True}, r"`alpha`"),
    ({"alpha": 13.0, "loss": "overshoot"}, r"`alpha` to be a float in \(0, 12\)"),
    ({"delta": 0.0}, r"`delta` to be a float in \(0, 1\)"),
    ({"delta": 1}, r"`delta`"),
    ({"loss": "tree_distance"}, r"`loss` to be one of 'miss', 'overshoot'"),
    ({"budget": -1}, r"`budget` to be an int >= 0"),
    ({"loss": "overshoot", "budget": 1}, r"`budget` applies to loss='miss' only"),
    ({"loss": lambda n, l: n * 0.0}, r"callable `loss` needs `loss_bound`"),
    ({"loss": "miss", "loss_bound": 2.0}, r"`loss_bound` is for custom losses"),
])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        hd.RiskControl(H, **kw)


def test_bad_inputs_and_losses_are_named():
    probs, y = synthetic_outputs(H, 50, seed=14)
    with pytest.raises(RuntimeError, match="not fitted yet: call .fit"):
        hd.RiskControl(H).decode(probs)
    with pytest.raises(ValueError, match=r"`targets` in 0..607"):
        hd.RiskControl(H).fit(probs, torch.full((50,), 608))
    with pytest.raises(ValueError, match=r"`targets` to have 50 entries"):
        hd.RiskControl(H).fit(probs, y[:10])
    with pytest.raises(TypeError, match=r"`targets` to hold integer"):
        hd.RiskControl(H).fit(probs, y.float())
    with pytest.raises(ValueError, match=r"`probs`"):
        hd.RiskControl(H).fit(probs * 2, y)
    with pytest.raises(ValueError, match=r"at least 22 rows at alpha=0.1, delta=0.1, but got 20"):
        hd.RiskControl(H, alpha=0.1, delta=0.1).fit(probs[:20], y[:20])
    # tree distance is not monotone along the family (a step towards the target lowers it)
    leaves = torch.arange(H.num_leaves)
    dist = torch.stack([hd.get_metric("tree_distance", H)(torch.full_like(leaves, n), leaves).double()
                        for n in range(H.num_nodes)])
    with pytest.raises(ValueError, match=r"`loss` to be 0 at the root"):
        hd.RiskControl(H, loss=dist)
    with pytest.raises(ValueError, match=r"`loss` to be non-decreasing down the tree.*= 1 > loss\[\d+, \d+\] = 0"):
        hd.RiskControl(H, loss=(dist == 1).double())  # "within one edge of the target": the parent, not the leaf
    with pytest.raises(ValueError, match=r"`loss` to be non-decreasing down the tree, but on row"):
        hd.RiskControl(H, loss=lambda n, l: (H.depth[n] == 1).double(), loss_bound=1).fit(probs, y)
    with pytest.raises(ValueError, match=r"`loss` values in \[0, loss_bound=0.5\]"):
        hd.RiskControl(H, loss=imprecision(H), loss_bound=0.5, alpha=0.2).fit(probs, y)
    with pytest.raises(ValueError, match=r"shape \(N, L\)|shape \(843, 608\)"):
        hd.RiskControl(H, loss=torch.zeros(3, 3))
    table = torch.stack([imprecision(H)(torch.full_like(leaves, n), leaves) for n in range(H.num_nodes)])
    a = hd.RiskControl(H, loss=table, alpha=0.2, delta=0.2).fit(probs, y)
    b = hd.RiskControl(H, loss=imprecision(H), loss_bound=float(table.max()), alpha=0.2, delta=0.2).fit(probs, y)
    assert a.lam == b.lam and a.calibration_risk == pytest.approx(b.calibration_risk, abs=1e-12)
    with pytest.raises(ValueError, match="LossSteps of this decoder's loss"):
        hd.RiskControl(H, loss="overshoot", alpha=2.0).fit_steps(hd.RiskControl(H).loss_steps(probs, y))
    with pytest.raises(ValueError, match=r"`lam` to be a float >= 0"):
        hd.decoders.ThresholdDescent(H, -0.1)


def test_a_callable_loss_may_return_numpy_and_other_types_are_named():
    """A loss returning numpy got "expected shape (400,), got (400,)"."""
    probs, y = synthetic_outputs(H, 400, seed=15)
    loss = imprecision(H)
    want = hd.RiskControl(H, loss=loss, loss_bound=float(H.max_depth), alpha=0.5).fit(probs, y)
    as_numpy = hd.RiskControl(H, loss=lambda n, l: loss(n, l).numpy(), loss_bound=float(H.max_depth), alpha=0.5)
    assert as_numpy.fit(probs, y).lam == want.lam and as_numpy.calibration_risk == want.calibration_risk
    with pytest.raises(TypeError, match=r"Expected `loss\(nodes, leaves\)` to return a torch.Tensor \(or a numpy "
                                        r"array of numbers\) of shape \(400,\), but got builtins.list"):
        hd.RiskControl(H, loss=lambda n, l: loss(n, l).tolist(), loss_bound=9.0).fit(probs, y)
    with pytest.raises(ValueError, match=r"shape \(400,\) \(one value per pair\), but got \(400, 1\)"):
        hd.RiskControl(H, loss=lambda n, l: loss(n, l)[:, None], loss_bound=9.0).fit(probs, y)


def test_benchmark_reports_the_fitted_lambda():
    from benchmarks import risk_control as bench

    import hdecode_torch.decoders.risk_control as rcm
    import hdecode_torch.kernels.top_down_path as tdp

    saved = (rcm.CPU_CHAIN_BYTES, tdp.PREFIX_SEGMENT)
    (r,) = bench.main(["--tree", "inat19", "--rows", "300", "--repeats", "1", "--min-time", "0", "--segments", "8",
                       "--chunk-bytes", "18"])
    assert (rcm.CPU_CHAIN_BYTES, tdp.PREFIX_SEGMENT) == saved  # the sweeps put the settings back
    assert {"fit, scan segments of 8", "fit, chunks of 2^18 bytes", "  critical values"} <= set(r["ms"])
    h = hd.load_hierarchy("inat19")
    probs, y = synthetic_outputs(h, 300, seed=0)
    assert r["lambda"] == hd.RiskControl(h, alpha=0.1).fit(probs, y).lam
    assert r["lambda_ucb"] == hd.RiskControl(h, alpha=0.1, delta=0.1).fit(probs, y).lam
    assert set(r["ms"]) >= {"fit (conformal)", "fit (confidence bound)", "decode"}
