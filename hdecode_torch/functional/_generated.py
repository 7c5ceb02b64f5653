"""The functions of a metric or decoder registered by a user after the package loaded
(``hd.register_metric``, ``hd.register_decoder``): made from its class on first access
(``functional.my_metric``), with the signature and docstring its ``PARAMS`` give.

The built-in metrics and decoders do not come from here: theirs are written out, one module per
concept (``_accuracy.py`` ... ``_heuristics.py``).  Both kinds call the same pieces (``_pieces.py``), so a
generated function behaves as a written-out one would, and tests/test_functional.py checks that each
written-out signature is the one this module would make from the class.
"""

from __future__ import annotations

import inspect

import torch

from ..core.posterior import Posterior
from ..decoders.base import Decoder
from ..decoders.registry import DECODERS
from ..hierarchy import Hierarchy
from ..metrics.registry import METRICS
from ._pieces import as_hierarchy, decode_by, expect, score

__all__ = ["metric_functions", "decoder_function", "functions_of", "signature_of",
           "VALUE_LEADING", "EXPECTED_LEADING", "DECODE_LEADING",
           "VALUE_KEYWORDS", "PROBS_KEYWORDS", "DECODE_KEYWORDS", "METRIC_DECODE_KEYWORDS"]

_POS = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KW = inspect.Parameter.KEYWORD_ONLY

# (name, annotation) of the leading arguments, and (name, default, annotation) of each function's own
# keywords; a metric's or decoder's parameter cannot take one of these names.
VALUE_LEADING = (("preds", torch.Tensor), ("target", torch.Tensor), ("hierarchy", Hierarchy))
EXPECTED_LEADING = (("leaf_probs", torch.Tensor | Posterior), ("preds", torch.Tensor), ("hierarchy", Hierarchy))
DECODE_LEADING = (("leaf_probs", torch.Tensor | Posterior), ("hierarchy", Hierarchy))
VALUE_KEYWORDS = (("decoder", "optimal", str | tuple | Decoder), ("from_logits", False, bool | str),
                  ("reduction", "none", str), ("dtype", None, torch.dtype | None), ("validate", None, bool | None))
PROBS_KEYWORDS = (("from_logits", False, bool | str), ("normalize", False, bool), ("validate", None, bool | None),
                  ("chunk_size", None, int | None))
DECODE_KEYWORDS = PROBS_KEYWORDS + (("within", None, torch.Tensor | int | None),)
# A metric's decoder also certifies top-k decisions (where the metric gives a certificate).
METRIC_DECODE_KEYWORDS = DECODE_KEYWORDS + (("certify", False, bool),)

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
_CERTIFY_ARG = """
    certify: with a top-k input, also each row's certificate: ``(pred, certified, regret_bound)``,
        as for :func:`hdecode_torch.functional.decode`."""

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


def signature_of(leading: tuple, cls, own: tuple) -> inspect.Signature:
    """``(leading..., *, <cls.PARAMS>, <own keywords>) -> Tensor``: the signature of a function of ``cls``,
    its parameters keyword-only with their declared defaults (none where required) and types; a declared
    parameter named as one of the function's own arguments is a ``TypeError``."""
    taken = {item[0] for item in own} | {name for name, _ in leading}
    clash = [p.name for p in cls.PARAMS if p.name in taken]
    if clash:
        raise TypeError(f"{cls.component_kind.capitalize()} {cls.name!r} declares parameter(s) {clash}, which the "
                        f"functional API uses for its own keywords: call its class instead")
    params = [inspect.Parameter(n, _POS, annotation=a) for n, a in leading]
    for p in cls.PARAMS:
        default = inspect.Parameter.empty if p.required else p.default
        annotation = p.type if p.has_text_form else inspect.Parameter.empty
        params.append(inspect.Parameter(p.name, _KW, default=default, annotation=annotation))
    params += [inspect.Parameter(n, _KW, default=d, annotation=a) for n, d, a in own]
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
    function.__module__ = "hdecode_torch.functional"
    function.__signature__ = signature
    function.__doc__ = doc
    return function


def _built(cls, arguments: dict):
    """(``cls`` built on the bound hierarchy with its declared parameters, the other arguments)."""
    declared = {p.name for p in cls.PARAMS}
    rest = {k: v for k, v in arguments.items() if k not in declared}
    return cls(as_hierarchy(rest["hierarchy"]), **{k: v for k, v in arguments.items() if k in declared}), rest


def metric_functions(cls) -> dict:
    """``{function name: function}``: the value, expected value and (if it has one) Bayes-optimal decoder of
    the metric class ``cls`` as functions."""
    f = _fields(cls)
    f["better"] = ("" if "better" in cls.description
                   else f"  {'Higher' if cls.higher_is_better else 'Lower'} is better.")
    f["preds"] = ("(B, N) bool node sets (closed under ancestors) or (B,) int64 node ids\n"
                  "        (their ancestor sets)" if cls.kind == "set" else "(B,) int64 node ids")
    expected_args = _PROBS_ARGS.format(preds_arg=f"\n    preds: {f['preds']}.", within="", **f)

    def value_body(a):
        m, r = _built(cls, a)
        return score(m, r["preds"], r["target"], decoder=r["decoder"], from_logits=r["from_logits"],
                     reduction=r["reduction"], dtype=r["dtype"], validate=r["validate"])

    def expected_body(a):
        m, r = _built(cls, a)
        return expect(m, r["leaf_probs"], r["preds"], from_logits=r["from_logits"], normalize=r["normalize"],
                      validate=r["validate"], chunk_size=r["chunk_size"])

    def decode_body(a):
        m, r = _built(cls, a)
        return decode_by(m, r["leaf_probs"], from_logits=r["from_logits"], normalize=r["normalize"],
                         validate=r["validate"], chunk_size=r["chunk_size"], within=r["within"],
                         certify=r["certify"])

    out = {
        cls.name: _make(cls.name, signature_of(VALUE_LEADING, cls, VALUE_KEYWORDS), _VALUE_DOC.format(**f),
                        value_body),
        f"expected_{cls.name}": _make(f"expected_{cls.name}", signature_of(EXPECTED_LEADING, cls, PROBS_KEYWORDS),
                                      _EXPECTED_DOC.format(**{**f, "args": expected_args}), expected_body),
    }
    if cls.has_decoder:
        f["returns"] = ("(B, N) bool ancestor-closed node sets holding the root" if cls.kind == "set"
                        else "(B,) int64 node ids")
        decode_args = _PROBS_ARGS.format(preds_arg="", within=_WITHIN_ARG + _CERTIFY_ARG, **f)
        out[f"decode_{cls.name}"] = _make(f"decode_{cls.name}",
                                          signature_of(DECODE_LEADING, cls, METRIC_DECODE_KEYWORDS),
                                          _DECODE_DOC.format(**{**f, "args": decode_args}), decode_body)
    return out


def decoder_function(cls):
    """``decode_<name>``: the decoder class ``cls`` as a function."""

    def body(a):
        d, r = _built(cls, a)
        return decode_by(d, r["leaf_probs"], from_logits=r["from_logits"], normalize=r["normalize"],
                         validate=r["validate"], chunk_size=r["chunk_size"], within=r["within"])

    return _make(f"decode_{cls.name}", signature_of(DECODE_LEADING, cls, DECODE_KEYWORDS),
                 _DECODER_DOC.format(**_fields(cls)), body)


def functions_of(name: str):
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
