"""``kernels.candidates.pack_rows``: each row's kept nodes left-packed in rank order.  With ``pad`` on plain CPU
tensors NumPy lists them (the padding columns then hold ``pad``); the kept columns are the top-k selection's, on
random masks of every density, batch sizes around NumPy's threshold and non-contiguous masks; under an operator
count the top-k selection runs."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hdecode_torch.kernels.candidates import pack_rows
from hdecode_torch.kernels.true_entries import NUMPY_MIN_ENTRIES


def _case(b, n, density, seed):
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(b, n, generator=g) < density
    keep[:, 0] = True  # a root, always kept, as the decoders' masks have
    rank = torch.randperm(n, generator=g).to(torch.int32)
    width = max(int(keep.sum(1).max()), 1)
    return keep, rank, width


def _expected(keep, rank, width):
    """Per row, the kept nodes by decreasing rank (a Python reference)."""
    rows = []
    for r in keep.tolist():
        kept = sorted((i for i, k in enumerate(r) if k), key=lambda i: -int(rank[i]))
        rows.append(kept)
    return rows


@pytest.mark.parametrize("b,n", [(1, 5000), (3, 2000), (64, 843), (400, 97), (2, 10)])
@pytest.mark.parametrize("density", [0.01, 0.3, 1.0])
def test_padded_packing_keeps_the_top_k_columns(b, n, density):
    keep, rank, width = _case(b, n, density, b * n)
    count = keep.sum(1)
    padded = pack_rows(keep, rank, width, pad=-7)
    plain = pack_rows(keep, rank, width)
    assert padded.shape == plain.shape == (b, width) and padded.dtype == plain.dtype == torch.int64
    real = torch.arange(width)[None, :] < count[:, None]
    assert torch.equal(padded[real], plain[real])
    for row, kept in zip(padded.tolist(), _expected(keep, rank, width)):
        assert row[: len(kept)] == kept
    if keep.numel() >= NUMPY_MIN_ENTRIES:  # NumPy's listing: the padding is pad
        assert bool((padded[~real] == -7).all())


def test_non_contiguous_mask_and_wider_than_needed():
    keep, rank, _ = _case(300, 60, 0.2, 1)
    view = keep.t().contiguous().t()  # node-major storage, (B, N) view
    width = int(keep.sum(1).max()) + 3
    got = pack_rows(view, rank, width, pad=60)
    real = torch.arange(width)[None, :] < keep.sum(1)[:, None]
    assert torch.equal(got[real], pack_rows(keep, rank, width)[real]) and bool((got[~real] == 60).all())


def test_an_operator_count_sees_the_top_k_selection():
    keep, rank, width = _case(100, 200, 0.1, 2)
    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))
    with Count():
        got = pack_rows(keep, rank, width, pad=200)
    assert any("topk" in s for s in seen)
    assert torch.equal(got, pack_rows(keep, rank, width))
