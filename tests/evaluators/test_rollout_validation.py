"""The ramp's step judgement on traffic from an independent generator (`rollout_world`): it catches
harm within the sessions `step_duration` states, and keeps its error rates and coverage under
continuous peeking (200 seeded runs at once, looked at after every batch of 20 sessions)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.arms import SessionUnits, session_units
from evaluators.rollout.step import (
    ROLLBACK,
    gating_codes,
    gating_stats,
    step_actions,
    step_duration,
)
from evaluators.rollout.twosample import HARM, MeanDiff, ShareDiff
from tests.evaluators.rollout_world import Requests, generate, truth

SETTINGS = VerdictSettings()
# 200 runs at once: the slow tier (docs/getting-started.md, "Test tiers").
pytestmark = pytest.mark.slow

RUNS = 200
EVERY = 20  # sessions between looks
WEIGHT = 0.25
LATENCY_MARGIN = math.log(SETTINGS.latency_delta)
ALPHA_HARM = SETTINGS.alpha / 6  # six gating tests


def _units(req: Requests) -> SessionUnits:
    return session_units(
        req.columns(),
        slo_ttft_s=SETTINGS.slo_ttft_s,
        slo_e2e_s=SETTINGS.slo_e2e_s,
    )


def _runs(
    seed: int, sessions: int, weight: float = WEIGHT, **world: float
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Per-session values and arms as (runs, sessions) arrays, sessions in closing order."""
    rng = np.random.default_rng(seed)
    req = generate(rng, runs=RUNS, sessions=sessions, weight=weight, **world)
    units = _units(req)
    values = {k: v.reshape(RUNS, sessions) for k, v in units.values.items()}
    return values, units.candidate.reshape(RUNS, sessions)


def _measured_noise(metric: str) -> float:
    """The per-session sd a plan would measure on production before the ramp."""
    req = generate(np.random.default_rng(99), runs=1, sessions=4000, weight=0.5)
    return float(np.std(_units(req).arm(metric, candidate=False)))


def _advance_sessions(weight: float = WEIGHT) -> int:
    """The step's horizon: sessions for the first-turn TTFT test to show its margin."""
    d = step_duration(weight, 1.0, _measured_noise("ttft_first"), LATENCY_MARGIN, alpha=0.05)
    assert d.sessions is not None
    return d.sessions


def _rollbacks(values: dict[str, np.ndarray], cand: np.ndarray, horizon: int) -> np.ndarray:
    looks = np.arange(EVERY, cand.shape[1] + 1, EVERY)
    stats = gating_stats(
        values, cand, looks, settings=SETTINGS, weight=WEIGHT, horizon_sessions=horizon
    )
    actions = step_actions(gating_codes(stats, SETTINGS), True)
    out: np.ndarray = np.any(actions == ROLLBACK, axis=-1)
    return out


def test_a_30_percent_slower_candidate_is_rolled_back_within_the_stated_sessions() -> None:
    """A candidate 30 % slower on TTFT at a 25 % step is judged rollback, within the sessions
    step_duration states for that harm, in at least 90 % of 200 runs."""
    horizon = _advance_sessions()
    stated = step_duration(
        WEIGHT,
        1.0,
        _measured_noise("ttft_first"),
        math.log(1.3) - LATENCY_MARGIN,
        alpha=ALPHA_HARM,
        horizon_sessions=horizon,
    )
    assert stated.sessions is not None and stated.sessions < horizon
    values, cand = _runs(1, stated.sessions, ttft_factor=1.3)
    caught = float(np.mean(_rollbacks(values, cand, horizon)))
    print(f"stated {stated.sessions} sessions: rollback in {caught:.3f}")
    assert caught >= 0.90


@pytest.mark.parametrize(
    ("ttft_factor", "extra_fail_p"),
    [(1.0, 0.0), (SETTINGS.latency_delta, 0.01)],
    ids=["a-a", "at-the-margins"],
)
def test_no_harm_is_rarely_rolled_back_under_continuous_peeking(
    ttft_factor: float, extra_fail_p: float
) -> None:
    """Looked at after every 20 sessions up to 3,000, an A/A ramp, and a candidate exactly at
    the latency and failure margins (the hardest null), are rolled back in at most 5 % of 200
    runs."""
    values, cand = _runs(2, 3000, ttft_factor=ttft_factor, extra_fail_p=extra_fail_p)
    rate = float(np.mean(_rollbacks(values, cand, _advance_sessions())))
    print(f"rollback in {rate:.3f}")
    assert rate <= 0.05


def test_an_error_rate_harm_is_caught() -> None:
    """A candidate failing 3 pp more requests (margin 1 pp) is rolled back on the failure test
    within the sessions step_duration states for the shares' test, in >= 90 % of runs."""
    weight = 0.5
    noise = _measured_noise("failure")
    stated = step_duration(
        weight,
        1.0,
        noise * math.sqrt(2.0),  # the candidate's extra failures roughly double the variance
        truth("failure", extra_fail_p=0.03) - SETTINGS.error_delta,
        alpha=ALPHA_HARM,
        kind="share",
    )
    assert stated.sessions is not None
    values, cand = _runs(3, stated.sessions, weight=weight, extra_fail_p=0.03)
    looks = np.arange(EVERY, stated.sessions + 1, EVERY)
    stat = ShareDiff(values["failure"], cand, looks, candidate_smaller=True)
    codes = stat.decide(SETTINGS.error_delta, ALPHA_HARM, SETTINGS.alpha, 30)
    caught = float(np.mean(np.any(codes == HARM, axis=-1)))
    print(f"stated {stated.sessions} sessions: failure harm in {caught:.3f}")
    assert caught >= 0.90


@pytest.mark.parametrize("ttft_factor", [1.0, 1.1])
def test_intervals_cover_the_true_difference_at_every_look(ttft_factor: float) -> None:
    """The 95 % sequences (α/2 per side) hold the generator's true difference at every look
    from the first to the 3,000th session in at least 95 % of runs: TTFT log ratio by turn
    bucket, and the failure share with clustered failures and +1 pp on the candidate."""
    values, cand = _runs(4, 3000, ttft_factor=ttft_factor, extra_fail_p=0.01)
    looks = np.arange(EVERY, 3001, EVERY)
    horizon = 2.0 * WEIGHT * (1 - WEIGHT) * _advance_sessions()
    half = SETTINGS.alpha / 2
    for metric in ("ttft_first", "ttft_later"):
        st = MeanDiff(values[metric], cand, looks, horizon=horizon, sigma_floor=0.01)
        lo, hi = st.bounds(half, half)
        true = truth(metric, ttft_factor=ttft_factor)
        held = (st.n_c < 2) | (st.n_p < 2) | ((lo <= true) & (true <= hi))
        coverage = float(np.mean(np.all(held, axis=-1)))
        print(f"{metric}: {coverage:.3f}")
        assert coverage >= 0.95
    shares = ShareDiff(values["failure"], cand, looks, candidate_smaller=True)
    held = shares.covers(truth("failure", extra_fail_p=0.01), half, half)
    coverage = float(np.mean(np.all(held, axis=-1)))
    print(f"failure: {coverage:.3f}")
    assert coverage >= 0.95
