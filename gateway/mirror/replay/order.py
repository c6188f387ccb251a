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

`SessionTrail` is each ring's memory of the sessions it queued: which are broken (a turn of
theirs will never reach the candidate), so their later turns are shed, never sent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

__all__ = ["SessionTrail", "TurnOrder"]

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


# Sessions a ring remembers (highest turn accepted, broken or not); past it the least recently
# seen are forgotten, which can only let a broken session's later turns through (~120 B each).
TRAIL_MAX: Final = 65536


class SessionTrail:
    """One ring's sessions: the highest turn it accepted of each, and whether it is broken (a
    turn of it was dropped or shed after the ring accepted it or before it got there), so a
    candidate receives a session's turns as a prefix or not at all. LRU-bounded.

    A first turn (0) always starts the session over: a new conversation under the same key, or
    a retry of the turn that broke it. A later turn of a session the ring never saw is
    accepted (the conversation began before this process, on another host, or before its
    candidate sampled it: the report's split and headless filters cover those). A later turn
    that skips one (`turn > highest + 1`) means a turn between never got here: it breaks the
    session. The highest turn is kept over a restart, so conversations interleaved under one
    key (the `user` field) do not look like skips."""

    __slots__ = ("_sessions", "max_sessions")

    def __init__(self, max_sessions: int = TRAIL_MAX) -> None:
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[bytes, tuple[int, bool]] = OrderedDict()  # (highest, broken)

    def admit(self, session: bytes, turn: int) -> bool:
        """Whether a turn of `session` may be queued (recording it when it may)."""
        state = self._sessions.get(session)
        if state is None:
            self._put(session, turn, False)
            return True
        highest, broken = state
        self._sessions.move_to_end(session)
        if turn == 0:
            self._sessions[session] = (highest, False)
            return True
        if broken:
            return False
        if turn > highest + 1:
            self._sessions[session] = (highest, True)
            return False
        if turn > highest:
            self._sessions[session] = (turn, False)
        return True

    def broken(self, session: bytes) -> bool:
        state = self._sessions.get(session)
        return state is not None and state[1]

    def break_(self, session: bytes) -> None:
        """A turn of `session` will never reach the candidate: refuse its later turns."""
        state = self._sessions.get(session)
        if state is None:
            self._put(session, 0, True)
        else:
            self._sessions[session] = (state[0], True)
            self._sessions.move_to_end(session)

    def _put(self, session: bytes, turn: int, broken: bool) -> None:
        self._sessions[session] = (turn, broken)
        if len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
