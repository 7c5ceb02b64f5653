"""``DecodingHead(cuda_graph=True)``: the head's decoding captured once as a CUDA graph and replayed.

The graph holds :func:`~hdecode_torch.integrations.export.graph_body` (fixed sizes, no host read), with
the input check as a flag on the device: the one host read of a replayed call is that flag's.
"""

from __future__ import annotations

import warnings

import torch

from ..core.plan import resolve_plan
from ..core.posterior import Posterior
from ..decoders import Decoder
from ..hierarchy import Hierarchy
from .export import fixed_size_decoder, graph_body

__all__ = ["decode_graphed"]


class _CapturedGraph:
    """One CUDA graph of the head's decoding for a fixed input shape, dtype and device."""

    def __init__(self, key, graph, static_in, static_out, static_flag=None):
        self.key, self.graph, self.static_in, self.static_out = key, graph, static_in, static_out
        self.static_flag = static_flag  # the input check's flag, computed in the graph


def decode_graphed(head, scores) -> torch.Tensor:
    """``head(scores)`` for a head built with ``cuda_graph=True``: the first CUDA input's shape, dtype,
    device and plan are captured, later calls with the same replay the graph; anything else is
    decoded eagerly (CPU inputs with one warning)."""
    if not isinstance(scores, torch.Tensor) or scores.device.type != "cuda":
        if not head._warned_cpu_graph:
            head._warned_cpu_graph = True
            device = scores.device if isinstance(scores, torch.Tensor) else "non-tensor input"
            warnings.warn(f"DecodingHead(cuda_graph=True) captures CUDA inputs only; decoding {device} input "
                          "eagerly", UserWarning, stacklevel=3)
        return head._decode_eager(scores)
    h = head._checked_device(scores)
    scores = scores.detach()
    plan = resolve_plan(h, scores.device)
    key = (tuple(scores.shape), scores.dtype, scores.device, plan.name, head.validate)
    if head._graph is None:
        head._graph = _capture(head, h, scores, key, fixed_size_decoder(head, h, plan))
    g = head._graph
    if g.key != key:
        return head._decode_eager(scores)
    g.static_in.copy_(scores)
    g.graph.replay()
    # The check ran in the graph: one host read of its flag; when it is false, the eager check of the
    # same input raises the error (or gives the warning) the flag stands for.
    if head.validate and not bool(g.static_flag):
        Posterior(h, scores, from_logits=head.from_logits, validate=True, name="scores")
    return g.static_out.clone()


def _capture(head, h: Hierarchy, scores: torch.Tensor, key, decoder: Decoder) -> _CapturedGraph:
    static_in = scores.clone()
    with torch.no_grad():
        side = torch.cuda.Stream(device=scores.device)
        side.wait_stream(torch.cuda.current_stream(scores.device))
        with torch.cuda.stream(side):  # warm-up: tree tables, allocator pools, Triton compilation
            for _ in range(2):
                graph_body(head, h, static_in, head.validate, decoder)
        torch.cuda.current_stream(scores.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body = graph_body(head, h, static_in, head.validate, decoder)
    static_out, static_flag = body if head.validate else (body, None)
    return _CapturedGraph(key, graph, static_in, static_out, static_flag)
