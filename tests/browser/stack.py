"""What the browser tests run against: a real `canary serve` process (SQLite, admin token, or
an open admin API with `insecure_admin = true`)
proxying to a simulated live engine and mirroring to a simulated A/A control and a simulated
bi-KV candidate, plus Playwright's chromium (the system's, `executable_path`). Holds no tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer, start_sim
from tests.browser.conftest import CHROMIUM
from tests.upstreams import free_port

TOKEN = "ui-test-token-5d1c8e2b7a"  # labelled "ops" in the audit log
TIME_SCALE = 0.15
CANDIDATE = "kv"
# Margins for ~100 sessions (the README's "Margins by volume" for small experiments), and a
# minimum of pairs a short test reaches: the bi-KV candidate promotes within a minute or two.
# A session closes (and counts) after 5 s without a turn, so a step of traffic is judged
# seconds after it ends.
VERDICT = {
    "session_idle_s": 5.0,
    "min_pairs": 120,
    "error_delta": 0.05,
    "error_critical": 0.1,
    "slo_exceedance_delta": 0.05,
    "agreement_delta": 0.05,
    "similarity_delta": 0.05,
    "latency_delta": 1.10,
}


@dataclass
class Stack:
    url: str  # the proxy (and, under /admin, the admin API and the page)
    sims: dict[str, SimServer]
    proc: asyncio.subprocess.Process

    @property
    def ui(self) -> str:
        return self.url + "/admin/ui/"

    async def sim_requests(self, name: str) -> int:
        async with (
            aiohttp.ClientSession() as http,
            http.get(self.sims[name].url + "/sim/stats") as resp,
        ):
            return int((await resp.json())["requests"])


def _toml(value: Any) -> str:
    return json.dumps(value)  # strings, numbers and booleans are spelled alike in TOML


def config_text(db: Path, sims: dict[str, SimServer], *, insecure: bool = False) -> str:
    lines = [
        *(["[admin]", "insecure = true"] if insecure else []),
        "[live]",
        f"url = {_toml(sims['live'].url)}",
        "[storage]",
        f"db_url = {_toml(f'sqlite+aiosqlite:///{db}')}",
        "registry_poll_interval_s = 1.0",
        # The simulators, the browser and (in CI) a spinning vLLM share two cores: a lenient
        # guard keeps the mirror from shedding the copies under test, and the mirror and the
        # report process run at normal priority (at "idle" a busy host starves the report
        # process for longer than the page waits for a verdict).
        "[mirror]",
        "shed_loop_lag_ms = 500.0",
        "shed_cpu_busy = 0.0",
        'priority = "normal"',
        "[reports]",
        'priority = "normal"',
        "[verdict]",
        *(f"{k} = {_toml(v)}" for k, v in VERDICT.items()),
    ]
    for name, kind in (("control", "control"), (CANDIDATE, "bi-kv")):
        lines += [
            "[[candidates]]",
            f"name = {_toml(name)}",
            f"url = {_toml(sims[name].url)}",
            f"kind = {_toml(kind)}",
            "sample_rate = 1.0",
            'sampling = "session"',
            "concurrency = 16",
        ]
    return "\n".join(lines) + "\n"


async def _ready(url: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):  # up to 60 s on a loaded 2-core machine
            if proc.returncode is not None:
                break
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.05)
    proc.kill()
    await proc.wait()
    text = await asyncio.to_thread(log.read_text)
    raise AssertionError(f"canary serve did not become ready: {text[-2000:]}")


@contextlib.asynccontextmanager
async def running_stack(tmp: Path, *, token: bool = True) -> AsyncIterator[Stack]:
    """The gateway and its engines; with `token` False, no admin token and an open admin API."""
    sims: dict[str, SimServer] = {}
    proc: asyncio.subprocess.Process | None = None
    try:
        for name, profile in (("live", "baseline"), ("control", "control"), (CANDIDATE, "bi-kv")):
            sims[name] = await start_sim(get_profile(profile, time_scale=TIME_SCALE))
        config = tmp / "canary.toml"
        config.write_text(config_text(tmp / "canary.db", sims, insecure=not token))
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
        if token:
            env["CANARY_ADMIN_TOKEN"] = f"ops:{TOKEN}"
        log = tmp / "gateway.log"
        with log.open("wb") as out:  # a file, not a pipe nobody reads (it would fill and block)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(config),
                "--listen", f"127.0.0.1:{port}", stdout=out, stderr=out, env=env,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        await _ready(url, proc, log)
        yield Stack(url, sims, proc)
    finally:
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for sim in sims.values():
            await sim.close()


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Any]:
    """Playwright's async API over the system's chromium; yields the Browser."""
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            await browser.close()
