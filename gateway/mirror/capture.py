"""Capture: the opt-in, bounded `CaptureSink` that keeps a sample of mirrored request bodies so
`canary capacity` can replay whole conversations.

`offer` is called once per exchange whose copy a ring accepted, when production's answer ended:
synchronous, O(1), never blocks, never raises, never parses or copies the body. It decides by
conversation (`xxh3_64(salt + session key) < share`, so a conversation is captured whole or not
at all), checks the candidate filter, the per-body limit and the byte budget, and queues a
reference to the body, bounded by `[capture] queue_max`. Every refusal is counted by reason.

`take` (called by the capture writer's task, off the request path) redacts what it takes: the
configured JSON fields of the body and the secret headers (`Authorization` always). This module
never does IO and never logs a body or a header value (`capture_writer_for` only builds the
storage-side writer).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec
import xxhash

from domain.capture import CaptureRecord
from domain.exposition import Exposed, Family
from domain.records import ExchangeRecord

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from gateway.config.sections import CaptureConfig, StorageConfig
    from storage.capacity.captures import CaptureWriter

__all__ = ["REDACTED", "CaptureSink", "redact_body", "redact_headers", "session_captured"]

REDACTED: Final = "[redacted]"
# A salt of its own: which conversations are captured is independent of which are mirrored.
CAPTURE_SALT: Final = b"canary-capture-v1\0"
_TWO_64: Final = float(2**64)
# Never stored whatever the configuration says: they carry credentials.
ALWAYS_REDACTED_HEADERS: Final = frozenset({"authorization", "proxy-authorization"})
# Connection-level headers say nothing about the request a replay must send.
_HOP_BY_HOP: Final = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host"}
)
COUNTER_KEYS: Final = (
    "offered",
    "captured",
    "not_sampled",
    "not_targeted",
    "refused_oversize",
    "refused_budget",
    "refused_queue_full",
    "refused_unparseable",
    "offer_errors",
    "written",
    "write_failed",
    "purged",
)
CAPTURE_TOTAL: Final = Family(
    "canary_capture_total",
    "counter",
    "Captured request bodies, and refusals by reason.",
    ("outcome",),
)
CAPTURE_BYTES: Final = Family(
    "canary_capture_bytes",
    "gauge",
    "Bytes of bodies stored (inside retention) or queued.",
    ("state",),
)

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def session_captured(session_key: str, share: float) -> bool:
    """The documented decision: xxh3_64(CAPTURE_SALT + session key) / 2**64 < share."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    return xxhash.xxh3_64_intdigest(CAPTURE_SALT + session_key.encode()) / _TWO_64 < share


def _redact(node: Any, path: Sequence[str]) -> None:
    if not path:
        return
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        keys: Iterable[str] = list(node) if head == "*" else ([head] if head in node else [])
        for key in keys:
            if rest:
                _redact(node[key], rest)
            else:
                node[key] = REDACTED
    elif isinstance(node, list) and head == "*":
        for i, item in enumerate(node):
            if rest:
                _redact(item, rest)
            else:
                node[i] = REDACTED


def redact_body(body: bytes, fields: Sequence[Sequence[str]]) -> str | None:
    """The body as JSON text with each field path (`user`, `metadata.*`, `messages.*.name`)
    replaced by "[redacted]"; None when the body is not a JSON object."""
    try:
        doc = _decoder.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    for path in fields:
        _redact(doc, path)
    return _encoder.encode(doc).decode()


def redact_headers(headers: Mapping[str, str], secret: frozenset[str]) -> str:
    """Headers as a JSON object (lower-case names), secrets replaced, hop-by-hop ones dropped."""
    kept: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in _HOP_BY_HOP:
            continue
        kept[low] = REDACTED if low in secret or low in ALWAYS_REDACTED_HEADERS else value
    return _encoder.encode(kept).decode()


class _Pending:
    __slots__ = ("answered_at", "body", "exchange", "headers")

    def __init__(
        self, exchange: ExchangeRecord, body: bytes, headers: Mapping[str, str], at: float
    ) -> None:
        self.exchange = exchange
        self.body = body
        self.headers = headers
        self.answered_at = at


class CaptureSink:
    """Implements the mirror's `CaptureSink` protocol; see the module docstring."""

    def __init__(
        self,
        *,
        share: float,
        max_bytes: int,
        max_body_bytes: int,
        queue_max: int,
        candidates: Sequence[str] = (),
        redact_fields: Sequence[str] = (),
        redact_headers: Sequence[str] = (),
    ) -> None:
        self.share = share
        # Bounds what capture may store in total (bytes of bodies inside the retention age);
        # beyond it new bodies are refused and counted until the purge frees room.
        self.max_bytes = max_bytes
        # One huge body must not eat the whole budget; refused and counted.
        self.max_body_bytes = max_body_bytes
        # Bounds the memory held while the database is slow: bodies waiting to be written.
        self.queue_max = queue_max
        self.candidates = frozenset(candidates)
        self.fields = tuple(tuple(f.split(".")) for f in redact_fields if f)
        self.secret_headers = frozenset(h.lower() for h in redact_headers)
        self.stored_bytes = 0  # bytes in the database inside the retention age (refreshed)
        self.queued_bytes = 0
        self._queue: deque[_Pending] = deque()
        self.counts = dict.fromkeys(COUNTER_KEYS, 0)

    # ---- the sink: on the request path, O(1), never raises
    def offer(self, exchange: ExchangeRecord, body: bytes, headers: Mapping[str, str]) -> None:
        counts = self.counts
        try:
            counts["offered"] += 1
            if self.candidates and self.candidates.isdisjoint(exchange.targets):
                counts["not_targeted"] += 1
                return
            if not session_captured(exchange.session_key or exchange.id, self.share):
                counts["not_sampled"] += 1
                return
            size = len(body)
            if size > self.max_body_bytes:
                counts["refused_oversize"] += 1
                return
            if self.stored_bytes + self.queued_bytes + size > self.max_bytes:
                counts["refused_budget"] += 1
                return
            if len(self._queue) >= self.queue_max:
                counts["refused_queue_full"] += 1
                return
            self._queue.append(_Pending(exchange, body, headers, time.time()))
            self.queued_bytes += size
            counts["captured"] += 1
        except Exception:  # a capture problem must never reach production's answer
            counts["offer_errors"] += 1

    # ---- the writer's side, off the request path
    def take(self, limit: int) -> list[CaptureRecord]:
        """Up to `limit` queued captures, redacted (bodies that are not JSON are dropped)."""
        return list(self._take(limit))

    def _take(self, limit: int) -> Iterator[CaptureRecord]:
        queue = self._queue
        while queue and limit > 0:
            item = queue.popleft()
            size = len(item.body)
            self.queued_bytes -= size
            limit -= 1
            body = redact_body(item.body, self.fields)
            if body is None:
                self.counts["refused_unparseable"] += 1
                continue
            self.stored_bytes += size  # counted as stored until the next refresh says otherwise
            ex = item.exchange
            yield CaptureRecord(
                exchange_id=ex.id,
                session_key=ex.session_key or ex.id,
                turn_index=ex.turn_index,
                received_at=ex.received_at,
                answered_at=item.answered_at,
                route=ex.route,
                model=ex.model,
                targets=ex.targets,
                body=body,
                headers=redact_headers(item.headers, self.secret_headers),
                body_bytes=size,
            )

    @property
    def depth(self) -> int:
        return len(self._queue)

    def set_stored_bytes(self, value: int) -> None:
        """The writer's refresh of what the database holds inside the retention age."""
        self.stored_bytes = max(0, value)

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def prometheus_lines(self) -> Iterable[Exposed]:
        yield CAPTURE_TOTAL
        for key in COUNTER_KEYS:
            yield CAPTURE_TOTAL.sample(self.counts[key], key)
        yield CAPTURE_BYTES.sample(self.stored_bytes, "stored")
        yield CAPTURE_BYTES.sample(self.queued_bytes, "queued")
        yield CAPTURE_BYTES.sample(self.max_bytes, "limit")


def capture_from_config(config: CaptureConfig) -> CaptureSink | None:
    """The sink the configuration asks for, or None when capture is off."""
    if not config.enabled or config.share <= 0:
        return None
    return CaptureSink(
        share=config.share,
        max_bytes=config.max_bytes,
        max_body_bytes=config.max_body_bytes,
        queue_max=config.queue_max,
        candidates=config.candidates,
        redact_fields=config.redact_fields,
        redact_headers=config.redact_headers,
    )


def capture_writer_for(
    engine: AsyncEngine, sink: CaptureSink, config: CaptureConfig, storage: StorageConfig
) -> CaptureWriter:
    """The bounded writer that drains `sink` (its own task, off the request path)."""
    from storage.capacity.captures import CaptureWriter

    return CaptureWriter(
        engine,
        sink.take,
        batch_size=storage.writer_batch_size,
        flush_interval_s=storage.writer_flush_interval_s,
        retention_s=config.retention_s,
        # Purging is a DELETE plus a SUM: once a minute is plenty against a days-long retention.
        purge_interval_s=min(60.0, config.retention_s),
        on_stored_bytes=sink.set_stored_bytes,
        on_count=sink.count,
    )
