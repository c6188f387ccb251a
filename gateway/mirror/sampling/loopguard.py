"""Overload guard of the mirror process: shed a share of new copies while *it* is overloaded.

The mirror runs in its own low-priority process, so production is protected structurally (the
channel's bound and the OS scheduler), not by this guard. What is left for the guard is the
mirror process's own sustained overload: copies it cannot meter in time would measure the
candidate wrongly. A timer callback re-armed every `interval_s` (every `IDLE_INTERVAL_S` while
the process uses less than `FAST_ABOVE_BUSY` of a core) measures how late it runs;
two sustained signals over `window_s` set `shed_fraction` in [0, 1]:

- `lag`: the median lag of the wake-ups in the last `window_s` above `threshold_ms`; the share
  shed grows with the excess (1 at twice the threshold). One late wake-up on a busy host, however
  late, is one sample among about `window_s / interval_s` and moves the median not at all; only
  a loop that is late most of the time sheds. Lag counts only while the process itself uses
  at least `LAG_NEEDS_BUSY` of a core: a loop that is late because other processes hold the CPU
  (a busy host, a SCHED_IDLE mirror behind production) is the host's load, not the mirror's,
  and copies then wait in the rings (bounded, counted) instead of being shed. Nothing sheds on
  lag before a whole window of samples exists.
- `cpu`: the process's event-loop thread busy for more than `cpu_busy` of the window's wall
  time (1 at a whole core).

Which copies are shed is decided by the copy's body hash, so shedding is deterministic and
proportional, not a window where everything goes. Every shed copy is counted by reason.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Final

__all__ = ["LoopLagGuard"]

# How often the guard wakes to measure the lag: 20 times a second gives the median of a 2 s
# window 40 samples, plenty against a threshold of tens of milliseconds. Every wake-up of an
# otherwise idle process costs it: at 100 a second, py-spy charged the guard about a quarter of
# an idle mirror process's CPU.
INTERVAL_S: Final = 0.05
# Lag samples kept for the median (a window of 2 s at 50 ms is 40); bounded whatever the window.
SAMPLES_MAX: Final = 1024
# The median is recomputed every this many samples (sorting ~40 floats every 250 ms).
_MEDIAN_EVERY: Final = 5
# Share of a core the mirror process must itself use for its lag to mean its own overload.
LAG_NEEDS_BUSY: Final = 0.5
# Below this share of a core its lag cannot shed, so the guard wakes only every
# `IDLE_INTERVAL_S` (the CPU window still closes on time, and the lag samples are there, fewer,
# before the share reaches `LAG_NEEDS_BUSY`): 20 wake-ups a second were half an idle mirror
# process's CPU (3.3 of 6.7 ms a second), and a light load pays for them as much.
FAST_ABOVE_BUSY: Final = LAG_NEEDS_BUSY / 2
IDLE_INTERVAL_S: Final = 0.5


class LoopLagGuard:
    """Measures sustained loop lag and CPU use; `should_shed` is what the offer path asks."""

    __slots__ = (
        "_clock",
        "_expected",
        "_handle",
        "_lags",
        "_last",
        "_loop",
        "_since_median",
        "_times",
        "_window_cpu",
        "_window_start",
        "avg_lag_s",
        "busy",
        "cpu_busy",
        "cpu_window_s",
        "current_interval_s",
        "frac_cpu",
        "frac_lag",
        "interval_s",
        "last_lag_s",
        "max_lag_s",
        "reasons",
        "shed_fraction",
        "shedding",
        "sheds",
        "threshold_s",
        "window_s",
    )

    def __init__(
        self,
        threshold_ms: float,
        interval_s: float = INTERVAL_S,
        *,
        cpu_busy: float | None = 0.9,
        window_s: float = 2.0,
    ) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.interval_s = interval_s
        self.current_interval_s = interval_s  # the next wake-up's: see FAST_ABOVE_BUSY
        self.cpu_busy = cpu_busy  # None: the CPU signal is off
        self.window_s = window_s
        self.cpu_window_s = window_s
        self.shed_fraction = 0.0
        self.shedding = False
        self.frac_lag = 0.0
        self.frac_cpu = 0.0
        self.avg_lag_s = 0.0
        self.last_lag_s = 0.0
        self.max_lag_s = 0.0
        self.busy = 0.0  # CPU share of the last full window
        self.sheds = 0  # how many times shedding switched on
        self.reasons = {"lag": 0, "cpu": 0}  # copies shed, by the signal that shed them
        self._window_start = 0.0
        self._window_cpu = 0.0
        self._clock = 0.0
        # Each wake-up's time (on the guard's clock) and lag, side by side: the median sorts the
        # lags as they are (C), with no tuple per sample to build or unpack.
        self._times: deque[float] = deque(maxlen=SAMPLES_MAX)
        self._lags: deque[float] = deque(maxlen=SAMPLES_MAX)
        self._since_median = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None  # the next wake-up, while started
        self._expected = self._last = 0.0

    def observe(self, lag_s: float, elapsed_s: float | None = None) -> None:
        """Record one lag measurement taken `elapsed_s` after the previous one (pure)."""
        self.last_lag_s = lag_s
        self.max_lag_s = max(self.max_lag_s, lag_s)
        self._clock += self.interval_s + lag_s if elapsed_s is None else elapsed_s
        times, lags = self._times, self._lags
        times.append(self._clock)
        lags.append(lag_s)
        horizon = self._clock - self.window_s
        while times[0] < horizon:
            times.popleft()
            lags.popleft()
        self._since_median += 1
        if self._since_median < _MEDIAN_EVERY and len(lags) > _MEDIAN_EVERY:
            return
        self._since_median = 0
        ordered = sorted(lags)
        self.avg_lag_s = ordered[len(ordered) // 2]  # the median: robust to single stalls
        self._lag_fraction()
        self._update()

    def _lag_fraction(self) -> None:
        excess = self.avg_lag_s - self.threshold_s
        times = self._times
        full = bool(times) and times[-1] - times[0] >= 0.9 * self.window_s
        if excess <= 0 or not full or self.busy < LAG_NEEDS_BUSY:
            self.frac_lag = 0.0
        else:
            self.frac_lag = min(1.0, excess / self.threshold_s)

    def observe_cpu(self, cpu_s: float, wall_s: float) -> None:
        """Record CPU seconds used over `wall_s` seconds of wall time (pure)."""
        self.busy = cpu_s / wall_s if wall_s > 0 else 0.0
        fast = self.busy >= FAST_ABOVE_BUSY
        self.current_interval_s = self.interval_s if fast else max(self.interval_s, IDLE_INTERVAL_S)
        limit = self.cpu_busy
        if limit is None or self.busy <= limit:
            self.frac_cpu = 0.0
        else:
            self.frac_cpu = min(1.0, (self.busy - limit) / max(1.0 - limit, 1e-9))
        self._lag_fraction()
        self._update()

    def _update(self) -> None:
        fraction = max(self.frac_lag, self.frac_cpu)
        if fraction > 0 and not self.shedding:
            self.sheds += 1
        self.shed_fraction = fraction
        self.shedding = fraction > 0

    def should_shed(self, digest: bytes) -> bool:
        """Shed this copy? True for a `shed_fraction` share of body hashes; counts the reason."""
        fraction = self.shed_fraction
        if fraction <= 0 or int.from_bytes(digest[:8], "big") >= fraction * 2.0**64:
            return False
        self.reasons["lag" if self.frac_lag >= self.frac_cpu else "cpu"] += 1
        return True

    def start(self) -> None:
        """Start measuring: a timer callback every `interval_s`, or `IDLE_INTERVAL_S` while
        the process is far from busy (no task, no future per wake-up: the sleep's own objects
        were most of the guard's cost)."""
        if self._handle is not None:
            return
        loop = self._loop = asyncio.get_running_loop()
        now = loop.time()
        self._window_start, self._window_cpu = now, time.thread_time()
        self._last = now
        self._expected = now + self.current_interval_s
        self._handle = loop.call_at(self._expected, self._tick)

    async def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        self.shed_fraction = self.frac_lag = self.frac_cpu = 0.0
        self.shedding = False

    def _tick(self) -> None:
        loop = self._loop
        if loop is None or self._handle is None:
            return
        now = loop.time()
        self.observe(max(0.0, now - self._expected), now - self._last)
        self._last = now
        if now - self._window_start >= self.cpu_window_s:
            cpu = time.thread_time()
            self.observe_cpu(cpu - self._window_cpu, now - self._window_start)
            self._window_start, self._window_cpu = now, cpu
        self._expected = now + self.current_interval_s
        self._handle = loop.call_at(self._expected, self._tick)
