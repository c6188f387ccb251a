"""The registry: an in-memory snapshot of the live endpoint and the candidates, replaced
atomically, reloaded from storage whenever the stored registry version changes.

Every replica sharing a database polls one integer (`registry_meta.version`) every
`poll_interval_s` and reloads only when it moved, so a promotion, a rollback or a candidate
change made through any replica is applied by all of them within one interval (docs/design.md,
"Control plane").
The proxy never waits on this: it reads `LiveTarget` and the snapshot, both swapped whole.

The ramp rides on the same reload: with each new version the registry reads the rollout
(`storage.rollouts.current_rollout`) and swaps the worker's `ArmRouter` to its snapshot
(`gateway.rollout.state.arms_snapshot`, the candidate a `LiveTarget` built once per
rollout). On PostgreSQL it also LISTENs (`storage.rollouts.listen`), so a rollback committed by
any replica is applied here within a second, not a poll interval; polling stays the fallback.
`start` applies the stored rollout before it returns: a restarted worker never serves a stale
weight.

A database error while polling keeps the old snapshot, counted, logged once per outage; the
proxy keeps serving the last known live endpoint. With `store_loss_hold_s`, a watch reads the
store whenever nothing else has for a while: after that long without a successful read the
ramp is *held* (new sessions to production, `arms.Split.held`; a guard's local rollback
stands), and it resumes the stored rollout only once the store has answered for
`store_resume_after_s`, so that a rollback another worker decided meanwhile (retried every
`rollout.store_retry_max_s` at most) is stored, and read here, first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from domain.errors import EndpointNotFound, UsageError
from domain.records import Rollout
from gateway.rollout.arms import ArmRouter
from gateway.rollout.state import arms_snapshot
from gateway.server.hooks import LiveTarget
from storage import queries
from storage import rollouts as rollout_store

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One consistent view of the registry at `version`."""

    version: int
    live: Endpoint
    candidates: tuple[Endpoint, ...]  # role candidate only (active and paused), by name
    retired: tuple[Endpoint, ...] = field(default=())

    @classmethod
    def build(cls, version: int, endpoints: Sequence[Endpoint]) -> Snapshot:
        live = [ep for ep in endpoints if ep.role == "live"]
        if not live:
            raise EndpointNotFound(
                "live", "no live endpoint is stored: start the gateway with --live URL once"
            )
        by_name = sorted(endpoints, key=lambda ep: ep.name)
        return cls(
            version=version,
            live=live[0],
            candidates=tuple(ep for ep in by_name if ep.role == "candidate"),
            retired=tuple(ep for ep in by_name if ep.role == "retired"),
        )

    def find(self, name: str) -> Endpoint | None:
        """The endpoint called `name` in this snapshot, whatever its role."""
        if self.live.name == name:
            return self.live
        for ep in (*self.candidates, *self.retired):
            if ep.name == name:
                return ep
        return None


class Registry:
    """Owns the snapshot and the polling task; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        live_target: LiveTarget,
        *,
        poll_interval_s: float,
        on_change: Callable[[Snapshot], None] | None = None,
        router: ArmRouter | None = None,
        candidate_target: Callable[[Endpoint], object] = LiveTarget,
        store_loss_hold_s: float | None = None,
        store_resume_after_s: float = 5.0,
    ) -> None:
        self._engine = engine
        self._live_target = live_target
        self._poll_interval_s = poll_interval_s
        self._on_change = on_change
        self._router = router
        self._candidate_target = candidate_target  # the object the proxy routes arm 1 to
        self._snapshot: Snapshot | None = None
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()  # set by a NOTIFY: reload now, not at the next poll
        self.rollout: Rollout | None = None  # the stored rollout, as last loaded
        self._target_of: tuple[int, object] | None = None  # (arms generation, candidate target)
        self.listen_stats = rollout_store.ListenStats()
        self.rollout_errors = 0
        self._lock = asyncio.Lock()  # one reload at a time, so swaps happen in version order
        self._failing = False
        self.reloads = 0
        self.poll_errors = 0
        self._hold_after_s = store_loss_hold_s  # None: never hold (no router, or not asked)
        self._resume_after_s = store_resume_after_s
        self._watch: asyncio.Task[None] | None = None
        self._store_ok_at = time.monotonic()  # the last successful read of the store
        self._store_back_at: float | None = None  # the first of the current run of such reads
        self.held = False  # new sessions held on production: the store was lost too long
        self.holds = 0

    async def start(
        self, *, seed_live: Endpoint | None, seed_candidates: Sequence[Endpoint] = ()
    ) -> None:
        """Seed first-start endpoints (the stored live endpoint wins over `seed_live`), load the
        snapshot, and start polling. Raises EndpointNotFound when nothing is live."""
        await queries.seed(self._engine, seed_live, seed_candidates)
        version, endpoints = await queries.load_endpoints(self._engine)
        self._swap(Snapshot.build(version, endpoints))
        self._apply_rollout(await rollout_store.current_rollout(self._engine))
        self._store_ok()
        if self._watch is None and self._router is not None and self._hold_after_s is not None:
            self._watch = asyncio.create_task(self._watch_store(), name="registry-store-watch")
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="registry-poll")
        if self._listener is None:
            # Returns at once on SQLite (no push): the poll is all there is.
            self._listener = asyncio.create_task(
                rollout_store.listen(self._engine, self._wake.set, stats=self.listen_stats),
                name="registry-listen",
            )

    @property
    def snapshot(self) -> Snapshot:
        if self._snapshot is None:
            raise RuntimeError("Registry.start() has not completed")
        return self._snapshot

    def stats(self) -> dict[str, int]:
        return {
            "version": self._snapshot.version if self._snapshot else 0,
            "reloads": self.reloads,
            "poll_errors": self.poll_errors,
            "rollout_generation": self.rollout.generation if self.rollout else 0,
            "rollout_errors": self.rollout_errors,
            "rollout_notifications": self.listen_stats.notifications,
            "store_held": int(self.held),
            "store_holds": self.holds,
        }

    async def refresh(self) -> Snapshot:
        """Reload now if the stored version moved (the admin API calls this after a write, so
        this replica applies it at once). A database error keeps, and returns, the old
        snapshot: the write already committed, and the poll will catch up."""
        await self._read_store()
        return self.snapshot

    def poke(self) -> None:
        """Reload at once instead of at the next poll (a worker named a candidate this process
        does not know yet: it registered since the last poll)."""
        self._wake.set()

    async def close(self) -> None:
        tasks = {t for t in (self._task, self._listener, self._watch) if t is not None}
        self._task = self._listener = self._watch = None
        for task in tasks:
            task.cancel()
        if tasks:
            # asyncio.wait, not `await task` under suppress(CancelledError): a cancel of close()
            # itself must reach its caller, not be taken for the task's own.
            await asyncio.wait(tasks)

    async def _poll(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns, swallowing a cancel,
            # when the awaited event is set in the same loop pass (close() would wait forever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self._read_store()

    async def _read_store(self) -> bool:
        """One reload; a failure counted and logged once per outage. True when it succeeded."""
        try:
            await self._reload()
        except Exception as exc:
            self._failed(exc)
            return False
        self._store_ok()
        return True

    def _store_ok(self) -> None:
        now = time.monotonic()
        self._store_ok_at = now
        if self._store_back_at is None:
            self._store_back_at = now
        if self._failing:
            self._failing = False
            logger.info("registry: storage reachable again (version %d)", self.version)

    async def _watch_store(self) -> None:
        """Hold the ramp after `store_loss_hold_s` without a successful read, resume it after
        `store_resume_after_s` of answers. Reads the store itself when nothing else has for a
        quarter of the bound; a read that hangs delays nothing here but its own next try."""
        assert self._hold_after_s is not None
        bound = self._hold_after_s
        every = min(1.0, bound / 5)
        ping: asyncio.Task[bool] | None = None
        try:
            while True:
                await asyncio.sleep(every)
                now = time.monotonic()
                idle = ping is None or ping.done()
                if idle and now - self._store_ok_at >= bound / 4:
                    ping = asyncio.create_task(self._read_store(), name="registry-store-ping")
                lost_for = now - self._store_ok_at
                if not self.held and lost_for > bound:
                    self._hold(lost_for)
                elif (
                    self.held
                    and idle
                    and self._store_back_at is not None
                    and lost_for < bound
                    and now - self._store_back_at >= self._resume_after_s
                ):
                    await self._resume()
        finally:
            if ping is not None:
                ping.cancel()
                # asyncio.wait neither raises the ping's CancelledError nor hides a cancel of
                # this task that lands while it waits.
                await asyncio.wait({ping})

    def _hold(self, lost_for: float) -> None:
        """New sessions to production now; sessions already on the candidate keep it."""
        self.held = True
        self.holds += 1
        self._store_back_at = None
        router = self._router
        current = router.rollout if router is not None else None
        logger.warning(
            "registry: no read of the store for %.1f s (rollout.store_loss_hold_s = %g): new "
            "sessions go to production until it has answered for %g s (rollout generation %d "
            "was at %g %%)",
            lost_for,
            self._hold_after_s,
            self._resume_after_s,
            current.generation if current is not None else 0,
            current.weight * 100 if current is not None else 0.0,
        )
        if router is not None and current is not None and current.weight > 0:
            router.swap(current.held())

    async def _resume(self) -> None:
        """Route by the stored rollout again: the store is the truth (a rollback stored
        meanwhile applies; a stale weight nobody stored is never resumed)."""
        async with self._lock:  # in version order with the reloads
            try:
                rollout = await rollout_store.current_rollout(self._engine)
            except Exception as exc:
                self._failed(exc)  # still held: the next tick tries again
                return
            self.held = False
            try:
                self._apply_rollout(rollout)
            except Exception:
                self.rollout_errors += 1
                logger.exception("registry: the stored rollout not applied on resuming")
        logger.warning(
            "registry: the store has answered for %g s: routing by the stored rollout again (%s)",
            self._resume_after_s,
            "none"
            if rollout is None
            else f"{rollout.candidate} {rollout.state} at {rollout.weight:g} %",
        )

    @property
    def version(self) -> int:
        return self._snapshot.version if self._snapshot else 0

    async def _reload(self) -> None:
        async with self._lock:
            if await queries.registry_version(self._engine) == self.version:
                return
            version, endpoints = await queries.load_endpoints(self._engine)
            # Any move counts, backwards too (a database restored from a backup).
            if version != self.version:
                self._swap(Snapshot.build(version, endpoints))
                self._apply_rollout(await rollout_store.current_rollout(self._engine))

    def _apply_rollout(self, rollout: Rollout | None) -> None:
        """Swap the router to `rollout` if it is newer than what the router holds."""
        self.rollout = rollout
        if self._router is None or rollout is None:
            return
        gen = rollout.id * 2 + (0 if rollout.is_open else 1)
        current = self._router.rollout
        weight = 0.0 if self.held else rollout.weight / 100.0  # held: no new sessions
        if gen < current.generation or (gen == current.generation and weight <= current.weight):
            return  # already applied (a reload for another change), or older
        target: object = None
        if rollout.is_open:
            if self._target_of is None or self._target_of[0] != gen:
                ep = self.snapshot.find(rollout.candidate)
                if ep is None:
                    self.rollout_errors += 1
                    logger.error("registry: the rollout's candidate %r is gone", rollout.candidate)
                    return
                self._target_of = (gen, self._candidate_target(ep))
            target = self._target_of[1]
        snap = arms_snapshot(rollout, target)
        try:
            self._router.swap(snap.held() if self.held else snap)
        except UsageError:
            self.rollout_errors += 1
            logger.exception("registry: rollout %d not applied", rollout.id)

    def _swap(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self.reloads += 1
        self._live_target.set(snapshot.live)
        if self._on_change is not None:
            try:
                self._on_change(snapshot)
            except Exception:
                logger.exception("registry: on_change callback failed (snapshot still applied)")

    def _failed(self, exc: Exception) -> None:
        self.poll_errors += 1
        self._store_back_at = None
        if not self._failing:
            self._failing = True
            logger.warning(
                "registry: cannot reload from storage (%s: %s); keeping version %d",
                type(exc).__name__,
                str(exc).splitlines()[0] if str(exc) else "",
                self.version,
            )
