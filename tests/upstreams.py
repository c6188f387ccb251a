"""Small deterministic upstreams for proxy tests: an aiohttp app with scripted routes and a raw
TCP server that writes exact bytes (for hop-by-hop headers and resets aiohttp would not send)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import xxhash
from aiohttp import web

from bench._shared.ports import free_port as free_port  # one home: bench's scripts use it too

SSE_EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"' + word + b'"}}]}\n\n'
    for word in (b"one", b" two", b" three", b" four")
] + [b"data: [DONE]\n\n"]
JSON_BODY = b'{"choices":[{"index":0,"message":{"content":"fixed"},"finish_reason":"stop"}]}'
GZIP_BODY = gzip.compress(b'{"compressed": true}' * 20, mtime=0)


class UpstreamState:
    """What the scripted upstream saw: cancelled handlers and when, requests in progress."""

    def __init__(self) -> None:
        self.cancelled_at: list[float] = []
        self.active = 0
        self.started = asyncio.Event()


STATE = web.AppKey("upstream_state", UpstreamState)


def cancelled(state: UpstreamState) -> Callable[[], Awaitable[list[float]]]:
    """A probe for `tests.waiting.until`: the times the upstream's requests were cancelled."""

    async def probe() -> list[float]:
        return state.cancelled_at

    return probe


async def _echo(request: web.Request) -> web.Response:
    body = await request.read()
    return web.json_response(
        {
            "method": request.method,
            "path_qs": request.raw_path,
            "headers": [[k, v] for k, v in request.headers.items()],
            "body_len": len(body),
            "body_hash": xxhash.xxh3_128_hexdigest(body),
        },
        headers={"X-Upstream": "echo"},
    )


async def _sse(request: web.Request) -> web.StreamResponse:
    await request.read()
    gap = float(request.query.get("gap", "0.02"))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Custom": "a"})
    await resp.prepare(request)
    for event in SSE_EVENTS:
        await resp.write(event)
        await asyncio.sleep(gap)
    await resp.write_eof()
    return resp


async def _json(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=JSON_BODY, content_type="application/json", headers={"X-A": "1"})


async def _gzip(request: web.Request) -> web.Response:
    resp = web.Response(body=GZIP_BODY, content_type="application/json")
    resp.headers["Content-Encoding"] = "gzip"
    return resp


async def _hang(request: web.Request) -> web.StreamResponse:
    """Never answers; records its cancellation (the proxy closed the connection)."""
    state = request.app[STATE]
    state.active += 1
    state.started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        state.cancelled_at.append(time.monotonic())
        raise
    finally:
        state.active -= 1
    raise AssertionError("unreachable")


async def _forever(request: web.Request) -> web.StreamResponse:
    """Streams an event every 10 ms until the connection goes; records the cancellation."""
    state = request.app[STATE]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    state.active += 1
    state.started.set()
    try:
        while True:
            await resp.write(SSE_EVENTS[0])
            await asyncio.sleep(0.01)
    except (asyncio.CancelledError, ConnectionError):
        state.cancelled_at.append(time.monotonic())
        raise
    finally:
        state.active -= 1


async def _stall(request: web.Request) -> web.StreamResponse:
    """Headers and one event, then silence."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(SSE_EVENTS[0])
    await asyncio.sleep(3600)
    return resp


def scripted_app() -> web.Application:
    app = web.Application(client_max_size=256 << 20)
    app[STATE] = UpstreamState()
    app.router.add_route("*", "/echo/{tail:.*}", _echo)
    app.router.add_route("*", "/echo", _echo)
    app.router.add_post("/sse", _sse)
    app.router.add_route("*", "/json", _json)
    app.router.add_get("/gzip", _gzip)
    app.router.add_post("/hang", _hang)
    app.router.add_post("/forever", _forever)
    app.router.add_post("/stall", _stall)
    return app


# --- a raw TCP upstream: each connection gets `respond(head)` written back


RawResponder = Callable[[bytes, asyncio.StreamWriter], Awaitable[None]]


def rst(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@contextlib.asynccontextmanager
async def raw_upstream(respond: RawResponder) -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1:0 that reads a request head and lets `respond` answer."""
    seen: list[bytes] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            seen.append(head)
            await respond(head, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            if not writer.transport.is_closing():
                writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def decode(body: bytes) -> dict[str, object]:
    return dict(msgspec.json.decode(body))
