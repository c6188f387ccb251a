"""The mirror process's CPU per copy at a steady rate, alone: no worker, no production proxy.

    .venv/bin/python bench/mirror_rate.py [--rates 300,1000] [--seconds 20] [--rounds 3]
        [--tree DIR ...]

The mirror process (`gateway.mirror.plane.serve_plane`, real SQLite, the priority and settings
bench/core.py's `canary serve` runs it with: registry poll and counter flush every second) runs
with one fast candidate at 100 % (nginx `return 200` with a tiny chat completion). This script
plays the worker on the plane's Unix socket, open loop at each rate: per request one write with
the COPY frame and production's RESULT frame (what the worker's 2 ms coalescing writes at these
rates: production answers well within it). The CPU the mirror process used (/proc utime +
stime) over `--seconds`, counted until its counters say every copy is observed, per copy.

`--tree` (repeatable) runs the same measure against other source trees (a `git archive` of
another commit), interleaved round by round with this one, row order alternating: an A/B in
one run, on the same host, nginx and database settings. Without the worker and the production
path bench/core.py measures beside it, the spread from round to round is smaller, so a change
of a few µs per copy shows. The mirror process is pinned to CPU 0, nginx and this script to
CPU 1 (`--no-pin`: anywhere). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mirror_instructions import (  # siblings, found through sys.path
    CANDIDATE,
    PLANE_TEMPLATE,
    Setup,
    _connect,
    _observed,
    _stop,
    copy_frames,
)
from overhead import ROOT

# As bench/core.py's `canary serve` runs it: the registry polled and the counters flushed every
# second (bench/plane.py's gateway configuration); the rest the defaults.
PLANE = PLANE_TEMPLATE.format(
    overrides='"storage.registry_poll_interval_s": 1.0, "storage.counters_flush_interval_s": 1.0,'
)


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drive(sock: str, pid: int, rate: float, seconds: float) -> tuple[float, int]:
    """Warm up, then `seconds` at `rate` copies/s: (mirror CPU s, copies observed)."""
    worker = await _connect(sock)
    loop = asyncio.get_running_loop()

    async def pace(n: int) -> None:
        start = loop.time()
        for i in range(n):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            worker.writer.write(b"".join(copy_frames(worker.sent)))
            worker.sent += 1

    await pace(int(rate))  # a second of warm-up
    await asyncio.sleep(1.0)
    before = _observed(await worker.fresh_stats())
    c0 = _cpu_s(pid)
    n = int(rate * seconds)
    await pace(n)
    deadline = time.monotonic() + 30
    while _observed(await worker.fresh_stats()) < before + n and time.monotonic() < deadline:
        pass
    cpu = _cpu_s(pid) - c0
    observed = _observed(await worker.fresh_stats()) - before
    worker.task.cancel()
    worker.writer.close()
    return cpu, observed


def run_once(setup: Setup, tree: Path, rate: float, seconds: float, pin: bool) -> float:
    db_url, sock = setup.fresh()
    prefix = ["taskset", "-c", "0"] if pin else []
    proc = subprocess.Popen(
        [*prefix, sys.executable, str(setup.script), sock, db_url, setup.url, setup.url],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        cpu, observed = asyncio.run(_drive(sock, proc.pid, rate, seconds))
    finally:
        _stop(proc)
    if observed < rate * seconds:
        print(f"  ({tree.name}: {observed} of {int(rate * seconds)} copies observed)")
    return cpu * 1e6 / max(observed, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="300,1000", help="copies per second, comma-separated")
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tree", action="append", default=[], help="another source tree to compare")
    p.add_argument("--no-pin", action="store_true")
    args = p.parse_args()
    pin = not args.no_pin
    if pin:
        os.sched_setaffinity(0, {1})
    trees = [Path(ROOT), *(Path(t).resolve() for t in args.tree)]
    rates = [float(r) for r in args.rates.split(",")]
    print(f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    results: dict[tuple[float, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp))
        setup.script.write_text(PLANE)
        try:
            for rnd in range(args.rounds):
                order = trees if rnd % 2 == 0 else trees[::-1]
                for rate in rates:
                    for tree in order:
                        us = run_once(setup, tree, rate, args.seconds, pin)
                        results.setdefault((rate, str(tree)), []).append(us)
                        print(f"r{rnd} {rate:g}/s {tree}: {us:.0f} µs/copy", flush=True)
        finally:
            setup.procs.stop()
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end; candidate '{CANDIDATE}' at 100 %\n")
    print("| copies/s | tree | mirror CPU µs per copy (median) | by round |\n|---:|---|---:|---|")
    for (rate, tree), values in results.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {rate:g} | {tree} | {statistics.median(values):.0f} | {rounds} |")


if __name__ == "__main__":
    main()
