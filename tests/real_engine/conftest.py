"""One real-engine run per test session: four vLLM engines, the gateway, sessions, reports.

The engines are the test session's (`real_engines`, `tests/fixtures_real_engine.py`: started
once from `$CANARY_REAL_ENGINE_ROOT`, shared with the capacity tests; skipped, or failed under
`CANARY_REQUIRE_REAL_ENGINE=1`, without the install).

The run, once: `canary serve --live` in front of `live` (no prefix caching) as a real process
with SQLite; `bi-kv` (prefix caching), `control` (configured like live) and `quantized` (the same
model in bfloat16) registered through the admin API at sample rate 1 with session sampling and
the margins `canary plan` gives at these engines' noise for the session count, the mirror
process at `nice` (the README's advice for a host with no spare CPU);
`CANARY_REAL_ENGINE_SESSIONS` (default 200) agent-like conversations of 3 turns (a long system
prompt of their own, re-sent with the history) streamed through the gateway with the official
`openai` SDK and an `X-Session-ID` each, 4 at a time; then every turn sent again straight to
live; the mirror drained; the gateway stopped (its writer drains); `canary report NAME
--planned-look --format json`; `canary plan --candidate bi-kv` (the noise measured, recorded).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.real_engine import engines as eng

SESSIONS = int(os.environ.get("CANARY_REAL_ENGINE_SESSIONS", "200"))
TURNS = 3
CONCURRENCY = int(os.environ.get("CANARY_REAL_ENGINE_CONCURRENCY", "4"))  # conversations in flight
MAX_TOKENS = 32
# Agent-like conversations: each opens with a long system prompt of its own (instructions,
# tool descriptions, retrieved documents), and every turn re-sends it with the history, so
# prefill dominates TTFT and later turns repeat a long prefix. In the tiny model's tokens (about
# two a word): turn 1 prompts ~1,450 tokens, turn 2 ~1,580 (1,450 of them a cached prefix on
# bi-kv), turn 3 ~1,720, within the engines' max_model_len of 2,048 with the 32-token replies.
SYSTEM_WORDS = int(os.environ.get("CANARY_REAL_ENGINE_SYSTEM_WORDS", "700"))
WORDS_PER_TURN = int(os.environ.get("CANARY_REAL_ENGINE_TURN_WORDS", "40"))
# Margins chosen the way the README tells an operator ("Margins by volume", real engines on
# shared CPUs): rates within 3 pp; latency from `canary plan` at the noise these engines show
# (a turn-1 TTFT log-ratio sd of ~1.1 per pair, bench/RESULTS.md) for the session count, with
# the intervals tuned to that many sessions (`horizon_units`). `planned_verdict` runs the plan.
NOISE = float(os.environ.get("CANARY_REAL_ENGINE_NOISE", "1.1"))
# Beyond the per-pair noise, two engines of one configuration on two shared cores differ by a
# run-level factor that more pairs do not shrink: bi-kv's turn-1 TTFT against its control (nothing
# is cached at turn 1, so the truth is 1.0) came out 0.69, 0.70, 0.79, 0.88, 0.91, 0.94, 0.95,
# 0.96, 1.06, 1.09, 1.14 and 1.28 in the twelve runs on record (bench/RESULTS.md, "Real engines:
# the run-level spread"): a log-sd of about 0.17 between runs against the 0.08 that 200 sessions'
# own noise explains. The latency margin is the plan's widened by that factor, so the test gates on
# the candidate, not on which engine the host's scheduler favoured in this run.
HOST_SPREAD = float(os.environ.get("CANARY_REAL_ENGINE_HOST_SPREAD", "1.3"))
RATES = {
    "error_delta": 0.03,
    "error_critical": 0.1,
    "agreement_delta": 0.03,
    "slo_exceedance_delta": 0.03,
    "similarity_delta": 0.03,
}
# The engines share the gateway's two cores, so the host has no spare CPU; the README's advice
# for such a host is the mirror process at `nice` ("Limits and failure behaviour"). Measured on
# this suite (bench/RESULTS.md): SCHED_IDLE added about 1-5 ms of the mirror's late wake-ups to
# each mirrored TTFT (of 250-350 ms) against normal priority, on bi-kv and its control alike.
MIRROR_PRIORITY = os.environ.get("CANARY_REAL_ENGINE_MIRROR_PRIORITY", "nice")
KINDS = {"bi-kv": "bi-kv", "control": "control", "quantized": "quantized"}
# Share of the quantized candidate's pairs it and the control score (teacher forcing,
# tests/real_engine/test_real_scoring.py); the kind's default (0.1) gives too few for a decision
# in a run this short.
SCORE_RATE = float(os.environ.get("CANARY_REAL_ENGINE_SCORE_RATE", "0.25"))
WORDS = (
    "the request returns a value when the file is opened and the stream is closed after each "
    "line of text the parser reads from the buffer with an optional argument that sets the "
    "default encoding for every call to the function which raises an error if the object is "
    "not found in the list of keys used by the module to load data from a path on disk"
).split()


@dataclass
class Turn:
    """One streamed chat turn as the SDK client saw it."""

    session: str
    turn: int
    messages: list[dict[str, str]]
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None


@dataclass
class RealRun:
    """Everything the tests look at, gathered once."""

    workdir: Path
    db_path: Path
    engines: dict[str, eng.Engine]
    turns: list[Turn]
    direct: list[Turn]
    reports: dict[str, dict[str, Any]]
    counters: dict[str, dict[str, int]]
    engine_before: dict[str, dict[str, float]]
    engine_after: dict[str, dict[str, float]]
    gateway_metrics: str
    timings: dict[str, float] = field(default_factory=dict)

    def rows(self, sql: str, *args: object) -> list[sqlite3.Row]:
        with sqlite3.connect(self.db_path) as db:
            db.row_factory = sqlite3.Row
            return list(db.execute(sql, args))


def _system_message(rng: random.Random, session: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(SYSTEM_WORDS))
    return f"Session {session}. You are the assistant of this project; its notes: {words}."


def _user_message(rng: random.Random, session: int, turn: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(WORDS_PER_TURN))
    return f"Conversation {session}, question {turn}: {words}?"


async def _chat(client: Any, messages: list[dict[str, str]], sid: str | None, out: Turn) -> None:
    """One streamed turn with the official SDK; it closes the stream after `[DONE]`."""
    try:
        stream = await client.chat.completions.create(
            model=eng.MODEL,
            messages=messages,
            stream=True,
            temperature=0,
            max_tokens=MAX_TOKENS,
            stream_options={"include_usage": True},
            extra_headers={"X-Session-ID": sid} if sid else None,
        )
        parts: list[str] = []
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    parts.append(choice.delta.content)
                if choice.finish_reason:
                    out.finish_reason = choice.finish_reason
            if chunk.usage is not None:
                out.completion_tokens = chunk.usage.completion_tokens
        out.text = "".join(parts)
    except Exception as exc:  # the test reports every failed turn by name
        out.error = f"{type(exc).__name__}: {exc}"


async def _sessions(base_url: str) -> list[Turn]:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
    sem = asyncio.Semaphore(CONCURRENCY)
    turns: list[Turn] = []

    async def one(s: int) -> None:
        rng = random.Random(f"real-engine-{s}")
        sid = f"conv-{s}"
        messages = [{"role": "system", "content": _system_message(rng, s)}]
        async with sem:
            for t in range(1, TURNS + 1):
                messages.append({"role": "user", "content": _user_message(rng, s, t)})
                turn = Turn(sid, t, list(messages))
                await _chat(client, turn.messages, sid, turn)
                turns.append(turn)
                if turn.error:
                    return
                messages.append({"role": "assistant", "content": turn.text})

    try:
        await asyncio.gather(*(one(s) for s in range(SESSIONS)))
    finally:
        await client.close()
    return turns


async def _direct(live_url: str, turns: list[Turn]) -> list[Turn]:
    import openai

    client = openai.AsyncOpenAI(base_url=live_url + "/v1", api_key="unused", max_retries=0)
    sem = asyncio.Semaphore(CONCURRENCY)
    out = [Turn(t.session, t.turn, t.messages) for t in turns]

    async def one(turn: Turn) -> None:
        async with sem:
            await _chat(client, turn.messages, None, turn)

    try:
        await asyncio.gather(*(one(t) for t in out))
    finally:
        await client.close()
    return out


def _http_json(method: str, url: str, body: object | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def _canary() -> str:
    return str(Path(sys.executable).parent / "canary")


def planned_verdict(sessions: int = SESSIONS, noise: float = NOISE) -> dict[str, float]:
    """The verdict overrides `canary plan` gives for `sessions` 3-turn sessions at `noise`:
    the rate margins above, the smallest latency margin clean candidates show within that many
    sessions widened by the host's run-level spread (rounded up to 0.05), a critical margin 1.25x
    past it, the horizon."""
    res = subprocess.run(
        [_canary(), "plan", "--rate", "1", "--sample-rate", "1", "--turns", str(TURNS),
         "--noise", str(noise), "--horizon", str(sessions), "--failures", "0",
         "--disagreement", "0", "--error-delta", str(RATES["error_delta"]),
         "--agreement-delta", str(RATES["agreement_delta"]),
         "--slo-delta", str(RATES["slo_exceedance_delta"]), "--format", "json"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    latency = plan["latency_margin_in_budget"]
    assert latency is not None, plan
    delta = math.ceil(latency * HOST_SPREAD * 20 - 1e-9) / 20
    return {
        **RATES,
        "latency_delta": delta,
        "latency_critical": max(1.25, round(delta * 1.25, 2)),
        "horizon_units": sessions,
    }


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"canary serve exited with {proc.returncode}:\n{eng.tail(log)}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"canary serve not ready:\n{eng.tail(log)}")


def _drained(gw: str, names: list[str], expected: int) -> dict[str, dict[str, int]]:
    """Wait until every candidate's copies are all answered; returns the counters."""
    deadline = time.monotonic() + 600
    counters: dict[str, dict[str, int]] = {}
    while True:
        for name in names:
            status, body = _http_json("GET", f"{gw}/admin/candidates/{name}")
            assert status == 200, body
            counters[name] = {k: int(v) for k, v in body["counters"].items()}
        done = all(
            c.get("sampled", 0) >= expected
            and c.get("pending", 0) == 0
            and c.get("score_pending", 0) == 0
            and c.get("sent", 0)
            == c.get("observed_ok", 0) + c.get("observed_error", 0) + c.get("timed_out", 0)
            for c in counters.values()
        )
        if done or time.monotonic() > deadline:
            return counters
        time.sleep(1.0)


def _ttft_vs_engine(
    db_path: Path, before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float | None]]:
    """Per engine, the mean TTFT the gateway stored for it against the engine's own mean (its
    `vllm:time_to_first_token_seconds` over the same requests): the excess is what the arm's
    measuring process added (network, tokenization, its own scheduling delay)."""
    with sqlite3.connect(db_path) as db:
        stored = {
            row[0]: (row[1], row[2])
            for row in db.execute(
                "SELECT endpoint, AVG(ttft_s), COUNT(ttft_s) FROM observations GROUP BY endpoint"
            )
        }
    out: dict[str, dict[str, float | None]] = {}
    for name in after:
        n = eng.delta(after[name], before[name], "vllm:time_to_first_token_seconds_count")
        total = eng.delta(after[name], before[name], "vllm:time_to_first_token_seconds_sum")
        engine_mean = total / n if n else None
        stored_mean, stored_n = stored.get(name, (None, 0))
        out[name] = {
            "engine_mean_s": engine_mean,
            "engine_n": n,
            "stored_mean_s": stored_mean,
            "stored_n": float(stored_n),
            "excess_s": None
            if engine_mean is None or stored_mean is None
            else stored_mean - engine_mean,
        }
    return out


@pytest.fixture(scope="session")
def real_run(real_engines: dict[str, eng.Engine]) -> Iterator[RealRun]:
    """The whole run, once per test session."""
    workdir = Path(tempfile.mkdtemp(prefix="canary-real-"))
    db_path = workdir / "canary.db"
    db_url = f"sqlite+aiosqlite:///{db_path}"
    live = real_engines["live"]
    port = eng.free_port(set())
    gw = f"http://127.0.0.1:{port}"
    log = workdir / "gateway.log"
    timings: dict[str, float] = {}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_canary(), "serve", "--live", live.url, "--listen", f"127.0.0.1:{port}",
             "--db", db_url, "--insecure-admin", "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "CANARY_MIRROR_PRIORITY": MIRROR_PRIORITY},
        )  # fmt: skip
    verdict = planned_verdict()
    try:
        _wait_ready(gw, proc, log)
        for name, kind in KINDS.items():
            status, body = _http_json(
                "POST",
                gw + "/admin/candidates",
                {
                    "name": name,
                    "url": real_engines[name].url,
                    "kind": kind,
                    "sample_rate": 1.0,
                    "sampling": "session",
                    "concurrency": 4,
                    "timeout_s": 120.0,
                    "verdict": verdict,
                    **({"score_rate": SCORE_RATE} if kind == "quantized" else {}),
                },
            )
            assert status == 201, f"registering {name}: {status} {body}"
        before = {name: eng.scrape(e.url) for name, e in real_engines.items()}
        t0 = time.monotonic()
        turns = asyncio.run(_sessions(gw))
        timings["sessions_s"] = time.monotonic() - t0
        counters = _drained(gw, list(KINDS), len(turns))
        timings["drain_s"] = time.monotonic() - t0 - timings["sessions_s"]
        # Every engine answered every turn (live directly, the candidates at rate 1).
        key = "vllm:request_success_total"
        after = {
            name: eng.settled_scrape(
                e.url,
                key,
                # and one request per scoring copy it answered (test_real_scoring.py)
                reach=before[name].get(key, 0.0)
                + len(turns)
                + counters.get(name, {}).get("score_ok", 0),
            )
            for name, e in real_engines.items()
        }
        with urllib.request.urlopen(gw + "/metrics", timeout=10) as resp:
            gateway_metrics = resp.read().decode()
        t1 = time.monotonic()
        direct = asyncio.run(_direct(live.url, turns))
        timings["direct_s"] = time.monotonic() - t1
    finally:
        proc.send_signal(signal.SIGTERM)  # the gateway drains its writer before it exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    reports: dict[str, dict[str, Any]] = {}
    for name in KINDS:
        res = subprocess.run(
            [_canary(), "report", name, "--db", db_url, "--planned-look", "--format", "json"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert res.returncode == 0, f"canary report {name}: {res.stderr[-2000:]}"
        reports[name] = json.loads(res.stdout)
        (workdir / f"report-{name}.json").write_text(res.stdout)
        text = subprocess.run(
            [_canary(), "report", name, "--db", db_url, "--planned-look"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        (workdir / f"report-{name}.txt").write_text(text.stdout)
    (workdir / "gateway-metrics.txt").write_text(gateway_metrics)
    # The plan from this run's own pairs: the noise each gating test showed (recorded).
    measured = subprocess.run(
        [_canary(), "plan", "--candidate", "bi-kv", "--db", db_url, "--horizon", str(SESSIONS),
         "--format", "json"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    (workdir / "plan-bi-kv.json").write_text(measured.stdout + measured.stderr)
    summary = {
        "verdict": verdict,
        "timings": timings,
        "counters": counters,
        "ttft_vs_engine": _ttft_vs_engine(db_path, before, after),
        "mirror_priority": re.findall(r'priority="([^"]+)"', gateway_metrics),
    }
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2))
    yield RealRun(
        workdir=workdir,
        db_path=db_path,
        engines=real_engines,
        turns=turns,
        direct=direct,
        reports=reports,
        counters=counters,
        engine_before=before,
        engine_after=after,
        gateway_metrics=gateway_metrics,
        timings=timings,
    )
