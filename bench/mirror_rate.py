"""The mirror process's CPU per copy at a steady rate, alone: no worker, no production proxy.

    .venv/bin/python bench/mirror_rate.py [--rates 300,1000] [--seconds 20] [--rounds 3]
        [--tree DIR ...] [--naive]

The mirror process (`gateway.mirror.plane.serve_plane`, real SQLite, the priority and settings
bench/core.py's `canary serve` runs it with: registry poll and counter flush every second) runs
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
CPU 1 (`--no-pin`: anywhere). A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
               "ttft_s, e2e_s, itl_count, output_tokens, finish_reason, output_text, "
               "text_truncated) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, 0)")
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
        await stop.wait()
        server.close()
        for task in background:
            task.cancel()

uvloop.run(main())
"""
NAIVE_ROW = Path("naive")  # the row's name in `trees`


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
    naive = tree == NAIVE_ROW
    script = setup.tmp / "naive.py" if naive else setup.script
    source = Path(ROOT) if naive else tree
    proc = subprocess.Popen(
        [*prefix, sys.executable, str(script), sock, db_url, setup.url, setup.url],
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)},
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
    p.add_argument("--naive", action="store_true", help="add the naive mirror (the floor)")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument(
        "--token-counter",
        default="auto",
        help='[mirror] token_counter: "auto" (the default: the candidate\'s /tokenize counts '
        'every answer\'s text, one more request per distinct text) or "off"',
    )
    args = p.parse_args()
    pin = not args.no_pin
    if pin:
        os.sched_setaffinity(0, {1})
    trees = [Path(ROOT), *(Path(t).resolve() for t in args.tree)]
    if args.naive:
        trees.append(NAIVE_ROW)
    rates = [float(r) for r in args.rates.split(",")]
    print(f"Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start")
    results: dict[tuple[float, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        setup = Setup(Path(tmp))
        counter = f'"mirror.token_counter": {json.dumps(args.token_counter)},'
        setup.script.write_text(
            PLANE.replace('"storage.registry_poll', counter + ' "storage.registry_poll')
        )
        (setup.tmp / "naive.py").write_text(NAIVE)
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
    print(
        f"\nload average {os.getloadavg()[0]:.2f} at the end; candidate '{CANDIDATE}' at 100 %; "
        f"token_counter {args.token_counter}\n"
    )
    print("| copies/s | tree | mirror CPU µs per copy (median) | by round |\n|---:|---|---:|---|")
    for (rate, tree), values in results.items():
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {rate:g} | {tree} | {statistics.median(values):.0f} | {rounds} |")


if __name__ == "__main__":
    main()
