"""Client side of the gateway: pooled connections to an upstream and the errors of one exchange.

`UpstreamPool` is the proxy's (and, one each, the mirror lanes'): keep-alive connections driven
through aiohttp's client protocol and C parser without a `ClientSession`, `ClientRequest` or
`ClientResponse` per request (that machinery was about half of a proxied request's CPU).
Each exchange runs under a `Watchdog` (`server/deadlines.py`: its time-to-first-byte, idle and
total deadlines, one timer for every exchange in flight); `UpstreamPool.open` and `read_chunk`
map every failure, a deadline's included, to one `UpstreamError`.

Never logs, never retries a request (except, as aiohttp's session does, an idempotent one whose
reused keep-alive connection turned out closed before any answer), never reads a body whole."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from time import perf_counter
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_writer import _serialize_headers
from aiohttp.streams import StreamReader
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from domain.errors import CanaryError
from domain.outcomes import ErrorKind

if TYPE_CHECKING:
    from gateway.server.deadlines import Watchdog


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
        self._size = self.nbytes = len(value)

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


_CLIENT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, HttpProcessingError)


async def read_chunk(resp: aiohttp.ClientResponse | UpstreamResponse, watchdog: Watchdog) -> bytes:
    """The next body chunk as it arrived (b"" at the end), under the watchdog's deadlines."""
    try:
        return await resp.content.readany()
    except asyncio.CancelledError:
        watchdog.check_cancel()
        raise
    except _CLIENT_ERRORS as exc:
        raise map_client_error(exc, before_response=False) from exc


# Methods whose bodiless request carries no `Content-Length` (as aiohttp's client sends them).
_NO_LENGTH_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# A request that failed on a reused keep-alive connection before any answer (the upstream had
# closed it) is sent once more on another when repeating it is harmless (RFC 9110 §9.2.2), as
# aiohttp's session does.
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionResetError)


class Origin:
    """Where an upstream's requests go, computed once per base URL: the connection key
    (scheme, host, port), the base path prefixed to every target, the `Host` header line."""

    __slots__ = ("base", "host", "host_line", "key", "port", "prefix", "ssl")

    def __init__(self, base: URL) -> None:
        host, port = base.raw_host, base.port
        if base.scheme not in ("http", "https") or not host or port is None:
            raise ValueError(f"not an http(s) base URL: {base}")
        self.base, self.host, self.port, self.ssl = base, host, port, base.scheme == "https"
        self.key = (base.scheme, host, port)
        self.prefix = base.raw_path.rstrip("/")
        # What aiohttp's client sends: host[:port] (no default port), UTF-8.
        self.host_line = f"Host: {base.host_port_subcomponent}\r\n".encode()


class UpstreamConnection(ResponseHandler):
    """aiohttp's client protocol, plus the relay (`server/stream/relay.py`) of the streamed
    answer it carries now: None when the answer in flight is not relayed, and always once it is
    back in the pool."""

    __slots__ = ("relay",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.relay: Any = None


class _Conn:
    """One keep-alive connection: aiohttp's client protocol, and what it was last set up for."""

    __slots__ = ("key", "proto", "since", "skip_payload")

    def __init__(self, key: tuple[str, str, int], proto: ResponseHandler) -> None:
        self.key = key
        self.proto = proto
        self.since = 0.0  # when it went idle (loop time)
        self.skip_payload: bool | None = None  # the response parser's mode (None: no parser)


class UpstreamResponse:
    """An upstream's answer: status, reason, headers, the body stream (`content`, aiohttp's
    flow-controlled `StreamReader`), and the connection it holds until `release` (after the
    body's end: back to the pool when reusable) or `close` (dropped, so the upstream stops)."""

    __slots__ = ("_conn", "_pool", "content", "headers", "reason", "status")

    def __init__(
        self,
        pool: UpstreamPool,
        conn: _Conn,
        status: int,
        reason: str,
        headers: CIMultiDictProxy[str],
        content: StreamReader,
    ) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self.content = content

    @property
    def connection(self) -> ResponseHandler | None:
        """The connection's protocol while the response holds it."""
        conn = self._conn
        return None if conn is None else conn.proto

    def release(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._pool._release(conn)

    def close(self) -> None:
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._pool._drop(conn)


class _SliceWriter:
    """What `SlicedBody.write` writes to: the connection's transport, with its flow control."""

    __slots__ = ("proto",)

    def __init__(self, proto: ResponseHandler) -> None:
        self.proto = proto

    async def write(self, data: memoryview) -> None:
        transport = self.proto.transport
        if transport is None or transport.is_closing():
            raise aiohttp.ClientConnectionResetError("upstream connection lost")
        transport.write(data)
        await self.proto._drain_helper()


class UpstreamPool:
    """Keep-alive HTTP/1.1 connections for the proxy's (or a mirror lane's) exchanges, driven
    through aiohttp's client protocol (`ResponseHandler`: its C response parser, its flow-controlled
    body stream) without a `ClientSession` per request: no `ClientRequest`/`ClientResponse`, timer,
    trace, cookie or redirect machinery, no body-writer task. A request goes out in one write (head
    and body; a body over `SLICE_ABOVE` in slices under flow control), with the bytes aiohttp's
    client sends: the request line, `Host`, the given headers in order, `Content-Length`.

    At most `limit` connections are open (0: no limit); past it the oldest idle one is closed,
    or the request waits for one to come back (that wait counts toward time-to-first-byte). Idle
    connections close after `keepalive_s`. Call inside a running loop; loop thread only.
    """

    __slots__ = (
        "_closed", "_idle", "_keepalive_s", "_limit", "_loop", "_open", "_sweep", "_waiters",
        "connect_timeout_s", "read_bufsize",
    )  # fmt: skip

    def __init__(
        self, *, limit: int, keepalive_s: float, connect_timeout_s: float,
        read_bufsize: int = 2**16,
    ) -> None:  # fmt: skip
        self._loop = asyncio.get_running_loop()
        self._limit = limit
        self._keepalive_s = keepalive_s
        self.connect_timeout_s = connect_timeout_s
        self.read_bufsize = read_bufsize
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}  # most recently used last
        self._open = 0  # connections open or being opened
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return self._open

    async def open(
        self,
        method: str,
        origin: Origin,
        target: str,
        *,
        headers: CIMultiDict[str],
        data: bytes | SlicedBody | None,
        watchdog: Watchdog,
    ) -> UpstreamResponse:
        """Send `method target` (a path and query) to `origin` and wait for the response
        headers, under the watchdog's deadlines; every failure is an `UpstreamError`."""
        try:
            resp = await self._exchange(method, origin, target, headers, data)
        except asyncio.CancelledError:
            watchdog.check_cancel()
            raise
        except _CLIENT_ERRORS as exc:
            raise map_client_error(exc, before_response=True) from exc
        watchdog.headers_received(perf_counter())
        return resp

    def _head(
        self, method: str, origin: Origin, target: str, headers: CIMultiDict[str],
        data: bytes | SlicedBody | None,
    ) -> bytes:  # fmt: skip
        # aiohttp's own serializer (C): it refuses control characters in the line and headers.
        raw = _serialize_headers(f"{method} {origin.prefix}{target} HTTP/1.1", headers)
        line_end = raw.index(b"\r\n") + 2
        if data is not None:
            size = len(data) if isinstance(data, bytes) else data.nbytes
            length = b"Content-Length: %d\r\n\r\n" % size
        elif method in _NO_LENGTH_METHODS:
            length = b"\r\n"
        else:
            length = b"Content-Length: 0\r\n\r\n"
        return b"".join((raw[:line_end], origin.host_line, raw[line_end:-2], length))

    async def _exchange(
        self, method: str, origin: Origin, target: str, headers: CIMultiDict[str],
        data: bytes | SlicedBody | None,
    ) -> UpstreamResponse:  # fmt: skip
        head = self._head(method, origin, target, headers, data)
        retry = method in _IDEMPOTENT
        while True:
            conn, reused = await self._acquire(origin)
            try:
                return await self._send(conn, method, head, data)
            except BaseException as exc:
                self._drop(conn)
                if not (retry and reused and isinstance(exc, _STALE)):
                    raise
                retry = False

    async def _send(
        self, conn: _Conn, method: str, head: bytes, data: bytes | SlicedBody | None
    ) -> UpstreamResponse:
        proto = conn.proto
        skip = method == "HEAD"
        if conn.skip_payload is not skip:
            proto.set_response_params(
                skip_payload=skip, read_until_eof=True, auto_decompress=False,
                read_bufsize=self.read_bufsize,
            )  # fmt: skip
            conn.skip_payload = skip
        transport = proto.transport
        if transport is None or transport.is_closing():
            raise aiohttp.ServerDisconnectedError()
        if data is None:
            transport.write(head)
        elif isinstance(data, bytes):
            transport.write(head + data)
        else:
            transport.write(head)
            await data.write(_SliceWriter(proto))
        while True:
            message, payload = await proto.read()
            code = message.code
            if code < 100 or code > 199 or code == 101:
                break
        return UpstreamResponse(self, conn, code, message.reason, message.headers, payload)

    async def _acquire(self, origin: Origin) -> tuple[_Conn, bool]:
        """A connection to `origin`: its most recently used idle one, else a new one (once
        the limit allows); True when reused."""
        key = origin.key
        loop = self._loop
        while True:
            if self._closed:
                raise aiohttp.ClientConnectionError("the upstream pool is closed")
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.proto.is_connected() and loop.time() - conn.since < self._keepalive_s:
                    return conn, True
                self._drop(conn, wake=False)
            if not self._limit or self._open < self._limit or self._evict_oldest():
                break
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken and cancelled at once: pass the turn on
                else:
                    with contextlib.suppress(ValueError):
                        self._waiters.remove(waiter)
                raise
        self._open += 1
        try:
            proto = await self._connect(origin)
        except BaseException:
            self._open -= 1
            self._wake()
            raise
        return _Conn(key, proto), False

    async def _connect(self, origin: Origin) -> ResponseHandler:
        loop = self._loop
        try:
            async with asyncio.timeout(self.connect_timeout_s or None):
                _, proto = await loop.create_connection(
                    lambda: UpstreamConnection(loop), origin.host, origin.port,
                    ssl=True if origin.ssl else None,
                )  # fmt: skip
        except TimeoutError as exc:
            raise UpstreamConnectError(
                f"upstream connect timeout: {origin.host}:{origin.port}"
            ) from exc
        except OSError as exc:
            raise UpstreamConnectError(f"{origin.host}:{origin.port}: {exc}") from exc
        return proto

    def _release(self, conn: _Conn) -> None:
        proto = conn.proto
        if self._closed or proto.should_close or not proto.is_connected():
            self._drop(conn)
            return
        conn.since = self._loop.time()
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = []
        idle.append(conn)
        if self._sweep is None:
            self._sweep = self._loop.call_later(self._keepalive_s, self._sweep_idle)
        if self._waiters:
            self._wake()

    def _drop(self, conn: _Conn, *, wake: bool = True) -> None:
        conn.proto.close()
        self._open -= 1
        if wake and self._waiters:
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _evict_oldest(self) -> bool:
        """Close the connection idle the longest (of any origin): False when none is idle."""
        oldest: list[_Conn] | None = None
        for idle in self._idle.values():
            if idle and (oldest is None or idle[0].since < oldest[0].since):
                oldest = idle
        if oldest is None:
            return False
        self._drop(oldest.pop(0), wake=False)
        return True

    def _sweep_idle(self) -> None:
        self._sweep = None
        deadline = self._loop.time() - self._keepalive_s
        left = False
        for idle in self._idle.values():
            keep = [c for c in idle if c.since > deadline and c.proto.is_connected()]
            for conn in idle:
                if conn not in keep:
                    self._drop(conn)
            idle[:] = keep
            left = left or bool(keep)
        if left and not self._closed:
            self._sweep = self._loop.call_later(self._keepalive_s, self._sweep_idle)

    def close(self) -> None:
        """Close the idle connections; waiting requests fail, released ones close."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in self._idle.values():
            while idle:
                self._drop(idle.pop(), wake=False)
        waiters, self._waiters = self._waiters, deque()
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(aiohttp.ClientConnectionError("the upstream pool is closed"))
