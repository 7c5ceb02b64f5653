"""What metrics and decoders share: the hierarchy, declared parameters, a key, and one ``decode`` template."""

from __future__ import annotations

import numbers

import warnings

import torch

from ..hierarchy import Hierarchy
from .chunking import chunk_ranges
from .params import Param, bind_params, format_value
from .posterior import Posterior
from .logits import input_kind
from .subtree import decode_within
from .topk import TopK, no_top_k_decoder

__all__ = ["HierarchyComponent"]


def _chunk_size(chunk_size):
    """``None`` or a positive int (numpy integers accepted); the range is checked by ``chunk_ranges``."""
    if isinstance(chunk_size, numbers.Integral) and not isinstance(chunk_size, bool):
        return int(chunk_size)
    if chunk_size is not None and not isinstance(chunk_size, (int, float)):
        raise TypeError(f"Expected `chunk_size` to be a positive int or None, but got {type(chunk_size).__name__}")
    return chunk_size


class HierarchyComponent:
    """A checked :class:`~hdecode_torch.Hierarchy`, declared parameters, a key, and batched decoding.

    Subclasses set ``name``, ``description``, ``kind`` (``"leaf"``, ``"node"`` or ``"set"``: what
    ``decode`` returns) and ``PARAMS`` (their parameters as :class:`~hdecode_torch.core.params.Param` s:
    the constructor checks them and stores each as an attribute), and declare their decoding per plan:
    ``_decode_default(post)``, which every plan runs, unless the class also defines ``_decode_gpu(post)``
    for the GPU plan; both take a :class:`~hdecode_torch.Posterior` whose ``plan`` says which applies.  ``decode`` is the same
    everywhere: check the input, build (or reuse) the batch's Posterior, split it into chunks bounded by
    the plan's memory budget, decode each, and unbatch a 1-D input.
    """

    name: str = ""
    description: str = ""
    kind: str = "node"
    #: What the registry calls this kind of component ("metric" or "decoder"), for messages.
    component_kind: str = "component"
    PARAMS: tuple[Param, ...] = ()
    #: Other names the registry accepts for it (on input only; outputs use ``name``).
    aliases: tuple[str, ...] = ()
    #: Whether ``list_metrics``/``list_decoders`` list it (``False``: found by name only, for a component
    #: that cannot be built from its name alone, such as a cost matrix).
    listed: bool = True
    #: The algorithm its decoding uses on each device plan, ``{"cpu": ..., "gpu": ...}``, in words.
    algorithms: dict[str, str] = {}
    #: Where its NumPy references live, as ``"module:qualified name"``: ``oracle`` the value function of the
    #: tests' exhaustive oracle (``reference:<metric>`` in tests/), ``baseline`` the per-sample decoder the
    #: benchmarks time it against (``benchmarks.baselines:Baselines.<name>``, called as ``f(baselines,
    #: leaf_probs, **params)``).  ``None``: it has none.
    oracle: str | None = None
    #: On the CPU plan, decode a batch in blocks of rows whose temporaries (``_bytes_per_sample``) stay
    #: within this many bytes (and the memory budget), unless a chunk size is given; None: the memory
    #: budget alone.  A component whose passes over (N, B) tables are each a few operations sets it to
    #: ``CPU_BLOCK_BYTES``: blocks that stay in the cache (and in memory the allocator keeps) instead of
    #: tables of the whole batch, fresh pages on every call.  Rows are independent, so a block's rows
    #: are the bits of the whole batch.
    cpu_block_bytes: int | None = None
    baseline: str | None = None

    def __init__(self, hierarchy, *args, validate: bool = True, **params):
        if not isinstance(hierarchy, Hierarchy):
            raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
        if len(args) > len(self.PARAMS):
            raise TypeError(f"{type(self).__name__} takes at most {len(self.PARAMS)} positional parameter(s) after the "
                            f"hierarchy ({', '.join(p.name for p in self.PARAMS) or 'none'}), but got {len(args)}")
        for p, value in zip(self.PARAMS, args):
            if p.name in params:
                raise TypeError(f"{type(self).__name__} got parameter `{p.name}` twice")
            params[p.name] = value
        self.hierarchy = hierarchy
        self.validate = validate
        for key, value in bind_params(self.PARAMS, params, f"{self.component_kind} {self.name!r}").items():
            setattr(self, key, value)

    @property
    def params(self) -> dict:
        """The parameters that define the answer (those in the key), ``{name: value}``."""
        return {p.name: getattr(self, p.name) for p in self.PARAMS if p.in_key}

    @property
    def key(self) -> str:
        """``name[param=value,...]``, the label used in tables, logs and JSON (and a valid spec)."""
        if not self.params:
            return self.name
        return f"{self.name}[{','.join(f'{k}={format_value(v)}' for k, v in self.params.items())}]"

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({self.hierarchy!r}{args})"

    # ------------------------------------------------------------------ decoding
    def _validate(self, validate) -> bool:
        return bool(self.validate if validate is None else validate)

    def _posterior(self, leaf_probs, validate, from_logits=False, normalize=False, extra_checks=(),
                   defer_check: bool = True):
        """The batch's Posterior; a new one's input check is deferred to the decoder's one host read.

        A Posterior passed in holds converted probabilities already: ``from_logits`` and ``normalize``
        applied when it was built, so asking for them again is an error (``from_logits=False`` says
        what it holds and is accepted).
        """
        kind = input_kind(from_logits)  # checked whatever the input
        if isinstance(leaf_probs, Posterior):
            if kind != "probs" or normalize:
                given = ", ".join(f"{k}={v!r}" for k, v in (("from_logits", from_logits), ("normalize", normalize))
                                  if (k == "normalize" and v) or (k == "from_logits" and kind != "probs"))
                raise ValueError(f"`leaf_probs` is a Posterior, whose probabilities are converted already: {given} "
                                 "applies when it is built (Posterior(hierarchy, scores, from_logits=..., "
                                 "normalize=...)), not to decode/expected")
            return Posterior.of(self.hierarchy, leaf_probs)
        return Posterior(self.hierarchy, leaf_probs, from_logits=from_logits, normalize=normalize,
                         validate=self._validate(validate), extra_checks=extra_checks, defer_check=defer_check)

    def _bytes_per_sample(self, h, plan) -> int:
        """Bytes of temporaries per sample of a decode under ``plan``, used to choose chunk sizes."""
        return 8 * h.num_nodes * 4

    def _chunks(self, post, chunk_size=None, bytes_per_sample: int | None = None):
        """The chunks of ``post``'s batch: ``bytes_per_sample`` (default: a decode's) within the budget."""
        batch = post.batch_size
        if chunk_size is None and batch <= 1:
            return [(0, batch)]  # what chunk_ranges gives any budget: one row is never split
        if bytes_per_sample is None:
            bytes_per_sample = self._bytes_per_sample(post.h, post.plan)
        budget = post.plan.budget
        block = None if (chunk_size is not None or post.plan.gpu) else self._cpu_block_bytes(post)
        if block:
            budget = min(budget, block)
        return chunk_ranges(batch, bytes_per_sample, budget, _chunk_size(chunk_size))

    def _cpu_block_bytes(self, post) -> int | None:
        """The CPU plan's block of rows for ``post``'s batch, in bytes of temporaries (``cpu_block_bytes``)."""
        return self.cpu_block_bytes

    def decode(self, leaf_probs, *, from_logits: bool | str = False, normalize: bool = False,
               validate: bool | None = None, chunk_size: int | None = None, within=None) -> torch.Tensor:
        """Decode a batch.

        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`, to share
        its node sums with other decoders).  ``from_logits``: ``False`` probabilities (default),
        ``True`` logits (a softmax is applied), ``"auto"`` decided per batch; ``normalize=True``
        divides each non-negative row by its sum (both as for :class:`~hdecode_torch.Posterior`, and
        an error with a Posterior, converted already).  Returns (B,) int64 node ids, or (B, N) bool
        ancestor-closed node sets for set metrics; a 1-D input gives an unbatched output.  Large
        batches are decoded in chunks bounded by the memory budget (``chunk_size`` overrides it);
        ``validate=False`` skips the input check (one host sync).  ``within``: (B,) int64 node ids
        (or one id for all rows), the node each row's answer must lie under: the row is decoded on
        that node's subtree as if it were the whole tree, its probabilities renormalised there (the
        root: no restriction; see :mod:`hdecode_torch.core.subtree`).
        """
        if TopK.of(leaf_probs) is not None:
            raise no_top_k_decoder(f"the {self.component_kind} `{self.name}`")
        if isinstance(leaf_probs, torch.Tensor) and leaf_probs.requires_grad:
            # a decision has no gradient; none is recorded (a tensor that needs none records none: one
            # dispatcher call fewer per decode)
            leaf_probs = leaf_probs.detach()
        post = self._posterior(leaf_probs, validate, from_logits, normalize)
        if within is not None:
            out = decode_within(self, post, within, chunk_size)
            return out[0] if post.unbatched else out
        chunks = self._chunks(post, chunk_size)
        try:
            if len(chunks) == 1:
                out = self._decode(post)
            else:
                out = torch.cat([self._decode(post.chunk(a, b)) for a, b in chunks])
        except Exception:
            post.settle()  # bad input explains a failure better than the failure itself
            raise
        post.settle()  # decoders that read nothing from the host: the check's one read
        return out[0] if post.unbatched else out

    def on_subtree(self, sub):
        """This component with the same parameters on the subtree ``sub`` (a
        :class:`~hdecode_torch.core.subtree.Subtree`): what ``decode(..., within=)`` decodes with.
        Components whose parameters are tied to the tree's ids (a cost matrix, a fitted table) restrict them."""
        return type(self)(sub.hierarchy, validate=False, **{p.name: getattr(self, p.name) for p in self.PARAMS})

    def _decode(self, post) -> torch.Tensor:
        """The decoding of one chunk under its plan (``post.plan``)."""
        return self._decode_gpu(post) if post.plan.gpu else self._decode_default(post)

    def _decode_default(self, post) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} declares no decoding")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # The hook was called `_decode_cpu` although every plan without a `_decode_gpu` runs it; a class
        # written against that name keeps working.
        if "_decode_cpu" in cls.__dict__ and "_decode_default" not in cls.__dict__:
            warnings.warn(f"{cls.__qualname__}._decode_cpu is deprecated: name it _decode_default (what every plan "
                          "runs unless _decode_gpu decodes differently on the GPU plan)", DeprecationWarning,
                          stacklevel=2)
            cls._decode_default = cls.__dict__["_decode_cpu"]

    def _decode_cpu(self, post) -> torch.Tensor:
        # the former name, for a subclass that calls it through super()
        return self._decode_default(post)

    def _decode_gpu(self, post) -> torch.Tensor:
        return self._decode_default(post)
