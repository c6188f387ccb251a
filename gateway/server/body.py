"""Reading a request body under three bounds: its own size, all bodies together, and time.

`max_body_bytes` bounds one body (413). `BodyBudget` bounds the bytes held by every body being
read or forwarded at once (`max_body_bytes_in_flight`): a declared `Content-Length` is reserved
before the first byte is read, a chunked body as it arrives, and everything is released when
the request ends; past the budget the request is refused (503) instead of the process growing
until the kernel kills it. `body_read_timeout_s` bounds the silence between two chunks of a body
(408), so a client that stops sending cannot hold its reservation for ever.
This module must never buffer more than one body per request, or log.
"""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import web

from domain.exposition import Family, Sample

TOO_LARGE: Final = "too_large"
BUSY: Final = "busy"
TIMEOUT: Final = "timeout"

BODY_REFUSED: Final = Family(
    "canary_proxy_body_refused_total",
    "counter",
    "Request bodies refused: budget (503, max_body_bytes_in_flight full) or timeout (408, "
    "body_read_timeout_s).",
    ("reason",),
)
BODY_IN_FLIGHT: Final = Family(
    "canary_proxy_body_bytes_in_flight", "gauge", "Request-body bytes held by requests in flight."
)


class BodyBudget:
    """Bytes reserved by the bodies in flight, against a fixed limit. Pure; loop thread only."""

    __slots__ = ("limit", "refused", "reserved", "timeouts")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserved = 0
        self.refused = 0  # requests refused because the budget was full
        self.timeouts = 0  # bodies that stopped arriving

    def take(self, n: int) -> bool:
        if self.reserved + n > self.limit:
            return False
        self.reserved += n
        return True

    def give(self, n: int) -> None:
        self.reserved -= n

    def prometheus_lines(self) -> list[Sample]:
        return [
            BODY_REFUSED.sample(self.refused, "budget"),
            BODY_REFUSED.sample(self.timeouts, TIMEOUT),
            BODY_IN_FLIGHT.sample(self.reserved),
        ]


class BodyRead:
    """One request's body read: `body` or `failure`; `held` bytes to give back at the end."""

    __slots__ = ("body", "failure", "held")

    def __init__(self) -> None:
        self.body = b""
        self.failure: str | None = None
        self.held = 0


async def read_body(
    request: web.Request, max_body: int, budget: BodyBudget, idle_s: float, into: BodyRead
) -> None:
    """Fill `into` with the whole body (one bytes object) or the reason it was refused. The
    caller gives `into.held` back to `budget` when the request ends, whatever happened."""
    length = request.content_length
    if length is not None:
        if length > max_body:
            into.failure = TOO_LARGE
            return
        if not budget.take(length):
            budget.refused += 1
            into.failure = BUSY
            return
        into.held = length
    payload = request.content
    if length == 0 or (length is None and not request.body_exists):
        return
    if payload.is_eof():
        # The whole body came with the head (most requests): taken as it is, no timer armed.
        chunk = payload.read_nowait()
        if _accept(len(chunk), max_body, budget, into):
            into.body = chunk
        return
    parts: list[bytes] = []
    size = 0
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(idle_s) as deadline:
            while chunk := await payload.readany():
                deadline.reschedule(loop.time() + idle_s)
                size += len(chunk)
                if not _accept(size, max_body, budget, into):
                    return
                parts.append(chunk)
    except TimeoutError:
        budget.timeouts += 1
        into.failure = TIMEOUT
        return
    into.body = parts[0] if len(parts) == 1 else b"".join(parts)


def _accept(size: int, max_body: int, budget: BodyBudget, into: BodyRead) -> bool:
    """May the body grow to `size` bytes? Reserves what a chunked body (or one longer than
    declared) adds; else sets `into.failure`."""
    if size > max_body:
        into.failure = TOO_LARGE
        return False
    if size > into.held:  # chunked, or more than declared: reserve as it comes
        if not budget.take(size - into.held):
            budget.refused += 1
            into.failure = BUSY
            return False
        into.held = size
    return True
