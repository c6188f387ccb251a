"""The one bounded batch writer (storage/batch.py) on the capture path, on real SQLite and
PostgreSQL: records pulled from the owner's queue are written in batches and counted on the
owner's counters; without retry a refused batch costs itself, counted, and the writer goes on;
what is still queued at shutdown is written."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from domain.capture import CaptureRecord
from storage.capacity.captures import CaptureWriter
from storage.queries import count_rows
from storage.writer import ObservationWriter
from tests.storage.test_storage_writer import wait_until


def capture(i: int, body: Any = '{"messages": []}') -> CaptureRecord:
    now = time.time()
    return CaptureRecord(
        exchange_id=f"cap-{i:06d}",
        session_key=f"s{i}",
        turn_index=0,
        received_at=now,
        answered_at=now + 0.1,
        route="/v1/chat/completions",
        model="m",
        targets=("a",),
        body=body,
        headers="{}",
        body_bytes=10,
    )


class Source:
    """A stand-in for the capture sink's side the writer sees: a queue it pulls from, and the
    counters it reports into."""

    def __init__(self) -> None:
        self.queue: deque[CaptureRecord] = deque()
        self.counts: dict[str, int] = {}
        self.stored_bytes = -1

    def take(self, n: int) -> list[CaptureRecord]:
        return [self.queue.popleft() for _ in range(min(n, len(self.queue)))]

    def count(self, key: str, n: int) -> None:
        self.counts[key] = self.counts.get(key, 0) + n

    def set_stored_bytes(self, value: int) -> None:
        self.stored_bytes = value


def writer(engine: AsyncEngine, source: Source) -> CaptureWriter:
    return CaptureWriter(
        engine,
        source.take,
        batch_size=50,
        flush_interval_s=0.02,
        retention_s=3600.0,
        purge_interval_s=60.0,
        on_stored_bytes=source.set_stored_bytes,
        on_count=source.count,
    )


async def test_both_paths_share_the_batch_writer() -> None:
    from storage.batch import BatchWriter

    assert issubclass(CaptureWriter, BatchWriter) and issubclass(ObservationWriter, BatchWriter)


async def test_pulled_records_are_written_in_batches(db_engine: AsyncEngine) -> None:
    source = Source()
    w = writer(db_engine, source)
    await w.start()
    assert source.stored_bytes == 0  # the first purge ran before any body was accepted
    source.queue.extend(capture(i) for i in range(130))
    await wait_until(lambda: source.counts.get("written") == 130)
    assert await count_rows(db_engine, "captures") == 130
    assert w.counts["batches"] >= 3  # 130 records in batches of at most 50
    await w.close()
    assert source.counts.get("write_failed", 0) == 0


async def test_a_refused_batch_costs_itself_and_the_writer_goes_on(
    db_engine: AsyncEngine,
) -> None:
    """Captures are a sample: no retry; the refused batch is counted as write_failed."""
    source = Source()
    w = writer(db_engine, source)
    source.queue.extend([capture(0), capture(1, body=None)])  # NOT NULL body: refused
    await w.start()
    await wait_until(lambda: source.counts.get("write_failed") == 2)
    assert w.counts["retries"] == 0 and w.counts["db_errors"] == 1
    source.queue.extend(capture(i) for i in range(2, 12))
    await wait_until(lambda: source.counts.get("written") == 10)
    await w.close()
    assert await count_rows(db_engine, "captures") == 10


async def test_close_writes_what_is_queued(db_engine: AsyncEngine) -> None:
    source = Source()
    w = writer(db_engine, source)
    await w.start()
    source.queue.extend(capture(i) for i in range(120))
    await w.close(timeout_s=10.0)
    assert source.counts.get("written") == 120 and not source.queue
    assert await count_rows(db_engine, "captures") == 120
