"""The project's one exception tree.

Every exception canary-gateway raises on purpose is a `CanaryError`; the classes that belong to
one plane are declared in that plane's module but hang from this tree (tests/test_error_kinds.py
imports every module and fails on an exception class outside it). Code raises them (with
`raise ... from ...`); each boundary maps them in one place, nowhere else:

- the proxy (`gateway.server.proxy`): OpenAI-shaped JSON errors (502, 504; 499 counted);
- the admin API (`gateway.control.admin.boundary.map_exception`): a status and
  `{"error": {"message", "type", "code", "field"?, "detail"?}}`;
- the report process (`gateway.control.reports`): the admin API's same function;
- the CLI (`gateway.cli.errors.cli_errors`, around every command): `canary: <message>` on
  stderr and `exit_code`.

Each class declares its mapping as class attributes (`exit_code`, `http_status`, `code`) and
the edges read them; the table says the same and tests/test_exception_tree.py holds the two
equal (exit code, admin status and `code`, then what it means):

    CanaryError                  exit 1  admin 500 internal_error: a bug, logged
    ├── UsageError               exit 2  admin 422 invalid_request: bad operator input
    │   ├── ConfigError          exit 2  admin 422 invalid_request: names source, key, reason
    │   ├── InvalidSettings      exit 2  admin 422 validation_error: a verdict setting (field)
    │   ├── InvalidRollout       exit 2  admin 422 validation_error (gateway.rollout.state): a
    │   │                                rollout's steps, dwell or reason (field)
    │   └── InvalidField         exit 2  admin 422 validation_error
    │                                    (gateway.control.admin.boundary): an admin request's
    │                                    field or query parameter (field)
    ├── NotFound                 exit 2  admin 404 not_found: nothing by that name
    ├── StorageError             exit 1  admin 503 storage_unavailable (the proxy keeps serving)
    │   ├── StorageUnavailable   exit 1  admin 503 storage_unavailable
    │   ├── DuplicateName        exit 1  admin 409 conflict
    │   ├── InvalidEndpoint      exit 1  admin 422 invalid_request (also a ValueError)
    │   ├── EndpointNotFound     exit 2  admin 404 not_found (also a NotFound)
    │   ├── PromotionConflict    exit 1  admin 409 conflict, `detail.reason`
    │   │   ├── PromotionRefused exit 1  admin 409 promotion_refused (gateway.control.promotion):
    │   │   │                            `detail` holds the report's verdict and reasons
    │   │   └── RolloutRefused   exit 1  admin 409 conflict (gateway.rollout.state): a ramp's
    │   │                                start without a promote verdict, `detail.reason`
    │   └── SchemaBehind         exit 2  admin 503 storage_unavailable: names the command to run
    │       └── SchemaAhead      exit 2  admin 503 storage_unavailable
    ├── UpstreamError            exit 1  admin 502 upstream_error (gateway.server.upstream); the
    │   │                                proxy answers by its `kind` (an `ErrorKind`)
    │   ├── UpstreamConnectError exit 1  admin 502 upstream_unreachable
    │   ├── UpstreamResetError   exit 1  admin 502 upstream_reset (or the connection cut)
    │   └── UpstreamTimeoutError exit 1  admin 504 upstream_timeout (or the connection cut)
    ├── ApiError                 exit 1  admin 500 internal_error (gateway.control.admin.boundary):
    │                                    an admin answer, its own status and type per instance
    ├── ReportsUnavailable       exit 1  admin 503 reports_unavailable (gateway.control.reports):
    │                                    the report process is down, its queue full, too slow
    │                                    (or this replica has none: [reports] enabled = false)
    ├── LabelRefused             exit 2  admin 409 conflict (storage.labels): per instance 404
    │                                    (an unknown pair, a deleted candidate), 409 (a second
    │                                    label, store_text off) or 422; the field named
    ├── ReportTooLarge           exit 1  admin 422 report_too_large: more pairs than
    │                                    reports.max_pairs (checked on counts, before columns)
    ├── NotAuthenticated         exit 2  admin 401 authentication_error
    │                                    (gateway.control.admin.boundary): no or a wrong token;
    │                                    answered with a Bearer challenge
    ├── Forbidden                exit 2  admin 403 forbidden (gateway.control.admin.boundary):
    │                                    the token's role may not use this route (field)
    ├── RateLimited              exit 2  admin 429 rate_limited (gateway.control.admin.boundary):
    │                                    too many failed authentications, with Retry-After
    ├── AdminAPIError            exit 1  admin 502 admin_api_error (gateway.cli.client): the
    │                                    admin API refused; per instance exit 2 on a 4xx
    ├── AdminUnreachable         exit 1  admin 502 admin_unreachable (gateway.cli.client)
    ├── GatewayUnreadable        exit 1  admin 500 internal_error (gateway.cli.commands.plan):
    │                                    /metrics unreadable, a CLI error only
    ├── ScoringError             exit 1  admin 500 internal_error (gateway.mirror.scoring.forced):
    │   │                                counted score_failed in the mirror, never a boundary
    │   └── ScoringUnsupported   exit 1  admin 500 internal_error: counted score_unsupported
    ├── ClientGone               exit 1  admin 500 internal_error (gateway.sim.state): the
    │                                    simulator's client left; it ends the simulated answer
    └── ProcessDidNotStart       exit 1  admin 500 internal_error: a child process (the mirror,
                                         report or simulator process) did not say it listens
"""

from __future__ import annotations

from typing import Any, Final

# The CLI's exit codes, named once (`gateway.cli.errors.cli_errors` sets them; the classes below
# declare theirs with them).
EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1  # something failed: storage, a network peer, a bug
EXIT_USAGE: Final = 2  # the operator's input (a flag, a name, a refused request), as argparse
EXIT_INTERRUPTED: Final = 130  # 128 + SIGINT, as shells report it


class CanaryError(Exception):
    """Base of every error canary-gateway raises on purpose.

    The class attributes are its mapping, which the edges read (the table above says the same):
    `exit_code` for the CLI, `http_status` and `code` (the error's `type` in the JSON body) for
    the admin API; `http_message`, when set, is said over HTTP instead of the message (which
    may name a database URL); `http_field` names the offending input; `http_headers()` adds
    headers to the answer."""

    exit_code: int = EXIT_FAILURE
    http_status: int = 500
    code: str = "internal_error"
    http_message: str | None = None
    http_field: str | None = None

    def http_detail(self) -> dict[str, Any] | None:
        """Machine-readable detail for the JSON error body, if the class has any."""
        return None

    def http_headers(self) -> dict[str, str] | None:
        """Headers the HTTP answer carries (a challenge, Retry-After), if the class has any."""
        return None

    def cli_lines(self) -> list[str]:
        """Lines the CLI prints under the message (none unless the class has more to say)."""
        return []


class UsageError(CanaryError):
    """Bad input from the operator: a flag, a config file, an argument. Exit code 2."""

    exit_code = EXIT_USAGE
    http_status = 422
    code = "invalid_request"


class InvalidSettings(UsageError, ValueError):
    """A verdict setting or a candidate's `verdict` override the statistics cannot use. Also a
    ValueError, so validation code can catch it with the other bad-input errors."""

    code = "validation_error"
    http_field = "verdict"


class NotFound(CanaryError):
    """No such thing by that name (an endpoint, a candidate, a report format). Exit code 2:
    the operator named it."""

    exit_code = EXIT_USAGE
    http_status = 404
    code = "not_found"


class ConfigError(UsageError):
    """A configuration file, flag or environment variable is invalid.

    The message always names the source (file or variable), the key and the reason.
    """


class StorageError(CanaryError):
    """Base of every error storage raises on purpose. Over HTTP it says only that storage is
    unavailable: bodies are validated before storage sees them, so what storage still refuses
    is the database's state (down, read-only, full), and its message may name the database."""

    http_status = 503
    code = "storage_unavailable"
    http_message: str | None = "storage is unavailable, retry later"


class StorageUnavailable(StorageError):
    """The database could not be reached or refused the operation (locked, down, restarting)."""


class DuplicateName(StorageError):
    """An endpoint with that name already exists (live, candidate or retired)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"an endpoint named {name!r} already exists")
        self.name = name

    http_status = 409
    code = "conflict"
    http_message = None


class InvalidEndpoint(StorageError, ValueError):
    """An endpoint field the schema cannot hold: unknown, ill-typed, or longer than its column.
    Also a ValueError, so validation code can catch it with the other bad-input errors."""

    http_status = 422
    code = "invalid_request"
    http_message = None


class EndpointNotFound(NotFound, StorageError):
    """No endpoint has that name."""

    http_status = 404
    code = "not_found"
    http_message = None

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

    http_status = 409
    code = "conflict"
    http_message = None

    def http_detail(self) -> dict[str, Any] | None:
        return {"reason": self.reason}


class ReportTooLarge(CanaryError):
    """A report's window holds more pairs than the process computing it may hold in memory
    (`[reports] max_pairs`); the message says how many, the limit, and what to do."""

    http_status = 422
    code = "report_too_large"

    @classmethod
    def of(cls, pairs: int, limit: int) -> ReportTooLarge:
        return cls(
            f"the report's window holds {pairs:,} pairs, more than [reports] max_pairs "
            f"({limit:,}; a report holds about 330 bytes a pair while it is computed): raise "
            "max_pairs where the report process has the memory, or run `canary report` "
            "(with --since / --until for a shorter window) on a machine that has it"
        )


class SchemaBehind(StorageError):
    """The database schema does not match the code; the message names the command to run.
    Exit code 2: the operator fixes it (`canary db upgrade`)."""

    exit_code = EXIT_USAGE
    http_message = None  # names the command to run, never the database URL


class SchemaAhead(SchemaBehind):
    """The database schema is newer than this code (another replica was upgraded first).

    A subclass of `SchemaBehind` on purpose: both mean "refuse to start, tell the operator".
    """


class ProcessDidNotStart(CanaryError):
    """A child process the gateway spawned (the mirror, report or simulator process) died or
    did not say it listens in time; the message names it and its exit code."""
