"""The mirror process's once-a-second tick of its two sampling controllers, as a part of
`gateway.mirror.tee.Mirror`: the capacity shares (`capacity.py`), lowered while the process
cannot keep up, from each ring's occupancy sampled within the tick, and the `target_rps`
controller (`adaptive.py`); and what they report (`rate_stats`, `shed_reasons`).

It never touches a request: it reads the lanes' counters and rings, and hands changed shares to
the workers through `AdaptiveRates`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from gateway.mirror.sampling import capacity as capacity_mod

if TYPE_CHECKING:
    from gateway.mirror.replay.lane import Lane
    from gateway.mirror.replay.ring import MemoryBudget
    from gateway.mirror.sampling.adaptive import AdaptiveRates
    from gateway.mirror.sampling.loopguard import LoopLagGuard
    from gateway.mirror.sampling.sampler import Offer


log = logging.getLogger("canary.mirror.tick")


class SamplingTick:
    """The controllers' state and tick; `Mirror` holds the lanes, offers and guard it reads."""

    _lanes: dict[str, Lane]
    _offers: tuple[Offer, ...]
    adaptive: AdaptiveRates
    budget: MemoryBudget
    guard: LoopLagGuard

    def _init_shares(self) -> None:
        # Capacity shares (capacity.py): lowered while this process cannot keep up.
        self.capacity = capacity_mod.CapacityShares()
        self.channel = capacity_mod.ChannelFill()  # the workers report their channels' fill
        self._ring_fill: dict[str, capacity_mod.Occupancy] = {}
        self.limit_times = capacity_mod.LimitTimes()  # when copies were shed by hash
        self.admitted = capacity_mod.Admitted()
        self._capacity_at: float | None = None
        self.shed_capacity = 0  # copies shed here under a capacity share (later turns, undecided)
        self.tick_errors = 0  # ticks that raised (logged; the loop goes on)

    def control_tick(self, now: float) -> None:
        """One step of the `target_rps` controller (the mirror runs one a second)."""
        self.adaptive.tick(now)

    async def _tick_loop(self) -> None:
        """Once a tick, both controllers: capacity, then `target_rps`. Within the tick every
        ring's occupancy is looked at up to `SAMPLES_PER_TICK` times (its lowest kept); once
        every ring was found empty no later look can find less, so the tick's rest is one
        sleep: an idle or lightly loaded mirror wakes about once a second, not five times."""
        every = capacity_mod.TICK_S / capacity_mod.SAMPLES_PER_TICK
        while True:
            left = capacity_mod.SAMPLES_PER_TICK
            while left:
                await asyncio.sleep(every)
                left -= 1
                if self.sample_rings() and left:
                    await asyncio.sleep(every * left)
                    break
            now = time.monotonic()
            try:
                self.capacity_tick(now)
                self.control_tick(now)
            except Exception:  # one bad tick must not freeze the shares for good
                self.tick_errors += 1
                if self.tick_errors == 1 or self.tick_errors % 100 == 0:
                    log.exception(
                        "sampling tick failed (%d so far); the next goes on", self.tick_errors
                    )

    def sample_rings(self) -> bool:
        """One look at each ring's occupancy: items or bytes against its bounds, or the host's
        memory budget, whichever is fullest (the one it would overflow first). True when every
        ring's lowest this tick is 0."""
        budget = self.budget.used / max(1, self.budget.limit)
        fills = self._ring_fill
        floor = True
        for name, lane in self._lanes.items():
            ring = lane.ring
            fill = max(
                budget,
                ring.items / max(1, ring.max_items),
                ring.bytes / max(1, ring.max_bytes),
            )
            floor = fills.setdefault(name, capacity_mod.Occupancy()).sample(fill) == 0 and floor
        return floor

    def capacity_tick(self, now: float) -> None:
        """One step of the capacity controller; changed shares go to the workers."""
        last, self._capacity_at = self._capacity_at, now
        dt = capacity_mod.TICK_S if last is None else now - last
        rates = {o.name: o.rate for o in self._offers}
        loads = []
        fills = self._ring_fill
        for name in [n for n in fills if n not in self._lanes]:
            del fills[name]
        for name, lane in self._lanes.items():
            c = lane.counters
            ring = fills.setdefault(name, capacity_mod.Occupancy())
            ring.close_tick()
            loads.append(
                capacity_mod.LaneLoad(
                    name,
                    rates.get(name, 0.0),
                    c.sampled,  # every copy whose frame arrived, shed here or not
                    c.observed_ok + c.observed_error + c.timed_out,
                    c.dropped_overflow,
                    ring,
                )
            )
        self.channel.tick(now)
        eligible = self.adaptive.control.eligible.instant(now)
        channel = self.channel.occupancy
        if self.capacity.tick(now, dt, eligible, loads, channel, self.guard.shedding):
            self.adaptive.set_capacity(self.capacity.wire(rates, now), now)
        self.limit_times.tick(self.capacity, self._lanes, time.time())

    def shed_reasons(self) -> dict[str, int]:
        """Copies shed by this process, by reason (the guard's signals; `capacity`)."""
        return {**self.guard.reasons, "capacity": self.shed_capacity}

    def rate_stats(self) -> dict[str, dict[str, float | None]]:
        """Per candidate: target, effective share, realized copies/s and what changes cost."""
        out = self.adaptive.stats(lane.endpoint for lane in self._lanes.values())
        for name, row in out.items():
            row["capacity_share"] = self.capacity.share(name)
        return out
