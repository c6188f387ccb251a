"""Transparency: through the gateway a client gets what it gets from the live endpoint directly."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest

from gateway.sim.server import start_sim
from tests import fixtures_net
from tests.upstreams import GZIP_BODY, JSON_BODY, SSE_EVENTS, decode, scripted_app

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy

# Headers that legitimately differ between two answers or hops.
VOLATILE = {"date", "x-request-id", "transfer-encoding", "connection", "keep-alive"}
# The simulator's per-request id and creation time, which differ between any two requests.
_IDS = re.compile(rb'"(id|created)":\s*("[^"]*"|\d+)')


def stable_headers(headers: Any) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in headers.items() if k.lower() not in VOLATILE]


def normalise(body: bytes) -> bytes:
    return _IDS.sub(rb'"\1":"*"', body)


async def fetch(
    http: aiohttp.ClientSession, method: str, url: str, **kw: Any
) -> tuple[int, list[tuple[str, str]], list[bytes]]:
    async with http.request(method, url, **kw) as resp:
        chunks = [chunk async for chunk in resp.content.iter_any()]
        return resp.status, stable_headers(resp.headers), chunks


CHAT = {"model": "sim-model", "messages": [{"role": "user", "content": "Tell me a story"}]}

SIM_CASES = [
    ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 12}),
    ("POST", "/v1/chat/completions", {**CHAT, "max_tokens": 12, "stream": True}),
    (
        "POST",
        "/v1/chat/completions",
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
    ),
    ("POST", "/v1/completions", {"model": "sim-model", "prompt": "Once upon", "max_tokens": 8}),
    (
        "POST",
        "/v1/completions",
        {"model": "sim-model", "prompt": "Once upon", "max_tokens": 8, "stream": True},
    ),
    ("POST", "/v1/embeddings", {"model": "sim-model", "input": ["a", "b"]}),
    ("GET", "/v1/models", None),
    ("POST", "/tokenize", {"model": "sim-model", "prompt": "hello world"}),
    ("GET", "/health", None),
    ("GET", "/no/such/path?x=1&y=%20z", None),
    ("POST", "/v1/chat/completions", {"model": "unknown-model", "messages": []}),
]


@pytest.mark.parametrize(("method", "path", "payload"), SIM_CASES)
async def test_simulator_direct_vs_gateway(
    method: str,
    path: str,
    payload: dict[str, Any] | None,
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """Status, headers and body bytes (ids aside) match the simulator answered directly."""
    async with await start_sim("fast") as sim:
        gw = await gateway(sim.url)
        direct = await fetch(http, method, sim.url + path, json=payload)
        proxied = await fetch(http, method, gw.url + path, json=payload)
    assert proxied[0] == direct[0]
    assert proxied[1] == direct[1]
    assert normalise(b"".join(proxied[2])) == normalise(b"".join(direct[2]))


async def test_sse_chunk_sequence_is_preserved(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """Paced SSE events reach the client one by one, byte for byte, as the upstream sent them."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    direct = await fetch(http, "POST", up.url + "/sse?gap=0.05", data=b"{}")
    proxied = await fetch(http, "POST", gw.url + "/sse?gap=0.05", data=b"{}")
    assert direct[2] == SSE_EVENTS
    assert proxied[2] == SSE_EVENTS
    assert proxied[1] == direct[1]


async def test_sse_events_are_not_buffered(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """The first event arrives long before the upstream has finished the stream."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    loop = asyncio.get_running_loop()
    async with http.post(gw.url + "/sse?gap=0.3", data=b"{}") as resp:
        start = loop.time()
        first = await resp.content.readany()
        first_after = loop.time() - start
        rest = await resp.read()
        total = loop.time() - start
    assert first == SSE_EVENTS[0]
    assert first_after < 0.25 < total
    assert first + rest == b"".join(SSE_EVENTS)


async def test_plain_json_keeps_content_length_and_bytes(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """A Content-Length answer stays a Content-Length answer with identical bytes."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    async with http.post(gw.url + "/json", data=b"{}") as resp:
        assert resp.headers["Content-Length"] == str(len(JSON_BODY))
        assert "Transfer-Encoding" not in resp.headers
        assert resp.headers["X-A"] == "1"
        assert await resp.read() == JSON_BODY


async def test_compressed_body_passes_untouched(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
) -> None:
    """A gzip answer is forwarded compressed, with its Content-Encoding, not decoded."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    async with (
        aiohttp.ClientSession(auto_decompress=False) as raw,
        raw.get(gw.url + "/gzip", headers={"Accept-Encoding": "gzip"}) as resp,
    ):
        assert resp.headers["Content-Encoding"] == "gzip"
        assert await resp.read() == GZIP_BODY


async def test_head_request(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """HEAD is forwarded and answered with the upstream's headers and no body."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    direct = await fetch(http, "HEAD", up.url + "/json")
    proxied = await fetch(http, "HEAD", gw.url + "/json")
    assert proxied == direct
    assert proxied[2] == []


async def test_methods_paths_and_query_strings_are_forwarded(
    serve: Callable[..., Awaitable[Any]],
    gateway: Callable[..., Awaitable[Any]],
    http: aiohttp.ClientSession,
) -> None:
    """Every method reaches the upstream with its raw path and query string unchanged."""
    up = await serve(scripted_app(), handler_cancellation=True)
    gw = await gateway(up.url)
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"):
        path = "/echo/a%2Fb/c?q=1&q=2&sp=%20x&empty="
        async with http.request(method, gw.url + path, data=b"xyz") as resp:
            seen = decode(await resp.read())
        assert seen["method"] == method
        assert seen["path_qs"] == path
        assert seen["body_len"] == 3


async def test_openai_sdk_streaming_and_not(gateway: Callable[..., Awaitable[Any]]) -> None:
    """The official openai SDK works through the gateway, streaming and not, like directly."""
    async with await start_sim("fast") as sim:
        gw = await gateway(sim.url)
        results: dict[str, tuple[str, str]] = {}
        for name, base in (("direct", sim.url), ("gateway", gw.url)):
            async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="k") as client:
                whole = await client.chat.completions.create(
                    model="sim-model",
                    messages=[{"role": "user", "content": "Say something"}],
                    max_tokens=10,
                )
                stream = await client.chat.completions.create(
                    model="sim-model",
                    messages=[{"role": "user", "content": "Say something"}],
                    max_tokens=10,
                    stream=True,
                )
                parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
                results[name] = (whole.choices[0].message.content or "", "".join(parts))
                models = await client.models.list()
                assert [m.id for m in models.data] == ["sim-model"]
    assert results["gateway"] == results["direct"]
    assert results["gateway"][0]


async def test_runs_on_the_parametrized_loop(event_loop_policy: Any) -> None:
    """This module really runs on both loops: the running loop comes from the policy's module."""
    loop_pkg = type(asyncio.get_running_loop()).__module__.split(".")[0]
    policy_pkg = type(event_loop_policy).__module__.split(".")[0]
    assert loop_pkg == policy_pkg
