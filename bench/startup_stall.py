"""Start-up stall benchmark: what registering a candidate costs the production event loop.

Two measurements, one run:

1. The suspects in isolation, on this process's loop: creating a lane's aiohttp session and
   connector the first time and again (aiohttp builds its default SSL contexts lazily on the
   first `TCPConnector`), and constructing a whole `Lane` and starting its workers.
2. The real gateway (`running()`: a worker plus the host's mirror process): a probe task on the
   worker's loop wakes every 1 ms and records how late it is, while `--cycles` candidates are
   registered and deleted through the admin API; the same number of admin reads is the baseline.
   In the mirror-process model the lanes start in the mirror process, so the worker's worst
   wake-up during registrations should match the baseline's.

Usage: `python bench/startup_stall.py [--cycles 10]`. Prints the numbers for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


async def suspects() -> None:
    from domain.endpoint import Endpoint
    from gateway.config.sections import GatewayConfig
    from gateway.mirror.replay.lane import Lane
    from gateway.mirror.replay.ring import MemoryBudget
    from gateway.mirror.replay.sinks import InMemorySink
    from gateway.server.app import make_client_session

    for label in ("first ClientSession+TCPConnector", "second ClientSession+TCPConnector"):
        t = time.perf_counter()
        session = make_client_session(limit=8, keepalive_s=60.0, connect_timeout_s=5.0)
        print(f"{label}: {(time.perf_counter() - t) * 1000:.2f} ms")
        await session.close()
    cfg = GatewayConfig()
    for i in range(3):
        t = time.perf_counter()
        lane = Lane(
            Endpoint(name=f"c{i}", url="http://127.0.0.1:9", sample_rate=1.0),
            MemoryBudget(1 << 20),
            InMemorySink(),
            mirror=cfg.mirror,
            upstream=cfg.upstream,
            storage=cfg.storage,
            credentials=cfg.credentials,
        )
        lane.start()
        print(f"Lane() + start() #{i + 1}: {(time.perf_counter() - t) * 1000:.2f} ms")
        await lane.close()


async def probe(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + 0.001
        await asyncio.sleep(0.001)
        lags.append(loop.time() - due)


async def gateway_run(cycles: int) -> None:
    from gateway.config.load import load_config
    from gateway.process.runtime import running
    from gateway.sim.server import start_sim

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            None,
            environ={},
            overrides={
                "listen": "127.0.0.1:0",
                "db_url": f"sqlite+aiosqlite:///{tmp}/stall.db",
                "insecure_admin": True,
            },
        )
        async with (
            await start_sim("fast") as cand,
            running(cfg) as parts,
            aiohttp.ClientSession() as http,
        ):
            base = parts.url + "/admin/candidates"
            for label in ("admin reads (baseline)", "register + delete"):
                lags: list[float] = []
                stop = asyncio.Event()
                task = asyncio.get_running_loop().create_task(probe(lags, stop))
                for i in range(cycles):
                    if label.startswith("admin"):
                        async with http.get(base) as resp:
                            await resp.read()
                        await asyncio.sleep(0.3)
                        continue
                    body = {"name": f"s{i}", "url": cand.url, "sample_rate": 1.0}
                    async with http.post(base, json=body) as resp:
                        assert resp.status == 201, await resp.text()
                    await asyncio.sleep(0.3)  # the mirror process reloads and starts the lane
                    async with http.delete(f"{base}/s{i}") as resp:
                        assert resp.status in (200, 204), await resp.text()
                stop.set()
                await task
                lags.sort()
                print(
                    f"worker loop during {cycles} x {label}: wake-ups {len(lags)}, "
                    f"p99 {lags[int(0.99 * len(lags))] * 1000:.2f} ms, "
                    f"max {lags[-1] * 1000:.2f} ms"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=10)
    args = p.parse_args()
    print("load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    asyncio.run(suspects())
    asyncio.run(gateway_run(args.cycles))
    print("load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
