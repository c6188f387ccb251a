"""Header handling: hop-by-hop headers stripped both ways, Host, X-Forwarded-*, X-Request-ID."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tests import fixtures_net
from tests.upstreams import decode, raw_upstream, scripted_app

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy


def header_map(seen: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for key, value in seen["headers"]:
        out.setdefault(key.lower(), []).append(value)
    return out


async def test_request_hop_by_hop_headers_are_stripped(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """Connection, the headers it names, Keep-Alive, TE, Trailer, Upgrade, Proxy-* never reach
    the upstream; end-to-end headers (Authorization, custom, repeated) do, unchanged."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    headers = [
        ("Connection", "keep-alive, X-Hop-Secret"),
        ("X-Hop-Secret", "s3cret"),
        ("Keep-Alive", "timeout=5"),
        ("TE", "trailers"),
        ("Trailer", "X-Checksum"),
        ("Upgrade", "h2c"),
        ("Proxy-Authorization", "Basic abc"),
        ("Proxy-Connection", "keep-alive"),
        ("Authorization", "Bearer client-token"),
        ("X-Custom", "one"),
        ("X-Custom", "two"),
        ("Content-Type", "application/json"),
    ]
    async with http.post(gw.url + "/echo", data=b"{}", headers=headers) as resp:
        seen = header_map(decode(await resp.read()))
    for name in ("x-hop-secret", "keep-alive", "te", "trailer", "upgrade"):
        assert name not in seen, name
    assert not [k for k in seen if k.startswith("proxy-")]
    assert seen.get("connection", ["keep-alive"]) == ["keep-alive"]  # the client session's own
    assert seen["authorization"] == ["Bearer client-token"]
    assert seen["x-custom"] == ["one", "two"]
    assert seen["content-type"] == ["application/json"]
    assert seen["content-length"] == ["2"]
    assert seen["host"] == [up.url.removeprefix("http://")]


async def test_forwarded_headers_are_appended(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """X-Forwarded-For and X-Forwarded-Proto append this hop to what the client sent."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    async with http.get(gw.url + "/echo") as resp:
        seen = header_map(decode(await resp.read()))
    assert seen["x-forwarded-for"] == ["127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["http"]
    extra = {"X-Forwarded-For": "10.1.2.3", "X-Forwarded-Proto": "https"}
    async with http.get(gw.url + "/echo", headers=extra) as resp:
        seen = header_map(decode(await resp.read()))
    assert seen["x-forwarded-for"] == ["10.1.2.3, 127.0.0.1"]
    assert seen["x-forwarded-proto"] == ["https, http"]


async def test_request_id_generated_when_absent_and_returned(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """A missing X-Request-ID is generated, sent upstream and returned; a given one is kept."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    async with http.get(gw.url + "/echo") as resp:
        rid = resp.headers["X-Request-ID"]
        seen = header_map(decode(await resp.read()))
    assert len(rid) == 36 and seen["x-request-id"] == [rid]
    async with http.get(gw.url + "/echo", headers={"X-Request-ID": "mine-42"}) as resp:
        assert resp.headers["X-Request-ID"] == "mine-42"
        seen = header_map(decode(await resp.read()))
    assert seen["x-request-id"] == ["mine-42"]


async def test_no_headers_are_added_upstream(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
) -> None:
    """The gateway adds no User-Agent, Accept or Accept-Encoding of its own."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    async with (
        aiohttp.ClientSession(skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding")) as s,
        s.get(gw.url + "/echo") as resp,
    ):
        seen = header_map(decode(await resp.read()))
    assert set(seen) == {
        "host",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-request-id",
    }


async def test_response_hop_by_hop_headers_are_stripped(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """Hop-by-hop response headers (and those Connection names) never reach the client; every
    end-to-end header, repeated ones and Set-Cookie included, does."""
    head = (
        b"HTTP/1.1 200 OK\r\n"
        b"Content-Type: application/json\r\n"
        b"Connection: keep-alive, X-Internal\r\n"
        b"X-Internal: secret\r\n"
        b"Keep-Alive: timeout=5\r\n"
        b"Proxy-Authenticate: Basic\r\n"
        b"Upgrade: h2c\r\n"
        b"Trailer: X-Sum\r\n"
        b"Set-Cookie: a=1\r\n"
        b"Set-Cookie: b=2\r\n"
        b"X-Vllm: yes\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )

    async def respond(request_head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(head)
        await writer.drain()

    async with raw_upstream(respond) as url:
        gw = await gateway(url)
        async with http.get(gw.url + "/anything") as resp:
            assert await resp.read() == b"{}"
            names = {k.lower() for k in resp.headers}
            assert resp.headers.getall("Set-Cookie") == ["a=1", "b=2"]
            assert resp.headers["X-Vllm"] == "yes"
            assert resp.headers["Content-Length"] == "2"
    for name in ("x-internal", "keep-alive", "proxy-authenticate", "upgrade", "trailer"):
        assert name not in names, name


async def test_cookies_are_not_shared_between_clients(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """A Set-Cookie answer is never replayed by the gateway on another client's request."""
    seen: list[bytes] = []

    async def respond(request_head: bytes, writer: asyncio.StreamWriter) -> None:
        seen.append(request_head)
        writer.write(b"HTTP/1.1 200 OK\r\nSet-Cookie: session=abc\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()

    async with raw_upstream(respond) as url:
        gw = await gateway(url)
        for _ in range(2):
            async with aiohttp.ClientSession() as fresh, fresh.get(gw.url + "/") as resp:
                await resp.read()
    assert len(seen) == 2 and b"session=abc" not in seen[1]
