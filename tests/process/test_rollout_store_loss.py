"""The ramp fails safe without its store: two `canary serve` replicas on PostgreSQL reached
through a TCP link the test cuts and restores (tests/store_link.py; the machine's server keeps
running), a ramp at 50 %, the `[rollout]` store settings at their defaults.

With the store gone, replica A's guard rolls A back on A's own failing traffic at once and B,
whose traffic is healthy, holds new sessions on production after `rollout.store_loss_hold_s`;
once the store is back, A's rollback is stored within a retry and B goes from held to rolled
back without sending a new session to the candidate. Then, for a healthy candidate, both
replicas hold while the store is gone (a session already on the candidate keeps it) and resume
the stored 50 % once it has answered for `rollout.store_resume_after_s`. Production answers
every request throughout, and nobody intervenes. The timings are printed, for bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from openai import AsyncOpenAI

from bench._shared.fleet import TOKEN
from bench._shared.fleet import child_env as _env
from bench._shared.fleet import cli as _cli
from bench._shared.nginx import wait_http as _wait_http
from bench._shared.rollout_fleet import (
    _COMPLETION,
    CANDIDATE_MODEL,
    PRODUCTION_MODEL,
    _admin,
    _client,
    _config,
    _salt,
    _until,
    candidate_keys,
    served_by,
)
from gateway.config.sections import RolloutConfig
from storage.engine import make_engine, upgrade
from storage.rollouts import current_rollout
from tests.process.test_fleet import PG_ONLY
from tests.store_link import StoreLink, store_link
from tests.upstreams import free_port

pytestmark = pytest.mark.slow

DEFAULTS = RolloutConfig()
HOLD_S = DEFAULTS.store_loss_hold_s
RESUME_S = DEFAULTS.store_resume_after_s
RETRY_MAX_S = DEFAULTS.store_retry_max_s
# storage.registry_poll_interval_s, its default: the last read before a cut may be this old, so
# a hold can come this much before HOLD_S after the cut (the bound runs from the last read).
POLL_S = 2.0
PROBE_S = 0.05
_AUTH = {"Authorization": f"Bearer {TOKEN.partition(':')[2]}"}
_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


@asynccontextmanager
async def _arm_servers() -> AsyncIterator[tuple[str, str]]:
    """Production and the candidate on 127.0.0.1:0, answering a chat completion that names the
    arm; the candidate answers 503 to a request carrying X-Fail (the arms of
    bench/_shared/rollout_fleet.py, without its nginx)."""

    def app(model: str, failing: bool) -> web.Application:
        body = _COMPLETION.replace("MODEL", model)

        async def answer(request: web.Request) -> web.Response:
            await request.read()
            if failing and "X-Fail" in request.headers:
                return web.Response(status=503, text="failing on purpose")
            return web.Response(text=body, content_type="application/json")

        a = web.Application()
        a.router.add_route("*", "/{tail:.*}", answer)
        return a

    runners = [
        web.AppRunner(app(PRODUCTION_MODEL, False)),
        web.AppRunner(app(CANDIDATE_MODEL, True)),
    ]
    urls = []
    try:
        for runner in runners:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        yield urls[0], urls[1]
    finally:
        for runner in runners:
            await runner.cleanup()


@asynccontextmanager
async def _replicas(conf: Path, db_url: str, logs: Path) -> AsyncIterator[tuple[str, str]]:
    """Replicas A and B on one config and database, each logging to `logs`/<name>.log (the test
    reads the hold's and the stored rollback's lines); SIGTERM and a clean exit for each."""
    procs, urls = [], []
    try:
        for name in ("replica-a", "replica-b"):
            port = free_port()
            args = ["serve", "--config", str(conf), "--listen", f"127.0.0.1:{port}"]
            env = _env() | {"CANARY_ADMIN_TOKEN": TOKEN, "CANARY_SERVER_REPLICA_NAME": name}
            with (logs / f"{name}.log").open("wb") as log:
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *_cli(*args, "--db", db_url),
                        env=env,
                        stdout=asyncio.subprocess.DEVNULL,
                        stderr=log,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            await _wait_http(url + "/readyz", "replica", proc)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        codes = [await asyncio.wait_for(proc.wait(), 60) for proc in procs]
        assert codes == [0] * len(procs), codes


@dataclass
class Load:
    """Background users on both replicas, fresh sessions on either arm: every answer counted."""

    replicas: tuple[str, str]
    answered: int = 0
    errors: list[str] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as http:
            for i in itertools.count():
                if stop.is_set():
                    return
                url = self.replicas[i % 2] + "/v1/chat/completions"
                try:
                    async with http.post(
                        url, json=_BODY, headers={"X-Session-ID": f"user-{i}"}
                    ) as resp:
                        await resp.read()
                        if resp.status != 200:
                            self.errors.append(f"{url}: {resp.status}")
                except aiohttp.ClientError as exc:
                    self.errors.append(f"{url}: {exc!r}")
                self.answered += 1
                await asyncio.sleep(0.02)


async def _first(client: AsyncOpenAI, keys: Iterator[str], model: str, since: float) -> float:
    """Seconds from `since` until a fresh key is served by `model` (probing every PROBE_S)."""
    while await served_by(client, next(keys)) != model:
        assert time.monotonic() - since < 60, f"{client.base_url} never routed to {model}"
        await asyncio.sleep(PROBE_S)
    return time.monotonic() - since


async def _never(client: AsyncOpenAI, keys: Iterator[str], model: str, for_s: float) -> int:
    """Probe fresh keys for `for_s` seconds; how many were served by `model`."""
    until = time.monotonic() + for_s
    hits = 0
    while time.monotonic() < until:
        hits += await served_by(client, next(keys)) == model
        await asyncio.sleep(PROBE_S)
    return hits


async def _metric(http: aiohttp.ClientSession, replica: str, name: str) -> float:
    async with http.get(replica + "/metrics") as resp:
        text = await resp.text()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    assert values, f"{name} not exported by {replica}"
    return sum(values)


async def _rolled_back_after(http: aiohttp.ClientSession, replica: str, since: float) -> float:
    """Seconds from `since` (time.time()) until `replica`'s router is rolled back."""
    while True:
        async with http.get(replica + "/metrics") as resp:
            text = await resp.text()
        if any(
            ln.startswith("canary_rollout_state{")
            and 'state="rolled_back"' in ln
            and ln.endswith(" 1")
            for ln in text.splitlines()
        ):
            return time.time() - since
        assert time.time() - since < 30, f"{replica} not rolled back"
        await asyncio.sleep(PROBE_S)


async def _state(http: aiohttp.ClientSession, replica: str) -> dict[str, object]:
    async with http.get(replica + "/admin/rollout", headers=_AUTH) as resp:
        assert resp.status == 200, await resp.text()
        out: dict[str, object] = await resp.json()
        return out


@asynccontextmanager
async def _at_half(
    db_url: str, a: str, b: str, http: aiohttp.ClientSession, prefix: str
) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI, Iterator[str]]]:
    """A forced rollout at 50 % started on A: clients of A and B, once each has routed a fresh
    key to the candidate, and the fresh keys (`prefix`-N) the rollout sends to the candidate."""
    start = {"steps": [50.0, 100.0], "min_step_s": 3600, "force": True, "reason": "store loss"}
    await _admin(http, f"{a}/admin/candidates/cand/rollout", start)
    keys = candidate_keys(await _salt(db_url), prefix)
    async with _client(a) as ca, _client(b) as cb:
        for client in (ca, cb):
            await _until(client, keys, CANDIDATE_MODEL, 30.0)
        yield ca, cb, keys


async def _guard_phase(
    link: StoreLink, db_url: str, a: str, b: str, http: aiohttp.ClientSession
) -> dict[str, float]:
    """A failing candidate while the store is gone: A's guard, B's hold, the stored rollback."""
    async with _at_half(db_url, a, b, http, "guard") as (ca, cb, keys):
        link.cut()
        cut = time.monotonic()
        # Candidate failures on A (each answered by production, the fallback): ten trip the
        # burst guard even when the users' requests break the run of five in a row.
        for _ in range(10):
            assert await served_by(ca, next(keys), fail=True) == PRODUCTION_MODEL
        a_guard_s = await _first(ca, keys, PRODUCTION_MODEL, cut)
        b_hold_s = await _first(cb, keys, PRODUCTION_MODEL, cut)
        assert HOLD_S - POLL_S < b_hold_s < HOLD_S + 3.0, b_hold_s
        assert await _metric(http, a, "canary_rollout_guard_rollbacks_pending") == 1
        assert await _metric(http, b, "canary_rollout_store_holds_total") == 1
        assert await _metric(http, b, "canary_rollout_store_held") == 1

        link.restore()
        restored = time.time()
        # Neither replica sends a new session to the candidate again: A rolled back, B held
        # until it reads A's stored rollback (it resumes only after RESUME_S of answers).
        *late, b_rolled_back_s = await asyncio.gather(
            _never(ca, keys, CANDIDATE_MODEL, RESUME_S + POLL_S + 1.0),
            _never(cb, keys, CANDIDATE_MODEL, RESUME_S + POLL_S + 1.0),
            _rolled_back_after(http, b, restored),
        )
        assert late == [0, 0], late
    view = await _state(http, a)
    assert view["state"] == "rolled_back", view
    events = view["events"]
    assert isinstance(events, list)
    event = events[-1]
    assert (event["kind"], event["actor"]) == ("rollback", "guard"), event
    assert str(event["reason"]).startswith("guard_"), event
    assert await _metric(http, a, "canary_rollout_guard_rollbacks_pending") == 0
    while await _metric(http, b, "canary_rollout_store_held"):  # B's hold ends: rolled back
        assert time.time() - restored < RESUME_S + POLL_S + 10.0, "B stays held"
        await asyncio.sleep(PROBE_S)
    b_unheld_s = time.time() - restored
    stored_s = float(event["at"]) - restored
    assert 0 < stored_s < RESUME_S, stored_s
    return {
        "a_guard_s": a_guard_s,
        "b_hold_s": b_hold_s,
        "stored_s": stored_s,
        "b_unheld_s": b_unheld_s,
        "b_rolled_back_s": b_rolled_back_s,
    }


async def _healthy_phase(
    link: StoreLink, db_url: str, a: str, b: str, http: aiohttp.ClientSession
) -> dict[str, float]:
    """A healthy candidate while the store is gone: both hold, then resume the stored 50 %."""
    async with _at_half(db_url, a, b, http, "healthy") as (ca, cb, keys):
        kept = next(keys)
        assert await served_by(cb, kept) == CANDIDATE_MODEL
        link.cut()
        cut = time.monotonic()
        a_hold_s, b_hold_s = await asyncio.gather(
            _first(ca, keys, PRODUCTION_MODEL, cut), _first(cb, keys, PRODUCTION_MODEL, cut)
        )
        for hold_s in (a_hold_s, b_hold_s):
            assert HOLD_S - POLL_S < hold_s < HOLD_S + 3.0, hold_s
        assert await served_by(cb, kept) == CANDIDATE_MODEL  # its next turn keeps its arm
        await asyncio.sleep(2.0)  # the store stays away: still held
        assert await _never(cb, keys, CANDIDATE_MODEL, 1.0) == 0

        link.restore()
        back = time.monotonic()
        a_resume_s, b_resume_s = await asyncio.gather(
            _first(ca, keys, CANDIDATE_MODEL, back), _first(cb, keys, CANDIDATE_MODEL, back)
        )
        for resume_s in (a_resume_s, b_resume_s):
            assert RESUME_S <= resume_s < RESUME_S + POLL_S + 3.0, resume_s
        assert await served_by(cb, kept) == CANDIDATE_MODEL
    view = await _state(http, b)
    assert (view["state"], view["weight"]) == ("running", 50.0), view
    await _admin(http, f"{a}/admin/rollout/abort", {"reason": "end of test"})
    return {
        "a_hold_s": a_hold_s,
        "b_hold_s": b_hold_s,
        "a_resume_s": a_resume_s,
        "b_resume_s": b_resume_s,
    }


@PG_ONLY
async def test_the_rollout_fails_safe_without_its_store(db_url: str, tmp_path: Path) -> None:
    """With PostgreSQL cut in the middle of a ramp at 50 %: A's guard acts on A's traffic at
    once, B holds new sessions on production after the bound, A's rollback is stored as soon as
    the store returns and no replica routes a new session by the stale "running" row; a healthy
    candidate is held on both and resumed at the stored weight; production never errs."""
    await upgrade(db_url)
    async with store_link(db_url) as link, _arm_servers() as (live, cand):
        conf = _config(tmp_path, live, cand, POLL_S)
        # The controller judges the arms' latencies, which here are two handlers of this test's
        # busy loop (a ratio of milliseconds: noise it may call harm). It is not what this test
        # is about: an hour between its looks leaves the guards, the holds and the store.
        conf.write_text(conf.read_text() + "\n[rollout]\ncontroller_interval_s = 3600.0\n")
        async with _replicas(conf, link.url(db_url), tmp_path) as (a, b):
            load = Load((a, b))
            stop = asyncio.Event()
            users = asyncio.create_task(load.run(stop))
            try:
                async with aiohttp.ClientSession() as http:
                    guard = await _guard_phase(link, db_url, a, b, http)
                    healthy = await _healthy_phase(link, db_url, a, b, http)
            except BaseException:
                for name in ("replica-a", "replica-b"):  # what the replicas said, for the failure
                    lines = (tmp_path / f"{name}.log").read_text().splitlines()
                    print(f"--- {name}", *(ln for ln in lines if " info " not in ln), sep="\n")
                raise
            finally:
                stop.set()
                await users
    assert load.errors == [] and load.answered > 500, (load.answered, load.errors[:5])
    a_log, b_log = ((tmp_path / f"replica-{x}.log").read_text() for x in "ab")
    assert "(rollout.store_loss_hold_s = 10): new sessions go to production" in b_log
    assert "the guard's rollback of generation" in a_log and "failed attempts" in a_log
    engine = make_engine(db_url)
    try:
        stored = await current_rollout(engine)
    finally:
        await engine.dispose()
    assert stored is not None and stored.state == "aborted"
    print(
        f"\nstore loss (hold {HOLD_S:g} s, resume after {RESUME_S:g} s, retry <= "
        f"{RETRY_MAX_S:g} s, poll {POLL_S:g} s), {load.answered} user requests, 0 errors:\n"
        f"  failing candidate: A's guard to production {guard['a_guard_s']:.2f} s after the "
        f"cut; B held after {guard['b_hold_s']:.2f} s; A's rollback stored "
        f"{guard['stored_s']:.2f} s after the store returned, B rolled back "
        f"{guard['b_rolled_back_s']:.2f} s after and no longer held {guard['b_unheld_s']:.2f} s "
        "after\n"
        f"  healthy candidate: held after {healthy['a_hold_s']:.2f} s (A) and "
        f"{healthy['b_hold_s']:.2f} s (B); resumed 50 % {healthy['a_resume_s']:.2f} s (A) and "
        f"{healthy['b_resume_s']:.2f} s (B) after the store returned"
    )
