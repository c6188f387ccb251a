"""The ramp reaches every replica's router: on PostgreSQL a change committed through one replica
is applied to another's `ArmRouter` by LISTEN/NOTIFY within a second (its poll interval an
hour); on SQLite the poll applies it; a registry started on a stored rollout routes by it before
it serves; completion makes the candidate the live target; a worker's guard trip rolls back."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from gateway.control.registry import Registry
from gateway.rollout.arms import ArmRouter, SessionArms
from gateway.rollout.state import GuardTrips
from gateway.server.hooks import LiveTarget
from storage import queries
from storage.engine import make_engine, upgrade
from storage.rollouts import current_rollout, start_rollout, transition
from tests.fixtures_db import fresh_database

LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")
CAND = Endpoint(name="cand", url="http://127.0.0.1:9100/cand")


@contextlib.asynccontextmanager
async def replica(
    url: str, tmp_path: Path, name: str, poll_s: float
) -> AsyncIterator[tuple[Registry, ArmRouter, AsyncEngine]]:
    """A registry with its own engine, session table and router, as one replica has."""
    engine = make_engine(url)
    table = SessionArms.create(str(tmp_path / f"arms-{name}"), slots=1 << 12, ttl_s=600)
    router = ArmRouter(table)
    registry = Registry(engine, LiveTarget(LIVE), poll_interval_s=poll_s, router=router)
    try:
        await registry.start(seed_live=LIVE, seed_candidates=[CAND])
        yield registry, router, engine
    finally:
        await registry.close()
        table.close()
        await engine.dispose()


async def applied(check: Callable[[], bool], timeout_s: float) -> float:
    """Seconds until `check()` holds (fails the test past `timeout_s`)."""
    started = time.perf_counter()
    while not check():
        assert time.perf_counter() - started < timeout_s, "not applied in time"
        await asyncio.sleep(0.002)
    return time.perf_counter() - started


async def at_generation(router: ArmRouter, generation: int) -> float:
    """Seconds until `router` holds `generation`."""
    return await applied(lambda: router.rollout.generation == generation, 5.0)


@pytest.mark.postgres
async def test_listen_applies_a_change_to_another_replica_within_a_second(tmp_path: Path) -> None:
    """20 changes (starts and aborts) committed through replica A each reach replica B's router
    by NOTIFY, well before B's hour-long poll; the candidate share follows the weight."""
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        async with (
            replica(url, tmp_path, "a", 3600.0) as (_, _, engine_a),
            replica(url, tmp_path, "b", 3600.0) as (reg_b, router_b, _),
        ):
            await applied(lambda: reg_b.listen_stats.connected, 10.0)
            delays: list[float] = []
            for i in range(10):
                r = await start_rollout(
                    engine_a,
                    candidate="cand",
                    steps=[50, 100],
                    min_step_s=0,
                    actor="t",
                    reason=f"trial {i}",
                )
                delays.append(await at_generation(router_b, r.id * 2))
                assert router_b.rollout.weight == 0.5 and router_b.rollout.state == "ramping"
                target = router_b.rollout.candidate
                assert isinstance(target, LiveTarget) and target.endpoint.name == "cand"
                await transition(engine_a, kind="abort", actor="t", reason="trial")
                delays.append(await at_generation(router_b, r.id * 2 + 1))
                assert router_b.rollout.weight == 0 and router_b.rollout.state == "rolled_back"
            arms = [router_b.arm_for(f"s{i}") for i in range(200)]
            assert set(arms) == {0}  # everything on production after the abort
    p50 = statistics.median(delays)
    p95 = statistics.quantiles(delays, n=20)[18]
    print(f"\nrollout change applied on another replica (20 trials): p50 {p50 * 1000:.1f} ms, "
          f"p95 {p95 * 1000:.1f} ms, max {max(delays) * 1000:.1f} ms")  # fmt: skip
    assert max(delays) < 3.0  # generous: the design's bound is 1 s, CI hosts are shared


async def test_sqlite_falls_back_to_polling(tmp_path: Path) -> None:
    """On SQLite there is no push: the other replica's poll applies the start and the
    rollback; a registry started afterwards routes by the stored state before serving."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'r.db'}"
    await upgrade(url)
    async with (
        replica(url, tmp_path, "a", 3600.0) as (_, _, engine_a),
        replica(url, tmp_path, "b", 0.05) as (reg_b, router_b, _),
    ):
        assert not reg_b.listen_stats.connected
        r = await start_rollout(
            engine_a, candidate="cand", steps=[25, 100], min_step_s=0, actor="t", reason="x"
        )
        await applied(lambda: router_b.rollout.generation == r.id * 2, 5.0)
        await transition(engine_a, kind="advance", actor="t", reason="x")
        await applied(lambda: router_b.rollout.weight == 1.0, 5.0)
        assert router_b.arm_for("new-session") == 1  # at 100 % every new session
        async with replica(url, tmp_path, "c", 3600.0) as (_, router_c, _):
            assert (router_c.rollout.generation, router_c.rollout.weight) == (r.id * 2, 1.0)
        await transition(engine_a, kind="rollback", actor="t", reason="harm")
        await applied(lambda: router_b.rollout.state == "rolled_back", 5.0)
        assert router_b.arm_for("new-session") == 0


async def test_completion_makes_the_candidate_live(tmp_path: Path) -> None:
    """Completing at 100 % closes the generation and swaps the live target to the candidate."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'c.db'}"
    await upgrade(url)
    async with replica(url, tmp_path, "a", 3600.0) as (reg, router, engine):
        await start_rollout(
            engine, candidate="cand", steps=[100], min_step_s=0, actor="t", reason="x"
        )
        await reg.refresh()
        assert router.rollout.weight == 1.0
        done = await transition(engine, kind="complete", actor="controller", reason="done")
        await reg.refresh()
        assert (router.rollout.generation, router.rollout.state) == (done.id * 2 + 1, "idle")
        assert reg.snapshot.live.name == "cand"
        audit = await queries.list_promotions(engine, 1)
        assert (audit[0].to_endpoint, audit[0].reason) == ("cand", "rollout completed")


async def test_guard_trip_rolls_back_once_and_reaches_the_router(tmp_path: Path) -> None:
    """A worker's guard trip becomes one stored rollback carrying its evidence, applied to the
    router; a second trip of the same generation (another worker) is a lost race, not an error,
    and close() waits for both."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'g.db'}"
    await upgrade(url)
    async with replica(url, tmp_path, "a", 3600.0) as (reg, router, engine):
        r = await start_rollout(
            engine, candidate="cand", steps=[5, 100], min_step_s=0, actor="t", reason="x"
        )
        await transition(engine, kind="advance", actor="t", reason="x")  # generation moved
        await reg.refresh()
        guard = GuardTrips(engine, on_done=reg.refresh)
        evidence: dict[str, object] = {"consecutive_failures": 5, "window": 5}
        guard.trip(r.id * 2, "guard_consecutive", evidence)
        guard.trip(r.id * 2, "guard_consecutive", evidence)
        await guard.close()
        assert (guard.tripped, guard.lost, guard.failed) == (1, 1, 0)
        stored = await current_rollout(engine)
        assert stored is not None and stored.state == "rolled_back"
        assert [e.kind for e in stored.events].count("rollback") == 1
        event = stored.events[-1]
        assert (event.actor, event.reason, event.evidence) == (
            "guard",
            "guard_consecutive",
            evidence,
        )
        assert (router.rollout.generation, router.rollout.weight) == (r.id * 2 + 1, 0.0)
