"""Capacity shares: how much of the eligible traffic each candidate's copies may take while the
mirror process cannot keep up (pure: no IO, no asyncio).

Past its capacity a mirror that lets every worker build and write every sampled frame keeps
*fewer* copies the more it is offered: the frames fill the channel, the mirror process spends
itself reading them, and which copies survive depends on timing. Instead, once a second
(`CapacityShares.tick`, in the mirror process) each candidate's lane is checked for overload:

- `backlog`: the copies the mirror process received fell below `BACKLOG_RATIO` of what the
  workers' eligible rate and the share in force promise, by more than `BACKLOG_SIGMAS` times
  the sampling noise (the channel is backing up);
- `lane`: its ring overflowed, or is more than `RING_FILL` full (the candidate is the limit);
- `guard`: the mirror process's loop-lag / CPU guard (`gateway.mirror.sampling.loopguard`) sheds.

An overloaded candidate's capacity share becomes `HEADROOM` of what it managed (the copies
received, or completed when the lane is the limit) over the eligible rate, between 70 % and
`CUT_MIN` of the share in force (a ring that is full but overflows no more is only held at most
where it is while it drains); a quiet one rises by `RISE` a tick and is released once it
passes the sample share. Shares go to the workers like the adaptive references, and the worker
samples `hash < min(sample share, capacity share)`: the copies kept are a hash-chosen subset of
the sample, the same on every worker, chosen before a frame is built.

Sessions: a first turn is kept iff its hash is under the share in force; a later turn whose hash
lies in `[low, sample)`, where `low` is the lowest share of the last `SESSION_ACTIVE_S`, could
belong to a session admitted when the share was higher or shed when it was lower, so the mirror
process answers from the sessions it admitted (`Admitted`). An admitted session keeps its later
turns; a shed one is shed from its first turn.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Final, NamedTuple

__all__ = [
    "BACKLOG_RATIO",
    "HEADROOM",
    "Admitted",
    "CapacityShares",
    "LaneLoad",
]

BACKLOG_RATIO: Final = 0.85  # received / promised copies below this: the channel backs up
RING_FILL: Final = 0.5  # a lane's ring fuller than this: the candidate is the limit
HEADROOM: Final = 0.9  # an overloaded candidate is granted this share of what it managed
CUT_MIN: Final = 0.95  # an overloaded tick lowers a share by at least 5 % ...
CUT_MAX: Final = 0.7  # ... and at most by 30 % (a starved second on a busy host is not a collapse)
BACKLOG_SIGMAS: Final = 4.0  # ... and by more than this many standard deviations of sampling
RISE: Final = 1.1  # a quiet tick raises a capacity share by 10 %
GUARD_CUT: Final = 0.9  # the guard alone (no rate to go by) lowers a share by 10 %
SHARE_FLOOR: Final = 1e-4
SESSION_ACTIVE_S: Final = 120.0  # as `gateway.mirror.sampling.adaptive`: a session in progress
TICK_S: Final = 1.0
ADMITTED_MAX: Final = 65536  # admitted sessions remembered per candidate (LRU)


class LaneLoad(NamedTuple):
    """One candidate as the controller sees it: its sample share, cumulative counters and fill."""

    name: str
    rate: float  # the sample share in force (sample_rate, or target_rps's adaptive share)
    received: int  # copies that reached the mirror process (the lane's `sampled`)
    done: int  # copies that came to an end (observed_ok + observed_error + timed_out)
    overflow: int  # the ring's dropped_overflow
    fill: float  # queued items / ring capacity


class _State:
    __slots__ = ("history", "last", "share")

    def __init__(self) -> None:
        self.share: float | None = None  # None: no capacity limit
        self.last: tuple[int, int, int] | None = None  # (received, done, overflow) last tick
        self.history: deque[tuple[float, float]] = deque()  # (when, share) of recent limits


class CapacityShares:
    """The per-candidate capacity shares, and why they were last lowered."""

    __slots__ = ("_states", "cuts")

    def __init__(self) -> None:
        self._states: dict[str, _State] = {}
        self.cuts: dict[str, int] = {"backlog": 0, "lane": 0, "guard": 0}  # ticks that lowered

    def share(self, name: str) -> float | None:
        state = self._states.get(name)
        return None if state is None else state.share

    def tick(
        self,
        now: float,
        dt: float,
        eligible_rps: float | None,
        loads: Iterable[LaneLoad],
        guard: bool,
    ) -> bool:
        """One control step; True when some candidate's (share, low) changed."""
        changed = False
        seen: set[str] = set()
        for load in loads:
            seen.add(load.name)
            state = self._states.setdefault(load.name, _State())
            before = self._pair(state, load.rate, now)
            self._step(state, load, dt, eligible_rps, guard, now)
            changed |= self._pair(state, load.rate, now) != before
        for name in [n for n in self._states if n not in seen]:
            del self._states[name]
            changed = True
        return changed

    def _step(
        self,
        state: _State,
        load: LaneLoad,
        dt: float,
        eligible_rps: float | None,
        guard: bool,
        now: float,
    ) -> None:
        last, state.last = state.last, (load.received, load.done, load.overflow)
        if last is None or dt <= 0 or not eligible_rps or load.rate <= 0:
            return
        received = (load.received - last[0]) / dt
        done = (load.done - last[1]) / dt
        cur = load.rate if state.share is None else min(load.rate, state.share)
        lane = load.overflow > last[2] or load.fill > RING_FILL
        promised = eligible_rps * cur * dt
        deficit = promised - (load.received - last[0])
        # Sampling by hash is binomial: a deficit within BACKLOG_SIGMAS of its noise is not one.
        backlog = deficit > max((1 - BACKLOG_RATIO) * promised, BACKLOG_SIGMAS * promised**0.5)
        if lane or backlog:
            reason = "lane" if lane else "backlog"
            new = HEADROOM * (done if lane else received) / eligible_rps
        elif guard:
            reason, new = "guard", cur * GUARD_CUT
        else:
            if state.share is not None:
                raised = state.share * RISE
                state.share = None if raised >= load.rate else raised
            self._forget(state, now)
            return
        if reason == "lane" and load.overflow == last[2]:
            new = min(new, cur)  # a full ring that overflows no more: hold while it drains
        else:
            new = min(new, cur * CUT_MIN)
        self.cuts[reason] += 1
        state.share = max(SHARE_FLOOR, new, cur * CUT_MAX)
        state.history.append((now, state.share))

    @staticmethod
    def _forget(state: _State, now: float) -> None:
        history = state.history
        while history and now - history[0][0] > SESSION_ACTIVE_S:
            history.popleft()

    @staticmethod
    def _pair(state: _State, rate: float, now: float) -> tuple[float, float] | None:
        """(share, low) as the workers apply it; None when there is nothing to apply."""
        low = min((s for _, s in state.history), default=None)
        if state.share is None and low is None:
            return None
        share = 1.0 if state.share is None else state.share
        return share, min(share, low if low is not None else share)

    def wire(
        self, rates: Iterable[tuple[str, float]], now: float
    ) -> dict[str, tuple[float, float]]:
        """Per candidate with a limit or a recent one: (share, low), as RATES frames carry it."""
        out: dict[str, tuple[float, float]] = {}
        for name, rate in rates:
            state = self._states.get(name)
            if state is None:
                continue
            pair = self._pair(state, rate, now)
            if pair is not None:
                out[name] = pair
        return out


class Admitted:
    """Per candidate, the sessions whose first turn was kept (LRU-bounded): the mirror process
    answers the later turns a worker cannot decide alone."""

    __slots__ = ("_sessions", "max_sessions")

    def __init__(self, max_sessions: int = ADMITTED_MAX) -> None:
        self.max_sessions = max_sessions
        self._sessions: dict[str, OrderedDict[bytes, None]] = {}

    def add(self, name: str, session: bytes) -> None:
        sessions = self._sessions.setdefault(name, OrderedDict())
        sessions[session] = None
        sessions.move_to_end(session)
        if len(sessions) > self.max_sessions:
            sessions.popitem(last=False)

    def holds(self, name: str, session: bytes) -> bool:
        sessions = self._sessions.get(name)
        return sessions is not None and session in sessions

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for name in [n for n in self._sessions if n not in kept]:
            del self._sessions[name]
