"""A rollout's first look, before any request of its step has finished: the controller reads the
real (empty) evidence from storage, waits, and logs nothing above DEBUG.

Before, the per-session summaries of no request lacked the `ttft` key and every rollout start
logged a KeyError from the controller's retry loop.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import numpy as np
import pytest

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.arms import SessionUnits, session_units
from evaluators.rollout.rule import MEANS, comparisons, judge_look, look_stats
from gateway.rollout.controller import RolloutController
from storage import queries
from storage.engine import make_engine, upgrade
from storage.rollouts import current_rollout, start_rollout

LIVE = Endpoint(name="prod", url="http://127.0.0.1:9000", role="live")
CAND = Endpoint(name="cand", url="http://127.0.0.1:9100/cand")


def _no_requests() -> SessionUnits:
    empty = np.zeros(0)
    return session_units(
        {
            "session": np.zeros(0, dtype=np.int64),
            "arm": np.zeros(0, dtype=np.int8),
            "turn": np.zeros(0, dtype=np.int32),
            "ok": np.zeros(0, dtype=bool),
            "ttft_s": empty,
            "e2e_s": empty,
            "disconnected": np.zeros(0, dtype=bool),
        },
        slo_ttft_s=1.0,
        slo_e2e_s=10.0,
    )


def test_units_of_no_request_carry_every_summary() -> None:
    """The units of no request have every summary the rule reads (empty), so its tests say
    "insufficient" instead of failing on a missing key."""
    units = _no_requests()
    assert set(MEANS) <= set(units.values)
    assert all(len(v) == 0 for v in units.values.values())
    assert units.values.keys() == _one_request().values.keys()
    stats = look_stats(units, np.zeros(0, dtype=bool))
    settings = VerdictSettings()
    look = judge_look(
        stats, weight_pct=5.0, steps=[5, 50, 100], elapsed_s=0.0, min_step_s=60.0, settings=settings
    )
    tests = comparisons(stats, look, weight_pct=5.0, steps=[5, 50, 100], settings=settings)
    assert int(look.action) == 0  # wait
    assert {t.decision for t in tests} == {"insufficient"}


def _one_request() -> SessionUnits:
    return session_units(
        {
            "session": np.array([1], dtype=np.int64),
            "arm": np.array([0], dtype=np.int8),
            "turn": np.array([1], dtype=np.int32),
            "ok": np.array([True]),
            "ttft_s": np.array([0.2]),
            "e2e_s": np.array([2.0]),
            "disconnected": np.array([False]),
        },
        slo_ttft_s=1.0,
        slo_e2e_s=10.0,
    )


@pytest.mark.parametrize("weight", [5.0, 50.0])
async def test_first_look_with_no_finished_request_waits_silently(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, weight: float
) -> None:
    """A running rollout whose step has no finished request yet is judged "wait" from the real
    storage's evidence, with no failed tick and no log record above DEBUG (any logger)."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'first.db'}"
    await upgrade(url)
    engine = make_engine(url)
    try:
        await queries.seed(engine, LIVE, [CAND])
        steps = [weight, 100.0] if weight == 50.0 else [weight, 50.0, 100.0]
        await start_rollout(
            engine, candidate="cand", steps=steps, min_step_s=0.0, actor="t", reason="x"
        )
        stop = asyncio.Event()

        class OneRound(RolloutController):
            """The real controller, whose retry loop stops after its first tick."""

            async def tick(self) -> str | None:
                try:
                    return await super().tick()
                finally:
                    stop.set()

        ctl = OneRound(engine, VerdictSettings())
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            assert await ctl.tick() == "wait"
            stop.clear()
            await ctl.run(3600.0, stop)  # the loop a gateway runs: one round
        assert ctl.decisions == {**ctl.decisions, "wait": 2, "failed": 0}
        assert [r for r in caplog.records if r.levelno > logging.DEBUG] == []
        r = await current_rollout(engine)
        assert r is not None and (r.state, r.weight, len(r.events)) == ("running", weight, 1)
    finally:
        await engine.dispose()
