"""The SQL of a report's gradings: one row per verdict of a candidate's LLM grader (or the
control's, the grader's A/A), joined to its exchange for the arrival time and session the
statistics need, in arrival order with a pair's verdicts adjacent. Plain tuples, laid out as
`columns` says (the evaluators' `evaluators.pairs.gradings.COLUMNS`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from storage.models import ExchangeRow, GradingRow
from storage.sql import translated


async def grading_rows(
    engine: AsyncEngine,
    endpoint: str,
    columns: Sequence[str],
    *,
    since: float | None = None,
    until: float | None = None,
) -> list[tuple[Any, ...]]:
    """The gradings of `endpoint` whose exchange arrived in [since, until)."""
    g = GradingRow.__table__
    e = ExchangeRow.__table__
    pick = [e.c[c] if c in ("received_at", "session_key") else g.c[c] for c in columns]
    stmt = (
        select(*pick)
        .select_from(g.join(e, e.c.id == g.c.exchange_id))
        .where(g.c.endpoint == endpoint)
        .order_by(e.c.received_at, g.c.exchange_id, g.c.swapped)
    )
    if since is not None:
        stmt = stmt.where(e.c.received_at >= since)
    if until is not None:
        stmt = stmt.where(e.c.received_at < until)
    with translated(f"reading the gradings of {endpoint}"):
        async with engine.connect() as conn:
            return [tuple(r) for r in (await conn.execute(stmt)).all()]
