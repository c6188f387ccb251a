"""The project's one exception tree.

Every exception canary-gateway raises on purpose is a `CanaryError`; the classes that belong to
one plane are declared in that plane's module but hang from this tree (tests/test_error_kinds.py
imports every module and fails on an exception class outside it). Code raises them (with
`raise ... from ...`); each boundary maps them in one place, nowhere else:

- the proxy (`gateway.server.proxy`): OpenAI-shaped JSON errors (502, 504; 499 counted);
- the admin API (`gateway.control.admin.boundary.map_exception`): a status and
  `{"error": {"message", "type", "code", "field"?, "detail"?}}`;
- the CLI (`gateway.cli.main`): a message on stderr and `exit_code`.

    CanaryError                     exit 1; admin 500 unless mapped below
    ├── UsageError                  exit 2; admin 422: bad operator input (flag, file, argument)
    │   └── ConfigError             names the source, the key and the reason
    ├── StorageError                admin 503 (the proxy keeps serving)
    │   ├── StorageUnavailable      admin 503
    │   ├── DuplicateName           admin 409
    │   ├── InvalidEndpoint         admin 422 (also a ValueError)
    │   ├── EndpointNotFound        admin 404
    │   ├── PromotionConflict       admin 409 with `detail.reason`
    │   │   └── PromotionRefused    (gateway.control.promotion) 409, the report's reasons
    │   └── SchemaBehind            exit 2, admin 503; the message names the command to run
    │       └── SchemaAhead
    ├── UpstreamError               (gateway.server.upstream) `kind` is its `ErrorKind`;
    │   ├── UpstreamConnectError    proxy 502 upstream_unreachable
    │   ├── UpstreamResetError      proxy 502 upstream_reset, or the connection cut
    │   └── UpstreamTimeoutError    proxy 504 upstream_timeout, or the connection cut
    ├── ApiError                    (gateway.control.admin.boundary) an admin answer: its status
    ├── ReportsUnavailable          (gateway.control.reports) admin 503 reports_unavailable: the
    │                               host's report process is down, its queue full, or too slow
    │                               (or this replica has none: report_process = false)
    ├── ReportTooLarge              admin 422 report_too_large: the window holds more pairs than
    │                               report_max_pairs (checked on counts, before its columns load)
    ├── AdminAPIError               (gateway.cli.client) the admin API refused: exit 2 (4xx) or 1
    ├── AdminUnreachable            (gateway.cli.client) no answer from the admin API: exit 1
    ├── GatewayUnreadable           (gateway.cli.commands.plan) /metrics unreadable: exit 1
    ├── ScoringError                (gateway.mirror.scoring.forced) a scoring answer unreadable:
    counted
    │   │                           score_failed inside the mirror process, never a boundary
    │   └── ScoringUnsupported      the engine refused the parameters: score_unsupported
    └── ClientGone                  (gateway.sim.state) the simulator's client left: not an error
                                    anyone sees, it ends the simulated answer
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


class ReportTooLarge(CanaryError):
    """A report's window holds more pairs than the process computing it may hold in memory
    (`report_max_pairs`); the message says how many, the limit, and what to do."""

    @classmethod
    def of(cls, pairs: int, limit: int) -> ReportTooLarge:
        return cls(
            f"the report's window holds {pairs:,} pairs, more than report_max_pairs "
            f"({limit:,}; a report holds about 330 bytes a pair while it is computed): raise "
            "report_max_pairs where the report process has the memory, or run `canary report` "
            "(with --since / --until for a shorter window) on a machine that has it"
        )


class SchemaBehind(StorageError):
    """The database schema does not match the code; the message names the command to run.
    Exit code 2: the operator fixes it (`canary db upgrade`)."""

    exit_code = 2


class SchemaAhead(SchemaBehind):
    """The database schema is newer than this code (another replica was upgraded first).

    A subclass of `SchemaBehind` on purpose: both mean "refuse to start, tell the operator".
    """
