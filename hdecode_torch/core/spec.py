"""The one way to name a metric or a decoder with its parameters.

A spec is any of:

- a name, ``"wu_palmer"``;
- a name with parameters in the syntax of the components' keys, ``"hf_beta[beta=0.5]"``,
  ``"darts[lam=1]"`` (values are parsed by the parameter declared on the class);
- a ``(name, {params})`` pair, ``("hf_beta", {"beta": 0.5})``;
- an already built metric or decoder (returned as is).

Decoders also take ``"optimal:<metric spec>"``, e.g. ``"optimal:hf_beta[beta=2]"``: the Bayes-optimal
decoder of that metric (the key an :class:`~hdecode_torch.decoders.OptimalDecoder` prints).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["parse_spec", "split_specs"]

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
