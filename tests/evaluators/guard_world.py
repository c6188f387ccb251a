"""An independent generator of the candidate's request stream during a rollout step, for the
workers' guards: written apart from `evaluators.rollout.guards` and sharing none of its
formulas. Sessions arrive one by one (exponential gaps) at the step's session rate; each draws
its arm against the weight, a number of turns, and whether it is a failing session (every turn
fails); turn k starts `gap` seconds (jittered) after turn k-1 and takes a lognormal time. The
candidate's requests are handed, in the order they end, to the workers' own `ArmGuard`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gateway.rollout.arms import ArmGuard


def candidate_stream(
    rng: np.random.Generator,
    *,
    weight: float,
    duration_s: float,
    sessions_per_s: float,
    turns: int,
    gap_s: float,
    failing_share: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(failed, session id) of the candidate's requests of one step, in the order they end."""
    n = rng.poisson(sessions_per_s * weight * duration_s)
    start = np.sort(rng.uniform(0.0, duration_s, n))  # a Poisson process, given its count
    failing = rng.random(n) < failing_share
    t = start[:, None] + np.arange(turns)[None, :] * gap_s
    t = t + rng.uniform(-0.1, 0.1, (n, turns)) * gap_s * (np.arange(turns) > 0)
    t = t + np.exp(rng.normal(-0.5, 0.7, (n, turns)))  # each turn's own time to its end
    order = np.argsort(t.ravel(), kind="stable")
    session = np.repeat(np.arange(n), turns)[order]
    failed = np.repeat(failing, turns)[order]
    return failed, session


def first_trip(
    failed: np.ndarray,
    session: np.ndarray,
    make: Callable[[], ArmGuard],
    *,
    by_session: bool = True,
) -> str | None:
    """The reason the guard trips on this stream, if it does."""
    guard = make()
    for f, s in zip(failed.tolist(), session.tolist(), strict=True):
        reason = guard.observe(1, f, s if by_session else None)
        if reason is not None:
            return reason
    return None
