"""The package's layers: every import inside it points down the stack
hierarchy < kernels < core < metrics < decoders < functional < integrations < cli, function-level imports
included, and only core/ resolves the device plan."""

from __future__ import annotations

import ast
import pathlib

import hdecode_torch

PACKAGE = pathlib.Path(hdecode_torch.__file__).parent
LAYERS = ["hierarchy", "kernels", "core", "metrics", "decoders", "functional", "integrations", "cli"]
#: Modules at the package's top level, placed in the stack: data helpers sit with the kernels they use.
TOP_LEVEL = {"synthetic": "kernels"}


def _layer(parts: tuple[str, ...]) -> int | None:
    """Rank of a module given as its path parts under the package (None: the package's own entry points)."""
    if not parts:
        return None
    head = parts[0].removesuffix(".py")
    if head in LAYERS:
        return LAYERS.index(head)
    if head in TOP_LEVEL:
        return LAYERS.index(TOP_LEVEL[head])
    return None  # __init__, __main__: the public surface, above everything


def _imports(path: pathlib.Path):
    """(line, target parts under the package) of every import of a package module in ``path``."""
    rel = path.relative_to(PACKAGE).with_suffix("").parts
    here = rel[:-1]  # the package the module sits in
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
                target = base + tuple(node.module.split(".")) if node.module else base
                names = [target + (a.name,) for a in node.names] if not node.module else [target]
            elif node.module and node.module.split(".")[0] == "hdecode_torch":
                names = [tuple(node.module.split(".")[1:])]
            else:
                continue
            for t in names:
                yield node.lineno, t
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "hdecode_torch":
                    yield node.lineno, tuple(a.name.split(".")[1:])


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py"))


def test_every_import_points_down_the_stack():
    bad = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).parts
        mine = _layer(rel)
        if mine is None:
            continue
        for line, target in _imports(path):
            theirs = _layer(target)
            if target == ("__version__",):  # the version number, written once at the root
                continue
            if theirs is None:
                bad.append(f"{path.relative_to(PACKAGE)}:{line} imports the package root {'.'.join(target) or '.'}")
            elif theirs > mine:
                bad.append(f"{path.relative_to(PACKAGE)}:{line} ({LAYERS[mine]}) imports {'.'.join(target)} "
                           f"({LAYERS[theirs]})")
    assert not bad, "imports that point up the stack:\n" + "\n".join(bad)


def test_only_core_resolves_the_plan():
    readers = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).parts
        if rel[0] == "core":
            continue
        text = path.read_text(encoding="utf-8")
        for name in ("_OVERRIDE", "plan_name(", "current_plan", "planned_device_type"):
            if name in text:
                readers.append(f"{'/'.join(rel)} uses {name}")
    assert not readers, readers


def test_the_checker_sees_function_level_and_relative_imports(tmp_path):
    # A function-level relative import of an upper layer, as the checker parses it.
    src = "def f():\n    from ..metrics import get_metric\n"
    tree = ast.parse(src)
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert node.level == 2 and node.module == "metrics"
    assert _layer(("kernels", "x.py")) < _layer(("metrics",))
    # the functional API: above what it wraps, below the integrations built on it
    assert _layer(("decoders",)) < _layer(("functional", "__init__.py")) < _layer(("integrations", "torchmetrics.py"))
