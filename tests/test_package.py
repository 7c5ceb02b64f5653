"""The package itself: what `import hdecode_torch` loads, its metadata, version, license and extras."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hdecode_torch as hd

ROOT = Path(__file__).resolve().parent.parent

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def _python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + sys.path), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_import_loads_neither_dynamo_nor_triton_nor_optional_frameworks():
    """Dynamo (and Triton, which it imports) cost more than torch itself; the frameworks load on first use."""
    proc = _python(
        "import sys, hdecode_torch as hd\n"
        "heavy = ['torch._dynamo', 'torch._inductor', 'triton', 'torchmetrics', 'pytorch_lightning', 'lightning',\n"
        "         'matplotlib', 'onnx', 'onnxscript', 'networkx']\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
        "import torch\n"
        "h = hd.load_hierarchy('tieredimagenet-h')\n"
        "x = torch.full((2, h.num_leaves), 1.0 / h.num_leaves)\n"
        "hd.DecodingHead(h, 'tree_distance', cuda_graph=False)(x)\n"
        "print(sorted(m for m in ['torch._dynamo', 'triton'] if m in sys.modules))\n"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    at_import, after_head = proc.stdout.split("\n")[:2]
    assert at_import == "[]"
    assert after_head == "[]"  # an eager DecodingHead does not load Dynamo either


def test_lazy_integrations_load_their_framework_on_first_access():
    proc = _python("import sys, hdecode_torch as hd\nhd.HierarchicalMetric\nprint('torchmetrics' in sys.modules)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True"


def test_version_has_one_source():
    try:
        installed = importlib.metadata.version("hdecode_torch")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout with PYTHONPATH, not installed
        installed = None
    assert installed in (None, hd.__version__)
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"] and "version" in meta["project"]["dynamic"]
    assert meta["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "hdecode_torch.__version__"}


def test_license_and_typing_marker():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert meta["license"] == "MIT" and meta["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    assert not any(c.startswith("License ::") for c in meta["classifiers"])  # PEP 639: the expression only
    assert (ROOT / "hdecode_torch" / "py.typed").exists()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["hdecode_torch"]


def _names(reqs):
    return {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip() for r in reqs}


def test_dependencies_and_extras():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_req = [r for r in meta["dependencies"] if _names([r]) == {"torch"}]
    assert torch_req == ["torch>=2.8"]  # no upper cap: the next torch release must install
    # the README states the same bound
    assert "`torch>=2.8`" in (ROOT / "README.md").read_text()
    extras = meta["optional-dependencies"]
    optional = set().union(*(_names(v) for k, v in extras.items() if k not in ("all", "test", "scatter")))
    assert _names(extras["all"]) == optional  # [all] is every optional feature...
    assert "torch-scatter" not in _names(extras["all"])  # ...except the scatter backend, built from source
    assert {"onnx", "onnxscript", "onnxruntime"} <= _names(extras["export"]) <= _names(extras["test"])


def test_lightning_error_names_the_extra_that_installs_it():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    proc = _python("import sys\nsys.modules['pytorch_lightning'] = None\nsys.modules['lightning'] = None\n"
                   "sys.modules['lightning.pytorch'] = None\n"
                   "from hdecode_torch.integrations import HierarchicalMetricsCallback")
    assert proc.returncode != 0
    message = proc.stderr.strip().splitlines()[-1]
    assert 'pip install "hdecode_torch[lightning]"' in message
    (package,) = _names(meta["optional-dependencies"]["lightning"])
    assert f"`{package}`" in message


def test_import_is_lazy_and_every_public_name_loads():
    """`import hdecode_torch` loads no torch (the `hdecode` command answers --help before it); the
    version is readable then; `hd.X`, `from hdecode_torch import X`, dir() and `import *` still work."""
    proc = _python(
        "import sys, hdecode_torch as hd\n"
        "print('torch' in sys.modules, hd.__version__)\n"
        "print(sorted(set(hd.__all__) - set(dir(hd))))\n"
        "from hdecode_torch import get_metric, TemperatureScaler\n"
        "print('torch' in sys.modules, get_metric is hd.get_metric)\n"
        "ns = {}\n"
        "exec('from hdecode_torch import *', ns)\n"
        "print(sorted(set(hd.__all__) ^ {k for k in ns if k != '__builtins__'}))\n"
        "print(hd.kernels.__name__, hd.Hierarchy.__module__)\n"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"False {hd.__version__}"
    assert lines[1] == "[]"  # dir() lists every public name before it is loaded
    assert lines[2] == "True True"
    assert lines[3] == "[]"  # a star import gives __all__, HierarchicalMetricsCallback not in it
    assert lines[4] == "hdecode_torch.kernels hdecode_torch.hierarchy.hierarchy"
    assert "HierarchicalMetricsCallback" not in hd.__all__ and hd.HierarchicalMetricsCallback.__name__ == \
        "HierarchicalMetricsCallback"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hd.nope  # noqa: B018


@pytest.mark.parametrize("module", ["kernels", "kernels.fused", "synthetic", "metrics", "cli.compare"])
def test_any_submodule_can_be_imported_first(module):
    """With the package lazy, a submodule may be the first thing imported (kernels and core import each
    other: the cycle must still resolve, as it did when the package imported core first)."""
    proc = _python(f"import hdecode_torch.{module}\nimport hdecode_torch as hd\nprint(hd.get_metric.__name__)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "get_metric"
