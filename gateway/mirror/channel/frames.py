"""The wire between a worker and the mirror process: frame layout and message types (pure).

One frame is a 9-byte header `!BII` (kind, meta length, body length), a msgpack `meta` and the
raw body bytes (only copies carry a body). Bodies are never re-encoded: the worker hands the
bytes it already read to the socket and the mirror process reads them back as one `bytes`.

Worker -> mirror: COPY (a sampled or undecided request), RESULT (production's meter result for
a copy that was handed off), RELOAD (the registry moved), IDLE (answer IDLE_ACK once every copy
before it is finished), ELIGIBLE (about once a second: how many requests on mirrored routes the
worker served, sampled or not), RAMP (one request of an open rollout: its arm, session and
outcome, struct-packed in a fixed 45-byte meta, no msgpack, no body). Mirror -> worker: STATS
(host-wide counters and metrics), IDLE_ACK, RATES (the adaptive sampling references and the
instant they apply, and the capacity shares of an overloaded mirror; sent on connect and
whenever they change). This module never does IO.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

from domain.outcomes import ERROR_KINDS, ErrorKind
from gateway.server.meter import MeterResult

__all__ = [
    "FRAME",
    "KIND_COPY",
    "KIND_ELIGIBLE",
    "KIND_IDLE",
    "KIND_IDLE_ACK",
    "KIND_RAMP",
    "KIND_RATES",
    "KIND_RELOAD",
    "KIND_RESULT",
    "KIND_STATS",
    "RAMP",
    "RAMP_FRAME",
    "CopyMeta",
    "EligibleMeta",
    "IdleMeta",
    "RatesMeta",
    "ResultMeta",
    "StatsMeta",
    "frame_header",
    "ramp_error_kind",
    "ramp_frame",
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
KIND_RAMP: Final = 9

# A RAMP frame's meta: generation, arm, session (signed xxh3_64), status, error code (0 = none,
# else 1 + its index in domain.outcomes.ERROR_KINDS), ttft_s, e2e_s, finished, at.
RAMP: Final = struct.Struct("!qBqHBdd?d")
# Header and meta packed in one call on the worker (the body is always empty).
RAMP_FRAME: Final = struct.Struct("!BII" + RAMP.format[1:])
_ERROR_CODES: Final = {kind.value: n for n, kind in enumerate(ERROR_KINDS, 1)}
_OTHER: Final = _ERROR_CODES[ErrorKind.OTHER.value]


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
    # Of `chosen`: later turns the worker could not decide under a capacity share (the mirror
    # process keeps them iff it admitted their session).
    check: list[str] = msgspec.field(default_factory=list)


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
    # Per candidate under a capacity limit (or recently): (share, lowest recent share).
    capacity: dict[str, tuple[float, float]] = msgspec.field(default_factory=dict)


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


def ramp_frame(
    generation: int,
    arm: int,
    session: int,
    status: int,
    error_kind: str | None,
    ttft_s: float,
    e2e_s: float,
    finished: bool,
    at: float,
) -> bytes:
    """One RAMP frame, header included (an unknown error kind travels as `other`)."""
    code = 0 if error_kind is None else _ERROR_CODES.get(error_kind, _OTHER)
    return RAMP_FRAME.pack(
        KIND_RAMP,
        RAMP.size,
        0,
        generation,
        arm,
        session,
        min(max(status, 0), 0xFFFF),
        code,
        ttft_s,
        e2e_s,
        finished,
        at,
    )


def ramp_error_kind(code: int) -> str | None:
    """The error kind a RAMP frame's code names (None: the request did not fail)."""
    return None if code == 0 else ERROR_KINDS[code - 1].value
