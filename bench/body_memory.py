"""Memory held by slow uploads: `canary serve` RSS while N clients each send all but the last
KiB of a large body and then stall, with the bodies-in-flight budget at its default and with it
effectively off (the behaviour before the budget existed), in one interleaved run.

    .venv/bin/python bench/body_memory.py [--clients 12] [--mib 60] [--rounds 2]

Prints one row per (round, setting): RSS before, RSS while the uploads stall, how many got a
503 at once. Everything runs on 127.0.0.1; the gateway is a real `canary serve` process with
the built-in simulator as live endpoint and a throwaway SQLite file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import time

MiB = 1024 * 1024
OFF = str(1 << 40)  # a budget nothing reaches: the old behaviour


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def _wait_ready(port: int) -> None:
    for _ in range(300):
        with contextlib.suppress(OSError):
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if (await r.read()).startswith(b"HTTP/1.1 200"):
                w.close()
                return
        await asyncio.sleep(0.1)
    raise RuntimeError("gateway did not start")


async def _stalled_upload(port: int, size: int) -> tuple[asyncio.StreamWriter, bytes]:
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % size)
    block = b"x" * MiB
    sent = 0
    answer = b""
    while sent < size - 1024:
        n = min(len(block), size - 1024 - sent)
        w.write(block[:n])
        sent += n
        try:
            await w.drain()
        except ConnectionError:
            break
        with contextlib.suppress(TimeoutError):
            answer = await asyncio.wait_for(r.read(12), 0.0001)
        if answer:
            break
    return w, answer


async def one(budget: str, clients: int, size: int) -> tuple[float, float, int]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "CANARY_MAX_BODY_BYTES_IN_FLIGHT": budget,
               "CANARY_BODY_READ_TIMEOUT_S": "600", "CANARY_DRAIN_TIMEOUT_S": "0.5"}  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli.main", "serve", "--listen", f"127.0.0.1:{port}",
            "--db", f"sqlite+aiosqlite:///{tmp}/b.db",
            env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            await _wait_ready(port)
            before = _rss_mib(proc.pid)
            results = await asyncio.gather(*(_stalled_upload(port, size) for _ in range(clients)))
            await asyncio.sleep(1.0)
            held = _rss_mib(proc.pid)
            refused = sum(1 for _, a in results if a.startswith(b"HTTP/1.1 503"))
            for w, _ in results:
                w.close()
            return before, held, refused
        finally:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 15)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--mib", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f}; {args.clients} clients x {args.mib} MiB, stalled")
    print("| round | max_body_bytes_in_flight | RSS before MiB | RSS stalled MiB | refused 503 |")
    print("|---|---|---|---|---|")
    for rnd in range(args.rounds):
        for label, budget in (("default 256 MiB", str(256 * MiB)), ("off (old)", OFF)):
            t0 = time.monotonic()
            before, held, refused = await one(budget, args.clients, args.mib * MiB)
            print(f"| {rnd + 1} | {label} | {before:.0f} | {held:.0f} | {refused} |"
                  f"  <!-- {time.monotonic() - t0:.0f} s -->")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
