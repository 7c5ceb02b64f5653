#!/usr/bin/env python
"""Benchmark every decoder of hdecode_torch against per-sample NumPy baselines, after checking both agree.

    python -m benchmarks.run                      # full run (bundled trees, then the large synthetic trees)
    python -m benchmarks.run --quick              # a few minutes: fewer samples, repeats and batch sizes
    python benchmarks/run.py --trees tiered --batch-sizes 4000 --device cpu --json out.json

See benchmarks/README.md for what is measured and how to read the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time
from dataclasses import dataclass, field

if __package__ in (None, ""):  # `python benchmarks/run.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The per-sample baselines are single-threaded: keep NumPy's BLAS (matrix-vector products of the
# lca_height / Wu-Palmer / Zhao baselines) on one thread too.  Multi-threaded gemv on small
# matrices only adds contention (a 1010×1010 gemv took 15 ms instead of ~0.2 ms on a busy machine).
# Only effective when NumPy is not imported yet (the usual `python -m benchmarks.run`).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from hdecode_torch.core.spec import label  # noqa: E402
from benchmarks.baselines import NODE_METRICS, SET_METRICS, Baselines, expected_score  # noqa: E402
from hdecode_torch.core.registry import resolve_hook  # noqa: E402
from benchmarks.measure import cpu_model, measure_bandwidth, memory_profile, table_bandwidth, time_call  # noqa: E402
from benchmarks.workloads import SYNTHETIC, TREE_ALIASES, label_matches, load_tree, model_like_probs  # noqa: E402

DEFAULT_TREES = ["tieredimagenet-h", "inat19", "synthetic-100k", "synthetic-1m"]
LARGE_NODES = 50_000  # trees above this get the "scale" treatment (B = --large-batch-sizes, memory checks)
RSS_LIMIT = 6 * 2**30
DENSE_BASELINE_LIMIT = 2 * 2**30  # a baseline needing a bigger dense table is skipped
SPEEDUP_TARGET, SPEEDUP_MOONSHOT = 100.0, 1000.0
SCORE_RTOL = 1e-6  # optimal decoders: library and baseline expected scores agree to this relative tolerance
HEURISTIC_AGREEMENT = 0.99  # heuristics: fraction of identical predictions (float32 vs float64 near-ties)
NODE_PROB_ATOL = 1e-5



def timed_settings(cls) -> list[dict]:
    """The settings a metric or decoder is timed at: those the command line runs, from its declared
    options (a swept parameter at each value of its sweep, others at the option's default; a default that
    depends on the tree stays a function of it, :meth:`Spec.resolved`)."""
    settings = [{}]
    for p in cls.PARAMS:
        if p.flag is not None:
            values = p.flag.sweep or [p.flag.default if callable(p.flag.default) else p.flag.default_for(p, None)]
            settings = [{**s, p.name: v} for s in settings for v in values]
    return settings


def _key(name: str, params: dict) -> str:
    if not params:
        return name
    return name + "[" + ",".join(f"{k}={v.__name__ if callable(v) else format(v, 'g')}" for k, v in params.items()) + "]"


@dataclass
class Spec:
    key: str
    kind: str  # "kernel" | "optimal" | "heuristic"
    name: str  # metric name (optimal), decoder name (heuristic), or "node_probabilities"
    params: dict = field(default_factory=dict)  # a value that depends on the tree: a function of it
    out: str = "node"  # "node" ids, "set" bool masks, "table" (N,) floats
    cls: type | None = None  # the metric or decoder class, whose declarations give its baseline and direction

    def library(self, h):
        """The library call for this spec on hierarchy ``h``: fn(probs tensor) -> output tensor."""
        if self.kind == "kernel":
            return lambda x: hd.node_probabilities(h, x)
        params = self.resolved(h)
        if self.kind == "optimal":
            m = hd.get_metric(self.name, h, **params)
            return m.decode
        d = hd.get_decoder(self.name, h, **params)
        return d.decode

    def resolved(self, h) -> dict:
        return {k: v(h) if callable(v) else v for k, v in self.params.items()}


def discover_specs(only: list[str] | None = None) -> list[Spec]:
    """node_probabilities, every metric with a decoder (with its parameter grid), every heuristic."""
    tiny, _ = load_tree("synthetic-tiny")
    x = torch.full((1, tiny.num_leaves), 1.0 / tiny.num_leaves)
    specs = [Spec("node_probabilities", "kernel", "node_probabilities", out="table")]
    for name in hd.list_metrics():
        cls = hd.metrics.metric_class(name)
        if not cls.has_decoder:
            continue  # a metric without an exact decoder
        for params in timed_settings(cls):
            m = hd.get_metric(name, tiny, **{k: v(tiny) if callable(v) else v for k, v in params.items()})
            m.decode(x)
            specs.append(Spec(label(m, "optimal"), "optimal", name, params, "set" if m.kind == "set" else "node",
                              cls))
    for name in hd.list_decoders():
        if name == "optimal":
            continue
        cls = hd.decoders.decoder_class(name)
        for params in timed_settings(cls):
            specs.append(Spec(_key(name, params), "heuristic", name, params, cls=cls))
    if only:
        specs = [s for s in specs if any(label_matches(o, s.key) for o in only)]
    return specs


# --------------------------------------------------------------------------- baselines + checks
NO_TRAVERSAL = {"accuracy", "lca_height", "crm", "argmax_leaf"}  # baselines that need no node sums


def _timed_loop(fn, p64, k: int, repeats: int):
    """Run ``fn`` on samples 0..k-1, ``repeats`` times; per-sample time = its fastest run (drops preemption spikes)."""
    best = np.full(k, np.inf)
    preds = [None] * k
    for _ in range(max(1, repeats)):
        for i in range(k):
            t = time.perf_counter()
            preds[i] = fn(p64[i])
            best[i] = min(best[i], time.perf_counter() - t)
    return preds, best


class TreeBench:
    """One tree: hierarchy, baselines, inputs, and the cached baseline predictions/timings."""

    def __init__(self, name: str, args):
        self.name = TREE_ALIASES.get(name, name)
        self.h, self.build_s = load_tree(self.name)
        self.large = self.h.num_nodes > LARGE_NODES
        t0 = time.perf_counter()
        self.bl = Baselines(self.h.parents_list)
        self.bl_py = self.bl.with_traversal("python")
        self.tables_s = time.perf_counter() - t0
        self.batch_sizes = args.large_batch_sizes if self.large else args.batch_sizes
        self.cuda_batch_sizes = args.large_batch_sizes if self.large else args.cuda_batch_sizes
        bmax = max(self.batch_sizes + (self.cuda_batch_sizes if args.uses_cuda else []))
        self.k_check = min(bmax, args.large_baseline_samples if self.large else args.baseline_samples)
        self.k_py = min(self.k_check, args.python_baseline_samples)
        self.base_repeats = 1 if self.large else args.baseline_repeats
        t = self.bl.t
        self.probs = model_like_probs(t.ancestors, t.depth, t.num_leaves, bmax, seed=args.seed)
        self.p64 = self.probs[: self.k_check].astype(np.float64)
        self.base: dict[str, dict] = {}

    def info(self) -> dict:
        st = self.h.statistics()
        return {"num_nodes": st["num_nodes"], "num_leaves": st["num_leaves"], "max_depth": st["max_depth"],
                "min_leaf_depth": st["min_leaf_depth"], "single_child_nodes": st["num_single_child_nodes"],
                "build_s": round(self.build_s, 4), "baseline_tables_s": round(self.tables_s, 4),
                "synthetic": self.name in SYNTHETIC, "N_times_L_float32_bytes": 4 * st["num_nodes"] * st["num_leaves"]}

    def baseline(self, spec: Spec) -> dict:
        """Run (and time) the per-sample baseline on the check subset, once per spec."""
        if spec.key in self.base:
            return self.base[spec.key]
        res: dict = {}
        need = self.bl.dense_bytes(spec.name)
        if need > DENSE_BASELINE_LIMIT:
            res["skipped"] = f"baseline needs a dense {'N×L' if spec.name in ('wu_palmer', 'zhao') else 'L×L'} table ({need / 2**30:.0f} GiB)"
            self.base[spec.key] = res
            return res
        params = spec.resolved(self.h) if spec.kind != "kernel" else {}
        if spec.kind == "kernel":
            fn, fn_py = self.bl.node_probs, self.bl_py.node_probs
        elif spec.cls.baseline is None:
            res["skipped"] = f"{spec.name} declares no per-sample baseline"
            self.base[spec.key] = res
            return res
        else:  # the per-sample decoder its class declares, f(baselines, leaf_probs, **params)
            hook = resolve_hook(spec.cls.baseline)
            fn = lambda pl, _f=hook, _b=self.bl: _f(_b, pl, **params)  # noqa: E731
            fn_py = lambda pl, _f=hook, _b=self.bl_py: _f(_b, pl, **params)  # noqa: E731
        t0 = time.perf_counter()
        fn(self.p64[0])  # builds the tree-only tables (cost matrices, thresholds): not timed, as in the paper
        res["tables_s"] = time.perf_counter() - t0
        preds, per_sample = _timed_loop(fn, self.p64, self.k_check, self.base_repeats)
        res["us_per_sample"] = 1e6 * float(np.mean(per_sample))
        res["samples"] = self.k_check
        res["repeats"] = self.base_repeats
        uses_traversal = spec.name not in NO_TRAVERSAL
        if self.k_py and uses_traversal and not (self.large and spec.kind != "kernel"):
            k = max(1, min(self.k_py, 4) if self.large else self.k_py)
            _, per_sample = _timed_loop(fn_py, self.p64, k, 1)
            res["py_us_per_sample"] = 1e6 * float(np.mean(per_sample))
            res["py_samples"] = k
        res["preds"] = preds
        self.base[spec.key] = res
        return res

    def check(self, spec: Spec, lib_out) -> dict:
        """Compare library outputs on the check subset with the baseline's."""
        base = self.baseline(spec)
        if "skipped" in base:
            return {"status": "skipped", "detail": base["skipped"]}
        out = lib_out.detach().cpu().numpy()
        preds = base["preds"]
        k = len(preds)
        t = self.bl.t
        if spec.kind == "kernel":
            err = max(float(np.abs(out[i].astype(np.float64) - preds[i]).max()) for i in range(k))
            ok = err <= NODE_PROB_ATOL
            return {"status": "pass" if ok else "FAIL", "detail": f"max |Δp| = {err:.2e} (≤ {NODE_PROB_ATOL:g})", "samples": k}
        if spec.kind == "heuristic":
            agree = sum(int(out[i]) == int(preds[i]) for i in range(k))
            ok = agree >= HEURISTIC_AGREEMENT * k
            return {"status": "pass" if ok else "FAIL", "detail": f"{agree}/{k} identical predictions", "samples": k}
        params = spec.resolved(self.h)
        if spec.name in NODE_METRICS or spec.name in SET_METRICS:  # the baselines' own NumPy scoring
            def score(pred, p):
                return expected_score(t, spec.name, pred, p, **params)
        else:  # a metric the baselines do not know: the library's float64 expected value, for both sides
            metric = hd.get_metric(spec.name, self.h, **params)

            def score(pred, p):
                pred = torch.as_tensor(np.asarray(pred))[None]
                return float(metric.expected(torch.from_numpy(p)[None], pred)[0])
        worst, bad = 0.0, []
        for i in range(k):
            pred = out[i]
            if spec.out == "set":
                closed = bool(pred[t.root]) and bool(np.all(pred[t.parent[pred & (t.parent >= 0)]]))
                if not closed:
                    bad.append((i, "set not ancestor-closed"))
                    continue
            a = score(pred, self.p64[i])
            b = score(preds[i], self.p64[i])
            rel = abs(a - b) / max(abs(a), abs(b), 1e-12)
            worst = max(worst, rel)
            if rel > SCORE_RTOL:
                better = (a > b) == spec.cls.higher_is_better
                bad.append((i, f"library {a:.9g} vs baseline {b:.9g} ({'library better: baseline bug' if better else 'library worse'})"))
        status = "pass" if not bad else "FAIL"
        detail = f"max rel. diff of expected score {worst:.1e} (≤ {SCORE_RTOL:g})"
        if bad:
            detail += f"; {len(bad)} mismatches, first: sample {bad[0][0]}: {bad[0][1]}"
        return {"status": status, "detail": detail, "samples": k}


# --------------------------------------------------------------------------- main loop
def out_bytes(spec: Spec, h, b: int) -> int:
    if spec.out == "set":
        return b * h.num_nodes  # bool mask
    if spec.out == "table":
        return 4 * b * h.num_nodes
    return 8 * b


def fmt(x, spec="{:.1f}"):
    return "-" if x is None else spec.format(x)


def fmt_mb(b):
    return "-" if b is None else f"{b / 2**20:.0f}"


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    devices = []
    for d in args.device.split(","):
        if d == "all":
            devices += ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
        elif d == "cuda" and not torch.cuda.is_available():
            print("[note] CUDA requested but not available: skipped", file=sys.stderr)
        else:
            devices.append(d)
    devices = [torch.device(d) for d in dict.fromkeys(devices)]
    args.uses_cuda = any(d.type == "cuda" for d in devices)
    if args.backend != "torch":
        hd.set_backend(args.backend)
    specs = discover_specs(args.decoders)
    meta = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__, "hdecode_torch": hd.__version__, "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "plan": getattr(args, "plan", None),
        "devices": [str(d) for d in devices], "backend": hd.get_backend(),
        "numpy_blas_threads_env": os.environ.get("OPENBLAS_NUM_THREADS"),
        "torch_scatter": hd.kernels.scatter_available(), "validate": not args.no_validate,
        "args": {k: v for k, v in vars(args).items()},
    }
    if torch.cuda.is_available():
        meta["cuda_device"] = torch.cuda.get_device_name()
        meta["cuda_version"] = torch.version.cuda
    bandwidth = {}
    for d in devices:
        bw = measure_bandwidth(d)
        bandwidth[str(d)] = {"measured_copy_Bps": bw}
        if d.type == "cuda":
            bandwidth[str(d)]["table_peak_Bps"] = table_bandwidth(torch.cuda.get_device_name(d))
    print(f"hdecode_torch benchmark  {meta['date']}  torch {meta['torch']}  CPU: {meta['cpu_model']} "
          f"({meta['cpu_count']} cores, {meta['torch_threads']} torch threads)  devices: {meta['devices']}  "
          f"load avg: {meta['load_average_at_start']}")
    for d, bw in bandwidth.items():
        print(f"  {d}: measured copy bandwidth {bw['measured_copy_Bps'] / 1e9:.1f} GB/s"
              + (f" (table peak {bw['table_peak_Bps'] / 1e12:.2f} TB/s)" if bw.get("table_peak_Bps") else ""))

    result = {"meta": meta, "bandwidth": bandwidth, "trees": {}, "checks": [], "rows": [], "backend_rows": [],
              "targets": []}
    for tree_name in args.trees:
        t0 = time.perf_counter()
        tb = TreeBench(tree_name, args)
        result["trees"][tb.name] = info = tb.info()
        print(f"\n=== {tb.name}: N={info['num_nodes']} L={info['num_leaves']} depth={info['max_depth']} "
              f"(hierarchy build {tb.build_s:.2f} s; inputs + baseline tables {time.perf_counter() - t0:.1f} s)"
              + ("  [scale section]" if tb.large else ""))
        rows = []
        for dev in devices:
            h = tb.h.to(dev)
            fns = {s.key: s.library(h) for s in specs}
            # 1. correctness before timing, on the first k_check samples
            xs = torch.from_numpy(tb.probs[: tb.k_check]).to(dev)
            for s in specs:
                try:
                    chk = tb.check(s, fns[s.key](xs))
                except Exception as exc:  # a crash is a failed check, not a crashed benchmark
                    chk = {"status": "FAIL", "detail": f"error: {exc!r}"}
                chk.update({"tree": tb.name, "device": str(dev), "decoder": s.key, "kind": "correctness"})
                result["checks"].append(chk)
                if chk["status"] == "FAIL":
                    print(f"  CHECK FAILED {s.key} on {dev}: {chk['detail']}")
            # 2. timing
            for b in (tb.cuda_batch_sizes if dev.type == "cuda" else tb.batch_sizes):
                x = torch.from_numpy(tb.probs[:b]).to(dev)
                for s in specs:
                    fn = fns[s.key]
                    call = (lambda: fn(x, validate=False)) if (args.no_validate and s.kind != "kernel") else (lambda: fn(x))
                    reps = 3 if tb.large else args.repeats
                    try:
                        tm = time_call(call, dev, repeats=reps, min_time=0.0 if tb.large else args.min_time)
                    except Exception as exc:
                        print(f"  ERROR timing {s.key} B={b} on {dev}: {exc!r}")
                        result["checks"].append({"tree": tb.name, "device": str(dev), "decoder": s.key,
                                                 "kind": "runs", "status": "FAIL", "detail": repr(exc)})
                        continue
                    row = {"tree": tb.name, "device": str(dev), "batch": b, "decoder": s.key, "kind": s.kind,
                           "backend": hd.get_backend(), **tm,
                           "us_per_sample": 1e6 * tm["median_s"] / b, "samples_per_s": b / tm["median_s"]}
                    if not args.no_memory:
                        row.update(memory_profile(call, dev))
                    base = tb.base.get(s.key, {})
                    if "us_per_sample" in base:
                        row["baseline_us_per_sample"] = base["us_per_sample"]
                        row["baseline_samples"] = base["samples"]
                        row["speedup"] = base["us_per_sample"] / row["us_per_sample"]
                    if "py_us_per_sample" in base:
                        row["baseline_py_us_per_sample"] = base["py_us_per_sample"]
                        row["speedup_py"] = base["py_us_per_sample"] / row["us_per_sample"]
                    if "skipped" in base:
                        row["baseline_skipped"] = base["skipped"]
                    fb = 4 * b * tb.h.num_leaves + out_bytes(s, tb.h, b)
                    bw = bandwidth[str(dev)]["measured_copy_Bps"]
                    row["floor_bytes"] = fb
                    row["floor_s"] = fb / bw
                    row["floor_ratio"] = tm["median_s"] / row["floor_s"]
                    if dev.type == "cuda" and bandwidth[str(dev)].get("table_peak_Bps"):
                        row["floor_ratio_table_bw"] = tm["median_s"] / (fb / bandwidth[str(dev)]["table_peak_Bps"])
                    rows.append(row)
                    if tb.large and not args.no_memory:
                        nl = 4 * tb.h.num_nodes * tb.h.num_leaves
                        mem_ok = row.get("max_alloc_bytes", 0) < nl and (row.get("rss_peak_bytes") or 0) < RSS_LIMIT
                        result["checks"].append({
                            "tree": tb.name, "device": str(dev), "decoder": s.key, "batch": b, "kind": "memory",
                            "status": "pass" if mem_ok else "FAIL",
                            "detail": f"largest allocation {fmt_mb(row.get('max_alloc_bytes'))} MiB vs N·L·4 = "
                                      f"{nl / 2**30:.0f} GiB; peak RSS {fmt_mb(row.get('rss_peak_bytes'))} MiB "
                                      f"(limit {RSS_LIMIT / 2**30:.0f} GiB)"})
                print_rows([r for r in rows if r["batch"] == b and r["device"] == str(dev)], tb, result["checks"])
        result["rows"] += rows
        if args.backend_compare and hd.kernels.scatter_available() and any(d.type == "cpu" for d in devices):
            result["backend_rows"] += backend_compare(tb, specs, args)
        del tb
    summarize(result)
    return result


def print_rows(rows, tb, checks):
    if not rows:
        return
    r0 = rows[0]
    status = {(c["decoder"], c["device"]): c["status"] for c in checks
              if c["tree"] == tb.name and c["kind"] == "correctness"}
    memst = {(c["decoder"], c["device"]): c["status"] for c in checks if c["tree"] == tb.name and c["kind"] == "memory"
             and c.get("batch") == r0["batch"]}
    print(f"\n  {tb.name}  device={r0['device']}  B={r0['batch']}  backend={r0['backend']}  "
          f"torch threads={torch.get_num_threads()}")
    hdr = (f"  {'decoder':34s} {'µs/sample':>10s} {'samples/s':>11s} {'peak MiB':>8s} {'maxalloc':>8s} {'RSS MiB':>8s}"
           f" {'np µs':>9s} {'speed-up':>8s} {'py µs':>9s} {'vs py':>7s} {'floor×':>8s}  check")
    print(hdr)
    for r in rows:
        chk = status.get((r["decoder"], r["device"]), "-")
        if (r["decoder"], r["device"]) in memst:
            chk += "/mem " + memst[(r["decoder"], r["device"])]
        if r.get("baseline_skipped"):
            chk += " (no baseline)"
        print(f"  {r['decoder']:34s} {r['us_per_sample']:10.2f} {r['samples_per_s']:11.0f} "
              f"{fmt_mb(r.get('tensor_peak_bytes')):>8s} {fmt_mb(r.get('max_alloc_bytes')):>8s} "
              f"{fmt_mb(r.get('rss_peak_bytes')):>8s} {fmt(r.get('baseline_us_per_sample')):>9s} "
              f"{fmt(r.get('speedup'), '{:.1f}×'):>8s} {fmt(r.get('baseline_py_us_per_sample')):>9s} "
              f"{fmt(r.get('speedup_py'), '{:.0f}×'):>7s} {fmt(r.get('floor_ratio'), '{:.0f}'):>8s}  {chk}")
    sys.stdout.flush()


def backend_compare(tb: TreeBench, specs: list[Spec], args) -> list[dict]:
    """CPU, largest batch: every spec with the torch and the torch-scatter backend (same inputs, same outputs)."""
    dev = torch.device("cpu")
    b = max(tb.batch_sizes)
    x = torch.from_numpy(tb.probs[:b])
    sel = [s for s in specs if s.kind == "kernel"] if tb.large else specs
    out = []
    prev = hd.get_backend()
    print(f"\n  torch-scatter backend vs torch, {tb.name}, CPU, B={b}")
    print(f"  {'decoder':34s} {'torch µs/s':>10s} {'scatter µs/s':>12s} {'scatter/torch':>13s}  same output")
    try:
        for s in sel:
            res, outs = {}, {}
            for be in ("torch", "scatter"):
                hd.set_backend(be)
                fn = s.library(tb.h)
                outs[be] = fn(x)
                res[be] = time_call(lambda: fn(x), dev, repeats=3 if tb.large else args.repeats,
                                    min_time=0.0 if tb.large else args.min_time)
            same = bool(torch.equal(outs["torch"], outs["scatter"])) if s.kind != "kernel" else \
                bool(torch.allclose(outs["torch"], outs["scatter"], atol=1e-6))
            row = {"tree": tb.name, "batch": b, "decoder": s.key,
                   "torch_us_per_sample": 1e6 * res["torch"]["median_s"] / b,
                   "scatter_us_per_sample": 1e6 * res["scatter"]["median_s"] / b,
                   "same_output": same}
            row["scatter_over_torch"] = row["scatter_us_per_sample"] / row["torch_us_per_sample"]
            out.append(row)
            print(f"  {s.key:34s} {row['torch_us_per_sample']:10.2f} {row['scatter_us_per_sample']:12.2f} "
                  f"{row['scatter_over_torch']:13.2f}  {same}")
    finally:
        hd.set_backend(prev)
    return out


def summarize(result: dict) -> None:
    """Targets: CPU float32, largest batch, bundled trees — every optimal decoder ≥ 100× the per-sample baseline."""
    rows = [r for r in result["rows"] if r["device"] == "cpu" and r["kind"] == "optimal"
            and not result["trees"][r["tree"]]["synthetic"]]
    if rows:
        print("\n=== Targets (CPU float32, largest batch per bundled tree): optimal decoder vs per-sample NumPy")
        print("  baseline speed-ups are per sample; baselines ran on a subset of samples and are extrapolated per sample")
        print(f"  {'tree':18s} {'B':>5s} {'decoder':28s} {'vs numpy':>9s} {'vs py-trav':>10s}  ≥100×  ≥1000×")
    for tree in dict.fromkeys(r["tree"] for r in rows):
        bmax = max(r["batch"] for r in rows if r["tree"] == tree)
        for r in rows:
            if r["tree"] != tree or r["batch"] != bmax or "speedup" not in r:
                continue
            t = {"tree": tree, "batch": bmax, "decoder": r["decoder"], "speedup": r["speedup"],
                 "speedup_py": r.get("speedup_py"), "meets_100x": r["speedup"] >= SPEEDUP_TARGET,
                 "meets_1000x": r["speedup"] >= SPEEDUP_MOONSHOT}
            result["targets"].append(t)
            print(f"  {tree:18s} {bmax:5d} {r['decoder']:28s} {r['speedup']:8.1f}× {fmt(r.get('speedup_py'), '{:.0f}×'):>10s}"
                  f"  {'yes' if t['meets_100x'] else 'no':>5s}  {'yes' if t['meets_1000x'] else 'no':>6s}")
    fails = [c for c in result["checks"] if c["status"] == "FAIL"]
    n = len(result["checks"])
    skipped = sum(c["status"] == "skipped" for c in result["checks"])
    print(f"\n=== Checks: {n - len(fails) - skipped} passed, {len(fails)} failed, {skipped} skipped (no feasible baseline)")
    for c in fails:
        print(f"  FAIL {c['kind']} {c['tree']} {c['device']} {c['decoder']}: {c['detail']}")
    result["all_checks_passed"] = not fails


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer samples/repeats, B=256 only, bundled trees only")
    ap.add_argument("--device", default="all", help="cpu, cuda, or all (default: cpu + cuda when present)")
    ap.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes for the bundled trees (default 256,4000)")
    ap.add_argument("--cuda-batch-sizes", default=None,
                    help="batch sizes for the bundled trees on CUDA (default 256,4000,65536)")
    ap.add_argument("--large-batch-sizes", default=None, help="batch sizes for trees with > 50k nodes (default 64)")
    ap.add_argument("--trees", default=None,
                    help="comma-separated: tieredimagenet-h (tiered), inat19 (inat), synthetic-100k (100k), "
                         "synthetic-1m (1m), synthetic-tiny (default: all but tiny; --quick: tiered,inat)")
    ap.add_argument("--decoders", default=None, help="comma-separated substrings of decoder keys to run (default: all)")
    ap.add_argument("--baseline-samples", type=int, default=None, help="samples the per-sample baselines run on (default 200)")
    ap.add_argument("--large-baseline-samples", type=int, default=None, help="same, for the large trees (default 8)")
    ap.add_argument("--python-baseline-samples", type=int, default=None,
                    help="samples for the paper-style (Python loop over nodes) baseline (default 50; 0 = off)")
    ap.add_argument("--baseline-repeats", type=int, default=3,
                    help="runs of the baseline over its samples; each sample counts its fastest run (default 3)")
    ap.add_argument("--repeats", type=int, default=None, help="minimum timed repeats (default 5)")
    ap.add_argument("--min-time", type=float, default=None, help="minimum seconds of timed repeats per row (default 0.5)")
    ap.add_argument("--no-memory", action="store_true", help="skip the (profiled) memory pass")
    ap.add_argument("--no-validate", action="store_true", help="time decoders with validate=False")
    ap.add_argument("--backend", default="torch", choices=["torch", "scatter"], help="segment backend for the main rows")
    ap.add_argument("--no-backend-compare", dest="backend_compare", action="store_false",
                    help="skip the torch-scatter vs torch comparison (run when torch-scatter is installed)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads (default: 1, which the table header prints: on a shared or busy "
                         "machine more threads wait for each other at every operator and the medians mean nothing; "
                         "0 = torch's choice, one per core, for an idle machine)")
    ap.add_argument("--plan", default=None, choices=["cpu", "cuda"],
                    help="make every device-dependent choice as for this device (hd.plan_for), whatever the device "
                         "timed: e.g. --plan cuda times the GPU plan on the CPU (default: each device's own plan)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the results here (default benchmarks/results/<date>.json)")
    a = ap.parse_args(argv)
    q = a.quick
    a.batch_sizes = [int(x) for x in (a.batch_sizes or ("256" if q else "256,4000")).split(",")]
    a.cuda_batch_sizes = [int(x) for x in (a.cuda_batch_sizes or ("4000" if q else "256,4000,65536")).split(",")]
    a.large_batch_sizes = [int(x) for x in (a.large_batch_sizes or "64").split(",")]
    a.trees = [TREE_ALIASES.get(t, t) for t in (a.trees or ("tiered,inat" if q else ",".join(DEFAULT_TREES))).split(",")]
    a.decoders = a.decoders.split(",") if a.decoders else None
    a.baseline_samples = a.baseline_samples if a.baseline_samples is not None else (50 if q else 200)
    a.large_baseline_samples = a.large_baseline_samples if a.large_baseline_samples is not None else (4 if q else 8)
    a.python_baseline_samples = a.python_baseline_samples if a.python_baseline_samples is not None else (10 if q else 50)
    a.repeats = a.repeats if a.repeats is not None else (3 if q else 5)
    a.min_time = a.min_time if a.min_time is not None else (0.0 if q else 0.5)
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    threads, backend = torch.get_num_threads(), hd.get_backend()
    import contextlib

    try:
        with hd.plan_for(args.plan) if args.plan else contextlib.nullcontext():
            result = run(args)
    finally:  # leave the process as we found it (the smoke test calls main() in-process)
        torch.set_num_threads(threads)
        hd.set_backend(backend)
    path = args.json
    if path is None:
        os.makedirs(os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"), exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"bench-{stamp}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\nresults written to {path}")
    return 0 if result["all_checks_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
