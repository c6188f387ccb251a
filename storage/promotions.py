"""Promote and roll back: the two ways the live endpoint changes, each one transaction that
swaps the roles and appends an audit row (re-exported by storage.queries). Both are refused
while a rollout is open (storage.rollouts): the ramp owns the live endpoint until it ends.

Both start by bumping the registry version, which serializes them against every other
control-plane change; the checks that follow therefore see the winner of any race, and the loser
gets PromotionConflict. The partial unique index on endpoints (one live row) is the backstop.

Rollback walks the audit log as an undo stack: each rollback undoes the newest promotion not
already undone, so repeated rollbacks step back through history and stop at the first live.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Literal

import msgspec
from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound, PromotionConflict
from domain.records import OPEN_STATES, PromotionRecord
from storage.engine import write_transaction
from storage.sql import (
    PROMOTIONS,
    ROLLOUTS,
    bump_version,
    fetch,
    fetch_live,
    set_role,
    translated,
)

_ACTOR_MAX = 128  # promotions.actor is String(128)
_VERDICT_MAX = 16  # promotions.verdict is String(16)


def _check_expected(live: Endpoint | None, expect_live: str | None) -> None:
    if expect_live is None:
        return
    found = live.name if live is not None else None
    if found != expect_live:
        raise PromotionConflict(
            f"the live endpoint changed meanwhile: expected {expect_live!r}, found {found!r}",
            reason="live_changed",
        )


async def _swap(
    conn: AsyncConnection,
    live: Endpoint | None,
    new_live: Endpoint,
    *,
    action: Literal["promote", "rollback"],
    actor: str,
    reason: str,
    forced: bool = False,
    verdict: str | None = None,
    report_snapshot: str | None = None,
) -> PromotionRecord:
    now = time.time()
    try:
        if live is not None:
            await set_role(conn, live, "retired", now)
        await set_role(conn, new_live, "live", now)
    except IntegrityError as exc:
        raise PromotionConflict(
            "another endpoint became live concurrently", reason="concurrent"
        ) from exc
    record = PromotionRecord(
        id=0,
        action=action,
        from_endpoint=live.name if live is not None else None,
        to_endpoint=new_live.name,
        # Cut to the columns so both dialects store the same thing (SQLite would not refuse).
        actor=actor[:_ACTOR_MAX],
        reason=reason,
        forced=forced,
        verdict=None if verdict is None else verdict[:_VERDICT_MAX],
        report_snapshot=report_snapshot,
        at=now,
    )
    values = msgspec.structs.asdict(record)
    del values["id"]
    stmt = insert(PROMOTIONS).values(values).returning(PROMOTIONS.c.id)
    record.id = int((await conn.execute(stmt)).scalar_one())
    return record


async def promote(
    engine: AsyncEngine,
    name: str,
    *,
    actor: str,
    reason: str,
    forced: bool,
    verdict: str | None,
    report_snapshot: str | None,
    expect_live: str | None = None,
) -> PromotionRecord:
    """Make candidate `name` live and retire the current live endpoint, atomically.

    Raises EndpointNotFound, or PromotionConflict when `name` is not a candidate (already live,
    retired — e.g. a concurrent promote of the same candidate won), when a rollout is open (it
    owns the live endpoint until it ends) or, with `expect_live`, when the live endpoint is no
    longer the one the caller decided against.
    """
    with translated(f"promoting {name!r}"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            await refuse_if_rollout_open(conn, "promote")
            return await promote_on(
                conn,
                name,
                actor=actor,
                reason=reason,
                forced=forced,
                verdict=verdict,
                report_snapshot=report_snapshot,
                expect_live=expect_live,
            )


async def promote_on(
    conn: AsyncConnection,
    name: str,
    *,
    actor: str,
    reason: str,
    forced: bool,
    verdict: str | None,
    report_snapshot: str | None,
    expect_live: str | None = None,
) -> PromotionRecord:
    """`promote`'s checks and swap inside the caller's transaction, which has already bumped
    the registry version (a completed rollout promotes in the transaction that closes it)."""
    target = await fetch(conn, name)
    if target is None:
        raise EndpointNotFound(name)
    if target.role == "live":
        raise PromotionConflict(f"{name!r} is already live", reason="already_live")
    if target.role != "candidate":
        raise PromotionConflict(
            f"{name!r} is {target.role}, not a candidate", reason="not_candidate"
        )
    live = await fetch_live(conn)
    _check_expected(live, expect_live)
    return await _swap(
        conn,
        live,
        target,
        action="promote",
        actor=actor,
        reason=reason,
        forced=forced,
        verdict=verdict,
        report_snapshot=report_snapshot,
    )


async def refuse_if_rollout_open(conn: AsyncConnection, action: str) -> None:
    """PromotionConflict ('rollout_open') when a rollout is running or paused: while it is open
    the live endpoint changes only through it (complete, or abort first)."""
    stmt = select(ROLLOUTS.c.id, ROLLOUTS.c.candidate, ROLLOUTS.c.state).where(
        ROLLOUTS.c.state.in_(sorted(OPEN_STATES))
    )
    row = (await conn.execute(stmt)).first()
    if row is not None:
        raise PromotionConflict(
            f"cannot {action}: rollout {row.id} of {row.candidate!r} is {row.state}; "
            "complete or abort it first",
            reason="rollout_open",
        )


def _undo_target(rows: Iterable[tuple[str, str | None]]) -> str | None:
    """The from_endpoint of the newest promotion not yet undone (rows newest first)."""
    pending_undos = 0
    for action, from_endpoint in rows:
        if action == "rollback":
            pending_undos += 1
        elif pending_undos:
            pending_undos -= 1
        else:
            return from_endpoint
    return None


async def rollback(
    engine: AsyncEngine, *, actor: str, reason: str, expect_live: str | None = None
) -> PromotionRecord:
    """Restore the live endpoint that the newest not-yet-undone promotion replaced; the current
    live endpoint is retired. PromotionConflict when there is nothing to roll back to."""
    with translated("rolling back"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            await refuse_if_rollout_open(conn, "roll back")
            stmt = select(PROMOTIONS.c.action, PROMOTIONS.c.from_endpoint).order_by(
                PROMOTIONS.c.id.desc()
            )
            rows = await conn.execute(stmt)
            previous = _undo_target((row[0], row[1]) for row in rows)
            if previous is None:
                raise PromotionConflict(
                    "nothing to roll back to: no promotion left to undo in the audit log",
                    reason="nothing_to_roll_back",
                )
            target = await fetch(conn, previous)
            if target is None:
                raise PromotionConflict(
                    f"cannot roll back: the previous live endpoint {previous!r} was deleted",
                    reason="previous_deleted",
                )
            live = await fetch_live(conn)
            _check_expected(live, expect_live)
            if live is not None and live.name == target.name:
                raise PromotionConflict(f"{previous!r} is already live", reason="already_live")
            return await _swap(conn, live, target, action="rollback", actor=actor, reason=reason)


async def list_promotions(engine: AsyncEngine, limit: int = 50) -> list[PromotionRecord]:
    """The audit log, newest first."""
    with translated("reading the promotion log"):
        async with engine.connect() as conn:
            stmt = select(PROMOTIONS).order_by(PROMOTIONS.c.id.desc()).limit(limit)
            rows = (await conn.execute(stmt)).mappings().all()
    return [
        PromotionRecord(
            id=int(r["id"]),
            action=r["action"],
            from_endpoint=r["from_endpoint"],
            to_endpoint=r["to_endpoint"],
            actor=r["actor"],
            reason=r["reason"],
            forced=bool(r["forced"]),
            verdict=r["verdict"],
            report_snapshot=r["report_snapshot"],
            at=float(r["at"]),
        )
        for r in rows
    ]
