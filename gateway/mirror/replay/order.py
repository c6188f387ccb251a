"""Detects conversation turns that reach the mirror out of order, and tells which conversations
a change of the sampling threshold cuts (pure, bounded).

The mirror process releases a session's copies one at a time in the order they *arrive*. With
several workers, two turns of one conversation can be served by different workers; a turn
handed off late (its worker's channel busy) can then arrive after the next one. That is never
silently mis-paired: each arrival is compared with the highest turn index seen for its session,
and a lower one is counted `out_of_order_turns` (equal: a retry, not counted).

Each remembered session also keeps its sampling hash and when it was last seen, so when an
adaptive sampling rate (`target_rps`) lowers a candidate's threshold the mirror can count the
conversations in progress that lose their later turns (`cut`), and an arrival tells whether a
conversation was new to the mirror when it came (`arrive` returns when it was last seen).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = ["TurnOrder"]

# Sessions remembered; past it the least recently seen are forgotten (~150 B each, ~10 MB).
SESSIONS_MAX: Final = 65536


class TurnOrder:
    """Highest turn index, sampling hash and last arrival per session key, LRU-bounded."""

    __slots__ = ("_last", "max_sessions", "out_of_order")

    def __init__(self, max_sessions: int = SESSIONS_MAX) -> None:
        self.max_sessions = max_sessions
        # session -> [highest turn, sampling hash, last seen (monotonic s)]
        self._last: OrderedDict[bytes, list[float]] = OrderedDict()
        self.out_of_order = 0

    def arrive(self, session: bytes, turn: int, digest: int = 0, now: float = 0.0) -> float | None:
        """Record one arrival (an earlier turn than one already seen is counted); returns when
        the session was last seen before, None when it is new to the mirror."""
        entry = self._last.get(session)
        if entry is not None:
            self._last.move_to_end(session)
            seen = entry[2]
            if turn < entry[0]:
                self.out_of_order += 1
            elif turn > entry[0]:
                entry[0] = turn
            entry[2] = now
            return seen
        self._last[session] = [turn, digest, now]
        if len(self._last) > self.max_sessions:
            self._last.popitem(last=False)
        return None

    def cut(self, low: float, high: float, since: float) -> int:
        """Sessions seen at or after `since` whose hash is in [low, high): the conversations in
        progress a threshold lowered from `high` to `low` stops mirroring."""
        return sum(1 for _, h, seen in self._last.values() if seen >= since and low <= h < high)
