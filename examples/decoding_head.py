"""Append a DecodingHead to a trained classifier and decode a batch.

A small MLP is trained (plain PyTorch, a few seconds) on synthetic data drawn down the
bundled tieredImageNet-H tree, then ``nn.Sequential(model, DecodingHead(h, metric))``
returns, for each metric, its Bayes-optimal prediction: a node id, or a node set for
hF_β.  For each metric the script reports the value of the optimal predictions and of
the flat argmax-leaf predictions, on the test labels and in expectation under the
model's own posterior (where the optimal decoder is never worse, by construction).

    python examples/decoding_head.py                  # defaults: ~20 s on a laptop CPU
    python examples/decoding_head.py --samples 2000 --epochs 2 --test-samples 256
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn

import hdecode_torch as hd
from hdecode_torch import DecodingHead
from hdecode_torch.synthetic import tree_gaussian_features

METRICS = [("accuracy", {}), ("tree_distance", {}), ("wu_palmer", {}), ("zhao", {}), ("hf_beta", {"beta": 0.5}),
           ("hamming", {})]


def train_mlp(x, y, num_classes: int, epochs: int, hidden: int = 128, batch_size: int = 128, seed: int = 0):
    """A 2-layer MLP trained with Adam; prints each epoch's mean loss as it ends."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        total, count = 0.0, 0
        for idx in torch.randperm(len(y)).split(batch_size):
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, count = total + float(loss.detach()) * len(idx), count + len(idx)
        print(f"  epoch {epoch}/{epochs}: training loss {total / count:.3f} ({time.perf_counter() - start:.1f}s)",
              flush=True)
    return model.eval()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=10000, help="training samples")
    ap.add_argument("--test-samples", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--noise", type=float, default=3.0, help="feature noise: higher = more underdetermined")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=4, help="predictions to print (the least confident samples)")
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--json", help="write the results to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    h = hd.load_hierarchy("tieredimagenet-h")
    x, y = tree_gaussian_features(h, args.samples + args.test_samples, args.dim, args.noise, args.seed)
    x_train, y_train, x_test, y_test = x[: args.samples], y[: args.samples], x[args.samples:], y[args.samples:]
    print(f"training an MLP on {args.samples} samples for {args.epochs} epochs", flush=True)
    t0 = time.perf_counter()
    model = train_mlp(x_train, y_train, h.num_leaves, args.epochs, seed=args.seed)
    with torch.no_grad():
        train_time = time.perf_counter() - t0
        probs = torch.softmax(model(x_test), dim=1)
    print(f"trained on {args.samples} samples in {train_time:.1f}s; test top-1 "
          f"{float((probs.argmax(1) == y_test).double().mean()):.3f}")

    argmax = hd.get_decoder("argmax_leaf", h)
    flat = argmax.decode(probs)
    post = hd.Posterior(h, probs)  # node sums shared by every metric's expected-value computation
    uncertain = probs.max(1).values.argsort()[: args.show]
    results, shown = {}, {}
    print(f"decoding the {len(y_test)} test samples with each metric's DecodingHead", flush=True)
    for name, params in METRICS:
        pipeline = nn.Sequential(model, DecodingHead(h, name, from_logits=True, **params))
        head = pipeline[1]
        with torch.inference_mode():
            pred = pipeline(x_test)
        metric = head.metric
        results[metric.key] = {
            "higher_is_better": metric.higher_is_better,
            "test_optimal": float(metric(pred, y_test).mean()),
            "test_argmax_leaf": float(metric(flat, y_test).mean()),
            "expected_optimal": float(metric.expected(post, pred).mean()),
            "expected_argmax_leaf": float(metric.expected(post, flat).mean()),
        }
        if head.returns_sets:  # (B, N) bool: show the deepest node of each set
            deepest = torch.where(pred, h.depth, -1).argmax(1)
            shown[metric.key] = [f"{h.label(int(deepest[i]))}+{int(pred[i].sum()) - 1 - int(h.depth[deepest[i]])}"
                                 for i in uncertain.tolist()]
        else:
            shown[metric.key] = [h.label(int(pred[i])) for i in uncertain.tolist()]

    truth = [h.label(int(y_test[i])) for i in uncertain]
    print(f"\nthe {args.show} least confident test samples; true classes: {truth}")
    print("  (node sets shown as their deepest node, +k for k more nodes off that path)")
    for key, preds in shown.items():
        print(f"  {key:>18}: {preds}")
    print(f"\n{'metric':>18} {'dir':>4} {'test optimal':>13} {'test argmax':>12} {'E[optimal]':>11} {'E[argmax]':>10}")
    for key, r in results.items():
        print(f"{key:>18} {'+' if r['higher_is_better'] else '-':>4} {r['test_optimal']:13.4f} "
              f"{r['test_argmax_leaf']:12.4f} {r['expected_optimal']:11.4f} {r['expected_argmax_leaf']:10.4f}")
    out = {"test_top1": float((flat == y_test).double().mean()), "results": results, "shown": shown}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return out


if __name__ == "__main__":
    main()
