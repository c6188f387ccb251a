"""How often the workers' guards roll back a candidate that is production's equal.

The guards (`gateway.rollout.arms.ArmGuard`) are thresholds, not tests: `consecutive` candidate
failures in a row, or `burst` failing sessions among the last `window` counted candidate
requests (a session's further failures while its failure is in the window are not counted).
Their false trips are false rollbacks like a test's, so the rollout's error budget holds them:
the tests get `alpha * (1 - GUARD_SHARE)` and the guard defaults are sized so that their trips
over a whole rollout stay within `alpha * GUARD_SHARE` at the documented world (`WORLD`).

The world of a step: new sessions arrive at `sessions_per_s` (Poisson), a share `weight` on the
candidate; each has `turns` requests `turn_gap_s` apart; a share `failing_share` of sessions
fail every turn (failures clustered by session, the shape that makes a per-request count trip),
the others never fail. At weight w the candidate serves r = rate * w * turns requests a second.

* **Burst.** Counted requests arrive at r_c = rate * w * ((1 - p) * turns + p * m), where m is
  how many times a failing session is counted: once when its turns span less than the time D
  the window covers (D = window / r_c), again for each later turn that comes more than D after
  its last counted one (solved by iteration).
  Each counted request is a failing session's with probability q = p m / ((1 - p) turns + p m),
  independently across sessions. The window first holds `burst` failures at a counted failure
  whose `window - 1` predecessors hold `burst - 1`, so over the N = r_c * duration counted
  requests the expected number of such crossings is at most mu = N q P(Bin(window - 1, q) >=
  burst - 1) (a union bound, treating the labels as independent Bernoulli(q), which spreads
  them more than sessions do); the trip probability is stated as 1 - exp(-mu) <= mu.
* **Consecutive.** A streak of `consecutive` failures starts at a failing request (p) and goes on
  while the next candidate request fails: the same session's next turn is next when no other
  request comes within `turn_gap_s` (a = exp(-r * turn_gap_s)), else another session fails
  with p. mu = N_req p (a + (1 - a) p) ** (consecutive - 1), stated as 1 - exp(-mu).

Both are checked against a brute-force simulation of `ArmGuard` on generated sessions
(tests/evaluators/test_rollout_guards.py). A dead candidate (p = 1) trips the consecutive guard
at its `consecutive`-th request. Pure Python and scipy; never does IO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

# The share of the rollout's alpha its guards may spend on false trips; the tests get the rest.
GUARD_SHARE = 0.05


@dataclass(frozen=True, slots=True)
class World:
    """The traffic a guard's false-trip probability is stated at."""

    sessions_per_s: float = 10.0
    failing_share: float = 0.02
    turns: float = 3.0
    turn_gap_s: float = 10.0


# The documented world (docs/rollout.md, "Guards"): the defaults are sized for it.
WORLD = World()


@dataclass(frozen=True, slots=True)
class GuardTrips:
    """Each guard's probability of a false trip over one step (or a whole rollout), and either."""

    consecutive: float
    burst: float

    @property
    def either(self) -> float:
        return 1.0 - (1.0 - self.consecutive) * (1.0 - self.burst)


def _burst_counts(rate_sessions: float, turns: float, gap_s: float, p: float, window: int
                  ) -> tuple[float, float]:  # fmt: skip
    """(counted requests a second, share of them that are failing sessions')."""
    n_turns = max(1, round(turns))
    m = 1.0
    for _ in range(20):
        counted = rate_sessions * ((1.0 - p) * turns + p * m)
        covers_s = window / counted
        # A failing session's later turn counts again once its last counted one left the window.
        new_m, last = 1.0, 0.0
        for k in range(1, n_turns):
            if k * gap_s - last > covers_s:
                new_m, last = new_m + 1.0, k * gap_s
        if new_m == m:
            break
        m = max(m, new_m)  # never oscillate: the larger count is the conservative one
    counted = rate_sessions * ((1.0 - p) * turns + p * m)
    share = p * m / ((1.0 - p) * turns + p * m)
    return counted, share


def step_guard_trips(
    weight: float,
    duration_s: float,
    world: World,
    *,
    consecutive: int,
    window: int,
    burst: int,
) -> GuardTrips:
    """Each guard's false-trip probability over a step of `duration_s` at `weight` (0-1) in
    `world` (see the module docstring for the model and its bounds)."""
    if not 0.0 <= weight <= 1.0 or duration_s < 0:
        raise ValueError(f"weight in [0, 1] and duration_s >= 0: {weight}, {duration_s}")
    p = min(max(world.failing_share, 0.0), 1.0)
    rate_sessions = world.sessions_per_s * weight
    if rate_sessions <= 0 or duration_s == 0 or p == 0:
        return GuardTrips(0.0, 0.0)
    turns = max(world.turns, 1.0)
    requests_per_s = rate_sessions * turns
    n_requests = requests_per_s * duration_s
    if p >= 1.0:
        return GuardTrips(1.0 if n_requests >= consecutive else 0.0, 0.0)
    # Consecutive: a streak starts at a failing request and continues request by request.
    same = math.exp(-requests_per_s * world.turn_gap_s) if turns > 1 else 0.0
    go_on = same + (1.0 - same) * p
    mu_c = n_requests * p * go_on ** (consecutive - 1)
    # Burst: a crossing of `burst` counted failures among the last `window`.
    counted_per_s, q = _burst_counts(rate_sessions, turns, world.turn_gap_s, p, window)
    tail = float(stats.binom.sf(burst - 2, window - 1, q)) if burst >= 2 else 1.0
    mu_b = counted_per_s * duration_s * q * tail
    return GuardTrips(-math.expm1(-mu_c), -math.expm1(-mu_b))


def rollout_guard_trips(
    steps: Sequence[tuple[float, float]],
    world: World,
    *,
    consecutive: int,
    window: int,
    burst: int,
) -> tuple[tuple[GuardTrips, ...], GuardTrips]:
    """Per step (weight in %, seconds) and over the whole rollout (the steps are independent:
    each starts with a fresh window of its own sessions)."""
    per = tuple(
        step_guard_trips(
            pct / 100.0, seconds, world, consecutive=consecutive, window=window, burst=burst
        )
        for pct, seconds in steps
    )
    keep_c = math.prod(1.0 - g.consecutive for g in per)
    keep_b = math.prod(1.0 - g.burst for g in per)
    return per, GuardTrips(1.0 - keep_c, 1.0 - keep_b)


def false_rollbacks(
    tests: Sequence[float], guards: Sequence[float | None]
) -> tuple[float, float | None, float | None]:
    """(the tests' bound, the guards' trips, both) over a rollout from each step's; the guards'
    and the total are None where a step's dwell is unknown (out of reach)."""
    bound = math.fsum(tests)
    if any(g is None for g in guards):
        return bound, None, None
    guarded = 1.0 - math.prod(1.0 - (g or 0.0) for g in guards)
    return bound, guarded, min(1.0, bound + guarded)
