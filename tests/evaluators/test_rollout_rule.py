"""The ramp that completes by itself (issue 43, part 1), on an independent generator
(`rollout_traffic`: 10 new sessions/s, 3 turns 10 s apart, log-TTFT sd 0.8 with 70 % shared, 2 %
failing sessions) driven through the controller's pure decision (`evaluators.rollout.rule`) every
2 s in simulated time, with the workers' guard rule: 200 runs per case, default settings."""

from __future__ import annotations

import numpy as np
import pytest

from bench._shared.rollout_sim import (
    STEPS,
    RolloutOutcome,
    guard_trip_s,
    look_stats_at,
    planned_seconds,
    rolled_back_by,
    simulate_rollout,
)
from bench._shared.rollout_traffic import step_traffic
from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.arms import session_units
from evaluators.rollout.rule import MEANS, judge_look, look_stats
from gateway.config.sections import RolloutConfig
from gateway.rollout.arms import ArmGuard

RUNS = 200


@pytest.fixture(scope="module")
def good() -> RolloutOutcome:
    """200 ramps of a candidate whose world is production's (the A/A ramp)."""
    return simulate_rollout(1, runs=RUNS)


def test_a_good_candidate_completes_within_an_hour_without_a_hand(good: RolloutOutcome) -> None:
    """A good candidate completes 1 -> 100 % by the controller alone in <= 60 minutes in >= 90 %
    of 200 runs."""
    done = (good.state == "completed") & (good.seconds <= 3600.0)
    print(f"completed within 60 min: {done.mean():.3f}, median {np.median(good.seconds) / 60:.1f}")
    assert done.mean() >= 0.90


def test_an_a_a_rollout_is_rarely_rolled_back(good: RolloutOutcome) -> None:
    """An A/A ramp is rolled back, by a test or a guard at any look of any step, in <= 5 % of
    200 runs."""
    rate = float(np.mean(good.state == "rolled_back"))
    print(f"A/A rolled back: {rate:.3f} (guards {good.by_guard.mean():.3f})")
    assert rate <= 0.05


def test_canary_plan_states_the_rollouts_time_within_1_5x(good: RolloutOutcome) -> None:
    """The plan's expected time of the whole ramp at the measured rate and noise is within 1.5x
    of the median time of the completed runs."""
    median = float(np.median(good.seconds[good.state == "completed"]))
    planned = planned_seconds()
    print(f"planned {planned / 60:.1f} min, measured median {median / 60:.1f} min")
    assert median / 1.5 <= planned <= median * 1.5


@pytest.mark.parametrize(
    ("harm", "at", "before_leaving"),
    [
        ("ttft", 0, 1),
        ("ttft", 1, 1),
        ("ttft", 2, 2),
        ("ttft", 3, 3),
        ("failures", 0, 2),
        ("failures", 1, 2),
        ("failures", 2, 2),
    ],
    ids=["ttft-1", "ttft-5", "ttft-25", "ttft-50", "fail-1", "fail-5", "fail-25"],
)
def test_a_planted_harm_is_rolled_back_before_the_step_the_targets_name(
    good: RolloutOutcome, harm: str, at: int, before_leaving: int
) -> None:
    """TTFT x1.3 from 1 % or 5 % is rolled back before the ramp leaves 5 %, from 25 % or 50 %
    before it leaves that step; failing sessions 2 -> 5 % from any step up to 25 % before it
    leaves 25 %: each in >= 90 % of 200 runs (the runs keep the A/A history before the harm)."""
    out = simulate_rollout(
        10 + at, runs=RUNS, harm=harm, harm_step=at, until_step=before_leaving, before=good
    )
    caught = rolled_back_by(out, before_leaving)
    print(f"{harm} from {STEPS[at]:g} %: rolled back by {STEPS[before_leaving]:g} %: {caught:.3f}")
    assert caught >= 0.90


def test_the_simulated_looks_are_the_controllers_statistics() -> None:
    """At a look, the sums the simulation builds incrementally equal `look_stats` of
    `session_units` on the requests stored by then (the controller's live path)."""
    s = VerdictSettings()
    tr = step_traffic(np.random.default_rng(5), runs=1, duration_s=120.0, weight=0.3)
    look = 75.0
    sim = look_stats_at(tr, np.array([look]), s)
    ended = tr.end_s[0] <= look
    sess, turn = np.nonzero(ended)
    units = session_units(
        {
            "session": sess.astype(np.int64),
            "arm": tr.candidate[0][sess].astype(np.int64),
            "turn": turn + 1,
            "ok": tr.ok[0][sess, turn],
            "ttft_s": tr.ttft_s[0][sess, turn],
            "e2e_s": tr.e2e_s[0][sess, turn],
            "disconnected": np.zeros(len(sess), dtype=bool),
        },
        slo_ttft_s=s.slo_ttft_s,
        slo_e2e_s=s.slo_e2e_s,
    )
    began = np.isin(units.session, sess[turn == 0])
    live = look_stats(units, began)
    for name in MEANS:
        for a, b in ((sim.candidate, live.candidate), (sim.production, live.production)):
            for part in ("n", "s1", "s2"):
                np.testing.assert_allclose(
                    getattr(a[name], part)[0, 0], getattr(b[name], part), rtol=1e-9, atol=1e-9
                )
    for part in ("sessions_c", "sessions_p", "failing_c", "failing_p"):
        assert getattr(sim, part)[0, 0] == getattr(live, part)
    sim_look = judge_look(
        sim, weight_pct=50.0, steps=STEPS, elapsed_s=look, min_step_s=60.0, settings=s
    )
    live_look = judge_look(
        live, weight_pct=50.0, steps=STEPS, elapsed_s=look, min_step_s=60.0, settings=s
    )
    assert int(sim_look.action[0, 0]) == int(live_look.action)


def test_the_guard_model_trips_where_the_workers_guard_does() -> None:
    """On streams of candidate requests with bursts of failures, the simulation's vectorized
    guard trips at the same request as the workers' `ArmGuard` with the config's defaults."""
    config = RolloutConfig()
    rng = np.random.default_rng(7)
    tr = step_traffic(rng, runs=40, duration_s=120.0, weight=0.5, fail_p_candidate=0.12)
    trips = guard_trip_s(tr, config)
    for r in range(40):
        cand = np.broadcast_to(tr.candidate[r][:, None], tr.end_s[r].shape)
        end = tr.end_s[r][cand & np.isfinite(tr.end_s[r])]
        failed = ~tr.ok[r][cand & np.isfinite(tr.end_s[r])]
        guard = ArmGuard(
            consecutive=config.guard_consecutive_failures,
            window=config.guard_burst_window,
            burst=config.guard_burst_failures,
        )
        expected = np.inf
        for i in np.argsort(end, kind="stable"):
            if guard.observe(1, bool(failed[i])) is not None:
                expected = end[i]
                break
        assert trips[r] == expected
    assert np.isfinite(trips).sum() >= 10  # the streams do trip


def test_the_failing_test_keeps_its_level_at_every_count() -> None:
    """Under the null (each failing session the candidate's with probability w, the weight),
    the failing-session test read after every one of 3,000 failing sessions rejects in at most
    alpha of 2,000 runs, at 5 % and at 50 %."""
    from evaluators.rollout.rule import LookStats, failing_harm

    rng = np.random.default_rng(3)
    alpha = 0.05
    for w in (0.05, 0.5):
        cand = rng.random((2000, 3000)) < w
        m = np.cumsum(cand, axis=1).astype(np.float64)
        n = np.arange(1, 3001, dtype=np.float64)[None, :]
        stats = LookStats({}, {}, np.zeros(1), np.zeros(1), m, n - m)
        harm, _ = failing_harm(stats, w, alpha)
        rate = float(np.mean(harm.any(axis=1)))
        print(f"w = {w}: rejected in {rate:.4f}")
        assert rate <= alpha
