"""Agent (tool-call) turns on real vLLM through the gateway: the calls reach the client, every
arm's calls are checked against the declared tools, and a call turn is graded.

The engines are the test session's (`real_engines`); nothing new is started but the gateway:
`canary serve --live` in front of `live` as a real process with SQLite, `control` (configured
like live) registered as the control and `quantized` (bfloat16) as a model upgrade whose grader
is the `control` engine (both orders of every pair, as tests/real_engine/test_real_grading.py
grades text turns). Four agent turns go through the gateway with the official `openai` SDK,
each declaring `get_weather` (`strict`) and naming it in `tool_choice`: vLLM 0.32 forces the
named call's arguments to the tool's JSON schema, compact (the engines run
`--enable-auto-tool-choice --tool-call-parser hermes` with `VLLM_ENFORCE_STRICT_TOOL_CALLING=0`
and `disable_any_whitespace`, see engines.py; the tiny model's chat template renders tools,
calls and results in hermes's form), so every arm's call is well formed by construction and any
invalid verdict is the check's or the plumbing's fault. Two first turns (whole and streamed) and
two follow-ups that carry the call and a `role: tool` result (whole and streamed), all at
temperature 0: a few requests, a few seconds of the engines' CPU.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from domain.records import GRADING_OUTCOMES
from tests.real_engine import engines as eng
from tests.real_engine.conftest import _canary, _drained, _http_json, _wait_ready

# Engine start (when this module runs first), four turns, the copies, the gradings and a report.
pytestmark = pytest.mark.timeout(1800)

MAX_TOKENS = 64
# vLLM pins a named call's arguments to `parameters` (`strict` is what an agent that wants that
# sends); the `maxLength` and the enum keep the compact arguments to 59 characters (escapes
# aside), within MAX_TOKENS even at one token a character.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {
                "location": {
                    "type": "string",
                    "description": "City name, e.g. Paris",
                    "maxLength": 24,
                },
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["location"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CITIES = ("Paris", "Lisbon")
CANDIDATES = {"control": "control", "quantized": "quantized"}


@dataclass
class Turn:
    """One agent turn as the SDK client saw it."""

    name: str
    stream: bool
    messages: list[dict[str, Any]]
    calls: list[dict[str, str]] = field(default_factory=list)  # id, name, arguments
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


@dataclass
class ToolRun:
    """What the run left: the client's turns, the SQLite file, the control's report."""

    db_path: Path
    turns: list[Turn]
    report: dict[str, Any]
    gateway_log: Path

    def rows(self, sql: str, *args: object) -> list[sqlite3.Row]:
        with sqlite3.connect(self.db_path) as db:
            db.row_factory = sqlite3.Row
            return list(db.execute(sql, args))


async def _ask(client: Any, turn: Turn) -> None:
    """Send one turn with the tool declared and named; keep the calls the client got."""
    kwargs: dict[str, Any] = {
        "model": eng.MODEL,
        "messages": turn.messages,
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    try:
        if not turn.stream:
            resp = await client.chat.completions.create(**kwargs)
            choice = resp.choices[0]
            turn.text = choice.message.content or ""
            turn.finish_reason = choice.finish_reason
            for call in choice.message.tool_calls or ():
                turn.calls.append(
                    {
                        "id": call.id,
                        "name": call.function.name,
                        "arguments": call.function.arguments,
                    }
                )
            return
        stream = await client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
        parts: list[str] = []
        by_index: dict[int, dict[str, str]] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    parts.append(choice.delta.content)
                for delta in choice.delta.tool_calls or ():
                    call = by_index.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                    if delta.id:
                        call["id"] = delta.id
                    if delta.function is not None:
                        call["name"] += delta.function.name or ""
                        call["arguments"] += delta.function.arguments or ""
                if choice.finish_reason:
                    turn.finish_reason = choice.finish_reason
        turn.text = "".join(parts)
        turn.calls = [by_index[i] for i in sorted(by_index)]
    except Exception as exc:  # the test reports every failed turn by name
        turn.error = f"{type(exc).__name__}: {exc}"


def _follow_up(first: Turn, result: dict[str, Any]) -> list[dict[str, Any]]:
    """The first turn's messages, its call as the assistant's turn and the tool's result."""
    call = first.calls[0]
    return [
        *first.messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)},
        {"role": "user", "content": "And tomorrow, in the same city?"},
    ]


async def _agent_turns(base_url: str) -> list[Turn]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    turns: list[Turn] = []
    try:
        for stream, city in zip((False, True), CITIES, strict=True):
            kind = "stream" if stream else "whole"
            question = [{"role": "user", "content": f"What is the weather in {city}?"}]
            first = Turn(f"first-{kind}", stream, question)
            await _ask(client, first)
            turns.append(first)
            if first.error or not first.calls:
                continue
            result = {"temperature": 21, "unit": "celsius", "sky": "clear"}
            follow = Turn(f"follow-up-{kind}", stream, _follow_up(first, result))
            await _ask(client, follow)
            turns.append(follow)
    finally:
        await client.close()
    return turns


def _gradings_done(db_path: Path, candidate: str, pairs: int, within_s: float = 300.0) -> None:
    """Wait until every pair of `candidate` has its two gradings, or a row saying why not."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with sqlite3.connect(db_path) as db:
            outcomes = [
                r[0]
                for r in db.execute("SELECT outcome FROM gradings WHERE endpoint = ?", (candidate,))
            ]
        graded = sum(o in GRADING_OUTCOMES for o in outcomes)
        if graded + 2 * (len(outcomes) - graded) >= 2 * pairs:
            return
        time.sleep(1.0)


# How often the test's gateway reads the registry (the default is 2 s).
REGISTRY_POLL_S = 0.2


@pytest.fixture(scope="module")
def tool_run(real_engines: dict[str, eng.Engine]) -> Iterator[ToolRun]:
    """The gateway in front of live, the control and the graded upgrade, four agent turns."""
    workdir = Path(tempfile.mkdtemp(prefix="canary-real-tools-"))
    db_path = workdir / "canary.db"
    db_url = f"sqlite+aiosqlite:///{db_path}"
    port = eng.free_port(set())
    gw = f"http://127.0.0.1:{port}"
    log = workdir / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_canary(), "serve", "--live", real_engines["live"].url, "--listen",
             f"127.0.0.1:{port}", "--db", db_url, "--insecure-admin", "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "CANARY_STORAGE_REGISTRY_POLL_INTERVAL_S": str(REGISTRY_POLL_S)},
        )  # fmt: skip
    try:
        _wait_ready(gw, proc, log)
        grader = {
            "url": real_engines["control"].url,
            "model": eng.MODEL,
            "swap_rate": 1.0,
            "max_per_minute": 600,
        }
        for name, kind in CANDIDATES.items():
            status, body = _http_json(
                "POST",
                gw + "/admin/candidates",
                {
                    "name": name,
                    "url": real_engines[name].url,
                    "kind": kind,
                    "sample_rate": 1.0,
                    "timeout_s": 120.0,
                    "score_rate": 0.0,
                    **({"grader": grader} if name == "quantized" else {}),
                },
            )
            assert status == 201, f"registering {name}: {status} {body}"
        # The worker that took the registration applies it at once; the host's mirror process
        # reads the registry every registry_poll_interval_s, and a copy handed off before it
        # knows a candidate is counted lost (skipped_unknown_candidate). Every one of these four
        # turns must be mirrored: a few polls' time first.
        time.sleep(5 * REGISTRY_POLL_S)
        turns = asyncio.run(_agent_turns(gw))
        _drained(gw, list(CANDIDATES), len(turns))
        _gradings_done(db_path, "quantized", len(turns))
    finally:
        proc.send_signal(signal.SIGTERM)  # the gateway drains its writer before it exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # The traffic is over: a planned (final) look, so the sessions seconds old count as closed
    # (an ordinary look waits out `session_idle_s` before it uses a session's pairs).
    res = subprocess.run(
        [_canary(), "report", "control", "--db", db_url, "--planned-look", "--format", "json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert res.returncode == 0, f"canary report control: {res.stderr[-2000:]}"
    yield ToolRun(db_path=db_path, turns=turns, report=json.loads(res.stdout), gateway_log=log)


def test_every_agent_turn_got_its_named_call(tool_run: ToolRun) -> None:
    """Each turn, whole or streamed, first or carrying a call and its result, reached the client
    as one call of the named tool with a call id and arguments that are a JSON object holding
    the required `location`."""
    assert [t.name for t in tool_run.turns] == [
        "first-whole",
        "follow-up-whole",
        "first-stream",
        "follow-up-stream",
    ], [(t.name, t.error, t.calls) for t in tool_run.turns]
    for turn in tool_run.turns:
        assert turn.error is None, (turn.name, turn.error, eng.tail(tool_run.gateway_log))
        assert len(turn.calls) == 1, (turn.name, turn.calls, turn.text)
        (call,) = turn.calls
        assert call["name"] == "get_weather" and call["id"], (turn.name, call)
        args = json.loads(call["arguments"])
        assert isinstance(args, dict) and isinstance(args.get("location"), str), (turn.name, args)
        assert turn.finish_reason in ("stop", "tool_calls"), (turn.name, turn.finish_reason)


def test_every_arms_calls_are_valid(tool_run: ToolRun) -> None:
    """Production's, the control's and the upgrade's answers to every turn are stored with their
    call, and the mirror's check found each call valid against the declared tool (no invalid
    answer on any arm); the control's report shows an invalid-call share of 0 against
    production."""
    rows = tool_run.rows(
        "SELECT exchange_id, endpoint, arm, error_kind, tool_calls, tool_check, tool_error"
        " FROM observations ORDER BY endpoint, exchange_id"
    )
    by_arm: dict[str, list[sqlite3.Row]] = {}
    for r in rows:
        by_arm.setdefault(r["endpoint"] if r["arm"] == "candidate" else "production", []).append(r)
    assert sorted(by_arm) == ["control", "production", "quantized"], sorted(by_arm)
    for arm, answers in by_arm.items():
        assert len(answers) == len(tool_run.turns), (arm, len(answers))
        for r in answers:
            assert r["error_kind"] is None, (arm, dict(r))
            calls = json.loads(r["tool_calls"] or "[]")
            assert [c["name"] for c in calls] == ["get_weather"], (arm, dict(r))
        invalid = [dict(r) for r in answers if r["tool_check"] != "valid"]
        assert not invalid, (arm, invalid)
    validity = tool_run.report["metrics"]["tool_validity"]
    assert validity["estimate"] == 0, validity
    assert validity["status"] not in ("beyond", "critical"), validity


def test_call_turns_are_graded_by_the_real_grader(tool_run: ToolRun) -> None:
    """Every call turn of the upgrade is graded by the real grader in both orders with a valid
    verdict (the answers being calls, not text), its tokens counted."""
    rows = tool_run.rows(
        "SELECT exchange_id, candidate_first, outcome, winner, attempts, prompt_tokens,"
        " completion_tokens, error_kind FROM gradings WHERE endpoint = 'quantized'"
    )
    assert len(rows) == 2 * len(tool_run.turns), [dict(r) for r in rows]
    assert all(r["outcome"] == "graded" and r["winner"] is not None for r in rows), [
        dict(r) for r in rows
    ]
    assert all(r["prompt_tokens"] > 50 and r["completion_tokens"] > 0 for r in rows)
    for pair in {r["exchange_id"] for r in rows}:
        orders = sorted(r["candidate_first"] for r in rows if r["exchange_id"] == pair)
        assert orders == [0, 1], pair
