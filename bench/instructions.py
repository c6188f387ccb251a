"""Instructions per proxied request under valgrind's callgrind: the contention-proof comparison.

    .venv/bin/python bench/instructions.py [--requests 1000] [--before-root DIR]

On a shared machine CPU time per request moves with the neighbours (cache misses, fewer requests
per wake-up); instruction counts do not. Each proxy runs alone under `valgrind --tool=callgrind`
in front of nginx `return 200`: the bare gateway app (`gateway.server.app.start_gateway`: proxy,
meter, connection guards; no mirror or storage, whose timers would dominate a slowed-down run),
the same from `--before-root` (e.g. a `git archive` of an earlier commit), the minimal aiohttp
pass-through of bench/overhead.py, and with `--guards-off` this tree with the connection guards'
per-read and per-connection hooks replaced by aiohttp's own (what the guards cost). A client
warms each up with 200 requests, the counters are zeroed (`callgrind_control -z`), then it sends
exactly `--requests` requests over 8 keep-alive connections and the counters are dumped:
instructions / requests. It prints a markdown table.

`--candidate` adds three rows where every request is a small `POST /v1/chat/completions` (a
mirrored route): the pass-through, this tree with mirroring off, and this tree with one
candidate sampled at 100 %: the worker's `Handoff` tee connected to a Unix socket whose reader
(another process, standing where the mirror process listens) discards what arrives. The
difference of the last two is the worker's cost of mirroring a request (sampling decision, copy
frame, production's result frame, the meter the tee needs); the mirror process's own cost is
not in it (bench/plane.py measures that).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from overhead import (  # a sibling script, found through sys.path above
    JSON_BODY,
    NGINX_CONF,
    PASSTHROUGH,
    ROOT,
    Procs,
    free_port,
    wait_port,
)

PY = sys.executable
BARE_GATEWAY = """
import asyncio, sys, uvloop
from aiohttp.web_protocol import RequestHandler
from gateway.server import connections
from gateway.server.app import start_gateway
if sys.argv[3:] == ["guards-off"]:  # aiohttp's own per-read and per-connection code only
    connections._Handler.data_received = RequestHandler.data_received
    connections._Handler.connection_lost = RequestHandler.connection_lost
    connections.GuardedServer.connection_made = connections.Server.connection_made
    connections.GuardedServer.connection_lost = connections.Server.connection_lost
def config():
    try:  # the configuration by section
        from gateway.config.sections import GatewayConfig, LiveConfig, ServerConfig
    except ImportError:  # a --before-root from before the sections: one flat GatewayConfig
        from gateway.config import GatewayConfig
        return GatewayConfig(listen="127.0.0.1:" + sys.argv[1], live_url=sys.argv[2])
    return GatewayConfig(
        server=ServerConfig(listen="127.0.0.1:" + sys.argv[1]), live=LiveConfig(url=sys.argv[2])
    )
async def main():
    tee = None
    cfg = config()
    if sys.argv[3:4] and sys.argv[3].startswith("candidate="):  # one candidate at 100 %
        from domain.endpoint import Endpoint
        from gateway.mirror.channel.handoff import Handoff
        from gateway.server.hooks import LiveTarget
        live = LiveTarget(cfg.live.endpoint(cfg.live.url))
        tee = Handoff(cfg.mirror, live, sys.argv[3].split("=", 1)[1], "w0",
                      session_header=cfg.server.session_header)
        await tee.start()
        tee.apply([Endpoint(name="fast", url="http://127.0.0.1:9", sample_rate=1.0)])
        gw = await start_gateway(cfg, live=live, tee=tee)
    else:
        gw = await start_gateway(cfg)
    try:  # the heap settled once serving, as `canary serve` does (from gateway.lifecycle on)
        from gateway.lifecycle import settle_heap
    except ImportError:  # a --before-root from before it
        pass
    else:
        settle_heap()
    try:
        await asyncio.Event().wait()
    finally:
        await gw.close()
uvloop.run(main())
"""
# Where the mirror process would listen: reads the worker's frames and discards them.
DRAIN = """
import asyncio, sys
class Drain(asyncio.Protocol):
    def data_received(self, data):
        pass
async def main():
    await asyncio.get_running_loop().create_unix_server(Drain, sys.argv[1])
    await asyncio.Event().wait()
asyncio.run(main())
"""
CHAT_PATH = "/v1/chat/completions"
CHAT_BODY = b'{"model":"m","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":8}'


async def _send(url: str, n: int, conns: int = 8, body: bytes | None = None) -> None:
    import aiohttp

    left = n
    method = "GET" if body is None else "POST"
    headers = None if body is None else {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conns)) as http:

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with http.request(method, url, data=body, headers=headers) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status

        await asyncio.gather(*(worker() for _ in range(conns)))


@contextlib.contextmanager
def under_callgrind(
    script: Path, root: Path, up: str, tmp: Path, *extra: str
) -> Iterator[tuple[int, Callable[[], None], Callable[[], Path]]]:
    """`script` (a proxy on a port, in front of `up`) running under callgrind: its port, a
    function zeroing its counters and one dumping them (the dump's path)."""
    port = free_port()
    out = tmp / f"callgrind.{port}"
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p", PY, str(script),
         str(port), up, *extra],
        cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def control(flag: str) -> None:
        subprocess.run(["callgrind_control", flag, str(proc.pid)], check=True, capture_output=True)

    def dump() -> Path:
        control("-d")
        time.sleep(1)
        dumps = sorted(tmp.glob(f"{out.name}.{proc.pid}*"), key=lambda p: p.stat().st_mtime)
        return dumps[-1]

    try:
        wait_port(port, timeout=600)
        yield port, lambda: control("-z"), dump
    finally:
        proc.terminate()
        proc.wait(60)


def callgrind_dump(script: Path, root: Path, up: str, requests: int, tmp: Path, *extra: str,
                   chat: bool = False) -> Path:  # fmt: skip
    """Run `script` under callgrind, warm it up with 200 requests, zero the counters, send
    `requests` (GET /v1/completions, or with `chat` a small POST /v1/chat/completions), dump:
    the dump's path."""
    with under_callgrind(script, root, up, tmp, *extra) as (port, zero, dump):
        path, body = (CHAT_PATH, CHAT_BODY) if chat else ("/v1/completions", None)
        url = f"http://127.0.0.1:{port}{path}"
        asyncio.run(_send(url, 200, body=body))
        zero()
        asyncio.run(_send(url, requests, body=body))
        return dump()


def total_per_request(text: str, requests: int) -> float:
    total = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.M)
    assert total is not None, "no totals in the callgrind dump"
    return int(total.group(1)) / requests


def measure(script: Path, root: Path, up: str, requests: int, tmp: Path, *extra: str,
            chat: bool = False) -> float:  # fmt: skip
    dump = callgrind_dump(script, root, up, requests, tmp, *extra, chat=chat)
    return total_per_request(dump.read_text(errors="replace"), requests)


def start_drain(procs: Procs, tmp: Path) -> str:
    """A process standing where the mirror process listens, discarding what the worker's tee
    writes (`DRAIN`): its Unix socket's path, once it listens."""
    sock = str(tmp / "plane.sock")
    drain = tmp / "drain.py"
    drain.write_text(DRAIN)
    procs.start(PY, str(drain), sock)
    for _ in range(100):
        if Path(sock).exists():
            break
        time.sleep(0.05)
    return sock


def setup(procs: Procs, tmp: Path) -> tuple[str, Path, Path]:
    """nginx `return 200` started in `procs` (its URL), and the bare gateway's and the
    pass-through's scripts written to `tmp`: what every callgrind measure here runs against."""
    up, np_fixed, np_sim, sim = (free_port() for _ in range(4))
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(tmp=tmp, sim=sim, up=up, proxy_fixed=np_fixed,
                                      proxy_sim=np_sim, body=JSON_BODY))  # fmt: skip
    procs.start("nginx", "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "err.log"),
                "-g", "daemon off;", port=up)  # fmt: skip
    gw_script, pt_script = tmp / "bare_gateway.py", tmp / "passthrough.py"
    gw_script.write_text(BARE_GATEWAY)
    pt_script.write_text(PASSTHROUGH)
    return f"http://127.0.0.1:{up}", gw_script, pt_script


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--before-root", type=Path)
    ap.add_argument(
        "--guards-off", action="store_true",
        help="also this tree with the connection guards' per-read and per-connection code off",
    )  # fmt: skip
    ap.add_argument(
        "--candidate", action="store_true",
        help="also POST chat requests: pass-through, mirroring off, one candidate at 100 %%",
    )  # fmt: skip
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "nginx"):
        if shutil.which(tool) is None:
            sys.exit(f"{tool} is missing: apt-get install -y valgrind nginx")
    tmp = Path(tempfile.mkdtemp(prefix="canary-instr-"))
    procs = Procs()
    try:
        live, gw_script, pt_script = setup(procs, tmp)
        rows = {"canary-gateway proxy (this tree)": measure(gw_script, ROOT, live, args.requests,
                                                            tmp)}  # fmt: skip
        if args.before_root is not None:
            root = args.before_root.resolve()
            rows["canary-gateway proxy (before)"] = measure(gw_script, root, live, args.requests,
                                                            tmp)  # fmt: skip
        if args.guards_off:
            rows["canary-gateway proxy (this tree, guards off)"] = measure(
                gw_script, ROOT, live, args.requests, tmp, "guards-off"
            )
        rows["minimal aiohttp pass-through"] = measure(pt_script, ROOT, live, args.requests, tmp)
        if args.candidate:
            sock = start_drain(procs, tmp)
            rows["POST chat: minimal aiohttp pass-through"] = measure(
                pt_script, ROOT, live, args.requests, tmp, chat=True
            )
            rows["POST chat: canary-gateway, mirroring off"] = measure(
                gw_script, ROOT, live, args.requests, tmp, chat=True
            )
            rows["POST chat: canary-gateway, one candidate at 100 %"] = measure(
                gw_script, ROOT, live, args.requests, tmp, f"candidate={sock}", chat=True
            )
    finally:
        procs.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    base = rows["minimal aiohttp pass-through"]
    print(f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (instruction "
          f"counts do not depend on it); {args.requests} requests per proxy\n")  # fmt: skip
    print("| proxy | instructions / request | vs pass-through |\n|---|---:|---:|")
    for name, n in rows.items():
        ref = base
        if name.startswith("POST chat"):
            ref = rows["POST chat: minimal aiohttp pass-through"]
        print(f"| {name} | {n / 1e3:,.1f}K | {n / ref:.3f}x |")
    if args.candidate:
        off = rows["POST chat: canary-gateway, mirroring off"]
        on = rows["POST chat: canary-gateway, one candidate at 100 %"]
        print(f"\nMirroring a request (tee, copy frame, result frame, meter) costs the worker "
              f"{(on - off) / 1e3:,.1f}K instructions ({on / off - 1:+.1%}).")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
