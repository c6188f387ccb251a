"""The Responses API (`/v1/responses`) through the gateway: the official OpenAI SDK, streamed and
not, gets the simulator's answer untouched; production's meter and the candidate's both measure
it (TTFT, usage, text, function calls with their call ids); a mirrored copy reaches the
candidate and both observations are stored as a pair (real gateway and mirror process, two
simulators on 127.0.0.1:0, a real SQLite file). Plus the sampling rules Responses adds: its turn
index, its session key, and the requests that continue server-side state, never mirrored."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
import sqlalchemy as sa

from domain.endpoint import Endpoint
from gateway.config.load import load_config
from gateway.mirror.replay.sinks import InMemorySink
from gateway.mirror.sampling.sampler import hash_key, parse_request, session_key, turn_index
from gateway.process.runtime import running
from gateway.sim.profiles import get_profile
from gateway.sim.server import start_sim
from storage.engine import make_engine
from tests.mirror.test_mirror_lane import headers, make_mirror

RESPONSES = "/v1/responses"
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": name,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
    for name in ("get_weather", "get_time", "get_news")
]
# Prompts the simulator answers with one call ("q0") and with three parallel calls ("q1"),
# decided by the prompt's hash (gateway.sim.calls).
ONE_CALL, PARALLEL = "q0", "q1"


def _view(body: dict[str, Any]) -> Any:
    view = parse_request(msgspec.json.encode(body))
    assert view is not None
    return view


def test_turn_index_counts_assistant_messages_and_function_calls() -> None:
    """A Responses `input` list's turn index counts assistant messages and function calls; a
    string input, or an embeddings input of strings, is a first turn."""
    items = [
        {"role": "user", "content": "hi"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call", "name": "g", "arguments": "{}", "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"},
        {"role": "user", "content": "more"},
    ]
    assert turn_index(_view({"model": "m", "input": items})) == 3
    assert turn_index(_view({"model": "m", "input": "hi"})) == 0
    assert turn_index(_view({"model": "m", "input": ["a", "b"]})) == 0


def test_session_key_follows_a_responses_conversation() -> None:
    """Without a header, a conversation's first turn (a string input) and its later turns (a
    list) share one key from (model, instructions, first user message); another instructions
    or first message gives another key; the session header still wins."""
    first = {"model": "m", "instructions": "be brief", "input": "plan a trip"}
    later = {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": "plan a trip"},
            {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
    }
    other = {**first, "instructions": "be long"}
    key = session_key(_view(first), None)
    assert key == session_key(_view(later), None)
    assert key != session_key(_view(other), None)
    assert key != session_key(_view({**first, "input": "plan a nap"}), None)
    assert session_key(_view(later), "s-1") == b"s-1"


def test_requests_continuing_server_state_are_not_mirrored_and_counted() -> None:
    """A request naming `previous_response_id` (or a `conversation`) is never offered: the
    candidate never made that response; it is counted as skipped `unmirrorable_state`, while
    a self-contained Responses request is mirrored."""
    sink = InMemorySink()
    mirror = make_mirror([Endpoint(name="a", url="http://x:1", sample_rate=1.0)], sink)
    h = headers()
    chained = {"model": "m", "input": "next", "previous_response_id": "resp_1"}
    assert mirror.on_request("POST", RESPONSES, h, msgspec.json.encode(chained), "1") is None
    talk = {"model": "m", "input": "next", "conversation": "conv_1"}
    assert mirror.on_request("POST", RESPONSES, h, msgspec.json.encode(talk), "2") is None
    assert mirror.process_counters()["skipped_unmirrorable_state"] == 2
    assert mirror.counters()["a"]["sampled"] == 0
    plain = msgspec.json.encode({"model": "m", "input": "hi"})
    assert mirror.on_request("POST", RESPONSES, h, plain, "3") is not None


async def _traffic(url: str) -> dict[str, dict[str, Any]]:
    """Four requests through the gateway; what the SDK got, by the request's session id."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
    got: dict[str, dict[str, Any]] = {}
    try:
        whole = await client.responses.create(
            model="sim-model", input="hello there", max_output_tokens=24,
            extra_headers={"X-Session-ID": "text"},
        )  # fmt: skip
        got["text"] = {"text": whole.output_text, "usage": whole.usage, "calls": []}
        for session, prompt, stream in (
            ("one-call", ONE_CALL, True),
            ("parallel", PARALLEL, True),
            ("parallel-whole", PARALLEL, False),
        ):
            kwargs: dict[str, Any] = dict(
                model="sim-model", input=prompt, tools=TOOLS, tool_choice="required",
                extra_headers={"X-Session-ID": session},
            )  # fmt: skip
            if not stream:
                answer = await client.responses.create(**kwargs)
                calls = [(o.name, o.arguments, o.call_id) for o in answer.output]
                got[session] = {"calls": calls, "usage": answer.usage, "deltas": 0}
                continue
            events = await client.responses.create(stream=True, **kwargs)
            deltas, final = 0, None
            async for event in events:
                deltas += event.type == "response.function_call_arguments.delta"
                if event.type == "response.completed":
                    final = event.response
            assert final is not None
            calls = [(o.name, o.arguments, o.call_id) for o in final.output]  # type: ignore[union-attr]
            got[session] = {"calls": calls, "usage": final.usage, "deltas": deltas}
    finally:
        await client.close()
    return got


async def _stored(db: Path, want: int) -> list[sa.Row[Any]]:
    engine = make_engine(f"sqlite+aiosqlite:///{db}")
    query = sa.text(
        "SELECT e.session_key, o.arm, o.ttft_s, o.prompt_tokens, o.usage_tokens, o.token_events,"
        " o.finish_reason, o.tool_calls, o.output_text, o.error_kind FROM observations o"
        " JOIN exchanges e ON e.id = o.exchange_id"
    )
    try:
        async with asyncio.timeout(30):
            while True:
                try:
                    async with engine.connect() as conn:
                        rows = list((await conn.execute(query)).fetchall())
                except sa.exc.OperationalError:  # not written yet
                    rows = []
                if len(rows) >= want:
                    return rows
                await asyncio.sleep(0.1)
    finally:
        await engine.dispose()


@pytest.mark.slow  # the whole gateway with its mirror process: ~25 s on the shared host
async def test_responses_through_the_gateway_are_metered_mirrored_and_paired(
    tmp_path: Path,
) -> None:
    """The SDK's answers (text; one streamed call in many argument deltas; three parallel calls,
    streamed and whole) arrive as the simulator made them; production's and the candidate's
    observations are stored for every exchange, with the TTFT, the usage, the finish reason
    and each call's name, arguments and call id as the client saw them."""
    profile = get_profile("fast", decode_s_per_token=0.001)
    async with await start_sim(profile) as live, await start_sim(profile) as cand:
        config = load_config(
            None,
            environ={},
            overrides={
                "server.listen": "127.0.0.1:0",
                "live.url": live.url,
                "storage.db_url": f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}",
                "admin.insecure": True,
                "server.drain_timeout_s": 1.0,
                "mirror.priority": "normal",
                "candidates": [{"name": "c1", "url": cand.url, "sample_rate": 1.0}],
            },
        )
        async with running(config) as parts:
            got = await _traffic(parts.url)
            rows = await _stored(tmp_path / "canary.db", 8)
    assert got["one-call"]["deltas"] > 3 and len(got["one-call"]["calls"]) == 1
    assert len(got["parallel"]["calls"]) == 3
    assert got["parallel-whole"]["calls"] == got["parallel"]["calls"]
    assert len({call_id for _, _, call_id in got["parallel"]["calls"]}) == 3
    by: dict[tuple[str, str], sa.Row[Any]] = {}
    for row in rows:
        by[(row.arm, row.session_key)] = row
    assert len(by) == 8, sorted(by)
    sessions = {hash_key(name.encode()): name for name in got}
    for (arm, skey), row in by.items():
        name = sessions[skey]
        seen = got[name]
        assert row.error_kind is None and row.ttft_s is not None and row.ttft_s > 0
        assert row.prompt_tokens == seen["usage"].input_tokens
        assert row.usage_tokens == seen["usage"].output_tokens
        stored = json.loads(row.tool_calls) if row.tool_calls else []
        assert [(c["name"], c["arguments"], c["id"]) for c in stored] == seen["calls"], arm
        if name == "text":
            assert row.finish_reason == "length" and row.output_text == seen["text"]
        else:
            assert row.finish_reason == "tool_calls"
            # One argument delta a token event, each fragment of the arguments the client saw.
            assert row.token_events == (seen["deltas"] or None)
