"""Many workers, many tokens: nginx, a bare aiohttp pass-through and the gateway side by side.

    .venv/bin/python bench/scale.py [--workers 1,2,4,8] [--seconds 6] [--rounds 3] [--no-pin]
    .venv/bin/python bench/scale.py --quick          # 1 round of 2 s cells

The successor of bench/core.py for issue 44's scale table. Every part in its own process on
127.0.0.1; the upstreams are one nginx (`return 200` with a tiny chat completion for requests,
a static long SSE answer for streams) and, for paced streams, a small aiohttp engine. Proxies,
each started with N workers (N from `--workers`, kept to the counts this host can pin: see
Placement):
  nginx         nginx as a reverse proxy (`worker_processes N`, `proxy_buffering off`)
  bare          the minimal aiohttp pass-through of bench/overhead.py, N processes on one port
                (SO_REUSEPORT): read body, forward, stream back
  gateway       `canary serve` with `workers = N`, mirroring off (no candidate)
Loads, each cell `--seconds` long, the proxies interleaved in every round (order reversed
every other round, so drift in the host's load falls on all alike):
  requests      `wrk -t1 -c32`, tiny non-streamed chat requests (closed loop)
  burst SSE     `--streams` clients streaming a long answer (`--events` vLLM-shaped chat
                chunks and `[DONE]`) back to back, closed loop; the engine writes the whole answer
                at once, so the proxy reads many events per read (an engine running ahead of its
                API server, the zero-delay case)
  paced SSE     `--paced-streams` clients, the engine writing one event every `--gap-ms`: one
                event per read, the usual case of a live engine; the offered event rate is fixed,
                so the proxies do the same work in the same time
Columns: requests and SSE events per second (wall clock: on a shared host it measures the
neighbours too), and CPU per request and per event of the proxy's serving processes (utime +
stime from /proc over the cell, divided by what the client counted): nginx's workers, the
pass-through's processes, every gateway process but the mirror process (the supervisor and the
report process idle here). CPU per event is robust to the host's contention (a process is
charged only for the time it runs); it is the figure to compare on a busy host.

Placement (as bench/core.py): when the host has at least 2N CPUs, the proxies' workers get
CPUs 0..N-1 and the upstreams, the clients (this process) and wrk the others; otherwise
(or with `--no-pin`) nothing is pinned and the report says so. Worker counts above the host's
CPUs are skipped (the report says which).
It prints markdown tables for bench/RESULTS.md. It is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from isolation import tree_pids  # siblings, through sys.path above
from overhead import PASSTHROUGH, PY, Procs, cpu_seconds
from plane import _TINY_ANSWER as TINY_ANSWER
from plane import Gateway, _load, _pin, _wait_port, wrk
from plane import _free_port as free_port

PROXIES = ("nginx", "bare", "gateway")
NAMES = {
    "nginx": "nginx",
    "bare": "bare aiohttp",
    "gateway": "gateway",
    "before": "gateway, before",
}
LOADS = ("requests", "burst", "paced")

# The bare pass-through, N processes sharing its port.
BARE = PASSTHROUGH.replace("access_log=None", "reuse_port=True, access_log=None")

# A vLLM-shaped chat stream: the role chunk, `events` content chunks, the finish chunk, [DONE].
_HEAD = b'data: {"id":"chatcmpl-9f1c2a7e5b3d4c6f","object":"chat.completion.chunk","created":1733300000,"model":"sim-model","choices":[{"index":0,'  # noqa: E501
_TAIL = b'"logprobs":null,"finish_reason":null}]}\n\n'


def sse_events(events: int) -> list[bytes]:
    words = (b" the", b" proxy", b" streams", b" tokens", b",", b" quickly", b" and", b" well.")
    out = [_HEAD + b'"delta":{"role":"assistant","content":""},' + _TAIL]
    out += [
        _HEAD + b'"delta":{"content":"%s"},' % words[i % len(words)] + _TAIL for i in range(events)
    ]
    out.append(_HEAD + b'"delta":{"content":""},"logprobs":null,"finish_reason":"stop"}]}\n\n')
    out.append(b"data: [DONE]\n\n")
    return out


# A paced engine: GET /paced streams the answer one event every GAP seconds (one write each).
PACED = """
import asyncio, sys, uvloop
from aiohttp import web
EVENTS = open(sys.argv[2], "rb").read().split(b"\\n\\n")[:-1]
GAP = float(sys.argv[3])
async def paced(request):
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for ev in EVENTS:
        await resp.write(ev + b"\\n\\n")
        await asyncio.sleep(GAP)
    await resp.write_eof()
    return resp
app = web.Application()
app.router.add_get("/paced", paced)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""


@contextlib.contextmanager
def nginx_proc(conf: str, workers: int, cpus: set[int] | None) -> Iterator[list[int]]:
    """An nginx master with `workers` worker processes; yields the pids of its workers."""
    exe = shutil.which("nginx") or "/usr/sbin/nginx"
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "nginx.conf").write_text(
            f"""
daemon off; master_process on; worker_processes {workers}; user root;
pid {tmp}/nginx.pid; error_log {tmp}/error.log error;
events {{ worker_connections 16384; }}
http {{
  access_log off; keepalive_requests 1000000;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/f; uwsgi_temp_path {tmp}/u; scgi_temp_path {tmp}/s;
  {conf}
}}
"""
        )
        cmd = [exe, "-c", f"{tmp}/nginx.conf", "-p", tmp]
        if cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *cmd]
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while len(tree_pids(popen.pid)) < workers + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            yield [p for p in tree_pids(popen.pid) if p != popen.pid]
        finally:
            popen.terminate()
            popen.wait(10)


def upstream_conf(port: int, sse_dir: str, paced: int) -> str:
    """The engine: a tiny completion for every POST, the long SSE answer for GET /sse (written
    at once), the paced engine's answer for GET /paced (event by event, unbuffered)."""
    return f"""
  upstream paced {{ server 127.0.0.1:{paced}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location = /sse {{ types {{ }} default_type text/event-stream; root {sse_dir}; }}
    location = /paced {{
      proxy_pass http://paced; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
    location / {{ default_type application/json; return 200 '{TINY_ANSWER}'; }}
  }}"""


def proxy_conf(port: int, up: int) -> str:
    return f"""
  upstream engine {{ server 127.0.0.1:{up}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}"""


# ---------------------------------------------------------------- loads


async def sse_load(url: str, path: str, streams: int, seconds: float) -> tuple[int, int, int, int]:
    """`streams` clients fetching `path` back to back for `seconds`: (events, answers, errors,
    reads). An event is a `data:` line, `[DONE]` included."""
    loop = asyncio.get_running_loop()
    events = answers = errors = reads = 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=60), auto_decompress=False
    ) as http:
        end = loop.time() + seconds

        async def client() -> None:
            nonlocal events, answers, errors, reads
            while loop.time() < end:
                try:
                    async with http.get(url + path) as resp:
                        n = 0
                        async for chunk in resp.content.iter_any():
                            n += chunk.count(b"data: ")
                            reads += 1
                        events += n
                        if resp.status == 200 and n:
                            answers += 1
                        else:
                            errors += 1
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1

        async with asyncio.TaskGroup() as tg:
            for _ in range(streams):
                tg.create_task(client())
    return events, answers, errors, reads


class TreeGateway(Gateway):
    """`canary serve` run from another source tree (`--before-root`, e.g. a `git archive` of an
    earlier commit), with the same config as `Gateway`'s."""

    def __init__(self, root: Path, tmp: str, live: str, *, workers: int, cpus: set[int] | None):
        self.port = free_port()
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
        )
        self._out = self.log.open("w")
        cmd = [PY, "-m", "gateway.cli.main", "serve", "--config", str(cfg)]
        if cpus is not None:
            cmd = ["taskset", "-c", ",".join(map(str, sorted(cpus))), *cmd]
        self.popen = subprocess.Popen(
            cmd, cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
            stdout=self._out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_port(self.port, 60.0)
        time.sleep(0.3)


@dataclass
class Target:
    name: str
    url: str
    pids: list[int]  # the processes whose CPU is the row's

    def cpu(self) -> float:
        total = 0.0
        for pid in self.pids:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return total


@dataclass
class Cell:
    done: int  # requests (requests) or events (SSE) the client counted
    wall_s: float
    cpu_s: float
    errors: int = 0
    reads: int = 0  # client reads (SSE)

    @property
    def rate(self) -> float:
        return self.done / self.wall_s if self.wall_s else float("nan")

    @property
    def us(self) -> float:
        return self.cpu_s * 1e6 / self.done if self.done else float("nan")


async def measure(t: Target, load: str, args: argparse.Namespace) -> Cell:
    c0, w0 = t.cpu(), time.perf_counter()
    if load == "requests":
        rps, bad = await asyncio.to_thread(wrk, t.url, args.seconds, 32)
        wall = time.perf_counter() - w0
        return Cell(int(rps * args.seconds), args.seconds, t.cpu() - c0, int(bad))
    path, streams = ("/sse", args.streams) if load == "burst" else ("/paced", args.paced_streams)
    events, _, errors, reads = await sse_load(t.url, path, streams, args.seconds)
    wall = time.perf_counter() - w0
    return Cell(events, wall, t.cpu() - c0, errors, reads)


# ---------------------------------------------------------------- the run


@dataclass
class Results:
    cells: dict[tuple[int, str, str], list[Cell]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    placement: dict[int, str] = field(default_factory=dict)


def _gateway_pids(gw: Gateway) -> list[int]:
    skip = gw.mirror_pid()
    return [p for p in gw.tree_pids() if p != skip]


async def run_workers(n: int, args: argparse.Namespace, res: Results, tmp: str) -> None:
    ncpu = os.cpu_count() or 1
    pin = not args.no_pin and ncpu >= 2 * n
    proxy_cpus = set(range(n)) if pin else None
    rest_cpus = set(range(n, ncpu)) if pin else None
    res.placement[n] = (
        f"proxies on CPUs 0-{n - 1}, upstreams, clients and wrk on CPUs {n}-{ncpu - 1}"
        if pin
        else f"unpinned (every process on any of the {ncpu} CPUs)"
    )
    _pin(0, rest_cpus or set(range(ncpu)))
    up, paced_port, ng_port = free_port(), free_port(), free_port()
    sse_dir = Path(tmp, "sse")
    procs = Procs()
    try:
        with nginx_proc(upstream_conf(up, str(sse_dir), paced_port), 1, rest_cpus) as _:
            ps = procs.start(PY, "-c", PACED, str(paced_port), str(sse_dir / "sse"),
                             str(args.gap_ms / 1000), port=paced_port)  # fmt: skip
            _pin(ps.pid, rest_cpus)
            _wait_port(up)
            bare_port = free_port()
            script = Path(tmp, "bare.py")
            live = f"http://127.0.0.1:{up}"
            bare_pids = []
            for _ in range(n):
                p = procs.start(PY, str(script), str(bare_port), live)
                _pin(p.pid, proxy_cpus)
                bare_pids.append(p.pid)
            _wait_port(bare_port)
            with (
                nginx_proc(proxy_conf(ng_port, up), n, proxy_cpus) as ng_pids,
                contextlib.ExitStack() as stack,
            ):
                gw = Gateway(tmp, live, workers=n, cpus=proxy_cpus, mirror_cpus=proxy_cpus)
                stack.callback(gw.close)
                _wait_port(ng_port)
                before = None
                if args.before_root is not None:
                    before = TreeGateway(args.before_root, tmp, live, workers=n, cpus=proxy_cpus)
                    stack.callback(before.close)
                targets = {
                    "nginx": Target("nginx", f"http://127.0.0.1:{ng_port}", ng_pids),
                    "bare": Target("bare", f"http://127.0.0.1:{bare_port}", bare_pids),
                    "gateway": Target("gateway", gw.url, _gateway_pids(gw)),
                }
                if before is not None:
                    targets["before"] = Target("before", before.url, _gateway_pids(before))
                proxies = tuple(targets)
                for t in targets.values():  # warm pools and caches
                    for load in args.loads:
                        await measure(t, load, argparse.Namespace(**{**vars(args), "seconds": 1.0}))
                res.notes.append(f"{n} worker(s), after warm-up: {_load()}")
                for rnd in range(args.rounds):
                    order = proxies if rnd % 2 == 0 else proxies[::-1]
                    for load in args.loads:
                        for name in order:
                            cell = await measure(targets[name], load, args)
                            res.cells.setdefault((n, load, name), []).append(cell)
                            print(
                                f"N={n} r{rnd} {load:8} {name:8} {cell.rate:10,.0f}/s "
                                f"{cell.us:7.2f} µs CPU each, errors {cell.errors}, "
                                f"reads {cell.reads} ({_load()})",
                                flush=True,
                            )
                res.notes.append(f"{n} worker(s), end: {_load()}")
    finally:
        procs.stop()


def _files(tmp: str, events: int) -> None:
    """The static SSE answer and the pass-through's script."""
    Path(tmp, "sse").mkdir()
    Path(tmp, "sse", "sse").write_bytes(b"".join(sse_events(events)))
    Path(tmp, "bare.py").write_text(BARE)


async def run(args: argparse.Namespace) -> Results:
    res = Results(notes=[f"start: {_load()}, {os.cpu_count()} CPUs"])
    with tempfile.TemporaryDirectory(prefix="canary-scale-") as tmp:
        _files(tmp, args.events)
        for n in args.workers:
            await run_workers(n, args, res, tmp)
    res.notes.append(f"end: {_load()}")
    return res


# ---------------------------------------------------------------- the report


def _pool(cells: Sequence[Cell]) -> Cell:
    return Cell(
        sum(c.done for c in cells),
        sum(c.wall_s for c in cells),
        sum(c.cpu_s for c in cells),
        sum(c.errors for c in cells),
        sum(c.reads for c in cells),
    )


def _by_round(res: Results, n: int, load: str, name: str) -> str:
    return ", ".join(f"{c.us:.2f}" for c in res.cells[(n, load, name)])


def report(args: argparse.Namespace, res: Results, skipped: Sequence[int]) -> list[str]:
    lines = [
        f"{args.rounds} round(s) of {args.seconds:g} s per cell; requests: wrk -t1 -c32; burst "
        f"SSE: {args.streams} streams of {args.events + 3} events (written at once); paced SSE: "
        f"{args.paced_streams} streams, one event every {args.gap_ms:g} ms",
    ]
    lines += [f"- placement at N = {n}: {where}" for n, where in res.placement.items()]
    if skipped:
        lines.append(
            f"- not run: N = {', '.join(map(str, skipped))} (this host has {os.cpu_count()} CPUs)"
        )
    lines += [f"- load {note}" for note in res.notes]
    for load, unit in (("requests", "req"), ("burst", "event"), ("paced", "event")):
        lines += [
            "",
            f"### {load}: throughput and CPU per {unit} (rounds pooled; by round in brackets)",
            "",
            f"| workers | proxy | {unit}s/s | CPU µs/{unit} | by round | CPU / bare | "
            f"{unit}s per client read | errors |",
            "|---:|---|---:|---:|---|---:|---:|---:|",
        ]
        for n in args.workers:
            if (n, load, "bare") not in res.cells:
                continue
            bare = _pool(res.cells[(n, load, "bare")])
            for name in [x for x in NAMES if (n, load, x) in res.cells]:
                p = _pool(res.cells[(n, load, name)])
                per_read = f"{p.done / p.reads:.1f}" if p.reads else "–"
                lines.append(
                    f"| {n} | {NAMES[name]} | {p.rate:,.0f} | {p.us:.2f} | "
                    f"{_by_round(res, n, load, name)} | {p.us / bare.us:.2f}x | {per_read} | "
                    f"{p.errors} |"
                )
    lines += ["", "### Gateway against the bare pass-through (CPU per unit, lower is better)", ""]
    lines += [
        "| workers | gateway | per request | per event, burst | per event, paced |",
        "|---:|---|---:|---:|---:|",
    ]
    for n in args.workers:
        for gw in ("gateway", "before"):
            if not any((n, load, gw) in res.cells for load in LOADS):
                continue
            row = [f"| {n} | {NAMES[gw]}"]
            for load in LOADS:
                if (n, load, gw) in res.cells:
                    g = _pool(res.cells[(n, load, gw)]).us
                    b = _pool(res.cells[(n, load, "bare")]).us
                    row.append(f"{g / b:.2f}x ({g:.2f} / {b:.2f} µs)")
                else:
                    row.append("–")
            lines.append(" | ".join(row) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--workers", default="1,2,4,8", help="worker counts (those above the CPUs skipped)"
    )
    p.add_argument("--loads", default=",".join(LOADS), help="of requests, burst, paced")
    p.add_argument("--seconds", type=float, default=6.0, help="per cell (workers, load, proxy)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, proxy order alternating")
    p.add_argument("--events", type=int, default=300, help="content events per SSE answer")
    p.add_argument("--streams", type=int, default=16, help="burst SSE clients")
    p.add_argument("--paced-streams", type=int, default=32, help="paced SSE clients")
    p.add_argument("--gap-ms", type=float, default=5.0, help="paced engine: ms between events")
    p.add_argument("--no-pin", action="store_true", help="let every process use every CPU")
    p.add_argument("--before-root", type=Path, help="also run the gateway from this tree")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 round of 2 s cells")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    ncpu = os.cpu_count() or 1
    try:
        wanted = [int(x) for x in args.workers.split(",")]
        args.loads = [x for x in args.loads.split(",") if x]
    except ValueError:
        p.error("--workers: a comma-separated list of integers")
    if any(x not in LOADS for x in args.loads):
        p.error(f"--loads: each one of {', '.join(LOADS)}")
    args.workers = [n for n in wanted if 0 < n <= ncpu]
    skipped = [n for n in wanted if n not in args.workers]
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            print(f"{tool} is missing: apt-get install -y nginx wrk", file=sys.stderr)
            sys.exit(2)
    res = uvloop.run(run(args))
    print()
    print("\n".join(report(args, res, skipped)))


if __name__ == "__main__":
    main()
