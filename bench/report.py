#!/usr/bin/env python3
"""Benchmark: a report over millions of stored pairs (a benchmark, not a test).

Builds (once, cached) a database with the real schema holding N exchanges, each observed by
production, a candidate and a control, on SQLite (a file) or PostgreSQL (a database of its own),
then times the report in three ways, each in a fresh child process (so each peak RSS is its own):

- `rows`: the pairs built from the rows in one pass (`load_pairs(segmented=False)`), the way
  every report was built before report segments;
- `cold`: from segments, none stored yet: every closed span is built from the rows and stored
  (what the report process's background refresh does once, then a minute at a time);
- `warm`: from segments kept current (twice, the second is shown): what a report, the gate, a
  promotion or the live page costs in a running gateway.

Each prints the load and the build + render times (wall and CPU), pairs/s and peak RSS.

The data are realistic for the report's cost: half the requests at temperature 0 (2 % of
answers differ, so their texts are fetched), half at temperature 0.7 (every answer differs:
texts fetched, similarity on a subsample), 5 % asking for JSON, multi-turn sessions, 0.5 %
candidate failures, 1 % lost copies; texts of ~300 characters; 100 pairs a second.

    .venv/bin/python bench/report.py                     # 1,000,000 pairs, SQLite in $TMPDIR
    .venv/bin/python bench/report.py --pairs 10000000 --db /work/tmp-bench/report-10m.db
    .venv/bin/python bench/report.py --db-url postgresql+asyncpg://postgres@127.0.0.1/bench_1m
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import delete

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import load as store
from evaluators.pairs.spill import Spill, default_dir
from evaluators.report.build import build_report
from evaluators.report.render import render
from gateway.config.sections import ReportsConfig
from storage import queries
from storage.engine import make_engine, upgrade
from storage.models import ReportSegmentRow

WORDS = np.array(
    "the model returns a short answer about caching tokens and latency in batches while "
    "the scheduler keeps the queue warm for every request of the session".split()
)
CHUNK = 50_000


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _texts(rng: np.random.Generator, n: int) -> list[str]:
    words = WORDS[rng.integers(0, len(WORDS), (n, 50))]
    return [" ".join(row) for row in words]


def _obs_rows(
    rng: np.random.Generator,
    ids: list[str],
    t: np.ndarray,
    endpoint: str,
    arm: str,
    base_ttft: np.ndarray,
    base_tpot: np.ndarray,
    tokens: np.ndarray,
    texts: list[str],
    differs: np.ndarray,
    fail: np.ndarray,
) -> list[tuple[object, ...]]:
    n = len(ids)
    ttft = base_ttft * rng.lognormal(0, 0.1, n)
    tpot = base_tpot * rng.lognormal(0, 0.1, n)
    e2e = ttft + tpot * (tokens - 1)
    other = _texts(rng, int(differs.sum()))
    it = iter(other)
    rows = []
    for i in range(n):
        if fail[i]:
            rows.append((
                ids[i], endpoint, arm, t[i], 500, "http_5xx", None, None, None, None,
                0, None, None, None, None, None, None, None, None, False, 0, None,
                False, None, None,
            ))  # fmt: skip
            continue
        text = next(it) if differs[i] else texts[i]
        rows.append((
            ids[i], endpoint, arm, t[i], 200, None, 0.001, ttft[i], tpot[i], e2e[i],
            int(tokens[i]) - 1, tpot[i], tpot[i], 2 * tpot[i], int(tokens[i]), "bench:tokenize",
            "stop", text, f"{hash(text) & (2**64 - 1):032x}", False, 0, None,
            True, int(tokens[i]), int(tokens[i]),
        ))  # fmt: skip
    return rows


# The columns of `domain.records.ObservationRecord` these rows fill (the rest stay NULL): one
# event per token here, every answer counted by one tokenizer, its text delivered whole.
OBS_COLUMNS = (
    "exchange_id, endpoint, arm, started_at, status, error_kind, queue_wait_s, ttft_s, tpot_s, "
    "e2e_s, inter_event_count, inter_event_mean_s, inter_event_p50_s, inter_event_p99_s, "
    "output_tokens, token_counter, finish_reason, output_text, output_hash, text_truncated, "
    "cached_tokens, tool_calls, finished, token_events, usage_tokens"
)
OBS_SQL = (
    f"INSERT INTO observations ({OBS_COLUMNS}) "
    f"VALUES ({','.join('?' * len(OBS_COLUMNS.split(',')))})"
)
EX_SQL = (
    "INSERT INTO exchanges (id, received_at, route, model, stream, temperature, session_key, "
    "turn_index, request_hash, json_requested, tools_requested, replica, targets) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


Rows = list[tuple[object, ...]]


def _chunks(n: int, seed: int) -> Iterator[tuple[Rows, Rows]]:
    """(exchange rows, observation rows) in chunks of CHUNK exchanges."""
    rng = np.random.default_rng(seed)
    start = time.time() - n * 0.01 - 3600
    for lo in range(0, n, CHUNK):
        k = min(CHUNK, n - lo)
        ids = [f"{i:032x}" for i in range(lo, lo + k)]  # hex, like UUIDv7's random tail
        t = start + 0.01 * np.arange(lo, lo + k)
        temp0 = rng.random(k) < 0.5
        json_req = rng.random(k) < 0.05
        turn = rng.integers(0, 5, k)
        session = [f"{(i // 5) * 2654435761 % 2**64:032x}" for i in range(lo, lo + k)]
        targets = ",cand,ctrl,"
        ex = [
            (ids[i], float(t[i]), "/v1/chat/completions", "m", True,
             0.0 if temp0[i] else 0.7, session[i], int(turn[i]), "h", bool(json_req[i]), False,
             "r", targets)
            for i in range(k)
        ]  # fmt: skip
        texts = _texts(rng, k)
        for i in np.flatnonzero(json_req):
            texts[i] = json.dumps({"answer": texts[i][:40]})
        base_ttft = 0.2 * rng.lognormal(0, 0.5, k)
        base_tpot = 0.02 * rng.lognormal(0, 0.3, k)
        tokens = np.maximum(2, (120 * rng.lognormal(0, 0.4, k)).astype(int))
        none = np.zeros(k, dtype=bool)
        lost = rng.random(k) < 0.01
        rows = _obs_rows(rng, ids, t, "live", "production", base_ttft, base_tpot, tokens, texts,
                         none, none)  # fmt: skip
        for name in ("cand", "ctrl"):
            differs = ~temp0 | (rng.random(k) < 0.02)
            fail = rng.random(k) < (0.005 if name == "cand" else 0.001)
            arm_rows = _obs_rows(rng, ids, t, name, "candidate", base_ttft, base_tpot, tokens,
                                 texts, differs, fail)  # fmt: skip
            if name == "cand":
                arm_rows = [r for r, gone in zip(arm_rows, lost, strict=True) if not gone]
            rows += arm_rows
        yield ex, rows
        print(f"\r  built {lo + k:,}/{n:,} pairs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def build_database(url: str, n: int, seed: int = 7) -> None:
    """Create the schema with the migrations, then bulk-insert n exchanges with their arms."""
    asyncio.run(_register(url))
    if url.startswith("sqlite"):
        con = sqlite3.connect(url.split("///", 1)[1])
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=OFF")
        for ex, rows in _chunks(n, seed):
            with con:
                con.executemany(EX_SQL, ex)
                con.executemany(OBS_SQL, rows)
        con.execute("ANALYZE")
        con.close()
    else:
        asyncio.run(_copy_postgres(url, n, seed))


async def _copy_postgres(url: str, n: int, seed: int) -> None:
    """COPY the chunks into PostgreSQL (asyncpg's binary COPY), then ANALYZE."""
    import asyncpg

    con = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        ex_cols = EX_SQL.split("(", 1)[1].split(")", 1)[0].replace(" ", "").split(",")
        obs_cols = [c.strip() for c in OBS_COLUMNS.split(",")]
        for ex, rows in _chunks(n, seed):
            async with con.transaction():
                await con.copy_records_to_table("exchanges", records=ex, columns=ex_cols)
                await con.copy_records_to_table("observations", records=rows, columns=obs_cols)
        await con.execute("ANALYZE")
    finally:
        await con.close()


async def _register(url: str) -> None:
    await upgrade(url)
    engine = make_engine(url)
    try:
        await queries.create_endpoint(
            engine, Endpoint(name="live", url="http://l", role="live", price_per_hour_usd=8.0)
        )
        for name, kind, price in (("cand", "quantized", 4.0), ("ctrl", "control", 8.0)):
            ep = Endpoint(name=name, url="http://c", kind=kind, price_per_hour_usd=price)
            await queries.create_endpoint(engine, ep)
        await queries.upsert_counters(
            engine, "bench", {"cand": {"sampled": 10**9, "observed_ok": 10**9}}
        )
    finally:
        await engine.dispose()


async def run(url: str, phase: str, batch_size: int, spill: Spill | None) -> dict[str, float | str]:
    """One phase (rows, cold, warm) in this process: load the pairs, build and render."""
    await upgrade(url)  # a database built before report segments gains their table
    engine = make_engine(url)
    try:
        if phase == "cold":
            async with engine.begin() as conn:
                await conn.execute(delete(ReportSegmentRow.__table__))
        cand, live, control = await store.load_endpoints(engine, "cand")
        rounds = 2 if phase == "warm" else 1
        for _ in range(rounds):
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            ps = await store.load_pairs(
                engine,
                "cand",
                since=0.0,
                batch_size=batch_size,
                control="ctrl",
                segmented=phase != "rows",
                spill=spill,
            )
            accounting = await store.load_accounting(engine, "cand")
            t1, c1 = time.perf_counter(), time.process_time()
            report = build_report(
                ps,
                candidate=cand,
                live=live,
                control=control,
                accounting=accounting,
                settings=VerdictSettings(),
            )
            text = render(report, "text")
            t2, c2 = time.perf_counter(), time.process_time()
            ps_backed = ps.backing is not None
            del ps
    finally:
        await engine.dispose()
    return {
        "pairs": float(report.pairs.n + report.pairs.lost + report.pairs.pending),
        "verdict": report.verdict,
        "lines": float(len(text.splitlines())),
        "load_s": t1 - t0,
        "report_s": t2 - t1,
        "total_s": t2 - t0,
        "load_cpu_s": c1 - c0,
        "report_cpu_s": c2 - c1,
        "total_cpu_s": c2 - c0,
        "load_avg": os.getloadavg()[0],
        "peak_rss_mb": peak_mb(),
        "spilled": "file" if ps_backed else "heap",
    }


def _phase(url: str, phase: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", phase, "--db-url", url]
    cmd += ["--batch-size", str(args.batch_size), "--spill-over-bytes", str(args.spill_over_bytes)]
    if args.spill_dir:
        cmd += ["--spill-dir", args.spill_dir]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _built(url: str, marker: Path | None, pairs: int) -> bool:
    if marker is not None:
        return marker.exists() and marker.read_text().strip() == str(pairs)
    import asyncpg

    async def count() -> int | None:
        try:
            con = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        except asyncpg.InvalidCatalogNameError:
            return None
        try:
            return int(await con.fetchval("SELECT count(*) FROM exchanges"))
        except asyncpg.UndefinedTableError:
            return None
        finally:
            await con.close()

    return asyncio.run(count()) == pairs


def _create_postgres(url: str) -> None:
    """Drop and create the database the URL names (on the same server)."""
    import asyncpg

    base, name = url.replace("postgresql+asyncpg://", "postgresql://").rsplit("/", 1)

    async def go() -> None:
        con = await asyncpg.connect(base + "/postgres")
        try:
            await con.execute(f'DROP DATABASE IF EXISTS "{name}"')
            await con.execute(f'CREATE DATABASE "{name}"')
        finally:
            await con.close()

    asyncio.run(go())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument(
        "--db", type=Path, default=Path(tempfile.gettempdir()) / "canary-bench" / "report.db",
        help="the SQLite file (built once per --pairs)",
    )  # fmt: skip
    parser.add_argument("--db-url", help="a PostgreSQL database URL instead of --db")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--phases", default="rows,cold,warm", help="which phases to time")
    parser.add_argument(
        "--spill-over-bytes", type=int, default=ReportsConfig().spill_over_bytes,
        help="segmented windows with more bytes of columns go to a file, as the gateway's "
        "[reports] spill_over_bytes (default: its default); 0: never",
    )  # fmt: skip
    parser.add_argument("--spill-dir", help="where (default: the gateway's [reports] spill_dir)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the database")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    url = args.db_url or f"sqlite+aiosqlite:///{args.db}"
    if args.phase:  # a child: one phase, its result as the last line of JSON
        spill = (
            Spill(args.spill_dir or default_dir(url), args.spill_over_bytes)
            if args.spill_over_bytes > 0
            else None
        )
        print(json.dumps(asyncio.run(run(url, args.phase, args.batch_size, spill))))
        return 0
    if args.build_only:  # in a child process, so its memory does not count in the report's
        build_database(url, args.pairs)
        return 0
    marker = None if args.db_url else args.db.with_suffix(".pairs")
    if args.rebuild or not _built(url, marker, args.pairs):
        if marker is None:
            _create_postgres(url)
        else:
            for p in (args.db, Path(f"{args.db}-wal"), Path(f"{args.db}-shm")):
                p.unlink(missing_ok=True)
            args.db.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--build-only", "--pairs", str(args.pairs)]
        subprocess.run([*cmd, "--db-url", url], check=True)
        if marker is not None:
            marker.write_text(str(args.pairs))
        print(f"built {args.pairs:,} pairs in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    where = "PostgreSQL" if args.db_url else f"SQLite, {args.db}"
    print(f"report over {args.pairs:,} stored pairs ({where})")
    print(f"  machine load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at start")
    print("  phase   step             wall        CPU    pairs/s (wall)   peak RSS  verdict")
    for phase in args.phases.split(","):
        r = _phase(url, phase, args)
        n = r["pairs"]
        steps = (("load pairs", "load"), ("build + render", "report"), ("total", "total"))
        for label, key in steps:
            wall, cpu = r[f"{key}_s"], r[f"{key}_cpu_s"]
            tail = f"   {r['peak_rss_mb']:6.0f} MiB  {r['verdict']}" if key == "total" else ""
            tail += f" (columns on the {r['spilled']})" if tail else ""
            print(f"  {phase:<7} {label:<15} {wall:6.2f} s  {cpu:6.2f} s  {n / wall:>12,.0f}{tail}")
        print(f"          (load average {r['load_avg']:.1f} after this phase)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
