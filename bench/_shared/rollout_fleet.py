"""A rollout fleet, for bench/rollout_fleet.py and the fleet tests (tests/process/): two
`canary serve` replicas on one PostgreSQL database behind the shipped nginx, production and the
candidate as nginx servers answering a fixed chat completion that names the arm (the candidate
answers 503 to a request carrying X-Fail, so a worker's guard trips on demand), and the
rollback-reach trial.

A trial opens a forced rollout at 50 % through replica A, waits until both replicas route by it,
makes A decide a rollback (an operator abort on A's admin API, or A's guard tripped by five
failing candidate requests), and times how long B keeps routing a fresh candidate-bound session
to the candidate after the decision's stored `at`. Session keys bound to the candidate are found
from the rollout's stored salt with the router's own threshold, so one request per probe tells
which arm B routes new sessions to (a probe is a fresh session: the table's memory plays no
part)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import xxhash
from openai import AsyncOpenAI

from bench._shared.fleet import TOKEN, replicas
from bench._shared.nginx import nginx_binary, nginx_front, wait_http
from bench._shared.ports import free_port
from gateway.rollout import arms
from storage.engine import make_engine, upgrade
from storage.rollouts import current_rollout

PRODUCTION_MODEL = "production-arm"
CANDIDATE_MODEL = "candidate-arm"
WEIGHT = 50.0
PROBE_EVERY_S = 0.01
_AUTH = {"Authorization": f"Bearer {TOKEN.partition(':')[2]}"}

_COMPLETION = (
    '{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"MODEL","choices":'
    '[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
_ARMS_CONF = """
worker_processes 1;
master_process off;
pid TMP/arms.pid;
error_log TMP/arms-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path TMP/arms-body;
  server {
    listen 127.0.0.1:LIVE_PORT;
    location / { default_type application/json; return 200 'PRODUCTION_BODY'; }
  }
  server {
    listen 127.0.0.1:CAND_PORT;
    location / {
      default_type application/json;
      if ($http_x_fail) { return 503; }
      return 200 'CANDIDATE_BODY';
    }
  }
}
"""


@dataclass(frozen=True, slots=True)
class Fleet:
    a: str
    b: str
    front: str
    db_url: str


@dataclass(frozen=True, slots=True)
class Reach:
    """One trial: when A's rollback was decided (its stored event's `at`), when A's admin API
    answered (operator abort only), when B first routed a candidate-bound session to production,
    and how many probes B served on the candidate after the decision."""

    kind: str
    decided_at: float
    answered_at: float | None
    reached_at: float
    late_probes: int

    @property
    def reach_s(self) -> float:
        return self.reached_at - self.decided_at


def _config(tmp: Path, live: str, cand: str, poll_s: float) -> Path:
    conf = tmp / "gateway.toml"
    conf.write_text(
        f"""
live_url = "{live}"
registry_poll_interval_s = {poll_s}
mirror_priority = "normal"
mirror_shed_loop_lag_ms = 500.0
mirror_shed_cpu_busy = 0.0

[[candidates]]
name = "cand"
url = "{cand}"
sample_rate = 0.0
"""
    )
    return conf


@asynccontextmanager
async def _arm_servers(tmp: Path) -> AsyncIterator[tuple[str, str]]:
    live, cand = free_port(), free_port()
    text = _ARMS_CONF.replace("TMP", str(tmp))
    text = text.replace("LIVE_PORT", str(live)).replace("CAND_PORT", str(cand))
    text = text.replace("PRODUCTION_BODY", _COMPLETION.replace("MODEL", PRODUCTION_MODEL))
    text = text.replace("CANDIDATE_BODY", _COMPLETION.replace("MODEL", CANDIDATE_MODEL))
    conf = tmp / "arms.conf"
    conf.write_text(text)
    proc = await asyncio.create_subprocess_exec(
        *(nginx_binary(), "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        urls = (f"http://127.0.0.1:{live}", f"http://127.0.0.1:{cand}")
        for url in urls:
            await wait_http(url + "/health", "arm server", proc)
        yield urls
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


@asynccontextmanager
async def rollout_fleet(tmp: Path, db_url: str, *, poll_s: float) -> AsyncIterator[Fleet]:
    """The fleet on an empty database `db_url`, every replica polling the registry every
    `poll_s` seconds (besides PostgreSQL's LISTEN)."""
    await upgrade(db_url)
    async with _arm_servers(tmp) as (live, cand):
        conf = _config(tmp, live, cand, poll_s)
        async with (
            replicas(conf, db_url, "replica-a", "replica-b") as (a, b),
            nginx_front(tmp, [a, b], affinity=True) as front,
        ):
            yield Fleet(a, b, front, db_url)


def _client(replica: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=replica + "/v1", api_key="unused", max_retries=0, timeout=30)


async def served_by(client: AsyncOpenAI, key: str, *, fail: bool = False) -> str:
    """The arm (its model name) that served a one-turn session `key`."""
    headers = {"X-Session-ID": key} | ({"X-Fail": "1"} if fail else {})
    resp = await client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=1, extra_headers=headers
    )
    return resp.model


def candidate_keys(salt: str, prefix: str) -> Iterator[str]:
    """Fresh session keys that the rollout with this salt sends to the candidate at WEIGHT."""
    threshold = arms.Split(
        1, salt=int(salt, 16), weight=WEIGHT / 100, candidate="c", state="ramping"
    ).threshold
    for i in itertools.count():
        key = f"{prefix}-{i}"
        if xxhash.xxh3_64_intdigest(key.encode(), int(salt, 16)) < threshold:
            yield key


async def _admin(
    http: aiohttp.ClientSession, url: str, body: dict[str, object]
) -> dict[str, object]:
    async with http.post(url, json=body, headers=_AUTH) as resp:
        assert resp.status < 300, (resp.status, await resp.text())
        out: dict[str, object] = await resp.json()
        return out


async def _salt(db_url: str) -> str:
    engine = make_engine(db_url)
    try:
        rollout = await current_rollout(engine)
    finally:
        await engine.dispose()
    assert rollout is not None and rollout.is_open
    return rollout.salt


async def _until(client: AsyncOpenAI, keys: Iterator[str], model: str, timeout_s: float) -> int:
    """Probe until a fresh key is served by `model`; the probes served otherwise."""
    deadline = time.monotonic() + timeout_s
    other = 0
    while await served_by(client, next(keys)) != model:
        other += 1
        assert time.monotonic() < deadline, f"not routed to {model} within {timeout_s} s"
        await asyncio.sleep(PROBE_EVERY_S)
    return other


async def trial(fleet: Fleet, n: int, kind: str, *, timeout_s: float) -> Reach:
    """One rollout opened through A and rolled back by A (`kind` "abort" or "guard"), with B's
    routing probed every PROBE_EVERY_S seconds from before the decision until it sends a
    candidate-bound session to production."""
    async with _client(fleet.a) as a, _client(fleet.b) as b, aiohttp.ClientSession() as http:
        start = {"steps": [WEIGHT, 100.0], "min_step_s": 3600, "force": True, "reason": "bench"}
        await _admin(http, f"{fleet.a}/admin/candidates/cand/rollout", start)
        keys = candidate_keys(await _salt(fleet.db_url), f"t{n}-{kind}")
        for client in (a, b):  # both replicas route by the new rollout
            await _until(client, keys, CANDIDATE_MODEL, timeout_s)
        reached: list[float] = []
        on_candidate: list[float] = []  # when each probe B still sent to the candidate answered

        async def probe_b() -> None:
            while True:
                served = await served_by(b, next(keys))
                (reached if served == PRODUCTION_MODEL else on_candidate).append(time.time())
                if reached:
                    return
                await asyncio.sleep(PROBE_EVERY_S)

        prober = asyncio.create_task(probe_b())  # awaited below, within this trial
        try:
            await asyncio.sleep(5 * PROBE_EVERY_S)  # B is being probed before A decides
            answered: float | None = None
            if kind == "abort":
                await _admin(http, f"{fleet.a}/admin/rollout/abort", {"reason": "bench"})
                answered = time.time()
            else:  # five candidate failures in a row on A's worker
                while True:
                    assert await served_by(a, next(keys), fail=True) == PRODUCTION_MODEL
                    async with http.get(f"{fleet.a}/admin/rollout", headers=_AUTH) as resp:
                        if (await resp.json())["state"] != "running":
                            break
            await asyncio.wait_for(asyncio.shield(prober), timeout_s)
        finally:
            prober.cancel()
            await asyncio.gather(prober, return_exceptions=True)
        async with http.get(f"{fleet.a}/admin/rollout", headers=_AUTH) as resp:
            view = await resp.json()
    event = view["events"][-1]
    assert event["kind"] == ("abort" if kind == "abort" else "rollback"), event
    decided = float(event["at"])
    late = sum(1 for t in on_candidate if t > decided)
    return Reach(kind, decided, answered, reached[0], late)
