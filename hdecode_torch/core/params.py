"""Parameters of metrics and decoders, declared once on each class.

A class lists its parameters as :class:`Param` s in ``PARAMS``; from that one declaration come the
constructor's checks, the ``key`` (``hf_beta[beta=0.5]``), the text specs of the command line and of
``get_metric("hf_beta[beta=0.5]", h)``, the help texts, the test grid (``grid``, read by the tests'
harness) and the command-line option with its default (``flag``, a :class:`Flag`, read by ``hdecode``
and by the benchmarks, which time the setting the command line runs).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Param", "Flag", "REQUIRED", "bind_params", "format_value", "grid_cases"]


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
class Flag:
    """The command-line option of a parameter: ``hdecode compare --tau 0.7`` sets ``tau``.

    option: the option (``"--tau"``; its ``dest`` is ``tau``); default: the value the command line
    uses when the option is not given (``None``: the parameter's own default), or a function of the
    hierarchy whose docstring's first line says what it gives (``information_threshold``'s ½·log L);
    help: what the option sets (the command line adds whose parameter it is and the default);
    sweep: the values at which commands that score several metrics (``compare``, ``plot gain``) run
    the metric unless its plural option (``option + "s"``, several values) gives others; lower,
    lower_open: the least value the command line's parser accepts before torch loads (excluded when
    ``lower_open``), the parameter's own check following once it does.  Plain data, so that the
    command line can read it from a catalogue without importing the classes (``hdecode_torch.cli.catalogue``).
    """

    option: str
    default: Any = None
    help: str = ""
    sweep: tuple = ()
    lower: float | None = None
    lower_open: bool = False

    @property
    def dest(self) -> str:
        """The option's attribute on the parsed arguments (``--info-threshold`` -> ``info_threshold``)."""
        return self.option.lstrip("-").replace("-", "_")

    def default_for(self, param: "Param", hierarchy):
        """The command line's value of ``param`` on ``hierarchy`` when the option is not given."""
        if callable(self.default):
            return self.default(hierarchy)
        return param.default if self.default is None else self.default

    def default_text(self, param: "Param") -> str:
        """The default as the help text states it."""
        if callable(self.default):
            return (self.default.__doc__ or self.default.__name__).strip().splitlines()[0].rstrip(".")
        return format_value(param.default if self.default is None else self.default)


@dataclass(frozen=True)
class Param:
    """One parameter of a metric or decoder class.

    name: the keyword; type: ``float``, ``int``, ``str`` or ``bool`` (values given as text are parsed
    to it), or ``object`` for values that have no text form (a tensor); default: its value when not
    given (``REQUIRED``: must be given); check: ``check(value, name) -> value`` raising ``ValueError``
    /``TypeError`` that names the parameter; choices: the allowed values of a ``str`` parameter;
    in_key: whether the value is part of the component's ``key`` (parameters that change the answer
    are, those that only change how it is computed, such as ``strategy``, are not); doc: one line;
    grid: the values the tests run it at (the first where one case is enough; :func:`grid_cases`);
    flag: its command-line option (:class:`Flag`), or ``None``.
    """

    name: str
    type: type = float
    default: Any = REQUIRED
    check: Callable[[Any, str], Any] | None = None
    choices: tuple = ()
    in_key: bool = True
    doc: str = ""
    grid: tuple = ()
    flag: Flag | None = None

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


def grid_cases(params: tuple[Param, ...]) -> list[dict]:
    """The parameter settings the tests run a component at: every gridded parameter at its first
    value, then each further value of each parameter with the others at their first (one case per
    value, not the product).  ``[{}]`` for a component without a grid."""
    gridded = [p for p in params if p.grid]
    first = {p.name: p.grid[0] for p in gridded}
    return [first] + [{**first, p.name: v} for p in gridded for v in p.grid[1:]]
