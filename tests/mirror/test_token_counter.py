"""The token counter's every outcome: counted by the chosen engine's /tokenize (the control
when there is one, never the live engine), or stored uncounted with the reason counted: the
text not stored, cut at store_text_max_chars, a failing tokenizer, no tokenizer at all (real
simulators on 127.0.0.1:0, the real mirror plane in process, both event loops)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from domain.endpoint import Endpoint
from gateway.mirror.replay.sinks import InMemorySink
from gateway.server.meter import ResponseMeter
from tests.fixtures_net import start_app
from tests.mirror.test_mirror_lane import Run, chat, headers, make_mirror, quiesce, run, sim

__all__ = ["run"]

STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"content":"one"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" two three"}}]}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"content":" four"},"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)


def production(mirror: Any, rid: str, text_max: int = 1000) -> None:
    """A request the mirror copies, and production's streamed answer metered as a worker does:
    four words in three events, 10 ms apart."""
    token = mirror.on_request("POST", "/v1/chat/completions", headers(), chat(rid), rid)
    assert token is not None
    meter = ResponseMeter(0.0, is_sse=True, text_max_chars=text_max)
    for i, event in enumerate(STREAM.split(b"\n\n")[:-1]):
        meter.feed(event + b"\n\n", 0.01 * (i + 1))
    mirror.on_response(token, meter.finish(0.05, 200), None)


async def _until_counted(mirror: Any, sink: InMemorySink, n: int) -> None:
    async with asyncio.timeout(10):
        while len(sink.observations) < n:
            await quiesce(mirror)
            await asyncio.sleep(0.01)


def test_counted_by_the_control_with_tpot_from_tokens(run: Run[None]) -> None:
    """With a control registered, every arm's text is counted by the control's /tokenize; the
    production answer of 4 tokens in 3 events gets TPOT = span / 3, not span / 2."""

    async def scenario() -> None:
        cand, ctl = await sim("fast"), await sim("fast")
        sink = InMemorySink()
        eps = [
            Endpoint(name="cand", url=cand.url, sample_rate=1.0),
            Endpoint(name="ctl", url=ctl.url, sample_rate=1.0, kind="control"),
        ]
        mirror = make_mirror(eps, sink)
        await mirror.start()
        try:
            production(mirror, "r1")
            await _until_counted(mirror, sink, 3)
        finally:
            await mirror.close()
            await cand.close()
            await ctl.close()
        (prod,) = [o for o in sink.observations if o.arm == "production"]
        assert prod.output_tokens == 4 and prod.token_counter == "tokenize:ctl"
        assert prod.token_events == 3 and prod.usage_tokens is None
        assert prod.tpot_s is not None and abs(prod.tpot_s - (0.03 - 0.01) / 3) < 1e-9
        assert {o.token_counter for o in sink.observations} == {"tokenize:ctl"}
        assert mirror.tokens.outcomes["counted"] == 3

    run(scenario())


def test_uncountable_texts_are_stored_uncounted_with_their_reason(run: Run[None]) -> None:
    """A text not stored, a text cut at store_text_max_chars and a tokenizer that answers 500
    leave output_tokens and TPOT None and count why; the records are all stored."""

    async def scenario() -> None:
        cand = await sim("fast")
        failing = web.Application()

        async def refuse(_: web.Request) -> web.Response:
            return web.json_response({"error": {"message": "no"}}, status=500)

        failing.router.add_post("/tokenize", refuse)
        failing.router.add_post("/v1/chat/completions", refuse)
        broken = await start_app(failing)
        try:
            for settings, reason in (
                ({"storage.store_text": False}, "not_stored"),
                ({"storage.store_text_max_chars": 5}, "text_cut"),
                ({"mirror.token_counter": "off"}, "no_tokenizer"),
                ({"mirror.token_counter": "broken"}, "tokenizer_failed"),
            ):
                sink = InMemorySink()
                eps = [
                    Endpoint(name="cand", url=cand.url, sample_rate=1.0),
                    Endpoint(name="broken", url=broken.url, sample_rate=0.0),
                ]
                mirror = make_mirror(eps, sink, **settings)
                await mirror.start()
                try:
                    production(mirror, f"r-{reason}")
                    await _until_counted(mirror, sink, 2)
                finally:
                    await mirror.close()
                (prod,) = [o for o in sink.observations if o.arm == "production"]
                assert prod.output_tokens is None and prod.tpot_s is None, reason
                assert prod.token_counter is None and prod.token_events == 3, reason
                assert mirror.tokens.outcomes[reason] >= 1, (reason, mirror.tokens.outcomes)
        finally:
            await cand.close()
            await broken.close()

    run(scenario())


def test_a_tool_call_answer_counts_its_calls_not_an_empty_text(run: Run[None]) -> None:
    """An answer that is only a tool call is counted by the engine's /tokenize as its call's
    name plus its arguments (one request each), never as 0 output tokens."""
    from domain.records import ObservationRecord
    from tests.packing_engine import PackingEngine, tokenize

    async def scenario() -> None:
        engine = PackingEngine(5)
        served = await start_app(engine.app())
        sink = InMemorySink()
        mirror = make_mirror([Endpoint(name="ctl", url=served.url, sample_rate=0.0)], sink)
        await mirror.start()
        record = ObservationRecord(
            exchange_id="x", endpoint="live", arm="production", started_at=0.0, status=200,
            output_text="", output_hash="h", tool_calls='[{"name": "f", "arguments": "{} x"}]',
            ttft_s=0.01, e2e_s=0.05, token_events=3,
        )  # fmt: skip
        try:
            mirror.tokens.put_observation(record)
            await _until_counted(mirror, sink, 1)
        finally:
            await mirror.close()
            await served.close()
        (stored,) = sink.observations
        assert stored.output_tokens == len(tokenize("f")) + len(tokenize("{} x")) == 3
        assert stored.token_counter == "tokenize:ctl" and engine.tokenize_calls == 2
        assert mirror.tokens.outcomes["counted"] == 1 and mirror.tokens.outcomes["no_text"] == 0

    run(scenario())
