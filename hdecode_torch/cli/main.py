"""Entry point of the ``hdecode`` command."""

from __future__ import annotations

import argparse
import os
import sys

from . import compare, decode, info, plot
from .common import CLIError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hdecode",
        description="Bayes-optimal decoding of hierarchical classifiers: compare decoders, decode, plot.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (compare, decode, plot, info):
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `hdecode compare | head`: the reader left; stop quietly instead of a traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except CLIError as exc:
        print(f"hdecode {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        # The library's input errors name the argument and the fix (SPEC §6); a traceback adds
        # nothing for a command-line user.  HDECODE_DEBUG=1 shows it anyway.
        if os.environ.get("HDECODE_DEBUG"):
            raise
        print(f"hdecode {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
