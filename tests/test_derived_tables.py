"""The fused ops' one cache of derived tables and index checks passed (``kernels.fused._checks.derived``):
reused while its sources are unchanged, rebuilt after an in-place change, dropped with a source, bounded with
the least recently used entry out, never for inference tensors or values ``keep`` rejects."""

from __future__ import annotations

import gc
import importlib

import pytest
import torch

checks = importlib.import_module("hdecode_torch.kernels.fused._checks")


@pytest.fixture
def cache(monkeypatch):
    monkeypatch.setattr(checks, "_DERIVED", {})
    monkeypatch.setattr(checks, "CACHE_ENTRIES", 4)
    return checks._DERIVED


def _counting(value):
    calls = []
    return calls, lambda: calls.append(1) or value


def test_reused_until_a_source_changes(cache):
    t = torch.arange(5)
    calls, build = _counting(7)
    assert [checks.derived("t", (t,), build) for _ in range(3)] == [7, 7, 7] and len(calls) == 1
    t.add_(1)  # a new version: built again, then reused
    assert [checks.derived("t", (t,), build) for _ in range(2)] == [7, 7] and len(calls) == 2
    assert [checks.derived("u", (t,), build) for _ in range(2)] == [7, 7] and len(calls) == 3  # another tag
    assert len(cache) == 2


def test_an_entry_goes_with_its_source(cache):
    t, u = torch.arange(3), torch.arange(4)
    checks.derived("pair", (t, u), lambda: 1)
    checks.derived("alone", (u,), lambda: 2)
    assert len(cache) == 2
    del t
    gc.collect()
    assert list(cache) == [("alone", id(u))]


def test_bounded_least_recently_used_out(cache):
    for i in range(4):
        checks.derived(("width", i), (), lambda i=i: i)
    assert checks.derived(("width", 0), (), lambda: -1) == 0  # a hit: now the most recently used
    checks.derived(("width", 4), (), lambda: 4)
    assert list(cache) == [(("width", i),) for i in (2, 3, 0, 4)]  # 1 out, not 0
    calls, build = _counting(1)
    checks.derived(("width", 1), (), build)
    assert len(calls) == 1 and len(cache) == 4


def test_inference_tensors_and_rejected_values_are_not_kept(cache):
    with torch.inference_mode():
        t = torch.arange(3)
    calls, build = _counting(5)
    assert checks.derived("t", (t,), build) == 5 and checks.derived("t", (t,), build) == 5
    assert len(calls) == 2 and not cache
    u = torch.arange(3)
    assert checks.derived("u", (u,), build, keep=lambda v: v < 5) == 5 and not cache
    assert checks.derived("u", (u,), lambda: 4, keep=lambda v: v < 5) == 4 and len(cache) == 1


def test_index_checks_are_kept_until_a_change_and_trusted_marks_are_not_read(cache):
    t = torch.tensor([0, 5])
    checks.check_bounds([(t, 5, "t", "N")])
    assert len(cache) == 1
    t[1] = 9  # in place: read again, and refused
    with pytest.raises(ValueError, match="`t` in \\[0, N\\] = \\[0, 5\\], but got 9"):
        checks.check_bounds([(t, 5, "t", "N")])
    assert not cache
    u = checks.trust_indices(torch.tensor([7]), 3)  # its producer's word: not read where trusted
    checks.check_bounds([(u, 3, "u", "C")], remember=False, trusted_ok=True)
    with pytest.raises(ValueError, match="`u`"):
        checks.check_bounds([(u, 3, "u", "C")], remember=False)
    v = torch.tensor([1])
    checks.check_bounds([(v, 3, "v", "C")], remember=False, trusted_ok=True)  # read, not kept
    with pytest.raises(ValueError, match="`v`"):
        checks.check_bounds([(v, 0, "v", "C")], remember=False, trusted_ok=True)
    assert len(cache) == 1
