"""`canary plan` states the whole rollout's false-rollback probability of an equal candidate, tests
and guards together, per step and in all, at the failing share given, as a subprocess."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from evaluators.rollout.guards import GUARD_SHARE, WORLD, rollout_guard_trips
from tests.cli.test_cli_plan import canary


async def test_plan_states_tests_and_guards_false_rollbacks_within_alpha() -> None:
    """At the documented world (10 new sessions/s, 3 turns, 2 % failing sessions) each split
    step's tests hold alpha * (1 - GUARD_SHARE) / 4, the guards' trips are the model's over each
    step's dwell, and the total is at most alpha."""
    code, out, err = await canary(
        "plan", "--rate", "30", "--turns", "3", "--failing-share", "0.02", "--format", "json"
    )
    assert code == 0, err
    doc = json.loads(out)
    steps = doc["ramp"]
    assert [r["tests_false"] for r in steps] == [0.05 * (1 - GUARD_SHARE) / 4] * 4 + [0.0]
    _, guards = rollout_guard_trips(
        [(r["weight"], r["seconds"]) for r in steps],
        replace(WORLD, sessions_per_s=10.0, turns=3.0),
        consecutive=5, window=50, burst=10,
    )  # fmt: skip
    assert math.isclose(doc["ramp_guards_false"], guards.either, rel_tol=1e-9)
    assert math.isclose(doc["ramp_tests_false"], 0.05 * (1 - GUARD_SHARE), rel_tol=1e-9)
    assert doc["ramp_guards_false"] <= 0.05 * GUARD_SHARE
    assert doc["ramp_false_rollback"] <= 0.05
    code, out, _ = await canary("plan", "--rate", "30", "--turns", "3")
    assert code == 0 and "false rollbacks of an equal candidate: tests ≤ 4.8 %" in out
    assert "≤ α = 0.05" in out


async def test_plan_warns_when_the_guards_exceed_the_budget_at_a_high_failing_share() -> None:
    """At 20 % failing sessions the guards would trip falsely in most rollouts: the plan says
    the total is above alpha and which settings to raise."""
    code, out, err = await canary("plan", "--rate", "30", "--turns", "3", "--failing-share", "0.2")
    assert code == 0, err
    assert "> α = 0.05" in out and "rollout.guard_burst_failures" in out
