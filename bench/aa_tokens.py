#!/usr/bin/env python3
"""An A/A of the simulator with SSE event packing on: tokens counted, not events.

Three simulated engines of one profile, each packing 1..K tokens into every SSE event at random
(`canary sim --tokens-per-event K`, as a busy vLLM API server does): the live endpoint, a
control and a candidate "aa" that is production's configuration under another name. One
`canary serve` mirrors every session to both; the agent workload runs RUNS windows of SESSIONS
conversations one after the other, and each window is one independent A/A experiment: the
report of "aa" over that window alone, at LOOKS evenly spaced looks (the last a planned look).
A run rejects when output length or TPOT is judged beyond its margin at any look. Before
tokens were counted from the text, the event count made identical answers look shorter on the
arm whose engine packed more.

    .venv/bin/python bench/aa_tokens.py                       # 100 runs, K = 4
    .venv/bin/python bench/aa_tokens.py --runs 20 --sessions 20 --tokens-per-event 1

Prints the rejection rate of each metric with its 95 % Clopper-Pearson interval, and the share
of pairs whose two arms were counted alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import aiohttp
import sqlalchemy as sa

from bench.simulate import clopper_pearson
from evaluators.judge.settings import VerdictSettings
from evaluators.report.build import evaluate
from gateway.process.demo.children import Processes, free_port, wait_ready
from gateway.sim.workload import WorkloadSpec, run_workload
from storage.engine import make_engine

METRICS = ("output_length", "tpot")
REJECTING = ("beyond", "critical")


async def _windows(args: argparse.Namespace, work: Path) -> tuple[list[tuple[float, float]], Path]:
    procs = Processes(work)
    urls: dict[str, str] = {}
    try:
        for name in ("live", "control", "aa"):
            port = free_port()
            proc = await procs.start(
                name, "sim", "--port", str(port), "--profile", "baseline",
                "--time-scale", str(args.time_scale), "--seed", str(len(urls)),
                "--tokens-per-event", str(args.tokens_per_event),
            )  # fmt: skip
            urls[name] = f"http://127.0.0.1:{port}"
            await wait_ready(urls[name] + "/health", proc, name, work / f"{name}.log")
        config = work / "gateway.toml"
        config.write_text(
            "counters_flush_interval_s = 0.5\nregistry_poll_interval_s = 0.5\n"
            f'[[candidates]]\nname = "control"\nkind = "control"\nurl = "{urls["control"]}"\n'
            'sample_rate = 1.0\nsampling = "session"\n'
            f'[[candidates]]\nname = "aa"\nkind = "aa"\nurl = "{urls["aa"]}"\n'
            'sample_rate = 1.0\nsampling = "session"\n'
        )
        db = work / "canary.db"
        port = free_port()
        proc = await procs.start(
            "gateway", "serve", "--listen", f"127.0.0.1:{port}", "--live", urls["live"],
            "--db", f"sqlite+aiosqlite:///{db}", "--config", str(config),
        )  # fmt: skip
        gw = f"http://127.0.0.1:{port}"
        await wait_ready(gw + "/readyz", proc, "gateway", work / "gateway.log")
        windows = []
        for run in range(args.runs):
            start = time.time()
            spec = WorkloadSpec(
                sessions=args.sessions,
                first_session=run * args.sessions,
                turns=args.turns,
                concurrency=args.concurrency,
                seed=run,
            )
            await run_workload(gw, spec)
            await asyncio.sleep(1.0)  # the copies of the window's last turns answer
            windows.append((start, time.time()))
            print(f"\rtraffic: window {run + 1}/{args.runs}", end="", file=sys.stderr)
        print(file=sys.stderr)
        await asyncio.sleep(3.0)  # the writer's last batch
        async with aiohttp.ClientSession() as http, http.get(gw + "/metrics") as resp:
            for line in (await resp.text()).splitlines():
                if line.startswith(("canary_mirror_token_counts_total", "canary_mirror_tokenize")):
                    print(line)
        return windows, db
    finally:
        await procs.stop_all()


async def _judge(args: argparse.Namespace, windows: list[tuple[float, float]], db: Path) -> None:
    engine = make_engine(f"sqlite+aiosqlite:///{db}")
    rejects = dict.fromkeys(METRICS, 0)
    try:
        for i, (since, until) in enumerate(windows):
            hit = dict.fromkeys(METRICS, False)
            for look in range(1, args.looks + 1):
                at = since + (until - since) * look / args.looks
                report = await evaluate(
                    engine, "aa", since=since, until=at, settings=VerdictSettings(),
                    planned_look=look == args.looks,
                )  # fmt: skip
                for name in METRICS:
                    metric = report.metrics.get(name)
                    hit[name] |= metric is not None and metric.status in REJECTING
            for name in METRICS:
                rejects[name] += hit[name]
            print(f"\rjudged: window {i + 1}/{len(windows)}", end="", file=sys.stderr)
        print(file=sys.stderr)
        async with engine.connect() as conn:
            same, both, pairs = (
                await conn.execute(
                    sa.text(
                        "SELECT SUM(CASE WHEN p.output_tokens = c.output_tokens AND "
                        "p.token_counter = c.token_counter THEN 1 ELSE 0 END), "
                        "SUM(CASE WHEN p.output_tokens IS NOT NULL AND c.output_tokens IS NOT "
                        "NULL THEN 1 ELSE 0 END), COUNT(*) "
                        "FROM observations p JOIN observations c "
                        "ON c.exchange_id = p.exchange_id AND c.endpoint = 'aa' "
                        "WHERE p.arm = 'production' AND p.output_hash = c.output_hash"
                    )
                )
            ).one()
    finally:
        await engine.dispose()
    n = len(windows)
    print(
        f"A/A, simulator with 1..{args.tokens_per_event} tokens per SSE event: {n} runs of "
        f"{args.sessions} sessions x {args.turns} turns, {args.looks} looks each"
    )
    print(f"{'metric':<15} {'rejected':>9} {'rate':>7}  95 % interval     target")
    for name in METRICS:
        k = rejects[name]
        lo, hi = clopper_pearson(k, n)
        print(f"{name:<15} {k:>4}/{n:<4} {k / n:>7.1%}  [{lo:.3f}, {hi:.3f}]   <= 5 %")
    print(
        f"identical answer pairs: {pairs}; both answers counted: {both or 0}; "
        f"counted alike: {same or 0} of those"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--sessions", type=int, default=30, help="conversations per run")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--looks", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--tokens-per-event", type=int, default=4)
    ap.add_argument("--time-scale", type=float, default=0.2)
    ap.add_argument("--keep", metavar="DIR", help="keep the logs and the database in DIR")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="canary-aa-") as tmp:
        work = Path(args.keep) if args.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        windows, db = asyncio.run(_windows(args, work))
        asyncio.run(_judge(args, windows, db))
    return 0


if __name__ == "__main__":
    sys.exit(main())
