"""The registry on SQLite and PostgreSQL: seeding, the snapshot and LiveTarget swaps, two
registries (two gateway processes) seeing each other's changes within the poll interval,
outages while polling, and shutdown of the polling task."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import DEFAULT_SAMPLE_RATE, Endpoint
from domain.errors import EndpointNotFound
from gateway.control.registry import Registry, Snapshot
from gateway.server.hooks import LiveTarget
from storage import queries
from storage.engine import make_engine
from tests.fixtures_db import Outage

POLL_S = 0.2
LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")
CANDS = (
    Endpoint(name="a", url="http://127.0.0.1:9101"),
    Endpoint(name="b", url="http://127.0.0.1:9102", state="paused"),
)


class Replica:
    """One simulated gateway process: its own engine, LiveTarget and Registry."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        self.target = LiveTarget(Endpoint(name="boot", url="http://127.0.0.1:1"))
        self.changes: list[Snapshot] = []
        self.changed = asyncio.Event()
        self.registry = Registry(
            self.engine, self.target, poll_interval_s=POLL_S, on_change=self._on_change
        )

    def _on_change(self, snapshot: Snapshot) -> None:
        self.changes.append(snapshot)
        self.changed.set()

    async def wait_for(self, cond: Callable[[Snapshot], bool], timeout_s: float) -> float:
        """Seconds until a swapped-in snapshot satisfies `cond`."""
        start = time.monotonic()
        async with asyncio.timeout(timeout_s):
            while not (self.changes and cond(self.changes[-1])):
                self.changed.clear()
                await self.changed.wait()
        return time.monotonic() - start

    async def close(self) -> None:
        await self.registry.close()
        await self.engine.dispose()


ReplicaFactory = Callable[[], Awaitable[Replica]]


@pytest.fixture
async def replicas(migrated_db_url: str) -> AsyncIterator[ReplicaFactory]:
    """Starts replicas on the same database (seeded like `canary serve --live`), closes them."""
    made: list[Replica] = []

    async def start() -> Replica:
        replica = Replica(migrated_db_url)
        made.append(replica)
        await replica.registry.start(seed_live=LIVE, seed_candidates=CANDS)
        return replica

    yield start
    for replica in made:
        await replica.close()


async def test_start_seeds_and_swaps_in(replicas: ReplicaFactory) -> None:
    """start() seeds, builds the snapshot (candidates = role candidate, active and paused),
    points the LiveTarget at the live endpoint and reports the change once."""
    r = await replicas()
    snap = r.registry.snapshot
    assert snap.live.name == "prod" and [c.name for c in snap.candidates] == ["a", "b"]
    assert r.target.endpoint == snap.live and str(r.target.base_url) == "http://127.0.0.1:9000"
    assert r.changes == [snap]
    paused = snap.find("b")
    assert paused is not None and paused.state == "paused" and snap.find("zzz") is None


async def test_refresh_applies_a_write_at_once(replicas: ReplicaFactory) -> None:
    """After a write, refresh() swaps the new snapshot in immediately; without a change it
    keeps the same snapshot object."""
    r = await replicas()
    same = await r.registry.refresh()
    assert same is r.registry.snapshot and len(r.changes) == 1
    await queries.create_endpoint(r.engine, Endpoint(name="c", url="http://127.0.0.1:9103"))
    snap = await r.registry.refresh()
    assert [c.name for c in snap.candidates] == ["a", "b", "c"]
    assert snap.version == await queries.registry_version(r.engine)


async def test_two_replicas_see_each_other_within_the_poll_interval(
    replicas: ReplicaFactory,
) -> None:
    """A candidate change, a promotion and a rollback made through one replica reach the other
    by polling within the poll interval (plus scheduling slack), LiveTarget included."""
    one, two = await replicas(), await replicas()
    slack = POLL_S + 1.0

    await queries.update_endpoint(one.engine, "a", {"sample_rate": 0.5})
    await two.wait_for(lambda s: s.candidates[0].sample_rate == 0.5, slack)

    await queries.promote(
        one.engine, "a", actor="t", reason="r", forced=False, verdict=None, report_snapshot=None
    )
    await one.registry.refresh()
    assert one.target.endpoint.name == "a"
    await two.wait_for(lambda s: s.live.name == "a", slack)
    assert two.target.endpoint.name == "a" and str(two.target.base_url).endswith(":9101")

    await queries.rollback(two.engine, actor="t", reason="r")
    await one.wait_for(lambda s: s.live.name == "prod", slack)
    assert one.target.endpoint.name == "prod"
    await two.registry.refresh()
    assert one.registry.snapshot.version == two.registry.snapshot.version


async def test_stored_live_wins_over_seed_after_restart(
    migrated_db_url: str, replicas: ReplicaFactory
) -> None:
    """After a promotion, a restarted replica started with the same --live keeps the promoted
    endpoint live, and the config's candidates are not re-added or reset."""
    first = await replicas()
    await queries.promote(
        first.engine, "a", actor="t", reason="r", forced=False, verdict=None, report_snapshot=None
    )
    await queries.update_endpoint(first.engine, "b", {"sample_rate": 0.7})
    await first.close()
    again = await replicas()
    snap = again.registry.snapshot
    assert snap.live.name == "a" and again.target.endpoint.name == "a"
    assert [c.name for c in snap.candidates] == ["b"] and snap.candidates[0].sample_rate == 0.7
    assert [r.name for r in snap.retired] == ["prod"]


async def test_start_without_any_live_endpoint_fails(db_engine: AsyncEngine) -> None:
    """With nothing stored and nothing to seed, start() says a live endpoint is needed."""
    registry = Registry(db_engine, LiveTarget(LIVE), poll_interval_s=POLL_S)
    with pytest.raises(EndpointNotFound, match="--live"):
        await registry.start(seed_live=None, seed_candidates=CANDS)
    await registry.close()


async def test_outage_while_polling_keeps_the_snapshot(
    migrated_db_url: str, db_outage: Outage, replicas: ReplicaFactory
) -> None:
    """While storage is unreachable polls fail, are counted, and the old snapshot and live
    target stay; once it is back a change made meanwhile elsewhere is picked up."""
    r = await replicas()
    snap = r.registry.snapshot
    async with db_outage(migrated_db_url, reads=True):
        await asyncio.sleep(POLL_S * 3)
        assert r.registry.poll_errors >= 2
        assert r.registry.snapshot is snap and r.target.endpoint == snap.live
        assert await r.registry.refresh() is snap
    await queries.update_endpoint(r.engine, "a", {"sample_rate": 0.9})
    await r.wait_for(lambda s: s.candidates[0].sample_rate == 0.9, POLL_S + 2.0)
    assert r.registry.stats()["poll_errors"] >= 2


async def test_on_change_errors_do_not_stop_polling(replicas: ReplicaFactory) -> None:
    """A failing on_change callback is logged; the snapshot still swaps and polling goes on."""
    r = await replicas()
    seen: list[float] = []
    called = asyncio.Event()

    def explode(snapshot: Snapshot) -> None:
        seen.append(snapshot.candidates[0].sample_rate)
        called.set()
        raise RuntimeError("callback bug")

    r.registry._on_change = explode
    for rate in (0.1, 0.2):
        called.clear()
        await queries.update_endpoint(r.engine, "a", {"sample_rate": rate})
        async with asyncio.timeout(POLL_S + 2.0):
            await called.wait()
        assert r.registry.snapshot.candidates[0].sample_rate == rate
    assert seen == [0.1, 0.2]


async def test_close_stops_polling(replicas: ReplicaFactory) -> None:
    """After close() the registry no longer polls: later changes are not applied."""
    r = await replicas()
    await r.registry.close()
    await r.registry.close()  # idempotent
    await queries.update_endpoint(r.engine, "a", {"sample_rate": 0.4})
    await asyncio.sleep(POLL_S * 2)
    assert r.registry.snapshot.candidates[0].sample_rate == DEFAULT_SAMPLE_RATE


async def test_close_returns_when_a_change_arrives_as_it_closes(migrated_db_url: str) -> None:
    """A change notification (the PostgreSQL listener sets the poll's wake-up) that lands in the
    same loop pass as close(): the poll must still end. (`asyncio.wait_for` on Python 3.11 returns
    the woken wait and drops the cancel there, so close() waited out the poll interval: an hour.)"""
    engine = make_engine(migrated_db_url)
    registry = Registry(engine, LiveTarget(LIVE), poll_interval_s=3600.0)
    closing: asyncio.Task[None] | None = None
    try:
        await registry.start(seed_live=LIVE)
        await asyncio.sleep(0)  # the poll task is waiting for its wake-up
        poll = registry._task
        assert poll is not None
        registry._wake.set()  # what the listener's notification callback does
        closing = asyncio.create_task(registry.close())
        # Not cancelled on time-out (a cancel of close() would end the poll after all): a cancel
        # ends the poll at once, 2 s is slack.
        await asyncio.wait({closing}, timeout=2)
        assert closing.done() and poll.done(), "close() waited on the poll's interval"
    finally:
        if closing is not None and not closing.done():
            closing.cancel()
            await asyncio.wait({closing})
        await engine.dispose()
