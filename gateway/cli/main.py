"""The `canary` command: parses arguments and hands off to one module per subcommand.

Each module in `gateway.cli.commands` exposes `register(subparsers)`, which adds its parser(s) and
sets `func` (a callable taking the parsed namespace and returning an exit code). Heavy imports
happen inside those functions, so `canary --help` stays fast. Every command runs inside
`gateway.cli.errors.cli_errors`, the one place errors become a message and an exit code (usage
errors and bad configuration: 2); never a traceback: an unexpected error (a bug) is one line
naming the command and the file its traceback was written to, and exit 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gateway.cli.errors import cli_errors

_COMMANDS = (
    "serve",
    "sim",
    "db",
    "candidates",
    "promote",
    "rollout",
    "report",
    "label",
    "plan",
    "capacity",
    "demo",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="canary",
        description=(
            "canary-gateway: a drop-in reverse proxy for vLLM / OpenAI-compatible endpoints. "
            "It forwards production traffic untouched, mirrors sampled copies to candidate "
            "endpoints, compares the answers pair by pair and reports whether to promote."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    import importlib

    for name in _COMMANDS:
        module = importlib.import_module(f"gateway.cli.commands.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with cli_errors(args.command) as outcome:
        outcome.code = args.func(args)
    return outcome.code


if __name__ == "__main__":
    sys.exit(main())
