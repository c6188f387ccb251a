"""The mirror process's CPU per copy at a steady rate, alone: no worker, no production proxy.

    .venv/bin/python bench/mirror_rate.py [--rates 300,1000] [--seconds 20] [--rounds 3]
        [--tree DIR ...] [--naive]
    .venv/bin/python bench/mirror_rate.py --callgrind [--copies 600] [--callgrind-rate 30]
        [--token-counter off] [--tree DIR ...]
    .venv/bin/python bench/mirror_rate.py --idle [--seconds 15] [--rounds 5] [--tree DIR ...]
        [--naive]
    .venv/bin/python bench/mirror_rate.py --agent [--tool-check on,off] [--rates 300] ...

The mirror process (`gateway.mirror.plane.serve_plane`, real SQLite, the product's defaults:
registry poll every 2 s, counters flushed every 5 s; `--poll-s S` sets both, as bench/core.py's
`canary serve` runs them at 1 s, which costs an idle mirror process 5.7 ms of CPU a second
against 3.7 with the defaults, 2026-12-06; before that day this script ran them at 1 s) runs
with one fast candidate at 100 % (nginx `return 200` with a tiny chat completion). This script
plays the worker on the plane's Unix socket, open loop at each rate: per request one write with
the COPY frame and production's RESULT frame (what the worker's 2 ms coalescing writes at these
rates: production answers well within it). The CPU the mirror process used (/proc utime +
stime) over `--seconds`, counted until its counters say every copy is observed, per copy.

`--naive` adds the floor of the mirror's job in this stack, as the minimal aiohttp pass-through
is the worker's (bench/overhead.py): a naive mirror process (`NAIVE`, below) that reads the same
frames from the same socket and, per copy, POSTs the body to the candidate through an aiohttp
`ClientSession`, reads the answer, and stores three rows (the exchange, production's and the
candidate's observation: a few columns each, from a JSON decode of the request and of the answer)
with aiosqlite `executemany` every 0.5 s into the same schema. No ring, budget, dedup, meter,
timeouts, accounting, counters table, registry or split watch: what is left is the part of a copy
no mirror can skip (two wake-ups, an HTTP exchange, three rows), done the plain way.

`--tree` (repeatable) runs the same measure against other source trees (a `git archive` of
another commit), interleaved round by round with this one, row order alternating: an A/B in
one run, on the same host, nginx and database settings. Without the worker and the production
path bench/core.py measures beside it, the spread from round to round is smaller, so a change
of a few µs per copy shows. The mirror process is pinned to CPU 0, nginx and this script to
CPU 1 (`--no-pin`: anywhere). A benchmark, not a test: the rates assert nothing. With
`--naive` the last table pairs each tree with the naive mirror round by round: the ratio of
each round, their geometric mean and its 95 % t-interval on the log ratios, and n. A cell's
CPU per copy moves by ±10 % from round to round on a shared 2-vCPU host, and the two cells of
one round move together: the paired interval says whether a ratio is told apart from 1.0.

`--idle` measures the background instead: each tree's mirror process (and the naive) gets 100
copies, then nothing; `IDLE_SETTLE_S` after they are observed, its CPU over `--seconds` (every
thread's /proc schedstat, in ns: the clock ticks of /proc stat are 10 ms, too coarse for a few
ms a second), in ms a second: its timers, STATS frames, registry poll, counter flushes. At 300
copies a second each ms a second is 3.3 µs a copy.

`--callgrind` counts instructions instead of CPU time, which the neighbours on a shared host do
not move: this tree's mirror process (and each `--tree`'s), then the naive mirror, each alone
under `valgrind --tool=callgrind` (bench/mirror_instructions.py's way). `--warmup` copies, then
the counters are zeroed (`callgrind_control -z`), `--copies` copies are sent open loop at
`--callgrind-rate` per second (slow enough for valgrind to follow), and once all are observed
(the STATS frames' count) and `SETTLE_S` later (their rows written) dumped: raw instructions and
wall time. Zeroed again, `--idle-s` seconds with no copies, dumped: the background per second
(stats, registry poll and counter flushes, split watch; the naive's two timers). Net
instructions per copy = (raw - background/s x wall) / copies; the table gives raw and net and
their ratio mirror / naive. Settings: the mirror process as above, plus no overload shedding
(`mirror.shed_loop_lag_ms` 1e9, `mirror.shed_cpu_busy` 0: under valgrind it would shed copies).
The writer keeps its 0.5 s timer (`storage.writer_flush_interval_s`, the default) because the
naive flushes every 0.5 s too: at the same paced rate both write the same batches (15 copies
at 30/s), so the commit's share of a copy is the same in both rows (larger than at 300-1,000/s,
where batches are bigger). That holds only while the process keeps up: one that falls behind
(valgrind is 50 times slower, the host's neighbours take its CPU) gets copies in bursts, with
more connections and bigger batches, and other counts (a naive row went from 547K to 687K per
copy on a host at load 5-7), so a row fails if its backlog at a STATS frame passes
`--max-lag-s` seconds of copies: lower the rate. It fails too unless every copy is observed,
the mirror's accounting row adds up with every copy observed_ok, and each database holds one
exchange and two observations per copy (warm-up included).

`--agent` makes the copies an agent's (bench/mirror_agent.py): each request declares three
functions with JSON-Schema parameters and `tool_choice: "auto"`, streamed; production's RESULT
is the worker's meter on a streamed answer with `tool_calls` deltas (id, name, argument
fragments; one copy in five with two parallel calls), and nginx streams the candidate's, one in
ten with arguments that break the schema; its `/tokenize` answers, so the token counter counts
every call. `--tool-check on,off` (implies `--agent`) runs each cell with `mirror.tool_check`
true and false, interleaved round by round like the trees (row order alternating), and adds a
table pairing on with off by round: the ratio's geometric mean, its 95 % t-interval and n,
the cost of judging every arm's tool calls (the schema compiled once, then validated per call).
The verdicts each row stored (last round, warm-up included) are printed: off stores none. Off
still parses each request's declaration (`CallJudge.declared`, when its copy is accepted), so
the ratio is the judging, not the declaration's parse. Not with `--naive` (it reads a whole JSON
answer) nor `--callgrind`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import scipy.stats

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mirror_agent
from mirror_instructions import (  # siblings, found through sys.path
    CANDIDATE,
    PLANE_TEMPLATE,
    Setup,
    Worker,
    _check,
    _connect,
    _observed,
    _stop,
    _total,
    callgrind_prefix,
    copy_frames,
    dump,
    idle_dump,
    less_background,
    zero,
)
from overhead import ROOT


def plane_script(
    token_counter: str, poll_s: float | None, callgrind: bool, tool_check: bool = True
) -> str:
    """The mirror process's script: the product's defaults, but for the token counter, the
    registry poll and counters flush intervals when `poll_s` is given (bench/core.py's and
    bench/plane.py's `canary serve` run both at 1 s), `mirror.tool_check` and, under valgrind,
    no shedding."""
    overrides = f'"mirror.token_counter": {json.dumps(token_counter)},'
    if not tool_check:  # the product's default is true: the usual script is left as it was
        overrides += ' "mirror.tool_check": False,'
    if poll_s is not None:
        overrides += (
            f' "storage.registry_poll_interval_s": {poll_s!r},'
            f' "storage.counters_flush_interval_s": {poll_s!r},'
        )
    if callgrind:
        overrides += " " + CALLGRIND_OVERRIDES
    return PLANE_TEMPLATE.format(overrides=overrides)


# The naive mirror (`--naive`): same argv as the plane script; STATS frames carry its one counter.
NAIVE = """
import asyncio, os, signal, sys, time
import aiohttp, aiosqlite, msgspec, uvloop, xxhash
from gateway.mirror.channel import frames
socket_path, db_url, live, cand = sys.argv[1:5]
decode_copy = msgspec.msgpack.Decoder(frames.CopyMeta).decode
decode_result = msgspec.msgpack.Decoder(frames.ResultMeta).decode
encode = msgspec.msgpack.Encoder().encode
EXCHANGE = ("INSERT INTO exchanges (id, received_at, route, model, stream, turn_index, "
            "request_hash, json_requested, tools_requested, replica, targets) "
            "VALUES (?, ?, ?, ?, ?, 0, ?, 0, 0, ?, ',fast,')")
OBSERVATION = ("INSERT INTO observations (exchange_id, endpoint, arm, started_at, status, "
               "ttft_s, e2e_s, finished, inter_event_count, output_tokens, finish_reason, "
               "output_text, text_truncated) VALUES (?, ?, ?, ?, ?, ?, ?, 1, 0, ?, ?, ?, 0)")
exchanges, observations, observed, conns = [], [], 0, set()

async def one_copy(session, m, body):
    global observed
    doc = msgspec.json.decode(body)
    exchanges.append((m.exchange_id, m.received_at, m.path_qs, doc.get("model"),
                      bool(doc.get("stream")), xxhash.xxh3_128_hexdigest(body), m.worker))
    started, t0 = time.time(), time.perf_counter()
    async with session.post(cand + m.path_qs, data=body,
                            headers={"Content-Type": "application/json"}) as resp:
        data = await resp.read()
        status = resp.status
    e2e = time.perf_counter() - t0
    answer = msgspec.json.decode(data)
    choice = answer["choices"][0]
    observations.append((m.exchange_id, "fast", "candidate", started, status, e2e, e2e,
                         answer.get("usage", {}).get("completion_tokens"),
                         choice.get("finish_reason"), choice["message"]["content"]))
    observed += 1

def on_result(m):
    r = m.result
    observations.append((m.exchange_id, "live", "production", time.time(), r.status, r.ttft_s,
                         r.e2e_s, r.output_tokens, r.finish_reason, None))

class Conn(asyncio.Protocol):
    def __init__(self, session, tasks):
        self.session, self.tasks, self.buf = session, tasks, bytearray()
    def connection_made(self, transport):
        self.transport = transport
        conns.add(transport)
    def connection_lost(self, exc):
        conns.discard(self.transport)
    def data_received(self, data):
        self.buf += data
        head = frames.FRAME.size
        while len(self.buf) >= head:
            kind, mlen, blen = frames.FRAME.unpack_from(self.buf)
            if len(self.buf) < head + mlen + blen:
                break
            meta = bytes(self.buf[head:head + mlen])
            body = bytes(self.buf[head + mlen:head + mlen + blen])
            del self.buf[:head + mlen + blen]
            if kind == frames.KIND_COPY:
                task = asyncio.get_running_loop().create_task(
                    one_copy(self.session, decode_copy(meta), body))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif kind == frames.KIND_RESULT:
                on_result(decode_result(meta))

async def flush(db):
    while True:
        await asyncio.sleep(0.5)
        ex, exchanges[:] = exchanges[:], []
        ob, observations[:] = observations[:], []
        if ex or ob:
            await db.executemany(EXCHANGE, ex)
            await db.executemany(OBSERVATION, ob)
            await db.commit()

async def stats():
    while True:
        await asyncio.sleep(0.5)
        meta = encode(frames.StatsMeta(os.getpid(), "normal", {"fast": {"observed_ok": observed}},
                                       {}, {}, ""))
        for t in list(conns):
            t.write(frames.frame_header(frames.KIND_STATS, len(meta), 0) + meta)

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with aiosqlite.connect(db_url.split(":///", 1)[1]) as db, \\
            aiohttp.ClientSession() as session:
        await db.execute("PRAGMA synchronous = NORMAL")
        tasks = set()
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: Conn(session, tasks), socket_path)
        background = [asyncio.create_task(flush(db)), asyncio.create_task(stats())]
        stopped = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopped, *background],
                                     return_when=asyncio.FIRST_COMPLETED)
        server.close()
        for task in background:
            task.cancel()
        for task in done:
            task.result()  # a flush that failed (the schema moved on) ends the process, loudly

uvloop.run(main())
"""
NAIVE_ROW = Path("naive")  # the row's name in `trees`
Frames = Callable[[int], Iterator[bytes]]  # copy i's frames: `copy_frames` or the agent's


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _pace(worker: Worker, rate: float, n: int, frames: Frames = copy_frames) -> None:
    """`n` copies open loop at `rate` per second, one write each (COPY and RESULT frames)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(n):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        worker.writer.write(b"".join(frames(worker.sent)))
        worker.sent += 1


async def _until_observed(worker: Worker, n: int, timeout_s: float) -> int:
    """Copies observed once `n` are, or once `timeout_s` has passed (STATS every 0.5 s)."""
    deadline = time.monotonic() + timeout_s
    while (seen := _observed(await worker.fresh_stats())) < n and time.monotonic() < deadline:
        pass
    return seen


async def _drive(
    sock: str, pid: int, rate: float, seconds: float, frames: Frames
) -> tuple[float, int]:
    """Warm up, then `seconds` at `rate` copies/s: (mirror CPU s, copies observed)."""
    worker = await _connect(sock)
    await _pace(worker, rate, int(rate), frames)  # a second of warm-up
    await asyncio.sleep(1.0)
    before = _observed(await worker.fresh_stats())
    c0 = _cpu_s(pid)
    n = int(rate * seconds)
    await _pace(worker, rate, n, frames)
    await _until_observed(worker, before + n, 30)
    cpu = _cpu_s(pid) - c0
    observed = _observed(await worker.fresh_stats()) - before
    worker.task.cancel()
    worker.writer.close()
    return cpu, observed


def _start(
    setup: Setup, tree: Path, prefix: list[str], sock: str, db_url: str, check: bool = True
) -> subprocess.Popen[bytes]:
    """The mirror process of `tree` (or the naive one), `prefix` + its script's command line;
    `check`: `mirror.tool_check`."""
    naive = tree == NAIVE_ROW
    script = setup.tmp / "naive.py" if naive else setup.script if check else _off(setup)
    source = Path(ROOT) if naive else tree
    return subprocess.Popen(
        [*prefix, str(script), sock, db_url, setup.url, setup.url],
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _off(setup: Setup) -> Path:
    """The plane script with `mirror.tool_check` false, beside `setup.script`."""
    return setup.script.with_name("plane-tool-check-off.py")


def _verdicts(db_url: str) -> dict[str, int]:
    """Observations stored, by arm and tool_check verdict ("-": not judged)."""
    with contextlib.closing(sqlite3.connect(db_url.split(":///", 1)[1])) as db:
        rows = db.execute(
            "SELECT arm, coalesce(tool_check, '-'), count(*) FROM observations GROUP BY 1, 2"
        ).fetchall()
    return {f"{arm} {verdict}": n for arm, verdict, n in rows}


IDLE_SETTLE_S = 3.0  # `--idle`: after the warm-up's copies are observed, before the window


def _run_s(pid: int) -> float:
    """CPU time of every live thread of `pid` (schedstat: nanoseconds, not clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def idle_once(
    setup: Setup, row: tuple[Path, bool], seconds: float, pin: bool, frames: Frames
) -> float:
    """`--idle`: the mirror process's CPU in ms a second with no copies, after 100."""
    db_url, sock = setup.fresh()
    prefix = ["taskset", "-c", "0"] if pin else []
    proc = _start(setup, row[0], [*prefix, sys.executable], sock, db_url, row[1])

    async def drive() -> float:
        worker = await _connect(sock)
        await _pace(worker, 100, 100, frames)
        await _until_observed(worker, 100, 30)
        await asyncio.sleep(IDLE_SETTLE_S)
        c0 = _run_s(proc.pid)
        await asyncio.sleep(seconds)
        used = _run_s(proc.pid) - c0
        worker.task.cancel()
        worker.writer.close()
        return used

    try:
        return asyncio.run(drive()) * 1e3 / seconds
    finally:
        _stop(proc)


def run_once(
    setup: Setup, row: tuple[Path, bool], rate: float, seconds: float, pin: bool, frames: Frames
) -> tuple[float, dict[str, int]]:
    """One cell: (mirror CPU µs per copy, the observations stored by arm and verdict)."""
    tree, check = row
    db_url, sock = setup.fresh()
    prefix = ["taskset", "-c", "0"] if pin else []
    proc = _start(setup, tree, [*prefix, sys.executable], sock, db_url, check)
    try:
        cpu, observed = asyncio.run(_drive(sock, proc.pid, rate, seconds, frames))
    finally:
        _stop(proc)
    if observed < rate * seconds:
        print(f"  ({tree.name}: {observed} of {int(rate * seconds)} copies observed)")
    return cpu * 1e6 / max(observed, 1), _verdicts(db_url)


# `--callgrind`: valgrind slows the loop down 50-fold; no overload shedding, every copy is sent.
CALLGRIND_OVERRIDES = '"mirror.shed_loop_lag_ms": 1e9, "mirror.shed_cpu_busy": 0,'
SETTLE_S = 2.0  # after the last copy is observed: its rows written (0.5 s timers) in the window


def _rows(db_url: str) -> tuple[int, int]:
    """(exchanges, observations) stored in the SQLite file of `db_url`."""
    with contextlib.closing(sqlite3.connect(db_url.split(":///", 1)[1])) as db:
        (exchanges,) = db.execute("SELECT count(*) FROM exchanges").fetchone()
        (observations,) = db.execute("SELECT count(*) FROM observations").fetchone()
    return exchanges, observations


def callgrind_once(setup: Setup, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One row under callgrind: raw and net instructions per copy, the background per second."""
    db_url, sock = setup.fresh()
    out = setup.tmp / f"callgrind.{tree.name}"
    proc = _start(setup, tree, callgrind_prefix(out), sock, db_url)
    rate, expect = args.callgrind_rate, args.warmup + args.copies
    backlog = [0]

    async def drive() -> dict[str, Any]:
        worker = await _connect(sock)  # valgrind's start: minutes (the wait is up to 10 min)
        await _pace(worker, rate, args.warmup)
        warm = await _until_observed(worker, args.warmup, args.wait_s)
        assert warm == args.warmup, f"{tree.name}: warm-up {warm} of {args.warmup} observed"
        await asyncio.sleep(SETTLE_S)  # the warm-up's last rows written before the window
        zero(proc.pid)
        t0 = time.monotonic()
        watch = asyncio.get_running_loop().create_task(_watch_backlog(worker, backlog))
        await _pace(worker, rate, args.copies)
        watch.cancel()
        seen = await _until_observed(worker, expect, args.wait_s)
        await asyncio.sleep(SETTLE_S)
        wall = time.monotonic() - t0
        run = dump(proc.pid, out)
        row = await worker.fresh_stats()
        idle, idle_wall = await idle_dump(proc.pid, out, args.idle_s)
        worker.task.cancel()
        worker.writer.close()
        return {"run": run, "wall": wall, "idle": idle, "idle_wall": idle_wall,
                "observed": seen - warm, "row": row}  # fmt: skip

    try:
        res = asyncio.run(drive())
    finally:
        _stop(proc)
    lag_s = backlog[0] / rate
    assert lag_s <= args.max_lag_s, (
        f"{tree.name} fell {lag_s:.1f} s behind (copies sent, not observed): bursts take other "
        f"paths (more connections, bigger batches); lower --callgrind-rate"
    )
    row = res["row"]
    if tree != NAIVE_ROW:  # the mirror's accounting row adds up, every copy sampled and sent
        _check(row, expect)
    ok = row.get("observed_ok", 0)
    assert ok == expect, f"{tree.name}: observed_ok {ok} of {expect} copies: {row}"
    assert res["observed"] == args.copies, f"{tree.name}: {res['observed']} of {args.copies}"
    stored = _rows(db_url)
    assert stored == (expect, 2 * expect), f"{tree.name}: (exchanges, observations) {stored}"
    total = _total(res["run"].read_text(errors="replace"))
    background, net = less_background(total, res["idle"], res["idle_wall"], res["wall"])
    n = res["observed"]
    return {"raw": total / n, "net": net / n, "background": background, "wall": res["wall"],
            "observed": n, "stored": stored, "lag_s": lag_s}  # fmt: skip


async def _watch_backlog(worker: Worker, worst: list[int]) -> None:
    """Until cancelled: the most copies sent and not yet observed at a STATS frame, in worst[0]
    (at the rate, one STATS period's worth and those in flight when the process keeps up)."""
    while True:
        row = await worker.fresh_stats()
        worst[0] = max(worst[0], worker.sent - _observed(row))


def callgrind_main(setup: Setup, trees: list[Path], args: argparse.Namespace) -> None:
    """`--callgrind`: each tree's mirror process and the naive mirror, one after the other."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y valgrind")
    load0, t0 = os.getloadavg()[0], time.monotonic()
    rows = [*trees, NAIVE_ROW] if NAIVE_ROW not in trees else trees
    results = {}
    for tree in rows:
        results[tree] = res = callgrind_once(setup, tree, args)
        print(f"{tree}: net {res['net'] / 1e3:,.1f}K instructions / copy, raw "
              f"{res['raw'] / 1e3:,.1f}K", flush=True)  # fmt: skip
    print(
        f"\nMachine: {os.cpu_count()} cores, load average {load0:.2f} -> "
        f"{os.getloadavg()[0]:.2f}; callgrind, {args.copies} copies at "
        f"{args.callgrind_rate:g}/s after {args.warmup} of warm-up, background over "
        f"{args.idle_s:g} s; candidate "
        f"'{CANDIDATE}' at 100 %; token_counter {args.token_counter}; "
        f"{time.monotonic() - t0:.0f} s in all\n"
    )
    print(
        "| mirror | copies observed | stored (exchanges, observations) | wall s | max lag s "
        "| background K instr/s | raw K instr/copy | net K instr/copy |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|"
    )
    label = {t: "naive mirror" if t == NAIVE_ROW else f"mirror process ({t})" for t in results}
    for tree, r in results.items():
        print(f"| {label[tree]} | {r['observed']} | {r['stored'][0]}, {r['stored'][1]} | "
              f"{r['wall']:.1f} | {r['lag_s']:.1f} | {r['background'] / 1e3:,.0f} | "
              f"{r['raw'] / 1e3:,.1f} | {r['net'] / 1e3:,.1f} |")  # fmt: skip
    naive = results[NAIVE_ROW]
    for tree, r in results.items():
        if tree != NAIVE_ROW:
            print(f"| {label[tree]} / naive | | | | | | {r['raw'] / naive['raw']:.2f}x | "
                  f"**{r['net'] / naive['net']:.2f}x** |")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="300,1000", help="copies per second, comma-separated")
    p.add_argument("--seconds", type=float, default=20.0, help="measured window per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tree", action="append", default=[], help="another source tree to compare")
    p.add_argument("--naive", action="store_true", help="add the naive mirror (the floor)")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument(
        "--idle",
        action="store_true",
        help="instead of the rates: each tree's CPU a second with no copies (after 100 and "
        f"{IDLE_SETTLE_S:g} s), over --seconds, every thread's schedstat",
    )
    p.add_argument(
        "--token-counter",
        default="auto",
        help='[mirror] token_counter: "auto" (the default: the candidate\'s /tokenize counts '
        'every answer\'s text, one more request per distinct text) or "off"',
    )
    p.add_argument(
        "--poll-s",
        type=float,
        help="[storage] registry_poll_interval_s and counters_flush_interval_s (default: the "
        "product's, 2 s and 5 s; bench/core.py runs both at 1 s)",
    )
    p.add_argument(
        "--agent",
        action="store_true",
        help="agent-shaped copies: tools declared, streamed tool calls on both arms "
        "(bench/mirror_agent.py)",
    )
    p.add_argument(
        "--tool-check",
        help="[mirror] tool_check values to run each cell with, comma-separated: on, off "
        "(default: on only); given, it implies --agent and pairs on with off by round",
    )
    g = p.add_argument_group("--callgrind: instructions per copy, this tree's against the naive")
    g.add_argument("--callgrind", action="store_true", help="instead of the CPU rates")
    g.add_argument("--copies", type=int, default=600, help="measured copies per row")
    g.add_argument("--warmup", type=int, default=100, help="copies before the counters are zeroed")
    g.add_argument("--callgrind-rate", type=float, default=30.0, help="copies per second")
    g.add_argument("--max-lag-s", type=float, default=2.0, help="fail if a row falls behind more")
    g.add_argument("--idle-s", type=float, default=10.0, help="background measure (seconds)")
    g.add_argument("--wait-s", type=float, default=600.0, help="longest wait for the copies")
    args = p.parse_args()
    checks = _tool_checks(p, args)
    pin = not args.no_pin and not args.callgrind
    if pin:
        os.sched_setaffinity(0, {1})
    trees = [Path(ROOT), *(Path(t).resolve() for t in args.tree)]
    rows = [(tree, check) for tree in trees for check in checks]
    if args.naive:
        trees.append(NAIVE_ROW)
        rows.append((NAIVE_ROW, True))
    label = {row: _label(row, checks) for row in rows}
    frames: Frames = mirror_agent.copy_frames if args.agent else copy_frames
    rates = [float(r) for r in args.rates.split(",")]
    results: dict[tuple[float, str], list[float]] = {}
    verdicts: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        setup = mirror_agent.AgentSetup(Path(tmp)) if args.agent else Setup(Path(tmp))
        setup.script.write_text(plane_script(args.token_counter, args.poll_s, args.callgrind))
        _off(setup).write_text(plane_script(args.token_counter, args.poll_s, args.callgrind, False))
        (setup.tmp / "naive.py").write_text(NAIVE)
        if args.callgrind:
            try:
                callgrind_main(setup, trees, args)
            finally:
                setup.procs.stop()
            return
        print(f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
        try:
            for rnd in range(args.rounds):
                order = rows if rnd % 2 == 0 else rows[::-1]
                if args.idle:
                    for row in order:
                        ms = idle_once(setup, row, args.seconds, pin, frames)
                        results.setdefault((0.0, label[row]), []).append(ms)
                        print(f"r{rnd} idle {label[row]}: {ms:.2f} ms CPU/s", flush=True)
                    continue
                for rate in rates:
                    for row in order:
                        us, verdicts[label[row]] = run_once(
                            setup, row, rate, args.seconds, pin, frames
                        )
                        results.setdefault((rate, label[row]), []).append(us)
                        print(f"r{rnd} {rate:g}/s {label[row]}: {us:.0f} µs/copy", flush=True)
        finally:
            setup.procs.stop()
    print(
        f"\nload average {os.getloadavg()[0]:.2f} at the end; candidate '{CANDIDATE}' at 100 %; "
        f"token_counter {args.token_counter}; copies "
        f"{'agent-shaped (bench/mirror_agent.py)' if args.agent else 'a tiny chat completion'}\n"
    )
    if args.idle:
        print("| idle, after 100 copies | CPU ms a second (median) | by round |\n|---|---:|---|")
        for (_, tree), values in results.items():
            print(f"| {tree} | {statistics.median(values):.2f} | "
                  f"{', '.join(f'{v:.2f}' for v in values)} |")  # fmt: skip
        return
    print("| copies/s | tree | mirror CPU µs per copy (median) | by round |\n|---:|---|---:|---|")
    for (rate, tree), values in results.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {rate:g} | {tree} | {statistics.median(values):.0f} | {rounds} |")
    if args.naive:
        print(paired_table(results, rates, [label[r] for r in rows if r[0] != NAIVE_ROW]))
    if len(checks) > 1:
        print(tool_check_table(results, rates, [str(t) for t in trees if t != NAIVE_ROW]))
    if args.agent:
        print("\nObservations stored by arm and tool_check (last round, warm-up included):")
        for name, counts in verdicts.items():
            print(f"- {name}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))


def _tool_checks(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[bool]:
    """`--tool-check`'s values in order (default: on only); given, it sets `--agent`."""
    if args.tool_check is None:
        checks = [True]
    else:
        words = [w.strip() for w in args.tool_check.split(",")]
        if not words or any(w not in ("on", "off") for w in words) or len(set(words)) < len(words):
            p.error(f"--tool-check takes on, off or on,off (each once), not {args.tool_check!r}")
        checks = [w == "on" for w in words]
        args.agent = True
    if args.agent and (args.naive or args.callgrind):
        p.error("--agent (or --tool-check) runs without --naive and --callgrind: the naive "
                "mirror reads a whole JSON answer, and the agent's candidate streams")  # fmt: skip
    return checks


def _label(row: tuple[Path, bool], checks: list[bool]) -> str:
    """A row's name in the tables: the tree, and its tool_check when several are run."""
    tree, check = row
    if tree == NAIVE_ROW or checks == [True]:
        return str(tree)
    return f"{tree}, tool_check {'on' if check else 'off'}"


def paired_ratio(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """The geometric mean of the round-by-round ratios a/b and its 95 % t-interval (on the
    log ratios: a round's cells ran back to back, so the host's drift over the run cancels in
    the ratio); None under 3 rounds."""
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True) if x > 0 and y > 0]
    if len(logs) < 3:
        return None
    mean = statistics.fmean(logs)
    half = scipy.stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _paired_line(rate: float, name: str, mine: list[float], base: list[float]) -> str:
    """One table line: the ratio of each round, their geometric mean [95 % CI] and n."""
    each = ", ".join(f"{x / y:.2f}" for x, y in zip(mine, base, strict=True))
    r = paired_ratio(mine, base)
    mean = "insufficient data (< 3 rounds)" if r is None else (
        f"**{r[0]:.2f}x** [{r[1]:.2f}, {r[2]:.2f}]"
    )  # fmt: skip
    return f"| {rate:g} | {name} | {each} | {mean} | {len(mine)} |"


def paired_table(
    results: dict[tuple[float, str], list[float]], rates: list[float], trees: list[str]
) -> str:
    """Each tree against the naive mirror, paired by round: the ratio, its interval and n."""
    out = [
        "\n| copies/s | tree | mirror / naive, per round | geometric mean [95 % CI] | n |",
        "|---:|---|---|---:|---:|",
    ]
    for rate in rates:
        naive = results[(rate, str(NAIVE_ROW))]
        out.extend(_paired_line(rate, tree, results[(rate, tree)], naive) for tree in trees)
    return "\n".join(out)


def tool_check_table(
    results: dict[tuple[float, str], list[float]], rates: list[float], trees: list[str]
) -> str:
    """Each tree's mirror CPU per copy with `mirror.tool_check` on against off, paired by
    round: µs per copy of each (median), the ratio on / off, its interval and n."""
    out = [
        "\n| copies/s | tree | µs/copy on | µs/copy off | on / off, per round "
        "| geometric mean [95 % CI] | n |",
        "|---:|---|---:|---:|---|---:|---:|",
    ]
    for rate in rates:
        for tree in trees:
            on = results[(rate, f"{tree}, tool_check on")]
            off = results[(rate, f"{tree}, tool_check off")]
            line = _paired_line(rate, tree, on, off)
            head, _, tail = line.partition(f" {tree} |")
            medians = f" {statistics.median(on):.0f} | {statistics.median(off):.0f} |"
            out.append(f"{head} {tree} |{medians}{tail}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
