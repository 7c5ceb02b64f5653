"""What metrics and decoders share: the hierarchy, parameters, a label, and the one ``decode`` template."""

from __future__ import annotations

import inspect
import numbers

import torch

__all__ = ["HierarchyComponent", "accepted_params", "build_component"]


def _chunk_size(chunk_size):
    """``None`` or a positive int (numpy integers accepted); the range is checked by ``chunk_ranges``."""
    if isinstance(chunk_size, numbers.Integral) and not isinstance(chunk_size, bool):
        return int(chunk_size)
    if chunk_size is not None and not isinstance(chunk_size, (int, float)):
        raise TypeError(f"Expected `chunk_size` to be a positive int or None, but got {type(chunk_size).__name__}")
    return chunk_size


class HierarchyComponent:
    """A checked :class:`~hdecode_torch.Hierarchy`, parameters, a label, and batched decoding.

    Subclasses set ``name``, ``description`` and ``kind`` (``"leaf"``, ``"node"`` or ``"set"``: what
    ``decode`` returns) and implement :meth:`_decode` on a :class:`~hdecode_torch.Posterior`.  ``decode`` is
    the same everywhere: check the input, build (or reuse) the batch's Posterior, split it into chunks
    bounded by the memory budget, decode each, and unbatch a 1-D input.
    """

    name: str = ""
    description: str = ""
    kind: str = "node"

    def __init__(self, hierarchy, *, validate: bool = True):
        from .hierarchy import Hierarchy

        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        self.hierarchy = hierarchy
        self.validate = validate

    @property
    def params(self) -> dict:
        return {}

    @property
    def key(self) -> str:
        """``name[param=value,...]``, the label used in tables, logs and JSON."""
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(f'{k}={v:g}' for k, v in self.params.items())}]"

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({self.hierarchy!r}{args})"

    # ------------------------------------------------------------------ decoding
    def _validate(self, validate) -> bool:
        return bool(self.validate if validate is None else validate)

    def _posterior(self, leaf_probs, validate):
        from .core.posterior import Posterior

        return Posterior.of(self.hierarchy, leaf_probs, validate=self._validate(validate))

    def _bytes_per_sample(self, h) -> int:
        """Bytes of temporaries per sample of :meth:`_decode`, used to choose chunk sizes."""
        return 8 * h.num_nodes * 4

    def _chunks(self, post, chunk_size=None):
        from .core.chunking import budget_for, chunk_ranges

        return chunk_ranges(post.batch_size, self._bytes_per_sample(post.h), _chunk_size(chunk_size),
                            budget_for(post.device))

    def decode(self, leaf_probs, *, validate: bool | None = None, chunk_size: int | None = None) -> torch.Tensor:
        """Decode a batch.

        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`, to share
        its node sums with other decoders).  Returns (B,) int64 node ids, or (B, N) bool ancestor-closed
        node sets for set metrics; a 1-D input gives an unbatched output.  Large batches are decoded in
        chunks bounded by the memory budget (``chunk_size`` overrides it); ``validate=False`` skips the
        input check (one host sync).
        """
        if isinstance(leaf_probs, torch.Tensor):
            leaf_probs = leaf_probs.detach()  # a decision has no gradient; none is recorded
        post = self._posterior(leaf_probs, validate)
        parts = [self._decode(post.chunk(a, b)) for a, b in self._chunks(post, chunk_size)]
        out = torch.cat(parts) if len(parts) > 1 else parts[0]
        return out[0] if post.unbatched else out

    def _decode(self, post) -> torch.Tensor:
        raise NotImplementedError


def accepted_params(cls) -> tuple[list[str], list[str]]:
    """(keyword parameters ``cls(hierarchy, ...)`` accepts, the required ones), following ``**kw`` up the MRO."""
    accepted: list[str] = []
    required: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[2:]  # self, hierarchy
        for prm in params:
            if prm.kind in (prm.VAR_KEYWORD, prm.VAR_POSITIONAL) or prm.name in accepted:
                continue
            accepted.append(prm.name)
            if prm.default is inspect.Parameter.empty:
                required.append(prm.name)
        if not any(prm.kind == prm.VAR_KEYWORD for prm in params):
            break
    return accepted, required


def build_component(cls, what: str, name: str, hierarchy, params: dict):
    """``cls(hierarchy, **params)`` after checking the parameter names against its signature."""
    accepted, required = accepted_params(cls)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(f"Bad parameters for {what} {name!r}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
                         f"accepted: {', '.join(accepted) or 'none'}")
    missing = [p for p in required if p not in params]
    if missing:
        raise ValueError(f"Bad parameters for {what} {name!r}: it requires {', '.join(map(repr, missing))}")
    return cls(hierarchy, **params)
