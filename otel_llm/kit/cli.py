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


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, except that bare ``otel-llm`` prints the commands (help, exit status 2: no
    command ran, as for any missing argument), and an option a command does not know is that command's
    error, pointing to ``otel-llm COMMAND --help`` (argparse would report it against ``otel-llm``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser.print_help()
        raise SystemExit(2)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(build_parser(), argv)
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
