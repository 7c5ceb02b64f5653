"""hd.functional.node_calibration_check: the node ECE per depth against its consistency-resampling noise floor."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from hdecode_torch import functional as F
from hdecode_torch.functional._calibration import _node_calibration_compute, _node_calibration_update
from hdecode_torch.functional._calibration_check import _resampled_hits
from hdecode_torch.synthetic import synthetic_miscalibrated, synthetic_outputs

from reference import random_tree


def _tree(seed: int, nodes: int) -> hd.Hierarchy:
    return hd.Hierarchy.from_parents(random_tree(np.random.default_rng(seed), nodes, num_nodes_min=nodes // 2))


@pytest.fixture(scope="module")
def tiered():
    return hd.load_hierarchy("tieredimagenet-h")


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [None, 4096])
def test_resampled_hits_are_the_hits_of_the_drawn_labels(seed, budget):
    """Each resample's hits equal the hit statistics of _node_calibration_update run on the labels drawn, with
    the same generator, in the same chunks (a budget of 4 KiB makes chunks of a few rows)."""
    h = _tree(seed, 25)  # unbalanced, with single-child chains
    probs, _ = synthetic_outputs(h, 37, 1.0, seed=seed, dtype=torch.float64)
    old = hd.get_memory_budget()
    try:
        if budget is not None:
            hd.set_memory_budget(budget)
        post = hd.Posterior(h, probs)
        got = _resampled_hits(post, 7, 5, seed)
        per_row = 16 * h.num_nodes + 40 * 5
        chunk = max(1, hd.get_memory_budget() // per_row)
    finally:
        hd.set_memory_budget(old if budget is not None else None)
    gen = torch.Generator().manual_seed(seed)
    draws = torch.cat([torch.multinomial(probs[lo:lo + chunk], 5, replacement=True, generator=gen)
                       for lo in range(0, 37, chunk)])
    for r in range(5):
        _, _, hits = _node_calibration_update(probs, draws[:, r], h, 7)
        assert torch.equal(got[r], hits), r


def test_a_calibrated_model_is_not_flagged_and_a_miscalibrated_one_is(tiered):
    probs, y = synthetic_outputs(tiered, 3000, seed=5, dtype=torch.float64)
    check = F.node_calibration_check(probs, y, tiered)
    assert check.ece.shape == check.noise_floor.shape == check.miscalibrated.shape == (tiered.max_depth + 1,)
    assert torch.equal(check.ece, F.node_calibration_error(probs, y, tiered))
    assert not check.miscalibrated.any()
    logits, y2, true = synthetic_miscalibrated(tiered, 3000, distortion="depth", strength=2.0, seed=5,
                                               dtype=torch.float64)
    bad = F.node_calibration_check(logits, y2, tiered, from_logits=True)
    assert bad.miscalibrated[1:4].all()  # flattened near the root: far beyond the noise there
    assert not bad.miscalibrated[0]
    assert not F.node_calibration_check(true, y2, tiered).miscalibrated.any()


def test_false_alarms_are_rare_on_calibrated_models():
    """For a calibrated model, a depth is flagged with probability at most 1/(R+1): over 40 data sets on a 4-level
    tree with R = 19 (5% per depth), no more than about 5% of the (data set, depth) pairs."""
    h = _tree(3, 30)
    flagged = total = 0
    for seed in range(40):
        probs, y = synthetic_outputs(h, 200, 1.0, seed=seed, dtype=torch.float64)
        check = F.node_calibration_check(probs, y, h, resamples=19, seed=seed)
        flagged += int(check.miscalibrated[1:].sum())
        total += h.max_depth
    assert flagged / total <= 0.05 + 3 * (0.05 * 0.95 / total) ** 0.5


def test_deterministic_and_seeded(tiered):
    probs, y = synthetic_outputs(tiered, 500, seed=1)
    a = F.node_calibration_check(probs, y, tiered, seed=3)
    b = F.node_calibration_check(probs, y, tiered, seed=3)
    c = F.node_calibration_check(probs, y, tiered, seed=4)
    assert torch.equal(a.noise_floor, b.noise_floor) and not torch.equal(a.noise_floor, c.noise_floor)


@pytest.mark.parametrize("kwargs, message", [
    ({"resamples": 0}, "Expected `resamples` to be an int >= 1, but got 0"),
    ({"resamples": True}, "Expected `resamples` to be an int >= 1"),
    ({"seed": -1}, "Expected `seed` to be an int >= 0, but got -1"),
    ({"n_bins": 0}, "Expected `n_bins` to be an int >= 1, but got 0"),
])
def test_bad_arguments(tiered, kwargs, message):
    probs, y = synthetic_outputs(tiered, 4, seed=1)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        F.node_calibration_check(probs, y, tiered, **kwargs)


def test_no_rows_is_an_error(tiered):
    with pytest.raises(ValueError, match="B >= 1 rows"):
        F.node_calibration_check(torch.zeros(0, tiered.num_leaves), torch.zeros(0, dtype=torch.long), tiered)
