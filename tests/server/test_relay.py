"""The direct relay of streamed answers (gateway/server/stream/relay.py): every byte, in order,
whoever carries it; the task takes over for a client that does not keep up and hands back;
nothing of a relay survives on a pooled connection; HTTP/1.0 clients get the raw body; a mirror
lane's sink meters a copy's answer without keeping it."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from gateway.server.deadlines import DeadlineSweeper, UpstreamTimeouts
from gateway.server.meter import MeterResult, ResponseMeter
from gateway.server.stream.relay import MeterSink
from gateway.server.upstream import Origin, UpstreamPool, read_chunk
from tests import fixtures_net
from tests.waiting import SETTLE_S, until

SEEN = web.AppKey("seen", list[tuple[str, int]])
pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy


def events(n: int, pad: int = 0) -> list[bytes]:
    """A vLLM-shaped chat stream of `n` content events (each padded by `pad` bytes)."""
    head = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    out = [head + b'"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n']
    for i in range(n):
        word = b" w%d%s" % (i, b"x" * pad)
        out.append(head + b'"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % word)
    out.append(head + b'"delta":{},"finish_reason":"stop"}]}\n\n')
    out.append(b"data: [DONE]\n\n")
    return out


def engine(stream: list[bytes], gap_s: float = 0.0) -> web.Application:
    """An upstream writing `stream` one event per write (a read each, with `gap_s` between),
    counting what it was asked on each connection."""
    seen: list[tuple[str, int]] = []

    async def sse(request: web.Request) -> web.StreamResponse:
        seen.append((request.path, id(request.transport)))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in stream:
            await resp.write(ev)
            await asyncio.sleep(gap_s)
        await resp.write_eof()
        return resp

    async def plain(request: web.Request) -> web.Response:
        seen.append((request.path, id(request.transport)))
        return web.json_response({"ok": True, "path": request.path})

    app = web.Application()
    app[SEEN] = seen
    app.router.add_post("/v1/chat/completions", sse)
    app.router.add_get("/plain", plain)
    return app


async def stream_reads(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    found = re.findall(r'canary_proxy_stream_reads_total\{path="(\w+)"\} (\S+)', text)
    return {path: float(value) for path, value in found}


async def test_a_relayed_stream_is_byte_identical_and_metered(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """One event per read: the first read goes through the task, the rest through the relay;
    the client gets every byte in order and the stored meter saw every event."""
    stream = events(40)
    up = await serve(engine(stream, gap_s=0.002))
    tee = RecordingTee()
    gw = await gateway(up.url, tee=tee)
    for _ in range(3):  # the same pooled upstream connection, reused
        async with http.post(gw.url + "/v1/chat/completions", json={"stream": True}) as resp:
            assert resp.status == 200
            body = await resp.read()
        assert body == b"".join(stream)
    async with http.get(gw.url + "/plain") as resp:  # a plain answer after relayed ones
        assert await resp.json() == {"ok": True, "path": "/plain"}
    seen = up.app[SEEN]
    assert len({conn for _, conn in seen}) == 1, "the upstream connection was not reused"
    reads = await stream_reads(http, gw.url)
    assert reads["task"] >= 3, reads
    assert reads["relay"] >= 3 * 30, f"the relay carried too few of 3 x 43 reads: {reads}"
    await until(tee.count(4), what="four metered answers", within_s=SETTLE_S)
    streamed = [result for result in tee.responses if result.is_sse]
    assert len(streamed) == 3, tee.responses
    for result in streamed:
        assert result.status == 200 and result.saw_done and result.finish_reason == "stop"
        assert result.token_events == 40
        assert result.text == "".join(f" w{i}" for i in range(40))
        assert result.bytes_total == len(b"".join(stream))


async def test_a_client_that_does_not_read_gets_the_task_then_the_relay_again(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """A client that stops reading while 4 MB stream at it: the relay hands the stream to the
    task (which waits for the client to drain), then takes it back; not a byte is lost,
    duplicated or reordered, and the final event still counts as delivered."""
    stream = events(4000, pad=1000)
    up = await serve(engine(stream))
    gw = await gateway(up.url)
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 16\r\nConnection: close\r\n\r\n{"stream": true}'
    )
    loop = asyncio.get_running_loop()
    with socket.create_connection((gw.host, gw.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        sock.setblocking(False)
        await loop.sock_sendall(sock, request)
        await asyncio.sleep(1.0)  # not reading: the gateway's buffer to this client fills
        received = bytearray()
        while chunk := await loop.sock_recv(sock, 1 << 16):
            received += chunk
    head, _, framed = bytes(received).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    assert dechunk(framed) == b"".join(stream)
    reads = await stream_reads(http, gw.url)
    assert reads["task"] >= 2, f"the task never took over from the relay: {reads}"
    assert reads["relay"] > 0, f"the relay never took the stream back: {reads}"


async def test_an_http10_client_gets_the_raw_body(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """No chunked coding on HTTP/1.0: the relay writes the reads as they are."""
    stream = events(30)
    up = await serve(engine(stream, gap_s=0.002))
    gw = await gateway(up.url)
    reader, writer = await asyncio.open_connection(gw.host, gw.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Length: 16\r\n\r\n"
        b'{"stream": true}'
    )
    received = await asyncio.wait_for(reader.read(), SETTLE_S)
    writer.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0] and b"chunked" not in head.lower()
    assert body == b"".join(stream)
    assert (await stream_reads(http, gw.url))["relay"] > 0


@pytest.mark.parametrize("finished", [False, True])
async def test_a_client_leaving_mid_relay_is_a_disconnect_unless_it_had_the_end(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    finished: bool,
) -> None:
    """A client that leaves while the relay carries its stream: counted as a disconnect; one
    that leaves after the final event (the relay wrote it) is an answered request."""
    stream = events(50, pad=10)
    if not finished:
        stream = stream[:-2] + [b": keep-alive\n\n"] * 400  # never ends within the test
    up = await serve(engine(stream, gap_s=0.005))
    tee = RecordingTee()
    gw = await gateway(up.url, tee=tee)
    async with aiohttp.ClientSession() as client:
        resp = await client.post(gw.url + "/v1/chat/completions", json={"stream": True})
        got = b""
        while len(got) < len(b"".join(stream[:40])):
            got += await resp.content.readany()
        if finished:
            await asyncio.sleep(0.5)  # the rest, [DONE] included, is written by the relay
        resp.close()
    await until(tee.count(1), what="the answer metered", within_s=SETTLE_S)
    async with aiohttp.ClientSession() as client, client.get(gw.url + "/metrics") as metrics:
        text = await metrics.text()
    disconnects = re.search(
        r'canary_proxy_upstream_errors_total\{kind="client_disconnect"\} (\S+)', text
    )
    assert disconnects is not None
    assert float(disconnects.group(1)) == (0.0 if finished else 1.0)
    assert tee.kinds == [None if finished else "client_disconnect"]


def dechunk(framed: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body (strictly: every size line and CRLF checked)."""
    out = bytearray()
    at = 0
    while True:
        end = framed.index(b"\r\n", at)
        size = int(framed[at:end], 16)
        at = end + 2
        if size == 0:
            assert framed[at:] == b"\r\n", "bytes after the last chunk"
            return bytes(out)
        out += framed[at : at + size]
        assert framed[at + size : at + size + 2] == b"\r\n", "a chunk without its CRLF"
        at += size + 2


class RecordingTee:
    """A tee storing every answer (so each is fully metered), recording what it is told."""

    def __init__(self) -> None:
        self.responses: list[MeterResult] = []
        self.kinds: list[str | None] = []

    def on_request(self, method: str, path: str, headers: Any, body: bytes, rid: str) -> object:
        return rid

    def on_response(self, token: object, result: MeterResult, kind: str | None) -> None:
        self.responses.append(result)
        self.kinds.append(kind)

    def count(self, n: int) -> Callable[[], Awaitable[bool]]:
        async def reached() -> bool:
            return len(self.responses) >= n

        return reached


async def test_a_copy_is_metered_from_the_read_callback_and_not_kept(
    serve: Callable[..., Awaitable[Any]],
) -> None:
    """A mirror lane's sink (`MeterSink`): every read of the answer reaches the meter from the
    connection's callback, none is queued for the task (its first `readany` is the end), and
    the connection goes back to the pool clean for the next answer."""
    stream = events(60)
    up = await serve(engine(stream, gap_s=0.002))
    pool = UpstreamPool(limit=2, keepalive_s=30.0, connect_timeout_s=5.0)
    sweeper = DeadlineSweeper(UpstreamTimeouts())
    try:
        for _ in range(2):
            t0 = perf_counter()
            wd = sweeper.watch(t0)
            resp = await pool.open(
                "POST", Origin(URL(up.url)), "/v1/chat/completions",
                headers=CIMultiDict({"Content-Type": "application/json"}),
                data=b'{"stream": true}', watchdog=wd,
            )  # fmt: skip
            meter = ResponseMeter(t0, is_sse=True, text_max_chars=10_000)
            sink = MeterSink.attach(resp.connection, resp.content, meter, wd)
            assert sink is not None
            queued = []
            while chunk := await read_chunk(resp, wd):
                queued.append(chunk)
                meter.feed(chunk, perf_counter())
            sink.stop()
            resp.release()
            wd.close()
            result = meter.finish(perf_counter(), resp.status)
            assert result.saw_done and result.token_events == 60
            assert result.text == "".join(f" w{i}" for i in range(60))
            assert result.bytes_total == len(b"".join(stream))
            assert sink.reads >= 50, f"the sink metered only {sink.reads} reads"
            assert len(queued) <= 2, f"{len(queued)} reads were queued for the task"
        assert len({conn for _, conn in up.app[SEEN]}) == 1, "the connection was not reused"
    finally:
        pool.close()
        sweeper.close()
