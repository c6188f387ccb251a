"""Isolation benchmark: what mirroring costs production, and what a hung candidate costs it.

One run, every server in its own process on 127.0.0.1:

1. Latency (open loop, a fixed request rate, streamed chat answers from a jitter-free simulated
   engine): production p50/p99 and requests/s with mirroring off; on at 100 % to a fast
   candidate; on at 100 % to a hung candidate; and nginx's `mirror` module to the same hung
   candidate.
2. Throughput (closed loop, the live engine answering with no delay): requests/s with mirroring
   off, and on at 100 % to a fast candidate.
3. Memory: gateway RSS over 60 s of overload with 100 KB prompts, mirrored at 100 % to a hung
   candidate through a 1 MiB `mirror_memory_budget_bytes`.

Usage: `python bench/isolation.py [--quick] [--nice -20] [--pin]` (nginx on PATH for the nginx
row). Prints markdown tables, the ratios against the targets and every run's mirror counters;
results go in bench/RESULTS.md by hand. Scenarios are interleaved over `--rounds` so drift in a
shared host's background load falls on all of them alike; on a busy shared host run it with
`--nice -20` (as root) or the rows measure the host's scheduler rather than the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
_COPIES = re.compile(r'canary_mirror_copies_total\{candidate="([^"]+)",outcome="(\w+)"\} (\d+)')


# ---------------------------------------------------------------- child processes


async def _serve_sim(
    profile: str, time_scale: float, max_tokens: int, overhead_s: float | None = None
) -> None:
    from gateway.sim.profiles import get_profile
    from gateway.sim.server import start_sim

    # No jitter, no batch interference, a fixed answer length: the engine's latency is the same
    # for every request, so what varies between rows is the gateway. 100 KB prompts must fit.
    knobs: dict[str, Any] = {
        "time_scale": time_scale,
        "jitter": 0.0,
        "decode_s_per_extra_seq": 0.0,
        "max_model_len": 1 << 20,
    }
    if max_tokens:
        knobs.update(min_output_tokens=max_tokens, max_output_tokens=max_tokens)
    if overhead_s is not None:
        knobs["overhead_s"] = overhead_s  # a slow candidate: this TTFT on every answer
    sim = await start_sim(get_profile(profile, **knobs))
    print(f"READY {sim.url}", flush=True)
    await _until_signalled()
    await sim.close()


async def _serve_live(tokens: int, gap_s: float) -> None:
    """A stand-in engine with exactly the same answer and timing for every request: `tokens`
    SSE chunks `gap_s` apart (the simulator's latency model varies with load and prompt)."""
    from aiohttp import web

    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"tok "}}]}\n\n'
    tail = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(tokens):
            if gap_s:
                await asyncio.sleep(gap_s)
            await resp.write(chunk)
        await resp.write(tail)
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * MiB)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"READY http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    await _until_signalled()
    await runner.cleanup()


async def _serve_gateway(
    live: str, candidates: Sequence[str], rate: float, budget: int, priority: str, lag_ms: float
) -> None:
    """The product as `canary serve` runs it: worker + the host's mirror process + SQLite.
    `lag_ms` >= 1e6 turns the mirror process's overload guard off (neither loop lag nor CPU
    saturation sheds copies); below that the configured defaults apply."""
    guard_off = (
        {"mirror_shed_loop_lag_ms": lag_ms, "mirror_shed_cpu_busy": 0.0} if lag_ms >= 1e6 else {}
    )
    from gateway.config.load import load_config
    from gateway.process.runtime import running

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "live_url": live,
                "db_url": f"sqlite+aiosqlite:///{tmp}/bench.db",
                "mirror_memory_budget_bytes": budget,
                "drain_timeout_s": 0.5,
                "mirror_priority": priority,
                **guard_off,
                "candidates": [
                    {"name": name, "url": url, "sample_rate": rate, "timeout_s": 300.0}
                    for name, _, url in (c.partition("=") for c in candidates)
                ],
            },
        )
        async with running(cfg) as parts:
            print(f"READY {parts.url}", flush=True)
            await _until_signalled()


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class Proc:
    """A child process that prints `READY <url>` once it listens."""

    def __init__(self, argv: Sequence[str], cpu: int | None) -> None:
        self.popen = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=ROOT, text=True
        )
        if cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.popen.pid, {cpu})
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().split()
        if not line or line[0] != "READY":
            self.stop()
            raise RuntimeError(f"{argv} did not start")
        self.url = line[1]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def rss_bytes(self) -> int:
        return _rss(self.pid)

    def tree_pids(self) -> list[int]:
        """This process and its descendants (the mirror process of a plane gateway)."""
        return tree_pids(self.pid)

    def tree_rss_bytes(self) -> int:
        return tree_rss(self.pid)

    def tree_cpu_seconds(self) -> float:
        total = 0.0
        for pid in self.tree_pids():
            with contextlib.suppress(OSError):
                total += _cpu(pid)
        return total

    def cpu_seconds(self) -> float:
        return _cpu(self.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def tree_pids(root: int) -> list[int]:
    """`root` and its descendants, from /proc."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree_rss(root: int) -> int:
    """Resident memory of `root` and its descendants together, bytes."""
    total = 0
    for pid in tree_pids(root):
        with contextlib.suppress(OSError, IndexError):
            total += _rss(pid)
    return total


def _rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) * 1024


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _me(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


@contextlib.contextmanager
def sim(
    profile: str,
    time_scale: float = 1.0,
    cpu: int | None = None,
    max_tokens: int = 0,
    overhead_s: float | None = None,
) -> Iterator[Proc]:
    argv = ["--role", "sim", "--profile", profile, "--time-scale", str(time_scale)]
    if overhead_s is not None:
        argv += ["--overhead-s", str(overhead_s)]
    proc = Proc(_me(*argv, "--max-tokens", str(max_tokens)), cpu)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def live_engine(tokens: int, gap_s: float, cpu: int | None = None) -> Iterator[Proc]:
    argv = ["--role", "live", "--max-tokens", str(tokens), "--gap", str(gap_s)]
    proc = Proc(_me(*argv), cpu)
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def gateway(
    live: str,
    candidates: Sequence[str] = (),
    budget: int = 256 * MiB,
    cpu: int | None = None,
    lag_ms: float = 20.0,
    priority: str = "idle",
) -> Iterator[Proc]:
    argv = ["--role", "gateway", "--live", live, "--budget", str(budget), "--lag-ms", str(lag_ms)]
    argv += ["--priority", priority]
    for c in candidates:
        argv += ["--candidate", c]
    proc = Proc(_me(*argv), cpu)
    try:
        yield proc
    finally:
        proc.stop()


_NGINX_CONF = """
daemon off; master_process off; worker_processes 1; user root;
pid {dir}/nginx.pid; error_log {dir}/error.log error;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body; proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/f; uwsgi_temp_path {dir}/u; scgi_temp_path {dir}/s;
  client_max_body_size 64m; client_body_buffer_size 1m;
  upstream live {{ server {live}; keepalive 256; }}
  upstream cand {{ server {cand}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      mirror /mirror; mirror_request_body on;
      proxy_pass http://live; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
    location = /mirror {{
      internal;
      proxy_pass http://cand$request_uri; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_read_timeout 300s;
    }}
  }}
}}
"""


@contextlib.contextmanager
def nginx_mirror(live: str, cand: str, cpu: int | None = None) -> Iterator[str]:
    exe = shutil.which("nginx")
    if exe is None:
        raise FileNotFoundError("nginx")
    with tempfile.TemporaryDirectory() as tmp:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf = Path(tmp, "nginx.conf")
        strip = "http://"
        conf.write_text(
            _NGINX_CONF.format(
                dir=tmp, live=live.removeprefix(strip), cand=cand.removeprefix(strip), port=port
            )
        )
        popen = subprocess.Popen([exe, "-c", str(conf), "-p", tmp], stdin=subprocess.DEVNULL)
        if cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(popen.pid, {cpu})
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            popen.terminate()
            popen.wait(10)


# ---------------------------------------------------------------- load generation


def _body(i: int, pad: int = 400) -> bytes:
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"request {i}: " + "lorem ipsum " * (pad // 12)},
    ]
    return msgspec.json.encode({"model": "sim-model", "messages": msgs, "stream": True})


class Stats(msgspec.Struct):
    label: str
    n: int
    errors: int
    rps: float
    p50_ms: float
    p99_ms: float
    gw_cpu_ms_per_req: float = float("nan")  # gateway CPU time per request sent


class Sample(msgspec.Struct):
    """One load run: latencies of the measured requests and what it cost the gateway."""

    lat: list[float]
    errors: int
    elapsed: float
    sent: int  # warm-up included
    gw_cpu_s: float = 0.0


def pool(label: str, samples: Sequence[Sample]) -> Stats:
    """Stats over several interleaved runs of one scenario, latencies pooled."""
    lat = sorted(x for s in samples for x in s.lat)
    errors = sum(s.errors for s in samples)
    elapsed = sum(s.elapsed for s in samples)
    sent = sum(s.sent for s in samples)
    cpu = sum(s.gw_cpu_s for s in samples)
    if not lat:
        return Stats(label, 0, errors, 0.0, float("nan"), float("nan"))

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000

    per_req = cpu * 1000 / sent if cpu else float("nan")
    return Stats(label, len(lat), errors, len(lat) / elapsed, pct(0.5), pct(0.99), per_req)


ERRORS: dict[str, int] = {}


async def _one(http: aiohttp.ClientSession, url: str, body: bytes) -> float | None:
    t0 = time.perf_counter()
    try:
        async with http.post(
            f"{url}/v1/chat/completions",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer client"},
        ) as resp:
            async for _ in resp.content.iter_any():
                pass
            if resp.status != 200:
                ERRORS[f"http_{resp.status}"] = ERRORS.get(f"http_{resp.status}", 0) + 1
                return None
    except (aiohttp.ClientError, TimeoutError) as exc:
        ERRORS[type(exc).__name__] = ERRORS.get(type(exc).__name__, 0) + 1
        return None
    return time.perf_counter() - t0


@contextlib.asynccontextmanager
async def _client() -> AsyncIterator[aiohttp.ClientSession]:
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        # Production answers take well under a second here; 30 s marks a request as stuck.
        connector=conn,
        timeout=aiohttp.ClientTimeout(total=30),
    ) as http:
        yield http


async def open_loop(url: str, rate: float, seconds: float, warmup: float) -> Sample:
    """Requests at a fixed rate whatever the answers do (no coordinated omission)."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    errors = 0
    async with _client() as http:

        async def fire(i: int, keep: bool) -> None:
            nonlocal errors
            dt = await _one(http, url, _body(i))
            if not keep:
                return
            if dt is None:
                errors += 1
            else:
                lat.append(dt)

        async with asyncio.TaskGroup() as tg:
            start = loop.time()
            total = int((warmup + seconds) * rate)
            for i in range(total):
                await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
                tg.create_task(fire(i, i >= warmup * rate))
        elapsed = loop.time() - start - warmup
    return Sample(lat, errors, elapsed, total)


async def closed_loop(url: str, concurrency: int, seconds: float, pad: int = 400) -> Sample:
    """`concurrency` clients, each sending its next request when the previous one ends."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    errors = 0
    counter = iter(range(1, 10**9))
    async with _client() as http:
        for i in range(concurrency):  # warm the connections
            await _one(http, url, _body(-i - 1, pad))
        end = loop.time() + seconds

        async def client() -> None:
            nonlocal errors
            while loop.time() < end:
                dt = await _one(http, url, _body(next(counter), pad))
                if dt is None:
                    errors += 1
                else:
                    lat.append(dt)

        start = loop.time()
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(client())
        elapsed = loop.time() - start
    return Sample(lat, errors, elapsed, next(counter) - 1 + concurrency)


async def on_gateway(gw: Proc, run: Any) -> Sample:
    """Run a load against `gw` and record the gateway's CPU time."""
    before = gw.cpu_seconds()
    sample: Sample = await run
    sample.gw_cpu_s = gw.cpu_seconds() - before
    return sample


async def rss_during(rss: Callable[[], int], load: Awaitable[Sample]) -> tuple[Sample, list[int]]:
    """Run `load` while sampling `rss()` every 0.25 s; its result and the samples."""
    samples: list[int] = []

    async def sample() -> None:
        while True:
            samples.append(rss())
            await asyncio.sleep(0.25)

    async with asyncio.TaskGroup() as tg:
        sampler = tg.create_task(sample())
        result = await load
        sampler.cancel()
    return result, samples


async def copies(url: str) -> dict[str, dict[str, Any]]:
    async with _client() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out: dict[str, dict[str, Any]] = {}
    for name, outcome, value in _COPIES.findall(text):
        out.setdefault(name, {})[outcome] = int(value)
    for line in text.splitlines():
        if line.startswith(("canary_mirror_shed_episodes_total", "canary_mirror_loop_lag_max")):
            key, _, value = line.partition(" ")
            out.setdefault("loop", {})[key.removeprefix("canary_mirror_")] = float(value)
    return out


# ---------------------------------------------------------------- the run


async def bench(args: argparse.Namespace) -> None:
    secs, rate = args.seconds, args.rate
    notes: list[str] = [f"start {_load()}"]
    gw_cpu, other_cpu = (0, 1) if (os.cpu_count() or 1) > 1 and args.pin else (None, None)
    if other_cpu is not None:
        # The gateway (and nginx) get CPU 0 to themselves, as on a real host where the engines
        # and the clients are elsewhere; this process, the engines and the candidates share CPU 1.
        os.sched_setaffinity(0, {other_cpu})
    print(
        f"# isolation benchmark: {rate} req/s open loop for {secs} s per row; CPUs {os.cpu_count()}"
    )

    # 1. Latency, open loop.
    with (
        live_engine(args.max_tokens, args.gap, other_cpu) as live,
        live_engine(args.max_tokens, 0.0, other_cpu) as fast,
        sim("hang", cpu=other_cpu) as hang,
    ):
        scenarios: list[tuple[str, list[str]]] = [
            ("mirroring off", []),
            ("100 % to a fast candidate", [f"fast={fast.url}"]),
            ("100 % to a hung candidate", [f"hang={hang.url}"]),
        ]
        # Rounds interleave the scenarios so that drift in the host's background load falls on
        # every scenario alike; latencies are pooled over the rounds.
        runs: dict[str, list[Sample]] = {label: [] for label, _ in scenarios}
        for rnd in range(args.rounds):
            for label, cands in scenarios:
                with gateway(live.url, cands, cpu=gw_cpu) as gw:
                    sample = await on_gateway(gw, open_loop(gw.url, rate, secs, args.warmup))
                    runs[label].append(sample)
                    notes.append(f"round {rnd} {label}: {await copies(gw.url)} {_load()}")
                print(_row(pool(label, [sample])), flush=True)
        rows = [pool(label, runs[label]) for label, _ in scenarios]
        try:
            with nginx_mirror(live.url, hang.url, gw_cpu) as url:
                nginx = await open_loop(url, rate, secs, args.warmup)
            rows.append(pool("nginx mirror, hung candidate", [nginx]))
            print(_row(rows[-1]), flush=True)
        except FileNotFoundError:
            print("nginx not found: row skipped (apt-get install -y nginx)")

        # 2. Throughput, closed loop against an engine with no delay.
        # The third row turns the loop guard off, to show the cost of sending every copy.
        tscenarios = [(*sc, 20.0) for sc in scenarios[:2]]
        tscenarios.append(("100 % fast, loop guard off", scenarios[1][1], 1e7))
        truns: dict[str, list[Sample]] = {label: [] for label, _, _ in tscenarios}
        with live_engine(args.max_tokens, 0.0, other_cpu) as live_fast:
            for rnd in range(args.rounds):
                for label, cands, lag in tscenarios:
                    with gateway(live_fast.url, cands, cpu=gw_cpu, lag_ms=lag) as gw:
                        sample = await on_gateway(gw, closed_loop(gw.url, args.concurrency, secs))
                        truns[label].append(sample)
                        notes.append(f"round {rnd} throughput {label}: {await copies(gw.url)}")
                    print(_row(pool(label, [sample])), flush=True)
        tput = [pool(label, truns[label]) for label in truns]

        # 3. RSS under overload: 100 KB prompts, hung candidate, 1 MiB budget.
        with (
            live_engine(args.max_tokens, 0.0, other_cpu) as live_fast,
            gateway(live_fast.url, [f"hang={hang.url}"], budget=MiB, cpu=gw_cpu) as gw,
        ):
            idle_rss = gw.rss_bytes()
            overload = closed_loop(gw.url, args.concurrency, args.rss_seconds, pad=100_000)
            sample_, samples = await rss_during(gw.rss_bytes, overload)
            mem = pool("100 KB prompts", [sample_])
            mem_copies = await copies(gw.url)

    print()
    print("| scenario | requests | errors | req/s | p50 ms | p99 ms | gateway CPU ms/req |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in rows:
        print(_row(s))
    print()
    print(
        f"| throughput ({args.concurrency} clients, closed loop) | requests | errors | req/s "
        "| p50 ms | p99 ms | gateway CPU ms/req |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for s in tput:
        print(_row(s))
    off, fast_row, hang_row = rows[0], rows[1], rows[2]
    print()
    print(f"hung/off p50 {hang_row.p50_ms / off.p50_ms:.3f} (target <= 1.05)")
    print(f"hung/off p99 {hang_row.p99_ms / off.p99_ms:.3f} (target <= 1.05)")
    print(
        f"fast/off p50 {fast_row.p50_ms / off.p50_ms:.3f}, p99 {fast_row.p99_ms / off.p99_ms:.3f}"
    )
    if len(rows) > 3:
        ng = rows[3]
        print(
            f"nginx-hung/off p50 {ng.p50_ms / off.p50_ms:.3f}, p99 {ng.p99_ms / off.p99_ms:.3f}, "
            f"req/s {ng.rps:.1f} of {rate} offered, errors {ng.errors}"
        )
    print(f"throughput fast/off {tput[1].rps / tput[0].rps:.3f} (target >= 0.75)")
    for t in tput[1:]:
        capacity = tput[0].gw_cpu_ms_per_req / t.gw_cpu_ms_per_req
        print(f"gateway capacity {t.label} / off (CPU per request, off/on) {capacity:.3f}")
    print(f"client-side errors by kind: {ERRORS}")
    peak = max(samples)
    print(
        f"RSS: idle {idle_rss / MiB:.1f} MiB, peak {peak / MiB:.1f} MiB "
        f"over {args.rss_seconds:.0f} s "
        f"({mem.n} requests of 100 KB, {mem.rps:.1f} req/s, errors {mem.errors}); "
        f"target <= budget + 64 MiB = 65.0 MiB"
    )
    print(f"RSS run copies: {mem_copies}")
    for note in notes:
        print(f"copies, {note}")


async def plane_bench(args: argparse.Namespace) -> None:
    """The mirror process (what `canary serve` runs), interleaved over rounds: open loop at
    each rate, every fault candidate at 100 %, latency over the whole run from the first
    request after start-up (the candidate is registered at start), then RSS at overload. (The
    in-loop mirror it was once compared with is gone; bench/RESULTS.md keeps that comparison.)"""
    rates = [float(r) for r in args.rates.split(",")]
    secs = args.seconds
    notes: list[str] = [f"start {_load()}"]
    models = ["plane"]
    with (
        live_engine(args.max_tokens, args.gap) as live,
        live_engine(args.max_tokens, 0.0) as fast,
        sim("hang") as hang,
        sim("baseline", max_tokens=args.max_tokens, overhead_s=1.0) as slow,
        sim("reset-mid-stream", max_tokens=args.max_tokens) as reset,
    ):
        scenarios: list[tuple[str, list[str]]] = [
            ("off", []),
            ("hung", [f"hang={hang.url}"]),
            ("slow 1 s TTFT", [f"slow={slow.url}"]),
            ("reset mid-stream", [f"reset={reset.url}"]),
            ("fast", [f"fast={fast.url}"]),
        ]
        runs: dict[tuple[float, str, str], list[Sample]] = {}
        observed: dict[tuple[float, str, str], list[float]] = {}
        plane_cpu: dict[tuple[float, str], float] = {}
        for rnd in range(args.rounds):
            for rate in rates:
                for label, cands in scenarios:
                    for model in models:
                        with gateway(live.url, cands, priority=args.priority) as gw:
                            tree0 = gw.tree_cpu_seconds()
                            sample = await on_gateway(gw, open_loop(gw.url, rate, secs, 0.0))
                            mirror_cpu = gw.tree_cpu_seconds() - tree0 - sample.gw_cpu_s
                            cp = await copies(gw.url)
                        key = (rate, label, model)
                        runs.setdefault(key, []).append(sample)
                        for name, c in cp.items():
                            if name != "loop" and c.get("sampled"):
                                done = sum(c.get(k, 0) for k in ("observed_ok", "observed_error"))
                                observed.setdefault(key, []).append(done / c["sampled"])
                        if model == "plane" and label == "fast":
                            plane_cpu[(rate, label)] = mirror_cpu
                        notes.append(f"r{rnd} {rate:g}/s {label} {model}: {cp} {_load()}")
                        print(f"{rate:g}/s {label:18} {model:6} {_row(pool(label, [sample]))}")
                with contextlib.suppress(FileNotFoundError):  # the anchor row, when nginx exists
                    with nginx_mirror(live.url, hang.url) as url:
                        sample = await open_loop(url, rate, secs, 0.0)
                    runs.setdefault((rate, "nginx mirror, hung", "nginx"), []).append(sample)
                    print(f"{rate:g}/s nginx mirror, hung  {_row(pool('nginx', [sample]))}")
        # RSS of the whole plane gateway (worker + mirror process) at overload, 100 KB prompts.
        with (
            live_engine(args.max_tokens, 0.0) as live_fast,
            gateway(live_fast.url, [f"hang={hang.url}"], budget=MiB, priority=args.priority) as gw,
        ):
            idle_rss = gw.tree_rss_bytes()
            overload = closed_loop(gw.url, args.concurrency, args.rss_seconds, pad=100_000)
            mem, rss = await rss_during(gw.tree_rss_bytes, overload)
            mem_copies = await copies(gw.url)
    notes.append(f"end {_load()}")
    print()
    print(
        "| req/s | candidate at 100 % | model | requests | errors | p50 ms | p99 ms "
        "| p50 / off | p99 / off | copies observed |"
    )
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for rate in rates:
        for model in models:
            off = pool("off", runs[(rate, "off", model)])
            for label, _ in scenarios:
                st = pool(label, runs[(rate, label, model)])
                obs = observed.get((rate, label, model))
                share = f"{100 * min(obs):.1f} %" if obs else "–"
                print(
                    f"| {rate:g} | {label} | {model} | {st.n} | {st.errors} | {st.p50_ms:.2f} "
                    f"| {st.p99_ms:.2f} | {st.p50_ms / off.p50_ms:.3f} "
                    f"| {st.p99_ms / off.p99_ms:.3f} | {share} |"
                )
    for rate in rates:
        if (rate, "nginx mirror, hung", "nginx") in runs:
            off = pool("off", runs[(rate, "off", "plane")])
            st = pool("nginx", runs[(rate, "nginx mirror, hung", "nginx")])
            print(
                f"| {rate:g} | hung (nginx `mirror`, anchor) | nginx | {st.n} | {st.errors} "
                f"| {st.p50_ms:.2f} | {st.p99_ms:.2f} | {st.p50_ms / off.p50_ms:.3f} "
                f"| {st.p99_ms / off.p99_ms:.3f} | – |"
            )
    for (rate, _), cpu in plane_cpu.items():
        n = runs[(rate, "fast", "plane")][-1].sent
        print(
            f"mirror process CPU at {rate:g}/s fast: {cpu:.2f} s for {n} copies "
            f"= {n / cpu if cpu else float('nan'):.0f} copies per CPU-second"
        )
    print(
        f"RSS (worker + mirror process): idle {idle_rss / MiB:.1f} MiB, peak {max(rss) / MiB:.1f}"
        f" MiB over {args.rss_seconds:.0f} s ({len(mem.lat)} requests of 100 KB, errors "
        f"{mem.errors}); budget 1 MiB; target <= 65 MiB above the budget"
    )
    print(f"RSS run copies: {mem_copies}")
    for note in notes:
        print(f"copies, {note}")


def _load() -> str:
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def _row(s: Stats) -> str:
    return (
        f"| {s.label} | {s.n} | {s.errors} | {s.rps:.1f} | {s.p50_ms:.2f} | {s.p99_ms:.2f} "
        f"| {s.gw_cpu_ms_per_req:.3f} |"
    )


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--role", choices=["bench", "plane-bench", "sim", "live", "gateway"], default="bench"
    )
    p.add_argument("--priority", default="idle", help="plane gateway: mirror_priority")
    p.add_argument("--overhead-s", type=float, default=None, help="sim: fixed TTFT, s")
    p.add_argument("--rates", default="300,1000", help="plane-bench: open-loop rates, req/s")
    p.add_argument("--gap", type=float, default=0.002, help="live engine gap between chunks, s")
    p.add_argument("--profile", default="baseline")
    p.add_argument("--time-scale", type=float, default=0.25, help="live engine speed (latency)")
    p.add_argument("--max-tokens", type=int, default=32, help="live engine answer length")
    p.add_argument("--live")
    p.add_argument("--candidate", action="append", default=[])
    p.add_argument("--budget", type=int, default=256 * MiB)
    p.add_argument("--lag-ms", type=float, default=20.0, help="gateway mirror_shed_loop_lag_ms")
    p.add_argument("--rate", type=float, default=50.0, help="open-loop requests/s")
    p.add_argument("--seconds", type=float, default=15.0, help="per scenario and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rss-seconds", type=float, default=60.0)
    p.add_argument(
        "--pin",
        action="store_true",
        help="gateway on CPU 0, everything else on CPU 1 (only on an otherwise idle host)",
    )
    p.add_argument("--quick", action="store_true", help="short rows, for a smoke run")
    p.add_argument(
        "--nice",
        type=int,
        default=None,
        help="scheduling priority for this run and its children (e.g. -20 on a shared host)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.rss_seconds, args.rounds = 4.0, 1.0, 8.0, 1
    if args.nice is not None and args.role == "bench":
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # children inherit it
    if args.role == "sim":
        uvloop.run(_serve_sim(args.profile, args.time_scale, args.max_tokens, args.overhead_s))
    elif args.role == "live":
        uvloop.run(_serve_live(args.max_tokens, args.gap))
    elif args.role == "gateway":
        uvloop.run(
            _serve_gateway(args.live, args.candidate, 1.0, args.budget, args.priority, args.lag_ms)
        )
    elif args.role == "plane-bench":
        uvloop.run(plane_bench(args))
    else:
        uvloop.run(bench(args))


if __name__ == "__main__":
    main()
