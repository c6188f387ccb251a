"""The wire between a worker and the mirror process: frame layout and message types (pure).

One frame is a 9-byte header `!BII` (kind, meta length, body length), a msgpack `meta` and the
raw body bytes (only copies carry a body). Bodies are never re-encoded: the worker hands the
bytes it already read to the socket and the mirror process reads them back as one `bytes`.

Worker -> mirror: COPY (a sampled or undecided request), RESULT (production's meter result for
a copy that was handed off), RELOAD (the registry moved), IDLE (answer IDLE_ACK once every copy
before it is finished), ELIGIBLE (about once a second: how many requests on mirrored routes the
worker served, sampled or not), RAMP (one request of an open rollout: its arm, session and
outcome, a `domain.records.RolloutRequest` struct-packed in a fixed 45-byte meta whose layout is
derived from that declaration; no msgpack, no body), METRICS (with several workers, about once
a second: the worker's own series, rendered and labelled). Mirror -> worker: STATS (host-wide
counters and metrics, and every worker's last METRICS text), IDLE_ACK, RATES (the adaptive
sampling references and the instant they apply, and the capacity shares of an overloaded
mirror; sent on connect and whenever they change). This module never does IO.
"""

from __future__ import annotations

import math
import struct
from typing import Final

import msgspec

from domain.observation import Field, describe
from domain.outcomes import ERROR_KINDS, ErrorKind
from domain.records import RolloutRequest
from gateway.server.meter import MeterResult

__all__ = [
    "FRAME",
    "KIND_COPY",
    "KIND_ELIGIBLE",
    "KIND_IDLE",
    "KIND_IDLE_ACK",
    "KIND_METRICS",
    "KIND_RATES",
    "KIND_RELOAD",
    "KIND_RESULT",
    "KIND_ROLLOUT",
    "KIND_STATS",
    "ROLLOUT_FRAME",
    "ROLLOUT_LAYOUT",
    "ROLLOUT_META",
    "CopyMeta",
    "EligibleMeta",
    "IdleMeta",
    "MetricsMeta",
    "RatesMeta",
    "ResultMeta",
    "RolloutLayout",
    "StatsMeta",
    "frame_header",
    "rollout_error_kind",
    "rollout_frame",
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
KIND_ROLLOUT: Final = 9
KIND_METRICS: Final = 10
# The longest METRICS text the mirror process relays (bytes): a worker's series with every
# candidate and histogram are tens of kilobytes; past it the text is refused and counted.
METRICS_MAX_BYTES: Final = 1 << 20


def _code(field: Field) -> str:
    """A declared field's packed form: an integer by its width (8 and 16 bits unsigned, 64
    signed, else 32 signed), a float a double (None as NaN), a bool a byte, a string an error
    kind's code (0 = none, else 1 + its index in domain.outcomes.ERROR_KINDS)."""
    if field.type is int:
        return {8: "B", 16: "H", 64: "q"}.get(field.quantity.bits, "i")
    return {float: "d", bool: "?", str: "B"}[field.type]


class RolloutLayout:
    """The RAMP meta's packed layout, derived from a declared request record (one field after
    another, in declaration order): `pack` and `unpack` are the only conversions between the
    record (None where absent) and the wire (NaN, code 0)."""

    __slots__ = ("_clamp", "_codes", "_floats", "cls", "meta", "names")

    def __init__(self, cls: type[msgspec.Struct]) -> None:
        fields = describe(cls)
        self.cls = cls
        self.names = tuple(f.name for f in fields)
        self.meta = struct.Struct("!" + "".join(_code(f) for f in fields))
        self._floats = tuple(i for i, f in enumerate(fields) if f.type is float and f.nullable)
        self._codes = tuple(i for i, f in enumerate(fields) if f.type is str)
        # Unsigned fields are clamped into their range (a status above 65535 is none of HTTP's).
        self._clamp = tuple(
            (i, (1 << f.quantity.bits) - 1)
            for i, f in enumerate(fields)
            if f.type is int and f.quantity.bits in (8, 16)
        )

    def values(self, record: msgspec.Struct) -> list[object]:
        """The record's packed values, in layout order (a record of exactly `cls`; about
        0.2 µs for RolloutRequest, the worker's cost per request of an open rollout)."""
        out: list[object] = list(_astuple(record))
        for i in self._floats:
            if out[i] is None:
                out[i] = _NAN
        for i in self._codes:
            kind = out[i]
            out[i] = 0 if kind is None else _ERROR_CODES.get(kind, _OTHER)  # type: ignore[call-overload]
        for i, top in self._clamp:
            value = out[i]
            if not 0 <= value <= top:  # type: ignore[operator]
                out[i] = min(max(value, 0), top)  # type: ignore[call-overload]
        return out

    def fields(self, meta: bytes) -> dict[str, object]:
        """A packed meta's fields by name (NaN back to None, a code back to its error kind);
        raises struct.error when it is not one."""
        values: list[object] = list(self.meta.unpack(meta))
        for i in self._floats:
            if values[i] != values[i]:  # NaN
                values[i] = None
        for i in self._codes:
            values[i] = rollout_error_kind(values[i])  # type: ignore[arg-type]
        return dict(zip(self.names, values, strict=True))


_NAN: Final = math.nan
_astuple: Final = msgspec.structs.astuple
_ERROR_CODES: Final = {kind.value: n for n, kind in enumerate(ERROR_KINDS, 1)}
_OTHER: Final = _ERROR_CODES[ErrorKind.OTHER.value]
ROLLOUT_LAYOUT: Final = RolloutLayout(RolloutRequest)
# A RAMP frame's meta, as declared by domain.records.RolloutRequest.
ROLLOUT_META: Final = ROLLOUT_LAYOUT.meta
# Header and meta packed in one call on the worker (the body is always empty).
ROLLOUT_FRAME: Final = struct.Struct("!BII" + ROLLOUT_META.format[1:])


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
    """Requests on mirrored routes this worker served (sampled or not) over `interval_s`, and
    the lowest occupancy of its channel over that time (bytes not yet taken by the mirror
    process over `channel_max_bytes`; `gateway.mirror.sampling.capacity.ChannelFill`)."""

    count: int
    interval_s: float
    channel_fill: float = 0.0


class MetricsMeta(msgspec.Struct, array_like=True, frozen=True):
    """One worker's own series, rendered with its `worker` label (the value is `worker`)."""

    worker: str
    text: str


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
    # Each worker's last METRICS text, by its `worker` label value (several workers only).
    workers: dict[str, str] = msgspec.field(default_factory=dict)


def frame_header(kind: int, meta_len: int, body_len: int) -> bytes:
    return FRAME.pack(kind, meta_len, body_len)


def headers_nbytes(headers: list[tuple[str, str]]) -> int:
    """Bytes a copy's header list holds (names and values, as sent)."""
    return sum(len(k) + len(v) + 4 for k, v in headers)


def rollout_frame(request: RolloutRequest) -> bytes:
    """One RAMP frame, header included (an unknown error kind travels as `other`)."""
    return ROLLOUT_FRAME.pack(KIND_ROLLOUT, ROLLOUT_META.size, 0, *ROLLOUT_LAYOUT.values(request))


def rollout_error_kind(code: int) -> str | None:
    """The error kind a RAMP frame's code names (None: the request did not fail)."""
    return None if code == 0 else ERROR_KINDS[code - 1].value
