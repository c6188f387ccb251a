"""Capacity results: one row per `canary capacity` run, the newest per endpoint read by the
report's cost metric. Never computes anything; the numbers come from evaluators.capacity.
"""

from __future__ import annotations

from typing import Any

import msgspec
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.capture import CapacitySummary
from storage.models import Base
from storage.sql import translated

CAPACITY_RESULTS = Base.metadata.tables["capacity_results"]
_FIELDS = tuple(f for f in CapacitySummary.__struct_fields__ if f != "id")


async def save_capacity(engine: AsyncEngine, values: dict[str, Any]) -> int:
    """Store one run (`values` holds CapacitySummary's fields less `id`); returns its id."""
    row = {k: values.get(k) for k in _FIELDS}
    with translated("storing a capacity result"):
        async with engine.begin() as conn:
            result = await conn.execute(
                insert(CAPACITY_RESULTS).values(**row).returning(CAPACITY_RESULTS.c.id)
            )
            return int(result.scalar_one())


async def latest_capacity(
    engine: AsyncEngine, endpoint: str, *, since: float | None = None
) -> CapacitySummary | None:
    """The newest run for `endpoint` (taken at or after `since`, when given), or None."""
    t = CAPACITY_RESULTS
    query = select(t).where(t.c.endpoint == endpoint).order_by(t.c.created_at.desc()).limit(1)
    if since is not None:
        query = query.where(t.c.created_at >= since)
    with translated(f"reading the capacity result of {endpoint!r}"):
        async with engine.connect() as conn:
            row = (await conn.execute(query)).mappings().first()
    if row is None:
        return None
    return msgspec.convert(dict(row), CapacitySummary)
