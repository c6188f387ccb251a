"""Round 4's judgement of one ramp step by its margins, and how long a step takes to show them.

The controller now decides by `rule` (harm at every look, power-sized dwells, the margins asked
once at the largest split step); this module keeps the margin tests of every summary at a step
(`gating_tests`, the intersection-union rule) and `step_duration`, the sessions a step would
need to show the candidate within its margins, which docs/rollout.md cites.

A step serves a share `weight` of new sessions with the candidate. Its gating tests are the
two-sample comparisons of `twosample` on every summary of `arms`, at the candidate's margins
(`VerdictSettings`: latency_delta as a log ratio, error_delta, slo_exceedance_delta):

* `rollback` — some test shows harm: its lower bound lies past the margin. Rollback may fire at
  any look on any of the K tests, so each harm bound runs at α/K (Bonferroni).
* `advance` — every test is ok (its upper bound lies inside the margin: an intersection-union
  test, no correction) and the step's minimum duration has passed.
* `wait` — otherwise (including "insufficient": an arm below `min_metric_pairs` sessions).

`step_duration` states, before a step starts, the sessions and seconds by which about 95 % of
steps decide at a measured session rate and noise; the smaller arm sets it (at 5 % the
candidate's arm is 19x smaller than production's). Pure; never does IO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from scipy import special

from domain.errors import UsageError
from evaluators.judge.plan import QUANTILE
from evaluators.judge.settings import VerdictSettings
from evaluators.rollout.arms import LATENCY, SUMMARIES, SessionUnits
from evaluators.rollout.twosample import (
    DECISIONS,
    HARM,
    OK,
    Codes,
    Comparison,
    MeanDiff,
    ShareDiff,
    comparison,
    effective_units,
    mixture_boundary,
)

F = NDArray[np.float64]
I64 = NDArray[np.int64]
Action = Literal["advance", "rollback", "wait"]

# Action codes of the vectorized form, indexing ACTIONS.
WAIT, ADVANCE, ROLLBACK = 0, 1, 2
ACTIONS: tuple[Action, ...] = ("wait", "advance", "rollback")
# Largest step sized, in sessions: past this a margin is out of reach for the step.
MAX_SESSIONS = 10_000_000


def margins(settings: VerdictSettings) -> dict[str, float]:
    """Each gating test's margin on its own scale (log ratio or share difference)."""
    latency = math.log(settings.latency_delta)
    return {
        "ttft_first": latency,
        "ttft_later": latency,
        "e2e": latency,
        "failure": settings.error_delta,
        "ttft_slo": settings.slo_exceedance_delta,
        "e2e_slo": settings.slo_exceedance_delta,
    }


def gating_stats(
    values: dict[str, F],
    candidate: NDArray[np.bool_],
    looks: I64 | None,
    *,
    settings: VerdictSettings,
    weight: float,
    horizon_sessions: float,
) -> dict[str, MeanDiff | ShareDiff]:
    """Every gating test's sequence over sessions in closing order (last axis; leading axes
    are runs), read at `looks` (sessions so far). The latency sequences are tuned to the
    information `horizon_sessions` sessions at `weight` will carry."""
    _check_weight(weight)
    horizon = effective_units(horizon_sessions, weight, "mean")
    out: dict[str, MeanDiff | ShareDiff] = {}
    for name in SUMMARIES:
        if name in LATENCY:
            out[name] = MeanDiff(
                values[name],
                candidate,
                looks,
                horizon=horizon,
                sigma_floor=settings.latency_sigma_floor,
            )
        else:
            out[name] = ShareDiff(values[name], candidate, looks, candidate_smaller=weight <= 0.5)
    return out


def gating_codes(stats: dict[str, MeanDiff | ShareDiff], settings: VerdictSettings) -> Codes:
    """Decision codes of every test, stacked on a new first axis (in `SUMMARIES` order)."""
    marg = margins(settings)
    alpha_harm = settings.alpha / len(stats)
    return np.stack(
        [
            stats[name].decide(marg[name], alpha_harm, settings.alpha, settings.min_metric_pairs)
            for name in stats
        ]
    )


def step_actions(codes: Codes, min_step_passed: bool | NDArray[np.bool_]) -> NDArray[np.int8]:
    """Action code per look from the tests' codes (axis 0): rollback on any harm, advance when
    every test is ok and the minimum duration has passed, else wait."""
    out = np.full(codes.shape[1:], WAIT, dtype=np.int8)
    out[np.all(codes == OK, axis=0) & min_step_passed] = ADVANCE
    out[np.any(codes == HARM, axis=0)] = ROLLBACK
    return out


@dataclass(frozen=True, slots=True)
class StepJudgement:
    """What the step should do, and why: the harmful tests (rollback) or the tests not yet
    shown ok (wait), each with its evidence."""

    action: Action
    because: tuple[Comparison, ...]
    tests: tuple[Comparison, ...]


def gating_tests(
    units: SessionUnits, settings: VerdictSettings, *, weight: float, horizon_sessions: float
) -> tuple[Comparison, ...]:
    """Every gating test of a live step, at its last look (all sessions closed so far)."""
    stats = gating_stats(
        units.values,
        units.candidate,
        None,
        settings=settings,
        weight=weight,
        horizon_sessions=horizon_sessions,
    )
    marg = margins(settings)
    alpha_harm = settings.alpha / len(stats)
    return tuple(
        comparison(
            name,
            stat,
            margin=marg[name],
            alpha_harm=alpha_harm,
            alpha_ok=settings.alpha,
            min_units=settings.min_metric_pairs,
        )
        for name, stat in stats.items()
    )


def judge_step(
    tests: Sequence[Comparison], *, elapsed_s: float, min_step_s: float
) -> StepJudgement:
    """The step's action from its gating tests (see the module docstring)."""
    if not tests:
        raise UsageError("a ramp step needs at least one gating test")
    codes = np.array([[DECISIONS.index(t.decision)] for t in tests], dtype=np.int8)
    action = ACTIONS[int(step_actions(codes, elapsed_s >= min_step_s)[0])]
    if action == "rollback":
        because = tuple(t for t in tests if t.decision == "harm")
    elif action == "wait":
        because = tuple(t for t in tests if t.decision != "ok")
    else:
        because = ()
    return StepJudgement(action, because, tuple(tests))


@dataclass(frozen=True, slots=True)
class StepDuration:
    """Sessions (both arms) and seconds by which about 95 % of steps decide; None when out of
    reach (more than MAX_SESSIONS)."""

    sessions: int | None
    seconds: float | None


def step_duration(
    weight: float,
    sessions_per_s: float,
    noise: float,
    margin: float,
    *,
    alpha: float,
    kind: Literal["mean", "share"] = "mean",
    horizon_sessions: float | None = None,
) -> StepDuration:
    """Sessions and seconds for a test to decide at `weight`, new sessions arriving at
    `sessions_per_s` and a per-session standard deviation `noise` in each arm.

    `margin` is the distance the bound must clear: the margin itself for "ok" at no true
    difference, (effect − margin) for "harm". `alpha` is the level of that bound (α to
    advance, α/K to roll back). The sequence is tuned to `horizon_sessions` (default: the
    answer itself, as a plan would tune it). Decided = the bound at n clears the margin by
    z(0.95) standard errors. For shares the betting sequence is sized as a tuned normal
    mixture of the pair differences (close while bets stay small), and never below its
    floor log(1/α)/(0.8 δ) pairs (`evaluators.judge.plan`).
    """
    _check_weight(weight)
    if not (noise > 0 and margin > 0 and sessions_per_s > 0):
        raise UsageError("step_duration needs noise, margin and session rate > 0")
    sd = noise * math.sqrt(2.0)
    z = float(special.ndtri(QUANTILE))
    floor = math.log(1.0 / alpha) / (0.8 * margin) if kind == "share" else 2.0

    def width(sessions: float) -> float:
        t = effective_units(sessions, weight, kind)
        tune = t if horizon_sessions is None else effective_units(horizon_sessions, weight, kind)
        b = float(mixture_boundary(np.array([t]), tune, alpha)[0])
        return (b / t + z / math.sqrt(t)) * sd

    def decided(sessions: float) -> bool:
        return effective_units(sessions, weight, kind) >= floor and width(sessions) <= margin

    lo, hi = 1.0, float(MAX_SESSIONS)
    if not decided(hi):
        return StepDuration(None, None)
    while hi - lo > 1.0:
        mid = math.sqrt(lo * hi) if hi > 4.0 * lo else 0.5 * (lo + hi)
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    sessions = math.ceil(hi)
    return StepDuration(sessions, sessions / sessions_per_s)


def _check_weight(weight: float) -> None:
    if not 0.0 < weight < 1.0:
        raise UsageError(f"a ramp step compares two arms: weight in (0, 1), got {weight}")
