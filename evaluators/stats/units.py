"""Units of independence: which pairs the sequential statistics may use, and as what.

Turns of one conversation are correlated (a session that starts failing keeps failing; its
answers diverge together), so when sampling is by session a *unit* is a burst of one session's
pairs (no gap longer than `idle_s` between them) and a statistic bets on each unit's mean,
never on its pairs one by one. Without sessions each pair is its own unit.

A unit enters the statistics only once it is *closed* and *settled*. Closed: its last pair is
older than the idle gap (no further turn can join it; a lone pair closes when it arrives).
Units are ordered by closing time, which depends on arrival times only, never on how fast an
arm answered. Settled: every pair in it has all its answers, or is older than the candidate's
timeout. A look uses the longest run of closed units, in order, that are all settled: it stops
at the first unit still waiting for a copy, so a look is never biased toward the fast copies.
The units of an earlier look are then a prefix of a later look's, in the same order, with the
same values: the betting martingales stay martingales over looks.

Pure numpy; never reads a clock (the caller says what time "now" is).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]
F64 = NDArray[np.float64]
B = NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class Units:
    """Per pair: its unit's rank in closing order, or -1 while its unit is still open."""

    rank: I32  # per pair; -1 = open (not yet usable)
    count: int  # closed units
    open_pairs: int  # pairs held back because their unit is still open
    by_session: bool  # units are session bursts (else single pairs)

    def means(self, x: F64 | NDArray[np.float32], use: B) -> tuple[F64, I64, int]:
        """(mean of x per closed unit in closing order, pairs per unit, pairs used).

        `x` holds one value per pair in `use` (in pair order), as the evaluators compute them.
        Units with no pair in `use` are skipped.
        """
        # Bin 0 collects the pairs of open units (rank -1) and is dropped: no copy of the
        # values is made to leave them out, and each unit's sum adds its pairs in pair order.
        bins = self.rank[use].astype(np.intp)
        bins += 1
        sizes = np.bincount(bins, minlength=self.count + 1)[1:]
        used = int(sizes.sum())
        if used == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64), 0
        sums = np.bincount(bins, weights=x, minlength=self.count + 1)[1:]
        present = sizes > 0
        return sums[present] / sizes[present], sizes[present].astype(np.int64), used


def build_units(
    received_at: F64,
    session: NDArray[np.uint64],
    *,
    by_session: bool,
    as_of: float,
    idle_s: float,
    settled: B,
) -> Units:
    """Assign pairs to units and rank the usable ones at `as_of` (inf: all closed).

    `settled` marks the pairs whose outcome can no longer change (all answers in, or timed out).
    """
    n = len(received_at)
    t = np.asarray(received_at, dtype=np.float64)
    if n == 0:
        return Units(np.zeros(0, dtype=np.int32), 0, 0, by_session)
    if by_session:
        unit, last, first = _session_bursts(t, session, idle_s)
        close = last + idle_s
    else:
        unit = first = np.arange(n, dtype=np.int64)
        close = t
    closed = close <= as_of
    # Rank closed units by (closing time, first pair): a stable order every later look repeats.
    ids = np.flatnonzero(closed)
    order = ids[np.lexsort((first[ids], close[ids]))]
    del ids, first, closed
    # Stop at the first unit (in that order) that still waits for a copy.
    unsettled = np.zeros(len(close), dtype=bool)
    unsettled[unit[~np.asarray(settled, dtype=bool)]] = True
    waiting = np.flatnonzero(unsettled[order])
    if len(waiting):
        order = order[: waiting[0]]
    rank_of_unit = np.full(len(close), -1, dtype=np.int32)
    rank_of_unit[order] = np.arange(len(order), dtype=np.int32)
    rank = rank_of_unit[unit]
    return Units(rank, len(order), int(np.count_nonzero(rank < 0)), by_session)


def _session_bursts(t: F64, session: NDArray[np.uint64], idle_s: float) -> tuple[I64, F64, I64]:
    """(unit id per pair, last arrival per unit, first pair per unit): one session split where
    it idles > idle_s. A pair without a session (key 0) is a unit of its own.

    Units are numbered in (session, arrival) order, where each is one contiguous run: the
    per-unit reductions run over those runs. Temporaries are dropped as soon as they are used
    (at ten million pairs each is 10-80 MB)."""
    n = len(t)
    order = np.lexsort((t, session))
    new = np.ones(n, dtype=bool)
    s = session[order]
    np.not_equal(s[1:], s[:-1], out=new[1:])
    new[1:] |= s[1:] == 0
    del s
    ts = t[order]
    gap = ts[1:] - ts[:-1]
    new[1:] |= gap > idle_s
    del gap
    starts = np.flatnonzero(new)
    last = np.maximum.reduceat(ts, starts)
    del ts
    first = np.minimum.reduceat(order, starts)
    del starts
    sorted_unit = np.cumsum(new, dtype=np.int64)
    sorted_unit -= 1
    del new
    unit = np.empty(n, dtype=np.int64)
    unit[order] = sorted_unit
    return unit, last, first
