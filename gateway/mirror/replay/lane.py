"""One candidate's lane: its ring buffer and the workers that replay copies against it.

Each lane owns an `UpstreamPool` of keep-alive connections to its candidate (never
production's pool), `concurrency` workers, its own timeout and credentials; a copy goes out
through the pool as the proxy's requests do (aiohttp's client protocol and C parser, no
`ClientSession`/`ClientRequest`/`ClientResponse` per copy), and its connection goes back to the
pool after the body's end or is dropped on any other exit (timeout, cancel, error), so a hung
candidate stops. Its scoring and token-counting requests (`post_json`) go through the same
pool.

A copy keeps the client's headers except hop-by-hop ones, `Host`, `Content-Length`,
`Accept-Encoding` (the lane asks for what it can decode) and `Authorization` (unless
`forward_auth`); the candidate's own bearer token, when configured, is added, and so is
`X-Canary-Mirror: <exchange id>`. The body is the production bytes unchanged,
except `model` when the candidate overrides it; the copy keeps production's streaming settings
(no `include_usage` is added, so both arms count output tokens the same way).

The same `ResponseMeter` as production measures the answer from the moment the request is
sent; time spent in the ring is recorded separately as queue wait. Nothing here is awaited by
the request path: `offer` is synchronous and only wakes an idle worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable
from typing import Final

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from domain.endpoint import Endpoint
from domain.kinds import CONTROL, score_rate
from domain.outcomes import ErrorKind
from domain.records import ObservationRecord
from gateway.config.sections import CredentialsConfig, MirrorConfig, StorageConfig, UpstreamConfig
from gateway.credentials import candidate_credential
from gateway.mirror.counters import LaneCounters
from gateway.mirror.replay.observe import classify, observation
from gateway.mirror.replay.ring import Entry, MemoryBudget, Offer, RingBuffer
from gateway.mirror.replay.validity import NOTHING, CallJudge, Declared
from gateway.server.deadlines import DeadlineSweeper, UpstreamTimeouts
from gateway.server.headers import COPY_SKIP, copy_end_to_end, copy_skip
from gateway.server.hooks import ObservationSink
from gateway.server.meter import MeterResult, ResponseMeter
from gateway.server.stream.relay import MeterSink
from gateway.server.upstream import (
    Origin,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    read_chunk,
    request_body,
)

__all__ = ["MIRROR_HEADER", "Copy", "Lane"]

MIRROR_HEADER: Final = "X-Canary-Mirror"

# Not forwarded to a candidate: the copy policy of `gateway.server.headers`, the loop guard
# (the lane sets its own), and the credential headers unless the candidate says forward_auth.
_DROP: Final = COPY_SKIP | {MIRROR_HEADER.lower()}
_decode_obj = msgspec.json.Decoder(dict[str, object]).decode
_encode = msgspec.json.Encoder().encode


def is_event_stream(content_type: str | None) -> bool:
    """Whether a Content-Type header names SSE (its media type, case-insensitive), without
    aiohttp's full parameter parsing of `ClientResponse.content_type`."""
    if not content_type:
        return False
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


# Fixed bookkeeping of one queued copy (objects, slots, ring entry), charged with its bytes so
# a flood of tiny copies cannot hide in the memory budget.
COPY_OVERHEAD_BYTES: Final = 512


def _never(record: ObservationRecord) -> bool:
    return False


def _ignore(exchange_id: str, lane: str) -> None:
    return None


class Copy:
    """One mirrored production request, shared by every lane that accepted it (never copied).

    `nbytes` is everything the copy holds: body, every header name and value, and a fixed
    overhead; the rings and the memory budget count that, not just the body."""

    __slots__ = ("body", "exchange_id", "headers", "nbytes", "path_qs", "tools")

    def __init__(
        self,
        exchange_id: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        tools: Declared = NOTHING,
    ) -> None:
        self.exchange_id = exchange_id
        self.path_qs = path_qs
        self.headers = headers
        self.body = body
        # What the request declared, parsed once: every arm's calls are judged against it.
        self.tools = tools
        self.nbytes = (
            len(body)
            + len(path_qs)
            + sum(len(k) + len(v) for k, v in headers.items())
            + COPY_OVERHEAD_BYTES
        )


class Lane:
    """A candidate's ring buffer, workers and upstream pool."""

    def __init__(
        self,
        endpoint: Endpoint,
        budget: MemoryBudget,
        sink: ObservationSink,
        *,
        mirror: MirrorConfig,
        upstream: UpstreamConfig,
        storage: StorageConfig,
        credentials: CredentialsConfig,
        calls: CallJudge | None = None,
    ) -> None:
        self.counters = LaneCounters()
        # The mirror process's tool-call checker (shared by every lane: one schema cache).
        self._calls = calls or CallJudge()
        self.ring: RingBuffer[Copy] = RingBuffer(
            endpoint.buffer_max_items,
            endpoint.buffer_max_bytes,
            budget,
            self.counters,
            mirror.dedup_window_s,
        )
        self._upstream = upstream
        self._storage = storage
        self._credentials = credentials
        self._sink = sink
        self._text_max = storage.store_text_max_chars if storage.store_text else 0
        self._sweeper: DeadlineSweeper | None = None
        self._pool: UpstreamPool | None = None  # the copies'
        self._workers: dict[int, asyncio.Task[None]] = {}
        self._idle: deque[asyncio.Future[None]] = deque()
        self._quiet: list[asyncio.Future[None]] = []  # wait_idle() callers
        self._stopping = False
        # Where a finished copy's observation goes: the sink, unless the scorer holds it until
        # its pair is scored (`gateway.mirror.scoring.jobs.Scorer.hold`; returns True when held).
        self.hold: Callable[[ObservationRecord], bool] = _never
        # A copy's fate before its answer, for the jobs that wait for that answer (scoring,
        # grading): taken by a worker (`on_send`; from then its timeout bounds the wait) or
        # left unsent (`on_discard`: overflow, shed, cleared; the answer will never come).
        self.on_send: Callable[[str, str], None] = _ignore
        self.on_discard: Callable[[str, str], None] = _ignore
        self.ring.on_discard = self._discarded
        self.endpoint = endpoint
        self._configure(endpoint)

    # ------------------------------------------------------------------ configuration

    def _configure(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.name = endpoint.name
        self.session_mode = endpoint.sampling == "session"
        self._base = endpoint.url.rstrip("/")
        # Connection key, path prefix and Host line, computed once per registration.
        self._origin = Origin(URL(self._base, encoded=True))
        self._drop = _DROP | copy_skip(self._credentials.headers, endpoint.forward_auth)
        token = candidate_credential(self._credentials, endpoint.name, endpoint.credentials_env)
        self._auth = f"Bearer {token}" if token else None
        self._timeout_s = endpoint.timeout_s
        if self._sweeper is None or self._sweeper.timeouts.total_s != endpoint.timeout_s:
            # Copies in flight keep the sweeper they were started under until they end.
            self._sweeper = DeadlineSweeper(
                UpstreamTimeouts(
                    connect_s=self._upstream.connect_timeout_s,
                    ttfb_s=0,
                    idle_s=0,
                    total_s=endpoint.timeout_s,
                )
            )
        self._model = endpoint.model
        # Share of this candidate's pairs it scores itself (a control scores only beside one).
        self.score_share = (
            0.0 if endpoint.kind == CONTROL else score_rate(endpoint.kind, endpoint.score_rate)
        )
        self.is_control = endpoint.kind == CONTROL

    @property
    def model(self) -> str | None:
        """The `model` sent to this candidate instead of the client's (None: the client's)."""
        return self._model

    async def post_json(
        self, path: str, body: bytes, *, purpose: str = "score"
    ) -> tuple[int, bytes]:
        """POST a JSON body to this candidate (a scoring or token-counting request, named by
        `purpose` in the mirror header) with its credentials, through the lane's pool, under
        its deadlines; (status, body). Raises UpstreamError (its timeout included)."""
        pool, sweeper = self._pool, self._sweeper
        assert pool is not None and sweeper is not None
        headers: CIMultiDict[str] = CIMultiDict(
            {"Content-Type": "application/json", MIRROR_HEADER: purpose}
        )
        if self._auth is not None:
            headers["Authorization"] = self._auth
        wd = sweeper.watch(time.perf_counter())
        resp: UpstreamResponse | None = None
        try:
            resp = await pool.open(
                "POST", self._origin, path, headers=headers, data=body or None, watchdog=wd
            )
            parts = []
            while chunk := await read_chunk(resp, wd):
                wd.touch(time.perf_counter())
                parts.append(chunk)
            resp.release()  # back to the pool when reusable
            return resp.status, b"".join(parts)
        finally:
            wd.close()
            if resp is not None:
                resp.close()  # a no-op once released; else the connection is dropped

    def update(self, endpoint: Endpoint) -> None:
        """Apply a changed registration, keeping queued copies that still fit."""
        self._configure(endpoint)
        self.ring.resize(
            endpoint.buffer_max_items, endpoint.buffer_max_bytes, self.ring.dedup_window_s
        )
        if self._pool is not None:
            self._scale()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the lane's own upstream pool and session, start its workers (needs a running
        loop)."""
        if self._pool is not None:
            return
        up = self._upstream
        # The same client as the proxy's (gateway.server.upstream) but the lane's own: no
        # connection cap of its own (the workers are the bound, at most one connection each, and
        # it follows `concurrency`), the configured connect timeout and keep-alive, no cookies,
        # bytes untouched.
        self._pool = UpstreamPool(
            limit=0, keepalive_s=up.keepalive_s, connect_timeout_s=up.connect_timeout_s
        )
        self._scale()

    def _scale(self) -> None:
        loop = asyncio.get_running_loop()
        for index in range(self.endpoint.concurrency):
            if index not in self._workers:
                task = loop.create_task(self._work(index), name=f"mirror-{self.name}-{index}")
                self._workers[index] = task
                task.add_done_callback(functools.partial(self._forget, index))
        self._wake_all()  # surplus workers notice the lower concurrency and leave

    def _forget(self, index: int, task: asyncio.Task[None]) -> None:
        if self._workers.get(index) is task:
            del self._workers[index]

    def stop_offers_and_clear(self) -> int:
        """Stop taking copies and drop the queued ones (counted); in-flight copies finish."""
        self._stopping = True
        dropped = self.ring.clear()
        self._wake_all()
        if not self.ring.pending:
            self._notify_quiet()
        return dropped

    def begin_drain(self) -> None:
        """Workers send what is queued, then leave."""
        self._stopping = True
        self._wake_all()

    @property
    def workers(self) -> tuple[asyncio.Task[None], ...]:
        return tuple(self._workers.values())

    async def close(self) -> None:
        """Cancel the workers (in-flight copies count as timed out), drop the rest, close."""
        self._stopping = True
        workers = self.workers
        for task in workers:
            task.cancel()
        for task in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.ring.clear()
        self.ring.detach()
        self._notify_quiet()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # ------------------------------------------------------------------ hot path

    def offer(
        self, copy: Copy, digest: bytes, session: bytes | None, now: float, turn: int = 0
    ) -> bool:
        """Queue a copy (`turn`: its index in `session`); synchronous, never awaits. True when
        the ring accepted it."""
        # The Copy object is shared by every ring that takes it: the budget counts it once.
        if self.ring.offer(copy, id(copy), copy.nbytes, digest, session, now, turn) is not (
            Offer.ACCEPTED
        ):
            return False
        self._wake_one()
        return True

    def _wake_one(self) -> None:
        idle = self._idle
        while idle:
            fut = idle.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _notify_quiet(self) -> None:
        waiters, self._quiet = self._quiet, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_idle(self) -> None:
        """Return once nothing is queued or in flight (tests, benchmarks, operators)."""
        loop = asyncio.get_running_loop()
        while self.ring.pending:
            fut: asyncio.Future[None] = loop.create_future()
            self._quiet.append(fut)
            await fut

    def _wake_all(self) -> None:
        while self._idle:
            fut = self._idle.popleft()
            if not fut.done():
                fut.set_result(None)

    # ------------------------------------------------------------------ workers

    async def _work(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        ring = self.ring
        while index < self.endpoint.concurrency:
            entry = ring.pop(time.perf_counter())
            if entry is None:
                if self._stopping and not ring.items:
                    return
                fut = loop.create_future()
                self._idle.append(fut)
                await fut
                continue
            self.on_send(entry.payload.exchange_id, self.name)
            try:
                await self._send(entry)
            finally:
                # Unanswered (no response head: refused, reset, timed out or cancelled before
                # it), the copy never reached the candidate: its session's later turns are shed.
                ring.done(entry, entry.answered)
                if ring.has_ready:
                    self._wake_one()  # a session's next turn may have become ready
                elif self._stopping and not ring.items:
                    self._wake_all()  # draining and nothing left: idle workers may leave
                if not ring.pending:
                    self._notify_quiet()

    def _discarded(self, copy: Copy) -> None:
        self.on_discard(copy.exchange_id, self.name)

    def _request_headers(self, copy: Copy) -> CIMultiDict[str]:
        headers: CIMultiDict[str] = CIMultiDict()
        copy_end_to_end(copy.headers, self._drop, headers)
        if self._auth is not None:
            headers["Authorization"] = self._auth
        headers[MIRROR_HEADER] = copy.exchange_id
        return headers

    def _request_body(self, body: bytes) -> bytes:
        if self._model is None:
            return body
        try:
            obj = _decode_obj(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return body
        if "model" not in obj:
            return body
        obj["model"] = self._model
        return _encode(obj)

    async def _send(self, entry: Entry[Copy]) -> None:
        pool = self._pool
        assert pool is not None
        copy = entry.payload
        started_at = time.time()
        t0 = time.perf_counter()
        queue_wait = t0 - entry.enqueued_at
        meter: ResponseMeter | None = None
        status = 0
        error_kind: str | None = None
        assert self._sweeper is not None
        wd = self._sweeper.watch(t0)
        resp: UpstreamResponse | None = None
        sink: MeterSink | None = None
        try:
            resp = await pool.open(
                "POST",
                self._origin,
                copy.path_qs,
                headers=self._request_headers(copy),
                data=request_body(self._request_body(copy.body)),
                watchdog=wd,
            )
            status = resp.status
            entry.answered = True
            meter = ResponseMeter(
                t0,
                is_sse=is_event_stream(resp.headers.get("Content-Type")),
                text_max_chars=self._text_max,
            )
            # From the connection's read callback: no task wake-up per event (the first
            # chunks may be queued already, and are read here).
            sink = MeterSink.attach(resp.connection, resp.content, meter, wd)
            while chunk := await read_chunk(resp, wd):
                now = time.perf_counter()
                wd.touch(now)
                meter.feed(chunk, now)
            if sink is not None:
                sink.stop()
                sink = None
            resp.release()  # the body's end: back to the pool when reusable
        except UpstreamError as exc:
            error_kind = exc.kind
        except asyncio.CancelledError:
            self._record(copy, started_at, queue_wait, meter, status, ErrorKind.CANCELLED)
            raise
        finally:
            wd.close()
            if sink is not None:
                sink.stop()
            if resp is not None:
                # A no-op once released; on any other exit (timeout, cancel, error, shed) the
                # connection is dropped, so the candidate stops generating.
                resp.close()
        self._record(copy, started_at, queue_wait, meter, status, error_kind)

    def _record(
        self,
        copy: Copy,
        started_at: float,
        queue_wait: float,
        meter: ResponseMeter | None,
        status: int,
        error_kind: str | None,
    ) -> None:
        now = time.perf_counter()
        result = (
            meter.finish(now, status)
            if meter is not None
            else MeterResult(status=status, is_sse=False)
        )
        if error_kind is None:
            error_kind = classify(result)
        c = self.counters
        c.sent += 1
        if error_kind in (ErrorKind.TIMEOUT, ErrorKind.CANCELLED):
            c.timed_out += 1
        elif error_kind is None:
            c.observed_ok += 1
        else:
            c.observed_error += 1
        record = observation(
            copy.exchange_id,
            self.name,
            "candidate",
            started_at,
            result,
            error_kind,
            store_text=self._storage.store_text,
            max_chars=self._storage.store_text_max_chars,
            queue_wait_s=queue_wait,
        )
        self._calls.judge(record, copy.tools, result.tool_calls)
        if not self.hold(record):
            self._sink.put_observation(record)

    # ------------------------------------------------------------------ export

    def snapshot(self) -> dict[str, int]:
        out = self.counters.as_dict()
        out["pending"] = self.ring.pending
        out["inflight"] = self.ring.inflight
        out["buffer_items"] = self.ring.items
        out["buffer_bytes"] = self.ring.bytes
        out["score_pending"] = self.counters.score_pending
        return out
