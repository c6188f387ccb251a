"""Overload guard: shed new mirror copies while the event loop lags (production first, always).

A small owned task sleeps `interval_s` and measures how late it wakes up; while the lag exceeds
the threshold, `shedding` is True and the mirror's offer path (which only reads that boolean)
counts new copies as `shed_overload` instead of queueing them. One on-time wake-up clears it.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["LoopLagGuard"]


class LoopLagGuard:
    """Measures event-loop lag in the background; `shedding` is what the hot path reads."""

    __slots__ = (
        "_task",
        "interval_s",
        "last_lag_s",
        "max_lag_s",
        "shedding",
        "sheds",
        "threshold_s",
    )

    def __init__(self, threshold_ms: float, interval_s: float = 0.01) -> None:
        self.threshold_s = threshold_ms / 1000.0
        self.interval_s = interval_s
        self.shedding = False
        self.last_lag_s = 0.0
        self.max_lag_s = 0.0
        self.sheds = 0  # how many times shedding switched on
        self._task: asyncio.Task[None] | None = None

    def observe(self, lag_s: float) -> None:
        """Record one lag measurement (pure; the task calls it, tests may too)."""
        self.last_lag_s = lag_s
        self.max_lag_s = max(self.max_lag_s, lag_s)
        over = lag_s > self.threshold_s
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
        self.shedding = False

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.interval_s
        while True:
            expected = loop.time() + interval
            await asyncio.sleep(interval)
            self.observe(max(0.0, loop.time() - expected))
