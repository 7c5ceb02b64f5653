#!/usr/bin/env python
"""Jaccard on a GPU in one short run: the Triton kernel of ``hdecode::jaccard_sets`` against its torch
implementation and against the CPU plan's decisions, and their timings.

    python -m benchmarks.jaccard_gpu_check                       # both bundled trees, B = 1, 256, 4096, 40737
    python -m benchmarks.jaccard_gpu_check --batch-sizes 1,256 --json out.json

For each bundled tree and batch size (float32 rows of ``benchmarks.latency``):

- decisions: the CPU plan on CPU tensors (the reference), the GPU plan on CUDA with the Triton kernel
  and with the torch implementation (``set_triton_enabled(False)``): rows that differ from the
  reference, and the largest gap in float64 expected Jaccard between the two sets of such a row
  (a row that differs only between sets within rounding of each other is a tie, not an error);
- the op alone, on the GPU plan's own arguments: the kernel's (B, C) sets against the torch
  implementation's on the same CUDA tensors;
- times (median, CUDA-synchronized, after warm-up): the whole GPU-plan decode with either
  implementation, the op alone with either, and the CPU plan on the CPU;
- operators: the ATen operators and CUDA kernels one GPU-plan decode launches (torch.profiler), and
  those inside the op, with the Triton kernel.

Without CUDA it runs the CPU parts (the CPU plan against the GPU plan's torch implementation on CPU
tensors, and their times) and says that the CUDA parts were skipped; ``--device interpret`` with
TRITON_INTERPRET=1 runs the CUDA parts on CPU tensors with the interpreted kernel (a dry run).
Exit status 1 when a CUDA decision differs from the CPU plan's by more than rounding, or the op's two
implementations differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if __package__ in (None, ""):  # `python benchmarks/jaccard_gpu_check.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from benchmarks.latency import _probs  # noqa: E402
from benchmarks.workloads import load_tree  # noqa: E402

__all__ = ["check", "main"]

#: Rows whose two sets' expected Jaccard differ by at most this are ties decided by rounding.
TIE_GAP = 1e-9


def _median_ms(fn, min_time: float, sync, max_calls: int = 200) -> float:
    for _ in range(2):
        fn()
    sync()
    times, spent = [], 0.0
    while (spent < min_time or len(times) < 5) and len(times) < max_calls:
        sync()
        t = time.perf_counter()
        fn()
        sync()
        d = time.perf_counter() - t
        times.append(d)
        spent += d
    return 1e3 * statistics.median(times)


def op_args(metric, p):
    """The arguments the GPU plan's decoder passes to ``hdecode::jaccard_sets`` for rows ``p``."""
    from hdecode_torch.metrics import jaccard as J

    seen = []
    op = J.jaccard_sets

    def spy(*args):
        seen.append(args)
        return op(*args)
    J.jaccard_sets = spy
    try:
        with hd.plan_for("cuda"):
            metric.decode(p)
    finally:
        J.jaccard_sets = op
    return seen[-1]


def _differing(metric, p, sets, ref) -> dict:
    rows = (sets != ref).any(1).nonzero()[:, 0]
    gap = 0.0
    if rows.numel():
        a = metric.expected(p[rows].double().cpu(), sets[rows].cpu())
        b = metric.expected(p[rows].double().cpu(), ref[rows].cpu())
        gap = float((a - b).abs().max())
    return {"rows": int(rows.numel()), "max_value_gap": gap}


def check(tree: str, batch: int, min_time: float, device: str, cpu_time_max: int = 4096) -> dict:
    """Decisions, times and operator counts of one (tree, batch); see the module docstring.

    ``device``: "cuda", "cpu" (the CPU parts only) or "interpret" (the CUDA parts on CPU tensors, the
    kernel run by Triton's interpreter in place of the CUDA dispatch: a dry run of this script, needs
    TRITON_INTERPRET=1 and small batches).  The CPU plan is timed, and the GPU plan run on the CPU, up
    to ``cpu_time_max`` rows (beyond, the CPU plan runs once, for the reference decisions).
    """
    from hdecode_torch.kernels import fused as F
    from hdecode_torch.kernels.fused.jaccard_sets import jaccard_sets_torch
    from hdecode_torch.metrics import jaccard as J

    h, _ = load_tree(tree)
    metric = hd.get_metric("jaccard", h)
    p = _probs(h, batch)
    out = {"tree": tree, "batch": batch}
    with hd.plan_for("cpu"):
        ref = metric.decode(p)
        if batch <= cpu_time_max:
            out["cpu_plan_ms"] = _median_ms(lambda: metric.decode(p), min_time, lambda: None)
    if batch <= cpu_time_max:
        with hd.plan_for("cuda"):
            gpu_plan_on_cpu = metric.decode(p)
            out["gpu_plan_on_cpu_ms"] = _median_ms(lambda: metric.decode(p), min_time, lambda: None)
        out["gpu_plan_on_cpu_vs_cpu"] = _differing(metric, p, gpu_plan_on_cpu, ref)
    if device == "cpu":
        out["cuda"] = "skipped: no CUDA device"
        return out
    from hdecode_torch.kernels.fused.jaccard_sets import triton as JT

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    pc = p.cuda() if cuda else p.clone()
    hc = h.to("cuda") if cuda else h
    mc = hd.get_metric("jaccard", hc)
    op = J.jaccard_sets
    for name, enabled in (("triton", True), ("torch", False)):
        F.set_triton_enabled(enabled)
        if enabled and not cuda:  # the dry run: the interpreted kernel where CUDA would dispatch to it
            J.jaccard_sets = JT.launch
        try:
            with hd.plan_for("cuda"):
                sets = mc.decode(pc)
                out[f"{name}_decode_ms"] = _median_ms(lambda: mc.decode(pc), min_time, sync)
        finally:
            F.set_triton_enabled(True)
            J.jaccard_sets = op
        out[f"{name}_vs_cpu"] = _differing(metric, p, sets.cpu(), ref)
    args = op_args(mc, pc)
    out["op_shape"] = list(args[0].shape)
    kernel = JT.launch(*args)
    fallback = jaccard_sets_torch(*args)
    out["op_kernel_equals_torch"] = bool(torch.equal(kernel, fallback))
    out["op_rows_differing"] = int((kernel != fallback).any(1).sum())
    out["op_triton_ms"] = _median_ms(lambda: JT.launch(*args), min_time, sync)
    out["op_torch_ms"] = _median_ms(lambda: jaccard_sets_torch(*args), min_time, sync)
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])

    def profiled(fn) -> tuple[int, int]:
        fn()
        sync()
        with profile(activities=acts) as prof:
            fn()
            sync()
        events = prof.events()
        aten = sum(1 for e in events if e.name.startswith("aten::"))
        kernels = sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        return aten, kernels

    with hd.plan_for("cuda"):
        out["decode_aten_ops"], out["decode_cuda_kernels"] = profiled(lambda: mc.decode(pc))
    out["op_aten_ops"], out["op_cuda_kernels"] = profiled(lambda: JT.launch(*args))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default="tiered,inat")
    ap.add_argument("--batch-sizes", default="1,256,4096,40737")
    ap.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpu-time-max", type=int, default=4096, help="largest batch timed on the CPU")
    ap.add_argument("--device", choices=["cuda", "cpu", "interpret"], default=None,
                    help="default: cuda when available, else cpu; interpret: a dry run (TRITON_INTERPRET=1)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__,
              "device": torch.cuda.get_device_name() if device == "cuda" else f"{device} (no GPU)", "results": []}
    bad = False
    for tree in args.trees.split(","):
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            try:
                r = check(tree, batch, args.min_time, device, args.cpu_time_max)
            except Exception as err:  # report it and go on: one run must bring back every other figure
                r = {"tree": tree, "batch": batch, "error": f"{type(err).__name__}: {err}"}
                bad = True
            report["results"].append(r)
            print(json.dumps(r), flush=True)
            if "error" in r:
                continue
            if device != "cpu":
                bad |= not r["op_kernel_equals_torch"]
                bad |= any(r[f"{n}_vs_cpu"]["max_value_gap"] > TIE_GAP for n in ("triton", "torch"))
            if "gpu_plan_on_cpu_vs_cpu" in r:
                bad |= r["gpu_plan_on_cpu_vs_cpu"]["max_value_gap"] > TIE_GAP
    report["ok"] = not bad
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print("ok" if not bad else "FAILED: a decision differs beyond rounding, or the op's implementations differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
