"""Reading inputs and writing outputs for the command line.

Inputs: ``.npy``, ``.pt``/``.pth`` and text tables (``.csv``, ``.tsv``, ``.txt``), from a path or
from standard input (``-``, format recognised from the content); where a top-k list is accepted, also a
``.npz`` path or a ``.pt`` holding the arrays ``values`` and ``indices`` (:func:`load_array`).  Outputs
are checked before any work starts (folder exists and is writable, not a folder, not one of the
inputs) and written to a temporary file beside the target that is renamed into place only once complete, so that a full
disk, a file-size limit, Ctrl-C or SIGTERM never leaves a fragment or destroys an existing file; a
fragment left by a killed run (SIGKILL, a power cut) is removed by the next run writing that output.

The checks run before torch is imported (``hdecode`` answers a bad command line at once), so numpy
and torch are imported by the readers that need them, not by this module.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import stat
import sys
import tempfile
import warnings

__all__ = [
    "CLIError", "STDIN", "one_line", "require_stdout", "describe", "read_input_bytes", "read_input_text", "load_array",
    "check_output_path", "check_distinct_inputs", "StagedWrites", "ARRAY_FORMATS", "is_special_file",
]

STDIN = "-"
#: Set by ``main`` when the command was started with standard output closed (``hdecode ... >&-``).
stdout_closed = False
ARRAY_FORMATS = (".npy", ".pt", ".pth", ".csv", ".tsv", ".txt")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class CLIError(Exception):
    """A user-facing error, printed as ``hdecode <command>: error: <message>``.

    ``exit_code`` 2: a bad command line or input; 1: the run could not complete (an output
    could not be written).
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


def one_line(exc: BaseException) -> str:
    """A readable one-line reason: the first non-empty line of the message, ANSI codes removed,
    the exception's type name when the message is empty."""
    text = _ANSI.sub("", str(exc))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    return " ".join(lines[0].split())


def require_stdout(why: str) -> None:
    """Fail before any work when the results would go to a closed standard output."""
    if stdout_closed:
        raise CLIError(f"standard output is closed, and {why}")


def describe(path: str) -> str:
    return "standard input" if path == STDIN else repr(path)


# --------------------------------------------------------------------------- reading
def _check_readable_file(path: str, flag: str) -> None:
    if not os.path.exists(path):
        raise CLIError(f"{flag}: no such file {path!r}")
    if os.path.isdir(path):
        raise CLIError(f"{flag}: {path!r} is a folder, not a file")


def read_input_bytes(path: str, flag: str) -> bytes:
    """The bytes of ``path``, or of standard input for ``-``."""
    if path == STDIN:
        stdin = sys.stdin
        if stdin is None:
            raise CLIError(f"{flag} -: standard input is closed")
        if stdin.isatty():
            raise CLIError(f"{flag} -: standard input is a terminal; pipe or redirect a file into it "
                           f"(... {flag} - < FILE)")
        try:
            return stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode()
        except OSError as exc:
            raise CLIError(f"{flag} -: cannot read standard input: {exc.strerror or one_line(exc)}") from None
    _check_readable_file(path, flag)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise CLIError(f"{flag}: cannot read {path!r}: {exc.strerror or one_line(exc)}") from None


def read_input_text(path: str, flag: str) -> str:
    data = read_input_bytes(path, flag)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CLIError(f"{flag}: {describe(path)} is not UTF-8 text (byte {exc.start})") from None


def _sniff_array_format(data: bytes) -> str:
    """``.npy``, ``.pt`` or ``.txt`` from the first bytes (for standard input, which has no extension)."""
    if data.startswith(b"\x93NUMPY"):
        return ".npy"
    if data.startswith(b"PK\x03\x04") or data.startswith(b"\x80"):  # torch.save zip archive, or a legacy pickle
        return ".pt"
    return ".txt"


def _numpy_safe_globals() -> list:
    """What ``torch.load(weights_only=True)`` must be allowed to rebuild a numpy array: the array
    type, its dtype and numpy's reconstruct function (it only allocates an array of an allowed
    type).  Nothing that can run code."""
    import numpy as np

    allowed = [np.ndarray, np.dtype]
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy.core is deprecated in numpy 2
            try:
                allowed.append(importlib.import_module(module)._reconstruct)
            except (ImportError, AttributeError):
                pass
    dtypes = getattr(np, "dtypes", None)
    if dtypes is not None:
        allowed += [getattr(dtypes, n) for n in dir(dtypes) if n.endswith("DType") and "Object" not in n
                    and isinstance(getattr(dtypes, n), type)]
    return allowed


def _torch_load(src, name: str):
    import torch

    safe = getattr(torch.serialization, "safe_globals", None)
    ctx = safe(_numpy_safe_globals()) if safe is not None else contextlib.nullcontext()
    try:
        with ctx:
            return torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt or unsafe files
        if type(exc).__name__ == "UnpicklingError" and "weights_only" in str(exc).lower().replace(" ", "_"):
            found = ""
            try:
                if hasattr(src, "seek"):
                    src.seek(0)
                names = torch.serialization.get_unsafe_globals_in_checkpoint(src)
                found = f" ({', '.join(names[:4])})" if names else ""
            except Exception:  # noqa: BLE001 - only a detail of the message
                pass
            if "torch._utils._rebuild_nested_tensor" in found:  # torch >= 2.15 refuses to load one
                raise CLIError(f"{name} holds a nested tensor; save one (B, L) tensor") from None
            raise CLIError(f"cannot read {name}: it holds Python objects that are not safe to load{found}; "
                           "save a tensor (torch.save(tensor, path)) or a numpy array (.npy)") from None
        raise CLIError(f"cannot read {name} as a .pt file (truncated or not a torch.save file?): "
                       f"{one_line(exc)}") from None


def _parse_number_table(text: str, name: str, delimiter: str | None, index_header: bool = False):
    """A float64 numpy table from text.  The first row is a header when none of its cells is a number;
    a cell that is not a number elsewhere is an error naming its line and column.

    ``index_header``: a first row that is the column numbers (0..W-1 or 1..W, as pandas' ``to_csv``
    or ``np.savetxt(header=...)`` write them) is a header when the data cannot be such a row (some
    other cell is not an integer); where it could be a row of the data (two columns, where 0,1 is
    also a probability row, or integer data) it is an error, never a silent extra sample.
    """
    import numpy as np

    nul = text.find("\x00")
    if nul >= 0:  # UTF-8 allows NUL, which no text table holds: a binary file, not one line of a header
        raise CLIError(f"{name} is not a text table (character {nul} is a NUL byte); binary arrays go in .npy or "
                       ".pt files")
    lines = [(k + 1, ln) for k, ln in enumerate(text.splitlines()) if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise CLIError(f"{name} has no data")
    if delimiter is None:  # sniffed from the first line
        delimiter = "," if "," in lines[0][1] else ("\t" if "\t" in lines[0][1] else None)
    rows = [[c.strip() for c in (ln.split(delimiter) if delimiter else ln.split())] for _, ln in lines]

    def number(c):
        try:
            float(c)
            return True
        except ValueError:
            return False

    if not any(number(c) for c in rows[0]):  # a header: no cell is a number
        lines, rows = lines[1:], rows[1:]
        if not rows:
            raise CLIError(f"{name} has a header line but no data")
    width = len(rows[0])
    for (k, _), r in zip(lines, rows):
        if len(r) != width:
            raise CLIError(f"{name}, line {k}: {len(r)} columns, but line {lines[0][0]} has {width}")
    try:
        table = np.array(rows, dtype=np.float64)
    except ValueError:
        for (k, _), r in zip(lines, rows):
            for j, c in enumerate(r):
                if not number(c):
                    raise CLIError(f"{name}, line {k}, column {j + 1}: {c!r} is not a number") from None
        raise
    if index_header and width >= 2:
        first = table[0]
        cols = np.arange(width, dtype=np.float64)
        if np.array_equal(first, cols) or np.array_equal(first, cols + 1):
            rest = table[1:]
            data_are_integers = bool(np.all(rest == np.round(rest)))
            what = f"line {lines[0][0]} ({', '.join(rows[0][:3])}{', ...' if width > 3 else ''}) is the column numbers"
            if width == 2 or not rest.size or data_are_integers:
                why = ("with two columns it is also a probability row" if width == 2 else
                       "it is the only line" if not rest.size else "every other line holds integers too")
                raise CLIError(f"{name}: {what}, a header or a sample? It cannot be told ({why}); remove the line, "
                               "or give the columns names that are not numbers (p0, p1, ...)")
            table = rest  # the data hold fractions: a row of column numbers is a header
    return table


def load_array(path: str, flag: str, *, index_header: bool = False, top_k: bool = False):
    """A tensor from ``.npy``, ``.pt``/``.pth`` (a tensor or a numpy array) or a text table
    (``.csv`` comma-, ``.tsv`` tab-, ``.txt`` comma/tab/whitespace-separated); ``-`` reads
    standard input and recognises the format from its first bytes.  ``index_header``: see
    :func:`_parse_number_table` (for tables with one column per class).  ``top_k``: also a top-k list,
    a ``.npz`` path or a ``.pt`` holding a dict with ``values`` and ``indices`` (or a
    ``torch.return_types.topk``), returned as the pair of tensors ``(values, indices)``."""
    import numpy as np

    if path == STDIN:
        data = read_input_bytes(path, flag)
        if not data:
            raise CLIError(f"{flag}: standard input is empty")
        ext, src, name = _sniff_array_format(data), io.BytesIO(data), f"{flag} (standard input)"
    else:
        ext = os.path.splitext(path)[1].lower()
        if ext not in ARRAY_FORMATS and not (top_k and ext == ".npz"):
            formats = ARRAY_FORMATS + ((".npz",) if top_k else ())
            raise CLIError(f"{flag}: unknown format {ext or '(no extension)'!r} of {path!r}; "
                           f"use one of {', '.join(formats)}")
        _check_readable_file(path, flag)
        try:
            size = os.path.getsize(path)
        except OSError as exc:
            raise CLIError(f"{flag}: cannot read {path!r}: {exc.strerror}") from None
        if size == 0:
            raise CLIError(f"{flag}: {path!r} is empty (0 bytes)")
        src, name = path, f"{flag} {path!r}"
    try:
        if ext == ".npy":
            try:
                arr = np.load(src, allow_pickle=False)
            except OSError as exc:
                if exc.strerror:  # the file could not be read at all
                    raise CLIError(f"cannot read {name}: {exc.strerror}") from None
                raise CLIError(f"cannot read {name} as a .npy file (truncated or corrupt?): {one_line(exc)}") \
                    from None
            except Exception as exc:  # noqa: BLE001 - numpy raises many types for corrupt files
                raise CLIError(f"cannot read {name} as a .npy file (truncated or corrupt?): {one_line(exc)}") \
                    from None
        elif ext == ".npz":
            try:
                with np.load(src, allow_pickle=False) as archive:
                    arr = {key: archive[key] for key in archive.files}
            except OSError as exc:
                raise CLIError(f"cannot read {name}: {exc.strerror or one_line(exc)}") from None
            except Exception as exc:  # noqa: BLE001 - numpy raises many types for corrupt files
                raise CLIError(f"cannot read {name} as a .npz file (truncated or corrupt?): {one_line(exc)}") \
                    from None
        elif ext in (".pt", ".pth"):
            arr = _torch_load(src, name)
        else:
            if isinstance(src, io.BytesIO):
                data = src.getvalue()
            else:
                with open(src, "rb") as f:
                    data = f.read()
            try:
                text = data.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise CLIError(f"{name} is not a text table (byte {exc.start} is not UTF-8 text); binary arrays "
                               "go in .npy or .pt files") from None
            delimiter = {".csv": ",", ".tsv": "\t"}.get(ext)
            arr = _parse_number_table(text, name, delimiter, index_header=index_header)
    except OSError as exc:
        raise CLIError(f"cannot read {name}: {exc.strerror or one_line(exc)}") from None
    if top_k:
        import torch

        if isinstance(arr, torch.return_types.topk):
            arr = {"values": arr.values, "indices": arr.indices}
        if isinstance(arr, dict):
            missing = [key for key in ("values", "indices") if key not in arr]
            if missing:
                raise CLIError(f"{name} holds {', '.join(map(repr, sorted(map(str, arr)))) or 'nothing'}, expected a "
                               "top-k list: the arrays 'values' (B, k) and 'indices' (B, k)")
            return _as_tensor(arr["values"], f"{name} ('values')"), _as_tensor(arr["indices"], f"{name} ('indices')")
    return _as_tensor(arr, name)


def _as_tensor(obj, name: str):
    import numpy as np
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.device.type == "meta":
            raise CLIError(f"{name} holds a tensor on the meta device: a shape {tuple(obj.shape)} without values; "
                           "save the tensor with its data (torch.save(tensor.cpu(), path))")
        if getattr(obj, "is_nested", False):
            raise CLIError(f"{name} holds a nested tensor; save one (B, L) tensor")
        if obj.is_sparse or obj.layout != torch.strided:
            return obj.to_dense()
        return obj
    if not isinstance(obj, np.ndarray):
        raise CLIError(f"{name} holds a {type(obj).__name__}, expected a single tensor or array")
    if obj.dtype.kind not in "biuf":
        raise CLIError(f"{name} holds an array of dtype {obj.dtype}, expected numbers")
    if not obj.dtype.isnative:
        obj = obj.astype(obj.dtype.newbyteorder("="))
    if obj.dtype == np.uint16 or obj.dtype == np.uint32 or obj.dtype == np.uint64:
        obj = obj.astype(np.float64 if obj.dtype == np.uint64 else np.int64)
    return torch.from_numpy(np.ascontiguousarray(obj))


def check_distinct_inputs(inputs: dict[str, str | None]) -> None:
    """At most one input may be standard input (``-``)."""
    stdin = [flag for flag, p in inputs.items() if p == STDIN]
    if len(stdin) > 1:
        raise CLIError(f"only one input can be read from standard input, but {' and '.join(stdin)} are both '-'")


# --------------------------------------------------------------------------- writing
def _same_file(a: str, b: str) -> bool:
    """Whether two existing paths are one file (any spelling, symbolic or hard link)."""
    try:
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(path: str, flag: str, inputs: dict[str, str | None] | None = None,
                      outputs: dict[str, str | None] | None = None) -> None:
    """Fail now, before any work, if ``path`` cannot be written: its folder is missing or not
    writable, it is a folder, it is read-only, or it is one of ``inputs`` or ``outputs``
    (``{flag: path}``; the same file by any spelling, symbolic or hard link)."""
    if path == STDIN:
        raise CLIError(f"{flag} -: writing to standard output is not supported here; give a file name")
    if not path or not path.strip():
        raise CLIError(f"{flag}: empty file name")
    for other_flag, other in (inputs or {}).items():
        if other and other != STDIN and _same_file(path, other):
            raise CLIError(f"{flag} {path!r} is the input file {other_flag} {other!r}: writing it would destroy "
                           "the input; choose another output file")
    for other_flag, other in (outputs or {}).items():
        if other and other != STDIN and (_same_file(path, other) or os.path.realpath(path) == os.path.realpath(other)):
            raise CLIError(f"{flag} {path!r} and {other_flag} {other!r} are the same file; choose two names")
    if is_special_file(path):
        if not os.access(path, os.W_OK):
            raise CLIError(f"{flag}: {path!r} is not writable")
        return  # /dev/null, a named pipe, a terminal: written in place
    target = os.path.realpath(path)  # write through a symbolic link, not over it
    if os.path.isdir(target):
        raise CLIError(f"{flag}: {path!r} is a folder; give a file name")
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise CLIError(f"{flag}: {path!r} is read-only")
    folder = os.path.dirname(target) or "."
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise CLIError(f"{flag}: cannot write {path!r}: the folder {os.path.dirname(path) or folder!r} {what}")
    try:  # the only reliable test (permissions, read-only mounts, /proc): create a file there
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".hdecode-probe-")
    except OSError as exc:
        raise CLIError(f"{flag}: cannot write in the folder of {path!r}: {exc.strerror}") from None
    try:
        os.close(fd)
    finally:
        os.unlink(probe)


def is_special_file(path: str) -> bool:
    """Whether ``path`` exists and is not a regular file (``/dev/null``, a named pipe, a terminal,
    ``/dev/stdout``): such an output is written in place, and its name has no format extension."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


class _PlainWrites:
    """A binary file seen through its Python ``write``: numpy's fast path (a C ``fwrite``) would
    report a full disk as "N requested and M written", without the reason (errno)."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        return self._f.write(data)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _fragment_prefix(base: str) -> str:
    """Temporaries are ``.NAME.hdecode-PID-RANDOM.tmp``: hidden, named after their target and their
    writer's process, so that a later run can tell an abandoned one from one being written."""
    return f".{base}.hdecode-"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: another user's live process
        return True
    return True


def sweep_fragments(folder: str, base: str) -> list[str]:
    """Remove the temporaries of output ``base`` in ``folder`` whose writer is gone (killed by
    SIGKILL, or by a power cut, before it could clean up); returns their paths.  Temporaries of a
    process still running (another ``hdecode`` writing the same output) are left alone."""
    pattern = re.compile(re.escape(_fragment_prefix(base)) + r"(\d+)-[^/]*\.tmp\Z")
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match and not _process_alive(int(match.group(1))) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(entry.path)
    return removed


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class StagedWrites:
    """Output files written to temporaries beside their targets and renamed into place by
    :meth:`commit`.  As a context manager: commit on success; on any error, Ctrl-C and SIGTERM
    included (``main`` turns SIGTERM into an exception), remove the temporaries, so that no fragment
    is left and existing files keep their content.  Before writing, abandoned temporaries of the
    same target (their writer was killed outright) are removed.

    A target that exists and is not a regular file (``/dev/null``, a pipe) is written in place.
    """

    def __init__(self):
        self._staged: list[tuple[str, str]] = []  # (temporary, target)

    def __enter__(self) -> "StagedWrites":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()

    def write(self, path: str, flag: str, fill, text: bool = False) -> None:
        """Call ``fill(f)`` with a file object (binary, or UTF-8 text with ``text=True``) for ``path``."""
        try:
            if is_special_file(path):
                dest = path
            else:
                target = os.path.realpath(path)
                folder, base = os.path.dirname(target) or ".", os.path.basename(target)
                sweep_fragments(folder, base)
                fd, dest = tempfile.mkstemp(dir=folder, prefix=f"{_fragment_prefix(base)}{os.getpid()}-",
                                            suffix=".tmp")
                self._staged.append((dest, target))
                os.close(fd)
            with open(dest, "wb") as raw:
                if text:
                    f = io.TextIOWrapper(raw, encoding="utf-8", newline="")
                    fill(f)
                    f.flush()
                    f.detach()
                else:
                    fill(_PlainWrites(raw))
        except OSError as exc:
            raise CLIError(f"{flag}: cannot write {path!r}: {exc.strerror or one_line(exc)}", exit_code=1) from None
        except MemoryError:
            raise CLIError(f"{flag}: out of memory while writing {path!r}", exit_code=1) from None

    def commit(self) -> None:
        mask = None
        try:
            for tmp, target in self._staged:
                if os.path.exists(target):
                    mode = stat.S_IMODE(os.stat(target).st_mode)
                else:
                    mask = _umask() if mask is None else mask
                    mode = 0o666 & ~mask
                os.chmod(tmp, mode)  # mkstemp creates 0600 files
                os.replace(tmp, target)
        except OSError as exc:
            self.discard()
            raise CLIError(f"cannot move the output into place: {exc.strerror or one_line(exc)}", exit_code=1) \
                from None
        self._staged = []

    def discard(self) -> None:
        for tmp, _ in self._staged:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self._staged = []
