"""The ramp's seams, as small protocols: where a worker's evidence goes (`RolloutSink`: in a worker
the hand-off to the mirror process, `gateway.mirror.channel.handoff.Handoff.put_rollout`) and who
makes its guard's trip durable (`RolloutGuard`: `gateway.rollout.state.GuardTrips`).
Every method here is synchronous and must never block: they are called on the request path.
"""

from __future__ import annotations

from typing import Protocol

from domain.records import RolloutRequest


class RolloutSink(Protocol):
    """Receives one record per request of an open rollout (the ramp's live evidence); in a
    worker it is the hand-off to the mirror process. Never blocks: drops and counts when full."""

    def put_rollout(self, request: RolloutRequest) -> None:
        """One request's outcome, arm, session and end (`domain.records.RolloutRequest`)."""


class RolloutGuard(Protocol):
    """Makes a worker's guard trip durable and pushed to every replica (a storage rollback with
    `expected_generation`, which NOTIFYs). Called at most once per generation, on the loop, on
    the request path, after this worker already rolled back: it schedules the write (an owned
    task), never awaits it."""

    def trip(self, generation: int, reason: str, evidence: dict[str, object]) -> None: ...
