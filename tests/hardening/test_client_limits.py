"""Hostile or careless clients against a real gateway on 127.0.0.1: bodies, connections, heads,
malformed requests, odd targets, `Expect`, and a client that stops reading (issue items 2, 3, 6,
8), over raw sockets so every byte is the test's choice; on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web

from tests import fixtures_net
from tests.upstreams import raw_upstream, scripted_app
from tests.waiting import SETTLE_S, until

pytest_plugins = ("tests.fixtures_net",)
pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy

EOF_WAIT = 20.0  # generous: only bounds a hung test, never asserts a duration


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _exchange(url: str, raw: bytes) -> bytes:
    reader, writer = await _open(url)
    writer.write(raw)
    try:
        return await asyncio.wait_for(reader.read(), EOF_WAIT)
    finally:
        writer.close()


def _status(raw: bytes) -> int:
    return int(raw.split(b" ", 2)[1])


def _json_body(raw: bytes) -> Any:
    return msgspec.json.decode(raw.partition(b"\r\n\r\n")[2])


async def _metrics(http: aiohttp.ClientSession, gw: Any) -> str:
    async with http.get(gw.url + "/metrics") as resp:
        return await resp.text()


@pytest_asyncio.fixture
async def upstream(serve: Callable[..., Awaitable[Any]]) -> AsyncIterator[str]:
    served = await serve(scripted_app())
    yield served.url


async def test_bodies_in_flight_are_bounded(gateway: Any, upstream: str, http: Any) -> None:
    """While one slow upload holds most of `max_body_bytes_in_flight`, another is refused with
    an OpenAI-shaped 503 (counted); once it ends, uploads are accepted again."""
    gw = await gateway(upstream, max_body_bytes_in_flight=1000, body_read_timeout_s=60.0)
    reader, writer = await _open(gw.url)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n" + b"a" * 10)
    await writer.drain()

    async def reserved() -> bool:  # the gateway has reserved the first body
        return "canary_proxy_body_bytes_in_flight 800" in await _metrics(http, gw)

    await until(reserved, what="the first body reserved", within_s=SETTLE_S)
    second = await _exchange(
        gw.url, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n" + b"b" * 300
    )
    assert _status(second) == 503
    assert _json_body(second)["error"]["code"] == "gateway_overloaded"
    writer.write(b"a" * 790)
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), EOF_WAIT)
    assert _status(first) == 200
    writer.close()
    async with http.post(gw.url + "/echo", data=b"c" * 300) as resp:
        assert resp.status == 200
    assert 'canary_proxy_body_refused_total{reason="budget"} 1' in await _metrics(http, gw)


async def test_a_body_that_stops_arriving_times_out(gateway: Any, upstream: str) -> None:
    """A body that stops arriving gets a 408 `request_timeout` and the connection closes,
    instead of being held open for ever."""
    gw = await gateway(upstream, body_read_timeout_s=0.3)
    reader, writer = await _open(gw.url)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), EOF_WAIT)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = await asyncio.wait_for(reader.readexactly(length), EOF_WAIT)
    writer.close()
    assert _status(head) == 408
    assert b"connection: close" in head.lower()
    assert msgspec.json.decode(body)["error"]["code"] == "request_timeout"


async def test_slowloris_head_is_cut(gateway: Any, upstream: str, http: Any) -> None:
    """A request head trickled a line at a time is cut after `header_read_timeout_s`, counted
    in `canary_header_read_timeouts_total`."""
    gw = await gateway(upstream, header_read_timeout_s=0.3, keepalive_timeout_s=3600.0)
    reader, writer = await _open(gw.url)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n")

    async def trickle() -> None:
        for i in range(100):
            await asyncio.sleep(0.1)
            if writer.is_closing():
                return
            writer.write(b"X-%d: y\r\n" % i)

    task = asyncio.create_task(trickle())
    try:
        assert await asyncio.wait_for(reader.read(), EOF_WAIT) == b""
    finally:
        task.cancel()
        writer.close()
    assert 'canary_header_read_timeouts_total{listener="proxy"} 1' in await _metrics(http, gw)


async def test_idle_connections_are_closed(gateway: Any, upstream: str) -> None:
    """A connection that sends nothing, and one idle after a request, are closed after
    `keepalive_timeout_s` (aiohttp's default would keep them for an hour)."""
    gw = await gateway(upstream, keepalive_timeout_s=0.3)
    reader, writer = await _open(gw.url)
    assert await asyncio.wait_for(reader.read(), EOF_WAIT) == b""
    writer.close()
    reader, writer = await _open(gw.url)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), EOF_WAIT)  # the answer, then the close
    assert _status(data) == 200
    writer.close()


async def test_connection_limit_refuses_with_503(
    gateway: Any, upstream: str, http: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Past `max_connections`, with every connection's request in flight, a new connection gets
    a 503 `too_many_connections` (read whole, not a reset) and is closed; counted, nothing
    logged; once a slot frees, requests are served again."""
    gw = await gateway(upstream, max_connections=3, keepalive_timeout_s=3600.0)
    busy = [await _open(gw.url) for _ in range(3)]
    for _, writer in busy:
        writer.write(b"POST /hang HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    await asyncio.sleep(0.2)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            raw = await _exchange(gw.url, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _status(raw) == 503
            assert _json_body(raw)["error"]["code"] == "too_many_connections"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    for _, writer in busy:
        writer.close()

    async def served() -> bytes | None:  # a slot frees once the gateway sees the closes
        raw = await _exchange(
            gw.url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        return raw if _status(raw) == 200 else None

    raw = await until(served, what="a request served again", within_s=SETTLE_S)
    assert raw is not None
    assert b'canary_connections_refused_total{listener="proxy"} ' in raw
    assert b'canary_connections_refused_total{listener="proxy"} 0' not in raw


async def test_idle_connections_make_room_at_the_limit(gateway: Any, upstream: str) -> None:
    """At `max_connections`, a new client is served: the connections idle the longest (silent
    ones, a half-sent head, keep-alive ones between requests) are closed for it, counted by
    reason, while a connection with a request in flight is never touched."""
    gw = await gateway(upstream, max_connections=4, keepalive_timeout_s=3600.0)
    streaming = await _open(gw.url)
    streaming[1].write(b"POST /forever HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    await asyncio.wait_for(streaming[0].readuntil(b"\r\n\r\n"), EOF_WAIT)
    keepalive = await _open(gw.url)
    keepalive[1].write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
    await asyncio.wait_for(keepalive[0].readuntil(b"\r\n\r\n"), EOF_WAIT)
    silent = await _open(gw.url)
    half = await _open(gw.url)
    half[1].write(b"GET /echo HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(0.2)
    # Four open: each newcomer (kept open) closes the oldest idle one, never the stream.
    newcomers = [await _open(gw.url) for _ in range(3)]
    for reader, writer in newcomers:
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _status(await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), EOF_WAIT)) == 200
    for reader, _ in (keepalive, silent, half):
        await asyncio.wait_for(reader.read(), EOF_WAIT)  # closed by the gateway
    assert b"data:" in await asyncio.wait_for(streaming[0].read(64), EOF_WAIT)
    for _, writer in [streaming, keepalive, silent, half, *newcomers]:
        writer.close()
    await asyncio.sleep(0.2)
    raw = await _exchange(gw.url, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    text = raw.decode()
    assert 'canary_connections_shed_total{listener="proxy",reason="between_requests"} 1' in text
    assert 'canary_connections_shed_total{listener="proxy",reason="before_first_request"} 2' in (
        text
    )
    assert 'canary_connections_refused_total{listener="proxy"} 0' in text


async def test_malformed_requests_are_counted_not_logged(
    gateway: Any, upstream: str, http: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A malformed request carrying a token gets a 400 that does not echo it; 50 of them
    are counted in `canary_bad_requests_total` and logged at most once, without the token."""
    gw = await gateway(upstream, bad_request_log_interval_s=3600.0)
    secret = b"sk-live-0123456789abcdef"
    bad = b"GET /echo HTTP/1.1\r\nAuthorization: Bearer " + secret + b"\nX: y\r\n\r\n"
    with caplog.at_level(logging.DEBUG):
        for _ in range(50):
            raw = await _exchange(gw.url, bad)
            assert _status(raw) == 400
            assert secret not in raw
    logged = [r for r in caplog.records if r.name.startswith(("aiohttp", "canary"))]
    assert len(logged) <= 1
    assert all(secret.decode() not in r.getMessage() + str(r.__dict__) for r in caplog.records)
    text = await _metrics(http, gw)
    counted = [line for line in text.splitlines() if line.startswith("canary_bad_requests_total")]
    assert sum(int(line.rsplit(" ", 1)[1]) for line in counted) == 50


async def test_absolute_form_target_is_forwarded_by_its_path(
    gateway: Any, upstream: str, http: Any
) -> None:
    """`GET http://x/echo/y?q=1 HTTP/1.1` is forwarded as `/echo/y?q=1`: no 500, counted."""
    gw = await gateway(upstream)
    raw = await _exchange(
        gw.url,
        b"GET http://elsewhere.example/echo/y?q=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert _status(raw) == 200
    assert _json_body(raw)["path_qs"] == "/echo/y?q=1"
    assert "canary_proxy_non_origin_targets_total 1" in await _metrics(http, gw)


async def test_expect_continue_is_answered_and_not_forwarded(gateway: Any) -> None:
    """With `Expect: 100-continue`, the client gets the gateway's 100, the upstream (which
    never sends a 100 of its own) receives a complete request without `Expect`, and answers."""

    async def respond(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()

    seen: list[bytes] = []

    async def recording(head: bytes, writer: asyncio.StreamWriter) -> None:
        seen.append(head)
        await respond(head, writer)

    async with raw_upstream(recording) as live:
        gw = await gateway(live, ttfb_timeout_s=30.0)
        reader, writer = await _open(gw.url)
        writer.write(
            b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), EOF_WAIT)
        assert interim.startswith(b"HTTP/1.1 100")
        writer.write(b"hello")
        final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), EOF_WAIT)
        writer.close()
    assert _status(final) == 200
    assert b"expect" not in seen[0].lower()


async def _firehose(request: web.Request) -> web.StreamResponse:
    """Streams 64 KiB chunks as fast as the gateway reads them, until the connection goes."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    chunk = b"data: " + b"x" * 65536 + b"\n\n"
    with contextlib.suppress(ConnectionError):
        while True:
            await resp.write(chunk)
    return resp


async def test_a_client_that_stops_reading_is_its_own_fault(
    gateway: Any, serve: Callable[..., Awaitable[Any]], http: Any
) -> None:
    """A client that stops reading a fast stream is cut after `client_write_timeout_s`,
    counted as `client_slow_reader` (status 499), never as the live endpoint's idle timeout."""
    app = web.Application()
    app.router.add_post("/firehose", _firehose)
    served = await serve(app)
    gw = await gateway(served.url, idle_timeout_s=0.2, client_write_timeout_s=0.5)
    host, port = gw.url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    _reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(b"POST /firehose HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
    await writer.drain()
    text = ""

    async def cut() -> bool:  # never read: the gateway gives up after client_write_timeout_s
        nonlocal text
        text = await _metrics(http, gw)
        return 'canary_proxy_upstream_errors_total{kind="client_slow_reader"} 1' in text

    with contextlib.suppress(AssertionError):  # the assertions below say what was counted
        await until(cut, what="the slow reader cut", within_s=0.5 + SETTLE_S)
    writer.close()
    assert 'canary_proxy_upstream_errors_total{kind="client_slow_reader"} 1' in text
    assert 'canary_proxy_upstream_errors_total{kind="timeout_idle"} 0' in text
