"""The seams between the proxy, the mirror and storage, as small protocols.

The proxy knows only `RequestTee` and `LiveTarget` (the registry swaps it); the ramp's own seams
are in `gateway.rollout.hooks`, and its candidate is a `LiveTarget` of the candidate
endpoint, held by the router's `Split.candidate`.
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
