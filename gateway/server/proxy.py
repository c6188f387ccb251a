"""The hot path: forward one client request to the live endpoint and stream the answer back.

Every method and path is forwarded with its query string; status, headers (less hop-by-hop ones)
and body bytes come back unchanged, chunk by chunk as they arrive. The request body is read once
into one `bytes` object that the tee (the mirror) receives by reference. A passive meter watches
answers the tee stores; an SSE answer it does not store gets a watch (`server/stream/watch.py`: only
its first token, for the TTFT histogram, and its final event are parsed). Upstream failures map
to OpenAI-shaped errors at this one boundary: 413 body too large, 502 refused/reset before
answering, 504 timeout before the first byte; a failure after streaming started cuts the client
connection (no fake success). A client that goes away aborts the upstream request at once, so the
engine stops generating.

During a ramp (`gateway.rollout.route.RolloutRoute`), the session key (the session header,
else the request id) picks the arm: the candidate's requests are forwarded, streamed and
metered the same way to its base URL, and a candidate failure before any byte reached the
client is retried once on production, with fresh deadlines (counted as a fallback, reported as
the candidate's failure). The router is asked for every request, rollout or not (1-4 µs): it
remembers each session's arm so that sessions in flight when a ramp starts stay on production.
The rest of the ramp's work (metering every request, counting by arm, the evidence record, the
guard) happens only while a rollout is ramping. Only production-arm requests reach the tee: the
mirror copies production's traffic to candidates, never a candidate's own requests back to it.

This module must never log per request, never buffer a whole response, never await anything of
the mirror, and never let a tee error reach the client.
"""

from __future__ import annotations

import asyncio
from time import perf_counter

import msgspec
from aiohttp import web
from multidict import CIMultiDict

from domain.ids import uuid7
from domain.outcomes import ErrorKind
from gateway.config.sections import LimitsConfig, UpstreamConfig
from gateway.rollout.arms import PRODUCTION, Split
from gateway.rollout.route import RolloutRoute, rollout_kind
from gateway.server.body import BUSY, TIMEOUT, BodyBudget, BodyRead, read_body
from gateway.server.deadlines import CLIENT_WRITE, DeadlineSweeper, UpstreamTimeouts
from gateway.server.headers import REQUEST_SKIP, RESPONSE_SKIP, copy_end_to_end
from gateway.server.hooks import LiveTarget, RequestTee
from gateway.server.meter import MeterResult, ResponseMeter
from gateway.server.prometheus import Exporter
from gateway.server.stream.relay import Relay
from gateway.server.stream.watch import StreamWatch
from gateway.server.upstream import (
    Origin,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
    read_chunk,
    request_body,
)

_REQUEST_SKIP = REQUEST_SKIP
_RESPONSE_SKIP = RESPONSE_SKIP

# Routes with their own metric series; anything else is "other".
ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
    "/tokenize",
    "/detokenize",
)
CLIENT_CLOSED = 499  # status label for requests the client abandoned (nginx's convention)
XRID = "X-Request-ID"
_encode = msgspec.json.Encoder().encode


def error_body(message: str, type_: str, code: str) -> bytes:
    """An OpenAI-shaped error body."""
    return _encode({"error": {"message": message, "type": type_, "code": code}})


_ERROR_HEADERS = {"Content-Type": "application/json"}
_CONNECT_BODY = error_body(
    "the live endpoint refused the connection or could not be reached", "server_error",
    "upstream_unreachable",
)  # fmt: skip
_RESET_BODY = error_body(
    "the live endpoint closed the connection before answering", "server_error", "upstream_reset"
)
_TIMEOUT_BODIES = {
    phase: error_body(
        f"the live endpoint did not answer in time ({phase} timeout)", "server_error",
        "upstream_timeout",
    )
    for phase in ("connect", "ttfb", "idle", "total")
}  # fmt: skip


_BUSY_BODY = error_body(
    "the gateway is reading too many request bodies at once; retry later", "server_error",
    "gateway_overloaded",
)  # fmt: skip
_BAD_TARGET_BODY = error_body(
    "request target must be a path (origin-form) or an absolute http(s) URL",
    "invalid_request_error", "bad_request_target",
)  # fmt: skip
SLOW_READER = "client_slow_reader"
# Every `kind` of canary_proxy_upstream_errors_total, exported at 0 from start (a series that
# appears only with its first error leaves dashboards empty and rate() alerts unwritable): the
# error kinds of the live exchange (a timeout by its Watchdog phase; a connect timeout counts
# as connect) and the client's.
TIMEOUT_LABELS = {phase: f"timeout_{phase}" for phase in ("ttfb", "idle", "total")}
UPSTREAM_ERROR_LABELS: tuple[str, ...] = (
    ErrorKind.CONNECT,
    ErrorKind.RESET,
    *TIMEOUT_LABELS.values(),
    ErrorKind.CLIENT_DISCONNECT,
    SLOW_READER,
)


def _result(meter: ResponseMeter | None, now: float, status: int) -> MeterResult:
    if meter is None:
        return MeterResult(status=status, is_sse=False)
    return meter.finish(now, status)


class _CoalescedResponse(web.StreamResponse):
    """A response whose headers leave with its first body bytes: one send instead of two for a
    plain (non-SSE) answer. SSE answers keep aiohttp's default (headers at once), so a client
    sees the stream open before the first token."""

    _send_headers_immediately = False


class _RouteStats:
    """Pre-bound metric series of one route, so a request does lookups, not allocations."""

    __slots__ = ("by_status", "counter", "e2e", "route", "ttft")

    def __init__(self, route: str, metrics: ProxyMetrics) -> None:
        self.route = route
        self.counter = metrics.requests
        self.by_status: dict[int, object] = {}
        self.ttft = metrics.ttft.labels(route)
        self.e2e = metrics.e2e.labels(route)

    def count(self, status: int) -> None:
        series = self.by_status.get(status)
        if series is None:
            series = self.by_status[status] = self.counter.labels(self.route, str(status))
        series.inc()  # type: ignore[attr-defined]


class ProxyMetrics:
    """The proxy's series in a registry: requests, in-flight, TTFT, E2E, upstream errors."""

    def __init__(self, registry: Exporter) -> None:
        self.requests = registry.counter(
            "canary_proxy_requests_total",
            "Proxied requests by route and status.",
            ("route", "status"),
        )
        self.in_flight = registry.gauge(
            "canary_proxy_in_flight_requests", "Requests being proxied now."
        )
        self.ttft = registry.histogram(
            "canary_proxy_ttft_seconds",
            "Live endpoint time to first token (SSE) or first byte, from request sent.",
            ("route",),
        )
        self.e2e = registry.histogram(
            "canary_proxy_e2e_seconds",
            "Live endpoint end-to-end time, from request sent to last byte.",
            ("route",),
        )
        self.upstream_errors = registry.counter(
            "canary_proxy_upstream_errors_total",
            "Live endpoint failures by kind (connect, reset, timeout_<phase>), and the client's "
            "(client_disconnect, client_slow_reader).",
            ("kind",),
        )
        self.closed_after_final = registry.counter(
            "canary_proxy_client_closed_after_final_total",
            "Streams whose client closed after receiving the final event (answered, not cut).",
        )
        self.odd_target = registry.counter(
            "canary_proxy_non_origin_targets_total",
            "Requests whose target was not a path: absolute-form (forwarded by its path) or "
            "other (400).",
        )
        self.tee_errors = registry.counter(
            "canary_proxy_tee_errors_total", "Exceptions raised by the request tee (swallowed)."
        )
        reads = registry.counter(
            "canary_proxy_stream_reads_total",
            "Upstream reads of streamed (SSE) answers by who wrote them to the client: the "
            "upstream connection's read callback (relay) or the request's task (task: the first "
            "read, and every read while the client was not keeping up).",
            ("path",),
        )
        self._reads_task, self._reads_relay = reads.labels("task"), reads.labels("relay")
        self.routes = {route: _RouteStats(route, self) for route in ROUTES}
        self.other = _RouteStats("other", self)
        self._errors = {kind: self.upstream_errors.labels(kind) for kind in UPSTREAM_ERROR_LABELS}

    def stream_reads(self, task: int, relay: int) -> None:
        self._reads_task.inc(task)
        if relay:
            self._reads_relay.inc(relay)

    def error(self, kind: str) -> None:
        series = self._errors.get(kind)
        if series is None:  # a kind outside the declared set: still counted, never dropped
            series = self._errors[kind] = self.upstream_errors.labels(kind)
        series.inc()


class Proxy:
    """The catch-all request handler. `session` is set by the app's lifecycle once a loop runs."""

    def __init__(
        self,
        limits: LimitsConfig,
        upstream: UpstreamConfig,
        live: LiveTarget,
        metrics: ProxyMetrics,
        tee: RequestTee | None = None,
        *,
        text_max: int,
        rollout: RolloutRoute | None = None,
    ) -> None:
        self.live = live
        self.tee = tee
        self.rollout = rollout
        self.metrics = metrics
        self.pool: UpstreamPool | None = None
        self.max_body = limits.max_body_bytes
        self.budget = BodyBudget(limits.max_body_bytes_in_flight)
        self.body_idle_s = limits.body_read_timeout_s
        self.text_max = text_max  # stored output text is cut to this
        self.timeouts = UpstreamTimeouts(
            connect_s=upstream.connect_timeout_s,
            ttfb_s=upstream.ttfb_timeout_s,
            idle_s=upstream.idle_timeout_s,
            total_s=upstream.total_timeout_s,
            client_write_s=limits.client_write_timeout_s,
        )
        self.sweeper = DeadlineSweeper(self.timeouts)
        self._body_timeout = error_body(
            f"the request body stopped arriving for {self.body_idle_s:g} s",
            "invalid_request_error", "request_timeout",
        )  # fmt: skip
        self._too_large = error_body(
            f"request body exceeds the gateway's limit of {self.max_body} bytes",
            "invalid_request_error",
            "request_too_large",
        )
        self._live: Origin | None = None

    def _live_origin(self) -> Origin:
        base = self.live.base_url
        origin = self._live
        if origin is None or origin.base is not base:  # the registry swapped the live endpoint
            origin = self._live = Origin(base)
        return origin

    def _finish_tee(self, token: object, result: MeterResult, kind: str | None) -> None:
        try:
            self.tee.on_response(token, result, kind)  # type: ignore[union-attr]
        except Exception:
            self.metrics.tee_errors.inc()

    def _request_headers(
        self, request: web.Request, rid: str | None
    ) -> tuple[CIMultiDict[str], str]:
        src = request.headers
        out: CIMultiDict[str] = CIMultiDict()
        copy_end_to_end(src, _REQUEST_SKIP, out)
        remote = request.remote or ""
        xff = src.get("X-Forwarded-For")
        out["X-Forwarded-For"] = f"{xff}, {remote}" if xff else remote
        xfp = src.get("X-Forwarded-Proto")
        out["X-Forwarded-Proto"] = f"{xfp}, {request.scheme}" if xfp else request.scheme
        if rid is None:
            rid = uuid7()
            out[XRID] = rid
        return out, rid

    async def handle(self, request: web.Request) -> web.StreamResponse:
        metrics = self.metrics
        stats = metrics.routes.get(request.path, metrics.other)
        metrics.in_flight.inc()
        read = BodyRead()
        try:
            return await self._forward(request, stats, read)
        finally:
            self.budget.give(read.held)
            metrics.in_flight.dec()

    def _target(self, request: web.Request) -> str | None:
        """The path and query to forward: origin-form as sent; the path of an absolute-form
        target (RFC 9112 §3.2.2: a server must accept it); None for any other form."""
        raw = request.raw_path
        if raw.startswith("/"):
            return raw
        self.metrics.odd_target.inc()
        if raw.startswith(("http://", "https://")):
            return request.rel_url.raw_path_qs
        return None

    async def _forward(
        self, request: web.Request, stats: _RouteStats, read: BodyRead
    ) -> web.StreamResponse:
        rid = request.headers.get(XRID)
        path = self._target(request)
        if path is None:
            stats.count(400)
            return self._error(400, _BAD_TARGET_BODY, rid or uuid7())
        await read_body(request, self.max_body, self.budget, self.body_idle_s, read)
        if read.failure is not None:
            return self._refuse_body(read.failure, stats, rid or uuid7())
        body = read.body
        headers, rid = self._request_headers(request, rid)
        rollout = self.rollout
        arm: int = PRODUCTION
        active: Split | None = None
        key = ""
        if rollout is not None:
            router = rollout.router
            active = router.rollout  # the snapshot arm_for decides with (one thread)
            key = request.headers.get(rollout.session_header) or rid
            arm = router.arm_for(key)
            if active.state != "ramping":
                active = None
        tee = self.tee
        token: object | None = None
        if tee is not None and arm == PRODUCTION:
            try:
                token = tee.on_request(request.method, path, request.headers, body, rid)
            except Exception:
                self.metrics.tee_errors.inc()
        pool = self.pool
        assert pool is not None, "the proxy's upstream pool is not started"
        t0 = perf_counter()
        wd = self.sweeper.watch(t0)
        upstream: UpstreamResponse | None = None
        meter: ResponseMeter | None = None  # set when the answer is stored (the tee's token)
        watch: ResponseMeter | StreamWatch | None = None  # the meter, or a stream's watch
        out: web.StreamResponse | None = None
        status = 0
        first_at = 0.0
        delivered = False  # the client was sent the stream's final event ([DONE] / finish_reason)
        complete = False  # the whole answer went out
        is_sse = relayable = False
        relay: Relay | None = None  # the answer's direct relay (server/stream/), once engaged
        reads = 0  # upstream reads the task carried
        kind: str | None = None  # how it failed, for the ramp's record
        try:
            if active is not None and arm:
                assert rollout is not None
                upstream, failed = await rollout.open(
                    pool, active, request.method, path, headers, body, wd
                )
                if failed is not None:  # production covers; from here a production request
                    reason, failed_status, failed_kind = failed
                    rollout.fallbacks[reason].inc()
                    rollout.record(
                        active, arm, key, "fallback", status=failed_status,
                        error_kind=failed_kind, e2e_s=perf_counter() - t0,
                    )  # fmt: skip
                    active = None
                    wd.close()
                    t0 = perf_counter()
                    wd = self.sweeper.watch(t0)
            if upstream is None:
                upstream = await pool.open(
                    request.method,
                    self._live_origin(),
                    path,
                    headers=headers,
                    data=request_body(body),
                    watchdog=wd,
                )
            status = upstream.status
            up_headers = upstream.headers
            ctype = up_headers.get("Content-Type", "")
            is_sse = relayable = ctype.startswith("text/event-stream")
            if token is not None:  # the answer is stored: every event metered
                watch = meter = ResponseMeter(t0, is_sse=is_sse, text_max_chars=self.text_max)
            elif is_sse:  # only its first token and its final event are needed
                watch = StreamWatch(t0)
            cls = web.StreamResponse if is_sse else _CoalescedResponse
            out = cls(status=status, reason=upstream.reason)
            out_headers = out.headers  # built in place: no intermediate multidict
            copy_end_to_end(up_headers, _RESPONSE_SKIP, out_headers)
            if XRID not in out_headers:
                out_headers[XRID] = rid
            await out.prepare(request)
            while chunk := await read_chunk(upstream, wd):
                now = perf_counter()
                wd.last = now
                if not first_at:
                    first_at = now
                if watch is not None:
                    watch.feed(chunk, now)
                wd.writing = now  # a stall from here on is the client's, not the upstream's
                await out.write(chunk)
                wd.writing = 0.0
                if watch is not None and not delivered:
                    delivered = watch.final_event_seen()
                reads += 1
                if relayable:  # from here on the upstream's reads go to the client directly
                    if relay is None:
                        # (an answer already whole in the body stream has nothing to relay)
                        relay = None if upstream.content.is_eof() else Relay.attach(
                            upstream.connection, upstream.content, request.writer,
                            request.protocol, watch, wd,
                        )  # fmt: skip
                        relayable = relay is not None  # else the task carries it all
                    if relay is not None and not relay.on:
                        await relay.resume()
            if relay is not None:
                relay.stop()
            upstream.release()
            wd.writing = perf_counter()  # the end waits on the client: its deadline applies
            await out.write_eof()
            complete = True
        except UpstreamError as exc:
            kind = rollout_kind(exc)
            return self._upstream_failed(request, exc, stats, out, upstream, meter, token, rid)
        except (asyncio.CancelledError, ConnectionError) as exc:
            if isinstance(exc, asyncio.CancelledError):
                try:
                    wd.check_cancel()
                except UpstreamTimeoutError as timeout:
                    kind = rollout_kind(timeout)
                    return self._upstream_failed(
                        request, timeout, stats, out, upstream, meter, token, rid
                    )
            if relay is not None:
                relay.stop()
                delivered = delivered or relay.delivered
            if not delivered:
                kind = ErrorKind.CLIENT_DISCONNECT
            self._client_gone(stats, upstream, meter, token, status, delivered)
            if isinstance(exc, asyncio.CancelledError):
                raise
            assert out is not None
            return out
        finally:
            wd.close()
            if relay is not None:
                relay.stop()
                delivered = delivered or relay.delivered
            if is_sse:
                self.metrics.stream_reads(reads, 0 if relay is None else relay.reads)
            if upstream is not None:
                upstream.close()  # a no-op once released; else the connection is not reusable
            if active is not None:
                assert rollout is not None
                now = perf_counter()
                ttft: float | None = None
                if watch is not None and watch.first_token_at is not None:
                    ttft = watch.first_token_at - t0
                elif first_at and not is_sse:
                    ttft = first_at - t0
                rollout.record(
                    active, arm, key, status=status, error_kind=kind, ttft_s=ttft,
                    e2e_s=now - t0, finished=delivered or (complete and not is_sse),
                )  # fmt: skip
        end = perf_counter()
        stats.count(status)
        stats.e2e.observe(end - t0)
        if watch is not None and watch.first_token_at is not None:
            stats.ttft.observe(watch.first_token_at - t0)
        elif not is_sse and first_at:
            stats.ttft.observe(first_at - t0)
        if token is not None and meter is not None:
            self._finish_tee(token, meter.finish(end, status), None)
        return out

    def _refuse_body(self, failure: str, stats: _RouteStats, rid: str) -> web.Response:
        if failure == BUSY:
            stats.count(503)
            resp = self._error(503, _BUSY_BODY, rid)
            resp.headers["Retry-After"] = "1"
        elif failure == TIMEOUT:
            stats.count(408)
            resp = self._error(408, self._body_timeout, rid)
        else:
            stats.count(413)
            return self._error(413, self._too_large, rid)
        # The rest of the body is not read: the connection cannot carry another request.
        resp.force_close()
        return resp

    def _error(self, status: int, body: bytes, rid: str) -> web.Response:
        resp = web.Response(status=status, body=body, headers=_ERROR_HEADERS)
        resp.headers[XRID] = rid
        return resp

    def _upstream_failed(
        self,
        request: web.Request,
        exc: UpstreamError,
        stats: _RouteStats,
        out: web.StreamResponse | None,
        upstream: UpstreamResponse | None,
        meter: ResponseMeter | None,
        token: object | None,
        rid: str,
    ) -> web.StreamResponse:
        kind = exc.kind
        timeout = isinstance(exc, UpstreamTimeoutError)
        if timeout and exc.phase == CLIENT_WRITE:  # type: ignore[attr-defined]
            return self._slow_reader(request, stats, upstream, meter, token, out)
        self.metrics.error(TIMEOUT_LABELS.get(exc.phase, ErrorKind.TIMEOUT) if timeout else kind)  # type: ignore[attr-defined]
        if upstream is not None:
            upstream.close()  # drop the connection: the engine must stop generating
        end = perf_counter()
        status = upstream.status if upstream is not None else 0
        if token is not None:
            self._finish_tee(token, _result(meter, end, status), kind)
        if out is not None and out.prepared:
            # Headers (and maybe chunks) already went out: cut the connection so the client
            # sees an incomplete response, never a clean end.
            stats.count(status)
            transport = request.transport
            if transport is not None:
                transport.close()
            return out
        if isinstance(exc, UpstreamTimeoutError):
            stats.count(504)
            return self._error(504, _TIMEOUT_BODIES[exc.phase], rid)
        stats.count(502)
        body = _CONNECT_BODY if kind == ErrorKind.CONNECT else _RESET_BODY
        return self._error(502, body, rid)

    def _slow_reader(
        self,
        request: web.Request,
        stats: _RouteStats,
        upstream: UpstreamResponse | None,
        meter: ResponseMeter | None,
        token: object | None,
        out: web.StreamResponse | None,
    ) -> web.StreamResponse:
        """The client stopped reading for `client_write_timeout_s`: its fault, counted as
        `client_slow_reader` (status 499), the connection cut and the upstream aborted."""
        if upstream is not None:
            upstream.close()
        self.metrics.error(SLOW_READER)
        stats.count(CLIENT_CLOSED)
        if token is not None:
            self._finish_tee(token, _result(meter, perf_counter(), 0), ErrorKind.CLIENT_DISCONNECT)
        transport = request.transport
        if transport is not None:
            transport.abort()  # its buffer is full: a graceful close would wait on it
        assert out is not None
        return out

    def _client_gone(
        self,
        stats: _RouteStats,
        upstream: UpstreamResponse | None,
        meter: ResponseMeter | None,
        token: object | None,
        status: int,
        delivered: bool = False,
    ) -> None:
        if upstream is not None:
            upstream.close()
        if delivered:
            # The client had its final event: closing before the gateway's last write (the SDK
            # does after `[DONE]`) is how an answer ends, not a failure of it.
            stats.count(status)
            self.metrics.closed_after_final.inc()
            if token is not None:
                self._finish_tee(token, _result(meter, perf_counter(), status), None)
            return
        self.metrics.error(ErrorKind.CLIENT_DISCONNECT)
        stats.count(CLIENT_CLOSED)
        if token is not None:
            self._finish_tee(
                token, _result(meter, perf_counter(), status), ErrorKind.CLIENT_DISCONNECT
            )
