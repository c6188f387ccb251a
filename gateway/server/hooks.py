"""The seams between the proxy, the mirror and storage, as small protocols.

The proxy knows only `RequestTee` and `LiveTarget` (the registry swaps it); during a ramp, also
`RampSink` (its evidence) and `RolloutGuard` (a worker's fast rollback made durable); the ramp's
candidate is a `LiveTarget` of the candidate endpoint, held by the router's `Rollout.candidate`.
In a worker the tee is `gateway.mirror.channel.handoff.Handoff`: it samples and writes each
chosen copy into the bounded channel to the host's mirror process, never parsing the body and
never awaiting. In the mirror process the same interface is implemented by
`gateway.mirror.tee.Mirror`, which hands finished records to an `ObservationSink` (storage's
writer implements it; tests use an in-memory one).
Every method here is synchronous and must never block: they are called on the request path.
"""

from __future__ import annotations

from typing import Protocol

from multidict import CIMultiDictProxy
from yarl import URL

from domain.endpoint import Endpoint
from domain.records import ExchangeRecord, ObservationRecord
from gateway.server.meter import MeterResult


class LiveTarget:
    """Where production traffic goes right now. The registry replaces `endpoint` and `base_url`
    together on a promotion or rollback; the proxy reads them once per request."""

    __slots__ = ("base_url", "endpoint")

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.base_url = URL(endpoint.url.rstrip("/"))

    def set(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.base_url = URL(endpoint.url.rstrip("/"))


class RequestTee(Protocol):
    """Receives production requests and their metered responses (the mirror)."""

    def on_request(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        request_id: str,
    ) -> object | None:
        """Called once the body is read, before forwarding. O(candidates), never awaits; in a
        worker it never parses `body` and copies it at most once, into the bounded channel.
        Returns a token for `on_response`, or None when nothing was mirrored."""

    def on_response(self, token: object, result: MeterResult, error_kind: str | None) -> None:
        """Called once the production response is over (complete, failed or aborted)."""


class ObservationSink(Protocol):
    """Accepts finished records; never blocks (a bounded queue that drops and counts)."""

    def put_exchange(self, record: ExchangeRecord) -> None: ...

    def put_observation(self, record: ObservationRecord) -> None: ...


class RampSink(Protocol):
    """Receives one record per request of an open rollout (the ramp's live evidence); in a
    worker it is the hand-off to the mirror process. Never blocks: drops and counts when full."""

    def put_ramp(
        self,
        generation: int,
        arm: int,
        session: int,
        status: int,
        error_kind: str | None,
        ttft_s: float,
        e2e_s: float,
        finished: bool,
        at: float,
    ) -> None:
        """`session`: the unsalted xxh3_64 of the session key as a signed int64; `ttft_s` and
        `e2e_s` NaN when absent; `finished`: the stream's final event was delivered; `at`:
        time.time() at the end."""


class RolloutGuard(Protocol):
    """Makes a worker's guard trip durable and pushed to every replica (a storage rollback with
    `expected_generation`, which NOTIFYs). Called at most once per generation, on the loop, on
    the request path, after this worker already rolled back: it schedules the write (an owned
    task), never awaits it."""

    def trip(self, generation: int, reason: str, evidence: dict[str, object]) -> None: ...
