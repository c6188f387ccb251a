"""Tool-call validity, validated on a world written apart from the product (`tool_world`):
sessions with clustered invalid calls, failed and uncheckable answers, mixed reasons; 200 runs a
case through the product's metric and verdict, looking every so many sessions, the last look
planned.

The plan is `canary plan`'s tool-validity row (`evaluators.judge.plan.rate_units`) for the
discordance and turns a user would state. It assumes independent pairs within a session; this
world's invalid calls cluster by session, so showing a small true difference within the margin
takes longer than that plan says: +0.3 pp is promoted in 91.5 % of runs by 1.5x its plan
(measured), and the test allows 2x.
"""

from __future__ import annotations

import numpy as np
import pytest

import evaluators.metrics.toolcalls as toolcalls_module
from evaluators.judge import plan
from evaluators.judge.settings import VerdictSettings
from tests.evaluators import tool_world as tw

RUNS = 200
S = VerdictSettings()
TURNS = 4  # the world's mean session length is about 4.2 turns


def discordance(a: float, b: float) -> float:
    """The share of pairs where exactly one arm is invalid, as a user would state it."""
    return a * (1 - b) + b * (1 - a)


def first_decision(world: tw.World, sessions: int, every: int, seed: int, *, stop: bool) -> str:
    """Look every `every` sessions (the last look planned): the first reject, else the first
    promote when `stop` (an experiment ends at its decision), else "hold"."""
    ps = tw.draw(world, sessions, np.random.default_rng(seed))
    ends = tw.session_ends(ps)
    looks = [int(k) for k in ends[every - 1 :: every]]
    if not looks or looks[-1] != int(ends[-1]):
        looks.append(int(ends[-1]))
    for j, k in enumerate(looks):
        r = tw.judge_at(ps, k, S, planned=j == len(looks) - 1)
        if r.status in ("critical", "beyond"):
            return "reject"
        if stop and r.status == "inside":
            return "promote"
    return "hold"


def shares(
    world: tw.World, sessions: int, every: int, runs: int, *, stop: bool
) -> dict[str, float]:
    out = [first_decision(world, sessions, every, 5000 + i, stop=stop) for i in range(runs)]
    return {d: out.count(d) / runs for d in ("reject", "promote", "hold")}


@pytest.mark.slow
def test_three_points_more_invalid_calls_are_rejected_within_the_plan() -> None:
    """Production invalid in 1 % of answers, the candidate in 4 %: rejected in at least 90 %
    of 200 runs by the planned sessions."""
    world = tw.World(production=0.01, candidate=0.04)
    sessions = plan.rate_units(S.tool_validity_delta, S.alpha, discordance(0.01, 0.04), TURNS)
    assert sessions is not None
    got = shares(world, sessions, 50, RUNS, stop=True)
    assert got["reject"] >= 0.90, got


@pytest.mark.slow
def test_a_third_of_a_point_more_is_promoted() -> None:
    """A candidate 0.3 pp more invalid than production (1 % vs 1.3 %) shows it within the 1 pp
    margin in at least 90 % of 200 runs by twice the plan for that effect, and is never
    rejected."""
    world = tw.World(production=0.01, candidate=0.013)
    planned = plan.rate_units(
        S.tool_validity_delta, S.alpha, discordance(0.01, 0.013), TURNS, effect=0.003
    )
    assert planned is not None
    got = shares(world, 2 * planned, 100, RUNS, stop=True)
    assert got["promote"] >= 0.90 and got["reject"] == 0, got


@pytest.mark.slow
def test_equal_arms_are_rejected_at_most_five_percent_of_runs_every_look_counted() -> None:
    """Both arms independently invalid in 3 % of answers (A/A): rejected in at most 5 % of
    200 runs, counting a reject at any look up to the plan, even after a promote."""
    world = tw.World(production=0.03, candidate=0.03)
    sessions = plan.rate_units(S.tool_validity_delta, S.alpha, discordance(0.03, 0.03), TURNS)
    assert sessions is not None
    got = shares(world, sessions, 100, RUNS, stop=False)
    assert got["reject"] <= 0.05, got


def test_judging_against_zero_instead_of_production_fails_the_a_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mutation: a metric that forgets production's own invalid calls (compares the candidate
    with 0) rejects an A/A at 3 % in most runs, so the A/A row above would catch it."""

    def against_zero(worse: np.ndarray, better: np.ndarray) -> np.ndarray:
        return worse.astype(np.float32)

    monkeypatch.setattr(toolcalls_module, "indicator_difference", against_zero)
    world = tw.World(production=0.03, candidate=0.03)
    got = shares(world, 1500, 300, 10, stop=False)
    assert got["reject"] > 0.5, got
