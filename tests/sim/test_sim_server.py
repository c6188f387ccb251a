"""Tests of the simulator over real sockets: wire format, caches, faults, stats and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from gateway.sim.profiles import PROFILES, get_profile
from gateway.sim.server import SimServer, build_sim_app, start_sim
from tests.waiting import SETTLE_S, until

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
Start = Callable[..., Awaitable[SimServer]]
WEATHER_TOOL: Any = {  # Any: the SDK wants its TypedDicts
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
async def sims() -> AsyncIterator[Start]:
    """Start simulators by profile name (with overrides); all are closed after the test."""
    started: list[SimServer] = []

    async def start(name: str, seed: int = 0, **overrides: Any) -> SimServer:
        sim = await start_sim(get_profile(name, **overrides), seed=seed)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        await sim.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "sim-model", "messages": [{"role": "user", "content": content}], **extra}


def _events(raw: bytes) -> list[Any]:
    """Parse an SSE body into JSON payloads (and the "[DONE]" marker), checking the framing."""
    assert raw.endswith(b"\n\n")
    events: list[Any] = []
    for block in raw[:-2].split(b"\n\n"):
        assert block.startswith(b"data: "), block
        payload = block[len(b"data: ") :]
        events.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
    return events


async def _stats(http: aiohttp.ClientSession, sim: SimServer) -> dict[str, int]:
    async with http.get(sim.url + "/sim/stats") as resp:
        stats: dict[str, int] = await resp.json()
        return stats


async def _wait_for(
    http: aiohttp.ClientSession, sim: SimServer, key: str, value: int, within: float = SETTLE_S
) -> dict[str, int]:
    """The simulator's stats once `key` reads `value` (its own loop's next turns)."""

    async def reached() -> dict[str, int] | None:
        stats = await _stats(http, sim)
        return stats if stats[key] == value else None

    found = await until(
        reached, what=f"the simulator's {key} at {value}", within_s=within, every_s=0.01
    )
    assert found is not None
    return found


def _openai(sim: SimServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)


# --- wire format ----------------------------------------------------------------------------


async def test_chat_stream_matches_vllm_chunk_format(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """A streamed chat answer is role chunk, one token per chunk, a finish chunk, the usage
    chunk with empty choices and cached_tokens, then [DONE] — each event its own HTTP chunk."""
    sim = await sims("baseline", time_scale=0.01)
    body = _chat("Hello there", stream=True, stream_options={"include_usage": True})
    async with http.post(sim.url + CHAT, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        http_chunks: list[bytes] = []
        buf = b""
        async for data, end_of_chunk in resp.content.iter_chunks():
            buf += data
            if end_of_chunk:
                http_chunks.append(buf)
                buf = b""
    assert all(c.startswith(b"data: ") and c.count(b"\n\n") == 1 for c in http_chunks)
    events = _events(b"".join(http_chunks))
    assert events[-1] == "[DONE]"
    first, *tokens, final, usage_chunk, _ = events
    assert first["object"] == "chat.completion.chunk" and first["model"] == "sim-model"
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert len({e["id"] for e in events[:-1]}) == 1
    assert all(len(e["choices"]) == 1 and e["choices"][0]["finish_reason"] is None for e in tokens)
    assert all(e["choices"][0]["delta"]["content"] for e in tokens)
    assert final["choices"][0]["finish_reason"] == "stop"
    assert final["choices"][0]["delta"] == {"content": ""}
    usage = usage_chunk["usage"]
    assert usage_chunk["choices"] == []
    assert usage["completion_tokens"] == len(tokens) + 1  # the end-of-sequence token counts
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_stream_without_include_usage_and_max_tokens_ends_with_length(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """max_tokens cuts the stream with finish_reason "length" on the last token, and no usage
    chunk is sent unless asked for."""
    sim = await sims("baseline", time_scale=0.01)
    async with http.post(sim.url + CHAT, json=_chat("Hi", stream=True, max_tokens=4)) as resp:
        events = _events(await resp.read())
    assert events[-1] == "[DONE]"
    tokens = events[1:-1]
    assert len(tokens) == 4 and all("usage" not in e for e in tokens)
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert tokens[-1]["choices"][0]["delta"]["content"]


async def test_non_stream_chat_and_completion_objects(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """Non-streamed answers are full chat.completion / text_completion objects whose text is
    what the stream would have carried, with usage including cached_tokens."""
    sim = await sims("baseline", time_scale=0.01)
    async with http.post(sim.url + CHAT, json=_chat("Hi")) as resp:
        chat = await resp.json()
    async with http.post(sim.url + CHAT, json=_chat("Hi", stream=True)) as resp:
        streamed = "".join(
            e["choices"][0]["delta"].get("content", "") for e in _events(await resp.read())[:-1]
        )
    assert chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-")
    choice = chat["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    assert choice["message"]["content"] == streamed
    assert chat["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}

    body = {"model": "sim-model", "prompt": "Once upon a time", "max_tokens": 200}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        text = await resp.json()
    assert text["object"] == "text_completion" and text["choices"][0]["text"]
    assert text["usage"]["completion_tokens"] >= 17
    body = {"prompt": "Once upon a time", "stream": True}  # vLLM's default max_tokens is 16
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        events = _events(await resp.read())
    assert len(events) == 17 and events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[0]["object"] == "text_completion"
    assert (
        "".join(e["choices"][0]["text"] for e in events[:-1])
        == text["choices"][0]["text"][: len("".join(e["choices"][0]["text"] for e in events[:-1]))]
    )


async def test_models_health_tokenize_and_embeddings(sims: Start) -> None:
    """The auxiliary vLLM routes answer like vLLM, including through the openai SDK."""
    sim = await sims("fast", served_model_names=["m1", "m2"])
    client = _openai(sim)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m1", "m2"]
        emb = await client.embeddings.create(model="m2", input=["a cat", "a dog"])
        assert [len(d.embedding) for d in emb.data] == [32, 32]
        again = await client.embeddings.create(model="m2", input="a cat")
        assert again.data[0].embedding == pytest.approx(emb.data[0].embedding, abs=1e-6)
    finally:
        await client.close()
    async with aiohttp.ClientSession() as http:
        async with http.get(sim.url + "/health") as resp:
            assert resp.status == 200 and await resp.read() == b""
        async with http.post(sim.url + "/tokenize", json={"prompt": "Hello, world"}) as resp:
            tok = await resp.json()
        assert tok["count"] == 3 == len(tok["tokens"]) and tok["max_model_len"] == 32768


# --- determinism and statistics -------------------------------------------------------------


async def test_same_prompt_same_text_on_every_profile(sims: Start) -> None:
    """At temperature 0 the answer text is byte-identical across profiles and seeds."""
    servers = [
        await sims("baseline", time_scale=0.0),
        await sims("control", time_scale=0.0, seed=5),
        await sims("bi-kv", time_scale=0.0),
        await sims("fast"),
        await sims("quantized", time_scale=0.0, divergence=0.0),
    ]
    clients = [_openai(s) for s in servers]
    try:
        for i in range(5):
            texts = set()
            for client in clients:
                r = await client.chat.completions.create(
                    model="sim-model",
                    messages=[{"role": "user", "content": f"Explain item {i}"}],
                    temperature=0,
                )
                texts.add(r.choices[0].message.content)
            assert len(texts) == 1
    finally:
        for client in clients:
            await client.close()


async def test_quantized_diverges_from_baseline_at_the_configured_rate(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """Over 200 prompts about 30 % of quantized answers differ from the baseline's; the rest
    are identical, and a rerun gives the same verdict for every prompt."""
    base, quant = await sims("baseline", time_scale=0.0), await sims("quantized", time_scale=0.0)

    async def answer(sim: SimServer, i: int) -> str:
        async with http.post(sim.url + CHAT, json=_chat(f"Prompt {i}: summarise.")) as resp:
            body = await resp.json()
            text: str = body["choices"][0]["message"]["content"]
            return text

    n = 200
    a = await asyncio.gather(*(answer(base, i) for i in range(n)))
    b = await asyncio.gather(*(answer(quant, i) for i in range(n)))
    rate = sum(x != y for x, y in zip(a, b, strict=True)) / n
    assert abs(rate - 0.3) < 0.1
    assert await asyncio.gather(*(answer(quant, i) for i in range(20))) == b[:20]


async def test_bi_kv_reuses_session_kv_and_cuts_ttft_on_later_turns(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """On a growing 6-turn conversation bi-kv reports the previous turns as cached tokens and
    has a lower TTFT than the baseline, which caches nothing."""
    long_question = " ".join(f"detail{i} about the cache and its blocks," for i in range(120))

    async def conversation(sim: SimServer) -> tuple[list[int], list[int], list[float]]:
        messages: list[dict[str, str]] = []
        prompts, cached, ttfts = [], [], []
        for turn in range(6):
            messages.append({"role": "user", "content": f"Turn {turn}. {long_question}"})
            body = {
                "messages": messages,
                "stream": True,
                "max_tokens": 12,
                "stream_options": {"include_usage": True},
            }
            sent = time.perf_counter()
            ttft = None
            raw = b""
            headers = {"X-Session-ID": "conv-1"}
            async with http.post(sim.url + CHAT, json=body, headers=headers) as resp:
                async for data in resp.content.iter_any():
                    raw += data
                    if ttft is None and b'"content":"' in raw.split(b"\n\n", 1)[-1]:
                        ttft = time.perf_counter() - sent
            events = _events(raw)
            assert ttft is not None
            ttfts.append(ttft)
            usage = events[-2]["usage"]
            prompts.append(usage["prompt_tokens"])
            cached.append(usage["prompt_tokens_details"]["cached_tokens"])
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2])
            messages.append({"role": "assistant", "content": text})
        return prompts, cached, ttfts

    (_, base_cached, base_ttft), (prompts, kv_cached, kv_ttft) = await asyncio.gather(
        conversation(await sims("baseline", time_scale=0.3)),
        conversation(await sims("bi-kv", time_scale=0.3)),
    )
    assert base_cached == [0] * 6
    # Turn N holds turn N-1's prompt and its 12 answer tokens: only the new message is prefilled.
    assert kv_cached == [0] + [p + 12 for p in prompts[:-1]]
    # Medians of the later turns: one turn stalled by the host (a 0.4 s pause of this process
    # on a busy CI machine) must not decide a claim about every later turn.
    assert statistics.median(kv_ttft[1:]) < 0.5 * statistics.median(base_ttft[1:])


# --- tools, JSON, errors --------------------------------------------------------------------


async def test_tool_calls_through_the_openai_sdk(sims: Start) -> None:
    """With tools and tool_choice "required" the answer is a tool call, streamed as vLLM does,
    whose arguments are a JSON object matching the non-streamed answer."""
    sim = await sims("baseline", time_scale=0.01)
    client = _openai(sim)
    messages: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    try:
        full = await client.chat.completions.create(
            model="sim-model", messages=messages, tools=[WEATHER_TOOL], tool_choice="required"
        )
        choice = full.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        assert choice.message.tool_calls is not None
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        args = json.loads(call.function.arguments)
        assert isinstance(args["city"], str) and isinstance(args.get("days", 0), int)

        stream = await client.chat.completions.create(
            model="sim-model",
            messages=messages,
            tools=[WEATHER_TOOL],
            tool_choice=named,
            stream=True,
        )
        name, finish = None, None
        fragments: list[str] = []
        ids: set[str] = set()
        async for chunk in stream:
            for tc in chunk.choices[0].delta.tool_calls or ():
                assert tc.index == 0 and tc.function is not None
                name = tc.function.name or name
                if tc.id:
                    ids.add(tc.id)
                fragments.append(tc.function.arguments or "")
            finish = chunk.choices[0].finish_reason or finish
        assert name == "get_weather" and finish == "tool_calls" and ids == {call.id}
        assert fragments[0] == "" and len(fragments) > 3
        assert json.loads("".join(fragments)) == args
    finally:
        await client.close()


async def test_json_object_response_format(sims: Start) -> None:
    """response_format json_object gives a valid JSON object as the message content."""
    sim = await sims("baseline", time_scale=0.01)
    client = _openai(sim)
    try:
        r = await client.chat.completions.create(
            model="sim-model",
            messages=[{"role": "user", "content": "Reply in JSON."}],
            response_format={"type": "json_object"},
        )
    finally:
        await client.close()
    content = r.choices[0].message.content
    assert content is not None and isinstance(json.loads(content), dict)


async def test_unknown_model_is_404_and_bad_requests_are_400(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """An unknown model gets vLLM's 404 NotFoundError; bad JSON or missing messages get an
    OpenAI-shaped 400."""
    sim = await sims("fast")
    async with http.post(sim.url + CHAT, json={**_chat("x"), "model": "gpt-9"}) as resp:
        assert resp.status == 404
        error = (await resp.json())["error"]
    assert error["type"] == "NotFoundError" and error["code"] == 404 and "gpt-9" in error["message"]
    client = _openai(sim)
    try:
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(
                model="nope", messages=[{"role": "user", "content": "x"}]
            )
    finally:
        await client.close()
    for raw in (b"{not json", b'{"model": "sim-model"}', b'{"messages": [], "model": null}'):
        async with http.post(sim.url + CHAT, data=raw) as resp:
            assert resp.status == 400, raw
            error = (await resp.json())["error"]
            assert error["type"] == "BadRequestError" and error["code"] == 400
            assert error["message"]
    async with http.post(sim.url + "/v1/completions", data=b"[]") as resp:
        assert resp.status == 400


# --- faults ---------------------------------------------------------------------------------


async def test_error_500_profile_answers_an_openai_error(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """error-500 answers 500 with an OpenAI error body, which the SDK raises as such."""
    sim = await sims("error-500")
    async with http.post(sim.url + CHAT, json=_chat("x")) as resp:
        assert resp.status == 500
        assert (await resp.json())["error"]["type"] == "InternalServerError"
    client = _openai(sim)
    try:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(
                model="sim-model", messages=[{"role": "user", "content": "x"}]
            )
    finally:
        await client.close()
    assert (await _stats(http, sim))["faulted"] == 2


async def test_hang_profile_never_answers_and_counts_the_abort(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """hang reads the request and never answers; when the client gives up it is counted."""
    sim = await sims("hang")
    with pytest.raises(asyncio.TimeoutError):
        async with http.post(
            sim.url + CHAT, json=_chat("x"), timeout=aiohttp.ClientTimeout(total=0.3)
        ) as resp:
            await resp.read()
    stats = await _wait_for(http, sim, "aborted", 1)
    assert stats["active"] == 0 and stats["completed"] == 0
    async with http.get(sim.url + "/sim/requests") as resp:
        assert (await resp.json())[0]["body_len"] > 0  # it did read the request


async def test_reset_mid_stream_profile_resets_the_connection(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """reset-mid-stream sends headers and a few chunks, then the client sees a TCP reset,
    not a clean end of stream."""
    sim = await sims("reset-mid-stream", time_scale=0.01)
    received: list[bytes] = []
    with pytest.raises(aiohttp.ClientPayloadError) as excinfo:
        async with http.post(sim.url + CHAT, json=_chat("x", stream=True)) as resp:
            assert resp.status == 200
            async for line in resp.content:
                received.append(line)  # noqa: PERF401 - a comprehension loses lines read before the reset
    assert "ConnectionResetError" in str(excinfo.value)  # a reset, not a clean FIN
    events = [line for line in received if line.startswith(b"data: ")]
    assert 2 <= len(events) < 10 and b"data: [DONE]\n" not in received
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(sim.url + CHAT, json=_chat("x")) as resp:
            await resp.read()
    assert (await _stats(http, sim))["faulted"] == 2


async def test_slow_drip_profile_spaces_chunks(sims: Start, http: aiohttp.ClientSession) -> None:
    """slow-drip sends one chunk per slow_drip_s_per_chunk × time_scale, however fast decode is."""
    sim = await sims("slow-drip", time_scale=0.04)  # 40 ms per chunk
    fast = await sims("baseline", time_scale=0.04)  # 0.3 ms per token
    body = _chat("x", stream=True, max_tokens=4)
    elapsed = {}
    for server in (sim, fast):
        started = time.perf_counter()
        async with http.post(server.url + CHAT, json=body) as resp:
            events = _events(await resp.read())
        elapsed[server.profile.name] = time.perf_counter() - started
        assert len(events) == 6  # role, 4 tokens, [DONE]
    # The prefill (which yields the first token) and 3 decode steps take one drip each.
    assert elapsed["slow-drip"] >= 4 * 0.04 > elapsed["baseline"]


async def test_garbage_profile_streams_non_sse_bytes(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """garbage answers 200 text/event-stream whose body holds no SSE event at all."""
    sim = await sims("garbage", time_scale=0.01)
    async with http.post(sim.url + CHAT, json=_chat("x", stream=True)) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        body = await resp.read()
    assert len(body) >= 1024 and b"\n" not in body and b"data:" not in body


async def test_slow_read_profile_reads_slowly_then_answers(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """slow-read takes the body one byte at a time (at least size × per-byte delay) and then
    answers exactly what the baseline answers."""
    slow, base = await sims("slow-read", time_scale=0.05), await sims("fast")
    body = _chat("y" * 300)  # ~370 bytes × 1 ms × 0.05 ≥ 18 ms
    size = len(json.dumps(body))
    started = time.perf_counter()
    async with http.post(slow.url + CHAT, json=body) as resp:
        slow_answer = await resp.json()
    assert time.perf_counter() - started >= size * 0.001 * 0.05
    async with http.post(base.url + CHAT, json=body) as resp:
        base_answer = await resp.json()
    assert slow_answer["choices"] == base_answer["choices"]


# --- disconnects, stats, request log --------------------------------------------------------


async def test_client_disconnect_stops_generation_and_counts_abort(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """A client that closes mid-stream is counted as aborted promptly and frees its slot."""
    sim = await sims("baseline", time_scale=5.0)  # 40 ms per token
    resp = await http.post(sim.url + CHAT, json=_chat("x", stream=True))
    await resp.content.readline()
    assert (await _stats(http, sim))["active"] == 1
    resp.close()
    stats = await _wait_for(http, sim, "aborted", 1, within=0.5)
    assert stats["active"] == 0 and stats["completed"] == 0


async def test_disconnect_is_noticed_without_handler_cancellation() -> None:
    """Even in an app run without handler cancellation, a client leaving a non-streamed request
    during a long prefill is noticed by polling and counted as aborted."""
    profile = get_profile("baseline", overhead_s=10.0, jitter=0.0)
    runner = web.AppRunner(build_sim_app(profile))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(asyncio.TimeoutError):
                await http.post(url + CHAT, json=_chat("x"), timeout=aiohttp.ClientTimeout(0.1))
            deadline = time.monotonic() + 1.0
            while True:
                async with http.get(url + "/sim/stats") as resp:
                    stats = await resp.json()
                if stats["aborted"] == 1:
                    break
                assert time.monotonic() < deadline, stats
                await asyncio.sleep(0.01)
            assert stats["active"] == 0
    finally:
        await runner.cleanup()


async def test_batch_slots_queue_requests_and_stats_track_concurrency(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """With max_num_seqs=2, five concurrent requests never run more than two at a time and
    all complete."""
    sim = await sims("baseline", time_scale=0.05, max_num_seqs=2)

    async def one(i: int) -> None:
        async with http.post(sim.url + CHAT, json=_chat(f"q{i}", max_tokens=8)) as resp:
            assert resp.status == 200

    await asyncio.gather(*(one(i) for i in range(5)))
    stats = await _stats(http, sim)
    assert stats["max_active"] == 2 and stats["completed"] == 5 and stats["requests"] == 5


async def test_request_log_shows_forwarded_headers_and_reset_clears_everything(
    sims: Start, http: aiohttp.ClientSession
) -> None:
    """/sim/requests records method, path, headers, body length and session (at most 200);
    /sim/reset clears the log, the counters and the KV caches."""
    sim = await sims("bi-kv", time_scale=0.0)
    headers = {"X-Session-ID": "s-42", "X-Custom": "kept"}
    body = _chat("hello", max_tokens=3)
    for _ in range(205):
        async with http.post(sim.url + CHAT, json=body, headers=headers) as resp:
            cached = (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > 0
    async with http.get(sim.url + "/sim/requests") as resp:
        log = await resp.json()
    assert len(log) == 200
    entry = log[-1]
    assert entry["method"] == "POST" and entry["path"] == CHAT and entry["session"] == "s-42"
    assert entry["headers"]["X-Custom"] == "kept" and entry["body_len"] == len(json.dumps(body))
    async with http.post(sim.url + "/sim/reset") as resp:
        assert resp.status == 200
    assert (await _stats(http, sim))["requests"] == 0
    async with http.get(sim.url + "/sim/requests") as resp:
        assert await resp.json() == []
    async with http.post(sim.url + CHAT, json=body, headers=headers) as resp:
        assert (await resp.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_streaming_resets_and_disconnects_behave_the_same_on_uvloop() -> None:
    """On uvloop (what `canary sim` runs on) streams, TCP resets and abort counting work too."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        async with (
            await start_sim(get_profile("baseline", time_scale=0.01)) as sim,
            await start_sim(get_profile("reset-mid-stream", time_scale=0.01)) as reset,
            await start_sim(get_profile("baseline", time_scale=5.0)) as slow,
            aiohttp.ClientSession() as http,
        ):
            async with http.post(sim.url + CHAT, json=_chat("x", stream=True)) as resp:
                assert _events(await resp.read())[-1] == "[DONE]"
            with pytest.raises(aiohttp.ClientPayloadError, match="ConnectionResetError"):
                async with http.post(reset.url + CHAT, json=_chat("x", stream=True)) as resp:
                    await resp.read()
            resp = await http.post(slow.url + CHAT, json=_chat("x", stream=True))
            await resp.content.readline()
            resp.close()
            await _wait_for(http, slow, "aborted", 1, within=0.5)

    uvloop.run(scenario())


# --- CLI ------------------------------------------------------------------------------------


def _cli(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "sim", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        **kwargs,
    )


def test_cli_help_lists_every_profile() -> None:
    """`canary sim --help` exits 0 and describes every named profile and the main flags."""
    result = _cli("--help")
    assert result.returncode == 0
    for name in PROFILES:
        assert f"  {name} " in result.stdout
    for flag in ("--port", "--profile", "--host", "--seed", "--time-scale", "--divergence"):
        assert flag in result.stdout


def test_cli_unknown_profile_exits_2_listing_valid_ones() -> None:
    """An unknown profile is a usage error: exit 2 and a message naming the valid profiles."""
    result = _cli("--profile", "nope")
    assert result.returncode == 2
    assert "nope" in result.stderr and "baseline" in result.stderr and "slow-read" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_serves_until_interrupted() -> None:
    """`canary sim --port 0` serves the simulator and exits 0 on Ctrl-C (SIGINT)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "sim", "--port", "0", "--profile", "fast"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "serving sim-model on http://127.0.0.1:" in line, line
        url = line.rsplit(" ", 1)[-1].strip()
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=5)
