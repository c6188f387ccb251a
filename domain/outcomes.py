"""How an exchange ended: the error kinds and finish reasons every plane speaks of.

The proxy's upstream client, the mirror lanes and the meter label failures with `ERROR_KINDS`;
storage keeps the label; the evaluators code it as `ERROR_KINDS.index(label)`. Pure: no IO.
"""

from __future__ import annotations

from typing import Final

OK: Final = "ok"
TIMEOUT: Final = "timeout"  # a deadline passed (connect, first byte, idle gap or total)
CONNECT: Final = "connect"  # the endpoint refused or could not be reached
RESET: Final = "reset"  # the connection broke after it was made
HTTP_4XX: Final = "http_4xx"
HTTP_5XX: Final = "http_5xx"
GARBAGE: Final = "garbage"  # a 200 whose body is not the OpenAI shape it claims
TRUNCATED: Final = "truncated"  # a stream that ended without its final event
CANCELLED: Final = "cancelled"  # the gateway shut down mid-request: not the endpoint failing
CLIENT_DISCONNECT: Final = "client_disconnect"  # production only: the client went away first
OTHER: Final = "other"

# Failure classes in the order the evaluators code them (0 = answered OK).
ERROR_KINDS: Final = (
    OK,
    TIMEOUT,
    CONNECT,
    RESET,
    HTTP_4XX,
    HTTP_5XX,
    GARBAGE,
    TRUNCATED,
    CANCELLED,
    OTHER,
)
# Finish reasons in the order the evaluators code them (0 = none reported).
FINISH_REASONS: Final = ("none", "stop", "length", "tool_calls", "content_filter", "other")
