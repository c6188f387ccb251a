"""The wire between a worker and the mirror process: frame layout and message types (pure).

One frame is a 9-byte header `!BII` (kind, meta length, body length), a msgpack `meta` and the
raw body bytes (only copies carry a body). Bodies are never re-encoded: the worker hands the
bytes it already read to the socket and the mirror process reads them back as one `bytes`.

Worker -> mirror: COPY (a sampled or undecided request), RESULT (production's meter result for
a copy that was handed off), RELOAD (the registry moved), IDLE (answer IDLE_ACK once every copy
before it is finished), ELIGIBLE (about once a second: how many requests on mirrored routes the
worker served, sampled or not). Mirror -> worker: STATS (host-wide counters and metrics),
IDLE_ACK, RATES (the adaptive sampling references and the instant they apply, sent on connect
and whenever they change). This module never does IO.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

from gateway.server.meter import MeterResult

__all__ = [
    "FRAME",
    "KIND_COPY",
    "KIND_ELIGIBLE",
    "KIND_IDLE",
    "KIND_IDLE_ACK",
    "KIND_RATES",
    "KIND_RELOAD",
    "KIND_RESULT",
    "KIND_STATS",
    "CopyMeta",
    "EligibleMeta",
    "IdleMeta",
    "RatesMeta",
    "ResultMeta",
    "StatsMeta",
    "frame_header",
]

FRAME: Final = struct.Struct("!BII")
KIND_COPY: Final = 1
KIND_RESULT: Final = 2
KIND_RELOAD: Final = 3
KIND_IDLE: Final = 4
KIND_STATS: Final = 5
KIND_IDLE_ACK: Final = 6
KIND_ELIGIBLE: Final = 7
KIND_RATES: Final = 8


class CopyMeta(msgspec.Struct, array_like=True, frozen=True):
    """What the mirror process needs to replay one request; `chosen` empty = it samples."""

    exchange_id: str
    method: str
    path_qs: str
    request_id: str
    received_at: float
    live_name: str
    worker: str
    headers: list[tuple[str, str]]
    chosen: list[str]
    session_value: str | None = None  # the session header's value, when present


class ResultMeta(msgspec.Struct, array_like=True, frozen=True):
    """Production's answer to a handed-off copy, joined on `exchange_id` by the mirror."""

    exchange_id: str
    error_kind: str | None
    result: MeterResult


class IdleMeta(msgspec.Struct, array_like=True, frozen=True):
    seq: int


class EligibleMeta(msgspec.Struct, array_like=True, frozen=True):
    """Requests on mirrored routes this worker served (sampled or not) over `interval_s`."""

    count: int
    interval_s: float


class RatesMeta(msgspec.Struct, array_like=True, frozen=True):
    """The adaptive sampling references (eligible req/s, per sampling mode) every worker uses
    from `apply_at` on (`time.monotonic()`, one clock for every process of the host); `seq`
    orders them within one mirror process's lifetime."""

    seq: int
    apply_at: float
    request_rps: float
    session_rps: float


class StatsMeta(msgspec.Struct, frozen=True):
    """The mirror process's view of the host, sent to every worker about twice a second."""

    pid: int
    priority: str
    counters: dict[str, dict[str, int]]
    process: dict[str, int]
    writer: dict[str, int]
    prometheus: str
    # Per candidate: target, effective share, realized copies/s, what changes cost (admin view).
    rates: dict[str, dict[str, float | None]] = msgspec.field(default_factory=dict)


def frame_header(kind: int, meta_len: int, body_len: int) -> bytes:
    return FRAME.pack(kind, meta_len, body_len)


def headers_nbytes(headers: list[tuple[str, str]]) -> int:
    """Bytes a copy's header list holds (names and values, as sent)."""
    return sum(len(k) + len(v) + 4 for k, v in headers)
