"""Every error path of the proxy: OpenAI-shaped 413/502/504, and cut streams after a reset."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gateway.sim.server import start_sim
from tests import fixtures_net
from tests.upstreams import (
    SSE_EVENTS,
    STATE,
    cancelled,
    decode,
    free_port,
    raw_upstream,
    rst,
    scripted_app,
)
from tests.waiting import SETTLE_S, until

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy


def assert_openai_error(body: bytes, code: str) -> None:
    err = decode(body)["error"]
    assert isinstance(err, dict)
    assert set(err) == {"message", "type", "code"}
    assert err["code"] == code and err["message"]


async def metric_lines(http: aiohttp.ClientSession, url: str, prefix: str) -> list[str]:
    async with http.get(url + "/metrics") as resp:
        return [line for line in (await resp.text()).splitlines() if line.startswith(prefix)]


async def test_connection_refused_is_502(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """A live endpoint that refuses connections gives an OpenAI-shaped 502 and a counted error."""
    gw = await gateway(f"http://127.0.0.1:{free_port()}")
    async with http.post(gw.url + "/v1/chat/completions", json={}) as resp:
        assert resp.status == 502
        assert resp.headers["Content-Type"] == "application/json"
        assert resp.headers["X-Request-ID"]
        assert_openai_error(await resp.read(), "upstream_unreachable")
    lines = await metric_lines(http, gw.url, "canary_proxy_upstream_errors_total")
    assert 'canary_proxy_upstream_errors_total{kind="connect"} 1' in lines


async def test_reset_before_answer_is_502(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """A live endpoint that resets the connection before any response byte gives 502."""

    async def reset(head: bytes, writer: asyncio.StreamWriter) -> None:
        rst(writer)

    async with raw_upstream(reset) as url:
        gw = await gateway(url)
        async with http.post(gw.url + "/v1/completions", json={"prompt": "x"}) as resp:
            assert resp.status == 502
            assert_openai_error(await resp.read(), "upstream_reset")


async def test_close_before_answer_is_502(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """A live endpoint that closes cleanly without answering gives 502 too."""

    async def close(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.close()

    async with raw_upstream(close) as url:
        gw = await gateway(url)
        async with http.post(gw.url + "/x", data=b"1") as resp:
            assert resp.status == 502
            assert_openai_error(await resp.read(), "upstream_reset")


async def test_ttfb_timeout_is_504_and_aborts_upstream(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """No response headers within the TTFB timeout gives 504, and the upstream is let go."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url, ttfb_timeout_s=0.3)
    async with http.post(gw.url + "/hang", data=b"{}") as resp:
        assert resp.status == 504
        assert_openai_error(await resp.read(), "upstream_timeout")
    state = up.app[STATE]
    await until(cancelled(state), what="the hung upstream request aborted", within_s=SETTLE_S)
    assert state.cancelled_at, "the hung upstream request was not aborted"
    lines = await metric_lines(http, gw.url, "canary_proxy_upstream_errors_total")
    assert 'canary_proxy_upstream_errors_total{kind="timeout_ttfb"} 1' in lines


async def test_total_timeout_before_first_byte_is_504(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """The total deadline also ends a request that has not answered yet, with 504."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url, total_timeout_s=0.2)
    async with http.post(gw.url + "/hang", data=b"{}") as resp:
        assert resp.status == 504


async def test_idle_timeout_mid_stream_cuts_the_client_stream(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """A stream that goes silent past the idle timeout is cut, never ended cleanly."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url, idle_timeout_s=0.3)
    async with http.post(gw.url + "/stall", data=b"{}") as resp:
        assert resp.status == 200
        assert await resp.content.readany() == SSE_EVENTS[0]
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    lines = await metric_lines(http, gw.url, "canary_proxy_upstream_errors_total")
    assert 'canary_proxy_upstream_errors_total{kind="timeout_idle"} 1' in lines


async def test_reset_mid_stream_cuts_the_client_stream(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """The simulator's reset-mid-stream fault reaches the client as a broken stream."""
    async with await start_sim("reset-mid-stream") as sim:
        gw = await gateway(sim.url)
        payload = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(
            gw.url + "/v1/chat/completions", json={**payload, "stream": True}
        ) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        # The gateway keeps serving afterwards.
        async with http.get(gw.url + "/healthz") as resp:
            assert resp.status == 200


async def test_reset_mid_body_with_content_length_cuts_the_client(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """A Content-Length answer cut short upstream is cut short for the client too."""

    async def short(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: a/b\r\n\r\nabc")
        await writer.drain()
        await asyncio.sleep(0.05)
        rst(writer)

    async with raw_upstream(short) as url:
        gw = await gateway(url)
        async with http.get(gw.url + "/x") as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()


@pytest.mark.parametrize("profile", ["error-500", "garbage"])
async def test_upstream_faults_pass_through(
    profile: str, gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """An upstream 500 or garbage body is the upstream's answer: forwarded as is."""
    async with await start_sim(profile) as sim:
        gw = await gateway(sim.url)
        payload = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(sim.url + "/v1/chat/completions", json=payload) as direct:
            direct_status, direct_type = direct.status, direct.headers.get("Content-Type")
            await direct.read()
        async with http.post(gw.url + "/v1/chat/completions", json=payload) as resp:
            assert resp.status == direct_status
            assert resp.headers.get("Content-Type") == direct_type
            await resp.read()


async def test_body_over_limit_is_413(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """A body over max_body_bytes gives 413, by Content-Length or by counting a chunked body."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url, max_body_bytes=1000)
    async with http.post(gw.url + "/echo", data=b"x" * 1001) as resp:
        assert resp.status == 413
        assert_openai_error(await resp.read(), "request_too_large")

    async def chunked() -> Any:
        for _ in range(20):
            yield b"y" * 100

    async with http.post(gw.url + "/echo", data=chunked()) as resp:
        assert resp.status == 413
    async with http.post(gw.url + "/echo", data=b"x" * 1000) as resp:
        assert resp.status == 200
        assert decode(await resp.read())["body_len"] == 1000
