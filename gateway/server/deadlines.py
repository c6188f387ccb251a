"""The deadlines of one upstream exchange, and the one timer that enforces every exchange's.

`UpstreamTimeouts` names them (connect, time to first byte, idle between chunks, total, and the
proxy's client-write bound); a `Watchdog` holds one exchange's; one `DeadlineSweeper` per
process (the proxy's, each mirror lane's) ticks while any is registered and cancels the task of
an exchange past a deadline, which `Watchdog.check_cancel` turns into `UpstreamTimeoutError`.
The upstream client (`server/upstream.py`) only reads a watchdog; the relays
(`server/stream/relay.py`) stamp it from the read callback.
"""

from __future__ import annotations

import asyncio
from time import perf_counter
from typing import Any

import msgspec

from gateway.server.upstream import UpstreamTimeoutError

CLIENT_WRITE = "client_write"  # the deadline phase of a client that stopped reading


class UpstreamTimeouts(msgspec.Struct, frozen=True, kw_only=True):
    """Deadlines of one upstream exchange, in seconds; 0 disables one."""

    connect_s: float = 10.0
    ttfb_s: float = 600.0  # request sent -> response headers
    idle_s: float = 300.0  # longest gap between two body chunks
    total_s: float = 3600.0  # request sent -> last byte
    # One write to a client that does not read (the proxy's side only; 0 = none): while it is
    # pending the idle deadline is suspended, the stall is the client's.
    client_write_s: float = 0.0


class DeadlineSweeper:
    """One timer for the TTFB, idle and total deadlines of every exchange in flight.

    A per-exchange timer costs two timer handles per request (armed, then re-armed when the
    headers arrive) plus their cancellation; here an exchange costs a set insertion and removal.
    While any `Watchdog` is registered, one timer ticks every `resolution_s` and cancels the task
    of each exchange past a deadline: a deadline fires at most one tick late. The tick stops by
    itself when nothing is registered.
    """

    __slots__ = ("_handle", "_loop", "_watched", "resolution_s", "timeouts")

    def __init__(self, timeouts: UpstreamTimeouts) -> None:
        self.timeouts = timeouts
        # A tenth of the shortest deadline, at most 100 ms: precise enough for deadlines counted
        # in seconds, ten wake-ups a second while requests are in flight.
        enabled = [t for t in (timeouts.ttfb_s, timeouts.idle_s, timeouts.total_s) if t > 0]
        self.resolution_s = min([0.1, *(t / 10 for t in enabled)])
        self._watched: set[Watchdog] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, t0: float) -> Watchdog:
        """A watchdog for the current task's exchange, started at `t0` (perf_counter)."""
        loop = self._loop
        if loop is None:  # asked once: on 3.11 every get_running_loop() is a getpid() syscall
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None, "a Watchdog must be created inside a task"
        wd = Watchdog(self, t0, task)
        self._watched.add(wd)
        if self._handle is None:
            self._handle = loop.call_later(self.resolution_s, self._tick)
        return wd

    def _tick(self) -> None:
        now = perf_counter()
        for wd in [wd for wd in self._watched if wd.overdue(now)]:
            wd.expire()
        if self._watched and self._loop is not None:
            self._handle = self._loop.call_later(self.resolution_s, self._tick)
        else:
            self._handle = None

    def close(self) -> None:
        """Stop the tick (at shutdown); watchdogs still registered never expire."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._watched.clear()


class Watchdog:
    """The TTFB, idle and total deadlines of one exchange, checked by its `DeadlineSweeper`.

    Hot-path cost is an attribute store per chunk (`last`). Past a deadline the sweeper cancels
    the owning task; `expired` then names the phase, and `check_cancel` turns that cancellation
    into a typed error.
    """

    __slots__ = ("_sweeper", "_t0", "_task", "body", "expired", "last", "writing")

    def __init__(self, sweeper: DeadlineSweeper, t0: float, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._sweeper = sweeper
        self._t0 = t0
        self.last = t0
        self.body = False  # False while waiting for headers, True once the body is flowing
        self.writing = 0.0  # when a pending write to the client started (0: none pending)
        self.expired: str | None = None

    def _next_deadline(self) -> tuple[float, str]:
        t = self._sweeper.timeouts
        best, phase = float("inf"), ""
        if t.total_s:
            best, phase = self._t0 + t.total_s, "total"
        if self.writing:
            if t.client_write_s and self.writing + t.client_write_s < best:
                best, phase = self.writing + t.client_write_s, CLIENT_WRITE
        elif self.body:
            if t.idle_s and self.last + t.idle_s < best:
                best, phase = self.last + t.idle_s, "idle"
        elif t.ttfb_s and self._t0 + t.ttfb_s < best:
            best, phase = self._t0 + t.ttfb_s, "ttfb"
        return best, phase

    def overdue(self, now: float) -> bool:
        return self.expired is None and now >= self._next_deadline()[0]

    def expire(self) -> None:
        """Cancel the owning task for the earliest deadline passed (called by the sweeper)."""
        self.expired = phase = self._next_deadline()[1]
        self._task.cancel(f"upstream {phase} timeout")

    def headers_received(self, now: float) -> None:
        """Switch from the TTFB deadline to the idle deadline."""
        self.body = True
        self.last = now

    def touch(self, now: float) -> None:
        self.last = now

    def close(self) -> None:
        self._sweeper._watched.discard(self)

    def check_cancel(self) -> None:
        """Inside `except CancelledError`: raise the timeout if this watchdog caused it.

        Returns (so the caller re-raises the cancellation) when someone else cancelled the task,
        e.g. the client went away.
        """
        if self.expired is not None and self._task.uncancel() == 0:
            raise UpstreamTimeoutError(self.expired, before_response=not self.body)
