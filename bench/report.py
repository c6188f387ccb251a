#!/usr/bin/env python3
"""Benchmark: `canary report` over a million stored pairs (a benchmark, not a test).

Builds (once, cached by --db path) a SQLite database with the real schema holding N exchanges,
each observed by production, a candidate and a control, then times
`evaluators.pairs.load.load_pairs`
and `build_report` separately and prints a table: pairs/s, wall time, peak RSS, and the RSS
sampled while the rows stream in (it must stay flat: the rows go straight into preallocated
compact columns; nothing per pair is kept as a Python object).

The data are realistic for the report's cost: half the requests at temperature 0 (2 % of
answers differ, so their texts are fetched), half at temperature 0.7 (every answer differs:
texts fetched, similarity on a 20,000-pair subsample), 5 % asking for JSON, multi-turn
sessions, 0.5 % candidate failures, 1 % lost copies; texts of ~300 characters.

    .venv/bin/python bench/report.py                     # 1,000,000 pairs, DB cached in $TMPDIR
    .venv/bin/python bench/report.py --pairs 100000 --db /tmp/small.db
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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from domain.endpoint import Endpoint
from evaluators.judge.settings import VerdictSettings
from evaluators.pairs import load as store
from evaluators.report.build import build_report
from evaluators.report.render import render
from storage import queries
from storage.engine import make_engine, upgrade

WORDS = np.array(
    "the model returns a short answer about caching tokens and latency in batches while "
    "the scheduler keeps the queue warm for every request of the session".split()
)
CHUNK = 50_000


def rss_mb() -> float:
    """Resident anonymous memory (the heap: what this process allocated, not cached files)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    return float("nan")


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
            rows.append(
                (
                    ids[i],
                    endpoint,
                    arm,
                    t[i],
                    500,
                    "http_5xx",
                    None,
                    None,
                    None,
                    None,
                    0,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    False,
                    0,
                    None,
                )
            )
            continue
        text = next(it) if differs[i] else texts[i]
        rows.append((
            ids[i], endpoint, arm, t[i], 200, None, 0.001, ttft[i], tpot[i], e2e[i],
            int(tokens[i]) - 1, tpot[i], tpot[i], 2 * tpot[i], int(tokens[i]), "usage",
            "stop", text, f"{hash(text) & (2**64 - 1):032x}", False, 0, None,
        ))  # fmt: skip
    return rows


OBS_SQL = (
    "INSERT INTO observations (exchange_id, endpoint, arm, started_at, status, error_kind, "
    "queue_wait_s, ttft_s, tpot_s, e2e_s, itl_count, itl_mean_s, itl_p50_s, itl_p99_s, "
    "output_tokens, output_tokens_source, finish_reason, output_text, output_hash, "
    "text_truncated, cached_tokens, tool_calls) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)
EX_SQL = (
    "INSERT INTO exchanges (id, received_at, route, model, stream, temperature, session_key, "
    "turn_index, request_hash, json_requested, tools_requested, replica, targets) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def build_database(path: Path, n: int, seed: int = 7) -> None:
    """Create the schema with the migrations, then bulk-insert n exchanges with their arms."""
    url = f"sqlite+aiosqlite:///{path}"
    asyncio.run(_register(url))
    rng = np.random.default_rng(seed)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=OFF")
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
            (ids[i], t[i], "/v1/chat/completions", "m", True,
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
        with con:
            con.executemany(EX_SQL, ex)
            con.executemany(OBS_SQL, rows)
        print(f"\r  built {lo + k:,}/{n:,} pairs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    con.execute("ANALYZE")
    con.close()


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


async def run(path: Path, batch_size: int) -> dict[str, float]:
    url = f"sqlite+aiosqlite:///{path}"
    engine = make_engine(url)
    samples: list[tuple[int, float]] = []
    loaded = 0

    def progress(k: int) -> None:
        nonlocal loaded
        loaded += k
        samples.append((loaded, rss_mb()))

    try:
        gc.collect()
        rss0 = rss_mb()
        c0 = time.process_time()
        t0 = time.perf_counter()
        cand, live, control = await store.load_endpoints(engine, "cand")
        ps = await store.load_pairs(
            engine, "cand", since=0.0, batch_size=batch_size, progress=progress, control="ctrl"
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
    finally:
        await engine.dispose()
    tail = [rss for done, rss in samples if done >= 0.1 * loaded]
    return {
        "pairs": float(ps.n),
        "load_s": t1 - t0,
        "report_s": t2 - t1,
        "total_s": t2 - t0,
        "load_cpu_s": c1 - c0,
        "report_cpu_s": c2 - c1,
        "total_cpu_s": c2 - c0,
        "load_avg": os.getloadavg()[0],
        "rss_before_mb": rss0,
        "rss_stream_min_mb": min(tail),
        "rss_stream_max_mb": max(tail),
        "peak_rss_mb": peak_mb(),
        "pairset_mb": ps.nbytes / 2**20,
        "verdict_lines": float(len(text.splitlines())),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument(
        "--db", type=Path, default=Path(tempfile.gettempdir()) / "canary-bench" / "report.db"
    )
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument("--rebuild", action="store_true", help="rebuild the database")
    parser.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_only:  # in a child process, so its memory does not count in the report's
        build_database(args.db, args.pairs)
        return 0
    marker = args.db.with_suffix(".pairs")
    built = marker.read_text().strip() if marker.exists() and args.db.exists() else ""
    if args.rebuild or built != str(args.pairs):
        for p in (args.db, Path(f"{args.db}-wal"), Path(f"{args.db}-shm")):
            p.unlink(missing_ok=True)
        args.db.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        cmd = [sys.executable, __file__, "--build-only", "--pairs", str(args.pairs)]
        subprocess.run([*cmd, "--db", str(args.db)], check=True)
        marker.write_text(str(args.pairs))
        print(f"built {args.pairs:,} pairs in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    r = asyncio.run(run(args.db, args.batch_size))
    n = r["pairs"]
    print(f"canary report over {int(n):,} stored pairs (SQLite, {args.db})")
    print(f"  machine load average {r['load_avg']:.1f} on {os.cpu_count()} CPUs")
    print("                    wall        CPU    pairs/s (wall)")
    for label, key in (("load pairs", "load"), ("build + render", "report"), ("total", "total")):
        wall, cpu = r[f"{key}_s"], r[f"{key}_cpu_s"]
        print(f"  {label:<15} {wall:6.1f} s  {cpu:6.1f} s  {n / wall:>12,.0f}")
    print(f"  PairSet         {r['pairset_mb']:7.1f} MiB")
    print(
        f"  anonymous RSS   {r['rss_before_mb']:7.0f} MiB before, "
        f"{r['rss_stream_min_mb']:.0f}-{r['rss_stream_max_mb']:.0f} MiB while streaming "
        f"(10-100 % of rows); peak RSS {r['peak_rss_mb']:.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
