"""Scoring copies in the mirror: selection, the three requests to the simulated engines, the
scores kept per arm, the accounting identity, bounds, and what never happens (production is
never asked, latency copies are not altered)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgspec
import pytest
import uvloop

from domain.accounting import identity_holds
from domain.endpoint import Endpoint
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.scoring import forced as scoring
from gateway.mirror.scoring.jobs import selected
from gateway.mirror.tee import Mirror
from gateway.server.meter import MeterResult
from gateway.sim.engine import prompt_logprobs
from tests.mirror.test_mirror_lane import Run, chat, headers, make_mirror, quiesce, sim, sim_log

ANSWER = "The stream is closed after each line of text the parser reads."


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Run[Any]:
    """Runs a scenario to completion on a fresh loop of the parametrised kind."""
    factory = uvloop.new_event_loop if request.param == "uvloop" else None

    def runner(coro: Any) -> Any:
        with asyncio.Runner(loop_factory=factory) as r:
            return r.run(coro)

    return runner


def _send(mirror: Mirror, i: int, answer: str | None = ANSWER) -> object:
    body = chat(f"question {i} about the stream", "and the parser?")
    token = mirror.on_request("POST", "/v1/chat/completions", headers(), body, f"req-{i}")
    if token is not None:
        result = MeterResult(status=200, is_sse=False, text=answer)
        mirror.on_response(token, result, None)
    return token


async def _settle(mirror: Mirror) -> None:
    await quiesce(mirror)
    async with asyncio.timeout(10):
        while mirror.scorer.pending:
            await asyncio.sleep(0.01)
            await mirror.wait_idle()


def test_scores_candidate_and_control_never_production(run: Run[None]) -> None:
    """A quantized candidate and its control score production's answer; the candidate's
    logprobs are lower by the simulator's shift, the control's KL is not computed, and every
    scoring copy is counted in the identity."""

    async def scenario() -> None:
        quant = await sim("quantized")
        ctrl = await sim("control")
        sink = InMemorySink()
        eps = [
            Endpoint(name="q", url=quant.url, kind="quantized", sample_rate=1.0, score_rate=1.0),
            Endpoint(name="k", url=ctrl.url, kind="control", sample_rate=1.0),
        ]
        mirror = make_mirror(eps, sink)
        await mirror.start()
        try:
            for i in range(6):
                assert _send(mirror, i) is not None
            await _settle(mirror)
        finally:
            await mirror.close()
            log_q, log_k = await sim_log(quant), await sim_log(ctrl)
            await quant.close()
            await ctrl.close()
        by = {(o.endpoint, o.exchange_id): o for o in sink.observations}
        exchanges = [e.id for e in sink.exchanges]
        assert len(exchanges) == 6
        for ex in exchanges:
            q, k, p = by[("q", ex)], by[("k", ex)], by[("live", ex)]
            assert p.score_tokens is None and p.score_logprob is None  # production never scored
            assert q.score_tokens and q.score_tokens == k.score_tokens
            assert q.score_logprob is not None and k.score_logprob is not None
            assert q.score_logprob == pytest.approx(k.score_logprob - 0.1, abs=1e-6)
            assert q.score_top1 is not None and k.score_top1 is not None
            assert q.score_top1 <= k.score_top1
            assert q.score_kl is not None and q.score_kl >= 0 and k.score_kl is None
            assert q.ttft_s is not None and q.status == 200  # the latency copy, unaltered
        paths = [e["path"] for e in log_q]
        assert paths.count("/v1/chat/completions") == 6  # latency copies
        assert paths.count("/v1/completions") == 6  # scoring copies (sim_log: /v1/ only)
        assert [e["path"] for e in log_k].count("/v1/completions") == 6
        counters = mirror.counters()
        for name in ("q", "k"):
            c = counters[name]
            assert identity_holds(c), c
            assert c["score_sampled"] == c["score_ok"] == 6 and c["score_pending"] == 0

    run(scenario())


def test_unsupported_engine_and_share(run: Run[None]) -> None:
    """An engine that refuses prompt logprobs is counted `score_unsupported` with
    score_tokens 0; a candidate with no score_rate of a kind without a default is not scored."""

    async def scenario() -> None:
        old = await sim("quantized", prompt_logprobs=False)
        plain = await sim("baseline")
        sink = InMemorySink()
        eps = [
            Endpoint(name="old", url=old.url, kind="quantized", sample_rate=1.0, score_rate=1.0),
            Endpoint(name="plain", url=plain.url, kind="other", sample_rate=1.0),
        ]
        mirror = make_mirror(eps, sink)
        await mirror.start()
        try:
            for i in range(4):
                _send(mirror, i)
            await _settle(mirror)
        finally:
            await mirror.close()
            await old.close()
            await plain.close()
        old_obs = [o for o in sink.observations if o.endpoint == "old"]
        assert len(old_obs) == 4 and all(o.score_tokens == 0 for o in old_obs)
        assert all(o.score_logprob is None for o in old_obs)
        plain_obs = [o for o in sink.observations if o.endpoint == "plain"]
        assert len(plain_obs) == 4 and all(o.score_tokens is None for o in plain_obs)
        c = mirror.counters()
        assert c["old"]["score_unsupported"] == 4 and identity_holds(c["old"])
        assert c["plain"]["score_sampled"] == 0

    run(scenario())


def test_bounded_jobs_and_no_answer(run: Run[None]) -> None:
    """Past score_max_pending a pair is not scored (score_dropped); a pair whose production
    answer kept no text is dropped too, and its observation is still written."""

    async def scenario() -> None:
        quant = await sim("quantized")
        sink = InMemorySink()
        eps = [Endpoint(name="q", url=quant.url, kind="quantized", sample_rate=1.0)]
        mirror = make_mirror(eps, sink, score_max_pending=1)
        eps_scored = [msgspec.structs.replace(eps[0], score_rate=1.0)]
        mirror.apply(eps_scored)
        await mirror.start()
        try:
            body = chat("one")
            t1 = mirror.on_request("POST", "/v1/chat/completions", headers(), body, "a")
            t2 = mirror.on_request("POST", "/v1/chat/completions", headers(), chat("two"), "b")
            assert t1 is not None and t2 is not None
            mirror.on_response(t1, MeterResult(status=200, is_sse=False, text=None), None)
            mirror.on_response(t2, MeterResult(status=200, is_sse=False, text="x"), None)
            await _settle(mirror)
        finally:
            await mirror.close()
            await quant.close()
        c = mirror.counters()["q"]
        assert c["score_sampled"] == 2 and c["score_dropped"] == 2 and identity_holds(c), c
        assert len([o for o in sink.observations if o.endpoint == "q"]) == 2

    run(scenario())


def test_selection_is_nested_and_near_its_share() -> None:
    """Selection depends on the exchange id only: a smaller share scores a subset."""
    ids = [f"01890000-0000-7000-8000-{i:012x}" for i in range(4000)]
    small = {i for i in ids if selected(i, 0.05)}
    large = {i for i in ids if selected(i, 0.2)}
    assert small <= large
    assert 120 < len(small) < 280 and 650 < len(large) < 950
    assert not any(selected(i, 0.0) for i in ids)


def test_scores_parse_vllm_shape() -> None:
    """Scores read vLLM's prompt logprobs (token ids as keys, ranks) at the answer's positions;
    the top-k KL of identical distributions is 0 and grows with a shift."""
    ids = [5, 17, 23, 99, 4, 8]
    base = prompt_logprobs(ids, 5, 0.0)
    shifted = prompt_logprobs(ids, 5, 0.3)
    body = msgspec.json.encode({"choices": [{"prompt_logprobs": base}]})
    got = scoring.parse_scores(body, ids, 3)
    assert got.tokens == 3
    assert got.logprob == pytest.approx(
        sum(base[i][str(ids[i])]["logprob"] for i in range(3, 6)) / 3  # type: ignore[index]
    )
    other = scoring.parse_scores(
        msgspec.json.encode({"prompt_logprobs": shifted}), ids, 3
    )  # chat completions put them at the top
    assert other.logprob == pytest.approx(got.logprob - 0.3)
    assert scoring.topk_kl(got.topk, got.topk) == 0.0
    assert scoring.topk_kl(got.topk, other.topk) > 0
    assert math.isnan(scoring.topk_kl(got.topk, other.topk[:1]))
    with pytest.raises(scoring.ScoringError):
        scoring.parse_scores(body, ids[:-1], 3)


async def _one_worker(
    n: int, answer_wait_s: float, sim_knobs: dict[str, Any], **endpoint: Any
) -> tuple[Mirror, InMemorySink]:
    """`n` exchanges offered at once to a quantized candidate `q` scored at 1.0 behind one
    worker; returns the mirror (closed) and its sink once every job has ended."""
    quant = await sim("quantized", **sim_knobs)
    sink = InMemorySink()
    ep = Endpoint(
        name="q",
        url=quant.url,
        kind="quantized",
        sample_rate=1.0,
        score_rate=1.0,
        concurrency=1,
        **endpoint,
    )
    mirror = make_mirror([ep], sink, **{"mirror.answer_wait_s": answer_wait_s})
    await mirror.start()
    try:
        for i in range(n):
            assert _send(mirror, i) is not None
        await _settle(mirror)  # bounded: 10 s
    finally:
        await mirror.close()
        await quant.close()
    return mirror, sink


def test_a_copy_queued_behind_a_backlog_is_still_scored(run: Run[None]) -> None:
    """A job waits for its arm's copy the copy's timeout (plus answer_wait_s) from when a worker
    takes it, not from the offer: ten copies queued behind one worker, each ~0.26 s, the last
    sent ~2.3 s after its offer, past timeout_s + answer_wait_s (1.2 s), and every one scored."""

    async def scenario() -> None:
        knobs = {"time_scale": 1.0, "min_output_tokens": 32, "max_output_tokens": 32}
        mirror, sink = await _one_worker(10, 0.2, knobs, timeout_s=1.0)
        c = mirror.counters()["q"]
        waits = sorted(o.queue_wait_s or 0.0 for o in sink.observations if o.endpoint == "q")
        assert waits[-1] > 1.2, waits  # the backlog the test is about did form
        assert c["score_sampled"] == c["score_ok"] == 10 and c["score_dropped"] == 0, c
        assert identity_holds(c), c

    run(scenario())


def test_a_copy_dropped_unsent_is_not_waited_for(run: Run[None]) -> None:
    """A copy evicted from its ring (buffer_max_items 2) will never be answered: its job is
    dropped at once (score_dropped), not after timeout_s + answer_wait_s (here 10 min), and the
    copies that were sent are scored."""

    async def scenario() -> None:
        # Offered at once: the ring keeps the last two.
        mirror, _ = await _one_worker(8, 600.0, {}, buffer_max_items=2)
        c = mirror.counters()["q"]
        assert c["dropped_overflow"] == 6, c
        assert c["score_sampled"] == 8 and c["score_dropped"] == 6 and c["score_ok"] == 2, c
        assert c["score_pending"] == 0 and identity_holds(c), c

    run(scenario())
