"""How long a job waits for a candidate copy's answer (the scorer's jobs, the grader's pairs).

A copy can sit in its ring behind a backlog for longer than its timeout before a worker takes
it, and its timeout bounds only what comes after. So the wait is `timeout_s + slack_s`
(`mirror.answer_wait_s`) from the offer, pushed back to `timeout_s + slack_s` from the moment a
worker takes the copy (`Lane.on_send`). A copy that leaves its ring unsent is reported
(`Lane.on_discard`), so a job never waits for an answer that cannot come. When the time is up
while a copy is still queued (a backlog: it will be sent or discarded), the job waits on,
looking again every `slack_s`, up to `QUEUED_MAX_S` from the offer; then it gives up as it does
when an answer is late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Final

__all__ = ["QUEUED_MAX_S", "CopyWait"]

# A copy queued this long after its offer is as good as lost: a job stops waiting for it.
QUEUED_MAX_S: Final = 3600.0


class CopyWait:
    """The deadline of one job; `expire` is called once, when it passes."""

    __slots__ = ("_at", "_expire", "_handle", "_offered", "_slack_s", "queued")

    def __init__(
        self, timeout_s: float, slack_s: float, expire: Callable[[], None], queued: Iterable[str]
    ) -> None:
        loop = asyncio.get_running_loop()
        self._offered = loop.time()
        self._slack_s = slack_s  # for the observation (and production's answer) to arrive
        self._expire = expire
        self._at = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self.queued = set(queued)  # the arms whose copy no worker has taken yet
        self._push(timeout_s + slack_s)

    def sent(self, arm: str, timeout_s: float) -> None:
        """A worker took `arm`'s copy: wait its timeout from now (never less than before)."""
        if arm in self.queued:
            self.queued.discard(arm)
            self._push(timeout_s + self._slack_s)

    def discarded(self, arm: str) -> None:
        self.queued.discard(arm)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _push(self, delay_s: float) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time() + delay_s
        if at <= self._at:
            return
        self.cancel()
        self._at = at
        self._handle = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = asyncio.get_running_loop().time()
        if self.queued and now - self._offered < QUEUED_MAX_S:
            self._push(min(self._slack_s, self._offered + QUEUED_MAX_S - now))
            return
        self._expire()
