"""The names the command line takes, and the checks that need nothing but them, without torch.

A misspelt name (``--metric wu_palmar``), an input file that does not exist (``--probs nope.npy``) or
a parameter of a metric or decoder that is not selected (``--beta`` with ``--metric zhao``) is
answered from the tables here before torch (seconds to import) is loaded, with the message the
library's registries give once it is.  The tables are read from the torch-free copy of the classes'
declarations (:mod:`.catalogue`).  Names that a module given with ``--import`` registers are not in
them: with ``--import``, names and parameters are checked after the import, and only the files before it.
"""

from __future__ import annotations

import difflib
import os
import re

from .catalogue import CATALOGUE
from .io import STDIN, CLIError, _check_readable_file
from .options import DECODER_FLAGS, HEURISTIC_NAMES, HIERARCHY_NAMES, METRIC_FLAGS, METRIC_NAMES

__all__ = ["METRIC_ALIASES", "UNLISTED_METRICS", "DECODER_NAMES", "HIERARCHY_ALIASES", "PARAM_OWNERS",
           "check_applicable_names", "check_before_torch"]

#: ``hdecode_torch.metrics.METRICS``' aliases, alias -> name.
METRIC_ALIASES = {a: name for name, facts in CATALOGUE["metrics"].items() for a in facts["aliases"]}
#: Registered but not listed (``cost_matrix`` needs its (N, L) table, which no option gives).
UNLISTED_METRICS = tuple(name for name, facts in CATALOGUE["metrics"].items() if not facts["listed"])
#: ``hdecode_torch.list_decoders()``, in its order (the heuristics and ``optimal``); no aliases.
DECODER_NAMES = tuple(name for name, facts in CATALOGUE["decoders"].items() if facts["listed"])
#: ``hdecode_torch.hierarchy.bundled``'s aliases (matched without case), alias -> name.
HIERARCHY_ALIASES = {"tiered": "tieredimagenet-h", "tieredimagenet": "tieredimagenet-h",
                     "tiered-imagenet-h": "tieredimagenet-h", "inat": "inat19", "inaturalist19": "inat19"}



def param_owners(metric_flags, decoder_flags) -> tuple:
    """``(args attribute, option, "metric"/"decoder", owner)`` of every parameter option, its plural
    (``--betas``) included where it has a sweep; ``*_flags``: ``(owner, flag facts)``."""
    out = []
    for kind, flags in (("metric", metric_flags), ("decoder", decoder_flags)):
        for owner, flag in flags:
            dest = flag["option"].lstrip("-").replace("-", "_")
            out.append((dest, flag["option"], kind, owner))
            if flag["sweep"]:
                out.append((dest + "s", flag["option"] + "s", kind, owner))
    return tuple(out)


#: (args attribute, flag, "metric"/"decoder", the one it belongs to), from the catalogue.
PARAM_OWNERS = param_owners(METRIC_FLAGS, DECODER_FLAGS)

# The name at the head of a spec, as hdecode_torch.core.spec parses it (that module's package loads torch).
_SPEC_NAME = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*(?:\[.*\])?\s*", re.S)


def check_applicable_names(args, metric_names, decoder_names, *, metric_flag="--metrics",
                           decoder_flag="--decoders", owners=None) -> None:
    """A metric or decoder parameter given on the command line (``--beta``, ``--tau``, ...) for one
    that is not selected is an error; ``*_names``: the selected ones' registered names; ``owners``: as
    :data:`PARAM_OWNERS` (the default), which a run with ``--import`` extends by the module's own."""
    selected = {"metric": list(metric_names), "decoder": list(decoder_names)}
    for attr, flag, kind, owner in PARAM_OWNERS if owners is None else owners:
        if getattr(args, attr, None) is None or owner in selected[kind]:
            continue
        chosen = ", ".join(dict.fromkeys(selected[kind])) or "none"
        which = metric_flag if kind == "metric" else decoder_flag
        raise CLIError(f"{flag} applies to the {kind} {owner}, which is not selected ({which}: {chosen})")


def _split(values) -> list[str]:
    """``hdecode_torch.core.spec.split_specs`` over option values: commas inside brackets kept."""
    out = []
    for text in values:
        depth, start = 0, 0
        for i, ch in enumerate(text):
            depth += (ch == "[") - (ch == "]")
            if ch == "," and depth == 0:
                out.append(text[start:i])
                start = i + 1
        out.append(text[start:])
    return list(dict.fromkeys(s.strip() for s in out if s.strip()))


def _name(spec: str) -> str | None:
    """The registered name a spec starts with; ``None`` for a malformed spec (reported after the import)."""
    if spec.startswith("optimal:") or spec.rstrip().endswith("/optimal"):
        return "optimal"
    match = _SPEC_NAME.fullmatch(spec)
    return match.group(1) if match else None


def _unknown(kind: str, name: str, known, listed) -> CLIError:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return CLIError(f"unknown {kind} {name!r}{hint}; available: {', '.join(sorted(listed))}")


def _metric_names(specs) -> list[str]:
    known = {*METRIC_NAMES, *METRIC_ALIASES, *UNLISTED_METRICS}
    names = []
    for spec in specs:
        name = _name(spec)
        if name is None:
            continue
        if name not in known:
            raise _unknown("metric", name, known, METRIC_NAMES)
        names.append(METRIC_ALIASES.get(name, name))
    return names


def _decoder_names(specs, flag: str, heuristics_only: bool) -> list[str]:
    if heuristics_only:
        if "all" in specs:
            specs = [s for s in specs if s != "all"] + list(HEURISTIC_NAMES)
        for spec in specs:
            if spec == "optimal" or spec.startswith("optimal:") or spec.rstrip().endswith("/optimal"):
                raise CLIError(f"{flag}: 'optimal' is not a heuristic; each metric's optimal decoder is always "
                               "included")
    names = []
    for spec in specs:
        name = _name(spec)
        if name is None:
            continue
        if name not in DECODER_NAMES:
            raise _unknown("decoder", name, DECODER_NAMES, DECODER_NAMES)
        names.append(name)
    return names


def check_hierarchy(spec: str | None) -> None:
    """``--hierarchy``: a bundled name (or alias), ``-`` or an existing path."""
    if spec is None or spec == STDIN or os.path.exists(spec):
        return
    if spec.lower() not in (*HIERARCHY_NAMES, *HIERARCHY_ALIASES):
        raise CLIError(f"--hierarchy {spec!r} is neither a bundled tree ({', '.join(HIERARCHY_NAMES)}) nor an "
                       "existing file")


def check_before_torch(args, *, metrics=None, decoders=None, metric_flag="--metrics", decoder_flag="--decoders",
                       heuristics_only=True, single=False, files=()) -> None:
    """The checks of a run that need no torch: the tree's name, the metric and decoder names and
    the parameters given for them, and that the input files ``files`` (flags) exist.

    ``metrics``/``decoders``: the option values naming the selection (each value may hold several
    comma-separated specs), the command's default when the option is not given; ``single``: the
    option takes one spec (``decode --metric``), a list of several is reported later.
    ``heuristics_only``: ``decoders`` selects heuristics (``all`` expands, ``optimal`` is refused).
    """
    check_hierarchy(getattr(args, "hierarchy", None))
    if not getattr(args, "imports", None):
        metric_specs, decoder_specs = _split(metrics or ()), _split(decoders or ())
        # An option with no name in it, or several where one is taken: the run's own message, after the import.
        malformed = (metrics and not metric_specs) or (decoders and not decoder_specs)
        if not malformed and not (single and (len(metric_specs) > 1 or len(decoder_specs) > 1)):
            metric_names = _metric_names(metric_specs)
            decoder_names = _decoder_names(decoder_specs, decoder_flag, heuristics_only)
            if len(metric_names) == len(metric_specs) and len(decoder_names) == len(decoder_specs):
                check_applicable_names(args, metric_names, decoder_names, metric_flag=metric_flag,
                                       decoder_flag=decoder_flag)
    for path in getattr(args, "imports", None) or ():
        if path.endswith(".py"):
            _check_readable_file(path, "--import")
    for flag in files:
        path = getattr(args, flag.lstrip("-").replace("-", "_"), None)
        if path is not None and path != STDIN:
            _check_readable_file(path, flag)
