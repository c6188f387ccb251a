"""Split sessions, as the host's mirror process sees them in the store.

A session whose turns reach two gateway replicas (a balancer not keyed on the session) has its
copies sent by two mirror processes, which keep turn order only among their own: turns can
reach a candidate out of order or at once. Every exchange is stored under the replica that
handled it, so each replica can find, in the store, the sessions it shares with another one.

`SplitWatch` checks every `counters_flush_interval_s` and counts each session it shares with
another replica within `WINDOW_S` seconds once (`canary_mirror_split_sessions_total{replica}`):
an alarm for the balancer's configuration. The report counts split sessions exactly, over its
whole window, and leaves them out of the analysis by turn (evaluators.pairs.load).

This replica's own sessions the watch learns from the exchanges its mirror process hands to
the writer (`stored`, O(1)), not from the store. The store gives the others': each check reads
only the other replicas' exchanges stored since the previous check (less `LATE_S`, for rows the
writers stored after their `received_at`), their sessions' keys and replicas, which the watch
remembers for `WINDOW_S` (this replica's and the others' apart, each bounded by `MAX_TRACKED`).
The first check reads the whole window, every replica's rows included (what this process
stored before it restarted). Reading the whole window at every check instead cost the mirror
process about 60 stored rows per copy at a steady rate (a 300 s window every 5 s), more than
writing them; re-reading its own rows since the previous check (less `LATE_S`) still cost a
check 10-12 ms where reading only the others' costs 4-5 (bench/split_watch.py: one replica,
1,000 exchanges a second, checks 5 s apart).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Final

from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors
from domain.exposition import Exposed, Family
from storage import queries

# Two replicas' turns of one session closer together than this are seen; a session idle
# longer between two replicas is left to the report. It bounds what the watch remembers.
WINDOW_S: Final = 300.0
# Each check re-reads this much before the previous one: a row stored up to this long after
# its `received_at` (the writers' batching, a short database stall) is still seen.
LATE_S: Final = 10.0
# Sessions remembered in each of the watch's maps (this replica's, the others', those counted);
# past it the least recently seen is forgotten (and a split involving it may go uncounted, or
# be counted again).
MAX_TRACKED: Final = 100_000


def _remember(seen: OrderedDict[str, float], key: str, at: float) -> None:
    """`seen[key]` = the latest of its times, moved to the most recently seen end."""
    seen[key] = max(seen.get(key, at), at)
    seen.move_to_end(key)


def _forget(seen: OrderedDict[str, float], horizon: float) -> None:
    """Drop the least recently seen entries older than `horizon` or beyond `MAX_TRACKED`
    (`popitem(last=False)`: O(1), where deleting a plain dict's first key leaves a hole that
    every later look at the front walks past)."""
    while seen and (len(seen) > MAX_TRACKED or next(iter(seen.values())) < horizon):
        seen.popitem(last=False)


class SplitWatch:
    """Counts the sessions this replica shares with another one in the store."""

    def __init__(self, engine: AsyncEngine, replica: str, every_s: float) -> None:
        self.engine = engine
        self.replica = replica
        self.every_s = every_s
        self.counted = 0
        self.rows_read = 0  # (session, replica) rows the checks read from the store
        self._seen: OrderedDict[str, float] = OrderedDict()  # counted split -> last seen split
        self._mine: OrderedDict[str, float] = OrderedDict()  # this replica's -> latest received_at
        self._others: OrderedDict[str, float] = OrderedDict()  # other replicas' -> the same
        self._checked_at: float | None = None  # the previous check's `now`
        self._fresh: set[str] = set()  # this replica's sessions stored since the previous check

    def stored(self, key: str | None, at: float) -> None:
        """This replica's mirror process handed an exchange of session `key`, received at `at`,
        to the writer (the request path: O(1), no IO)."""
        if key is None:
            return
        _remember(self._mine, key, at)
        fresh = self._fresh
        fresh.add(key)
        if len(self._mine) > MAX_TRACKED:
            self._mine.popitem(last=False)
        if len(fresh) > MAX_TRACKED:  # checks stopped (a long storage outage): forget the set
            fresh.clear()

    def note(self, keys: list[str], now: float) -> int:
        """Record the split sessions of one check; returns how many are new."""
        new = 0
        for key in keys:
            if key not in self._seen:
                new += 1
            _remember(self._seen, key, now)
        _forget(self._seen, now - WINDOW_S)
        self.counted += new
        return new

    def fold(self, rows: list[tuple[str, str, float]], now: float) -> list[str]:
        """Add one check's (session, replica, latest received_at) rows to what the watch
        remembers; the sessions among them, and among this replica's `stored` since the
        previous check, that both this replica and another stored within the window (pure)."""
        horizon = now - WINDOW_S
        touched, self._fresh = self._fresh, set()
        for key, replica, at in rows:
            if at >= horizon:
                _remember(self._mine if replica == self.replica else self._others, key, at)
                touched.add(key)
        _forget(self._mine, horizon)
        _forget(self._others, horizon)
        mine, others = self._mine, self._others
        return [k for k in touched if mine.get(k, 0.0) >= horizon <= others.get(k, 0.0)]

    async def check(self) -> None:
        now = time.time()
        since = now - WINDOW_S
        exclude: str | None = None  # the first check reads every replica's rows
        if self._checked_at is not None:
            since = max(since, self._checked_at - LATE_S)
            exclude = self.replica  # later ones: this replica's come from `stored`
        try:
            rows = await queries.session_replicas_since(self.engine, since, exclude=exclude)
        except errors.StorageError:
            return  # the next check reads from the same point
        self._checked_at = now
        self.rows_read += len(rows)
        self.note(self.fold(rows, now), now)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            await self.check()

    def prometheus_lines(self) -> list[Exposed]:
        return [SPLIT_SESSIONS.sample(self.counted, self.replica)]


SPLIT_SESSIONS: Final = Family(
    "canary_mirror_split_sessions_total",
    "counter",
    "Sessions this replica shares with another replica in the store (a balancer not keyed on "
    "the session).",
    ("replica",),
)
