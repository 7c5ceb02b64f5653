"""A :class:`~hdecode_torch.integrations.module.DecodingHead` inside graphs: the fixed-size decoding a graph
holds, the traced forward of ``torch.export`` (and the ONNX exporter, which uses it), and
:meth:`DecodingHead.export` / :meth:`DecodingHead.export_onnx`.

A graph cannot read the host: no size may depend on the data and the input check is either left out
(export: the example is checked eagerly) or returned as a flag on the device (CUDA graphs,
``cuda_graphs.py``).  A metric whose decoder prunes candidates is swapped for its exact fixed-size
equivalent (``metric.fixed_size(plan)``, declared by the metric).
"""

from __future__ import annotations

import contextlib
import copy
import os

import torch

from ..core.plan import MAX_LEVELS, Plan, plan_for, resolve_plan
from ..core.posterior import Posterior
from ..core.topk import TopK
from ..core.validation import compute_dtype
from ..decoders import Decoder
from ..hierarchy import Hierarchy

__all__ = ["tracing", "fixed_size_decoder", "graph_body", "build_tables", "prepare_tables", "decode_traced", "export",
           "export_onnx"]


# --------------------------------------------------------------------------- tracing
def tracing() -> str | None:
    """``"compile"`` while Dynamo traces (``torch.compile``, strict export), ``"export"`` under non-strict
    ``torch.export`` (and the ONNX exporter, which uses it), else None.

    Dynamo is asked first: torch 2.7 to at least 2.11 (not 2.13) fold ``torch.compiler.is_exporting()``
    to True in every frame Dynamo traces, ``torch.compile`` included.  Non-strict export runs the Python
    code itself, where ``is_dynamo_compiling()`` is False.
    """
    if torch.compiler.is_dynamo_compiling():
        return "compile"
    if _is_exporting():
        return "export"
    return "compile" if torch.compiler.is_compiling() else None


_is_exporting = torch.compiler.is_exporting  # a module global, so a test can play an older torch's answer


def _real_tensors(example: torch.Tensor):
    """A context in which torch ops make real tensors, even while ``example`` is being traced.

    Tree-only tables are cached on the hierarchy; built during a trace they would be fake tensors
    (and stay cached), so they are built for real, outside the trace, before it reads them.
    """
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing

    if not isinstance(example, FakeTensor) and tracing() != "export":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(unset_fake_temporarily())
    stack.enter_context(disable_proxy_modes_tracing())
    return stack


# --------------------------------------------------------------------------- the fixed-size decoding
def fixed_size_decoder(head, h: Hierarchy, plan: Plan) -> Decoder:
    """The decoder a graph of ``head`` runs under ``plan``: fixed sizes, exact (ValueError if none)."""
    reason = head._untraceable_reason()
    if reason is not None:
        raise ValueError(f"This DecodingHead cannot be part of a graph: {reason}. Run it eagerly (outside "
                         "the exported or captured part of the model)")
    own = getattr(head.decoder, "metric", None)
    if head.decoder.name != "optimal" or own is None:
        return head.decoder
    fixed = own.fixed_size(plan, h)
    if fixed is own:
        return head.decoder
    dec = copy.copy(head.decoder)
    dec.metric = fixed
    return dec


def graph_body(head, h: Hierarchy, scores: torch.Tensor, check: bool = False, decoder: Decoder | None = None):
    """The decoding a graph holds: one chunk, fixed sizes, no host read.  With ``check``, also the
    input check's flag, computed in the graph: ``(output, flag)``, flag a 0-d bool on the device,
    true when there is nothing to raise or warn.  ``decoder``: :func:`fixed_size_decoder`'s (resolved
    here under the current plan when not given)."""
    post = Posterior(h, scores, from_logits=head.from_logits, validate=check, name="scores", defer_check=True)
    if decoder is None:
        decoder = fixed_size_decoder(head, h, post.plan)
    out = decoder._decode(post)
    out = out[0] if post.unbatched else out
    return (out, post.check_flag()) if check else out


def build_tables(head, h: Hierarchy, scores: torch.Tensor, plan: Plan, decoder: Decoder) -> None:
    """Build (once per tree, device, plan and dtype) every tree-only table the graph reads."""
    dtype = compute_dtype(scores.dtype)
    key = ("graph_tables", head.decoder.key, head.metric.key, plan.name, dtype)

    def build():
        with _real_tensors(scores):
            uniform = torch.full((2, h.num_leaves), 1.0 / h.num_leaves, dtype=dtype, device=h.device)
            graph_body(head, h, uniform, decoder=decoder)
        return True
    h.cached(key, build)


def decode_traced(head, scores) -> torch.Tensor:
    """``head(scores)`` while ``torch.export`` traces it: the fixed-size decoding, unchecked."""
    if TopK.of(scores) is not None:
        raise ValueError("A DecodingHead cannot export the decoding of a top-k list: its support's size "
                         "depends on the data; decode it eagerly")
    if not isinstance(scores, torch.Tensor):
        raise TypeError(f"Expected `scores` to be a torch.Tensor, but got {type(scores).__name__}")
    if head.validate and not head._unchecked_trace:
        raise ValueError("Expected a DecodingHead built with `validate=False` in an exported graph: the input "
                         "check reads a flag on the host, which a graph cannot do. Set head.validate = False "
                         "(and check inputs upstream), or use head.export() / head.export_onnx(), which check "
                         "the example once and export the unchecked graph")
    h = head._checked_device(scores)
    plan = resolve_plan(h, scores.device)
    decoder = fixed_size_decoder(head, h, plan)  # an untraceable decoder fails here, with its reason
    build_tables(head, h, scores, plan, decoder)
    return graph_body(head, h, scores.detach(), decoder=decoder)


# --------------------------------------------------------------------------- export
def _example(head, example) -> torch.Tensor:
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"Expected `example` to be a torch.Tensor, but got {type(example).__name__}")
    L = head._hierarchy.num_leaves
    if example.dim() != 2 or example.shape[1] != L or example.shape[0] < 2:
        raise ValueError(f"Expected `example` to have shape (B, {L}) with B >= 2 (export makes the batch size "
                         f"dynamic; sizes 0 and 1 would be specialised), but got {tuple(example.shape)}")
    h = head._checked_device(example)
    fixed_size_decoder(head, h, resolve_plan(h, example.device))
    if head.validate:
        head._decode_eager(example)  # the exported graph cannot check; the example is checked here
    return example.detach()


@contextlib.contextmanager
def _export_context(head, device_type: str | None):
    was, head._unchecked_trace = head._unchecked_trace, True
    try:
        with plan_for(device_type) if device_type is not None else contextlib.nullcontext():
            yield
    finally:
        head._unchecked_trace = was


def prepare_tables(head, x: torch.Tensor) -> None:
    """:func:`build_tables` for ``x`` under the current plan (before a trace reads them)."""
    h = head.hierarchy
    plan = resolve_plan(h, x.device)
    build_tables(head, h, x, plan, fixed_size_decoder(head, h, plan))


def export(head, example: torch.Tensor, dynamic_batch: bool = True):
    """:meth:`DecodingHead.export` (its docstring says what the program does)."""
    x = _example(head, example)
    with _export_context(head, None):
        prepare_tables(head, x)
        program = torch.export.export(head, (x,), dynamic_shapes=_batch_dim(dynamic_batch), strict=False)
    return _checked_program(program, head._hierarchy.num_leaves)


def export_onnx(head, example: torch.Tensor, path=None, dynamic_batch: bool = True, **kwargs):
    """:meth:`DecodingHead.export_onnx` (its docstring says what the model does)."""
    try:
        import onnxscript  # noqa: F401  (torch.onnx's exporter needs it; say so before tracing)
    except ImportError as exc:
        raise ImportError('export_onnx needs onnx and onnxscript: pip install "hdecode_torch[export]"') from exc
    h = head._hierarchy
    with plan_for("cpu"):
        fused_sums = resolve_plan(h, torch.device("cpu")).tree_sums != "levels"
    if fused_sums:
        raise ValueError(f"Cannot export a tree of {h.max_depth + 1} levels to ONNX: beyond {MAX_LEVELS} "
                         "levels the tree sums are fused hdecode:: operators, which ONNX does not know")
    if path is not None:
        _check_destination(path)
    x = _example(head, example)
    kwargs.setdefault("input_names", ["scores"])
    kwargs.setdefault("output_names", ["prediction"])
    with _export_context(head, "cpu"):
        prepare_tables(head, x)
        return torch.onnx.export(head, (x,), path, dynamo=True, dynamic_shapes=_batch_dim(dynamic_batch), **kwargs)


def _batch_dim(dynamic: bool):
    """``dynamic_shapes`` of the scores argument: a symbolic batch size, or None (the example's)."""
    # An upper bound below 2**63 - 1: some torch versions guard sizes against that value, and an
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
