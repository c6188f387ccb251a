"""Report segments (`report_segments`): the SQL behind `evaluators.pairs.segments`.

A segment is one candidate's pairs received in [starts_at, ends_at), stored as the report's
columns. What this module answers is whether a stored segment still describes the rows, from
two facts that only grow when rows are added (exchanges and observations are insert-only):

- the count of all exchanges in the span (an index-only range scan on `exchanges.received_at`);
- the count of the span's observations with id > watermark - RECHECK_IDS, where the watermark is
  the newest observation id when the segment was last checked. Ids come from a sequence, so on
  PostgreSQL a transaction that took a lower id can commit after a higher one is visible; the
  RECHECK_IDS below the watermark are counted again to see such late commits (a writer's batch
  is far smaller), and a count that grew means a new observation.

A stored segment whose counts still match is the rows' columns; any other is recomputed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
from numpy.typing import NDArray
from sqlalchemy import (
    BigInteger,
    Integer,
    and_,
    bindparam,
    cast,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.errors import StorageError
from storage.models import Base
from storage.sql import translated

SEGMENTS = Base.metadata.tables["report_segments"]
EXCHANGES = Base.metadata.tables["exchanges"]
OBSERVATIONS = Base.metadata.tables["observations"]
# Observation ids below a watermark counted again at every check (see the module docstring).
RECHECK_IDS = 10_000


class SegmentMeta(msgspec.Struct, frozen=True):
    """A stored segment without its columns."""

    id: int
    starts_at: float
    ends_at: float
    exchanges: int
    watermark: int
    recent: int
    rows: int
    sample_size: int


async def stored(
    engine: AsyncEngine, candidate: str, control: str, params: str, since: float, until: float
) -> list[SegmentMeta]:
    """The stored segments of (candidate, control, params) inside [since, until)."""
    s = SEGMENTS.c
    stmt = (
        select(
            s.id,
            s.starts_at,
            s.ends_at,
            s.exchanges,
            s.watermark,
            s.recent,
            s.rows,
            s.sample_size,
        )
        .where(
            s.candidate == candidate,
            s.control == control,
            s.params == params,
            s.starts_at >= since,
            s.ends_at <= until,
        )
        .order_by(s.starts_at)
    )
    with translated("reading report segments"):
        async with engine.connect() as conn:
            return [SegmentMeta(*row) for row in await conn.execute(stmt)]


async def exchange_counts(
    engine: AsyncEngine, grid_s: float, since: float, until: float
) -> dict[int, int]:
    """Exchanges per grid cell (received_at // grid_s) with received_at in [since, until)."""
    e = EXCHANGES.c
    if engine.dialect.name == "postgresql":
        cell: Any = cast(func.floor(e.received_at / grid_s), BigInteger)
    else:  # SQLite truncates toward zero: the same as floor for arrival times (positive)
        cell = cast(e.received_at / grid_s, Integer)
    stmt = (
        select(cell, func.count())
        .where(e.received_at >= since, e.received_at < until)
        .group_by(cell)
    )
    with translated("counting exchanges per report segment"):
        async with engine.connect() as conn:
            return {int(k): int(n) for k, n in await conn.execute(stmt)}


async def exchange_count(engine: AsyncEngine, since: float, until: float | None) -> int:
    """Exchanges with received_at in [since, until) (None: no upper bound)."""
    e = EXCHANGES.c
    stmt = select(func.count()).where(e.received_at >= since)
    if until is not None:
        stmt = stmt.where(e.received_at < until)
    with translated("counting exchanges"):
        async with engine.connect() as conn:
            return int((await conn.execute(stmt)).scalar_one())


async def max_observation_id(engine: AsyncEngine) -> int:
    with translated("reading the newest observation id"):
        async with engine.connect() as conn:
            value = (await conn.execute(select(func.max(OBSERVATIONS.c.id)))).scalar_one()
    return int(value or 0)


async def observed_since(
    engine: AsyncEngine, watermark: int, endpoints: Sequence[str], since: float, until: float
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """(observation id, its exchange's received_at) of the observations of `endpoints` (and of
    production) with id > watermark whose exchange arrived in [since, until).

    The arrival window is applied here, not in SQL: the query must walk observations by id
    (the few newer than the watermark) and look each exchange up by key, never scan the
    exchanges by arrival time (which a planner may prefer when the window is in the query)."""
    o, e = OBSERVATIONS.c, EXCHANGES.c
    stmt = (
        select(o.id, e.received_at)
        .select_from(OBSERVATIONS.join(EXCHANGES, e.id == o.exchange_id))
        .where(o.id > watermark, or_(o.arm == "production", o.endpoint.in_(list(endpoints))))
    )
    with translated("reading observations newer than the report segments"):
        async with engine.connect() as conn:
            rows = (await conn.execute(stmt)).all()
    ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
    times = np.fromiter((r[1] for r in rows), np.float64, len(rows))
    keep = (times >= since) & (times < until)
    return ids[keep], times[keep]


async def blobs(engine: AsyncEngine, ids: Sequence[int]) -> dict[int, bytes]:
    """The columns of these segments, by id."""
    with translated("reading report segments"):
        async with engine.connect() as conn:
            rows = await conn.execute(
                select(SEGMENTS.c.id, SEGMENTS.c.data).where(SEGMENTS.c.id.in_(list(ids)))
            )
            return {int(i): bytes(data) for i, data in rows}


async def put(
    engine: AsyncEngine,
    *,
    candidate: str,
    control: str,
    params: str,
    starts_at: float,
    ends_at: float,
    exchanges: int,
    watermark: int,
    recent: int,
    rows: int,
    sample_size: int,
    data: bytes,
) -> bool:
    """Store a segment, replacing the one of the same span; False when a concurrent writer
    (another replica's report process) stored it first."""
    s = SEGMENTS.c
    key = and_(
        s.candidate == candidate,
        s.control == control,
        s.params == params,
        s.starts_at == starts_at,
        s.ends_at == ends_at,
    )
    values = {
        "candidate": candidate,
        "control": control,
        "params": params,
        "starts_at": starts_at,
        "ends_at": ends_at,
        "exchanges": exchanges,
        "watermark": watermark,
        "recent": recent,
        "rows": rows,
        "sample_size": sample_size,
        "computed_at": time.time(),
        "data": data,
    }
    try:
        with translated("storing a report segment"):
            async with engine.begin() as conn:
                await conn.execute(delete(SEGMENTS).where(key))
                await conn.execute(insert(SEGMENTS).values(values))
    except StorageError as exc:  # a lost race is the one error expected here
        if isinstance(exc.__cause__, IntegrityError):
            return False
        raise
    return True


async def advance(engine: AsyncEngine, checked: Sequence[tuple[int, int, int]]) -> None:
    """Segments (id, watermark, recent) found still valid, checked up to a newer watermark."""
    if not checked:
        return
    s = SEGMENTS.c
    stmt = (
        update(SEGMENTS)
        .where(s.id == bindparam("sid"))
        .values(watermark=bindparam("w"), recent=bindparam("r"))
    )
    rows = [{"sid": i, "w": w, "r": r} for i, w, r in checked]
    with translated("advancing report segments"):
        async with engine.begin() as conn:
            await conn.execute(stmt, rows)


async def forget(engine: AsyncEngine, name: str) -> None:
    """Drop the segments of an endpoint (as candidate or control)."""
    s = SEGMENTS.c
    with translated(f"dropping the report segments of {name!r}"):
        async with engine.begin() as conn:
            await conn.execute(delete(SEGMENTS).where(or_(s.candidate == name, s.control == name)))
