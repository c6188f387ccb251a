"""Streams under stress: client disconnects abort the upstream, many concurrent streams, large
bodies, and the tee contract (same body object, exactly one on_response, errors contained)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import xxhash
from multidict import CIMultiDictProxy

from gateway.server.meter import MeterResult
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from tests import fixtures_net
from tests.upstreams import STATE, cancelled, decode, free_port, scripted_app
from tests.waiting import SETTLE_S, until

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy

CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "Tell me a long story"}]}


async def sim_stats(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/sim/stats") as resp:
        return dict(await resp.json())


async def test_client_disconnect_aborts_upstream_within_a_second(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
) -> None:
    """A client leaving mid-stream makes the gateway drop the upstream connection at once."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    state = up.app[STATE]
    async with aiohttp.ClientSession() as client:
        resp = await client.post(gw.url + "/forever", data=b"{}")
        assert await resp.content.readany()
        left_at = time.monotonic()
        resp.close()  # the client goes away mid-stream
    await until(cancelled(state), what="the upstream request cancelled", within_s=SETTLE_S)
    assert state.cancelled_at, "the upstream kept streaming after the client left"
    assert state.cancelled_at[0] - left_at < 1.0
    assert state.active == 0


async def test_client_disconnect_before_first_byte_aborts_upstream(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
) -> None:
    """A client leaving while the upstream has not answered yet also aborts the upstream."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    state = up.app[STATE]
    async with aiohttp.ClientSession() as client:
        task = asyncio.create_task(client.post(gw.url + "/hang", data=b"{}"))  # awaited below
        await asyncio.wait_for(state.started.wait(), 5)
        left_at = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await until(cancelled(state), what="the upstream request cancelled", within_s=SETTLE_S)
    assert state.cancelled_at and state.cancelled_at[0] - left_at < 1.0


async def test_client_disconnect_stops_simulated_generation(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """Against the simulator: an abandoned stream is counted aborted, nothing stays active."""
    async with await start_sim(get_profile("baseline", time_scale=0.5)) as sim:
        gw = await gateway(sim.url)
        async with aiohttp.ClientSession() as client:
            resp = await client.post(
                gw.url + "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 500}
            )
            assert await resp.content.readany()
            resp.close()

        async def aborted() -> dict[str, Any] | None:
            stats = await sim_stats(http, sim.url)
            return stats if stats["aborted"] == 1 else None

        stats = await until(
            aborted, what="the simulator counting the stream aborted", within_s=SETTLE_S
        )
        assert stats["active"] == 0


async def test_200_concurrent_streams(gateway: Callable[..., Awaitable[Any]]) -> None:
    """200 concurrent SSE streams all complete with the same events as direct streams."""
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    async with http, await start_sim(get_profile("baseline", time_scale=1.0)) as sim:
        gw = await gateway(sim.url)
        body = {**CHAT, "stream": True, "max_tokens": 60}

        async def one(base: str) -> bytes:
            async with http.post(base + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                return await resp.read()

        streams = await asyncio.gather(*(one(gw.url) for _ in range(200)))
        reference = await one(sim.url)
        stats = await sim_stats(http, sim.url)
    assert stats["max_active"] >= 150, stats
    events = [s.count(b"data: ") for s in streams]
    assert set(events) == {reference.count(b"data: ")}
    assert all(s.endswith(b"data: [DONE]\n\n") for s in streams)


async def test_large_bodies_both_ways(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """A 48 MiB request body reaches the upstream intact, read once into one bytes object."""
    up = await serve(scripted_app(), handler_cancellation=True)
    tee = RecordingTee()
    gw = await gateway(up.url, tee=tee)
    payload = bytes(range(256)) * (48 * 4096)
    async with http.post(gw.url + "/echo", data=io.BytesIO(payload)) as resp:
        seen = decode(await resp.read())
    assert seen["body_len"] == len(payload)
    assert seen["body_hash"] == xxhash.xxh3_128_hexdigest(payload)
    assert isinstance(tee.bodies[0], bytes) and tee.bodies[0] == payload


class RecordingTee:
    """A tee that records what the proxy hands it."""

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.bodies: list[bytes] = []
        self.requests: list[tuple[str, str, str]] = []
        self.responses: list[tuple[object, MeterResult, str | None]] = []

    def on_request(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        request_id: str,
    ) -> object | None:
        self.bodies.append(body)
        self.requests.append((method, path_qs, request_id))
        if self.fail:
            raise RuntimeError("tee broke")
        return len(self.requests)

    def on_response(self, token: object, result: MeterResult, error_kind: str | None) -> None:
        self.responses.append((token, result, error_kind))
        if self.fail:
            raise RuntimeError("tee broke again")


async def test_tee_sees_request_and_metered_response(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """The tee gets the body and request id before forwarding and one metered response after."""
    tee = RecordingTee()
    async with await start_sim("fast") as sim:
        gw = await gateway(sim.url, tee=tee)
        async with http.post(
            gw.url + "/v1/chat/completions?a=1",
            json={**CHAT, "stream": True, "max_tokens": 5},
            headers={"X-Request-ID": "rid-1"},
        ) as resp:
            text = await resp.read()
    assert tee.requests == [("POST", "/v1/chat/completions?a=1", "rid-1")]
    assert len(tee.responses) == 1
    token, result, kind = tee.responses[0]
    assert token == 1 and kind is None
    assert result.status == 200 and result.is_sse and result.saw_done
    assert result.ttft_s is not None and result.bytes_total == len(text)
    assert result.text and result.output_hash


async def test_tee_is_told_about_failures_once(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """Connect failures, timeouts and client disconnects each reach on_response exactly once."""
    tee = RecordingTee()
    gw = await gateway(f"http://127.0.0.1:{free_port()}", tee=tee)
    async with http.post(gw.url + "/v1/completions", data=b"{}") as resp:
        assert resp.status == 502
    up = await serve(scripted_app(), handler_cancellation=True)
    gw2 = await gateway(up.url, tee=tee, ttfb_timeout_s=0.2)
    async with http.post(gw2.url + "/hang", data=b"{}") as resp:
        assert resp.status == 504
    async with aiohttp.ClientSession() as client:
        resp = await client.post(gw2.url + "/forever", data=b"{}")
        await resp.content.readany()
        resp.close()

    async def three() -> bool:
        return len(tee.responses) >= 3

    with contextlib.suppress(AssertionError):  # the assertions below say what was recorded
        await until(three, what="three responses recorded", within_s=SETTLE_S)
    assert [kind for _, _, kind in tee.responses] == ["connect", "timeout", "client_disconnect"]
    assert [token for token, _, _ in tee.responses] == [1, 2, 3]


async def test_broken_tee_never_breaks_production(
    gateway: Callable[..., Awaitable[Any]], http: aiohttp.ClientSession
) -> None:
    """A tee that raises is counted on /metrics; the client still gets its full answer."""
    tee = RecordingTee(fail=True)
    async with await start_sim("fast") as sim:
        gw = await gateway(sim.url, tee=tee)
        async with http.post(gw.url + "/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == 200
            assert decode(await resp.read())["choices"]
        async with http.get(gw.url + "/metrics") as resp:
            text = await resp.text()
    assert "canary_proxy_tee_errors_total 1" in text
