"""`RolloutRoute`: a worker's share of the ramp, in one object as a mitmproxy addon holds its
options, hooks and metrics: the `ArmRouter` that picks each session's arm, the fast `ArmGuard`
on the candidate, where each request's evidence goes (`hooks.RolloutSink`) and who makes a guard
trip durable (`hooks.RolloutGuard`), the candidate's upstream (`open`, with the fallback to
production) and every `canary_rollout_*` series, bound once.

The proxy (`gateway.server.proxy`) asks `router.arm_for` on every request and, while a rollout
is ramping, opens the candidate through `open` and reports each request's end to `record`. Only
counting and a struct per request of an open rollout happen here: never a log, never an await
but the candidate's upstream, never an exception toward the client (a sink or hook error is
counted and swallowed).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import xxhash
from multidict import CIMultiDict

from domain.exposition import Family, Sample
from domain.outcomes import ErrorKind
from domain.records import RolloutRequest
from gateway.config.sections import RolloutConfig
from gateway.rollout.arms import GUARD_BURST, GUARD_CONSECUTIVE, ArmGuard, ArmRouter, Split
from gateway.rollout.hooks import RolloutGuard, RolloutSink
from gateway.server.deadlines import CLIENT_WRITE, Watchdog
from gateway.server.hooks import LiveTarget
from gateway.server.prometheus import Exporter
from gateway.server.upstream import (
    Origin,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeoutError,
    request_body,
)

__all__ = ["RolloutRoute", "rollout_kind", "session_hash"]

# The ramp's label sets, every series exported at 0 from start.
ARMS = ("production", "candidate")  # by arm index
OUTCOMES = ("ok", "error", "fallback")
FALLBACK_REASONS = ("connect", "reset", "status_5xx", "timeout")
ROLLBACK_REASONS = ("harm", GUARD_CONSECUTIVE, GUARD_BURST, "operator")
ROUTER_STATES = ("idle", "ramping", "rolled_back")
# Failures of an arm (with any 5xx status); a client going away or the gateway stopping is not.
_ARM_FAILURES = frozenset({ErrorKind.CONNECT, ErrorKind.RESET, ErrorKind.TIMEOUT})
_SIGN = 1 << 63
_WRAP = 1 << 64
ROLLOUT_WEIGHT = Family(
    "canary_rollout_weight", "gauge", "Share of new sessions the candidate serves, in percent."
)
ROLLOUT_STATE = Family(
    "canary_rollout_state",
    "gauge",
    "This worker's router state (idle, ramping, rolled_back): 1 for the current.",
    ("state",),
)
ROLLOUT_SESSIONS = Family(
    "canary_rollout_sessions_total",
    "counter",
    "Sessions this worker first saw (new), forgot with a full table (evicted), stored in the "
    "slot of an idle one (reclaimed).",
    ("kind",),
)


def session_hash(key: str) -> int:
    """The unsalted xxh3_64 of a session key as a signed int64 (the ramp's session unit)."""
    # surrogateescape: a header holding bytes that are not UTF-8 hashes as its wire bytes.
    h = xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape"))
    return h - _WRAP if h >= _SIGN else h


class RolloutRoute:
    """A worker's share of the ramp: its `ArmRouter`, its fast guard, where its evidence goes
    (`sink`) and who makes a trip durable (`hook`; None: the guard acts on this worker only),
    with every metric series bound once. `sink` and `hook` may be set after construction."""

    __slots__ = (
        "_candidate",
        "fallbacks",
        "guard",
        "hook",
        "requests",
        "retry",
        "rollbacks",
        "router",
        "session_header",
        "sink",
        "sink_errors",
        "trip_errors",
    )

    def __init__(
        self,
        router: ArmRouter,
        config: RolloutConfig,
        registry: Exporter,
        *,
        session_header: str,
        sink: RolloutSink | None = None,
        hook: RolloutGuard | None = None,
    ) -> None:
        self.router = router
        self._candidate: Origin | None = None
        self.session_header = session_header
        self.retry = config.retry_on_production
        self.sink = sink
        self.hook = hook
        self.guard = ArmGuard(
            consecutive=config.guard_consecutive_failures,
            window=config.guard_burst_window,
            burst=config.guard_burst_failures,
        )
        requests = registry.counter(
            "canary_rollout_requests_total",
            "Requests of an open rollout by arm and outcome (fallback: the candidate failed "
            "before the first byte and production answered).",
            ("arm", "outcome"),
        )
        self.requests = tuple(
            {outcome: requests.labels(arm, outcome) for outcome in OUTCOMES} for arm in ARMS
        )
        fallbacks = registry.counter(
            "canary_rollout_fallbacks_total",
            "Candidate failures before the first byte retried on production, by reason.",
            ("reason",),
        )
        self.fallbacks = {reason: fallbacks.labels(reason) for reason in FALLBACK_REASONS}
        rollbacks = registry.counter(
            "canary_rollout_rollbacks_total",
            "Rollouts this worker sent back to production, by reason.",
            ("reason",),
        )
        self.rollbacks = {reason: rollbacks.labels(reason) for reason in ROLLBACK_REASONS}
        self.sink_errors = registry.counter(
            "canary_rollout_sink_errors_total", "Exceptions raised by the ramp sink (swallowed)."
        )
        self.trip_errors = registry.counter(
            "canary_rollout_trip_errors_total",
            "Exceptions raised by the rollout guard hook (swallowed; the local rollback stands).",
        )
        registry.add_collector(self.samples)

    def samples(self) -> list[Sample]:
        """The router's weight, state and session counts, read at scrape time."""
        rollout = self.router.rollout
        counts = self.router.counters()
        return [
            ROLLOUT_WEIGHT.sample(rollout.weight * 100.0),
            *(ROLLOUT_STATE.sample(float(rollout.state == s), s) for s in ROUTER_STATES),
            ROLLOUT_SESSIONS.sample(counts["new_sessions"], "new"),
            ROLLOUT_SESSIONS.sample(counts["evicted"], "evicted"),
            ROLLOUT_SESSIONS.sample(counts["reclaimed"], "reclaimed"),
        ]

    def record(
        self, active: Split, arm: int, key: str, label: str | None = None, /, **outcome: Any
    ) -> None:
        """One request of the ramp is over, its `outcome` given by the fields of
        `domain.observation.Outcome` (declared there, never spelled here): count it under `label`
        (else ok or error), hand its record to the sink, and feed the guard with a candidate's
        outcome (tripping it rolls this worker back at once)."""
        request = RolloutRequest(
            generation=active.generation, arm=arm, session=session_hash(key), at=time.time(),
            **outcome,
        )  # fmt: skip
        status = request.status
        failed = status >= 500 or request.error_kind in _ARM_FAILURES
        if request.error_kind is None and status >= 500:
            request = msgspec.structs.replace(request, error_kind=ErrorKind.HTTP_5XX)
        self.requests[arm][label or ("error" if failed else "ok")].inc()
        sink = self.sink
        if sink is not None:
            try:
                sink.put_rollout(request)
            except Exception:
                self.sink_errors.inc()
        if arm:
            reason = self.guard.observe(active.generation, failed, request.session)
            if reason is not None:
                self.trip(active, reason)

    async def open(
        self,
        pool: UpstreamPool,
        active: Split,
        method: str,
        path: str,
        headers: CIMultiDict[str],
        body: bytes,
        wd: Watchdog,
    ) -> tuple[UpstreamResponse | None, tuple[str, int, str] | None]:
        """Open the candidate's response. With `retry_on_production`, a failure before its
        headers, or a 5xx status (checked before anything goes to the client), returns
        (None, (fallback reason, status, error kind)) for production to cover."""
        target: LiveTarget = active.candidate  # type: ignore[assignment]
        base = target.base_url
        origin = self._candidate
        if origin is None or origin.base is not base:
            origin = self._candidate = Origin(base)
        if not self.retry:
            return await pool.open(
                method, origin, path, headers=headers, data=request_body(body), watchdog=wd
            ), None  # fmt: skip
        try:
            upstream = await pool.open(
                method, origin, path, headers=headers, data=request_body(body), watchdog=wd
            )
        except UpstreamError as exc:
            kind = exc.kind
            reason = (
                "timeout"
                if isinstance(exc, UpstreamTimeoutError)
                else "connect"
                if kind == ErrorKind.CONNECT
                else "reset"
            )
            return None, (reason, 0, kind)
        if upstream.status >= 500:
            status = upstream.status
            upstream.close()
            return None, ("status_5xx", status, ErrorKind.HTTP_5XX)
        return upstream, None

    def trip(self, active: Split, reason: str) -> None:
        """Everything back to production on this worker now; the hook spreads it."""
        router = self.router
        current = router.rollout
        if current.generation != active.generation:
            return  # the rollout already moved on (rolled back, completed): nothing to undo
        router.swap(current.rolled_back())
        self.rollbacks[reason].inc()
        hook = self.hook
        if hook is not None:
            try:
                hook.trip(active.generation, reason, self.guard.evidence())
            except Exception:
                self.trip_errors.inc()


def rollout_kind(exc: UpstreamError) -> str:
    """The ramp's error kind of an exchange failure: a client that stopped reading is the
    client's, not the arm's."""
    if isinstance(exc, UpstreamTimeoutError) and exc.phase == CLIENT_WRITE:
        return ErrorKind.CLIENT_DISCONNECT
    return exc.kind
