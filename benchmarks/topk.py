#!/usr/bin/env python
"""Dense against top-k decoding: microseconds per sample of the same decision, from the (B, L) table and
from its top-k list (``probs.topk(k)``, the rest completed uniformly), for the optimal decoders of the
metrics that take a list and for the heuristics that do (``HEURISTICS``, named in the table's metric column).

    python -m benchmarks.topk                                   # tiered, inat, 100k; B = 256; k = 10, 100
    python -m benchmarks.topk --trees 1m --rows 64              # the 1M-node tree, dense side by side
    python -m benchmarks.topk --trees 1m --rows 1024 --ks 100   # too large for a dense table: top-k only
    python -m benchmarks.topk --json topk.json
    python -m benchmarks.topk --device cuda --rows 4096         # on a GPU (times synchronized)
    python -m benchmarks.topk --counts --trees tiered --rows 1024   # what a GPU pays per call, counted here

Per tree, model-shaped rows (``benchmarks.workloads.model_like_probs``: a random temperature, a boost on
a true leaf and on the leaves of one of its ancestors); the dense decoder reads the (B, L) float32 table,
the top-k decoder the list taken from it, ``m.decode(hd.TopK(values, indices))`` with the list's checks
(the top-k itself is not timed: a served model returns the list).
Each metric runs dense and top-k alternately, ``--repeats`` times, one intra-op thread; medians are
reported.  The decisions of the first 16 rows of each case are checked against the dense decoder on the
completed table (the same expected score; the exit status is 1 otherwise).  On trees too large for a
dense table the lists are drawn directly: k leaves near a random leaf in depth-first order (its
cousins), Dirichlet(0.3) masses of total uniform in (0, 1).

``--counts``: instead of times, per metric and k, the operators that launch a kernel and the host reads
of one validated top-k call (its ``hd.TopK`` construction included) and of the dense call on the same rows,
under ``hd.plan_for("cuda")`` on CPU tensors (:mod:`benchmarks.plan_cost`'s counter): on a GPU each operator
is a launch and each host read a full device sync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/topk.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from benchmarks.workloads import load_tree, model_like_probs  # noqa: E402

METRICS = ["accuracy", "tree_distance", "tree_distance_c", "lca_height", "wu_palmer", "zhao", "hamming", "hf_beta",
           "hf_beta[beta=0.5]", "jaccard"]
#: The heuristic decoders that take a top-k list, at the command line's parameters.
HEURISTICS = [("argmax_leaf", {}), ("top_down", {}), ("majority", {}), ("confidence_threshold", {"tau": 0.8}),
              ("confidence_threshold[tau=0.3]", {}),
              ("crm", {}), ("plurality", {}), ("hie", {}), ("darts", {"lam": 1.0}), ("expected_information", {}),
              ("information_threshold", {"threshold": 2.0})]
#: Largest dense (B, L) table built, in entries (1 GiB of float32).
DENSE_MAX_ENTRIES = 2**28
#: Rows whose decision is checked against the dense decoder on the completed table before the timings count.
CHECK_ROWS = 16


def drawn_lists(h, rows: int, k: int, seed: int = 0) -> hd.TopK:
    """A (rows, k) top-k list per row without a dense table (see the module docstring)."""
    g = torch.Generator().manual_seed(seed)
    L = h.num_leaves
    rank = torch.empty_like(h.dfs_leaves)
    rank[h.dfs_leaves] = torch.arange(L)
    near = torch.rand(rows, min(5 * k, L), generator=g).topk(k).indices
    indices = h.dfs_leaves[(rank[torch.randint(0, L, (rows,), generator=g)][:, None] + near) % L]
    values = torch.distributions.Dirichlet(torch.full((k,), 0.3)).sample((rows,)) * torch.rand(rows, 1, generator=g)
    return hd.TopK(values.sort(1, descending=True).values, indices)


def agrees(m, values, indices, num_leaves: int, device: torch.device) -> bool:
    """Whether the top-k decision of these rows has the dense decoder's expected score on the completed table
    (a heuristic: the dense heuristic's node on it).  A set metric's top-k sets are sparse: scored as they are
    against the dense decoder's (B, N) sets (equal sets can differ only at exact ties, equal expected scores
    cannot)."""
    full = hd.TopK(values, indices).completed(num_leaves, torch.float64)
    pred = m.decode(hd.TopK(values.to(device), indices.to(device))).cpu()
    if isinstance(m, hd.decoders.Decoder):
        return bool(torch.equal(pred, m.decode(full)))
    ours, theirs = m.expected(full, pred), m.expected(full, m.decode(full))
    return bool(torch.allclose(ours, theirs, rtol=1e-9, atol=1e-9))


def timed(fn, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def count_tree(name: str, rows: int, ks: list[int]) -> dict:
    """Per metric and k: operators and host reads of one validated top-k call and of the dense call on the same
    rows, GPU plan (see the module docstring)."""
    from benchmarks.plan_cost import cost_of

    h, _ = load_tree(name)
    probs = torch.from_numpy(model_like_probs(h.ancestors.numpy(), h.depth.numpy(), h.num_leaves, rows, seed=0))
    out = {"tree": name, "rows": rows, "results": []}
    for metric, params in [(m, None) for m in METRICS] + HEURISTICS:
        m = hd.get_metric(metric, h) if params is None else hd.get_decoder(metric, h, **params)
        dense = cost_of(m.decode, probs)
        for k in ks:
            values, indices = probs.topk(k)
            top = cost_of(lambda v: m.decode(hd.TopK(v, indices)), values)
            row = {"metric": metric, "k": k, "dense_ops": dense.ops, "dense_reads": dense.reads,
                   "topk_ops": top.ops, "topk_reads": top.reads,
                   "topk_top_ops": sorted(top.by_op.items(), key=lambda kv: -kv[1])[:8]}
            out["results"].append(row)
            print(f"| {name} | {metric} | {k} | {dense.ops} | {dense.reads} | {top.ops} | {top.reads} |", flush=True)
    return out


def bench_tree(name: str, rows: int, ks: list[int], repeats: int, device: torch.device) -> dict:
    h, _ = load_tree(name)
    dense_fits = rows * h.num_leaves <= DENSE_MAX_ENTRIES and h.ancestor_table_fits
    probs = None
    if dense_fits:
        probs = torch.from_numpy(model_like_probs(h.ancestors.numpy(), h.depth.numpy(), h.num_leaves, rows, seed=0))
    out = {"tree": name, "device": str(device), "num_nodes": h.num_nodes, "num_leaves": h.num_leaves, "max_depth": h.max_depth,
           "rows": rows, "results": []}
    out["heuristic_results"] = []
    for metric, params in [(m, None) for m in METRICS] + HEURISTICS:
        m = hd.get_metric(metric, h) if params is None else hd.get_decoder(metric, h, **params)
        for k in ks:
            lists = hd.TopK(*probs.topk(k)) if probs is not None else drawn_lists(h, rows, k)
            values, indices = lists.values, lists.indices
            on_device = None if probs is None else probs.to(device)
            values_d, indices_d = values.to(device), indices.to(device)
            if probs is not None:
                m.decode(on_device[:2])
            m.decode(hd.TopK(values_d[:2], indices_d[:2]))  # the tree's tables, outside the timings
            dense_t, topk_t = [], []
            for _ in range(repeats):
                if probs is not None:
                    dense_t.append(timed(lambda: m.decode(on_device), device))
                topk_t.append(timed(lambda: m.decode(hd.TopK(values_d, indices_d)), device))  # its checks included
            row = {"metric": metric, "k": k, "topk_us": statistics.median(topk_t) / rows * 1e6,
                   "agrees": agrees(m, values[:CHECK_ROWS], indices[:CHECK_ROWS], h.num_leaves, device)}
            if dense_t:
                row["dense_us"] = statistics.median(dense_t) / rows * 1e6
                row["speedup"] = row["dense_us"] / row["topk_us"]
            out["results" if params is None else "heuristic_results"].append(row)
            print(f"| {name} | {metric} | {k} | {row.get('dense_us', float('nan')):.1f} | {row['topk_us']:.1f} | "
                  f"{row.get('speedup', float('nan')):.1f} | {'yes' if row['agrees'] else 'NO'} |", flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=["tieredimagenet-h", "inat19", "100k"])
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--ks", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where the lists and tables live")
    parser.add_argument("--json", default=None)
    parser.add_argument("--counts", action="store_true",
                        help="count operators and host reads per call on the GPU plan (CPU tensors) instead of timing")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    np.random.seed(0)
    if args.counts:
        print("| tree | metric | k | dense ops | dense reads | top-k ops | top-k reads |")
        print("|---|---|---|---|---|---|---|")
        results = [count_tree(t, args.rows, args.ks) for t in args.trees]
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"plan": "cuda", "results": results}, f, indent=1)
        return 0
    print("| tree | metric | k | dense µs/sample | top-k µs/sample | dense / top-k | same expected score |")
    print("|---|---|---|---|---|---|---|")
    results = [bench_tree(t, args.rows, args.ks, args.repeats, device) for t in args.trees]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "device": str(device), "results": results}, f, indent=1)
    return 0 if all(r["agrees"] for tree in results for r in tree["results"] + tree["heuristic_results"]) else 1


if __name__ == "__main__":
    sys.exit(main())
