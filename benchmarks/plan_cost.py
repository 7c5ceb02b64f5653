#!/usr/bin/env python
"""What one decode call costs a GPU, counted on the CPU: operators that launch a kernel, host reads, bytes.

    python -m benchmarks.plan_cost                       # GPU plan, both bundled trees and their 48-level-deeper
                                                         # variants, B = 40,737 (the iNat19 test-set size)
    python -m benchmarks.plan_cost --plan cpu --batch 4096 --trees tiered --json cost.json

Each decoder runs once to build its tree-only tables, then once under a counting dispatch mode, inside
``hd.plan_for(--plan)`` on CPU tensors.  Counted per call:

* ``ops``: ATen operators that launch a kernel (views and other metadata operators are free; a fused
  ``hdecode::`` op counts as one: on a GPU it is one Triton kernel);
* ``reads``: host reads, values the host must wait for (``.item()``, ``.tolist()``, ``bool()``,
  ``nonzero``, ...): each stalls a GPU stream;
* ``MiB``: bytes read and written by the counted operators, a proxy of memory traffic; ``floor`` is what
  a single fused kernel must move (the (B, L) input read, the output written).

A GPU call costs, to first order, ops × launch latency + reads × sync latency + bytes / bandwidth; the
``model ms`` column prices it at 6 µs, 30 µs and 3 TB/s (H100-like; a model, not a measurement).  The
deeper variant of a tree has a spine of 48 single-child nodes above its root: a plan whose operator
count does not depend on the depth shows the same ``ops`` there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):  # `python benchmarks/plan_cost.py`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

import hdecode_torch as hd  # noqa: E402
from hdecode_torch.core.spec import label as decoder_label  # noqa: E402

__all__ = ["Cost", "cost_of", "deepened"]

# Operators that only make views or metadata (no kernel on a GPU).
FREE = {"empty", "empty_like", "empty_strided", "detach", "lift_fresh", "alias", "view", "as_strided", "expand",
        "slice", "select", "t", "transpose", "unsqueeze", "squeeze", "permute", "unflatten", "_unsafe_view",
        "split", "split_with_sizes", "unbind", "narrow", "diagonal", "_reshape_alias", "reshape", "flatten",
        "movedim", "expand_as", "chunk", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "resize_",
        "set_", "lift", "_conj", "conj", "_neg_view", "result_type"}
SYNC_OPS = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
            "equal", "allclose", "_local_scalar_dense"}
HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy")


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor) and x.layout == torch.strided:
        return x.numel() * x.element_size()
    return 0


class Cost(TorchDispatchMode):
    """Counts kernel-launching operators, host reads and bytes of the calls made under it."""

    def __init__(self):
        super().__init__()
        self.ops, self.reads, self.bytes, self.by_op = 0, 0, 0, {}
        self._saved, self._depth = {}, 0

    def __enter__(self):
        for name in HOST_READS:  # reading a value on the host waits for the device
            orig = getattr(torch.Tensor, name)
            self._saved[name] = orig

            def counted(t, *a, _orig=orig, **k):
                if self._depth == 0:
                    self.reads += 1
                self._depth += 1
                try:
                    return _orig(t, *a, **k)
                finally:
                    self._depth -= 1
            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, orig in self._saved.items():
            setattr(torch.Tensor, name, orig)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        base = func.overloadpacket.__name__
        if self._depth == 0 and (base in SYNC_OPS or (
                base == "repeat_interleave" and kwargs.get("output_size") is None
                and len(args) > 1 and isinstance(args[1], torch.Tensor))):
            self.reads += 1
        if base not in FREE and base.rstrip("_") not in FREE and not getattr(func, "is_view", False):
            self.ops += 1
            self.by_op[base] = self.by_op.get(base, 0) + 1
            self.bytes += sum(_nbytes(t) for t in tree_flatten((args, kwargs))[0]) + sum(
                _nbytes(t) for t in tree_flatten(out)[0])
        return out


def cost_of(fn, x, plan: str = "cuda") -> Cost:
    """The :class:`Cost` of ``fn(x)`` under ``hd.plan_for(plan)``, after a warm-up call (tree-only tables) of the
    path counted: the torch path (the native kernels stand aside under the counting mode, so the warm-up does too,
    else the counted call would build the tables a native warm-up left unbuilt)."""
    from hdecode_torch.kernels import native

    with hd.plan_for(plan):
        with native.use_native(False):
            fn(x)
        with Cost() as c:
            fn(x)
    return c


def deepened(h, extra: int = 48):
    """``h`` with a spine of ``extra`` single-child internal nodes above its root (depth + extra)."""
    n = h.num_nodes
    parents = h.parent.tolist()
    spine = list(range(n, n + extra))
    parents[h.root] = spine[-1]
    parents += [-1] + spine[:-1]
    return hd.Hierarchy.from_parents(parents)


def decoders(h):
    """(label, decode function, output bytes per sample) of node_probabilities and every exact decoder."""
    yield "node_probabilities", lambda x: hd.node_probabilities(h, x), 4 * h.num_nodes
    grids = {"tree_distance_c": [{"c": 0.5}], "hf_beta": [{"beta": 0.5}, {"beta": 1.0}, {"beta": 2.0}]}
    for name in hd.list_metrics():
        if not hd.has_optimal_decoder(name):
            continue
        for params in grids.get(name, [{}]):
            m = hd.get_metric(name, h, **params)
            yield decoder_label(m, "optimal"), m.decode, h.num_nodes if m.kind == "set" else 8


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", default="tieredimagenet-h,inat19")
    ap.add_argument("--batch", type=int, default=40737)
    ap.add_argument("--plan", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--no-deep", action="store_true", help="skip the 48-level-deeper variants")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for name in args.trees.split(","):
        base = hd.load_hierarchy(name)
        g = torch.Generator().manual_seed(0)
        logits = torch.randn(args.batch, base.num_leaves, generator=g) * 2.5
        logits[torch.arange(args.batch), torch.randint(0, base.num_leaves, (args.batch,), generator=g)] += 5
        x = torch.softmax(logits.double(), 1).float()
        variants = [(name, base)] + ([] if args.no_deep else [(f"{name}+48", deepened(base))])
        for tree, h in variants:
            print(f"\n{tree}: N={h.num_nodes} L={h.num_leaves} depth={h.max_depth} B={args.batch} plan={args.plan}")
            print(f"  {'decoder':28s} {'ops':>5s} {'reads':>6s} {'MiB':>8s} {'floor':>7s} {'model ms':>9s}")
            for label, fn, out_bytes in decoders(h):
                c = cost_of(fn, x, args.plan)
                floor = (x.numel() * 4 + args.batch * out_bytes) / 2**20
                model = (c.ops * 6 + c.reads * 30) / 1e3 + c.bytes / 3e12 * 1e3
                rows.append({"tree": tree, "decoder": label, "plan": args.plan, "batch": args.batch, "ops": c.ops,
                             "reads": c.reads, "MiB": c.bytes / 2**20, "floor_MiB": floor, "model_ms": model,
                             "top_ops": sorted(c.by_op.items(), key=lambda kv: -kv[1])[:8]})
                print(f"  {label:28s} {c.ops:5d} {c.reads:6d} {c.bytes / 2**20:8.0f} {floor:7.0f} {model:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
