"""``HierarchicalMetricsCallback``: every requested (metric, decoder) pair, computed during validation.

Works with ``pytorch_lightning`` and, when that is the installed flavour, ``lightning.pytorch``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import torch

from ..hierarchy import Hierarchy
from .module import clear_posterior_cache, decoder_label, has_optimal_decoder, resolve_metric
from .torchmetrics import HierarchicalMetric

try:
    import pytorch_lightning as _pl
except ImportError:  # the unified `lightning` package
    try:
        import lightning.pytorch as _pl
    except ImportError as exc:
        raise ImportError('HierarchicalMetricsCallback needs PyTorch Lightning: pip install "hdecode_torch[lightning]" '
                          "(the `lightning` package; `pytorch-lightning` works too)") from exc

__all__ = ["HierarchicalMetricsCallback", "callback_class"]

_LOGIT_KEYS = ("logits", "logit", "scores")
_PROB_KEYS = ("probs", "probabilities", "prob", "leaf_probs")


class _CallbackLogic:
    """The callback's behaviour, independent of which Lightning package supplies ``Callback``."""

    def __init__(self, hierarchy: Hierarchy, metrics: Sequence = ("accuracy",), decoders: Sequence = ("optimal",),
                 output_key: str = "logits", target_key: str = "target", from_logits: bool | None = None,
                 extract: Callable | None = None, prefix: str = "val", print_table: bool = False,
                 validate: bool = True):
        super().__init__()
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")

        def single(spec):
            pair = isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], Mapping)
            return isinstance(spec, str) or pair

        if single(metrics) or single(decoders):
            raise TypeError("Expected `metrics` and `decoders` to be lists, e.g. metrics=['accuracy', "
                            "('hf_beta', {'beta': 0.5})], decoders=['optimal', 'majority']")
        if from_logits is None:
            if extract is not None:
                raise ValueError("With `extract=`, say what it returns: pass from_logits=True (logits) or False "
                                 "(probabilities)")
            if output_key in _LOGIT_KEYS:
                from_logits = True
            elif output_key in _PROB_KEYS:
                from_logits = False
            else:
                raise ValueError(f"Cannot tell whether `output_key={output_key!r}` holds logits or probabilities: "
                                 "pass from_logits=True or False")
        self.hierarchy = hierarchy
        self.output_key, self.target_key = output_key, target_key
        self.from_logits = bool(from_logits)
        self.extract = extract
        self.prefix = prefix
        self.print_table = bool(print_table)
        self.metrics: dict[str, HierarchicalMetric] = {}
        self.pairs: dict[str, tuple[str, str]] = {}
        self.skipped: list[tuple[str, str]] = []
        for metric_spec in metrics:
            metric = resolve_metric(hierarchy, metric_spec)
            optimal_ok = None
            for decoder_spec in decoders:
                if decoder_spec == "optimal":
                    optimal_ok = has_optimal_decoder(metric) if optimal_ok is None else optimal_ok
                    if not optimal_ok:
                        self.skipped.append((metric.key, "optimal"))
                        continue
                m = HierarchicalMetric(hierarchy, metric, decoder_spec, from_logits=self.from_logits, validate=validate)
                label = decoder_label(m.decoder, metric)
                name = "/".join(p for p in (prefix, metric.key, label) if p)
                if name in self.metrics:
                    raise ValueError(f"The pair ({metric.key}, {label}) is requested twice")
                self.metrics[name] = m
                self.pairs[name] = (metric.key, label)
        if self.skipped:
            warnings.warn(f"No Bayes-optimal decoder for {sorted({k for k, _ in self.skipped})}: "
                          "those metrics are reported for the heuristic decoders only", stacklevel=2)
        if not self.metrics:
            raise ValueError("No (metric, decoder) pair to compute; add a heuristic decoder")
        self.results: dict[tuple[str, str], float] = {}
        self.history: list[dict[tuple[str, str], float]] = []

    # ------------------------------------------------------------------ helpers
    def _to(self, device: torch.device) -> None:
        for m in self.metrics.values():
            m.to(device)

    def _reset(self) -> None:
        for m in self.metrics.values():
            m.reset()
        clear_posterior_cache()

    def _extract(self, outputs, batch):
        if self.extract is not None:
            return self.extract(outputs, batch)
        if not isinstance(outputs, Mapping) or self.output_key not in outputs:
            got = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
            raise ValueError(
                f"HierarchicalMetricsCallback reads what `validation_step` returns: expected a dict with key "
                f"{self.output_key!r}, but got {got}. Return e.g. {{{self.output_key!r}: scores, "
                f"{self.target_key!r}: y}}, or pass `output_key=` or `extract=(outputs, batch) -> (scores, target)`")
        scores = outputs[self.output_key]
        if self.target_key in outputs:
            target = outputs[self.target_key]
        elif isinstance(batch, Mapping) and self.target_key in batch:
            target = batch[self.target_key]
        elif isinstance(batch, (tuple, list)) and len(batch) == 2:
            target = batch[1]
        else:
            raise ValueError(f"Cannot find the targets: return them from `validation_step` under "
                             f"{self.target_key!r}, or pass `extract=`")
        return scores, target

    def format_table(self, results: Mapping[tuple[str, str], float] | None = None) -> str:
        """Metrics as rows, decoders as columns; ``*`` marks each row's best decoder."""
        results = self.results if results is None else results
        rows = list(dict.fromkeys(k for k, _ in results))
        cols = list(dict.fromkeys(d for _, d in results))
        better = {key: m.higher_is_better for name, m in self.metrics.items() for key in [self.pairs[name][0]]}
        width = max([len("metric")] + [len(r) for r in rows])
        cw = max([10] + [len(c) for c in cols])
        lines = ["metric".ljust(width) + "".join(c.rjust(cw + 2) for c in cols)]
        for r in rows:
            vals = {c: results[(r, c)] for c in cols if (r, c) in results}
            best = (max if better[r] else min)(vals.values()) if vals else None
            cells = [(f"{vals[c]:.4f}" + ("*" if vals[c] == best and len(vals) > 1 else " ")) if c in vals else "-"
                     for c in cols]
            lines.append(r.ljust(width) + "".join(x.rjust(cw + 2) for x in cells))
        return "\n".join(lines)

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer, pl_module, stage=None) -> None:
        self._to(pl_module.device)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._to(pl_module.device)
        self._reset()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if trainer.sanity_checking:
            return
        scores, target = self._extract(outputs, batch)
        scores = scores.detach()
        for m in self.metrics.values():
            m.update(scores, target)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            self._reset()
            return
        results = {}
        for name, m in self.metrics.items():
            value = m.compute()  # torchmetrics all-reduces total/count: every rank gets the global mean
            # The value is already global and identical on every rank.  sync_dist with "max" returns
            # it unchanged for any world size (a mean of identical floats need not be exact) and
            # avoids Lightning's "use sync_dist=True" warning for epoch-level values under DDP.
            pl_module.log(name, value, on_step=False, on_epoch=True, sync_dist=True, reduce_fx="max", batch_size=1)
            results[self.pairs[name]] = float(value)
        self.results = results
        self.history.append(dict(results))
        if self.print_table and trainer.is_global_zero:
            title = f"[{self.prefix or 'eval'}] epoch {trainer.current_epoch}"
            print(f"\n{title}\n{self.format_table(results)}", flush=True)
        self._reset()


class HierarchicalMetricsCallback(_CallbackLogic, _pl.Callback):
    """Computes and logs hierarchical metrics of several decoders during validation.

    ``validation_step`` returns a dict with the model's scores under ``output_key``
    ((B, L) float logits or probabilities of the leaves ``0..L-1``) and, unless the batch
    is ``(x, y)`` or a dict holding it, the targets under ``target_key`` ((B,) int leaf
    ids).  ``extract=(outputs, batch) -> (scores, target)`` handles anything else.

    At each validation epoch end, one value per pair is logged as
    ``"<prefix>/<metric key>/<decoder>"``, e.g. ``val/hf_beta[beta=0.5]/optimal`` or
    ``val/tree_distance/darts[lam=0.5]``; it appears in ``trainer.callback_metrics`` and
    in the loggers.  The sanity check is skipped.  ``results`` holds the last epoch's
    values ``{(metric key, decoder): float}``, ``history`` every epoch's.

    Args:
        hierarchy: the class tree.
        metrics: names, ``(name, params)`` pairs or built metrics.
        decoders: ``"optimal"`` (each metric's own Bayes-optimal decoder; skipped with a
            warning for ``jaccard``, which has none), heuristic names, ``(name, params)``.
        output_key, target_key: keys of the step output (and batch) to read.
        from_logits: ``None`` decides from ``output_key`` (``"logits"``/``"scores"`` -> True,
            ``"probs"``/``"probabilities"`` -> False); required with ``extract``.
        extract: optional ``(outputs, batch) -> (scores, target)``; must be picklable under ddp_spawn.
        prefix: first part of the logged names.
        print_table: print the epoch's results as a table (rank 0 only).
        validate: check scores and targets (one host sync each per batch and pair).

    Under DDP each rank updates :class:`HierarchicalMetric` states on the model's device;
    ``compute`` sums ``total``/``count`` across ranks, so the logged values are the means
    over the whole validation set.  They match a single-process run exactly when the
    DistributedSampler does not pad, i.e. the set size divides by the world size (up to
    float64 summation order for non-integer per-sample values).  All validation
    dataloaders are pooled.
    """


_FLAVOUR_CLASSES = {_pl.__name__: HierarchicalMetricsCallback}


def callback_class(flavour: str = "pytorch_lightning") -> type:
    """The callback class deriving from ``flavour``'s ``Callback`` (``"pytorch_lightning"`` or ``"lightning.pytorch"``).

    Only needed when both packages are installed and the Trainer comes from the one not
    imported first (``HierarchicalMetricsCallback`` derives from ``pytorch_lightning`` then).
    """
    if flavour not in _FLAVOUR_CLASSES:
        import importlib

        module = importlib.import_module(flavour)
        name = "HierarchicalMetricsCallback_" + flavour.replace(".", "_")
        cls = type(name, (_CallbackLogic, module.Callback), {"__doc__": HierarchicalMetricsCallback.__doc__,
                                                            "__module__": __name__})
        globals()[name] = cls  # importable by name, so ddp_spawn can pickle instances
        _FLAVOUR_CLASSES[flavour] = cls
    return _FLAVOUR_CLASSES[flavour]


_FLAVOUR_NAMES = {"HierarchicalMetricsCallback_pytorch_lightning": "pytorch_lightning",
                  "HierarchicalMetricsCallback_lightning_pytorch": "lightning.pytorch"}


def __getattr__(name: str):
    # A process unpickling a callback of the other flavour (ddp_spawn) has not called callback_class yet.
    if name in _FLAVOUR_NAMES:
        return callback_class(_FLAVOUR_NAMES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
