"""An independent generator of ramp traffic: requests of multi-turn sessions served by one arm.

Written apart from `evaluators.rollout` and sharing none of its code or assumptions: it knows
requests, not session summaries. Each session draws an arm (by a hash-like uniform draw against
the weight), a number of turns (geometric, 1 to 10), a latency random effect, a decode speed,
and whether it is a "bad" session that fails most of its turns (clustered failures). Each
request draws heavy-tailed TTFT (lognormal, with occasional queueing spikes), a later-turn
speed-up (KV reuse), a nondeterministic output length and decode jitter, a background failure,
and a client disconnect. Many runs at once: session ids are unique across runs and requests are
ordered by (run, session, turn), so each run's sessions close in session order.

The true differences the generator implies are stated by `truth`, computed from its parameters
(not estimated from its draws).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

BASE_TTFT_S = 0.35
SESSION_SD = 0.4  # sd of a session's shared log-TTFT shift (prompt length, replica)
REQUEST_SD = 0.6  # sd of one request's log-TTFT noise
SPIKE_P, SPIKE_SD = 0.05, 1.5  # queueing spikes: multiply TTFT by exp(|N(0, 1.5)|)
LATER_TURN_SHIFT = -0.6  # log TTFT on turns >= 2 (prefix cache hits)
BAD_SESSION_P, BAD_FAIL_P = 0.03, 0.6  # a bad session fails 60 % of its turns
BACKGROUND_FAIL_P = 0.004
DISCONNECT_P = 0.01
MAX_TURNS = 10
TURN_P = 0.35  # turns ~ geometric(0.35): mean ~2.8


@dataclass(frozen=True)
class Requests:
    """One entry per request, ordered by (run, session, turn)."""

    session: NDArray[np.int64]
    arm: NDArray[np.int64]
    turn: NDArray[np.int64]
    ok: NDArray[np.bool_]
    ttft_s: NDArray[np.float64]
    e2e_s: NDArray[np.float64]
    disconnected: NDArray[np.bool_]

    def columns(self) -> dict[str, NDArray[Any]]:
        """The requests as the rollout's evidence names its columns (its field names)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def generate(
    rng: np.random.Generator,
    *,
    runs: int,
    sessions: int,
    weight: float,
    ttft_factor: float = 1.0,
    extra_fail_p: float = 0.0,
) -> Requests:
    """`runs` x `sessions` sessions; the candidate's TTFT is `ttft_factor` times production's
    and each of its requests fails with an extra independent probability `extra_fail_p`."""
    m = runs * sessions
    cand_s = rng.random(m) < weight
    turns_s = np.minimum(rng.geometric(TURN_P, m), MAX_TURNS)
    effect_s = rng.normal(0.0, SESSION_SD, m)
    tpot_s = 0.03 * np.exp(rng.normal(0.0, 0.2, m))
    bad_s = rng.random(m) < BAD_SESSION_P

    sid = np.repeat(np.arange(m, dtype=np.int64), turns_s)
    n = len(sid)
    starts = np.repeat(np.cumsum(turns_s) - turns_s, turns_s)
    turn = np.arange(n, dtype=np.int64) - starts + 1
    cand = cand_s[sid]

    log_ttft = (
        math.log(BASE_TTFT_S)
        + effect_s[sid]
        + np.where(turn >= 2, LATER_TURN_SHIFT, 0.0)
        + rng.normal(0.0, REQUEST_SD, n)
        + np.where(rng.random(n) < SPIKE_P, np.abs(rng.normal(0.0, SPIKE_SD, n)), 0.0)
        + np.where(cand, math.log(ttft_factor), 0.0)
    )
    ttft = np.exp(log_ttft)
    tokens = np.clip(np.round(np.exp(rng.normal(5.0, 0.8, n))), 1, 2000)
    e2e = ttft + tokens * tpot_s[sid] * np.exp(rng.normal(0.0, 0.1, n))

    fail_p = np.where(bad_s[sid], BAD_FAIL_P, BACKGROUND_FAIL_P)
    failed = rng.random(n) < fail_p
    failed |= cand & (rng.random(n) < extra_fail_p)
    # Half of the failures come before any token (no TTFT); all end early.
    no_token = failed & (rng.random(n) < 0.5)
    ttft = np.where(no_token, np.nan, ttft)
    e2e = np.where(failed, np.where(no_token, 0.05, ttft * 1.5), e2e)
    disconnected = rng.random(n) < DISCONNECT_P
    e2e = np.where(disconnected, e2e * rng.random(n), e2e)
    return Requests(sid, cand.astype(np.int64), turn, ~failed, ttft, e2e, disconnected)


def truth(metric: str, *, ttft_factor: float = 1.0, extra_fail_p: float = 0.0) -> float:
    """The true candidate − production difference of a session summary's mean, from the
    parameters: log TTFT moves by log(factor) whatever the turn; a session's expected failure
    share is its per-turn failure probability (failures are independent of disconnects)."""
    if metric in ("ttft_first", "ttft_later"):
        return math.log(ttft_factor)
    if metric == "failure":
        p0 = BAD_SESSION_P * BAD_FAIL_P + (1 - BAD_SESSION_P) * BACKGROUND_FAIL_P
        return extra_fail_p * (1.0 - p0)
    raise KeyError(metric)
