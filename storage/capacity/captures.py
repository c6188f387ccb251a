"""Captured request bodies: the bounded writer that stores them and the queries that read whole
conversations back for replay.

`CaptureWriter` is a `storage.batch.BatchWriter` whose one stream pulls redacted records from a
source callable (the capture sink's `take`, so nothing of the request path waits on it),
inserts them in batches with INSERT … ON CONFLICT DO NOTHING, and every `purge_interval_s`
deletes rows older than the retention age and reports the bytes still stored (the sink's byte
budget). A failed write drops the batch and counts it (`write_failed`): captures are a sample,
and the sink's queue bound keeps memory bounded.
It never logs a body or a header.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.capture import CapturedSession, CapturedTurn, CaptureRecord
from storage.batch import BatchWriter, Stream
from storage.models import Base
from storage.sql import insert_ignore, translated

logger = logging.getLogger(__name__)

CAPTURES = Base.metadata.tables["captures"]


def capture_row(record: CaptureRecord) -> dict[str, Any]:
    return {
        "exchange_id": record.exchange_id,
        "captured_at": record.answered_at,
        "session_key": record.session_key,
        "turn_index": record.turn_index,
        "received_at": record.received_at,
        "answered_at": record.answered_at,
        "route": record.route,
        "model": record.model,
        "targets": "," + ",".join(record.targets) + "," if record.targets else "",
        "body": record.body,
        "headers": record.headers,
        "body_bytes": record.body_bytes,
    }


async def insert_captures(engine: AsyncEngine, records: Sequence[CaptureRecord]) -> None:
    if not records:
        return
    with translated("storing captures"):
        async with engine.begin() as conn:
            await conn.execute(
                insert_ignore(engine.dialect.name, CAPTURES), [capture_row(r) for r in records]
            )


async def purge_captures(engine: AsyncEngine, older_than: float) -> tuple[int, int]:
    """Delete captures taken before `older_than`; return (rows deleted, bytes still stored)."""
    with translated("purging captures"):
        async with engine.begin() as conn:
            deleted = await conn.execute(
                delete(CAPTURES).where(CAPTURES.c.captured_at < older_than)
            )
            stored = await conn.scalar(select(func.coalesce(func.sum(CAPTURES.c.body_bytes), 0)))
    return int(deleted.rowcount or 0), int(stored or 0)


async def capture_stats(engine: AsyncEngine) -> tuple[int, int, int]:
    """(captured turns, conversations, bytes stored)."""
    with translated("counting captures"):
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    select(
                        func.count(),
                        func.count(func.distinct(CAPTURES.c.session_key)),
                        func.coalesce(func.sum(CAPTURES.c.body_bytes), 0),
                    )
                )
            ).one()
    return int(row[0]), int(row[1]), int(row[2])


async def load_sessions(
    engine: AsyncEngine,
    *,
    candidate: str | None = None,
    since: float | None = None,
    limit: int = 1000,
) -> list[CapturedSession]:
    """Up to `limit` conversations, newest first, each with its turns in order from turn 0.

    A conversation is cut at the first missing turn (a turn refused by the byte budget, say),
    so every replayed turn carries the history its engine would have seen. `candidate` keeps
    the conversations mirrored to that candidate. Think time of turn k is the gap between the
    end of production's answer to turn k-1 and the arrival of turn k (never negative)."""
    c = CAPTURES.c
    query = select(
        c.session_key, c.turn_index, c.received_at, c.answered_at, c.route, c.body
    ).order_by(c.session_key, c.turn_index, c.received_at)
    if candidate is not None:
        query = query.where(c.targets.like(f"%,{candidate},%"))
    if since is not None:
        query = query.where(c.captured_at >= since)
    sessions: dict[str, list[tuple[int, float, float, str, str]]] = {}
    with translated("loading captures"):
        async with engine.connect() as conn:
            for row in await conn.execute(query):
                sessions.setdefault(row[0], []).append((row[1], row[2], row[3], row[4], row[5]))
    out: list[tuple[float, CapturedSession]] = []
    for key, rows in sessions.items():
        turns: list[CapturedTurn] = []
        prev_answered: float | None = None
        for expected, (turn, received, answered, route, body) in enumerate(_first_per_turn(rows)):
            if turn != expected:
                break
            think = 0.0 if prev_answered is None else max(0.0, received - prev_answered)
            turns.append(CapturedTurn(route=route, body=body.encode(), think_s=think))
            prev_answered = answered
        if turns:
            out.append((rows[0][1], CapturedSession(session_key=key, turns=tuple(turns))))
    out.sort(key=lambda item: item[0], reverse=True)
    return [s for _, s in out[:limit]]


def _first_per_turn(
    rows: list[tuple[int, float, float, str, str]],
) -> list[tuple[int, float, float, str, str]]:
    """One row per turn index (the earliest; a retried turn is stored twice)."""
    out: list[tuple[int, float, float, str, str]] = []
    for row in rows:
        if not out or out[-1][0] != row[0]:  # rows come ordered by turn, then arrival
            out.append(row)
    return out


class CaptureWriter(BatchWriter):
    """Drains a capture source into the database; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        take: Callable[[int], list[CaptureRecord]],
        *,
        batch_size: int,
        flush_interval_s: float,
        retention_s: float,
        purge_interval_s: float,
        on_stored_bytes: Callable[[int], None],
        on_count: Callable[[str, int], None],
    ) -> None:
        # The sink keeps the bounded queue (records and bytes); this writer only pulls from it.
        stream = Stream("capture", CAPTURES, capture_row, "written", "write_failed", pull=take)
        super().__init__(
            engine,
            (stream,),
            batch_size=batch_size,
            flush_interval_s=flush_interval_s,
            queue_max=0,
            retry=False,  # captures are a sample: a failed batch costs itself, counted
            name="capture writer",
            on_count=on_count,
        )
        self._retention_s = retention_s
        self._purge_interval_s = purge_interval_s
        self._on_stored_bytes = on_stored_bytes
        self._next_purge = 0.0

    async def start(self) -> None:
        if self._task is None:
            await self._purge()  # learn what is already stored before accepting new bodies
            self._next_purge = time.monotonic() + self._purge_interval_s
        await super().start()

    async def tick(self) -> None:
        if time.monotonic() >= self._next_purge:
            self._next_purge = time.monotonic() + self._purge_interval_s
            await self._purge()

    async def _purge(self) -> None:
        try:
            deleted, stored = await purge_captures(self._engine, time.time() - self._retention_s)
        except Exception:
            logger.warning("capture writer: purge failed; retrying at the next interval")
            return
        if self._on_count is not None:
            self._on_count("purged", deleted)
        self._on_stored_bytes(stored)
