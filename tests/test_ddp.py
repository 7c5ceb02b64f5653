"""HierarchicalMetric across 2 CPU processes (gloo, torch.distributed by hand) equals one process.

The validation set size divides by the world size (DistributedSampler pads otherwise)
and the model is not trained, so both runs score the same predictions.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import hdecode_torch as hd

WORLD = 2
N_SAMPLES, DIM = 96, 12
PAIRS = [("accuracy", {}, "optimal"), ("tree_distance", {}, "optimal"), ("wu_palmer", {}, "optimal"),
         ("hf_beta", {"beta": 0.5}, "optimal"), ("hamming", {}, "majority"), ("zhao", {}, ("darts", {"lam": 0.5}))]


def _tree():
    return hd.load_hierarchy("tieredimagenet-h")


def _data():
    g = torch.Generator().manual_seed(0)
    h = _tree()
    return torch.randn(N_SAMPLES, DIM, generator=g), torch.randint(0, h.num_leaves, (N_SAMPLES,), generator=g)


def _net(num_leaves):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(DIM, 24), nn.Tanh(), nn.Linear(24, num_leaves))
    with torch.no_grad():
        net[-1].weight.mul_(15)  # peaked, varied outputs (a fresh net is near uniform over 608 classes)
    return net


def assert_same_mean(key, got, want):
    """HierarchicalMetric sums its per-sample values in sorted order (exact=True), so the mean is
    bitwise the same whatever the number of processes and however the samples were split."""
    assert float(got) == float(want), (key, float(got), float(want))


# --------------------------------------------------------------------------- torch.distributed, by hand
def _metrics(h):
    from hdecode_torch.integrations import HierarchicalMetric

    return {f"{m}/{d if isinstance(d, str) else d[0]}": HierarchicalMetric(h, m, decoder=d, from_logits=True, **p)
            for m, p, d in PAIRS}


def _metric_worker(rank, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        h = _tree()
        x, y = _data()
        net = _net(h.num_leaves)
        mine = torch.arange(rank, N_SAMPLES, WORLD)  # DistributedSampler's split
        metrics = _metrics(h)
        from torchmetrics import MetricCollection

        collection = MetricCollection(list(_metrics(h).values()))  # one batch shared by its members
        with torch.no_grad():
            for chunk in mine.split(10):
                logits, target = net(x[chunk]), y[chunk]
                for m in metrics.values():
                    m.update(logits, y[chunk])  # a new target tensor per metric: nothing shared
                collection.update(logits, target)
        results = {k: m.compute() for k, m in metrics.items()}
        results.update({f"collection:{k}": v for k, v in collection.compute().items()})
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_metric_under_gloo_equals_single_process(tmp_path):
    mp.spawn(_metric_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    h = _tree()
    x, y = _data()
    net = _net(h.num_leaves)
    single = _metrics(h)
    with torch.no_grad():
        logits = net(x)
    for a in range(0, N_SAMPLES, 16):
        for m in single.values():
            m.update(logits[a:a + 16], y[a:a + 16])
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for key, m in single.items():
        want = m.compute()
        for r in range(WORLD):
            for got in (results[r][key], results[r][f"collection:{m.name}"]):
                assert got.dtype == logits.dtype  # the scores' dtype; the sum behind it is float64
                assert_same_mean(key, got, want)
        assert torch.equal(results[0][key], results[1][key])  # every rank gets the global value
