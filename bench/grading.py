"""Production untouched by an LLM grader: production's latency with grading at `rate` 1.0, side
by side with mirroring alone and mirroring off, in one run, interleaved round by round.

    .venv/bin/python bench/grading.py [--rate 100] [--seconds 10] [--rounds 4]
    .venv/bin/python bench/grading.py --quick        # a short smoke run (1 round of 3 s)

Every part in its own process on 127.0.0.1. Upstreams are the simulator (`canary sim`): the live
engine (`fast`: no delays, so the gateway's own cost is what moves), a model-upgrade candidate
(`upgrade`, every answer in its own words, `--time-scale 0.02`), and two LLM graders (`grader`:
pairwise verdicts with a planted position bias), a fast one (`--time-scale 0.02`, about as quick
as the candidate) and a slow one (`--time-scale 20`: a grading takes seconds, far behind
the offered pairs, so its bounded queue fills and the rest is dropped, counted). Rows, each its
own `canary serve` (one worker and its mirror process, fresh SQLite, the defaults otherwise):
  off           no candidate
  mirror        the upgrade at `sample_rate` 1.0, no grader
  grading       the same with the fast grader at `rate` 1.0 (swap_rate 0.25, uncapped)
  slow grader   the same with the slow grader at `rate` 1.0
Load: unique tiny chat requests, open loop at `--rate` for `--seconds` per cell (bench/plane.py's
`open_loop_tiny`: latency from each request's *scheduled* send time to its last byte, so a late
client or a stalled gateway both count). Round by round every row is visited, the order reversed
every other round, so drift in the host's load falls on all rows alike. Between cells the
mirror and the grading lane are left to settle (`--settle` seconds), so a cell's backlog of
gradings is not the next cell's load.

Columns: p50 and p99 per row (every round's latencies pooled) and their ratio to mirroring off;
the median over rounds of each round's p99 and its ratio to mirroring off and to mirroring
alone (steadier on a shared host, where one burst of other work rules a pooled p99); the
per-round p99 ratios' range, production errors, the CPU per request of the worker
(production's process: the same in every row if grading costs it nothing) and of the mirror
process (where copies and gradings run), and the grading accounting over the run
(from the gateway's /metrics: pairs sampled, grader calls, graded, dropped, failed). It prints
a markdown table for bench/RESULTS.md. It is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Procs, cpu_seconds  # siblings, through sys.path above
from plane import Gateway, _load, _pct, gateway, open_loop_tiny
from plane import _free_port as free_port

ROWS = ("off", "mirror", "grading", "slow grader")
NAMES = {
    "off": "mirroring off",
    "mirror": "mirroring alone (upgrade at 100 %)",
    "grading": "mirroring + grading at rate 1.0 (fast grader)",
    "slow grader": "mirroring + grading at rate 1.0 (slow grader, seconds a grading)",
}
CANDIDATE = "upgrade"
GRADING_KEYS = ("sampled", "calls", "graded", "tie", "dropped", "failed", "unparseable")
_GRADING = re.compile(r'^canary_grading_(\w+)_total\{candidate="([^"]+)"\} ([0-9.e+]+)$', re.M)


def _sim(procs: Procs, profile: str, time_scale: float) -> str:
    port = free_port()
    procs.start(
        sys.executable,
        *("-m", "gateway.cli.main", "sim", "--port", str(port), "--profile", profile),
        *("--time-scale", f"{time_scale:g}"),
        port=port,
    )
    return f"http://127.0.0.1:{port}"


async def _register(gw: Gateway, url: str, grader: str | None) -> None:
    body: dict[str, object] = {
        "name": CANDIDATE,
        "url": url,
        "kind": "model-upgrade",
        "sample_rate": 1.0,
        "timeout_s": 60.0,
    }
    if grader is not None:
        body["grader"] = {
            "url": grader,
            "model": "sim-model",
            "rate": 1.0,
            "max_per_minute": 1_000_000,
            "price_per_mtok": 0.2,
        }
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{gw.url}/admin/candidates", json=body) as resp,
    ):
        if resp.status != 201:
            raise RuntimeError(f"register on {gw.url}: {resp.status} {await resp.text()}")


async def _grading(gw: Gateway) -> dict[str, int]:
    """The gateway's grading counters for the candidate (the mirror process's, via /metrics)."""
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/metrics") as resp:
        text = await resp.text()
    return {k: int(float(v)) for k, name, v in _GRADING.findall(text) if name == CANDIDATE}


@dataclass
class Cell:
    lat: list[float]
    errors: int
    worker_s: float = 0.0  # CPU of the worker (production's process) over the cell
    mirror_s: float = 0.0  # CPU of the mirror process (copies and gradings) over the cell


@dataclass
class Results:
    cells: dict[str, list[Cell]] = field(default_factory=dict)
    grading: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


_sent = [0]  # every request of the run has a body of its own (the mirror deduplicates)


async def measure(gw: Gateway, rate: float, seconds: float) -> Cell:
    first = _sent[0]
    _sent[0] += int(seconds * rate)
    mpid = gw.mirror_pid()
    w0, m0 = cpu_seconds(gw.popen.pid), cpu_seconds(mpid) if mpid else 0.0
    lat, errors, _ = await open_loop_tiny(gw.url, rate, seconds, first=first)
    cell = Cell([d for _, d in lat], errors)
    cell.worker_s = cpu_seconds(gw.popen.pid) - w0
    cell.mirror_s = cpu_seconds(mpid) - m0 if mpid else 0.0
    return cell


async def run(args: argparse.Namespace) -> Results:
    res = Results(notes=[f"start: {_load()}, {os.cpu_count()} CPUs"])
    procs = Procs()
    tmp = tempfile.mkdtemp(prefix="canary-grading-")
    try:
        live = _sim(procs, "fast", 1.0)
        cand = _sim(procs, "upgrade", 0.02)
        fast_grader = _sim(procs, "grader", 0.02)
        slow_grader = _sim(procs, "grader", args.slow_scale)
        with (
            gateway(tmp, live) as off,
            gateway(tmp, live) as mirror,
            gateway(tmp, live) as grading,
            gateway(tmp, live) as slow,
        ):
            gws = {"off": off, "mirror": mirror, "grading": grading, "slow grader": slow}
            await _register(mirror, cand, None)
            await _register(grading, cand, fast_grader)
            await _register(slow, cand, slow_grader)
            await asyncio.sleep(2.5)  # the workers and the mirror processes learn of them
            for row in ROWS:  # warm-up: pools, SQLite, the lanes
                await measure(gws[row], args.rate, 2.0)
            before = {row: await _grading(gws[row]) for row in ROWS}
            res.notes.append(f"after warm-up: {_load()}")
            for rnd in range(args.rounds):
                for row in ROWS if rnd % 2 == 0 else ROWS[::-1]:
                    await asyncio.sleep(args.settle)
                    cell = await measure(gws[row], args.rate, args.seconds)
                    res.cells.setdefault(row, []).append(cell)
                    print(
                        f"r{rnd} {row:12} n {len(cell.lat)} errors {cell.errors} "
                        f"p50 {_pct(cell.lat, 0.5):.2f} ms p99 {_pct(cell.lat, 0.99):.2f} ms "
                        f"worker {cell.worker_s * 1e6 / len(cell.lat):.0f} µs/req "
                        f"mirror {cell.mirror_s * 1e6 / len(cell.lat):.0f} µs/req",
                        flush=True,
                    )
                res.notes.append(f"after round {rnd}: {_load()}")
            await asyncio.sleep(args.settle)
            for row in ROWS:
                after = await _grading(gws[row])
                res.grading[row] = {
                    k: after.get(k, 0) - before[row].get(k, 0) for k in GRADING_KEYS
                }
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    res.notes.append(f"end: {_load()}")
    return res


def report(args: argparse.Namespace, res: Results) -> list[str]:
    base = [x for c in res.cells["off"] for x in c.lat]
    b50, b99 = _pct(base, 0.5), _pct(base, 0.99)
    # One burst of the host's other work lands in one cell and rules a pooled p99; the median
    # of the rounds' p99s is the steadier figure on a shared host.
    m99 = {row: statistics.median(_pct(c.lat, 0.99) for c in res.cells[row]) for row in ROWS}
    out = [
        f"{args.rounds} rounds x {args.seconds:g} s at {args.rate:g} req/s per row, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| row | requests | errors | p50 ms | p99 ms (pooled) | p50 / off | p99 / off "
        "| p99 ms, median round | / off | / mirroring alone | per-round p99 / off "
        "| worker CPU µs/req | mirror CPU µs/req | gradings / pairs sampled | grader calls "
        "| pairs dropped | failed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---:|",
    ]
    for row in ROWS:
        cells = res.cells[row]
        xs = [x for c in cells for x in c.lat]
        p50, p99 = _pct(xs, 0.5), _pct(xs, 0.99)
        per = [
            _pct(c.lat, 0.99) / _pct(o.lat, 0.99)
            for c, o in zip(cells, res.cells["off"], strict=True)
        ]
        g = res.grading.get(row, {})
        graded = f"{g.get('graded', 0):,} / {g.get('sampled', 0):,}" if row != "off" else "-"
        out.append(
            f"| {NAMES[row]} | {len(xs):,} | {sum(c.errors for c in cells)} | {p50:.2f} "
            f"| {p99:.2f} | {p50 / b50:.3f}x | {p99 / b99:.3f}x "
            f"| {m99[row]:.2f} | **{m99[row] / m99['off']:.2f}x** "
            f"| **{m99[row] / m99['mirror']:.2f}x** "
            f"| {min(per):.2f}-{max(per):.2f}x "
            f"| {sum(c.worker_s for c in cells) * 1e6 / max(len(xs), 1):.0f} "
            f"| {sum(c.mirror_s for c in cells) * 1e6 / max(len(xs), 1):.0f} "
            f"| {graded} | {g.get('calls', 0):,} "
            f"| {g.get('dropped', 0):,} | {g.get('failed', 0):,} |"
        )
    out += [
        "",
        "Gradings with a verdict against the pairs selected (a pair graded both ways counts "
        "twice; swap_rate 0.25), from the warm-up to the end; pairs dropped: the bounded queue "
        "(`grading_max_pending`) full behind a slow grader. Load:",
    ]
    out += [f"- {n}" for n in res.notes]
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--rate", type=float, default=100.0, help="requests per second (100)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per cell (10)")
    p.add_argument("--rounds", type=int, default=4, help="rounds (4)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds between cells (3)")
    p.add_argument(
        "--slow-scale", type=float, default=20.0, help="the slow grader's --time-scale (20)"
    )
    p.add_argument("--quick", action="store_true", help="1 round of 3 s")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.settle = 1, 3.0, 1.0
    print("\n".join(report(args, asyncio.run(run(args)))))


if __name__ == "__main__":
    main()
