"""Load aligned (production, candidate[, control]) observations from storage: the evaluators' IO.

The only evaluator module that touches the database. One streaming query (a server-side cursor,
read in partitions of `batch_size`) joins each exchange in the window to production's
observation, the candidate's and the control's; rows go straight into the compact columns of a
`PairSet` (about 200 bytes per pair), so memory stays flat whatever the number of rows.

Texts are only fetched where they can matter: when two arms' output hashes differ (divergence,
similarity) or the request asked for JSON. Equal hashes are an exact match without the text.

Split sessions: a session whose turns were stored by more than one gateway replica
(`exchanges.replica`, the host's mirror process) is marked in `PairSet.split` by a second,
grouped query; its turns could reach the candidate out of order or at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, and_, case, func, literal, null, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from domain.accounting import ACCOUNTING_KEYS
from domain.capture import CapacitySummary
from domain.endpoint import Endpoint
from evaluators.pairs.columns import (
    ARM_FIELDS,
    PAIR_FIELDS,
    PRODUCTION_UNUSED_WITH_CONTROL,
    PairSetBuilder,
    sample_fraction,
    sample_suffixes,
    session_ids,
)
from evaluators.pairs.types import PairSet
from storage import queries
from storage.models import ExchangeRow, MirrorCounterRow, ObservationRow


async def load_endpoints(
    engine: AsyncEngine, candidate: str
) -> tuple[Endpoint, Endpoint | None, Endpoint | None]:
    """(candidate, live endpoint, control) — LookupError when the candidate does not exist.

    The control is the most recently updated active endpoint of kind "control" other than the
    candidate itself (so a control's own report compares it with production).
    """
    _, endpoints = await queries.load_endpoints(engine)
    by_name = {ep.name: ep for ep in endpoints}
    if candidate not in by_name:
        raise LookupError(f"no candidate named {candidate!r}")
    live = next((ep for ep in endpoints if ep.role == "live"), None)
    controls = [
        ep
        for ep in endpoints
        if ep.kind == "control" and ep.name != candidate and ep.role == "candidate"
    ]
    controls.sort(key=lambda ep: (ep.state == "active", ep.updated_at), reverse=True)
    return by_name[candidate], live, controls[0] if controls else None


# A replica's counters are stale when its last snapshot is older than this (the age after which
# its gauges stop counting: a dozen flush intervals at the default) while its exchanges for the
# candidate kept arriving after the snapshot, i.e. it died (kill -9, OOM) without a final flush.
STALE_COUNTERS_AFTER_S = queries.GAUGE_MAX_AGE_S
STALE_REPLICAS = "stale_replicas"  # accounting key: replicas whose counters lag their pairs


async def load_accounting(
    engine: AsyncEngine, candidate: str, *, now: float | None = None
) -> dict[str, int]:
    """The candidate's copy accounting: each counter summed over every replica's snapshot, and
    `stale_replicas`, how many replicas' counters lag the exchanges they stored (then the
    counters under-count and the report must not trust them for coverage)."""
    totals = dict.fromkeys(ACCOUNTING_KEYS, 0)
    totals.update((await queries.sum_counters(engine, now=now)).get(candidate, {}))
    totals[STALE_REPLICAS] = await _stale_replicas(engine, candidate, now)
    return totals


async def _stale_replicas(engine: AsyncEngine, candidate: str, now: float | None) -> int:
    e = ExchangeRow.__table__
    m = MirrorCounterRow.__table__
    old = (time.time() if now is None else now) - STALE_COUNTERS_AFTER_S
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
    async with engine.connect() as conn:
        return int((await conn.execute(stmt)).scalar_one())


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
    engine: AsyncEngine, candidate: str, *, since: float | None = None, until: float | None = None
) -> int:
    """How many rows load_pairs will read for the candidate in the window."""
    e, c, cond = _candidate_rows(candidate, since, until)
    joined = e.outerjoin(c, and_(c.c.exchange_id == e.c.id, c.c.endpoint == candidate))
    async with engine.connect() as conn:
        stmt = select(func.count()).select_from(joined).where(*cond)
        return int((await conn.execute(stmt)).scalar_one())


def _query(
    candidate: str,
    control: str | None,
    since: float | None,
    until: float | None,
    suffixes: tuple[str, ...] | None,
) -> Any:
    """The one streaming query: exchanges in arrival order with the three arms' fields.

    Hash equality with production is computed in SQL (a small integer instead of three hash
    strings per row); a text is fetched only where it will be read: JSON requested, or the
    output differs from production's and the request is at temperature 0 (first divergence)
    or in the similarity sample.
    """
    e, c, cond = _candidate_rows(candidate, since, until)
    p = ObservationRow.__table__.alias("p")
    k = ObservationRow.__table__.alias("k") if control else None
    if suffixes is None:
        sampled: ColumnElement[bool] = literal(True)
    else:
        suffix = func.substr(e.c.id, func.length(e.c.id) - 1, 2)
        sampled = suffix.in_(suffixes)

    def match(a: Any) -> Any:
        if a is None:
            return null()
        unknown = or_(a.c.output_hash.is_(None), p.c.output_hash.is_(None))
        return case((unknown, null()), (a.c.output_hash == p.c.output_hash, 1), else_=0)

    def needs_text(a: Any) -> ColumnElement[bool]:
        if a is None:
            return literal(False)
        differs = and_(
            a.c.id.is_not(None),
            or_(
                a.c.output_hash.is_(None),
                p.c.output_hash.is_(None),
                a.c.output_hash != p.c.output_hash,
            ),
        )
        return or_(e.c.json_requested.is_(True), and_(differs, or_(e.c.temperature == 0, sampled)))

    need_c, need_k = needs_text(c), needs_text(k)

    def arm(a: Any, need: ColumnElement[bool], unused: tuple[str, ...] = ()) -> list[Any]:
        if a is None:
            return [null()] * len(ARM_FIELDS)
        cols = []
        for name in ARM_FIELDS:
            col = a.c[name]
            if name in unused:
                col = null()  # a NULL costs the driver almost nothing; a number does not
            elif name in ("output_text", "text_truncated"):
                col = case((need, col), else_=null())
            cols.append(col)
        return cols

    head = [e.c[name] for name in PAIR_FIELDS[:-1]] + [sampled]
    p_unused = PRODUCTION_UNUSED_WITH_CONTROL if k is not None else ()
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


async def load_pairs(
    engine: AsyncEngine,
    candidate: str,
    *,
    since: float | None = None,
    until: float | None = None,
    batch_size: int = 5000,
    progress: Callable[[int], None] | None = None,
    control: str | bool | None = True,
    similarity_max_pairs: int = 10_000,
    max_chars: int = 4000,
    expected_rows: int | None = None,
) -> PairSet:
    """Aligned pairs of `candidate` received in [since, until), in arrival order.

    The rows are the exchanges whose copy the candidate's ring accepted (`exchanges.targets`)
    or that the candidate observed; an accepted copy without an observation is lost.

    `since` defaults to the candidate's creation (earlier exchanges were never mirrored to it),
    `until` to now. `control`: True finds the control (kind "control"), a name uses that one,
    False/None uses none. `progress` is called with the number of rows of each batch.
    Exchanges without a candidate observation younger than the candidate's timeout are
    "pending", older ones "lost". `expected_rows` (from `count_pairs`) saves a second count.
    LookupError when the candidate does not exist.
    """
    cand, _live, found = await load_endpoints(engine, candidate)
    control_name = (found.name if found else None) if control is True else (control or None)
    if since is None:
        since = cand.created_at or None
    now = time.time()
    lost_before = (until if until is not None else now) - cand.timeout_s
    total = expected_rows
    if total is None:
        total = await count_pairs(engine, candidate, since=since, until=until)
    suffixes = sample_suffixes(similarity_max_pairs / max(1, total))
    builder = PairSetBuilder(
        total,
        has_control=control_name is not None,
        similarity_fraction=sample_fraction(suffixes),
        max_chars=max_chars,
        lost_before=lost_before,
    )
    stmt = _query(candidate, control_name, since, until, suffixes)
    async with engine.connect() as conn:
        batches = _batches(conn, stmt, batch_size)
        # The next batch is fetched while this one is converted: the driver's thread (aiosqlite)
        # or socket (asyncpg) works while numpy does. At most one batch waits: memory stays flat.
        # Converting runs in a worker thread so a report read inside a running gateway (admin
        # API) never holds its event loop for a whole batch.
        async with asyncio.TaskGroup() as tasks:
            ahead = tasks.create_task(anext(batches, None))
            while part := await ahead:
                ahead = tasks.create_task(anext(batches, None))
                await asyncio.to_thread(builder.add, part)
                if progress is not None:
                    progress(len(part))
    pairs = builder.finish()
    split = await split_sessions(engine, candidate, since=since, until=until)
    if split:
        sessions = pairs.session[: pairs.n]
        pairs.split[: pairs.n] = (sessions != 0) & np.isin(sessions, session_ids(split))
    return pairs


async def split_sessions(
    engine: AsyncEngine, candidate: str, *, since: float | None = None, until: float | None = None
) -> list[str]:
    """The session keys among the candidate's pairs in the window whose exchanges more than one
    gateway replica stored: split sessions (a balancer not keyed on the session)."""
    e, c, cond = _candidate_rows(candidate, since, until)
    joined = e.outerjoin(c, and_(c.c.exchange_id == e.c.id, c.c.endpoint == candidate))
    stmt = (
        select(e.c.session_key)
        .select_from(joined)
        .where(*cond, e.c.session_key.is_not(None))
        .group_by(e.c.session_key)
        .having(func.count(func.distinct(e.c.replica)) > 1)
    )
    async with engine.connect() as conn:
        return [str(key) for key in (await conn.scalars(stmt)).all()]


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


async def load_capacity(engine: AsyncEngine, candidate: str) -> CapacitySummary | None:
    """The candidate's newest `canary capacity` result younger than CAPACITY_MAX_AGE_S."""
    from evaluators.metrics.cost import CAPACITY_MAX_AGE_S
    from storage.capacity import latest_capacity

    return await latest_capacity(engine, candidate, since=time.time() - CAPACITY_MAX_AGE_S)
