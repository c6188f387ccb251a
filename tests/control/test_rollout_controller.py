"""The real rollout controller on real storage: live evidence of an A/A step advances it (and
then completes the rollout: the promotion), waits while the dwell has not passed, and a
candidate 30 % slower is rolled back with the evidence of the tests that showed harm.

The per-request evidence is generated here (an independent generator: log-normal latencies,
sessions of three turns, arms drawn at the step's weight) and served by the controller's
evidence seam, in the columns `storage.reports.rollout.rollout_requests` returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from gateway.rollout.controller import RolloutController
from storage import queries
from storage.engine import make_engine, upgrade
from storage.rollouts import current_rollout, start_rollout

LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")
CAND = Endpoint(name="cand", url="http://127.0.0.1:9100/cand")
SESSIONS = 3000
TURNS = 3


class Traffic:
    """One rollout generation's live requests, served as `rollout_requests` columns."""

    def __init__(self, generation: int, start: float, *, slowdown: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        n = SESSIONS * TURNS
        session = np.repeat(rng.integers(-(2**62), 2**62, SESSIONS), TURNS)
        arm = np.repeat((rng.random(SESSIONS) < 0.5).astype(np.int8), TURNS)
        factor = np.where(arm == 1, slowdown, 1.0)
        at = start + np.sort(rng.uniform(0, 10, SESSIONS))
        self.generation = generation
        cols: dict[str, NDArray[Any]] = {
            "session": session,
            "arm": arm,
            "turn": np.tile(np.arange(1, TURNS + 1, dtype=np.int32), SESSIONS),
            "ok": np.ones(n, dtype=bool),
            "ttft_s": np.exp(rng.normal(np.log(0.2), 0.3, n)) * factor,
            "e2e_s": np.exp(rng.normal(np.log(3.0), 0.3, n)) * factor,
            "disconnected": np.zeros(n, dtype=bool),
        }
        # Turns of one session a second apart, requests in arrival order.
        self.at = np.repeat(at, TURNS) + np.tile(np.arange(TURNS, dtype=np.float64), SESSIONS)
        order = np.argsort(self.at, kind="stable")
        self.at = self.at[order]
        self.cols = {k: v[order] for k, v in cols.items()}

    async def __call__(
        self, _engine: AsyncEngine, generation: int, since: float | None, until: float | None
    ) -> dict[str, NDArray[Any]]:
        keep = np.full(len(self.at), generation == self.generation)
        if since is not None:
            keep &= self.at >= since
        if until is not None:
            keep &= self.at < until
        return {k: v[keep] for k, v in self.cols.items()}


@contextlib.asynccontextmanager
async def store(tmp_path: Path, min_step_s: float) -> AsyncIterator[tuple[AsyncEngine, int, float]]:
    """A database with a running rollout of `cand` at 50 % then 100 %."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'ctl.db'}"
    await upgrade(url)
    engine = make_engine(url)
    try:
        await queries.seed(engine, LIVE, [CAND])
        r = await start_rollout(
            engine, candidate="cand", steps=[50, 100], min_step_s=min_step_s, actor="t", reason="x"
        )
        yield engine, r.id * 2, r.step_started_at
    finally:
        await engine.dispose()


async def test_equal_arms_advance_then_complete(tmp_path: Path) -> None:
    """An A/A step at the largest split step shows no harm and, at its one non-inferiority
    look, every margin, and advances; at 100 % with its dwell passed the controller completes:
    the candidate is the live endpoint."""
    async with store(tmp_path, 0.0) as (engine, generation, started):
        traffic = Traffic(generation, started, slowdown=1.0, seed=7)
        ctl = RolloutController(engine, VerdictSettings(), evidence=traffic)
        assert await ctl.tick() == "advance"
        r = await current_rollout(engine)
        assert r is not None and (r.state, r.weight) == ("running", 100.0)
        event = r.events[-1]
        assert (event.kind, event.actor) == ("advance", "controller")
        assert event.evidence is not None
        assert {t["decision"] for t in event.evidence["tests"]} == {"ok"}
        assert event.evidence["non_inferiority"] is True
        assert {"ttft", "failing", "ttft_first", "failure"} <= {
            t["name"] for t in event.evidence["tests"]
        }
        assert all(t["n_candidate"] > 1000 for t in event.evidence["tests"][:1])
        assert await ctl.tick() == "complete"
        r = await current_rollout(engine)
        assert r is not None and r.state == "completed"
        _, endpoints = await queries.load_endpoints(engine)
        assert next(e for e in endpoints if e.role == "live").name == "cand"
        assert await ctl.tick() is None  # nothing left to judge
        assert ctl.decisions["advance"] == ctl.decisions["complete"] == 1


async def test_equal_arms_wait_for_the_dwell(tmp_path: Path) -> None:
    """Every test within its margin does not advance before min_step_s has passed."""
    async with store(tmp_path, 3600.0) as (engine, generation, started):
        ctl = RolloutController(
            engine, VerdictSettings(), evidence=Traffic(generation, started, slowdown=1.0, seed=7)
        )
        assert await ctl.tick() == "wait"
        r = await current_rollout(engine)
        assert r is not None and (r.state, r.weight, len(r.events)) == ("running", 50.0, 1)


async def test_slower_candidate_is_rolled_back_with_evidence(tmp_path: Path) -> None:
    """A candidate 30 % slower on every request is rolled back (weight 0) at once, the event
    naming the deterioration tests that showed harm with their estimates (about log 1.3,
    lower bound above no difference)."""
    async with store(tmp_path, 3600.0) as (engine, generation, started):
        traffic = Traffic(generation, started, slowdown=1.3, seed=11)
        ctl = RolloutController(engine, VerdictSettings(), evidence=traffic)
        assert await ctl.tick() == "rollback"
        r = await current_rollout(engine)
        assert r is not None and (r.state, r.weight) == ("rolled_back", 0.0)
        event = r.events[-1]
        assert event.kind == "rollback" and event.reason.startswith("harm: ")
        assert event.evidence is not None
        assert {"ttft", "e2e"} <= set(event.evidence["because"])
        ttft = next(t for t in event.evidence["tests"] if t["name"] == "ttft")
        assert abs(ttft["estimate"] - np.log(1.3)) < 0.05 and ttft["lower"] > ttft["margin"]
        assert [s.value for s in ctl.samples()] == [1]


async def test_margins_not_shown_hold_the_rollout_until_a_person_answers(tmp_path: Path) -> None:
    """At the largest split step an A/A candidate whose non-inferiority look (sized for 50 %
    power at a 2.2 % latency margin) misses a margin is not rolled back but paused (hold) with
    the margin it missed; once a person resumes it the controller advances it instead of
    holding again."""
    from storage.rollouts import transition

    tight = VerdictSettings().with_overrides({"latency_delta": 1.022, "ramp_ni_power": 0.5})
    async with store(tmp_path, 0.0) as (engine, generation, started):
        ctl = RolloutController(
            engine, tight, evidence=Traffic(generation, started, slowdown=1.0, seed=0)
        )
        assert await ctl.tick() == "hold"
        r = await current_rollout(engine)
        assert r is not None and (r.state, r.weight) == ("paused", 50.0)
        event = r.events[-1]
        assert (event.kind, event.actor) == ("pause", "controller")
        assert event.evidence is not None and event.evidence["because"] == ["e2e"]
        assert await ctl.tick() is None  # paused: nothing to judge
        await transition(engine, kind="resume", actor="ops", reason="margins are fine")
        assert await ctl.tick() == "advance"
        r = await current_rollout(engine)
        assert r is not None and (r.state, r.weight) == ("running", 100.0)
