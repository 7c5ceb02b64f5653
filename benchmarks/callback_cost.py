#!/usr/bin/env python
"""What ``HierarchicalMetricsCallback`` adds to a validation, before and after a change of its code.

    python -m benchmarks.callback_cost                  # this checkout against commit 5ea730f
    python -m benchmarks.callback_cost --cost-rows 4000 --time-rows 4000 --repeats 5 --json cost.json
    python -m benchmarks.callback_cost --before none    # this checkout only

The validation of the Lightning example's pairs (7 metrics x 7 decoders on tieredImageNet-H, batches
of 256) runs through ``trainer.validate`` on precomputed calibrated synthetic logits, so the model
costs nothing and what changes with the callback is the callback.  Two measurements:

* **GPU-plan cost model**: the run under ``hd.plan_for("cuda")`` on CPU tensors, counted with
  :class:`benchmarks.plan_cost.Cost` (operators that launch a kernel on a GPU, host reads), with the
  callback minus without it, per validation batch, averaged over the validation (``--cost-rows``).
  Tree tables are built before counting, outside inference mode (the CPU reference of the fused
  operators re-reads, at every call, index tables made under inference mode, where a GPU checks them
  asynchronously); ``--tables-in-validation`` builds them in the first validation instead, as a plain
  run on the CPU does, and counts those reads too.  The reads include Lightning's conversion of every
  logged value to a Python number at the end of ``trainer.validate``: one per pair.
* **CPU time** (``--time-rows``): the validation with the callback minus without it (the callback's
  overhead), against the time of decoding and scoring each pair once on all rows through the public
  API (a Posterior of the logits, the decoder, the metric; no input check), pair by pair.  The runs
  alternate (none, before, after, reference, none, ...) and medians are reported.

"Before" is the callback and ``HierarchicalMetric`` of ``--before`` (a git commit of this
repository), loaded from ``git show`` into this process next to the current ones.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import types
import warnings

if __package__ in (None, ""):  # `python benchmarks/callback_cost.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from benchmarks.plan_cost import Cost  # noqa: E402
from hdecode_torch.synthetic import synthetic_outputs  # noqa: E402

METRICS = ["accuracy", "tree_distance", "wu_palmer", "zhao", ("hf_beta", {"beta": 0.5}), "hamming", "jaccard"]
DECODERS = ["optimal", "argmax_leaf", "top_down", "majority", "plurality", ("darts", {"lam": 0.0}), "hie"]
BEFORE = "5ea730f"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_before(commit: str):
    """The callback class of ``commit``, its modules imported from ``git show`` under other names."""
    import importlib

    pkg = "hdecode_torch.integrations"
    importlib.import_module(pkg)
    module = None
    for name, path, renames in [("_before_torchmetrics", "torchmetrics.py", {}),
                                ("_before_lightning", "lightning.py",
                                 {"from .torchmetrics import": "from ._before_torchmetrics import"})]:
        text = subprocess.run(["git", "-C", ROOT, "show", f"{commit}:hdecode_torch/integrations/{path}"],
                              capture_output=True, text=True, check=True).stdout
        for a, b in renames.items():
            text = text.replace(a, b)
        module = types.ModuleType(f"{pkg}.{name}")
        module.__package__, module.__file__ = pkg, f"<{commit}:{path}>"
        sys.modules[module.__name__] = module
        exec(compile(text, module.__file__, "exec"), module.__dict__)
    return module.HierarchicalMetricsCallback


def _pl():
    try:
        import pytorch_lightning as pl
    except ImportError:
        import lightning.pytorch as pl
    return pl


def _module(pl):
    class Replay(pl.LightningModule):
        """Returns the batch as the step's output: the logits were computed beforehand."""

        def validation_step(self, batch, batch_idx):
            logits, y = batch
            return {"logits": logits, "target": y}

    return Replay()


def _data(h, rows: int, seed: int = 0):
    probs, y = synthetic_outputs(h, rows, seed=seed)
    return probs.clamp_min(1e-30).log(), y  # logits whose softmax is the calibrated probabilities


def _validate(pl, callback_cls, h, logits, y, batch_size: int) -> None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(logits, y), batch_size=batch_size)
    callbacks = [] if callback_cls is None else [callback_cls(h, metrics=METRICS, decoders=DECODERS)]
    trainer = pl.Trainer(accelerator="cpu", devices=1, callbacks=callbacks, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.validate(_module(pl), loader, verbose=False)


def _pairs(h):
    for spec in METRICS:
        metric = hd.get_metric(spec, h)
        for d in DECODERS:
            yield metric, hd.get_decoder(d, h, metric=metric)


def _decode_each_pair(h, logits, y) -> None:
    for metric, decoder in _pairs(h):
        post = hd.Posterior(h, logits, from_logits=True, validate=False)
        metric(decoder.decode(post), y, validate=False)


def cost_model(pl, versions: dict, h, rows: int, batch_size: int, prewarm: bool = True) -> dict:
    """Operators and host reads per batch the callback adds under the GPU plan, per version."""
    logits, y = _data(h, rows)
    batches = -(-rows // batch_size)
    out = {}
    with hd.plan_for("cuda"):
        if prewarm:
            _decode_each_pair(h, logits[:64], y[:64])  # tree tables, outside inference mode
        counts = {}
        for label, cls in [("none", None)] + list(versions.items()):
            _validate(pl, cls, h, logits[:batch_size], y[:batch_size], batch_size)  # warm-up
            with Cost() as c:
                _validate(pl, cls, h, logits, y, batch_size)
            counts[label] = c
    for label in versions:
        c, base = counts[label], counts["none"]
        out[label] = {"ops_per_batch": (c.ops - base.ops) / batches, "reads_per_batch": (c.reads - base.reads) / batches,
                      "ops": c.ops - base.ops, "reads": c.reads - base.reads}
    out["setting"] = {"rows": rows, "batch_size": batch_size, "batches": batches}
    return out


def cpu_time(pl, versions: dict, h, rows: int, batch_size: int, repeats: int) -> dict:
    """Median seconds of the validation without and with each version, and of decoding each pair once."""
    logits, y = _data(h, rows, seed=1)
    jobs = [("none", lambda: _validate(pl, None, h, logits, y, batch_size))]
    jobs += [(label, lambda cls=cls: _validate(pl, cls, h, logits, y, batch_size)) for label, cls in versions.items()]
    jobs.append(("each pair once", lambda: _decode_each_pair(h, logits, y)))
    times: dict[str, list[float]] = {label: [] for label, _ in jobs}
    for label, job in jobs:
        job()  # warm-up: tree tables, Lightning's first-run costs
    for _ in range(repeats):
        for label, job in jobs:
            t = time.perf_counter()
            job()
            times[label].append(time.perf_counter() - t)
    med = {label: statistics.median(t) for label, t in times.items()}
    out = {"median_s": med, "all_s": times, "setting": {"rows": rows, "batch_size": batch_size, "repeats": repeats,
                                                         "threads": torch.get_num_threads()}}
    for label in versions:
        overhead = med[label] - med["none"]
        out[label] = {"overhead_s": overhead, "overhead_x_each_pair_once": overhead / med["each pair once"]}
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default=BEFORE, help=f"git commit to compare with (default {BEFORE}; 'none': skip)")
    ap.add_argument("--cost-rows", type=int, default=40737, help="validation rows of the cost model (default 40,737)")
    ap.add_argument("--time-rows", type=int, default=4000, help="validation rows of the CPU timing (default 4,000)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each job (alternating)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1: steadier timings)")
    ap.add_argument("--tables-in-validation", action="store_true",
                    help="build the tree tables in the first validation (under inference mode), not before")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*does not have many workers")
    pl = _pl()
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric"):  # after the import, which sets them
        logging.getLogger(name).setLevel(logging.WARNING)
    from hdecode_torch.integrations import HierarchicalMetricsCallback

    versions = {}
    if args.before != "none":
        try:
            versions[f"before ({args.before})"] = load_before(args.before)
        except Exception as exc:  # noqa: BLE001 - no git, no such commit, or helpers it imports are gone
            print(f"(before: cannot load the callback of {args.before}: {type(exc).__name__}: {exc})", flush=True)
    versions["after"] = HierarchicalMetricsCallback
    h = hd.load_hierarchy("tieredimagenet-h")
    print(f"HierarchicalMetricsCallback on tieredImageNet-H: {len(METRICS)} metrics x {len(DECODERS)} decoders "
          f"(49 pairs), batches of {args.batch_size}", flush=True)

    cost = cost_model(pl, versions, h, args.cost_rows, args.batch_size, prewarm=not args.tables_in_validation)
    print(f"\nGPU-plan cost model, {args.cost_rows} rows = {cost['setting']['batches']} batches; what the callback "
          "adds per batch:")
    print(f"  {'':24s} {'operators':>10s} {'host reads':>11s}")
    for label in versions:
        print(f"  {label:24s} {cost[label]['ops_per_batch']:10.0f} {cost[label]['reads_per_batch']:11.2f}")

    timing = cpu_time(pl, versions, h, args.time_rows, args.batch_size, args.repeats)
    med = timing["median_s"]
    print(f"\nCPU time, {args.time_rows} rows, {torch.get_num_threads()} thread(s), median of {args.repeats}: "
          f"validation without the callback {med['none']:.2f} s; decoding and scoring each pair once on all rows "
          f"{med['each pair once']:.2f} s")
    print(f"  {'':24s} {'validation':>10s} {'overhead':>9s} {'overhead / each pair once':>26s}")
    for label in versions:
        r = timing[label]
        print(f"  {label:24s} {med[label]:9.2f}s {r['overhead_s']:8.2f}s {r['overhead_x_each_pair_once']:25.2f}x")
    out = {"cost_model": cost, "cpu_time": timing}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
