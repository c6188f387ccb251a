"""Per-session units of a ramp: each session's summaries, from its requests.

During a ramp a session is served by one arm only (chosen by the hash of its key), so the
unit of independence is the session and its arm is the session's. Requests arrive in time
order; a session's unit takes the position of its last request (its closing order), so the
units of an earlier look are a prefix of a later look's, as the sequential tests need.

Per session (NaN where the session has no request that counts for a summary):

* `failure` — share of its requests that failed. A request the client abandoned counts for
  no summary: neither the arm's failure nor a latency that never finished.
* `ttft` — mean log TTFT of all its answered requests (the ramp's deterioration test).
* `ttft_first`, `ttft_later` — mean log TTFT of its answered requests on turn 1, and on
  turns >= 2 (KV-reuse candidates trade one for the other).
* `e2e` — mean log E2E of its answered requests.
* `ttft_slo`, `e2e_slo` — share of its answered requests over the TTFT / E2E SLO.

Pure numpy; never does IO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from domain.errors import UsageError

F = NDArray[np.float64]
B = NDArray[np.bool_]

# The per-session summaries, in the order the step judges them.
LATENCY = ("ttft_first", "ttft_later", "e2e")
SHARES = ("failure", "ttft_slo", "e2e_slo")
SUMMARIES = (*LATENCY, *SHARES)


@dataclass(frozen=True, slots=True)
class SessionUnits:
    """One entry per session, in closing order: its arm (1 = candidate) and its summaries."""

    session: NDArray[np.int64]
    candidate: B
    values: dict[str, F]

    def __len__(self) -> int:
        return len(self.session)

    def arm(self, name: str, candidate: bool) -> F:
        """One arm's values of a summary, in closing order, sessions without one dropped."""
        x = self.values[name][self.candidate == candidate]
        out: F = x[np.isfinite(x)]
        return out


def session_units(
    session: NDArray[np.int64],
    arm: NDArray[np.integer],
    turn: NDArray[np.integer],
    ok: B,
    ttft_s: F,
    e2e_s: F,
    disconnected: B,
    *,
    slo_ttft_s: float,
    slo_e2e_s: float,
) -> SessionUnits:
    """Summarize requests (one entry each, in arrival order) into per-session units.

    `arm` is 0 (production) or 1 (candidate), `turn` counts from 1, `ttft_s` is NaN when no
    token came, `disconnected` marks a request the client abandoned before its end.
    Raises UsageError when the arrays disagree in length, or a session has two arms.
    """
    n = len(session)
    arrays = (arm, turn, ok, ttft_s, e2e_s, disconnected)
    if any(len(a) != n for a in arrays):
        raise UsageError("session_units: every per-request array needs one entry per request")
    if n == 0:
        empty = np.zeros(0)
        return SessionUnits(
            np.zeros(0, dtype=np.int64),
            np.zeros(0, dtype=bool),
            {k: empty for k in SUMMARIES},
        )
    keys, first, unit = np.unique(session, return_index=True, return_inverse=True)
    m = len(keys)
    arm_i = np.asarray(arm, dtype=np.int64)
    if np.any((arm_i != 0) & (arm_i != 1)):
        raise UsageError("session_units: arm is 0 (production) or 1 (candidate)")
    cand = arm_i[first] == 1
    if np.any(cand[unit] != (arm_i == 1)):
        raise UsageError("session_units: a session is served by one arm only during a ramp")

    counted = ~np.asarray(disconnected, dtype=bool)
    ok_b = np.asarray(ok, dtype=bool)
    answered = counted & ok_b
    ttft = np.asarray(ttft_s, dtype=np.float64)
    e2e = np.asarray(e2e_s, dtype=np.float64)
    has_ttft = answered & np.isfinite(ttft) & (ttft > 0)
    has_e2e = answered & np.isfinite(e2e) & (e2e > 0)
    first_turn = np.asarray(turn) <= 1
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ttft = np.where(has_ttft, np.log(np.where(has_ttft, ttft, 1.0)), 0.0)
        log_e2e = np.where(has_e2e, np.log(np.where(has_e2e, e2e, 1.0)), 0.0)

    def mean(x: F, use: B) -> F:
        num = np.bincount(unit, weights=np.where(use, x, 0.0), minlength=m)
        den = np.bincount(unit, weights=use.astype(np.float64), minlength=m)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)

    values = {
        "ttft": mean(log_ttft, has_ttft),
        "ttft_first": mean(log_ttft, has_ttft & first_turn),
        "ttft_later": mean(log_ttft, has_ttft & ~first_turn),
        "e2e": mean(log_e2e, has_e2e),
        "failure": mean((~ok_b).astype(np.float64), counted),
        "ttft_slo": mean((ttft > slo_ttft_s).astype(np.float64), has_ttft),
        "e2e_slo": mean((e2e > slo_e2e_s).astype(np.float64), has_e2e),
    }
    # Closing order: the position of each session's last request.
    last = np.zeros(m, dtype=np.int64)
    np.maximum.at(last, unit, np.arange(n, dtype=np.int64))
    order = np.argsort(last, kind="stable")
    return SessionUnits(
        keys[order].astype(np.int64),
        cand[order],
        {k: v[order] for k, v in values.items()},
    )
