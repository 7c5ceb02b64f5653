"""Synthetic calibrated outputs: shapes, determinism, calibration, and the noise knob."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import hdecode_torch as hd
import reference as ref
from hdecode_torch.synthetic import DEFAULT_NOISE, synthetic_outputs
from harness import DEVICES


@pytest.fixture(scope="module")
def tiered():
    return hd.load_hierarchy("tieredimagenet-h")


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * p.clamp_min(1e-300).log()).sum(1)


def test_shapes_dtypes_and_rows(tiered):
    probs, y = synthetic_outputs(tiered, 257, 0.7, seed=3)
    assert probs.shape == (257, tiered.num_leaves) and probs.dtype == torch.float32
    assert y.shape == (257,) and y.dtype == torch.int64
    assert torch.allclose(probs.double().sum(1), torch.ones(257, dtype=torch.float64), atol=1e-5)
    assert bool((probs >= 0).all()) and 0 <= int(y.min()) and int(y.max()) < tiered.num_leaves
    p64, _ = synthetic_outputs(tiered, 4, 0.7, seed=3, dtype=torch.float64)
    assert p64.dtype == torch.float64
    hd.Posterior(tiered, probs)  # passes the library's own validation


def test_empty_batch(tiered):
    probs, y = synthetic_outputs(tiered, 0, 1.0, seed=0)
    assert probs.shape == (0, tiered.num_leaves) and y.shape == (0,)


def test_determinism_by_seed(tiered):
    a = synthetic_outputs(tiered, 300, 1.0, seed=11)
    b = synthetic_outputs(tiered, 300, 1.0, seed=11)
    c = synthetic_outputs(tiered, 300, 1.0, seed=12)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    # The global RNG is neither used nor advanced.
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    synthetic_outputs(tiered, 10, 1.0, seed=5)
    assert torch.equal(torch.rand(3), before)


@pytest.mark.parametrize("device", DEVICES)
def test_same_data_on_every_device(tiered, device):
    p_cpu, y_cpu = synthetic_outputs(tiered, 50, 1.0, seed=2)
    p, y = synthetic_outputs(tiered, 50, 1.0, seed=2, device=device)
    assert p.device.type == torch.device(device).type
    assert torch.equal(p.cpu(), p_cpu) and torch.equal(y.cpu(), y_cpu)


def test_entropy_grows_with_noise(tiered):
    # Same seed -> same centres and offsets: each row's entropy is a nondecreasing function of the temperature.
    levels = [0.25, 0.5, 1.0, 2.0, 4.0]
    ents = torch.stack([entropy(synthetic_outputs(tiered, 400, s, seed=1, dtype=torch.float64)[0]) for s in levels])
    assert bool((ents[1:] >= ents[:-1] - 1e-9).all())
    means = ents.mean(1)
    assert bool((means[1:] > means[:-1]).all())
    assert float(means[-1]) < math.log(tiered.num_leaves)


def test_calibrated_by_construction(tiered):
    """Reliability diagram over all (sample, leaf) pairs: in each probability bin, the frequency of
    'the target is this leaf' matches the mean predicted probability within sampling noise."""
    probs, y = synthetic_outputs(tiered, 6000, DEFAULT_NOISE, seed=7, dtype=torch.float64)
    hit = torch.zeros_like(probs)
    hit[torch.arange(len(y)), y] = 1.0
    edges = torch.tensor([0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0001], dtype=torch.float64)
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (probs >= lo) & (probs < hi)
        n = int(sel.sum())
        if n < 200:
            continue
        conf = float(probs[sel].mean())
        freq = float(hit[sel].mean())
        se = math.sqrt(conf * (1 - conf) / n)
        assert abs(freq - conf) < 4.5 * se + 1e-3, (float(lo), float(hi), n, conf, freq)
    # Top-1: the argmax leaf is right as often as its probability says.
    top, arg = probs.max(1)
    acc = (arg == y).double().mean()
    se = math.sqrt(float(acc) * (1 - float(acc)) / len(y))
    assert abs(float(acc) - float(top.mean())) < 4 * se


def test_targets_follow_probs_exactly():
    # On a 3-leaf tree the empirical label distribution, pooled over rows, matches the mean of the rows.
    h = hd.Hierarchy.from_parents([3, 3, 4, 4, -1])
    probs, y = synthetic_outputs(h, 40000, 1.0, seed=0, dtype=torch.float64)
    freq = torch.bincount(y, minlength=3).double() / len(y)
    mean = probs.mean(0)
    se = (mean * (1 - mean) / len(y)).sqrt()
    assert bool(((freq - mean).abs() < 4 * se).all())


def test_noise_sets_difficulty(tiered):
    acc = []
    for s in (0.25, 1.0, 3.0):
        probs, y = synthetic_outputs(tiered, 2000, s, seed=0)
        acc.append(float((probs.argmax(1) == y).double().mean()))
    assert acc[0] > 0.75 and acc[0] > acc[1] > acc[2]
    probs, y = synthetic_outputs(tiered, 3000, DEFAULT_NOISE, seed=0)
    assert 0.35 < float((probs.argmax(1) == y).double().mean()) < 0.65  # the documented "about half"


def test_unbalanced_tree_with_chains():
    rng = np.random.default_rng(0)
    par = ref.random_tree(rng)
    h = hd.Hierarchy.from_parents(par)
    probs, y = synthetic_outputs(h, 64, 0.5, seed=0)
    assert probs.shape == (64, h.num_leaves)
    assert torch.allclose(probs.sum(1), torch.ones(64), atol=1e-5)


@pytest.mark.parametrize("kwargs", [dict(num_samples=-1), dict(num_samples=2.5), dict(noise=0.0), dict(noise=-1.0),
                                    dict(noise=float("inf")), dict(noise=float("nan")), dict(dtype=torch.float16)])
def test_bad_arguments(tiered, kwargs):
    args = dict(num_samples=4, noise=1.0, seed=0)
    args.update(kwargs)
    with pytest.raises(ValueError):
        synthetic_outputs(tiered, **args)


def test_tree_gaussian_features_follow_the_tree():
    """Classes sharing more ancestors have closer means: siblings are nearer than the average pair."""
    from hdecode_torch.synthetic import tree_gaussian_features

    h = hd.load_hierarchy("inat19")
    x, y = tree_gaussian_features(h, 4000, dim=16, noise=0.0, seed=1)
    assert x.shape == (4000, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.equal(tree_gaussian_features(h, 10, seed=3)[0], tree_gaussian_features(h, 10, seed=3)[0])
    means = {}
    for leaf in y.unique().tolist():
        means[leaf] = x[y == leaf][0]
    leaves = sorted(means)
    sib, other = [], []
    for a in leaves[:200]:
        for b in leaves[:200]:
            if a < b:
                d = (means[a] - means[b]).norm().item()
                (sib if h.parent[a] == h.parent[b] else other).append(d)
    assert sum(sib) / len(sib) < 0.8 * sum(other) / len(other)
