"""Whole sessions under overload: when the mirror drops a turn of a session (ring overflow, an
unanswered copy), its later turns are shed and counted `shed_session_broken`, never sent, so
the candidate receives each session's turns as a prefix or not at all."""

from __future__ import annotations

import asyncio

from aiohttp import web

from domain.endpoint import Endpoint
from gateway.mirror.counters import identity_holds
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.tee import Mirror
from tests.mirror.test_mirror_lane import Run, chat, headers, make_mirror, quiesce, run, send
from tests.upstreams import free_port

__all__ = ["run"]  # the fixture, on both event loops


async def _candidate() -> tuple[web.AppRunner, str, list[tuple[str, int]]]:
    """A candidate that logs (session, turn) of each copy it answers."""
    log: list[tuple[str, int]] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        log.append((request.headers["X-Session-ID"], turn))
        await asyncio.sleep(0.001)
        return web.json_response({"choices": [{"index": 0, "message": {"content": "ok"}}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}", log


def _turn(mirror: Mirror, session: str, turn: int) -> None:
    texts = [f"{session} says {k}" for k in range(turn + 1)]
    send(mirror, chat(*texts), f"{session}-{turn}", headers(X_Session_ID=session))


def test_an_overflow_drop_of_a_first_turn_sheds_the_session(run: Run[None]) -> None:
    """A ring of two drops session a's first turn on overflow: a's later turns are shed and
    counted, never sent, while b and c, whose first turns stayed, reach the candidate whole;
    the accounting identity holds."""

    async def scenario() -> None:
        runner, url, log = await _candidate()
        sink = InMemorySink()
        ep = Endpoint(name="kv", url=url, sample_rate=1.0, sampling="session", buffer_max_items=2)
        mirror = make_mirror([ep], sink)  # not started yet: the ring only fills
        try:
            _turn(mirror, "a", 0)
            _turn(mirror, "b", 0)
            _turn(mirror, "c", 0)  # the ring is full: a's first turn is dropped
            _turn(mirror, "a", 1)
            await mirror.start()
            await quiesce(mirror)
            _turn(mirror, "a", 2)
            _turn(mirror, "b", 1)
            await quiesce(mirror)
            c = mirror.counters()["kv"]
            assert identity_holds(c)
            assert (c["sampled"], c["dropped_overflow"], c["shed_session_broken"]) == (6, 1, 2)
            assert c["observed_ok"] == 3
        finally:
            await mirror.close()
            await runner.cleanup()
        assert sorted(log) == [("b", 0), ("b", 1), ("c", 0)]
        # a's first turn was queued (its exchange stored, its copy lost); nothing after it.
        assert sorted(e.turn_index for e in sink.exchanges) == [0, 0, 0, 1]

    run(scenario())


def test_an_unanswered_first_turn_sheds_the_turn_queued_behind_it(run: Run[None]) -> None:
    """A first turn the candidate never answered (connection refused) breaks its session: the
    turn queued behind it and the next one offered are shed and counted, never sent."""

    async def scenario() -> None:
        sink = InMemorySink()
        ep = Endpoint(
            name="kv", url=f"http://127.0.0.1:{free_port()}", sample_rate=1.0, sampling="session"
        )
        mirror = make_mirror([ep], sink)
        try:
            _turn(mirror, "a", 0)
            _turn(mirror, "a", 1)  # waits behind turn 0 in the ring
            await mirror.start()
            await quiesce(mirror)
            _turn(mirror, "a", 2)
            c = mirror.counters()["kv"]
            assert identity_holds(c)
            assert (c["sent"], c["observed_error"], c["shed_session_broken"]) == (1, 1, 2)
        finally:
            await mirror.close()

    run(scenario())
