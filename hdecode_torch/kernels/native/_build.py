"""Building and loading the native kernels: the C sources compiled once per user, cached, loaded with ctypes.

Every ``*.c`` file next to this one is compiled, with the ``*.h`` files beside them, into one shared library: a
kernel family adds its own source without touching the others'.  The library's name is keyed by a hash of
the sources and headers, the compiler (its path and ``--version``),
the flags and the platform, so a changed source, compiler or flag builds a new file and never loads a
stale one.  It is compiled to a temporary name in the cache folder and moved into place with
``os.replace`` (atomic): several processes (pytest-xdist workers) may build it at once, and each loads a
complete file, theirs or another's.  A file that does not load (corrupt, truncated) is rebuilt once.

Flags: ``-O2 -fPIC -shared -ffp-contract=off`` and never ``-ffast-math`` or ``-march=native``: the sums
must be the IEEE additions torch performs, one rounding each, in the same order (no fused multiply-add,
no reassociation), on any CPU of the platform the file was built on.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

__all__ = ["SOURCES", "HEADERS", "FLAGS", "ABI", "cache_dir", "find_compiler", "library_path", "load"]

_HERE = pathlib.Path(__file__).parent
#: The C sources compiled together (sorted: the same command line, the same key, on every machine).
SOURCES = tuple(sorted(_HERE.glob("*.c")))
#: The headers they include (part of the cache key: a changed header builds a new library).
HEADERS = tuple(sorted(_HERE.glob("*.h")))
FLAGS = ("-std=c99", "-O2", "-fPIC", "-shared", "-ffp-contract=off")
#: What ``hd_native_abi()`` returns for this package's source: a file that answers otherwise is not loaded.
ABI = 3
#: Machines whose C ``float``/``double`` arithmetic is IEEE binary32/binary64, one rounding per operation
#: (SSE2 on x86-64, NEON/VFP on AArch64): elsewhere (the x87 unit of 32-bit x86, say) the torch path runs.
MACHINES = ("x86_64", "amd64", "aarch64", "arm64")
_COMPILE_TIMEOUT_S = 120


def cache_dir() -> pathlib.Path:
    """``$HDECODE_CACHE_DIR``, else ``$XDG_CACHE_HOME/hdecode_torch``, else ``~/.cache/hdecode_torch``."""
    own = os.environ.get("HDECODE_CACHE_DIR")
    if own:
        return pathlib.Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "hdecode_torch"


def find_compiler() -> list[str] | None:
    """The C compiler's command line: ``$CC`` (split like a shell word list), else ``cc``, else ``gcc``;
    None when there is none."""
    cc = os.environ.get("CC", "").strip()
    if cc:
        words = shlex.split(cc)
        path = shutil.which(words[0])
        return [path] + words[1:] if path else None
    for name in ("cc", "gcc"):
        path = shutil.which(name)
        if path:
            return [path]
    return None


def _identity(cc: list[str]) -> str | None:
    """The compiler's ``--version`` output (its identity in the cache key), None when it does not run."""
    try:
        done = subprocess.run(cc + ["--version"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


def library_path(cc: list[str], identity: str, directory: pathlib.Path, flags=FLAGS) -> pathlib.Path:
    """Where the library built by ``cc`` with ``flags`` lives in ``directory``: named by a hash of everything
    that makes its bits (sources and headers with their names, compiler, flags, platform, the ABI number)."""
    key = hashlib.sha256()
    files = [part for f in SOURCES + HEADERS for part in (f.name.encode(), f.read_bytes())]
    for part in (*files, "\0".join(cc).encode(), identity.encode(), "\0".join(flags).encode(),
                 sys.platform.encode(), platform.machine().encode(), str(ABI).encode()):
        key.update(part)
        key.update(b"\0")
    return directory / f"hdecode_native-{key.hexdigest()[:20]}.so"


def _open(path: pathlib.Path):
    """The loaded library at ``path`` with its ABI checked, or None (missing, not loadable, another ABI)."""
    try:
        lib = ctypes.CDLL(str(path))
        abi = lib.hd_native_abi
    except (OSError, AttributeError):
        return None
    abi.restype, abi.argtypes = ctypes.c_int64, []
    return lib if abi() == ABI else None


def _compile(cc: list[str], path: pathlib.Path, flags=FLAGS) -> str | None:
    """Compile the sources to ``path`` (through a temporary file moved into place); None on success, else why not."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        try:
            done = subprocess.run(cc + list(flags) + [str(f) for f in SOURCES] + ["-o", tmp], capture_output=True,
                                  timeout=_COMPILE_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as err:
            return f"the compiler did not run ({err})"
        if done.returncode != 0:
            return f"the compiler failed ({done.returncode}): {done.stderr.decode(errors='replace').strip()[-500:]}"
        os.replace(tmp, path)
        tmp = None
        return None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def load(flags=FLAGS):
    """``(library, None)``, or ``(None, reason)`` when the native kernels are unavailable here.  ``flags``: the
    compiler's (tests build the portable C loops with ``FLAGS + ("-DHD_PORTABLE",)``)."""
    if platform.machine().lower() not in MACHINES or struct.calcsize("P") != 8:
        return None, f"not built on this machine ({platform.machine()}, {8 * struct.calcsize('P')}-bit)"
    if not SOURCES:
        return None, f"the C sources are missing ({_HERE})"
    cc = find_compiler()
    if cc is None:
        return None, "no C compiler ($CC, cc or gcc)"
    identity = _identity(cc)
    if identity is None:
        return None, f"the C compiler {shlex.join(cc)} does not run"
    try:
        path = library_path(cc, identity, cache_dir(), tuple(flags))
        lib = _open(path) if path.exists() else None
        if lib is None:  # absent, or a file that does not load: built (again), replacing it
            why = _compile(cc, path, tuple(flags))
            if why is not None:
                return None, why
            lib = _open(path)
    except OSError as err:  # an unwritable cache folder, say
        return None, f"the cache folder is not usable ({err})"
    if lib is None:
        return None, f"the built library does not load ({path})"
    return lib, None
