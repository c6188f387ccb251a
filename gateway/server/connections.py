"""Client connections of a listener: how many, how long they may idle, what a bad request costs.

aiohttp's server keeps an idle keep-alive connection for 3,630 s, has no timeout on reading a
request head, no limit on open connections, and logs every malformed request (header line and
any token in it included) at ERROR. `GatewayRunner` serves an app with:
- a connection limit: past `max_connections`, a new connection gets a 503 and is closed;
- a header-read timeout: a request head that has started but not ended within
  `header_read_timeout_s` closes the connection (slowloris);
- aiohttp's keep-alive timeout set to `keepalive_timeout_s`;
- malformed requests answered with an OpenAI-shaped 400, counted by kind, and logged without
  their content at most once per `bad_request_log_interval_s`.
Each refusal is a counter in `ConnectionStats`, exported on `/metrics`. This module hooks
aiohttp's `RequestHandler` and `Server` (3.14): the private attributes it reads are named where
used. It must never log request bytes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

from aiohttp import web
from aiohttp.web_log import AccessLogger
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_server import Server

from domain.exposition import Exposed, Family
from gateway.server.proxy import error_body

log = logging.getLogger("canary.gateway")

CONNECTIONS_REFUSED: Final = Family(
    "canary_connections_refused_total",
    "counter",
    "Connections closed at accept: the listener was at its connection limit.",
    ("listener",),
)
HEADER_READ_TIMEOUTS: Final = Family(
    "canary_header_read_timeouts_total",
    "counter",
    "Connections closed because a request head did not complete within header_read_timeout_s.",
    ("listener",),
)
BAD_REQUESTS: Final = Family(
    "canary_bad_requests_total",
    "counter",
    "Malformed HTTP requests answered 400, by kind.",
    ("listener", "kind"),
)

_FULL_BODY = error_body(
    "the gateway has too many open connections; retry later", "server_error", "too_many_connections"
)
_FULL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s"
) % (len(_FULL_BODY), _FULL_BODY)
_BAD_BODY = error_body(
    "malformed HTTP request", "invalid_request_error", "bad_request"
)  # never echoes the request: it may hold a token


class ConnectionStats:
    """Counters of one listener's refusals (plain ints: incremented on the loop thread)."""

    __slots__ = (
        "_last_log", "_unlogged", "also", "bad_requests", "header_timeouts", "listener", "refused",
    )  # fmt: skip

    def __init__(self, listener: str) -> None:
        self.listener = listener
        self.also: list[ConnectionStats] = []  # other listeners, exported with this one
        self.refused = 0
        self.header_timeouts = 0
        self.bad_requests: dict[str, int] = {}
        self._last_log = -1e18
        self._unlogged = 0

    def bad_request(self, kind: str, interval_s: float, peer: str | None) -> None:
        self.bad_requests[kind] = self.bad_requests.get(kind, 0) + 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._last_log >= interval_s:
            log.warning(
                "malformed requests refused (content not logged)",
                extra={"fields": {"listener": self.listener, "kind": kind, "peer": peer,
                                  "count": self._unlogged, "interval_s": interval_s}},
            )  # fmt: skip
            self._last_log = now
            self._unlogged = 0

    def prometheus_lines(self) -> list[Exposed]:
        """This listener's series and those of `also` (other listeners of the process), one
        block per family: a family's samples must stay together in the text format."""
        every = [self, *self.also]
        lines: list[Exposed] = [CONNECTIONS_REFUSED]
        lines += [CONNECTIONS_REFUSED.sample(s.refused, s.listener) for s in every]
        lines.append(HEADER_READ_TIMEOUTS)
        lines += [HEADER_READ_TIMEOUTS.sample(s.header_timeouts, s.listener) for s in every]
        lines.append(BAD_REQUESTS)
        for s in every:
            for kind, n in sorted(s.bad_requests.items()):
                lines.append(BAD_REQUESTS.sample(n, s.listener, kind))
        return lines


class _Refuse(asyncio.Protocol):
    """Answers 503 and closes: what a connection past the limit gets (no parser, no task)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(_FULL)
        transport.close()


class _Handler(RequestHandler):
    """aiohttp's protocol with a header-read deadline and quiet, counted bad requests."""

    __slots__ = ("_guard", "_head_timer")

    def __init__(self, guard: GuardedServer, **kwargs: Any) -> None:
        super().__init__(guard, **kwargs)
        self._guard = guard
        self._head_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # `_messages` (parsed heads not yet handled) and `_request_in_progress` are aiohttp's:
        # with neither, the bytes buffered are an incomplete request head.
        waiting_for_head = not self._messages and not self._request_in_progress
        if waiting_for_head and not self._force_close:
            if self._head_timer is None:
                self._head_timer = self._loop.call_later(
                    self._guard.header_read_timeout_s, self._head_expired
                )
        elif self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if not self._messages and not self._request_in_progress and not self._force_close:
            self._guard.stats.header_timeouts += 1
            self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        kind = type(exc).__name__ if exc is not None else f"status_{status}"
        self._guard.stats.bad_request(kind, self._guard.log_interval_s, request.remote)
        if status >= 500:
            body = error_body("internal error", "server_error", "internal_error")
        else:
            body = _BAD_BODY
        resp = web.Response(status=status, body=body, content_type="application/json")
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        # aiohttp's own "Unhandled exception" lines: counted like bad requests, rate-limited.
        exc = kw.get("exc_info")
        kind = type(exc).__name__ if isinstance(exc, BaseException) else "unhandled"
        self._guard.stats.bad_request(kind, self._guard.log_interval_s, None)


class GuardedServer(Server):
    """aiohttp's `Server` with a connection limit and the guarded protocol."""

    def __init__(
        self,
        *args: Any,
        max_connections: int,
        header_read_timeout_s: float,
        log_interval_s: float,
        stats: ConnectionStats,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.max_connections = max_connections
        self.header_read_timeout_s = header_read_timeout_s
        self.log_interval_s = log_interval_s
        self.stats = stats

    def __call__(self) -> Any:
        # `_connections` is aiohttp's table of open connections (kept until their task ends).
        if len(self._connections) >= self.max_connections:
            self.stats.refused += 1
            return _Refuse()
        return _Handler(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """An `AppRunner` whose server is a `GuardedServer` (same start-up as aiohttp's)."""

    def __init__(
        self,
        app: web.Application,
        *,
        max_connections: int,
        header_read_timeout_s: float,
        log_interval_s: float,
        stats: ConnectionStats,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._guard_args = {
            "max_connections": max_connections,
            "header_read_timeout_s": header_read_timeout_s,
            "log_interval_s": log_interval_s,
            "stats": stats,
        }

    async def _make_server(self) -> Server:
        # What AppRunner._make_server and Application._make_handler do, with our Server class.
        app = self.app
        loop = asyncio.get_running_loop()
        app._set_loop(loop)
        app.on_startup.freeze()
        await app.startup()
        app.freeze()
        kwargs = dict(self._kwargs)
        kwargs["debug"] = app._debug
        kwargs.setdefault("access_log_class", AccessLogger)
        return GuardedServer(
            app._handle,
            request_factory=app._make_request,
            loop=loop,
            **self._guard_args,  # type: ignore[arg-type]
            **kwargs,
        )
