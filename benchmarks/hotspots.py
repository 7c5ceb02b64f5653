#!/usr/bin/env python
"""Micro-benchmarks behind the hot-spot notes: a library kernel next to a candidate replacement.

    python -m benchmarks.hotspots [--trees tiered,inat] [--batch 4000] [--threads 1] [--json PATH]

Each experiment times the current code path and an alternative written here (not in the
library), checks that both give the same answer, and prints min / median milliseconds.
Experiments that rely on library internals that have since changed print ``n/a`` with the error.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from benchmarks.baselines import TreeTables  # noqa: E402
from benchmarks.workloads import TREE_ALIASES, load_tree, model_like_probs  # noqa: E402


def bench(fn, n: int = 15) -> tuple[float, float]:
    fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * min(ts), 1e3 * statistics.median(ts)


# ---------------------------------------------------------------------------- alternatives
def fused_validation(x: torch.Tensor, tol: float = 1e-4) -> bool:
    """One pass for the row sums, one for the minimum: finite & non-negative & rows sum to 1.

    amin propagates NaN, a negative or -inf entry makes it < 0, and a +inf entry makes its
    row sum inf, so these two reductions decide the same thing as isfinite/>=0/row sums.
    """
    s = x.sum(1)
    flags = torch.stack([x.amin() >= 0, ((s - 1).abs() <= tol).all()]).tolist()
    return all(flags)


def dfs_tables(h):
    """Leaves in DFS order and each node's [lo, hi) range in it (numpy, tree-only)."""
    par = np.asarray(h.parents_list)
    n, L = par.shape[0], h.num_leaves
    kids = [[] for _ in range(n)]
    for c, p in enumerate(par.tolist()):
        if p >= 0:
            kids[p].append(c)
    lo = np.zeros(n, np.int64)
    hi = np.zeros(n, np.int64)
    order = []
    stack = [(h.root, 0)]
    while stack:
        node, state = stack.pop()
        if state == 0:
            lo[node] = len(order)
            if node < L:
                order.append(node)
                hi[node] = len(order)
            else:
                stack.append((node, 1))
                stack.extend((k, 0) for k in reversed(kids[node]))
        else:
            hi[node] = len(order)
    return torch.as_tensor(np.asarray(order)), torch.as_tensor(lo), torch.as_tensor(hi)


def node_probs_prefix(x: torch.Tensor, order, lo, hi) -> torch.Tensor:
    """p(n) = S[hi(n)] − S[lo(n)] with S the float64 prefix sum of the leaves in DFS order. (N, B) float32."""
    s = torch.zeros(x.shape[0], x.shape[1] + 1, dtype=torch.float64)
    torch.cumsum(x[:, order], dim=1, dtype=torch.float64, out=s[:, 1:])
    return (s[:, hi] - s[:, lo]).t().to(x.dtype)


def deepest_above_int16(h, p: torch.Tensor, thr: float) -> torch.Tensor:
    """deepest_above with an int16 key table (2 bytes per entry instead of 8)."""
    d16 = h.depth.to(torch.int16)[:, None]
    key = torch.where(p > thr, d16, torch.full_like(d16, -1))
    best, node = key.max(dim=0)
    return torch.where(best >= 0, node, torch.full_like(node, h.root))


def top_down_walk(h, p: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """top_down as D gathers along the chosen path: p (N, B) node probabilities, table (N, W) children (pad N)."""
    n, b = p.shape
    pe = torch.cat([p, p.new_full((1, b), float("-inf"))])
    cur = torch.full((b,), h.root, dtype=torch.long)
    cols = torch.arange(b)[:, None]
    for _ in range(h.max_depth):
        kids = table[cur]  # (B, W), ascending ids, padded with N
        nxt = kids.gather(1, pe[kids, cols].argmax(1, keepdim=True))[:, 0]  # first max = smallest id
        cur = torch.where(nxt < n, nxt, cur)  # a leaf stays
    return cur


def children_table(h) -> torch.Tensor:
    nch = h.children_ptr[1:] - h.children_ptr[:-1]
    n, w = h.num_nodes, int(nch.max())
    table = torch.full((n, w), n, dtype=torch.long)
    pos = torch.arange(h.children.numel()) - torch.repeat_interleave(h.children_ptr[:-1], nch)
    table[torch.repeat_interleave(torch.arange(n), nch), pos] = h.children
    return table


def path_sum_add(h, values: torch.Tensor) -> torch.Tensor:
    """path_sum top-down with one gather + index_add_ per level (children ids are distinct)."""
    from hdecode_torch.kernels.tree_sums import level_pairs

    out = values.clone()
    for nodes, parents in reversed(level_pairs(h)):
        out.index_add_(0, nodes, out.index_select(0, parents))
    return out


def _zero_root(h, v, include_root):
    if include_root:
        return v
    v = v.clone()
    v[h.root] = 0
    return v


# ---------------------------------------------------------------------------- experiments
def experiments(h, x: torch.Tensor):
    from hdecode_torch.kernels.tree_sums import leaf_to_node_sum, path_sum
    from hdecode_torch.core.validation import prepare_leaf_probs

    L, B = h.num_leaves, x.shape[0]
    out = []

    def add(name, current, alt=None, same=None, note=""):
        row = {"experiment": name, "current_ms": current, "alternative_ms": alt, "same_result": same, "note": note}
        out.append(row)
        c = f"{current[0]:8.2f} /{current[1]:8.2f}"
        a = "" if alt is None else f"{alt[0]:8.2f} /{alt[1]:8.2f}   ×{current[0] / alt[0]:.1f}"
        print(f"  {name:44s} {c}   {a}  {'' if same is None else ('same' if same else 'DIFFERENT')} {note}")

    def guarded(name, fn):
        try:
            fn()
        except Exception as exc:  # library internals moved on
            print(f"  {name:44s} n/a: {exc!r}")
            out.append({"experiment": name, "error": repr(exc)})

    print(f"  {'experiment':44s} {'current min / median ms':>22s}   {'alternative':>19s}   speed-up")

    def e_validation():
        add("validation: prepare_leaf_probs vs fused",
            bench(lambda: prepare_leaf_probs(x, L)), bench(lambda: fused_validation(x)), fused_validation(x))
        add("validation: prepare_leaf_probs(validate=False)", bench(lambda: prepare_leaf_probs(x, L, validate=False)))
        for name, kw in (("accuracy", {}), ("tree_distance", {}), ("hamming", {})):
            m = hd.get_metric(name, h, **kw)
            add(f"decode {name}: validate=True vs False", bench(lambda: m.decode(x)),
                bench(lambda: m.decode(x, validate=False)), bool(torch.equal(m.decode(x), m.decode(x, validate=False))))
    guarded("validation", e_validation)

    def e_node_sums():
        order, lo, hi = dfs_tables(h)
        a = leaf_to_node_sum(h, x.t())
        b = node_probs_prefix(x, order, lo, hi)
        add("node sums: per-level index_add_ vs DFS prefix", bench(lambda: leaf_to_node_sum(h, x.t())),
            bench(lambda: node_probs_prefix(x, order, lo, hi)), bool((a - b).abs().max() < 1e-6))
    guarded("node sums", e_node_sums)

    def e_strategies():
        for name in ("wu_palmer", "zhao"):
            res = {}
            for strat in ("structural", "dense", "candidates"):
                m = hd.get_metric(name, h, strategy=strat)
                res[strat] = (bench(lambda: m.decode(x), n=5), m.decode(x))
            auto = hd.get_metric(name, h)
            chosen = auto.resolved_strategy()
            for strat in ("dense", "candidates"):
                add(f"{name}: structural vs {strat}", res["structural"][0], res[strat][0], None,
                    f"(auto = {chosen})")
    guarded("strategies", e_strategies)

    def e_deepest():
        from hdecode_torch.kernels.selection import deepest_above

        p = hd.Posterior(h, x).node
        add("deepest_above: first True row vs int16 key max", bench(lambda: deepest_above(h, p, 0.5)),
            bench(lambda: deepest_above_int16(h, p, 0.5)),
            bool(torch.equal(deepest_above(h, p, 0.5), deepest_above_int16(h, p, 0.5))))
    guarded("deepest_above", e_deepest)

    def e_keys():
        from hdecode_torch.kernels.selection import informative_order
        from hdecode_torch.kernels.selection import most_informative_where as _most_informative

        p = hd.Posterior(h, x).node
        allowed = p > 0.75
        rank = torch.empty(h.num_nodes, dtype=torch.long)
        rank[informative_order(h)] = torch.arange(h.num_nodes - 1, -1, -1)  # larger = more informative
        r = rank[:, None]

        def alt():
            best, idx = torch.where(allowed, r, torch.full_like(r, -1)).max(0)
            return torch.where(best >= 0, idx, torch.full_like(idx, h.root))
        add("most_informative: first allowed row vs masked rank max", bench(lambda: _most_informative(h, allowed)),
            bench(alt), bool(torch.equal(_most_informative(h, allowed), alt())))

        from hdecode_torch.kernels.selection import argbest, argbest_pairs

        v = torch.round(p * 8) / 8  # many exact ties
        sample = torch.arange(v.shape[1]).repeat(h.num_nodes)
        node = torch.arange(h.num_nodes).repeat_interleave(v.shape[1])

        def as_pairs():
            return argbest_pairs(h, v.reshape(-1), sample, node, v.shape[1], True)
        add("argbest: rows in tie order vs the same table as (row, column) pairs", bench(lambda: argbest(h, v, True)),
            bench(as_pairs), bool(torch.equal(argbest(h, v, True), as_pairs())))
    guarded("keys", e_keys)

    def e_top_down():
        dec = hd.get_decoder("top_down", h)
        table = children_table(h)
        walk = lambda: top_down_walk(h, hd.Posterior(h, x).node, table)  # noqa: E731
        add("top_down decode (children window) vs padded children table", bench(lambda: dec.decode(x), n=5), bench(walk, n=5),
            bool(torch.equal(dec.decode(x), walk())), f"(W = max branching = {table.shape[1]})")
    guarded("top_down", e_top_down)

    def e_sddmm():
        import warnings

        from hdecode_torch.kernels.candidates import candidate_mask

        wp = hd.get_metric("wu_palmer", h, strategy="candidates")
        cost, stats = wp.similarity_matrix(h, x.dtype), wp.dense_pruning(h)
        post = hd.Posterior(h, x)
        mask = candidate_mask(h, post.node, stats)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            csr = mask.to(x.dtype).to_sparse_csr()
            sd = lambda: torch.sparse.sampled_addmm(csr, cost, x.t(), beta=0.0)  # noqa: E731
            r = sd().to_sparse_coo()
        d = cost @ x.t()
        same = bool((d[r.indices()[0], r.indices()[1]] - r.values()).abs().max() < 1e-5)
        add("wu_palmer risks: dense mm vs sampled_addmm", bench(lambda: cost @ x.t(), n=5), bench(sd, n=5), same,
            f"(candidates/sample mean {float(mask.sum(0).float().mean()):.1f}; candidate_mask itself: "
            f"{bench(lambda: candidate_mask(h, post.node, stats), n=5)[0]:.1f} ms)")
    guarded("sampled_addmm", e_sddmm)

    def e_path_sum():
        p = hd.Posterior(h, x).node
        add("path_sum: index_copy_ vs index_add_", bench(lambda: path_sum(h, p)), bench(lambda: path_sum_add(h, p)),
            bool((path_sum(h, p) - path_sum_add(h, p)).abs().max() < 1e-5))
    guarded("path_sum", e_path_sum)

    def e_path_sum_in_decoders():
        import importlib

        mods = [importlib.import_module(f"hdecode_torch.metrics.{m}") for m in ("lca_height", "wu_palmer", "zhao")]
        originals = [getattr(m, "path_sum") for m in mods]
        for name, kw in (("lca_height", {}), ("wu_palmer", {"strategy": "structural"}), ("zhao", {})):
            m = hd.get_metric(name, h, **kw)
            cur = bench(lambda: m.decode(x), n=5)
            ref = m.decode(x)
            try:
                for mod in mods:
                    mod.path_sum = lambda hh, v, include_root=True: path_sum_add(hh, _zero_root(hh, v, include_root))
                alt = bench(lambda: m.decode(x), n=5)
                same = bool(torch.equal(ref, m.decode(x)))
            finally:
                for mod, f in zip(mods, originals):
                    mod.path_sum = f
            add(f"decode {name}{'[structural]' if kw else ''}: path_sum index_add_", cur, alt, same,
                "(library decode with path_sum swapped)")
    guarded("path_sum in decoders", e_path_sum_in_decoders)

    def e_hf_buckets():
        from hdecode_torch.metrics.hf_beta import hf_beta_bound

        for beta in (0.5, 2.0):
            m = hd.get_metric("hf_beta", h, beta=beta)
            p = hd.node_probabilities(h, x).t()
            count = (p >= hf_beta_bound(h, beta).to(p.dtype)[:, None]).sum(0)
            perm = torch.argsort(count)
            xs = x[perm]
            nb = 8
            step = (B + nb - 1) // nb
            chunks = lambda xx: torch.cat([m.decode(xx[i:i + step]) for i in range(0, B, step)])  # noqa: E731
            single = bench(lambda: m.decode(x), n=5)
            add(f"hf_beta[{beta:g}]: one call vs {nb} chunks", single, bench(lambda: chunks(x), n=5),
                bool(torch.equal(m.decode(x), chunks(x))))
            add(f"hf_beta[{beta:g}]: one call vs {nb} buckets by #cands", single, bench(lambda: chunks(xs), n=5),
                bool(torch.equal(m.decode(x)[perm], chunks(xs))),
                f"(candidates per sample: max {int(count.max())}, mean {float(count.float().mean()):.1f})")
    guarded("hf_beta buckets", e_hf_buckets)

    def e_hf():
        for beta in (0.5, 2.0):
            m = hd.get_metric("hf_beta", h, beta=beta)
            total = bench(lambda: m.decode(x), n=5)

            def q_only():
                hd.Posterior(h, x).by_leaf_depth()
            add(f"hf_beta[{beta:g}]: decode vs the (N,E,B) table alone", total, bench(q_only, n=5), None,
                "(the decode reads candidate masses from prefix sums; the alternative is the full table it avoids)")
    guarded("hf_beta", e_hf)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default="tiered,inat")
    ap.add_argument("--batch", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0 = torch's default)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    default_threads = torch.get_num_threads()
    if a.threads:
        torch.set_num_threads(a.threads)
    results = {"torch": torch.__version__, "threads": torch.get_num_threads(), "batch": a.batch, "trees": {}}
    for name in a.trees.split(","):
        name = TREE_ALIASES.get(name, name)
        h, _ = load_tree(name)
        t = TreeTables(h.parents_list)
        x = torch.from_numpy(model_like_probs(t.ancestors, t.depth, t.num_leaves, a.batch))
        print(f"\n=== {name}  B={a.batch}  torch threads={torch.get_num_threads()}")
        rows = experiments(h, x)
        if a.threads != default_threads:
            cur = torch.get_num_threads()
            one = bench(lambda: hd.node_probabilities(h, x))
            torch.set_num_threads(default_threads)
            dflt = bench(lambda: hd.node_probabilities(h, x))
            torch.set_num_threads(cur)
            print(f"  node_probabilities with {cur} vs {default_threads} threads: {one[0]:.2f} / {dflt[0]:.2f} ms (min)")
            rows.append({"experiment": f"node_probabilities threads {cur} vs {default_threads}",
                         "current_ms": dflt, "alternative_ms": one})
        results["trees"][name] = rows
    torch.set_num_threads(default_threads)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
