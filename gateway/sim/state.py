"""Per-app runtime state of the simulator and its disconnect-aware sleep.

`SimState` holds the engine, the batch slots, the counters behind `GET /sim/stats` and the
bounded request log behind `GET /sim/requests`. `pause` is the only way the simulator waits on
behalf of a client: it notices a closed connection within `POLL_S`, so a generation stops
promptly whether or not the server cancels handlers on disconnect.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from typing import Any

from aiohttp import web

from domain.errors import CanaryError
from gateway.sim.engine import Engine
from gateway.sim.profiles import SimProfile

REQUEST_LOG_SIZE = 200  # enough for a proxy test to find its requests; older ones fall off
POLL_S = 0.05  # how often a sleeping generation checks that its client is still there


class SimStats:
    """Counters exposed on `GET /sim/stats`."""

    __slots__ = (
        "aborted",
        "active",
        "completed",
        "faulted",
        "max_active",
        "requests",
        "scored",
        "scored_tokens",
    )

    def __init__(self) -> None:
        self.requests = 0  # every request outside /sim/
        self.active = 0  # generating (or hanging) right now
        self.completed = 0
        self.aborted = 0  # the client went away mid-generation
        self.faulted = 0  # answered with an injected fault (500, garbage, reset)
        self.max_active = 0
        self.scored = 0  # scoring requests answered (prompt logprobs)
        self.scored_tokens = 0  # prompt tokens they prefilled

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


class SimState:
    """The engine, its batch slots, counters and the bounded request log of one app."""

    __slots__ = ("engine", "log", "profile", "rng", "slots", "stats")

    def __init__(self, profile: SimProfile, seed: int) -> None:
        self.profile = profile
        self.engine = Engine(profile, seed)
        self.rng = random.Random(seed)  # garbage bytes
        # Requests beyond max_num_seqs wait here; the wait is the queue part of TTFT.
        self.slots = asyncio.Semaphore(profile.max_num_seqs)
        self.stats = SimStats()
        self.log: deque[dict[str, Any]] = deque(maxlen=REQUEST_LOG_SIZE)

    def enter(self) -> None:
        """A sequence starts generating."""
        self.stats.active += 1
        self.stats.max_active = max(self.stats.max_active, self.stats.active)

    def scaled(self, seconds: float) -> float:
        return seconds * self.profile.time_scale

    def reset(self) -> None:
        active = self.stats.active
        self.stats = SimStats()
        self.stats.active = self.stats.max_active = active
        self.log.clear()
        self.engine.reset()
        self.rng = random.Random(self.engine.seed)


STATE = web.AppKey("sim_state", SimState)


class ClientGone(CanaryError):
    """The client closed its connection while the simulator was working for it."""


async def pause(request: web.BaseRequest, delay: float) -> None:
    """Sleep `delay` seconds (may be inf), raising `ClientGone` soon after the client leaves."""
    if delay <= 0:
        return
    loop = asyncio.get_running_loop()
    if math.isinf(delay):
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ClientGone
        # A hang ends only when the client leaves, and the server's handler cancellation ends
        # it then; polling would wake every hung connection POLL_S apart (a few thousand hung
        # connections, as a mirror to a hung candidate holds, cost a whole core).
        await loop.create_future()
    end = loop.time() + delay
    while True:
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ClientGone
        left = end - loop.time()
        if left <= 0:
            return
        await asyncio.sleep(min(left, POLL_S))
