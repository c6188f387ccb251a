"""The project's exception tree, in one place.

Domain code raises these (with `raise ... from ...`); they are mapped to an exit code in
`gateway.cli` and to HTTP responses at the proxy and admin boundaries, nowhere else.
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


class SchemaOutOfDateError(UsageError):
    """The database schema is older than the code; `canary db upgrade` fixes it."""


class StorageUnavailableError(CanaryError):
    """The database cannot be reached (the proxy keeps serving; writers retry and count)."""


class NotFoundError(CanaryError):
    """A named candidate or endpoint does not exist (HTTP 404)."""


class ConflictError(CanaryError):
    """The change conflicts with the current state: duplicate name, lost race, refused promote
    (HTTP 409)."""

    def __init__(self, message: str, detail: object | None = None) -> None:
        super().__init__(message)
        self.detail = detail
