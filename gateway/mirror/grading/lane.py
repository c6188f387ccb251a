"""The lane toward each candidate's LLM grader: in the mirror process, after both answers of a
pair are complete; never on the request path, never before production answered its client.

At the offer (synchronous, inside the mirror's loop) a pair is selected for every accepted
candidate that has a grader and whose `rate` covers the exchange (`request.is_graded`). It then
waits, off every latency path, for production's answer (`answer`) and the candidate's finished
observation (`observed`, a look at the record on its way to the sink: nothing is held or
delayed). A complete pair joins a bounded queue; `grading_concurrency` tasks send its gradings,
each one call at a time, and while the mirror sheds load (its loop-lag guard) they send nothing:
grading runs at idle priority behind the copies themselves.

Each grading is capped per candidate: at most `max_per_minute` grader calls in any 60 s and
`daily_token_budget` tokens per UTC day; past either it is recorded `over_cap` without a call
(tokens are known when a call returns, so the gradings in flight may pass the budget by their
own tokens, `grading_concurrency` calls at most).
An unparseable answer is retried once, never guessed. The grader's credential comes from its
own `credentials_env` through the candidates' credentials reader (never a client's header).

An answer is its text and its calls (an agent turn is graded like any other: `prompt` shows
the grader both); a failed answer, or one with neither text nor a call, is no answer.

Bounded: `grading_max_pending` pairs waiting or queued (beyond: `dropped`); a pair whose answers
do not arrive within the candidate's timeout plus a minute is dropped too; each call is bounded
by `grading_timeout_s`. Every grading is counted (graded, tie, unparseable, failed, over cap)
and stored as a `GradingRecord`, with its tokens; so is every pair of a candidate with a grader
that is not graded, one row with its reason (`NOT_GRADED_OUTCOMES`: outside the rate, queue
full, no answer, stopped), so that the report accounts for every complete pair from the shared
store, merged across replicas.

A graded pair whose unit (the session's key hash) falls within the grader's `label_rate`
(`domain.records.is_labelled`, chosen here, before the verdict is known) is also kept for people:
the conversation and both answers exactly as the grader was shown them, handed to the sink's
`put_label_item` (storage.labels). Never with `store_text = false`: the writer keeps none.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Final, Protocol, runtime_checkable

import aiohttp
import msgspec
from yarl import URL

from domain.endpoint import GraderSpec
from domain.exposition import GRADING_FAMILIES, Exposed
from domain.records import GradingOutcome, GradingRecord, LabelItem, ObservationRecord, is_labelled
from gateway.config.sections import CredentialsConfig, MirrorConfig
from gateway.credentials import candidate_credential
from gateway.mirror.grading import request as rq
from gateway.mirror.grading.prompt import Reply, answer_text, conversation_text
from gateway.mirror.replay.wait import CopyWait

__all__ = ["Grading", "GradingCounters", "GradingSink", "LabelSink"]

log = logging.getLogger("canary.mirror.grading")

_WINDOW_S: Final = 60.0  # max_per_minute's window
_PAUSE_S: Final = 0.05  # how often a paused lane looks again (shedding, or nothing to do)
_CHAT: Final = "/v1/chat/completions"
_decode = msgspec.json.Decoder(dict[str, Any]).decode


@runtime_checkable
class GradingSink(Protocol):
    """Receives finished gradings; never blocks (storage.writer.ObservationWriter)."""

    def put_grading(self, record: GradingRecord) -> None: ...


@runtime_checkable
class LabelSink(Protocol):
    """Receives the pairs kept for people; never blocks (storage.writer.ObservationWriter)."""

    def put_label_item(self, item: LabelItem) -> None: ...


@dataclass(slots=True)
class GradingCounters:
    """One candidate's grading accounting (exported as canary_grading_* families)."""

    sampled: int = 0  # pairs selected by the rate
    dropped: int = 0  # pairs not graded: queue full, an answer missing, failed or late
    calls: int = 0  # requests sent to the grader (a retry is a second call)
    graded: int = 0  # gradings with a verdict (ties included)
    tie: int = 0
    unparseable: int = 0
    failed: int = 0
    over_cap: int = 0
    tokens: int = 0  # prompt + completion tokens the grader reported

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class _Pair:
    __slots__ = (
        "body",
        "candidate",
        "candidate_reply",
        "exchange_id",
        "missing",
        "received_at",
        "reference",
        "reference_reply",
        "spec",
        "timeout_s",
        "unit",
        "wait",
        "waiting",
    )

    def __init__(
        self,
        exchange_id: str,
        body: bytes,
        candidate: str,
        reference: str,
        spec: GraderSpec,
        received_at: float,
        unit: str,
    ) -> None:
        self.exchange_id = exchange_id
        self.unit = unit  # the session's key hash (or the exchange id): the labelling unit
        self.body = body  # a reference to the copy's body (shared, never copied)
        self.candidate = candidate
        self.reference = reference
        self.spec = spec
        self.received_at = received_at
        self.reference_reply: Reply | None = None  # production's answer
        self.candidate_reply: Reply | None = None
        self.missing: str | None = None  # why an answer is unusable (a no_answer's error_kind)
        self.waiting = {"production", "candidate"}
        self.wait: CopyWait | None = None
        self.timeout_s = 0.0  # the candidate's copy's


def _reply(record: ObservationRecord, arm: str) -> tuple[Reply | None, str | None]:
    """(the answer the grader reads, None) of a usable observation, else (None, why not)."""
    if record.error_kind is not None:
        return None, f"{arm}_failed"
    calls = record.tool_calls if record.tool_calls not in (None, "", "[]") else None
    if not record.output_text and calls is None:
        return None, f"{arm}_empty"
    return Reply(record.output_text, calls), None


class _Cap:
    """max_per_minute and the daily token budget of one candidate's grader."""

    __slots__ = ("day", "sent", "used")

    def __init__(self) -> None:
        self.sent: deque[float] = deque()  # monotonic send times within the window
        self.day = -1
        self.used = 0

    def allows(self, spec: GraderSpec, now: float, wall: float) -> bool:
        while self.sent and self.sent[0] <= now - _WINDOW_S:
            self.sent.popleft()
        day = int(wall // 86_400)
        if day != self.day:
            self.day, self.used = day, 0
        return len(self.sent) < spec.max_per_minute and self.used < spec.daily_token_budget


class Grading:
    """Every candidate's grader lane of one mirror process."""

    def __init__(
        self,
        config: MirrorConfig,
        sink: GradingSink | None,
        credentials: CredentialsConfig,
        *,
        max_chars: int,
        busy: Callable[[], bool] = lambda: False,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._max = config.grading_max_pending
        self._timeout_s = config.grading_timeout_s
        self._slack_s = config.answer_wait_s
        self._concurrency = config.grading_concurrency
        self._max_chars = max_chars
        self._sink = sink
        self._credentials = credentials
        self._environ = environ
        self._busy = busy
        self._pairs: dict[tuple[str, str], _Pair] = {}
        # The candidates waiting for an exchange's production answer (bounded with _pairs).
        self._by_exchange: dict[str, list[str]] = {}
        self._queue: deque[_Pair] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is queued or in flight
        self._idle.set()
        self._counters: dict[str, GradingCounters] = {}
        self._caps: dict[str, _Cap] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._inflight = 0
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._pairs) + len(self._queue)

    def _count(self, name: str) -> GradingCounters:
        c = self._counters.get(name)
        if c is None:
            c = self._counters[name] = GradingCounters()
        return c

    # ------------------------------------------------------------------ the pair's answers

    def offer(
        self,
        exchange_id: str,
        body: bytes,
        targets: Iterable[tuple[str, GraderSpec | None, float]],
        reference: str,
        received_at: float,
        unit: str | None = None,
    ) -> None:
        """Select the exchange for each (candidate, grader, timeout) whose rate covers it;
        `unit` is the session's key hash (None: the exchange is its own unit)."""
        if self._closed or not self._tasks:
            return
        for name, spec, timeout_s in targets:
            if spec is None:
                continue
            c = self._count(name)
            if not rq.is_graded(exchange_id, spec.rate):
                self._not_graded(exchange_id, name, reference, "not_sampled")
                continue
            c.sampled += 1
            if self.pending >= self._max:
                c.dropped += 1
                self._not_graded(exchange_id, name, reference, "queue_full")
                continue
            pair = _Pair(exchange_id, body, name, reference, spec, received_at, unit or exchange_id)
            pair.timeout_s = timeout_s
            key = (exchange_id, name)
            self._pairs[key] = pair
            self._by_exchange.setdefault(exchange_id, []).append(name)
            pair.wait = CopyWait(
                timeout_s, self._slack_s, functools.partial(self._expire, key), ("candidate",)
            )

    def sent(self, exchange_id: str, candidate: str) -> None:
        """A worker took the candidate's copy: wait for its answer its timeout from now."""
        pair = self._pairs.get((exchange_id, candidate))
        if pair is not None and pair.wait is not None:
            pair.wait.sent("candidate", pair.timeout_s)

    def discarded(self, exchange_id: str, candidate: str) -> None:
        """The candidate's copy left its ring unsent: the pair is not graded (no_answer)."""
        key = (exchange_id, candidate)
        pair = self._pairs.get(key)
        if pair is None or "candidate" not in pair.waiting:
            return
        pair.missing = pair.missing or "not_sent"
        self._arrived(key, pair, "candidate")

    def answer(self, record: ObservationRecord) -> None:
        """Production's finished observation: its text and calls are the reference answer."""
        names = self._by_exchange.pop(record.exchange_id, ())
        if not names:
            return
        reply, missing = _reply(record, "production")
        for name in names:
            key = (record.exchange_id, name)
            pair = self._pairs.get(key)
            if pair is not None:
                pair.reference_reply = reply
                pair.missing = pair.missing or missing
                self._arrived(key, pair, "production")

    def observed(self, record: ObservationRecord) -> None:
        """A candidate's finished observation, on its way to the sink (never held)."""
        key = (record.exchange_id, record.endpoint)
        pair = self._pairs.get(key)
        if pair is None:
            return
        pair.candidate_reply, missing = _reply(record, "candidate")
        pair.missing = pair.missing or missing
        self._arrived(key, pair, "candidate")

    def _arrived(self, key: tuple[str, str], pair: _Pair, who: str) -> None:
        pair.waiting.discard(who)
        if pair.waiting:
            return
        del self._pairs[key]
        if pair.wait is not None:
            pair.wait.cancel()
        if pair.reference_reply is None or pair.candidate_reply is None:
            self._count(pair.candidate).dropped += 1
            self._not_graded(
                pair.exchange_id, pair.candidate, pair.reference, "no_answer", pair.missing
            )
            return
        self._queue.append(pair)
        self._idle.clear()
        self._wake.set()

    def _expire(self, key: tuple[str, str]) -> None:
        pair = self._pairs.pop(key, None)
        if pair is not None:
            self._count(pair.candidate).dropped += 1
            self._not_graded(pair.exchange_id, pair.candidate, pair.reference, "no_answer", "late")
        waiting = self._by_exchange.get(key[0])
        if waiting is not None and key[1] in waiting:
            waiting.remove(key[1])
            if not waiting:
                del self._by_exchange[key[0]]

    def _not_graded(
        self,
        exchange_id: str,
        candidate: str,
        reference: str,
        outcome: GradingOutcome,
        error: str | None = None,
    ) -> None:
        """Store why a pair is not graded: one row, no call (the report's accounting)."""
        if self._sink is not None:
            self._sink.put_grading(
                GradingRecord(
                    exchange_id=exchange_id,
                    endpoint=candidate,
                    reference=reference,
                    graded_at=time.time(),
                    candidate_first=False,
                    swapped=False,
                    outcome=outcome,
                    attempts=0,
                    error_kind=error,
                )
            )

    # ------------------------------------------------------------------ the grader calls

    def start(self) -> None:
        """Open the lane's session and start its tasks (needs a running loop)."""
        if self._tasks or self._closed or self._sink is None:
            return
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            connector=aiohttp.TCPConnector(limit=self._concurrency),
        )
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name=f"mirror-grading-{i}")
            for i in range(self._concurrency)
        ]

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if not self._inflight:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._busy():  # idle priority: the copies first
                await asyncio.sleep(_PAUSE_S)
                continue
            pair = self._queue.popleft()
            self._inflight += 1
            try:
                await self._grade(pair)
            except asyncio.CancelledError:
                raise
            except Exception:  # a grader's failure never ends the lane
                log.exception("grading failed", extra={"fields": {"candidate": pair.candidate}})
            finally:
                self._inflight -= 1
                if not self._queue and not self._inflight:
                    self._idle.set()

    async def _grade(self, pair: _Pair) -> None:
        try:
            request = _decode(pair.body)
        except msgspec.DecodeError:  # the mirror parsed it already: not seen in practice
            self._count(pair.candidate).dropped += 1
            self._not_graded(
                pair.exchange_id, pair.candidate, pair.reference, "no_answer", "request_not_json"
            )
            return
        assert pair.candidate_reply is not None and pair.reference_reply is not None
        conversation = conversation_text(request, self._max_chars)
        cand_text, cand_len = answer_text(pair.candidate_reply, self._max_chars)
        ref_text, ref_len = answer_text(pair.reference_reply, self._max_chars)
        if is_labelled(pair.unit, pair.spec.label_rate) and isinstance(self._sink, LabelSink):
            self._sink.put_label_item(
                LabelItem(
                    exchange_id=pair.exchange_id,
                    endpoint=pair.candidate,
                    reference=pair.reference,
                    unit=pair.unit,
                    graded_at=time.time(),
                    conversation=conversation,
                    candidate_answer=cand_text,
                    reference_answer=ref_text,
                )
            )
        for first, swapped in rq.orders(pair.exchange_id, pair.spec.swap_rate):
            body = rq.grader_body(
                pair.spec, conversation, cand_text, ref_text, candidate_shown_first=first
            )
            record = await self._one(pair, body, first)
            record.swapped = swapped
            record.candidate_chars, record.reference_chars = cand_len, ref_len
            if self._sink is not None:
                self._sink.put_grading(record)
            await asyncio.sleep(0)  # let the copies' work run between gradings

    async def _one(self, pair: _Pair, body: bytes, first: bool) -> GradingRecord:
        """One grading in one order: at most two calls (one retry when unparseable)."""
        c = self._count(pair.candidate)
        cap = self._caps.setdefault(pair.candidate, _Cap())
        outcome: GradingOutcome = "failed"
        label: rq.Label | None = None
        tokens = [0, 0]
        attempts = 0
        error: str | None = None
        started = time.monotonic()
        while attempts < 2:
            if not cap.allows(pair.spec, time.monotonic(), time.time()):
                outcome = "over_cap" if attempts == 0 else outcome
                break
            attempts += 1
            cap.sent.append(time.monotonic())
            c.calls += 1
            try:
                status, answer = await self._post(pair.spec, pair.candidate, body)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                outcome, error = "failed", "timeout" if isinstance(exc, TimeoutError) else "connect"
                break
            if status != 200:
                outcome, error = "failed", f"http_{status // 100}xx"
                break
            parsed = rq.parse_answer(answer)
            tokens[0] += parsed.prompt_tokens
            tokens[1] += parsed.completion_tokens
            spent = parsed.prompt_tokens + parsed.completion_tokens
            cap.used += spent
            c.tokens += spent
            if parsed.label is not None:
                outcome, label = "graded", parsed.label
                break
            outcome = "unparseable"
        if outcome == "graded":
            c.graded += 1
            c.tie += label == "tie"
        elif outcome == "unparseable":
            c.unparseable += 1
        elif outcome == "over_cap":
            c.over_cap += 1
        else:
            c.failed += 1
        return GradingRecord(
            exchange_id=pair.exchange_id,
            endpoint=pair.candidate,
            reference=pair.reference,
            graded_at=time.time(),
            candidate_first=first,
            swapped=False,
            outcome=outcome,
            winner=rq.winner_of(label, first) if label is not None else None,
            prompt_tokens=tokens[0],
            completion_tokens=tokens[1],
            latency_s=time.monotonic() - started if attempts else None,
            attempts=attempts,
            error_kind=error,
        )

    async def _post(self, spec: GraderSpec, candidate: str, body: bytes) -> tuple[int, bytes]:
        assert self._session is not None
        headers = {"Content-Type": "application/json"}
        token = candidate_credential(
            self._credentials, candidate, spec.credentials_env, self._environ
        )
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = URL(spec.url.rstrip("/") + _CHAT, encoded=True)
        async with asyncio.timeout(self._timeout_s):
            async with self._session.post(url, data=body, headers=headers) as resp:
                return resp.status, await resp.read()

    # ------------------------------------------------------------------ lifecycle, export

    async def wait_idle(self) -> None:
        """Return once nothing is queued (pairs still waiting for an answer are not awaited)."""
        if self._tasks:
            await self._idle.wait()

    async def close(self, timeout_s: float) -> None:
        """Grade what is queued for up to `timeout_s`, then stop; the rest counts dropped."""
        self._closed = True
        if self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._idle.wait()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for pair in [*self._queue, *self._pairs.values()]:
            if pair.wait is not None:
                pair.wait.cancel()
            self._count(pair.candidate).dropped += 1
            self._not_graded(pair.exchange_id, pair.candidate, pair.reference, "stopped")
        self._queue.clear()
        self._pairs.clear()
        self._by_exchange.clear()
        if self._session is not None:
            await self._session.close()

    def counters(self) -> dict[str, dict[str, int]]:
        return {name: c.as_dict() for name, c in self._counters.items()}

    def prometheus_lines(self) -> Iterable[Exposed]:
        """Every grading family; before any candidate with a grader has a pair, each at 0 with
        no candidate (an empty label is no label), so the board's series exist from start-up."""
        values = {name: c.as_dict() for name, c in self._counters.items()}
        for key, family in GRADING_FAMILIES.items():  # each family's samples in its own block
            yield family
            if not values:
                yield family.sample(0, "")
            for name, counts in values.items():
                yield family.sample(counts[key], name)


def targets_of(lanes: Sequence[Any]) -> list[tuple[str, GraderSpec | None, float]]:
    """(name, grader, timeout) of each accepted lane (`gateway.mirror.replay.lane.Lane`)."""
    return [(lane.name, lane.endpoint.grader, lane.endpoint.timeout_s) for lane in lanes]
