"""Detects conversation turns that reach the mirror out of order (pure, bounded).

The mirror process releases a session's copies one at a time in the order they *arrive*. With
several workers, two turns of one conversation can be served by different workers; a turn
handed off late (its worker's channel busy) can then arrive after the next one. That is never
silently mis-paired: each arrival is compared with the highest turn index seen for its session,
and a lower one is counted `out_of_order_turns` (equal: a retry, not counted).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = ["TurnOrder"]

# Sessions remembered; past it the least recently seen are forgotten (~100 B each, ~6.5 MB).
SESSIONS_MAX: Final = 65536


class TurnOrder:
    """Highest turn index seen per session key, LRU-bounded."""

    __slots__ = ("_last", "max_sessions", "out_of_order")

    def __init__(self, max_sessions: int = SESSIONS_MAX) -> None:
        self.max_sessions = max_sessions
        self._last: OrderedDict[bytes, int] = OrderedDict()
        self.out_of_order = 0

    def arrive(self, session: bytes, turn: int) -> bool:
        """Record one arrival; False (and counted) when an earlier turn than one already seen."""
        last = self._last.get(session)
        if last is not None:
            self._last.move_to_end(session)
            if turn < last:
                self.out_of_order += 1
                return False
            if turn > last:
                self._last[session] = turn
            return True
        self._last[session] = turn
        if len(self._last) > self.max_sessions:
            self._last.popitem(last=False)
        return True
