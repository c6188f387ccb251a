"""The SQL of a report's pairs: every query `evaluators.pairs.load` runs, as plain results.

The loader pairs; this module reads. It answers with row tuples, integers, domain records and
msgspec Structs, so the evaluators import no SQLAlchemy and no driver:

- `endpoints`: every endpoint of the registry (the loader picks the candidate and control);
- `count_pairs` / `window_rows`: how many rows the streaming query reads, and the rows
  themselves in batches, through the driver's own server-side cursor;
- `counters` / `stale_replicas`: the candidate's copy accounting, summed over replicas, and how
  many replicas' counters lag the exchanges they stored;
- `capacity`: the candidate's newest `canary capacity` result young enough to trust;
- `tool_errors`: the candidate's most frequent first tool-call problems.

What a row holds is the caller's `RowLayout` (the evaluators' column order): exchange columns,
then each arm's observation columns, then whether the candidate's / control's output hash equals
production's. Hash equality is computed in SQL (a small integer instead of three hash strings
per row); a text is fetched only where it will be read: JSON requested, or the output differs
from production's and the request is at temperature 0 (first divergence) or in the similarity
sample.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, TypeAlias

import msgspec
from sqlalchemy import ColumnElement, and_, case, func, literal, null, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from domain.accounting import GAUGE_MAX_AGE_S
from domain.capture import CAPACITY_MAX_AGE_S, CapacitySummary
from domain.endpoint import Endpoint
from storage import queries
from storage.capacity.runs import latest_capacity
from storage.models import ExchangeRow, MirrorCounterRow, ObservationRow
from storage.sql import translated

# What the loader holds to name its store: the engine `storage.engine.make_engine` built.
Engine: TypeAlias = AsyncEngine

# A text column is fetched only for the rows whose texts are compared (see the docstring).
_TEXTS = ("output_text", "text_truncated")
# The exchange's id tail, computed in SQL: its place in the similarity sample.
ID_SUFFIX = "id_suffix"


class RowLayout(msgspec.Struct, frozen=True):
    """The columns of one row of `window_rows`, in order."""

    exchange: tuple[str, ...]  # exchange columns (ID_SUFFIX: the id's last two characters)
    arm: tuple[str, ...]  # observation columns, for production, candidate, then control
    # Production's columns a report with a control never reads: sent as NULL.
    unused_by_production_with_control: tuple[str, ...] = ()


async def endpoints(engine: Engine) -> list[Endpoint]:
    """Every endpoint of the registry (live, candidates, retired), by name."""
    _, found = await queries.load_endpoints(engine)
    return found


async def counters(engine: Engine, candidate: str, *, now: float | None = None) -> dict[str, int]:
    """The candidate's copy counters, each summed over every replica's snapshot (gauges only
    from replicas that reported within GAUGE_MAX_AGE_S)."""
    return (await queries.sum_counters(engine, now=now)).get(candidate, {})


async def stale_replicas(engine: Engine, candidate: str, *, now: float | None = None) -> int:
    """Replicas whose last counter snapshot is older than GAUGE_MAX_AGE_S while their
    exchanges for the candidate kept arriving after it (it died without a final flush), or
    that never reported though their exchanges are older than a report would take."""
    e = ExchangeRow.__table__
    m = MirrorCounterRow.__table__
    old = (time.time() if now is None else now) - GAUGE_MAX_AGE_S
    last = (
        select(e.c.replica, func.max(e.c.received_at).label("last"))
        .where(e.c.targets.contains(f",{candidate},", autoescape=True))
        .group_by(e.c.replica)
        .subquery()
    )
    flushed = select(m.c.replica, m.c.updated_at).where(m.c.endpoint == candidate).subquery()
    stmt = (
        select(func.count())
        .select_from(last.outerjoin(flushed, flushed.c.replica == last.c.replica))
        .where(
            or_(
                # reported, stopped reporting, and stored exchanges after its last report
                and_(flushed.c.updated_at < old, last.c.last > flushed.c.updated_at),
                # never reported, though its exchanges are older than a report would take
                and_(flushed.c.updated_at.is_(None), last.c.last < old),
            )
        )
    )
    with translated("counting stale replicas"):
        async with engine.connect() as conn:
            return int((await conn.execute(stmt)).scalar_one())


async def capacity(engine: Engine, candidate: str) -> CapacitySummary | None:
    """The candidate's newest `canary capacity` result younger than CAPACITY_MAX_AGE_S."""
    return await latest_capacity(engine, candidate, since=time.time() - CAPACITY_MAX_AGE_S)


def _candidate_rows(
    candidate: str, since: float | None, until: float | None
) -> tuple[Any, Any, list[ColumnElement[bool]]]:
    """(exchanges, the candidate's observations alias, conditions) selecting the exchanges that
    are this candidate's pairs: those its ring accepted (`targets`) or that it observed."""
    e = ExchangeRow.__table__
    c = ObservationRow.__table__.alias("c")
    cond: list[ColumnElement[bool]] = [
        or_(c.c.id.is_not(None), e.c.targets.contains(f",{candidate},", autoescape=True))
    ]
    if since is not None:
        cond.append(e.c.received_at >= since)
    if until is not None:
        cond.append(e.c.received_at < until)
    return e, c, cond


async def count_pairs(
    engine: Engine, candidate: str, *, since: float | None = None, until: float | None = None
) -> int:
    """How many rows `window_rows` reads for the candidate in [since, until)."""
    e, c, cond = _candidate_rows(candidate, since, until)
    joined = e.outerjoin(c, and_(c.c.exchange_id == e.c.id, c.c.endpoint == candidate))
    with translated("counting a candidate's pairs"):
        async with engine.connect() as conn:
            stmt = select(func.count()).select_from(joined).where(*cond)
            return int((await conn.execute(stmt)).scalar_one())


async def tool_errors(
    engine: Engine,
    candidate: str,
    *,
    since: float | None = None,
    until: float | None = None,
    limit: int = 5,
) -> list[tuple[str, int]]:
    """The candidate's most frequent first tool-call problems (`observations.tool_error`, value
    free) in [since, until), with their counts, most frequent first."""
    e = ExchangeRow.__table__
    o = ObservationRow.__table__
    cond: list[ColumnElement[bool]] = [
        o.c.endpoint == candidate,
        o.c.arm == "candidate",
        o.c.tool_error.is_not(None),
    ]
    if since is not None:
        cond.append(e.c.received_at >= since)
    if until is not None:
        cond.append(e.c.received_at < until)
    n = func.count().label("n")
    stmt = (
        select(o.c.tool_error, n)
        .select_from(o.join(e, e.c.id == o.c.exchange_id))
        .where(*cond)
        .group_by(o.c.tool_error)
        .order_by(n.desc(), o.c.tool_error)
        .limit(limit)
    )
    with translated("reading a candidate's tool-call problems"):
        async with engine.connect() as conn:
            return [(str(r[0]), int(r[1])) for r in await conn.execute(stmt)]


def _query(
    layout: RowLayout,
    candidate: str,
    control: str | None,
    since: float | None,
    until: float | None,
    suffixes: tuple[str, ...] | None,
) -> Any:
    """The one streaming query: exchanges in arrival order with the three arms' fields."""
    e, c, cond = _candidate_rows(candidate, since, until)
    p = ObservationRow.__table__.alias("p")
    k = ObservationRow.__table__.alias("k") if control else None
    suffix = func.substr(e.c.id, func.length(e.c.id) - 1, 2)
    sampled: ColumnElement[bool] = literal(True) if suffixes is None else suffix.in_(suffixes)

    def match(a: Any) -> Any:
        if a is None:
            return null()
        unknown = or_(a.c.output_hash.is_(None), p.c.output_hash.is_(None))
        return case((unknown, null()), (a.c.output_hash == p.c.output_hash, 1), else_=0)

    def needs_text(a: Any) -> ColumnElement[bool]:
        if a is None:
            return literal(False)
        unknown = or_(a.c.output_hash.is_(None), p.c.output_hash.is_(None))
        differs = or_(unknown, a.c.output_hash != p.c.output_hash)
        # Unknown hashes always fetch the texts: exact match never depends on the sample.
        return or_(
            e.c.json_requested.is_(True),
            and_(
                a.c.id.is_not(None),
                or_(unknown, and_(differs, or_(e.c.temperature == 0, sampled))),
            ),
        )

    need_c, need_k = needs_text(c), needs_text(k)

    def arm(a: Any, need: ColumnElement[bool], unused: tuple[str, ...] = ()) -> list[Any]:
        if a is None:
            return [null()] * len(layout.arm)
        cols = []
        for name in layout.arm:
            col = a.c[name]
            if name in unused:
                col = null()  # a NULL costs the driver almost nothing; a number does not
            elif name in _TEXTS:
                col = case((need, col), else_=null())
            cols.append(col)
        return cols

    head = [suffix if name == ID_SUFFIX else e.c[name] for name in layout.exchange]
    p_unused = layout.unused_by_production_with_control if k is not None else ()
    arms = arm(p, or_(need_c, need_k), p_unused) + arm(c, need_c) + arm(k, need_k)
    joined = e.join(p, and_(p.c.exchange_id == e.c.id, p.c.arm == "production")).outerjoin(
        c, and_(c.c.exchange_id == e.c.id, c.c.endpoint == candidate)
    )
    if k is not None:
        joined = joined.outerjoin(k, and_(k.c.exchange_id == e.c.id, k.c.endpoint == control))
    return (
        select(*head, *arms, match(c), match(k))
        .select_from(joined)
        .where(*cond)
        .order_by(e.c.received_at, e.c.id)
    )


async def window_rows(
    engine: Engine,
    layout: RowLayout,
    candidate: str,
    *,
    control: str | None,
    since: float | None,
    until: float | None,
    suffixes: tuple[str, ...] | None,
    batch_size: int,
) -> AsyncGenerator[Sequence[Sequence[Any]], None]:
    """The candidate's pairs received in [since, until), in arrival order (received_at, id), in
    batches of at most `batch_size` rows laid out as `layout` says; texts only where `suffixes`
    (None: every exchange) or the module docstring's rules ask for them."""
    stmt = _query(layout, candidate, control, since, until, suffixes)
    with translated("reading a candidate's pairs"):
        async with engine.connect() as conn:
            async for rows in _batches(conn, stmt, batch_size):
                yield rows


async def _batches(
    conn: AsyncConnection, stmt: Any, batch_size: int
) -> AsyncIterator[Sequence[Sequence[Any]]]:
    """The query's rows in batches, through a server-side cursor.

    On aiosqlite and asyncpg the compiled statement runs on the driver's own cursor: plain
    tuples / records, without SQLAlchemy's per-row Result machinery (about a tenth of the CPU
    of a million-pair report). The only bound values are names, times and id suffixes, rendered
    as escaped literals by SQLAlchemy's compiler. Other drivers use SQLAlchemy's stream.
    """
    driver = conn.dialect.driver
    if driver in ("aiosqlite", "asyncpg"):
        sql = str(stmt.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        raw: Any = (await conn.get_raw_connection()).driver_connection
        if driver == "aiosqlite":
            async with raw.execute(sql) as cursor:
                while rows := await cursor.fetchmany(batch_size):
                    yield rows
        else:
            async with raw.transaction():
                cursor = await raw.cursor(sql)
                while rows := await cursor.fetch(batch_size):
                    yield rows
        return
    result = await conn.stream(stmt.execution_options(yield_per=batch_size))
    while rows := await result.fetchmany(batch_size):
        yield rows
