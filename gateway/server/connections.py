"""Client connections of a listener: how many, how long they may idle, what a bad request costs.

aiohttp's server keeps an idle keep-alive connection for 3,630 s, has no timeout on reading a
request head, no limit on open connections, and logs every malformed request (header line and
any token in it included) at ERROR. `GatewayRunner` serves an app with:
- a connection limit: at `max_connections`, a new connection first makes room by closing the
  connections that have waited longest with no request in flight (idle keep-alive ones, silent
  or half-sent heads: a batch, oldest first, counted by reason), as Envoy's overload manager
  shrinks idle timeouts near its limit; only when every connection has a request in flight does
  the new one get a 503 (written, then the connection lingers briefly so the client reads it
  rather than a reset) and close;
- a header-read timeout: a request head that has started but not ended within
  `header_read_timeout_s` closes the connection (slowloris);
- aiohttp's keep-alive timeout set to `keepalive_timeout_s`;
- malformed requests answered with an OpenAI-shaped 400, counted by kind, and logged without
  their content at most once per `bad_request_log_interval_s`.
Each refusal is a counter in `ConnectionStats`, exported on `/metrics`. This module hooks
aiohttp's `RequestHandler` and `Server` (3.14): the private attributes it reads are named where
used. Transports are used through their protocol only: uvloop's are not `asyncio.Transport`
subclasses. It must never log request bytes.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

from aiohttp import hdrs, web
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
CONNECTIONS_SHED: Final = Family(
    "canary_connections_shed_total",
    "counter",
    "Idle connections (no request in flight) closed to make room for a new one at the "
    "connection limit, by reason.",
    ("listener", "reason"),
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


# Why an idle connection was closed to make room for a new one: it had not yet sent a whole
# request (silent, or a head still arriving), or it was idle between two requests.
SHED_BEFORE_FIRST = "before_first_request"
SHED_BETWEEN = "between_requests"

# A refused connection stays open this long after its 503 (reading and discarding what the client
# sends) so that the client reads the answer instead of a reset; at most `_LINGER_MAX` at once,
# since each holds a descriptor past the limit (they come out of the descriptor reserve).
_LINGER_S = 1.0
_LINGER_MAX = 32


class ConnectionStats:
    """Counters of one listener's refusals (plain ints: incremented on the loop thread)."""

    __slots__ = (
        "_last_log", "_unlogged", "also", "bad_requests", "header_timeouts", "listener", "refused",
        "shed",
    )  # fmt: skip

    def __init__(self, listener: str) -> None:
        self.listener = listener
        self.also: list[ConnectionStats] = []  # other listeners, exported with this one
        self.refused = 0
        self.header_timeouts = 0
        self.shed = {SHED_BEFORE_FIRST: 0, SHED_BETWEEN: 0}
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
        lines.append(CONNECTIONS_SHED)
        lines += [
            CONNECTIONS_SHED.sample(n, s.listener, why) for s in every for why, n in s.shed.items()
        ]
        lines.append(HEADER_READ_TIMEOUTS)
        lines += [HEADER_READ_TIMEOUTS.sample(s.header_timeouts, s.listener) for s in every]
        lines.append(BAD_REQUESTS)
        for s in every:
            for kind, n in sorted(s.bad_requests.items()):
                lines.append(BAD_REQUESTS.sample(n, s.listener, kind))
        return lines


class _Refuse(asyncio.Protocol):
    """Answers 503 and closes: what a connection past the limit gets (no parser, no task).

    After the answer it half-closes and discards what the client sends until the client closes
    or `_LINGER_S` passes: closing a socket with unread bytes sends a reset, which can destroy
    the answer before the client reads it (nginx's `lingering_close`, for the same reason)."""

    __slots__ = ("_guard", "_timer")

    def __init__(self, guard: GuardedServer) -> None:
        self._guard = guard
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports are not asyncio's classes.
        t = cast(asyncio.Transport, transport)
        t.write(_FULL)
        guard = self._guard
        if guard.lingering >= _LINGER_MAX or not t.can_write_eof():
            t.close()
            return
        t.write_eof()
        guard.lingering += 1
        self._timer = guard._loop.call_later(_LINGER_S, t.abort)

    def data_received(self, data: bytes) -> None:
        pass  # the request is refused whatever it says

    def eof_received(self) -> bool:
        return False  # the client is done: close

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._guard.lingering -= 1


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


def _idle_since(handler: RequestHandler) -> float:
    # aiohttp's keep-alive deadline, set at connect and after each answer: oldest idle first.
    return handler._next_keepalive_close_time


class GuardedServer(Server):
    """aiohttp's `Server` with a connection limit, idle connections shed at the limit, and the
    guarded protocol."""

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
        # Connections whose transport is open (aiohttp's `_connections` keeps a closed one until
        # its task ends): a shed connection stops counting when it is closed.
        self.open = 0
        self.lingering = 0  # refused connections still reading their client's bytes
        self._shed: set[RequestHandler] = set()
        # A batch per shedding so that a flood of new connections scans the table once per
        # batch, not once per connection.
        self.shed_batch = max(1, max_connections // 64)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self.open += 1

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        if handler in self._shed:
            self._shed.discard(handler)
        else:
            self.open -= 1

    def __call__(self) -> Any:
        if self.open >= self.max_connections and not self._shed_idle():
            self.stats.refused += 1
            return _Refuse(self)
        return _Handler(self, loop=self._loop, **self._kwargs)

    def _shed_idle(self) -> bool:
        """Close the `shed_batch` connections idle the longest; False when none is idle."""
        # `_waiter` is aiohttp's future of a handler waiting for its next request head (None
        # while a request is in flight); `_force_close` marks one already closing.
        idle = [
            h
            for h in self._connections
            if h._waiter is not None and not h._waiter.done() and not h._force_close
        ]
        if not idle:
            return False
        for handler in heapq.nsmallest(self.shed_batch, idle, key=_idle_since):
            # `_request_count` counts the requests this connection has sent so far.
            reason = SHED_BETWEEN if handler._request_count else SHED_BEFORE_FIRST
            self.stats.shed[reason] += 1
            self._shed.add(handler)
            self.open -= 1
            handler.force_close()
        return True


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
        direct: Handler | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, **kwargs)
        self._direct = direct
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
            direct_dispatch(app, self._direct),
            request_factory=app._make_request,
            loop=loop,
            **self._guard_args,  # type: ignore[arg-type]
            **kwargs,
        )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def direct_dispatch(app: web.Application, direct: Handler | None) -> Handler:
    """The server's handler: `direct` (the app's catch-all) without the router for every
    request the router would give it anyway, `app._handle` (router, `Expect`, middlewares) for
    the rest. Decided on the frozen app; with middlewares, response-prepare signals or a route
    that is neither a plain path nor a sub-app prefix, every request takes the router."""
    if direct is None or app.middlewares or len(app.on_response_prepare):
        return app._handle
    exact: set[str] = set()
    prefixes: list[str] = []
    for resource in app.router.resources():
        info = resource.get_info()
        if "path" in info:
            exact.add(info["path"])
        elif "prefix" in info:
            prefixes.append(info["prefix"])
        elif info.get("formatter") == "/{tail}":
            continue  # the catch-all itself
        else:
            return app._handle
    routed = app._handle
    own = frozenset(exact)
    starts = tuple(prefixes)
    expect = hdrs.EXPECT

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in own or path.startswith(starts) or expect in request.headers:
            return await routed(request)
        return await direct(request)

    return handle
