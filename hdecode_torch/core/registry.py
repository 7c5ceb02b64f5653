"""Registries of metrics and decoders: names to classes, aliases, and building from a spec.

The library registers its own classes in two :class:`Registry` instances (``metrics.METRICS``,
``decoders.DECODERS``); users add theirs with ``hd.register_metric`` / ``hd.register_decoder`` and
get everything built on names for free: ``get_metric``, ``DecodingHead``, ``HierarchicalMetric``,
the Lightning callback and the command line (``hdecode --import MODULE``).

A class declares its facts once, on itself (``name``, ``aliases``, ``listed``, ``kind``,
``higher_is_better``, ``PARAMS`` with their test grids and command-line options, ``algorithms``, the
``oracle`` and ``baseline`` hooks); the registry only reads them.  :meth:`Registry.declarations` gives
them as plain data, from which ``hdecode_torch.cli.catalogue`` writes the torch-free copy the command
line reads before torch loads.
"""

from __future__ import annotations

import difflib
import importlib

from .params import Param
from .spec import parse_spec

__all__ = ["Registry", "flag_facts", "resolve_hook"]


class Registry:
    """Names -> classes of one kind (``"metric"`` or ``"decoder"``), each a subclass of ``base``."""

    def __init__(self, kind: str, base: type):
        self.kind, self.base = kind, base
        self._classes: dict[str, type] = {}
        self._aliases: dict[str, str] = {}
        self._unlisted: set[str] = set()

    def register(self, cls: type | None = None, *, aliases=(), replace: bool = False, listed: bool | None = None):
        """Add ``cls`` under ``cls.name`` (and its declared ``cls.aliases``, and ``aliases``); usable as a
        class decorator.

        ``cls`` must subclass the registry's base class and declare a non-empty ``name`` (letters,
        digits and ``_``) and a one-line ``description``.  A name already taken is a ``ValueError``
        unless ``replace=True``.  ``listed`` (default: the class's ``listed``) ``False``: found by name
        but left out of :meth:`names` (a component that cannot be built from its name alone, such as a
        cost matrix).  Returns ``cls``.
        """
        if cls is None:
            return lambda c: self.register(c, aliases=aliases, replace=replace, listed=listed)
        if not isinstance(cls, type) or not issubclass(cls, self.base):
            raise TypeError(f"Expected a subclass of {self.base.__name__} to register as a {self.kind}, but got {cls!r}")
        name = getattr(cls, "name", "")
        aliases = tuple(dict.fromkeys((*getattr(cls, "aliases", ()), *aliases)))
        listed = getattr(cls, "listed", True) if listed is None else listed
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

    def aliases_of(self, name: str) -> tuple[str, ...]:
        """The aliases registered for ``name``, in registration order."""
        return tuple(a for a, n in self._aliases.items() if n == name)

    def declarations(self) -> dict[str, dict]:
        """``{name: facts}`` of every registered class (listed or not), in registration order, as plain
        data (names, numbers, text): what the command line and the benchmarks' baselines need without
        torch.  Facts: ``listed``, ``aliases``, ``kind``, ``higher_is_better`` (metrics), ``baseline``
        (the hook), and ``flags``, one per parameter with a command-line option (:func:`flag_facts`)."""
        out = {}
        for name, cls in self._classes.items():
            kind = cls.kind if isinstance(cls.kind, str) else None  # None: that of each instance (optimal)
            facts = {"listed": name not in self._unlisted, "aliases": list(self.aliases_of(name)), "kind": kind}
            if hasattr(cls, "higher_is_better"):
                facts["higher_is_better"] = bool(cls.higher_is_better)
            facts["baseline"] = cls.baseline
            facts["flags"] = [flag_facts(p) for p in cls.PARAMS if p.flag is not None]
            out[name] = facts
        return out


def flag_facts(param: Param) -> dict:
    """A parameter's command-line option as plain data: ``param``, ``option``, ``default`` (a number, or
    ``None`` where it depends on the tree), ``default_text`` (as the help states it), ``help``, ``sweep``,
    ``lower``, ``lower_open``."""
    flag = param.flag
    default = None if callable(flag.default) else (param.default if flag.default is None else flag.default)
    return {"param": param.name, "option": flag.option, "default": default, "default_text": flag.default_text(param),
            "help": flag.help, "sweep": list(flag.sweep), "lower": flag.lower, "lower_open": flag.lower_open}


def resolve_hook(hook: str):
    """The object a ``"module:qualified.name"`` hook names (a class's ``oracle`` or ``baseline``), its
    module imported now (``reference`` is tests/reference.py, on the path under pytest)."""
    module, sep, qualname = hook.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"Expected a hook as 'module:qualified.name', but got {hook!r}")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj
