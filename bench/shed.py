"""Shedding that keeps capacity (issue 44): an open-loop sweep on one worker.

    .venv/bin/python bench/shed.py [--start 100] [--seconds 10] [--settle 4]
        [--delay-ms 20] [--concurrency 4] [--workers 1]

`canary serve --workers N` runs in front of a live endpoint that answers at once, with one
candidate at `sample_rate` 1.0 that answers after `--delay-ms`, `--concurrency` copies at once:
its capacity is set by the candidate (about concurrency / delay copies a second), so a Python
load generator on a shared 2-core host can offer twice it. Both upstreams run in a child
process of their own (uvloop); the load runs here, open loop (requests on a fixed schedule over
32 keep-alive connections, whatever the answers take). The loop guard is left at its defaults;
the mirror process runs at normal priority (on a shared host SCHED_IDLE measures the others).

1. Sweep: offered requests (= copies) per second from `--start` up in steps of 10 %, each for
   `--seconds`, measured after `--settle`: the copies the candidate received per second against
   the copies offered. The capacity is the highest offered rate that keeps >= 99 %.
2. Overload: 1.5x and 2x that capacity: copies kept per second against those kept at capacity
   (target >= 90 %), the worker's shed and overflow counts, production's p99.
3. Mirroring off (no candidate) at 2x: production's p99, against step 2's.

A benchmark, not a test: it asserts nothing. It prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.upstreams import free_port  # noqa: E402

ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
CLIENTS = 32


def _upstreams(live_port: int, cand_port: int, delay_s: float) -> None:
    """The child process: live (answers at once) and the candidate (after `delay_s`)."""
    import uvloop

    count = [0]

    async def live(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    async def candidate(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(delay_s)
        count[0] += 1
        return web.json_response(ANSWER)

    async def counted(request: web.Request) -> web.Response:
        return web.json_response({"copies": count[0]})

    async def main() -> None:
        runners = []
        for port, routes in (
            (live_port, [web.post("/v1/chat/completions", live)]),
            (cand_port, [web.post("/v1/chat/completions", candidate), web.get("/count", counted)]),
        ):
            app = web.Application()
            app.add_routes(routes)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runners.append(runner)
        await asyncio.Event().wait()

    uvloop.run(main())


async def _serve(tmp: Path, config: Path, live_port: int, workers: int) -> tuple[object, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli.main", "serve",
        "--listen", f"127.0.0.1:{port}", "--db", f"sqlite+aiosqlite:///{tmp / 'canary.db'}",
        "--workers", str(workers), "--config", str(config), "--insecure-admin",
        "--live", f"http://127.0.0.1:{live_port}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as http:
        for _ in range(1200):
            try:
                async with http.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return proc, url
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("canary serve did not become ready")


async def _copies(cand_url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(cand_url + "/count") as resp:
        return int((await resp.json())["copies"])


async def _metrics(url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as resp:
        text = await resp.text()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


async def _step(
    url: str, cand_url: str | None, rps: float, seconds: float, settle: float
) -> dict[str, float]:
    """Offer `rps` for `seconds`; copies kept per second and production latencies measured
    over [settle, seconds]."""
    start = time.monotonic()
    sent_in_window = [0]
    lat: list[float] = []
    n = int(rps * seconds)
    marks: dict[str, int] = {}

    async def client(idx: int) -> None:
        async with aiohttp.ClientSession() as http:
            for i in range(idx, n, CLIENTS):
                due = start + i / rps
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                t0 = time.monotonic()
                async with http.post(
                    url + "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": f"{start} {i}"}]},
                    headers={"X-Request-ID": f"{start}-{i}"},
                ) as resp:
                    await resp.read()
                if due - start >= settle:
                    sent_in_window[0] += 1
                    lat.append(time.monotonic() - t0)

    async def mark() -> None:
        if cand_url is None:
            return
        await asyncio.sleep(max(0.0, start + settle - time.monotonic()))
        marks["a"] = await _copies(cand_url)
        await asyncio.sleep(max(0.0, start + seconds - time.monotonic()))
        marks["b"] = await _copies(cand_url)

    await asyncio.gather(mark(), *(client(c) for c in range(CLIENTS)))
    window = seconds - settle
    lat.sort()
    kept = (marks["b"] - marks["a"]) / window if cand_url else 0.0
    offered = sent_in_window[0] / window
    return {
        "target": rps,
        "offered": offered,
        "kept": kept,
        "ratio": kept / offered if offered else 0.0,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
    }


def _config(path: Path, cand_port: int | None, concurrency: int) -> None:
    text = "counters_flush_interval_s = 1.0\nregistry_poll_interval_s = 1.0\n"
    text += 'mirror_priority = "normal"\n'  # SCHED_IDLE on a shared host measures the others
    if cand_port is not None:
        text += (
            f"[[candidates]]\nname = 'c'\nurl = 'http://127.0.0.1:{cand_port}'\n"
            f"sample_rate = 1.0\nconcurrency = {concurrency}\nbuffer_max_items = 1000\n"
        )
    path.write_text(text)


async def main(args: argparse.Namespace) -> None:
    live_port, cand_port = free_port(), free_port()
    ups = multiprocessing.Process(
        target=_upstreams, args=(live_port, cand_port, args.delay_ms / 1000), daemon=True
    )
    ups.start()
    cand_url = f"http://127.0.0.1:{cand_port}"
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        config = tmp / "on.toml"
        _config(config, cand_port, args.concurrency)
        proc, url = await _serve(tmp, config, live_port, args.workers)
        try:
            rps, capacity = args.start, None
            while True:
                row = await _step(url, cand_url, rps, args.seconds, args.settle)
                rows.append(("sweep", row))
                print(f"sweep {row}", file=sys.stderr, flush=True)
                if row["ratio"] < 0.99:
                    break
                capacity = row
                rps *= 1.1
            if capacity is None:
                raise SystemExit("not even the first step kept 99 %: lower --start")
            before = await _metrics(url)
            for factor in (1.5, 2.0):
                row = await _step(
                    url, cand_url, capacity["target"] * factor, args.overload_seconds, args.settle
                )
                rows.append((f"{factor}x", row))
                print(f"{factor}x {row}", file=sys.stderr, flush=True)
            after = await _metrics(url)
        finally:
            proc.terminate()  # type: ignore[attr-defined]
            await proc.wait()  # type: ignore[attr-defined]
        off_dir = tmp / "off"
        off_dir.mkdir()
        off = off_dir / "off.toml"
        _config(off, None, args.concurrency)
        proc, url = await _serve(off_dir, off, live_port, args.workers)
        try:
            row = await _step(url, None, capacity["target"] * 2.0, args.overload_seconds, 0.0)
            rows.append(("off 2x", row))
        finally:
            proc.terminate()  # type: ignore[attr-defined]
            await proc.wait()  # type: ignore[attr-defined]
    ups.terminate()

    key = 'canary_mirror_handoff_dropped_total{candidate="c",reason="%s"}'
    print(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs, workers {args.workers}")
    print(
        "| step | offered copies/s | kept copies/s | kept | kept vs at capacity | p50 ms | p99 ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, row in rows:
        vs = row["kept"] / capacity["kept"] if name != "off 2x" else float("nan")
        print(
            f"| {name} | {row['offered']:.0f} | {row['kept']:.0f} | {row['ratio']:.1%} | "
            f"{vs:.0%} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} |"
        )
    for reason in ("shed_overload", "dropped_overflow"):
        got = after.get(key % reason, 0.0) - before.get(key % reason, 0.0)
        print(f"worker {reason} during the overload steps: {got:.0f}")
    mirror_keys = [k for k in after if k.startswith("canary_mirror_copies_total")]
    for k in mirror_keys:
        print(f"{k}: {after[k] - before.get(k, 0.0):.0f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--start", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--overload-seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
