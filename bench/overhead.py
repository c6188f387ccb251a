"""Proxy overhead benchmark: canary-gateway vs direct, nginx and a minimal aiohttp pass-through.

    .venv/bin/python bench/overhead.py [--duration 10] [--rates 200,1000] [--profile]
    .venv/bin/python bench/overhead.py --cpu-only [--cpu-rounds 6] [--cpu-duration 4]
        [--fixed-rate 400] [--before-root DIR]

Every server and every load generator runs in its own process on 127.0.0.1:
  upstreams  nginx `return 200` with a fixed JSON body (plain requests); the engine simulator with
             the zero-delay "fast" profile plus a pacing route that stamps each SSE event with its
             send time (streams, per-chunk delay)
  proxies    `canary serve` (the complete gateway: meter, mirror tee, storage writer; one worker,
             then --workers 2), nginx as a plain reverse proxy, and PASSTHROUGH below (the floor of
             an aiohttp stack)
  load       wrk (closed loop, saturation); an asyncio open-loop generator (fixed offered rates;
             latency measured from the scheduled send time, so no coordinated omission); an
             asyncio SSE client (events/s with 64 concurrent streams; per-chunk added delay)
It prints a markdown report on stdout. It is a benchmark, not a test: it asserts nothing.

On a shared machine, throughput measures the neighbours as much as the proxy. The CPU A/B section
(`--cpu-only` runs just it) is the honest number there: gateway and pass-through are loaded in
alternation, round after round, with the same wrk, and each proxy's CPU time (utime + stime from
/proc) is divided by the requests wrk counted; the report gives the median of the rounds. The same
is done at a fixed offered rate (`--fixed-rate`, open loop: every proxy serves the same requests
in the same time, so CPU per request is not skewed by how far each is pushed), with the added p50
and p99. `--before-root DIR` adds a gateway run from another source tree (e.g. a `git archive` of
an earlier commit) to both A/Bs; `--profile` then also py-spies each gateway at the fixed rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
JSON_BODY = '{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}'  # noqa: E501
CHAT = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Tell me a story about a proxy"}],
    "max_tokens": 64,
    "stream": True,
}

# The minimal aiohttp pass-through: read body, forward, stream back. The floor of this stack.
PASSTHROUGH = """
import asyncio, sys, aiohttp, uvloop
from aiohttp import web
UP = sys.argv[2]
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
       "content-length"}
async def handle(request):
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    session = request.app["session"]
    async with session.request(request.method, UP + request.raw_path, headers=headers,
                               data=body or None) as up:
        resp = web.StreamResponse(status=up.status,
            headers={k: v for k, v in up.headers.items() if k.lower() not in HOP})
        await resp.prepare(request)
        async for chunk in up.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
        return resp
async def session_ctx(app):
    app["session"] = aiohttp.ClientSession(auto_decompress=False,
        connector=aiohttp.TCPConnector(limit=1024))
    yield
    await app["session"].close()
app = web.Application()
app.cleanup_ctx.append(session_ctx)
app.router.add_route("*", "/{tail:.*}", handle)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

NGINX_CONF = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  upstream sim {{ server 127.0.0.1:{sim}; keepalive 256; }}
  upstream fixed {{ server 127.0.0.1:{up}; keepalive 256; }}
  server {{
    listen 127.0.0.1:{up} reuseport;
    location / {{ default_type application/json; return 200 '{body}'; }}
  }}
  server {{
    listen 127.0.0.1:{proxy_fixed};
    location / {{
      proxy_pass http://fixed; proxy_http_version 1.1; proxy_set_header Connection "";
    }}
  }}
  server {{
    listen 127.0.0.1:{proxy_sim};
    location / {{
      proxy_pass http://sim; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


class Procs:
    """Child processes, all stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, *argv: str, port: int | None = None, root: Path = ROOT
    ) -> subprocess.Popen[bytes]:
        log = open(os.devnull, "wb")  # noqa: SIM115 - closed with the process table at exit
        env = {**os.environ, "PYTHONPATH": str(root)}
        proc = subprocess.Popen(argv, cwd=root, stdout=log, stderr=log, env=env)
        self.procs.append(proc)
        if port is not None:
            wait_port(port)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def gateway(procs: Procs, tmp: Path, live: str, *extra: str, root: Path = ROOT) -> tuple[str, int]:
    port = free_port()
    proc = procs.start(
        PY, "-m", "gateway.cli.main", "serve", "--live", live, "--listen", f"127.0.0.1:{port}",
        "--db", f"sqlite+aiosqlite:///{tmp}/gw-{port}.db", *extra, root=root,
    )  # fmt: skip
    wait_port(port)
    time.sleep(1.0 if not extra else 3.0)  # every worker up
    return f"http://127.0.0.1:{port}", proc.pid


def passthrough(procs: Procs, tmp: Path, live: str) -> tuple[str, int]:
    script = tmp / "passthrough.py"
    script.write_text(PASSTHROUGH)
    port = free_port()
    proc = procs.start(PY, str(script), str(port), live, port=port)
    return f"http://127.0.0.1:{port}", proc.pid


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------- load generators (children)


def child(argv: list[str]) -> dict[str, float]:
    out = subprocess.run(
        [PY, __file__, *argv], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


_WORKER_LABEL = re.compile(r'worker="\d+",?')


def host_series(text: str) -> dict[str, float]:
    """A /metrics text as {series: value} for the whole host: with `canary serve --workers N`
    each worker's own series carry a `worker` label (any worker serves them all), and here
    they are summed over it, so a series reads the same whichever worker answered."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            series = _WORKER_LABEL.sub("", series).replace("{}", "")
            out[series] = out.get(series, 0.0) + float(value)
    return out


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


async def _open_loop(url: str, rate: float, duration: float) -> dict[str, float]:
    import aiohttp

    n = int(rate * duration)
    lat: list[float] = []
    errors = 0
    conn = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=conn) as http:
        for _ in range(50):  # warm the pool
            async with http.get(url) as r:
                await r.read()
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        clock = time.perf_counter  # uvloop's loop.time() has only millisecond resolution

        async def one(at: float) -> None:
            nonlocal errors
            try:
                async with http.get(url) as r:
                    await r.read()
                    if r.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
            lat.append(clock() - at)

        start = clock() + 0.05
        for i in range(n):
            at = start + i / rate
            delay = at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(one(at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
    return {
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "errors": errors,
        "n": len(lat),
        "served": len(lat) + 50,  # with the warm-up requests
    }


async def _sse(url: str, streams: int, duration: float) -> dict[str, float]:
    import aiohttp

    events = 0
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as http:
        deadline = asyncio.get_running_loop().time() + duration

        async def worker() -> None:
            nonlocal events
            while asyncio.get_running_loop().time() < deadline:
                async with http.post(url + "/v1/chat/completions", json=CHAT) as r:
                    async for chunk in r.content.iter_any():
                        events += chunk.count(b"data: ")

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        elapsed = time.perf_counter() - t0
    return {"events_per_s": events / elapsed}


async def _chunk_delay(url: str, streams: int) -> dict[str, float]:
    import aiohttp

    delays: list[float] = []
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.post(url + "/pace") as r:
                buf = b""
                async for chunk in r.content.iter_any():
                    now = time.monotonic_ns()
                    buf += chunk
                    *events, buf = buf.split(b"\n\n")
                    delays.extend((now - int(e[6:])) / 1e6 for e in events if e)

        for _ in range(streams):
            await one()
    return {"p50_ms": pct(delays, 0.5), "p99_ms": pct(delays, 0.99), "n": len(delays)}


async def _sim(port: int) -> None:
    from aiohttp import web

    from gateway.sim.profiles import get_profile
    from gateway.sim.server import build_sim_app

    async def pace(request: web.Request) -> web.StreamResponse:
        """200 SSE events, 2 ms apart, each carrying its send time (CLOCK_MONOTONIC, ns)."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(200):
            await resp.write(b"data: %d\n\n" % time.monotonic_ns())
            await asyncio.sleep(0.002)
        await resp.write_eof()
        return resp

    app = build_sim_app(get_profile("fast"))
    app.router.add_post("/pace", pace)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


def wrk(url: str, duration: float, conns: int = 64) -> tuple[float, float, int]:
    """Closed-loop saturation: requests/s, median latency (ms) and requests completed."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{int(duration)}s", "--latency", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    m = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}
    p50 = float(m.group(1)) * scale[m.group(2)] if m else float("nan")
    return rps, p50, done


def cpu_ab(
    targets: dict[str, tuple[str, int]], rounds: int, duration: float, conns: int = 32
) -> dict[str, tuple[list[float], list[float]]]:
    """Per target, CPU µs per request and req/s of each round; targets alternate order."""
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in targets}
    names = list(targets)
    for url, _ in targets.values():
        wrk(url, 1, conns)  # warm pools and caches
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            url, pid = targets[name]
            before = cpu_seconds(pid)
            rps, _, done = wrk(url, duration, conns)
            out[name][0].append((cpu_seconds(pid) - before) / max(done, 1) * 1e6)
            out[name][1].append(rps)
    return out


def cpu_fixed(
    targets: dict[str, tuple[str, int]], rate: float, duration: float, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """Per target and round, at a fixed offered rate (open loop): CPU µs per request, p50, p99
    and errors; targets alternate order round by round."""
    out: dict[str, dict[str, list[float]]] = {
        name: {"cpu": [], "p50": [], "p99": [], "errors": []} for name in targets
    }
    names = list(targets)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            url, pid = targets[name]
            before = cpu_seconds(pid)
            res = child(["_openloop", url, str(rate), str(duration)])
            out[name]["cpu"].append((cpu_seconds(pid) - before) / res["served"] * 1e6)
            for key, field in (("p50", "p50_ms"), ("p99", "p99_ms"), ("errors", "errors")):
                out[name][key].append(res[field])
    return out


def cpu_fixed_lines(res: dict[str, dict[str, list[float]]], rate: float) -> list[str]:
    rounds = len(next(iter(res.values()))["cpu"])
    lines = [
        f"### CPU per request at a fixed offered rate ({rate:.0f} req/s open loop, "
        f"{rounds} rounds, median)",
        "",
        "| proxy | CPU µs/request | rounds (µs) | p50 ms | p99 ms | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in res.items():
        each = ", ".join(f"{c:.0f}" for c in r["cpu"])
        lines.append(
            f"| {name} | {median(r['cpu']):.0f} | {each} | {median(r['p50']):.3f} | "
            f"{median(r['p99']):.3f} | {sum(r['errors']):.0f} |"
        )
    pt = res["minimal aiohttp pass-through"]
    for name, r in res.items():
        if name.startswith("canary-gateway"):
            lines.append(
                f"- {name} / pass-through CPU per request: "
                f"{median(r['cpu']) / median(pt['cpu']):.2f}x; per round: "
                + ", ".join(f"{g / p:.2f}" for g, p in zip(r["cpu"], pt["cpu"], strict=True))
            )
    return lines


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def cpu_ab_lines(res: dict[str, tuple[list[float], list[float]]], conns: int) -> list[str]:
    rounds = len(next(iter(res.values()))[0])
    lines = [
        f"### CPU per request, interleaved A/B (wrk -t1 -c{conns}, {rounds} rounds, median)",
        "",
        "| proxy | CPU µs/request | rounds (µs) | req/s |",
        "|---|---|---|---|",
    ]
    for name, (cpu, rps) in res.items():
        each = ", ".join(f"{c:.0f}" for c in cpu)
        lines.append(f"| {name} | {median(cpu):.0f} | {each} | {median(rps):,.0f} |")
    pt = res["minimal aiohttp pass-through"]
    lines.append("")
    for name, gw in res.items():
        if name.startswith("canary-gateway"):
            lines.append(
                f"- {name} / pass-through CPU per request: {median(gw[0]) / median(pt[0]):.2f}x"
                f"; req/s: {median(gw[1]) / median(pt[1]):.2f}x; per round CPU ratios: "
                + ", ".join(f"{g / p:.2f}" for g, p in zip(gw[0], pt[0], strict=True))
            )
    return lines


@contextmanager
def profiled(pid: int, tmp: Path, enabled: bool) -> Iterator[Path | None]:
    """py-spy top functions of `pid` while the block runs (when py-spy is installed)."""
    spy = shutil.which("py-spy")
    if not enabled or spy is None:
        yield None
        return
    out = tmp / f"profile-{pid}.txt"
    proc = subprocess.Popen(
        [spy, "record", "-p", str(pid), "-f", "raw", "-o", str(out), "-r", "200", "--nonblocking"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield out
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def inclusive(raw: Path, needle: str) -> tuple[float, float]:
    """Share of samples (%) with a frame containing `needle` anywhere in the stack, and with
    it as the leaf (self time)."""
    anywhere = leaf = total = 0
    for line in raw.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        total += int(num)
        if needle in stack:
            anywhere += int(num)
            if needle in stack.split(";")[-1]:
                leaf += int(num)
    return 100.0 * anywhere / max(total, 1), 100.0 * leaf / max(total, 1)


# The connection guards' own frames (their `data_received` runs on every read).
GUARD_FRAMES = "gateway/server/connections.py"


def profile_lines(
    targets: dict[str, tuple[str, int]], tmp: Path, rate: float, duration: float
) -> list[str]:
    """py-spy of each gateway at a fixed rate: top self frames and the guards' share."""
    lines: list[str] = []
    for name, (url, pid) in targets.items():
        if not name.startswith("canary-gateway"):
            continue
        with profiled(pid, tmp, True) as prof:
            child(["_openloop", url, str(rate), str(duration)])
        if prof is None or not prof.exists():
            continue
        lines += ["", f"#### py-spy of {name} at {rate:.0f} req/s (self %)", ""]
        lines += [f"- {share:.1f}% {fn}" for fn, share in top_frames(prof, 20)]
        anywhere, leaf = inclusive(prof, GUARD_FRAMES)
        lines += [
            "",
            f"`{GUARD_FRAMES}`: {anywhere:.1f}% of samples inclusive (aiohttp's parser below "
            f"it included), {leaf:.1f}% self",
        ]
    return lines


def top_frames(raw: Path, n: int = 15) -> list[tuple[str, float]]:
    """Self time by function from a py-spy raw (collapsed stacks) file."""
    counts: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, num = line.rpartition(" ")
        leaf = stack.split(";")[-1]
        counts[leaf] = counts.get(leaf, 0) + int(num)
        total += int(num)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:n]
    return [(name, 100.0 * c / total) for name, c in ranked]


# ----------------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--rates", default="200,1000")
    ap.add_argument("--profile", action="store_true", help="py-spy the gateway at saturation")
    ap.add_argument("--cpu-rounds", type=int, default=4, help="rounds of the CPU A/B")
    ap.add_argument("--cpu-duration", type=float, default=4.0, help="seconds per A/B cell")
    ap.add_argument("--cpu-only", action="store_true", help="run only the CPU A/B")
    ap.add_argument("--fixed-rate", type=float, default=400.0, help="req/s of the fixed A/B")
    ap.add_argument("--before-root", type=Path, help="also run the gateway from this tree")
    args = ap.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y wrk nginx")
    tmp = Path(tempfile.mkdtemp(prefix="canary-overhead-"))
    procs = Procs()
    try:
        up, sim, np_fixed, np_sim = (free_port() for _ in range(4))
        conf = tmp / "nginx.conf"
        conf.write_text(
            NGINX_CONF.format(
                tmp=tmp, sim=sim, up=up, proxy_fixed=np_fixed, proxy_sim=np_sim, body=JSON_BODY
            )
        )
        if not args.cpu_only:
            procs.start(PY, __file__, "_sim", str(sim), port=sim)
        procs.start(
            "nginx", "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "err.log"),
            "-g", "daemon off;", port=up,
        )  # fmt: skip
        wait_port(np_fixed)
        fixed = f"http://127.0.0.1:{up}"
        simurl = f"http://127.0.0.1:{sim}"
        gw1, gw1_pid = gateway(procs, tmp, fixed)
        pt1, pt1_pid = passthrough(procs, tmp, fixed)
        path = "/v1/completions"
        ab = {
            "canary-gateway, 1 worker": (gw1 + path, gw1_pid),
            "minimal aiohttp pass-through": (pt1 + path, pt1_pid),
        }
        if args.before_root is not None:
            before = gateway(procs, tmp, fixed, root=args.before_root.resolve())
            ab["canary-gateway, before"] = (before[0] + path, before[1])
        if args.cpu_only:
            load0 = os.getloadavg()[0]
            fixed_res = cpu_fixed(ab, args.fixed_rate, args.cpu_duration, args.cpu_rounds)
            res = cpu_ab(ab, args.cpu_rounds, args.cpu_duration)
            print(f"Machine: {os.cpu_count()} cores, load average {load0:.1f} at the start, "
                  f"{os.getloadavg()[0]:.1f} at the end\n")  # fmt: skip
            print("\n".join(cpu_fixed_lines(fixed_res, args.fixed_rate)))
            print()
            print("\n".join(cpu_ab_lines(res, 32)))
            if args.profile:
                print("\n".join(profile_lines(ab, tmp, args.fixed_rate, args.cpu_duration * 2)))
            return 0
        gw_sim, _ = gateway(procs, tmp, simurl)
        pt_sim, _ = passthrough(procs, tmp, simurl)
        pids = {gw1: gw1_pid, pt1: pt1_pid}
        plain = {
            "direct (nginx return 200)": fixed,
            "canary-gateway, 1 worker": gw1,
            "nginx reverse proxy": f"http://127.0.0.1:{np_fixed}",
            "minimal aiohttp pass-through": pt1,
        }
        streams = {
            "direct (simulator, fast)": simurl,
            "canary-gateway, 1 worker": gw_sim,
            "nginx reverse proxy": f"http://127.0.0.1:{np_sim}",
            "minimal aiohttp pass-through": pt_sim,
        }
        rates = [float(r) for r in args.rates.split(",")]
        lines = [
            f"Machine: {os.cpu_count()} cores, load average before the run "
            f"{os.getloadavg()[0]:.1f}; every number is from one run of {args.duration:.0f} s.",
            "",
        ]
        lines += ["### Latency at fixed offered rates (open loop, ms)", ""]
        head = "| target | " + " | ".join(f"{r:.0f}/s p50 | {r:.0f}/s p99" for r in rates) + " |"
        lines += [head, "|---" * (1 + 2 * len(rates)) + "|"]
        latency: dict[str, list[tuple[float, float]]] = {}
        for name, url in plain.items():
            row = []
            for rate in rates:
                res = child(["_openloop", url + path, str(rate), str(args.duration)])
                row.append((res["p50_ms"], res["p99_ms"]))
            latency[name] = row
            cells = " | ".join(f"{a:.3f} | {b:.3f}" for a, b in row)
            lines.append(f"| {name} | {cells} |")
        base = latency["direct (nginx return 200)"]
        lines += ["", "Added over direct (ms):", ""]
        for name, row in latency.items():
            if name.startswith("direct"):
                continue
            cells = ", ".join(
                f"{rate:.0f}/s: +{a - base[i][0]:.3f} p50, +{b - base[i][1]:.3f} p99"
                for i, (rate, (a, b)) in enumerate(zip(rates, row, strict=True))
            )
            lines.append(f"- {name}: {cells}")
        lines += ["", "### Saturation (wrk -t1 -c64, closed loop)", ""]
        lines += ["| target | req/s | p50 ms | proxy CPU µs/request |", "|---|---|---|---|"]
        sat: dict[str, float] = {}
        cpu: dict[str, float] = {}
        for name, url in plain.items():
            pid = pids.get(url)
            before = cpu_seconds(pid) if pid else 0.0
            rps, p50, _ = wrk(url + path, args.duration)
            if pid:
                cpu[name] = (cpu_seconds(pid) - before) / (rps * args.duration) * 1e6
            sat[name] = rps
            cell = f"{cpu[name]:.0f}" if name in cpu else "-"
            lines.append(f"| {name} | {rps:,.0f} | {p50:.2f} | {cell} |")
        gw2, _ = gateway(procs, tmp, fixed, "--workers", "2")
        rps2, p50_2, _ = wrk(gw2 + path, args.duration, conns=128)
        lines.append(f"| canary-gateway, --workers 2 | {rps2:,.0f} | {p50_2:.2f} |")
        one = sat["canary-gateway, 1 worker"]
        lines += [
            "",
            f"- gateway / minimal pass-through: {one / sat['minimal aiohttp pass-through']:.2f}x "
            "requests/s; CPU per request: "
            f"{cpu['minimal aiohttp pass-through'] / cpu['canary-gateway, 1 worker']:.2f}x "
            "as efficient",
            f"- gateway / nginx reverse proxy: {one / sat['nginx reverse proxy']:.2f}x",
            f"- --workers 2 / 1 worker: {rps2 / one:.2f}x",
        ]
        if args.cpu_rounds:
            lines += ["", *cpu_ab_lines(cpu_ab(ab, args.cpu_rounds, args.cpu_duration), 32)]
        lines += ["", "### SSE events/s, 64 concurrent streams (simulator, fast profile)", ""]
        lines += ["| target | events/s | vs direct |", "|---|---|---|"]
        direct_ev = 0.0
        for name, url in streams.items():
            ev = child(["_sse", url, "64", str(args.duration)])["events_per_s"]
            direct_ev = direct_ev or ev
            lines.append(f"| {name} | {ev:,.0f} | {ev / direct_ev:.2f}x |")
        lines += ["", "### Per-chunk delay, upstream send -> client receipt (ms, 2 ms pacing)", ""]
        lines += ["| target | p50 | p99 | added p50 | added p99 |", "|---|---|---|---|---|"]
        d0: dict[str, float] = {}
        for name, url in streams.items():
            res = child(["_chunkdelay", url, "20"])
            d0 = d0 or res
            lines.append(
                f"| {name} | {res['p50_ms']:.3f} | {res['p99_ms']:.3f} | "
                f"{res['p50_ms'] - d0['p50_ms']:+.3f} | {res['p99_ms'] - d0['p99_ms']:+.3f} |"
            )
        with profiled(gw1_pid, tmp, args.profile) as gw_profile:
            wrk(gw1 + path, args.duration)
        if gw_profile is not None and gw_profile.exists():
            lines += ["", "### Where the gateway's time goes at saturation (py-spy, self %)", ""]
            lines += [f"- {share:.1f}% {name}" for name, share in top_frames(gw_profile)]
        print("\n".join(lines))
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("_"):
        import uvloop

        cmd, rest = sys.argv[1], sys.argv[2:]
        if cmd == "_sim":
            uvloop.run(_sim(int(rest[0])))
            sys.exit(0)
        runners = {
            "_openloop": lambda: _open_loop(rest[0], float(rest[1]), float(rest[2])),
            "_sse": lambda: _sse(rest[0], int(rest[1]), float(rest[2])),
            "_chunkdelay": lambda: _chunk_delay(rest[0], int(rest[1])),
        }
        print(json.dumps(uvloop.run(runners[cmd]())))
        sys.exit(0)
    sys.exit(main())
