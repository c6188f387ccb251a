"""A real `canary serve` under the common 1,024-descriptor limit (`prlimit --nofile=1024:1024`),
in front of a real `canary sim`, on asyncio's loop and on uvloop (`event_loop`): its limits fit
the budget and say so in one line, 200 concurrent streams are all answered, and a flood of
thousands of idle connections locks no ordinary client out (issue 24, items 1 to 3)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from gateway.server.limits import plan_limits
from tests.upstreams import free_port
from tests.waiting import LISTEN_S, until_ready, until_sync

NOFILE = 1024
CHAT = {
    "model": "sim-model",
    "messages": [{"role": "user", "content": "Tell me about file descriptors"}],
    "max_tokens": 16,
    "stream": True,
}

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs util-linux prlimit")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CANARY_")}
    env.update(extra)
    return env


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, path: str) -> None:
    try:
        await until_ready(url + path, proc)
    except AssertionError:
        if proc.returncode is None:
            proc.kill()
        raise


class Served:
    """A `canary serve` process under the lowered limit, and its stderr once stopped."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url
        self.stderr = ""

    async def stop(self) -> str:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.stderr is not None
        self.stderr = (await asyncio.wait_for(self.proc.stderr.read(), 60)).decode()
        await asyncio.wait_for(self.proc.wait(), 60)
        return self.stderr

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.stderr.splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    """`canary sim` (baseline at a tenth of its delays): streams that overlap for a while."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli.main", "sim", "--port", str(port),
         "--time-scale", "0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
    )  # fmt: skip
    try:

        def listening() -> bool:
            assert proc.poll() is None, "canary sim exited"
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        until_sync(listening, what="canary sim listening", within_s=LISTEN_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_name(request: pytest.FixtureRequest) -> str:
    """The gateway process's event loop (`event_loop`): each test runs on both."""
    return str(request.param)


@pytest_asyncio.fixture
async def served(sim: str, tmp_path: Path, event_loop_name: str) -> AsyncIterator[Served]:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        "prlimit", f"--nofile={NOFILE}:{NOFILE}", "--",
        sys.executable, "-m", "gateway.cli.main", "serve", "--live", sim,
        "--listen", f"127.0.0.1:{port}", "--db", f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        "--log-format", "json",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env=_env(CANARY_EVENT_LOOP=event_loop_name),
    )  # fmt: skip
    gw = Served(proc, f"http://127.0.0.1:{port}")
    try:
        await _wait_ready(gw.url, proc, "/readyz")
        yield gw
    finally:
        await gw.stop()


def _limits_line(gw: Served) -> dict[str, Any]:
    found = [r for r in gw.log_lines() if r.get("msg", "").startswith("connection limits")]
    assert len(found) == 1, gw.stderr[-3000:]
    return found[0]


def _assert_quiet(gw: Served) -> None:
    """No traceback and nothing at ERROR in the gateway's log."""
    assert "Traceback" not in gw.stderr, gw.stderr[-3000:]
    assert [r for r in gw.log_lines() if r.get("level") in ("ERROR", "CRITICAL")] == []


def test_limits_fit_any_descriptor_budget() -> None:
    """Sized from the descriptor limit, client and upstream connections together with the
    admin listener and the reserve never exceed it (above the floor), the pool is what was
    configured unless client connections could not use it all, and a limit that fits the
    configuration keeps it."""
    for nofile in (256, 512, 1024, 2048, 4096, 8192, 65536):
        for admin in (0, 64):
            for upstream in (0, 16, 1024):
                got = plan_limits(nofile, max_connections=4096, upstream=upstream, admin=admin)
                assert got.enough
                pool = got.upstream_max_connections or got.max_connections
                used = got.max_connections + min(pool, got.max_connections) + admin + got.reserve
                assert used <= nofile
                # the configured pool, unless clients could not use it all
                assert pool >= min(upstream or got.max_connections, got.max_connections)
    at_1024 = plan_limits(1024, max_connections=4096, upstream=1024, admin=0)
    assert at_1024.max_connections >= 400 and at_1024.upstream_max_connections >= 400
    roomy = plan_limits(20000, max_connections=4096, upstream=1024, admin=64)
    assert (roomy.max_connections, roomy.upstream_max_connections, roomy.lowered) == (
        4096,
        1024,
        False,
    )
    tiny = plan_limits(64, max_connections=4096, upstream=1024, admin=0)
    assert not tiny.enough and tiny.max_connections >= 32 and tiny.upstream_max_connections >= 16


async def _stream(http: aiohttp.ClientSession, url: str) -> bool:
    async with http.post(url + "/v1/chat/completions", json=CHAT) as resp:
        body = await resp.read()
        return resp.status == 200 and body.rstrip().endswith(b"data: [DONE]")


async def test_200_concurrent_streams_under_nofile_1024(
    served: Served, event_loop_name: str
) -> None:
    """Under `nofile 1024` (hard), 200 concurrent streaming clients are all answered in full,
    8 concurrent `/v1/models` too, and one start-up line states the effective limits."""
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as http:
        results = await asyncio.gather(*(_stream(http, served.url) for _ in range(200)))
        assert all(results), f"{results.count(False)} of 200 streams not answered in full"

        async def models() -> int:
            async with http.get(served.url + "/v1/models") as resp:
                await resp.read()
                return resp.status

        assert await asyncio.gather(*(models() for _ in range(8))) == [200] * 8
    await served.stop()
    line = _limits_line(served)
    assert line["nofile"] == NOFILE and line["lowered"] is True
    assert line["loop"] == event_loop_name
    assert line["max_connections"] >= 200 and line["upstream_max_connections"] >= 200
    _assert_quiet(served)


FLOOD = 4000  # idle sockets opened against the gateway (about nine times its limit at 1024)
FLOOD_RATE = 400.0  # per second
ORDINARY_RATE = 20.0  # ordinary requests per second, each on a new connection
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


def _flood_size() -> int:
    """FLOOD, or what the test process's hard limit allows (raising its soft limit to it): at
    least twice the gateway's whole descriptor limit either way."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    top = FLOOD + 512 if hard == resource.RLIM_INFINITY else min(FLOOD + 512, hard)
    if soft != resource.RLIM_INFINITY and soft < top:
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    flood = FLOOD if soft == resource.RLIM_INFINITY else min(FLOOD, soft - 512)
    assert flood >= 2 * NOFILE, f"the test client's descriptor limit ({soft}) is too low"
    return flood


async def _flood(url: str, held: list[socket.socket], size: int) -> None:
    """Open `size` connections that never send a byte, FLOOD_RATE a second, and hold them."""
    host, port = url.removeprefix("http://").split(":")
    batch = 40
    for _ in range(size // batch):
        for _ in range(batch):
            sock = socket.socket()
            sock.setblocking(False)
            held.append(sock)
            with contextlib.suppress(BlockingIOError):
                sock.connect((host, int(port)))
        await asyncio.sleep(batch / FLOOD_RATE)


async def test_idle_flood_locks_no_one_out(served: Served) -> None:
    """With the gateway at `nofile 1024` and 4,000 idle sockets opened against it, at least
    99 % of ordinary requests (a new connection each, from before the flood to after it) are
    answered within the client's 1 s timeout; the idle connections closed for them are
    counted by reason, and nothing is logged at ERROR."""
    size = _flood_size()
    held: list[socket.socket] = []
    outcomes: list[bool] = []
    try:
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=CLIENT_TIMEOUT) as http:

            async def ordinary() -> None:
                try:
                    async with http.get(served.url + "/v1/models") as resp:
                        await resp.read()
                        outcomes.append(resp.status == 200)
                except (aiohttp.ClientError, TimeoutError):
                    outcomes.append(False)

            async def steady(seconds: float) -> None:
                tasks = []
                for _ in range(int(seconds * ORDINARY_RATE)):
                    tasks.append(asyncio.create_task(ordinary()))
                    await asyncio.sleep(1 / ORDINARY_RATE)
                await asyncio.gather(*tasks)

            flood = asyncio.create_task(_flood(served.url, held, size))
            await steady(size / FLOOD_RATE + 3.0)  # from the flood's start to after its end
            await flood
            async with http.get(served.url + "/metrics") as resp:
                text = await resp.text()
    finally:
        for sock in held:
            sock.close()
    answered = sum(outcomes) / len(outcomes)
    assert answered >= 0.99, f"{sum(outcomes)} of {len(outcomes)} answered within 1 s"
    shed = [
        int(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('canary_connections_shed_total{listener="proxy"')
    ]
    await served.stop()
    assert sum(shed) >= size - _limits_line(served)["max_connections"]
    _assert_quiet(served)
