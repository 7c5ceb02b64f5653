"""Entry point of the ``hdecode`` command."""

from __future__ import annotations

import argparse
import sys

from . import info


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hdecode",
        description="Bayes-optimal decoding of hierarchical classifiers: compare decoders, decode, plot.")
    sub = parser.add_subparsers(dest="command", required=True)
    info.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
