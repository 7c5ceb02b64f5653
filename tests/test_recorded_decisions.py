"""Every decoder's decisions on both bundled trees, both plans and two dtypes, equal bit for bit to those
recorded in ``data/recorded_decisions.json`` (``record_decisions.py``): a refactoring or a faster kernel
that changes a decision fails here, naming it."""

import json

import pytest
import torch

import record_decisions as rec


def test_decisions_equal_the_recorded_ones():
    recorded = json.loads(rec.PATH.read_text())
    torch.manual_seed(0)
    now = rec.decisions()
    assert sorted(now) == sorted(recorded)
    changed = sorted(k for k in now if now[k] != recorded[k])
    assert not changed, f"{len(changed)} of {len(now)} decisions changed: {changed[:20]}"


def test_the_recording_tells_decoders_apart():
    # a digest that collapsed (every decoder answering the same) would make the comparison above empty
    recorded = json.loads(rec.PATH.read_text())
    assert len(set(recorded.values())) > 0.75 * len(rec.DECODERS) * len(rec.TREES)


@pytest.mark.parametrize("tree", rec.TREES)
def test_rows_are_distributions(tree):
    import hdecode_torch as hd
    p = rec.rows(hd.load_hierarchy(tree), 0)
    assert p.shape[0] == rec.ROWS and (p >= 0).all()
    assert abs(p.sum(1) - 1).max() < 1e-12
