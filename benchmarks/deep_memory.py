"""Peak memory growth of one hF_β or Jaccard decode on a 400,000-node tree of depth ~800 (leaves at ~800
depths), B = 2.

    MALLOC_MMAP_THRESHOLD_=65536 python -m benchmarks.deep_memory PLAN METRIC BUDGET_MIB   # e.g. cpu jaccard 16

HDECODE_NATIVE=0 for the torch path.  The tree is built as tests/test_depth_ranges.py builds its 40,000-node one (a
spine of 800 nodes, then each node under a uniformly drawn earlier one); growth is VmHWM after clear_refs, the tree
tables warmed by a one-row call; prints the sets' sizes (equal with native on and off) and the call's CPU seconds.
"""

import sys
import time

import numpy as np
import torch

import hdecode_torch as hd

plan, metric, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
n, spine = 400000, 800
rng = np.random.default_rng(0)
parents = np.empty(n, dtype=np.int64)
parents[0], parents[1:spine] = -1, np.arange(spine - 1)
parents[spine:] = (rng.random(n - spine) * np.arange(spine, n)).astype(np.int64)
h = hd.Hierarchy.from_parents(parents.tolist())
P = torch.as_tensor(rng.dirichlet(np.full(h.num_leaves, 0.3), size=2))
hd.set_memory_budget(budget << 20)
small = hd.Hierarchy.from_parents([-1, 0, 0, 1, 1, 2, 2])
def rss(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field))
with hd.plan_for(plan):
    hd.get_decoder("optimal", small, metric=metric).decode(torch.full((2, 4), 0.25, dtype=torch.float64))
    dec = hd.get_decoder("optimal", h, metric=metric)
    dec.decode(P[:1])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = rss("VmRSS:")
    t = time.process_time()
    sets = dec.decode(P)
    t = time.process_time() - t
    growth = (rss("VmHWM:") - before) / 1024
print(f"{metric} plan={plan} budget={budget}MiB N={h.num_nodes} depth={h.max_depth} E={h.num_leaf_depths} "
      f"native={hd.kernels.native.enabled()} growth={growth:.0f}MiB cpu={t:.1f}s sizes={sets.sum(1).tolist()}")
