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


@unique
class ToolCheck(StrEnum):
    """The verdict on one answer's tool calls against what its request declared
    (`gateway.mirror.toolcalls`): VALID, one reason it is invalid, or UNCHECKABLE."""

    VALID = "valid"
    UNDECLARED = "undeclared"  # the function was not declared in tools
    NOT_OBJECT = "arguments_not_object"  # arguments are not JSON, or JSON but not an object
    SCHEMA = "schema"  # arguments violate the tool's parameters schema
    MISSING_CALL = "missing_call"  # tool_choice "required" or a named function, and no such call
    FORBIDDEN_CALL = "forbidden_call"  # tool_choice "none" answered with a call
    PARALLEL = "parallel"  # several calls while parallel_tool_calls is false
    CALL_ID = "call_id"  # a call id missing or duplicated
    # The declared schema (or the arguments) could not be checked safely: too big, too deep, a
    # remote $ref, a pattern a linear regex engine cannot run, an invalid schema. Not judged.
    UNCHECKABLE = "uncheckable"


# Verdicts in the order the evaluators code them. Appended members go last so the earlier codes
# never move.
TOOL_CHECKS: Final = tuple(ToolCheck)
# The verdicts that say the answer broke its request's tool contract.
TOOL_INVALID: Final = frozenset(set(ToolCheck) - {ToolCheck.VALID, ToolCheck.UNCHECKABLE})
