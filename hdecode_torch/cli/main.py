"""Entry point of the ``hdecode`` command.

Every failure ends as one line on standard error, ``hdecode <command>: error: <what and how to fix
it>``, with exit status 2 for a bad command line or input, 1 when the run could not complete (an
output could not be written, out of memory), 130 on Ctrl-C and 143 on SIGTERM (outputs being written
are removed); never a traceback (``HDECODE_DEBUG=1`` shows it).  Library warnings are shown the same
way, as ``hdecode <command>: warning: ...``.

The command line is parsed and checked before torch is imported: ``--help``, ``--version``, a bad
option, a misspelt metric, decoder or tree and a missing input file answer at once (:mod:`.names`), and
a run puts its progress line up before the ~2 s import of torch.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import sys
import warnings

from . import io
from .commands import build_parser
from .io import CLIError, one_line
from .progress import Progress

__all__ = ["main", "build_parser", "cli_wording", "Terminated"]

# The library's messages name Python arguments; a command-line user needs the flags.
_CLI_WORDING = [
    (re.compile(r"\bnormalize=True\b"), "--normalize"),
    (re.compile(r"\bfrom_logits=True\b"), "--from-logits"),
    (re.compile(r"\b(?:pass|use) from_logits=False\b"), "leave out --from-logits"),
    (re.compile(r"\bfrom_logits=False\b"), "no --from-logits"),
    (re.compile(r"\bfrom_logits=(['\"])auto\1"), "--from-logits auto"),
    (re.compile(r"\(or apply softmax\)"), "(the softmax is then applied for you)"),
    (re.compile(r"`(leaf_probs|probs|scores|logits)((?:\[[^`]*\])?)`"), r"--probs\2"),
    (re.compile(r"`targets?`"), "--targets"),
    (re.compile(r"`beta`"), "--beta"),
    (re.compile(r"`c`"), "--c"),
    (re.compile(r"`tau`"), "--tau"),
    (re.compile(r"`lam`"), "--lam"),
    (re.compile(r"`threshold`"), "--info-threshold"),
    (re.compile(r"`leaf_order`"), "--leaf-order"),
    (re.compile(r"`noise`"), "--noise"),
    (re.compile(r"`num_samples`"), "--num-samples"),
    (re.compile(r"`device`"), "--device"),
]


def cli_wording(message: str) -> str:
    """Rewrite a library message for the command line: API keywords become flags (``normalize=True``
    -> ``--normalize``), the whole on one line."""
    text = " ".join(str(message).split())
    for pattern, repl in _CLI_WORDING:
        text = pattern.sub(repl, text)
    return text


class Terminated(BaseException):
    """SIGTERM, raised where the program is so that it unwinds like Ctrl-C: the outputs being written
    are removed (:class:`~hdecode_torch.cli.io.StagedWrites`) before the exit.  A BaseException, so
    that no ``except Exception`` swallows it."""


def _raise_terminated(signum, frame):
    raise Terminated


def _install_sigterm():
    """Turn SIGTERM into :class:`Terminated`; returns the previous handler (``None``: not installed,
    outside the main thread)."""
    try:
        return signal.signal(signal.SIGTERM, _raise_terminated)
    except (ValueError, OSError):  # not the main thread: leave the signal alone
        return None


class _StdoutFailure(Exception):
    """Writing to standard output failed (a full disk, ``> /dev/full``): not an input/output file error."""

    def __init__(self, exc: OSError):
        super().__init__(exc.strerror or one_line(exc))


class _GuardedStdout:
    """Standard output whose write errors are told apart from those of the files the command writes."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutFailure(exc) from None

    def flush(self):
        try:
            return self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _StdoutFailure(exc) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _reopen_closed_std_fds() -> dict:
    """Point closed standard descriptors at /dev/null (``hdecode ... >&-``), so that files opened
    later never take their numbers; give ``sys.stdout``/``sys.stderr`` a stream when Python found
    none.  Returns the original streams (``None`` where closed), for :func:`_restore`."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            new = os.open(os.devnull, os.O_RDWR)
            if new != fd:
                os.dup2(new, fd)
                os.close(new)
    state = {"stdout": sys.stdout, "stderr": sys.stderr}
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")
    sys.stdout = _GuardedStdout(sys.stdout)
    return state


def _restore(state: dict) -> None:
    for name, stream in state.items():
        current = getattr(sys, name)
        if isinstance(current, _GuardedStdout):
            current = current._stream
        if stream is None and current is not None:
            current.close()
        setattr(sys, name, stream)


def _silence_stdout() -> None:
    """After a failed write to standard output: send what is left to /dev/null, so that the
    interpreter's final flush does not fail again with a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    state = _reopen_closed_std_fds()
    io.stdout_closed = state["stdout"] is None
    previous = _install_sigterm()
    try:
        return _main(argv)
    except KeyboardInterrupt:  # before the command was known (while parsing): still one line
        print("hdecode: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("hdecode: terminated", file=sys.stderr)
        return 143
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        io.stdout_closed = False
        _restore(state)


def _runner(spec: str):
    """``"module:function"`` of this package, imported now (torch with it)."""
    module, function = spec.split(":")
    return getattr(importlib.import_module(f".{module}", __package__), function)


def _main(argv) -> int:
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    sub = getattr(args, "_parser", parser)
    if extras and not getattr(args, "imports", None):  # with --import: maybe the options of the module's own
        sub.error(f"unrecognized arguments: {' '.join(extras)}")
    prog = sub.prog
    debug = bool(os.environ.get("HDECODE_DEBUG"))
    progress = None

    def error(message: str, code: int) -> int:
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code

    def show_warning(message, category, filename, lineno, file=None, line=None):
        text = f"{prog}: warning: {cli_wording(one_line(message) if isinstance(message, Warning) else message)}"
        if progress is not None:
            progress.write(text)
        else:
            print(text, file=sys.stderr)

    with warnings.catch_warnings():
        if not sys.warnoptions:
            # Python's default filters (deprecations of other packages stay hidden); setting them again
            # resets the "already shown" registries, so that each run shows each distinct warning once.
            warnings.filterwarnings("default", category=UserWarning)
            warnings.filterwarnings("default", category=FutureWarning)
        warnings.showwarning = show_warning
        try:
            if args._check is not None:
                args._check(args)  # the options alone, before torch is imported
            progress = Progress(f"{prog.removeprefix('hdecode ')}: loading",
                                enabled=not getattr(args, "no_progress", False))
            with progress:
                if extras:
                    from .common import parse_imported_flags

                    parse_imported_flags(args, extras)
                code = int(_runner(args._run)(args, progress) or 0)
            sys.stdout.flush()
            return code
        except KeyboardInterrupt:
            # Outputs are renamed into place only when complete, so nothing half-written is left.
            print(f"{prog}: interrupted", file=sys.stderr)
            return 130
        except Terminated:
            print(f"{prog}: terminated", file=sys.stderr)
            return 143
        except BrokenPipeError:
            # `hdecode decode ... | head`: the reader left; stop quietly.
            _silence_stdout()
            return 1
        except CLIError as exc:
            if debug:
                raise
            return error(cli_wording(str(exc)), exc.exit_code)
        except (ValueError, TypeError) as exc:
            # The library's input errors name the argument and the fix; a traceback adds nothing.
            if debug:
                raise
            return error(cli_wording(one_line(exc)), 2)
        except MemoryError:
            if debug:
                raise
            return error("out of memory; use a smaller --batch-size or fewer samples", 1)
        except _StdoutFailure as exc:
            _silence_stdout()
            return error(f"cannot write to standard output: {exc}", 1)
        except OSError as exc:
            if debug:
                raise
            where = f" {exc.filename!r}" if getattr(exc, "filename", None) else ""
            return error(f"input/output error{where}: {exc.strerror or one_line(exc)}", 1)
        except Exception as exc:  # noqa: BLE001 - the last guard against a traceback
            if debug:
                raise
            text = one_line(exc)
            if "can't allocate memory" in text or "out of memory" in text.lower():
                return error("out of memory; use a smaller --batch-size or fewer samples", 1)
            return error(f"internal error ({type(exc).__name__}: {text}); please report it, with the command. "
                         "HDECODE_DEBUG=1 shows the traceback", 1)
        finally:
            if progress is not None:
                try:
                    progress.close()
                except Exception:  # noqa: BLE001 - its first close (leaving `with progress`) reported it already
                    pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
