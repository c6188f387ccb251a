"""The CLI's one error edge: `cli_errors()` wraps every command and turns what it raises into
`canary: <message>` on stderr and an exit code, never a traceback.

A `CanaryError` exits with its class's `exit_code` (domain/errors.py's table) and prints its
`cli_lines()` under the message (a refused promote's reasons); an `OSError` (a file that cannot
be read or written, a socket that cannot be opened) exits 1 with its message, which names the
path. What is printed is made terminal-safe (a message may quote what a server sent). Commands
never map errors themselves, and return `EXIT_OK` or raise: the exit codes are named once, in
domain.errors.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from domain.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, CanaryError
from gateway.cli.escape import terminal_safe


class Outcome:
    """The exit code of the command run inside `cli_errors` (0 until something sets it)."""

    __slots__ = ("code",)

    def __init__(self) -> None:
        self.code = EXIT_OK


@contextmanager
def cli_errors() -> Iterator[Outcome]:
    """Run the block; set `outcome.code` from what escapes it and say why on stderr."""
    outcome = Outcome()
    try:
        yield outcome
    except CanaryError as exc:
        print(terminal_safe(f"canary: {exc}"), file=sys.stderr)
        for line in exc.cli_lines():
            print(terminal_safe(line), file=sys.stderr)
        outcome.code = exc.exit_code
    except OSError as exc:  # str() names the path (or the address) and the reason
        print(terminal_safe(f"canary: {exc}"), file=sys.stderr)
        outcome.code = EXIT_FAILURE
    except KeyboardInterrupt:
        outcome.code = EXIT_INTERRUPTED
