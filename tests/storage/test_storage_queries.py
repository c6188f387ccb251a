"""Control-plane queries on SQLite and PostgreSQL: endpoint CRUD, version bumps, seeding, and
the mirror counters."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.accounting import GAUGE_MAX_AGE_S
from domain.endpoint import DEFAULT_SAMPLE_RATE, Endpoint
from domain.errors import (
    DuplicateName,
    EndpointNotFound,
    InvalidEndpoint,
    PromotionConflict,
    StorageUnavailable,
)
from storage import queries
from storage.sql import MIRROR_COUNTERS
from tests.waiting import SETTLE_S, until

LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live", kind="live")


def cand(name: str, **kw: object) -> Endpoint:
    return Endpoint(name=name, url=f"http://127.0.0.1:9100/{name}", **kw)  # type: ignore[arg-type]


async def test_create_get_and_load(db_engine: AsyncEngine) -> None:
    """A created endpoint is stored with version 1 and timestamps, and is read back equal."""
    stored = await queries.create_endpoint(
        db_engine, cand("bikv", kind="bi-kv", sample_rate=0.25, verdict={"alpha": 0.01})
    )
    assert stored.version == 1 and stored.created_at > 0
    assert await queries.get_endpoint(db_engine, "bikv") == stored
    version, endpoints = await queries.load_endpoints(db_engine)
    assert version == 1 and endpoints == [stored]


async def test_every_change_bumps_the_registry_version(db_engine: AsyncEngine) -> None:
    """Create, update and delete each bump registry_meta.version by one; reads do not."""
    assert await queries.registry_version(db_engine) == 0
    await queries.create_endpoint(db_engine, cand("a"))
    await queries.update_endpoint(db_engine, "a", {"sample_rate": 0.5})
    await queries.get_endpoint(db_engine, "a")
    assert await queries.registry_version(db_engine) == 2
    await queries.delete_endpoint(db_engine, "a")
    assert await queries.registry_version(db_engine) == 3


async def test_duplicate_name_refused(db_engine: AsyncEngine) -> None:
    """A second endpoint with a taken name raises DuplicateName and changes nothing."""
    await queries.create_endpoint(db_engine, cand("a"))
    with pytest.raises(DuplicateName):
        await queries.create_endpoint(db_engine, cand("a", sample_rate=0.9))
    assert (await queries.get_endpoint(db_engine, "a")).sample_rate == DEFAULT_SAMPLE_RATE
    assert await queries.registry_version(db_engine) == 1


async def test_unknown_names_raise_not_found(db_engine: AsyncEngine) -> None:
    """get, update and delete of a missing name raise EndpointNotFound."""
    with pytest.raises(EndpointNotFound):
        await queries.get_endpoint(db_engine, "nope")
    with pytest.raises(EndpointNotFound):
        await queries.update_endpoint(db_engine, "nope", {"sample_rate": 0.1})
    with pytest.raises(EndpointNotFound):
        await queries.delete_endpoint(db_engine, "nope")


async def test_update_changes_fields_and_version(db_engine: AsyncEngine) -> None:
    """An update stores the new values, bumps the endpoint's version and keeps created_at."""
    first = await queries.create_endpoint(db_engine, cand("a"))
    new = await queries.update_endpoint(
        db_engine, "a", {"state": "paused", "sample_rate": 0.3, "verdict": {"x": 1.0}}
    )
    assert new.state == "paused" and new.sample_rate == 0.3 and new.version == 2
    assert new.created_at == first.created_at and new.updated_at >= first.updated_at
    assert await queries.get_endpoint(db_engine, "a") == new


async def test_update_rejects_bad_changes(db_engine: AsyncEngine) -> None:
    """Unknown or bookkeeping fields and ill-typed values raise ValueError; role moves into or
    out of live raise PromotionConflict."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    for changes in ({"name": "b"}, {"version": 9}, {"bogus": 1}, {"sample_rate": "high"}):
        with pytest.raises(ValueError):
            await queries.update_endpoint(db_engine, "a", changes)
    with pytest.raises(PromotionConflict):
        await queries.update_endpoint(db_engine, "a", {"role": "live"})
    with pytest.raises(PromotionConflict):
        await queries.update_endpoint(db_engine, "prod", {"role": "retired"})
    retired = await queries.update_endpoint(db_engine, "a", {"role": "retired"})
    assert retired.role == "retired"


async def test_values_the_schema_cannot_hold_are_refused_alike(db_engine: AsyncEngine) -> None:
    """An over-long or ill-typed field raises InvalidEndpoint on both dialects (SQLite would
    otherwise store what PostgreSQL refuses), and a bad seed stores nothing."""
    with pytest.raises(InvalidEndpoint, match="kind"):
        await queries.create_endpoint(db_engine, cand("a", kind="k" * 33))
    with pytest.raises(InvalidEndpoint, match="state"):
        await queries.create_endpoint(db_engine, cand("a", state="sleeping"))
    with pytest.raises(InvalidEndpoint, match="model"):
        await queries.seed(db_engine, LIVE, [cand("a"), cand("b", model="m" * 201)])
    assert (await queries.load_endpoints(db_engine))[1] == []


async def test_delete_refuses_the_live_endpoint(db_engine: AsyncEngine) -> None:
    """Deleting the live endpoint raises PromotionConflict with a reason; candidates go."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    with pytest.raises(PromotionConflict) as info:
        await queries.delete_endpoint(db_engine, "prod")
    assert info.value.reason == "is_live"
    await queries.delete_endpoint(db_engine, "a")
    _, endpoints = await queries.load_endpoints(db_engine)
    assert [ep.name for ep in endpoints] == ["prod"]


async def test_create_live_refused_when_one_is_live(db_engine: AsyncEngine) -> None:
    """Only promotion makes a second endpoint live; creating one as live is refused."""
    await queries.seed(db_engine, LIVE, [])
    with pytest.raises(PromotionConflict):
        await queries.create_endpoint(db_engine, cand("x", role="live"))


async def test_seed_is_first_start_only(db_engine: AsyncEngine) -> None:
    """Seeding inserts the live endpoint only when none is live and candidates only when their
    name is absent; a repeated seed changes nothing and bumps no version."""
    await queries.seed(db_engine, LIVE, [cand("a", sample_rate=0.1)])
    version = await queries.registry_version(db_engine)
    other_live = Endpoint(name="prod2", url="http://127.0.0.1:9999", role="live")
    await queries.seed(db_engine, other_live, [cand("a", sample_rate=0.9)])
    assert await queries.registry_version(db_engine) == version
    await queries.seed(db_engine, other_live, [cand("a"), cand("b")])
    _, endpoints = await queries.load_endpoints(db_engine)
    by_name = {ep.name: ep for ep in endpoints}
    assert set(by_name) == {"prod", "a", "b"}
    assert by_name["prod"].role == "live" and by_name["a"].sample_rate == 0.1
    assert by_name["b"].role == "candidate"


async def test_seed_without_live(db_engine: AsyncEngine) -> None:
    """Candidates can be seeded on their own (live None)."""
    await queries.seed(db_engine, None, [cand("a")])
    _, endpoints = await queries.load_endpoints(db_engine)
    assert [(ep.name, ep.role) for ep in endpoints] == [("a", "candidate")]


async def test_counters_upsert_and_sum(db_engine: AsyncEngine) -> None:
    """Each replica's counters replace its previous row; the sum adds replicas together."""
    await queries.upsert_counters(db_engine, "r1", {"a": {"sampled": 3, "sent": 2}})
    await queries.upsert_counters(db_engine, "r1", {"a": {"sampled": 5, "sent": 4}})
    await queries.upsert_counters(db_engine, "r2", {"a": {"sampled": 1, "sent": 1}, "b": {}})
    await queries.upsert_counters(db_engine, "r3", {})
    assert await queries.sum_counters(db_engine) == {"a": {"sampled": 6, "sent": 5}, "b": {}}
    assert await queries.registry_version(db_engine) == 0


async def test_when_copies_were_shed_is_a_span_over_replicas(db_engine: AsyncEngine) -> None:
    """The instants copies were shed by hash merge over replicas as a span (earliest first,
    latest last), not a sum; the seconds and the copies add up."""
    first, last, secs = "shed_capacity_first_at", "shed_capacity_last_at", "shed_capacity_seconds"
    row1 = {"sampled": 9, "shed_capacity": 4, first: 1000, last: 1010, secs: 11}
    row2 = {"sampled": 5, "shed_capacity": 2, first: 990, last: 1005, secs: 16}
    await queries.upsert_counters(db_engine, "r1", {"a": row1})
    await queries.upsert_counters(db_engine, "r2", {"a": row2})
    await queries.upsert_counters(db_engine, "r3", {"a": {"sampled": 1}})
    assert await queries.sum_counters(db_engine) == {
        "a": {"sampled": 15, "shed_capacity": 6, first: 990, last: 1010, secs: 27}
    }


async def test_stale_replicas_gauges_count_as_zero(db_engine: AsyncEngine) -> None:
    """A replica that stopped reporting keeps its totals in the sum but not its gauges."""
    counters = {"a": {"sampled": 4, "sent": 3, "pending": 1}}
    await queries.upsert_counters(db_engine, "gone", counters)
    await queries.upsert_counters(db_engine, "alive", counters)
    now = time.time()
    assert await queries.sum_counters(db_engine, now=now) == {
        "a": {"sampled": 8, "sent": 6, "pending": 2}
    }
    later = now + GAUGE_MAX_AGE_S + 1
    await queries.upsert_counters(db_engine, "alive", counters)  # still reporting...
    async with db_engine.begin() as conn:  # ...as of `later`; "gone" last reported at `now`
        await conn.execute(
            MIRROR_COUNTERS.update()
            .where(MIRROR_COUNTERS.c.replica == "alive")
            .values(updated_at=later)
        )
    assert await queries.sum_counters(db_engine, now=later) == {
        "a": {"sampled": 8, "sent": 6, "pending": 1}
    }


async def test_unreachable_database_raises_storage_unavailable() -> None:
    """A database that cannot be reached surfaces as StorageUnavailable, not a driver error."""
    from storage.engine import make_engine

    threads = threading.active_count()
    for url in (
        "postgresql+asyncpg://postgres@127.0.0.1:1/none",
        "sqlite+aiosqlite:////nonexistent-dir/x.db",
    ):
        engine = make_engine(url)
        try:
            with pytest.raises(StorageUnavailable):
                await queries.registry_version(engine)
        finally:
            await engine.dispose()
    # aiosqlite stops the worker thread of a failed connect without awaiting it; let it finish
    # on this loop, or it completes a future on a closed loop after the test.

    async def finished() -> bool:
        return threading.active_count() <= threads

    with contextlib.suppress(AssertionError):  # as before: waited for, not asserted
        await until(finished, what="aiosqlite's thread finished", within_s=SETTLE_S, every_s=0.01)


async def test_target_rps_round_trip(db_engine: AsyncEngine) -> None:
    """`target_rps` is stored, changed and cleared (NULL) like any nullable field; an
    out-of-range value never reaches the database."""
    stored = await queries.create_endpoint(db_engine, cand("rps", target_rps=20.0, sample_rate=1.0))
    assert (await queries.get_endpoint(db_engine, "rps")).target_rps == 20.0 == stored.target_rps
    changed = await queries.update_endpoint(db_engine, "rps", {"target_rps": 0.5})
    assert changed.target_rps == 0.5
    assert (await queries.load_endpoints(db_engine))[1][0].target_rps == 0.5
    cleared = await queries.update_endpoint(db_engine, "rps", {"target_rps": None})
    assert cleared.target_rps is None
    assert (await queries.get_endpoint(db_engine, "rps")).target_rps is None
