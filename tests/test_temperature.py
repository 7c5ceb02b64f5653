"""TemperatureScaler: fitting recovers the temperature of mis-scaled logits, and sits in front of a DecodingHead."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import hdecode_torch as hd
from hdecode_torch.synthetic import synthetic_outputs
from harness import bundled


@pytest.fixture(scope="module")
def calibrated():
    """Calibrated probabilities (labels drawn from them) on iNat19, split in two halves."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    h = hd.load_hierarchy("inat19")
    p, y = synthetic_outputs(h, 4000, 1.0, seed=3, dtype=torch.float64)
    yield h, p.log(), y
    torch.set_num_threads(before)


@pytest.mark.parametrize("scale, lo, hi", [(3.0, 2.8, 3.2), (0.5, 0.46, 0.54), (1.0, 0.94, 1.06)],
                         ids=["over-confident", "under-confident", "calibrated"])
def test_fit_recovers_the_temperature(calibrated, scale, lo, hi):
    """logits = scale * (true log-probabilities): the NLL is minimised at T = scale (up to sampling noise)."""
    _, logp, y = calibrated
    z = scale * logp
    fit, held = slice(0, 2000), slice(2000, 4000)
    scaler = hd.TemperatureScaler().fit(z[fit], y[fit])
    assert lo < scaler.temperature < hi
    raw = hd.TemperatureScaler().negative_log_likelihood(z[held], y[held])
    tuned = scaler.negative_log_likelihood(z[held], y[held])
    true = hd.TemperatureScaler().negative_log_likelihood(logp[held], y[held])
    if scale != 1.0:
        assert tuned < raw - 0.05  # a real gain on the held-out half
    assert tuned == pytest.approx(true, abs=2e-3)  # and as good as the true probabilities
    # The NLL by hand, at the fitted T.
    by_hand = float(torch.nn.functional.cross_entropy(z[held] / scaler.temperature, y[held]))
    assert tuned == pytest.approx(by_hand, rel=1e-6)


def test_fit_is_deterministic_and_detached(calibrated):
    _, logp, y = calibrated
    z = (2.0 * logp[:500]).float().requires_grad_(True)
    a = hd.TemperatureScaler().fit(z, y[:500]).temperature
    b = hd.TemperatureScaler().fit(z, y[:500]).temperature
    assert a == b
    assert z.grad is None
    # Starting from another T converges to the same minimum.
    c = hd.TemperatureScaler(temperature=0.2).fit(z, y[:500]).temperature
    assert c == pytest.approx(a, rel=1e-5)


def test_forward_in_front_of_a_decoding_head(calibrated):
    h, logp, _ = calibrated
    z = (3.0 * logp[:64]).float()
    scaler = hd.TemperatureScaler(temperature=3.0)
    out = scaler(z)
    assert out.dtype == torch.float32 and out.shape == z.shape
    torch.testing.assert_close(out, z / 3.0)
    model = nn.Sequential(scaler, hd.DecodingHead(h, "wu_palmer", from_logits=True))
    pred = model(z)
    wp = hd.get_metric("wu_palmer", h)
    assert torch.equal(pred, wp.decode(torch.softmax(z / 3.0, dim=1)))
    # Differentiable in T: it can also be trained with the network.
    scaler(z).sum().backward()
    assert scaler.log_temperature.grad is not None and math.isfinite(float(scaler.log_temperature.grad))


def test_state_dict_round_trip(tmp_path):
    scaler = hd.TemperatureScaler(temperature=2.5)
    torch.save(scaler.state_dict(), tmp_path / "t.pt")
    other = hd.TemperatureScaler()
    other.load_state_dict(torch.load(tmp_path / "t.pt", weights_only=True))
    assert other.temperature == scaler.temperature == pytest.approx(2.5, rel=1e-6)
    assert list(scaler.state_dict()) == ["log_temperature"]
    assert "temperature=2.5" in repr(scaler)


def test_masked_classes_are_allowed():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(200, 5, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 4, (200,), generator=g)
    z[:, 4] = float("-inf")  # class 4 never possible, never a target
    scaler = hd.TemperatureScaler().fit(z, y)
    assert math.isfinite(scaler.temperature) and scaler.temperature > 1  # random labels: soften
    assert torch.isneginf(scaler(z)[:, 4]).all()


def test_separable_logits_warn():
    z = torch.zeros(6, 3)
    z[:, 0] = 5.0
    with pytest.warns(UserWarning, match="rank every target first"):
        scaler = hd.TemperatureScaler().fit(z, torch.zeros(6, dtype=torch.long))
    assert scaler.temperature < 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z[0] = torch.tensor([0.0, 5.0, 0.0])  # one mistake: a proper minimum
        hd.TemperatureScaler().fit(z, torch.zeros(6, dtype=torch.long))


@pytest.mark.parametrize("logits, targets, kwargs, exc, match", [
    (torch.zeros(4), torch.zeros(4, dtype=torch.long), {}, ValueError, r"shape \(B, L\)"),
    (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), {}, ValueError, r"B, L >= 1"),
    (torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, dtype=torch.long), {}, TypeError, "floating-point"),
    (torch.zeros(4, 3), torch.zeros(4), {}, TypeError, "integer class ids"),
    (torch.zeros(4, 3), torch.zeros(5, dtype=torch.long), {}, ValueError, r"shape \(4,\)"),
    (torch.zeros(4, 3), torch.full((4,), 3), {}, ValueError, r"in 0..2, but got 3"),
    (torch.zeros(4, 3), torch.full((4,), -1), {}, ValueError, r"in 0..2, but got -1"),
    (torch.tensor([[0.0, float("nan"), 0.0]]), torch.zeros(1, dtype=torch.long), {}, ValueError, "row 0"),
    (torch.tensor([[float("-inf"), 0.0]]), torch.zeros(1, dtype=torch.long), {}, ValueError, "-inf at its target"),
    (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long), {"max_iter": 0}, ValueError, "max_iter"),
    ([[0.0, 1.0]], torch.zeros(1, dtype=torch.long), {}, TypeError, "torch.Tensor"),
])
def test_fit_errors(logits, targets, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        hd.TemperatureScaler().fit(logits, targets, **kwargs)


@pytest.mark.parametrize("t", [0.0, -1.0, float("inf"), float("nan"), True])
def test_bad_initial_temperature(t):
    with pytest.raises(ValueError, match="`temperature` to be a finite float > 0"):
        hd.TemperatureScaler(temperature=t)


# --------------------------------------------------------------------------- issue 24
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_probabilities_are_refused(calibrated, dtype):
    """softmax(p / T) models the labels at no T: fitting it gave T = 0.059 or 1.19e7 in silence."""
    _, logp, y = calibrated
    probs = logp[:300].exp().to(dtype)
    for fit in (lambda: hd.TemperatureScaler().fit(probs, y[:300]),
                lambda: hd.TemperatureScaler().negative_log_likelihood(probs, y[:300])):
        with pytest.raises(ValueError, match="every row is non-negative and sums to 1: these are probabilities"):
            fit()
    # Their log is what to pass: T = 1 on these calibrated probabilities, up to sampling noise.
    assert 0.85 < hd.TemperatureScaler().fit(probs.log(), y[:300]).temperature < 1.15


@pytest.mark.parametrize("scale", [1e-12, 1e-8, 1e-4, 1e4, 1e8])
def test_the_fit_is_the_same_at_every_scale(calibrated, scale):
    """T(s·z) = s·T(z): logits of scale 1e-8 used to return T = 1 (the optimiser did not move); logits on
    a scale no calibrated model has get T and a warning that says so."""
    _, logp, y = calibrated
    z = 2.0 * logp[:1000]
    base = hd.TemperatureScaler().fit(z, y[:1000]).temperature
    with pytest.warns(UserWarning, match=f"times too {'small' if scale < 1 else 'large'} for calibrated ones"):
        scaled = hd.TemperatureScaler().fit(scale * z, y[:1000]).temperature
    assert scaled == pytest.approx(scale * base, rel=1e-6)
    assert 1.8 < base < 2.2


def test_constant_rows_warn_and_keep_the_temperature():
    z = torch.full((8, 4), 3.0)
    z[:, 3] = float("-inf")  # a masked class does not make a row informative
    with pytest.warns(UserWarning, match="constant within every row"):
        scaler = hd.TemperatureScaler(temperature=2.0).fit(z, torch.arange(8) % 3)
    assert scaler.temperature == pytest.approx(2.0)


def test_fit_under_inference_mode(calibrated):
    """Inside torch.inference_mode() the fit used to fail: "element 0 of tensors does not require grad"."""
    _, logp, y = calibrated
    z, t = 3.0 * logp[:500], y[:500]
    want = hd.TemperatureScaler().fit(z, t).temperature
    with torch.inference_mode():
        assert hd.TemperatureScaler().fit(z, t).temperature == want
        z_inf = 3.0 * logp[:500]  # an inference tensor
        made_inside = hd.TemperatureScaler()
    assert z_inf.is_inference() and made_inside.log_temperature.is_inference()
    assert hd.TemperatureScaler().fit(z_inf, t).temperature == want
    assert made_inside.fit(z, t).temperature == want  # a parameter made under inference_mode
    with torch.inference_mode():
        assert made_inside.fit(z_inf, t).temperature == pytest.approx(want, rel=1e-6)  # from T = want


def test_temperature_scaler_takes_logits_of_any_shape_and_fits_only_logits():
    inat = bundled("inat19")[0]
    scaler = hd.TemperatureScaler(2.0)
    z = torch.randn(6, inat.num_leaves, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    z = z.float().reshape(2, 3, inat.num_leaves)
    torch.testing.assert_close(scaler(z), z / 2)
    assert scaler(z).dtype == torch.float32
    with pytest.raises(TypeError, match="floating-point"):
        scaler(torch.ones(3, inat.num_leaves, dtype=torch.long))
    with pytest.raises(ValueError, match=r"shape \(B, L\)"):
        hd.TemperatureScaler().fit(z, torch.zeros(2, dtype=torch.long))
