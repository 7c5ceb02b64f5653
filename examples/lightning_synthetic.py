"""Train an MLP with PyTorch Lightning and compare optimal and heuristic decoders every epoch.

Synthetic data follow the bundled tieredImageNet-H tree: each node's mean is its
parent's mean plus a random offset, and samples are their class mean plus noise
(``--noise``: higher = classes overlap more = more underdetermined).  The
:class:`~hdecode_torch.integrations.HierarchicalMetricsCallback` scores every
(metric, decoder) pair on the validation set and prints a table per epoch (``*`` marks
the best decoder of each metric).

    python examples/lightning_synthetic.py                      # defaults: ~1 min on a laptop CPU
    python examples/lightning_synthetic.py --epochs 1 --samples 2000 --val-samples 500
    python examples/lightning_synthetic.py --devices 2          # DDP on 2 CPU processes
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

import hdecode_torch as hd
from hdecode_torch.integrations import HierarchicalMetricsCallback
from hdecode_torch.synthetic import tree_gaussian_features

try:
    import pytorch_lightning as pl
except ImportError:
    import lightning.pytorch as pl

METRICS = ["accuracy", "tree_distance", "wu_palmer", "zhao", ("hf_beta", {"beta": 0.5}), "hamming", "jaccard"]
DECODERS = ["optimal", "argmax_leaf", "top_down", "majority", "plurality", ("darts", {"lam": 0.0}), "hie"]


class MLP(pl.LightningModule):
    def __init__(self, dim: int, num_classes: int, hidden: int = 128, lr: float = 3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        return {"logits": logits, "target": y}  # what HierarchicalMetricsCallback reads

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main(argv=None) -> dict:
    """Run the example; returns {"logged", "history", "model", "val", "callback"}."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000, help="training samples")
    ap.add_argument("--val-samples", type=int, default=4000, help="validation samples (a multiple of --devices)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--noise", type=float, default=3.0, help="feature noise: higher = more underdetermined")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--devices", type=int, default=1, help="CPU processes (> 1: DDP)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    ap.add_argument("--quiet", action="store_true", help="no per-epoch table")
    ap.add_argument("--json", help="write the last epoch's results to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    pl.seed_everything(args.seed, verbose=False)

    h = hd.load_hierarchy("tieredimagenet-h")
    x, y = tree_gaussian_features(h, args.samples + args.val_samples, args.dim, args.noise, args.seed)
    train = torch.utils.data.TensorDataset(x[: args.samples], y[: args.samples])
    val = torch.utils.data.TensorDataset(x[args.samples:], y[args.samples:])
    callback = HierarchicalMetricsCallback(h, metrics=METRICS, decoders=DECODERS, print_table=not args.quiet)
    trainer = pl.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=args.devices,
        strategy="ddp_spawn" if args.devices > 1 else "auto", callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    model = MLP(args.dim, h.num_leaves)
    trainer.fit(model, torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True),
                torch.utils.data.DataLoader(val, batch_size=args.batch_size))
    names = callback.names["validate"]  # {(metric key, decoder label): logged name, e.g. "val_hf_beta0p5_optimal"}
    logged = {name: float(trainer.callback_metrics[name]) for name in names.values()}
    out = {"logged": logged, "history": [{names[pair]: v for pair, v in e.items()} for e in callback.history]}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    out.update(model=model, val=val, callback=callback)
    return out


if __name__ == "__main__":
    main()
