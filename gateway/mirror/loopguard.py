"""Overload guard: shed new mirror copies while the gateway is overloaded (production first).

A small owned task sleeps `interval_s` and measures how late it wakes up. Two signals switch
`shedding` on, and the mirror's offer path (which only reads that boolean) then counts new copies
as `shed_overload` instead of queueing them:

- loop lag above `mirror_shed_loop_lag_ms` (one late wake-up; one on-time wake-up clears it);
- the event-loop thread busy on the CPU for more than `cpu_busy` of the last `cpu_window_s` of
  wall time (its own thread's CPU time: a storage writer's thread does not count).

The second exists because a saturated loop need not lag: a closed loop of clients keeps every
iteration short while the core is 100 % busy, and then each copy's HTTP exchange and meter are
taken straight from production's throughput. Copies may use spare CPU only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

__all__ = ["LoopLagGuard"]


class LoopLagGuard:
    """Measures loop lag and CPU busy-ness in the background; `shedding` is what the hot path
    reads."""

    __slots__ = (
        "_cpu_over",
        "_lag_over",
        "_task",
        "_window_cpu",
        "_window_start",
        "busy",
        "cpu_busy",
        "cpu_window_s",
        "interval_s",
        "last_lag_s",
        "max_lag_s",
        "shedding",
        "sheds",
        "threshold_s",
    )

    def __init__(
        self,
        threshold_ms: float,
        interval_s: float = 0.01,
        *,
        cpu_busy: float | None = 0.9,
        cpu_window_s: float = 0.2,
    ) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.interval_s = interval_s
        self.cpu_busy = cpu_busy  # None: the CPU signal is off
        self.cpu_window_s = cpu_window_s
        self.shedding = False
        self.last_lag_s = 0.0
        self.max_lag_s = 0.0
        self.busy = 0.0  # CPU share of the last full window
        self.sheds = 0  # how many times shedding switched on
        self._lag_over = False
        self._cpu_over = False
        self._window_start = 0.0
        self._window_cpu = 0.0
        self._task: asyncio.Task[None] | None = None

    def observe(self, lag_s: float) -> None:
        """Record one lag measurement (pure; the task calls it, tests may too)."""
        self.last_lag_s = lag_s
        self.max_lag_s = max(self.max_lag_s, lag_s)
        self._lag_over = lag_s > self.threshold_s
        self._update()

    def observe_cpu(self, cpu_s: float, wall_s: float) -> None:
        """Record CPU seconds used over `wall_s` seconds of wall time (pure)."""
        self.busy = cpu_s / wall_s if wall_s > 0 else 0.0
        self._cpu_over = self.cpu_busy is not None and self.busy > self.cpu_busy
        self._update()

    def _update(self) -> None:
        over = self._lag_over or self._cpu_over
        if over and not self.shedding:
            self.sheds += 1
        self.shedding = over

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="mirror-lag")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.shedding = self._lag_over = self._cpu_over = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.interval_s
        self._window_start, self._window_cpu = loop.time(), time.thread_time()
        while True:
            expected = loop.time() + interval
            await asyncio.sleep(interval)
            now = loop.time()
            self.observe(max(0.0, now - expected))
            if now - self._window_start >= self.cpu_window_s:
                cpu = time.thread_time()
                self.observe_cpu(cpu - self._window_cpu, now - self._window_start)
                self._window_start, self._window_cpu = now, cpu
