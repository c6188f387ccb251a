"""A worker that is never asked for a report never loads the statistics stack: scipy and numpy
(tens of MiB per process, most of a second to import) arrive only with the first report or
OpenAPI request, and are imported off the proxy's loop then (a real `running()` gateway in a
fresh process)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_SCRIPT = """
import asyncio, sys
import aiohttp
from gateway.config.load import load_config
from gateway.process.runtime import running

async def main(db):
    cfg = load_config(None, environ={}, overrides={
        "listen": "127.0.0.1:0", "db_url": db, "insecure_admin": True,
        "live_url": "http://127.0.0.1:9", "mirror_priority": "normal"})
    async with running(cfg) as parts, aiohttp.ClientSession() as http:
        async with http.get(parts.url + "/healthz") as resp:
            assert resp.status == 200, resp.status
        print("after start", "scipy" in sys.modules, "numpy" in sys.modules, flush=True)
        async with http.get(parts.url + "/admin/openapi.json") as resp:
            assert resp.status == 200, resp.status
            await resp.read()
        print("after openapi", "scipy" in sys.modules, flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_the_statistics_stack_loads_only_when_asked_for(tmp_path: Path) -> None:
    db = f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}"
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, db],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {
        line.split()[0] + " " + line.split()[1]: line.split()[2:]
        for line in out.stdout.splitlines()
    }
    assert lines["after start"] == ["False", "False"], out.stdout
    assert lines["after openapi"][0] == "True", out.stdout  # it was really built from the model


_SETTLE = """
import asyncio, gc, sys
from gateway.config.load import load_config
from gateway.lifecycle import YOUNG_THRESHOLD
from gateway.process.runtime import serve_until_stopped

async def main(db):
    cfg = load_config(None, environ={}, overrides={
        "listen": "127.0.0.1:0", "db_url": db, "insecure_admin": True,
        "live_url": "http://127.0.0.1:9", "mirror_priority": "normal"})
    print("before", gc.get_freeze_count(), gc.get_threshold()[0], flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(2.0, stop.set)
    await serve_until_stopped(cfg, stop=stop)
    print("serving", gc.get_freeze_count(), gc.get_threshold()[0], YOUNG_THRESHOLD, flush=True)

asyncio.run(main(sys.argv[1]))
"""


def test_a_serving_process_settles_its_heap(tmp_path: Path) -> None:
    """Once `canary serve` listens, what it built to serve is frozen out of the cyclic
    collector's sight and the young generation is collected every YOUNG_THRESHOLD allocations:
    at CPython's 700 the collector took 13-18 % of a worker's CPU at 1,000 req/s
    (bench/spy.py)."""
    db = f"sqlite+aiosqlite:///{tmp_path / 'canary.db'}"
    out = subprocess.run(
        [sys.executable, "-c", _SETTLE, db],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in out.stdout.splitlines()}
    assert lines["before"] == [0, 700], out.stdout
    frozen, threshold, wanted = lines["serving"]
    assert frozen > 10_000, out.stdout  # the imported modules and the app, at least
    assert threshold == wanted, out.stdout
