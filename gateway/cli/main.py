"""The `canary` command: parses arguments and hands off to one module per subcommand.

Each module in `gateway.cli.commands` exposes `register(subparsers)`, which adds its parser(s) and
sets `func` (a callable taking the parsed namespace and returning an exit code). Heavy imports
happen inside those functions, so `canary --help` stays fast. Usage errors and bad configuration
exit with code 2 and one readable message; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from domain.errors import CanaryError, UsageError

_COMMANDS = ("serve", "sim", "db", "candidates", "promote", "report", "plan", "capacity", "demo")


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
    try:
        code: int = args.func(args)
    except UsageError as exc:
        print(f"canary {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except CanaryError as exc:
        print(f"canary {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
