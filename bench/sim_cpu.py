"""The engine simulator's CPU per request under the demo's agent traffic.

Starts `canary sim` processes (one per profile named), drives `gateway.sim.workload` sessions
straight at each (no gateway), and prints per profile: requests, the simulator process's CPU
(user + system, from /proc) per request, the driver's own CPU per request, and the prompt
tokens the simulator counted (mean and largest). Run it before and after a change to the
simulator; compare ratios within one run, not microseconds across days.

    .venv/bin/python bench/sim_cpu.py --sessions 48 --turns 6 --profiles baseline,bi-kv
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from gateway.sim.workload import WorkloadSpec, run_workload

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


async def _one(profile: str, args: argparse.Namespace) -> str:
    cmd = [sys.executable, "-m", "gateway.cli.main", "sim", "--port", "0"]
    cmd += ["--profile", profile, "--time-scale", str(args.time_scale)]
    cmd += list(args.sim_args.split()) if args.sim_args else []
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        line = (await proc.stdout.readline()).decode()
        url = line.rsplit(" on ", 1)[1].strip()
        spec = WorkloadSpec(
            sessions=args.sessions, turns=args.turns, concurrency=args.concurrency, seed=args.seed
        )
        cpu0, own0 = _cpu_s(proc.pid), time.process_time()
        done = await run_workload(url, spec)
        sim_cpu, own = _cpu_s(proc.pid) - cpu0, time.process_time() - own0
    finally:
        proc.terminate()
        await proc.wait()
    n = max(done.requests, 1)
    prompts = [t for t in (getattr(r, "prompt_tokens", None) for r in done.turns) if t]
    calls = sum(1 for r in done.turns if getattr(r, "tool_calls", 0))
    mean = sum(prompts) / len(prompts) if prompts else float("nan")
    return (
        f"| {profile} | {done.requests} | {done.errors} | {1e3 * sim_cpu / n:.2f} | "
        f"{1e3 * own / n:.2f} | {mean:.0f} | {max(prompts, default=0)} | {calls / n:.0%} | "
        f"{done.wall_s:.1f} |"
    )


async def _main(args: argparse.Namespace) -> None:
    print(
        "| profile | requests | errors | sim CPU ms/req | driver CPU ms/req | prompt tokens mean"
        " | largest | call turns | wall s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for profile in args.profiles.split(","):
        print(await _one(profile, args), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="baseline,bi-kv")
    parser.add_argument("--sessions", type=int, default=48)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--sim-args", default="", help="more `canary sim` flags, one string")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
