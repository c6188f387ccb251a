"""`Mirror`: the mirror process's side of the `RequestTee` interface, owning every candidate lane.

It runs only in the host's mirror process (`gateway.mirror.plane`): the workers' `Handoff`
samples on the request path and the plane turns each COPY frame into `on_request`. There it
takes the worker's decision as given (`only`) or, for a request the worker handed off undecided,
parses the body for the session key and takes the same decision
(`gateway.mirror.sampling.sampler.decide`),
then offers one shared `Copy` to each chosen lane's ring — synchronous, O(candidates), never
awaiting, never copying the body. `on_response` hands the exchange and production's observation
to the sink; each lane hands its candidate's observation when the copy finishes. Both join on
exchange id. Every observation passes the token counter on its way (`replay/tokens.py`: one
tokenizer counts every arm's text, since an SSE event is not a token).

`apply(candidates)` swaps the candidate set at run time: new lanes start, changed ones keep their
queued copies where the new limits allow, removed ones drop their queue (counted) and finish
what is in flight, paused ones get no new copies. `close()` stops offering, lets the lanes drain
for up to `drain_timeout_s`, then cancels what is left (counted).

Candidates with `target_rps` sample with an adaptive share (`gateway.mirror.sampling.rate`): once a
second
the controller turns the host's eligible rate into references, and a change applies at the
instant it names (here, and in every worker through the plane). A lowered session-mode threshold
counts the conversations in progress it cuts; a raised one the conversations it joins mid-way.

Past its capacity the mirror lowers per-candidate capacity shares once a second
(`gateway.mirror.sampling.capacity`, ticked by `sampling/tick.py`, sent with the references),
so the workers shed by hash before building a frame; here it answers the later turns a worker
could not decide (`check`: kept iff their session was admitted) and counts what it sheds by
reason (`shed_reasons`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import xxhash
from multidict import CIMultiDictProxy

from domain.endpoint import Endpoint
from domain.exposition import Exposed
from domain.ids import uuid7
from domain.records import ExchangeRecord, ObservationRecord
from gateway.config.sections import CredentialsConfig, MirrorConfig, StorageConfig, UpstreamConfig
from gateway.lifecycle import finish_tasks
from gateway.mirror import counters as counters_mod
from gateway.mirror.capture import CaptureSink
from gateway.mirror.counters import MirrorCounters
from gateway.mirror.grading.lane import Grading, GradingSink, targets_of
from gateway.mirror.replay.lane import MIRROR_HEADER, Copy, Lane
from gateway.mirror.replay.observe import observation
from gateway.mirror.replay.order import TurnOrder
from gateway.mirror.replay.ring import MemoryBudget
from gateway.mirror.replay.tokens import TokenCounter
from gateway.mirror.replay.validity import CallJudge, Declared
from gateway.mirror.sampling.adaptive import AdaptiveRates
from gateway.mirror.sampling.loopguard import LoopLagGuard
from gateway.mirror.sampling.sampler import (
    SALT,
    Offer,
    RequestView,
    apply_capacity,
    decide_kept,
    hash_key,
    mirrored_route,
    offers_for,
    parse_request,
    session_key,
    turn_index,
)
from gateway.mirror.sampling.tick import SamplingTick
from gateway.mirror.scoring.jobs import Scorer
from gateway.mirror.toolcalls import Checker
from gateway.server.hooks import LiveTarget, ObservationSink
from gateway.server.meter import MeterResult

__all__ = ["Mirror"]


_NO_HEADERS: Mapping[str, str] = {}


def _nothing() -> None:
    return None


class _Token:
    """Returned by `on_request` for a mirrored request; completed by `on_response`."""

    __slots__ = ("body", "headers", "live_name", "record", "tools")

    def __init__(
        self,
        record: ExchangeRecord,
        live_name: str,
        body: bytes,
        headers: Mapping[str, str],
        tools: Declared,
    ) -> None:
        self.record = record
        self.live_name = live_name
        self.tools = tools  # production's calls are judged against the same declaration
        # References (no copy) kept only for the capture sink, released with the token.
        self.body = body
        self.headers = headers


class Mirror(SamplingTick):
    """Samples production requests into per-candidate lanes and reports what they observe."""

    def __init__(
        self,
        live: LiveTarget,
        sink: ObservationSink,
        replica: str,
        *,
        mirror: MirrorConfig,
        upstream: UpstreamConfig,
        storage: StorageConfig,
        credentials: CredentialsConfig,
        session_header: str,
        drain_timeout_s: float,
        capture: CaptureSink | None = None,
    ) -> None:
        self._mirror_cfg = mirror
        self._upstream_cfg = upstream
        self._storage_cfg = storage
        self._credentials_cfg = credentials
        self._drain_timeout_s = drain_timeout_s
        self._capture = capture
        self._live = live
        # Every observation (production's, the candidates', the scorer's) has its output
        # tokens counted by one tokenizer on its way to the real sink (replay/tokens.py).
        self.tokens = TokenCounter(sink, mirror)
        self._sink: ObservationSink = self.tokens
        self._replica = replica
        self._session_header = session_header
        self.budget = MemoryBudget(mirror.memory_budget_bytes)
        # Sheds only on the mirror process's own sustained overload (see loopguard.py).
        self.guard = LoopLagGuard(
            mirror.shed_loop_lag_ms,
            cpu_busy=mirror.shed_cpu_busy or None,
            window_s=mirror.shed_window_s,
        )
        self.process = MirrorCounters()
        self.order = TurnOrder()
        # Every arm's tool calls checked against the request's declared tools (one schema cache).
        self.calls = CallJudge(
            Checker(
                cache_size=mirror.tool_schema_cache, max_schema_bytes=mirror.tool_schema_max_bytes
            ),
            enabled=mirror.tool_check,
        )
        # Scoring copies (scorer.py): production's answer scored by the candidate and control.
        self.scorer = Scorer(mirror, self._sink)
        # A model upgrade's LLM grader (grading/lane.py): after both answers, at idle priority
        # (nothing is sent while the guard sheds copies). Only a sink that stores gradings.
        self.grading = Grading(
            mirror,
            sink if isinstance(sink, GradingSink) else None,
            credentials,
            max_chars=mirror.grading_max_chars,
            busy=lambda: self.guard.shedding,
        )
        self._lanes: dict[str, Lane] = {}
        self._offers: tuple[Offer, ...] = ()
        self._any_session = False  # some offer samples by session (its key may need the body)
        self._retiring: set[asyncio.Task[None]] = set()
        self._started = False
        self._closed = False
        # Sampling toward target_rps: the workers count the eligible requests and report them
        # (`adaptive.control.eligible`); this process sees only the sampled ones.
        self.adaptive = AdaptiveRates(
            self.order,
            lambda: self._offers,
            lambda: [(name, lane.counters.sampled) for name, lane in self._lanes.items()],
        )
        self._init_shares()
        self._tick_task: asyncio.Task[None] | None = None
        # Called when a worker names a candidate this process does not run (the mirror
        # process's registry: `Registry.poke`).
        self.on_unknown_candidate: Callable[[], None] = _nothing

    # ------------------------------------------------------------------ candidate set

    def apply(self, candidates: Sequence[Endpoint]) -> None:
        """Make the lanes match `candidates` (endpoints with another role are ignored)."""
        if self._closed:
            return
        wanted = {e.name: e for e in candidates if e.role == "candidate"}
        for name in [n for n in self._lanes if n not in wanted]:
            self._retire(self._lanes.pop(name))
        for name, endpoint in wanted.items():
            lane = self._lanes.get(name)
            if lane is None:
                lane = Lane(
                    endpoint,
                    self.budget,
                    self._sink,
                    mirror=self._mirror_cfg,
                    upstream=self._upstream_cfg,
                    storage=self._storage_cfg,
                    credentials=self._credentials_cfg,
                    calls=self.calls,
                )
                lane.hold = self._hold
                lane.on_send = self._sending
                lane.on_discard = self._discarding
                self._lanes[name] = lane
                if self._started:
                    lane.start()
            elif lane.endpoint != endpoint:
                lane.update(endpoint)
        self.tokens.choose(self._lanes)
        self.adaptive.forget(wanted)
        self.admitted.forget(wanted)
        self._offers = offers_for(wanted.values(), self.adaptive.refs)
        apply_capacity(self._offers, self.adaptive.capacity)
        self._any_session = any(o.session_mode for o in self._offers)

    def _hold(self, record: ObservationRecord) -> bool:
        """A candidate's finished observation: the grader reads its answer (never holds it),
        the scorer may hold it until its pair is scored."""
        if self.grading.pending:
            self.grading.observed(record)
        return self.scorer.hold(record)

    def _sending(self, exchange_id: str, lane: str) -> None:
        """A worker took a candidate's copy: the jobs waiting for its answer wait its timeout."""
        if self.scorer.pending:
            self.scorer.sent(exchange_id, lane)
        if self.grading.pending:
            self.grading.sent(exchange_id, lane)

    def _discarding(self, exchange_id: str, lane: str) -> None:
        """A candidate's copy left its ring unsent: its answer will never come."""
        if self.scorer.pending:
            self.scorer.discarded(exchange_id, lane)
        if self.grading.pending:
            self.grading.discarded(exchange_id, lane)

    def _retire(self, lane: Lane) -> None:
        lane.stop_offers_and_clear()
        if not self._started:
            lane.ring.detach()
            return
        task = asyncio.get_running_loop().create_task(
            self._finish_retired(lane), name=f"mirror-retire-{lane.name}"
        )
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    @staticmethod
    async def _finish_retired(lane: Lane) -> None:
        try:
            if workers := lane.workers:
                await asyncio.wait(workers)  # in-flight copies end within their timeout
        finally:
            await lane.close()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the loop-lag guard and every lane's workers."""
        if self._started or self._closed:
            return
        self._started = True
        self.guard.start()
        self.grading.start()
        for lane in self._lanes.values():
            lane.start()
        self._tick_task = asyncio.get_running_loop().create_task(
            self._tick_loop(), name="mirror-controllers"
        )

    async def close(self) -> None:
        """Stop offering, drain for up to `drain_timeout_s`, count the rest as dropped."""
        if self._closed:
            return
        self._closed = True
        self._offers = ()
        task, self._tick_task = self._tick_task, None
        await finish_tasks([task] if task is not None else [], 0)
        await self.adaptive.close()
        lanes = list(self._lanes.values())
        for lane in lanes:
            lane.begin_drain()
        pending = [t for lane in lanes for t in lane.workers]
        if pending and self._drain_timeout_s > 0:
            await asyncio.wait(pending, timeout=self._drain_timeout_s)
        for lane in lanes:
            await lane.close()
        await self.scorer.close(self._drain_timeout_s)
        await self.tokens.close(self._drain_timeout_s)
        await self.grading.close(self._drain_timeout_s)
        await finish_tasks(set(self._retiring), 0)
        await self.guard.close()

    async def wait_idle(self) -> None:
        """Return once no lane has a copy queued or in flight."""
        for lane in list(self._lanes.values()):
            await lane.wait_idle()
        await self.scorer.wait_idle()
        await self.tokens.wait_idle()
        await self.grading.wait_idle()

    # ------------------------------------------------------------------ RequestTee

    def on_request(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        request_id: str,
        *,
        exchange_id: str | None = None,
        live_name: str | None = None,
        received_at: float | None = None,
        only: Sequence[str] | None = None,
        replica: str | None = None,
        check: Sequence[str] = (),
    ) -> object | None:
        """Offer copies of a request a worker handed off; O(candidates), never awaits, never
        copies `body`.

        The worker's `exchange_id`, `live_name` and `received_at` are passed, so the records
        match what the worker saw when production served the request; `only` is the worker's
        sampling decision, taken as given (None: the worker left it undecided, so it is taken
        here); `replica` the worker that served production (stored on the exchange); `check`
        the chosen later turns the worker left to this process's admitted sessions."""
        offers = self._offers
        if only is not None:
            offers = tuple(o for o in offers if o.name in only)
            if len(offers) < len(only):
                # Registered since this process last read the registry: counted (the copy is
                # lost), and the registry read at once.
                self.process.unknown_candidate += len(only) - len(offers)
                self.on_unknown_candidate()
        if not offers:
            return None
        route = mirrored_route(method, path_qs)
        if route is None:
            return None
        if MIRROR_HEADER in headers:
            self.process.skipped_loop += 1
            return None
        header_value = headers.get(self._session_header)
        view: RequestView | None = None
        skey = header_value.encode() if header_value else None
        shed: list[Offer] = []
        if only is None:
            first = True
            if self._any_session:
                view = parse_request(body)
                if view is None:
                    self.process.skipped_unparseable += 1
                    return None
                if view.server_state:  # a copy would name a response the candidate never made
                    self.process.skipped_unmirrorable_state += 1
                    return None
                skey = skey or session_key(view, None)
                first = turn_index(view) == 0
            chosen, shed, later, _ = decide_kept(offers, request_id.encode(), skey, first)
        else:
            chosen, later = (
                [o for o in offers if o.name not in check],
                [o for o in offers if o.name in check],
            )
        if later and skey is not None:
            for offer in later:
                admitted = self.admitted.holds(offer.name, skey)
                (chosen if admitted else shed).append(offer)
        if shed:
            self._shed(shed)
        if not chosen:
            return None
        if view is None:
            view = parse_request(body)
            if view is None:
                self.process.skipped_unparseable += 1
                return None
            if view.server_state:  # a copy would name a response the candidate never made
                self.process.skipped_unmirrorable_state += 1
                return None
        return self._offer(
            chosen,
            route,
            path_qs,
            headers,
            body,
            view,
            skey,
            header_value,
            exchange_id or uuid7(),
            live_name or self._live.endpoint.name,
            received_at or time.time(),
            replica or self._replica,
        )

    def _shed(self, shed: list[Offer]) -> None:
        """Count copies shed here under a capacity share (sampled, then shed_capacity)."""
        for offer in shed:
            counters = self._lanes[offer.name].counters
            counters.sampled += 1
            counters.shed_capacity += 1
        self.shed_capacity += len(shed)

    def _offer(
        self,
        chosen: list[Offer],
        route: str,
        path_qs: str,
        headers: CIMultiDictProxy[str],
        body: bytes,
        view: RequestView,
        skey: bytes | None,
        header_value: str | None,
        exchange_id: str,
        live_name: str,
        received_at: float,
        replica: str,
    ) -> _Token | None:
        now = time.perf_counter()
        digest = xxhash.xxh3_128_digest(body)
        shedding = self.guard.shed_fraction > 0 and self.guard.should_shed(digest)
        if skey is None:
            skey = session_key(view, header_value)
        turn = turn_index(view)
        if any(o.session_mode for o in chosen):
            at = time.monotonic()
            h = xxhash.xxh3_64_intdigest(SALT + skey)
            seen = self.order.arrive(skey, turn, h, at)
            if turn > 0 and self.adaptive.changed:
                self.adaptive.count_joined(chosen, h, seen, at)
        copy = Copy(exchange_id, path_qs, headers, body, self.calls.declared(view, route))
        session_digest: bytes | None = None
        accepted: list[Lane] = []
        for offer in chosen:
            lane = self._lanes[offer.name]
            lane.counters.sampled += 1
            if shedding:
                lane.counters.shed_overload += 1
                if offer.session_mode:  # its later turns would reach the candidate headless
                    lane.ring.break_session(skey)
            elif offer.session_mode:
                # Dedup within a conversation only: two sessions opening with the same turn
                # must both reach the candidate, or the second's later turns arrive orphaned.
                if session_digest is None:
                    session_digest = xxhash.xxh3_128_digest(skey + b"\0" + digest)
                # The ring sheds a later turn of a session it broke (`shed_session_broken`).
                if lane.offer(copy, session_digest, skey, now, turn):
                    accepted.append(lane)
                    self.admitted.add(offer.name, skey)
            elif lane.offer(copy, digest, None, now):
                accepted.append(lane)
        if not accepted:
            return None
        targets = [lane.name for lane in accepted]
        if self._started:
            self.scorer.offer(copy.exchange_id, route, body, accepted)
            self.grading.offer(
                copy.exchange_id,
                body,
                targets_of(accepted),
                live_name,
                received_at,
                unit=hash_key(skey),
            )
        record = ExchangeRecord(
            id=copy.exchange_id,
            received_at=received_at,
            route=route,
            model=view.model,
            stream=bool(view.stream),
            temperature=view.temperature,
            session_key=hash_key(skey),
            turn_index=turn,
            request_hash=digest.hex(),
            json_requested=view.json_requested,
            tools_requested=view.tools_requested,
            replica=replica,
            targets=tuple(targets),
        )
        if self._capture is None:  # nothing will read them: do not hold the body until the
            return _Token(record, live_name, b"", _NO_HEADERS, copy.tools)  # production answers
        return _Token(record, live_name, body, headers, copy.tools)

    def on_response(self, token: object, result: MeterResult, error_kind: str | None) -> None:
        """Hand the exchange and production's observation to the sink."""
        if not isinstance(token, _Token):
            return
        record = token.record
        record.prompt_tokens = result.prompt_tokens
        record.cached_tokens = result.cached_tokens
        self._sink.put_exchange(record)
        # CAPTURE SEAM: the exchange record of an accepted copy goes to storage here, so the
        # capture sink (opt-in, O(1), never raises) is offered the same record and its body.
        if self._capture is not None:
            self._capture.offer(record, token.body, token.headers)
        production = observation(
            record.id,
            token.live_name,
            "production",
            record.received_at,
            result,
            error_kind,
            store_text=self._storage_cfg.store_text,
            max_chars=self._storage_cfg.store_text_max_chars,
        )
        self.calls.judge(production, token.tools, result.tool_calls)
        self._sink.put_observation(production)
        if self.scorer.pending:
            ok = production.error_kind is None and not production.tool_calls
            self.scorer.answer(record.id, production.output_text if ok else None)
        if self.grading.pending:  # its text and calls: an agent turn is graded too
            self.grading.answer(production)

    # ------------------------------------------------------------------ export

    def counters(self) -> dict[str, dict[str, int]]:
        """Per-candidate counters, including `pending`, `buffer_items` and `buffer_bytes`, when
        copies were shed by hash (`capacity.LimitTimes`), and the `/tokenize` requests a
        candidate answered for the token counter."""
        when, tokens = self.limit_times.fields, self.tokens.lane_counters
        return {
            name: {**lane.snapshot(), **when(name), **tokens(name)}
            for name, lane in self._lanes.items()
        }

    def process_counters(self) -> dict[str, int]:
        """Process-wide counters: requests never offered to any candidate, by reason, and
        conversation turns that arrived out of order."""
        return {**self.process.as_dict(), "out_of_order_turns": self.order.out_of_order}

    def prometheus_lines(self) -> Iterable[Exposed]:
        """Families and samples, for the metrics registry's `add_collector`."""
        yield from self.tokens.prometheus_lines()
        yield from self.calls.prometheus_lines()
        yield from counters_mod.rate_lines(
            self.rate_stats(), self.adaptive.control.eligible_rps, self.capacity.cuts
        )
        yield from self.grading.prometheus_lines()
        yield from counters_mod.prometheus_lines(
            self.counters(),
            self.process_counters(),
            self.budget.used,
            self.budget.limit,
            self.guard.shedding,
            self.guard.sheds,
            self.guard.max_lag_s,
            self.guard.busy,
            self.guard.shed_fraction,
            self.shed_reasons(),
        )
