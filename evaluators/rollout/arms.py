"""Per-session units of a rollout step: each session's summaries, from its requests.

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
* one mean log per further duration of the evidence (`<name>` of a `<name>_s` column): a
  quantity added to `domain.observation.Outcome` in seconds is summarized without an edit here.

The requests come as one mapping of columns, named and typed as the evidence declares them
(`storage.reports.rollout.ROLLOUT_COLUMNS`, derived from `Outcome` and the rollout's records):
the session, its arm and turn, `ok`, `disconnected`, and every duration (the float columns).
Nothing here lists the evidence's fields; only the summaries above name the two they read.

Pure numpy; never does IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from domain.errors import UsageError

F = NDArray[np.float64]
B = NDArray[np.bool_]

# The per-session summaries, in the order the step judges them.
LATENCY = ("ttft_first", "ttft_later", "e2e")
SHARES = ("failure", "ttft_slo", "e2e_slo")
SUMMARIES = (*LATENCY, *SHARES)
# The columns that say who and how, besides the durations (the evidence's float columns).
_UNIT = ("session", "arm", "turn", "ok", "disconnected")


@dataclass(frozen=True, slots=True)
class SessionUnits:
    """One entry per session, in closing order: its arm (1 = candidate) and its summaries
    (every summary of the module docstring, always: empty arrays when no request counts)."""

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
    columns: Mapping[str, NDArray[Any]], *, slo_ttft_s: float, slo_e2e_s: float
) -> SessionUnits:
    """Summarize requests (one entry each, in arrival order) into per-session units.

    `columns`: the evidence's per-request arrays by name (module docstring). `arm` is 0
    (production) or 1 (candidate), `turn` counts from 1, a duration is NaN where absent (no
    token came), `disconnected` marks a request the client abandoned before its end.
    Raises UsageError when a column is missing, the arrays disagree in length, or a session
    has two arms.
    """
    durations = {k: v for k, v in columns.items() if np.asarray(v).dtype.kind == "f"}
    try:
        session, arm, turn, ok, disconnected = (columns[k] for k in _UNIT)
        ttft_s, e2e_s = columns["ttft_s"], columns["e2e_s"]
    except KeyError as exc:
        raise UsageError(f"session_units: the evidence has no column {exc.args[0]}") from None
    session = np.asarray(session)
    n = len(session)
    if any(len(a) != n for a in columns.values()):
        raise UsageError("session_units: every per-request array needs one entry per request")
    # No early return for no request: the one path below gives every summary's key (an empty
    # array) however few requests there are, so a first look reads "insufficient", not a
    # missing key.
    keys, first, unit = np.unique(session, return_index=True, return_inverse=True)
    m = len(keys)
    arm_i = np.asarray(arm, dtype=np.int64)
    if np.any((arm_i != 0) & (arm_i != 1)):
        raise UsageError("session_units: arm is 0 (production) or 1 (candidate)")
    cand = arm_i[first] == 1
    if np.any(cand[unit] != (arm_i == 1)):
        raise UsageError("session_units: a session is served by one arm only")

    counted = ~np.asarray(disconnected, dtype=bool)
    ok_b = np.asarray(ok, dtype=bool)
    answered = counted & ok_b
    first_turn = np.asarray(turn) <= 1

    def logs(x: NDArray[Any]) -> tuple[F, F, B]:
        """A duration's values, their logs (0 where absent) and where it is present."""
        v = np.asarray(x, dtype=np.float64)
        has = answered & np.isfinite(v) & (v > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return v, np.where(has, np.log(np.where(has, v, 1.0)), 0.0), has

    ttft, log_ttft, has_ttft = logs(ttft_s)
    e2e, log_e2e, has_e2e = logs(e2e_s)

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
    for name, x in durations.items():
        summary = name.removesuffix("_s")
        if summary not in values:
            _, log_x, has_x = logs(x)
            values[summary] = mean(log_x, has_x)
    # Closing order: the position of each session's last request.
    last = np.zeros(m, dtype=np.int64)
    np.maximum.at(last, unit, np.arange(n, dtype=np.int64))
    order = np.argsort(last, kind="stable")
    return SessionUnits(
        keys[order].astype(np.int64),
        cand[order],
        {k: v[order] for k, v in values.items()},
    )
