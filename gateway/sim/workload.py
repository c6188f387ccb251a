"""Agent-like multi-turn traffic for the demo, the end-to-end tests and the benchmarks.

Each session is one conversation: a long shared system prompt (an agent's instructions), the
declared tools (JSON Schema `parameters`), a task, then turns whose context grows as an agent's
does. Every turn offers the tools with `tool_choice: "auto"`, except the last, which asks for
the final answer (`"none"`, as agent loops do at their step limit); a session in four turns
its parallel calls off (`parallel_tool_calls: false`). After a call answer the model's calls and
one `role: "tool"` result per call (its `tool_call_id` echoing the call's id) are appended, as
the OpenAI chat format requires: a file's contents, search hits, a forecast, or an error where
the arguments were not usable; after a text answer, the user's next instruction. Turns of one
session are sent in order with the same `X-Session-ID`; sessions run concurrently. Responses
are read with the same passive meter the gateway uses, so client-side TTFT follows the same
definition.

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
_encode = msgspec.json.Encoder().encode
_decode_args = msgspec.json.Decoder()


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> Any:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


TOOLS: list[dict[str, Any]] = [
    _tool(
        "get_weather",
        "Current weather and today's forecast for a place.",
        {
            "location": {"type": "string", "description": "City, region or address."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        ["location"],
    ),
    _tool(
        "search",
        "Search the repository's files for a query; returns the best hits with context.",
        {
            "query": {"type": "string"},
            "top_k": {"type": "integer", "minimum": 1, "maximum": 10},
        },
        ["query"],
    ),
    _tool(
        "read_file",
        "Read a file of the repository.",
        {"path": {"type": "string", "description": "Path from the repository root."}},
        ["path"],
    ),
]
_REQUIRED = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}


class WorkloadSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What traffic to send."""

    sessions: int = 48
    turns: int = 6
    concurrency: int = 12  # sessions in flight at once
    system_prompt_words: int = 600
    user_words: int = 40
    # Words of a file that read_file returns (lines of 7 words, 16 tokens as the simulator
    # counts them); search hits and a forecast are sized from it. 1,050 (2,400 tokens) grows a
    # ten-turn session past 16k prompt tokens, as a coding agent's context grows.
    tool_result_words: int = 1050
    tools_every: int = 1  # offer tools on every n-th turn (0: never); agents send them always
    no_parallel_every: int = 4  # every n-th session sends parallel_tool_calls: false (0: none)
    json_every: int = 0  # ask for a JSON object on every n-th turn (0: never)
    temperature: float = 0.0
    stream: bool = True
    max_tokens: int = 128  # room for three parallel calls; text answers are shorter
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
    prompt_tokens: int | None = None  # as the engine counted them (usage)
    tool_calls: int = 0  # calls in the answer


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
    return " ".join(rng.choices(_WORDS, k=n))


def system_prompt(spec: WorkloadSpec) -> str:
    rng = random.Random(spec.seed)  # shared by every session, like a real agent's instructions
    return "You are a coding agent working in a repository. " + _words(
        rng, spec.system_prompt_words
    )


_WORDS_PER_LINE = 7  # of a `_code` line (16 tokens as the simulator's tokenizer splits it)


def _code(rng: random.Random, lines: int) -> str:
    """Lines of source code (16 tokens each)."""
    out = []
    for _ in range(lines):
        a, b, c, d, e, f, g = rng.choices(_WORDS, k=7)
        out.append(f"    {a} = {b}.{c}({d}, {e})  # {f} {g}\n")
    return "".join(out)


def _arguments(text: str) -> dict[str, Any] | None:
    try:
        args = _decode_args.decode(text)
    except msgspec.DecodeError:
        return None
    return args if isinstance(args, dict) else None


def tool_result(name: str, arguments: str, rng: random.Random, words: int) -> str:
    """What the agent's tool returns for one call: a file, search hits, a forecast; an error
    naming what was wrong where the arguments were not usable (as agent frameworks answer)."""
    args = _arguments(arguments)
    if args is None:
        return "Error: the arguments are not a JSON object."
    missing = [k for k in _REQUIRED.get(name, ()) if k not in args]
    if missing:
        return f"Error: missing required argument {missing[0]!r}."
    lines = max(1, words // _WORDS_PER_LINE)
    if name == "read_file":
        return _code(rng, lines)
    if name == "search":
        top_k = args.get("top_k", 5)
        top_k = top_k if isinstance(top_k, int) and 1 <= top_k <= 10 else 5
        per_hit = max(1, lines // 8)
        hits = [
            f"{'/'.join(rng.choices(_WORDS, k=3))}.py:{rng.randint(1, 900)}:\n"
            + _code(rng, per_hit)
            for _ in range(top_k)
        ]
        return "".join(hits)
    hours = [
        {"hour": h, "temp": rng.randint(-5, 35), "wind_kmh": rng.randint(0, 60)}
        for h in range(max(1, lines // 2))  # hourly, for the next days
    ]
    forecast = {"location": args.get("location"), "unit": args.get("unit", "celsius")}
    return _encode({**forecast, "hourly": hours}).decode()


def _assistant_message(result: MeterResult, ids: list[str]) -> dict[str, Any]:
    if result.tool_calls:
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": name, "arguments": args}}
                for i, (name, args, _) in zip(ids, result.tool_calls, strict=True)
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
    no_parallel = spec.no_parallel_every and index % spec.no_parallel_every == 0
    req_headers = {"X-Session-ID": session_id, "Content-Type": "application/json", **headers}
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
            # The last turn asks for the final answer, as agent loops do at their step limit.
            body["tool_choice"] = "none" if turn == spec.turns else "auto"
            if no_parallel:
                body["parallel_tool_calls"] = False
        if spec.json_every and turn % spec.json_every == 0:
            body["response_format"] = {"type": "json_object"}
        t0 = time.perf_counter()
        meter = ResponseMeter(t0, is_sse=spec.stream, text_max_chars=4096)
        status, error = 0, None
        try:
            async with http.post(url, data=_encode(body), headers=req_headers) as resp:
                status = resp.status
                async for chunk in resp.content.iter_any():
                    meter.feed(chunk, time.perf_counter())
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = type(exc).__name__
        result = meter.finish(time.perf_counter(), status)
        if error is None and status != 200:
            error = f"http_{status}"
        calls = result.tool_calls or []
        on_turn(
            TurnResult(
                session=index,
                turn=turn,
                status=status,
                ttft_s=result.ttft_s,
                e2e_s=time.perf_counter() - t0,
                error=error,
                prompt_tokens=result.prompt_tokens,
                tool_calls=len(calls),
            )
        )
        if error is not None:
            return  # an agent stops a conversation whose turn failed
        ids = [call_id or f"call_{turn}_{i}" for i, (_, _, call_id) in enumerate(calls)]
        messages.append(_assistant_message(result, ids))
        for call_id, (name, arguments, _) in zip(ids, calls, strict=True):
            content = tool_result(name, arguments, rng, spec.tool_result_words)
            messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
        if not calls:
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
