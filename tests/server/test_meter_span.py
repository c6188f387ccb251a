"""The meter measures what the client got: timings over the token span, never a TPOT of 0 when
tokens share a read, and a stream that delivered its final event counts as answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from domain.timing import tpot, tpot_state
from gateway.mirror.replay.observe import classify, observation
from gateway.server.meter import CLOCK_RESOLUTION_S, MeterResult, ResponseMeter
from tests import fixtures_net
from tests.server.test_proxy_streams import RecordingTee
from tests.waiting import SETTLE_S, until

pytestmark = fixtures_net.BOTH_LOOPS
event_loop_policy = fixtures_net.both_loops_policy


def event(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def usage(completion: int) -> bytes:
    body = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": completion}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def meter_of(reads: list[tuple[float, bytes]], resolution_s: float = 1e-9) -> MeterResult:
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=100, resolution_s=resolution_s)
    for at, chunk in reads:
        meter.feed(chunk, at)
    return meter.finish(reads[-1][0], 200)


def test_tokens_in_one_read_are_unresolved_not_zero() -> None:
    """Every event in one read leaves the gaps and TPOT None and says so, never 0."""
    burst = event("a") + event("b") + event("c") + event(None, "length") + usage(3) + DONE
    res = meter_of([(1.0, burst)])
    assert res.timing_unresolved
    assert res.inter_event_mean_s is None and res.inter_event_count == 0
    assert res.ttft_s == 1.0 and res.usage_tokens == 3 and res.token_events == 3
    # Counted later (3 tokens): the span is 0, so TPOT stays None and reads as unresolved.
    counted = tpot(res.ttft_s, res.e2e_s, 3, CLOCK_RESOLUTION_S)
    assert counted is None and tpot_state(res.ttft_s, counted, 3) == "unresolved"


def test_shared_reads_spread_their_gap_over_their_tokens() -> None:
    """Tokens sharing a read split the gap before it: ITL sums to the span, none of it 0."""
    res = meter_of(
        [
            (1.0, event("a")),  # first token
            (2.0, event("b") + event("c") + event("d") + event("e")),  # 4 tokens over 1 s
            (3.0, event("f") + event(None, "stop") + usage(6) + DONE),  # 1 token over 1 s
        ]
    )
    assert not res.timing_unresolved
    assert res.inter_event_count == 5
    assert res.inter_event_mean_s == pytest.approx(2.0 / 5)
    assert res.inter_event_p50_s == pytest.approx(0.25)
    assert res.inter_event_max_s == pytest.approx(1.0)
    counted = tpot(res.ttft_s, res.e2e_s, 6, CLOCK_RESOLUTION_S)  # span / (tokens - 1)
    assert counted == pytest.approx(2.0 / 5)
    assert tpot_state(res.ttft_s, counted, 6) == "measured"


def test_tokens_that_came_with_the_first_one_join_the_next_gap() -> None:
    """Extra tokens of the first read have no interval of their own: they share the next one."""
    res = meter_of([(1.0, event("a") + event("b")), (3.0, event("c") + DONE)])
    assert res.inter_event_count == 2
    assert res.inter_event_p50_s == pytest.approx(1.0)
    assert res.inter_event_max_s == pytest.approx(1.0)
    assert res.token_events == 3 and res.usage_tokens is None


def test_span_below_the_clock_resolution_is_unresolved() -> None:
    """Reads closer together than the clock can tell apart are not turned into a number."""
    res = meter_of([(1.0, event("a")), (1.0005, event("b") + DONE)], resolution_s=0.001)
    assert res.timing_unresolved and res.inter_event_p50_s is None
    assert tpot(res.ttft_s, res.e2e_s, 2, 0.001) is None


def test_one_token_is_not_applicable_rather_than_unresolved() -> None:
    """A single-token answer has no TPOT to measure, and is not reported as unresolved."""
    res = meter_of([(1.0, event("a", "length") + usage(1) + DONE)])
    assert not res.timing_unresolved
    assert tpot(res.ttft_s, res.e2e_s, 1, CLOCK_RESOLUTION_S) is None
    assert tpot_state(res.ttft_s, None, 1) == "not_applicable"
    assert tpot_state(res.ttft_s, None, None) == "uncounted"


def test_final_event_is_success_even_without_done() -> None:
    """A stream cut after its finish reason answered; one cut before it is truncated."""
    answered = meter_of([(1.0, event("a")), (2.0, event("b", "stop"))])
    assert answered.finish_reason == "stop" and not answered.saw_done
    assert classify(answered) is None
    cut = meter_of([(1.0, event("a")), (2.0, event("b"))])
    assert classify(cut) == "truncated"


def test_observation_classifies_when_the_transport_did_not_fail() -> None:
    """Production and candidates are judged by one rule: a 5xx with no transport error is one."""
    res = MeterResult(status=503, is_sse=False)
    obs = observation("x", "live", "production", 0.0, res, None, store_text=True, max_chars=10)
    assert obs.error_kind == "http_5xx"
    kept = observation("x", "live", "production", 0.0, res, "reset", store_text=True, max_chars=10)
    assert kept.error_kind == "reset"


def _slow_eof_app(final: bool) -> web.Application:
    """An upstream that streams an answer, then keeps the body open as a slow engine might."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(event("Hel") + event("lo"))
        await asyncio.sleep(0.05)
        await resp.write(event("!", "stop") + usage(3) + DONE if final else event(" you"))
        await asyncio.sleep(30)  # the client leaves first; the gateway then drops this request
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


async def _read_then_leave(url: str, until: bytes) -> None:
    async with aiohttp.ClientSession() as client:
        resp = await client.post(url + "/v1/chat/completions", data=b"{}")
        seen = b""
        while until not in seen:
            chunk = await resp.content.readany()
            assert chunk, "the stream ended before the client saw what it waits for"
            seen += chunk
        resp.close()  # what the openai SDK does once it has read `[DONE]`


async def _responses(tee: RecordingTee, n: int) -> list[tuple[object, MeterResult, str | None]]:
    async def recorded() -> bool:
        return len(tee.responses) >= n

    with contextlib.suppress(AssertionError):  # the caller's assertions say what was recorded
        await until(recorded, what=f"{n} responses recorded", within_s=SETTLE_S)
    return tee.responses


async def test_client_closing_after_done_is_an_answer_not_a_disconnect(
    serve: Callable[..., Awaitable[Any]], gateway: Callable[..., Awaitable[Any]]
) -> None:
    """The SDK closing after `[DONE]` before the gateway's last write is stored as answered."""
    up = await serve(_slow_eof_app(final=True), handler_cancellation=True)
    tee = RecordingTee()
    gw = await gateway(up.url, tee=tee)
    await _read_then_leave(gw.url, b"[DONE]")
    (_, result, kind), *_ = await _responses(tee, 1)
    assert kind is None and result.saw_done and result.finish_reason == "stop"
    obs = observation("x", "live", "production", 0.0, result, kind, store_text=True, max_chars=9)
    assert obs.error_kind is None and obs.usage_tokens == 3
    async with aiohttp.ClientSession() as http, http.get(gw.url + "/metrics") as resp:
        text = await resp.text()
    assert "\ncanary_proxy_client_closed_after_final_total 1\n" in text


async def test_client_leaving_before_the_final_event_is_still_a_disconnect(
    serve: Callable[..., Awaitable[Any]], gateway: Callable[..., Awaitable[Any]]
) -> None:
    """A client that leaves before the final event reached it is a client disconnect."""
    up = await serve(_slow_eof_app(final=False), handler_cancellation=True)
    tee = RecordingTee()
    gw = await gateway(up.url, tee=tee)
    await _read_then_leave(gw.url, b" you")
    (_, result, kind), *_ = await _responses(tee, 1)
    assert kind == "client_disconnect" and not result.saw_done
