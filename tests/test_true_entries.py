"""``kernels/true_entries.py``: the true entries of a bool table, by NumPy on plain CPU tensors, are
``nonzero``'s integers in the same order; a trace or an operator count sees the ATen operator."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hdecode_torch.kernels import true_entries as te


class _Names(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _mask(shape, rate, seed):
    return torch.as_tensor(np.random.default_rng(seed).random(shape) < rate)


@pytest.mark.parametrize("shape", [(0,), (5,), (4099,), (70, 300), (3, 5, 400), (800, 4000)])
@pytest.mark.parametrize("rate", [0.0, 0.003, 0.5, 1.0])
def test_positions_are_nonzeros(shape, rate):
    mask = _mask(shape, rate, sum(shape))
    got = te.true_positions(mask)
    assert got.dtype == torch.int64 and got.dim() == 1
    assert torch.equal(got, mask.reshape(-1).nonzero().squeeze(1))


@pytest.mark.parametrize("shape", [(0, 7), (7, 0), (1, 5000), (70, 300), (800, 4000), (4097, 1)])
@pytest.mark.parametrize("rate", [0.0, 0.003, 0.5, 1.0])
def test_pairs_are_nonzeros(shape, rate):
    mask = _mask(shape, rate, sum(shape) + 1)
    row, col = te.true_pairs(mask)
    want_row, want_col = mask.nonzero().unbind(1)
    assert row.dtype == col.dtype == torch.int64
    assert torch.equal(row, want_row) and torch.equal(col, want_col)


def test_a_transposed_mask_is_listed_in_its_own_row_major_order():
    mask = _mask((300, 70), 0.05, 3).t()  # (70, 300), not contiguous
    assert not mask.is_contiguous()
    row, col = te.true_pairs(mask)
    want_row, want_col = mask.nonzero().unbind(1)
    assert torch.equal(row, want_row) and torch.equal(col, want_col)
    assert torch.equal(te.true_positions(mask), mask.reshape(-1).nonzero().squeeze(1))


def test_an_operator_count_sees_the_aten_operator():
    mask = _mask((70, 300), 0.05, 4)
    assert mask.numel() >= te.NUMPY_MIN_ENTRIES
    with _Names() as seen:
        row, _ = te.true_pairs(mask)
        te.true_positions(mask)
    assert seen.names.count("nonzero") == 2
    assert torch.equal(row, mask.nonzero()[:, 0])


def test_other_tables_are_refused_by_name():
    with pytest.raises(TypeError, match="Expected `mask` to be a bool tensor, but got torch.float32"):
        te.true_positions(torch.zeros(4))
    with pytest.raises(TypeError, match="Expected `mask` to be a 2-D bool tensor, but got 1-D torch.bool"):
        te.true_pairs(torch.zeros(4, dtype=torch.bool))
