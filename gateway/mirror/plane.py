"""The mirror plane: what the host's mirror process runs (rings, lanes, metering, the writer).

One mirror process per host serves every worker. It listens on a Unix socket; each worker
connects once and writes COPY / RESULT / RELOAD / IDLE / ELIGIBLE / RAMP frames
(`gateway.mirror.channel.frames`), which the connection's protocol dispatches in the read's own
callback (`_WorkerConnection`: no stream reader or task woken per read). The plane turns a COPY
into `Mirror.on_request` (body parsing, session keys, turn indexes, model overrides, rings and
lanes all happen here, never on a production loop), keeps the returned token until the worker's
RESULT for that exchange arrives, then hands the exchange and production's observation to the
storage writer. A RAMP frame (one request of an open rollout) becomes a `RolloutRecord` with its
turn and this host's replica (`gateway.mirror.evidence`), for the same writer. It runs its own
registry (polling, and reloading at once when a worker says RELOAD), saves its copy accounting
under its own replica name, and sends every worker a STATS frame about twice a second, which is
how workers export the mirror's metrics and the admin API shows its counters.

It is also the host's rate controller (`target_rps`): the workers' ELIGIBLE counts are the
host's eligible rate, and every change of the sampling references goes to every worker in a
RATES frame (and to each worker when it connects) naming the instant it applies.

It must never be awaited by a worker, and it never writes to a worker more than a STATS frame
backlog of `_STATS_BACKLOG` bytes (a worker that does not read misses stats, nothing else; a
RATES frame, tiny and rare, is always sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, cast

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy
from sqlalchemy.ext.asyncio import AsyncEngine

from domain import errors
from domain.endpoint import Endpoint
from domain.exposition import Exposed, Family, render
from domain.records import ExchangeRecord
from gateway.config.sections import GatewayConfig
from gateway.control.registry import Registry, Snapshot
from gateway.credentials import REFUSALS
from gateway.mirror.capture import CaptureSink, capture_from_config, capture_writer_for
from gateway.mirror.channel import frames
from gateway.mirror.evidence import RolloutEvidence
from gateway.mirror.replay.splits import SplitWatch
from gateway.mirror.tee import Mirror
from gateway.server.hooks import LiveTarget
from storage import queries
from storage.engine import make_engine
from storage.writer import ObservationWriter

__all__ = ["serve_plane"]

log = logging.getLogger("canary.mirror.plane")

PROCESS_INFO: Final = Family(
    "canary_mirror_process_info",
    "gauge",
    "The mirror process and the priority it runs at.",
    ("pid", "priority"),
)
PLANE_EVENTS: Final = Family(
    "canary_mirror_plane_total", "counter", "Mirror-process frame events, by event.", ("event",)
)
RESULTS_WAITING: Final = Family(
    "canary_mirror_results_waiting", "gauge", "Copies whose production result is due."
)
_STATS_INTERVAL_S: Final = 0.5
_STATS_BACKLOG: Final = 1 << 20  # bytes of unread STATS per worker before we skip sending
_encode = msgspec.msgpack.Encoder().encode
_decode_copy = msgspec.msgpack.Decoder(frames.CopyMeta).decode
_decode_result = msgspec.msgpack.Decoder(frames.ResultMeta).decode
_decode_idle = msgspec.msgpack.Decoder(frames.IdleMeta).decode
_decode_eligible = msgspec.msgpack.Decoder(frames.EligibleMeta).decode
_decode_metrics = msgspec.msgpack.Decoder(frames.MetricsMeta).decode


class _Stored:
    """The mirror's `ObservationSink` (and `GradingSink`, `LabelSink`): the writer's, and each
    exchange's session told to the split-session watch (this replica's sessions, without reading
    them back from the store)."""

    __slots__ = ("put_grading", "put_label_item", "put_observation", "splits", "writer")

    def __init__(self, writer: ObservationWriter, splits: SplitWatch) -> None:
        self.writer = writer
        self.splits = splits
        self.put_observation = writer.put_observation
        self.put_grading = writer.put_grading
        self.put_label_item = writer.put_label_item

    def put_exchange(self, record: ExchangeRecord) -> None:
        self.writer.put_exchange(record)
        self.splits.stored(record.session_key, record.received_at)


def rates_frame(msg: frames.RatesMeta) -> bytes:
    meta = _encode(msg)
    return frames.frame_header(frames.KIND_RATES, len(meta), 0) + meta


class _Plane:
    """The mirror core behind the socket: frames in, records to the writer, stats out."""

    def __init__(
        self,
        results_max: int,
        mirror: Mirror,
        writer: ObservationWriter,
        priority: str,
        *,
        capture: CaptureSink | None = None,
        evidence: RolloutEvidence | None = None,
    ) -> None:
        self.results_max = results_max  # [mirror] results_max
        self.capture = capture
        self.mirror = mirror
        self.writer = writer
        self.priority = priority
        self.tokens: OrderedDict[str, object] = OrderedDict()
        self.counts = {
            "copies": 0,
            "results": 0,
            "results_lost": 0,
            "results_unmatched": 0,
            "ramp_ignored": 0,
            "metrics_refused": 0,
        }
        # Each connected worker's last METRICS (its own series), relayed in every STATS frame.
        self.worker_metrics: dict[int, frames.MetricsMeta] = {}
        self.conns: set[asyncio.Transport] = set()  # the workers' connections
        self.reload = asyncio.Event()
        self.ready = asyncio.Event()
        self.idle_tasks: set[asyncio.Task[None]] = set()
        mirror.adaptive.on_change = self.send_rates
        self.splits: SplitWatch | None = None
        # RAMP frames -> the writer; None: the frames are counted `ramp_ignored`.
        self.evidence = evidence

    def on_copy(self, meta: bytes, body: bytes) -> None:
        m = _decode_copy(meta)
        self.counts["copies"] += 1
        headers = CIMultiDictProxy(CIMultiDict(m.headers))
        token = self.mirror.on_request(
            m.method,
            m.path_qs,
            headers,
            body,
            m.request_id,
            exchange_id=m.exchange_id,
            live_name=m.live_name,
            received_at=m.received_at,
            only=m.chosen or None,
            check=m.check,
            # Stored under this host's name, not the worker's: the workers of a host share this
            # process, which keeps a session's turns in order, so only another host splits one.
        )
        if token is None:
            return
        self.tokens[m.exchange_id] = token
        while len(self.tokens) > self.results_max:
            self.tokens.popitem(last=False)  # its worker died or dropped the result
            self.counts["results_lost"] += 1

    def on_result(self, meta: bytes) -> None:
        m = _decode_result(meta)
        token = self.tokens.pop(m.exchange_id, None)
        if token is None:
            self.counts["results_unmatched"] += 1
            return
        self.counts["results"] += 1
        self.mirror.on_response(token, m.result, m.error_kind)

    async def answer_idle(self, writer: asyncio.Transport, seq: int) -> None:
        await self.mirror.wait_idle()
        if not writer.is_closing():
            meta = _encode(frames.IdleMeta(seq))
            writer.write(frames.frame_header(frames.KIND_IDLE_ACK, len(meta), 0) + meta)

    def attach(self, transport: asyncio.Transport) -> None:
        """A worker's connection, once the plane is ready: the references in force (or due)
        first, so the worker samples as the others do before it serves, then the stats, so its
        first /metrics already has the mirror."""
        self.conns.add(transport)
        transport.write(rates_frame(self.mirror.adaptive.msg))
        transport.write(self.stats_frame())

    def detach(self, transport: asyncio.Transport) -> None:
        self.conns.discard(transport)
        self.worker_metrics.pop(id(transport), None)  # its series go stale, not frozen
        self.mirror.adaptive.control.eligible.forget(id(transport))
        self.mirror.channel.forget(id(transport))

    def _frames(self, view: memoryview, writer: asyncio.Transport) -> int:
        """Dispatch each complete frame in `view`; the bytes they took."""
        head, unpack = frames.FRAME.size, frames.FRAME.unpack_from
        pos, end = 0, len(view)
        while end - pos >= head:
            kind, mlen, blen = unpack(view, pos)
            start = pos + head
            stop = start + mlen + blen
            if stop > end:
                break
            meta = bytes(view[start : start + mlen])
            body = bytes(view[start + mlen : stop]) if blen else b""
            pos = stop
            try:
                self.dispatch(kind, meta, body, writer)
            except (msgspec.DecodeError, msgspec.ValidationError, struct.error):
                log.warning("dropped a malformed frame", extra={"fields": {"kind": kind}})
        return pos

    def dispatch(self, kind: int, meta: bytes, body: bytes, writer: asyncio.Transport) -> None:
        if kind == frames.KIND_COPY:
            self.on_copy(meta, body)
        elif kind == frames.KIND_ROLLOUT:
            if self.evidence is None:
                self.counts["ramp_ignored"] += 1
            else:
                self.evidence.on_frame(meta)
        elif kind == frames.KIND_RESULT:
            self.on_result(meta)
        elif kind == frames.KIND_ELIGIBLE:
            m = _decode_eligible(meta)
            eligible = self.mirror.adaptive.control.eligible
            now = time.monotonic()
            eligible.report(id(writer), m.count, m.interval_s, now)
            self.mirror.channel.report(id(writer), m.channel_fill, now)
        elif kind == frames.KIND_METRICS:
            if len(meta) > frames.METRICS_MAX_BYTES:
                self.counts["metrics_refused"] += 1
            else:
                self.worker_metrics[id(writer)] = _decode_metrics(meta)
        elif kind == frames.KIND_RELOAD:
            self.reload.set()
        elif kind == frames.KIND_IDLE:
            task = asyncio.get_running_loop().create_task(
                self.answer_idle(writer, _decode_idle(meta).seq), name="mirror-idle-ack"
            )
            self.idle_tasks.add(task)
            task.add_done_callback(self.idle_tasks.discard)

    def stats_frame(self) -> bytes:
        mirror = self.mirror
        items: list[Exposed] = [
            *mirror.prometheus_lines(),
            *self.writer.prometheus_lines(),
            *self._own_lines(),
        ]
        if self.splits is not None:
            items.extend(self.splits.prometheus_lines())
        if self.capture is not None:
            items.extend(self.capture.prometheus_lines())
        # The lanes read candidate credentials here, in the mirror process: its refusals count.
        items.extend(REFUSALS.prometheus_lines())
        lines = render(items)
        meta = _encode(
            frames.StatsMeta(
                pid=os.getpid(),
                priority=self.priority,
                counters=mirror.counters(),
                process={**mirror.process_counters(), **self.counts, **self._evidence_counts()},
                writer=self.writer.stats(),
                prometheus="\n".join(lines),
                rates=mirror.rate_stats(),
                workers={m.worker: m.text for m in self.worker_metrics.values()},
            )
        )
        return frames.frame_header(frames.KIND_STATS, len(meta), 0) + meta

    def _evidence_counts(self) -> dict[str, int]:
        return dict(self.evidence.counts) if self.evidence is not None else {}

    def send_rates(self, msg: frames.RatesMeta) -> None:
        """A new reference to every worker (tiny, sent even past the stats backlog: a worker
        that misses it samples differently from the others)."""
        frame = rates_frame(msg)
        for conn in list(self.conns):
            if not conn.is_closing():
                conn.write(frame)

    def _own_lines(self) -> list[Exposed]:
        out: list[Exposed] = [
            PROCESS_INFO.sample(1, str(os.getpid()), str(self.priority)),
            PLANE_EVENTS,
        ]
        counts = {**self.counts, **self._evidence_counts()}
        out.extend(PLANE_EVENTS.sample(v, k) for k, v in counts.items())
        out.append(RESULTS_WAITING.sample(len(self.tokens)))
        return out

    async def broadcast(self) -> None:
        while True:
            await asyncio.sleep(_STATS_INTERVAL_S)
            if not self.conns:
                continue
            frame = self.stats_frame()
            for conn in list(self.conns):
                if not conn.is_closing() and conn.get_write_buffer_size() < _STATS_BACKLOG:
                    conn.write(frame)


class _WorkerConnection(asyncio.Protocol):
    """One worker's connection: every complete frame a read brought is dispatched in the read's
    own callback (no stream reader, no task woken per read); a partial frame waits in `buf`.
    Until the plane is ready the connection is not read (the worker's frames wait in the
    socket, then in its own bounded buffer)."""

    def __init__(self, plane: _Plane) -> None:
        self.plane = plane
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's is not an asyncio.Transport subclass, but has its API).
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        plane = self.plane
        if plane.ready.is_set():
            plane.attach(transport)
            return
        transport.pause_reading()
        task = asyncio.get_running_loop().create_task(self._attach_when_ready(transport))
        plane.idle_tasks.add(task)
        task.add_done_callback(plane.idle_tasks.discard)

    async def _attach_when_ready(self, transport: asyncio.Transport) -> None:
        await self.plane.ready.wait()
        if not transport.is_closing():
            self.plane.attach(transport)
            transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        buf = self.buf
        if buf:
            buf += data
            with memoryview(buf) as view:
                done = self.plane._frames(view, transport)
            del buf[:done]
            return
        # Most reads hold whole frames: read them in place, keep only a partial tail.
        with memoryview(data) as view:
            done = self.plane._frames(view, transport)
        if done < len(data):
            buf += data[done:]

    def connection_lost(self, exc: Exception | None) -> None:
        # EOF (a partial frame left in `buf` was never complete) or a reset.
        if self.transport is not None:
            self.plane.detach(self.transport)
            self.transport = None
        self.buf.clear()


async def _reloads(plane: _Plane, registry: Registry) -> None:
    while True:
        await plane.reload.wait()
        plane.reload.clear()
        await registry.refresh()


async def _flush_counters(
    engine: AsyncEngine, replica: str, mirror: Mirror, every_s: float
) -> None:
    while True:
        await asyncio.sleep(every_s)
        with contextlib.suppress(errors.StorageError):  # the next flush carries the totals
            await queries.upsert_counters(engine, replica, mirror.counters())


async def _owned(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def serve_plane(
    config: GatewayConfig,
    socket_path: str,
    replica: str,
    priority: str,
    ready: Callable[[], None],
    stop: asyncio.Event,
) -> None:
    """Run the mirror plane until `stop` is set, then: wait for workers to close their channels
    (up to `server.drain_timeout_s`), drain the lanes, save the counters, flush the writer.
    The mirror process's wiring: it hands each part the sections it uses."""
    engine = make_engine(config.storage.db_url)
    writer = ObservationWriter(
        engine,
        batch_size=config.storage.writer_batch_size,
        flush_interval_s=config.storage.writer_flush_interval_s,
        queue_max=config.storage.writer_queue_max,
        store_text=config.storage.store_text,
        store_text_max_chars=config.storage.store_text_max_chars,
        evidence_queue_max=config.rollout.evidence_queue_max,
    )
    placeholder = Endpoint(name=config.live.name, url="http://127.0.0.1:9", role="live")
    live = LiveTarget(placeholder)
    # Capture (opt-in): bodies of sampled conversations for `canary capacity`, written by a
    # bounded writer of its own in this (the mirror) process, never on a worker's loop.
    capture = capture_from_config(config.capture)
    capture_writer = (
        capture_writer_for(engine, capture, config.capture, config.storage)
        if capture is not None
        else None
    )
    splits = SplitWatch(engine, replica, config.storage.counters_flush_interval_s)
    # The workers count the eligible requests (this process sees only the sampled ones).
    mirror = Mirror(
        live,
        _Stored(writer, splits),
        replica,
        mirror=config.mirror,
        upstream=config.upstream,
        storage=config.storage,
        credentials=config.credentials,
        session_header=config.server.session_header,
        drain_timeout_s=config.server.drain_timeout_s,
        capture=capture,
    )
    # Ramp evidence: each session's turns (a bounded table), records to the writer's own queue.
    evidence = RolloutEvidence(writer.put_rollout, replica)
    plane = _Plane(
        config.mirror.results_max, mirror, writer, priority, capture=capture, evidence=evidence
    )
    plane.splits = splits

    def on_change(snapshot: Snapshot) -> None:
        mirror.apply(snapshot.candidates)

    registry = Registry(
        engine, live, poll_interval_s=config.storage.registry_poll_interval_s, on_change=on_change
    )
    mirror.on_unknown_candidate = registry.poke
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(lambda: _WorkerConnection(plane), socket_path)
    tasks: tuple[asyncio.Task[None], ...] = ()
    # Everything started from here on is closed in `finally`, also when a start-up step fails
    # (the writers' tasks, the engine's connections): a failed start leaves nothing running.
    try:
        await writer.start()
        if capture_writer is not None:
            await capture_writer.start()
        await mirror.start()
        ready()
        # Workers seed the registry; until the live endpoint exists there is nothing to mirror.
        while not stop.is_set():
            try:
                await registry.start(seed_live=None)
                break
            except errors.StorageError:
                await asyncio.sleep(0.1)
        plane.ready.set()
        tasks = (
            loop.create_task(plane.broadcast(), name="mirror-stats"),
            loop.create_task(_reloads(plane, registry), name="mirror-reload"),
            loop.create_task(
                _flush_counters(engine, replica, mirror, config.storage.counters_flush_interval_s),
                name="mirror-counters",
            ),
            loop.create_task(plane.splits.run(), name="mirror-splits"),
        )
        await stop.wait()
        log.info("mirror process stopping", extra={"fields": {"workers": len(plane.conns)}})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(config.server.drain_timeout_s):
                while plane.conns:  # noqa: ASYNC110 - workers close on their own schedule
                    await asyncio.sleep(0.02)
    finally:
        server.close()
        await _owned(*tasks, *plane.idle_tasks)
        await mirror.close()
        plane.counts["results_lost"] += len(plane.tokens)
        plane.tokens.clear()
        with contextlib.suppress(errors.StorageError):
            await queries.upsert_counters(engine, replica, mirror.counters())
        await registry.close()
        await writer.close(config.server.drain_timeout_s)
        if capture_writer is not None:
            await capture_writer.close(config.server.drain_timeout_s)
        await engine.dispose()
