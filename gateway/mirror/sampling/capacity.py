"""Capacity shares: how much of the eligible traffic each candidate's copies may take while the
mirror really cannot keep up (pure: no IO, no asyncio).

Past its capacity a mirror that lets every worker build and write every sampled frame keeps
*fewer* copies the more it is offered: the frames fill the channel, the mirror process spends
itself reading them, and which copies survive depends on timing. Instead, once a second
(`CapacityShares.tick`, in the mirror process) each candidate is checked for overload, and an
overloaded one gets a capacity share the workers apply by hash before they build a frame.

What counts as overload is occupancy against a bound, not a rate: a buffer that fills and
would overflow. A rate deficit ("fewer copies arrived than the eligible rate promises") is no
signal: on a busy host a mirror process that is merely *late to read* receives a short second
and then a long one, and cutting on the short one sheds copies (by hash, but shed all the same)
that the channel would have delivered a moment later. So:

- `lane`: the candidate's ring. Its occupancy (items or bytes against its bounds, whichever is
  fuller) is sampled `SAMPLES_PER_TICK` times a tick and the *lowest* sample kept: a ring that
  emptied at any point of the tick was keeping up. Overloaded when that lowest occupancy was at
  least `FILL_HIGH` for `SUSTAIN_TICKS` ticks in a row and did not fall over them (by more
  than `DRAIN_MARGIN`): a backlog that drains is a burst being absorbed, not overload. A ring
  that overflowed in a tick it never left `FILL_HIGH` is full already: overloaded at once (a
  small ring can overflow many times over in `SUSTAIN_TICKS`, and each overflow is a copy lost
  by timing, the oldest queued, perhaps an admitted session's first turn).
- `channel`: each worker's channel to the mirror process (queued plus transport-buffered bytes
  against `channel_max_bytes`). The worker reports the lowest occupancy it saw at its flushes
  since its last report (`ChannelFill`, with the ELIGIBLE count); the fullest worker's is taken,
  with the same rule as a ring's. A slow reader lets the channel fill and then reads it empty
  (its lowest occupancy is low); a reader that cannot keep up never does.
- `guard`: the mirror process's loop-lag / CPU guard (`gateway.mirror.sampling.loopguard`,
  itself sustained over `mirror_shed_window_s`) sheds.

An overloaded candidate's share becomes `HEADROOM` of what it managed (the copies it completed
when its lane is the limit, or received when the channel is) over the eligible rate, between
`CUT_MAX` and `CUT_MIN` of the share in force. Hysteresis: a limited share rises (by `RISE` a
tick, released once past the sample share) only once the ring and the channel are under
`FILL_LOW` and the guard is quiet; in between it holds while the backlog drains. Shares go to
the workers like the adaptive references, and the worker samples
`hash < min(sample share, capacity share)`: the copies kept are a hash-chosen subset of the
sample, the same on every worker, chosen before a frame is built. A copy shed so is a sampling
decision (`shed_capacity`), not a lost copy: coverage does not count it missing.

Sessions: a first turn is kept iff its hash is under the share in force; a later turn whose hash
lies in `[low, sample)`, where `low` is the lowest share of the last `SESSION_ACTIVE_S`, could
belong to a session admitted when the share was higher or shed when it was lower, so the mirror
process answers from the sessions it admitted (`Admitted`). An admitted session keeps its later
turns while it stays whole; a shed one is shed from its first turn. Admission is not enough: a
session one of whose turns the mirror drops or sheds after admission (ring overflow, the loop
guard, unanswered, stop) is no longer admitted, and its ring sheds its later turns
(`shed_session_broken`, `gateway.mirror.replay.ring`), so no session reaches the candidate
headless.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Sequence
from typing import Final, NamedTuple

from domain.accounting import SHED_FIRST_AT, SHED_LAST_AT, SHED_SECONDS
from gateway.mirror.sampling import rate as rate_mod

__all__ = [
    "FILL_HIGH",
    "FILL_LOW",
    "HEADROOM",
    "Admitted",
    "CapacityShares",
    "ChannelFill",
    "LaneLoad",
    "LimitTimes",
    "Occupancy",
]

FILL_HIGH: Final = 0.5  # lowest occupancy of a tick at or above this: the buffer is not draining
FILL_LOW: Final = 0.25  # ... below this (ring and channel): a limited share may rise again
SUSTAIN_TICKS: Final = 2  # ticks in a row at FILL_HIGH or above before a cut
DRAIN_MARGIN: Final = 0.01  # occupancy that fell by more than this over those ticks is draining
SAMPLES_PER_TICK: Final = 4  # a ring's occupancy is sampled this often a tick (its lowest kept)
HEADROOM: Final = 0.9  # an overloaded candidate is granted this share of what it managed
CUT_MIN: Final = 0.95  # an overloaded tick lowers a share by at least 5 % ...
CUT_MAX: Final = 0.7  # ... and at most by 30 % (what one tick managed is a noisy measure)
RISE: Final = 1.1  # a quiet tick raises a capacity share by 10 %
GUARD_CUT: Final = 0.9  # the guard alone (no rate to go by) lowers a share by 10 %
SHARE_FLOOR: Final = 1e-4
SESSION_ACTIVE_S: Final = 120.0  # as `gateway.mirror.sampling.adaptive`: a session in progress
TICK_S: Final = rate_mod.TICK_S  # one loop ticks both controllers (`Mirror._tick_loop`)
CHANNEL_STALE_S: Final = 3.0  # a worker's channel report older than this no longer counts
ADMITTED_MAX: Final = 65536  # admitted sessions remembered per candidate (LRU)


class Occupancy:
    """One bounded buffer's lowest occupancy per tick, over the last few ticks: `over` when it
    stayed at `FILL_HIGH` or above for `SUSTAIN_TICKS` ticks without draining; `low` when the
    last tick's is under `FILL_LOW`."""

    __slots__ = ("_tick_min", "_ticks")

    def __init__(self) -> None:
        self._ticks: deque[float] = deque(maxlen=SUSTAIN_TICKS)
        self._tick_min: float | None = None

    def sample(self, fill: float) -> float:
        """One look at the buffer within the current tick; the tick's lowest so far."""
        low = self._tick_min
        low = self._tick_min = fill if low is None else min(low, fill)
        return low

    def close_tick(self) -> float:
        """End the tick: its lowest occupancy (0 when it was never looked at)."""
        low, self._tick_min = self._tick_min, None
        self._ticks.append(0.0 if low is None else low)
        return self._ticks[-1]

    @property
    def over(self) -> bool:
        ticks = self._ticks
        if len(ticks) < SUSTAIN_TICKS or min(ticks) < FILL_HIGH:
            return False
        return ticks[-1] >= ticks[0] - DRAIN_MARGIN  # not draining

    @property
    def high(self) -> bool:
        """The last tick's lowest occupancy was `FILL_HIGH` or more."""
        return bool(self._ticks) and self._ticks[-1] >= FILL_HIGH

    @property
    def low(self) -> bool:
        return not self._ticks or self._ticks[-1] < FILL_LOW


class ChannelFill:
    """The workers' channels as they report them: each worker's lowest occupancy since its
    previous report; `occupancy` samples the fullest fresh one into the tick."""

    __slots__ = ("_latest", "occupancy")

    def __init__(self) -> None:
        self._latest: dict[Hashable, tuple[float, float]] = {}  # source -> (fill, reported_at)
        self.occupancy = Occupancy()

    def report(self, source: Hashable, fill: float, now: float) -> None:
        self._latest[source] = (min(1.0, max(0.0, fill)), now)

    def forget(self, source: Hashable) -> None:
        self._latest.pop(source, None)

    def tick(self, now: float) -> None:
        fresh = [f for f, at in self._latest.values() if now - at <= CHANNEL_STALE_S]
        self.occupancy.sample(max(fresh, default=0.0))
        self.occupancy.close_tick()


class LaneLoad(NamedTuple):
    """One candidate as the controller sees it: its sample share, cumulative counters and the
    occupancy of its ring over the recent ticks."""

    name: str
    rate: float  # the sample share in force (sample_rate, or target_rps's adaptive share)
    received: int  # copies that reached the mirror process (the lane's `sampled`)
    done: int  # copies that came to an end (observed_ok + observed_error + timed_out)
    overflow: int  # the ring's dropped_overflow
    ring: Occupancy


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
        self.cuts: dict[str, int] = {"lane": 0, "channel": 0, "guard": 0}  # ticks that lowered

    def share(self, name: str) -> float | None:
        state = self._states.get(name)
        return None if state is None else state.share

    @property
    def limited(self) -> bool:
        """Some candidate's share is limited now."""
        return any(s.share is not None for s in self._states.values())

    def tick(
        self,
        now: float,
        dt: float,
        eligible_rps: float | None,
        loads: Sequence[LaneLoad],
        channel: Occupancy,
        guard: bool,
    ) -> bool:
        """One control step (each ring's and the channel's tick already closed); True when
        some candidate's (share, low) changed."""
        changed = False
        seen: set[str] = set()
        for load in loads:
            seen.add(load.name)
            state = self._states.setdefault(load.name, _State())
            before = self._pair(state, now)
            self._step(state, load, dt, eligible_rps, channel, guard, now)
            changed |= self._pair(state, now) != before
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
        channel: Occupancy,
        guard: bool,
        now: float,
    ) -> None:
        last, state.last = state.last, (load.received, load.done, load.overflow)
        if last is None or dt <= 0 or not eligible_rps or load.rate <= 0:
            return
        cur = load.rate if state.share is None else min(load.rate, state.share)
        ring = load.ring
        if ring.over or (ring.high and load.overflow > last[2]):  # the candidate is the limit
            reason = "lane"
            new = HEADROOM * (load.done - last[1]) / dt / eligible_rps
        elif channel.over:  # the mirror process is the limit: grant what it reads
            reason = "channel"
            new = HEADROOM * (load.received - last[0]) / dt / eligible_rps
        elif guard:
            reason, new = "guard", cur * GUARD_CUT
        else:
            if state.share is not None and load.ring.low and channel.low:
                raised = state.share * RISE
                state.share = None if raised >= load.rate else raised
            # else: a backlog above FILL_LOW, draining or not yet sustained: hold
            self._forget(state, now)
            return
        self.cuts[reason] += 1
        state.share = max(SHARE_FLOOR, min(new, cur * CUT_MIN), cur * CUT_MAX)
        state.history.append((now, state.share))

    @staticmethod
    def _forget(state: _State, now: float) -> None:
        history = state.history
        while history and now - history[0][0] > SESSION_ACTIVE_S:
            history.popleft()

    @staticmethod
    def _pair(state: _State, now: float) -> tuple[float, float] | None:
        """(share, low) as the workers apply it; None when there is nothing to apply."""
        low = min((s for _, s in state.history), default=None)
        if state.share is None and low is None:
            return None
        share = 1.0 if state.share is None else state.share
        return share, min(share, low if low is not None else share)

    def wire(self, names: Iterable[str], now: float) -> dict[str, tuple[float, float]]:
        """Per candidate with a limit or a recent one: (share, low), as RATES frames carry it."""
        out: dict[str, tuple[float, float]] = {}
        for name in names:
            state = self._states.get(name)
            if state is None:
                continue
            pair = self._pair(state, now)
            if pair is not None:
                out[name] = pair
        return out


class LimitTimes:
    """Per candidate, when a capacity share was in force (wall-clock seconds): the first and
    last second and how many ticks had one, i.e. when copies were shed by hash (the report says
    it; `domain.accounting.SHED_WHEN_FIELDS`)."""

    __slots__ = ("_rows",)

    def __init__(self) -> None:
        self._rows: dict[str, list[int]] = {}  # name -> [first, last, ticks]

    def tick(self, shares: CapacityShares, names: Iterable[str], wall: float) -> None:
        at = int(wall)
        for name in names:
            if shares.share(name) is None:
                continue
            row = self._rows.get(name)
            if row is None:
                self._rows[name] = [at, at, 1]
            else:
                row[1] = at
                row[2] += 1

    def fields(self, name: str) -> dict[str, int]:
        row = self._rows.get(name)
        if row is None:
            return {}
        return {SHED_FIRST_AT: row[0], SHED_LAST_AT: row[1], SHED_SECONDS: row[2]}


class Admitted:
    """Per candidate, the sessions whose first turn was kept (LRU-bounded): the mirror process
    answers the later turns a worker cannot decide alone. A session is added only once its
    candidate's ring accepted a copy of it; one the ring has since broken is refused there
    (`RingBuffer.trail`), whatever this set says."""

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
