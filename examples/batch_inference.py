"""Decode a large array of leaf probabilities on the GPU (or CPU), chunk by chunk, for several metrics.

The probabilities live in host memory (a ``.npy`` file, memory-mapped, or a synthetic
array); each chunk is copied to the device once, checked once, and its node sums
(a :class:`~hdecode_torch.Posterior`) are shared by every metric's optimal decoder.
Node predictions come back as int64 ids, set predictions as bit-packed (B, ceil(N/8))
uint8 rows.  Timings per metric and the overall throughput are printed; progress (each
chunk, each metric) goes to standard error as the work runs.

    python examples/batch_inference.py                               # 100k synthetic rows, auto device
    python examples/batch_inference.py --samples 5000 --chunk-size 1024
    python examples/batch_inference.py --input probs.npy --output preds.npz
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

import hdecode_torch as hd

METRICS = ["accuracy", "tree_distance", "wu_palmer", "zhao", "hf_beta[beta=0.5]", "hamming"]


def synthetic_probabilities(num_leaves: int, samples: int, temperature: float, seed: int) -> np.ndarray:
    """(samples, L) float32 softmax of Gaussian logits; lower temperature = more peaked rows."""
    rng = np.random.default_rng(seed)
    out = np.empty((samples, num_leaves), dtype=np.float32)
    for a in range(0, samples, 65536):  # bounded temporaries
        z = rng.standard_normal((min(samples, a + 65536) - a, num_leaves), dtype=np.float32) / temperature
        z = np.exp(z - z.max(1, keepdims=True))
        out[a:a + len(z)] = z / z.sum(1, keepdims=True)
    return out


def status(text: str, line: bool = False) -> None:
    """Progress on standard error: rewritten in place on a terminal; elsewhere only the lines (``line``)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + text + ("\n" if line else ""))
    elif line:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", help=".npy file of (n, L) probabilities (memory-mapped); default: synthetic")
    ap.add_argument("--samples", type=int, default=100_000, help="synthetic rows")
    ap.add_argument("--temperature", type=float, default=0.25, help="synthetic logits' temperature")
    ap.add_argument("--hierarchy", default="tieredimagenet-h")
    ap.add_argument("--metrics", nargs="+", default=METRICS, help="metric names or specs, e.g. hf_beta[beta=0.5]")
    ap.add_argument("--chunk-size", type=int, default=32768)
    ap.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, ...")
    ap.add_argument("--no-validate", action="store_true", help="skip the per-chunk input check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--output", help="write the predictions to this .npz")
    ap.add_argument("--json", help="write the timings to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)

    h = hd.load_hierarchy(args.hierarchy)
    if args.input:
        probs = np.load(args.input, mmap_mode="r")
    else:
        status(f"drawing {args.samples:,} synthetic rows of {h.num_leaves} leaves", line=True)
        probs = synthetic_probabilities(h.num_leaves, args.samples, args.temperature, args.seed)
    n = probs.shape[0]
    metrics = {}
    for spec in args.metrics:
        m = hd.get_metric(spec, h)
        metrics[m.key] = m
    outputs = {key: (np.empty((n, (h.num_nodes + 7) // 8), np.uint8) if m.kind == "set" else np.empty(n, np.int64))
               for key, m in metrics.items()}
    timing = {"copy+check": 0.0, "node sums": 0.0, **{key: 0.0 for key in metrics}}
    # Warm-up on one row: per-tree tables are built and cached once, outside the timings.
    status("warm-up on one row: building the tree's tables for each metric", line=True)
    warm = hd.Posterior(h, torch.as_tensor(np.asarray(probs[:1])).to(device))
    for m in metrics.values():
        m.decode(warm)
    pin = device.type == "cuda"
    _sync(device)
    start = time.perf_counter()
    chunks = -(-n // args.chunk_size)
    for k, a in enumerate(range(0, n, args.chunk_size), start=1):
        b = min(n, a + args.chunk_size)
        status(f"chunk {k}/{chunks} (rows {a:,}..{b - 1:,}): copy and check")
        t = time.perf_counter()
        host = torch.from_numpy(np.ascontiguousarray(probs[a:b]))
        chunk = (host.pin_memory() if pin else host).to(device, non_blocking=pin)
        post = hd.Posterior(h, chunk, validate=not args.no_validate)
        _sync(device)
        timing["copy+check"] += time.perf_counter() - t
        t = time.perf_counter()
        post.node  # noqa: B018 -- the shared p(n) table, timed on its own
        _sync(device)
        timing["node sums"] += time.perf_counter() - t
        for key, m in metrics.items():
            status(f"chunk {k}/{chunks} (rows {a:,}..{b - 1:,}): {key}")
            t = time.perf_counter()
            pred = m.decode(post)
            pred = pred.cpu().numpy()  # the copy back synchronizes
            timing[key] += time.perf_counter() - t
            outputs[key][a:b] = np.packbits(pred, axis=1) if pred.dtype == np.bool_ else pred
        status(f"chunk {k}/{chunks} done: {b:,} of {n:,} rows in {time.perf_counter() - start:.1f}s", line=True)
    total = time.perf_counter() - start

    print(f"{n} rows x {h.num_leaves} leaves on {device} in chunks of {args.chunk_size}: {total:.2f}s, "
          f"{n / total:,.0f} rows/s for {len(metrics)} metrics")
    for key, sec in timing.items():
        print(f"  {key:>20}: {sec:8.3f}s  ({n / max(sec, 1e-9):,.0f} rows/s)")
    if args.output:
        np.savez_compressed(args.output, **{k.replace("[", "(").replace("]", ")"): v for k, v in outputs.items()})
    result = {"device": str(device), "rows": n, "chunk_size": args.chunk_size, "seconds": total,
              "rows_per_second": n / total, "timing": timing}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    result["predictions"] = outputs
    result["num_nodes"] = h.num_nodes
    return result


if __name__ == "__main__":
    main()
