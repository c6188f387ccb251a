"""Storage's own exception tree (storage imports neither gateway nor evaluators).

The gateway maps these at its boundaries: `EndpointNotFound` -> 404, `DuplicateName` and
`PromotionConflict` -> 409, `InvalidEndpoint` -> 422, `SchemaBehind` -> exit code 2 with the
message as is, `StorageUnavailable` -> 503 (or "keep serving, count"). Every query function
raises only these, chained (`raise ... from ...`) to the driver's error.
"""

from __future__ import annotations


class StorageError(Exception):
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
    """The database schema does not match the code; the message names the command to run."""


class SchemaAhead(SchemaBehind):
    """The database schema is newer than this code (another replica was upgraded first).

    A subclass of `SchemaBehind` on purpose: both mean "refuse to start, tell the operator".
    """
