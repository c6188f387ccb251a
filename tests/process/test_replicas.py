"""Two `canary serve` processes sharing one database (SQLite file or PostgreSQL) apply each
other's control-plane changes within the registry poll interval."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from gateway.sim.server import start_sim
from tests.upstreams import free_port
from tests.waiting import until, until_ready

TOKEN = "ops:replica-test-token"
AUTH = {"Authorization": "Bearer replica-test-token"}
POLL_S = 0.5


@asynccontextmanager
async def replica(db_url: str, live_url: str) -> AsyncIterator[str]:
    """One gateway process; yields its base URL once ready, stops it with SIGTERM."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env |= {"CANARY_ADMIN_TOKEN": TOKEN, "CANARY_REGISTRY_POLL_INTERVAL_S": str(POLL_S)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "gateway.cli.main", "serve", "--listen", f"127.0.0.1:{port}"),
        *("--db", db_url, "--live", live_url),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await until_ready(url + "/readyz", proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        err = await asyncio.wait_for(proc.stderr.read(), 60)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, err.decode()[-2000:]


async def _until(probe: Any, limit_s: float) -> float:
    """Seconds until `await probe()` is true; fails past `limit_s`."""
    start = time.monotonic()
    await until(probe, what="the change applied", within_s=limit_s)
    return time.monotonic() - start


async def test_replicas_apply_each_others_changes(migrated_db_url: str) -> None:
    """A candidate added on one replica is mirrored by the other, and a promotion made on the
    second moves the first's production traffic, each within the poll interval (plus slack)."""
    live = await start_sim("fast")
    cand = await start_sim("fast")
    try:
        async with (
            replica(migrated_db_url, live.url) as a,
            replica(migrated_db_url, live.url) as b,
            aiohttp.ClientSession(headers=AUTH) as http,
        ):
            body = {"name": "kv", "url": cand.url, "kind": "bi-kv", "sample_rate": 1.0}
            async with http.post(a + "/admin/candidates", json=body) as resp:
                assert resp.status == 201

            async def b_mirrors() -> bool:
                async with http.get(b + "/metrics") as resp:
                    return 'canary_mirror_pending{candidate="kv"}' in await resp.text()

            await _until(b_mirrors, POLL_S + 5.0)
            promote = {"force": True, "reason": "replica test"}
            async with http.post(b + "/admin/candidates/kv/promote", json=promote) as resp:
                assert resp.status == 200, await resp.text()

            async def a_serves_candidate() -> bool:
                async with http.get(a + "/admin/status") as resp:
                    return bool((await resp.json())["live"]["name"] == "kv")

            await _until(a_serves_candidate, POLL_S + 5.0)
            chat = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(a + "/v1/chat/completions", json=chat) as resp:
                assert resp.status == 200
            async with http.get(cand.url + "/sim/stats") as resp:
                assert (await resp.json())["requests"] >= 1  # production now reaches kv
    finally:
        await live.close()
        await cand.close()
