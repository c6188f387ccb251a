"""A world of graded sessions with people's labels, written apart from the product: sessions of
a heavy-tailed number of turns, people's preference correlated within a session, an LLM grader
that copies people's judgement part of the time and otherwise has its own (biased) taste, a
share of pairs graded in both orders, sessions chosen for people by coin flip, and a few skips.

`World.runs` draws many runs and aggregates each to the per-session arrays the estimate bets
on (its own code: means over a session's pairs, skips worst-case each way); `World.one` builds
one run as the product stores it (Gradings rows and label records) for the evaluator path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

F = NDArray[np.float64]
B = NDArray[np.bool_]
Rows = list[tuple[object, ...]]
Label = tuple[str, str, float, str]

TIE = 0.15  # people's tie share
GRADER_TIE = 0.10  # the grader's own tie share
SESSION_SD = 0.6  # spread of a session's taste (logit scale): turns of one session agree
SWAP = 0.25  # pairs graded in both orders
SWAP_SAME = 0.8  # ... whose second verdict repeats the first (else a tie)


def _sigmoid(x: F) -> F:
    return 1.0 / (1.0 + np.exp(-x))


@lru_cache(maxsize=64)
def _calibrate(net: float, tie: float, spread: float) -> float:
    """The logit shift whose mean decisive net (with a N(0, spread) session shift) is `net`."""
    z = np.random.default_rng(99).normal(0.0, spread, 200_000) if spread else np.zeros(1)
    lo, hi = -12.0, 12.0
    for _ in range(80):
        mid = (lo + hi) / 2.0
        m = (1.0 - tie) * (2.0 * float(np.mean(_sigmoid(mid + z))) - 1.0)
        lo, hi = (mid, hi) if m < net else (lo, mid)
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Runs:
    """Per run (rows) and session (columns, in closing order)."""

    f: F
    chosen: B
    y_low: F
    y_high: F
    fit: B
    labels: F  # labelled pairs per session
    skips: F
    pairs: F  # graded pairs per session


@dataclass(frozen=True)
class World:
    people: float  # people's net preference (mean over sessions of the session's mean)
    grader: float  # the grader's net preference
    copy: float  # chance the grader's verdict is people's
    rate: float = 0.2  # sessions chosen for people
    skip: float = 0.01  # a person skips a pair

    def _draw(self, rng: np.random.Generator, sessions: int) -> tuple[F, F, NDArray[np.int64]]:
        turns = 1 + np.minimum(rng.geometric(0.45, sessions) - 1, 29)
        sess = np.repeat(np.arange(sessions), turns)
        n = len(sess)
        b = _calibrate(self.people, TIE, SESSION_SD)
        p = _sigmoid(b + rng.normal(0.0, SESSION_SD, sessions))[sess]
        u = rng.random(n)
        y = np.where(u < TIE, 0.0, np.where(rng.random(n) < p, 1.0, -1.0))
        own_net = (self.grader - self.copy * self.people) / (1.0 - self.copy)
        if abs(own_net) > 1.0 - GRADER_TIE:
            raise ValueError("the grader's own taste cannot reach that net preference")
        c = _calibrate(own_net, GRADER_TIE, 0.0)
        own = np.where(
            rng.random(n) < GRADER_TIE,
            0.0,
            np.where(rng.random(n) < _sigmoid(np.full(n, c)), 1.0, -1.0),
        )
        first = np.where(rng.random(n) < self.copy, y, own)
        second = np.where(rng.random(n) < SWAP_SAME, first, 0.0)
        f = np.where(rng.random(n) < SWAP, (first + second) / 2.0, first)
        return y, f, sess

    def runs(self, n_runs: int, sessions: int, seed: int) -> Runs:
        rng = np.random.default_rng(seed)
        out: dict[str, list[F]] = {k: [] for k in Runs.__dataclass_fields__}
        for _ in range(n_runs):
            y, f, sess = self._draw(rng, sessions)
            chosen = rng.random(sessions) < self.rate
            skipped = rng.random(len(y)) < self.skip
            cnt = np.bincount(sess, minlength=sessions).astype(np.float64)
            lab_pair = chosen[sess] & ~skipped
            skip_pair = chosen[sess] & skipped
            sum_y = np.bincount(sess, weights=np.where(lab_pair, y, 0.0), minlength=sessions)
            n_skip = np.bincount(sess, weights=skip_pair.astype(float), minlength=sessions)
            out["f"].append(np.bincount(sess, weights=f, minlength=sessions) / cnt)
            out["chosen"].append(chosen)
            out["y_low"].append((sum_y - n_skip) / cnt)
            out["y_high"].append((sum_y + n_skip) / cnt)
            out["fit"].append(chosen & (n_skip == 0))
            out["labels"].append(np.where(chosen, cnt - n_skip, 0.0))
            out["skips"].append(n_skip)
            out["pairs"].append(cnt)
        return Runs(**{k: np.array(v) for k, v in out.items()})  # type: ignore[arg-type]

    def pilot(self, sessions: int = 20_000, seed: int = 5) -> tuple[float, float, float]:
        """(people's agreement with the grader's verdict per pair, sd of a session's people's
        score, pairs per session): what a candidate's data would show."""
        y, f, sess = self._draw(np.random.default_rng(seed), sessions)
        agree = float(np.mean(np.sign(f) == y))
        cnt = np.bincount(sess).astype(float)
        ys = np.bincount(sess, weights=y) / cnt
        return agree, float(np.std(ys)), float(np.mean(cnt))

    def one(self, sessions: int, seed: int) -> tuple[Rows, list[str], list[Label], Runs]:
        """One run as stored: gradings rows (COLUMNS order), kept exchange ids, labels
        (exchange id, labeller, time, choice), and the same run aggregated."""
        rng = np.random.default_rng(seed)
        y, f, sess = self._draw(rng, sessions)
        chosen = rng.random(sessions) < self.rate
        skipped = rng.random(len(y)) < self.skip
        rows: Rows = []
        kept: list[str] = []
        labels: list[Label] = []
        turn = np.zeros(sessions, dtype=np.int64)
        word = {1.0: "candidate", 0.0: "tie", -1.0: "reference"}
        for i in range(len(y)):
            s = int(sess[i])
            t = 1000.0 + 120.0 * s + 5.0 * turn[s]
            turn[s] += 1
            eid = f"x{i:08d}"
            key = f"{s + 1:032x}"
            if f[i] in (1.0, 0.0, -1.0):
                verdicts = [word[float(f[i])]]
            else:  # graded both ways: one decisive verdict and a tie
                verdicts = [word[float(np.sign(f[i]))], "tie"]
            for k, w in enumerate(verdicts):
                rows.append((eid, t, key, k == 0, k == 1, "graded", w, 100, 50, 10, 5, t + 1.0))
            if chosen[s]:
                kept.append(eid)
                choice = "skip" if skipped[i] else word[float(y[i])]
                labels.append((eid, "ann", 10_000.0 + i, choice))
        cnt = np.bincount(sess, minlength=sessions).astype(np.float64)
        lab_pair = chosen[sess] & ~skipped
        skip_pair = chosen[sess] & skipped
        sum_y = np.bincount(sess, weights=np.where(lab_pair, y, 0.0), minlength=sessions)
        n_skip = np.bincount(sess, weights=skip_pair.astype(float), minlength=sessions)
        agg = Runs(
            f=np.bincount(sess, weights=f, minlength=sessions) / cnt,
            chosen=chosen,
            y_low=(sum_y - n_skip) / cnt,
            y_high=(sum_y + n_skip) / cnt,
            fit=chosen & (n_skip == 0),
            labels=np.where(chosen, cnt - n_skip, 0.0),
            skips=n_skip,
            pairs=cnt,
        )
        return rows, kept, labels, agg


def look_prefixes(chosen: B, labels: F, every: int) -> NDArray[np.int64]:
    """Units a look uses, at a look every `every` labels, people labelling sessions in order:
    each look's units end just before the next chosen session still unlabelled."""
    idx = np.flatnonzero(chosen)
    cum = np.cumsum(labels[idx])
    out = []
    for j in range(len(idx)):
        before = cum[j - 1] if j else 0.0
        if math.floor(cum[j] / every) > math.floor(before / every):
            out.append(int(idx[j + 1]) if j + 1 < len(idx) else len(chosen))
    return np.array(out, dtype=np.int64)
