"""``DecodingHead``: an ``nn.Module`` that turns a trained model's scores into hierarchical predictions.

Also home of the small helpers the torchmetrics and Lightning layers share (they import
only torch): resolving ``metric`` / ``decoder`` specifications, and the last-batch
:class:`~hdecode_torch.Posterior` cache that lets several metrics of one batch compute
the node probabilities once.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

import torch
from torch import nn

from ..decoders import Decoder, get_decoder
from ..hierarchy import Hierarchy
from ..core.posterior import Posterior
from ..core.validation import input_kind
from ..metrics import BaseMetric, get_metric, has_optimal_decoder, list_metrics

__all__ = [
    "DecodingHead", "resolve_metric", "resolve_decoder", "has_optimal_decoder", "shared_posterior",
    "clear_posterior_cache",
]


# --------------------------------------------------------------------------- specifications
def _split_spec(spec, what: str) -> tuple[object, dict]:
    """``"name"`` | ``("name", {params})`` | an object -> (name or object, params)."""
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2 or not isinstance(spec[1], Mapping):
            raise ValueError(f"Expected a {what} as a name or a (name, params dict) pair, but got {spec!r}")
        return spec[0], dict(spec[1])
    return spec, {}


def resolve_metric(hierarchy: Hierarchy, metric, **params) -> BaseMetric:
    """A metric from a name, a ``(name, params)`` pair or a built metric (returned as is)."""
    spec, extra = _split_spec(metric, "metric")
    if isinstance(spec, BaseMetric):
        if params or extra:
            raise ValueError(f"Parameters {sorted({**extra, **params})} given for an already built metric {spec!r}")
        return spec
    return get_metric(spec, hierarchy, **{**extra, **params})


def resolve_decoder(hierarchy: Hierarchy, decoder, metric: BaseMetric | None = None,
                    validate: bool = True) -> Decoder:
    """A decoder from ``"optimal"``, a name, a ``(name, params)`` pair or a built :class:`Decoder`.

    ``"optimal"`` is the Bayes-optimal decoder of ``metric``; a metric without one raises
    ``ValueError`` here rather than ``NotImplementedError`` at the first batch.
    """
    spec, params = _split_spec(decoder, "decoder")
    if isinstance(spec, Decoder):
        if params:
            raise ValueError(f"Parameters {sorted(params)} given for an already built decoder {spec!r}")
        return spec
    if spec == "optimal" and "metric" not in params:
        if metric is None:
            raise ValueError("decoder='optimal' needs a `metric` whose Bayes-optimal decoder to use")
        if not has_optimal_decoder(metric):
            raise ValueError(f"Metric `{metric.key}` has no Bayes-optimal decoder; pass a heuristic decoder "
                             "instead, e.g. decoder='majority'")
        return get_decoder("optimal", hierarchy, metric=metric, validate=validate)
    params.setdefault("validate", validate)
    return get_decoder(spec, hierarchy, **params)


def decoder_label(decoder: Decoder, metric: BaseMetric | None = None) -> str:
    """``"optimal"`` for ``metric``'s own optimal decoder, else the decoder's key (e.g. ``darts[lam=0.5]``)."""
    own = getattr(decoder, "metric", None)
    if metric is not None and own is not None and (own is metric or own.key == metric.key):
        return "optimal"
    return decoder.key


# --------------------------------------------------------------------------- last-batch posterior cache
# One entry per thread: the Posterior of the last (tensor, hierarchy, options) seen.  A
# MetricCollection calls every member's update with the *same* tensor object, so an
# identity check (weakref + in-place version counter) is enough to share the node sums
# without hashing or comparing the data.  One batch stays referenced until the next one.
_local = threading.local()


def _version(x: torch.Tensor):
    try:
        return x._version
    except RuntimeError:  # inference tensors have no version counter
        return None


def _same_tree(a: Hierarchy, b: Hierarchy) -> bool:
    return a is b or a.same_tree(b)


def shared_posterior(hierarchy: Hierarchy, scores, *, from_logits: bool = False, validate: bool = True) -> Posterior:
    """The :class:`Posterior` of ``scores`` (B, L), reused if the same tensor object was just seen.

    ``scores``: (B, L) or (L,) float probabilities, or logits when ``from_logits``; a
    :class:`Posterior` is returned as is.  Reuse requires the same tensor object, not
    modified in place since, the same tree and the same options; tensors made under
    ``torch.inference_mode()`` have no in-place version counter and are never reused.
    """
    if isinstance(scores, Posterior):
        return scores
    if not isinstance(scores, torch.Tensor) or _version(scores) is None:
        # Inference tensors have no version counter: a buffer refilled in place would look unchanged.
        return Posterior(hierarchy, scores, from_logits=from_logits, validate=validate)
    entry = getattr(_local, "entry", None)
    options = (input_kind(from_logits), bool(validate))
    if (entry is not None and entry["ref"]() is scores and entry["version"] == _version(scores)
            and entry["options"] == options and _same_tree(entry["hierarchy"], hierarchy)):
        return entry["post"]
    post = Posterior(hierarchy, scores, from_logits=from_logits, validate=validate)
    _local.entry = {"ref": weakref.ref(scores), "version": _version(scores), "options": options,
                    "hierarchy": hierarchy, "post": post}
    return post


def clear_posterior_cache() -> None:
    """Drop this thread's cached last-batch Posterior (frees that batch's node tables)."""
    _local.entry = None


# --------------------------------------------------------------------------- the head
class DecodingHead(nn.Module):
    """Appended to a trained classifier, returns hierarchical predictions instead of scores.

    ``nn.Sequential(model, DecodingHead(h, "wu_palmer"))(x)`` gives (B,)
    int64 node ids (node and leaf metrics, every heuristic decoder) or (B, N) bool
    ancestor-closed node sets (set metrics with ``decoder="optimal"``).

    Args:
        hierarchy: the class tree; its leaves ``0..L-1`` are the model's output columns.
        metric: a metric name, ``(name, params)`` or built metric; ``params`` are its
            parameters (``beta=``, ``c=``).  Kept as :attr:`metric` to score the predictions.
        decoder: ``"optimal"`` (the metric's Bayes-optimal decoder), a heuristic name,
            ``(name, params)`` such as ``("darts", {"lam": 0.5})``, or a built Decoder.
        from_logits: what the input holds: ``False`` (default) probabilities, ``True`` logits (a
            softmax is applied; probability-looking input gets a warning), ``"auto"`` decide per batch
            (probabilities if every row is a distribution, else logits).
        validate: check the inputs (one host sync per call); ``False`` on trusted hot paths.

    Input: (B, L) or (L,) float32/float64/float16/bfloat16 on the head's device.

    The tree's ``parent`` array (N,) int64 is a buffer, so ``.to(device)``, ``state_dict``
    and ``torch.save`` carry it; ``forward`` uses the hierarchy's cached copy on the
    buffer's device.  Loading a ``state_dict`` saved from another tree of the same size
    rebuilds the hierarchy (canonical ids; original names and labels are not stored).

    ``torch.compile``: ``forward`` is excluded from compilation (``torch.compiler.disable``),
    so ``torch.compile(nn.Sequential(backbone, head))`` compiles the backbone and runs the
    head eagerly.  Measured on CPU (torch 2.13, tieredImageNet-H, B = 256, one thread)
    with the head compiled (``fullgraph=False``): the decoders branch on data and sync
    with the host (validation, ``int(count.max())`` sizes), so Dynamo splits them into
    3-8 graphs.  The first call took 2-30 s to compile, and steady-state times moved by
    under a millisecond or got worse (eager -> compiled): tree_distance 0.8 -> 0.4 ms,
    majority 0.7 -> 0.3 ms, darts 0.9 -> 2.1 ms, wu_palmer 7.7 -> 14 ms, hf_beta 16 -> 20 ms.  The inductor
    backend also returned wrong hF_β sets while an earlier candidate compaction scattered into
    a buffer allocated before a graph break; the hF_β decoder compiled whole now equals eager
    (tested), but with no speed to gain the head stays eager.  ``fullgraph=True`` fails at the first data-dependent
    branch.
    """

    def __init__(self, hierarchy: Hierarchy, metric="accuracy", decoder="optimal", from_logits: bool | str = False,
                 validate: bool = True, **params):
        super().__init__()
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        input_kind(from_logits)  # checked here, not at the first batch
        self.from_logits = from_logits if from_logits == "auto" else bool(from_logits)
        self.validate = bool(validate)
        self.register_buffer("parent", hierarchy.parent.detach().to("cpu", torch.long).clone())
        self._metric_spec = (metric, dict(params))
        self._decoder_spec = decoder
        self._build(hierarchy.to("cpu"))
        self.register_load_state_dict_post_hook(_rebuild_after_load)

    def _build(self, hierarchy: Hierarchy) -> None:
        metric, params = self._metric_spec
        if isinstance(metric, BaseMetric) and not _same_tree(metric.hierarchy, hierarchy):
            if metric.name not in list_metrics():
                raise ValueError(f"Cannot rebuild the custom metric {metric!r} on a different tree")
            metric = (metric.name, dict(metric.params))
        dec = self._decoder_spec
        if isinstance(dec, Decoder) and not _same_tree(dec.hierarchy, hierarchy):
            raise ValueError(f"Cannot move the built decoder {dec!r} to a different tree; give the decoder by name")
        self._hierarchy = hierarchy
        self.metric = resolve_metric(hierarchy, metric, **params)
        self.decoder = resolve_decoder(hierarchy, self._decoder_spec, self.metric, validate=self.validate)

    @property
    def hierarchy(self) -> Hierarchy:
        """The tree, on the device of the head's buffers."""
        return self._hierarchy.to(self.parent.device)

    @property
    def returns_sets(self) -> bool:
        """Whether ``forward`` returns (B, N) bool node sets rather than (B,) node ids."""
        return self.decoder.name == "optimal" and self.decoder.metric.kind == "set"

    @torch.compiler.disable
    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        """scores: (B, L) float logits (``from_logits=True``) or probabilities.  Returns (B,) int64 or (B, N) bool."""
        h = self.hierarchy
        if isinstance(scores, torch.Tensor) and scores.device != h.device:
            raise ValueError(f"Expected `scores` on the head's device {h.device}, but got {scores.device}; "
                             "move the head with .to(device)")
        if isinstance(scores, torch.Tensor):
            scores = scores.detach()  # a decision has no gradient: inside nn.Sequential, no graph is kept
        post = Posterior(h, scores, from_logits=self.from_logits, validate=self.validate, name="scores")
        return self.decoder.decode(post)

    def extra_repr(self) -> str:
        return (f"metric={self.metric.key}, decoder={decoder_label(self.decoder, self.metric)}, "
                f"from_logits={self.from_logits}, num_nodes={self.parent.numel()}")


def _rebuild_after_load(module: DecodingHead, incompatible_keys) -> None:
    loaded = module.parent.detach().cpu()
    if not torch.equal(loaded, module._hierarchy.parent.cpu()):
        module._build(Hierarchy.from_parents(loaded.numpy()))
