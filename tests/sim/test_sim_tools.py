"""The simulator's tool calls through the official `openai` SDK, and the agent workload's
conversations: parallel calls streamed as vLLM does, ids, `parallel_tool_calls`, `tool_choice`,
broken calls at the configured share (judged by an independent JSON Schema validator), and
contexts that grow as an agent's."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import jsonschema
import openai
import pytest
from aiohttp import web

from gateway.sim.calls import PARALLEL_SHARE
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer, start_sim
from gateway.sim.workload import TOOLS, WorkloadSpec, run_workload

SDK_TOOLS: Any = TOOLS  # Any: the SDK wants its TypedDicts
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with await start_sim(get_profile("baseline", time_scale=0.0)) as server:
        yield server


def _client(sim: SimServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)


def _messages(i: int) -> Any:
    return [{"role": "user", "content": f"Task {i}: find where the cache is flushed."}]


def _invalid(name: str, arguments: str) -> str | None:
    """Why a call breaks its declared schema (an independent validator), or None."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        return "json"
    errors = list(jsonschema.Draft202012Validator(SCHEMAS[name]).iter_errors(args))
    return str(errors[0].validator) if errors else None


async def _streamed(client: openai.AsyncOpenAI, i: int, **extra: Any) -> list[dict[str, Any]]:
    """The calls of a streamed answer, rebuilt by index, with the order of their deltas."""
    stream = await client.chat.completions.create(
        model="sim-model", messages=_messages(i), tools=SDK_TOOLS, stream=True, **extra
    )
    calls: dict[int, dict[str, Any]] = {}
    order: list[int] = []
    async for chunk in stream:
        for tc in chunk.choices[0].delta.tool_calls or ():
            assert tc.function is not None
            if tc.id is not None:  # the call's first delta: its id and name, no arguments
                assert tc.index not in calls and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "fragments": []}
            calls[tc.index]["fragments"].append(tc.function.arguments or "")
            order.append(tc.index)
    assert order == sorted(order)  # one call's name and arguments, then the next call's
    return [calls[k] for k in sorted(calls)]


async def test_parallel_calls_streamed_and_whole_agree(sim: SimServer) -> None:
    """Over 60 prompts with tool_choice "required", about PARALLEL_SHARE of answers make 2-3
    calls; each call has its own `call_` id, its arguments come in many deltas and fit the
    declared schema, and the streamed answer rebuilt by index equals the whole one."""
    client = _client(sim)
    parallel = 0
    try:
        for i in range(60):
            whole = await client.chat.completions.create(
                model="sim-model", messages=_messages(i), tools=SDK_TOOLS, tool_choice="required"
            )
            choice = whole.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            calls = choice.message.tool_calls or []
            assert 1 <= len(calls) <= 3
            parallel += len(calls) > 1
            ids = [c.id for c in calls]
            assert len(set(ids)) == len(ids) and all(x.startswith("call_") for x in ids)
            streamed = await _streamed(client, i, tool_choice="required")
            got = [(c["id"], c["name"], "".join(c["fragments"])) for c in streamed]
            assert got == [(c.id, c.function.name, c.function.arguments) for c in calls]
            for c in streamed:
                assert (
                    len(c["fragments"]) > 3 and _invalid(c["name"], "".join(c["fragments"])) is None
                )
    finally:
        await client.close()
    sd = math.sqrt(PARALLEL_SHARE * (1 - PARALLEL_SHARE) / 60)
    assert abs(parallel / 60 - PARALLEL_SHARE) < 3 * sd, parallel


async def test_parallel_tool_calls_false_and_tool_choice_are_honoured(sim: SimServer) -> None:
    """`parallel_tool_calls: false` gives one call where the same prompts otherwise get several;
    "none" never calls, a named function is the one call, "auto" answers either way."""
    client = _client(sim)
    named: Any = {"type": "function", "function": {"name": "read_file"}}
    kinds: set[str] = set()
    several = 0
    try:
        for i in range(40):
            on = await _streamed(client, i, tool_choice="required")
            off = await _streamed(client, i, tool_choice="required", parallel_tool_calls=False)
            several += len(on) > 1
            assert len(off) == 1 and off[0]["id"] == on[0]["id"]
            none = await client.chat.completions.create(
                model="sim-model", messages=_messages(i), tools=SDK_TOOLS, tool_choice="none"
            )
            assert not none.choices[0].message.tool_calls and none.choices[0].message.content
            assert none.choices[0].finish_reason in ("stop", "length")
            forced = await _streamed(client, i, tool_choice=named)
            assert [c["name"] for c in forced] == ["read_file"]
            auto = await client.chat.completions.create(
                model="sim-model", messages=_messages(i), tools=SDK_TOOLS, tool_choice="auto"
            )
            kinds.add("calls" if auto.choices[0].message.tool_calls else "text")
    finally:
        await client.close()
    assert several > 0 and kinds == {"calls", "text"}


async def _broken(profile: str, n: int, **overrides: Any) -> list[tuple[int, str]]:
    """(prompt index, why) for each of `n` whole answers with an invalid call."""
    out = []
    async with await start_sim(get_profile(profile, time_scale=0.0, **overrides)) as server:
        client = _client(server)
        try:
            for i in range(n):
                answer = await client.chat.completions.create(
                    model="sim-model",
                    messages=_messages(i),
                    tools=SDK_TOOLS,
                    tool_choice="required",
                )
                for c in answer.choices[0].message.tool_calls or ():
                    why = _invalid(c.function.name, c.function.arguments)
                    if why is not None:
                        out.append((i, why))
                        break
        finally:
            await client.close()
    return out


async def test_broken_calls_at_the_configured_share_and_none_at_zero() -> None:
    """With break_calls 0.3, the share of 200 call answers that an independent JSON Schema
    validator rejects is within three binomial sds of 0.3, in several of the ways real models
    break calls, and the same requests again break alike; production's profile breaks none."""
    n, share = 200, 0.3
    broken = await _broken("quantized", n, break_calls=share)
    assert abs(len(broken) / n - share) < 3 * math.sqrt(share * (1 - share) / n), len(broken)
    assert {"json", "required", "type"} <= {why for _, why in broken}
    again = await _broken("quantized", 80, break_calls=share)
    assert again == [(i, why) for i, why in broken if i < 80]
    assert await _broken("baseline", 100) == []


class _Tap:
    """A pass-through in front of the simulator that keeps every chat request body."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.bodies = upstream, []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(json.loads(body))
        headers = {
            "Content-Type": "application/json",
            "X-Session-ID": request.headers["X-Session-ID"],
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(self.upstream + request.path, data=body, headers=headers) as up,
        ):
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp


async def test_a_ten_turn_agent_session_grows_past_16k_tokens_in_openai_format(
    sim: SimServer,
) -> None:
    """Ten-turn workload sessions reach a median of at least 16k prompt tokens (as the simulator
    counts them) at their last turn; every call is appended with its id and answered by one
    `role: "tool"` message naming it before the next turn; only the last turn asks for text."""
    tap = _Tap(sim.url)
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", tap.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        done = await run_workload(url, WorkloadSpec(sessions=8, turns=10, concurrency=8))
    finally:
        await runner.cleanup()
    assert done.errors == 0 and done.requests == 80
    last = [t.prompt_tokens or 0 for t in done.turns if t.turn == 10]
    assert statistics.median(last) >= 16_000, last
    assert sum(t.tool_calls > 0 for t in done.turns) >= 40  # calls in at least half the turns
    for body in tap.bodies:
        assert body["tool_choice"] == ("none" if _turn(body) == 10 else "auto")
        pending: list[str] = []
        for m in body["messages"]:
            if m["role"] == "tool":
                assert m["tool_call_id"] == pending.pop(0) and m["content"]
                continue
            assert not pending  # every call answered before anything else
            pending = [c["id"] for c in m.get("tool_calls") or ()]
        assert not pending


def _turn(body: dict[str, Any]) -> int:
    """The turn of a workload request: one more than the assistant answers it carries."""
    return 1 + sum(m["role"] == "assistant" for m in body["messages"])
