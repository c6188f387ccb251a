"""The ramp on real vLLM: the prefix-caching engine (`bi-kv`) ramped 1 -> 100 % in front of the
production engine (`live`) under agent-like multi-turn sessions, through a real `canary serve`.

vLLM logs no session per request, so the ground truth of who served what is each engine's own
`vllm:request_success_total`: the candidate is registered at sample rate 0 (no mirrored copy
reaches it), so every request it counted during the ramp is one it served for a client, and the
turns of the sessions the store puts on each arm must add up to exactly each engine's count."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import xxhash

from tests.real_engine import engines as eng
from tests.real_engine.conftest import (
    TURNS,
    Turn,
    _canary,
    _chat,
    _http_json,
    _system_message,
    _user_message,
    _wait_ready,
)
from tests.rollout_config import rollout_config

STEPS = [1, 5, 25, 50, 100]
NEW_PER_STEP = int(os.environ.get("CANARY_REAL_RAMP_SESSIONS_PER_STEP", "6"))
MIN_STEP_S = 10.0  # the dwell of every step; at 100 % it starts the completion's countdown
SUCCESS = "vllm:request_success_total"

pytestmark = pytest.mark.timeout(1800)


def _session_hash(key: str) -> int:
    h = xxhash.xxh3_64_intdigest(key.encode())
    return h - (1 << 64) if h >= 1 << 63 else h


async def _round(
    client: object,
    history: dict[str, list[dict[str, str]]],
    rngs: dict[str, random.Random],
    numbers: dict[str, int],
) -> list[Turn]:
    """One turn of every open session, 4 at a time (the engines share two cores). A session
    closes after its TURNS turns: each turn re-sends the history, and a fourth would near the
    engines' 2,048-token context (a fifth passed it: 2,049 prompt tokens, and vLLM's 400)."""
    sem = asyncio.Semaphore(4)
    out: list[Turn] = []

    async def one(sid: str) -> None:
        messages = history[sid]
        n = len(messages) // 2 + 1
        messages.append({"role": "user", "content": _user_message(rngs[sid], numbers[sid], n)})
        turn = Turn(sid, n, list(messages))
        async with sem:
            await _chat(client, turn.messages, sid, turn)
        out.append(turn)
        if turn.error is None:
            messages.append({"role": "assistant", "content": turn.text})
        else:
            messages.pop()

    await asyncio.gather(*(one(sid) for sid in history if len(history[sid]) // 2 < TURNS))
    return out


def _run_rollout(gw: str) -> tuple[list[Turn], list[float], int]:
    """Start the forced ramp; at each step open new sessions, run a turn of every session, and
    advance by hand; the turns, the weights seen and the rollout id."""
    import openai

    async def run() -> tuple[list[Turn], list[float], int]:
        client = openai.AsyncOpenAI(base_url=gw + "/v1", api_key="unused", max_retries=0)
        history: dict[str, list[dict[str, str]]] = {}
        rngs: dict[str, random.Random] = {}
        numbers: dict[str, int] = {}
        turns: list[Turn] = []
        weights: list[float] = []
        body = {"steps": STEPS, "min_step_s": MIN_STEP_S, "force": True, "reason": "real ramp"}
        status, started = _http_json("POST", gw + "/admin/candidates/bi-kv/rollout", body)
        assert status == 201, started
        try:
            for step in range(len(STEPS)):
                await asyncio.sleep(0.5)  # the registry's poll applies the new weight
                for i in range(NEW_PER_STEP):
                    sid = f"ramp-{step}-{i}"
                    rngs[sid] = random.Random(sid)
                    numbers[sid] = 1000 * step + i
                    history[sid] = [
                        {"role": "system", "content": _system_message(rngs[sid], numbers[sid])}
                    ]
                turns += await _round(client, history, rngs, numbers)
                status, view = _http_json("GET", gw + "/admin/rollout")
                assert status == 200, view
                weights.append(view["weight"])
                if step + 1 < len(STEPS):
                    status, view = _http_json(
                        "POST", gw + "/admin/rollout/advance", {"reason": "by hand"}
                    )
                    assert status == 200, view
                    if view["weight"] == 100:
                        # Paused within the dwell, so the controller cannot complete while the
                        # last turns run (after it, every turn goes to the new live endpoint).
                        status, view = _http_json(
                            "POST", gw + "/admin/rollout/pause", {"reason": "last turns"}
                        )
                        assert status == 200, view
            status, view = _http_json("POST", gw + "/admin/rollout/resume", {"reason": "done"})
            assert status == 200, view
        finally:
            await client.close()
        return turns, weights, int(started["id"])

    return asyncio.run(run())


def test_prefix_caching_candidate_rolled_out_to_100_percent_keeps_sessions_on_one_engine(
    real_engines: dict[str, eng.Engine],
) -> None:
    """A forced 1-5-25-50-100 ramp of the prefix-caching engine, advanced by hand under
    multi-turn sessions opened at every step, completes by the controller with 0 client errors;
    every session's stored arm is single-valued, and the turns of each arm's sessions equal the
    requests each real engine counted; the candidate is then live, with a promotion."""
    live, cand = real_engines["live"], real_engines["bi-kv"]
    workdir = Path(tempfile.mkdtemp(prefix="canary-real-ramp-"))
    db_path = workdir / "canary.db"
    config = workdir / "gw.toml"
    config.write_text(rollout_config(cand.url))
    port = eng.free_port(set())
    gw = f"http://127.0.0.1:{port}"
    log = workdir / "gateway.log"
    before = {name: eng.scrape(e.url) for name, e in (("live", live), ("bi-kv", cand))}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [_canary(), "serve", "--live", live.url, "--listen", f"127.0.0.1:{port}",
             "--db", f"sqlite+aiosqlite:///{db_path}", "--insecure-admin",
             "--config", str(config), "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _wait_ready(gw, proc, log)
        turns, weights, rollout_id = _run_rollout(gw)
        deadline = time.monotonic() + 120
        while True:
            status, view = _http_json("GET", gw + "/admin/rollout")
            if view["state"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(1.0)  # the completion reaches the worker by the poll
        status, gw_status = _http_json("GET", gw + "/admin/status")
        assert status == 200, gw_status
    finally:
        proc.send_signal(signal.SIGTERM)  # the writer drains before it exits
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    errors = [f"{t.session}/{t.turn}: {t.error}" for t in turns if t.error]
    assert errors == [], errors
    assert weights == [float(w) for w in STEPS]
    assert view["state"] == "completed" and view["events"][-1]["actor"] == "controller", view
    assert gw_status["live"]["name"] == "bi-kv"
    assert gw_status["last_promotion"]["to_endpoint"] == "bi-kv"
    assert all(t.finish_reason for t in turns)

    with sqlite3.connect(db_path) as db:
        rows = list(
            db.execute(
                "SELECT session, arm FROM rollout_requests WHERE generation = ?",
                (rollout_id * 2,),
            )
        )
    assert len(rows) == len(turns)
    arms: dict[int, set[int]] = {}
    for session, arm in rows:
        arms.setdefault(session, set()).add(arm)
    keys = {t.session for t in turns}
    assert all(len(arms[_session_hash(k)]) == 1 for k in keys), arms
    arm_of = {k: next(iter(arms[_session_hash(k)])) for k in keys}
    assert 0 < sum(arm_of.values()) < len(keys)
    assert all(arm_of[f"ramp-{len(STEPS) - 1}-{i}"] == 1 for i in range(NEW_PER_STEP))
    expected = {
        "live": sum(1 for t in turns if arm_of[t.session] == 0),
        "bi-kv": sum(1 for t in turns if arm_of[t.session] == 1),
    }
    counted = {}
    for name, e in (("live", live), ("bi-kv", cand)):
        after = eng.settled_scrape(
            e.url, SUCCESS, reach=before[name].get(SUCCESS, 0.0) + expected[name]
        )
        counted[name] = eng.delta(after, before[name], SUCCESS)
    assert counted == {k: float(v) for k, v in expected.items()}, (counted, expected)
