"""Registries of metrics and decoders: names to classes, aliases, and building from a spec.

The library registers its own classes in two :class:`Registry` instances (``metrics.METRICS``,
``decoders.DECODERS``); users add theirs with ``hd.register_metric`` / ``hd.register_decoder`` and
get everything built on names for free: ``get_metric``, ``DecodingHead``, ``HierarchicalMetric``,
the Lightning callback and the command line (``hdecode --import MODULE``).
"""

from __future__ import annotations

import difflib

from .params import bind_params
from .spec import parse_spec

__all__ = ["Registry"]


class Registry:
    """Names -> classes of one kind (``"metric"`` or ``"decoder"``), each a subclass of ``base``."""

    def __init__(self, kind: str, base: type):
        self.kind, self.base = kind, base
        self._classes: dict[str, type] = {}
        self._aliases: dict[str, str] = {}
        self._unlisted: set[str] = set()

    def register(self, cls: type | None = None, *, aliases=(), replace: bool = False, listed: bool = True):
        """Add ``cls`` under ``cls.name`` (and ``aliases``); usable as a class decorator.

        ``cls`` must subclass the registry's base class and declare a non-empty ``name`` (letters,
        digits and ``_``) and a one-line ``description``.  A name already taken is a ``ValueError``
        unless ``replace=True``.  ``listed=False``: found by name but left out of :meth:`names` (a
        component that cannot be built from its name alone, such as a cost matrix).  Returns ``cls``.
        """
        if cls is None:
            return lambda c: self.register(c, aliases=aliases, replace=replace, listed=listed)
        if not isinstance(cls, type) or not issubclass(cls, self.base):
            raise TypeError(f"Expected a subclass of {self.base.__name__} to register as a {self.kind}, but got {cls!r}")
        name = getattr(cls, "name", "")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"Expected {cls.__name__}.name to be an identifier such as 'my_{self.kind}', but got {name!r}")
        for key in (name, *aliases):
            taken = self._classes.get(key) or self._classes.get(self._aliases.get(key, ""))
            if taken is not None and taken is not cls and not replace:
                raise ValueError(f"The {self.kind} name {key!r} is taken by {taken.__name__}; pass replace=True to "
                                 "replace it")
        self._classes[name] = cls
        self._aliases.pop(name, None)
        (self._unlisted.discard if listed else self._unlisted.add)(name)
        for alias in aliases:
            self._aliases[alias] = name
        return cls

    def unregister(self, name: str) -> None:
        """Remove ``name`` and its aliases (``KeyError`` if it is not registered)."""
        del self._classes[name]
        self._unlisted.discard(name)
        for alias in [a for a, n in self._aliases.items() if n == name]:
            del self._aliases[alias]

    def names(self) -> list[str]:
        """The listed names, in registration order."""
        return [n for n in self._classes if n not in self._unlisted]

    def __contains__(self, name) -> bool:
        return name in self._classes or name in self._aliases

    def describe(self) -> dict[str, str]:
        """``{name: one-line description}``, in registration order."""
        return {name: self._classes[name].description for name in self.names()}

    def get_class(self, name: str) -> type:
        """The class of ``name`` (or of an alias); an unknown name is a ``ValueError`` that lists the
        names and suggests the closest."""
        if not isinstance(name, str):
            raise TypeError(f"Expected `name` to be a {self.kind} name, but got {type(name).__name__}")
        key = self._aliases.get(name, name)
        if key in self._classes:
            return self._classes[key]
        known = sorted(set(self._classes) | set(self._aliases))
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"Unknown {self.kind} {name!r}{hint}; available: {', '.join(sorted(self.names()))}")

    def build(self, spec, hierarchy, **params):
        """The component a spec names (``core.spec``), built on ``hierarchy`` with ``params`` added to
        the spec's own; a built component is returned as is (parameters then are an error)."""
        name, given = parse_spec(spec, self.kind)
        if isinstance(name, self.base):
            if given or params:
                raise ValueError(f"Parameters {sorted({**given, **params})} given for an already built {self.kind} "
                                 f"{name!r}")
            return name
        if not isinstance(name, str):
            raise TypeError(f"Expected `name` to be a {self.kind} name, a spec such as 'name[param=value]' or a built "
                            f"{self.kind}, but got {type(name).__name__}")
        clash = sorted(set(given) & set(params))
        if clash:
            raise ValueError(f"Parameter(s) {clash} given both in the spec {spec!r} and as keywords")
        cls = self.get_class(name)
        if isinstance(spec, str):  # values written in the spec are text: parse them as declared
            declared = {p.name: p for p in cls.PARAMS}
            given = {k: declared[k].parse(v) if k in declared and declared[k].has_text_form else v
                     for k, v in given.items()}
        return cls(hierarchy, **given, **params)

    def check_params(self, cls: type, given: dict) -> dict:
        """The checked parameters ``cls`` would be built with (``bind_params`` of its declarations)."""
        return bind_params(cls.PARAMS, given, f"{self.kind} {cls.name!r}")
