"""Promote and rollback on SQLite and PostgreSQL: role swaps with an audit row, the undo-stack
rollback, races between replicas (exactly one wins), and durability across restarts."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound, PromotionConflict
from domain.records import PromotionRecord
from storage import queries
from storage.engine import make_engine

LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")


def cand(name: str) -> Endpoint:
    return Endpoint(name=name, url=f"http://127.0.0.1:9100/{name}")


async def roles(engine: AsyncEngine) -> dict[str, str]:
    _, endpoints = await queries.load_endpoints(engine)
    return {ep.name: ep.role for ep in endpoints}


async def promote(engine: AsyncEngine, name: str, **kw: object) -> PromotionRecord:
    return await queries.promote(
        engine,
        name,
        actor="alice",
        reason="p99 better",
        forced=False,
        verdict="promote",
        report_snapshot='{"verdict": "promote"}',
        **kw,  # type: ignore[arg-type]
    )


async def test_promote_swaps_roles_and_audits(db_engine: AsyncEngine) -> None:
    """Promote makes the candidate live, retires the old live endpoint, bumps both versions and
    the registry version, and appends an audit row with every field."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    before = await queries.registry_version(db_engine)
    record = await promote(db_engine, "a")
    assert await roles(db_engine) == {"prod": "retired", "a": "live", "b": "candidate"}
    assert await queries.registry_version(db_engine) == before + 1
    assert (await queries.get_endpoint(db_engine, "a")).version == 2
    assert record.action == "promote" and record.from_endpoint == "prod"
    assert record.to_endpoint == "a" and record.actor == "alice" and record.verdict == "promote"
    assert await queries.list_promotions(db_engine) == [record]


async def test_promote_refusals(db_engine: AsyncEngine) -> None:
    """Promoting a missing name, the live endpoint or a retired one is refused, with reasons."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    with pytest.raises(EndpointNotFound):
        await promote(db_engine, "zzz")
    with pytest.raises(PromotionConflict) as live:
        await promote(db_engine, "prod")
    await promote(db_engine, "a")
    with pytest.raises(PromotionConflict) as retired:
        await promote(db_engine, "prod")
    assert (live.value.reason, retired.value.reason) == ("already_live", "not_candidate")
    assert len(await queries.list_promotions(db_engine)) == 1


async def test_promote_with_stale_expectation_refused(db_engine: AsyncEngine) -> None:
    """With expect_live, a promote decided against another live endpoint is refused."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    await promote(db_engine, "a", expect_live="prod")
    with pytest.raises(PromotionConflict) as info:
        await promote(db_engine, "b", expect_live="prod")
    assert info.value.reason == "live_changed"


async def test_rollback_walks_back_through_history(db_engine: AsyncEngine) -> None:
    """Each rollback undoes the newest promotion not yet undone; with none left it raises
    PromotionConflict."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    with pytest.raises(PromotionConflict) as empty:
        await queries.rollback(db_engine, actor="bob", reason="bad")
    assert empty.value.reason == "nothing_to_roll_back"
    await promote(db_engine, "a")
    await promote(db_engine, "b")
    first = await queries.rollback(db_engine, actor="bob", reason="ttft regression")
    assert (first.action, first.from_endpoint, first.to_endpoint) == ("rollback", "b", "a")
    assert await roles(db_engine) == {"prod": "retired", "a": "live", "b": "retired"}
    await queries.rollback(db_engine, actor="bob", reason="again")
    assert await roles(db_engine) == {"prod": "live", "a": "retired", "b": "retired"}
    with pytest.raises(PromotionConflict):
        await queries.rollback(db_engine, actor="bob", reason="once more")
    log = await queries.list_promotions(db_engine)
    assert [p.action for p in log] == ["rollback", "rollback", "promote", "promote"]
    assert [p.actor for p in await queries.list_promotions(db_engine, limit=1)] == ["bob"]


async def test_rollback_after_new_promotion_undoes_it_first(db_engine: AsyncEngine) -> None:
    """After promote a, rollback, promote b: rollback returns to prod (b's predecessor)."""
    await queries.seed(db_engine, LIVE, [cand("a"), cand("b")])
    await promote(db_engine, "a")
    await queries.rollback(db_engine, actor="bob", reason="r")
    await queries.update_endpoint(db_engine, "a", {"role": "candidate"})
    await promote(db_engine, "b")
    record = await queries.rollback(db_engine, actor="bob", reason="r")
    assert (record.from_endpoint, record.to_endpoint) == ("b", "prod")


async def test_rollback_to_deleted_endpoint_refused(db_engine: AsyncEngine) -> None:
    """When the previous live endpoint was deleted, rollback says so instead of guessing."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    await promote(db_engine, "a")
    await queries.delete_endpoint(db_engine, "prod")
    with pytest.raises(PromotionConflict) as info:
        await queries.rollback(db_engine, actor="bob", reason="r")
    assert info.value.reason == "previous_deleted"
    assert await roles(db_engine) == {"a": "live"}


async def _race(url: str, calls: int, name_for: object) -> list[PromotionRecord | BaseException]:
    """`calls` promotes from two engines (two gateway processes) at once."""
    engines = [make_engine(url), make_engine(url)]
    try:
        coros = [
            promote(engines[i % 2], name_for(i) if callable(name_for) else str(name_for))
            for i in range(calls)
        ]
        return await asyncio.gather(*coros, return_exceptions=True)
    finally:
        for engine in engines:
            await engine.dispose()


async def test_concurrent_promotes_of_one_candidate(
    db_engine: AsyncEngine, migrated_db_url: str
) -> None:
    """Eight simultaneous promotes of the same candidate from two processes: exactly one wins,
    the others raise PromotionConflict, and the log has one row."""
    await queries.seed(db_engine, LIVE, [cand("a")])
    results = await _race(migrated_db_url, 8, "a")
    wins = [r for r in results if isinstance(r, PromotionRecord)]
    assert len(wins) == 1, results
    assert all(isinstance(r, PromotionConflict) for r in results if r not in wins)
    assert await roles(db_engine) == {"prod": "retired", "a": "live"}
    assert len(await queries.list_promotions(db_engine)) == 1


async def test_concurrent_promotes_of_rivals(db_engine: AsyncEngine, migrated_db_url: str) -> None:
    """Rival candidates promoted at once against the same expected live endpoint: exactly one
    wins and exactly one endpoint is live."""
    names = [f"c{i}" for i in range(6)]
    await queries.seed(db_engine, LIVE, [cand(n) for n in names])
    engines = [make_engine(migrated_db_url), make_engine(migrated_db_url)]
    try:
        results = await asyncio.gather(
            *(promote(engines[i % 2], n, expect_live="prod") for i, n in enumerate(names)),
            return_exceptions=True,
        )
    finally:
        for engine in engines:
            await engine.dispose()
    wins = [r for r in results if isinstance(r, PromotionRecord)]
    assert len(wins) == 1, results
    assert all(isinstance(r, PromotionConflict) for r in results if r not in wins)
    live = [n for n, role in (await roles(db_engine)).items() if role == "live"]
    assert live == [wins[0].to_endpoint]


async def test_unguarded_concurrent_promotes_serialize(
    db_engine: AsyncEngine, migrated_db_url: str
) -> None:
    """Without expect_live, rival promotes apply one after another: the audit log is a chain
    (each from is the previous to) and exactly one endpoint ends live."""
    names = [f"c{i}" for i in range(6)]
    await queries.seed(db_engine, LIVE, [cand(n) for n in names])
    engines = [make_engine(migrated_db_url), make_engine(migrated_db_url)]
    try:
        await asyncio.gather(*(promote(engines[i % 2], n) for i, n in enumerate(names)))
    finally:
        for engine in engines:
            await engine.dispose()
    log = list(reversed(await queries.list_promotions(db_engine)))
    assert log[0].from_endpoint == "prod"
    assert all(a.to_endpoint == b.from_endpoint for a, b in itertools.pairwise(log))
    live = [n for n, role in (await roles(db_engine)).items() if role == "live"]
    assert live == [log[-1].to_endpoint]


async def test_promotion_and_rollback_survive_restart(migrated_db_url: str) -> None:
    """Candidates, the promoted live endpoint and the rolled-back one are all still there after
    the engine (the process) is replaced."""
    engine = make_engine(migrated_db_url)
    await queries.seed(engine, LIVE, [cand("a")])
    await queries.create_endpoint(engine, cand("b"))
    await promote(engine, "a")
    await engine.dispose()

    engine = make_engine(migrated_db_url)
    await queries.seed(engine, LIVE, [cand("a")])  # the restart seeds again; stored state wins
    assert await roles(engine) == {"prod": "retired", "a": "live", "b": "candidate"}
    await queries.rollback(engine, actor="bob", reason="r")
    await engine.dispose()

    engine = make_engine(migrated_db_url)
    try:
        await queries.seed(engine, LIVE, [cand("a")])
        assert await roles(engine) == {"prod": "live", "a": "retired", "b": "candidate"}
        assert [p.action for p in await queries.list_promotions(engine)] == ["rollback", "promote"]
    finally:
        await engine.dispose()
