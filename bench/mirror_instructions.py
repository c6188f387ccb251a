"""Instructions per mirrored copy in the mirror process, and where they go (issue 34).

    .venv/bin/python bench/mirror_instructions.py [--copies 1000] [--batch 20] [--keep DIR]

The mirror process (`gateway.mirror.plane.serve_plane`, real SQLite, `[mirror] priority =
"normal"`) runs alone under `valgrind --tool=callgrind`, with one fast candidate at 100 %: nginx
`return 200` with a tiny chat completion. This script plays the worker on the plane's Unix
socket: per copy one COPY frame (a tiny non-streamed chat request, its header list, the
candidate chosen) and one RESULT frame (production's meter result), `--batch` copies at a time
followed by an IDLE frame; the next batch goes when the IDLE_ACK says every copy before it is
finished, so the process always keeps up (closed loop, nothing dropped for want of CPU).

1. callgrind: `--warmup` copies, the counters are zeroed (`callgrind_control -z`), `--copies`
   copies, dump; then zeroed again and dumped after `--idle-s` seconds with no copies: the
   background (stats broadcast, registry poll, counter flushes) per second. Net instructions
   per copy = (run - background rate x run's wall time) / copies observed. Independent of the
   machine's load, except the background's share, which scales with wall time (small: it is
   printed).
2. the same without valgrind under cProfile (enabled after the warm-up): each Python
   function's self time, C callees charged to their Python caller, grouped by file into the
   mirror's stages (`STAGES`); a stage's instructions are the net total times its share.

Copies observed are read from the plane's own STATS frame (the candidate's accounting row);
the script fails if the row does not add up or a copy is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import ROOT, Procs, free_port  # siblings, found through sys.path
from stages import PROFILED, _wait_dump, self_cost_by_object, stage_shares

from domain.accounting import identity_holds
from gateway.mirror.channel import frames
from gateway.server.meter import MeterResult

PY = sys.executable
CANDIDATE = "fast"
ANSWER = (
    '{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,'
    '"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7}}'
)
NGINX = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port} reuseport;
    location / {{ default_type application/json; return 200 '{body}'; }}
  }}
}}
"""
# The mirror process as `canary serve` starts it (gateway.process.children._plane_main), minus
# the priority drop and the parent-death signal; `{overrides}`: config keys of the run.
PLANE_TEMPLATE = """
import asyncio, signal, sys
from gateway.config.load import load_config
from gateway.lifecycle import run_loop, settle_heap
from gateway.mirror.plane import serve_plane
socket_path, db_url, live, cand = sys.argv[1:5]
config = load_config(None, environ={{}}, overrides={{
    "storage.db_url": db_url, "live.url": live,
    "candidates": [{{"name": "fast", "url": cand, "sample_rate": 1.0}}],
    {overrides}
}})
async def main():
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # Ready: the heap settled, as the real mirror process does (gateway/process/children.py).
    await serve_plane(config, socket_path, "bench-mirror", "normal", settle_heap, stop)
run_loop(main(), config.server.event_loop)
"""
PLANE = PLANE_TEMPLATE.format(
    overrides="""
    "mirror.priority": "normal",
    # Valgrind slows the loop down 50-fold: no overload shedding, every copy is sent.
    "mirror.shed_loop_lag_ms": 1e9, "mirror.shed_cpu_busy": 0,
    # Batches by size only (`writer_batch_size`, 500 records), as at 1,000 copies/s: with the
    # 0.5 s timer a slowed-down run would write many small batches, and how many would depend
    # on the wall time (the load), not on the copies.
    "storage.writer_flush_interval_s": 3600.0,"""
)
# (stage, path fragments of the files it covers), first match wins.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("frame read/decode, dispatch (plane.py, asyncio streams)",
     ("gateway/mirror/plane.py", "asyncio/streams.py")),
    ("tee: on_request/on_response (tee.py, sampling)",
     ("gateway/mirror/tee.py", "gateway/mirror/sampling/")),
    ("ring/lane/order (replay/ring, lane, order)",
     ("replay/ring.py", "replay/lane.py", "replay/order.py")),
    ("observation/record (observe, sinks, splits, counters, evidence, scoring)",
     ("replay/observe.py", "replay/sinks.py", "replay/splits.py", "gateway/mirror/counters.py",
      "gateway/mirror/evidence.py", "gateway/mirror/scoring/", "domain/")),
    ("meter (meter.py)", ("gateway/server/meter.py",)),
    ("HTTP client (upstream pool, aiohttp client, yarl, multidict)",
     ("gateway/server/upstream.py", "aiohttp/client", "aiohttp/connector.py",
      "aiohttp/streams.py", "aiohttp/tracing.py", "aiohttp/cookiejar.py",
      "aiohttp/http_parser.py", "aiohttp/_http_parser", "aiohttp/http_writer.py",
      "aiohttp/payload.py", "aiohttp/helpers.py",
      "aiohttp/base_protocol.py", "/yarl/", "/multidict/", "/propcache/")),
    ("storage writer (storage/, SQLAlchemy, aiosqlite, sqlite3)",
     ("storage/", "sqlalchemy", "aiosqlite", "sqlite3", "threading.py", "queue.py")),
)  # fmt: skip
OTHER = "event loop/other"

_encode = msgspec.msgpack.Encoder().encode
_decode_stats = msgspec.msgpack.Decoder(frames.StatsMeta).decode
_BODY = b'{"model":"m","messages":[{"role":"user","content":"hello %d"}],"max_tokens":8}'
_HEADERS = [
    ("Host", "127.0.0.1:8080"),
    ("User-Agent", "python-httpx/0.27"),
    ("Accept", "application/json"),
    ("Content-Type", "application/json"),
    ("Authorization", "Bearer sk-test"),
]
_RESULT = MeterResult(
    status=200,
    is_sse=False,
    ttft_s=0.0009,
    e2e_s=0.0009,
    last_byte_s=0.0009,
    usage_tokens=1,  # the engine's count, as the meter keeps it; the mirror counts the text
    prompt_tokens=6,
    finish_reason="stop",
    chunk_count=1,
    text="ok",
    bytes_total=len(ANSWER),
)


def copy_frames(i: int) -> Iterator[bytes]:
    """One copy as a worker sends it: COPY (meta + body), then production's RESULT."""
    exchange = f"bench-{os.getpid()}-{i}"
    body = _BODY % i
    meta = _encode(
        frames.CopyMeta(exchange, "POST", "/v1/chat/completions", f"req-{i}", time.time(),
                        "live", "bench-worker", _HEADERS, [CANDIDATE])
    )  # fmt: skip
    yield frames.frame_header(frames.KIND_COPY, len(meta), len(body)) + meta + body
    meta = _encode(frames.ResultMeta(exchange, None, _RESULT))
    yield frames.frame_header(frames.KIND_RESULT, len(meta), 0) + meta


class Worker:
    """The worker's side of the plane's socket: sends copies, reads STATS and IDLE_ACK."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.sent = 0
        self.seq = 0
        self.acks: dict[int, asyncio.Future[None]] = {}
        self.stats: frames.StatsMeta | None = None
        self.stats_seen = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        while True:
            head = await self.reader.readexactly(frames.FRAME.size)
            kind, mlen, blen = frames.FRAME.unpack(head)
            meta = await self.reader.readexactly(mlen + blen)
            if kind == frames.KIND_STATS:
                self.stats = _decode_stats(meta[:mlen])
                self.stats_seen.set()
            elif kind == frames.KIND_IDLE_ACK:
                seq = msgspec.msgpack.decode(meta[:mlen], type=frames.IdleMeta).seq
                fut = self.acks.pop(seq, None)
                if fut is not None:
                    fut.set_result(None)

    async def send(self, n: int, batch: int) -> None:
        """`n` copies, `batch` at a time, each batch finished before the next is sent."""
        loop = asyncio.get_running_loop()
        left = n
        while left:
            k = min(batch, left)
            parts: list[bytes] = []
            for _ in range(k):
                parts.extend(copy_frames(self.sent))
                self.sent += 1
            self.seq += 1
            fut: asyncio.Future[None] = loop.create_future()
            self.acks[self.seq] = fut
            idle = _encode(frames.IdleMeta(self.seq))
            parts.append(frames.frame_header(frames.KIND_IDLE, len(idle), 0) + idle)
            self.writer.write(b"".join(parts))
            await self.writer.drain()
            await asyncio.wait_for(fut, 600)
            left -= k

    async def fresh_stats(self) -> dict[str, int]:
        """The candidate's accounting row from a STATS frame sent after this call."""
        self.stats_seen.clear()
        await asyncio.wait_for(self.stats_seen.wait(), 60)
        assert self.stats is not None
        return self.stats.counters.get(CANDIDATE, {})


async def _connect(path: str, wait_s: float = 600) -> Worker:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    worker = Worker(reader, writer)
    await asyncio.wait_for(worker.stats_seen.wait(), wait_s)  # the plane is ready
    return worker


def _observed(row: dict[str, int]) -> int:
    return sum(v for k, v in row.items() if k.startswith("observed_"))


async def _seed(db_url: str, live: str, cand: str) -> None:
    from gateway.config.load import load_config
    from gateway.process.runtime import prepare_storage
    from storage import queries
    from storage.engine import make_engine

    config = load_config(None, environ={}, overrides={
        "storage.db_url": db_url, "live.url": live,
        "candidates": [{"name": CANDIDATE, "url": cand, "sample_rate": 1.0}],
    })  # fmt: skip
    await prepare_storage(config)
    engine = make_engine(db_url)
    try:
        await queries.seed(
            engine, config.live.endpoint(live), [c.to_endpoint() for c in config.candidates]
        )
    finally:
        await engine.dispose()


class Setup:
    """nginx (live and candidate), a fresh SQLite file seeded with both endpoints."""

    def __init__(self, tmp: Path, token_counter: str | None = None) -> None:
        self.tmp = tmp
        self.procs = Procs()
        port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX.format(tmp=tmp, port=port, body=ANSWER))
        self.procs.start("nginx", "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "err.log"),
                         "-g", "daemon off;", port=port)  # fmt: skip
        self.url = f"http://127.0.0.1:{port}"
        self.script = tmp / "plane.py"
        counter = "" if token_counter is None else f'"mirror.token_counter": "{token_counter}",'
        self.script.write_text(PLANE.replace('"mirror.priority"', counter + '"mirror.priority"'))
        self.runs = 0

    def fresh(self) -> tuple[str, str]:
        """A new database and socket path for one run of the plane."""
        self.runs += 1
        db_url = f"sqlite+aiosqlite:///{self.tmp / f'canary{self.runs}.db'}"
        asyncio.run(_seed(db_url, self.url, self.url))
        return db_url, str(self.tmp / f"plane{self.runs}.sock")

    def plane(self, prefix: list[str], socket_path: str, db_url: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*prefix, str(self.script), socket_path, db_url, self.url, self.url],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _check(row: dict[str, int], expect: int) -> int:
    full = {**row, "pending": row.get("pending", 0)}
    assert identity_holds(full), f"the accounting row does not add up: {row}"
    assert row.get("sampled", 0) == expect, f"sampled {row.get('sampled')} != {expect}: {row}"
    return _observed(row)


def callgrind_run(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    db_url, sock = setup.fresh()
    out = setup.tmp / "callgrind.mirror"
    proc = setup.plane(callgrind_prefix(out), sock, db_url)

    async def drive() -> dict[str, Any]:
        worker = await _connect(sock)
        await worker.send(args.warmup, args.batch)
        before = _observed(await worker.fresh_stats())
        zero(proc.pid)  # the plane waits meanwhile: nothing is in flight between batches
        t0 = time.monotonic()
        await worker.send(args.copies, args.batch)
        wall = time.monotonic() - t0
        run = dump(proc.pid, out)
        after = _check(await worker.fresh_stats(), args.warmup + args.copies)
        idle, idle_wall = await idle_dump(proc.pid, out, args.idle_s)
        worker.writer.close()
        return {"run": run, "wall": wall, "idle": idle, "idle_wall": idle_wall,
                "observed": after - before, "row": worker.stats.counters}  # fmt: skip

    try:
        res = asyncio.run(drive())
    finally:
        _stop(proc)
    missing = f"{res['observed']} of {args.copies} observed: {res['row']}"
    assert res["observed"] == args.copies, missing
    text = res["run"].read_text(errors="replace")
    total = _total(text)
    background, net = less_background(total, res["idle"], res["idle_wall"], res["wall"])
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(res["run"], args.keep / "callgrind.mirror.out")
    return {
        "observed": res["observed"],
        "row": res["row"],
        "raw": total / res["observed"],
        "background_per_s": background,
        "wall": res["wall"],
        "net": net / res["observed"],
        "objects": {k: v / res["observed"] for k, v in self_cost_by_object(text).items()},
    }


def callgrind_prefix(out: Path) -> list[str]:
    """The command line before the script's: Python under callgrind, dumps to `out`.<pid>."""
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", PY]


def zero(pid: int) -> None:
    """Zero the callgrind counters of `pid`."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)


def dump(pid: int, out: Path) -> Path:
    """Dump the callgrind counters of `pid` (started with `callgrind_prefix(out)`): the file."""
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    time.sleep(1)
    dumps = sorted(out.parent.glob(f"{out.name}.{pid}*"), key=lambda p: p.stat().st_mtime)
    return dumps[-1]


async def idle_dump(pid: int, out: Path, idle_s: float) -> tuple[Path, float]:
    """Counters zeroed, `idle_s` with no copies, dumped: (the dump, its wall time)."""
    zero(pid)
    t0 = time.monotonic()
    await asyncio.sleep(idle_s)
    wall = time.monotonic() - t0
    return dump(pid, out), wall


def less_background(total: int, idle: Path, idle_wall: float, wall: float) -> tuple[float, float]:
    """(The background's instructions per second from the idle dump, `total` less the
    background over `wall`)."""
    background = _total(idle.read_text(errors="replace")) / idle_wall
    return background, total - background * wall


def _total(text: str) -> int:
    import re

    m = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    assert m is not None, "no totals in the callgrind dump"
    return int(m.group(1))


def stage_of(filename: str) -> str | None:
    for name, parts in STAGES:
        if any(p in filename for p in parts):
            return name
    return None


def profile_run(setup: Setup, args: argparse.Namespace) -> tuple[dict[str, float], Any]:
    """Each stage's share of the profiled self time, and the top functions by self time."""
    db_url, sock = setup.fresh()
    out = setup.tmp / "prof.mirror"
    wrapper = setup.tmp / "profiled.py"
    wrapper.write_text(PROFILED)
    proc = setup.plane([PY, str(wrapper), str(out)], sock, db_url)

    async def drive() -> None:
        worker = await _connect(sock)
        await worker.send(args.warmup, args.batch)
        proc.send_signal(signal.SIGUSR1)
        await asyncio.sleep(0.2)
        await worker.send(args.copies, args.batch)
        proc.send_signal(signal.SIGUSR2)
        worker.writer.close()

    try:
        asyncio.run(drive())
        _wait_dump(out)
    finally:
        _stop(proc)
    stats = pstats.Stats(str(out)).stats  # type: ignore[attr-defined]
    whole = sum(entry[2] for entry in stats.values())
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[: args.top]
    return stage_shares(stats, stage_of), (top, whole)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batch", type=int, default=20, help="copies per IDLE round trip")
    ap.add_argument("--idle-s", type=float, default=10.0, help="background measure (seconds)")
    ap.add_argument("--top", type=int, default=25, help="functions listed by self time")
    ap.add_argument("--keep", type=Path, help="copy the callgrind dump here")
    ap.add_argument("--no-profile", action="store_true", help="callgrind only")
    ap.add_argument("--token-counter", help='[mirror] token_counter ("off": no /tokenize)')
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "nginx"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y valgrind nginx")
    tmp = Path(tempfile.mkdtemp(prefix="canary-mirror-instr-"))
    load0 = os.getloadavg()[0]
    setup = Setup(tmp, args.token_counter)
    try:
        cg = callgrind_run(setup, args)
        shares, (top, whole) = ({}, ([], 1.0)) if args.no_profile else profile_run(setup, args)
    finally:
        setup.procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Machine: {os.cpu_count()} cores, load average {load0:.1f} -> "
          f"{os.getloadavg()[0]:.1f}; {args.copies} copies after {args.warmup} of warm-up, "
          f"batches of {args.batch}\n")  # fmt: skip
    print(f"Accounting rows at the end: {cg['row']}\n")
    print(f"Copies observed: {cg['observed']}; callgrind raw {cg['raw'] / 1e3:,.1f}K "
          f"instructions / copy; background {cg['background_per_s'] / 1e3:,.0f}K / s over "
          f"{cg['wall']:.1f} s; **net {cg['net'] / 1e3:,.1f}K instructions / copy**\n")  # fmt: skip
    if shares:
        print("| stage | K instr/copy | share |\n|---|---:|---:|")
        for name in sorted(shares, key=lambda n: -shares[n]):
            print(f"| {name} | {shares[name] * cg['net'] / 1e3:,.1f} | {shares[name]:.1%} |")
        print("\n| function (cProfile self time) | share |\n|---|---:|")
        for (filename, line, fn), (_cc, nc, tt, _ct, _c) in top:
            short = "/".join(filename.split("/")[-2:])
            print(f"| {short}:{line} {fn} ({nc} calls) | {tt / whole:.1%} |")
    print("\n| object (callgrind self cost, raw run) | share |\n|---|---:|")
    objects: dict[str, float] = cg["objects"]
    whole_objects = sum(objects.values())
    for name in sorted(objects, key=lambda n: -objects[n])[:10]:
        print(f"| {name.split('/')[-1]} | {objects[name] / whole_objects:.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
