"""hF_β at one row (B = 1): what a serving call pays, and that its shortcuts decide as the batch does.

One row takes paths of its own in both plans' decoders (its candidates listed without (sample, rank)
pairs and packed without padding, the masses of its few pairs read once for both pruning stages, its
best set written in place): the same values by construction, so a row decoded alone must give the bits
it gets inside a batch, and the operators a call runs are pinned (each costs a few microseconds at one
row on a CPU, a launch on a GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hdecode_torch as hd
from benchmarks.plan_cost import cost_of
from harness import batch, bundled, model_like, random_trees

#: Operators (kernel launches; views excluded) of one validated hF_β call at B = 1, per plan and tree: the
#: most over the rows below and β ∈ {0.5, 1, 2}.  At 453a7ad the CPU plan ran 202-245 on tieredImageNet-H
#: and 130 on iNat19, the GPU plan 39 on both.
ONE_ROW_OPS = {("cpu", "tieredimagenet-h"): 150, ("cpu", "inat19"): 80,
               ("cuda", "tieredimagenet-h"): 35, ("cuda", "inat19"): 35}


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("tree", ["tieredimagenet-h", "inat19"])
def test_one_row_operator_count(plan, tree):
    h, _ = bundled(tree)
    rng = np.random.default_rng(0)
    rows = np.concatenate([model_like(rng, h, 4, kind) for kind in ("peaked", "confused")])
    x = torch.as_tensor(rows, dtype=torch.float32)
    worst = 0
    for beta in (0.5, 1.0, 2.0):
        m = hd.get_metric("hf_beta", h, beta=beta)
        for i in range(x.shape[0]):
            cost = cost_of(m.decode, x[i:i + 1], plan)
            assert cost.reads <= (1 if plan == "cuda" else 7), (beta, i, cost.reads)
            worst = max(worst, cost.ops)
    assert worst <= ONE_ROW_OPS[plan, tree], worst


def _trees():
    for name in ("tieredimagenet-h", "inat19"):
        yield bundled(name)[0]
    for h, _ in random_trees(31, 6, num_nodes_max=40, unary_prob=0.3):
        yield h


@pytest.mark.parametrize("plan", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_row_alone_is_decoded_as_in_its_batch(plan, dtype):
    rng = np.random.default_rng(3)
    with hd.plan_for(plan):
        for h in _trees():
            x = torch.as_tensor(batch(rng, 12, h.num_leaves)).to(dtype)
            for beta in (0.5, 1.0, 2.0):
                m = hd.get_metric("hf_beta", h, beta=beta)
                together = m.decode(x)
                alone = torch.stack([m.decode(x[i:i + 1])[0] for i in range(x.shape[0])])
                assert torch.equal(alone, together), (h.num_nodes, beta)
                assert torch.equal(m.decode(x[0]), together[0])  # unbatched input: the same row
