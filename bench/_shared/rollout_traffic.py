"""An independent generator of a ramp step's live traffic, in simulated time (issue 43's world).

Written apart from `evaluators.rollout` and sharing none of its code: it knows sessions, turns,
arms and clocks, not summaries or tests. New sessions arrive as a Poisson process (10 a second);
each has 3 turns, each starting 10 s after the previous one started (or when it ended, if later).
A session's first-turn log TTFT has sd 0.8 around log(0.4 s); a later turn keeps 70 % of that
session's variance (sqrt(0.7) of its first-turn deviation plus fresh noise of variance 0.3 * 0.64),
so every turn has sd 0.8 and later turns correlate 0.84 with the first. E2E is TTFT plus a decode
time of lognormal length (median 120 tokens, sd 0.4 in log) at 25 ms a token. A failing session
(2 % of sessions) answers 5xx before the first byte on every turn, 50 ms after it starts. Each
session draws its arm by a uniform draw against the step's weight. Harm, on the candidate's
sessions only: TTFT x `ttft_factor` on every turn (E2E moves with it), or a failing share
`fail_p_candidate` instead of 2 %. Many runs at once, as (runs, sessions, turns) arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

RATE = 10.0  # new sessions a second
TURNS = 3
TURN_GAP_S = 10.0
TTFT_MEDIAN_S = 0.4
TTFT_SD = 0.8
SHARED = 0.7  # share of a later turn's log-TTFT variance that is its session's
FAIL_P = 0.02
FAIL_AFTER_S = 0.05
TOKENS_LOG_MEAN, TOKENS_LOG_SD, TPOT_S = math.log(120.0), 0.4, 0.025


@dataclass(frozen=True)
class StepTraffic:
    """(runs, sessions) per session and (runs, sessions, turns) per request; times from the
    step's start. `end_s` is when a request ended (when its record exists)."""

    start_s: NDArray[np.float64]  # (R, N): the session's first turn begins
    candidate: NDArray[np.bool_]  # (R, N)
    end_s: NDArray[np.float64]  # (R, N, T)
    ok: NDArray[np.bool_]  # (R, N, T)
    ttft_s: NDArray[np.float64]  # (R, N, T), NaN when no token came
    e2e_s: NDArray[np.float64]  # (R, N, T)


def step_traffic(
    rng: np.random.Generator,
    *,
    runs: int,
    duration_s: float,
    weight: float,
    ttft_factor: float = 1.0,
    fail_p_candidate: float = FAIL_P,
    rate: float = RATE,
) -> StepTraffic:
    """Sessions starting in [0, duration_s) of `runs` independent steps at `weight`."""
    n = int(rate * duration_s + 6.0 * math.sqrt(rate * duration_s) + 10)
    start = np.cumsum(rng.exponential(1.0 / rate, (runs, n)), axis=1)
    start = np.where(start < duration_s, start, np.inf)  # arrivals past the end never come
    cand = rng.random((runs, n)) < weight
    failing = rng.random((runs, n)) < np.where(cand, fail_p_candidate, FAIL_P)

    dev1 = rng.normal(0.0, TTFT_SD, (runs, n))
    fresh = rng.normal(0.0, TTFT_SD * math.sqrt(1.0 - SHARED), (runs, n, TURNS))
    dev = np.concatenate(
        [dev1[..., None], math.sqrt(SHARED) * dev1[..., None] + fresh[..., 1:]], axis=-1
    )
    log_ttft = math.log(TTFT_MEDIAN_S) + dev + np.where(cand, math.log(ttft_factor), 0.0)[..., None]
    ttft = np.exp(log_ttft)
    tokens = np.exp(rng.normal(TOKENS_LOG_MEAN, TOKENS_LOG_SD, (runs, n, TURNS)))
    e2e = ttft + tokens * TPOT_S
    fails = np.broadcast_to(failing[..., None], (runs, n, TURNS))
    e2e = np.where(fails, FAIL_AFTER_S, e2e)
    ttft = np.where(fails, np.nan, ttft)

    end = np.empty((runs, n, TURNS))
    begin = start
    for k in range(TURNS):
        if k:
            begin = np.maximum(start + k * TURN_GAP_S, end[..., k - 1])
        end[..., k] = begin + e2e[..., k]
    return StepTraffic(start, cand, end, ~fails, ttft, e2e)
