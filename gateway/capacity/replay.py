"""Replay of captured conversations against one endpoint, at a fixed offered load.

Offered load is a number of concurrent conversations (a closed loop, like `vllm bench serve
--max-concurrency`, but per conversation): each of `load` workers replays one conversation turn
after turn — each turn sent when the previous answer ended plus the captured think time — then
takes the next conversation of the pool. No new turn starts after the step's deadline, so a
step lasts its length plus at most one answer. Every request is streamed (`stream: true` with
usage) so TTFT, TPOT (from the usage each arm reports alike) and inter-event latency are
measured by the gateway's own meter, the same one that measures production. The request
history inside a captured body is production's: a replay sends exactly the prompt production
saw, so prefix reuse across turns is what the real conversation had.

Never used on the proxy path; every request has a timeout; errors become samples, not raises.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiohttp
import msgspec

from domain.capture import CapturedSession, CapturedTurn
from domain.outcomes import ErrorKind
from domain.timing import tpot
from evaluators.capacity.goodput import Sample
from gateway.server.meter import CLOCK_RESOLUTION_S, ResponseMeter

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class Arm(msgspec.Struct, frozen=True, kw_only=True):
    """An endpoint the driver replays against."""

    name: str
    url: str  # base URL, without the route
    model: str | None = None  # replaces the captured `model` when set
    token: str | None = None  # bearer token, when the endpoint needs one


def replay_body(turn: CapturedTurn, model: str | None) -> bytes:
    """The captured body, streamed with usage, with the arm's model when it names one."""
    doc: dict[str, Any] = _decoder.decode(turn.body)
    if turn.route != "/v1/embeddings":
        doc["stream"] = True
        opts = doc.get("stream_options")
        doc["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    if model is not None:
        doc["model"] = model
    return _encoder.encode(doc)


async def send_turn(
    http: aiohttp.ClientSession, arm: Arm, turn: CapturedTurn, session: int, timeout_s: float
) -> Sample:
    """One request, measured; failures are returned as samples with their kind."""
    headers = {"Content-Type": "application/json"}
    if arm.token:
        headers["Authorization"] = f"Bearer {arm.token}"
    body = replay_body(turn, arm.model)
    t0 = time.perf_counter()
    meter: ResponseMeter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with http.post(arm.url + turn.route, data=body, headers=headers) as resp:
                is_sse = resp.content_type == "text/event-stream"
                meter = ResponseMeter(t0, is_sse=is_sse, text_max_chars=0)
                async for chunk in resp.content.iter_any():
                    meter.feed(chunk, time.perf_counter())
                result = meter.finish(time.perf_counter(), resp.status)
    except TimeoutError:
        return Sample(session=session, ok=False, error_kind=ErrorKind.TIMEOUT)
    except aiohttp.ClientConnectorError:
        return Sample(session=session, ok=False, error_kind=ErrorKind.CONNECT)
    except (aiohttp.ClientError, OSError):
        return Sample(session=session, ok=False, error_kind=ErrorKind.RESET)
    if result.status != 200:
        kind = ErrorKind.HTTP_5XX if result.status >= 500 else ErrorKind.HTTP_4XX
        return Sample(session=session, ok=False, error_kind=kind)
    if result.ttft_s is None:
        return Sample(session=session, ok=False, error_kind=ErrorKind.NO_TOKENS)
    return Sample(
        session=session,
        ok=True,
        ttft_s=result.ttft_s,
        # Both arms report usage alike here (the replay asks for it): TPOT from that count.
        tpot_s=tpot(result.ttft_s, result.e2e_s, result.usage_tokens, CLOCK_RESOLUTION_S),
        e2e_s=result.e2e_s,
        inter_event_mean_s=result.inter_event_mean_s,
        output_tokens=result.usage_tokens or 0,
        cached_tokens=result.cached_tokens,
        prompt_tokens=result.prompt_tokens,
    )


class StepRun(msgspec.Struct, kw_only=True):
    samples: list[Sample]
    duration_s: float
    sessions_started: int


async def run_step(
    http: aiohttp.ClientSession,
    arm: Arm,
    pool: Sequence[CapturedSession],
    *,
    load: int,
    step_s: float,
    timeout_s: float,
    think_scale: float = 1.0,
    offset: int = 0,
    on_sample: Callable[[], None] | None = None,
) -> StepRun:
    """Replay `pool` (cycled from `offset`) with `load` concurrent conversations for `step_s`."""
    samples: list[Sample] = []
    next_session = 0
    start = time.perf_counter()
    deadline = start + step_s
    last_end = start

    async def worker() -> None:
        nonlocal next_session, last_end
        while time.perf_counter() < deadline:
            sid = next_session
            next_session += 1
            conv = pool[(offset + sid) % len(pool)]
            for turn in conv.turns:
                if turn.think_s > 0:
                    pause = turn.think_s * think_scale
                    if time.perf_counter() + pause >= deadline:
                        return
                    await asyncio.sleep(pause)
                if time.perf_counter() >= deadline:
                    return
                sample = await send_turn(http, arm, turn, sid, timeout_s)
                samples.append(sample)
                last_end = max(last_end, time.perf_counter())
                if on_sample is not None:
                    on_sample()

    async with asyncio.TaskGroup() as tg:
        for i in range(load):
            tg.create_task(worker(), name=f"capacity-{arm.name}-{i}")
    return StepRun(
        samples=samples, duration_s=max(last_end, deadline) - start, sessions_started=next_session
    )
