"""Honest coverage after a crash (issue item 9): a replica killed between two counter flushes
leaves stored pairs its counters never saw; the report marks it stale and its coverage never
exceeds what the pairs support. Real SQLite file, real storage queries, real evaluation."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import insert, update

from domain.endpoint import Endpoint
from domain.records import ExchangeRecord, ObservationRecord
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs.load import load_accounting
from evaluators.report.build import evaluate
from storage import queries
from storage.engine import make_engine, upgrade
from storage.models import ExchangeRow, MirrorCounterRow, ObservationRow
from storage.textguard import exchange_row, observation_row


def _obs(xid: str, endpoint: str, arm: str, at: float) -> dict[str, object]:
    record = ObservationRecord(
        exchange_id=xid, endpoint=endpoint, arm=arm, started_at=at, status=200,  # type: ignore[arg-type]
        ttft_s=0.05, e2e_s=0.2, output_tokens=10, finish_reason="stop", output_text="same",
    )  # fmt: skip
    return observation_row(record, store_text=True, max_chars=4096)


async def _crashed_replica(db_url: str, now: float) -> tuple[int, int]:
    """Replica `r1` flushed its counters (100 sampled, 100 observed) 300 s ago, then stored
    400 more exchanges for `cand` (360 observed, 40 lost with the crash) and died."""
    await upgrade(db_url)
    engine = make_engine(db_url)
    try:
        await queries.create_endpoint(engine, Endpoint(name="live", url="http://l", role="live"))
        await queries.create_endpoint(engine, Endpoint(name="cand", url="http://c"))
        counters = {"sampled": 100, "sent": 100, "observed_ok": 100}
        await queries.upsert_counters(engine, "r1", {"cand": counters})
        exchanges, observations = [], []
        for i in range(500):
            at = now - 400 + i * 0.5
            xid = f"x{i:05d}"
            exchanges.append(exchange_row(ExchangeRecord(
                id=xid, received_at=at, route="/v1/chat/completions", model="m",
                temperature=0.0, replica="r1", targets=("cand",),
            )))  # fmt: skip
            observations.append(_obs(xid, "live", "production", at))
            if i < 460:
                observations.append(_obs(xid, "cand", "candidate", at))
        async with engine.begin() as conn:
            await conn.execute(insert(ExchangeRow), exchanges)
            await conn.execute(insert(ObservationRow), observations)
            await conn.execute(update(MirrorCounterRow).values(updated_at=now - 300))
    finally:
        await engine.dispose()
    return 460, 40


async def test_a_crashed_replica_is_stale_and_coverage_follows_the_pairs(tmp_path: Path) -> None:
    """The killed replica is counted in `stale_replicas`, and the report's coverage is at most
    present / (present + lost), not the 100 % its last counter flush claims."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'crash.db'}"
    now = time.time()
    present, lost = await _crashed_replica(db_url, now)
    engine = make_engine(db_url)
    try:
        accounting = await load_accounting(engine, "cand", now=now)
        assert accounting["stale_replicas"] == 1
        report = await evaluate(engine, "cand", since=0.0, settings=VerdictSettings())
    finally:
        await engine.dispose()
    assert report.accounting["stale_replicas"] == 1
    assert report.pairs.coverage is not None
    assert report.pairs.coverage <= present / (present + lost)


async def test_a_replica_that_stopped_cleanly_is_not_stale(tmp_path: Path) -> None:
    """A replica whose last flush came after its last exchange (a clean shutdown) is not
    stale, however old the flush."""
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'clean.db'}"
    now = time.time()
    await _crashed_replica(db_url, now)
    engine = make_engine(db_url)
    try:
        async with engine.begin() as conn:
            await conn.execute(update(MirrorCounterRow).values(updated_at=now - 100))
        accounting = await load_accounting(engine, "cand", now=now)
    finally:
        await engine.dispose()
    assert accounting["stale_replicas"] == 0
