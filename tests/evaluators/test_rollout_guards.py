"""The guards' false-trip model (`evaluators.rollout.guards`) against a brute-force simulation of
the workers' `ArmGuard` on an independent generator (`guard_world`): it never understates a
measured trip rate and overstates it by at most 2x where the rate is measurable."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from evaluators.rollout.guards import WORLD, World, rollout_guard_trips, step_guard_trips
from gateway.rollout.arms import ArmGuard
from tests.evaluators.guard_world import candidate_stream, first_trip

OFF = 10**9  # a consecutive guard that never trips
RUNS = 1000


def _measured(w: float, d: float, p: float, c: int, window: int, b: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(RUNS):
        failed, session = candidate_stream(
            rng, weight=w, duration_s=d, sessions_per_s=WORLD.sessions_per_s,
            turns=round(WORLD.turns), gap_s=WORLD.turn_gap_s, failing_share=p,
        )  # fmt: skip
        guard = first_trip(failed, session, lambda: ArmGuard(consecutive=c, window=window, burst=b))
        hits += guard is not None
    return hits / RUNS


@pytest.mark.parametrize(
    ("w", "d", "p", "c", "window", "b"),
    [
        (0.05, 600.0, 0.06, OFF, 50, 5),
        (0.05, 600.0, 0.10, OFF, 50, 7),
        (0.01, 1200.0, 0.10, OFF, 50, 5),
        (0.01, 1200.0, 0.15, 3, 50, 50),
        (0.05, 600.0, 0.15, 3, 50, 50),
        (0.05, 600.0, 0.02, 5, 50, 10),
    ],
    ids=["burst-5", "burst-7", "burst-1pct", "streak-1pct", "streak-5pct", "defaults"],
)
def test_the_model_bounds_the_simulated_trip_rate(
    w: float, d: float, p: float, c: int, window: int, b: int
) -> None:
    """Over 1,000 simulated steps, the measured trip rate is at most the model's plus three
    standard errors, and where it is measurable (>= 5 %) the model is within 2x of it."""
    t0 = time.perf_counter()
    model = step_guard_trips(
        w, d, World(failing_share=p), consecutive=c, window=window, burst=b
    ).either
    elapsed = time.perf_counter() - t0
    sim = _measured(w, d, p, c, window, b, seed=round(1000 * w + 100 * p + b))
    print(f"w {w} p {p} c {c} b {b}/{window}: simulated {sim:.4f}, model {model:.4f}")
    assert sim <= model + 3.0 * math.sqrt(max(model * (1.0 - model), 1e-4) / RUNS)
    if sim >= 0.05:
        assert model <= 2.0 * sim
    assert elapsed < 0.05


def test_a_dead_candidate_trips_the_consecutive_guard_in_every_step() -> None:
    """Every request failing: the consecutive guard trips for sure, at any weight."""
    dead = World(failing_share=1.0)
    for w in (0.01, 0.05, 1.0):
        assert step_guard_trips(w, 60.0, dead, consecutive=5, window=50, burst=10).consecutive == 1


def test_the_defaults_stay_within_the_guards_share_at_the_documented_world() -> None:
    """At 10 new sessions/s, 2 % failing three-turn sessions, the default ramp's steps (their
    planned dwells) trip a guard falsely in far less than alpha * GUARD_SHARE."""
    from evaluators.rollout.guards import GUARD_SHARE

    steps = [(1.0, 60.0), (5.0, 500.0), (25.0, 730.0), (50.0, 1500.0), (100.0, 60.0)]
    _, total = rollout_guard_trips(steps, WORLD, consecutive=5, window=50, burst=10)
    print(f"guards over the rollout: {total.either:.2e}")
    assert total.either <= 0.05 * GUARD_SHARE
