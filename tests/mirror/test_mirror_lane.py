"""Lanes against real candidate servers: fault outcomes, headers, model override, session order.

Every test runs on asyncio's default loop and on uvloop (the `run` fixture), against simulator
or small aiohttp servers on 127.0.0.1 sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import aiohttp
import msgspec
import pytest
import uvloop
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from domain.endpoint import Endpoint
from gateway.config.load import config_from
from gateway.mirror.counters import identity_holds
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.tee import Mirror
from gateway.server.hooks import LiveTarget
from gateway.server.meter import MeterResult
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer, start_sim

T = TypeVar("T")
Run = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run[Any]:
    """Runs a scenario to completion on a fresh loop of the parametrised kind."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def runner(coro: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(coro)

    return runner


def headers(**extra: str) -> CIMultiDictProxy[str]:
    base = {"Content-Type": "application/json", "Authorization": "Bearer client-secret"}
    return CIMultiDictProxy(
        CIMultiDict({**base, **{k.replace("_", "-"): v for k, v in extra.items()}})
    )


def chat(*user_turns: str, stream: bool = False, model: str = "sim-model") -> bytes:
    messages: list[dict[str, str]] = []
    for i, text in enumerate(user_turns):
        if i:
            messages.append({"role": "assistant", "content": f"answer {i}"})
        messages.append({"role": "user", "content": text})
    return msgspec.json.encode({"model": model, "messages": messages, "stream": stream})


def make_mirror(
    candidates: Sequence[Endpoint],
    sink: InMemorySink,
    cpu_busy: float = 0.0,
    **settings: Any,
) -> Mirror:
    # A lenient loop-lag threshold and no CPU signal unless a test sets them: on a busy host a
    # scheduling pause or a tight test loop must not shed the copies a test is about (the guard
    # has its own tests).
    cfg = config_from(
        {
            "server.drain_timeout_s": 2.0,
            "mirror.shed_loop_lag_ms": 2000.0,
            "mirror.shed_cpu_busy": cpu_busy,
            **settings,
        }
    )
    live = LiveTarget(cfg.live.endpoint("http://127.0.0.1:9"))
    mirror = Mirror(
        live,
        sink,
        "test",
        mirror=cfg.mirror,
        upstream=cfg.upstream,
        storage=cfg.storage,
        credentials=cfg.credentials,
        session_header=cfg.server.session_header,
        drain_timeout_s=cfg.server.drain_timeout_s,
    )
    mirror.apply(candidates)
    return mirror


def send(
    mirror: Mirror, body: bytes, rid: str, hdrs: CIMultiDictProxy[str] | None = None
) -> object:
    token = mirror.on_request("POST", "/v1/chat/completions", hdrs or headers(), body, rid)
    if token is not None:
        mirror.on_response(token, MeterResult(status=200, is_sse=False), None)
    return token


async def quiesce(mirror: Mirror) -> None:
    """Wait (bounded) until no lane has a copy queued or in flight."""
    async with asyncio.timeout(10):
        await mirror.wait_idle()


async def sim(profile: str, **knobs: Any) -> SimServer:
    return await start_sim(get_profile(profile, **{"time_scale": 0.05, **knobs}))


async def sim_log(server: SimServer) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/sim/requests") as r:
        log: list[dict[str, Any]] = await r.json()
    return [e for e in log if e["path"].startswith("/v1/")]


FAULTS = [
    ("fast", "observed_ok", None),
    ("error-500", "observed_error", "http_5xx"),
    ("reset-mid-stream", "observed_error", "reset"),
    ("garbage", "observed_error", "garbage"),
    ("slow-read", "observed_ok", None),
    ("hang", "timed_out", "timeout"),
]


@pytest.mark.parametrize(("profile", "counter", "error_kind"), FAULTS)
def test_fault_profiles_are_observed_and_accounted(
    run: Run[None], profile: str, counter: str, error_kind: str | None
) -> None:
    """Each simulator fault ends as the right outcome, with an observation and exact accounting."""

    async def scenario() -> None:
        server = await sim(profile)
        sink = InMemorySink()
        timeout = 0.5 if profile == "hang" else 30.0  # only the hang should time out
        ep = Endpoint(
            name="cand", url=server.url, sample_rate=1.0, timeout_s=timeout, concurrency=2
        )
        mirror = make_mirror([ep], sink)
        await mirror.start()
        try:
            for i in range(4):
                assert send(mirror, chat(f"q{i}", stream=i % 2 == 0), f"r{i}") is not None
            await quiesce(mirror)
            c = mirror.counters()["cand"]
            assert c[counter] == 4 and c["sent"] == 4 and identity_holds(c)
            obs = sink.candidate("cand")
            assert len(obs) == 4 and {o.error_kind for o in obs} == {error_kind}
            assert all(o.queue_wait_s is not None and o.queue_wait_s >= 0 for o in obs)
            exchange_ids = {e.id for e in sink.exchanges}
            assert {o.exchange_id for o in obs} == exchange_ids
        finally:
            await mirror.close()
            await server.close()

    run(scenario())


def test_headers_auth_session_and_mirror_marker(
    run: Run[None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client auth never reaches a candidate; its own token, the session and X-Canary-Mirror do."""
    monkeypatch.setenv("CANARY_CANDIDATE_TEST_TOKEN", "cand-secret")

    async def scenario() -> None:
        a, b, c = await sim("fast"), await sim("fast"), await sim("fast")
        sink = InMemorySink()
        mirror = make_mirror(
            [
                Endpoint(name="plain", url=a.url, sample_rate=1.0),
                Endpoint(
                    name="creds",
                    url=b.url,
                    sample_rate=1.0,
                    credentials_env="CANARY_CANDIDATE_TEST_TOKEN",
                ),
                Endpoint(name="fwd", url=c.url, sample_rate=1.0, forward_auth=True),
            ],
            sink,
        )
        await mirror.start()
        try:
            send(mirror, chat("hello"), "r1", headers(X_Session_ID="sess-42", Accept_Encoding="br"))
            await quiesce(mirror)
            (exchange,) = sink.exchanges
            logs = [await sim_log(s) for s in (a, b, c)]
        finally:
            await mirror.close()
            for s in (a, b, c):
                await s.close()
        auths = []
        for (entry,) in logs:
            h = {k.lower(): v for k, v in entry["headers"].items()}
            assert h["x-session-id"] == "sess-42"
            assert h["x-canary-mirror"] == exchange.id
            assert "br" not in h.get("accept-encoding", "")
            auths.append(h.get("authorization"))
        assert auths == [None, "Bearer cand-secret", "Bearer client-secret"]

    run(scenario())


def test_model_override_and_loop_marker(run: Run[None]) -> None:
    """A candidate's `model` replaces the copy's model, and a marked request is not mirrored."""

    async def scenario() -> None:
        seen: list[dict[str, Any]] = []

        async def handler(request: web.Request) -> web.Response:
            seen.append(await request.json())
            return web.json_response({"choices": [{"index": 0, "message": {"content": "ok"}}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        sink = InMemorySink()
        mirror = make_mirror([Endpoint(name="m", url=url, sample_rate=1.0, model="other")], sink)
        await mirror.start()
        try:
            send(mirror, chat("x", model="prod-model"), "r1")
            assert send(mirror, chat("y"), "r2", headers(X_Canary_Mirror="abc")) is None
            await quiesce(mirror)
            assert mirror.process_counters()["skipped_loop"] == 1
        finally:
            await mirror.close()
            await runner.cleanup()
        assert [s["model"] for s in seen] == ["other"]
        assert sink.exchanges[0].model == "prod-model"

    run(scenario())


async def _ordering_server() -> tuple[web.AppRunner, str, list[tuple[str, int, str]], list[int]]:
    log: list[tuple[str, int, str]] = []
    active: dict[str, int] = {}
    worst = [0]

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        session = request.headers["X-Session-ID"]
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        active[session] = active.get(session, 0) + 1
        worst[0] = max(worst[0], active[session])
        log.append((session, turn, "start"))
        await asyncio.sleep(0.02)
        log.append((session, turn, "end"))
        active[session] -= 1
        return web.json_response({"choices": [{"index": 0, "message": {"content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", log, worst


def test_session_copies_reach_the_candidate_in_order(run: Run[None]) -> None:
    """Turns of one session are sent one at a time, in order, even with spare concurrency."""

    async def scenario() -> None:
        runner, url, log, worst = await _ordering_server()
        sink = InMemorySink()
        ep = Endpoint(name="kv", url=url, sample_rate=1.0, sampling="session", concurrency=4)
        mirror = make_mirror([ep], sink)
        await mirror.start()
        sessions = [f"s{i}" for i in range(5)]
        try:
            for turn in range(4):  # every session's turn k arrives before any turn k finished
                for s in sessions:
                    texts = [f"{s} message {k}" for k in range(turn + 1)]
                    send(mirror, chat(*texts), f"{s}-{turn}", headers(X_Session_ID=s))
            await quiesce(mirror)
            assert identity_holds(mirror.counters()["kv"])
        finally:
            await mirror.close()
            await runner.cleanup()
        assert worst[0] == 1
        for s in sessions:
            events = [(turn, what) for sess, turn, what in log if sess == s]
            assert events == [(t, w) for t in range(4) for w in ("start", "end")]

    run(scenario())


def test_event_stream_is_told_by_the_media_type() -> None:
    """The lane meters a copy as SSE when the Content-Type's media type is text/event-stream,
    whatever its case and parameters, as aiohttp's `content_type` would say."""
    from gateway.mirror.replay.lane import is_event_stream

    assert is_event_stream("text/event-stream")
    assert is_event_stream("Text/Event-Stream; charset=utf-8")
    assert is_event_stream(" text/event-stream ;x=1")
    assert not is_event_stream("application/json")
    assert not is_event_stream("text/event-streams")
    assert not is_event_stream("")
    assert not is_event_stream(None)


class _KeepAliveServer:
    """A raw HTTP/1.1 candidate: answers on the same connection until the client closes it;
    never answers a request whose body contains `hang`, and stops half-way through the body of
    one that contains `stall`. Records which connection carried each request and when the
    client closed each connection."""

    def __init__(self) -> None:
        self.requests: list[int] = []  # connection number of each request, in order
        self.closed: set[int] = set()
        self.changed = asyncio.Event()
        self._count = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._count += 1
        conn = self._count
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                self.requests.append(conn)
                if b"stall" in body:  # headers and half the body, then nothing
                    writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"choices"')
                    await writer.drain()
                if b"hang" in body or b"stall" in body:
                    await reader.read()  # wait for the client to give up
                    break
                answer = b'{"choices":[{"index":0,"message":{"content":"ok"}}]}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.add(conn)
            self.changed.set()
            writer.close()

    async def wait(self, predicate: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()


def test_copies_reuse_the_lanes_connection_and_a_timed_out_one_is_dropped(
    run: Run[None],
) -> None:
    """The lane's pool keeps one connection alive across copies; a copy past its timeout, before
    the answer's headers or in the middle of its body, drops its connection (the candidate sees
    it closed, counted as timed out) and the next copy opens a new one; closing the lane closes
    its idle connections."""

    async def scenario() -> None:
        cand = _KeepAliveServer()
        server = await asyncio.start_server(cand.handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sink = InMemorySink()
        ep = Endpoint(
            name="ka", url=f"http://127.0.0.1:{port}", sample_rate=1.0, timeout_s=0.5,
            concurrency=1,
        )  # fmt: skip
        # Counting tokens would add /tokenize requests to the connection this test counts.
        mirror = make_mirror([ep], sink, **{"mirror.token_counter": "off"})
        await mirror.start()
        try:
            for i in range(3):
                send(mirror, chat(f"q{i}"), f"r{i}")
                await quiesce(mirror)
            assert cand.requests == [1, 1, 1] and not cand.closed
            send(mirror, chat("hang"), "r-hang")
            await quiesce(mirror)
            await cand.wait(lambda: 1 in cand.closed)
            send(mirror, chat("after"), "r-after")
            await quiesce(mirror)
            send(mirror, chat("stall"), "r-stall")
            await quiesce(mirror)
            await cand.wait(lambda: 2 in cand.closed)
            send(mirror, chat("last"), "r-last")
            await quiesce(mirror)
            assert cand.requests == [1, 1, 1, 1, 2, 2, 3]
            c = mirror.counters()["ka"]
            assert (c["sent"], c["observed_ok"], c["timed_out"]) == (7, 5, 2)
            assert identity_holds(c)
            kinds = sorted(str(o.error_kind) for o in sink.candidate("ka"))
            assert kinds == ["None"] * 5 + ["timeout"] * 2
        finally:
            await mirror.close()
        await cand.wait(lambda: 3 in cand.closed)
        server.close()
        await server.wait_closed()

    run(scenario())
