"""Agent-like multi-turn traffic for the demo, the end-to-end tests and the benchmarks.

Each session is one conversation: a long shared system prompt (an agent's instructions and tool
descriptions), then turns whose context grows — the model's previous answer, a tool result or a
new user message is appended every turn, as coding agents do. Turns of one session are sent in
order with the same `X-Session-ID`; sessions run concurrently. Responses are read with the same
passive meter the gateway uses, so client-side TTFT follows the same definition.

Content is generated from a seeded RNG: the same spec produces the same traffic.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import msgspec

from gateway.server.meter import MeterResult, ResponseMeter

_WORDS = (
    "agent buffer cache client commit config context decode endpoint error event file "
    "function gateway handler header index kernel latency layer merge model module "
    "parser patch prefix prompt proxy queue replica request response schema server "
    "session socket stream table test thread token tool trace upstream value worker"
).split()

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name, description in (
        ("read_file", "Read a file of the repository."),
        ("search_code", "Search the repository for a pattern."),
        ("run_tests", "Run the test suite for a path."),
    )
]


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What traffic to send."""

    sessions: int = 48
    turns: int = 6
    concurrency: int = 12  # sessions in flight at once
    system_prompt_words: int = 600
    user_words: int = 40
    tool_result_words: int = 160
    tools_every: int = 1  # offer tools on every n-th turn (0: never); agents send them always
    json_every: int = 0  # ask for a JSON object on every n-th turn (0: never)
    temperature: float = 0.0
    stream: bool = True
    max_tokens: int = 48
    model: str = "sim-model"
    seed: int = 0
    route: str = "/v1/chat/completions"
    # Index of the first session: batches of one run (`canary demo` looks between them) take
    # consecutive ranges, so every conversation has its own id and its own draws.
    first_session: int = 0


class TurnResult(msgspec.Struct, kw_only=True):
    session: int
    turn: int
    status: int
    ttft_s: float | None
    e2e_s: float
    error: str | None = None


class WorkloadSummary(msgspec.Struct, kw_only=True):
    requests: int
    errors: int
    wall_s: float
    turns: list[TurnResult]

    def ttft_by_turn(self) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for t in self.turns:
            if t.ttft_s is not None and t.error is None:
                out.setdefault(t.turn, []).append(t.ttft_s)
        return out


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def system_prompt(spec: WorkloadSpec) -> str:
    rng = random.Random(spec.seed)  # shared by every session, like a real agent's instructions
    return "You are a coding agent working in a repository. " + _words(
        rng, spec.system_prompt_words
    )


def _assistant_message(result: MeterResult) -> dict[str, Any]:
    if result.tool_calls:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {"name": name, "arguments": args},
                }
                for i, (name, args) in enumerate(result.tool_calls)
            ],
        }
    return {"role": "assistant", "content": result.text}


async def _run_session(
    http: aiohttp.ClientSession,
    url: str,
    spec: WorkloadSpec,
    index: int,
    system: str,
    headers: Mapping[str, str],
    on_turn: Callable[[TurnResult], None],
) -> None:
    rng = random.Random(spec.seed * 1_000_003 + index)
    session_id = f"demo-{spec.seed}-{index}"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Task {index}: " + _words(rng, spec.user_words)},
    ]
    for turn in range(1, spec.turns + 1):
        body: dict[str, Any] = {
            "model": spec.model,
            "messages": messages,
            "temperature": spec.temperature,
            "max_tokens": spec.max_tokens,
            "stream": spec.stream,
        }
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        if spec.tools_every and turn % spec.tools_every == 0:
            body["tools"] = TOOLS
        if spec.json_every and turn % spec.json_every == 0:
            body["response_format"] = {"type": "json_object"}
        req_headers = {"X-Session-ID": session_id, **headers}
        t0 = time.perf_counter()
        meter = ResponseMeter(t0, is_sse=spec.stream, text_max_chars=4096)
        status, error = 0, None
        try:
            async with http.post(url, json=body, headers=req_headers) as resp:
                status = resp.status
                async for chunk in resp.content.iter_any():
                    meter.feed(chunk, time.perf_counter())
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = type(exc).__name__
        result = meter.finish(time.perf_counter(), status)
        if error is None and status != 200:
            error = f"http_{status}"
        on_turn(
            TurnResult(
                session=index,
                turn=turn,
                status=status,
                ttft_s=result.ttft_s,
                e2e_s=time.perf_counter() - t0,
                error=error,
            )
        )
        if error is not None:
            return  # an agent stops a conversation whose turn failed
        messages.append(_assistant_message(result))
        if result.tool_calls:
            for i, _call in enumerate(result.tool_calls):
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": f"call_{i}",
                        "content": _words(rng, spec.tool_result_words),
                    }
                )
        else:
            messages.append({"role": "user", "content": _words(rng, spec.user_words)})


async def run_workload(
    base_url: str,
    spec: WorkloadSpec,
    *,
    headers: Mapping[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
    timeout_s: float = 300.0,
) -> WorkloadSummary:
    """Send `spec.sessions` conversations of `spec.turns` turns to `base_url`."""
    url = base_url.rstrip("/") + spec.route
    system = system_prompt(spec)
    results: list[TurnResult] = []

    def on_turn(result: TurnResult) -> None:
        results.append(result)
        if progress is not None:
            progress(1)

    gate = asyncio.Semaphore(spec.concurrency)

    async def one(index: int, http: aiohttp.ClientSession) -> None:
        async with gate:
            await _run_session(http, url, spec, index, system, headers or {}, on_turn)

    started = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector = aiohttp.TCPConnector(limit=spec.concurrency)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as http,
        asyncio.TaskGroup() as group,
    ):
        for i in range(spec.first_session, spec.first_session + spec.sessions):
            group.create_task(one(i, http))
    return WorkloadSummary(
        requests=len(results),
        errors=sum(1 for r in results if r.error is not None),
        wall_s=time.perf_counter() - started,
        turns=sorted(results, key=lambda r: (r.session, r.turn)),
    )
