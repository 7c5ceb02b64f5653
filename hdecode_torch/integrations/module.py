"""``DecodingHead``: an ``nn.Module`` that turns a trained model's scores into hierarchical predictions.

Also home of the small helpers the torchmetrics and Lightning layers share (they import
only torch): building a (metric, decoder) pair from specifications and naming it.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
import warnings

import torch
from torch import nn

from ..core.plan import MAX_LEVELS, plan_for, resolve_plan
from ..core.posterior import Posterior
from ..core.topk import TOPK_METRICS, TopK, no_top_k_decoder
from ..core.conversion import compute_dtype
from ..core.logits import input_kind
from ..decoders import Decoder, get_decoder
from ..decoders.risk_control import RiskControl
from ..hierarchy import Hierarchy
from ..metrics import METRICS, BaseMetric, get_metric

__all__ = ["DecodingHead", "resolve_pair", "pair_name", "decoder_label"]


# --------------------------------------------------------------------------- specifications
def resolve_pair(hierarchy: Hierarchy, metric, decoder, validate: bool = True, **params) -> tuple[BaseMetric, Decoder]:
    """``(metric, decoder)`` from their specs (``get_metric`` / ``get_decoder``): ``decoder="optimal"`` is
    the metric's own Bayes-optimal decoder (``ValueError`` for a metric without one)."""
    m = get_metric(metric, hierarchy, **params)
    return m, get_decoder(decoder, hierarchy, metric=m, validate=validate)


def decoder_label(decoder: Decoder, metric: BaseMetric | None = None) -> str:
    """``"optimal"`` for ``metric``'s own optimal decoder, else the decoder's key (e.g. ``darts[lam=0.5]``)."""
    own = getattr(decoder, "metric", None)
    if metric is not None and own is not None and (own is metric or own.key == metric.key):
        return "optimal"
    return decoder.key


def _slug(key: str) -> str:
    """``name[p=v]`` -> ``namev``; ``name[p=v,q=w]`` -> ``name_pv_qw``; a decimal point becomes ``p``, and any
    other character than letters, digits, ``-`` and ``_`` becomes ``_``."""
    match = re.fullmatch(r"([^\[]*)\[(.*)\]", key)
    if match:
        name, inner = match.groups()
        items = [kv.split("=", 1) if "=" in kv else ["", kv] for kv in inner.split(",")]
        key = name + (items[0][1] if len(items) == 1 else "".join(f"_{k}{v}" for k, v in items))
    key = re.sub(r"(?<=\d)\.(?=\d)", "p", key)
    return re.sub(r"[^A-Za-z0-9_\-]", "_", key)


def pair_name(metric_key: str, decoder_key: str, prefix: str = "") -> str:
    """A name for a (metric, decoder) pair that every consumer accepts: logger keys, ``ModelCheckpoint``
    monitors and file-name templates, file names, ``nn.Module`` names (no ``.``, ``/`` or brackets).

    ``[<prefix>_]<metric>_<decoder>``, each parameter value appended to its component with the
    decimal point written ``p``: ``pair_name("hf_beta[beta=0.5]", "optimal", "val")`` is
    ``"val_hf_beta0p5_optimal"``, ``pair_name("tree_distance", "darts[lam=1]")`` is
    ``"tree_distance_darts1"``.
    """
    return "_".join(p for p in (prefix, _slug(metric_key), _slug(decoder_key)) if p)


def _same_tree(a: Hierarchy, b: Hierarchy) -> bool:
    return a is b or a.same_tree(b)


# --------------------------------------------------------------------------- the head
def _fixed_size_metric(metric: BaseMetric, h: Hierarchy) -> BaseMetric:
    """``metric``, or an exact equivalent whose decoding has no data-dependent size (for graphs), under
    the plan of ``h``'s device.

    A pruned candidate list (``strategy="candidates"``, or ``"auto"`` where the CPU plan picks it)
    has as many entries as (node, sample) pairs survive the pruning; the graph scores every node
    instead (the dense product while the (N, L) matrix fits, root-path sums otherwise).
    """
    from ..metrics.cost_matrix import CostMatrixMetric
    from ..metrics.strategies import StrategyNodeMetric

    if isinstance(metric, StrategyNodeMetric) and metric.resolved_strategy(resolve_plan(h, h.device), h) == "candidates":
        fixed = copy.copy(metric)
        fixed.strategy = "dense" if metric._dense_fits(h) else "structural"
        return fixed
    if isinstance(metric, CostMatrixMetric) and metric.strategy != "dense" and metric.is_hierarchically_reasonable:
        fixed = copy.copy(metric)
        fixed.strategy = "dense"
        return fixed
    return metric


def _real_tensors(example: torch.Tensor):
    """A context in which torch ops make real tensors, even while ``example`` is being traced.

    Tree-only tables are cached on the hierarchy; built during a trace they would be fake tensors
    (and stay cached), so they are built for real, outside the trace, before it reads them.
    """
    try:
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
        from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    except ImportError:  # pragma: no cover - older torch: tables must be built by an eager call first
        return contextlib.nullcontext()
    if not isinstance(example, FakeTensor) and _tracing() != "export":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(unset_fake_temporarily())
    stack.enter_context(disable_proxy_modes_tracing())
    return stack


_OUTSIDE_GRAPH: dict = {}


def top_k_metric(decoder: Decoder, from_logits, what: str) -> BaseMetric:
    """The metric whose decode takes a top-k input for ``decoder`` (its own optimal decoder), or the error
    saying why there is none: a heuristic decoder, a metric without a top-k decoder, or logits
    (``from_logits=True``: a top-k of logits cannot be completed, the softmax's normaliser is unknown).
    ``what`` names the caller in the errors."""
    if from_logits is True:
        raise ValueError(f"{what} was built with from_logits=True, but got a top-k list: the missing mass of a "
                         "top-k of logits is unknown (the softmax's normaliser needs every logit); pass the top-k "
                         "of the probabilities, probs.topk(k)")
    metric = getattr(decoder, "metric", None)
    if decoder.name != "optimal" or metric is None:
        raise ValueError(f"{what} decodes with `{decoder.name}`, which does not decode top-k inputs: only the "
                         f"optimal decoders of {', '.join(TOPK_METRICS)} do (decoder=\"optimal\")")
    if not metric.accepts_topk:
        raise no_top_k_decoder(f"`{metric.name}`")
    return metric


def _outside_graph():
    """``DecodingHead._decode`` excluded from ``torch.compile`` graphs.

    Wrapped on first use: ``torch.compiler.disable`` imports Dynamo, which takes longer than
    importing torch, and only a process that compiles has imported it already.
    """
    if "f" not in _OUTSIDE_GRAPH:
        _OUTSIDE_GRAPH["f"] = torch.compiler.disable(DecodingHead._decode)
    return _OUTSIDE_GRAPH["f"]


def _tracing() -> str | None:
    """``"compile"`` while Dynamo traces (``torch.compile``, strict export), ``"export"`` under non-strict
    ``torch.export`` (and the ONNX exporter, which uses it), else None.

    Dynamo is asked first: torch 2.7 to at least 2.11 (not 2.13) fold ``torch.compiler.is_exporting()``
    to True in every frame Dynamo traces, ``torch.compile`` included.  Non-strict export runs the Python
    code itself, where ``is_dynamo_compiling()`` is False; torch without ``is_exporting`` (2.6) marks it
    by ``is_compiling()`` alone.
    """
    compiler = torch.compiler
    if compiler.is_dynamo_compiling():
        return "compile"
    if _is_exporting() if _is_exporting is not None else compiler.is_compiling():
        return "export"
    return "compile" if compiler.is_compiling() else None


_is_exporting = getattr(torch.compiler, "is_exporting", None)


class _CapturedGraph:
    """One CUDA graph of the head's decoding for a fixed input shape, dtype and device."""

    def __init__(self, key, graph, static_in, static_out, static_flag=None):
        self.key, self.graph, self.static_in, self.static_out = key, graph, static_in, static_out
        self.static_flag = static_flag  # the input check's flag, computed in the graph


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

    Input: ``scores`` (B, L) or (L,) float32/float64/float16/bfloat16 on the head's device, or a top-k
    list of probabilities (``probs.topk(k)`` or a :class:`~hdecode_torch.TopK`) for the optimal decoders
    of accuracy, lca_height, tree_distance and tree_distance_c: the decision of its completed
    distribution, as ``metric.decode(topk)`` gives it (O(B·k·D), never the (B, L) table).  A head built
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
                 validate: bool = True, cuda_graph: bool = False, **params):
        super().__init__()
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        input_kind(from_logits)  # checked here, not at the first batch
        if not isinstance(cuda_graph, bool):
            raise TypeError(f"Expected `cuda_graph` to be a bool, but got {cuda_graph!r}")
        self.from_logits = from_logits if from_logits == "auto" else bool(from_logits)
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
        self._graph: _CapturedGraph | None = None
        self._unchecked_trace = False
        self._warned_cpu_graph = False

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

        Returns (B,) int64 node ids, or (B, N) bool node sets (:attr:`returns_sets`); () / (N,) for
        a 1-D input.
        """
        mode = _tracing()
        if mode == "export":
            if TopK.of(scores) is not None:
                raise ValueError("A DecodingHead cannot export the decoding of a top-k list: its support's size "
                                 "depends on the data; decode it eagerly")
            return self._decode_traced(scores)
        if mode == "compile":
            return _outside_graph()(self, scores)
        return self._decode(scores)

    def _decode(self, scores) -> torch.Tensor:
        topk = TopK.of(scores)
        if topk is not None:
            self._checked_device(topk.values)
            metric = top_k_metric(self.decoder, self.from_logits, "This DecodingHead")
            return metric.decode(topk, validate=self.validate)
        return self._decode_graphed(scores) if self.cuda_graph else self._decode_eager(scores)

    def _checked_device(self, scores) -> Hierarchy:
        h = self.hierarchy
        if isinstance(scores, torch.Tensor) and scores.device != h.device:
            raise ValueError(f"Expected `scores` on the head's device {h.device}, but got {scores.device}; "
                             "move the head with .to(device)")
        return h

    def _decode_eager(self, scores, validate: bool | None = None) -> torch.Tensor:
        h = self._checked_device(scores)
        if isinstance(scores, torch.Tensor):
            scores = scores.detach()  # a decision has no gradient: inside nn.Sequential, no graph is kept
        check = self.validate if validate is None else validate
        post = Posterior(h, scores, from_logits=self.from_logits, validate=check, name="scores")
        return self.decoder.decode(post)

    # ------------------------------------------------------------------ graphs
    def _graph_decoder(self, h: Hierarchy) -> Decoder:
        """The decoder a graph runs under the current plan: fixed sizes, exact (ValueError if none)."""
        reason = self._untraceable_reason()
        if reason is not None:
            raise ValueError(f"This DecodingHead cannot be part of a graph: {reason}. Run it eagerly (outside "
                             "the exported or captured part of the model)")
        own = getattr(self.decoder, "metric", None)
        if self.decoder.name != "optimal" or own is None:
            return self.decoder
        fixed = _fixed_size_metric(own, h)
        if fixed is own:
            return self.decoder
        dec = copy.copy(self.decoder)
        dec.metric = fixed
        return dec

    def _graph_body(self, h: Hierarchy, scores: torch.Tensor, check: bool = False):
        """The decoding a graph holds: one chunk, fixed sizes, no host read.  With ``check``, also the
        input check's flag, computed in the graph: ``(output, flag)``, flag a 0-d bool on the device,
        true when there is nothing to raise or warn."""
        post = Posterior(h, scores, from_logits=self.from_logits, validate=check, name="scores", defer_check=True)
        out = self._graph_decoder(h)._decode(post)
        out = out[0] if post.unbatched else out
        return (out, post.check_flag()) if check else out

    def _build_tables(self, h: Hierarchy, scores: torch.Tensor) -> None:
        """Build (once per tree, device, plan and dtype) every tree-only table the graph reads."""
        dtype = compute_dtype(scores.dtype)
        key = ("graph_tables", self.decoder.key, self.metric.key, resolve_plan(h, h.device).name, dtype)

        def build():
            with _real_tensors(scores):
                uniform = torch.full((2, h.num_leaves), 1.0 / h.num_leaves, dtype=dtype, device=h.device)
                self._graph_body(h, uniform)
            return True
        h.cached(key, build)

    def _decode_traced(self, scores) -> torch.Tensor:
        if not isinstance(scores, torch.Tensor):
            raise TypeError(f"Expected `scores` to be a torch.Tensor, but got {type(scores).__name__}")
        if self.validate and not self._unchecked_trace:
            raise ValueError("Expected a DecodingHead built with `validate=False` in an exported graph: the input "
                             "check reads a flag on the host, which a graph cannot do. Set head.validate = False "
                             "(and check inputs upstream), or use head.export() / head.export_onnx(), which check "
                             "the example once and export the unchecked graph")
        h = self._checked_device(scores)
        self._graph_decoder(h)  # an untraceable decoder fails here, with its reason
        self._build_tables(h, scores)
        return self._graph_body(h, scores.detach())

    def _decode_graphed(self, scores) -> torch.Tensor:
        if not isinstance(scores, torch.Tensor) or scores.device.type != "cuda":
            if not self._warned_cpu_graph:
                self._warned_cpu_graph = True
                device = scores.device if isinstance(scores, torch.Tensor) else "non-tensor input"
                warnings.warn(f"DecodingHead(cuda_graph=True) captures CUDA inputs only; decoding {device} input "
                              "eagerly", UserWarning, stacklevel=3)
            return self._decode_eager(scores)
        h = self._checked_device(scores)
        scores = scores.detach()
        key = (tuple(scores.shape), scores.dtype, scores.device, resolve_plan(h, scores.device).name,
               self.validate)
        if self._graph is None:
            self._graph = self._capture(h, scores, key)
        g = self._graph
        if g.key != key:
            return self._decode_eager(scores)
        g.static_in.copy_(scores)
        g.graph.replay()
        # The check ran in the graph: one host read of its flag; when it is false, the eager check of the
        # same input raises the error (or gives the warning) the flag stands for.
        if self.validate and not bool(g.static_flag):
            Posterior(h, scores, from_logits=self.from_logits, validate=True, name="scores")
        return g.static_out.clone()

    def _capture(self, h: Hierarchy, scores: torch.Tensor, key) -> _CapturedGraph:
        static_in = scores.clone()
        with torch.no_grad():
            side = torch.cuda.Stream(device=scores.device)
            side.wait_stream(torch.cuda.current_stream(scores.device))
            with torch.cuda.stream(side):  # warm-up: tree tables, allocator pools, Triton compilation
                for _ in range(2):
                    self._graph_body(h, static_in, self.validate)
            torch.cuda.current_stream(scores.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                body = self._graph_body(h, static_in, self.validate)
        static_out, static_flag = body if self.validate else (body, None)
        return _CapturedGraph(key, graph, static_in, static_out, static_flag)

    # ------------------------------------------------------------------ export
    def _example(self, example) -> torch.Tensor:
        if not isinstance(example, torch.Tensor):
            raise TypeError(f"Expected `example` to be a torch.Tensor, but got {type(example).__name__}")
        L = self._hierarchy.num_leaves
        if example.dim() != 2 or example.shape[1] != L or example.shape[0] < 2:
            raise ValueError(f"Expected `example` to have shape (B, {L}) with B >= 2 (export makes the batch size "
                             f"dynamic; sizes 0 and 1 would be specialised), but got {tuple(example.shape)}")
        self._graph_decoder(self._checked_device(example))
        if self.validate:
            self._decode_eager(example)  # the exported graph cannot check; the example is checked here
        return example.detach()

    @contextlib.contextmanager
    def _export_context(self, device_type: str | None):
        was, self._unchecked_trace = self._unchecked_trace, True
        try:
            with plan_for(device_type) if device_type is not None else contextlib.nullcontext():
                yield
        finally:
            self._unchecked_trace = was

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
        x = self._example(example)
        with self._export_context(None):
            self._build_tables(self.hierarchy, x)
            program = torch.export.export(self, (x,), dynamic_shapes=_batch_dim(dynamic_batch), strict=False)
        return _checked_program(program, self._hierarchy.num_leaves)

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
        try:
            import onnxscript  # noqa: F401  (torch.onnx's exporter needs it; say so before tracing)
        except ImportError as exc:
            raise ImportError('export_onnx needs onnx and onnxscript: pip install "hdecode_torch[export]"') from exc
        h = self._hierarchy
        with plan_for("cpu"):
            fused_sums = resolve_plan(h, torch.device("cpu")).tree_sums != "levels"
        if fused_sums:
            raise ValueError(f"Cannot export a tree of {h.max_depth + 1} levels to ONNX: beyond {MAX_LEVELS} "
                             "levels the tree sums are fused hdecode:: operators, which ONNX does not know")
        if path is not None:
            _check_destination(path)
        x = self._example(example)
        kwargs.setdefault("input_names", ["scores"])
        kwargs.setdefault("output_names", ["prediction"])
        with self._export_context("cpu"):
            self._build_tables(self.hierarchy, x)
            return torch.onnx.export(self, (x,), path, dynamo=True, dynamic_shapes=_batch_dim(dynamic_batch), **kwargs)

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
        return (f"metric={self.metric.key}, decoder={decoder_label(self.decoder, self.metric)}, "
                f"from_logits={self.from_logits}, num_nodes={self.parent.numel()}"
                + (", cuda_graph=True" if self.cuda_graph else ""))


def _batch_dim(dynamic: bool):
    """``dynamic_shapes`` of the scores argument: a symbolic batch size, or None (the example's)."""
    # An upper bound below 2**63 - 1: some torch versions (2.6) guard sizes against that value, and an
    # unbounded dimension then fails the export as a constraint violation.
    return ({0: torch.export.Dim("batch", max=2**62)},) if dynamic else None


class _ScoresCheck:
    """A forward pre-hook of an exported head's module: ``scores`` must be a (B, L) tensor.

    Prepended to torch's own input checks, which name no argument, and whose input guards (torch 2.13;
    torch 2.8 has none) index the shape without checking its length first: a 1-D input is an
    ``IndexError`` there.
    """

    def __init__(self, num_leaves: int):
        self.num_leaves = num_leaves

    def __call__(self, module, args):
        scores = args[0] if args else None
        if not isinstance(scores, torch.Tensor):
            raise TypeError(f"Expected `scores` to be a torch.Tensor, but got {type(scores).__name__}")
        if scores.dim() != 2 or scores.shape[1] != self.num_leaves:
            one = " (the program takes batches: pass scores[None] for one sample)" if scores.dim() == 1 else ""
            raise ValueError(f"Expected `scores` to have shape (B, {self.num_leaves}){one}, but got "
                             f"{tuple(scores.shape)}")


class _CheckedProgram(torch.export.ExportedProgram):
    """The ExportedProgram of :meth:`DecodingHead.export`: its ``module()`` checks ``scores`` first
    (:class:`_ScoresCheck`).  Saved and loaded with ``torch.export``, it is a plain ExportedProgram."""

    _hdecode_num_leaves: int

    def module(self, *args, **kwargs):
        gm = super().module(*args, **kwargs)
        gm.register_forward_pre_hook(_ScoresCheck(self._hdecode_num_leaves), prepend=True)  # before torch's own checks
        return gm


def _checked_program(program, num_leaves: int):
    """``program`` as a :class:`_CheckedProgram` (the same object, nothing copied)."""
    program.__class__ = _CheckedProgram
    program._hdecode_num_leaves = num_leaves
    return program


def _check_destination(path) -> None:
    """Refuse a save path whose folder is missing or which is a folder, before any export work."""
    import os

    try:
        target = os.fspath(path)
    except TypeError:
        return  # a file object: torch.onnx.export says what it takes
    if isinstance(target, bytes):
        target = os.fsdecode(target)
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"Cannot save the ONNX model to {target!r}: the folder {folder!r} does not exist")
    if os.path.isdir(target):
        raise IsADirectoryError(f"Cannot save the ONNX model to {target!r}: it is a folder; give a file name "
                                "such as head.onnx")


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
