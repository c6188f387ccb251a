"""Load aligned (production, candidate[, control]) observations from storage: the evaluators' IO.

The only evaluator module that touches the database. One streaming query (a server-side cursor,
read in partitions of `batch_size`) joins each exchange in the window to production's
observation, the candidate's and the control's; rows go straight into the compact columns of a
`PairSet` (about 150 bytes per pair), so memory stays flat whatever the number of rows.

Texts are only fetched where they can matter: when two arms' output hashes differ (divergence,
similarity) or the request asked for JSON. Equal hashes are an exact match without the text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import msgspec
from sqlalchemy import ColumnElement, and_, case, func, literal, null, or_, select
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncEngine

from evaluators.columns import ARM_FIELDS, PAIR_FIELDS, PairSetBuilder
from evaluators.types import PairSet
from storage.models import EndpointRow, ExchangeRow, MirrorCounterRow, ObservationRow
from storage.records import Endpoint

ACCOUNTING_KEYS = (
    "sampled",
    "deduplicated",
    "dropped_overflow",
    "dropped_oversize",
    "shed_overload",
    "sent",
    "pending",
    "observed_ok",
    "observed_error",
    "timed_out",
)

_ENDPOINT_FIELDS = tuple(f for f in Endpoint.__struct_fields__ if f != "verdict_overrides")


def _endpoint(row: RowMapping) -> Endpoint:
    overrides: dict[str, float] = {}
    if row["verdict_overrides"]:
        overrides = msgspec.json.decode(row["verdict_overrides"], type=dict[str, float])
    values = {name: row[name] for name in _ENDPOINT_FIELDS}
    return msgspec.convert(values | {"verdict_overrides": overrides}, Endpoint)


async def load_endpoints(
    engine: AsyncEngine, candidate: str
) -> tuple[Endpoint, Endpoint | None, Endpoint | None]:
    """(candidate, live endpoint, control) — LookupError when the candidate does not exist.

    The control is the most recently updated active endpoint of kind "control" other than the
    candidate itself (so a control's own report compares it with production).
    """
    async with engine.connect() as conn:
        rows = (await conn.execute(select(EndpointRow.__table__))).mappings().all()
    endpoints = [_endpoint(row) for row in rows]
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


async def load_accounting(engine: AsyncEngine, candidate: str) -> dict[str, int]:
    """The candidate's copy accounting: each counter summed over every replica's snapshot."""
    totals = dict.fromkeys(ACCOUNTING_KEYS, 0)
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(MirrorCounterRow.counters).where(MirrorCounterRow.endpoint == candidate)
        )
        for (raw,) in rows:
            try:
                counters = msgspec.json.decode(raw, type=dict[str, int])
            except msgspec.ValidationError:
                continue  # a snapshot from a different version: skip it rather than guess
            for name, value in counters.items():
                totals[name] = totals.get(name, 0) + value
    return totals


def _window(since: float | None, until: float | None) -> list[ColumnElement[bool]]:
    e = ExchangeRow.__table__.c
    cond: list[ColumnElement[bool]] = []
    if since is not None:
        cond.append(e.received_at >= since)
    if until is not None:
        cond.append(e.received_at < until)
    return cond


async def count_exchanges(
    engine: AsyncEngine, *, since: float | None = None, until: float | None = None
) -> int:
    """Exchanges in the window (an upper bound on the pairs load_pairs will return)."""
    async with engine.connect() as conn:
        stmt = select(func.count()).select_from(ExchangeRow.__table__).where(*_window(since, until))
        return int((await conn.execute(stmt)).scalar_one())


def _query(candidate: str, control: str | None, since: float | None, until: float | None) -> Any:
    e = ExchangeRow.__table__
    obs = ObservationRow.__table__
    p, c = obs.alias("p"), obs.alias("c")
    k = obs.alias("k") if control else None

    def differs(a: Any) -> ColumnElement[bool]:
        return and_(
            a.c.id.is_not(None),
            or_(
                a.c.output_hash.is_(None),
                p.c.output_hash.is_(None),
                a.c.output_hash != p.c.output_hash,
            ),
        )

    json_req = e.c.json_requested.is_(True)
    need_c = or_(json_req, differs(c))
    need_k = or_(json_req, differs(k)) if k is not None else literal(False)
    need_p = or_(need_c, need_k)

    def arm(a: Any, need: ColumnElement[bool]) -> list[Any]:
        cols = []
        for name in ARM_FIELDS:
            col = a.c[name]
            cols.append(case((need, col), else_=null()) if name == "output_text" else col)
        return cols

    head = [e.c[name] for name in PAIR_FIELDS]
    k_cols = arm(k, need_k) if k is not None else [null()] * len(ARM_FIELDS)
    joined = e.join(p, and_(p.c.exchange_id == e.c.id, p.c.arm == "production")).outerjoin(
        c, and_(c.c.exchange_id == e.c.id, c.c.endpoint == candidate)
    )
    if k is not None:
        joined = joined.outerjoin(k, and_(k.c.exchange_id == e.c.id, k.c.endpoint == control))
    return (
        select(*head, *arm(p, need_p), *arm(c, need_c), *k_cols)
        .select_from(joined)
        .where(*_window(since, until))
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
    similarity_max_pairs: int = 20_000,
    max_chars: int = 4000,
) -> PairSet:
    """Aligned pairs of `candidate` received in [since, until), in arrival order.

    `since` defaults to the candidate's creation (earlier exchanges were never mirrored to it),
    `until` to now. `control`: True finds the control (kind "control"), a name uses that one,
    False/None uses none. `progress` is called with the number of rows of each batch.
    Exchanges without a candidate observation younger than the candidate's timeout are
    "pending", older ones "lost". LookupError when the candidate does not exist.
    """
    cand, _live, found = await load_endpoints(engine, candidate)
    control_name = (found.name if found else None) if control is True else (control or None)
    if since is None:
        since = cand.created_at or None
    now = time.time()
    lost_before = (until if until is not None else now) - cand.timeout_s
    total = await count_exchanges(engine, since=since, until=until)
    builder = PairSetBuilder(
        total,
        has_control=control_name is not None,
        similarity_stride=max(1, math.ceil(total / max(1, similarity_max_pairs))),
        max_chars=max_chars,
        lost_before=lost_before,
    )
    stmt = _query(candidate, control_name, since, until)
    async with engine.connect() as conn:
        result = await conn.stream(stmt.execution_options(yield_per=batch_size))
        async for part in result.partitions(batch_size):
            builder.add(part)
            if progress is not None:
                progress(len(part))
    return builder.finish()
