"""Every metric and decoder as plain functions of tensors and a hierarchy, next to the classes (as
``torchmetrics.functional`` sits next to torchmetrics' classes).

One rule names them all, for every registered metric ``<metric>`` and decoder ``<decoder>``::

    <metric>(preds, target, hierarchy, *, <params>)           per-sample values (or their mean, sum)
    expected_<metric>(leaf_probs, preds, hierarchy, *, <params>)   Σ_l p(l) <metric>(preds, l)
    decode_<metric>(leaf_probs, hierarchy, *, <params>, within=None)   the metric's Bayes-optimal prediction
    decode_<decoder>(leaf_probs, hierarchy, *, <params>, within=None)  a heuristic decoder's prediction

e.g. ``wu_palmer(preds, target, h)``, ``hf_beta(preds, target, h, beta=0.5)``,
``expected_wu_palmer(probs, preds, h)``, ``decode_hf_beta(probs, h, beta=0.5)``,
``decode_darts(probs, h, lam=1.0)``.  The parameters of a metric or decoder (its ``PARAMS``) are
keyword-only.  The generic entry points take the name (or any spec, ``"hf_beta[beta=0.5]"``, or a built
metric) first: :func:`value`, :func:`expected`, :func:`decode` (a metric's Bayes-optimal decoder) and
:func:`decode_with` (any decoder).  The named functions of the built-in metrics and decoders are made
from the registries when this module loads, with their parameters in their signatures; a metric or
decoder registered later (``hd.register_metric``, ``hd.register_decoder``) gets the same functions on
first access (``functional.my_metric``), and the generic entry points take its name.

Each call builds the metric or decoder and calls its method, so a function returns exactly what the
method does: ``wu_palmer(preds, target, h) == get_metric("wu_palmer", h)(preds, target)``.  Building one
costs no more than reusing it (what depends on the tree alone is cached on the hierarchy), except
``cost_matrix``, which checks its matrix at each build: build a ``CostMatrixMetric`` once and pass it
to the generic functions.

The metric functions take what a torchmetrics metric takes: decoded predictions ((B,) int64 node ids;
set metrics also (B, N) bool node sets) are scored as they are; (B, L) float scores are decoded first
(by the metric's own Bayes-optimal decoder unless ``decoder=`` names another), as
:class:`~hdecode_torch.HierarchicalMetric` does, which computes through the same steps.
"""

from __future__ import annotations

import inspect

import torch

from ..core.posterior import Posterior
from ..decoders.registry import DECODERS, OptimalDecoder, get_decoder
from ..hierarchy import Hierarchy
from ..metrics.base import BaseMetric
from ..metrics.registry import METRICS, get_metric
from ._calibration import NodeReliability, node_calibration_error, node_reliability
from ._calibration_check import NodeCalibrationCheck, node_calibration_check
from ._pieces import (
    REDUCTIONS, checked_scores, prediction_kind, values_compute, values_update,
)

# the named functions are added below
__all__ = ["value", "expected", "decode", "decode_with", "node_calibration_error", "node_reliability",
           "NodeReliability"]
__all__ += ["node_calibration_check", "NodeCalibrationCheck"]


# --------------------------------------------------------------------------- the generic entry points
def value(metric, preds, target, hierarchy, *, decoder="optimal", from_logits: bool | str = False,
          reduction: str = "none", dtype: torch.dtype | None = None, validate: bool | None = None,
          **params) -> torch.Tensor:
    """The values of ``metric`` on ``preds`` against ``target``.

    Args:
        metric: a metric spec (``"wu_palmer"``, ``"hf_beta[beta=0.5]"``, ``("hf_beta", {"beta": 0.5})``)
            or a built metric on ``hierarchy``; ``params`` are its parameters (``beta=0.5``).
        preds: what is scored, told apart by its dtype: (B,) or () integer node ids, or (B, N) or (N,)
            bool node sets (set metrics), scored as they are; or (B, L) or (L,) float scores (or a
            :class:`~hdecode_torch.Posterior`), decoded by ``decoder`` first.
        target: (B,) or () int64 leaf ids in ``0..L-1``.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        decoder: what decodes float scores: ``"optimal"`` (the metric's Bayes-optimal decoder), a decoder
            spec (``"darts[lam=1]"``) or a built decoder; unused for decoded predictions.
        from_logits: what float scores hold: probabilities (``False``), logits (``True``) or ``"auto"``.
        reduction: ``"none"`` (per-sample values, (B,)), ``"mean"`` or ``"sum"`` (0-d; the float64 sum
            taken in sorted order, so it does not depend on the order of the samples).
        dtype: the result's floating dtype.  Default: the scores' compute dtype (float64 kept, float32
            otherwise) for scores, torch's default dtype (float32) for decoded predictions.
        validate: check the input (one host read); default: the metric's default (True).

    Returns:
        (B,) (or ()) values for ``reduction="none"``, else a 0-d tensor, on the predictions' device.
        Values are computed in float64 and cast once.  ``value("wu_palmer", pred, target, h)`` equals
        ``get_metric("wu_palmer", h)(pred, target)``.
    """
    return _value(_metric(metric, hierarchy, params), preds, target, decoder=decoder, from_logits=from_logits,
                  reduction=reduction, dtype=dtype, validate=validate)


def expected(metric, leaf_probs, preds, hierarchy, *, from_logits: bool | str = False, normalize: bool = False,
             validate: bool | None = None, chunk_size: int | None = None, **params) -> torch.Tensor:
    """The expected value ``Σ_l p(l) m(preds, l)`` of ``metric`` under each leaf distribution.

    Args:
        metric: a metric spec or a built metric on ``hierarchy``; ``params`` are its parameters.
        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`).
        preds: (B,) or () int64 node ids; set metrics also take (B, N) or (N,) bool node sets.
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        from_logits: ``True``: ``leaf_probs`` holds logits (a softmax is applied); ``"auto"``: decided
            per batch.  normalize: divide each row by its sum instead of requiring it to be 1.
        validate: check the input (one host read per call, two with logits); default True.
        chunk_size: samples per chunk (default: bounded by the memory budget).

    Returns:
        (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
        dtype), on their device: ``get_metric(metric, hierarchy, **params).expected(leaf_probs, preds)``.
    """
    m = _metric(metric, hierarchy, params)
    probs = _leaf_input(m, leaf_probs, from_logits, normalize, validate, defer=False)
    return m.expected(probs, preds, validate=validate, chunk_size=chunk_size)


def decode(metric, leaf_probs, hierarchy, *, from_logits: bool | str = False, normalize: bool = False,
           validate: bool | None = None, chunk_size: int | None = None, within=None, **params) -> torch.Tensor:
    """The Bayes-optimal prediction for ``metric``: the prediction of best expected value.

    Args:
        metric: a metric spec or a built metric on ``hierarchy``; ``params`` are its parameters.
        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`).
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        from_logits, normalize, validate, chunk_size: as for :func:`expected`.
        within: (B,) int64 node ids (or one id for all rows), the node each row's answer must lie under:
            the row is decoded on that node's subtree, its probabilities renormalised there (None or the
            root: the whole tree).

    Returns:
        (B,) int64 node ids for leaf and node metrics, (B, N) bool ancestor-closed node sets for set
        metrics (unbatched for a (L,) input): ``get_metric(metric, hierarchy, **params).decode(leaf_probs)``.
        A metric without an exact decoder raises ``NotImplementedError``.
    """
    m = _metric(metric, hierarchy, params)
    return m.decode(_leaf_input(m, leaf_probs, from_logits, normalize, validate, defer=True), validate=validate,
                    chunk_size=chunk_size, within=within)


def decode_with(decoder, leaf_probs, hierarchy, *, from_logits: bool | str = False, normalize: bool = False,
                validate: bool | None = None, chunk_size: int | None = None, within=None,
                **params) -> torch.Tensor:
    """The prediction of any decoder.

    Args:
        decoder: a decoder spec (``"darts"``, ``"darts[lam=0.5]"``, ``"optimal:hf_beta[beta=0.5]"``) or a
            built decoder on ``hierarchy``; ``params`` are its parameters (``lam=0.5``).
        leaf_probs: (B, L) or (L,) float probabilities (or a :class:`~hdecode_torch.Posterior`).
        hierarchy: the :class:`~hdecode_torch.Hierarchy`.
        from_logits, normalize, validate, chunk_size: as for :func:`expected`; within: as for :func:`decode`.

    Returns:
        (B,) int64 node ids (optimal decoders of set metrics: (B, N) bool sets), unbatched for a (L,)
        input: ``get_decoder(decoder, hierarchy, **params).decode(leaf_probs)``.
    """
    d = _same_tree(get_decoder(decoder, _hierarchy(hierarchy), **params), hierarchy)
    return d.decode(_leaf_input(d, leaf_probs, from_logits, normalize, validate, defer=True), validate=validate,
                    chunk_size=chunk_size, within=within)


# --------------------------------------------------------------------------- shared steps
def _hierarchy(hierarchy) -> Hierarchy:
    if not isinstance(hierarchy, Hierarchy):
        raise TypeError(f"Expected `hierarchy` to be a Hierarchy, but got {type(hierarchy).__name__}")
    return hierarchy


def _same_tree(component, hierarchy):
    if component.hierarchy is not hierarchy and not component.hierarchy.same_tree(hierarchy):
        raise ValueError(f"Expected a {component.component_kind} on {hierarchy!r}, but `{component.key}` is on "
                         f"{component.hierarchy!r}")
    return component


def _metric(spec, hierarchy, params: dict) -> BaseMetric:
    return _same_tree(get_metric(spec, _hierarchy(hierarchy), **params), hierarchy)


def _leaf_input(component, leaf_probs, from_logits, normalize, validate, *, defer: bool):
    """``leaf_probs`` as the method takes it: as given for probabilities, else a Posterior converting logits
    or normalising (its check deferred to the decoder's one host read when ``defer``)."""
    if from_logits is False and not normalize:
        return leaf_probs
    if isinstance(leaf_probs, Posterior):
        raise ValueError("`leaf_probs` is a Posterior, whose probabilities are already converted and checked: "
                         "`from_logits` and `normalize` apply to tensors only")
    return Posterior(component.hierarchy, leaf_probs, from_logits=from_logits, normalize=normalize,
                     validate=component._validate(validate), defer_check=defer)


def _value(m: BaseMetric, preds, target, *, decoder, from_logits, reduction, dtype, validate) -> torch.Tensor:
    if reduction not in REDUCTIONS:
        raise ValueError(f"Expected `reduction` to be one of {REDUCTIONS}, but got {reduction!r}")
    validate = m._validate(validate)
    kind, preds = prediction_kind(preds)
    if kind != "scores":
        return values_compute(values_update(m, preds, target, validate=validate), reduction, dtype)
    dec = get_decoder(decoder, m.hierarchy, metric=m, validate=validate)
    post, t = checked_scores(m.hierarchy, preds, target, from_logits=from_logits, validate=validate)
    values = values_update(m, dec.decode(post), t)  # predictions of a decoder, targets checked with the scores
    return values_compute(values, reduction, post.dtype if dtype is None else dtype)


# --------------------------------------------------------------------------- the named functions
# Keywords of the functions themselves: a metric's or decoder's parameter cannot take one of these names.
_KW = inspect.Parameter.KEYWORD_ONLY
_VALUE_KEYWORDS = (("decoder", "optimal"), ("from_logits", False), ("reduction", "none"), ("dtype", None),
                   ("validate", None))
_PROBS_KEYWORDS = (("from_logits", False), ("normalize", False), ("validate", None), ("chunk_size", None))
_DECODE_KEYWORDS = _PROBS_KEYWORDS + (("within", None),)

_VALUE_DOC = """{title}{better}

Per-sample values, or their mean or sum: ``get_metric("{name}", hierarchy{call})(preds, target)``.
See :class:`{cls}`.

Args:
    preds: decoded predictions, {preds}, scored as they are; or (B, L) float scores
        (probabilities, or logits with ``from_logits``; or a Posterior), decoded by ``decoder`` first.
    target: (B,) int64 leaf ids in 0..L-1.
    hierarchy: the Hierarchy.{params}
    decoder, from_logits, reduction, dtype, validate: as for :func:`hdecode_torch.functional.value`
        (``decoder="optimal"``: the metric's Bayes-optimal decoder).

Returns:
    (B,) values (``reduction="none"``) or a 0-d mean or sum, in ``dtype``: by default the scores'
    compute dtype, or torch's default dtype (float32) for decoded predictions.
"""

_PROBS_ARGS = """Args:
    leaf_probs: (B, L) or (L,) float probabilities (or a Posterior).{preds_arg}
    hierarchy: the Hierarchy.{params}
    from_logits, normalize, validate, chunk_size: as for :func:`hdecode_torch.functional.expected`.{within}
"""
_WITHIN_ARG = """
    within: (B,) int64 node ids (or one for all rows) the answers must lie under, as for
        :func:`hdecode_torch.functional.decode`."""

_EXPECTED_DOC = """Expected {name}: Σ_l p(l) {name}(preds, l) for each leaf distribution.

{name}: {description}
Equals ``get_metric("{name}", hierarchy{call}).expected(leaf_probs, preds)``.
See :class:`{cls}`.

{args}
Returns:
    (B,) (or ()) in the probabilities' compute dtype (float64 kept, float32 for every other floating
    dtype), on their device.
"""

_DECODE_DOC = """The Bayes-optimal prediction for {name}: of best expected {name} under each distribution.

{name}: {description}
Equals ``get_metric("{name}", hierarchy{call}).decode(leaf_probs)``.
See :class:`{cls}`.

{args}
Returns:
    {returns} (unbatched for a (L,) input),
    on the probabilities' device.
"""

_DECODER_DOC = """The {name} decoder: {description}

Equals ``get_decoder("{name}", hierarchy{call}).decode(leaf_probs)``.
See :class:`{cls}`.

{args}
Returns:
    (B,) int64 node ids (() for a (L,) input), on the probabilities' device.
"""


def _signature(leading: tuple[str, ...], cls, own: tuple) -> inspect.Signature:
    """``(leading..., *, <cls.PARAMS>, <own keywords>)``; a declared parameter named as one of the function's
    own keywords is a ``TypeError``."""
    taken = {name for name, _ in own} | set(leading)
    clash = [p.name for p in cls.PARAMS if p.name in taken]
    if clash:
        raise TypeError(f"{cls.component_kind.capitalize()} {cls.name!r} declares parameter(s) {clash}, which the "
                        f"functional API uses for its own keywords: call its class instead")
    params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in leading]
    for p in cls.PARAMS:
        default = inspect.Parameter.empty if p.required else p.default
        annotation = p.type if p.has_text_form else inspect.Parameter.empty
        params.append(inspect.Parameter(p.name, _KW, default=default, annotation=annotation))
    params += [inspect.Parameter(n, _KW, default=d) for n, d in own]
    return inspect.Signature(params, return_annotation=torch.Tensor)


def _params_doc(cls) -> str:
    lines = []
    for p in cls.PARAMS:
        default = "required" if p.required else f"default {p.default!r}"
        choices = f", one of {p.choices}" if p.choices else ""
        lines.append(f"\n    {p.name}: {p.doc or 'a parameter'} ({default}{choices}).")
    return "".join(lines)


def _fields(cls) -> dict:
    description = cls.description.rstrip(".") + "."
    fields = {"name": cls.name, "cls": f"{cls.__module__}.{cls.__qualname__}", "params": _params_doc(cls),
              "call": "".join(f", {p.name}={p.name}" for p in cls.PARAMS),
              "title": description[:1].upper() + description[1:], "description": description}
    return {**fields, "args": _PROBS_ARGS.format(preds_arg="", within=_WITHIN_ARG, **fields)}


def _make(name: str, signature: inspect.Signature, doc: str, body):
    """A function called ``name`` with ``signature`` and ``doc``; ``body(bound_arguments)`` does the work.
    Arguments are bound to the signature, so a wrong one is Python's usual ``TypeError``."""

    def function(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}() {exc}") from None
        bound.apply_defaults()
        return body(bound.arguments)

    function.__name__ = function.__qualname__ = name
    function.__module__ = __name__
    function.__signature__ = signature
    function.__doc__ = doc
    return function


def _split(cls, arguments: dict) -> tuple[dict, dict]:
    """(the component's declared parameters, the rest) of bound arguments."""
    declared = {p.name for p in cls.PARAMS}
    return ({k: v for k, v in arguments.items() if k in declared},
            {k: v for k, v in arguments.items() if k not in declared})


def metric_functions(cls) -> dict:
    """``{function name: function}``: the value, expected value and (if it has one) Bayes-optimal decoder of
    the metric class ``cls`` as functions (see the module docstring)."""
    f = _fields(cls)
    f["better"] = ("" if "better" in cls.description
                   else f"  {'Higher' if cls.higher_is_better else 'Lower'} is better.")
    f["preds"] = ("(B, N) bool node sets (closed under ancestors) or (B,) int64 node ids\n        (their ancestor sets)"
                  if cls.kind == "set" else "(B,) int64 node ids")
    expected_args = _PROBS_ARGS.format(preds_arg=f"\n    preds: {f['preds']}.", within="", **f)

    def value_body(a):
        params, rest = _split(cls, a)
        m = cls(_hierarchy(rest["hierarchy"]), **params)
        return _value(m, rest["preds"], rest["target"], decoder=rest["decoder"], from_logits=rest["from_logits"],
                      reduction=rest["reduction"], dtype=rest["dtype"], validate=rest["validate"])

    def expected_body(a):
        params, rest = _split(cls, a)
        return expected(cls(_hierarchy(rest["hierarchy"]), **params), rest["leaf_probs"], rest["preds"],
                        rest["hierarchy"], from_logits=rest["from_logits"], normalize=rest["normalize"],
                        validate=rest["validate"], chunk_size=rest["chunk_size"])

    def decode_body(a):
        params, rest = _split(cls, a)
        return decode(cls(_hierarchy(rest["hierarchy"]), **params), rest["leaf_probs"], rest["hierarchy"],
                      from_logits=rest["from_logits"], normalize=rest["normalize"], validate=rest["validate"],
                      chunk_size=rest["chunk_size"], within=rest["within"])

    out = {
        cls.name: _make(cls.name, _signature(("preds", "target", "hierarchy"), cls, _VALUE_KEYWORDS),
                        _VALUE_DOC.format(**f), value_body),
        f"expected_{cls.name}": _make(f"expected_{cls.name}",
                                      _signature(("leaf_probs", "preds", "hierarchy"), cls, _PROBS_KEYWORDS),
                                      _EXPECTED_DOC.format(**{**f, "args": expected_args}), expected_body),
    }
    if cls.has_decoder:
        f["returns"] = ("(B, N) bool ancestor-closed node sets holding the root" if cls.kind == "set"
                        else "(B,) int64 node ids")
        out[f"decode_{cls.name}"] = _make(f"decode_{cls.name}",
                                          _signature(("leaf_probs", "hierarchy"), cls, _DECODE_KEYWORDS),
                                          _DECODE_DOC.format(**f), decode_body)
    return out


def decoder_function(cls):
    """``decode_<name>``: the decoder class ``cls`` as a function (see the module docstring)."""

    def body(a):
        params, rest = _split(cls, a)
        return decode_with(cls(_hierarchy(rest["hierarchy"]), **params), rest["leaf_probs"], rest["hierarchy"],
                           from_logits=rest["from_logits"], normalize=rest["normalize"], validate=rest["validate"],
                           chunk_size=rest["chunk_size"], within=rest["within"])

    return _make(f"decode_{cls.name}", _signature(("leaf_probs", "hierarchy"), cls, _DECODE_KEYWORDS),
                 _DECODER_DOC.format(**_fields(cls)), body)


def _functions_of(name: str):
    """The function called ``name`` for what the registries hold now, or None."""
    for prefix in ("expected_", "decode_", ""):
        if not name.startswith(prefix):
            continue
        base = name[len(prefix):]
        if base in METRICS:
            function = metric_functions(METRICS.get_class(base)).get(name)
            if function is not None:
                return function
        if prefix == "decode_" and base in DECODERS and base != "optimal":
            return decoder_function(DECODERS.get_class(base))
    return None


def _builtins() -> dict:
    functions = {}
    for name in METRICS.names():
        functions.update(metric_functions(METRICS.get_class(name)))
    for name in DECODERS.names():
        cls = DECODERS.get_class(name)
        if cls is not OptimalDecoder:  # decode_<metric> is each metric's optimal decoder
            fn = decoder_function(cls)
            functions.setdefault(fn.__name__, fn)  # a metric's own decoder keeps its name (none clash today)
    clash = sorted(set(functions) & set(globals()))
    if clash:
        raise RuntimeError(f"functions {clash} would hide this module's own names")
    return functions


_BUILTINS = _builtins()
globals().update(_BUILTINS)
__all__ += list(_BUILTINS)


def __getattr__(name: str):
    # The functions of a metric or decoder registered after this module loaded (made anew at each
    # access, so that a replaced registration is followed).
    function = _functions_of(name) if not name.startswith("__") else None
    if function is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return function


def __dir__() -> list[str]:
    later = [n for m in METRICS.names() if m not in _BUILTINS for n in metric_functions(METRICS.get_class(m))]
    later += [f"decode_{d}" for d in DECODERS.names() if d != "optimal" and f"decode_{d}" not in _BUILTINS]
    return sorted(set(globals()) | set(later))
