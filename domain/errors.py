"""The project's one exception tree.

Code raises these (with `raise ... from ...`); they are mapped to an exit code in
`gateway.cli.main`, to OpenAI-shaped errors at the proxy boundary and to admin API statuses in
`gateway.control.admin.boundary`, nowhere else:

- `CanaryError` (exit 1) - `UsageError` (exit 2) - `ConfigError`: bad operator input
- `StorageError` - `StorageUnavailable` (503; the proxy keeps serving), `DuplicateName` (409),
  `InvalidEndpoint` (422), `EndpointNotFound` (404), `PromotionConflict` (409),
  `SchemaBehind` / `SchemaAhead` (exit 2, the message names the command to run)
"""

from __future__ import annotations


class CanaryError(Exception):
    """Base of every error canary-gateway raises on purpose."""

    exit_code = 1


class UsageError(CanaryError):
    """Bad input from the operator: a flag, a config file, an argument. Exit code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """A configuration file, flag or environment variable is invalid.

    The message always names the source (file or variable), the key and the reason.
    """


class StorageError(CanaryError):
    """Base of every error storage raises on purpose."""


class StorageUnavailable(StorageError):
    """The database could not be reached or refused the operation (locked, down, restarting)."""


class DuplicateName(StorageError):
    """An endpoint with that name already exists (live, candidate or retired)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"an endpoint named {name!r} already exists")
        self.name = name


class InvalidEndpoint(StorageError, ValueError):
    """An endpoint field the schema cannot hold: unknown, ill-typed, or longer than its column.
    Also a ValueError, so validation code can catch it with the other bad-input errors."""


class EndpointNotFound(StorageError):
    """No endpoint has that name."""

    def __init__(self, name: str, message: str | None = None) -> None:
        super().__init__(message or f"no endpoint named {name!r}")
        self.name = name


class PromotionConflict(StorageError):
    """The control-plane change conflicts with the current state: a lost promotion race, a
    promote of something that is not a candidate, deleting the live endpoint, nothing to roll
    back to. `reason` is a short machine-readable code, the message is for people."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class SchemaBehind(StorageError):
    """The database schema does not match the code; the message names the command to run.
    Exit code 2: the operator fixes it (`canary db upgrade`)."""

    exit_code = 2


class SchemaAhead(SchemaBehind):
    """The database schema is newer than this code (another replica was upgraded first).

    A subclass of `SchemaBehind` on purpose: both mean "refuse to start, tell the operator".
    """
