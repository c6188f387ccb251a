"""The demo's run: start the engines and the gateway, drive agent sessions a batch at a time
until every deciding candidate is promoted or rejected (the intervals are valid at any look, so
looking as often as it likes costs nothing) or `max_sessions` is reached, and say which ended
it; ramp a promoted bi-kv; stop the gateway (which drains the mirror and flushes storage); print
the reports as they stood at the verdicts.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import msgspec

from gateway.process.demo.arms import (
    DECIDED,
    DECIDING,
    ENGINES,
    DemoOptions,
    write_config,
)
from gateway.process.demo.children import (
    NoProgress,
    Processes,
    ProgressBar,
    free_port,
    wait_announced,
    wait_ready,
    workdir,
)
from gateway.process.demo.labeller import simulated_labeller
from gateway.process.demo.rollout import ROLLED_OUT, run_rollout
from gateway.process.demo.story import candidates_lines, keep_running, print_reports
from gateway.sim.workload import WorkloadSpec, run_workload


async def run_demo(
    opts: DemoOptions, progress: Callable[[int, str], ProgressBar] = lambda n, label: NoProgress()
) -> int:
    """Run the demo; returns the process exit code. `progress(total, label)`: the bar the
    workload advances (the CLI's; none by default)."""
    started = time.monotonic()
    # SIGTERM cancels the demo like Ctrl-C does, so the `finally` below stops every child.
    main = asyncio.current_task()
    assert main is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    async with workdir(opts.keep) as work:
        procs = Processes(work)
        try:
            return await _run(opts, work, procs, started, progress)
        finally:
            await procs.stop_all()


async def _run(
    opts: DemoOptions,
    work: Path,
    procs: Processes,
    started: float,
    progress: Callable[[int, str], ProgressBar],
) -> int:
    say = print
    urls: dict[str, str] = {}
    say(f"canary demo: working directory {work}")
    for e in ENGINES:
        await procs.start(
            f"sim-{e.name}",
            "sim",
            *("--port", "0", "--profile", e.profile, "--seed", str(opts.seed)),
            *("--time-scale", f"{opts.time_scale * e.time_factor:g}"),
            *e.extra,
        )
    for e in ENGINES:
        log = work / f"sim-{e.name}.log"
        urls[e.name] = await wait_announced(procs.get(f"sim-{e.name}"), e.name, log)
        await wait_ready(f"{urls[e.name]}/health", procs.get(f"sim-{e.name}"), e.name, log)
    gateway_port = free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    db_path = work / "canary.db"
    config_path = work / "demo.toml"
    write_config(config_path, gateway_port, urls, db_path)
    gateway = await procs.start("gateway", "serve", "--config", str(config_path))
    await wait_ready(f"{gateway_url}/readyz", gateway, "gateway", work / "gateway.log")
    say(f"gateway on {gateway_url} in front of {urls['live']} (SQLite: {db_path})")
    for line in candidates_lines(opts.turns):
        say(line)

    # A simulated labeller (a stand-in for a person) labels the upgrade's kept pairs meanwhile.
    done = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        labelling = group.create_task(simulated_labeller(gateway_url, done, opts.seed))
        try:
            summary, sent, verdicts = await _drive(gateway_url, opts, progress, say)
        finally:
            done.set()
    say(summary)
    say(labelling.result().line())
    verdicts_at = time.time()
    rollout_line = None
    if verdicts.get(ROLLED_OUT) == "promote":
        rollout_line = await run_rollout(gateway_url, opts, procs, sent, say)
    else:
        say(
            f"no ramp: {ROLLED_OUT}'s verdict is "
            f"{verdicts.get(ROLLED_OUT, 'not asked')!r}, not 'promote'"
        )
    if opts.keep:
        return await keep_running(gateway_url, urls, config_path, db_path)

    say("stopping the gateway (drains the mirror, flushes storage)...")
    await procs.stop("gateway", timeout_s=30.0)
    await procs.stop_all()
    # The reports as they stood at the verdicts: the ramp's traffic is the rollout's evidence.
    until = verdicts_at if rollout_line is not None else None
    code = await print_reports(f"sqlite+aiosqlite:///{db_path}", Path(opts.out_dir), until)
    if rollout_line is not None:
        say(rollout_line)
    say(f"demo finished in {time.monotonic() - started:.0f} s")
    return code


async def _drive(
    gateway_url: str,
    opts: DemoOptions,
    progress: Callable[[int, str], ProgressBar],
    say: Callable[[str], None],
) -> tuple[str, int, dict[str, str]]:
    """Send sessions a batch at a time until every deciding candidate is decided (or exactly
    `opts.sessions` when set, then look once); returns the line that says what ended it, the
    sessions sent and the last verdicts."""
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
        # One look after the planned traffic, to know whether bi-kv may be ramped.
        return traffic, sent, await _verdicts(gateway_url)
    if all(verdicts.get(name) in DECIDED for name in DECIDING):
        return f"{traffic}; every candidate decided after {sent} sessions", sent, verdicts
    open_ = ", ".join(n for n in DECIDING if verdicts.get(n) not in DECIDED)
    return (
        f"{traffic}; stopped at the cap (--max-sessions {opts.max_sessions}), not by the "
        f"evidence: {open_} still undecided",
        sent,
        verdicts,
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
