"""What the mirror's split-session watch costs per copy, on a store holding a full window.

    .venv/bin/python bench/split_watch.py [--rate 1000] [--window 300] [--checks 6]

A real SQLite file (the embedded default, schema by migration) is filled with `--window`
seconds of exchanges at `--rate` per second, as one mirror process stores them (every
exchange under its replica, six-turn sessions with a session key). Then `SplitWatch.check()`
(gateway/mirror/replay/splits.py) runs as the mirror process runs it: the first check of a
new watch reads the whole window (what every check read before the watch became incremental);
each following check comes `every_s` (5 s, the default `counters_flush_interval_s`) later,
after that many seconds of exchanges more are stored, each also told to the watch as the mirror
process tells it (`SplitWatch.stored`, the sessions this replica stored), and reads the other
replicas' rows among those, less `LATE_S` (here: none, one replica). CPU of the whole process
(the driver's thread included) per check, and per copy at `--rate` (a check's CPU / the copies
stored between two checks), and what `stored` costs per copy. A benchmark, not a test: it
asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncEngine

from domain.records import ExchangeRecord
from gateway.mirror.replay.splits import SplitWatch
from storage.engine import ensure_schema, make_engine
from storage.models import ExchangeRow
from storage.textguard import exchange_row

TURNS = 6
EVERY_S = 5.0
REPLICA = "bench-mirror-1"


def _rows(first: int, n: int, start: float, rate: float) -> list[dict[str, object]]:
    return [
        exchange_row(
            ExchangeRecord(
                id=f"{i:036d}",
                received_at=start + i / rate,
                route="/v1/chat/completions",
                replica=REPLICA,
                session_key=f"{i // TURNS:032x}",
                turn_index=i % TURNS,
            )
        )
        for i in range(first, first + n)
    ]


async def _fill(engine: AsyncEngine, rows: list[dict[str, object]]) -> None:
    async with engine.begin() as conn:
        for at in range(0, len(rows), 10_000):
            await conn.execute(insert(ExchangeRow), rows[at : at + 10_000])


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{Path(tmp, 'canary.db')}"
        engine = make_engine(url)
        await ensure_schema(engine, url)
        n = int(args.rate * args.window)
        start = time.time() - args.window
        await _fill(engine, _rows(0, n, start, args.rate))
        print(f"store: {n:,} exchanges over {args.window:g} s at {args.rate:g}/s (SQLite)")
        print(
            "\n| check | reads | CPU ms | CPU µs per copy | `stored` µs per copy |"
            "\n|---|---|---:|---:|---:|"
        )
        watch = SplitWatch(engine, REPLICA, EVERY_S)
        step = int(args.rate * EVERY_S)
        last = time.time()
        for i in range(args.checks + 1):
            if i:
                # As the mirror runs: `every_s` later, with that many seconds of exchanges more
                # (stamped over those seconds; the watch reads by `received_at`).
                await asyncio.sleep(max(0.0, last + EVERY_S - time.time()))
                first = n + (i - 1) * step
                rows = _rows(first, step, time.time() - EVERY_S - first / args.rate, args.rate)
                await _fill(engine, rows)
                keys = [(str(r["session_key"]), float(r["received_at"])) for r in rows]  # type: ignore[arg-type]
                c0 = time.process_time()
                for key, at in keys:
                    watch.stored(key, at)
                told = (time.process_time() - c0) * 1e6 / step
            last = time.time()
            c0 = time.process_time()
            await watch.check()
            ms = (time.process_time() - c0) * 1e3
            what = (
                "the whole window (first check)"
                if i == 0
                else "other replicas' since the previous check"
            )
            tell = f"{told:.2f}" if i else "–"
            print(f"| {i} | {what} | {ms:.1f} | {ms * 1e3 / step:.1f} | {tell} |")
        await engine.dispose()
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="exchanges stored per second")
    parser.add_argument("--window", type=float, default=300.0, help="seconds of exchanges stored")
    parser.add_argument("--checks", type=int, default=6, help="incremental checks after the first")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
