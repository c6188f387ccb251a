"""Split sessions on SQLite and PostgreSQL: a session whose exchanges two gateway replicas stored
is found in the store, counted in the report with its share of the pairs, and left out of every
analysis by turn with the reason; each replica's watcher counts the sessions it shares once."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.exposition import render
from domain.records import ExchangeRecord, ObservationRecord
from evaluators.judge.settings import VerdictSettings
from evaluators.metrics.latency import SPLIT_REASON
from evaluators.pairs.load import load_pairs
from evaluators.report.build import evaluate
from gateway.mirror.replay import splits
from gateway.mirror.replay.splits import WINDOW_S, SplitWatch
from storage import queries
from storage.models import ExchangeRow, ObservationRow
from storage.textguard import exchange_row, observation_row

SESSIONS = 12  # four turns each; sessions 0-2 went through both replicas
SPLIT = {0, 1, 2}
TURNS = 4


def _obs(xid: str, endpoint: str, arm: str, at: float, ttft: float) -> dict[str, object]:
    record = ObservationRecord(
        exchange_id=xid, endpoint=endpoint, arm=arm, started_at=at, status=200,  # type: ignore[arg-type]
        ttft_s=ttft, e2e_s=ttft + 0.2, output_tokens=10, finish_reason="stop", output_text="same",
    )  # fmt: skip
    return observation_row(record, store_text=True, max_chars=4096)


async def _fleet_history(engine: AsyncEngine, now: float) -> None:
    """Twelve four-turn sessions mirrored to `cand` and `control`; replica `a` stored every turn
    but those of sessions 0-2 at odd turns, which replica `b` stored."""
    await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
    await queries.create_endpoint(engine, Endpoint(name="cand", url="http://c", kind="bi-kv"))
    await queries.create_endpoint(engine, Endpoint(name="control", url="http://k", kind="control"))
    exchanges, observations = [], []
    for s in range(SESSIONS):
        for turn in range(TURNS):
            at = now - 200 + s * 10 + turn
            xid = f"x{s:02d}{turn}"
            replica = "b-mirror-1" if s in SPLIT and turn % 2 else "a-mirror-1"
            exchanges.append(exchange_row(ExchangeRecord(
                id=xid, received_at=at, route="/v1/chat/completions", model="m",
                temperature=0.0, replica=replica, targets=("cand", "control"),
                session_key=f"{s + 1:032x}", turn_index=turn,
            )))  # fmt: skip
            observations.append(_obs(xid, "live", "production", at, 0.2))
            observations.append(_obs(xid, "control", "candidate", at, 0.2))
            observations.append(_obs(xid, "cand", "candidate", at, 0.2 if turn == 0 else 0.1))
    async with engine.begin() as conn:
        await conn.execute(insert(ExchangeRow), exchanges)
        await conn.execute(insert(ObservationRow), observations)


async def test_split_sessions_are_reported_and_left_out_by_turn(db_engine: AsyncEngine) -> None:
    """The loader marks the split sessions' pairs; the report counts 3 sessions and 12 of 48
    pairs (25 %), its by-turn table and turn metrics use only the 9 whole sessions and say why,
    and a caveat names the cause and the fix."""
    now = time.time()
    await _fleet_history(db_engine, now)
    pairs = await load_pairs(db_engine, "cand", since=0.0)
    assert pairs.n == SESSIONS * TURNS
    assert int(pairs.split[: pairs.n].sum()) == len(SPLIT) * TURNS
    report = await evaluate(
        db_engine, "cand", since=0.0, settings=VerdictSettings(), planned_look=True
    )
    p = report.pairs
    assert (p.split_sessions, p.split_pairs, p.split_share) == (3, 12, 0.25)
    assert sum(int(row["n"] or 0) for row in report.ttft_by_turn) == (SESSIONS - 3) * TURNS
    later = report.metrics["ttft_later_turns"]
    first = report.metrics["ttft_first_turn"]
    assert later.n == (SESSIONS - 3) * (TURNS - 1) and first.n == SESSIONS - 3
    assert later.notes == [f"9 {SPLIT_REASON}"] and first.notes == [f"3 {SPLIT_REASON}"]
    assert report.metrics["ttft"].n == SESSIONS * TURNS  # other metrics keep every pair
    (caveat,) = [c for c in report.caveats if "more than one gateway replica" in c]
    assert caveat.startswith("3 sessions (25.0% of the pairs)") and "X-Session-ID" in caveat


async def test_each_replica_counts_the_sessions_it_shares_once(db_engine: AsyncEngine) -> None:
    """Both replicas find the 3 split sessions in the store within the window; a second check
    counts nothing new; a replica that shares none counts 0; the counter is exported."""
    now = time.time()
    await _fleet_history(db_engine, now)
    a = SplitWatch(db_engine, "a-mirror-1", every_s=5.0)
    b = SplitWatch(db_engine, "b-mirror-1", every_s=5.0)
    other = SplitWatch(db_engine, "c-mirror-1", every_s=5.0)
    for watch in (a, b, other, a, b):
        await watch.check()
    assert (a.counted, b.counted, other.counted) == (3, 3, 0)
    assert 'canary_mirror_split_sessions_total{replica="a-mirror-1"} 3' in render(
        a.prometheus_lines()
    )
    rows = await queries.session_replicas_since(db_engine, now - 500)
    shared = {k for k, r, _ in rows if r == "b-mirror-1"} & {
        k for k, r, _ in rows if r != "b-mirror-1"
    }
    assert sorted(shared) == [f"{s + 1:032x}" for s in sorted(SPLIT)]
    assert await queries.session_replicas_since(db_engine, now) == []


async def _store(engine: AsyncEngine, *turns: tuple[str, str, str, float]) -> None:
    """Exchanges (id, session key, replica, received_at)."""
    rows = [
        exchange_row(
            ExchangeRecord(
                id=xid,
                received_at=at,
                route="/v1/chat/completions",
                replica=replica,
                session_key=key,
            )
        )
        for xid, key, replica, at in turns
    ]
    async with engine.begin() as conn:
        await conn.execute(insert(ExchangeRow), rows)


async def test_a_check_reads_what_was_stored_since_the_previous_one(db_engine: AsyncEngine) -> None:
    """A session another replica joins after a check is counted at the next one from what the
    watch remembers; a check reads only the rows stored since the previous one (less LATE_S), so
    an old row stored later is left to the report, while a new watch's first check reads the
    whole window; a turn older than the window never makes a split."""
    now = time.time()
    s1, s2, s3 = "1" * 32, "2" * 32, "3" * 32
    watch = SplitWatch(db_engine, "a", every_s=5.0)
    await _store(db_engine, ("x1", s1, "a", now - 50))
    await watch.check()
    assert watch.counted == 0
    await _store(db_engine, ("x2", s1, "b", now - 1))  # b joins s1 after the check
    await watch.check()
    assert watch.counted == 1
    await _store(
        db_engine,
        ("x3", s2, "a", now - 2),
        ("x4", s2, "b", now - 200),  # stored long after its received_at
        ("x5", s3, "a", now - 1),
        ("x6", s3, "b", now - WINDOW_S - 5),  # outside the window
    )
    await watch.check()
    assert watch.counted == 1  # x4 predates what this check reads
    fresh = SplitWatch(db_engine, "a", every_s=5.0)
    await fresh.check()
    assert fresh.counted == 2  # s1 and s2; s3's other turn is older than the window
    await watch.check()
    assert watch.counted == 1


async def test_a_replica_knows_its_own_sessions_unread(db_engine: AsyncEngine) -> None:
    """After its first check a watch reads only the other replicas' rows: its own sessions come
    from the exchanges its mirror process stored (`stored`), and a split is counted whichever
    side came first, at the check after both are known."""
    now = time.time()
    s1, s2, s3 = "1" * 32, "2" * 32, "3" * 32
    watch = SplitWatch(db_engine, "a", every_s=5.0)
    await _store(db_engine, ("x0", s3, "a", now - 60))  # before a restart: the first check reads it
    await watch.check()
    assert watch.rows_read == 1
    # This replica's turns, as its mirror process stores them (the store gets them too).
    for xid, key, at in (("x1", s1, now - 3), ("x2", s2, now - 2), ("x3", None, now - 2)):
        watch.stored(key, at)
        await _store(db_engine, (xid, key, "a", at))  # type: ignore[arg-type]
    await _store(db_engine, ("x4", s1, "b", now - 1), ("x5", s3, "b", now - 1))
    await watch.check()
    assert watch.counted == 2  # s1 (stored here, then b) and s3 (from the first check, then b)
    assert watch.rows_read == 1 + 2  # b's two rows; none of this replica's
    await _store(db_engine, ("x6", s2, "b", now - 1))  # b joins s2, stored here before
    await watch.check()
    assert watch.counted == 3
    watch.stored(s2, now)  # a session already counted is not counted again
    await watch.check()
    assert watch.counted == 3


def test_what_a_watch_remembers_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_TRACKED sessions the least recently seen are forgotten, in every map."""
    monkeypatch.setattr(splits, "MAX_TRACKED", 3)
    watch = SplitWatch(None, "a", every_s=5.0)  # type: ignore[arg-type]
    now = time.time()
    rows = [(f"{i:032x}", replica, now) for i in range(10) for replica in ("a", "b")]
    assert len(watch.fold(rows, now)) == 3
    watch.note(watch.fold(rows, now), now)
    assert (len(watch._mine), len(watch._others), len(watch._seen)) == (3, 3, 3)
    for i in range(10):
        watch.stored(f"{i:032x}", now)
    assert len(watch._mine) == 3
