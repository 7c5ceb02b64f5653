"""What the Triton tests share: whether Triton is importable, a fresh interpreter to run code in (the
interpreter mode is chosen when Triton is imported, so each mode needs its own process), and the
ahead-of-time compile check for an H100 (sm_90, no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except ImportError:  # made unimportable, as the tests of a machine without Triton do
        return False


HAS_TRITON = _has_triton()
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")


def run_python(code: str, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a new interpreter with the project and tests/ importable, TRITON_INTERPRET unset
    unless ``env_extra`` sets it."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests"),
                                                       os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=ROOT)


def block_imports(*names: str) -> str:
    """Code that makes ``names`` absent for the rest of a fresh interpreter, run before ``import torch``,
    and defines ``loaded(*names)``: the modules of ``names`` (and their submodules) really imported.

    ``sys.modules[name] = None`` is Python's own way to say a module is missing: ``import name`` (and
    of any submodule) raises ModuleNotFoundError and ``importlib.util.find_spec(name)`` returns None,
    as where it is not installed.  A meta-path finder that raises ImportError in ``find_spec`` is not
    the same: torch 2.15 calls ``find_spec("triton")`` at start-up and catches only ModuleNotFoundError.
    """
    return textwrap.dedent(f"""\
        import sys
        for _name in {names!r}:
            sys.modules[_name] = None
        def loaded(*names):
            return sorted(m for m, mod in sys.modules.items()
                          if mod is not None and any(m == n or m.startswith(n + ".") for n in names))
    """)


_SM90_PRELUDE = """\
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
target = GPUTarget("cuda", 90, 32)
def build(fn, sig, consts, warps):
    src = ASTSource(fn=fn, signature=sig, constexprs=consts)
    return triton.compile(src, target=target, options={"num_warps": warps, "enable_fp_fusion": False})
"""


def check_compiles_for_sm90(body: str) -> None:
    """Run ``body`` after a prelude defining ``build(fn, signature, constexprs, num_warps)`` (Triton's
    real compiler, TTIR -> PTX -> cubin, for sm_90); ``body`` imports the ops' ``triton`` modules it
    builds.  Fail on any error, skip where Triton has no NVIDIA backend."""
    proc = run_python(_SM90_PRELUDE + textwrap.dedent(body) + '\nprint("compiled")\n')
    if "No module named 'triton.backends.nvidia'" in proc.stderr:
        pytest.skip("triton has no NVIDIA backend here")
    assert proc.returncode == 0 and "compiled" in proc.stdout, proc.stderr[-4000:]


def interpreter_results(module: str) -> dict:
    """``module.interpreter_checks()`` run in one fresh interpreter with ``TRITON_INTERPRET=1`` (one
    subprocess per test file, also under pytest-xdist): ``{case name: {"ok": ..., ...}}``."""
    # Each file's checks took 2.5 to over 5 minutes under the interpreter on the shared 2-core machine
    # (test_jaccard_triton's ran out of the former 300 s at a load average of 8-10).
    proc = run_python(f"import json, {module} as T; print('@@' + json.dumps(T.interpreter_checks()))",
                      {"TRITON_INTERPRET": "1"}, timeout=900)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][2:])


def route_cpu_calls_to_triton() -> None:
    """Send every fused op's CPU call through its CUDA dispatch (argument checks, then the Triton
    kernel), so that the kernels run under Triton's CPU interpreter wherever the suite calls an op.

    With ``HDECODE_TEST_PLAN=cuda`` this runs a test file as a GPU would run it, on a machine without
    one: ``HDECODE_TEST_TRITON_ON_CPU=1 TRITON_INTERPRET=1 HDECODE_TEST_PLAN=cuda pytest tests/...``
    (slow: the interpreter runs one program at a time).
    """
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("HDECODE_TEST_TRITON_ON_CPU needs TRITON_INTERPRET=1 in the environment")
    from hdecode_torch.kernels.fused import _registry

    import dataclasses

    for name, op in list(_registry.OPS.items()):
        _registry._LIB.impl(name, op.cuda, "CPU")
        # `_registry.call` runs `torch_impl` directly on plain CPU tensors (no dispatcher): point it at the
        # CUDA dispatch too
        _registry.OPS[name] = dataclasses.replace(op, torch_impl=op.cuda)
