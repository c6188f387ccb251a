"""`Handoff`: the `RequestTee` a worker runs; hands sampled copies to the mirror process.

The production loop does only this per request: decide the sample from the request id or the
session header (`gateway.mirror.sampling.sampler.decide`: one xxh3 per candidate, no body parsing),
and
when a copy is chosen queue one frame (header, small msgpack meta, a reference to the body bytes
it already read) for a Unix stream socket toward the host's mirror process. Frames are written
together at most `_COALESCE_S` after the first and at most one write every `_WRITE_EVERY_S`
(one write and one wake-up of the mirror process per few copies).
The write is non-blocking: the bytes go to the kernel's socket buffer, and what the kernel cannot
take waits in the transport's buffer; queued and buffered bytes together are capped at
`[mirror] channel_max_bytes`. A copy that would pass the cap is `dropped_overflow`; one larger
than the cap or the mirror memory budget is `dropped_oversize` before a byte of it is copied;
while the mirror process is down every chosen copy is `dropped_overflow` (reason counted), and so
is every copy whose frame was still queued when the channel dropped. Nothing here
ever awaits the mirror process on the request path, parses a body, or logs per request.

A session-mode candidate without the session header on the request cannot be sampled without
parsing the body; such requests are handed off undecided (`chosen` empty) and the mirror process
parses the body and takes the same decision (`decide`, with the key it found). If that hand-off
fails the request is counted `undecided_dropped` (process-wide: it was perhaps not sampled at
all).

The worker's own counts (copies it chose but could not hand off) are stored under the worker's
replica name; the mirror process stores everything else under its own. Each row satisfies the
accounting identity on its own, so their sum does too.

Adaptive sampling (`target_rps`): the request path adds one to `eligible` for each request on a
mirrored route (sampled or not); a task sends the count to the mirror process about once a
second (ELIGIBLE). The mirror process answers with the sampling references (RATES) and the
instant they apply; this worker swaps its thresholds at that instant, as every other worker of
the host does, so a key's decision never depends on which worker served it.

Capacity shares: while the mirror process cannot keep up it lowers per-candidate capacity
shares (`gateway.mirror.sampling.capacity`) that arrive with the references and apply the same
way; a sampled copy whose hash is above its candidate's share is `shed_capacity` here, counted
before a frame is built (`decide_kept`): a sampling decision, not a lost copy. A later turn of a
session that a worker cannot decide alone goes to the mirror process in `check`. Telling a
later turn needs one byte search of the body (`"assistant"`), done only while some session-mode
candidate has a limit.

Ramp evidence (`put_rollout`, the worker's `gateway.rollout.hooks.RolloutSink`): each request of an
open rollout becomes one fixed-size RAMP frame (struct-packed, no body), queued with the other
frames under the same cap as production's results; while the channel is down or full it is
`ramp_dropped`, counted, never waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import msgspec
from multidict import CIMultiDictProxy

from domain.accounting import GAUGE_FIELDS, IDENTITY_FIELDS
from domain.endpoint import Endpoint
from domain.exposition import Exposed, Family
from domain.ids import uuid7
from domain.records import RolloutRequest
from gateway.config.sections import MirrorConfig
from gateway.mirror.channel import frames
from gateway.mirror.replay.lane import MIRROR_HEADER
from gateway.mirror.sampling import rate as rate_mod
from gateway.mirror.sampling.sampler import (
    Offer,
    apply_capacity,
    decide_kept,
    mirrored_route,
    offers_for,
)
from gateway.server.headers import COPY_SKIP
from gateway.server.hooks import LiveTarget
from gateway.server.meter import MeterResult

__all__ = ["Handoff"]

log = logging.getLogger("canary.mirror.handoff")

_encode = msgspec.msgpack.Encoder().encode
_decode_stats = msgspec.msgpack.Decoder(frames.StatsMeta).decode
_decode_idle = msgspec.msgpack.Decoder(frames.IdleMeta).decode
_decode_rates = msgspec.msgpack.Decoder(frames.RatesMeta).decode
_SKIP: Final = COPY_SKIP | {MIRROR_HEADER.lower()}
# Results and ramp evidence are tiny and must not be refused when copies fill the channel:
# they get this headroom.
_RESULT_HEADROOM: Final = 1 << 20
_RECONNECT_S: Final = 0.2
# Frames are written to the socket together, at most this long after the first of them: each
# write wakes the mirror process, and a wake-up across CPUs (an IPI; a VM exit on a virtual
# machine) costs the worker more than the frame itself. Copies may wait this long; production's
# own timings are taken before, on the worker, so they are unaffected.
_COALESCE_S: Final = 0.002
# ... and at most one write every this long: past a few hundred frames a second (a copy and its
# result per sampled request) a write per frame cost the worker more than the frames' own
# encoding (py-spy under bench/shed.py at 1.5x: the write was the hand-off's largest cost), so
# under load the frames of 10 ms go in one write. A copy waits at most this long for the
# mirror process; its candidate's timings start when the lane sends it.
_WRITE_EVERY_S: Final = 0.010
ELIGIBLE_REPORT_S: Final = 1.0  # how often the eligible count goes to the mirror process
_SEP: Final = "\x00"
_SHED_SESSIONS_MAX: Final = 65536  # sessions whose first turn a worker shed, remembered
_LATER_TURN: Final = b'"assistant"'  # a chat body holding it is not a conversation's first turn


class _Protocol(asyncio.Protocol):
    """Reads STATS and IDLE_ACK frames from the mirror process (off the request path)."""

    def __init__(self, owner: Handoff) -> None:
        self._owner = owner
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= frames.FRAME.size:
            kind, mlen, blen = frames.FRAME.unpack_from(buf)
            end = frames.FRAME.size + mlen + blen
            if len(buf) < end:
                return
            meta = bytes(buf[frames.FRAME.size : frames.FRAME.size + mlen])
            del buf[:end]
            self._owner._on_frame(kind, meta)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._on_lost()


class Handoff:
    """Samples production requests and hands the chosen copies to the mirror process."""

    def __init__(
        self,
        config: MirrorConfig,
        live: LiveTarget,
        socket_path: str,
        worker: str,
        *,
        session_header: str,
    ):
        self._live = live
        self._path = socket_path
        self.worker = worker
        self._session_header = session_header
        self._limit = config.channel_max_bytes
        self._oversize = min(config.channel_max_bytes, config.memory_budget_bytes)
        self._offers: tuple[Offer, ...] = ()
        self._candidates: tuple[Endpoint, ...] = ()
        start = rate_mod.START_REFERENCE_RPS
        self._refs = (start, start)  # until the mirror process names the references in force
        self._rates_seq = -1
        self._caps: dict[str, tuple[float, float]] = {}  # capacity shares in force
        self._band = False  # some session-mode offer has later turns to tell (see decide_kept)
        # (candidate, session) whose first turn this worker shed, LRU-bounded: their later turns
        # are shed here too, without a frame (another worker's are left to the mirror process).
        self._shed_sessions: OrderedDict[str, None] = OrderedDict()
        self._rate_timers: set[asyncio.TimerHandle] = set()
        self.eligible = 0  # requests on mirrored routes, sampled or not (the request path adds)
        self._fill_min = 1.0  # the channel's lowest occupancy at a flush since the last report
        self._reporter: asyncio.Task[None] | None = None
        self._transport: asyncio.WriteTransport | None = None
        self._pending: list[bytes] = []  # frame parts not yet written to the transport
        self._pending_bytes = 0
        self._pending_chosen: list[tuple[list[str], bool]] = []  # each pending copy's choice
        self._flush_at: asyncio.TimerHandle | None = None
        self._written_at = float("-inf")  # the loop's time of the last write (`_WRITE_EVERY_S`)
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the first frame queued
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._idle_seq = 0
        self._idle_waiters: dict[int, asyncio.Future[None]] = {}
        # Per candidate: [sampled, dropped_overflow, dropped_oversize, shed_capacity] of copies
        # never handed off.
        self._lanes: dict[str, list[int]] = {}
        self.process: dict[str, int] = {
            "skipped_loop": 0,
            "undecided_dropped": 0,
            "channel_down": 0,
            "results_dropped": 0,
            "handed_off": 0,
            "ramp_handed_off": 0,
            "ramp_dropped": 0,
        }
        self.stats: frames.StatsMeta | None = None
        self.stats_at = 0.0
        # Several workers: this worker's own series (`Exporter.render_local`), sent about once a
        # second; the mirror process relays every worker's to all (`peer_metrics`).
        self.own_metrics: Callable[[], frames.MetricsMeta] | None = None
        self._metrics_failed = False
        self._stats_event = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Connect (the mirror process is already listening), wait for its first stats (so
        metrics and counters are complete from the first scrape), then keep reconnecting."""
        if await self._connect():
            await self.wait_stats(after=0.0)
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._keep(), name="mirror-handoff")
        self._reporter = loop.create_task(self._report(), name="mirror-eligible")

    async def _report(self) -> None:
        """Send the eligible count and the channel's lowest occupancy about once a second (a
        failed send is carried over)."""
        sent, at = self.eligible, time.monotonic()
        while True:
            await asyncio.sleep(ELIGIBLE_REPORT_S)
            now, count = time.monotonic(), self.eligible
            fill = min(self._fill_min, self._channel_fill())
            meta = _encode(frames.EligibleMeta(count - sent, now - at, fill))
            if self._send_small(frames.KIND_ELIGIBLE, meta):
                sent, at = count, now
                self._fill_min = 1.0
            if self.own_metrics is not None:  # one of several workers: its series, for the rest
                try:
                    self._send_small(frames.KIND_METRICS, _encode(self.own_metrics()))
                except Exception:  # never the end of this loop: the eligible counts go on
                    if not self._metrics_failed:  # logged once, retried every second
                        log.exception("could not render this worker's metrics for the others")
                    self._metrics_failed = True

    def _channel_fill(self) -> float:
        """The channel's occupancy now: queued and transport-buffered bytes against the cap."""
        transport = self._transport
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        return (buffered + self._pending_bytes) / self._limit

    async def _connect(self) -> bool:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_unix_connection(lambda: _Protocol(self), self._path)
        except OSError:
            return False
        self._transport = transport
        self._lost.clear()
        return True

    async def _keep(self) -> None:
        while True:
            await self._lost.wait()
            while not await self._connect():  # noqa: ASYNC110 - retrying a connect, no event
                await asyncio.sleep(_RECONNECT_S)
            log.info("mirror process reachable again", extra={"fields": {"worker": self.worker}})

    def _on_lost(self) -> None:
        self._transport = None
        self._drop_pending()
        self._rates_seq = -1  # a restarted mirror process numbers its references from 0
        self._lost.set()
        for fut in self._idle_waiters.values():
            if not fut.done():
                fut.set_result(None)
        self._idle_waiters.clear()

    async def close(self, timeout_s: float) -> None:
        """Stop handing off; give the channel up to `timeout_s` to drain, then close it."""
        self._closed = True
        self._offers = ()
        for timer in self._rate_timers:
            timer.cancel()
        self._rate_timers.clear()
        for task in (self._task, self._reporter):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._reporter = None
        self._flush()
        transport, self._transport = self._transport, None
        if transport is None:
            return
        deadline = time.monotonic() + timeout_s
        while transport.get_write_buffer_size() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the transport has no drained event; bounded by deadline
        transport.close()

    # ------------------------------------------------------------------ registry

    def apply(self, candidates: Sequence[Endpoint]) -> None:
        """Sample toward these candidates from now on; tell the mirror process to reload."""
        if self._closed:
            return
        self._candidates = tuple(candidates)
        self._rebuild()
        for offer in self._offers:
            self._lanes.setdefault(offer.name, [0, 0, 0, 0])
        self._send_small(frames.KIND_RELOAD, b"")

    def _rebuild(self) -> None:
        offers = offers_for(self._candidates, self._refs)
        apply_capacity(offers, self._caps)
        self._band = any(o.session_mode and o.low < o.threshold for o in offers)
        self._offers = offers

    def _remember_shed(self, key: str) -> None:
        sessions = self._shed_sessions
        sessions[key] = None
        if len(sessions) > _SHED_SESSIONS_MAX:
            sessions.popitem(last=False)

    def _on_rates(self, msg: frames.RatesMeta) -> None:
        """Swap the references at the instant the mirror process named (the same for every
        worker of the host); late or repeated messages never go back in time."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle

        def fire() -> None:
            self._rate_timers.discard(timer)
            if self._closed or msg.seq < self._rates_seq:
                return
            self._rates_seq = msg.seq
            self._refs = (msg.request_rps, msg.session_rps)
            self._caps = msg.capacity
            self._rebuild()

        timer = loop.call_later(max(0.0, msg.apply_at - time.monotonic()), fire)
        self._rate_timers.add(timer)

    # ------------------------------------------------------------------ RequestTee

    def on_request(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        request_id: str,
    ) -> object | None:
        """Decide the sample (no body parsing) and queue one frame; never awaits."""
        if mirrored_route(method, path_qs) is None:
            return None
        offers = self._offers
        if MIRROR_HEADER in headers:
            if offers:
                self.process["skipped_loop"] += 1
            return None
        self.eligible += 1
        if not offers:
            return None
        header_value = headers.get(self._session_header)
        first = not self._band or _LATER_TURN not in body
        sampled, shed, check, undecided = decide_kept(
            offers,
            request_id.encode("utf-8", "surrogateescape"),
            header_value.encode("utf-8", "surrogateescape") if header_value else None,
            first,
        )
        if check and header_value:  # later turns of sessions this worker shed: shed again
            shed_sessions = self._shed_sessions
            for offer in [o for o in check if o.name + _SEP + header_value in shed_sessions]:
                check.remove(offer)
                shed.append(offer)
        for offer in () if undecided else shed:  # under the capacity share: no frame built
            row = self._lanes.setdefault(offer.name, [0, 0, 0, 0])
            row[0] += 1
            row[3] += 1
            if offer.session_mode and first and header_value:
                self._remember_shed(offer.name + _SEP + header_value)
        if not sampled and not check and not undecided:
            return None
        chosen = [offer.name for offer in sampled]
        checked = [offer.name for offer in check]
        chosen.extend(checked)
        hdrs = [(str(k), v) for k, v in headers.items() if k.lower() not in _SKIP]
        exchange_id = uuid7()
        meta = _encode(
            frames.CopyMeta(
                exchange_id,
                method,
                path_qs,
                request_id,
                time.time(),
                self._live.endpoint.name,
                self.worker,
                hdrs,
                [] if undecided else chosen,
                header_value,
                checked,
            )
        )
        size = frames.FRAME.size + len(meta) + len(body)
        transport = self._transport
        failure: int | None = None
        if size > self._oversize:
            failure = 2
        elif transport is None:
            self.process["channel_down"] += 1
            failure = 1
        elif transport.get_write_buffer_size() + self._pending_bytes + size > self._limit:
            failure = 1
        if failure is not None:
            if undecided:
                self.process["undecided_dropped"] += 1
            for name in chosen:
                row = self._lanes.setdefault(name, [0, 0, 0, 0])
                row[0] += 1
                row[failure] += 1
            return None
        self._queue(size, frames.frame_header(frames.KIND_COPY, len(meta), len(body)), meta, body)
        self._pending_chosen.append((chosen, undecided))
        self.process["handed_off"] += 1
        return exchange_id

    def on_response(self, token: object, result: MeterResult, error_kind: str | None) -> None:
        """Send production's result for a handed-off copy (tiny; refused only if down)."""
        if not isinstance(token, str):
            return
        meta = _encode(frames.ResultMeta(token, error_kind, result))
        if not self._send_small(frames.KIND_RESULT, meta):
            self.process["results_dropped"] += 1

    def put_rollout(self, request: RolloutRequest) -> None:
        """One request of an open rollout to the mirror process (`RolloutSink`); never waits."""
        transport = self._transport
        frame = frames.rollout_frame(request)
        size = len(frame)
        if transport is None or (
            transport.get_write_buffer_size() + self._pending_bytes + size
            > self._limit + _RESULT_HEADROOM
        ):
            self.process["ramp_dropped"] += 1
            return
        self._queue(size, frame)
        self.process["ramp_handed_off"] += 1

    def _send_small(self, kind: int, meta: bytes) -> bool:
        transport = self._transport
        if transport is None:
            return False
        if transport.get_write_buffer_size() + self._pending_bytes > self._limit + _RESULT_HEADROOM:
            return False
        self._queue(frames.FRAME.size + len(meta), frames.frame_header(kind, len(meta), 0), meta)
        return True

    def _queue(self, size: int, *parts: bytes) -> None:
        """Add a frame to the next write (references only: bodies are not copied here)."""
        self._pending.extend(parts)
        self._pending_bytes += size
        if self._flush_at is None:
            loop = self._loop
            if loop is None:  # asked once: on 3.11 every get_running_loop() is a getpid() syscall
                loop = self._loop = asyncio.get_running_loop()
            now = loop.time()
            at = max(now + _COALESCE_S, self._written_at + _WRITE_EVERY_S)
            self._flush_at = loop.call_at(at, self._flush)

    def _flush(self) -> None:
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        transport, pending = self._transport, self._pending
        if not pending:
            return
        self._pending, self._pending_bytes, self._pending_chosen = [], 0, []
        if transport is not None:
            transport.writelines(pending)
            if self._loop is not None:
                self._written_at = self._loop.time()
            # What the kernel did not take is the backlog the mirror process has not read: its
            # lowest value between two reports tells a reader that cannot keep up (it never
            # empties) from one that is only late (`gateway.mirror.sampling.capacity`).
            fill = transport.get_write_buffer_size() / self._limit
            if fill < self._fill_min:
                self._fill_min = fill

    def _drop_pending(self) -> None:
        """The channel went down with frames not yet written: their copies never reached the
        mirror process, so they are counted here (`dropped_overflow`), as copies refused."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        for chosen, undecided in self._pending_chosen:
            if undecided:
                self.process["undecided_dropped"] += 1
            for name in chosen:
                row = self._lanes.setdefault(name, [0, 0, 0, 0])
                row[0] += 1
                row[1] += 1
        self._pending, self._pending_bytes, self._pending_chosen = [], 0, []

    def _on_frame(self, kind: int, meta: bytes) -> None:
        if kind == frames.KIND_STATS:
            self.stats = _decode_stats(meta)
            self.stats_at = time.monotonic()
            self._stats_event.set()
        elif kind == frames.KIND_RATES:
            self._on_rates(_decode_rates(meta))
        elif kind == frames.KIND_IDLE_ACK:
            fut = self._idle_waiters.pop(_decode_idle(meta).seq, None)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def wait_idle(self) -> None:
        """Return once every copy handed off so far has finished (tests, benchmarks)."""
        self._idle_seq += 1
        seq = self._idle_seq
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle_waiters[seq] = fut
        if not self._send_small(frames.KIND_IDLE, _encode(frames.IdleMeta(seq))):
            self._idle_waiters.pop(seq, None)
            return
        await fut

    async def wait_stats(self, after: float | None = None) -> frames.StatsMeta | None:
        """The next STATS frame received after `after` (default: now), within 5 s."""
        after = time.monotonic() if after is None else after
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                while self.stats_at <= after:
                    self._stats_event.clear()
                    await self._stats_event.wait()
        return self.stats

    # ------------------------------------------------------------------ export

    def counters(self) -> dict[str, dict[str, int]]:
        """This worker's own rows: copies it chose but could not hand off (identity holds)."""
        out: dict[str, dict[str, int]] = {}
        for name, (sampled, overflow, oversize, shed) in self._lanes.items():
            row = dict.fromkeys((*IDENTITY_FIELDS, *GAUGE_FIELDS, "dropped_on_stop"), 0)
            row.update(
                sampled=sampled,
                dropped_overflow=overflow,
                dropped_oversize=oversize,
                shed_capacity=shed,
            )
            out[name] = row
        return out

    def host_counters(self) -> dict[str, dict[str, int]]:
        """The mirror process's counters plus this worker's hand-off losses (admin view)."""
        merged = {n: dict(c) for n, c in (self.stats.counters if self.stats else {}).items()}
        for name, row in self.counters().items():
            into = merged.setdefault(name, dict.fromkeys(row, 0))
            for key in ("sampled", "dropped_overflow", "dropped_oversize", "shed_capacity"):
                into[key] = into.get(key, 0) + row[key]
        return merged

    def host_rates(self) -> dict[str, dict[str, float | None]]:
        """The mirror process's adaptive-sampling view per candidate, plus the share this
        worker applies now (`worker_sample_rate`; None: not sampled here)."""
        mine = {o.name: o.rate for o in self._offers}
        host = self.stats.rates if self.stats else {}
        return {
            name: {**host.get(name, {}), "worker_sample_rate": mine.get(name)}
            for name in {*host, *mine}
        }

    def peer_metrics(self) -> Mapping[str, str]:
        """Every worker's last series as the mirror process relayed them, by `worker` label."""
        return self.stats.workers if self.stats is not None else {}

    def writer_stats(self) -> dict[str, int]:
        return dict(self.stats.writer) if self.stats else {}

    def prometheus_lines(self) -> Iterable[Exposed]:
        """This worker's hand-off counters, then the mirror process's lines (host-wide)."""
        yield from _handoff_lines(self.counters(), self.process, self._transport is not None)
        if self.stats is not None:
            yield from self.stats.prometheus.splitlines()  # rendered there from declarations


HANDOFF_DROPPED: Final = Family(
    "canary_mirror_handoff_dropped_total",
    "counter",
    "Copies a worker chose but never handed off (shed_capacity: by hash under the capacity "
    "share, a sampling decision).",
    ("candidate", "reason"),
)
HANDOFF_EVENTS: Final = Family(
    "canary_mirror_handoff_total",
    "counter",
    "This worker's hand-off events, by event.",
    ("event",),
)
CHANNEL_UP: Final = Family(
    "canary_mirror_channel_up", "gauge", "1 while this worker is connected to the mirror process."
)


def _handoff_lines(
    lanes: Mapping[str, Mapping[str, int]], process: Mapping[str, int], connected: bool
) -> Iterable[Exposed]:
    yield HANDOFF_DROPPED
    for name, c in lanes.items():
        for key in ("dropped_overflow", "dropped_oversize", "shed_capacity"):
            yield HANDOFF_DROPPED.sample(c[key], name, key)
    yield HANDOFF_EVENTS
    for key, value in process.items():
        yield HANDOFF_EVENTS.sample(value, key)
    yield CHANNEL_UP.sample(int(connected))
