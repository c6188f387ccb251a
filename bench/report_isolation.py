#!/usr/bin/env python3
"""Benchmark: production latency while reports over a million pairs are computed back to back.

`canary serve` (one worker, its mirror process and its report process, as deployed) runs on
the database `bench/report.py` builds (1,000,000 stored pairs by default), in front of a fast
stand-in live engine. An open-loop client sends production traffic at `--rate` requests/s and
measures each answer, in alternating windows:

- **quiet**: no report is asked for;
- **reports**: `--reports` reports of the million-pair candidate are requested back to back
  through the admin API (each awaited to its end), while the same traffic runs.

`--load report,spin,stream,none` interleaves, in every round, the reports and three controls of
about the same length (`--burn-s`), each started at the report process's priority (the
interpreter's start-up included): a process that only spins on the CPU (a few kilobytes of
working set), one that only streams numpy arrays of 256 MB through memory, and one that does
nothing. The first two tell what any work at that priority costs production on this machine
(CPU time the kernel hands back at once, but a core, a cache and memory bandwidth shared
underneath) from what the report's own work costs; `none` is the A/A row: how far two quiet
windows differ on this host, the resolution of every other ratio.

Windows alternate over `--rounds`, so drift in a shared host's background load falls on both
alike; the table gives production p50 / p99 of each and their ratio (target: within 5 %) with a
95 % interval from resampling whole rounds (a host's hiccups come in bursts: requests are not
independent), the report's wall time as the operator saw it, and the machine's load average.
`--serve-cpus 0 --burn-cpus 1` pins the gateway (all of its processes, the report process too)
and the control loads to CPUs of their own.

    .venv/bin/python bench/report.py --pairs 1000000 --db /work/tmp-bench/report-1m.db
    .venv/bin/python bench/report_isolation.py --db /work/tmp-bench/report-1m.db
    .venv/bin/python bench/report_isolation.py --db /work/tmp-bench/report-1m.db \
        --load none,spin,report --rounds 8 --quiet-s 15

The database's live endpoint is pointed at the stand-in engine, its candidates' sampling is
set to 0 and their creation to 0 (so the admin API's report covers every stored pair).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

import isolation as iso  # noqa: E402  (bench/isolation.py: the live engine and the load)

from bench._shared.ports import free_port  # noqa: E402
from gateway.lifecycle import lower_priority  # noqa: E402


def _prepare(db: Path, live: str) -> None:
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE endpoints SET url = ? WHERE role = 'live'", (live,))
        # No copies (the reports' cost is measured, not the mirror's), and a report window
        # that starts before the stored pairs (bench/report.py stores them before it
        # registers the candidates; the admin API's report starts at the creation).
        con.execute("UPDATE endpoints SET sample_rate = 0, created_at = 0 WHERE role = 'candidate'")
    con.close()


def _serve(
    db: Path,
    live: str,
    port: int,
    priority: str,
    cpus: set[int] | None,
) -> subprocess.Popen[bytes]:
    """`canary serve` on `cpus` (every process of it inherits them: worker, mirror, reports)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env |= {"CANARY_REPORT_PRIORITY": priority, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "gateway.cli.main", "serve", "--listen", f"127.0.0.1:{port}"]
    argv += ["--db", f"sqlite+aiosqlite:///{db}", "--live", live, "--insecure-admin"]
    log = open(db.with_suffix(".serve.log"), "wb")  # noqa: SIM115 - the child owns it

    def pin() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)

    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=pin)


def _cpus(text: str) -> set[int]:
    return {int(c) for c in text.split(",") if c}


async def _ready(url: str, gw: subprocess.Popen[bytes]) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):
            try:
                async with http.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                if gw.poll() is not None:
                    raise RuntimeError("canary serve exited: see DB.serve.log") from None
            await asyncio.sleep(0.1)
    raise RuntimeError("canary serve did not become ready")


async def _reports(url: str, name: str, count: int, took: list[float]) -> None:
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for _ in range(count):
            t = time.perf_counter()
            async with http.get(f"{url}/admin/candidates/{name}/report") as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"report: {resp.status} {body[:300]!r}")
            took.append(time.perf_counter() - t)


_BURN = {
    # Pure interpreter work on a few kilobytes: the core, and nothing of the cache or memory.
    "spin": "x = 0\nwhile time.perf_counter() < end:\n    x = (x * 31 + 7) % 1000003\n",
    # numpy passes over 256 MB: memory bandwidth and the shared cache, as the statistics use.
    "stream": (
        "import numpy as np\na = np.ones(32 << 20)\nb = np.empty_like(a)\n"
        "while time.perf_counter() < end:\n    np.multiply(a, 1.0001, out=b)\n"
        "    np.add(b, a, out=a)\n"
    ),
    # Nothing: a second quiet window measured as a busy one (the A/A noise of the ratios).
    "none": "time.sleep(max(0.0, end - time.perf_counter()))\n",
}


_LABELS = {
    "report": "reports back to back",
    "spin": "control: a spinning process",
    "stream": "control: numpy streaming memory",
    "none": "control: nothing (A/A)",
}


async def _burn(
    kind: str, seconds: float, priority: str, cpus: set[int] | None, took: list[float]
) -> None:
    """A control load in place of the reports: `kind` work for `seconds` at `priority`, on
    `cpus` (None: wherever the kernel puts it)."""
    code = f"import time\nend = time.perf_counter() + {seconds}\n" + _BURN[kind]

    def low() -> None:
        # Before the interpreter starts: its start-up and imports run at the load's priority
        # too (a control that imported at production's priority measured that, not itself).
        if cpus:
            os.sched_setaffinity(0, cpus)
        lower_priority(priority, 10)

    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, preexec_fn=low)
    if await proc.wait() != 0:
        raise RuntimeError(f"the {kind} control load failed")
    took.append(time.perf_counter() - t)


async def _during(url: str, rate: float, task: asyncio.Task[None]) -> list[iso.Sample]:
    """Production traffic in 5-second windows until `task` (the reports) ends."""
    out = []
    while not task.done():
        out.append(await iso.open_loop(url, rate, 5.0, 0.0))
    await task
    return out


async def bench(args: argparse.Namespace) -> None:
    loads = [os.getloadavg()]
    with iso.live_engine(args.tokens, args.gap) as live_proc:
        _prepare(args.db, live_proc.url)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        gw = _serve(args.db, live_proc.url, port, args.priority, args.serve_cpus)
        try:
            await _ready(url, gw)
            await iso.open_loop(url, args.rate, 5.0, 0.0)  # warm-up, not counted
            # Per round: the quiet windows and each load's windows (the blocks the interval
            # resamples: a host's hiccups come in bursts, so requests are not independent).
            quiet: list[list[iso.Sample]] = []
            busy: dict[str, list[list[iso.Sample]]] = {load: [] for load in args.load}
            took: dict[str, list[float]] = {load: [] for load in args.load}
            for r in range(args.rounds):
                quiet.append([])
                for load in args.load:  # each load after a quiet window of its own
                    quiet[-1].append(await iso.open_loop(url, args.rate, args.quiet_s, 0.0))
                    loads.append(os.getloadavg())
                    if load == "report":
                        work = _reports(url, args.name, args.reports, took[load])
                    else:
                        work = _burn(load, args.burn_s, args.priority, args.burn_cpus, took[load])
                    busy[load].append(await _during(url, args.rate, asyncio.create_task(work)))
                    loads.append(os.getloadavg())
                    per_round = args.reports if load == "report" else 1
                    last = ", ".join(f"{t:.1f}" for t in took[load][-per_round:])
                    print(f"round {r + 1}: {load} took {last} s", file=sys.stderr, flush=True)
            quiet[-1].append(await iso.open_loop(url, args.rate, args.quiet_s, 0.0))
            loads.append(os.getloadavg())
        finally:
            gw.send_signal(signal.SIGTERM)
            try:
                gw.wait(60)
            except subprocess.TimeoutExpired:
                gw.kill()
                gw.wait()
    q = iso.pool("no reports", [w for r in quiet for w in r])
    print(f"production at {args.rate:g} req/s through `canary serve` (1 worker), "
          f"loads at priority {args.priority}, {args.db}")  # fmt: skip
    print("ratios: pooled over the rounds, [95 % interval] from resampling whole rounds")
    print("| windows | requests | errors | p50 ms | p99 ms | p50 / quiet | p99 / quiet |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| {q.label} | {q.n} | {q.errors} | {q.p50_ms:.2f} | {q.p99_ms:.2f} | | |")
    for load in args.load:
        b = iso.pool(_LABELS[load], [w for r in busy[load] for w in r])
        (l50, h50), (l99, h99) = round_intervals(quiet, busy[load])
        print(f"| {b.label} | {b.n} | {b.errors} | {b.p50_ms:.2f} | {b.p99_ms:.2f} | "
              f"{b.p50_ms / q.p50_ms:.3f} [{l50:.3f}, {h50:.3f}] | "
              f"{b.p99_ms / q.p99_ms:.3f} [{l99:.3f}, {h99:.3f}] |")  # fmt: skip
    for load in args.load:
        print(f"{load}: {len(took[load])} runs, wall {', '.join(f'{t:.1f}' for t in took[load])} s")
    one = [f"{x[0]:.1f}" for x in loads]
    print(f"machine load average (1 min) over the run: {', '.join(one)} on {os.cpu_count()} CPUs")


def round_intervals(
    quiet: list[list[iso.Sample]], busy: list[list[iso.Sample]], draws: int = 2000
) -> tuple[tuple[float, float], tuple[float, float]]:
    """95 % percentile-bootstrap intervals of the p50 and p99 ratios (busy / quiet), drawing
    whole rounds with replacement: the final quiet window goes with the last round."""
    import numpy as np

    rounds = len(busy)
    q = [np.concatenate([w.lat for w in quiet[r]]) for r in range(len(quiet))]
    q[rounds - 1] = np.concatenate(q[rounds - 1 :])
    b = [np.concatenate([w.lat for w in busy[r]]) for r in range(rounds)]
    rng = np.random.default_rng(1)
    ratios = np.empty((draws, 2))
    for i in range(draws):
        pick = rng.integers(0, rounds, rounds)
        qq = np.percentile(np.concatenate([q[r] for r in pick]), [50, 99])
        bb = np.percentile(np.concatenate([b[r] for r in pick]), [50, 99])
        ratios[i] = bb / qq
    lo, hi = np.percentile(ratios, [2.5, 97.5], axis=0)
    return (float(lo[0]), float(hi[0])), (float(lo[1]), float(hi[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, default=Path("/work/tmp-bench/report-1m.db"))
    p.add_argument("--name", default="cand")
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--reports", type=int, default=2, help="reports back to back per round")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--quiet-s", type=float, default=30.0)
    p.add_argument("--priority", default="idle", choices=("idle", "nice", "normal"))
    p.add_argument(
        "--load",
        default="report",
        type=lambda v: [x for x in v.split(",") if x],
        help="what runs in the busy windows, comma-separated, interleaved in each round: "
        "report (reports back to back), spin, stream, none (control loads, see above)",
    )
    p.add_argument("--burn-s", type=float, default=7.0, help="a control load's length")
    p.add_argument(
        "--serve-cpus",
        type=_cpus,
        help="CPUs of canary serve's processes, e.g. 0 (default: any)",
    )
    p.add_argument("--burn-cpus", type=_cpus, help="CPUs of the control loads (default: any)")
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--gap", type=float, default=0.001)
    args = p.parse_args()
    bad = [x for x in args.load if x not in _LABELS]
    if bad or not args.load:
        p.error(f"--load: expected report, spin, stream or none, got {','.join(bad) or 'nothing'}")
    asyncio.run(bench(args))


if __name__ == "__main__":
    main()
