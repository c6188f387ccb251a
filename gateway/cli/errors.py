"""The CLI's one error edge: `cli_errors()` wraps every command and turns what it raises into
`canary: <message>` on stderr and an exit code, never a traceback.

A `CanaryError` exits with its class's `exit_code` (domain/errors.py's table); an `OSError`
(a file that cannot be read or written, a socket that cannot be opened) exits 1 with its
message, which names the path. Commands never map errors themselves.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from domain.errors import CanaryError

OS_ERROR_EXIT = 1
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report it


class Outcome:
    """The exit code of the command run inside `cli_errors` (0 until something sets it)."""

    __slots__ = ("code",)

    def __init__(self) -> None:
        self.code = 0


@contextmanager
def cli_errors() -> Iterator[Outcome]:
    """Run the block; set `outcome.code` from what escapes it and say why on stderr."""
    outcome = Outcome()
    try:
        yield outcome
    except CanaryError as exc:
        print(f"canary: {exc}", file=sys.stderr)
        outcome.code = exc.exit_code
    except OSError as exc:  # str() names the path (or the address) and the reason
        print(f"canary: {exc}", file=sys.stderr)
        outcome.code = OS_ERROR_EXIT
    except KeyboardInterrupt:
        outcome.code = INTERRUPTED_EXIT
