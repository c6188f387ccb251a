"""The SQL of a report's gradings: one row per verdict of a candidate's LLM grader (or the
control's, the grader's A/A), joined to its exchange for the arrival time and session the
statistics need, in arrival order with a pair's verdicts adjacent. Plain tuples, laid out as
`columns` says (the evaluators' `evaluators.pairs.gradings.COLUMNS`); and the complete pairs
counted by what their rows say (`pair_outcomes`: the report's accounting of every pair)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, case, false, func, null, select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.records import GRADING_OUTCOMES
from storage.models import ExchangeRow, GradingRow, ObservationRow
from storage.sql import translated


async def grading_rows(
    engine: AsyncEngine,
    endpoint: str,
    columns: Sequence[str],
    *,
    since: float | None = None,
    until: float | None = None,
) -> list[tuple[Any, ...]]:
    """The gradings of `endpoint` whose exchange arrived in [since, until): one row per order
    sent (or capped); the rows of pairs never sent to the grader (`pair_outcomes`) are not
    gradings."""
    g = GradingRow.__table__
    e = ExchangeRow.__table__
    pick = [e.c[c] if c in ("received_at", "session_key") else g.c[c] for c in columns]
    stmt = (
        select(*pick)
        .select_from(g.join(e, e.c.id == g.c.exchange_id))
        .where(g.c.endpoint == endpoint, g.c.outcome.in_(GRADING_OUTCOMES))
        .order_by(e.c.received_at, g.c.exchange_id, g.c.swapped)
    )
    if since is not None:
        stmt = stmt.where(e.c.received_at >= since)
    if until is not None:
        stmt = stmt.where(e.c.received_at < until)
    with translated(f"reading the gradings of {endpoint}"):
        async with engine.connect() as conn:
            return [tuple(r) for r in (await conn.execute(stmt)).all()]


async def pair_outcomes(
    engine: AsyncEngine,
    endpoint: str,
    *,
    since: float | None = None,
    until: float | None = None,
) -> list[tuple[bool, str | None, str | None, int]]:
    """Every complete pair of `endpoint` (an exchange of [since, until) with production's
    observation and the endpoint's), grouped by what its grading rows say: (any verdict, the
    outcome of its first order's row, any row's outcome, pairs). A pair without a row has
    both outcomes None. Rows from every replica are read alike: the counts are merged."""
    g = GradingRow.__table__
    e = ExchangeRow.__table__
    p = ObservationRow.__table__.alias("p")
    c = ObservationRow.__table__.alias("c")
    joined = (
        e.join(p, and_(p.c.exchange_id == e.c.id, p.c.arm == "production"))
        .join(c, and_(c.c.exchange_id == e.c.id, c.c.endpoint == endpoint))
        .outerjoin(g, and_(g.c.exchange_id == e.c.id, g.c.endpoint == endpoint))
    )
    per_pair = select(
        func.max(case((g.c.outcome == "graded", 1), else_=0)).label("graded"),
        func.min(case((g.c.swapped == false(), g.c.outcome), else_=null())).label("first"),
        func.min(g.c.outcome).label("any"),
    ).select_from(joined)
    if since is not None:
        per_pair = per_pair.where(e.c.received_at >= since)
    if until is not None:
        per_pair = per_pair.where(e.c.received_at < until)
    sub = per_pair.group_by(e.c.id).subquery()
    stmt = select(sub.c.graded, sub.c.first, sub.c.any, func.count()).group_by(
        sub.c.graded, sub.c.first, sub.c.any
    )
    with translated(f"counting the complete pairs of {endpoint} by grading outcome"):
        async with engine.connect() as conn:
            return [(bool(r[0]), r[1], r[2], int(r[3])) for r in (await conn.execute(stmt)).all()]
