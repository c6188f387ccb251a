"""Split sessions, as the host's mirror process sees them in the store.

A session whose turns reach two gateway replicas (a balancer not keyed on the session) has its
copies sent by two mirror processes, which keep turn order only among their own: turns can
reach a candidate out of order or at once. Every exchange is stored under the replica that
handled it, so each replica can find, in the store, the sessions it shares with another one.

`SplitWatch` does that every `counters_flush_interval_s` over the last `WINDOW_S` seconds and
counts each such session once (`canary_mirror_split_sessions_total{replica}`): an alarm for the
balancer's configuration. The report counts split sessions exactly, over its whole window, and
leaves them out of the analysis by turn (evaluators.pairs.load).
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
# longer between two replicas is left to the report. It bounds each check's scan.
WINDOW_S: Final = 300.0
# Sessions remembered as counted (those seen split within the window; the oldest is forgotten
# past this bound, and would be counted again if it went on being split).
MAX_TRACKED: Final = 100_000


class SplitWatch:
    """Counts the sessions this replica shares with another one in the store."""

    def __init__(self, engine: AsyncEngine, replica: str, every_s: float) -> None:
        self.engine = engine
        self.replica = replica
        self.every_s = every_s
        self.counted = 0
        self._seen: OrderedDict[str, float] = OrderedDict()  # key -> last seen split

    def note(self, keys: list[str], now: float) -> int:
        """Record the split sessions of one check; returns how many are new."""
        new = 0
        for key in keys:
            if key not in self._seen:
                new += 1
            self._seen[key] = now
            self._seen.move_to_end(key)
        while self._seen and (
            len(self._seen) > MAX_TRACKED or next(iter(self._seen.values())) < now - WINDOW_S
        ):
            self._seen.popitem(last=False)
        self.counted += new
        return new

    async def check(self) -> None:
        now = time.time()
        try:
            keys = await queries.split_sessions_seen_by(self.engine, self.replica, now - WINDOW_S)
        except errors.StorageError:
            return  # the next check covers the same window
        self.note(keys, now)

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
