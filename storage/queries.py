"""Typed control-plane queries: endpoints, the registry version, seeding, mirror counters.
Promotions and rollbacks live in `storage.promotions` and are re-exported here.

Every change is committed before the function returns and bumps `registry_meta.version` in the
same transaction. The bump is the transaction's first statement, so it doubles as a global
lock: on PostgreSQL the row lock queues concurrent changes, on SQLite the write lock is taken by
BEGIN IMMEDIATE; every check that follows reads the state the previous change committed.
No SQL strings outside storage/.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from domain.accounting import GAUGE_FIELDS, GAUGE_MAX_AGE_S, SHED_FIRST_AT, SHED_LAST_AT
from domain.endpoint import Endpoint
from domain.errors import DuplicateName, EndpointNotFound, InvalidEndpoint, PromotionConflict
from storage.engine import write_transaction
from storage.models import Base
from storage.promotions import list_promotions, promote, rollback
from storage.sql import (
    ENDPOINTS,
    MIRROR_COUNTERS,
    MUTABLE_FIELDS,
    REGISTRY_META,
    bump_version,
    endpoint_values,
    fetch,
    fetch_live,
    json_encoder,
    row_to_endpoint,
    translated,
    upsert,
    validate_endpoint,
)

__all__ = [
    "create_endpoint",
    "delete_endpoint",
    "get_endpoint",
    "list_promotions",
    "load_endpoints",
    "promote",
    "registry_version",
    "rollback",
    "seed",
    "sum_counters",
    "update_endpoint",
    "upsert_counters",
]


async def registry_version(engine: AsyncEngine) -> int:
    """The control-plane version replicas compare to decide whether to reload."""
    with translated("reading the registry version"):
        async with engine.connect() as conn:
            stmt = select(REGISTRY_META.c.version).where(REGISTRY_META.c.id == 1)
            version = (await conn.execute(stmt)).scalar_one_or_none()
    return int(version or 0)


async def load_endpoints(engine: AsyncEngine) -> tuple[int, list[Endpoint]]:
    """The registry version and every endpoint (live, candidates, retired), by name."""
    with translated("loading endpoints"):
        async with engine.connect() as conn, conn.begin():
            # Version first: if a change lands between the two reads, the endpoints are newer
            # than the version, and the next poll reloads; never the other way round.
            stmt = select(REGISTRY_META.c.version).where(REGISTRY_META.c.id == 1)
            version = (await conn.execute(stmt)).scalar_one_or_none()
            rows = (await conn.execute(select(ENDPOINTS).order_by(ENDPOINTS.c.name))).mappings()
            endpoints = [row_to_endpoint(r) for r in rows]
    return int(version or 0), endpoints


async def get_endpoint(engine: AsyncEngine, name: str) -> Endpoint:
    with translated(f"reading endpoint {name!r}"):
        async with engine.connect() as conn:
            ep = await fetch(conn, name)
    if ep is None:
        raise EndpointNotFound(name)
    return ep


async def _insert(conn: AsyncConnection, ep: Endpoint, role: str, now: float) -> Endpoint:
    stored = msgspec.structs.replace(ep, role=role, version=1, created_at=now, updated_at=now)
    validate_endpoint(stored)
    try:
        await conn.execute(insert(ENDPOINTS).values(endpoint_values(stored)))
    except IntegrityError as exc:  # the name check above holds the lock; this is the backstop
        raise DuplicateName(ep.name) from exc
    return stored


async def create_endpoint(engine: AsyncEngine, ep: Endpoint) -> Endpoint:
    """Register an endpoint (normally a candidate); returns it as stored."""
    now = time.time()
    with translated(f"creating endpoint {ep.name!r}"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            if await fetch(conn, ep.name) is not None:
                raise DuplicateName(ep.name)
            if ep.role == "live" and (live := await fetch_live(conn)) is not None:
                raise PromotionConflict(
                    f"{live.name!r} is already live; register {ep.name!r} as a candidate and "
                    "promote it",
                    reason="live_exists",
                )
            return await _insert(conn, ep, ep.role, now)


def _validated(current: Endpoint, changes: Mapping[str, Any]) -> Endpoint:
    unknown = sorted(set(changes) - MUTABLE_FIELDS)
    if unknown:
        raise InvalidEndpoint(f"cannot change {', '.join(unknown)} of an endpoint")
    return validate_endpoint(msgspec.structs.replace(current, **changes))


async def update_endpoint(engine: AsyncEngine, name: str, changes: Mapping[str, Any]) -> Endpoint:
    """Change some fields of an endpoint; its version goes up by one. The role may move between
    candidate and retired only: promote and rollback are the only ways in and out of live.
    Raises InvalidEndpoint (a ValueError) for unknown fields or values the schema cannot hold."""
    now = time.time()
    with translated(f"updating endpoint {name!r}"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            current = await fetch(conn, name)
            if current is None:
                raise EndpointNotFound(name)
            new = _validated(current, changes)
            if new.role != current.role and "live" in (new.role, current.role):
                raise PromotionConflict(
                    f"cannot change the role of {name!r} from {current.role} to {new.role}: "
                    "use promote or rollback",
                    reason="role_change",
                )
            new = msgspec.structs.replace(new, version=current.version + 1, updated_at=now)
            values = endpoint_values(new)
            del values["name"], values["created_at"]
            await conn.execute(update(ENDPOINTS).where(ENDPOINTS.c.name == name).values(values))
            return new


async def delete_endpoint(engine: AsyncEngine, name: str) -> None:
    """Remove a candidate or retired endpoint (its stored observations stay)."""
    with translated(f"deleting endpoint {name!r}"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            current = await fetch(conn, name)
            if current is None:
                raise EndpointNotFound(name)
            if current.role == "live":
                raise PromotionConflict(
                    f"{name!r} is the live endpoint; promote another endpoint before deleting it",
                    reason="is_live",
                )
            await conn.execute(delete(ENDPOINTS).where(ENDPOINTS.c.name == name))
            # Its report segments go with it: a new endpoint of that name starts afresh.
            segments = Base.metadata.tables["report_segments"]
            await conn.execute(
                delete(segments).where(
                    (segments.c.candidate == name) | (segments.c.control == name)
                )
            )


async def _seed_needed(
    engine: AsyncEngine, live: Endpoint | None, candidates: Sequence[Endpoint]
) -> bool:
    async with engine.connect() as conn:
        names = set((await conn.execute(select(ENDPOINTS.c.name))).scalars())
        has_live = await fetch_live(conn) is not None
    return (live is not None and not has_live) or any(c.name not in names for c in candidates)


async def seed(
    engine: AsyncEngine, live: Endpoint | None, candidates: Sequence[Endpoint] = ()
) -> None:
    """First-start seeding: `live` only when no endpoint is live (afterwards the stored live
    endpoint wins, so a promotion survives restarts); each candidate only when its name is
    absent. Touches nothing, and bumps no version, when there is nothing to add."""
    with translated("seeding endpoints"):
        if not await _seed_needed(engine, live, candidates):
            return
        now = time.time()
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            if live is not None and await fetch_live(conn) is None:
                await _insert(conn, live, "live", now)
            names = set((await conn.execute(select(ENDPOINTS.c.name))).scalars())
            for cand in candidates:
                if cand.name not in names:
                    await _insert(conn, cand, "candidate", now)
                    names.add(cand.name)


async def upsert_counters(
    engine: AsyncEngine, replica: str, counters: Mapping[str, Mapping[str, int]]
) -> None:
    """Store this replica's copy-accounting counters, one row per candidate (not a
    control-plane change: no version bump)."""
    if not counters:
        return
    now = time.time()
    rows = [
        {
            "replica": replica,
            "endpoint": endpoint,
            "counters": json_encoder.encode(dict(values)).decode(),
            "updated_at": now,
        }
        for endpoint, values in counters.items()
    ]
    with translated("storing mirror counters"):
        async with engine.begin() as conn:
            stmt = upsert(
                conn.dialect.name,
                MIRROR_COUNTERS,
                ("replica", "endpoint"),
                ("counters", "updated_at"),
            )
            await conn.execute(stmt, rows)


# Point-in-time values, not totals: a replica that died without its final flush would report
# its last ones forever (a copy "pending" for ever inflates coverage), so they count only while
# the replica keeps reporting. Cumulative counters always count.
GAUGES = frozenset(GAUGE_FIELDS)  # domain.accounting: point-in-time values, scoring's too
_FIRST_LAST = frozenset((SHED_FIRST_AT, SHED_LAST_AT))  # instants, merged by min and max


async def sum_counters(
    engine: AsyncEngine, *, now: float | None = None
) -> dict[str, dict[str, int]]:
    """Each candidate's counters summed over every replica that reported them; gauges only from
    replicas that reported within GAUGE_MAX_AGE_S (a stale gauge counts as 0: conservative)."""
    with translated("reading mirror counters"):
        async with engine.connect() as conn:
            stmt = select(
                MIRROR_COUNTERS.c.endpoint,
                MIRROR_COUNTERS.c.counters,
                MIRROR_COUNTERS.c.updated_at,
            )
            rows = (await conn.execute(stmt)).all()
    fresh_after = (time.time() if now is None else now) - GAUGE_MAX_AGE_S
    totals: dict[str, dict[str, int]] = {}
    for endpoint, raw, updated_at in rows:
        into = totals.setdefault(endpoint, {})
        stale = updated_at < fresh_after
        for key, value in msgspec.json.decode(raw, type=dict[str, int]).items():
            if key in _FIRST_LAST and key in into:  # when copies were shed: the span
                into[key] = min(into[key], value) if key == SHED_FIRST_AT else max(into[key], value)
                continue
            into[key] = into.get(key, 0) + (0 if stale and key in GAUGES else value)
    return totals


async def count_rows(engine: AsyncEngine, table: str) -> int:
    """Row count of one of storage's tables (status pages and tests)."""
    with translated(f"counting {table}"):
        async with engine.connect() as conn:
            stmt = select(func.count()).select_from(Base.metadata.tables[table])
            return int((await conn.execute(stmt)).scalar_one())


async def session_replicas_since(
    engine: AsyncEngine, since: float, *, exclude: str | None = None
) -> list[tuple[str, str, float]]:
    """(session key, replica, latest `received_at`) of every session with an exchange stored
    since `since`, one row per replica that stored it, but replica `exclude`: what `SplitWatch`
    reads, a few seconds of exchanges per check (the `received_at` index bounds the scan to
    them)."""
    ex = Base.metadata.tables["exchanges"]
    stmt = (
        select(ex.c.session_key, ex.c.replica, func.max(ex.c.received_at))
        .where(ex.c.received_at >= since, ex.c.session_key.is_not(None))
        .group_by(ex.c.session_key, ex.c.replica)
    )
    if exclude is not None:
        stmt = stmt.where(ex.c.replica != exclude)
    with translated("reading recent sessions"):
        async with engine.connect() as conn:
            return [(str(k), str(r), float(t)) for k, r, t in (await conn.execute(stmt)).all()]
