"""HierarchicalScaler and its kernel: re-tempered conditionals recomposed into leaves, fitted on held-out rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import hdecode_torch as hd
from hdecode_torch.kernels.conditionals import (conditional_log_probs, leaf_rows, level_layout, node_log_probs,
                                                path_log_likelihood, path_sibling_groups, recompose)
from hdecode_torch.synthetic import synthetic_miscalibrated, synthetic_outputs
from harness import random_trees

FAMILIES = ("temperature", "depth", "depth_leaf", "depth_affine")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _trees():
    small = [h for h, _ in random_trees(5, 12, num_nodes_max=14, unary_prob=0.3)]
    return small + [hd.load_hierarchy("tieredimagenet-h"), hd.load_hierarchy("inat19")]


def _reference_recompose(h, leaf_logp: np.ndarray, power: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Brute force over nodes: p(n) by summing leaves, conditionals by division, re-tempered siblings."""
    par = np.asarray(h.parents_list)
    n, L = len(par), h.num_leaves
    p = np.exp(leaf_logp)
    under = np.zeros((n, L), dtype=bool)
    for leaf in range(L):
        a = leaf
        while a >= 0:
            under[a, leaf] = True
            a = par[a]
    node = p @ under.T.astype(np.float64)  # (B, N)
    cond = np.log(node) - np.log(np.where(par[None, :] >= 0, node[:, np.maximum(par, 0)], 1.0))
    t = power[None, :] * cond + shift[None, :]
    new = np.zeros_like(t)
    for m in range(n):
        if par[m] < 0:
            continue
        sib = np.flatnonzero(par == par[m])
        new[:, m] = t[:, m] - np.log(np.exp(t[:, sib]).sum(1))
    out = np.zeros((p.shape[0], L))
    for leaf in range(L):
        a = leaf
        while par[a] >= 0:
            out[:, leaf] += new[:, a]
            a = par[a]
    return out


# --------------------------------------------------------------------------- the kernel
def test_recompose_matches_brute_force_on_random_trees_and_bundled_ones():
    rng = np.random.default_rng(0)
    for h in _trees():
        z = torch.as_tensor(rng.normal(size=(7, h.num_leaves)) * 2)
        lp = torch.log_softmax(z, 1)
        power = torch.as_tensor(rng.uniform(0.3, 3.0, h.num_nodes))
        shift = torch.as_tensor(rng.normal(size=h.num_nodes))
        conds = conditional_log_probs(h, node_log_probs(h, lp.t()))
        got = leaf_rows(h, recompose(h, conds, power, shift)).t()
        want = _reference_recompose(h, lp.numpy(), power.numpy(), shift.numpy())
        np.testing.assert_allclose(got.numpy(), want, atol=1e-10)
        # The identity gives the input back, and every node's log p(n) is the sum of its leaves'.
        same = leaf_rows(h, recompose(h, conds, torch.ones(h.num_nodes, dtype=torch.float64))).t()
        torch.testing.assert_close(same, lp, atol=1e-12, rtol=0)
        node = hd.node_probabilities(h, lp.exp())
        for d, table in enumerate(node_log_probs(h, lp.t())):
            torch.testing.assert_close(table.t().exp(), node[:, level_layout(h)[0][d]], atol=1e-12, rtol=0)


def test_an_only_child_keeps_its_conditional_whatever_the_tempering():
    h = hd.Hierarchy.from_parents([3, 3, 4, 5, 5, -1])  # 0, 1 under 3; 2 under 4 (alone); 3, 4 under 5
    lp = torch.log_softmax(torch.tensor([[0.3, -1.0, 2.0], [5.0, 0.0, -3.0]], dtype=torch.float64), 1)
    conds = conditional_log_probs(h, node_log_probs(h, lp.t()))
    power = torch.tensor([1.0, 1.0, 7.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    shift = torch.tensor([0.0, 0.0, 5.0, 0.0, 0.0, 0.0])
    out = leaf_rows(h, recompose(h, conds, power, shift)).t()
    torch.testing.assert_close(out, lp, atol=1e-14, rtol=0)  # leaf 2 is its parent's only child


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_classes_stay_masked_with_finite_gradients(dtype):
    h = hd.load_hierarchy("tieredimagenet-h")
    g = torch.Generator().manual_seed(1)
    z = (torch.randn(5, h.num_leaves, generator=g) * 2).to(dtype)
    # A whole subtree masked (its parent's p = 0), and a lone masked leaf.
    internal = int(h.levels[3][h.levels[3] >= h.num_leaves][0])
    under = hd.kernels.is_ancestor(h, torch.tensor(internal), torch.arange(h.num_leaves))
    z[:, under] = float("-inf")
    z[:, 0] = float("-inf")
    scaler = hd.HierarchicalScaler(h, "depth_affine")
    with torch.no_grad():
        scaler.log_temperatures.uniform_(-0.5, 0.5, generator=g)
        scaler.shift.uniform_(-0.5, 0.5, generator=g)
    out = scaler(z)
    assert out.dtype == dtype
    assert torch.isneginf(out[:, under]).all() and torch.isneginf(out[:, 0]).all()
    assert torch.isfinite(out[:, ~under][:, 1:]).all()
    out[:, 5].sum().backward()
    for p in (scaler.log_temperature, scaler.log_temperatures, scaler.shift):
        assert torch.isfinite(p.grad).all()


def test_path_log_likelihood_is_the_forward_outputs_log_likelihood():
    """The fit's loss, over the sibling groups along each target's path only, equals -log q(y) and
    -Σ log q(ancestors) read from the forward output."""
    for h in _trees()[-2:] + _trees()[:4]:
        z, y, _ = synthetic_miscalibrated(h, 300, "depth", 2.0, seed=2, dtype=torch.float64)
        for family in FAMILIES[1:]:
            scaler = hd.HierarchicalScaler(h, family, temperature=1.3)
            with torch.no_grad():
                scaler.log_temperatures.normal_(0, 0.5, generator=torch.Generator().manual_seed(3))
                if scaler.shift is not None:
                    scaler.shift.normal_(0, 0.5)
            out = scaler(z)
            nll = -float(out.detach().gather(1, y[:, None]).mean())
            node = hd.node_probabilities(h, out.detach().exp())
            anc = h.ancestors[y]
            below_root = (anc < h.num_nodes) & (torch.arange(h.max_depth + 1) > 0)
            hier = -float((node.log().gather(1, anc.clamp(max=h.num_nodes - 1)) * below_root).sum(1).mean())
            assert scaler.loss(z, y) == pytest.approx(nll, abs=1e-10)
            assert scaler.loss(z, y, "hierarchical") == pytest.approx(hier, abs=1e-9)


def test_path_groups_leave_out_only_children():
    h = hd.Hierarchy.from_parents([3, 3, 4, 5, 5, -1])
    lp = torch.log_softmax(torch.zeros(2, 3, dtype=torch.float64), 1)
    conds = conditional_log_probs(h, node_log_probs(h, lp.t()))
    node, value, group, chosen, weight = path_sibling_groups(h, conds, torch.tensor([2, 0]))
    # target 2: {3, 4} at depth 1 only (2 is 4's only child); target 0: {3, 4} then {0, 1}
    assert node.tolist() == [3, 4, 3, 4, 0, 1] and group.tolist() == [0, 0, 1, 1, 2, 2]
    assert chosen.tolist() == [1, 2, 4] and weight.tolist() == [1.0, 1.0, 1.0]
    groups = (node, value, group, chosen, weight)
    assert float(path_log_likelihood(groups, torch.ones(6))) == pytest.approx(float(lp[0, 2] + lp[1, 0]))


# --------------------------------------------------------------------------- the module
def test_forward_shapes_dtypes_and_empty_batch():
    h = hd.load_hierarchy("inat19")
    scaler = hd.HierarchicalScaler(h)
    for dtype in (torch.float32, torch.float64):
        z = torch.randn(4, h.num_leaves, dtype=dtype)
        out = scaler(z)
        assert out.dtype == dtype and out.shape == z.shape
        torch.testing.assert_close(out.exp().sum(1), torch.ones(4, dtype=dtype))
        # The identity at initialisation.
        torch.testing.assert_close(out, torch.log_softmax(z, 1), atol=1e-5 if dtype == torch.float32 else 1e-12,
                                   rtol=0)
        assert scaler(z[:0]).shape == (0, h.num_leaves)
    with pytest.raises(ValueError, match=r"shape \(B, 1010\)"):
        scaler(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="floating-point"):
        scaler(torch.zeros(3, h.num_leaves, dtype=torch.long))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_gpu_plan_gives_the_same_output(family):
    h = hd.load_hierarchy("tieredimagenet-h")
    z, y, _ = synthetic_miscalibrated(h, 600, "sharp_leaves", 2.0, seed=4)
    scaler = hd.HierarchicalScaler(h, family).fit(z, y)
    want = scaler(z)
    with hd.plan_for("cuda"):
        assert torch.equal(scaler(z), want)
        assert hd.HierarchicalScaler(h, family).fit(z, y).state_dict().keys() == scaler.state_dict().keys()


def test_temperature_family_is_the_temperature_scaler():
    h = hd.load_hierarchy("inat19")
    z, y, _ = synthetic_miscalibrated(h, 2000, "global", 2.5, seed=5)
    a = hd.HierarchicalScaler(h, "temperature").fit(z, y)
    b = hd.TemperatureScaler().fit(z, y)
    assert a.temperature == b.temperature and a.temperatures == [] and a.num_parameters == 1
    torch.testing.assert_close(a(z), torch.log_softmax(b(z), 1))


def test_fit_recovers_per_depth_powers():
    """The model's conditionals at depth d are p*(c | n)^(k^u_d), u from -1 to 1: the depth family's
    temperatures grow with depth (T_d ≈ k^u_d undoes the power) and its held-out NLL is the oracle's."""
    h = hd.load_hierarchy("inat19")
    z, y, p = synthetic_miscalibrated(h, 6000, "depth", 3.0, seed=6, dtype=torch.float64)
    fit, held = slice(0, 3000), slice(3000, 6000)
    scaler = hd.HierarchicalScaler(h, "depth").fit(z[fit], y[fit])
    got = np.log(scaler.temperatures)
    # The global T takes a share of the common part; the spread across depths is the distortion's, 2 log k.
    assert np.all(np.diff(got) > 0)
    assert got[-1] - got[0] == pytest.approx(2 * np.log(3.0), abs=0.4)
    oracle = float(torch.nn.functional.nll_loss(p[held].log(), y[held]))
    temperature = hd.HierarchicalScaler(h, "temperature").fit(z[fit], y[fit]).loss(z[held], y[held])
    assert scaler.loss(z[held], y[held]) == pytest.approx(oracle, abs=0.01)
    assert temperature > oracle + 0.05


def test_fit_never_loses_to_the_temperature_on_its_own_data_and_is_deterministic():
    h = hd.load_hierarchy("tieredimagenet-h")
    z, y, _ = synthetic_miscalibrated(h, 1500, "flat_leaves", 2.0, seed=7)
    t = hd.HierarchicalScaler(h, "temperature").fit(z, y)
    for family in FAMILIES[1:]:
        for loss in ("nll", "hierarchical"):
            a = hd.HierarchicalScaler(h, family).fit(z, y, loss=loss)
            assert a.temperature in (t.temperature, 1.0)  # the fitted T, or T = 1 where that fits better
            assert a.loss(z, y, loss) <= t.loss(z, y, loss) + 1e-12
    a, b = hd.HierarchicalScaler(h).fit(z, y), hd.HierarchicalScaler(h).fit(z, y)
    assert torch.equal(a(z), b(z)) and a.temperatures == b.temperatures
    assert a.loss(z, y) < t.loss(z, y) - 0.02


def test_state_dict_round_trip_and_repr(tmp_path):
    h = hd.load_hierarchy("inat19")
    z, y, _ = synthetic_miscalibrated(h, 1000, "depth", 2.0, seed=8)
    scaler = hd.HierarchicalScaler(h, "depth_affine").fit(z, y)
    torch.save(scaler.state_dict(), tmp_path / "s.pt")
    other = hd.HierarchicalScaler(h, "depth_affine")
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert other.temperatures == scaler.temperatures and other.shifts == scaler.shifts
    assert other.temperature == scaler.temperature
    assert torch.equal(other(z), scaler(z))
    assert sorted(scaler.state_dict()) == ["log_temperature", "log_temperatures", "shift"]
    assert scaler.num_parameters == 1 + 2 * h.max_depth
    assert "family='depth_affine'" in repr(scaler) and "shifts=[" in repr(scaler)
    assert len(hd.HierarchicalScaler(h).temperatures) == 2 * h.max_depth


def test_in_front_of_a_decoding_head_and_differentiable():
    h = hd.load_hierarchy("tieredimagenet-h")
    z, y, _ = synthetic_miscalibrated(h, 800, "depth", 2.0, seed=9)
    scaler = hd.HierarchicalScaler(h).fit(z, y)
    model = nn.Sequential(scaler, hd.DecodingHead(h, "wu_palmer", from_logits=True))
    with torch.no_grad():
        pred = model(z)
    wp = hd.get_metric("wu_palmer", h)
    assert torch.equal(pred, wp.decode(scaler(z).detach().exp()))
    assert not torch.equal(pred, wp.decode(torch.softmax(z, 1)))  # the calibration changed decisions
    scaler.zero_grad()
    zz = z[:16].clone().requires_grad_(True)
    scaler(zz)[:, 3].sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in scaler.parameters()) and torch.isfinite(zz.grad).all()


def test_fit_under_inference_mode():
    h = hd.load_hierarchy("inat19")
    z, y, _ = synthetic_miscalibrated(h, 800, "depth", 2.0, seed=10)
    want = hd.HierarchicalScaler(h).fit(z, y).temperatures
    with torch.inference_mode():
        assert hd.HierarchicalScaler(h).fit(z, y).temperatures == want


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((), {"family": "nope"}, ValueError, "`family` to be one of"),
    ((), {"temperature": 0.0}, ValueError, "`temperature` to be a finite float > 0"),
])
def test_constructor_errors(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hd.HierarchicalScaler(hd.load_hierarchy("inat19"), *args, **kwargs)
    with pytest.raises(TypeError, match="`hierarchy` to be a Hierarchy"):
        hd.HierarchicalScaler([0, 1])


def test_fit_errors():
    h = hd.load_hierarchy("inat19")
    z = torch.randn(10, h.num_leaves)
    y = torch.zeros(10, dtype=torch.long)
    with pytest.raises(ValueError, match="`loss` to be one of"):
        hd.HierarchicalScaler(h).fit(z, y, loss="brier")
    with pytest.raises(ValueError, match="max_iter"):
        hd.HierarchicalScaler(h).fit(z, y, max_iter=0)
    with pytest.raises(ValueError, match=r"shape \(B, 1010\)"):
        hd.HierarchicalScaler(h).fit(z[:, :5], y)
    with pytest.raises(ValueError, match=r"in 0..1009"):
        hd.HierarchicalScaler(h).fit(z, y + 5000)


# --------------------------------------------------------------------------- synthetic miscalibrations
def test_synthetic_miscalibrated_distortions():
    h = hd.load_hierarchy("tieredimagenet-h")
    p, y = synthetic_outputs(h, 200, seed=3, dtype=torch.float64)
    z, y2, p2 = synthetic_miscalibrated(h, 200, "none", 2.0, seed=3, dtype=torch.float64)
    assert torch.equal(y, y2) and torch.equal(p, p2)
    torch.testing.assert_close(z, p.log())
    zg, _, _ = synthetic_miscalibrated(h, 200, "global", 2.0, seed=3, dtype=torch.float64)
    torch.testing.assert_close(zg, torch.log_softmax(2.0 * p.log(), 1))
    # Where no sibling group mixes leaves and internal nodes (iNat19: every leaf at depth 7), sharp_leaves'
    # powers (k for leaves, 1/k for internal nodes) are undone by their inverses.
    inat = hd.load_hierarchy("inat19")
    zi, _, pi = synthetic_miscalibrated(inat, 100, "sharp_leaves", 2.0, seed=3, dtype=torch.float64)
    inverse = torch.where(torch.arange(inat.num_nodes) < inat.num_leaves, 0.5, 2.0).double()
    back = leaf_rows(inat, recompose(inat, conditional_log_probs(inat, node_log_probs(inat, zi.t())), inverse)).t()
    torch.testing.assert_close(back, pi.log(), atol=1e-9, rtol=0)
    zs, _, _ = synthetic_miscalibrated(h, 200, "sharp_leaves", 2.0, seed=3, dtype=torch.float64)
    # Sharper leaves: log p(leaf | parent) further from 0 (powered by k > 1) than p*'s, flatter ones closer.
    zf, _, _ = synthetic_miscalibrated(h, 200, "flat_leaves", 2.0, seed=3)
    assert zf.dtype == torch.float32

    def leaf_conditionals(z):
        return float(leaf_rows(h, conditional_log_probs(h, node_log_probs(h, z.double().t()))).mean())

    assert leaf_conditionals(zs) < leaf_conditionals(p.log()) < leaf_conditionals(zf)
    with pytest.raises(ValueError, match="`distortion` to be one of"):
        synthetic_miscalibrated(h, 10, "blur")
    with pytest.raises(ValueError, match="`strength` to be a finite float > 0"):
        synthetic_miscalibrated(h, 10, "depth", -1.0)
    assert synthetic_miscalibrated(h, 0)[0].shape == (0, h.num_leaves)



# --------------------------------------------------------------------------- what it buys the decoders
ACCEPTANCE_METRICS = {"hf_1": ("hf_beta", {"beta": 1.0}), "wu_palmer": ("wu_palmer", {}), "jaccard": ("jaccard", {})}


def _realised(h, logp_by_method, y):
    """(method -> metric -> (B,) float64 values) of each metric's Bayes-optimal decision."""
    metrics = {k: hd.get_metric(name, h, **params) for k, (name, params) in ACCEPTANCE_METRICS.items()}
    return {method: {k: m(m.decode(torch.softmax(lp, 1)), y, dtype=torch.float64) for k, m in metrics.items()}
            for method, lp in logp_by_method.items()}


def _fitted_and_scored(distortion, strength):
    """Fitted on 8,000 rows, scored on 8,000 others (tieredImageNet-H): the realised values per row."""
    h = hd.load_hierarchy("tieredimagenet-h")
    z, y, p = synthetic_miscalibrated(h, 16000, distortion, strength, seed=11, dtype=torch.float64)
    fit, held = slice(0, 8000), slice(8000, 16000)
    temperature = hd.TemperatureScaler().fit(z[fit], y[fit])
    scaler = hd.HierarchicalScaler(h).fit(z[fit], y[fit])
    with torch.no_grad():
        logp = {"temperature": temperature(z[held]), "hierarchical": scaler(z[held]), "oracle": p[held].log()}
    return _realised(h, logp, y[held])


@pytest.mark.slow
@pytest.mark.parametrize("strength", [3.0, 1 / 3], ids=["deep-sharp", "deep-flat"])
def test_recovers_most_of_the_gap_to_the_oracle_on_per_depth_distortions(strength):
    """≥ 70% of the realised-score gap between one temperature and the oracle p*, on hF_1, Wu-Palmer and
    Jaccard.  The gap itself is several standard errors of the paired per-row differences."""
    values = _fitted_and_scored("depth", strength)
    for k in ACCEPTANCE_METRICS:
        t, s, o = (values[m][k] for m in ("temperature", "hierarchical", "oracle"))
        gap = o - t
        assert float(gap.mean()) > 4 * float(gap.std()) / gap.numel() ** 0.5, k
        assert float((s - t).mean()) >= 0.7 * float(gap.mean()), (k, float((s - t).mean()), float(gap.mean()))


@pytest.mark.slow
def test_never_worse_than_a_temperature_on_a_calibrated_model():
    """On a calibrated model (q = p*) the scaler's realised scores are the temperature's, within two standard
    errors of the paired per-row differences (the noise of 8,000 scored rows)."""
    values = _fitted_and_scored("none", 1.0)
    for k in ACCEPTANCE_METRICS:
        diff = values["hierarchical"][k] - values["temperature"][k]
        assert float(diff.mean()) >= -2 * float(diff.std()) / diff.numel() ** 0.5, k


def test_risk_control_composes_with_the_scaler():
    """The scaler fitted on one split, RiskControl's λ on a second, the miss rate measured on a third: the
    conformal guarantee holds (over random second/third splits), with the calibrated probabilities."""
    from test_risk_control import crc_holds, splits

    h = hd.load_hierarchy("inat19")
    z, y, _ = synthetic_miscalibrated(h, 8000, "sharp_leaves", 2.0, seed=12)
    scaler = hd.HierarchicalScaler(h).fit(z[:2000], y[:2000])
    with torch.no_grad():
        probs = torch.softmax(scaler(z[2000:]), 1)
    rest = y[2000:]
    for alpha in (0.1,):
        rc = hd.RiskControl(h, alpha=alpha)
        steps = rc.loss_steps(probs, rest)
        losses = torch.stack([steps.rows(test).losses(rc.fit_steps(steps.rows(cal)).lam).mean()
                              for cal, test in splits(steps.num_rows, n_cal=2000, count=60)])
        assert crc_holds(losses, alpha), (alpha, float(losses.mean()))
        assert float(losses.mean()) >= alpha - 0.02  # not vacuous
        # The fitted decoder is a decoder like any other, on the scaler's output.
        rc.fit(probs[:2000], rest[:2000])
        miss = ~hd.kernels.is_ancestor(h, rc.decode(probs[2000:]), rest[2000:])
        assert float(miss.double().mean()) == pytest.approx(float(steps.rows(torch.arange(2000, 6000))
                                                                  .losses(rc.lam).mean()), abs=1e-12)
