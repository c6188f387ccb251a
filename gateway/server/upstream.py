"""Client side of the gateway: pooled sessions to an upstream and the timeouts of one exchange.

`make_client_session` builds a keep-alive `aiohttp.ClientSession` that changes nothing it sends
or receives (no auto headers, no decompression, no cookie jar, no redirects are followed by the
callers). `Watchdog` holds the time-to-first-byte, idle-between-chunks and total deadlines of
one exchange; one `DeadlineSweeper` timer enforces those of every exchange in flight (no timer
per request, none per chunk); `open_response` and `read_chunk`
map every failure to one typed `UpstreamError`. The proxy uses one session for the live endpoint;
the mirror dispatcher builds its own with the same factory.

This module must never log, never retry a request, never read a body into memory whole.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

import aiohttp
import msgspec
from multidict import CIMultiDict
from yarl import URL

from domain.errors import CanaryError
from domain.outcomes import ErrorKind

# Headers aiohttp would add on its own; a proxy must forward only what the client sent.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


CLIENT_WRITE = "client_write"  # the deadline phase of a client that stopped reading


class UpstreamTimeouts(msgspec.Struct, frozen=True, kw_only=True):
    """Deadlines of one upstream exchange, in seconds; 0 disables one."""

    connect_s: float = 10.0
    ttfb_s: float = 600.0  # request sent -> response headers
    idle_s: float = 300.0  # longest gap between two body chunks
    total_s: float = 3600.0  # request sent -> last byte
    # One write to a client that does not read (the proxy's side only; 0 = none): while it is
    # pending the idle deadline is suspended, the stall is the client's.
    client_write_s: float = 0.0


class UpstreamError(CanaryError):
    """The upstream failed; `kind` is the error label used in metrics and observations."""

    kind: ErrorKind = ErrorKind.OTHER  # each subclass names its own
    http_status = 502
    code = "upstream_error"
    #: True when nothing of the response reached us (the proxy can still answer with an error).
    before_response = True


class UpstreamConnectError(UpstreamError):
    """The connection was refused or could not be opened (DNS, TLS, unreachable)."""

    kind = ErrorKind.CONNECT
    code = "upstream_unreachable"


class UpstreamResetError(UpstreamError):
    """The upstream closed or reset the connection before the response was complete."""

    kind = ErrorKind.RESET
    code = "upstream_reset"

    def __init__(self, message: str, *, before_response: bool) -> None:
        super().__init__(message)
        self.before_response = before_response


class UpstreamTimeoutError(UpstreamError):
    """A deadline passed; `phase` is ttfb, idle or total."""

    kind = ErrorKind.TIMEOUT
    http_status = 504
    code = "upstream_timeout"

    def __init__(self, phase: str, *, before_response: bool) -> None:
        super().__init__(f"upstream {phase} timeout")
        self.phase = phase
        self.before_response = before_response


def make_client_session(
    *,
    limit: int,
    keepalive_s: float,
    connect_timeout_s: float,
    limit_per_host: int = 0,
    read_bufsize: int = 2**16,
) -> aiohttp.ClientSession:
    """A pooled keep-alive session that forwards bytes untouched. Call inside a running loop.

    `limit` bounds open connections (0 = unlimited) so a flood cannot exhaust file descriptors;
    requests beyond it wait for a free connection (that wait counts toward time-to-first-byte).
    """
    connector = aiohttp.TCPConnector(
        limit=limit,
        limit_per_host=limit_per_host,
        keepalive_timeout=keepalive_s,
        ttl_dns_cache=60,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=SKIP_AUTO_HEADERS,
        read_bufsize=read_bufsize,
    )


# Bodies above this go out as `SlicedBody`: aiohttp warns about (and would write in one go)
# raw bytes over 1 MiB.
SLICE_ABOVE = 1 << 20
_SLICE = 256 << 10


class SlicedBody(aiohttp.payload.Payload):
    """A large request body written in slices of one `bytes` object: no copy, and the loop gets
    a turn (and flow control a say) between slices."""

    _autoclose = True

    def __init__(self, value: bytes) -> None:
        # Its default Content-Type is never sent: sessions from `make_client_session` skip it.
        super().__init__(value)
        self._size = len(value)

    def decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return bytes(self._value).decode(encoding, errors)

    async def as_bytes(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return bytes(self._value)

    async def write(self, writer: Any) -> None:
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        view = memoryview(self._value)
        end = len(view) if content_length is None else min(content_length, len(view))
        for start in range(0, end, _SLICE):
            await writer.write(view[start : min(start + _SLICE, end)])


def request_body(body: bytes) -> bytes | SlicedBody | None:
    """What to pass as `data=` for a forwarded body: None when empty, slices when large."""
    if not body:
        return None
    return SlicedBody(body) if len(body) > SLICE_ABOVE else body


class DeadlineSweeper:
    """One timer for the TTFB, idle and total deadlines of every exchange in flight.

    A per-exchange timer costs two timer handles per request (armed, then re-armed when the
    headers arrive) plus their cancellation; here an exchange costs a set insertion and removal.
    While any `Watchdog` is registered, one timer ticks every `resolution_s` and cancels the task
    of each exchange past a deadline: a deadline fires at most one tick late. The tick stops by
    itself when nothing is registered.
    """

    __slots__ = ("_handle", "_loop", "_watched", "resolution_s", "timeouts")

    def __init__(self, timeouts: UpstreamTimeouts) -> None:
        self.timeouts = timeouts
        # A tenth of the shortest deadline, at most 100 ms: precise enough for deadlines counted
        # in seconds, ten wake-ups a second while requests are in flight.
        enabled = [t for t in (timeouts.ttfb_s, timeouts.idle_s, timeouts.total_s) if t > 0]
        self.resolution_s = min([0.1, *(t / 10 for t in enabled)])
        self._watched: set[Watchdog] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, t0: float) -> Watchdog:
        """A watchdog for the current task's exchange, started at `t0` (perf_counter)."""
        wd = Watchdog(self, t0)
        self._watched.add(wd)
        if self._handle is None:
            loop = self._loop = asyncio.get_running_loop()
            self._handle = loop.call_later(self.resolution_s, self._tick)
        return wd

    def _tick(self) -> None:
        now = perf_counter()
        for wd in [wd for wd in self._watched if wd.overdue(now)]:
            wd.expire()
        if self._watched and self._loop is not None:
            self._handle = self._loop.call_later(self.resolution_s, self._tick)
        else:
            self._handle = None

    def close(self) -> None:
        """Stop the tick (at shutdown); watchdogs still registered never expire."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._watched.clear()


class Watchdog:
    """The TTFB, idle and total deadlines of one exchange, checked by its `DeadlineSweeper`.

    Hot-path cost is an attribute store per chunk (`last`). Past a deadline the sweeper cancels
    the owning task; `expired` then names the phase, and `check_cancel` turns that cancellation
    into a typed error.
    """

    __slots__ = ("_sweeper", "_t0", "_task", "body", "expired", "last", "writing")

    def __init__(self, sweeper: DeadlineSweeper, t0: float) -> None:
        task = asyncio.current_task()
        assert task is not None, "Watchdog must be created inside a task"
        self._task = task
        self._sweeper = sweeper
        self._t0 = t0
        self.last = t0
        self.body = False  # False while waiting for headers, True once the body is flowing
        self.writing = 0.0  # when a pending write to the client started (0: none pending)
        self.expired: str | None = None

    def _next_deadline(self) -> tuple[float, str]:
        t = self._sweeper.timeouts
        best, phase = float("inf"), ""
        if t.total_s:
            best, phase = self._t0 + t.total_s, "total"
        if self.writing:
            if t.client_write_s and self.writing + t.client_write_s < best:
                best, phase = self.writing + t.client_write_s, CLIENT_WRITE
        elif self.body:
            if t.idle_s and self.last + t.idle_s < best:
                best, phase = self.last + t.idle_s, "idle"
        elif t.ttfb_s and self._t0 + t.ttfb_s < best:
            best, phase = self._t0 + t.ttfb_s, "ttfb"
        return best, phase

    def overdue(self, now: float) -> bool:
        return self.expired is None and now >= self._next_deadline()[0]

    def expire(self) -> None:
        """Cancel the owning task for the earliest deadline passed (called by the sweeper)."""
        self.expired = phase = self._next_deadline()[1]
        self._task.cancel(f"upstream {phase} timeout")

    def headers_received(self, now: float) -> None:
        """Switch from the TTFB deadline to the idle deadline."""
        self.body = True
        self.last = now

    def touch(self, now: float) -> None:
        self.last = now

    def close(self) -> None:
        self._sweeper._watched.discard(self)

    def check_cancel(self) -> None:
        """Inside `except CancelledError`: raise the timeout if this watchdog caused it.

        Returns (so the caller re-raises the cancellation) when someone else cancelled the task,
        e.g. the client went away.
        """
        if self.expired is not None and self._task.uncancel() == 0:
            raise UpstreamTimeoutError(self.expired, before_response=not self.body)


def map_client_error(exc: BaseException, *, before_response: bool) -> UpstreamError:
    """Map an aiohttp/OS error to the typed error of the upstream exchange."""
    if isinstance(exc, UpstreamError):
        return exc
    # A connect timeout is "could not be reached" (502), like a refusal, not a slow answer (504).
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamConnectError(f"upstream connect timeout: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamConnectError(str(exc))
    return UpstreamResetError(
        f"upstream connection lost: {type(exc).__name__}: {exc}", before_response=before_response
    )


_CLIENT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


async def open_response(
    session: aiohttp.ClientSession,
    method: str,
    url: URL,
    *,
    headers: CIMultiDict[str],
    data: bytes | SlicedBody | None,
    watchdog: Watchdog,
    **kwargs: Any,
) -> aiohttp.ClientResponse:
    """Send the request and wait for the response headers, under the watchdog's deadlines."""
    try:
        resp = await session.request(
            method, url, headers=headers, data=data, allow_redirects=False, **kwargs
        )
    except asyncio.CancelledError:
        watchdog.check_cancel()
        raise
    except _CLIENT_ERRORS as exc:
        raise map_client_error(exc, before_response=True) from exc
    watchdog.headers_received(perf_counter())
    return resp


async def read_chunk(resp: aiohttp.ClientResponse, watchdog: Watchdog) -> bytes:
    """The next body chunk as it arrived (b"" at the end), under the watchdog's deadlines."""
    try:
        return await resp.content.readany()
    except asyncio.CancelledError:
        watchdog.check_cancel()
        raise
    except _CLIENT_ERRORS as exc:
        raise map_client_error(exc, before_response=False) from exc
