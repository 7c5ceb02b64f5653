"""Train an MLP with PyTorch Lightning and compare optimal and heuristic decoders every epoch.

Synthetic data follow the bundled tieredImageNet-H tree: each node's mean is its
parent's mean plus a random offset, and samples are their class mean plus noise
(``--noise``: higher = classes overlap more = more underdetermined).  The
:class:`~hdecode_torch.integrations.HierarchicalMetricsCallback` scores every
(metric, decoder) pair on the validation set and prints a table per epoch (``*`` marks
the best decoder of each metric, ``↑``/``↓`` which way is better).

Bayes-optimal decoding is optimal *under the model's probabilities*.  A network trained for
a few epochs with cross-entropy is over-confident, and the optimal decoders then commit to
deep, specific nodes too often: with raw logits the optimal column can lose to a heuristic.
So before each validation the model's logits are calibrated: a
:class:`~hdecode_torch.TemperatureScaler` is fitted on a held-out calibration split
(``--calibration-samples``, neither trained on nor scored) and the validation step returns
``logits / T``.  ``--no-calibration`` shows the uncalibrated table.

    python examples/lightning_synthetic.py                      # defaults: ~1 min on a laptop CPU
    python examples/lightning_synthetic.py --epochs 1 --samples 2000 --val-samples 500
    python examples/lightning_synthetic.py --devices 2          # DDP on 2 CPU processes
"""

from __future__ import annotations

import argparse
import json
import logging
import textwrap
import warnings

import torch
from torch import nn

import hdecode_torch as hd
from hdecode_torch.integrations import HierarchicalMetricsCallback
from hdecode_torch.synthetic import tree_gaussian_features

try:
    import pytorch_lightning as pl
except ImportError:
    import lightning.pytorch as pl

# Two notices that say nothing about this example: Lightning's advertisement for its cloud logger,
# and a FutureWarning from torch about a deprecated class that Lightning's own code still uses.
for _name in ("pytorch_lightning.utilities.rank_zero", "lightning.pytorch.utilities.rank_zero",
              "lightning_fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(lambda record: "litlogger" not in record.getMessage())
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)

METRICS = ["accuracy", "tree_distance", "wu_palmer", "zhao", ("hf_beta", {"beta": 0.5}), "hamming", "jaccard"]
DECODERS = ["optimal", "argmax_leaf", "top_down", "majority", "plurality", ("darts", {"lam": 0.0}), "hie"]


class MLP(pl.LightningModule):
    def __init__(self, dim: int, num_classes: int, hidden: int = 128, lr: float = 3e-3, calibration=None):
        super().__init__()
        self.save_hyperparameters(ignore=["calibration"])
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        # T is fitted, not trained: no gradient reaches it (and DDP has no unused parameter to complain about).
        self.scaler = hd.TemperatureScaler().requires_grad_(False)
        self.calibration = calibration  # (x, y) held out for the temperature, or None: raw logits

    def forward(self, x):
        """Calibrated logits: the network's divided by the fitted temperature."""
        return self.scaler(self.net(x))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)  # trained on its own logits; T is fitted apart
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def on_validation_epoch_start(self):
        if self.calibration is None or self.trainer.sanity_checking:
            return
        x, y = (t.to(self.device) for t in self.calibration)
        # Validation runs under inference mode, in which no temperature can be fitted (autograd is off).
        with torch.inference_mode(False), torch.no_grad():
            logits = self.net(x)
        with torch.inference_mode(False):
            self.scaler.fit(logits, y)  # deterministic: every DDP process fits the same T

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        return {"logits": logits, "target": y}  # what HierarchicalMetricsCallback reads

    def configure_optimizers(self):
        return torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr)


def main(argv=None) -> dict:
    """Run the example; returns {"logged", "history", "temperature", "model", "val", "callback"}."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20000, help="training samples")
    ap.add_argument("--val-samples", type=int, default=4000, help="validation samples (a multiple of --devices)")
    ap.add_argument("--calibration-samples", type=int, default=2000,
                    help="held-out samples the temperature is fitted on before each validation")
    ap.add_argument("--no-calibration", action="store_true", help="score the raw logits (over-confident)")
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
    n_cal = 0 if args.no_calibration else args.calibration_samples
    x, y = tree_gaussian_features(h, args.samples + n_cal + args.val_samples, args.dim, args.noise, args.seed)
    train = torch.utils.data.TensorDataset(x[: args.samples], y[: args.samples])
    calibration = (x[args.samples: args.samples + n_cal], y[args.samples: args.samples + n_cal]) if n_cal else None
    val = torch.utils.data.TensorDataset(x[args.samples + n_cal:], y[args.samples + n_cal:])
    callback = HierarchicalMetricsCallback(h, metrics=METRICS, decoders=DECODERS, print_table=not args.quiet)
    trainer = pl.Trainer(
        max_epochs=args.epochs, accelerator="cpu", devices=args.devices,
        strategy="ddp_spawn" if args.devices > 1 else "auto", callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    model = MLP(args.dim, h.num_leaves, calibration=calibration)
    trainer.fit(model, torch.utils.data.DataLoader(train, batch_size=args.batch_size, shuffle=True),
                torch.utils.data.DataLoader(val, batch_size=args.batch_size))
    names = callback.names["validate"]  # {(metric key, decoder label): logged name, e.g. "val_hf_beta0p5_optimal"}
    logged = {name: float(trainer.callback_metrics[name]) for name in names.values()}
    out = {"logged": logged, "history": [{names[pair]: v for pair, v in e.items()} for e in callback.history],
           "temperature": model.scaler.temperature}
    if not args.quiet and trainer.is_global_zero:
        # From what was logged: under ddp_spawn, the callback of this process did not run.
        results = {pair: logged[name] for pair, name in names.items()}
        print(summary(callback, results, len(val), n_cal, model.scaler.temperature, args, h.num_leaves), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    out.update(model=model, val=val, callback=callback)
    return out


def summary(callback, results: dict, num_val: int, num_cal: int, temperature: float, args, num_classes: int) -> str:
    """Where the table's numbers (``results``, ``{(metric, decoder): value}``) come from, and why an optimal
    decoder can lose in it."""
    lines = [f"\nScored on {num_val} validation samples: "
             + (f"logits / T, with T = {temperature:.3g} fitted on {num_cal} held-out samples." if num_cal
                else "raw logits, not calibrated (--no-calibration).")]
    last = results
    lost = []
    for metric in dict.fromkeys(k for k, _ in last):
        if (metric, "optimal") not in last:
            continue
        row = {d: v for (k, d), v in last.items() if k == metric}
        best = (max if callback.metrics[(metric, "optimal")].higher_is_better else min)(row.values())
        if row["optimal"] != best:
            lost.append(metric)
    if lost:
        accuracy = last.get(("accuracy", "optimal"))
        lines.append(
            f"The optimal decoder is not the best for {', '.join(lost)}.  Each optimal decoder is optimal under "
            "the model's probabilities: it wins in expectation when they are right, and can lose when they are "
            f"far from the truth, as after {args.epochs} epoch(s) on {args.samples} samples (about "
            f"{args.samples / num_classes:.0f} per class"
            + (f", accuracy {accuracy:.1%}" if accuracy is not None else "")
            + "; a temperature corrects their confidence, not their shape), or by chance on a small validation "
            "set.  Train longer on more data (the defaults: 20,000 samples, 3 epochs) to see the optimal column win.")
    return "\n".join(textwrap.fill(line, 100) if len(line) > 100 else line for line in lines)


if __name__ == "__main__":
    main()
