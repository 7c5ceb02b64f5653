"""Eager vs ``torch.compile`` vs CUDA graphs for the decoders that never sync with the host.

    python -m benchmarks.compile_graphs                         # CUDA when present, else CPU
    python -m benchmarks.compile_graphs --device cuda --batch 40737 --json out.json

Issue 7 asks to measure both and keep what wins.  A decoder can be captured in a CUDA graph
only if it never waits for the host: that is every closed form, the structural risks, the tree
walks and the argmax rules, called with ``validate=False`` (the input check is the one sync they
have).  Candidate-based decoders (``hf_beta``, Wu-Palmer's candidates) size tensors from the data
and cannot be captured; they are timed eager and compiled only.

Each variant is checked against the eager output before it is timed.  Compilation time (the
first call) is reported apart from the steady state.  On CPU only eager and compile run.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings

import torch

import hdecode_torch as hd

from .measure import sync, time_call
from .workloads import TREE_ALIASES, label_matches, load_tree, model_like_probs

#: (label, kind, name, params, host-sync free with validate=False)
DECODERS = [
    ("node_probabilities", "probs", None, {}, True),
    ("accuracy/optimal", "metric", "accuracy", {}, True),
    ("lca_height/optimal", "metric", "lca_height", {}, True),
    ("tree_distance/optimal", "metric", "tree_distance", {}, True),
    ("zhao/optimal", "metric", "zhao", {"strategy": "structural"}, True),
    ("wu_palmer/optimal (structural)", "metric", "wu_palmer", {"strategy": "structural"}, True),
    ("hamming/optimal", "metric", "hamming", {}, True),
    ("wu_palmer/optimal", "metric", "wu_palmer", {}, False),
    ("hf_beta[beta=1]/optimal", "metric", "hf_beta", {"beta": 1.0}, False),
    ("top_down", "decoder", "top_down", {}, True),
    ("plurality", "decoder", "plurality", {}, True),
    ("darts[lam=0.5]", "decoder", "darts", {"lam": 0.5}, True),
]


def decoder_fn(h, kind: str, name: str | None, params: dict):
    """A function probs (B, L) -> predictions, unchecked (validate=False)."""
    if kind == "probs":
        return lambda x: hd.node_probabilities(h, x, validate=False)
    obj = hd.get_metric(name, h, **params) if kind == "metric" else hd.get_decoder(name, h, **params)
    return lambda x: obj.decode(x, validate=False)


def cuda_graph(fn, x: torch.Tensor):
    """``fn`` captured on the static input ``x``: returns a replay function giving the same output."""
    static_in = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm-up on a side stream, as the CUDA graphs notes ask
            fn(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(static_in)

    def replay(inp):
        static_in.copy_(inp)
        graph.replay()
        return static_out
    return replay


def run(args) -> dict:
    dev = torch.device(args.device)
    rows = []
    for tree in args.trees.split(","):
        tree = TREE_ALIASES.get(tree, tree)
        h, _ = load_tree(tree)
        h = h.to(dev)
        x = torch.from_numpy(model_like_probs(h.ancestors.cpu().numpy(), h.depth.cpu().numpy(), h.num_leaves,
                                              args.batch)).to(dev)
        print(f"\n=== {tree}  B={args.batch}  device={dev}")
        print(f"  {'decoder':28s} {'variant':8s} {'µs/sample':>10s} {'ms/batch':>9s} {'first call s':>12s}  same")
        for label, kind, name, params, sync_free in DECODERS:
            if args.decoders and not any(label_matches(s, label) for s in args.decoders.split(",")):
                continue
            fn = decoder_fn(h, kind, name, params)
            want = fn(x)
            variants = ["eager", "compile"] + (["graph"] if dev.type == "cuda" and sync_free else [])
            for variant in variants:
                if variant not in args.variants.split(","):
                    continue
                row = {"tree": tree, "device": str(dev), "batch": args.batch, "decoder": label, "variant": variant}
                try:
                    t0 = time.perf_counter()
                    if variant == "eager":
                        call = fn
                    elif variant == "compile":
                        torch._dynamo.reset()
                        call = torch.compile(fn, dynamic=False)
                    else:
                        call = cuda_graph(fn, x)
                    got = call(x)
                    sync(dev)
                    row["first_call_s"] = time.perf_counter() - t0
                    row["same"] = bool(torch.equal(got, want))
                    if row["same"]:
                        row.update(time_call(lambda: call(x), dev, repeats=args.repeats, min_time=args.min_time))
                        row["us_per_sample"] = row["median_s"] / args.batch * 1e6
                except Exception as e:  # a variant that cannot run is a result too
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                rows.append(row)
                if "us_per_sample" in row:
                    print(f"  {label:28s} {variant:8s} {row['us_per_sample']:10.3f} {row['median_s'] * 1e3:9.3f} "
                          f"{row['first_call_s']:12.2f}  yes")
                else:
                    print(f"  {label:28s} {variant:8s} {'-':>10s} {'-':>9s} {row.get('first_call_s', 0):12.2f}  "
                          f"{'NO' if row.get('same') is False else row.get('error', '')}")
    return {"torch": torch.__version__, "device": str(dev),
            "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--trees", default="tiered,inat")
    ap.add_argument("--batch", type=int, default=40737, help="default: the iNat19 test set size")
    ap.add_argument("--decoders", default=None, help="comma-separated substrings of the labels")
    ap.add_argument("--variants", default="eager,compile,graph")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads on CPU (0 = torch's default)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch._logging.set_logs(dynamo=logging.ERROR)  # graph-break notes at every host sync: expected here
    warnings.filterwarnings("ignore", module=r"torch\._dynamo")
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    wrong = [r for r in result["rows"] if r.get("same") is False]
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
