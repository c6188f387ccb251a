"""The rollout use cases: start a ramp from a `promote` verdict, the operators' pause, resume,
advance and abort, and a worker's guard trip made durable (`GuardTrips`).

Storage (`storage.rollouts`) is the one source of truth and refuses what is inconsistent; this
module decides what may start (a `promote` verdict from the host's report process, or `force`
with a reason) and maps a stored rollout to the worker's `gateway.rollout.arms.Split`
(`arms_snapshot`). Every change is committed before a function returns. Never runs a report in
a worker: the verdict comes from `gateway.control.reports.Reports`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors as de
from domain.records import DEFAULT_STEPS, Rollout, check_steps
from gateway.control.reports import ReportDoc, Reports
from gateway.rollout import arms
from storage import queries as q
from storage import rollouts as store

log = logging.getLogger("canary.rollout")

OPERATOR_KINDS = ("pause", "resume", "advance", "abort")


class RolloutRefused(de.PromotionConflict):
    """The verdict is not `promote` and the start was not forced; `report` says why."""

    def __init__(self, name: str, report: ReportDoc) -> None:
        super().__init__(
            f"refusing to ramp {name!r}: the verdict is {report.verdict!r}, not 'promote' "
            f"({report.summary() or report.verdict}); force=true with a reason ramps anyway",
            reason="verdict_not_promote",
        )
        self.report = report

    def http_detail(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "verdict": self.report.verdict,
            "reasons": self.report.reasons(),
        }


class InvalidRollout(de.UsageError):
    """A rollout request with a bad field; `http_field` names it."""

    code = "validation_error"

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.http_field = field


class Rollouts:
    """The use cases over one storage engine; verdicts come from `reports`."""

    def __init__(self, engine: AsyncEngine, reports: Reports, *, default_min_step_s: float) -> None:
        self.engine = engine
        self.reports = reports
        self.default_min_step_s = default_min_step_s

    async def start(
        self,
        name: str,
        *,
        steps: Sequence[float] | None,
        min_step_s: float | None,
        force: bool,
        reason: str,
        actor: str,
    ) -> Rollout:
        """Open a rollout of candidate `name`; see the module docstring for when."""
        steps = list(DEFAULT_STEPS if steps is None else steps)
        try:
            check_steps(steps)
        except de.UsageError as exc:
            raise InvalidRollout(str(exc), "steps") from exc
        dwell = self.default_min_step_s if min_step_s is None else min_step_s
        if not dwell >= 0:
            raise InvalidRollout(f"min_step_s: {dwell!r} is not a duration >= 0", "min_step_s")
        if force and not reason.strip():
            raise InvalidRollout("reason: a forced rollout needs a reason", "reason")
        await q.get_endpoint(self.engine, name)  # EndpointNotFound before asking for a report
        report: ReportDoc | None = None
        try:
            report = await self.reports.report(name)
        except de.NotFound:
            raise
        except Exception as exc:
            if not force:
                raise
            log.warning("rollout: forced start of %s without a report (%r)", name, exc)
        verdict = report.verdict if report is not None else None
        if report is not None and verdict != "promote" and not force:
            raise RolloutRefused(name, report)
        evidence: dict[str, Any] = {"verdict": verdict, "forced": verdict != "promote"}
        rollout = await store.start_rollout(
            self.engine,
            candidate=name,
            steps=steps,
            min_step_s=dwell,
            actor=actor,
            reason=reason,
            evidence=evidence,
        )
        log.info("rollout: %s started %s at %g %% (verdict %s)", actor, name, steps[0], verdict)
        return rollout

    async def apply(self, kind: str, *, actor: str, reason: str) -> Rollout:
        """An operator's pause, resume, advance or abort of the open rollout."""
        if kind not in OPERATOR_KINDS:
            raise InvalidRollout(f"unknown rollout action {kind!r}", "action")
        rollout = await store.transition(
            self.engine,
            kind=kind,  # type: ignore[arg-type]  # checked against OPERATOR_KINDS above
            actor=actor,
            reason=reason,
        )
        log.info("rollout: %s applied %s to %s", actor, kind, rollout.candidate)
        return rollout

    async def current(self) -> Rollout | None:
        return await store.current_rollout(self.engine)


def arms_snapshot(rollout: Rollout, candidate: object) -> arms.Split:
    """The worker's routing snapshot of a stored rollout: generation = id * 2 (+1 once closed),
    weight = percent / 100 while open, nothing to the candidate once closed."""
    if rollout.is_open:
        return arms.Split(
            rollout.id * 2,
            salt=int(rollout.salt, 16),
            weight=rollout.weight / 100.0,
            candidate=candidate,
            state="ramping",
        )
    state: arms.SplitState = "idle" if rollout.state == "completed" else "rolled_back"
    return arms.Split(rollout.id * 2 + 1, state=state)  # as ArmRouter.rolled_back() builds it


class GuardTrips:
    """`gateway.rollout.hooks.RolloutGuard`: a worker's guard trip becomes a stored rollback
    (with `expected_generation`, so it never closes a newer rollout), in an owned task. A lost
    race (another worker or replica rolled back first) is fine. Without the store the rollback
    is retried with back-off (0.05 s doubling to `retry_max_s`) until it is stored or lost,
    never dropped: the worker already routes by it, and the stored "running" row must not
    outlive it. `close` waits `drain_s` for the rollbacks in flight, then says which were not
    stored."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        actor: str = "guard",
        on_done: Callable[[], Any] | None = None,
        retry_max_s: float = 1.0,
        drain_s: float = 10.0,
    ) -> None:
        self._engine = engine
        self._actor = actor
        self._on_done = on_done  # e.g. the registry's refresh, to apply the rollback here at once
        self._retry_max_s = retry_max_s
        self._drain_s = drain_s
        self._tasks: set[asyncio.Task[None]] = set()
        self.tripped = 0
        self.lost = 0
        self.failed = 0  # attempts that raised (the store unreachable), each retried
        self.pending = 0  # rollbacks decided and not yet stored or lost

    def trip(self, generation: int, reason: str, evidence: dict[str, object]) -> None:
        task = asyncio.get_running_loop().create_task(
            self._rollback(generation, reason, evidence), name=f"rollout-guard-{generation}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _rollback(self, generation: int, reason: str, evidence: dict[str, object]) -> None:
        self.pending += 1
        pause = 0.05
        failures = 0
        since = time.monotonic()
        try:
            while True:
                try:
                    if await self._attempt(generation, reason, evidence):
                        if failures:
                            log.warning(
                                "rollout: the guard's rollback of generation %d stored after "
                                "%d failed attempts (%.2f s)",
                                generation,
                                failures,
                                time.monotonic() - since,
                            )
                        return
                    pause = 0.05  # an advance raced the trip: read the new generation at once
                except Exception as exc:
                    self.failed += 1
                    failures += 1
                    if failures == 1:
                        log.warning(
                            "rollout: the guard's rollback of generation %d is not stored yet "
                            "(%s: %s); retrying every %g s at most until it is",
                            generation,
                            type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "",
                            self._retry_max_s,
                        )
                await asyncio.sleep(pause)
                pause = min(2 * pause, self._retry_max_s)
        finally:
            self.pending -= 1

    async def _attempt(self, generation: int, reason: str, evidence: dict[str, object]) -> bool:
        """One try: True once stored or lost to another change, False to read again."""
        current = await store.current_rollout(self._engine)
        if current is None or not current.is_open or current.id * 2 != generation:
            self.lost += 1
            return True
        try:
            await store.transition(
                self._engine,
                kind="rollback",
                actor=self._actor,
                reason=reason,
                evidence=dict(evidence),
                expected_generation=current.generation,
            )
        except de.PromotionConflict as exc:
            if exc.reason == "rollout_changed":
                return False
            self.lost += 1
            return True
        self.tripped += 1
        log.warning("rollout: guard %s rolled back %s", reason, current.candidate)
        if self._on_done is not None:
            await self._on_done()
        return True

    async def close(self) -> None:
        """Wait up to `drain_s` for the rollbacks in flight; one still unstored is logged (the
        replica that stays up, or the next worker's guard, has to decide it again)."""
        if not self._tasks:
            return
        tasks = list(self._tasks)
        _, left = await asyncio.wait(tasks, timeout=self._drain_s)
        for task in left:
            task.cancel()
            log.error("rollout: %s not stored before shutdown", task.get_name())
        await asyncio.gather(*tasks, return_exceptions=True)
