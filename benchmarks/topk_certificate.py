#!/usr/bin/env python
"""How often a top-k decision is certified, and what the certificate costs: ``decode(topk, certify=True)``.

    python -m benchmarks.topk_certificate                                # both bundled trees, B = 256
    python -m benchmarks.topk_certificate --trees 1m --rows 128          # the 986k-node tree
    python -m benchmarks.topk_certificate --json cert.json

Per tree, model-shaped rows (the recipe of ``benchmarks.workloads.model_like_probs``: Gaussian logits with a
random temperature, a boost of the leaves under a random ancestor of a true leaf and of the true leaf, scaled
by log L), drawn one row at a time (the ancestor's leaves from its depth-first range: no (B, L) table nor
ancestor table, so the 1M-node tree works too); each row's top 100 gives the lists for every k (1, 5, 10, 50,
100).  Per metric and k: the fraction of rows whose decision is certified (optimal under every completion
with each unlisted leaf at most the k-th listed value), the median regret bound of the others, and the
microseconds per sample of ``decode`` without and with ``certify=True``, alternating, ``--repeats`` times,
one intra-op thread, medians.  The exit status is 1 if a certified decision differs from the plain decode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/topk_certificate.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from benchmarks.workloads import load_tree  # noqa: E402

METRICS = ["accuracy", "tree_distance", "tree_distance_c", "lca_height"]
KS = [1, 5, 10, 50, 100]


def model_like_lists(h, rows: int, k: int, seed: int = 0) -> hd.TopK:
    """(rows, k) top-k lists of model-shaped rows, one dense row at a time (see the module docstring)."""
    rng = np.random.default_rng(seed)
    L = h.num_leaves
    log_l = np.log(max(L, 2))
    depth = h.depth.numpy()
    parents = h.parent_or_root.numpy()
    start, count, dfs = h.leaf_start.numpy(), h.leaf_count.numpy(), h.dfs_leaves.numpy()
    values = np.empty((rows, k), dtype=np.float32)
    indices = np.empty((rows, k), dtype=np.int64)
    for i in range(rows):
        logits = rng.standard_normal(L) * rng.uniform(0.5, 2.0)
        y = int(rng.integers(L))
        dy = int(depth[y])
        if dy >= 2:
            j = int(rng.integers(1, dy))
            a = y
            while depth[a] > j:
                a = parents[a]
            logits[dfs[start[a]:start[a] + count[a]]] += rng.uniform(0.0, 0.7) * log_l
        logits[y] += rng.uniform(0.2, 1.2) * log_l
        logits -= logits.max()
        e = np.exp(logits)
        top = torch.from_numpy((e / e.sum()).astype(np.float32)).topk(k)
        values[i], indices[i] = top.values.numpy(), top.indices.numpy()
    return hd.TopK(torch.from_numpy(values), torch.from_numpy(indices))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bench_tree(name: str, rows: int, ks: list[int], repeats: int) -> dict:
    h, _ = load_tree(name)
    full = model_like_lists(h, rows, min(max(ks), h.num_leaves))
    out = {"tree": name, "num_nodes": h.num_nodes, "num_leaves": h.num_leaves, "max_depth": h.max_depth,
           "rows": rows, "results": []}
    for metric in METRICS:
        m = hd.get_metric(metric, h)
        for k in ks:
            lists = hd.TopK(full.values[:, :k].contiguous(), full.indices[:, :k].contiguous())
            small = hd.TopK(lists.values[:2], lists.indices[:2])
            m.decode(small, certify=True)  # the tree's tables, outside the timings
            plain_t, cert_t = [], []
            for _ in range(repeats):
                plain_t.append(timed(lambda: m.decode(lists)))
                cert_t.append(timed(lambda: m.decode(lists, certify=True)))
            pred, certified, bound = m.decode(lists, certify=True)
            others = bound[~certified]
            row = {"metric": metric, "k": k, "certified": certified.double().mean().item(),
                   "median_bound": others.median().item() if others.numel() else 0.0,
                   "plain_us": statistics.median(plain_t) / rows * 1e6,
                   "certify_us": statistics.median(cert_t) / rows * 1e6,
                   "same_pred": bool(torch.equal(pred, m.decode(lists)))}
            row["ratio"] = row["certify_us"] / row["plain_us"]
            out["results"].append(row)
            print(f"| {name} | {metric} | {k} | {100 * row['certified']:.1f} % | {row['median_bound']:.3g} | "
                  f"{row['plain_us']:.1f} | {row['certify_us']:.1f} | {row['ratio']:.2f} |", flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=["tieredimagenet-h", "inat19"])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--ks", type=int, nargs="+", default=KS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print("| tree | metric | k | certified | median bound of the others | decode µs/sample | with certify "
          "µs/sample | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    results = [bench_tree(t, args.rows, args.ks, args.repeats) for t in args.trees]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "results": results}, f, indent=1)
    return 0 if all(r["same_pred"] for tree in results for r in tree["results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
