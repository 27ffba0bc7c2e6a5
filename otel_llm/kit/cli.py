"""The ``otel-llm`` console script. Each subcommand lives in ``otel_llm.kit.commands.<name>``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from otel_llm._version import __version__

# Subcommand modules, in help order; a new subcommand is one module with register() plus a name here.
COMMANDS = ("demo", "serve", "view")


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that a usage error is one line (``otel-llm serve: error: ...``), as every
    other usage error of otel-llm is, with where the full usage is; exit status 2 as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists every option)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="otel-llm", description="OpenTelemetry traces and metrics for every request an LLM engine serves"
    )
    parser.add_argument("--version", action="version", version=f"otel-llm {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"otel_llm.kit.commands.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        # Ctrl-C is how a user stops a run: one line, the shell's status for it, no traceback.
        print(f"otel-llm {args.command}: interrupted", file=sys.stderr, flush=True)
        return 130
    except BrokenPipeError:
        # Whoever read our output left (`otel-llm view --list | head`): nothing of ours went wrong, so no
        # message. The output still buffered would fail again at exit; it goes to /dev/null instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
