"""The proxy's upstream pool: the bytes it sends, keep-alive reuse, its connection limit, failures.

A raw asyncio server records every request as bytes and answers from a script, so what goes on
the wire is compared byte for byte with what aiohttp's own client session sends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from time import perf_counter

import pytest
import pytest_asyncio
from multidict import CIMultiDict
from yarl import URL

from gateway.server.app import make_client_session
from gateway.server.deadlines import DeadlineSweeper, UpstreamTimeouts
from gateway.server.upstream import (
    SLICE_ABOVE,
    Origin,
    UpstreamConnectError,
    UpstreamPool,
    UpstreamResetError,
    request_body,
)
from tests import fixtures_net

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Up: 1\r\n\r\nok"


class Recorder:
    """A keep-alive HTTP/1.1 server that records each request's bytes and each connection."""

    def __init__(
        self, answer: bytes = OK, *, close_after: bool = False, delay: float = 0.0,
        first_connection_answers: int | None = None,
    ) -> None:  # fmt: skip
        self.answer = answer
        self.close_after = close_after
        self.delay = delay
        # The first connection answers this many requests, then closes on the next one unanswered
        # (an upstream closing an idle keep-alive connection as the next request arrives).
        self.first_connection_answers = first_connection_answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.concurrent = 0
        self.max_concurrent = 0
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        budget = self.first_connection_answers if self.connections == 1 else None
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length) if length else b""
                self.requests.append(head + body)
                if budget is not None:
                    if budget == 0:
                        return  # closed without an answer
                    budget -= 1
                if self.delay:
                    await asyncio.sleep(self.delay)
                answer = self.answer
                if head.startswith(b"HEAD "):  # the same head, no body
                    answer = answer.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    return
        finally:
            self.concurrent -= 1
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()


@pytest_asyncio.fixture
async def recorder() -> AsyncIterator[Recorder]:
    rec = Recorder()
    await rec.start()
    yield rec
    await rec.stop()


def _watch() -> DeadlineSweeper:
    return DeadlineSweeper(UpstreamTimeouts())


async def _get(
    pool: UpstreamPool, origin: Origin, method: str, target: str, body: bytes = b"",
    headers: CIMultiDict[str] | None = None,
) -> tuple[int, bytes]:  # fmt: skip
    sweeper = _watch()
    wd = sweeper.watch(perf_counter())
    try:
        resp = await pool.open(
            method, origin, target, headers=headers or CIMultiDict(), data=request_body(body),
            watchdog=wd,
        )  # fmt: skip
        data = b""
        while chunk := await resp.content.readany():
            data += chunk
        resp.release()
        return resp.status, data
    finally:
        wd.close()
        sweeper.close()


@pytest.mark.parametrize(
    ("method", "body"),
    [("GET", b""), ("POST", b'{"a":1}'), ("DELETE", b""), ("PUT", b""), ("HEAD", b"")],
)
async def test_same_bytes_as_aiohttp_client(recorder: Recorder, method: str, body: bytes) -> None:
    base = URL(f"http://127.0.0.1:{recorder.port}/base/")
    headers = CIMultiDict(
        [("Content-Type", "application/json"), ("X-Dup", "1"), ("X-Dup", "2"), ("Ümlaut", "ä")]
    )
    session = make_client_session(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    try:
        async with session.request(
            method, URL(f"http://127.0.0.1:{recorder.port}/base/v1/x?q=%20", encoded=True),
            headers=headers, data=body or None, allow_redirects=False,
        ) as resp:  # fmt: skip
            await resp.read()
    finally:
        await session.close()
    pool = UpstreamPool(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    try:
        status, _ = await _get(pool, Origin(base), method, "/v1/x?q=%20", body, headers)
    finally:
        pool.close()
    assert status == 200
    assert len(recorder.requests) == 2
    assert recorder.requests[1] == recorder.requests[0]
    assert recorder.requests[1].startswith(f"{method} /base/v1/x?q=%20 HTTP/1.1\r\n".encode())


async def test_repeated_header_names_in_any_case_all_go_out(recorder: Recorder) -> None:
    # aiohttp's session keeps the last of two names that differ only in case (its merge of
    # default headers compares names case-sensitively); the pool forwards both, in order.
    headers = CIMultiDict([("X-Dup", "1"), ("x-dup", "2"), ("X-DUP", "3")])
    pool = UpstreamPool(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    try:
        origin = Origin(URL(f"http://127.0.0.1:{recorder.port}"))
        assert await _get(pool, origin, "GET", "/", headers=headers) == (200, b"ok")
    finally:
        pool.close()
    assert (
        recorder.requests[0]
        == (
            f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{recorder.port}\r\n"
            "X-Dup: 1\r\nx-dup: 2\r\nX-DUP: 3\r\n\r\n"
        ).encode()
    )


async def test_keep_alive_reuses_one_connection(recorder: Recorder) -> None:
    pool = UpstreamPool(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    origin = Origin(URL(f"http://127.0.0.1:{recorder.port}"))
    try:
        for _ in range(5):
            assert await _get(pool, origin, "GET", "/v1/models") == (200, b"ok")
        assert recorder.connections == 1
        assert pool.open_connections == 1
    finally:
        pool.close()
    assert pool.open_connections == 0


async def test_limit_makes_requests_wait_for_a_connection() -> None:
    rec = Recorder(delay=0.05)
    await rec.start()
    pool = UpstreamPool(limit=2, keepalive_s=30.0, connect_timeout_s=5.0)
    origin = Origin(URL(f"http://127.0.0.1:{rec.port}"))
    try:
        results = await asyncio.gather(*(_get(pool, origin, "GET", "/") for _ in range(6)))
        assert results == [(200, b"ok")] * 6
        assert rec.max_concurrent <= 2
        assert rec.connections == 2
        assert len(rec.requests) == 6
    finally:
        pool.close()
        await rec.stop()


async def test_connection_closed_by_upstream_is_not_reused() -> None:
    rec = Recorder(close_after=True)
    await rec.start()
    pool = UpstreamPool(limit=1, keepalive_s=30.0, connect_timeout_s=5.0)
    origin = Origin(URL(f"http://127.0.0.1:{rec.port}"))
    try:
        for _ in range(3):
            assert await _get(pool, origin, "GET", "/") == (200, b"ok")
            await asyncio.sleep(0.01)  # the upstream's close arrives
        assert rec.connections == 3
        assert pool.open_connections <= 1
    finally:
        pool.close()
        await rec.stop()


@pytest.mark.parametrize(("method", "retried"), [("GET", True), ("PUT", True), ("POST", False)])
async def test_reused_connection_closed_by_upstream_retries_idempotent_requests_once(
    method: str, retried: bool
) -> None:
    rec = Recorder(first_connection_answers=1)
    await rec.start()
    pool = UpstreamPool(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    origin = Origin(URL(f"http://127.0.0.1:{rec.port}"))
    try:
        assert await _get(pool, origin, method, "/", b"x") == (200, b"ok")
        if retried:  # sent again on a new connection, as aiohttp's session does
            assert await _get(pool, origin, method, "/", b"x") == (200, b"ok")
            assert rec.connections == 2
            assert len(rec.requests) == 3
        else:  # a POST is never sent twice: the client gets the reset
            with pytest.raises(UpstreamResetError):
                await _get(pool, origin, method, "/", b"x")
            assert rec.connections == 1
        assert pool.open_connections <= 1
    finally:
        pool.close()
        await rec.stop()


async def test_answer_with_connection_close_is_dropped() -> None:
    rec = Recorder(answer=b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    await rec.start()
    pool = UpstreamPool(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    origin = Origin(URL(f"http://127.0.0.1:{rec.port}"))
    try:
        assert await _get(pool, origin, "GET", "/") == (200, b"ok")
        assert pool.open_connections == 0
    finally:
        pool.close()
        await rec.stop()


async def test_large_body_goes_out_in_slices_whole(recorder: Recorder) -> None:
    body = bytes(range(256)) * ((SLICE_ABOVE // 256) + 3)
    pool = UpstreamPool(limit=4, keepalive_s=30.0, connect_timeout_s=5.0)
    try:
        origin = Origin(URL(f"http://127.0.0.1:{recorder.port}"))
        assert await _get(pool, origin, "POST", "/v1/x", body) == (200, b"ok")
    finally:
        pool.close()
    sent = recorder.requests[0]
    assert sent.endswith(b"\r\n\r\n" + body)
    assert f"Content-Length: {len(body)}\r\n".encode() in sent


async def test_refused_connection_is_a_connect_error_and_frees_its_slot() -> None:
    rec = Recorder()
    await rec.start()
    port = rec.port
    await rec.stop()
    assert rec.server is not None
    await rec.server.wait_closed()
    pool = UpstreamPool(limit=1, keepalive_s=30.0, connect_timeout_s=5.0)
    try:
        for _ in range(2):
            with pytest.raises(UpstreamConnectError):
                await _get(pool, Origin(URL(f"http://127.0.0.1:{port}")), "GET", "/")
        assert pool.open_connections == 0
    finally:
        pool.close()


async def test_reset_before_the_answer_is_an_upstream_reset() -> None:
    rec = Recorder(answer=b"")  # reads the request, closes without answering
    rec.close_after = True
    await rec.start()
    pool = UpstreamPool(limit=2, keepalive_s=30.0, connect_timeout_s=5.0)
    try:
        with pytest.raises(UpstreamResetError):
            await _get(pool, Origin(URL(f"http://127.0.0.1:{rec.port}")), "POST", "/", b"x")
        assert pool.open_connections == 0
    finally:
        pool.close()
        await rec.stop()


async def test_close_fails_waiting_requests() -> None:
    rec = Recorder(delay=0.2)
    await rec.start()
    pool = UpstreamPool(limit=1, keepalive_s=30.0, connect_timeout_s=5.0)
    origin = Origin(URL(f"http://127.0.0.1:{rec.port}"))
    first = asyncio.ensure_future(_get(pool, origin, "GET", "/"))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(_get(pool, origin, "GET", "/"))
    await asyncio.sleep(0.01)
    pool.close()
    with pytest.raises(UpstreamResetError):
        await second
    assert await first == (200, b"ok")
    assert pool.open_connections == 0
    await rec.stop()


def test_origin_rejects_non_http_urls() -> None:
    with pytest.raises(ValueError):
        Origin(URL("ftp://example.com/"))
    origin = Origin(URL("https://example.com/api/"))
    assert origin.key == ("https", "example.com", 443)
    assert origin.prefix == "/api"
    assert origin.host_line == b"Host: example.com\r\n"
