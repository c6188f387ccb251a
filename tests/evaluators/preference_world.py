"""An independent world of an LLM grader judging a model upgrade, written from the statistics
(issue 42, "How it is shown"), not from the product's code.

Sessions of 1 to 3 turns arrive in order; every pair of a session is graded. A pair is shown to
the grader once, with the candidate's answer first with probability 1/2, and with probability
`swap_rate` a second time in the other order. For each verdict the grader, with probability
`b`, picks the answer shown first; otherwise it ties with probability `t`, else prefers the
candidate with probability `p`. The net preference it plants (wins minus losses of the
candidate, averaged over the two orders) is (1 - b)(1 - t)(2p - 1); among decisive verdicts the
first-shown answer wins a share 1/2 + b / (2 (b + (1 - b)(1 - t))).

Its answers are lengths too: the candidate's answer is `length_ratio` times as long as
production's, times lognormal noise, and a grader with `length_pull` > 0 prefers the longer
answer that much more often (a verbosity bias the length-controlled estimate should remove).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from domain.records import GRADING_OUTCOMES
from evaluators.pairs.gradings import Gradings


@dataclass(frozen=True)
class Grader:
    """The world's grader and the traffic it grades."""

    b: float = 0.25  # picks the first-shown answer
    t: float = 0.2  # tie, when not picking by position
    p: float = 0.5  # prefers the candidate, when decisive and not by position
    swap_rate: float = 0.25
    max_turns: int = 3
    length_pull: float = 0.0  # extra preference for the longer answer, per doubling
    length_sd: float = 0.0  # sd of log2 length ratio between the arms' answers
    length_ratio: float = 1.0  # the candidate's answers are this much longer, typically

    @property
    def net(self) -> float:
        """The order-averaged net preference this grader plants."""
        return (1 - self.b) * (1 - self.t) * (2 * self.p - 1)

    @property
    def position_bias(self) -> float:
        """Among decisive verdicts, the first-shown answer's win share minus one half."""
        decisive = self.b + (1 - self.b) * (1 - self.t)
        return self.b / (2 * decisive)

    @classmethod
    def planting(cls, net: float, **kw: float) -> Grader:
        """A grader with b, t (defaults or given) and p chosen so that it plants `net`."""
        base = cls(**kw)  # type: ignore[arg-type]
        p = 0.5 + net / (2 * (1 - base.b) * (1 - base.t))
        assert 0.0 <= p <= 1.0
        return cls(**{**kw, "p": p})  # type: ignore[arg-type]


def draw(grader: Grader, sessions: int, rng: np.random.Generator) -> Gradings:
    """One run: `sessions` sessions, every pair graded (once, or twice with the order swapped)."""
    turns = rng.integers(1, grader.max_turns + 1, sessions)
    n_pairs = int(turns.sum())
    session_of = np.repeat(np.arange(sessions), turns)
    # Sessions start 100 s apart and their turns 1 s apart: each session is its own unit.
    turn_of = np.arange(n_pairs) - np.repeat(np.cumsum(turns) - turns, turns)
    received = session_of * 100.0 + turn_of
    swapped_pair = rng.random(n_pairs) < grader.swap_rate
    first_order = rng.random(n_pairs) < 0.5  # the candidate shown first
    log_ratio = math.log2(grader.length_ratio) + rng.normal(0.0, grader.length_sd, n_pairs)
    # Verdict rows: each pair once, the swapped ones again in the other order, in pair order.
    reps = np.where(swapped_pair, 2, 1)
    pair = np.repeat(np.arange(n_pairs), reps)
    second = np.zeros(len(pair), dtype=bool)
    second[np.cumsum(reps)[swapped_pair] - 1] = True
    cand_first = np.where(second, ~first_order[pair], first_order[pair])
    k = len(pair)
    u_pos, u_tie, u_win = rng.random(k), rng.random(k), rng.random(k)
    by_position = u_pos < grader.b
    tie = ~by_position & (u_tie < grader.t)
    p_cand = np.clip(grader.p + grader.length_pull * log_ratio[pair], 0.0, 1.0)
    cand_wins = np.where(by_position, cand_first, u_win < p_cand)
    score = np.where(tie, 0.0, np.where(cand_wins, 1.0, -1.0))
    ref_chars = rng.integers(200, 800, n_pairs)
    cand_chars = np.maximum(1, np.round(ref_chars * 2.0**log_ratio)).astype(np.int64)
    session_hash = (np.arange(sessions, dtype=np.uint64) + np.uint64(1)) * np.uint64(
        0x9E3779B97F4A7C15
    )
    return Gradings(
        pair=pair.astype(np.int64),
        received_at=received[pair],
        session=session_hash[session_of[pair]],
        candidate_first=cand_first,
        swapped=second,
        outcome=np.full(k, GRADING_OUTCOMES.index("graded"), dtype=np.int8),
        score=score,
        candidate_chars=cand_chars[pair],
        reference_chars=ref_chars[pair].astype(np.int64),
        tokens=np.full(k, 1_000, dtype=np.int64),
    )


def stack(runs: list[NDArray[np.float64]]) -> NDArray[np.float64]:
    """Unit values of several runs as one (runs, units) array, cut to the shortest run."""
    n = min(len(r) for r in runs)
    return np.stack([r[:n] for r in runs])
