"""``DecodingHead``: an ``nn.Module`` that turns a trained model's scores into hierarchical predictions.

``forward`` builds the :class:`~hdecode_torch.Posterior` of the scores and calls the decoder.  Graphs
have modules of their own: ``export.py`` (``torch.export``, ONNX, the fixed-size decoding a graph
holds) and ``cuda_graphs.py`` (``cuda_graph=True``).  Also home of ``resolve_pair`` and
``top_k_metric``, which the torchmetrics layer shares.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..core.posterior import Posterior
from ..core.spec import label
from ..core.topk import TOPK_DECODERS, TOPK_METRICS, TopK, no_top_k_decoder
from ..core.logits import input_kind
from ..decoders import Decoder, get_decoder
from ..decoders.risk_control import RiskControl
from ..functional._pieces import certifies, certifying_metrics
from ..hierarchy import Hierarchy
from ..metrics import METRICS, BaseMetric, get_metric
from . import cuda_graphs
from . import export as exporting
from .export import tracing

__all__ = ["DecodingHead", "resolve_pair", "pair_name", "decoder_label"]


# --------------------------------------------------------------------------- specifications
def resolve_pair(hierarchy: Hierarchy, metric, decoder, validate: bool = True, **params) -> tuple[BaseMetric, Decoder]:
    """``(metric, decoder)`` from their specs (``get_metric`` / ``get_decoder``): ``decoder="optimal"`` is
    the metric's own Bayes-optimal decoder (``ValueError`` for a metric without one)."""
    m = get_metric(metric, hierarchy, **params)
    return m, get_decoder(decoder, hierarchy, metric=m, validate=validate)


def decoder_label(decoder: Decoder, metric: BaseMetric | None = None) -> str:
    """The decoder's part of :func:`~hdecode_torch.core.spec.label`: ``"optimal"`` for ``metric``'s own
    optimal decoder, else its label (``darts[lam=0.5]``, ``wu_palmer/optimal``)."""
    if metric is None:
        return label(decoder=decoder)
    whole = label(metric, decoder)
    return whole[len(metric.key) + 1:]


def pair_name(metric_key: str, decoder_key: str, prefix: str = "") -> str:
    """``label(metric_key, decoder_key, prefix=prefix, safe=True)`` (:func:`~hdecode_torch.core.spec.label`):
    ``pair_name("hf_beta[beta=0.5]", "optimal", "val")`` is ``"val_hf_beta0p5_optimal"``."""
    return label(metric_key, decoder_key, prefix=prefix, safe=True)


def _same_tree(a: Hierarchy, b: Hierarchy) -> bool:
    return a is b or a.same_tree(b)


def top_k_metric(decoder: Decoder, from_logits, what: str) -> BaseMetric | Decoder:
    """The metric whose decode takes a top-k input for ``decoder`` (its own optimal decoder; a heuristic that
    decodes top-k inputs itself: the heuristic), or the error
    saying why there is none: a heuristic decoder, a metric without a top-k decoder, or logits
    (``from_logits=True``: a top-k of logits cannot be completed, the softmax's normaliser is unknown).
    ``what`` names the caller in the errors."""
    if from_logits is True:
        raise ValueError(f"{what} was built with from_logits=True, but got a top-k list: the missing mass of a "
                         "top-k of logits is unknown (the softmax's normaliser needs every logit); pass the top-k "
                         "of the probabilities, probs.topk(k)")
    metric = getattr(decoder, "metric", None)
    if decoder.name != "optimal" or metric is None:
        if getattr(decoder, "accepts_topk", False):
            return decoder  # a heuristic computed on the list's support: its decode takes the list
        raise ValueError(f"{what} decodes with `{decoder.name}`, which does not decode top-k inputs: only the "
                         f"optimal decoders of {', '.join(TOPK_METRICS)} and the heuristics "
                         f"{', '.join(TOPK_DECODERS)} do")
    if not metric.accepts_topk:
        raise no_top_k_decoder(f"`{metric.name}`")
    return metric


_OUTSIDE_GRAPH: dict = {}


def _outside_graph():
    """``DecodingHead._decode`` excluded from ``torch.compile`` graphs.

    Wrapped on first use: ``torch.compiler.disable`` imports Dynamo, which takes longer than
    importing torch, and only a process that compiles has imported it already.
    """
    if "f" not in _OUTSIDE_GRAPH:
        _OUTSIDE_GRAPH["f"] = torch.compiler.disable(DecodingHead._decode)
    return _OUTSIDE_GRAPH["f"]


# --------------------------------------------------------------------------- the head
class DecodingHead(nn.Module):
    """Appended to a trained classifier, returns hierarchical predictions instead of scores.

    ``nn.Sequential(model, DecodingHead(h, "wu_palmer"))(x)`` gives (B,) int64 node ids (node and
    leaf metrics, every heuristic decoder) or (B, N) bool ancestor-closed node sets (set metrics
    with ``decoder="optimal"``).

    Args:
        hierarchy: the class tree; its leaves ``0..L-1`` are the model's output columns.
        metric: a metric name, ``(name, params)`` or built metric; ``params`` are its
            parameters (``beta=``, ``c=``).  Kept as :attr:`metric` to score the predictions.
            A built Decoder here is taken as the decoder (``DecodingHead(h, rc)`` is
            ``DecodingHead(h, decoder=rc)``, the metric then ``"accuracy"``).
        decoder: ``"optimal"`` (the metric's Bayes-optimal decoder), a heuristic name,
            ``(name, params)`` such as ``("darts", {"lam": 0.5})``, or a built Decoder.
        from_logits: what the input holds.  ``False`` (default): probabilities, each row
            non-negative and summing to 1.  ``True``: logits, a softmax is applied (input that
            looks like probabilities gets a warning: a softmax of probabilities is wrong).
            ``"auto"``: decided per batch on the device, probabilities if every row is a
            distribution, else logits.
        validate: check the input (one host sync per call); ``False`` on trusted hot paths, and
            required for a head traced into a graph (see below).
        cuda_graph: capture the decoding of CUDA inputs as a CUDA graph (see below).
        certify: return, with each top-k input's decisions, their certificate: ``forward`` gives
            ``(pred, certified, regret_bound)`` as ``metric.decode(topk, certify=True)`` does ((B,) int64 or
            sparse (B, N) sets, (B,) bool, (B,) float64): whether each decision is optimal under every completion the list is
            consistent with, and a bound on its expected-score regret otherwise.  For the optimal decoders
            of the metrics with a certificate (accuracy, lca_height, tree_distance, tree_distance_c, hamming); such
            a head takes top-k lists only (a dense row's decision is exact: a ``ValueError`` naming
            ``certify``), so it is not exported nor captured in a CUDA graph.

    Input: ``scores`` (B, L) or (L,) float32/float64/float16/bfloat16 on the head's device, or a top-k
    list of probabilities (``probs.topk(k)`` or a :class:`~hdecode_torch.TopK`) for the optimal decoders
    of accuracy, lca_height, tree_distance, tree_distance_c and hamming: the decision of its completed
    distribution, as ``metric.decode(topk)`` gives it (O(B·k·D), never the (B, L) table; a set metric's
    sets as a coalesced sparse COO bool (B, N) tensor, never the (B, N) mask).  A head built
    with ``from_logits=True`` refuses one (a top-k of logits has no known missing mass); ``"auto"``
    takes it as probabilities.  Not in graphs (export, CUDA graphs): decoded eagerly.

    The tree's ``parent`` array (N,) int64 is a buffer, so ``.to(device)``, ``state_dict``
    and ``torch.save`` carry it; ``forward`` uses the hierarchy's cached copy on the
    buffer's device.  Loading a ``state_dict`` saved from another tree of the same size
    rebuilds the hierarchy (canonical ids; original names and labels are not stored).  With a
    :class:`~hdecode_torch.RiskControl` decoder, its fitted λ is the 0-d float64 buffer ``lam``
    (NaN before ``fit``; saved as the decoder holds it at saving time), and loading sets the
    decoder's λ.

    **Graphs.**  A decoder can be part of a graph when no size inside it depends on the data
    (:attr:`traceable`): every heuristic decoder and the optimal decoders of every node and
    leaf metric and of ``hamming``; not ``hf_beta`` (its candidate sets depend on the data).
    Traced, the head runs the decoding of the current plan (the device's, or
    :func:`~hdecode_torch.plan_for`'s) in one chunk, with Wu-Palmer, Zhao and cost-matrix
    candidate pruning replaced by an exact fixed-size strategy: the dense (N, L) product,
    O(B·N·L), while the matrix fits, else root-path sums, O(B·N·E) for E leaf depths.  A graph cannot check its input (the check reads a flag on the host), so tracing a
    head built with ``validate=True`` is an error, except through :meth:`export` /
    :meth:`export_onnx`, which check the example eagerly and export the unchecked graph.
    Tree-only tables are built eagerly before a trace reads them.

    - ``torch.export.export`` (non-strict, the default) of the head or of a model ending in it
      works for traceable heads; :meth:`export` does it with a dynamic batch size.
    - ONNX: :meth:`export_onnx` exports on the CPU plan, whose per-level tree sums are standard
      operators (trees of up to ``MAX_LEVELS`` levels); the GPU plan's fused ``hdecode::``
      operators are unknown to ONNX.  ``from_logits="auto"`` decides per batch inside the model, as
      the eager head does.
    - ``torch.compile``: outside export, the head is excluded from compiled graphs (a graph
      break; it runs eagerly), because its decoders branch on data and read sizes from the
      device, and compiling them gained little or lost.  A compiled model ending in the head
      gives the eager head's output.
    - ``cuda_graph=True``: the first call on a CUDA input captures the decoding (after an eager
      warm-up) for that input's shape, dtype and device; calls with that shape copy the input
      into the graph's buffer and replay it, others decode eagerly.  With ``validate=True`` the
      input check is part of the graph: after the replay its flag is read (the call's one host
      read), and a false flag re-checks the input eagerly to raise the error (or give the
      warning) it stands for.  The output is a new tensor.  On CPU inputs the flag does nothing
      (one warning).  An untraceable decoder (``hf_beta``, ``jaccard``: their candidate counts
      are read from the device during the call) is a ValueError.
    """

    def __init__(self, hierarchy: Hierarchy, metric="accuracy", decoder="optimal", from_logits: bool | str = False,
                 validate: bool = True, cuda_graph: bool = False, certify: bool = False, **params):
        super().__init__()
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        input_kind(from_logits)  # checked here, not at the first batch
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"Expected `cuda_graph` to be a bool, but got {cuda_graph!r}")
        if not isinstance(certify, bool):
            raise TypeError(f"Expected `certify` to be a bool, but got {certify!r}")
        self.from_logits = from_logits if from_logits == "auto" else bool(from_logits)
        self.certify = certify
        self.validate = bool(validate)
        self.cuda_graph = cuda_graph
        self.register_buffer("parent", hierarchy.parent.detach().to("cpu", torch.long).clone())
        if isinstance(metric, Decoder):
            # DecodingHead(h, rc): a decoder object cannot be the metric, so it is the decoder (the metric
            # only names the pair then, as with decoder=...).
            if not (isinstance(decoder, str) and decoder == "optimal"):
                raise TypeError(f"Expected `metric` to be a metric, but got the decoder {metric!r} together with "
                                f"decoder={decoder!r}: pass one decoder, as decoder=...")
            metric, decoder = "accuracy", metric
        self._metric_spec = (metric, dict(params))
        self._decoder_spec = decoder
        self._build(hierarchy.to("cpu"))
        if isinstance(self.decoder, RiskControl):
            # The fitted λ is state: saved and loaded with the head (NaN: not fitted).
            self.register_buffer("lam", _lam_tensor(self.decoder))
        if certify:
            self._check_certify(cuda_graph)
        if cuda_graph and not self.traceable:
            raise ValueError(f"Expected a decoder with fixed sizes for `cuda_graph=True`, but {self._untraceable_reason()}")
        self.register_load_state_dict_post_hook(_rebuild_after_load)

    def _build(self, hierarchy: Hierarchy) -> None:
        metric, params = self._metric_spec
        if isinstance(metric, BaseMetric) and not _same_tree(metric.hierarchy, hierarchy):
            if metric.name not in METRICS.names():
                raise ValueError(f"Cannot rebuild the custom metric {metric!r} on a different tree")
            metric = (metric.name, dict(metric.params))
        dec = self._decoder_spec
        if isinstance(dec, Decoder) and not _same_tree(dec.hierarchy, hierarchy):
            raise ValueError(f"Cannot move the built decoder {dec!r} to a different tree; give the decoder by name")
        self._hierarchy = hierarchy
        self.metric, self.decoder = resolve_pair(hierarchy, metric, self._decoder_spec, self.validate, **params)
        self._graph = None  # the captured CUDA graph (cuda_graphs.py)
        self._unchecked_trace = False
        self._warned_cpu_graph = False

    def _check_certify(self, cuda_graph: bool) -> None:
        own = getattr(self.decoder, "metric", None)
        if self.decoder.name != "optimal" or own is None or not certifies(own):
            what = f"`{own.name}`" if self.decoder.name == "optimal" and own is not None else \
                f"the decoder `{self.decoder.name}`"
            raise ValueError(f"Expected `certify` to be False for {what}, which gives no certificate of a top-k "
                             f"decision, but got True (the optimal decoders of {', '.join(certifying_metrics())} do)")
        if self.from_logits is True:
            raise ValueError("Expected `certify` to be False with from_logits=True: a certificate is of a top-k list "
                             "of probabilities (a top-k of logits has no known missing mass)")
        if cuda_graph:
            raise ValueError("Expected `certify` to be False with `cuda_graph=True`: a certifying head decodes top-k "
                             "lists only, which are decoded eagerly")

    @property
    def hierarchy(self) -> Hierarchy:
        """The tree, on the device of the head's buffers."""
        return self._hierarchy.to(self.parent.device)

    @property
    def returns_sets(self) -> bool:
        """Whether ``forward`` returns (B, N) bool node sets rather than (B,) node ids."""
        return self.decoder.name == "optimal" and self.decoder.metric.kind == "set"

    @property
    def traceable(self) -> bool:
        """Whether the decoding has fixed sizes, so it can be exported or captured in a CUDA graph."""
        return self._untraceable_reason() is None

    def _untraceable_reason(self) -> str | None:
        own = getattr(self.decoder, "metric", None)
        if self.decoder.name == "optimal" and own is not None and own.data_dependent_sizes:
            return f"the optimal decoder of `{own.key}` cannot be traced: {own.data_dependent_sizes}"
        return None

    # ------------------------------------------------------------------ forward
    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        """scores: (B, L) or (L,) float probabilities (or logits, see ``from_logits``), or a top-k list of
        probabilities (a :class:`~hdecode_torch.TopK` or ``probs.topk(k)``, see the class docstring).

        Returns (B,) int64 node ids, or (B, N) bool node sets (:attr:`returns_sets`; sparse COO for a
        top-k list); () / (N,) for a 1-D input.  With ``certify=True``: ``(pred, certified, regret_bound)`` of a top-k list.
        """
        mode = tracing()
        if self.certify and mode == "export":
            self._refuse_graph_if_certifying()
        if mode == "export":
            return exporting.decode_traced(self, scores)
        if mode == "compile":
            return _outside_graph()(self, scores)
        return self._decode(scores)

    def _decode(self, scores) -> torch.Tensor:
        topk = TopK.of(scores)
        if topk is not None:
            self._checked_device(topk.values)
            metric = top_k_metric(self.decoder, self.from_logits, "This DecodingHead")
            if self.certify:
                return metric.decode(topk, validate=self.validate, certify=True)
            return metric.decode(topk, validate=self.validate)
        if self.certify:
            raise ValueError("This DecodingHead was built with `certify=True`, but got dense scores: their decision "
                             "is exact, there is no unknown completion to certify; pass a top-k list "
                             "(probs.topk(k) or hd.TopK), or build the head without `certify`")
        if self.cuda_graph:
            return cuda_graphs.decode_graphed(self, scores)
        return self._decode_eager(scores)

    def _checked_device(self, scores) -> Hierarchy:
        h = self.hierarchy
        if isinstance(scores, torch.Tensor) and scores.device != h.device:
            raise ValueError(f"Expected `scores` on the head's device {h.device}, but got {scores.device}; "
                             "move the head with .to(device)")
        return h

    def _decode_eager(self, scores) -> torch.Tensor:
        h = self._checked_device(scores)
        if isinstance(scores, torch.Tensor):
            scores = scores.detach()  # a decision has no gradient: inside nn.Sequential, no graph is kept
        post = Posterior(h, scores, from_logits=self.from_logits, validate=self.validate, name="scores")
        return self.decoder.decode(post)

    def _graph_body(self, h: Hierarchy, scores: torch.Tensor, check: bool = False):
        """:func:`~hdecode_torch.integrations.export.graph_body` of this head under the current plan."""
        return exporting.graph_body(self, h, scores, check)

    def _build_tables(self, h: Hierarchy, scores: torch.Tensor) -> None:
        """The tree-only tables a graph of this head reads, built under the current plan."""
        exporting.prepare_tables(self, scores)

    # ------------------------------------------------------------------ export
    def export(self, example: torch.Tensor, *, dynamic_batch: bool = True):
        """``torch.export.export`` of this head: an ``ExportedProgram`` mapping scores to predictions.

        example: (B, L) float scores on the head's device, B >= 2 (checked once here when
        ``validate=True``; the program does not check its values).  ``dynamic_batch``: the batch
        size is a symbolic dimension, so the program takes any B >= 0 (an empty batch gives an empty
        prediction, as the eager head does); else only the example's B.
        The program takes batches only: its ``module()`` refuses any other shape than (B, L) with a
        ``ValueError`` (a single sample is ``scores[None]``; unlike the eager head, a 1-D input
        cannot give an unbatched output, as a graph's rank is fixed).  That check is a hook of the
        returned module, which a program saved and loaded with ``torch.export`` (or a deep copy of
        the module) no longer has: torch's own checks then reject a wrong shape (torch 2.13: a 1-D
        input with an ``IndexError``).
        Non-strict tracing (Dynamo's strict mode cannot read the plan).  The program runs the plan of
        the example's device (or of an enclosing :func:`~hdecode_torch.plan_for`).  On the CPU plan it
        holds only standard ATen operators (trees of up to ``MAX_LEVELS`` levels): a saved
        program loads and runs without hdecode_torch.  On the GPU plan it may hold the fused
        ``hdecode::`` operators: ``import hdecode_torch.kernels.fused`` (which registers them)
        before ``torch.export.load``.  ValueError for a decoder without fixed sizes (:attr:`traceable`).
        """
        self._refuse_graph_if_certifying()
        return exporting.export(self, example, dynamic_batch)

    def export_onnx(self, example: torch.Tensor, path=None, *, dynamic_batch: bool = True, **kwargs):
        """ONNX export of this head (``torch.onnx.export(dynamo=True)``); returns the ``ONNXProgram``.

        example: (B, L) float scores, B >= 2 (checked once here when ``validate=True``; the model
        does not check its input).  ``path``: also save the model there.  Input ``"scores"``,
        output ``"prediction"`` ((B,) int64 or (B, N) bool), batch size dynamic unless
        ``dynamic_batch=False``.  A ``path`` whose folder is missing (``FileNotFoundError``) or which
        is a folder (``IsADirectoryError``) is refused before anything is traced.  Traced on the CPU plan (per-level tree sums: ScatterND
        additions, gathers, argmax), so trees deeper than ``MAX_LEVELS`` levels, whose sums
        use fused ``hdecode::`` operators, cannot be exported.  Needs ``onnx`` and ``onnxscript``
        (``pip install "hdecode_torch[export]"``); ``kwargs`` go to ``torch.onnx.export``.
        """
        self._refuse_graph_if_certifying()
        return exporting.export_onnx(self, example, path, dynamic_batch, **kwargs)

    def _refuse_graph_if_certifying(self) -> None:
        if self.certify:
            raise ValueError("A DecodingHead built with `certify=True` cannot be exported: it decodes top-k lists "
                             "only, eagerly; export a head without `certify`")

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if "lam" in self._buffers and isinstance(self.decoder, RiskControl):
            # The decoder may have been fitted after the head was built: save its λ as it is now.
            self._buffers["lam"] = _lam_tensor(self.decoder).to(self._buffers["lam"].device)
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def __getstate__(self):
        # A captured CUDA graph and its buffers belong to this process: captured again after loading.
        state = dict(super().__getstate__())
        state["_graph"] = None
        return state

    def extra_repr(self) -> str:
        return (f"{label(self.metric, self.decoder)}, from_logits={self.from_logits}, num_nodes={self.parent.numel()}"
                + (", cuda_graph=True" if self.cuda_graph else "") + (", certify=True" if self.certify else ""))


def _rebuild_after_load(module: DecodingHead, incompatible_keys) -> None:
    loaded = module.parent.detach().cpu()
    if not torch.equal(loaded, module._hierarchy.parent.cpu()):
        module._build(Hierarchy.from_parents(loaded.numpy()))
    if isinstance(module.decoder, RiskControl) and "lam" in module._buffers:
        lam = float(module.lam)
        module.decoder.lam = None if math.isnan(lam) else lam


def _lam_tensor(decoder: "RiskControl") -> torch.Tensor:
    """A fitted RiskControl's λ as a 0-d float64 tensor (NaN before ``fit``; a float64 holds the float exactly)."""
    return torch.tensor(math.nan if decoder.lam is None else decoder.lam, dtype=torch.float64)
