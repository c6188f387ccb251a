"""A browser and the gateway it looks at, for the browser tests (tests/browser/) and
bench/ui_overhead.py: a real `canary serve` process (SQLite, admin token, or an open admin API
with `insecure_admin = true`) proxying to a simulated live engine and mirroring to a simulated
A/A control and a simulated bi-KV candidate (and, `graded`, a simulated model upgrade judged by
the simulator's LLM grader), plus Playwright's chromium (the system's, `executable_path`).
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

from bench._shared.ports import free_port
from bench._shared.waiting import IMPORTS_S, MIRROR_START_S, until_ready
from gateway.sim.profiles import get_profile
from gateway.sim.server import SimServer, start_sim

# Debian's chromium, driven by Playwright (no browser download); CANARY_CHROMIUM names another.
CHROMIUM = Path(os.environ.get("CANARY_CHROMIUM", "/usr/bin/chromium"))
TOKEN = "ui-test-token-5d1c8e2b7a"  # labelled "ops" in the audit log
# What the tests expect of the product, as the settings written below promise it. A report
# (and so a read of the page, a promote, a ramp's start) is answered within
# `[reports] timeout_s`, by the report or by a 503 saying why; `canary serve` serves once its
# report process listens, or after `[reports] start_wait_s`, and once its mirror process
# listens (a worker waits `MIRROR_START_S` for it, then exits).
REPORT_TIMEOUT_S = 120.0
REPORT_START_S = 120.0
# A copy is answered or given up within its candidate's `timeout_s`; the mirror's counters
# reach the store every `[storage] counters_flush_interval_s` (the default, 5 s).
COPY_TIMEOUT_S = 30.0
COUNTERS_FLUSH_S = 5.0
# A gateway that starts: its imports, the mirror process, then the report process (their
# imports are what a busy host slows; the product bounds the two waits above, not the imports,
# so this bound is generous and the test's own timeout is the backstop).
START_WITHIN_S = IMPORTS_S + MIRROR_START_S + REPORT_START_S
# One read of the page: a report, and the small calls made beside it.
READ_WITHIN_S = REPORT_TIMEOUT_S + 30.0
TIME_SCALE = 0.15
CANDIDATE = "kv"
UPGRADE = "upgrade"  # the model upgrade of a `graded` stack
# Its grader answers one short verdict per call, one call at a time: a tenth of the engines'
# delays keeps it up with a test's traffic.
GRADER_TIME_SCALE = TIME_SCALE / 10
# Margins for ~100 sessions (the README's "Margins by volume" for small experiments), and a
# minimum of pairs a short test reaches: the bi-KV candidate promotes within a minute or two.
# A session closes (and counts) after 5 s without a turn, so a step of traffic is judged
# seconds after it ends; a graded session's unit closes 30 s after that (the simulated grader
# answers within seconds; a verdict stored later is late and never used).
VERDICT = {
    "session_idle_s": 5.0,
    "grading_deadline_s": 30.0,
    "min_pairs": 120,
    "error_delta": 0.05,
    "error_critical": 0.1,
    "slo_exceedance_delta": 0.05,
    "agreement_delta": 0.05,
    "similarity_delta": 0.05,
    "latency_delta": 1.10,
    # Every turn declares tools, so tool-call validity gates too: at the same 5 pp.
    "tool_validity_delta": 0.05,
    "tool_validity_critical": 0.1,
}


@dataclass
class Stack:
    url: str  # the proxy (and, under /admin, the admin API and the page)
    sims: dict[str, SimServer]
    proc: asyncio.subprocess.Process
    token: str | None  # None: the admin API is open

    async def report(self, name: str) -> dict[str, Any]:
        """The candidate's report as the admin API answers it (what the page reads)."""
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=READ_WITHIN_S)) as http,
            http.get(f"{self.url}/admin/candidates/{name}/report", headers=headers) as resp,
        ):
            assert resp.status == 200, await resp.text()
            body: dict[str, Any] = await resp.json()
            return body

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


def config_text(
    db: Path, sims: dict[str, SimServer], *, insecure: bool = False, graded: bool = False
) -> str:
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
        f"timeout_s = {REPORT_TIMEOUT_S}",
        f"start_wait_s = {REPORT_START_S}",
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
            f"timeout_s = {COPY_TIMEOUT_S}",
        ]
    if graded:  # a model upgrade, every pair graded in both orders, uncapped
        lines += [
            "[[candidates]]",
            f"name = {_toml(UPGRADE)}",
            f"url = {_toml(sims[UPGRADE].url)}",
            'kind = "model-upgrade"',
            "sample_rate = 1.0",
            'sampling = "session"',
            "concurrency = 16",
            f"timeout_s = {COPY_TIMEOUT_S}",
            "[candidates.grader]",
            f"url = {_toml(sims['grader'].url)}",
            'model = "sim-model"',
            "rate = 1.0",
            "swap_rate = 1.0",
            "max_per_minute = 1000000",
            "price_per_mtok = 1.0",
        ]
    return "\n".join(lines) + "\n"


async def _ready(url: str, proc: asyncio.subprocess.Process, log: Path) -> None:
    """Until `/readyz` answers 200 (the report process listening: `start_wait_s`); the
    gateway's log when it does not."""
    try:
        await until_ready(url + "/readyz", proc, within_s=START_WITHIN_S)
    except AssertionError as exc:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        text = await asyncio.to_thread(log.read_text)
        raise AssertionError(f"canary serve did not become ready ({exc}): {text[-2000:]}") from exc


@contextlib.asynccontextmanager
async def running_stack(
    tmp: Path, *, token: bool = True, graded: bool = False
) -> AsyncIterator[Stack]:
    """The gateway and its engines; with `token` False, no admin token and an open admin API;
    with `graded`, a model upgrade and its LLM grader too."""
    sims: dict[str, SimServer] = {}
    proc: asyncio.subprocess.Process | None = None
    engines = [("live", "baseline"), ("control", "control"), (CANDIDATE, "bi-kv")]
    if graded:
        engines += [(UPGRADE, "upgrade")]
    try:
        for name, profile in engines:
            sims[name] = await start_sim(get_profile(profile, time_scale=TIME_SCALE))
        if graded:
            sims["grader"] = await start_sim(get_profile("grader", time_scale=GRADER_TIME_SCALE))
        config = tmp / "canary.toml"
        text = config_text(tmp / "canary.db", sims, insecure=not token, graded=graded)
        config.write_text(text)
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
        yield Stack(url, sims, proc, TOKEN if token else None)
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
