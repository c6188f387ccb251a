"""The ramp's state: one rollout per candidate, each change one audited transaction, pushed to
every replica.

Every write bumps the registry version first (the control plane's lock, as in
storage.promotions), so its checks see the winner of any race; the partial unique index on
`rollouts.live` (one open rollout per live endpoint) is the backstop, mapped to the same
conflict. A change is committed before the function returns. On PostgreSQL each write also
runs `pg_notify('canary_rollout', '<generation>')`, delivered at commit to every `listen`er;
replicas on SQLite, and any that missed a notification, fall back to polling the registry
version. Nothing here decides *when* to advance or roll back (the dwell `min_step_s`, the
tests, the guards): that is the caller's; this module only refuses what is inconsistent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type information
import msgspec
from sqlalchemy import func, insert, select, text, update
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from domain.errors import EndpointNotFound, PromotionConflict, UsageError
from domain.records import OPEN_STATES, Rollout, RolloutEvent, RolloutState, check_steps
from storage.engine import write_transaction
from storage.promotions import promote_on
from storage.sql import ROLLOUT_EVENTS, ROLLOUTS, bump_version, fetch, fetch_live, translated

logger = logging.getLogger(__name__)

CHANNEL: Final = "canary_rollout"
EVENTS_KEPT: Final = 200  # events returned with a rollout (the newest); all stay stored
_ACTOR_MAX = 128  # rollout_events.actor is String(128)

Transition = Literal["pause", "resume", "advance", "rollback", "abort", "complete"]
_CLOSING: Final[dict[str, RolloutState]] = {
    "rollback": "rolled_back",
    "abort": "aborted",
    "complete": "completed",
}
_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(dict[str, Any])
_steps_decoder = msgspec.json.Decoder(list[float])


def _open_conflict(row: Any, action: str) -> PromotionConflict:
    return PromotionConflict(
        f"cannot {action}: rollout {row.id} of {row.candidate!r} on {row.live!r} is "
        f"{row.state}; complete or abort it first",
        reason="rollout_open",
    )


def _rollout(row: Any, events: list[RolloutEvent]) -> Rollout:
    return Rollout(
        id=int(row.id),
        candidate=row.candidate,
        live=row.live,
        state=row.state,
        weight=float(row.weight),
        step=int(row.step),
        steps=_steps_decoder.decode(row.steps),
        min_step_s=float(row.min_step_s),
        salt=row.salt,
        generation=int(row.generation),
        started_at=float(row.started_at),
        step_started_at=float(row.step_started_at),
        updated_at=float(row.updated_at),
        events=events,
    )


async def _events(conn: AsyncConnection, rollout_id: int) -> list[RolloutEvent]:
    """The newest EVENTS_KEPT events of a rollout, oldest first."""
    stmt = (
        select(ROLLOUT_EVENTS)
        .where(ROLLOUT_EVENTS.c.rollout_id == rollout_id)
        .order_by(ROLLOUT_EVENTS.c.id.desc())
        .limit(EVENTS_KEPT)
    )
    rows = (await conn.execute(stmt)).all()
    return [
        RolloutEvent(
            at=float(r.at),
            kind=r.kind,
            from_weight=float(r.from_weight),
            to_weight=float(r.to_weight),
            step=int(r.step),
            actor=r.actor,
            reason=r.reason,
            evidence=None if r.evidence is None else _event_decoder.decode(r.evidence),
        )
        for r in reversed(rows)
    ]


async def _open_row(conn: AsyncConnection) -> Any:
    stmt = select(ROLLOUTS).where(ROLLOUTS.c.state.in_(sorted(OPEN_STATES)))
    return (await conn.execute(stmt.order_by(ROLLOUTS.c.id.desc()))).first()


async def _record(
    conn: AsyncConnection, rollout_id: int, generation: int, event: RolloutEvent
) -> None:
    """Insert the event row and, on PostgreSQL, queue the notification (sent at commit)."""
    values = msgspec.structs.asdict(event)
    values["actor"] = event.actor[:_ACTOR_MAX]
    values["evidence"] = (
        None if event.evidence is None else _encoder.encode(event.evidence).decode()
    )
    await conn.execute(insert(ROLLOUT_EVENTS).values(rollout_id=rollout_id, **values))
    if conn.dialect.name == "postgresql":
        await conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": CHANNEL, "p": str(generation)})


async def _read(conn: AsyncConnection, rollout_id: int) -> Rollout:
    row = (await conn.execute(select(ROLLOUTS).where(ROLLOUTS.c.id == rollout_id))).one()
    return _rollout(row, await _events(conn, rollout_id))


async def start_rollout(
    engine: AsyncEngine,
    *,
    candidate: str,
    steps: Sequence[float],
    min_step_s: float,
    actor: str,
    reason: str,
    evidence: dict[str, Any] | None = None,
) -> Rollout:
    """Open a rollout of `candidate` against the current live endpoint at `steps[0]` percent.

    Whether it may start (a `promote` verdict, or force with a reason) is the caller's decision;
    `evidence` records it on the start event. Raises UsageError for bad steps or dwell,
    EndpointNotFound, or PromotionConflict: 'not_a_candidate', 'candidate_paused',
    'no_live_endpoint', 'rollout_open' (also when a racing replica opened one first)."""
    check_steps(steps)
    if not (math.isfinite(min_step_s) and min_step_s >= 0):
        raise UsageError(f"rollout min_step_s: {min_step_s!r} is not a duration >= 0")
    with translated(f"starting a rollout of {candidate!r}"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            target = await fetch(conn, candidate)
            if target is None:
                raise EndpointNotFound(candidate)
            if target.role != "candidate":
                raise PromotionConflict(
                    f"{candidate!r} is {target.role}, not a candidate", reason="not_a_candidate"
                )
            if target.state == "paused":
                raise PromotionConflict(
                    f"{candidate!r} is paused; resume it before ramping it",
                    reason="candidate_paused",
                )
            live = await fetch_live(conn)
            if live is None:
                raise PromotionConflict(
                    "there is no live endpoint to ramp against", reason="no_live_endpoint"
                )
            if (row := await _open_row(conn)) is not None:
                raise _open_conflict(row, f"start a rollout of {candidate!r}")
            last = (await conn.execute(select(func.max(ROLLOUTS.c.generation)))).scalar()
            generation = int(last or 0) + 1
            now = time.time()
            values = {
                "candidate": candidate,
                "live": live.name,
                "state": "running",
                "weight": float(steps[0]),
                "step": 0,
                "steps": _encoder.encode([float(s) for s in steps]).decode(),
                "min_step_s": float(min_step_s),
                "salt": secrets.token_hex(8),
                "generation": generation,
                "started_at": now,
                "step_started_at": now,
                "updated_at": now,
            }
            try:
                stmt = insert(ROLLOUTS).values(values).returning(ROLLOUTS.c.id)
                rollout_id = int((await conn.execute(stmt)).scalar_one())
            except IntegrityError as exc:
                raise PromotionConflict(
                    f"cannot start a rollout of {candidate!r}: another rollout on "
                    f"{live.name!r} was opened concurrently",
                    reason="rollout_open",
                ) from exc
            event = RolloutEvent(
                at=now,
                kind="start",
                from_weight=0.0,
                to_weight=float(steps[0]),
                step=0,
                actor=actor,
                reason=reason,
                evidence=evidence,
            )
            await _record(conn, rollout_id, generation, event)
            return await _read(conn, rollout_id)


def _refuse(kind: str, row: Any, why: str, reason: str) -> PromotionConflict:
    return PromotionConflict(
        f"cannot {kind} rollout {row.id} of {row.candidate!r}: {why}", reason=reason
    )


def _next(kind: Transition, row: Any, steps: list[float]) -> tuple[RolloutState, float, int]:
    """The state, weight and step after `kind`, or PromotionConflict naming why not."""
    state, weight, step = row.state, float(row.weight), int(row.step)
    if kind == "pause":
        if state != "running":
            raise _refuse(kind, row, f"it is {state}", "not_running")
        return "paused", weight, step
    if kind == "resume":
        if state != "paused":
            raise _refuse(kind, row, f"it is {state}", "not_paused")
        return "running", weight, step
    if kind == "advance":
        if state != "running":
            raise _refuse(kind, row, f"it is {state}; resume it first", "not_running")
        if step + 1 >= len(steps):
            raise _refuse(kind, row, f"it is at its last step ({weight:g} %)", "last_step")
        return "running", steps[step + 1], step + 1
    if kind == "complete":
        if weight < 100:
            raise _refuse(kind, row, f"its weight is {weight:g} %, not 100", "not_at_full_weight")
        return "completed", weight, step
    if kind in ("rollback", "abort"):
        return _CLOSING[kind], 0.0, step
    raise UsageError(f"unknown rollout transition {kind!r}")


async def transition(
    engine: AsyncEngine,
    *,
    kind: Transition,
    actor: str,
    reason: str,
    evidence: dict[str, Any] | None = None,
    expected_generation: int | None = None,
) -> Rollout:
    """Apply `kind` to the open rollout and record its event, in one transaction.

    advance moves to the next step; rollback and abort set the weight to 0 and close it;
    complete (at 100 %) closes it and promotes the candidate in the same transaction, with a
    promotions audit row (reason 'rollout completed'). With `expected_generation`, a rollout
    changed meanwhile is refused ('rollout_changed'). Other refusals are PromotionConflict:
    'no_open_rollout', 'not_running', 'not_paused', 'last_step', 'not_at_full_weight', and
    promote's own ('live_changed', 'not_candidate', ...) on complete."""
    with translated(f"applying {kind} to the rollout"):
        async with write_transaction(engine) as conn:
            await bump_version(conn)
            row = await _open_row(conn)
            if row is None:
                raise PromotionConflict(
                    f"cannot {kind}: no rollout is running or paused", reason="no_open_rollout"
                )
            if expected_generation is not None and row.generation != expected_generation:
                raise _refuse(
                    kind,
                    row,
                    f"it changed meanwhile (generation {row.generation}, "
                    f"expected {expected_generation})",
                    "rollout_changed",
                )
            state, weight, step = _next(kind, row, _steps_decoder.decode(row.steps))
            now = time.time()
            generation = int(row.generation) + 1
            values: dict[str, Any] = {
                "state": state,
                "weight": weight,
                "step": step,
                "generation": generation,
                "updated_at": now,
            }
            if step != row.step:
                values["step_started_at"] = now
            await conn.execute(update(ROLLOUTS).where(ROLLOUTS.c.id == row.id).values(values))
            if kind == "complete":
                await promote_on(
                    conn,
                    row.candidate,
                    actor=actor,
                    reason="rollout completed",
                    forced=False,
                    verdict=None,
                    report_snapshot=None
                    if evidence is None
                    else _encoder.encode(evidence).decode(),
                    expect_live=row.live,
                )
            event = RolloutEvent(
                at=now,
                kind=kind,
                from_weight=float(row.weight),
                to_weight=weight,
                step=step,
                actor=actor,
                reason=reason,
                evidence=evidence,
            )
            await _record(conn, int(row.id), generation, event)
            return await _read(conn, int(row.id))


async def current_rollout(engine: AsyncEngine) -> Rollout | None:
    """The open rollout, else the most recent one, with its newest events (oldest first)."""
    with translated("reading the rollout"):
        async with engine.connect() as conn:
            row = await _open_row(conn)
            if row is None:
                stmt = select(ROLLOUTS).order_by(ROLLOUTS.c.id.desc()).limit(1)
                row = (await conn.execute(stmt)).first()
            if row is None:
                return None
            return _rollout(row, await _events(conn, int(row.id)))


class ListenStats:
    """What a `listen` loop has done, for the caller's /metrics."""

    __slots__ = ("connected", "connections", "last_error", "notifications", "reconnects")

    def __init__(self) -> None:
        self.connected = False
        self.connections = 0  # LISTENs established
        self.notifications = 0
        self.reconnects = 0  # connections opened after the first (each after an error)
        self.last_error: str | None = None


def _dsn(target: str | AsyncEngine) -> URL | None:
    url = target.url if isinstance(target, AsyncEngine) else make_url(target)
    if not url.drivername.startswith("postgresql"):
        return None
    return url.set(drivername="postgresql")


async def _listen_once(
    dsn: str, on_change: Callable[[], None], stats: ListenStats, keepalive_s: float
) -> None:
    """One connection's life: LISTEN, catch up once, then wait until it breaks (raises)."""
    conn = await asyncpg.connect(dsn, timeout=max(keepalive_s, 5.0))
    lost = asyncio.Event()

    def _notified(*_args: object) -> None:
        stats.notifications += 1
        on_change()

    try:
        conn.add_termination_listener(lambda _c: lost.set())
        await conn.add_listener(CHANNEL, _notified)
        stats.connections += 1
        stats.reconnects = stats.connections - 1
        stats.connected = True
        on_change()
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns, swallowing a cancel,
            # when the awaited event is set in the same loop pass (close() would wait forever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(keepalive_s):
                    await lost.wait()
            if lost.is_set() or conn.is_closed():
                raise ConnectionError("the listening connection was closed")
            await conn.execute("SELECT 1", timeout=keepalive_s)
    finally:
        stats.connected = False
        if not conn.is_closed():
            # Bounded: a connection to a dead server must not hold up the reconnect.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), timeout=1.0)


async def listen(
    target: str | AsyncEngine,
    on_change: Callable[[], None],
    *,
    reconnect_s: float = 1.0,
    keepalive_s: float = 10.0,
    stats: ListenStats | None = None,
) -> None:
    """Call `on_change` on every rollout change committed by any replica, until cancelled.

    Holds one dedicated asyncpg connection LISTENing on CHANNEL; after an error it reconnects
    every `reconnect_s` seconds, and calls `on_change` once after each (re)connect, since a
    change committed while it was away sent its notification to nobody. A connection cut
    silently is found by a `SELECT 1` every `keepalive_s`. On SQLite it returns at once: there
    is no push, replicas poll (registry_poll_interval_s)."""
    url = _dsn(target)
    if url is None:
        return
    dsn = url.render_as_string(hide_password=False)
    stats = stats if stats is not None else ListenStats()
    while True:
        try:
            await _listen_once(dsn, on_change, stats, keepalive_s)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            stats.last_error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            # Not a connection's ordinary failure (a DSN the driver rejects, a driver bug): say
            # it once per distinct error, and keep retrying as for the others, since a listener
            # that ended would leave this replica to the poll with nothing saying so.
            error = f"{type(exc).__name__}: {exc}"
            if error != stats.last_error:
                logger.error("rollout listener: %s; retrying every %g s", error, reconnect_s)
            stats.last_error = error
        await asyncio.sleep(reconnect_s)
