"""The `modelswap` command: a dispatcher over subcommands registered as entry points.

Each part of the system registers its subcommands in pyproject.toml under
`[project.entry-points."modelswap.commands"]`; an entry point names a function that takes
an `argparse` subparsers object and adds its parser, whose `handler` default is called with
the parsed arguments and returns the exit code. The dispatcher therefore imports nothing
of the operator or the node, and a subcommand exists only once its part is built.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

COMMAND_GROUP = "modelswap.commands"

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="modelswap",
        description="Serve many models on few GPUs: operator, node agent and tools.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for entry in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        register = entry.load()
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":  # pragma: no cover - `python -m modelswap_api.cli`
    sys.exit(main())
