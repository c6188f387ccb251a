"""The ramp end to end, through whole processes: `canary serve` on SQLite in front of two
`canary sim` engines (baseline as production, bi-kv as the candidate), agent-like multi-turn
sessions through the official `openai` SDK, and the operator's admin API.

Each simulator logs the X-Session-ID of every request it served (`GET /sim/requests`): that is
the ground truth of which engine served a session, checked against the arm the gateway stored
for it (`rollout_requests`). The candidate is configured with `sample_rate = 0`, so no mirrored
copy reaches its simulator and every request in its log is one it served for a client."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
import xxhash
from sqlalchemy import select

from bench._shared.fleet import child_env as _env
from bench._shared.fleet import cli as _cli
from bench._shared.nginx import wait_http as _wait_http
from storage import queries
from storage.engine import make_engine
from storage.models import RolloutRequestRow
from storage.rollouts import current_rollout
from tests.process.test_serve_cli import spawn_serve, stop, until_serving
from tests.rollout_config import rollout_config
from tests.upstreams import free_port
from tests.waiting import SETTLE_S, until

# Whole processes (a supervisor, a worker, the mirror and report processes, two engines) on a
# shared two-core machine: start-up alone can take tens of seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHAT = "/v1/chat/completions"
MODEL = "sim-model"
TIME_SCALE = "0.05"  # the engines' latency model, 20x faster: this is about routing


@dataclass
class Engine:
    """One `canary sim` child and what its request log has shown so far."""

    url: str
    proc: asyncio.subprocess.Process
    sessions: dict[str, int] = field(default_factory=dict)  # X-Session-ID -> chat requests

    async def harvest(self, http: aiohttp.ClientSession) -> None:
        """Fold the simulator's (bounded, 200-entry) request log into `sessions`; called after
        every round, so no round outgrows the log. Entries are counted by position: the log is
        reset after each read."""
        async with http.get(self.url + "/sim/requests") as resp:
            log = await resp.json()
        async with http.post(self.url + "/sim/reset") as resp:
            assert resp.status == 200
        for entry in log:
            if entry["path"] == CHAT and entry["session"]:
                self.sessions[entry["session"]] = self.sessions.get(entry["session"], 0) + 1


async def _sim(profile: str) -> Engine:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = _cli("sim", "--profile", profile, "--port", str(port), "--time-scale", TIME_SCALE)
    proc = await asyncio.create_subprocess_exec(
        *argv, env=_env(), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    await _wait_http(url + "/health", profile, proc)
    return Engine(url, proc)


async def _end(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    await asyncio.wait_for(proc.wait(), 30)


@asynccontextmanager
async def _engines() -> AsyncIterator[tuple[Engine, Engine]]:
    """Production (baseline) and candidate (bi-kv) simulators."""
    prod, cand = await asyncio.gather(_sim("baseline"), _sim("bi-kv"))
    try:
        yield prod, cand
    finally:
        await asyncio.gather(_end(prod.proc), _end(cand.proc))


def _config(tmp: Path, prod: Engine, cand: Engine) -> Path:
    path = tmp / "gw.toml"
    top = f'live_url = "{prod.url}"\nmirror_priority = "normal"\n'
    path.write_text(top + rollout_config(cand.url))
    return path


async def _serve(tmp: Path, config: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc, port = await spawn_serve(
        tmp, "--insecure-admin", "--workers", "1", "--config", str(config)
    )
    return proc, await until_serving(proc, port)


async def _admin(
    http: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An admin call that must succeed: its JSON answer."""
    if body is None:
        async with http.get(url + path) as resp:
            assert resp.status == 200, await resp.text()
            out: dict[str, Any] = await resp.json()
            return out
    async with http.post(url + path, json=body) as resp:
        assert resp.status in (200, 201), await resp.text()
        out = await resp.json()
        return out


class Sessions:
    """Agent-like conversations: each a growing message list under its own X-Session-ID, one
    turn per round (streamed on odd turns), counting the turns the client saw fail."""

    def __init__(self, url: str) -> None:
        self.client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        self.history: dict[str, list[dict[str, str]]] = {}
        self.errors: list[str] = []
        self.turns = 0

    def open(self, keys: list[str]) -> None:
        for key in keys:
            self.history[key] = [{"role": "system", "content": f"You are agent {key}."}]

    async def turn(self, key: str) -> None:
        messages = self.history[key]
        n = len(messages) // 2
        messages.append({"role": "user", "content": f"step {n} of task {key}: run the tool"})
        headers = {"X-Session-ID": key}
        self.turns += 1
        try:
            if n % 2:
                stream = await self.client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=8,
                    stream=True,
                    extra_headers=headers,
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in stream if c.choices]
                )
            else:
                done = await self.client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=8,
                    extra_headers=headers,
                )
                text = done.choices[0].message.content or ""
        except openai.OpenAIError as exc:
            self.errors.append(f"{key}: {exc!r}")
            messages.pop()
            return
        messages.append({"role": "assistant", "content": text})

    async def round(self, keys: list[str] | None = None) -> None:
        await asyncio.gather(*(self.turn(k) for k in (keys or list(self.history))))

    async def close(self) -> None:
        await self.client.close()


# What the config below promises: the controller looks every `controller_interval_s` (0.5 s)
# and each worker's guard decides on its next candidate failures; the stored decision reaches
# the admin API at once. The bound is the controller's looks and a worker's decision on a busy
# host (each a few turns of a loop), generously.
DECIDE_WITHIN_S = 0.5 + SETTLE_S
# The mirror's writer stores a partial batch after `writer_flush_interval_s` (0.5 s).
WRITE_WITHIN_S = 0.5 + SETTLE_S


async def _rollout_left_running(
    http: aiohttp.ClientSession, url: str, *, within_s: float
) -> dict[str, Any]:
    """The rollout once it is no longer running (completed or rolled back), as the admin API
    shows it; the last view seen if it did not leave `running` within `within_s`."""
    view: dict[str, Any] = {}

    async def left() -> bool:
        nonlocal view
        view = await _admin(http, url, "/admin/rollout")
        return bool(view["state"] != "running")

    with contextlib.suppress(AssertionError):  # the caller's assertions say what was seen
        await until(left, what="the rollout leaving running", within_s=within_s, every_s=0.1)
    return view


async def _stored_arms(
    db: Path, generation: int, expect_rows: int, since: float = 0.0
) -> dict[int, set[int]]:
    """session hash -> the arms stored for it in `generation` (requests ended at or after
    `since`), once the mirror process has written at least `expect_rows` such rows (its writer
    flushes in the background)."""
    engine = make_engine(f"sqlite+aiosqlite:///{db}")
    r = RolloutRequestRow
    query = select(r.session, r.arm).where(r.generation == generation, r.at >= since)
    rows: list[Any] = []

    async def stored() -> bool:
        nonlocal rows
        async with engine.connect() as conn:
            rows = list((await conn.execute(query)).all())
        return len(rows) >= expect_rows

    try:
        # The writer stores a partial batch after `writer_flush_interval_s`.
        with contextlib.suppress(AssertionError):  # the assertion below says what was stored
            await until(stored, what=f"{expect_rows} rows stored", within_s=WRITE_WITHIN_S)
    finally:
        await engine.dispose()
    assert len(rows) >= expect_rows, (len(rows), expect_rows)
    arms: dict[int, set[int]] = {}
    for session, arm in rows:
        arms.setdefault(session, set()).add(arm)
    return arms


async def _salt(db: Path) -> int:
    """The open rollout's salt, as the workers hash with it."""
    engine = make_engine(f"sqlite+aiosqlite:///{db}")
    try:
        rollout = await current_rollout(engine)
    finally:
        await engine.dispose()
    assert rollout is not None and rollout.is_open
    return int(rollout.salt, 16)


def _keys(salt: int, prefix: str, low: float, high: float, n: int) -> list[str]:
    """`n` session keys whose salted hash puts them in [low, high) of the weight: a session
    first seen at weight w goes to the candidate exactly when its point is below w."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        key = f"{prefix}-{i}"
        point = xxhash.xxh3_64_intdigest(key.encode(), salt) / 2**64
        if low <= point < high:
            out.append(key)
        i += 1
    return out


def _hash(key: str) -> int:
    h = xxhash.xxh3_64_intdigest(key.encode())
    return h - (1 << 64) if h >= 1 << 63 else h


def _served_by(prod: Engine, cand: Engine, keys: list[str]) -> dict[str, int]:
    """Which engine served each session (1 candidate, 0 production); fails on a session that
    either engine's log shows on both."""
    served: dict[str, int] = {}
    for key in keys:
        on = {arm for arm, e in ((0, prod), (1, cand)) if key in e.sessions}
        assert len(on) == 1, (key, on)
        served[key] = on.pop()
    return served


async def test_forced_rollout_advanced_by_hand_keeps_every_session_on_one_engine(
    tmp_path: Path,
) -> None:
    """A forced 1-5-25-50-100 ramp advanced by hand while multi-turn sessions run (new ones at
    every step, every session a turn per step, advances racing the turns; paused at 100 % for
    its last turns) completes at 100 % by the controller once resumed: 0 client errors, each
    session's stored arm single-valued and equal to the simulator that served all its turns,
    and the candidate is then live with a promotion."""
    async with _engines() as (prod, cand):
        proc, url = await _serve(tmp_path, _config(tmp_path, prod, cand))
        sessions = Sessions(url)
        try:
            async with aiohttp.ClientSession() as http:
                start = {
                    "steps": [1, 5, 25, 50, 100],
                    "min_step_s": 5.0,
                    "force": True,
                    "reason": "e2e drill",
                }
                started = await _admin(http, url, "/admin/candidates/bi-kv/rollout", start)
                assert (started["state"], started["weight"]) == ("running", 1.0)
                generation = started["id"] * 2
                weights = [1.0]
                for step in range(5):
                    sessions.open([f"s{step}-{i}" for i in range(8)])
                    await sessions.round()
                    if step < 4:  # an advance races a round of turns of every session
                        turns = asyncio.ensure_future(sessions.round())
                        moved = await _admin(
                            http, url, "/admin/rollout/advance", {"reason": "by hand"}
                        )
                        await turns
                        weights.append(moved["weight"])
                        if moved["weight"] == 100.0:
                            # Paused within the 100 % step's dwell, so the controller cannot
                            # complete while its turns run: a turn after the completion goes
                            # to the new live endpoint, the candidate, whatever its session.
                            await _admin(http, url, "/admin/rollout/pause", {"reason": "turns"})
                    await asyncio.gather(prod.harvest(http), cand.harvest(http))
                    await asyncio.sleep(0.4)  # the registry's poll applies the new weight
                assert weights == [1.0, 5.0, 25.0, 50.0, 100.0]
                await _admin(http, url, "/admin/rollout/resume", {"reason": "turns done"})
                # At 100 % there is no next step: the controller completes after the dwell.
                view = await _rollout_left_running(http, url, within_s=5.0 + DECIDE_WITHIN_S)
                assert view["state"] == "completed", view
                kinds = [e["kind"] for e in view["events"]]
                assert kinds[-3:] == ["pause", "resume", "complete"], kinds
                assert view["events"][-1]["actor"] == "controller"
                await asyncio.sleep(0.5)  # the completion reaches the worker by the poll
                status = await _admin(http, url, "/admin/status")
                assert status["live"]["name"] == "bi-kv"
                assert status["last_promotion"]["to_endpoint"] == "bi-kv"
        finally:
            await sessions.close()
            code, err = await stop(proc)
        assert code == 0, err[-2000:]
    assert sessions.errors == [], sessions.errors
    keys = list(sessions.history)
    # Step s (0..4) opens 8 sessions and runs two rounds of every open one (one at 100 %).
    assert sessions.turns == sum(8 * (s + 1) * (1 if s == 4 else 2) for s in range(5))
    served = _served_by(prod, cand, keys)
    stored = await _stored_arms(tmp_path / "canary.db", generation, sessions.turns)
    for key in keys:
        assert stored[_hash(key)] == {served[key]}, (key, stored[_hash(key)], served[key])
    # Both arms served sessions, and each session's every turn reached its engine.
    assert 0 < sum(served.values()) < len(keys)
    assert all(
        len(sessions.history[k]) // 2 == (cand if served[k] else prod).sessions[k] for k in keys
    )
    # The sessions opened at 100 % are all the candidate's; those opened at 1 % mostly not.
    assert all(served[f"s4-{i}"] == 1 for i in range(8))
    engine = make_engine(f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}")
    try:
        audit = await queries.list_promotions(engine, 1)
    finally:
        await engine.dispose()
    assert (audit[0].to_endpoint, audit[0].reason) == ("bi-kv", "rollout completed")


async def _metric(http: aiohttp.ClientSession, url: str, series: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} not exported")


async def test_a_candidate_killed_at_25_percent_is_rolled_back_without_client_errors(
    tmp_path: Path,
) -> None:
    """The candidate's engine SIGKILLed while 12 sessions (6 on each arm) run turns back to back
    at 25 %: a worker's guard rolls the ramp back and stores it, the candidate's sessions
    continue on production, and the client sees at most one error per candidate session (a
    stream the kill cut after its first byte cannot be retried); in practice 0."""
    async with _engines() as (prod, cand):
        proc, url = await _serve(tmp_path, _config(tmp_path, prod, cand))
        sessions = Sessions(url)
        try:
            async with aiohttp.ClientSession() as http:
                start = {"steps": [25, 100], "min_step_s": 600, "force": True, "reason": "drill"}
                await _admin(http, url, "/admin/candidates/bi-kv/rollout", start)
                await asyncio.sleep(0.4)  # the registry's poll applies it
                salt = await _salt(tmp_path / "canary.db")
                on_cand = _keys(salt, "c", 0.0, 0.25, 6)
                on_prod = _keys(salt, "p", 0.25, 1.0, 6)
                sessions.open(on_cand + on_prod)
                await sessions.round()
                await asyncio.gather(prod.harvest(http), cand.harvest(http))
                assert set(cand.sessions) == set(on_cand) and set(prod.sessions) == set(on_prod)
                assert sessions.errors == []

                stop_turns = asyncio.Event()

                async def agent(key: str) -> None:
                    while not stop_turns.is_set():
                        await sessions.turn(key)
                        await asyncio.sleep(0.1)

                agents = [asyncio.ensure_future(agent(k)) for k in sessions.history]
                try:
                    await asyncio.sleep(0.5)
                    cand.proc.kill()  # mid-turn: some of its requests are in flight
                    await cand.proc.wait()
                    view = await _rollout_left_running(http, url, within_s=DECIDE_WITHIN_S)
                    await asyncio.sleep(1.0)  # more turns, all on production now
                finally:
                    stop_turns.set()
                    await asyncio.gather(*agents)
                await prod.harvest(http)
                fallbacks = sum(
                    [
                        await _metric(http, url, f'canary_rollout_fallbacks_total{{reason="{r}"}}')
                        for r in ("connect", "reset", "status_5xx", "timeout")
                    ]
                )
                rollbacks = sum(
                    [
                        await _metric(http, url, f'canary_rollout_rollbacks_total{{reason="{r}"}}')
                        for r in ("guard_consecutive", "guard_burst")
                    ]
                )
        finally:
            await sessions.close()
            code, err = await stop(proc)
        assert code == 0, err[-2000:]
    assert view["state"] == "rolled_back", view
    rollback = view["events"][-1]
    assert rollback["kind"] == "rollback" and rollback["to_weight"] == 0, rollback
    assert rollback["reason"].startswith(("guard_", "harm")), rollback
    assert rollbacks == 1 and fallbacks >= 1, (rollbacks, fallbacks)
    # Every candidate session went on, on production: its turns after the kill reached it.
    assert all(k in prod.sessions for k in on_cand), prod.sessions
    assert len(sessions.errors) <= len(on_cand), sessions.errors
    assert sessions.turns > 4 * len(sessions.history)


async def test_a_restart_mid_rollout_resumes_the_same_step_and_split(tmp_path: Path) -> None:
    """`canary serve` stopped (SIGTERM) at 25 % and started again on the same database shows
    the same rollout, state, weight and step, and routes at once by the same salt and weight:
    the host's session table is gone, so every session, old or new, is decided by its salted
    hash against 25 %: sessions that were the candidate's at 5 % or 25 % stay there, those on
    production above 25 % stay there, and those that started on production at 5 % with a
    point in [5 %, 25 %) now move to the candidate (the documented limit)."""
    db = tmp_path / "canary.db"
    async with _engines() as (prod, cand):
        config = _config(tmp_path, prod, cand)
        proc, url = await _serve(tmp_path, config)
        sessions = Sessions(url)
        try:
            async with aiohttp.ClientSession() as http:
                start = {
                    "steps": [5, 25, 50, 100],
                    "min_step_s": 600,
                    "force": True,
                    "reason": "drill",
                }
                await _admin(http, url, "/admin/candidates/bi-kv/rollout", start)
                await asyncio.sleep(0.4)
                salt = await _salt(db)
                a = _keys(salt, "a", 0.0, 0.05, 3)  # candidate from 5 %
                b = _keys(salt, "b", 0.05, 0.25, 3)  # production at 5 %, below 25 %
                c = _keys(salt, "c", 0.25, 1.0, 3)  # production
                sessions.open(a + b + c)
                await sessions.round()
                before = await _admin(http, url, "/admin/rollout/advance", {"reason": "hand"})
                await asyncio.sleep(0.4)
                d = _keys(salt, "d", 0.05, 0.25, 3)  # new at 25 %: the candidate
                sessions.open(d)
                await sessions.round()
                await asyncio.gather(prod.harvest(http), cand.harvest(http))
                first = _served_by(prod, cand, a + b + c + d)
                assert first == {k: int(k in a or k in d) for k in a + b + c + d}
        finally:
            code, err = await stop(proc)
            await sessions.close()
        assert code == 0, err[-2000:]

        proc, url = await _serve(tmp_path, config)
        restarted = time.time()
        sessions.client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        prod.sessions.clear()
        cand.sessions.clear()
        try:
            async with aiohttp.ClientSession() as http:
                after = await _admin(http, url, "/admin/rollout")
                e = _keys(salt, "e", 0.0, 0.25, 2) + _keys(salt, "f", 0.25, 1.0, 2)
                sessions.open(e)
                await sessions.round()  # the first requests after it is ready
                await asyncio.gather(prod.harvest(http), cand.harvest(http))
        finally:
            await sessions.close()
            code, err = await stop(proc)
        assert code == 0, err[-2000:]
    same = ("id", "state", "weight", "step", "steps", "generation", "step_started_at")
    assert {k: after[k] for k in same} == {k: before[k] for k in same}, (before, after)
    assert (after["state"], after["weight"], after["step"]) == ("running", 25.0, 1)
    assert sessions.errors == [], sessions.errors
    keys = a + b + c + d + e
    now = _served_by(prod, cand, keys)
    by_hash = {
        k: int(xxhash.xxh3_64_intdigest(k.encode(), salt) < round(0.25 * 2**64)) for k in keys
    }
    assert now == by_hash
    assert all(now[k] == 1 for k in a + d) and all(now[k] == 0 for k in c)
    assert all(first[k] == 0 and now[k] == 1 for k in b)  # moved: the table did not survive
    # The restarted worker stored the same arms, in the same generation.
    stored = await _stored_arms(db, after["id"] * 2, len(keys), since=restarted)
    assert {k: stored[_hash(k)] for k in keys} == {k: {now[k]} for k in keys}
