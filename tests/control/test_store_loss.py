"""The ramp without its store, in one process on PostgreSQL reached through a TCP link the test
cuts (tests/store_link.py): a worker that cannot read the store for `store_loss_hold_s` holds
new sessions on production while its candidate sessions keep their arm, and follows the store
again once it has answered for `store_resume_after_s`; a guard's rollback decided while the
store is gone is retried until stored, and a held replica never resumes the stale weight.
tests/process/test_rollout_store_loss.py shows the same with two `canary serve` replicas."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.control.registry import Registry
from gateway.rollout.arms import CANDIDATE, PRODUCTION, ArmRouter, SessionArms
from gateway.rollout.state import GuardTrips
from gateway.server.hooks import LiveTarget
from storage.engine import make_engine, upgrade
from storage.rollouts import current_rollout, start_rollout
from tests.control.test_rollout_propagation import CAND, LIVE, applied
from tests.fixtures_db import fresh_database
from tests.store_link import store_link
from tests.waiting import until

pytestmark = pytest.mark.postgres

HOLD_S = 1.0
RESUME_S = 1.5
RETRY_MAX_S = 0.2


@contextlib.asynccontextmanager
async def held_replica(
    url: str, tmp_path: Path, name: str
) -> AsyncIterator[tuple[Registry, ArmRouter, AsyncEngine]]:
    """A registry that holds the ramp after HOLD_S without its store, as a worker's does."""
    engine = make_engine(url)
    table = SessionArms.create(str(tmp_path / f"arms-{name}"), slots=1 << 12, ttl_s=600)
    router = ArmRouter(table)
    registry = Registry(
        engine,
        LiveTarget(LIVE),
        poll_interval_s=0.2,
        router=router,
        store_loss_hold_s=HOLD_S,
        store_resume_after_s=RESUME_S,
    )
    try:
        await registry.start(seed_live=LIVE, seed_candidates=[CAND])
        yield registry, router, engine
    finally:
        await registry.close()
        table.close()
        await engine.dispose()


def _share(router: ArmRouter, prefix: str, n: int = 400) -> float:
    """The share of `n` fresh sessions `router` sends to the candidate."""
    return sum(router.arm_for(f"{prefix}-{i}") for i in range(n)) / n


async def test_a_worker_without_its_store_holds_new_sessions_then_follows_the_store(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Cut from the store at 50 %, a worker sends new sessions to production after HOLD_S
    (counted, logged) while a candidate session keeps its arm, and routes by the stored 50 %
    again only after RESUME_S of the store's answers."""
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        direct = make_engine(url)
        try:
            async with (
                store_link(url) as link,
                held_replica(link.url(url), tmp_path, "a") as (reg, router, _),
            ):
                await start_rollout(
                    direct, candidate="cand", steps=[50, 100], min_step_s=0, actor="t", reason="x"
                )
                await reg.refresh()
                assert router.rollout.weight == 0.5
                on_candidate = next(
                    k for k in (f"early-{i}" for i in range(100)) if router.arm_for(k) == CANDIDATE
                )
                with caplog.at_level(logging.WARNING, logger="gateway.control.registry"):
                    link.cut()
                    fail_safe_s = await applied(lambda: router.rollout.weight == 0, 10.0)
                assert HOLD_S <= fail_safe_s < HOLD_S + 2.0, fail_safe_s
                assert reg.stats()["store_holds"] == 1 and reg.stats()["store_held"] == 1
                assert any("store_loss_hold_s" in r.getMessage() for r in caplog.records)
                assert _share(router, "held") == 0.0
                assert router.arm_for(on_candidate) == CANDIDATE  # its KV cache is there
                await asyncio.sleep(HOLD_S)  # still held, however long the store stays away
                assert router.rollout.weight == 0 and reg.holds == 1

                link.restore()
                resume_s = await applied(lambda: router.rollout.weight == 0.5, 10.0)
                assert resume_s >= RESUME_S, resume_s
                assert reg.stats()["store_held"] == 0
                assert 0.35 < _share(router, "after") < 0.65
                assert router.arm_for(on_candidate) == CANDIDATE
        finally:
            await direct.dispose()
    print(f"\nheld after {fail_safe_s:.2f} s without the store; resumed {resume_s:.2f} s after")


async def test_a_rollback_decided_without_the_store_is_stored_before_anyone_resumes(
    tmp_path: Path,
) -> None:
    """A guard rollback decided on replica A while the store is gone is retried until the store
    returns and stored within RESUME_S, and the held replica B goes from held straight to rolled
    back, never to the stale "running at 50 %" the store held for a moment."""
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        direct = make_engine(url)
        try:
            async with (
                store_link(url) as link,
                held_replica(link.url(url), tmp_path, "a") as (reg_a, router_a, engine_a),
                held_replica(link.url(url), tmp_path, "b") as (reg_b, router_b, _),
            ):
                r = await start_rollout(
                    direct, candidate="cand", steps=[50, 100], min_step_s=0, actor="t", reason="x"
                )
                for reg in (reg_a, reg_b):
                    await reg.refresh()

                async def both_at_half() -> bool:
                    # On a loaded host a poll can take longer than HOLD_S: a replica that held
                    # then resumes after RESUME_S of answers (its own test below).
                    return router_a.rollout.weight == router_b.rollout.weight == 0.5

                await until(
                    both_at_half, what="both replicas at the stored 50 %", within_s=RESUME_S + 30
                )
                guard = GuardTrips(engine_a, on_done=reg_a.refresh, retry_max_s=RETRY_MAX_S)
                link.cut()
                # What RolloutRoute.trip does on the fifth failure in a row: local, then durable.
                router_a.swap(router_a.rollout.rolled_back())
                evidence: dict[str, object] = {"consecutive_failures": 5}
                guard.trip(r.id * 2, "guard_consecutive", evidence)
                assert router_a.arm_for("fresh") == PRODUCTION
                await applied(lambda: reg_b.held, 10.0)
                await asyncio.sleep(2 * RETRY_MAX_S)
                assert guard.pending == 1 and guard.failed >= 2 and guard.tripped == 0

                link.restore()
                restored = time.time()
                b_candidate_weights: list[float] = []
                while router_b.rollout.state != "rolled_back":
                    b_candidate_weights.append(router_b.rollout.weight)
                    assert time.time() - restored < 10.0, "B never applied the rollback"
                    await asyncio.sleep(0.002)
                await guard.close()
                stored = await current_rollout(direct)
        finally:
            await direct.dispose()
    assert stored is not None and stored.state == "rolled_back"
    event = stored.events[-1]
    assert (event.kind, event.actor, event.reason) == ("rollback", "guard", "guard_consecutive")
    assert (guard.tripped, guard.pending) == (1, 0)
    stored_s = event.at - restored
    assert 0 < stored_s < RESUME_S, stored_s
    assert set(b_candidate_weights) == {0.0}  # held until the rollback, never the stale 50 %
    assert router_a.rollout.generation == router_b.rollout.generation == r.id * 2 + 1
    print(f"\nguard rollback stored {stored_s:.2f} s after the store returned")


async def test_a_shutdown_waits_its_drain_for_an_unstored_rollback_then_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Closing the guard while the store is still gone waits `drain_s`, not forever, and logs
    the rollback it could not store."""
    async with fresh_database("postgresql", tmp_path) as url:
        await upgrade(url)
        async with (
            store_link(url) as link,
            held_replica(link.url(url), tmp_path, "a") as (_, _, engine),
        ):
            r = await start_rollout(
                engine, candidate="cand", steps=[50, 100], min_step_s=0, actor="t", reason="x"
            )
            guard = GuardTrips(engine, retry_max_s=RETRY_MAX_S, drain_s=0.5)
            link.cut()
            guard.trip(r.id * 2, "guard_burst", {})
            await applied(lambda: guard.failed >= 1, 5.0)
            started = time.monotonic()
            with caplog.at_level(logging.ERROR, logger="canary.rollout"):
                await guard.close()
            waited = time.monotonic() - started
    assert 0.5 <= waited < 2.0, waited
    assert guard.pending == 0 and guard.tripped == 0
    assert any(
        f"rollout-guard-{r.id * 2} not stored before shutdown" in rec.getMessage()
        for rec in caplog.records
    )
