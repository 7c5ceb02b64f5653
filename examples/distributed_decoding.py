"""Decode a million rows on a local Ray cluster with ``hd.BatchDecoder``, then the same rows in one process.

The rows are synthetic logits made inside the cluster, chunk by chunk (chunk ``k`` is drawn from its
own seed, so the rows do not depend on who makes them); ``map_batches`` runs one ``BatchDecoder`` per
actor.  Printed: rows/s of each worker's decoding (its decode time only), of the whole pipeline
(generation and transfers included), and of one process decoding the same rows chunk by chunk; and
whether every prediction is the same both ways (it must be: a row's answer does not depend on the batch).

    python examples/distributed_decoding.py                       # 10^6 rows, 2 workers
    python examples/distributed_decoding.py --rows 100000 --workers 4 --decoders wu_palmer majority
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

import hdecode_torch as hd

DECODERS = ["wu_palmer", "tree_distance", "majority"]


def make_chunk(k: int, chunk: int, rows: int, num_leaves: int, seed: int) -> dict:
    """Rows ``k*chunk .. min((k+1)*chunk, rows)``: ``{"id": (b,) int64, "logits": (b, L) float32}``, peaked
    around a random leaf with a random sharpness, drawn from the seed ``(seed, k)``."""
    rng = np.random.default_rng([seed, k])
    a, b = k * chunk, min((k + 1) * chunk, rows)
    z = rng.standard_normal((b - a, num_leaves), dtype=np.float32) * rng.choice([0.3, 1.0, 3.0], (b - a, 1))
    z[np.arange(b - a), rng.integers(0, num_leaves, b - a)] += rng.uniform(0, 8, b - a).astype(np.float32)
    return {"id": np.arange(a, b, dtype=np.int64), "logits": z}


class TimedDecoder:
    """A ``BatchDecoder`` that also says which worker decoded each row and how long its batch took."""

    def __init__(self, threads: int, **kwargs):
        torch.set_num_threads(threads)
        self.decoder = hd.BatchDecoder(**kwargs)
        self.worker = os.getpid()

    def __call__(self, batch: dict) -> dict:
        start = time.perf_counter()
        out = self.decoder(batch)
        seconds = time.perf_counter() - start
        n = len(batch["id"])
        out["worker"] = np.full(n, self.worker, dtype=np.int64)
        out["seconds"] = np.full(n, seconds / max(n, 1))  # each row's share of its batch's decode time
        return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=2, help="Ray actors decoding (and CPUs of the local cluster)")
    ap.add_argument("--chunk", type=int, default=8192, help="rows made at once, and decoded in one call")
    ap.add_argument("--hierarchy", default="tieredimagenet-h")
    ap.add_argument("--decoders", nargs="+", default=DECODERS, help="decoder or metric specs (node predictions)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker and in the single process")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="write the Ray predictions (and ids) to this .npz")
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    import ray

    h = hd.load_hierarchy(args.hierarchy)
    L, rows, chunk = h.num_leaves, args.rows, args.chunk
    chunks = -(-rows // chunk)
    kwargs = {"hierarchy": h, "decoders": args.decoders, "keep_scores": False, "device": "cpu"}
    one = hd.BatchDecoder(**kwargs)  # checks the specs before the cluster starts
    columns = one.columns
    if any(d.kind == "set" for d in one.decoders):
        ap.error("--decoders: node predictions only here (a set metric's (B, N) sets would fill the driver)")

    # ---- Ray: generation and decoding in the cluster, predictions streamed back to the driver.
    here = os.path.dirname(os.path.dirname(os.path.abspath(hd.__file__)))
    env = {"OMP_NUM_THREADS": str(args.threads),
           "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False, configure_logging=False,
             runtime_env={"env_vars": env})
    try:
        import ray.data

        ray.data.DataContext.get_current().enable_progress_bars = False
        start = time.perf_counter()
        # The chunk ids come from the driver: a read task would wait for a CPU the actors hold.
        ds = (ray.data.from_items([{"id": k} for k in range(chunks)], override_num_blocks=chunks)
              .map_batches(lambda b: _concat([make_chunk(int(k), chunk, rows, L, args.seed) for k in b["id"]]),
                           batch_size=1)
              # batch_size=None: one call per chunk.  A size in rows would be counted in chunk ids (the
              # two steps run fused), bundling every chunk into one task for one actor.
              .map_batches(TimedDecoder, fn_constructor_kwargs={"threads": args.threads, **kwargs},
                           batch_size=None, compute=ray.data.ActorPoolStrategy(size=args.workers)))
        pred = {c: np.empty(rows, dtype=np.int64) for c in columns}
        seen = np.zeros(rows, dtype=bool)
        work: dict[int, list[float]] = {}
        for b in ds.iter_batches(batch_size=None, batch_format="numpy"):
            ids = b["id"]
            seen[ids] = True
            for c in columns:
                pred[c][ids] = b[c]
            for w in np.unique(b["worker"]):
                mine = b["worker"] == w
                acc = work.setdefault(int(w), [0, 0.0])
                acc[0] += int(mine.sum())
                acc[1] += float(b["seconds"][mine].sum())
        ray_seconds = time.perf_counter() - start
    finally:
        ray.shutdown()
    assert seen.all(), f"{int((~seen).sum())} rows came back from no worker"

    # ---- One process: the same rows, chunk by chunk.
    torch.set_num_threads(args.threads)
    gen_seconds = dec_seconds = 0.0
    same = True
    for k in range(chunks):
        t0 = time.perf_counter()
        batch = make_chunk(k, chunk, rows, L, args.seed)
        t1 = time.perf_counter()
        out = one(batch)
        dec_seconds += time.perf_counter() - t1
        gen_seconds += t1 - t0
        same &= all(np.array_equal(out[c], pred[c][batch["id"]]) for c in columns)

    workers = {str(w): {"rows": n, "decode_seconds": s, "rows_per_s": n / s} for w, (n, s) in sorted(work.items())}
    result = {"rows": rows, "leaves": L, "decoders": columns, "workers": workers, "ray_seconds": ray_seconds,
              "ray_rows_per_s": rows / ray_seconds, "single_decode_seconds": dec_seconds,
              "single_rows_per_s": rows / dec_seconds, "single_generate_seconds": gen_seconds,
              "identical": bool(same), "threads": args.threads}
    print(f"{rows:,} rows of {L} leaves, decoders {', '.join(columns)}")
    for i, (w, r) in enumerate(workers.items()):
        print(f"  Ray worker {i} (pid {w}): {r['rows']:>9,} rows, {r['rows_per_s']:>10,.0f} rows/s decoding")
    print(f"  Ray pipeline ({args.workers} workers, generation included): {result['ray_rows_per_s']:,.0f} rows/s")
    print(f"  one process, same rows:                        {result['single_rows_per_s']:,.0f} rows/s decoding")
    print(f"  predictions identical both ways: {same}")
    if args.output:
        np.savez(args.output, id=np.arange(rows), **pred)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def _concat(parts: list[dict]) -> dict:
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


if __name__ == "__main__":
    main()
