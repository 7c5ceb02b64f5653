"""Parameters of metrics and decoders, declared once on each class.

A class lists its parameters as :class:`Param` s in ``PARAMS``; from that one declaration come the
constructor's checks, the ``key`` (``hf_beta[beta=0.5]``), the text specs of the command line and of
``get_metric("hf_beta[beta=0.5]", h)``, and the help texts.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Param", "REQUIRED", "bind_params", "format_value"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The default of a parameter that must be given.
REQUIRED: Any = _Required()


def format_value(value) -> str:
    """A parameter value as it appears in keys: numbers in ``%g`` form, strings as they are."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Real):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class Param:
    """One parameter of a metric or decoder class.

    name: the keyword; type: ``float``, ``int``, ``str`` or ``bool`` (values given as text are parsed
    to it), or ``object`` for values that have no text form (a tensor); default: its value when not
    given (``REQUIRED``: must be given); check: ``check(value, name) -> value`` raising ``ValueError``
    /``TypeError`` that names the parameter; choices: the allowed values of a ``str`` parameter;
    in_key: whether the value is part of the component's ``key`` (parameters that change the answer
    are, those that only change how it is computed, such as ``strategy``, are not); doc: one line.
    """

    name: str
    type: type = float
    default: Any = REQUIRED
    check: Callable[[Any, str], Any] | None = None
    choices: tuple = ()
    in_key: bool = True
    doc: str = ""

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def has_text_form(self) -> bool:
        """Whether the value can be written in a text spec (``name[p=v]``, the command line)."""
        return self.type in (float, int, str, bool)

    def parse(self, text: str):
        """The value of ``text`` (from a spec such as ``hf_beta[beta=0.5]``) in this parameter's type."""
        if not self.has_text_form:
            raise ValueError(f"Parameter `{self.name}` cannot be given as text")
        text = text.strip()
        try:
            if self.type is bool:
                low = text.lower()
                if low not in ("true", "false", "1", "0"):
                    raise ValueError
                return low in ("true", "1")
            if self.type is int:
                return int(text)
            if self.type is float:
                value = float(text)
                if math.isnan(value):
                    raise ValueError
                return value
        except ValueError:
            raise ValueError(f"Expected `{self.name}` to be a {self.type.__name__}, but got {text!r}") from None
        return text

    def convert(self, value):
        """``value`` checked (a Python value: text is parsed by :meth:`parse`, from text specs only)."""
        if self.choices and value not in self.choices:
            raise ValueError(f"Expected `{self.name}` to be one of {self.choices}, but got {value!r}")
        return self.check(value, self.name) if self.check is not None else value


def bind_params(params: tuple[Param, ...], given: dict, what: str) -> dict:
    """``{name: checked value}`` for every declared parameter, defaults filled in.

    Unknown and missing parameters raise ``ValueError`` naming them and ``what`` (e.g. ``metric
    'hf_beta'``), with the accepted ones.
    """
    names = [p.name for p in params]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"Bad parameters for {what}: unknown parameter(s) {', '.join(map(repr, unknown))}; "
                         f"accepted: {', '.join(names) or 'none'}")
    missing = [p.name for p in params if p.required and p.name not in given]
    if missing:
        raise ValueError(f"Bad parameters for {what}: it requires {', '.join(map(repr, missing))}")
    return {p.name: p.convert(given[p.name]) if p.name in given else p.default for p in params}
