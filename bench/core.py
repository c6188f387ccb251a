"""What one core serves: issue 34's measures side by side, in one run, interleaved round by round.

    .venv/bin/python bench/core.py [--rates 300,1000] [--seconds 10] [--rounds 3] [--no-pin]
    .venv/bin/python bench/core.py --quick        # a short smoke run (1 round of 3 s)

Every part in its own process on 127.0.0.1; one nginx serves the live engine and the fast
candidate (`return 200` with a tiny chat completion). Rows, each a proxy in front of that engine:
  direct        the engine itself (the latency baseline of the "added" columns; no CPU column)
  pass-through  the minimal aiohttp pass-through of bench/overhead.py (read body, forward, stream
                back): the floor of this stack
  off           `canary serve`, one worker and its mirror process, real SQLite, no candidate
  fast 100 %    the same with a fast candidate (the second nginx server) at 100 % sampling
Load: unique tiny chat requests, open loop at each of `--rates` for `--seconds` per cell; each
request's latency runs from its *scheduled* send time to its last byte (no coordinated omission).
Round by round every rate visits every row, the row order reversed every other round, so drift in
the host's load falls on all rows alike. Then `wrk -t1 -c32` (closed loop) saturates the
pass-through and the gateway with mirroring off, alternately, `--seconds` each, every round.

Placement (`--no-pin` turns it off): the whole gateway (worker AND mirror process) and the
pass-through on CPU 0, as in the issue ("the whole gateway on one core"); nginx, this process
(the open-loop client) and wrk on CPU 1.

Columns: CPU µs per request of each process, from /proc utime + stime over the measured window
divided by the requests offered in it (the mirror process: also per copy it sent, its CPU counted
until its counters settle after the window); the mirror's copy accounting from the gateway's
/metrics (the mirror process's counters plus the copies the worker chose but never handed off,
bench/plane.py's `host_copies`); p50/p99 and the same added over direct; the ratios issue 34's
"done when" asks for, each judged met / not met; the load average before and after.
It prints markdown tables for bench/RESULTS.md. It is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import Procs, cpu_seconds, median, passthrough  # siblings, through sys.path above
from plane import (
    Gateway,
    _load,
    _pct,
    _pin,
    _wait_port,
    gateway,
    host_copies,
    nginx,
    open_loop_tiny,
    register,
    tiny_server,
    wrk,
)
from plane import _free_port as free_port

ROWS = ("direct", "pass-through", "off", "fast 100 %")
NAMES = {
    "direct": "direct (nginx `return 200`)",
    "pass-through": "minimal aiohttp pass-through",
    "off": "canary-gateway, mirroring off",
    "fast 100 %": "canary-gateway, fast candidate at 100 %",
}
# The copy outcomes that end a copy other than being sent; `sent` ends in an observation or a
# time-out. `sampled` counts every copy chosen (the worker's hand-off drops included).
DROPS = ("dropped_overflow", "dropped_oversize", "shed_overload")


@dataclass
class Cell:
    """One row at one rate in one round."""

    offered: int
    lat: list[float]  # seconds, scheduled send -> last byte, successful requests
    errors: int
    worker_s: float = 0.0  # CPU seconds over the window (the pass-through's own process)
    other_s: float = 0.0  # the gateway's other processes (the report process), same window
    mirror_s: float = 0.0  # CPU seconds from the window's start until the counters settled
    copies: dict[str, int] = field(default_factory=dict)  # deltas over the window and drain


def _copies_of(snapshot: dict[str, Any], name: str) -> dict[str, int]:
    row = snapshot.get(name, {})
    return {k: int(v) for k, v in row.items() if isinstance(v, int)}


def _pending(c: dict[str, int]) -> int:
    """Copies chosen that have not reached an outcome (queued or in flight)."""
    done = c.get("deduplicated", 0) + sum(c.get(k, 0) for k in DROPS) + c.get("sent", 0)
    return c.get("sampled", 0) - done


def _observed(c: dict[str, int]) -> int:
    return c.get("observed_ok", 0) + c.get("observed_error", 0)


def _share(c: dict[str, int]) -> float:
    """Copies observed of those chosen (a repeated body's copy is deduplicated, not lost; every
    body here is unique, so there are none)."""
    wanted = c.get("sampled", 0) - c.get("deduplicated", 0)
    return _observed(c) / wanted if wanted > 0 else float("nan")


async def _settled(gw: Gateway, name: str, within_s: float = 20.0) -> dict[str, int]:
    """The candidate's counters once nothing is pending and two reads a second apart agree
    (the mirror process reports its counters to the worker about once a second)."""
    deadline = time.monotonic() + within_s
    last: dict[str, int] | None = None
    while True:
        await asyncio.sleep(1.2)
        now = _copies_of(await host_copies(gw.url), name)
        if (now == last and _pending(now) == 0) or time.monotonic() > deadline:
            return now
        last = now


# ---------------------------------------------------------------- one cell


@dataclass
class Target:
    name: str
    url: str
    pid: int | None = None  # the process whose CPU is the row's (worker or pass-through)
    gw: Gateway | None = None
    candidate: str | None = None


_sent = [0]  # requests numbered so far: every request of the run has a body of its own


async def open_loop(url: str, rate: float, seconds: float) -> tuple[list[float], int]:
    """bench/plane.py's open loop of tiny chat requests, each body unique in the whole run (the
    mirror deduplicates repeated bodies, which would hide copies)."""
    first = _sent[0]
    _sent[0] += int(seconds * rate)
    lat, errors, _ = await open_loop_tiny(url, rate, seconds, first=first)
    return [d for _, d in lat], errors


def _others(gw: Gateway | None) -> float:
    """CPU seconds of the gateway's processes but the worker and the mirror process (the report
    process, multiprocessing's resource tracker)."""
    if gw is None:
        return 0.0
    total, skip = 0.0, {gw.popen.pid, gw.mirror_pid()}
    for pid in gw.tree_pids():
        if pid not in skip:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
    return total


async def measure(t: Target, rate: float, seconds: float, cpus: set[int] | None) -> Cell:
    mpid = t.gw.mirror_pid() if t.gw else None
    if mpid is not None:
        _pin(mpid, cpus)  # again: a restarted mirror process would start unpinned
    before = _copies_of(await host_copies(t.gw.url), t.candidate) if t.gw and t.candidate else {}
    w0 = cpu_seconds(t.pid) if t.pid else 0.0
    m0 = cpu_seconds(mpid) if mpid else 0.0
    o0 = _others(t.gw)
    lat, errors = await open_loop(t.url, rate, seconds)
    cell = Cell(int(seconds * rate), lat, errors)
    cell.worker_s = cpu_seconds(t.pid) - w0 if t.pid else 0.0
    cell.other_s = _others(t.gw) - o0
    if t.gw and t.candidate:
        after = await _settled(t.gw, t.candidate)
        cell.copies = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    if mpid:
        cell.mirror_s = cpu_seconds(mpid) - m0
    return cell


async def warm(targets: Sequence[Target], rate: float) -> None:
    """Two seconds at the first rate through every row (pools, caches, SQLite, the lane)."""
    for t in targets:
        await open_loop(t.url, rate, 2.0)
        if t.gw and t.candidate:
            await _settled(t.gw, t.candidate)


# ---------------------------------------------------------------- the run


@dataclass
class Results:
    cells: dict[tuple[float, str], list[Cell]] = field(default_factory=dict)
    sat: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (req/s, CPU µs/req)
    notes: list[str] = field(default_factory=list)
    peak_load: float = 0.0  # the highest 1-minute load average seen between cells


def _seen(res: Results) -> None:
    res.peak_load = max(res.peak_load, os.getloadavg()[0])


async def run(args: argparse.Namespace) -> Results:
    res = Results(notes=[f"start: {_load()}, {os.cpu_count()} CPUs"])
    _seen(res)
    ncpu = os.cpu_count() or 1
    gw_cpus, rest_cpus = ({0}, {1}) if ncpu > 1 and not args.no_pin else (None, None)
    _pin(0, rest_cpus)  # this process (the client) and what it starts: wrk
    rates = [float(r) for r in args.rates.split(",")]
    live_port, fast_port = free_port(), free_port()
    procs = Procs()
    tmp = tempfile.mkdtemp(prefix="canary-core-")
    try:
        with (
            nginx(tiny_server(live_port) + tiny_server(fast_port)) as engine,
            gateway(tmp, f"http://127.0.0.1:{live_port}", cpus=gw_cpus, mirror_cpus=gw_cpus) as off,
            gateway(tmp, f"http://127.0.0.1:{live_port}", cpus=gw_cpus, mirror_cpus=gw_cpus) as gw,
        ):
            _pin(engine.pid, rest_cpus)
            for port in (live_port, fast_port):
                _wait_port(port)
            live = f"http://127.0.0.1:{live_port}"
            pt_url, pt_pid = passthrough(procs, Path(tmp), live)
            _pin(pt_pid, gw_cpus)
            async with aiohttp.ClientSession() as http:
                await register(http, gw, "fast", f"http://127.0.0.1:{fast_port}")
            await asyncio.sleep(2.5)  # the worker and the mirror process learn of it
            targets = {
                "direct": Target("direct", live),
                "pass-through": Target("pass-through", pt_url, pt_pid),
                "off": Target("off", off.url, off.popen.pid, off),
                "fast 100 %": Target("fast 100 %", gw.url, gw.popen.pid, gw, "fast"),
            }
            await warm(list(targets.values()), rates[0])
            res.notes.append(f"after warm-up: {_load()}")
            for rnd in range(args.rounds):
                for rate in rates:
                    order = ROWS if rnd % 2 == 0 else ROWS[::-1]
                    for row in order:
                        cell = await measure(targets[row], rate, args.seconds, gw_cpus)
                        res.cells.setdefault((rate, row), []).append(cell)
                        _seen(res)
                        print(f"r{rnd} {rate:g}/s {row:13} {_fmt(cell)}", flush=True)
                sat_order = ("pass-through", "off") if rnd % 2 == 0 else ("off", "pass-through")
                for row in sat_order:
                    url, pid = targets[row].url, targets[row].pid or 0
                    wrk(url, 1, 32)  # warm the connections
                    c0 = cpu_seconds(pid)
                    rps, _ = wrk(url, args.seconds, 32)
                    cpu = (cpu_seconds(pid) - c0) * 1e6 / max(rps * args.seconds, 1.0)
                    res.sat.setdefault(row, []).append((rps, cpu))
                    print(f"r{rnd} saturation {row:13} {rps:,.0f} req/s {cpu:.0f} µs/req")
                res.notes.append(f"after round {rnd}: {_load()}")
                _seen(res)
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    res.notes.append(f"end: {_load()}")
    return res


def _fmt(c: Cell) -> str:
    cp = f" copies {c.copies}" if c.copies else ""
    return (
        f"n {len(c.lat)}/{c.offered} errors {c.errors} p50 {_pct(c.lat, 0.5):.2f} "
        f"p99 {_pct(c.lat, 0.99):.2f} ms worker {_us(c.worker_s, c.offered)} µs/req "
        f"mirror {_us(c.mirror_s, c.offered)} µs/req{cp} ({_load()})"
    )


def _num(x: float) -> str:
    return "–" if x != x else f"{x:.0f}"


def _us(cpu_s: float, n: int) -> str:
    return f"{cpu_s * 1e6 / n:.0f}" if cpu_s and n else "–"


# ---------------------------------------------------------------- the report


@dataclass
class Pooled:
    """One row at one rate, the rounds together."""

    cells: list[Cell]

    @property
    def lat(self) -> list[float]:
        return [x for c in self.cells for x in c.lat]

    @property
    def offered(self) -> int:
        return sum(c.offered for c in self.cells)

    def worker_us(self) -> float:
        return sum(c.worker_s for c in self.cells) * 1e6 / max(self.offered, 1)

    def rounds_us(self) -> list[float]:
        return [c.worker_s * 1e6 / max(c.offered, 1) for c in self.cells]

    def copies(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.cells:
            for k, v in c.copies.items():
                out[k] = out.get(k, 0) + v
        return out

    def mirror_per_copy(self) -> float:
        sent = self.copies().get("sent", 0)
        return sum(c.mirror_s for c in self.cells) * 1e6 / sent if sent else float("nan")


def report(args: argparse.Namespace, res: Results) -> list[str]:
    rates = sorted({rate for rate, _ in res.cells})
    pool = {key: Pooled(cells) for key, cells in res.cells.items()}
    where = (
        "every process on every CPU (--no-pin)"
        if args.no_pin
        else "gateway (worker + mirror process) and pass-through on CPU 0; nginx, the client and "
        "wrk on CPU 1"
    )
    lines = [
        f"{args.rounds} round(s) of {args.seconds:g} s per cell; rates {args.rates} req/s open "
        f"loop; placement: {where}",
        f"Load: {res.notes[0]}; {res.notes[-1]}",
        "",
        "### CPU per request and production latency (open loop; rounds pooled)",
        "",
        "| req/s | proxy | worker CPU µs/req | by round | mirror process CPU µs/req "
        "| mirror CPU µs/copy sent | other gateway processes µs/req | p50 ms | p99 ms "
        "| added p50 ms | added p99 ms | errors |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rate in rates:
        d = pool[(rate, "direct")]
        d50, d99 = _pct(d.lat, 0.5), _pct(d.lat, 0.99)
        for row in ROWS:
            p = pool[(rate, row)]
            p50, p99 = _pct(p.lat, 0.5), _pct(p.lat, 0.99)
            cpu = f"{p.worker_us():.0f}" if row != "direct" else "–"
            by = ", ".join(f"{x:.0f}" for x in p.rounds_us()) if row != "direct" else "–"
            m_req = _us(sum(c.mirror_s for c in p.cells), p.offered)
            m_copy = p.mirror_per_copy()
            other = _us(sum(c.other_s for c in p.cells), p.offered)
            lines.append(
                f"| {rate:g} | {NAMES[row]} | {cpu} | {by} | {m_req} | "
                f"{_num(m_copy)} | {other} | {p50:.2f} | {p99:.2f} | "
                f"{p50 - d50:+.2f} | {p99 - d99:+.2f} | {sum(c.errors for c in p.cells)} |"
            )
    lines += [
        "",
        "### Copies of the fast candidate (the mirror's counters; chosen = sampled, the worker's "
        "hand-off drops included)",
        "",
        "| req/s | round | requests | chosen | deduplicated | sent | observed | dropped (overflow "
        "/ oversize / shed) | timed out | pending | observed / chosen |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for rate in rates:
        for i, c in enumerate([*res.cells[(rate, "fast 100 %")], None]):
            cp = c.copies if c else pool[(rate, "fast 100 %")].copies()
            n = c.offered if c else pool[(rate, "fast 100 %")].offered
            chosen = cp.get("sampled", 0)
            drops = " / ".join(str(cp.get(k, 0)) for k in DROPS)
            share = _share(cp)
            lines.append(
                f"| {rate:g} | {i if c else 'all'} | {n} | {chosen} | {cp.get('deduplicated', 0)} "
                f"| {cp.get('sent', 0)} | {_observed(cp)} | {drops} | {cp.get('timed_out', 0)} | "
                f"{_pending(cp)} | {'–' if share != share else f'{100 * share:.1f} %'} |"
            )
    sat = {
        row: (median([r for r, _ in v]), median([u for _, u in v])) for row, v in res.sat.items()
    }
    lines += [
        "",
        f"### Saturation (wrk -t1 -c32, closed loop, {args.seconds:g} s, median of rounds)",
        "",
        "| proxy | req/s | by round | CPU µs/req |",
        "|---|---:|---|---:|",
    ]
    for row in ("pass-through", "off"):
        by = ", ".join(f"{r:,.0f}" for r, _ in res.sat[row])
        lines.append(f"| {NAMES[row]} | {sat[row][0]:,.0f} | {by} | {sat[row][1]:.0f} |")
    sat_ratio = sat["off"][0] / sat["pass-through"][0]
    lines += ["", f"gateway / pass-through req/s: {sat_ratio:.2f}x", ""]
    lines += ['### Issue 34\'s "done when", in this run', ""]
    if res.peak_load > (os.cpu_count() or 1):
        lines += [
            f"The load average reached {res.peak_load:.1f} on {os.cpu_count()} CPUs during the "
            "run: these verdicts measure the neighbours as much as the gateway.",
            "",
        ]
    lines += done_when(rates, pool, sat_ratio, pinned=not args.no_pin)
    lines += ["", *(f"- load {note}" for note in res.notes)]
    return lines


def _mark(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def done_when(
    rates: Sequence[float], pool: dict[tuple[float, str], Pooled], sat: float, *, pinned: bool
) -> list[str]:
    out = []
    place = "whole gateway on one core" if pinned else "unpinned (--no-pin: not the issue's setup)"
    wanted = [r for r in (300.0, 1000.0) if r in rates]
    judged = wanted or list(rates)
    if not wanted:
        at = ", ".join(f"{r:g}" for r in rates)
        out.append(f"- (the issue names 300 and 1,000 req/s; judged here at {at} req/s)")
    ratios = {
        r: pool[(r, "off")].worker_us() / pool[(r, "pass-through")].worker_us() for r in judged
    }
    cells = ", ".join(f"{r:g}/s {x:.2f}x" for r, x in ratios.items())
    by_round = "; ".join(
        f"{r:g}/s "
        + ", ".join(
            f"{g / p:.2f}"
            for g, p in zip(
                pool[(r, "off")].rounds_us(), pool[(r, "pass-through")].rounds_us(), strict=True
            )
        )
        for r in judged
    )
    out.append(
        f"- worker CPU per request ≤ 1.0x the pass-through's, mirroring off: {cells} "
        f"(by round: {by_round}): {_mark(all(x <= 1.0 for x in ratios.values()))}; "
        f"stretch ≤ 0.7x: {_mark(all(x <= 0.7 for x in ratios.values()))}"
    )
    fast = {r: pool[(r, "fast 100 %")] for r in judged}
    per_copy = {r: p.mirror_per_copy() for r, p in fast.items()}
    out.append(
        "- mirror ≤ 250 µs of CPU per copy: "
        + ", ".join(f"{r:g}/s {x:.0f} µs" for r, x in per_copy.items())
        + f": {_mark(all(x <= 250 for x in per_copy.values()))}"
    )
    top = max(judged)
    p = fast[top]
    cp = p.copies()
    share = _share(cp)
    worst = min((_share(c.copies) for c in p.cells), default=float("nan"))
    out.append(
        f"- fast candidate at 100 %, {top:g} req/s, {place}: copies observed "
        f"{_observed(cp)}/{cp.get('sampled', 0)} = {100 * share:.1f} % (worst round "
        f"{100 * worst:.1f} %), ≥ 95 % overall and in every round: "
        f"{_mark(share >= 0.95 and worst >= 0.95)}"
    )
    off99 = _pct(pool[(top, "off")].lat, 0.99)
    fast99 = _pct(p.lat, 0.99)
    rounds = ", ".join(
        f"{_pct(f.lat, 0.99) / _pct(o.lat, 0.99):.2f}"
        for f, o in zip(p.cells, pool[(top, "off")].cells, strict=True)
    )
    out.append(
        f"- production p99 with the fast candidate within 1.3x of mirroring off at {top:g} req/s: "
        f"{fast99:.2f} / {off99:.2f} ms = {fast99 / off99:.2f}x (by round: {rounds}): "
        f"{_mark(fast99 / off99 <= 1.3)}"
    )
    out.append(f"- req/s at saturation ≥ 1.0x the pass-through's: {sat:.2f}x: {_mark(sat >= 1.0)}")
    return out


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--rates", default="300,1000", help="open-loop offered rates, req/s")
    p.add_argument("--seconds", type=float, default=10.0, help="per cell (row, rate, round)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, row order alternating")
    p.add_argument("--no-pin", action="store_true", help="let every process use every CPU")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 3 s per cell")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 3.0
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y nginx wrk")
    res = uvloop.run(run(args))
    print()
    print("\n".join(report(args, res)))


if __name__ == "__main__":
    main()
