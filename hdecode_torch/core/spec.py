"""The one way to name a metric or a decoder with its parameters.

A spec is any of:

- a name, ``"wu_palmer"``;
- a name with parameters in the syntax of the components' keys, ``"hf_beta[beta=0.5]"``,
  ``"darts[lam=1]"`` (values are parsed by the parameter declared on the class);
- a ``(name, {params})`` pair, ``("hf_beta", {"beta": 0.5})``;
- an already built metric or decoder (returned as is).

Decoders also take ``"<metric spec>/optimal"`` (the label below) or ``"optimal:<metric spec>"``, e.g.
``"hf_beta[beta=2]/optimal"``: the Bayes-optimal decoder of that metric.

:func:`label` is the one way every output names a decoder or a (metric, decoder) pair: the head's
repr, the torchmetrics metric's name, the Lightning callback's logged keys, ``hdecode compare``'s
JSON keys and headers, the benchmarks' rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["parse_spec", "split_specs", "label", "OPTIMAL"]

#: The decoder label of a metric's own Bayes-optimal decoder within a (metric, decoder) pair.
OPTIMAL = "optimal"

_SPEC = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(?:\[(.*)\])?\s*")


def parse_spec(spec, what: str = "metric"):
    """``(name or built object, params dict)`` of a spec (module docstring).

    Text values stay text here; the class's parameter declarations parse them.  A malformed spec is
    a ``ValueError`` naming ``what`` and showing the syntax.
    """
    if isinstance(spec, (tuple, list)):
        if len(spec) != 2 or not isinstance(spec[1], Mapping):
            raise ValueError(f"Expected a {what} as a name or a (name, params dict) pair, but got {spec!r}")
        return spec[0], dict(spec[1])
    if not isinstance(spec, str):
        return spec, {}
    if spec.startswith("optimal:"):
        return "optimal", {"metric": spec[len("optimal:"):]}
    if spec.rstrip().endswith("/" + OPTIMAL):  # a label, as label() writes it
        return "optimal", {"metric": spec.rstrip()[:-len(OPTIMAL) - 1]}
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(f"Expected a {what} spec such as 'hf_beta' or 'hf_beta[beta=0.5]', but got {spec!r}")
    name, inner = match.groups()
    params: dict = {}
    if inner is not None and inner.strip():
        for item in inner.split(","):
            key, sep, value = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"Expected parameters as name=value in {what} spec {spec!r}, but got {item.strip()!r}")
            if key in params:
                raise ValueError(f"Parameter {key!r} is given twice in {what} spec {spec!r}")
            params[key] = value.strip()
    return name, params


def split_specs(text: str) -> list[str]:
    """Comma-separated specs, commas inside brackets kept: ``"a,b[x=1,y=2]"`` -> ``["a", "b[x=1,y=2]"]``."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [s for s in out if s]


def label(metric=None, decoder=None, *, prefix: str = "", safe: bool = False) -> str:
    """The canonical label of a decoder, of a metric, or of a (metric, decoder) pair.

    ``metric``: a built metric or its key; ``decoder``: a built decoder or its label (a str is taken as
    written).  The label of a decoder is its key (``"darts[lam=0.5]"``), except a metric's Bayes-optimal
    decoder, which is ``"<metric key>/optimal"`` (``"hf_beta[beta=0.5]/optimal"``); a pair's is
    ``"<metric key>/<decoder label>"``, the metric's own optimal decoder written ``optimal``
    (``"hf_beta[beta=0.5]/optimal"``, ``"tree_distance/darts[lam=0.5]"``).  Each part is a spec that
    ``get_metric`` / ``get_decoder`` take back.  ``prefix`` is put first (``"val/hf_beta[beta=0.5]/optimal"``).

    ``safe=True`` writes the same label with letters, digits, ``_`` and ``-`` only, for names that refuse
    ``.``, ``/`` or brackets (logger keys in ``ModelCheckpoint`` file-name templates, ``MetricCollection``
    keys, file and column names): the parts joined by ``_``, each parameter value appended to its
    component with the decimal point written ``p`` (``"hf_beta0p5_optimal"``, ``"val_tree_distance_darts0p5"``,
    ``name_pv_qw`` for several parameters).  O(length of the keys).
    """
    if metric is not None and not isinstance(metric, str):
        metric = metric.key
    if decoder is not None and not isinstance(decoder, str):
        own = getattr(decoder, "metric", None) if decoder.name == OPTIMAL else None
        if own is not None and (metric is None or own.key == metric):
            metric, decoder = own.key, OPTIMAL  # a metric's own optimal decoder, named after the metric
        else:
            decoder = decoder.key  # an OptimalDecoder's key is "<metric key>/optimal" too
    parts = [p for p in (prefix, metric, decoder) if p]
    return "_".join(_slug(p) for p in parts) if safe else "/".join(parts)


def _slug(key: str) -> str:
    """``name[p=v]`` -> ``namev``; ``name[p=v,q=w]`` -> ``name_pv_qw``; a decimal point becomes ``p``, and any
    other character than letters, digits, ``-`` and ``_`` becomes ``_``."""
    if key.startswith("optimal:"):  # the optimal decoder of another metric than the pair's
        key = key[len("optimal:"):] + "/" + OPTIMAL
    return "_".join(_slug_one(k) for k in _split_labels(key))


def _split_labels(key: str) -> list[str]:
    """``key`` cut at the ``/`` outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(key):
        depth += (ch == "[") - (ch == "]")
        if ch == "/" and depth == 0:
            out.append(key[start:i])
            start = i + 1
    out.append(key[start:])
    return [k for k in out if k]


def _slug_one(key: str) -> str:
    match = re.fullmatch(r"([^\[]*)\[(.*)\]", key)
    if match:
        name, inner = match.groups()
        items = [kv.split("=", 1) if "=" in kv else ["", kv] for kv in inner.split(",")]
        key = name + (items[0][1] if len(items) == 1 else "".join(f"_{k}{v}" for k, v in items))
    key = re.sub(r"(?<=\d)\.(?=\d)", "p", key)
    return re.sub(r"[^A-Za-z0-9_\-]", "_", key)
