"""How an exchange ended: the error kinds and finish reasons every plane speaks of.

`ErrorKind` is the one set of failure labels. Every emitter uses a member, never a string
literal: the proxy's upstream client and its disconnect path (metrics and observations), the
mirror lanes and `gateway.mirror.replay.observe.classify`, the capacity replay, the synthetic pair
generator. Storage keeps the label (a `StrEnum` member is its own string); the evaluators code it
as `ERROR_KINDS.index(label)`. tests/test_error_kinds.py scans the packages and fails on a literal
kind, or on a member the evaluators' classification does not handle. Pure: no IO.
"""

from __future__ import annotations

from enum import StrEnum, unique
from typing import Final


@unique
class ErrorKind(StrEnum):
    """Why an exchange failed (OK only as code 0 in the evaluators' arrays)."""

    OK = "ok"
    TIMEOUT = "timeout"  # a deadline passed (connect, first byte, idle gap or total)
    CONNECT = "connect"  # the endpoint refused or could not be reached
    RESET = "reset"  # the connection broke after it was made
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    GARBAGE = "garbage"  # a 200 whose body is not the OpenAI shape it claims
    TRUNCATED = "truncated"  # a stream that ended without its final event
    CANCELLED = "cancelled"  # the gateway shut down mid-request: not the endpoint failing
    OTHER = "other"
    HTTP_OTHER = "http_other"  # a status below 200 (informational, or none at all)
    CLIENT_DISCONNECT = "client_disconnect"  # production only: the client went away first
    NO_TOKENS = "no_tokens"  # capacity replay: a 200 that carried no output token


# Failure classes in the order the evaluators code them (0 = answered OK). Appended members go
# last so the earlier codes never move.
ERROR_KINDS: Final = tuple(ErrorKind)
# Kinds that say nothing about the endpoint (the gateway or the client ended the exchange):
# the evaluators leave such a pair out of the failure comparison.
NOT_THE_ENDPOINT: Final = frozenset({ErrorKind.CANCELLED, ErrorKind.CLIENT_DISCONNECT})
# Finish reasons in the order the evaluators code them (0 = none reported).
FINISH_REASONS: Final = ("none", "stop", "length", "tool_calls", "content_filter", "other")
