"""The grader lane in the mirror (gateway.mirror.grading.lane), against a real grader endpoint on
127.0.0.1:0: a pair is graded after both answers, blind and in both orders when swapped, with
the grader's own credential and a JSON-schema response_format; unparseable answers are retried
once and never guessed, a grader that is down costs the copies nothing, and the cap holds. Agent
turns are graded too (a call against a call, a call against text), every pair of a candidate
with a grader leaves one row saying what became of it, and the grading series exist at 0
before any grader."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from aiohttp import web

from domain.endpoint import Endpoint, GraderSpec
from domain.exposition import GRADING_FAMILIES, Sample
from domain.records import GRADING_OUTCOMES
from gateway.config.load import load_config
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.tee import Mirror
from gateway.process.runtime import running
from gateway.server.meter import MeterResult
from tests.mirror.test_mirror_lane import chat, headers, make_mirror, quiesce, sim
from tests.waiting import until

DASHBOARD = Path(__file__).parents[2] / "deploy/grafana/canary-gateway.json"

PRODUCTION_ANSWER = "The parser closes the stream after each line."
KEY_VAR = "CANARY_CANDIDATE_JUDGE_KEY"


class StubGrader:
    """A grader endpoint: prefers the answer that is not production's (mode "fair"), always
    answers A ("first"), answers A after 0.2 s ("slow"), or answers prose ("garbage"); logs
    every request and the most calls it had in flight at once."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.requests: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.url = ""
        self.in_flight = 0
        self.most_in_flight = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        self.auth.append(request.headers.get("Authorization"))
        prompt = body["messages"][0]["content"]
        if self.mode == "slow":
            await asyncio.sleep(0.2)
        if self.mode == "garbage":
            content = "Answer A is clearly better."
        elif self.mode in ("first", "slow"):
            content = '{"winner": "A"}'
        else:
            a = prompt.split("[Answer A]\n", 1)[1].split("\n\n[Answer B]", 1)[0]
            content = json.dumps({"winner": "B" if a == PRODUCTION_ANSWER else "A"})
        return web.json_response(
            {
                "choices": [{"message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 8},
            }
        )


@asynccontextmanager
async def grader_server(mode: str) -> AsyncIterator[StubGrader]:
    stub = StubGrader(mode)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stub.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    stub.url = f"http://127.0.0.1:{port}"
    try:
        yield stub
    finally:
        await runner.cleanup()


def _send(mirror: Mirror, i: int) -> None:
    body = chat(f"question {i} about the stream")
    token = mirror.on_request("POST", "/v1/chat/completions", headers(), body, f"req-{i}")
    assert token is not None
    mirror.on_response(token, MeterResult(status=200, is_sse=False, text=PRODUCTION_ANSWER), None)


async def _settle(mirror: Mirror, sink: InMemorySink, want: int) -> None:
    await quiesce(mirror)
    async with asyncio.timeout(15):
        while len(sink.gradings) < want:
            await asyncio.sleep(0.02)
            await mirror.grading.wait_idle()


async def _run(
    grader: GraderSpec, n: int, want: int, **settings: Any
) -> tuple[InMemorySink, Mirror]:
    upgrade = await sim("baseline")
    sink = InMemorySink()
    ep = Endpoint(name="upgrade", url=upgrade.url, sample_rate=1.0, grader=grader)
    mirror = make_mirror([ep], sink, **settings)
    await mirror.start()
    try:
        for i in range(n):
            _send(mirror, i)
        await _settle(mirror, sink, want)
    finally:
        await mirror.close()
        await upgrade.close()
    return sink, mirror


async def test_pairs_graded_blind_in_both_orders(monkeypatch: pytest.MonkeyPatch) -> None:
    """With swap_rate 1 every pair is graded twice, once with each answer first; the grader
    prefers the candidate's answer and each verdict maps back to the candidate; the grader
    sees a json_schema response_format and its own credential, never the client's."""
    monkeypatch.setenv(KEY_VAR, "judge-secret")
    async with grader_server("fair") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=1.0, credentials_env=KEY_VAR)
        sink, mirror = await _run(spec, 6, 12)
    assert len(sink.gradings) == 12
    by_pair: dict[str, list[Any]] = {}
    for g in sink.gradings:
        by_pair.setdefault(g.exchange_id, []).append(g)
    assert set(by_pair) == {e.id for e in sink.exchanges}
    for pair in by_pair.values():
        assert sorted(g.candidate_first for g in pair) == [False, True]
        assert sorted(g.swapped for g in pair) == [False, True]
        assert all(g.outcome == "graded" and g.winner == "candidate" for g in pair)
        assert all(g.reference == "live" and g.endpoint == "upgrade" for g in pair)
        assert all(g.prompt_tokens == 100 and g.completion_tokens == 8 for g in pair)
        assert all(g.reference_chars == len(PRODUCTION_ANSWER) for g in pair)
    assert all(r["response_format"]["type"] == "json_schema" for r in stub.requests)
    assert stub.auth == ["Bearer judge-secret"] * 12
    c = mirror.grading.counters()["upgrade"]
    assert c["sampled"] == 6 and c["graded"] == 12 and c["calls"] == 12
    assert c["tokens"] == 12 * 108 and c["unparseable"] == c["failed"] == c["dropped"] == 0
    # The copies themselves were observed as usual.
    assert len([o for o in sink.observations if o.endpoint == "upgrade"]) == 6


async def test_unparseable_is_retried_once_never_guessed() -> None:
    """A grader answering prose is asked twice per grading and counted unparseable, with no
    winner and both calls' tokens."""
    async with grader_server("garbage") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0)
        sink, mirror = await _run(spec, 4, 4)
    assert [g.outcome for g in sink.gradings] == ["unparseable"] * 4
    assert all(g.winner is None and g.attempts == 2 for g in sink.gradings)
    assert all(g.prompt_tokens == 200 for g in sink.gradings)
    assert len(stub.requests) == 8
    assert mirror.grading.counters()["upgrade"]["unparseable"] == 4


async def test_grader_down_costs_the_copies_nothing() -> None:
    """A grader nobody listens on: every grading is counted failed, and every copy is still
    observed with status 200."""
    async with grader_server("fair") as stub:
        url = stub.url  # closed when the block ends: nothing listens there any more
    spec = GraderSpec(url=url, model="judge", swap_rate=0.0)
    sink, mirror = await _run(spec, 5, 5)
    assert [g.outcome for g in sink.gradings] == ["failed"] * 5
    assert all(g.error_kind == "connect" for g in sink.gradings)
    copies = [o for o in sink.observations if o.endpoint == "upgrade"]
    assert len(copies) == 5 and all(o.status == 200 for o in copies)
    assert mirror.grading.counters()["upgrade"]["failed"] == 5


async def test_cap_per_minute_holds() -> None:
    """With max_per_minute 3, eight pairs give three grader calls and five gradings counted
    over cap, never sent."""
    async with grader_server("first") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0, max_per_minute=3)
        sink, mirror = await _run(spec, 8, 8)
    outcomes = [g.outcome for g in sink.gradings]
    assert outcomes.count("graded") == 3 and outcomes.count("over_cap") == 5
    assert len(stub.requests) == 3
    c = mirror.grading.counters()["upgrade"]
    assert c["calls"] == 3 and c["over_cap"] == 5
    lines = [x for x in mirror.prometheus_lines() if not isinstance(x, str)]
    names = {getattr(x, "name", None) or x.family.name for x in lines}  # type: ignore[union-attr]
    assert "canary_grading_over_cap_total" in names


async def test_gradings_in_flight_up_to_the_concurrency() -> None:
    """Twelve pairs to a grader that takes 0.2 s a call, at grading_concurrency 4: four calls in
    flight at once, never more, and every pair graded."""
    async with grader_server("slow") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0)
        sink, mirror = await _run(spec, 12, 12, **{"mirror.grading_concurrency": 4})
    assert [g.outcome for g in sink.gradings] == ["graded"] * 12
    assert stub.most_in_flight == 4
    assert mirror.grading.counters()["upgrade"]["calls"] == 12


# An agent turn: tools declared, a call and its result in the history, and the candidate told
# to call `get_weather` (the simulator then calls it with arguments fitting its schema).
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _agent_turn(i: int) -> bytes:
    return msgspec.json.encode(
        {
            "model": "sim-model",
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "messages": [
                {"role": "user", "content": f"Weather in Paris, trip {i}?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
                {"role": "user", "content": "And in Rome?"},
            ],
        }
    )


async def _agent_run(production: MeterResult, n: int) -> tuple[InMemorySink, StubGrader]:
    """`n` agent turns through the mirror to a simulator candidate, graded by a stub."""
    upgrade = await sim("baseline")
    sink = InMemorySink()
    try:
        async with grader_server("first") as stub:
            spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0)
            ep = Endpoint(name="upgrade", url=upgrade.url, sample_rate=1.0, grader=spec)
            mirror = make_mirror([ep], sink)
            await mirror.start()
            try:
                for i in range(n):
                    token = mirror.on_request(
                        "POST", "/v1/chat/completions", headers(), _agent_turn(i), f"req-{i}"
                    )
                    assert token is not None
                    mirror.on_response(token, production, None)
                await _settle(mirror, sink, n)
            finally:
                await mirror.close()
    finally:
        await upgrade.close()
    return sink, stub


def _answers(prompt: str) -> tuple[str, str]:
    a = prompt.split("[Answer A]\n", 1)[1].split("\n\n[Answer B]\n", 1)
    return a[0], a[1].split("\n\nReply with", 1)[0]


async def test_call_turn_graded_through_the_mirror() -> None:
    """Production and the candidate both call a tool: the pair is graded, and the grader sees
    the declared tool, the history's call and result, and each answer's call with canonical
    JSON arguments."""
    production = MeterResult(
        status=200,
        is_sse=False,
        text="",
        finish_reason="tool_calls",
        tool_calls=[("get_weather", '{ "city": "Rome" }', "call_p")],
    )
    sink, stub = await _agent_run(production, 3)
    assert [g.outcome for g in sink.gradings] == ["graded"] * 3
    calls = [o for o in sink.observations if o.endpoint == "upgrade"]
    assert len(calls) == 3 and all(o.tool_calls and "get_weather" in o.tool_calls for o in calls)
    for body, g in zip(stub.requests, sink.gradings, strict=True):
        prompt = body["messages"][0]["content"]
        assert "- get_weather: The current weather of a city." in prompt
        assert 'assistant: [call] get_weather {"city":"Paris"} (id call_1)' in prompt
        assert 'tool [result of call_1]: {"temp": 21}' in prompt
        a, b = _answers(prompt)
        mine = '[call] get_weather {"city":"Rome"}'
        assert (a if not g.candidate_first else b) == mine
        assert (b if not g.candidate_first else a).startswith("[call] get_weather {")
        assert g.reference_chars == len(mine)


async def test_text_against_call_is_graded() -> None:
    """Production answers in text and the candidate calls a tool: the pair is graded, one
    answer the text and the other the call."""
    production = MeterResult(status=200, is_sse=False, text=PRODUCTION_ANSWER)
    sink, stub = await _agent_run(production, 2)
    assert [g.outcome for g in sink.gradings] == ["graded"] * 2
    for body in stub.requests:
        answers = set(_answers(body["messages"][0]["content"]))
        assert PRODUCTION_ANSWER in answers
        assert any(x.startswith("[call] get_weather {") for x in answers)


# Pairs sent: the rate (0.5, by exchange id hash) samples some and leaves some; with 24, at least
# three are sampled (and overflow the queue of 2) in all but ~2 in 100,000 runs.
PAIRS = 24


async def test_every_pair_leaves_one_row_saying_what_became_of_it() -> None:
    """At rate 0.5 with one production failure and a queue of two: each exchange has its
    graded rows or exactly one row with its reason (not sampled, queue full, no answer), and
    the lane's counters agree."""
    async with grader_server("slow") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0, rate=0.5)
        upgrade = await sim("baseline")
        sink = InMemorySink()
        ep = Endpoint(name="upgrade", url=upgrade.url, sample_rate=1.0, grader=spec)
        mirror = make_mirror([ep], sink, **{"mirror.grading_max_pending": 2})
        await mirror.start()
        try:
            for i in range(PAIRS):
                token = mirror.on_request(
                    "POST", "/v1/chat/completions", headers(), chat(f"q {i}"), f"req-{i}"
                )
                assert token is not None
                failed = MeterResult(status=500, is_sse=False, text="")
                ok = MeterResult(status=200, is_sse=False, text=PRODUCTION_ANSWER)
                mirror.on_response(token, failed if i == 0 else ok, None)
            await quiesce(mirror)
            async with asyncio.timeout(15):
                while len({g.exchange_id for g in sink.gradings}) < PAIRS:
                    await asyncio.sleep(0.02)
                    await mirror.grading.wait_idle()
        finally:
            await mirror.close()
            await upgrade.close()
    by_pair: dict[str, list[str]] = {}
    for g in sink.gradings:
        by_pair.setdefault(g.exchange_id, []).append(g.outcome)
    assert set(by_pair) == {e.id for e in sink.exchanges}
    outcomes = [o for rows in by_pair.values() for o in rows]
    assert all(len(rows) == 1 for rows in by_pair.values())  # swap_rate 0: one row a pair
    c = mirror.grading.counters()["upgrade"]
    assert outcomes.count("not_sampled") == PAIRS - c["sampled"] > 0
    assert outcomes.count("queue_full") + outcomes.count("no_answer") == c["dropped"] > 0
    assert outcomes.count("graded") == c["graded"] > 0
    assert set(outcomes) <= {"graded", "not_sampled", "queue_full", "no_answer"}
    unsent = [g for g in sink.gradings if g.outcome not in GRADING_OUTCOMES]
    assert all(g.attempts == 0 and g.winner is None for g in unsent)
    assert {g.error_kind for g in unsent if g.outcome == "no_answer"} <= {"production_failed"}


async def test_a_pair_is_graded_after_a_backlog_and_not_waited_for_when_dropped() -> None:
    """Eight copies offered at once to a ring of five behind one worker (each ~0.3 s): the
    three evicted are not graded, at once (no_answer, not_sent); the five sent are, the last
    queued ~1.2 s, past its timeout_s + answer_wait_s (0.85 s) from the offer."""
    async with grader_server("ok") as stub:
        spec = GraderSpec(url=stub.url, model="judge", swap_rate=0.0, rate=1.0)
        upgrade = await sim("baseline", time_scale=1.0, min_output_tokens=32, max_output_tokens=32)
        sink = InMemorySink()
        ep = Endpoint(
            name="upgrade",
            url=upgrade.url,
            sample_rate=1.0,
            grader=spec,
            concurrency=1,
            timeout_s=0.8,
            buffer_max_items=5,
        )
        mirror = make_mirror([ep], sink, **{"mirror.answer_wait_s": 0.05})
        await mirror.start()
        try:
            for i in range(8):
                _send(mirror, i)
            await _settle(mirror, sink, 8)
        finally:
            await mirror.close()
            await upgrade.close()
    outcomes = sorted(g.outcome for g in sink.gradings)
    assert outcomes == ["graded"] * 5 + ["no_answer"] * 3, outcomes
    assert {g.error_kind for g in sink.gradings if g.outcome == "no_answer"} == {"not_sent"}
    waits = [o.queue_wait_s or 0.0 for o in sink.observations if o.endpoint == "upgrade"]
    assert max(waits) > 0.85, waits  # the last copy waited past timeout_s + answer_wait_s


def test_grading_series_exist_at_zero_before_any_grader() -> None:
    """A mirror with no candidate exports every canary_grading_* family with one series at 0
    (no candidate label), so the board's panels show 0, not "no data"."""
    mirror = make_mirror([], InMemorySink())
    samples = [x for x in mirror.prometheus_lines() if isinstance(x, Sample)]
    zero = {
        s.family.name: (s.labels, s.value)
        for s in samples
        if s.family.name.startswith("canary_grading_")
    }
    assert zero == {f.name: (("",), 0) for f in GRADING_FAMILIES.values()}


async def test_board_grading_series_at_zero_on_metrics_from_start_up(tmp_path: Path) -> None:
    """A gateway started with no candidate serves, on /metrics, every canary_grading_* counter
    the Grafana board queries, each at 0 (the mirror process relays them to the worker)."""
    board = DASHBOARD.read_text(encoding="utf-8")
    queried = set(re.findall(r"canary_grading_[a-z_]+_total", board))
    assert len(queried) >= 5
    config = load_config(
        None,
        environ={},
        overrides={
            "server.listen": "127.0.0.1:0",
            "storage.db_url": f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}",
            "admin.insecure": True,
        },
    )
    async with running(config) as parts, aiohttp.ClientSession() as http:

        async def zeros() -> set[str]:
            async with http.get(parts.url + "/metrics") as resp:
                text = await resp.text()
            return {n for n in queried if re.search(rf"^{n}(\{{[^}}]*\}})? 0$", text, re.M)}

        await until(
            lambda: _all(zeros, queried), what="the board's grading series at 0", within_s=30
        )


async def _all(probe: Callable[[], Awaitable[set[str]]], want: set[str]) -> bool:
    return await probe() == want
