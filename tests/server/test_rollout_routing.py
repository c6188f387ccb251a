"""The ramp on the proxy's path: sticky arms by session, production covering a candidate's early
failures, the guard's rollback, the evidence records and the metrics, on real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import openai
import pytest
import pytest_asyncio
from aiohttp import web

from domain.outcomes import ErrorKind
from domain.records import RolloutRequest
from gateway.config.load import config_from
from gateway.rollout.arms import ArmGuard, ArmRouter, SessionArms, Split
from gateway.rollout.route import session_hash
from gateway.server.app import ROLLOUT_ROUTE, RunningGateway, start_gateway
from gateway.server.hooks import LiveTarget
from tests import fixtures_net
from tests.fixtures_net import Served
from tests.upstreams import free_port, raw_upstream, rst

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy

CHAT = "/v1/chat/completions"
GENERATION = 4  # a stored rollout id 2, open


def completion(model: str) -> dict[str, object]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def named_upstream(name: str, status: int = 200) -> web.Application:
    """An OpenAI-shaped upstream that names itself in `model` and in X-Upstream."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if status != 200:
            return web.json_response({"error": "down"}, status=status)
        if not body.get("stream"):
            return web.json_response(completion(name), headers={"X-Upstream": name})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Upstream": name})
        await resp.prepare(request)
        for word in ("a", "b"):
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": name,
                "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}],
            }
            await resp.write(b"data: " + msgspec.json.encode(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post(CHAT, chat)
    return app


class Sink:
    """A RolloutSink keeping every record."""

    def __init__(self) -> None:
        self.records: list[RolloutRequest] = []

    def put_rollout(self, request: RolloutRequest) -> None:
        self.records.append(request)


class Trips:
    """A RolloutGuard keeping every trip."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, dict[str, object]]] = []

    def trip(self, generation: int, reason: str, evidence: dict[str, object]) -> None:
        self.calls.append((generation, reason, evidence))


class Tee:
    """A RequestTee recording which requests it was offered."""

    def __init__(self) -> None:
        self.sessions: list[str] = []

    def on_request(self, method: str, path_qs: str, headers: Any, body: bytes, rid: str) -> None:
        self.sessions.append(headers.get("X-Session-ID", ""))

    def on_response(self, token: object, result: object, error_kind: str | None) -> None:
        raise AssertionError("no token was handed out")


class RolloutGateway:
    """A gateway with a router, its sink and its guard hook."""

    def __init__(self, gw: RunningGateway, router: ArmRouter, sink: Sink, trips: Trips) -> None:
        self.gw = gw
        self.router = router
        self.sink = sink
        self.trips = trips
        self.url = gw.url

    def start(self, candidate_url: str, weight: float, salt: int = 7) -> Split:
        cfg = self.gw.app[ROLLOUT_ROUTE]  # the route exists: the router is wired into the proxy
        assert cfg.router is self.router
        endpoint = config_from({"live_url": candidate_url}).live.endpoint(candidate_url)
        rollout = Split(GENERATION, salt, weight, LiveTarget(endpoint), "ramping")
        self.router.swap(rollout)
        return rollout


@pytest_asyncio.fixture
async def rollout_gateway(
    tmp_path: Path,
) -> AsyncIterator[Callable[..., Awaitable[RolloutGateway]]]:
    """`await ramp(production_url, tee=None, **config)` -> a gateway whose router is idle."""
    opened: list[tuple[RunningGateway, SessionArms]] = []

    async def _open(live_url: str, tee: Any = None, **config: Any) -> RolloutGateway:
        cfg = config_from({"listen": "127.0.0.1:0", "live_url": live_url, **config})
        table = SessionArms.create(str(tmp_path / f"arms-{len(opened)}"), slots=1 << 12)
        router = ArmRouter(table)
        sink, trips = Sink(), Trips()
        gw = await start_gateway(
            cfg, tee=tee, router=router, rollout_sink=sink, rollout_guard=trips
        )
        opened.append((gw, table))
        return RolloutGateway(gw, router, sink, trips)

    yield _open
    for gw, table in reversed(opened):
        await gw.close()
        table.close()


async def upstreams(serve: Callable[..., Awaitable[Served]]) -> tuple[str, str]:
    prod = await serve(named_upstream("production"))
    cand = await serve(named_upstream("candidate"))
    return prod.url, cand.url


async def metric_lines(url: str, prefix: str) -> list[str]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        return [line for line in (await resp.text()).splitlines() if line.startswith(prefix)]


async def served_by(client: openai.AsyncOpenAI, session: str) -> str:
    reply = await client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"X-Session-ID": session},
    )
    return reply.model


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


async def test_sessions_keep_their_arm_while_new_ones_follow_the_weight(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """Sessions first seen at 25 % keep their upstream at 50 %, and new sessions split ~50 %."""
    prod, cand = await upstreams(serve)
    r = await rollout_gateway(prod)
    rollout = r.start(cand, 0.25)
    async with sdk(r.url) as client:
        first = {f"old-{i}": await served_by(client, f"old-{i}") for i in range(120)}
        assert 0.1 < sum(v == "candidate" for v in first.values()) / len(first) < 0.4
        r.router.swap(rollout.step(0.5))
        again = {key: await served_by(client, key) for key in first}
        assert again == first
        new = [await served_by(client, f"new-{i}") for i in range(300)]
    assert 0.38 < new.count("candidate") / len(new) < 0.62


async def test_rollback_sends_every_session_to_production_at_once(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """After a rollback, sessions that were on the candidate are served by production."""
    prod, cand = await upstreams(serve)
    r = await rollout_gateway(prod)
    rollout = r.start(cand, 0.5)
    async with sdk(r.url) as client:
        seen = {f"s-{i}": await served_by(client, f"s-{i}") for i in range(40)}
        assert "candidate" in seen.values()
        r.router.swap(rollout.rolled_back())
        after = {key: await served_by(client, key) for key in seen}
    assert set(after.values()) == {"production"}


@pytest.mark.parametrize("failure", ["refused", "status_500", "reset"])
async def test_candidate_failing_before_the_first_byte_is_covered_by_production(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
    failure: str,
) -> None:
    """A candidate that refuses, answers 500 or resets before answering: the client gets
    production's 200, counted as a fallback and recorded as the candidate's failure."""
    prod = (await serve(named_upstream("production"))).url

    async def reset(head: bytes, writer: asyncio.StreamWriter) -> None:
        rst(writer)

    async with raw_upstream(reset) as reset_url:
        cand = {
            "refused": f"http://127.0.0.1:{free_port()}",
            "status_500": (await serve(named_upstream("candidate", status=500))).url,
            "reset": reset_url,
        }[failure]
        r = await rollout_gateway(prod)
        r.start(cand, 1.0)
        async with sdk(r.url) as client:
            assert await served_by(client, "one") == "production"
    reason, status, kind = {
        "refused": ("connect", 0, ErrorKind.CONNECT),
        "status_500": ("status_5xx", 500, ErrorKind.HTTP_5XX),
        "reset": ("reset", 0, ErrorKind.RESET),
    }[failure]
    assert f'canary_rollout_fallbacks_total{{reason="{reason}"}} 1' in await metric_lines(
        r.url, "canary_rollout_fallbacks_total"
    )
    requests = await metric_lines(r.url, "canary_rollout_requests_total")
    assert 'canary_rollout_requests_total{arm="candidate",outcome="fallback"} 1' in requests
    assert 'canary_rollout_requests_total{arm="production",outcome="ok"} 0' in requests
    [rec] = r.sink.records
    assert (rec.generation, rec.arm, rec.session, rec.status, rec.error_kind) == (
        GENERATION, 1, session_hash("one"), status, kind,
    )  # fmt: skip
    assert rec.ttft_s is None and rec.e2e_s is not None and rec.e2e_s > 0 and not rec.finished
    assert r.trips.calls == []


async def test_without_retry_the_client_sees_the_candidates_failure(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """With retry_on_production off, a candidate's 500 reaches the client and counts as error."""
    prod = (await serve(named_upstream("production"))).url
    cand = (await serve(named_upstream("candidate", status=500))).url
    r = await rollout_gateway(prod, **{"rollout.retry_on_production": False})
    r.start(cand, 1.0)
    async with (
        aiohttp.ClientSession() as http,
        http.post(r.url + CHAT, json={}, headers={"X-Session-ID": "a"}) as resp,
    ):
        assert resp.status == 500
    requests = await metric_lines(r.url, "canary_rollout_requests_total")
    assert 'canary_rollout_requests_total{arm="candidate",outcome="error"} 1' in requests
    rec = r.sink.records[0]
    assert (rec.status, rec.error_kind) == (500, ErrorKind.HTTP_5XX)


async def test_candidate_dying_mid_stream_cuts_the_client(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """A candidate that resets after its first event: the client's stream is cut, never ended
    cleanly, and the record says reset, unfinished."""
    prod = (await serve(named_upstream("production"))).url

    async def one_event_then_reset(head: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.sleep(0.05)
        rst(writer)

    async with raw_upstream(one_event_then_reset) as cand:
        r = await rollout_gateway(prod)
        r.start(cand, 1.0)
        async with (
            aiohttp.ClientSession() as http,
            http.post(r.url + CHAT, json={"stream": True}, headers={"X-Session-ID": "a"}) as resp,
        ):
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
    [rec] = r.sink.records
    assert rec.arm == 1 and rec.error_kind == ErrorKind.RESET and rec.finished is False
    assert rec.ttft_s is not None and rec.ttft_s > 0  # the first token arrived before the cut
    assert 'canary_rollout_fallbacks_total{reason="reset"} 0' in await metric_lines(
        r.url, "canary_rollout_fallbacks_total"
    )


async def test_guard_trips_once_after_consecutive_failures(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """Three consecutive candidate failures roll this worker back at once and call trip once;
    later requests go straight to production."""
    prod = (await serve(named_upstream("production"))).url
    r = await rollout_gateway(prod, **{"rollout.guard_consecutive_failures": 3})
    r.start(f"http://127.0.0.1:{free_port()}", 1.0)
    async with sdk(r.url) as client:
        models = [await served_by(client, f"s-{i}") for i in range(6)]
    assert models == ["production"] * 6
    [(generation, reason, evidence)] = r.trips.calls
    assert (generation, reason) == (GENERATION, "guard_consecutive")
    assert evidence["consecutive_failures"] == 3
    assert r.router.rollout.state == "rolled_back"
    assert r.router.rollout.generation == GENERATION + 1
    assert 'canary_rollout_fallbacks_total{reason="connect"} 3' in await metric_lines(
        r.url, "canary_rollout_fallbacks_total"
    )
    assert 'canary_rollout_rollbacks_total{reason="guard_consecutive"} 1' in await metric_lines(
        r.url, "canary_rollout_rollbacks_total"
    )
    assert len(r.sink.records) == 3  # the rolled-back generation records nothing


async def test_sink_gets_one_record_per_request_with_its_arm(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """Each request of an open rollout, streamed or not, gives one record naming the arm that
    served it, its session hash, its TTFT and E2E, and that it finished."""
    prod, cand = await upstreams(serve)
    r = await rollout_gateway(prod)
    r.start(cand, 0.5)
    served: list[tuple[str, int]] = []
    async with aiohttp.ClientSession() as http:
        for i in range(30):
            key = f"s-{i}"
            async with http.post(
                r.url + CHAT, json={"stream": i % 2 == 0}, headers={"X-Session-ID": key}
            ) as resp:
                await resp.read()
                served.append((key, int(resp.headers["X-Upstream"] == "candidate")))
    assert {arm for _, arm in served} == {0, 1}
    assert len(r.sink.records) == len(served)
    for (key, arm), rec in zip(served, r.sink.records, strict=True):
        assert (rec.generation, rec.arm, rec.session, rec.status, rec.error_kind) == (
            GENERATION, arm, session_hash(key), 200, None,
        )  # fmt: skip
        assert rec.ttft_s is not None and rec.e2e_s is not None
        assert 0 < rec.ttft_s <= rec.e2e_s and rec.finished and rec.at > 0


async def test_only_production_arm_requests_reach_the_tee(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """The mirror's tee is offered production-arm requests only, never the candidate's own."""
    prod, cand = await upstreams(serve)
    tee = Tee()
    r = await rollout_gateway(prod, tee=tee)
    r.start(cand, 0.5)
    async with sdk(r.url) as client:
        models = {f"s-{i}": await served_by(client, f"s-{i}") for i in range(30)}
    on_production = [key for key, model in models.items() if model == "production"]
    assert tee.sessions == on_production and 0 < len(on_production) < 30


async def test_rollout_metrics_are_exported_at_zero_from_start(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """Before any rollout, every rollout series is exported: weight 0, state idle, counts 0."""
    r = await rollout_gateway((await serve(named_upstream("production"))).url)
    lines = await metric_lines(r.url, "canary_rollout_")
    for expected in (
        "canary_rollout_weight 0",
        'canary_rollout_state{state="idle"} 1',
        'canary_rollout_state{state="ramping"} 0',
        'canary_rollout_state{state="rolled_back"} 0',
        'canary_rollout_rollbacks_total{reason="harm"} 0',
        'canary_rollout_rollbacks_total{reason="guard_burst"} 0',
        'canary_rollout_rollbacks_total{reason="operator"} 0',
        'canary_rollout_requests_total{arm="production",outcome="ok"} 0',
        'canary_rollout_requests_total{arm="candidate",outcome="fallback"} 0',
        'canary_rollout_fallbacks_total{reason="timeout"} 0',
        'canary_rollout_sessions_total{kind="new"} 0',
        'canary_rollout_sessions_total{kind="evicted"} 0',
        'canary_rollout_sessions_total{kind="reclaimed"} 0',
    ):
        assert expected in lines, expected


def test_guard_trips_on_a_burst_once_per_generation() -> None:
    """Failures spread among successes trip the burst guard at the burst count, once per
    generation, and a new generation starts from a clean window."""
    guard = ArmGuard(consecutive=5, window=10, burst=3)
    outcomes = [True, False, True, False, False, True]
    reasons = [guard.observe(4, failed) for failed in outcomes]
    assert reasons == [None, None, None, None, None, "guard_burst"]
    assert guard.evidence()["window_failures"] == 3
    assert guard.observe(4, True) is None  # tripped already for generation 4
    assert [guard.observe(6, True) for _ in range(3)] == [None, None, "guard_burst"]
    assert guard.tripped == 2


def test_guard_forgets_failures_that_left_the_window() -> None:
    """A failure older than the window no longer counts toward a burst."""
    guard = ArmGuard(consecutive=5, window=4, burst=2)
    assert [guard.observe(0, f) for f in (True, False, False, False, False, True)] == [None] * 6
    assert guard.observe(0, True) == "guard_burst"


def test_an_older_generations_outcome_leaves_the_newer_guard_alone() -> None:
    """A candidate stream of an older rollout that ends after a newer one began is not counted:
    it neither resets the newer generation's streak nor trips it."""
    guard = ArmGuard(consecutive=3, window=10, burst=10)
    assert [guard.observe(6, True) for _ in range(2)] == [None, None]
    assert guard.observe(4, False) is None  # generation 4's last stream, finishing late
    assert guard.observe(4, True) is None
    assert guard.observe(6, True) == "guard_consecutive"  # the streak of 6 was kept: 3 in a row
    assert guard.tripped == 1


async def test_a_session_id_that_is_not_utf8_is_routed_by_its_bytes(
    rollout_gateway: Callable[..., Awaitable[RolloutGateway]],
    serve: Callable[..., Awaitable[Served]],
) -> None:
    """An `X-Session-ID` (and `X-Request-Id`) holding bytes that are not UTF-8 is hashed by its
    wire bytes: the request is answered (no 500, no traceback), and the session stays on one
    arm."""
    prod, cand = await upstreams(serve)
    r = await rollout_gateway(prod)
    r.start(cand, 0.5)
    host, port = r.url.removeprefix("http://").split(":")
    body = msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    served = set()
    for _ in range(3):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Type: application/json\r\nX-Session-ID: caf\xe9-\xff\r\n"
            b"X-Request-Id: r\xfe1\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        raw = await asyncio.wait_for(reader.read(), 20.0)
        writer.close()
        assert raw.split(b" ", 2)[1] == b"200", raw[:300]
        served.add(msgspec.json.decode(raw.partition(b"\r\n\r\n")[2])["model"])
    assert len(served) == 1
