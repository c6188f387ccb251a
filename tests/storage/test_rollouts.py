"""Rollouts on SQLite and PostgreSQL: start, transitions and reads are durable; every refusal
leaves the state as it was; racing replicas open one rollout at most; complete promotes in the
same transaction; and on PostgreSQL a listener sees another engine's changes."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound, PromotionConflict, UsageError
from domain.records import DEFAULT_STEPS, Rollout, check_steps
from storage import queries
from storage.engine import make_engine, upgrade
from storage.rollouts import (
    EVENTS_KEPT,
    ListenStats,
    current_rollout,
    listen,
    start_rollout,
    transition,
)
from tests.fixtures_db import fresh_database, terminate_backends
from tests.waiting import SETTLE_S

LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")


def cand(name: str, **kw: object) -> Endpoint:
    return Endpoint(name=name, url=f"http://127.0.0.1:9100/{name}", **kw)  # type: ignore[arg-type]


async def start(engine: AsyncEngine, name: str = "a", **kw: object) -> Rollout:
    args: dict[str, object] = {
        "candidate": name,
        "steps": DEFAULT_STEPS,
        "min_step_s": 60.0,
        "actor": "alice",
        "reason": "verdict promote",
    }
    args.update(kw)
    return await start_rollout(engine, **args)  # type: ignore[arg-type]


async def roles(engine: AsyncEngine) -> dict[str, str]:
    _, endpoints = await queries.load_endpoints(engine)
    return {ep.name: ep.role for ep in endpoints}


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ((), "empty"),
        ((5.0, 1.0, 100.0), "not strictly increasing"),
        ((5.0, 5.0, 100.0), "not strictly increasing"),
        ((0.0, 100.0), "outside"),
        ((50.0, 101.0), "outside"),
        ((float("nan"), 100.0), "outside"),
        ((1.0, 50.0), "not 100"),
        (tuple(float(i) for i in range(80, 101)), "more than 20"),
    ],
)
def test_check_steps_names_the_problem(steps: tuple[float, ...], problem: str) -> None:
    """check_steps refuses each kind of bad ramp with a UsageError naming what is wrong."""
    with pytest.raises(UsageError, match=problem):
        check_steps(steps)


def test_check_steps_accepts_the_default_and_a_single_step() -> None:
    """The default ramp and a one-step ramp straight to 100 are valid."""
    check_steps(DEFAULT_STEPS)
    check_steps([100.0])


async def test_round_trip_survives_restart(migrated_db_url: str) -> None:
    """Start, pause, resume and advance are committed: a new engine reads the same rollout,
    its generation one higher per change and one event per change, oldest first."""
    engine = make_engine(migrated_db_url)
    try:
        await queries.seed(engine, LIVE, [cand("a")])
        first = await start(engine, evidence={"verdict": "promote"})
        assert (first.state, first.weight, first.step, first.live) == ("running", 1.0, 0, "prod")
        assert first.steps == list(DEFAULT_STEPS) and len(first.salt) == 16
        await transition(engine, kind="pause", actor="bob", reason="lunch")
        await transition(engine, kind="resume", actor="bob", reason="back")
        last = await transition(engine, kind="advance", actor="ramp", reason="dwell passed")
    finally:
        await engine.dispose()
    engine = make_engine(migrated_db_url)
    try:
        got = await current_rollout(engine)
    finally:
        await engine.dispose()
    assert got == last
    assert (got.state, got.weight, got.step, got.generation) == (
        "running",
        5.0,
        1,
        first.generation + 3,
    )
    assert [e.kind for e in got.events] == ["start", "pause", "resume", "advance"]
    assert got.events[0].evidence == {"verdict": "promote"} and got.events[1].actor == "bob"
    assert (got.events[-1].from_weight, got.events[-1].to_weight) == (1.0, 5.0)
    assert got.step_started_at >= first.step_started_at and got.salt == first.salt


async def test_no_rollout_reads_none(db_engine: AsyncEngine) -> None:
    """With no rollout ever started, current_rollout is None."""
    assert await current_rollout(db_engine) is None


async def test_reads_return_the_newest_events_oldest_first(db_engine: AsyncEngine) -> None:
    """With more than EVENTS_KEPT events stored, a read returns the newest EVENTS_KEPT, oldest
    first, ending with the latest transition."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    opened = await start(db_engine)
    async with db_engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO rollout_events (rollout_id, at, kind, from_weight, to_weight, step, "
                "actor, reason) VALUES (:r, :at, 'pause', 1, 1, 0, 'bulk', :why)"
            ),
            [{"r": opened.id, "at": float(i), "why": str(i)} for i in range(EVENTS_KEPT + 5)],
        )
    paused = await transition(db_engine, kind="pause", actor="bob", reason="last")
    assert len(paused.events) == EVENTS_KEPT
    assert [e.reason for e in paused.events[-3:]] == [str(EVENTS_KEPT + 3), str(EVENTS_KEPT + 4),
                                                      "last"]  # fmt: skip
    assert await current_rollout(db_engine) == paused


async def test_start_refusals_change_nothing(db_engine: AsyncEngine) -> None:
    """Unknown, live, retired and paused candidates, bad steps or dwell, and a second open
    rollout are refused with their reason codes, and the stored rollout is left as it was."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b"), cand("p", state="paused")])
    await queries.update_endpoint(db_engine, "b", {"role": "retired"})
    with pytest.raises(EndpointNotFound):
        await start(db_engine, "zzz")
    reasons = {}
    for name in ("prod", "b", "p"):
        with pytest.raises(PromotionConflict) as info:
            await start(db_engine, name)
        reasons[name] = info.value.reason
    assert reasons == {"prod": "not_a_candidate", "b": "not_a_candidate", "p": "candidate_paused"}
    with pytest.raises(UsageError, match="not 100"):
        await start(db_engine, steps=(1.0, 50.0))
    with pytest.raises(UsageError, match="min_step_s"):
        await start(db_engine, min_step_s=-1.0)
    assert await current_rollout(db_engine) is None
    opened = await start(db_engine, "a")
    await queries.update_endpoint(db_engine, "b", {"role": "candidate"})
    with pytest.raises(PromotionConflict, match=r"rollout \d+ of 'a'") as info:
        await start(db_engine, "b")
    assert info.value.reason == "rollout_open"
    assert await current_rollout(db_engine) == opened


async def test_transition_refusals_change_nothing(db_engine: AsyncEngine) -> None:
    """Transitions with no open rollout, resume of a running one, pause or advance of a paused
    one, advance past the last step and complete below 100 % are refused with reason codes;
    the rollout (generation, events) is unchanged by each."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    with pytest.raises(PromotionConflict) as none_open:
        await transition(db_engine, kind="pause", actor="bob", reason="r")
    assert none_open.value.reason == "no_open_rollout"
    await start(db_engine, steps=(50.0, 100.0))

    async def refused(kind: str) -> str:
        before = await current_rollout(db_engine)
        with pytest.raises(PromotionConflict) as info:
            await transition(db_engine, kind=kind, actor="bob", reason="r")  # type: ignore[arg-type]
        assert await current_rollout(db_engine) == before
        return info.value.reason

    assert await refused("resume") == "not_paused"
    assert await refused("complete") == "not_at_full_weight"
    await transition(db_engine, kind="pause", actor="bob", reason="r")
    assert await refused("pause") == "not_running"
    assert await refused("advance") == "not_running"
    await transition(db_engine, kind="resume", actor="bob", reason="r")
    await transition(db_engine, kind="advance", actor="bob", reason="r")
    assert await refused("advance") == "last_step"
    await transition(db_engine, kind="abort", actor="bob", reason="r")
    assert await refused("resume") == "no_open_rollout"


async def test_compare_and_set_on_generation(db_engine: AsyncEngine) -> None:
    """A transition against a stale generation is refused ('rollout_changed'); against the
    current one it applies."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    seen = await start(db_engine)
    await transition(db_engine, kind="pause", actor="guard", reason="r")
    with pytest.raises(PromotionConflict) as info:
        await transition(
            db_engine,
            kind="advance",
            actor="ramp",
            reason="r",
            expected_generation=seen.generation,
        )
    assert info.value.reason == "rollout_changed"
    now = await current_rollout(db_engine)
    assert now is not None and now.state == "paused"
    resumed = await transition(
        db_engine, kind="resume", actor="bob", reason="r", expected_generation=now.generation
    )
    assert resumed.generation == now.generation + 1


async def test_concurrent_starts_open_one_rollout(
    db_engine: AsyncEngine, migrated_db_url: str
) -> None:
    """Six simultaneous starts (rival candidates) from two engines: exactly one succeeds, the
    others get PromotionConflict 'rollout_open', and one rollout is stored."""
    names = [f"c{i}" for i in range(6)]
    await queries.seed(db_engine, LIVE, [cand(n) for n in names])
    engines = [make_engine(migrated_db_url), make_engine(migrated_db_url)]
    try:
        results = await asyncio.gather(
            *(start(engines[i % 2], n) for i, n in enumerate(names)), return_exceptions=True
        )
    finally:
        for engine in engines:
            await engine.dispose()
    wins = [r for r in results if isinstance(r, Rollout)]
    assert len(wins) == 1, results
    losses = [r for r in results if not isinstance(r, Rollout)]
    assert all(isinstance(r, PromotionConflict) and r.reason == "rollout_open" for r in losses)
    assert await current_rollout(db_engine) == wins[0]
    assert await queries.count_rows(db_engine, "rollouts") == 1


async def test_database_refuses_a_second_open_rollout(db_engine: AsyncEngine) -> None:
    """The partial unique index rejects a second open rollout on one live endpoint even from a
    raw insert, and accepts closed ones beside it."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    await start(db_engine)
    row = (
        "INSERT INTO rollouts (candidate, live, state, weight, step, steps, min_step_s, salt, "
        "generation, started_at, step_started_at, updated_at) VALUES "
        "('b', 'prod', :s, 0, 0, '[100.0]', 0, '00', 9, 0, 0, 0)"
    )
    async with db_engine.begin() as conn:
        await conn.execute(text(row), {"s": "aborted"})
    with pytest.raises(IntegrityError):
        async with db_engine.begin() as conn:
            await conn.execute(text(row), {"s": "paused"})


async def test_complete_promotes_in_the_same_transaction(db_engine: AsyncEngine) -> None:
    """complete at 100 % closes the rollout, makes the candidate live and writes the promotion
    audit row ('rollout completed'); a new rollout may then start against the new live one."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    await start(db_engine, steps=(50.0, 100.0))
    await transition(db_engine, kind="advance", actor="ramp", reason="dwell passed")
    done = await transition(
        db_engine, kind="complete", actor="ramp", reason="last step clean", evidence={"p": 0.4}
    )
    assert (done.state, done.weight, done.events[-1].kind) == ("completed", 100.0, "complete")
    assert await roles(db_engine) == {"prod": "retired", "a": "live", "b": "candidate"}
    (audit,) = await queries.list_promotions(db_engine)
    assert (audit.action, audit.from_endpoint, audit.to_endpoint) == ("promote", "prod", "a")
    assert (audit.reason, audit.actor, audit.report_snapshot) == (
        "rollout completed",
        "ramp",
        '{"p":0.4}',
    )
    assert await current_rollout(db_engine) == done
    nxt = await start(db_engine, "b")
    assert nxt.live == "a" and nxt.generation == done.generation + 1 and nxt.salt != done.salt


async def test_complete_refused_when_live_changed(db_engine: AsyncEngine) -> None:
    """complete refuses ('live_changed') when the live endpoint is no longer the one the rollout
    started against, and nothing is committed: the rollout stays open at 100 %."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("other", role="live")])
    await start(db_engine, steps=(100.0,))
    async with db_engine.begin() as conn:  # an out-of-band change of the live endpoint
        await conn.execute(text("UPDATE endpoints SET role = 'retired' WHERE name = 'prod'"))
        await conn.execute(text("UPDATE endpoints SET role = 'live' WHERE name = 'other'"))
    with pytest.raises(PromotionConflict) as info:
        await transition(db_engine, kind="complete", actor="ramp", reason="r")
    assert info.value.reason == "live_changed"
    still = await current_rollout(db_engine)
    assert still is not None and (still.state, still.weight) == ("running", 100.0)
    assert await queries.list_promotions(db_engine) == []


async def test_rollback_and_abort_zero_the_weight_with_evidence(db_engine: AsyncEngine) -> None:
    """rollback stores weight 0, state rolled_back and the guard's evidence; abort closes the
    next one the same way as aborted; the live endpoint never changes."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    await start(db_engine)
    await transition(db_engine, kind="advance", actor="ramp", reason="r")
    evidence = {"guard": "error_rate", "candidate": 0.08, "live": 0.01, "sessions": 412}
    back = await transition(
        db_engine, kind="rollback", actor="guard", reason="error rate", evidence=evidence
    )
    assert (back.state, back.weight, back.events[-1].evidence) == ("rolled_back", 0.0, evidence)
    assert (back.events[-1].from_weight, back.events[-1].to_weight) == (5.0, 0.0)
    await start(db_engine)
    await transition(db_engine, kind="pause", actor="bob", reason="r")
    gone = await transition(db_engine, kind="abort", actor="bob", reason="changed my mind")
    assert (gone.state, gone.weight) == ("aborted", 0.0)
    assert await roles(db_engine) == {"prod": "live", "a": "candidate"}


async def test_promote_and_rollback_refused_while_open(db_engine: AsyncEngine) -> None:
    """While a rollout is open, promote and rollback are refused ('rollout_open'); once it is
    aborted they work again."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    await queries.promote(
        db_engine, "b", actor="t", reason="r", forced=True, verdict=None, report_snapshot=None
    )
    await queries.update_endpoint(db_engine, "prod", {"role": "candidate"})
    await start(db_engine, "a")
    with pytest.raises(PromotionConflict, match="rollout") as promoted:
        await queries.promote(
            db_engine, "prod", actor="t", reason="r", forced=True, verdict=None, report_snapshot=""
        )
    with pytest.raises(PromotionConflict, match="rollout") as rolled:
        await queries.rollback(db_engine, actor="t", reason="r")
    assert (promoted.value.reason, rolled.value.reason) == ("rollout_open", "rollout_open")
    assert len(await queries.list_promotions(db_engine)) == 1
    await transition(db_engine, kind="abort", actor="t", reason="r")
    record = await queries.rollback(db_engine, actor="t", reason="r")
    assert (record.from_endpoint, record.to_endpoint) == ("b", "prod")


async def test_listen_returns_at_once_on_sqlite(tmp_path: Path) -> None:
    """On SQLite there is no push: listen returns immediately without calling on_change."""
    calls: list[int] = []
    url = f"sqlite+aiosqlite:///{tmp_path / 'x.db'}"
    await asyncio.wait_for(listen(url, lambda: calls.append(1)), timeout=SETTLE_S)
    assert calls == []


async def test_listen_outlives_an_error_it_does_not_expect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A DSN the driver rejects with neither an OS nor a driver error (asyncpg raises
    OverflowError for a port past 65535) does not end the listener: it records the error,
    logs it once and keeps retrying until cancelled."""
    stats = ListenStats()
    url = "postgresql+asyncpg://root@127.0.0.1:99999/postgres"
    task = asyncio.get_running_loop().create_task(
        listen(url, lambda: None, reconnect_s=0.02, stats=stats)
    )
    await asyncio.sleep(0.3)
    assert not task.done()  # still retrying
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert stats.last_error is not None and stats.last_error.startswith("OverflowError")
    logged = [r for r in caplog.records if "rollout listener" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelname == "ERROR"


@contextlib.asynccontextmanager
async def _listening(url: str, stats: ListenStats) -> AsyncIterator[asyncio.Queue[float]]:
    """A listener task on its own engine URL; yields a queue of the times it was called."""
    seen: asyncio.Queue[float] = asyncio.Queue()
    task = asyncio.get_running_loop().create_task(
        listen(url, lambda: seen.put_nowait(time.perf_counter()), reconnect_s=0.1, stats=stats)
    )
    try:
        await asyncio.wait_for(seen.get(), timeout=SETTLE_S)  # the catch-up call after connecting
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.postgres
async def test_listener_sees_another_engines_changes(tmp_path: Path) -> None:
    """On PostgreSQL a listener sees each of 20 transitions committed by another engine (the
    p95 delays are printed, not asserted; the only bound asserted is 5 s)."""
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        writer = make_engine(url)
        stats = ListenStats()
        try:
            await queries.seed(writer, LIVE, [cand("a")])
            async with _listening(url, stats) as seen:
                await start(writer)
                await asyncio.wait_for(seen.get(), timeout=SETTLE_S)
                delays, after_ack = [], []
                for i in range(20):
                    t0 = time.perf_counter()
                    kind = "pause" if i % 2 == 0 else "resume"
                    await transition(writer, kind=kind, actor="t", reason="r")  # type: ignore[arg-type]
                    acked = time.perf_counter()
                    heard = await asyncio.wait_for(seen.get(), timeout=SETTLE_S)
                    delays.append(heard - t0)
                    after_ack.append(heard - acked)
                assert seen.empty()
        finally:
            await writer.dispose()
    p95 = statistics.quantiles(delays, n=20)[-1]
    ack95 = statistics.quantiles(after_ack, n=20)[-1]
    print(f"\nrollout change seen by another engine, 20 transitions: call -> listener p95 "
          f"{p95 * 1000:.1f} ms (max {max(delays) * 1000:.1f}); commit acknowledged -> listener "
          f"p95 {ack95 * 1000:.1f} ms")  # fmt: skip
    assert stats.notifications == 21 and stats.reconnects == 0


@pytest.mark.postgres
async def test_listener_reconnects_and_catches_up(tmp_path: Path) -> None:
    """After its connection is killed, the listener reconnects (counted) and calls on_change
    once more, so a change committed while it was away is not missed."""
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        stats = ListenStats()
        async with _listening(url, stats) as seen:
            assert await terminate_backends(url) >= 1
            writer = make_engine(url)
            try:
                await queries.seed(writer, LIVE, [cand("a")])
                await start(writer)
            finally:
                await writer.dispose()
            # reconnects is counted before the catch-up call this waits for.
            await asyncio.wait_for(seen.get(), timeout=SETTLE_S)
        assert stats.reconnects >= 1 and stats.last_error is not None
