"""``HierarchicalMetricsCallback``: every requested (metric, decoder) pair, computed in validation and test.

Works with ``pytorch_lightning`` and, when that is the installed flavour, ``lightning.pytorch``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import torch

from ..core.plan import get_memory_budget
from ..core.posterior import Posterior
from ..core.conversion import compute_dtype
from ..core.index_checks import RangeCheck, as_targets, check_ranges
from ..core.logits import input_kind
from ..core.topk import CompletedTopK, TopK
from ..core.validation import leaf_row_flags, prepare_leaf_probs
from ..hierarchy import Hierarchy
from ..metrics import get_metric, has_optimal_decoder
from ..core.spec import label
from .module import decoder_label
from .torchmetrics import HierarchicalMetric, release_shared_batch, update_together

try:
    import pytorch_lightning as _pl
except ImportError:  # the unified `lightning` package
    try:
        import lightning.pytorch as _pl
    except ImportError as exc:
        raise ImportError('HierarchicalMetricsCallback needs PyTorch Lightning: pip install "hdecode_torch[lightning]" '
                          "(the `lightning` package; `pytorch-lightning` works too)") from exc

__all__ = ["HierarchicalMetricsCallback", "callback_class", "default_name"]

_LOGIT_KEYS = ("logits", "logit", "scores")
_PROB_KEYS = ("probs", "probabilities", "prob", "leaf_probs")
_STEP = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}
_STAGE = {"validate": "validation", "test": "test", "predict": "predict"}


def default_name(prefix: str, metric: str, decoder: str) -> str:
    """The logged name of a pair: its label (:func:`~hdecode_torch.core.spec.label`) after the stage's
    prefix, written with letters, digits, ``_`` and ``-`` only (``val_hf_beta0p5_optimal``,
    ``test_tree_distance_darts0p5``), so it works as a ``ModelCheckpoint`` monitor, in its ``filename``
    template and as a file name.

    prefix: the stage's prefix; metric, decoder: the pair's metric key and decoder label, such as
    ``"hf_beta[beta=0.5]"`` and ``"darts[lam=0.5]"`` or ``"optimal"``.
    """
    return label(metric, decoder, prefix=prefix, safe=True)


class _CallbackLogic:
    """The callback's behaviour, independent of which Lightning package supplies ``Callback``."""

    def __init__(self, hierarchy: Hierarchy, metrics: Sequence = ("accuracy",), decoders: Sequence = ("optimal",),
                 output_key: str = "logits", target_key: str = "target", from_logits: bool | str | None = None,
                 extract: Callable | None = None, prefix: str = "val", test_prefix: str | None = "test",
                 predict: bool = False, name_fn: Callable[[str, str, str], str] | None = None,
                 prog_bar: bool | Sequence = False, print_table: bool = False, validate: bool = True,
                 exact: bool = True):
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
                raise ValueError("With `extract=`, say what it returns: pass from_logits=True (logits), False "
                                 "(probabilities) or 'auto'")
            if output_key in _LOGIT_KEYS:
                from_logits = True
            elif output_key in _PROB_KEYS:
                from_logits = False
            else:
                raise ValueError(f"Cannot tell whether `output_key={output_key!r}` holds logits or probabilities: "
                                 "pass from_logits=True, False or 'auto'")
        for arg, value in (("prefix", prefix), ("test_prefix", test_prefix)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"Expected `{arg}` to be a str, but got {type(value).__name__}")
        if name_fn is not None and not callable(name_fn):
            raise TypeError(f"Expected `name_fn` to be a callable (prefix, metric, decoder) -> str, but got "
                            f"{type(name_fn).__name__}")
        self.hierarchy = hierarchy
        self.output_key, self.target_key = output_key, target_key
        self.extract = extract
        self.prefix, self.test_prefix, self.predict = prefix, test_prefix, bool(predict)
        self.name_fn = default_name if name_fn is None else name_fn
        self.print_table = bool(print_table)
        #: The pairs, ``{(metric key, decoder label): HierarchicalMetric}``, shared by the stages (one runs at a time).
        self.metrics: dict[tuple[str, str], HierarchicalMetric] = {}
        self.skipped: list[tuple[str, str]] = []
        for metric_spec in metrics:
            metric = get_metric(metric_spec, hierarchy)
            optimal_ok = None
            for decoder_spec in decoders:
                if decoder_spec == "optimal":
                    optimal_ok = has_optimal_decoder(metric) if optimal_ok is None else optimal_ok
                    if not optimal_ok:
                        self.skipped.append((metric.key, "optimal"))
                        continue
                # validate=False: the callback checks the rows itself, once per block (see _flush)
                m = HierarchicalMetric(hierarchy, metric, decoder_spec, from_logits=from_logits, validate=False,
                                       exact=exact)
                pair = (metric.key, decoder_label(m.decoder, metric))
                if pair in self.metrics:
                    raise ValueError(f"The pair {pair} is requested twice")
                self.metrics[pair] = m
        if self.skipped:
            warnings.warn(f"No Bayes-optimal decoder for {sorted({k for k, _ in self.skipped})}: "
                          "those metrics are reported for the heuristic decoders only", stacklevel=2)
        if not self.metrics:
            raise ValueError("No (metric, decoder) pair to compute; add a heuristic decoder")
        self.from_logits = next(iter(self.metrics.values())).from_logits
        self.validate = bool(validate)
        self._rows = _RowBuffer()
        self.names: dict[str, dict[tuple[str, str], str]] = {}
        for stage, pre in (("validate", prefix), ("test", test_prefix), ("predict", "predict" if predict else None)):
            if pre is not None:
                self.names[stage] = self._stage_names(stage, pre)
        self.prog_bar = self._prog_bar_pairs(prog_bar)
        self.results: dict[tuple[str, str], float] = {}
        self.history: list[dict[tuple[str, str], float]] = []
        self.test_results: dict[tuple[str, str], float] = {}
        self.predict_results: dict[tuple[str, str], float] = {}

    def _stage_names(self, stage, pre) -> dict[tuple[str, str], str]:
        names = {}
        for pair in self.metrics:
            name = self.name_fn(pre, *pair)
            if not isinstance(name, str) or not name:
                raise TypeError(f"Expected `name_fn` to return a non-empty str, but it returned {name!r} for {pair}")
            names[pair] = name
        if len(set(names.values())) != len(names):
            seen: dict[str, tuple] = {}
            for pair, name in names.items():
                if name in seen:
                    raise ValueError(f"Two pairs get the logged name {name!r} ({stage}): {seen[name]} and {pair}; "
                                     "give `name_fn` a name per pair")
                seen[name] = pair
        return names

    def _prog_bar_pairs(self, prog_bar) -> set[tuple[str, str]]:
        if isinstance(prog_bar, bool):
            return set(self.metrics) if prog_bar else set()
        if isinstance(prog_bar, str) or not isinstance(prog_bar, Sequence):
            raise TypeError("Expected `prog_bar` to be a bool or a list of pairs, e.g. prog_bar=['val_wu_palmer_optimal'] "
                            f"or prog_bar=[('wu_palmer', 'optimal')], but got {prog_bar!r}")
        lookup = {}
        for pair, m in self.metrics.items():
            lookup[pair] = lookup[m.name] = pair
            for names in self.names.values():
                lookup[names[pair]] = pair
        chosen = set()
        for item in prog_bar:
            key = tuple(item) if isinstance(item, list) else item
            if key not in lookup:
                valid = ", ".join(repr(n) for n in self.names.get("validate", {}).values())
                raise ValueError(f"Expected each entry of `prog_bar` to name a computed pair (a logged name such as "
                                 f"{valid}, or a (metric, decoder) tuple), but got {item!r}")
            chosen.add(lookup[key])
        return chosen

    @property
    def state_key(self) -> str:
        return self._generate_state_key(prefix=self.prefix, pairs=sorted(self.metrics))

    # ------------------------------------------------------------------ helpers
    def _to(self, device: torch.device) -> None:
        for m in self.metrics.values():
            m.to(device)

    def _reset(self) -> None:
        for m in self.metrics.values():
            m.reset()
        self._rows.clear()
        release_shared_batch()

    def _extract(self, outputs, batch, stage: str):
        step = _STEP[stage]
        if self.extract is not None:
            got = self.extract(outputs, batch)
            if not isinstance(got, (tuple, list)) or len(got) != 2:
                raise ValueError(f"Expected `extract` to return (scores, target), but it returned {type(got).__name__}")
            scores, target = got
        else:
            if not isinstance(outputs, Mapping) or self.output_key not in outputs:
                got = f"a dict with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else (
                    "None" if outputs is None else f"a {type(outputs).__name__}")
                raise ValueError(
                    f"HierarchicalMetricsCallback reads what `{step}` returns: expected a dict with key "
                    f"{self.output_key!r}, but got {got}. Return e.g. {{'loss': loss, {self.output_key!r}: scores, "
                    f"{self.target_key!r}: y}}, or pass `output_key=` or `extract=(outputs, batch) -> (scores, target)`")
            scores = outputs[self.output_key]
            if self.target_key in outputs:
                target = outputs[self.target_key]
            elif isinstance(batch, Mapping) and self.target_key in batch:
                target = batch[self.target_key]
            elif isinstance(batch, (tuple, list)) and len(batch) == 2:
                target = batch[1]
            else:
                raise ValueError(f"Cannot find the targets: return them from `{step}` under {self.target_key!r}, "
                                 "or pass `extract=`")
        return scores, target

    def _check_contract(self, scores, target, stage: str) -> None:
        """Shapes and types of the first batch of a stage, so a wrong step fails before any training."""
        step = _STEP[stage]
        L = self.hierarchy.num_leaves
        what = f"`{step}`'s scores ({self.output_key!r})" if self.extract is None else "`extract`'s scores"
        topk = TopK.of(scores)
        if topk is not None:
            if self.from_logits is True:
                raise ValueError(f"Expected {what} to be logits (from_logits=True), but got a top-k list: the missing "
                                 "mass of a top-k of logits is unknown (the softmax needs every logit); return "
                                 "probs.topk(k) of the probabilities, with output_key='probs' or from_logits=False")
            if topk.values.dim() != 2:
                raise ValueError(f"Expected {what} to be a top-k list of shape (B, k), but got "
                                 f"{tuple(topk.values.shape)}")
            scores = topk.values
        elif not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
            kind = f"dtype {scores.dtype}" if isinstance(scores, torch.Tensor) else type(scores).__name__
            raise ValueError(f"Expected {what} to be a float tensor (B, {L}) or a top-k list, but got {kind}")
        elif scores.dim() != 2 or scores.shape[1] != L:
            raise ValueError(f"Expected {what} to have shape (B, {L}) (one column per leaf of the hierarchy), but got "
                             f"{tuple(scores.shape)}")
        if not isinstance(target, torch.Tensor) or target.is_floating_point() or target.dtype == torch.bool:
            kind = f"dtype {target.dtype}" if isinstance(target, torch.Tensor) else type(target).__name__
            raise ValueError(f"Expected the targets of `{step}` to be an int tensor (B,) of leaf ids, but got {kind}")
        if target.shape != scores.shape[:1]:
            raise ValueError(f"Expected the targets of `{step}` to have shape ({scores.shape[0]},) (one per row of "
                             f"the scores), but got {tuple(target.shape)}")

    def format_table(self, results: Mapping[tuple[str, str], float] | None = None) -> str:
        """Metrics as rows (``↑`` higher is better, ``↓`` lower), decoders as columns; ``*`` marks each
        row's best decoder (ties included)."""
        results = self.results if results is None else results
        rows = list(dict.fromkeys(k for k, _ in results))
        cols = list(dict.fromkeys(d for _, d in results))
        better = {pair[0]: m.higher_is_better for pair, m in self.metrics.items()}
        labels = {r: f"{r} {'↑' if better[r] else '↓'}" for r in rows}
        width = max([len("metric")] + [len(x) for x in labels.values()])
        cw = max([10] + [len(c) for c in cols])
        lines = ["metric".ljust(width) + "".join(c.rjust(cw + 2) for c in cols)]
        for r in rows:
            vals = {c: results[(r, c)] for c in cols if (r, c) in results}
            best = (max if better[r] else min)(vals.values()) if vals else None
            cells = [(f"{vals[c]:.4f}" + ("*" if vals[c] == best and len(vals) > 1 else " ")) if c in vals else "-"
                     for c in cols]
            lines.append(labels[r].ljust(width) + "".join(x.rjust(cw + 2) for x in cells))
        lines.append("↑ higher is better, ↓ lower is better; * the best decoder of each metric.")
        return "\n".join(lines)

    # ------------------------------------------------------------------ stages
    def _start(self, pl_module, stage) -> None:
        if stage in self.names:
            self._to(pl_module.device)
            self._reset()

    def _batch(self, trainer, outputs, batch, stage, batch_idx, dataloader_idx) -> None:
        if stage not in self.names:
            return
        scores, target = self._extract(outputs, batch, stage)
        self._check_contract(scores, target, stage)  # shapes and dtypes only: no device work
        if trainer.sanity_checking:
            return  # the contract is checked; the values of an untrained model are not reported
        topk = TopK.of(scores)
        if topk is not None:
            self._update_topk(topk, target.detach(), (_STAGE[stage], dataloader_idx, batch_idx))
            return
        scores = scores.detach()
        if not self._rows.fits(scores):
            self._flush(stage)
            self._rows.allocate(scores, self._capacity(scores), self._expected_rows(trainer, stage, scores),
                                per_batch_flags=self.from_logits == "auto")
        as_probs = valid = None
        if self.from_logits == "auto":
            # "auto" decides per batch whether the scores are probabilities (as a HierarchicalMetric
            # updated with this batch would); the decision and the check are kept per row.
            flags = leaf_row_flags(scores, "auto")
            as_probs, valid = flags.is_dist.all(), flags.valid
        self._rows.append(scores, target.detach(), (_STAGE[stage], dataloader_idx, batch_idx), as_probs, valid)

    def _update_topk(self, topk: TopK, target: torch.Tensor, where) -> None:
        """Score every pair on a batch of top-k lists, decoded at once (O(B·k·D) per decoder, never (B, L): not
        buffered, as a block of dense rows is): each pair's value is that of its metric's top-k decode, as
        ``HierarchicalMetric.update(topk, target)`` gives it; the batch is checked first (one host read)."""
        topk = TopK(topk.values.detach(), topk.indices.detach(), topk.missing, topk.prior)
        if self.validate:
            stage, dataloader_idx, batch_idx = where
            try:
                CompletedTopK(self.hierarchy, topk, True)
                t = as_targets(target, self.hierarchy.num_leaves, name="target")
                check_ranges([RangeCheck(t, self.hierarchy.num_leaves, "target", "leaf ids")])
            except ValueError as exc:
                at = f"{stage} batch {batch_idx}" + (f" of dataloader {dataloader_idx}" if dataloader_idx else "")
                raise ValueError(f"HierarchicalMetricsCallback, {at}: {exc}") from None
        for m in self.metrics.values():
            m.update(topk, target)

    def _capacity(self, scores: torch.Tensor) -> int:
        """Rows buffered before decoding: the buffer, the block's probabilities and node table within
        ``get_memory_budget()``."""
        h = self.hierarchy
        c = torch.empty((), dtype=compute_dtype(scores.dtype)).element_size()
        per_row = h.num_leaves * (scores.element_size() + c) + h.num_nodes * c + 8 + 2
        return max(int(scores.shape[0]), get_memory_budget() // per_row)

    @staticmethod
    def _expected_rows(trainer, stage, scores) -> int | None:
        """The stage's rows if every batch has the first one's size (None when the loader has no length)."""
        batches = {"validate": "num_val_batches", "test": "num_test_batches", "predict": "num_predict_batches"}[stage]
        try:
            total = sum(getattr(trainer, batches))
        except (AttributeError, TypeError):
            return None
        return int(total) * int(scores.shape[0]) if total != float("inf") else None

    def _flush(self, stage) -> None:
        """Check the buffered rows (one host read), decode them once per decoder and score every pair."""
        rows = self._rows
        if not rows.count:
            rows.clear()
            return
        x, t = rows.scores[:rows.count], rows.target[:rows.count]
        h = self.hierarchy
        kind = input_kind(self.from_logits)
        if self.validate:
            flags = leaf_row_flags(x, self.from_logits) if kind != "auto" else None
            valid = flags.valid if flags is not None else rows.valid[:rows.count]
            target_ok = (t >= 0) & (t < h.num_leaves)
            checks = [valid.all(), target_ok.all()] + ([flags.is_dist.all()] if kind == "logits" else [])
            ok = torch.stack(checks).tolist()  # the block's one host read
            if not (ok[0] and ok[1]):
                self._raise_invalid_batch(x, t, valid, target_ok)
            if kind == "logits" and ok[2] and h.num_leaves > 1:
                warnings.warn("`scores` looks like probabilities (non-negative rows summing to 1), but from_logits="
                              "True applies a softmax to it, which is then wrong: pass from_logits=False for "
                              "probabilities (or from_logits='auto')", UserWarning, stacklevel=2)
        if kind == "auto":
            xc = x.to(compute_dtype(x.dtype))
            x, kind = torch.where(rows.as_probs[:rows.count, None], xc, torch.softmax(xc, dim=1)), "probs"
        post = Posterior(h, x, from_logits=kind == "logits", validate=False, name="scores")
        post.node  # node probabilities of the whole block, sliced by decoders that decode it in chunks
        update_together(self.metrics.values(), post, t)  # each decoder decodes the block once
        release_shared_batch()
        rows.clear()

    def _raise_invalid_batch(self, x, t, valid, target_ok) -> None:
        """The error of the first batch with an invalid row, with the message of the per-batch check."""
        first = int((~(valid & target_ok)).nonzero()[0])
        start, stop, (stage, dataloader_idx, batch_idx) = next(b for b in self._rows.batches if b[0] <= first < b[1])
        where = f"{stage} batch {batch_idx}" + (f" of dataloader {dataloader_idx}" if dataloader_idx else "")
        try:
            if not bool(valid[first]):
                prepare_leaf_probs(x[start:stop], self.hierarchy.num_leaves, name="scores",
                                   from_logits=self.from_logits)
            target = as_targets(t[start:stop], self.hierarchy.num_leaves, name="target")
            check_ranges([RangeCheck(target, self.hierarchy.num_leaves, "target", "leaf ids")])
        except ValueError as exc:
            raise ValueError(f"HierarchicalMetricsCallback, {where}: {exc}") from None
        raise ValueError(f"HierarchicalMetricsCallback, {where}: row {first - start} failed the input check")

    def _end(self, trainer, pl_module, stage) -> dict[tuple[str, str], float] | None:
        if stage not in self.names:
            return None
        if trainer.sanity_checking:
            self._reset()
            return None
        self._flush(stage)
        values = {}
        for pair, m in self.metrics.items():
            value = m.compute()  # every process gets the value over all processes' samples (see the class docstring)
            if stage != "predict":  # Lightning does not log in predict
                # Already global and identical on every rank: sync_dist with "max" returns it unchanged for
                # any world size (a mean of identical floats need not be exact) and avoids Lightning's
                # "use sync_dist=True" warning for epoch-level values under DDP.
                pl_module.log(self.names[stage][pair], value, on_step=False, on_epoch=True, sync_dist=True,
                              reduce_fx="max", batch_size=1, prog_bar=pair in self.prog_bar)
            values[pair] = value
        # One host read for every pair's value.
        results = dict(zip(values, torch.stack(list(values.values())).tolist()))
        if self.print_table and trainer.is_global_zero:
            pre = {"validate": self.prefix, "test": self.test_prefix, "predict": "predict"}[stage]
            print(f"\n[{pre}] epoch {trainer.current_epoch}\n{self.format_table(results)}", flush=True)
        self._reset()
        return results

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer, pl_module, stage=None) -> None:
        self._to(pl_module.device)

    def on_validation_epoch_start(self, trainer, pl_module) -> None:
        self._start(pl_module, "validate")

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, outputs, batch, "validate", batch_idx, dataloader_idx)

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        results = self._end(trainer, pl_module, "validate")
        if results is not None:
            self.results = results
            self.history.append(dict(results))

    def on_test_epoch_start(self, trainer, pl_module) -> None:
        self._start(pl_module, "test")

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, outputs, batch, "test", batch_idx, dataloader_idx)

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        results = self._end(trainer, pl_module, "test")
        if results is not None:
            self.test_results = results

    def on_predict_epoch_start(self, trainer, pl_module) -> None:
        self._start(pl_module, "predict")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._batch(trainer, outputs, batch, "predict", batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer, pl_module) -> None:
        results = self._end(trainer, pl_module, "predict")
        if results is not None:
            self.predict_results = results

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The validation history and the last results, as plain lists (loadable with ``weights_only=True``)."""
        def rows(results):
            return [[m, d, v] for (m, d), v in results.items()]
        return {"history": [rows(r) for r in self.history], "results": rows(self.results),
                "test_results": rows(self.test_results)}

    def load_state_dict(self, state_dict: Mapping) -> None:
        def pairs(rows):
            return {(m, d): float(v) for m, d, v in rows}
        self.history = [pairs(r) for r in state_dict.get("history", [])]
        self.results = pairs(state_dict.get("results", []))
        self.test_results = pairs(state_dict.get("test_results", []))


class _RowBuffer:
    """Rows of one stage waiting to be decoded, on their device: the scores as the step returned them,
    the targets (int64), and for ``from_logits="auto"`` each row's batch decision and check."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.scores = self.target = self.as_probs = self.valid = None
        self.count = 0
        #: (first row, end row, (stage, dataloader_idx, batch_idx)) of each buffered batch.
        self.batches: list[tuple[int, int, tuple]] = []

    def fits(self, scores: torch.Tensor) -> bool:
        buf = self.scores
        return (buf is not None and buf.dtype == scores.dtype and buf.device == scores.device
                and self.count + scores.shape[0] <= buf.shape[0])

    def allocate(self, scores: torch.Tensor, capacity: int, expected: int | None, per_batch_flags: bool) -> None:
        """An empty buffer of ``capacity`` rows for ``scores``' dtype and device (``expected`` rows when
        fewer are coming)."""
        rows = capacity if expected is None else max(int(scores.shape[0]), min(capacity, expected))
        dev = scores.device
        self.clear()
        self.scores = torch.empty((rows, scores.shape[1]), dtype=scores.dtype, device=dev)
        self.target = torch.empty(rows, dtype=torch.long, device=dev)
        if per_batch_flags:
            self.as_probs = torch.empty(rows, dtype=torch.bool, device=dev)
            self.valid = torch.empty(rows, dtype=torch.bool, device=dev)

    def append(self, scores, target, where, as_probs=None, valid=None) -> None:
        a, b = self.count, self.count + scores.shape[0]
        self.scores[a:b].copy_(scores)
        self.target[a:b].copy_(target)
        if as_probs is not None:
            self.as_probs[a:b].copy_(as_probs)
            self.valid[a:b].copy_(valid)
        self.batches.append((a, b, where))
        self.count = b


class HierarchicalMetricsCallback(_CallbackLogic, _pl.Callback):
    """Computes and logs hierarchical metrics of several decoders in validation and test.

    **What the step returns.**  ``validation_step`` (and ``test_step``) returns a dict with the
    model's scores under ``output_key`` ((B, L) float, one column per leaf ``0..L-1``) and, unless
    the batch is ``(x, y)`` or a dict holding ``target_key``, the targets under ``target_key``
    ((B,) int leaf ids), e.g. ``return {"loss": loss, "logits": logits, "target": y}``.
    ``extract=(outputs, batch) -> (scores, target)`` handles anything else.  The scores may also be
    a top-k list of probabilities (``probs.topk(k)`` or a :class:`~hdecode_torch.TopK`, with
    ``output_key="probs"`` or ``from_logits=False``) for the pairs whose decoder decodes one: each batch
    is decoded at once, never as the (B, L) table, and each value is that of the metric's top-k decode
    (``HierarchicalMetric.update(topk, target)``).  The contract (types
    and shapes) is checked on every batch, the sanity check's included, so a step that returns
    only the loss fails before the first training epoch.

    **What it costs.**  Per batch, the scores and targets are copied into a buffer on their
    device: two copies, no host read, no decoding.  At the end of the epoch, or once the buffer
    holds as many rows as fit in :func:`~hdecode_torch.get_memory_budget` together with their
    probabilities and node table, the buffered block is checked (one host read: a bad row raises
    then, naming its batch, with the message of the per-batch check), turned into one
    :class:`~hdecode_torch.Posterior` (node probabilities summed once), decoded once per distinct
    decoder (each heuristic once for every metric, each optimal decoder once), and each metric
    scores its decoders' node predictions together.  The values reach the host in one read at
    the end of the epoch.  So an epoch costs about one decoding of the stage's rows per decoder,
    in large blocks, plus a few operators per pair to reduce and log the values.

    **What is logged.**  At the end of each validation epoch, one value per pair, named by
    ``name_fn(prefix, metric key, decoder label)``; the default (:func:`default_name`) is the pair's
    label (:func:`~hdecode_torch.core.spec.label`) after the prefix, written with letters, digits
    and ``_``: ``val_<metric>_<decoder>`` with parameter values appended and the decimal point written
    ``p``: ``val_hf_beta0p5_optimal``, ``val_tree_distance_darts0p5``, ``val_accuracy_majority``.
    These names work as ``ModelCheckpoint(monitor="val_hf_beta0p5_optimal")`` and in its
    ``filename="{epoch}-{val_hf_beta0p5_optimal:.3f}"``.  ``trainer.test`` logs the same pairs
    with ``test_prefix`` (``test_hf_beta0p5_optimal``; ``None`` skips the test stage);
    ``predict=True`` also computes them in ``trainer.predict`` (into :attr:`predict_results`,
    not logged: Lightning does not log in predict).  The sanity check is not reported.

    Attributes: ``results`` (the last validation epoch's values ``{(metric key, decoder
    label): float}``), ``history`` (every validation epoch's, kept across a resume from a
    checkpoint through ``state_dict``/``load_state_dict``), ``test_results``,
    ``predict_results``, ``names`` (``{stage: {pair: logged name}}``), ``metrics``
    (``{pair: HierarchicalMetric}``, updated once per block; they leave the check to the callback).

    Args:
        hierarchy: the class tree.
        metrics: names, ``(name, params)`` pairs or built metrics.
        decoders: ``"optimal"`` (each metric's own Bayes-optimal decoder; skipped with a
            warning for a metric without one), heuristic names, ``(name, params)``.
        output_key, target_key: keys of the step output (and batch) to read.
        from_logits: what the scores hold: ``True`` logits, ``False`` probabilities, ``"auto"``
            decided per batch; ``None`` decides from ``output_key`` (``"logits"``/``"scores"`` ->
            True, ``"probs"``/``"probabilities"`` -> False) and is required with ``extract``.
        extract: optional ``(outputs, batch) -> (scores, target)``; must be picklable under ddp_spawn.
        prefix, test_prefix: first part of the logged names in validation and test.
        predict: also compute the pairs in ``trainer.predict`` (``predict_step`` returns the same dict).
        name_fn: ``(prefix, metric key, decoder label) -> logged name``, e.g.
            ``lambda p, m, d: f"{p}/{m}/{d}"`` for the names of earlier versions.
        prog_bar: ``True`` shows every pair in the progress bar; a list chooses pairs, by logged
            name or ``(metric key, decoder label)``.
        print_table: print each epoch's results as a table (rank 0 only).
        validate: check the scores and targets of each block (one host read per block, before
            decoding it); ``False`` skips the check.
        exact: the :class:`HierarchicalMetric` states (below).

    **Under DDP** each rank updates :class:`HierarchicalMetric` states on the model's device.
    With ``exact=True`` (default) they are the per-sample values (float64, 8 bytes per sample
    and pair), concatenated across ranks by ``compute``, which sums them in sorted order: the
    logged mean is bitwise the same for any number of processes or batch split.  With
    ``exact=False`` only a sum and a count are kept and summed across ranks (constant memory,
    equal up to float64 rounding).  Either way the value is the mean over every rank's samples;
    it equals a single-process run when the DistributedSampler does not pad, i.e. the set size
    divides by the world size.  All dataloaders of a stage are pooled.
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
