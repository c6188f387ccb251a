"""`AdaptiveRates`: the mirror's side of sampling toward a target rate (`target_rps`).

It steps the controller (`gateway.mirror.sampling.rate`) on the host's eligible rate once a
second, when the mirror's loop ticks it (`Mirror._tick_loop`, with the capacity controller),
applies a changed reference to the mirror's offers at the instant it names (and hands it to
`on_change`, which the plane sends to every worker), and counts what a change cost: in session
mode, the conversations in progress a lowered threshold cuts (from the recent-conversation
ledger of `gateway.mirror.replay.order`) and those a raised threshold joins after their first turn.
The capacity shares of an overloaded mirror (`gateway.mirror.sampling.capacity`) travel in the
same messages (`set_capacity`) and apply the same way: at the instant named, here and in every
worker.
It never touches the request path except `count_joined`, called only for later turns of
sampled conversations while some candidate has changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Protocol

from domain.endpoint import Endpoint
from gateway.mirror.channel import frames
from gateway.mirror.replay.order import TurnOrder
from gateway.mirror.sampling import rate as rate_mod
from gateway.mirror.sampling.sampler import Offer, apply_capacity, threshold_for

__all__ = ["SESSION_ACTIVE_S", "AdaptiveRates", "OfferLike"]

# A conversation seen within this long counts as in progress when a threshold change cuts it.
SESSION_ACTIVE_S: Final = 120.0


class OfferLike(Protocol):
    """What this module reads and sets on one of the mirror's offers."""

    rate: float
    threshold: float

    @property
    def name(self) -> str: ...
    @property
    def endpoint(self) -> Endpoint: ...
    @property
    def session_mode(self) -> bool: ...


class _Cost:
    """What the adaptive share of one candidate did: changes, and what they cost sessions."""

    __slots__ = ("changed_at", "changes", "cut", "joined", "raised_at", "raised_from")

    def __init__(self) -> None:
        self.changes = 0
        self.cut = 0  # conversations in progress a lowered threshold stopped mirroring
        self.joined = 0  # conversations a raised threshold began mirroring after turn 0
        self.changed_at = float("-inf")
        self.raised_at: float | None = None
        self.raised_from = 0.0  # the threshold before the last raise


class AdaptiveRates:
    """The controller, the references in force, and the cost of their changes, per candidate.

    `offers` returns the mirror's current offers; `sampled` each candidate's cumulative
    sampled count. The workers' eligible counts are reported to `control.eligible`."""

    def __init__(
        self,
        order: TurnOrder,
        offers: Callable[[], Sequence[OfferLike]],
        sampled: Callable[[], Iterable[tuple[str, int]]],
    ) -> None:
        self._order = order
        self._offers = offers
        self._sampled = sampled
        self.control = rate_mod.RateControl()
        start = rate_mod.START_REFERENCE_RPS
        self.refs = (start, start)
        self.msg = frames.RatesMeta(0, 0.0, start, start)  # the last one, sent to new workers
        self.capacity: dict[str, tuple[float, float]] = {}  # the capacity shares in force
        self.on_change: Callable[[frames.RatesMeta], None] | None = None
        self._costs: dict[str, _Cost] = {}
        self._timers: set[asyncio.TimerHandle] = set()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """No change applies after this: the scheduled ones are cancelled."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    # ------------------------------------------------------------------ control

    def tick(self, now: float) -> None:
        """One controller step; a changed reference is scheduled here and handed to
        `on_change`, both naming the same instant."""
        if not self.control.tick(now, self._sampled()):
            return
        request_rps, session_rps = self.control.refs()
        self._send(request_rps, session_rps, self.msg.capacity, now)

    def set_capacity(self, capacity: dict[str, tuple[float, float]], now: float) -> None:
        """New capacity shares for the workers and this process, from the instant named."""
        self.control.seq += 1
        self._send(self.msg.request_rps, self.msg.session_rps, capacity, now)

    def _send(
        self,
        request_rps: float,
        session_rps: float,
        capacity: dict[str, tuple[float, float]],
        now: float,
    ) -> None:
        msg = frames.RatesMeta(
            self.control.seq, now + rate_mod.APPLY_LEAD_S, request_rps, session_rps, capacity
        )
        self.msg = msg
        self.schedule(msg)
        if self.on_change is not None:
            self.on_change(msg)

    def schedule(self, msg: frames.RatesMeta) -> None:
        """Apply `msg` at its instant (at once when it is due, or without a running loop)."""
        delay = msg.apply_at - time.monotonic()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or delay <= 0:
            self._apply(msg)
            return
        timer: asyncio.TimerHandle

        def fire() -> None:
            self._timers.discard(timer)
            self._apply(msg)

        timer = loop.call_later(delay, fire)
        self._timers.add(timer)

    def _apply(self, msg: frames.RatesMeta) -> None:
        if self._closed:
            return
        self.refs = (msg.request_rps, msg.session_rps)
        self.capacity = msg.capacity
        now = time.monotonic()
        offers = self._offers()
        for offer in offers:
            if offer.endpoint.target_rps is None:
                continue
            share = rate_mod.endpoint_rate(offer.endpoint, self.refs)
            old, new = offer.threshold, threshold_for(share)
            if new == old:
                continue
            cost = self._costs.setdefault(offer.name, _Cost())
            cost.changes += 1
            if offer.session_mode and new < old:
                since = max(cost.changed_at, now - SESSION_ACTIVE_S)
                cost.cut += self._order.cut(new, old, since)
            elif offer.session_mode:
                cost.raised_at, cost.raised_from = now, old
            cost.changed_at = now
            offer.rate, offer.threshold = share, new
        apply_capacity([o for o in offers if isinstance(o, Offer)], self.capacity)

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the costs of candidates that are gone."""
        kept = set(keep)
        for name in [n for n in self._costs if n not in kept]:
            del self._costs[name]

    # ------------------------------------------------------------------ sessions

    @property
    def changed(self) -> bool:
        """Some candidate's share changed (the request path asks before `count_joined`)."""
        return bool(self._costs)

    def count_joined(
        self, chosen: Sequence[OfferLike], h: int, seen: float | None, now: float
    ) -> None:
        """A later turn of a conversation a candidate did not mirror before its threshold was
        last raised, arriving for the first time since: joined mid-way (counted once)."""
        for offer in chosen:
            cost = self._costs.get(offer.name)
            if cost is None or cost.raised_at is None or not offer.session_mode:
                continue
            if now - cost.raised_at > SESSION_ACTIVE_S or h < cost.raised_from:
                continue
            if seen is None or seen < cost.raised_at:
                cost.joined += 1

    # ------------------------------------------------------------------ export

    def stats(self, endpoints: Iterable[Endpoint]) -> dict[str, dict[str, float | None]]:
        """Per candidate: target, the share in force (0: not offered), realized copies/s, the
        host's eligible rate, and what changes cost."""
        shares = {o.name: o.rate for o in self._offers()}
        out: dict[str, dict[str, float | None]] = {}
        for ep in endpoints:
            cost = self._costs.get(ep.name) or _Cost()
            out[ep.name] = {
                "target_rps": ep.target_rps,
                "effective_sample_rate": shares.get(ep.name, 0.0),
                "realized_copies_per_second": self.control.realized(ep.name),
                "eligible_requests_per_second": self.control.eligible_rps,
                "rate_changes": cost.changes,
                "sessions_cut": cost.cut,
                "sessions_joined": cost.joined,
            }
        return out
