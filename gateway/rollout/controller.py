"""The rollout controller: judges the open rollout's current step from live evidence and
advances, rolls back or completes it. Runs in the host's report process (idle priority), never
in a worker.

Every `interval_s`: read the running rollout, its step's requests since the step started
(`storage.reports.rollout.rollout_requests` of generation id * 2), summarize them per session
(`evaluators.rollout.arms`), judge the look by the ramp's rule (`evaluators.rollout.rule`:
deterioration tests at every look, a dwell sized by power, one non-inferiority look at the
largest split step), and apply the judgement as a storage transition with
`expected_generation`, so controllers of several replicas (or an operator's change meanwhile)
never apply a stale decision twice: the loser's transition is refused ('rollout_changed') and
counted. Harm rolls back; a step with its sessions advances; a non-inferiority look that does
not show every margin pauses the ramp for a person ("hold"). At 100 % there is no next step:
the rollout completes (the promotion) once `min_step_s` has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Final

from domain import errors as de
from domain.exposition import Family, Sample
from storage import queries as q
from storage import rollouts as store

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from sqlalchemy.ext.asyncio import AsyncEngine

    from domain.records import Rollout
    from evaluators.judge.settings import VerdictSettings

log = logging.getLogger("canary.rollout")

# The per-request columns of one generation's requests ended in [since, until).
Evidence = Callable[
    ["AsyncEngine", int, float | None, float | None], Awaitable[dict[str, "NDArray[Any]"]]
]
ROLLBACKS: Final = Family(
    "canary_rollout_rollbacks_total",
    "counter",
    "Rollouts rolled back, by why (harm: the controller's tests; guard_*: a worker's guard; "
    "operator: an abort).",
    ("reason",),
)
DECISIONS: Final = ("advance", "complete", "rollback", "hold", "wait", "lost", "failed")


async def _stored_evidence(
    engine: AsyncEngine, generation: int, since: float | None, until: float | None
) -> dict[str, NDArray[Any]]:
    # Imported here: the controller loads the evidence's columns only once there is a rollout.
    from storage.reports.rollout import rollout_requests

    columns: dict[str, NDArray[Any]] = await rollout_requests(engine, generation, since, until)
    return columns


def _evidence_doc(
    tests: tuple[Any, ...], because: tuple[Any, ...], *, weight: float, elapsed_s: float
) -> dict[str, Any]:
    """What a decision stores on its event: every test with its estimate, interval and n per
    arm, the ones that decided, the step's weight and age."""

    def clean(c: Any) -> dict[str, Any]:
        d = asdict(c)
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()
        }

    return {
        "weight": weight,
        "elapsed_s": round(elapsed_s, 3),
        "because": [c.name for c in because],
        "tests": [clean(c) for c in tests],
    }


class RolloutController:
    """Judges and moves the open rollout; see the module docstring."""

    def __init__(
        self,
        engine: AsyncEngine,
        settings: VerdictSettings,
        *,
        evidence: Evidence | None = None,
        clock: Callable[[], float] = time.time,
        actor: str = "controller",
    ) -> None:
        self._engine = engine
        self._settings = settings
        self._evidence = evidence if evidence is not None else _stored_evidence
        self._clock = clock
        self._actor = actor
        self.decisions = dict.fromkeys(DECISIONS, 0)
        self.rollbacks = {"harm": 0}

    def samples(self) -> list[Sample]:
        """`canary_rollout_rollbacks_total` for the rollbacks this controller decided."""
        return [ROLLBACKS.sample(n, reason) for reason, n in self.rollbacks.items()]

    async def tick(self) -> str | None:
        """Judge the running rollout once; the decision taken, or None without one running."""
        rollout = await store.current_rollout(self._engine)
        if rollout is None or rollout.state != "running":
            return None
        _, endpoints = await q.load_endpoints(self._engine)
        ep = next((e for e in endpoints if e.name == rollout.candidate), None)
        if ep is None:
            return None  # removed meanwhile: the storage refuses its transitions anyway
        settings = self._settings.with_overrides(ep.verdict)
        action, evidence = await self._judge(rollout, settings)
        if action == "wait":
            self.decisions["wait"] += 1
            return "wait"
        kind = {"advance": "advance", "complete": "complete", "rollback": "rollback"}.get(
            action, "pause"
        )
        reason = {
            "advance": f"no harm in {evidence['sessions']} sessions after "
            f"{evidence['elapsed_s']:g} s"
            + (", every margin shown" if evidence["non_inferiority"] else ""),
            "complete": f"100 % for {evidence['elapsed_s']:g} s without harm",
            "rollback": "harm: " + ", ".join(evidence["because"]),
            "hold": "non-inferiority not shown at the largest split step: "
            + ", ".join(evidence["because"])
            + "; resume to go on (the margins are then yours) or abort",
        }[action]
        try:
            await store.transition(
                self._engine,
                kind=kind,  # type: ignore[arg-type]  # one of the storage's kinds, above
                actor=self._actor,
                reason=reason,
                evidence=evidence,
                expected_generation=rollout.generation,
            )
        except de.PromotionConflict as exc:
            # Another controller or an operator changed it first: judge again next round.
            self.decisions["lost"] += 1
            log.info("rollout: %s of %s not applied: %s", kind, rollout.candidate, exc)
            return "lost"
        self.decisions[action] += 1
        if action == "rollback":
            self.rollbacks["harm"] += 1
        log.warning("rollout: %s %s (%s)", action, rollout.candidate, reason)
        return action

    async def _judge(
        self, rollout: Rollout, settings: VerdictSettings
    ) -> tuple[str, dict[str, Any]]:
        import numpy as np

        from evaluators.rollout.arms import session_units
        from evaluators.rollout.rule import ACTIONS, comparisons, judge_look, look_stats

        now = self._clock()
        elapsed = now - rollout.step_started_at
        last = rollout.step + 1 >= len(rollout.steps)
        cols = await self._evidence(self._engine, rollout.id * 2, rollout.step_started_at, None)
        units = session_units(cols, slo_ttft_s=settings.slo_ttft_s, slo_e2e_s=settings.slo_e2e_s)
        # Only sessions whose first turn came in this step: their arm was drawn at its weight.
        began = np.isin(units.session, cols["session"][np.asarray(cols["turn"]) <= 1])
        stats = look_stats(units, began)
        look = judge_look(
            stats,
            weight_pct=rollout.weight,
            steps=rollout.steps,
            elapsed_s=elapsed,
            min_step_s=rollout.min_step_s,
            settings=settings,
            margins_answered=any(
                e.kind == "resume" and e.at >= rollout.step_started_at for e in rollout.events
            ),
        )
        action = ACTIONS[int(look.action)]
        if last and action == "advance":
            action = "complete"
        tests = comparisons(
            stats, look, weight_pct=rollout.weight, steps=rollout.steps, settings=settings
        )
        if action == "rollback":
            because = tuple(t for t in tests if t.decision == "harm")
        elif action == "hold":
            because = tuple(t for t in tests if t.name in look.ni_within and t.decision != "ok")
        else:
            because = ()
        evidence = _evidence_doc(tests, because, weight=rollout.weight, elapsed_s=elapsed)
        evidence["sessions"] = int(np.asarray(look.sessions))
        evidence["sessions_needed"] = int(np.ceil(float(np.asarray(look.needed))))
        evidence["non_inferiority"] = bool(look.ni_asked)
        return action, evidence

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        """`tick` every `interval_s` until `stop`; a failure is counted, logged, retried."""
        while not stop.is_set():
            try:
                await self.tick()
            except de.StorageError as exc:
                self.decisions["failed"] += 1
                log.warning("rollout controller: %s", exc)
            except Exception:
                self.decisions["failed"] += 1
                log.exception("rollout controller: judging the step failed")
            # asyncio.timeout, not wait_for: on 3.11 wait_for returns, swallowing a cancel,
            # when the awaited event is set in the same loop pass (close() would wait forever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await stop.wait()
