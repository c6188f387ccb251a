"""The CLI's one error edge: `cli_errors()` wraps every command and turns what it raises into
`canary: <message>` on stderr and an exit code, never a traceback.

A `CanaryError` exits with its class's `exit_code` (domain/errors.py's table) and prints its
`cli_lines()` under the message (a refused promote's reasons); an `OSError` (a file that cannot
be read or written, a socket that cannot be opened) exits 1 with its message, which names the
path. Anything else is a bug (a `ValueError` from an evaluator): it exits 1 with one line naming
the command, the exception and the file its full traceback was written to (a new
`canary-error-*.log` in the temporary directory, readable by its owner only), for the bug
report. What is printed is made terminal-safe (a message may quote what a server sent).
Commands never map errors themselves, and return `EXIT_OK` or raise: the exit codes are named
once, in domain.errors. Never prints a traceback, and never writes the command line (a --db
URL may hold a password) to the traceback's file.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

from domain.errors import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_OK, CanaryError
from gateway.cli.escape import one_line, terminal_safe

# The exception's message in the one line is cut here: the file has all of it.
MESSAGE_CHARS = 200


class Outcome:
    """The exit code of the command run inside `cli_errors` (0 until something sets it)."""

    __slots__ = ("code",)

    def __init__(self) -> None:
        self.code = EXIT_OK


def save_traceback(exc: BaseException, command: str | None) -> str:
    """Write `exc`'s traceback to a new file in the temporary directory; the words saying
    where it is, or why it could not be written."""
    head = (
        f"canary {command or '(no command)'}: unexpected error at "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
        f"python {platform.python_version()} on {platform.platform()}\n\n"
    )
    try:
        fd, path = tempfile.mkstemp(prefix="canary-error-", suffix=".log")  # mode 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(head + "".join(traceback.format_exception(exc)))
    except OSError as err:
        return f"its traceback could not be saved: {err}"
    return f"full traceback in {path}"


def _unexpected(exc: Exception, command: str | None) -> str:
    """The one line said for a bug: what failed, and where its traceback is."""
    what = f"canary {command}" if command else "canary"
    message = one_line(str(exc))
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    said = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    where = one_line(save_traceback(exc, command))
    return f"{what}: unexpected error (a bug, please report it): {said}; {where}"


@contextmanager
def cli_errors(command: str | None = None) -> Iterator[Outcome]:
    """Run the block (the subcommand `command`); set `outcome.code` from what escapes it and
    say why on stderr."""
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
    except Exception as exc:  # a bug: one line here, the traceback in a file
        print(_unexpected(exc, command), file=sys.stderr)
        outcome.code = EXIT_FAILURE
