"""The A/A rollout's false rollbacks with the workers' own guard (`ArmGuard`, counting failing
sessions) on an independent generator (`bench._shared.rollout_traffic`: 10 new sessions/s,
three turns 10 s apart, 2 % of sessions failing every turn), the controller's decision read
every 2 s in simulated time: tests and guards together stay within alpha, and the guards' trips
stay within what `canary plan` states for them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from scipy import stats

from bench._shared.rollout_sim import STEPS, planned_seconds, simulate_rollout
from bench._shared.rollout_traffic import FAIL_P, RATE, TURN_GAP_S, TURNS, StepTraffic, step_traffic
from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.guards import World, rollout_guard_trips
from evaluators.rollout.rule import plan_rollout
from gateway.config.sections import RolloutConfig
from gateway.rollout.arms import ArmGuard

pytestmark = pytest.mark.slow

RUNS = 200
BATCHES = 3  # the A/A total: 600 rollouts (standard error ~0.8 pp), ~50 s
CONFIG = RolloutConfig()


def worker_guard(by_session: bool = True) -> Callable[[StepTraffic], np.ndarray]:
    """Each run's trip time of one worker's `ArmGuard` seeing every candidate request of the
    step in the order they end, each with its session (or, `by_session=False`, none: every
    request its own session, the per-request count)."""

    def trips(tr: StepTraffic) -> np.ndarray:
        runs = tr.end_s.shape[0]
        out = np.full(runs, np.inf)
        for r in range(runs):
            cand = np.broadcast_to(tr.candidate[r][:, None], tr.end_s[r].shape)
            use = cand & np.isfinite(tr.end_s[r])
            sess, _ = np.nonzero(use)
            end = tr.end_s[r][use]
            failed = ~tr.ok[r][use]
            guard = ArmGuard(
                consecutive=CONFIG.guard_consecutive_failures,
                window=CONFIG.guard_burst_window,
                burst=CONFIG.guard_burst_failures,
            )
            order = np.argsort(end, kind="stable")
            for i, f, s in zip(order.tolist(), failed[order].tolist(), sess[order].tolist(),
                               strict=True):  # fmt: skip
                if guard.observe(1, f, s if by_session else None) is not None:
                    out[r] = end[i]
                    break
        return out

    return trips


def _plan_steps(s: VerdictSettings) -> list[tuple[float, float]]:
    plan = plan_rollout(
        STEPS, sessions_per_s=RATE, noise=0.8, failing_share=FAIL_P,
        min_step_s=CONFIG.default_min_step_s, settings=s, turn_span_s=30.0,
    )  # fmt: skip
    return [(p.weight_pct, p.seconds) for p in plan]


def test_an_a_a_rollout_with_the_workers_guard_is_falsely_rolled_back_within_alpha() -> None:
    """600 A/A rollouts (three seeded batches of 200), tests and the workers' guard together:
    rolled back in <= alpha (5 %), the guard's own trips within the binomial 99.9 % bound of
    what the plan states for them."""
    s = VerdictSettings()
    back_at = np.zeros(len(STEPS))
    guards = 0
    for seed in range(21, 21 + BATCHES):
        out = simulate_rollout(seed, runs=RUNS, guard=worker_guard())
        back = out.state == "rolled_back"
        back_at += [np.sum(back & (out.step == k)) for k in range(len(STEPS))]
        guards += int(out.by_guard.sum())
    n = RUNS * BATCHES
    total = back_at.sum() / n
    print(
        f"A/A n={n}: rolled back {total:.4f} (guards {guards / n:.4f}); per step "
        + ", ".join(f"{p:g} %: {c / n:.4f}" for p, c in zip(STEPS, back_at, strict=True))
        + f"; planned {planned_seconds() / 60:.1f} min"
    )
    _, model = rollout_guard_trips(
        _plan_steps(s), World(RATE, FAIL_P, float(TURNS), TURN_GAP_S),
        consecutive=CONFIG.guard_consecutive_failures,
        window=CONFIG.guard_burst_window, burst=CONFIG.guard_burst_failures,
    )  # fmt: skip
    assert total <= s.alpha
    assert guards <= stats.binom.ppf(0.999, n, model.either)


@pytest.mark.parametrize(
    ("p", "first_steps"), [(0.06, 2), (0.04, 5)], ids=["6pct-small-steps", "4pct-whole"]
)
def test_the_guards_trip_no_more_than_the_plan_states(p: float, first_steps: int) -> None:
    """With more failing sessions on the candidate than the documented world (6 % over the
    small steps, where a failing session's turns share one burst window; 4 % over the whole
    rollout), the workers' guard over each step's planned dwell trips in no more of 200
    rollouts than the guards' model states, within the binomial 99.9 % bound."""
    s = VerdictSettings()
    steps = _plan_steps(s)[:first_steps]
    per, total = rollout_guard_trips(
        steps, World(RATE, p, float(TURNS), TURN_GAP_S),
        consecutive=CONFIG.guard_consecutive_failures,
        window=CONFIG.guard_burst_window, burst=CONFIG.guard_burst_failures,
    )  # fmt: skip
    rng = np.random.default_rng(33)
    tripped = np.zeros(RUNS, dtype=bool)
    guard = worker_guard()
    for pct, seconds in steps:
        alive = np.flatnonzero(~tripped)
        tr = step_traffic(
            rng, runs=len(alive), duration_s=seconds, weight=pct / 100.0, fail_p_candidate=p
        )
        tripped[alive] |= np.isfinite(guard(tr))
    allowed = stats.binom.ppf(0.999, RUNS, total.either) / RUNS
    print(
        f"guards at {p:.0%} failing, {first_steps} steps: tripped {tripped.mean():.3f} of "
        f"{RUNS}, model {total.either:.4f} (per step "
        + ", ".join(f"{g.either:.2g}" for g in per)
        + f"), allowed {allowed:.3f}"
    )
    assert tripped.mean() <= allowed
