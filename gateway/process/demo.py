"""`canary demo`: the whole loop — mirror, measure, decide — on one machine, in about a minute.

Starts four engine simulators (production, a `control` with production's profile, a `bi-kv`
candidate that keeps each session's KV cache, and a `quantized` candidate whose answers sometimes
diverge), a gateway in front of production with SQLite in a temporary directory, and drives
agent-like multi-turn sessions through it a batch at a time, asking the gateway for each
candidate's verdict between batches, until every candidate is promoted or rejected (the
intervals are valid at any look, so looking as often as it likes costs nothing) or
`max_sessions` is reached, and says which ended it. Then it stops the gateway (which drains the
mirror and flushes storage), prints both candidates' reports and writes their HTML forms.

Every process it starts is its own child; all are stopped on exit, on error and on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

import aiohttp
import msgspec

from domain.errors import CanaryError
from gateway.control.admin.ui import PAGE_PATH
from gateway.lifecycle import die_with_parent
from gateway.sim.workload import WorkloadSpec, run_workload

# name, simulator profile, extra `canary sim` flags, candidate kind (None: production)
ARMS: tuple[tuple[str, str, tuple[str, ...], str | None], ...] = (
    ("live", "baseline", (), None),
    ("control", "control", (), "control"),
    ("bi-kv", "bi-kv", (), "bi-kv"),
    ("quantized", "quantized", ("--divergence", "0.3", "--logprob-shift", "0.1"), "quantized"),
)

CONFIG_TEMPLATE = """\
# Written by `canary demo`: a gateway in front of a simulated production engine, with three
# simulated candidates mirrored whole sessions at a time.
[server]
listen = "127.0.0.1:{gateway_port}"
log_format = "json"

[live]
url = "{live_url}"
price_per_hour_usd = 2.0

[storage]
db_url = "sqlite+aiosqlite:///{db_path}"
registry_poll_interval_s = 1.0
counters_flush_interval_s = 1.0

[admin]
insecure = true

[reports]
# The demo asks for both candidates' verdicts between batches of sessions; beside four busy
# simulators an idle-priority report process would answer late (keep "idle" in production).
priority = "normal"

[mirror]
# Five processes share this machine's cores, so scheduling delays show up as event-loop lag
# and the gateway may use a whole core; production here is a simulator, so the demo's loop
# guard tolerates more lag and no CPU limit (in a real deployment keep the defaults).
shed_loop_lag_ms = 250.0
shed_cpu_busy = 0.0
# The mirror process meters the candidates' answers; at idle priority, beside four busy
# simulators, its wake-ups land late and every candidate TTFT carries that delay. The demo's
# production is a simulator, so the mirror runs at normal priority here (keep "idle" in a real
# deployment, where the engines are not on the gateway's cores).
priority = "normal"
# Scoring copies (the quantized candidate and the control score production's answers): a few
# at once per simulator, so scoring keeps up with the demo's traffic.
score_concurrency = 4
{candidates}"""

CANDIDATE_TEMPLATE = """
[[candidates]]
name = "{name}"
url = "{url}"
kind = "{kind}"
sample_rate = 1.0
sampling = "session"
concurrency = 16
{scoring}price_per_hour_usd = {price}
# 100 sessions can show a rate within about 3.7/100 ≈ 4 pp at best (sessions are the unit of
# independence); the defaults (0.5 pp failures, 1 pp agreement) need ~750 / ~375 sessions.
# The demo accepts 5 pp so that it can decide within a minute; and its four simulators share
# this machine's cores with the gateway, so their timings carry scheduling noise that a real
# engine's would not (TPOT of the KV-keeping simulator moves with its batch): latency gets a
# 20 % margin, under the 25 % critical one.
[candidates.verdict]
latency_delta = 1.2
error_delta = 0.05
error_critical = 0.1
slo_exceedance_delta = 0.05
agreement_delta = 0.05
similarity_delta = 0.05
"""


# The quantized candidate scores half its pairs (its default, 0.1, leaves a one-minute demo
# with too few scored pairs to decide `logprob_divergence`).
SCORING = {"quantized": "score_rate = 0.5\n"}


# Candidates whose verdicts the demo waits for (the control's is the noise floor, not a goal).
DECIDING = ("bi-kv", "quantized")
DECIDED = ("promote", "reject")


class DemoOptions(msgspec.Struct, kw_only=True):
    sessions: int = 0  # > 0: exactly this many, no looking; 0: until every verdict is decided
    max_sessions: int = 400  # the cap when driving until decided
    batch: int = 20  # sessions between two looks
    turns: int = 6
    concurrency: int = 16
    time_scale: float = 0.25
    keep: bool = False
    out_dir: str = "canary-reports"
    seed: int = 0


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # handed to the child process; closed right after the spawn


def _tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:]


def _write_reports(out_dir: Path, name: str, html: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.html"
    path.write_text(html, encoding="utf-8")
    return path.resolve()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Processes:
    """The child processes of the demo; `stop_all` terminates them, then kills stragglers."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.children: list[tuple[str, asyncio.subprocess.Process]] = []

    async def start(self, name: str, *args: str) -> asyncio.subprocess.Process:
        log = _open_log(self.logdir / f"{name}.log")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gateway.cli.main",
            *args,
            stdout=log,
            stderr=log,
            start_new_session=True,  # Ctrl-C reaches the demo, which stops its children itself
            preexec_fn=functools.partial(die_with_parent, os.getpid()),  # ... or the kernel does
        )
        log.close()
        self.children.append((name, proc))
        return proc

    async def stop(self, name: str, timeout_s: float = 15.0) -> None:
        for child_name, proc in self.children:
            if child_name == name:
                await self._stop(proc, timeout_s)

    @staticmethod
    async def _stop(proc: asyncio.subprocess.Process, timeout_s: float) -> None:
        if proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(p, 5.0) for _, p in reversed(self.children)))


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, what: str, log: Path) -> None:
    deadline = time.monotonic() + 30.0
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                tail = _tail(log)
                raise CanaryError(f"{what} exited with code {proc.returncode}:\n{tail}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise CanaryError(f"{what} did not become ready at {url} within 30 s (log: {log})")


@contextlib.asynccontextmanager
async def _workdir(keep: bool) -> AsyncIterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="canary-demo-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


class ProgressBar(Protocol):
    """What the demo needs of a progress bar (the CLI passes `gateway.cli.progress.Progress`)."""

    def advance(self, n: int = 1) -> None: ...
    def note(self, status: str) -> None: ...
    def __enter__(self) -> ProgressBar: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class _NoProgress:
    def advance(self, n: int = 1) -> None:
        pass

    def note(self, status: str) -> None:
        pass

    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


async def run_demo(
    opts: DemoOptions, progress: Callable[[int, str], ProgressBar] = lambda n, label: _NoProgress()
) -> int:
    """Run the demo; returns the process exit code. `progress(total, label)`: the bar the
    workload advances (the CLI's; none by default)."""
    started = time.monotonic()
    # SIGTERM cancels the demo like Ctrl-C does, so the `finally` below stops every child.
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    async with _workdir(opts.keep) as work:
        procs = _Processes(work)
        try:
            return await _run(opts, work, procs, started, progress)
        finally:
            await procs.stop_all()


async def _run(
    opts: DemoOptions,
    work: Path,
    procs: _Processes,
    started: float,
    progress: Callable[[int, str], ProgressBar],
) -> int:
    say = print
    urls: dict[str, str] = {}
    prices = {"control": 2.0, "bi-kv": 2.0, "quantized": 1.2}
    say(f"canary demo: working directory {work}")
    for name, profile, extra, _kind in ARMS:
        port = _free_port()
        urls[name] = f"http://127.0.0.1:{port}"
        await procs.start(
            f"sim-{name}",
            "sim",
            "--port",
            str(port),
            "--profile",
            profile,
            "--time-scale",
            str(opts.time_scale),
            "--seed",
            str(opts.seed),
            *extra,
        )
    gateway_port = _free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    db_path = work / "canary.db"
    candidates = "".join(
        CANDIDATE_TEMPLATE.format(
            name=name, url=urls[name], kind=kind, price=prices[name], scoring=SCORING.get(kind, "")
        )
        for name, _p, _e, kind in ARMS
        if kind is not None
    )
    config_path = work / "demo.toml"
    config_path.write_text(
        CONFIG_TEMPLATE.format(
            gateway_port=gateway_port,
            live_url=urls["live"],
            db_path=db_path,
            candidates=candidates,
        )
    )
    for name, _p, _e, _k in ARMS:
        proc = next(p for n, p in procs.children if n == f"sim-{name}")
        await _wait_ready(
            f"{urls[name]}/health", proc, f"simulator {name}", work / f"sim-{name}.log"
        )
    gateway = await procs.start("gateway", "serve", "--config", str(config_path))
    await _wait_ready(f"{gateway_url}/readyz", gateway, "gateway", work / "gateway.log")
    say(f"gateway on {gateway_url} in front of {urls['live']} (SQLite: {db_path})")
    say("candidates: control (same profile as production), bi-kv (keeps session KV), quantized")

    summary = await _drive(gateway_url, opts, progress, say)
    say(summary)
    if opts.keep:
        return await _keep_running(gateway_url, urls, config_path, db_path)

    say("stopping the gateway (drains the mirror, flushes storage)...")
    await procs.stop("gateway", timeout_s=30.0)
    await procs.stop_all()
    code = await _print_reports(f"sqlite+aiosqlite:///{db_path}", Path(opts.out_dir))
    say(f"demo finished in {time.monotonic() - started:.0f} s")
    return code


async def _drive(
    gateway_url: str,
    opts: DemoOptions,
    progress: Callable[[int, str], ProgressBar],
    say: Callable[[str], None],
) -> str:
    """Send sessions a batch at a time until every deciding candidate is decided (or exactly
    `opts.sessions` when set); returns the line that says what ended it."""
    fixed = opts.sessions > 0
    total = opts.sessions if fixed else opts.max_sessions
    step = total if fixed else opts.batch
    sent = requests = errors = 0
    wall = 0.0
    verdicts: dict[str, str] = {}
    with progress(total * opts.turns, "agent sessions through the gateway") as bar:
        while sent < total:
            n = min(step, total - sent)
            spec = WorkloadSpec(
                sessions=n,
                first_session=sent,
                turns=opts.turns,
                concurrency=opts.concurrency,
                seed=opts.seed,
            )
            done = await run_workload(gateway_url, spec, progress=bar.advance)
            sent += n
            requests += done.requests
            errors += done.errors
            wall += done.wall_s
            if fixed:
                break
            verdicts = await _verdicts(gateway_url)
            bar.note(" ".join(f"{name}: {verdicts[name]}" for name in DECIDING))
            if all(verdicts[name] in DECIDED for name in DECIDING):
                break
    traffic = (
        f"sent {requests} requests ({sent} sessions) in {wall:.1f} s, {errors} production errors"
    )
    if fixed:
        return traffic
    if all(verdicts.get(name) in DECIDED for name in DECIDING):
        return f"{traffic}; every candidate decided after {sent} sessions"
    open_ = ", ".join(n for n in DECIDING if verdicts.get(n) not in DECIDED)
    return (
        f"{traffic}; stopped at the cap (--max-sessions {opts.max_sessions}), not by the "
        f"evidence: {open_} still undecided"
    )


async def _verdicts(gateway_url: str) -> dict[str, str]:
    """Each deciding candidate's verdict now, from the gateway's report process (an interim
    look: valid whenever it is taken); "pending" when a report is not available yet."""
    out: dict[str, str] = {}
    timeout = aiohttp.ClientTimeout(total=120.0)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for name in DECIDING:
            url = f"{gateway_url}/admin/candidates/{name}/report"
            try:
                async with http.get(url) as resp:
                    body = await resp.read()
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            out[name] = (
                str(msgspec.json.decode(body).get("verdict", "pending")) if ok else "pending"
            )
    return out


async def _print_reports(db_url: str, out_dir: Path) -> int:
    from evaluators.judge.settings import VerdictSettings
    from evaluators.report.build import evaluate
    from evaluators.report.render import render
    from storage.engine import make_engine

    engine = make_engine(db_url)
    try:
        for name in ("bi-kv", "quantized"):
            # The demo's traffic is over: this is its planned final look.
            report = await evaluate(engine, name, settings=VerdictSettings(), planned_look=True)
            print()
            print(render(report, "text"))
            html_path = _write_reports(out_dir, name, render(report, "html"))
            print(f"HTML report: {html_path}")
    finally:
        await engine.dispose()
    return 0


async def _keep_running(gateway: str, urls: dict[str, str], config: Path, db: Path) -> int:
    db_url = f"sqlite+aiosqlite:///{db}"
    print(
        f"""
Everything is still running (Ctrl-C stops it all):
  gateway      {gateway}   (metrics: {gateway}/metrics, admin: {gateway}/admin/status)
  live page    {gateway}/admin{PAGE_PATH}   (open it in a browser: no token on loopback)
  production   {urls["live"]}
  candidates   control {urls["control"]}, bi-kv {urls["bi-kv"]}, quantized {urls["quantized"]}
  config       {config}

Try:
  canary candidates list --admin-url {gateway}
  canary candidates show bi-kv --admin-url {gateway}
  canary report bi-kv --db {db_url}
  canary report quantized --db {db_url} --planned-look --format html --out quantized.html
  curl -s {gateway}/admin/candidates/bi-kv/gate
  canary promote bi-kv --admin-url {gateway} --reason "demo"
  canary rollback --admin-url {gateway}
""",
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("stopping...")
    return 0
