"""Where the gateway's CPU goes under real load, from a sampling profiler (issue 34, item 1).

    .venv/bin/python bench/spy.py [--rate 1000] [--seconds 15] [--no-pin] [--keep DIR]

One `canary serve` (one worker and its mirror process, real SQLite) with a fast candidate at
100 %, in front of nginx `return 200` (a tiny chat completion for live and candidate alike), is
driven by bench/core.py's open loop of unique tiny chat requests at `--rate` req/s. After 3 s of
warm-up, `py-spy record --native --format raw` samples the worker and the mirror process
(`--sample-rate` per second; samples of a blocked thread, `IDLE`, left out) for `--seconds`,
while /proc gives each process's CPU over the same window. Placement as in bench/core.py: the
whole gateway on CPU 0, nginx and the client on CPU 1 (`--no-pin`: anywhere).

Each sample is charged to the stage of its innermost frame that belongs to a known file (the
worker's stages are bench/stages.py's, the mirror's bench/mirror_instructions.py's); native
frames (the interpreter, libc, the kernel's syscalls, libsqlite3, the C parsers) are charged to
the Python frame that called them, as in those scripts; a stack with no known frame falls under
"event loop/other". A stage's µs per request = the process's CPU µs per request × its share of
the samples. Unlike cProfile's split this is what the process did at full speed, unprofiled
(py-spy reads the stacks from outside), and unlike callgrind it includes the load's real
batching (many frames per read, many rows per INSERT). Each process's top native objects and
the busiest leaf functions are printed too. It is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mirror_instructions  # siblings, found through sys.path above
import stages
from core import DROPS, _copies_of, _settled, open_loop
from overhead import cpu_seconds, free_port
from plane import _load, _pin, _wait_port, gateway, host_copies, nginx, register, tiny_server

PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
OTHER = "event loop/other"
# A py-spy raw line: "frame;frame;...;leaf COUNT", a frame "function (file:line)" or, native,
# "symbol (object)"; the root first.
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<where>[^()]*)\)$")
# Frames near the leaf that mean the thread was waiting, not running: a lock or a condition
# (an idle executor or aiosqlite thread, a thread waiting for the GIL), the event loop's poll,
# a sleep.
IDLE = ("PyThread_acquire_lock_timed", "pthread_cond_timedwait", "pthread_cond_wait",
        "take_gil", "sem_timedwait", "sem_wait", "epoll_pwait", "epoll_wait",
        "clock_nanosleep", "select ", "poll ")  # fmt: skip
StageMap = tuple[tuple[str, tuple[str, ...]], ...]


def _where(frame: str) -> tuple[str, str]:
    m = _FRAME.match(frame)
    return (m["fn"], m["where"]) if m else (frame, "")


def split(raw: str, stage_map: StageMap) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    """(samples by stage, by native object of the leaf, by leaf function, total samples)."""
    by_stage: Counter[str] = Counter()
    by_object: Counter[str] = Counter()
    by_leaf: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if any(f.startswith(IDLE) for f in frames[-4:]):
            continue  # blocked, not running: py-spy's own idle test misses these with --native
        total += n
        fn, where = _where(frames[-1])
        obj = where if ".py" not in where else "python"
        by_object[obj.split("/")[-1] or "?"] += n
        by_leaf[f"{fn} ({where.split('/')[-1]})"] += n
        stage = OTHER
        for frame in reversed(frames):
            _, where = _where(frame)
            if ".py" not in where:
                continue
            hit = next((s for s, parts in stage_map if any(p in where for p in parts)), None)
            if hit is not None:
                stage = hit
                break
        by_stage[stage] += n
    return by_stage, by_object, by_leaf, total


def _table(title: str, counts: Counter[str], total: int, us_per: float, unit: str) -> list[str]:
    out = [f"| {title} | share | µs / {unit} |", "|---|---:|---:|"]
    for name, n in counts.most_common():
        share = n / max(total, 1)
        out.append(f"| {name} | {share:.1%} | {us_per * share:.1f} |")
    out.append(f"| total ({total:,} samples) | 100% | {us_per:.1f} |")
    return out


def _top(title: str, counts: Counter[str], total: int, k: int) -> list[str]:
    out = [f"| {title} | share |", "|---|---:|"]
    for name, n in counts.most_common(k):
        out.append(f"| {name.replace('|', '/')} | {n / max(total, 1):.1%} |")
    return out


def _record(pid: int, seconds: float, rate: int, out: Path) -> subprocess.Popen[bytes]:
    cmd = [PY_SPY, "record", "--native", "--format", "raw", "--rate", str(rate),
           "--duration", str(int(seconds)), "--pid", str(pid), "--output", str(out)]  # fmt: skip
    # --native needs the process paused for each sample (tens of µs, `--rate` times a second):
    # a little wall time, next to no CPU of the process's own.
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def run(args: argparse.Namespace, tmp: str) -> list[str]:
    lines = [f"Machine: {os.cpu_count()} CPUs, {_load()} at the start"]
    ncpu = os.cpu_count() or 1
    gw_cpus, rest = ({0}, {1}) if ncpu > 1 and not args.no_pin else (None, None)
    _pin(0, rest)
    live_port, fast_port = free_port(), free_port()
    with (
        nginx(tiny_server(live_port) + tiny_server(fast_port)) as engine,
        gateway(tmp, f"http://127.0.0.1:{live_port}", cpus=gw_cpus, mirror_cpus=gw_cpus) as gw,
    ):
        _pin(engine.pid, rest)
        for port in (live_port, fast_port):
            _wait_port(port)
        async with aiohttp.ClientSession() as http:
            await register(http, gw, "fast", f"http://127.0.0.1:{fast_port}")
        await asyncio.sleep(2.5)  # the worker and the mirror process learn of it
        await open_loop(gw.url, args.rate, 3.0)  # warm-up: pools, SQLite, the lane
        await _settled(gw, "fast")
        mpid = gw.mirror_pid()
        assert mpid is not None, "no mirror process"
        pids = {"worker": gw.popen.pid, "mirror process": mpid}
        before = _copies_of(await host_copies(gw.url), "fast")
        cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
        spies = {k: _record(p, args.seconds, args.sample_rate, Path(tmp, f"{k[0]}.txt"))
                 for k, p in pids.items()}  # fmt: skip
        t0 = time.perf_counter()
        lat, errors = await open_loop(gw.url, args.rate, args.seconds)
        worker_s = cpu_seconds(pids["worker"]) - cpu0["worker"]
        after = await _settled(gw, "fast")
        mirror_s = cpu_seconds(mpid) - cpu0["mirror process"]
        wall = time.perf_counter() - t0
        for name, spy in spies.items():
            _, err = spy.communicate(timeout=args.seconds + 60)
            if spy.returncode != 0:
                raise RuntimeError(f"py-spy on the {name}: {err.decode()[-500:]}")
        copies = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        offered = int(args.rate * args.seconds)
        sent = copies.get("sent", 0)
        observed = copies.get("observed_ok", 0) + copies.get("observed_error", 0)
        lines += [
            f"Load: {args.rate:g} req/s for {args.seconds:g} s ({offered:,} requests, "
            f"{len(lat):,} answered, {errors} errors); copies sampled "
            f"{copies.get('sampled', 0):,}, sent {sent:,}, observed {observed:,}, "
            + ", ".join(f"{k} {copies.get(k, 0):,}" for k in DROPS)
            + f"; py-spy at {args.sample_rate}/s, --native, blocked threads left out; "
            f"{_load()} at the end ({wall:.1f} s from the window's start to settled counters)",
            "",
        ]
        keep = Path(args.keep) if args.keep else None
        for name, stage_map, us, unit in (
            ("worker", stages.STAGES, worker_s * 1e6 / offered, "request"),
            ("mirror process", mirror_instructions.STAGES, mirror_s * 1e6 / max(sent, 1), "copy"),
        ):
            raw = await asyncio.to_thread(Path(tmp, f"{name[0]}.txt").read_text)
            if keep:
                keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(tmp, f"{name[0]}.txt"), keep / f"{name.split()[0]}.raw.txt")
            by_stage, by_object, by_leaf, total = split(raw, stage_map)
            lines += [f"**{name}**: {us:.0f} µs of CPU per {unit} (/proc)", ""]
            lines += [*_table(f"{name} stage (py-spy samples)", by_stage, total, us, unit), ""]
            lines += [*_top("leaf object (native frames; python = interpreted code)",
                            by_object, total, 8), ""]  # fmt: skip
            lines += [*_top("leaf function", by_leaf, total, 15), ""]
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rate", type=float, default=1000.0, help="open-loop offered rate, req/s")
    p.add_argument("--seconds", type=float, default=15.0, help="the sampled window")
    p.add_argument("--sample-rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--no-pin", action="store_true", help="let every process use every CPU")
    p.add_argument("--keep", help="copy py-spy's raw stacks here (flamegraph input)")
    args = p.parse_args(argv)
    if not Path(PY_SPY).exists():
        sys.exit("py-spy is not installed: pip install py-spy")
    tmp = tempfile.mkdtemp(prefix="canary-spy-")
    try:
        print("\n".join(uvloop.run(run(args, tmp))))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
