"""Scoring copies: after a pair's latency copies finished, the candidate (and the control) score
production's answer on the same conversation (`gateway.mirror.scoring.forced` builds and reads
them).

Selection happens when a copy is offered: an exchange is scored for a candidate when
`xxh3_64("score" + exchange id) / 2**64 < share` (the candidate's `score_rate`, else its kind's
default: `domain.kinds.SCORE_RATES`), so one exchange is scored for every candidate whose share
covers it; a control whose ring took the same copy is scored beside it. A job then waits, off
every latency path, for production's answer and for each scored arm's latency copy (their
observations are held here, not written, until their scores are in: the copy itself is never
delayed or altered, and scoring never enters its measurement). Then each arm is asked, at most
`score_concurrency` scoring requests per endpoint at once; production's engine never is.

Bounded: at most `score_max_pending` jobs at once (beyond: `score_dropped`); a job whose events
do not all arrive in time (`gateway.mirror.replay.wait`: each arm's timeout plus
`answer_wait_s`, counted from when a worker takes its copy) writes what it holds unscored
(`score_dropped`), and an arm whose copy left its ring unsent is not scored (`score_dropped`).
Every scoring copy is counted on the endpoint asked (domain.accounting's scoring identity).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import xxhash

from domain.records import ObservationRecord
from gateway.config.sections import MirrorConfig
from gateway.lifecycle import finish_tasks
from gateway.mirror.replay.lane import Lane
from gateway.mirror.replay.wait import CopyWait
from gateway.mirror.scoring import forced as scoring
from gateway.server.hooks import ObservationSink
from gateway.server.upstream import UpstreamError

__all__ = ["Scorer", "selected"]

_PRODUCTION: Final = "\0production"
_SALT: Final = b"canary-score\0"
# Answers meaning "this engine cannot score so" (an older engine, parameters refused).
_UNSUPPORTED: Final = frozenset({400, 404, 405, 422, 501})
_decode = msgspec.json.Decoder(dict[str, Any]).decode


def selected(exchange_id: str, share: float) -> bool:
    """Whether an exchange is scored at `share` (nested: a smaller share scores a subset)."""
    return share > 0 and xxhash.xxh3_64_intdigest(_SALT + exchange_id.encode()) < share * 2**64


class _Job:
    __slots__ = (
        "answer",
        "arms",
        "body",
        "control",
        "held",
        "route",
        "settled",
        "wait",
        "waiting",
    )

    def __init__(self, route: str, body: bytes, arms: list[Lane], control: str | None) -> None:
        self.route = route
        self.body = body  # a reference to the copy's body (shared, never copied)
        self.arms = {lane.name: lane for lane in arms}
        self.control = control
        self.waiting = {*self.arms, _PRODUCTION}
        self.held: dict[str, ObservationRecord] = {}
        self.answer: str | None = None
        self.wait: CopyWait | None = None
        self.settled: set[str] = set()  # arms whose scoring copy was counted


class Scorer:
    """Scoring jobs of one mirror process."""

    def __init__(self, config: MirrorConfig, sink: ObservationSink) -> None:
        self._k = config.score_logprobs
        self._concurrency = config.score_concurrency
        self._max = config.score_max_pending
        self._slack_s = config.answer_wait_s
        self._sink = sink
        self._jobs: dict[str, _Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._jobs)

    def offer(self, exchange_id: str, route: str, body: bytes, targets: list[Lane]) -> None:
        """Select the exchange for scoring (synchronous; at the offer, inside the loop)."""
        scored = [lane for lane in targets if selected(exchange_id, lane.score_share)]
        if not scored or self._closed:
            return
        control = next((lane for lane in targets if lane.is_control), None)
        arms = scored + ([control] if control is not None else [])
        for lane in arms:
            lane.counters.score_sampled += 1
        if len(self._jobs) >= self._max:
            for lane in arms:
                lane.counters.score_dropped += 1
            return
        for lane in arms:
            lane.counters.score_pending += 1
        job = _Job(route, body, arms, control.name if control is not None else None)
        self._jobs[exchange_id] = job
        job.wait = CopyWait(
            max(lane.endpoint.timeout_s for lane in arms),
            self._slack_s,
            lambda: self._expire(exchange_id),
            job.arms,
        )

    def sent(self, exchange_id: str, arm: str) -> None:
        """A worker took `arm`'s copy of the exchange: wait for it its timeout from now."""
        job = self._jobs.get(exchange_id)
        if job is not None and job.wait is not None and arm in job.arms:
            job.wait.sent(arm, job.arms[arm].endpoint.timeout_s)

    def discarded(self, exchange_id: str, arm: str) -> None:
        """`arm`'s copy left its ring unsent: that arm is not scored (score_dropped); with no
        candidate left to score, neither is the job."""
        job = self._jobs.get(exchange_id)
        if job is None or arm not in job.waiting or arm not in job.arms:
            return
        lane = job.arms.pop(arm)
        lane.counters.score_pending -= 1
        lane.counters.score_dropped += 1
        if job.wait is not None:
            job.wait.discarded(arm)
        if arm == job.control:
            job.control = None
        if all(name == job.control for name in job.arms):
            del self._jobs[exchange_id]
            if job.wait is not None:
                job.wait.cancel()
            self._give_up(job)
            return
        self._arrived(exchange_id, job, arm)

    def hold(self, record: ObservationRecord) -> bool:
        """Keep an arm's finished observation until its pair is scored; False: not ours."""
        job = self._jobs.get(record.exchange_id)
        if job is None or record.endpoint not in job.waiting:
            return False
        job.held[record.endpoint] = record
        self._arrived(record.exchange_id, job, record.endpoint)
        return True

    def answer(self, exchange_id: str, text: str | None) -> None:
        """Production's answer to an exchange (None: it failed or kept no text)."""
        job = self._jobs.get(exchange_id)
        if job is None or _PRODUCTION not in job.waiting:
            return
        job.answer = text or None
        self._arrived(exchange_id, job, _PRODUCTION)

    def _arrived(self, exchange_id: str, job: _Job, who: str) -> None:
        job.waiting.discard(who)
        if job.waiting:
            return
        if job.wait is not None:
            job.wait.cancel()
        task = asyncio.get_running_loop().create_task(
            self._run(exchange_id, job), name=f"mirror-score-{exchange_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _expire(self, exchange_id: str) -> None:
        job = self._jobs.pop(exchange_id, None)
        if job is not None:
            self._give_up(job)

    def _give_up(self, job: _Job) -> None:
        """Write what a job holds unscored; its scoring copies count as dropped."""
        for lane in job.arms.values():
            lane.counters.score_pending -= 1
            lane.counters.score_dropped += 1
        for record in job.held.values():
            self._sink.put_observation(record)

    async def _run(self, exchange_id: str, job: _Job) -> None:
        try:
            if job.answer is None:
                self._give_up(job)
                return
            try:
                request = _decode(job.body)
            except msgspec.DecodeError:
                self._give_up(job)
                return
            names = list(job.arms)
            results = await asyncio.gather(
                *(self._score(job.arms[n], job, request, job.answer) for n in names)
            )
            by_name = dict(zip(names, results, strict=True))
            reference = by_name.get(job.control) if job.control is not None else None
            for name, got in by_name.items():
                record = job.held.get(name)
                if record is None:
                    continue
                if isinstance(got, scoring.Scored):
                    record.score_tokens = got.tokens
                    record.score_logprob = got.logprob
                    record.score_top1 = got.top1
                    if isinstance(reference, scoring.Scored) and name != job.control:
                        kl = scoring.topk_kl(reference.topk, got.topk)
                        record.score_kl = kl if math.isfinite(kl) else None
                elif got == "unsupported":
                    record.score_tokens = 0
            for record in job.held.values():
                self._sink.put_observation(record)
        except asyncio.CancelledError:
            for lane in job.arms.values():
                if lane.name not in job.settled:  # cancelled before it was sent
                    lane.counters.score_pending -= 1
                    lane.counters.score_dropped += 1
            for record in job.held.values():
                self._sink.put_observation(record)
            raise
        finally:
            self._jobs.pop(exchange_id, None)

    async def _score(
        self, lane: Lane, job: _Job, request: Mapping[str, Any], answer: str
    ) -> scoring.Scored | str:
        """One arm's scores, or "unsupported" / "failed"; counted when it ends."""
        outcome: scoring.Scored | str = "failed"
        gate = self._gates.get(lane.name)
        if gate is None:
            gate = self._gates[lane.name] = asyncio.Semaphore(self._concurrency)
        try:
            async with gate:
                outcome = await self._ask(lane, job.route, request, answer)
        except scoring.ScoringUnsupported:
            outcome = "unsupported"
        except (UpstreamError, TimeoutError, scoring.ScoringError, OSError):
            outcome = "failed"
        finally:
            job.settled.add(lane.name)
            c = lane.counters
            c.score_pending -= 1
            c.score_sent += 1
            if isinstance(outcome, scoring.Scored):
                c.score_ok += 1
            elif outcome == "unsupported":
                c.score_unsupported += 1
            else:
                c.score_failed += 1
        return outcome

    async def _ask(
        self, lane: Lane, route: str, request: Mapping[str, Any], answer: str
    ) -> scoring.Scored:
        model = lane.model or request.get("model")
        prefix_body = scoring.prefix_request(route, request, lane.model)
        full_body = scoring.full_request(route, request, answer, lane.model)
        if prefix_body is None or full_body is None:
            raise scoring.ScoringError("nothing to score in this request")
        prefix = len(scoring.parse_ids(await _checked(lane, "/tokenize", prefix_body)))
        ids = scoring.parse_ids(await _checked(lane, "/tokenize", full_body))
        if len(ids) <= prefix:
            raise scoring.ScoringError("production's answer adds no token")
        answer_body = await _checked(
            lane,
            "/v1/completions",
            scoring.score_request(ids, model if isinstance(model, str) else None, self._k),
        )
        return scoring.parse_scores(answer_body, ids, prefix)

    async def wait_idle(self) -> None:
        """Return once no scoring request is in flight (jobs still waiting are not awaited)."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self, timeout_s: float) -> None:
        """Let running jobs finish for up to `timeout_s`, cancel the rest; write every held
        observation (unscored where it was not scored)."""
        self._closed = True
        await finish_tasks(set(self._tasks), timeout_s)
        jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            if job.wait is not None:
                job.wait.cancel()
            self._give_up(job)


async def _checked(lane: Lane, path: str, body: bytes) -> bytes:
    status, answer = await lane.post_json(path, body)
    if status in _UNSUPPORTED:
        raise scoring.ScoringUnsupported(f"{path}: {status}")
    if status != 200:
        raise scoring.ScoringError(f"{path}: {status}")
    return answer
