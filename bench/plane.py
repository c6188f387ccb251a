"""Mirror-plane benchmark: what copies cost production when the gateway runs as `canary serve`.

The table of the mirror-plane issue, in one run, every part in its own process on 127.0.0.1:

1. Tiny requests, open loop at each `--rates` (req/s): unique non-streamed chat requests to an
   nginx `return 200` live engine through `canary serve` (a worker + the host's mirror process,
   real SQLite, `[mirror] priority = "idle"`). Each row starts a fresh gateway with no candidate,
   starts the load, and registers the row's candidate at 100 % through the admin API one second
   in; latency is from each request's *scheduled* send time to its last byte, over the whole
   row, registration included. Candidates: hung (accepts, never answers), slow (1 s TTFT),
   reset mid-stream, fast (a second nginx `return 200`); the anchor is nginx's own `mirror`
   module sending every request to the hung candidate.
2. Streams: `--streams` concurrent SSE streams (200 events 2 ms apart) from a stand-in engine,
   closed loop; per-event inter-arrival gap at the client, p50/p99, same candidates.
3. `--workers 2` against `--workers 1`, mirroring off: closed-loop throughput with wrk.
4. RSS of every gateway process together at overload: 100 KB prompts, hung candidate, 1 MiB
   mirror budget.

Scenarios are interleaved round by round so drift in the host's load falls on all alike.
Placement, as on a production host whose clients and engines are elsewhere (`--no-pin` turns it
off): the gateway's worker has CPU 0; this process (the client), nginx and the stream engine
share CPU 1; the candidates stand in for other machines and run at SCHED_IDLE anywhere; the
mirror process runs where `canary serve` puts it (SCHED_IDLE), on either CPU.

Usage: `python bench/plane.py [--rates 300,1000] [--seconds 10] [--rounds 2]` with nginx and wrk
on PATH. Prints markdown tables for bench/RESULTS.md, the mirror counters of every row and the
host's load average before and after each part.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))

from isolation import (
    MiB,
    _client,
    _cpu,
    closed_loop,
    copies,
    live_engine,
    rss_during,
    sim,
    tree_pids,
    tree_rss,
)
from overhead import free_port as _free_port
from overhead import host_series

_HANDOFF = re.compile(r'canary_mirror_handoff_dropped_total\{candidate="([^"]+)",reason="(\w+)"\}')


async def host_copies(url: str) -> dict[str, Any]:
    """The host's copy accounting: the mirror process's counters plus the copies the worker
    chose but could not hand off (a full channel), which never reached the mirror process."""
    out = await copies(url)
    async with _client() as http, http.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for series, value in host_series(text).items():  # summed over the workers
        if (m := _HANDOFF.fullmatch(series)) is not None:
            name, reason = m.groups()
            row = out.setdefault(name, {})
            row["sampled"] = row.get("sampled", 0) + int(value)
            row[reason] = row.get(reason, 0) + int(value)
    return out


_TINY_ANSWER = (
    '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7}}'
)


def _wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def _idle(pid: int) -> None:
    """A stand-in for another machine: only CPU that nothing else on this host wants."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0))


def _pin(pid: int, cpus: set[int] | None) -> None:
    if cpus is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, cpus)


def _pids_named(name: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit() and (d / "comm").read_text().strip() == name:
                out.append(int(d.name))
    return out


def _load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# ---------------------------------------------------------------- nginx


@contextlib.contextmanager
def nginx(servers: str) -> Iterator[subprocess.Popen[bytes]]:
    """One nginx process (no master) serving `servers`; yields it (its pid is nginx's)."""
    exe = shutil.which("nginx")
    if exe is None:
        raise FileNotFoundError("nginx (apt-get install -y nginx)")
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp, "nginx.conf")
        conf.write_text(
            f"""
daemon off; master_process off; worker_processes 1; user root;
pid {tmp}/nginx.pid; error_log {tmp}/error.log error;
events {{ worker_connections 16384; }}
http {{
  access_log off; keepalive_requests 1000000;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/f; uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
  client_max_body_size 64m; client_body_buffer_size 1m;
  {servers}
}}
"""
        )
        popen = subprocess.Popen([exe, "-c", str(conf), "-p", tmp], stdin=subprocess.DEVNULL)
        try:
            yield popen
        finally:
            popen.terminate()
            popen.wait(10)


def tiny_server(port: int) -> str:
    """An engine that answers every chat request at once with the same small completion (it
    reads the body first: nginx answers `return` before reading it otherwise)."""
    return f"""
  server {{
    listen 127.0.0.1:{port};
    location / {{
      default_type application/json;
      return 200 '{_TINY_ANSWER}';
    }}
  }}"""


def mirror_server(port: int, live_port: int, cand: str) -> str:
    return f"""
  upstream live_{port} {{ server 127.0.0.1:{live_port}; keepalive 256; }}
  upstream cand_{port} {{ server {cand.removeprefix("http://")}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      mirror /mirror; mirror_request_body on;
      proxy_pass http://live_{port}; proxy_http_version 1.1; proxy_set_header Connection "";
    }}
    location = /mirror {{
      internal;
      proxy_pass http://cand_{port}$request_uri; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_read_timeout 300s;
    }}
  }}"""


# ---------------------------------------------------------------- the gateway, as shipped

_MIRROR_PID = re.compile(r"mirror process started pid=(\d+)")


class Gateway:
    """`canary serve` in a child process, on a port of its own, with a fresh SQLite file."""

    def __init__(
        self,
        tmp: str,
        live: str,
        *,
        workers: int = 1,
        budget: int = 256 * MiB,
        cpus: set[int] | None = None,
        mirror_cpus: set[int] | None = None,
    ) -> None:
        """`cpus`: where `canary serve` runs (every CPU when None); `mirror_cpus`: where its
        mirror process runs once started (every CPU when None)."""
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tmp, f"gw-{self.port}.log")
        cfg = Path(tmp, f"gw-{self.port}.toml")
        cfg.write_text(
            f'[server]\nlisten = "127.0.0.1:{self.port}"\nworkers = {workers}\n'
            "drain_timeout_s = 0.5\n"
            f'[live]\nurl = "{live}"\n'
            f'[storage]\ndb_url = "sqlite+aiosqlite:///{tmp}/gw-{self.port}.db"\n'
            "registry_poll_interval_s = 1.0\ncounters_flush_interval_s = 1.0\n"
            "[admin]\ninsecure = true\n"
            f"[mirror]\nmemory_budget_bytes = {budget}\n"
        )
        exe = str(Path(sys.executable).with_name("canary"))
        self._out = self.log.open("w")
        cpus = cpus or set(range(os.cpu_count() or 1))
        pin = ["taskset", "-c", ",".join(map(str, sorted(cpus)))]
        self.popen = subprocess.Popen(
            [*pin, exe, "serve", "--config", str(cfg)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        _wait_port(self.port, 60.0)
        time.sleep(0.3)  # the mirror process connects its socket
        mpid = self.mirror_pid()
        if mpid is not None:
            # The worker keeps its core; by default the mirror process (SCHED_IDLE) may use idle
            # CPU on any.
            _pin(mpid, mirror_cpus or set(range(os.cpu_count() or 1)))

    def tree_pids(self) -> list[int]:
        return tree_pids(self.popen.pid)

    def mirror_pid(self) -> int | None:
        found = _MIRROR_PID.findall(self.log.read_text())
        return int(found[-1]) if found else None

    def cpu(self) -> tuple[float, float]:
        """CPU seconds of (every gateway process except the mirror process, the mirror one)."""
        mpid = self.mirror_pid()
        rest = mirror = 0.0
        for pid in self.tree_pids():
            with contextlib.suppress(OSError):
                if pid == mpid:
                    mirror += _cpu(pid)
                else:
                    rest += _cpu(pid)
        return rest, mirror

    def rss(self) -> int:
        return tree_rss(self.popen.pid)

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._out.close()


@contextlib.contextmanager
def gateway(tmp: str, live: str, **kw: Any) -> Iterator[Gateway]:
    gw = Gateway(tmp, live, **kw)
    try:
        yield gw
    finally:
        gw.close()


async def register(http: aiohttp.ClientSession, gw: Gateway, name: str, url: str) -> float:
    """Register a candidate at 100 % through the admin API; returns when it was acknowledged."""
    body = {"name": name, "url": url, "sample_rate": 1.0, "timeout_s": 300.0}
    async with http.post(f"{gw.url}/admin/candidates", json=body) as resp:
        if resp.status != 201:
            raise RuntimeError(f"register {name}: {resp.status} {await resp.text()}")
    return time.perf_counter()


# ---------------------------------------------------------------- load


class Row(msgspec.Struct):
    label: str
    n: int
    errors: int
    p50_ms: float
    p99_ms: float
    first_s_p99_ms: float = float("nan")  # the second after registration
    copies: dict[str, Any] = {}
    gw_cpu_s: float = 0.0
    mirror_cpu_s: float = 0.0
    xs: list[float] = []  # every latency (or gap) of the row, seconds


def _pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def _tiny_body(i: int) -> bytes:
    return msgspec.json.encode(
        {
            "model": "sim-model",
            "messages": [{"role": "user", "content": f"request {i}"}],
            "max_tokens": 8,
        }
    )


async def open_loop_tiny(
    url: str, rate: float, seconds: float, on_start: Any = None, first: int = 0
) -> tuple[list[tuple[float, float]], int, dict[str, int]]:
    """Unique tiny chat requests at a fixed rate, numbered from `first`; latency from each
    one's scheduled send time (a late client or a stalled gateway both count). Returns (start
    offset, latency) pairs."""
    out: list[tuple[float, float]] = []
    errors: dict[str, int] = {}
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
        clock = time.perf_counter  # uvloop's loop.time() has a 1 ms resolution
        start = clock()

        async def fire(i: int, due: float) -> None:
            try:
                async with http.post(
                    f"{url}/v1/chat/completions",
                    data=_tiny_body(first + i),
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors[f"http_{resp.status}"] = errors.get(f"http_{resp.status}", 0) + 1
                        return
            except (aiohttp.ClientError, TimeoutError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
            out.append((due - start, clock() - due))

        async with asyncio.TaskGroup() as tg:
            if on_start is not None:
                tg.create_task(on_start(http))
            for i in range(int(seconds * rate)):
                due = start + i / rate
                await asyncio.sleep(max(0.0, due - clock()))
                tg.create_task(fire(i, due))
    return out, sum(errors.values()), errors


async def streams(
    url: str, concurrency: int, seconds: float, on_start: Any = None
) -> tuple[list[float], int]:
    """`concurrency` clients streaming back to back; the gap before every SSE event."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    errors = 0
    body = msgspec.json.encode(
        {"model": "sim-model", "messages": [{"role": "user", "content": "stream"}], "stream": True}
    )
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=60)
    ) as http:
        end = loop.time() + seconds
        counter = iter(range(10**9))

        async def client() -> None:
            nonlocal errors
            while loop.time() < end:
                i = next(counter)
                payload = body.replace(b'"stream"}', f'"stream {i}"}}'.encode(), 1)
                try:
                    async with http.post(
                        f"{url}/v1/chat/completions",
                        data=payload,
                        headers={"Content-Type": "application/json"},
                    ) as resp:
                        last: float | None = None
                        async for chunk in resp.content.iter_any():
                            now = time.perf_counter()
                            events = chunk.count(b"data:")
                            if last is not None and events:
                                gaps.append(now - last)
                                gaps.extend([0.0] * (events - 1))
                            last = now
                        if resp.status != 200:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1

        async with asyncio.TaskGroup() as tg:
            if on_start is not None:
                tg.create_task(on_start(http))
            for _ in range(concurrency):
                tg.create_task(client())
    return gaps, errors


def wrk(url: str, seconds: float, connections: int) -> tuple[float, str]:
    exe = shutil.which("wrk")
    if exe is None:
        raise FileNotFoundError("wrk (apt-get install -y wrk)")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(
            'wrk.method = "POST"\n'
            'wrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = [[{_tiny_body(0).decode()}]]\n"
        )
    out = subprocess.run(
        [
            exe,
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            "-s",
            f.name,
            f"{url}/v1/chat/completions",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(f.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return rps, (bad.group(1) if bad else "0")


# ---------------------------------------------------------------- the run


SCENARIOS = ("off", "hung", "slow 1 s TTFT", "reset mid-stream", "fast")


async def run(args: argparse.Namespace) -> None:
    notes = [f"start {_load()}, CPUs {os.cpu_count()}"]
    ncpu = os.cpu_count() or 1
    # The worker gets CPU 0; the client, nginx and the stream engine CPU 1 (as on a host whose
    # clients and engines are elsewhere); candidates and the mirror process idle CPU anywhere.
    gw_cpus, rest_cpus = ({0}, {1}) if ncpu > 1 and not args.no_pin else (None, None)
    _pin(0, rest_cpus)
    rates = [float(r) for r in args.rates.split(",")]
    live_port, fast_port, anchor_port = _free_port(), _free_port(), _free_port()
    results: dict[tuple[str, str], list[Row]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        sim("hang") as hang,
        sim("hang") as hang_nginx,  # nginx keeps its mirrors' connections open 300 s
        sim("baseline", max_tokens=8, overhead_s=1.0) as slow,
        sim("reset-mid-stream", max_tokens=8) as reset,
        live_engine(200, 0.002) as stream_live,
        live_engine(200, 0.0) as stream_fast,
        nginx(
            tiny_server(live_port)
            + tiny_server(fast_port)
            + mirror_server(anchor_port, live_port, hang_nginx.url)
        ),
    ):
        for p in (hang, hang_nginx, slow, reset, stream_fast):
            _idle(p.pid)
        _pin(stream_live.pid, rest_cpus)
        for pid in _pids_named("nginx"):
            _pin(pid, rest_cpus)
        for port in (live_port, fast_port, anchor_port):
            _wait_port(port)
        live = f"http://127.0.0.1:{live_port}"
        tiny_cands = {
            "hung": hang.url,
            "slow 1 s TTFT": slow.url,
            "reset mid-stream": reset.url,
            "fast": f"http://127.0.0.1:{fast_port}",
        }
        stream_cands = {**tiny_cands, "fast": stream_fast.url}

        async def one(kind: str, label: str, rate: float) -> Row:
            cands = tiny_cands if kind == "tiny" else stream_cands
            target = live if kind == "tiny" else stream_live.url
            with gateway(tmp, target, cpus=gw_cpus) as gw:
                registered: list[float] = []

                async def on_start(http: aiohttp.ClientSession) -> None:
                    await asyncio.sleep(1.0)
                    if label != "off":
                        registered.append(await register(http, gw, "cand", cands[label]))

                cpu0 = gw.cpu()
                if kind == "tiny":
                    lat, errors, kinds = await open_loop_tiny(gw.url, rate, args.seconds, on_start)
                    xs = [d for _, d in lat]
                    first = [d for t, d in lat if 1.0 <= t < 2.0]
                else:
                    xs, errors = await streams(gw.url, args.streams, args.seconds, on_start)
                    first, kinds = [], {}
                cpu1 = gw.cpu()
                await asyncio.sleep(1.5)  # the counters reach /metrics
                cp = await host_copies(gw.url)
                if kinds:
                    cp["client_errors"] = kinds
            return Row(
                label,
                len(xs),
                errors,
                _pct(xs, 0.5),
                _pct(xs, 0.99),
                _pct(first, 0.99),
                cp,
                cpu1[0] - cpu0[0],
                cpu1[1] - cpu0[1],
                xs,
            )

        tput: dict[str, list[float]] = {}
        if args.only != "rss":
            await one("tiny", "off", rates[0])  # a warm-up row, not recorded (caches, first start)
            # 1 + 2: tiny requests at each rate, then streams; interleaved round by round.
            for rnd in range(args.rounds):
                for rate in rates:
                    for label in SCENARIOS:
                        row = await one("tiny", label, rate)
                        results.setdefault((f"{rate:g}", label), []).append(row)
                        print(f"r{rnd} {rate:g}/s {label:17} {_fmt(row)}", flush=True)
                        notes.append(f"r{rnd} {rate:g}/s {label}: {row.copies} {_load()}")
                    lat, errors, kinds = await open_loop_tiny(
                        f"http://127.0.0.1:{anchor_port}", rate, args.seconds
                    )
                    xs = [d for _, d in lat]
                    row = Row(
                        "nginx mirror, hung", len(xs), errors, _pct(xs, 0.5), _pct(xs, 0.99), xs=xs
                    )
                    results.setdefault((f"{rate:g}", "nginx"), []).append(row)
                    print(f"r{rnd} {rate:g}/s nginx mirror hung {_fmt(row)} {kinds}", flush=True)
                for label in SCENARIOS:
                    row = await one("streams", label, 0.0)
                    results.setdefault(("streams", label), []).append(row)
                    print(f"r{rnd} streams {label:17} {_fmt(row)}", flush=True)
                    notes.append(f"r{rnd} streams {label}: {row.copies} {_load()}")
            notes.append(f"after latency rows {_load()}")

            # 3. --workers 2 vs 1, mirroring off, wrk closed loop; every process on every CPU.
            _pin(0, set(range(ncpu)))
            for rnd in range(args.rounds + 1):
                tput.setdefault("nginx direct", []).append(wrk(live, args.seconds, 64)[0])
                for workers in (1, 2):
                    with gateway(tmp, live, workers=workers) as gw:
                        wrk(gw.url, 1, 64)  # warm the connections
                        cpu0 = gw.cpu()[0]
                        rps, bad = wrk(gw.url, args.seconds, 64)
                        cpu = gw.cpu()[0] - cpu0
                    key = f"--workers {workers}"
                    tput.setdefault(key, []).append(rps)
                    tput.setdefault(f"{key} CPU ms/req", []).append(
                        cpu * 1000 / (rps * args.seconds)
                    )
                    print(f"r{rnd} {key}: {rps:.0f} req/s, non-2xx {bad}, {_load()}", flush=True)
            notes.append(f"after throughput {_load()}")

        # 4. RSS at overload: 100 KB prompts, hung candidate, 1 MiB budget.
        with gateway(tmp, live, budget=MiB) as gw:
            async with aiohttp.ClientSession() as http:
                await register(http, gw, "cand", hang.url)
            await asyncio.sleep(1.5)
            idle = gw.rss()
            overload = closed_loop(gw.url, 16, args.rss_seconds, pad=100_000)
            mem, rss = await rss_during(gw.rss, overload)
            await asyncio.sleep(1.5)
            mem_copies = await host_copies(gw.url)
    notes.append(f"end {_load()}")
    if args.only == "rss":
        print(_rss_line(args, idle, rss, mem, mem_copies))
        for note in notes:
            print(f"note: {note}")
        return
    _print(args, rates, results, tput, idle, rss, mem, mem_copies, notes)


def _fmt(r: Row) -> str:
    return (
        f"n {r.n} errors {r.errors} p50 {r.p50_ms:.2f} p99 {r.p99_ms:.2f} "
        f"p99 1st s {r.first_s_p99_ms:.2f} ms"
    )


def _pool(rows: Sequence[Row]) -> tuple[int, int, float, float]:
    """The rounds of one scenario, latencies pooled."""
    xs = [x for r in rows for x in r.xs]
    return len(xs), sum(r.errors for r in rows), _pct(xs, 0.5), _pct(xs, 0.99)


def _observed(rows: Sequence[Row]) -> str:
    shares = []
    for r in rows:
        c = r.copies.get("cand", {})
        if c.get("sampled"):
            shares.append((c.get("observed_ok", 0) + c.get("observed_error", 0)) / c["sampled"])
    return f"{100 * min(shares):.1f} %" if shares else "–"


def _rss_line(
    args: argparse.Namespace, idle: int, rss: Sequence[int], mem: Any, copies: dict[str, Any]
) -> str:
    return (
        f"RSS of every gateway process: idle {idle / MiB:.1f} MiB, peak {max(rss) / MiB:.1f} MiB "
        f"(+{(max(rss) - idle) / MiB:.1f}) over {args.rss_seconds:.0f} s of 100 KB prompts "
        f"({len(mem.lat)} requests, errors {mem.errors}); budget 1 MiB; target: growth <= "
        f"budget + 64 MiB; copies {copies}"
    )


def _print(
    args: argparse.Namespace,
    rates: Sequence[float],
    results: dict[tuple[str, str], list[Row]],
    tput: dict[str, list[float]],
    idle: int,
    rss: Sequence[int],
    mem: Any,
    mem_copies: dict[str, Any],
    notes: Sequence[str],
) -> None:
    print()
    print(
        "| load | candidate at 100 % | requests | errors | p50 ms | p99 ms | p50 / off "
        "| p99 / off | p99 / same round's off, by round | p99 in the second after registration, "
        "ms | worker CPU µs/req | copies observed (worst round) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for group in [f"{r:g}" for r in rates] + ["streams"]:
        _, _, off50, off99 = _pool(results[(group, "off")])
        labels = [*SCENARIOS, "nginx"] if group != "streams" else list(SCENARIOS)
        for label in labels:
            rows = results[(group, label)]
            n, errors, p50, p99 = _pool(rows)
            first = max(r.first_s_p99_ms for r in rows)
            where = f"{group} req/s tiny" if group != "streams" else f"{args.streams} SSE streams"
            name = label if label != "nginx" else "hung (nginx `mirror`, anchor)"
            cpu = sum(r.gw_cpu_s for r in rows)
            per_req = f"{cpu * 1e6 / n:.0f}" if cpu and n else "–"
            offs = results[(group, "off")]
            by_round = " ".join(
                f"{r.p99_ms / o.p99_ms:.2f}" for r, o in zip(rows, offs, strict=False)
            )
            print(
                f"| {where} | {name} | {n} | {errors} | {p50:.2f} | {p99:.2f} "
                f"| {p50 / off50:.3f} | {p99 / off99:.3f} | {by_round} | "
                f"{'–' if first != first else f'{first:.2f}'} | {per_req} | {_observed(rows)} |"
            )
    print()
    for group in [f"{r:g}" for r in rates] + ["streams"]:
        for r in results[(group, "fast")]:
            c = r.copies.get("cand", {})
            done = c.get("observed_ok", 0) + c.get("observed_error", 0)
            if r.mirror_cpu_s > 0:
                print(
                    f"mirror process, {group} fast: {done} copies observed with "
                    f"{r.mirror_cpu_s:.2f} CPU-s = {done / r.mirror_cpu_s:.0f} copies per "
                    f"CPU-second; worker {r.gw_cpu_s:.2f} CPU-s"
                )
    med = {k: sorted(v)[len(v) // 2] for k, v in tput.items()}
    print()
    print("| closed loop, wrk -t1 -c64, mirroring off | req/s (median of rounds) | rounds |")
    print("|---|---:|---|")
    for k in ("nginx direct", "--workers 1", "--workers 2"):
        print(f"| {k} | {med[k]:.0f} | {', '.join(f'{x:.0f}' for x in tput[k])} |")
    print(
        f"--workers 2 / --workers 1 = {med['--workers 2'] / med['--workers 1']:.2f}x "
        f"(target >= 1.8x); gateway CPU ms/req: 1 worker {med['--workers 1 CPU ms/req']:.3f}, "
        f"2 workers {med['--workers 2 CPU ms/req']:.3f}"
    )
    print(_rss_line(args, idle, rss, mem, mem_copies))
    for note in notes:
        print(f"note: {note}")


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="300,1000", help="open-loop rates of tiny requests, req/s")
    p.add_argument("--seconds", type=float, default=10.0, help="per row and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--streams", type=int, default=64, help="concurrent SSE streams")
    p.add_argument("--rss-seconds", type=float, default=30.0)
    p.add_argument("--no-pin", action="store_true", help="let every process use every CPU")
    p.add_argument(
        "--only", choices=["all", "rss"], default="all", help="rss: only the memory part (4)"
    )
    args = p.parse_args(argv)
    uvloop.run(run(args))


if __name__ == "__main__":
    main()
