"""An independent world of a slow, bursty LLM grader: verdicts that arrive minutes after their
pairs, out of order, and in bursts after the grader was down. Written from the statistics
(a grading is stored when the grader answers, not when its pair arrived), not from the code
that closes units.

Sessions arrive as a Poisson process; each has 1 to 4 turns, a few seconds apart (now and then
a pause longer than the idle gap). Every pair is graded once: +1 (the candidate preferred) with
probability `win`, -1 with probability `loss`, else a tie, so the net preference is
`win - loss` whatever the session. The grader takes longer over the pairs it gives to
production (it writes a longer justification): a lognormal time with median `think_win_s` for
a win or a tie and `think_loss_s` for a loss, so the verdicts of a look's newest sessions are
the favourable ones. The grader is down now and then (outages start at `outage_per_s` and
last an exponential `outage_mean_s`); what it would have graded meanwhile is graded in a burst
when it comes back, each pair after an exponential `drain_mean_s` more. A few verdicts (a
share `straggle`) are stuck behind a retry storm for a Pareto time of at least 10 minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from domain.records import GRADING_OUTCOMES
from evaluators.pairs.gradings import Gradings


@dataclass(frozen=True)
class World:
    """The traffic and the grader."""

    rate: float = 0.4  # new sessions per second
    duration_s: float = 5_400.0
    win: float = 0.35
    loss: float = 0.40
    think_win_s: float = 15.0
    think_loss_s: float = 90.0
    think_sd: float = 0.6  # of the log
    outage_per_s: float = 1 / 1_200
    outage_mean_s: float = 180.0
    drain_mean_s: float = 60.0
    straggle: float = 0.005

    @property
    def net(self) -> float:
        return self.win - self.loss


def draw(w: World, rng: np.random.Generator) -> Gradings:
    """One run: every pair graded once, with the time its verdict was stored."""
    sessions = rng.poisson(w.rate * w.duration_s)
    start = np.sort(rng.uniform(0.0, w.duration_s, sessions))
    turns = rng.integers(1, 5, sessions)
    n = int(turns.sum())
    first = np.repeat(np.cumsum(turns) - turns, turns)
    idx = np.arange(n) - first  # the turn's index in its session
    # Gaps between turns: mostly a few seconds, one in twenty a pause past the idle gap.
    gap = np.where(rng.random(n) < 0.05, rng.uniform(40.0, 120.0, n), rng.exponential(6.0, n))
    gap[idx == 0] = 0.0
    offset = np.cumsum(gap)
    offset -= np.repeat(offset[np.cumsum(turns) - turns], turns)  # from the session's start
    received = np.repeat(start, turns) + offset
    order = np.argsort(received, kind="stable")
    received = received[order]
    session_of = np.repeat(np.arange(sessions), turns)[order]
    u = rng.random(n)
    score = np.where(u < w.win, 1.0, np.where(u < w.win + w.loss, -1.0, 0.0))
    median = np.where(score < 0, w.think_loss_s, w.think_win_s)
    stored = received + median * np.exp(rng.normal(0.0, w.think_sd, n))
    stored = _outages(w, stored, rng)
    stuck = rng.random(n) < w.straggle
    stored[stuck] += 600.0 * (1.0 + rng.pareto(1.5, int(stuck.sum())))
    session_hash = (np.arange(sessions, dtype=np.uint64) + np.uint64(7)) * np.uint64(
        0x9E3779B97F4A7C15
    )
    return Gradings(
        pair=np.arange(n, dtype=np.int64),
        received_at=received,
        session=session_hash[session_of],
        candidate_first=rng.random(n) < 0.5,
        swapped=np.zeros(n, dtype=bool),
        outcome=np.full(n, GRADING_OUTCOMES.index("graded"), dtype=np.int8),
        score=score,
        candidate_chars=np.full(n, 400, dtype=np.int64),
        reference_chars=np.full(n, 400, dtype=np.int64),
        tokens=np.full(n, 900, dtype=np.int64),
        graded_at=stored,
    )


def _outages(w: World, stored: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A verdict due while the grader is down is stored after it comes back, in a burst."""
    horizon = w.duration_s + 4 * 3_600.0
    k = rng.poisson(w.outage_per_s * horizon)
    begin = rng.uniform(0.0, horizon, k)
    end = begin + rng.exponential(w.outage_mean_s, k)
    out = stored.copy()
    for b, e in zip(begin, end, strict=True):
        down = (out >= b) & (out < e)
        out[down] = e + rng.exponential(w.drain_mean_s, int(down.sum()))
    return out
